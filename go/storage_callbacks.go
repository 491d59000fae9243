package distckpt

// The trampolines libdistckpt calls for a Go Storage (dckpt_storage_callbacks, set up in storage.go). Each one looks
// the storage up through its cgo.Handle, recovers a panic into DCKPT_EIO, and maps the Go error to a status code:
// fs.ErrNotExist -> DCKPT_ENOTFOUND, fs.ErrExist -> DCKPT_EEXISTS, anything else -> DCKPT_EIO. Buffers are not
// copied: WriteAt and ReadAt get a slice over the library's memory, valid during the call only.

/*
#include <stdint.h>
#include <stdlib.h>
#include <distckpt/distckpt.h>
*/
import "C"

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"runtime/cgo"
	"unsafe"
)

// hostFile is a file a Storage is writing; its cgo.Handle is the C file pointer.
type hostFile struct {
	f    StorageFile
	path string
}

func hostOf(h C.uintptr_t) *storageHost { return cgo.Handle(h).Value().(*storageHost) }

// status records err as the storage's last error and returns its code.
func (s *storageHost) status(op, path string, err error) C.int {
	if err == nil {
		return C.DCKPT_OK
	}
	s.lastMu.Lock()
	s.lastErr = fmt.Errorf("%s %s: %w", op, path, err)
	s.lastMu.Unlock()
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return C.DCKPT_ENOTFOUND
	case errors.Is(err, fs.ErrExist):
		return C.DCKPT_EEXISTS
	}
	return C.DCKPT_EIO
}

// guard turns a panic of the Storage into DCKPT_EIO (a panic must not unwind through C frames).
func (s *storageHost) guard(op, path string, rc *C.int) {
	if p := recover(); p != nil {
		*rc = s.status(op, path, fmt.Errorf("panic in the Go Storage: %v", p))
	}
}

//export distckptGoStorageCreate
func distckptGoStorageCreate(file *C.uintptr_t, cpath *C.char, sizeHint C.uint64_t, h C.uintptr_t) (rc C.int) {
	s := hostOf(h)
	path := C.GoString(cpath)
	defer s.guard("create", path, &rc)
	f, err := s.s.Create(path, uint64(sizeHint))
	if err == nil && f == nil {
		err = errors.New("Create returned no file")
	}
	if err != nil {
		return s.status("create", path, err)
	}
	*file = C.uintptr_t(cgo.NewHandle(&hostFile{f: f, path: path}))
	return C.DCKPT_OK
}

//export distckptGoStorageWrite
func distckptGoStorageWrite(file C.uintptr_t, off C.uint64_t, data unsafe.Pointer, size C.size_t,
	h C.uintptr_t) (rc C.int) {
	s := hostOf(h)
	hf := cgo.Handle(file).Value().(*hostFile)
	defer s.guard("write", hf.path, &rc)
	return s.status("write", hf.path, hf.f.WriteAt(unsafe.Slice((*byte)(data), int(size)), uint64(off)))
}

//export distckptGoStorageSync
func distckptGoStorageSync(file C.uintptr_t, h C.uintptr_t) (rc C.int) {
	s := hostOf(h)
	hf := cgo.Handle(file).Value().(*hostFile)
	defer s.guard("sync", hf.path, &rc)
	return s.status("sync", hf.path, hf.f.Sync())
}

//export distckptGoStorageClose
func distckptGoStorageClose(file C.uintptr_t, size C.uint64_t, discard C.int, h C.uintptr_t) (rc C.int) {
	s := hostOf(h)
	fh := cgo.Handle(file)
	hf := fh.Value().(*hostFile)
	defer fh.Delete() // close is called exactly once per file, whatever it returns
	defer s.guard("close", hf.path, &rc)
	return s.status("close", hf.path, hf.f.Close(uint64(size), discard != 0))
}

//export distckptGoStorageSize
func distckptGoStorageSize(size *C.uint64_t, cpath *C.char, h C.uintptr_t) (rc C.int) {
	s := hostOf(h)
	path := C.GoString(cpath)
	defer s.guard("size", path, &rc)
	n, err := s.s.Size(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return C.DCKPT_ENOTFOUND // an expected answer, not a failure worth reporting
		}
		return s.status("size", path, err)
	}
	*size = C.uint64_t(n)
	return C.DCKPT_OK
}

