package distckpt

/*
#include <stdlib.h>
#include <distckpt/distckpt.h>

// Weak, so that this package still links against a libdistckpt built before incremental checkpoints; Flatten then
// reports ErrUnsupported.
#pragma weak dckpt_flatten

static int distckpt_go_has_flatten(void) { return dckpt_flatten != NULL; }
*/
import "C"

import "unsafe"

// FlattenInfo reports a Flatten.
type FlattenInfo struct {
	BytesCopied    uint64 `json:"bytes_copied"`     // data bytes read, verified and written: every chunk
	BytesFromBases uint64 `json:"bytes_from_bases"` // of which the source held in its bases
	NumFiles       int    `json:"num_files"`        // data files of the copy
}

// Flatten writes a self-contained copy of the checkpoint at src to dst: every chunk, wherever it lies (in src or the
// checkpoints an incremental save made it refer to, Info.Bases), read, verified and written to the copy's own data
// files. dst may be src itself with overwrite: the checkpoint then becomes self-contained in place and its bases can
// be pruned (ErrState if other incremental checkpoints refer to it). Atomic, as a save. storage: nil for what the
// paths name (S3 for an "s3://" URL, else the POSIX file system). The copy is made by the library (dckpt_flatten).
func Flatten(src, dst string, overwrite bool, storage *StorageHandle) (FlattenInfo, error) {
	if C.distckpt_go_has_flatten() == 0 {
		return FlattenInfo{}, errorf(CodeUnsupported, "the loaded libdistckpt %s has no dckpt_flatten; upgrade it",
			LibraryVersion())
	}
	p, err := storage.acquire()
	if err != nil {
		return FlattenInfo{}, err
	}
	defer storage.release()
	csrc, cdst := C.CString(src), C.CString(dst)
	defer C.free(unsafe.Pointer(csrc))
	defer C.free(unsafe.Pointer(cdst))
	ow := C.int(0)
	if overwrite {
		ow = 1
	}
	info := C.dckpt_flatten_info{version: C.DCKPT_FLATTEN_INFO_VERSION}
	if err := ccall(func() C.int { return C.dckpt_flatten(&info, csrc, cdst, ow, p) }); err != nil {
		return FlattenInfo{}, err
	}
	return FlattenInfo{BytesCopied: uint64(info.bytes_copied), BytesFromBases: uint64(info.bytes_from_bases),
		NumFiles: int(info.num_files)}, nil
}