//export distckptGoStorageRead
func distckptGoStorageRead(got *C.size_t, cpath *C.char, off C.uint64_t, data unsafe.Pointer, size C.size_t,
	h C.uintptr_t) (rc C.int) {
	s := hostOf(h)
	path := C.GoString(cpath)
	defer s.guard("read", path, &rc)
	p := unsafe.Slice((*byte)(data), int(size))
	n, err := s.s.ReadAt(path, p, uint64(off))
	if n < 0 || n > len(p) {
		err = fmt.Errorf("ReadAt returned %d for a buffer of %d bytes", n, len(p))
	} else if errors.Is(err, io.EOF) {
		err = nil
	}
	if err != nil {
		return s.status("read", path, err)
	}
	*got = C.size_t(n)
	return C.DCKPT_OK
}

//export distckptGoStorageList
func distckptGoStorageList(out unsafe.Pointer, cdir *C.char, h C.uintptr_t) (rc C.int) {
	s := hostOf(h)
	dir := C.GoString(cdir)
	defer s.guard("list", dir, &rc)
	names, err := s.s.List(dir)
	if err != nil {
		return s.status("list", dir, err)
	}
	for _, name := range names {
		cname := C.CString(name)
		rc = C.dckpt_storage_list_add((*C.dckpt_storage_list)(out), cname)
		C.free(unsafe.Pointer(cname))
		if rc != C.DCKPT_OK {
			return s.status("list", dir, fmt.Errorf("the library refused the name %q", name))
		}
	}
	return C.DCKPT_OK
}

//export distckptGoStorageRemove
func distckptGoStorageRemove(cpath *C.char, h C.uintptr_t) (rc C.int) {
	s := hostOf(h)
	path := C.GoString(cpath)
	defer s.guard("remove", path, &rc)
	err := s.s.Remove(path)
	if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	return s.status("remove", path, err)
}

//export distckptGoStorageCommit
func distckptGoStorageCommit(cpath *C.char, data unsafe.Pointer, size C.size_t, replace C.int,
	h C.uintptr_t) (rc C.int) {
	s := hostOf(h)
	path := C.GoString(cpath)
	defer s.guard("commit", path, &rc)
	return s.status("commit", path, s.committer.Commit(path, unsafe.Slice((*byte)(data), int(size)), replace != 0))
}

// hostUpload is a multipart upload a Storage is sending; its cgo.Handle is the C upload pointer.
type hostUpload struct {
	u    Upload
	path string
}

//export distckptGoUploadBegin
func distckptGoUploadBegin(up *C.uintptr_t, cpath *C.char, sizeHint C.uint64_t, h C.uintptr_t) (rc C.int) {
	s := hostOf(h)
	path := C.GoString(cpath)
	defer s.guard("upload_begin", path, &rc)
	u, err := s.parts.BeginUpload(path, uint64(sizeHint))
	if err == nil && u == nil {
		err = errors.New("BeginUpload returned no upload")
	}
	if err != nil {
		return s.status("upload_begin", path, err)
	}
	*up = C.uintptr_t(cgo.NewHandle(&hostUpload{u: u, path: path}))
	return C.DCKPT_OK
}

//export distckptGoUploadPart
func distckptGoUploadPart(up C.uintptr_t, number C.unsigned, data unsafe.Pointer, size C.size_t,
	h C.uintptr_t) (rc C.int) {
	s := hostOf(h)
	hu := cgo.Handle(up).Value().(*hostUpload)
	defer s.guard("upload_part", hu.path, &rc)
	return s.status("upload_part", hu.path, hu.u.UploadPart(int(number), unsafe.Slice((*byte)(data), int(size))))
}

//export distckptGoUploadComplete
func distckptGoUploadComplete(up C.uintptr_t, h C.uintptr_t) (rc C.int) {
	s := hostOf(h)
	uh := cgo.Handle(up)
	hu := uh.Value().(*hostUpload)
	defer uh.Delete() // the last call on the upload, whatever it returns
	defer s.guard("upload_complete", hu.path, &rc)
	return s.status("upload_complete", hu.path, hu.u.Complete())
}

//export distckptGoUploadAbort
func distckptGoUploadAbort(up C.uintptr_t, h C.uintptr_t) (rc C.int) {
	s := hostOf(h)
	uh := cgo.Handle(up)
	hu := uh.Value().(*hostUpload)
	defer uh.Delete()
	defer s.guard("upload_abort", hu.path, &rc)
	return s.status("upload_abort", hu.path, hu.u.Abort())
}

//export distckptGoStorageRemoved
func distckptGoStorageRemoved(cpath *C.char, h C.uintptr_t) (rc C.int) {
	hook := cgo.Handle(h).Value().(*removedHook)
	defer func() {
		if p := recover(); p != nil {
			hook.err = fmt.Errorf("panic in the removed callback: %v", p)
			rc = 1
		}
	}()
	if hook.err != nil {
		return 1
	}
	if err := hook.fn(C.GoString(cpath)); err != nil {
		hook.err = err
		return 1
	}
	return 0
}
