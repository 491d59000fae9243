package distckpt

/*
#include <stdint.h>
#include <stdlib.h>
#include <distckpt/distckpt.h>

// The Go side of the callbacks (storage_callbacks.go). A file is a cgo.Handle carried as the file pointer; user_data
// is the storage's cgo.Handle carried as a pointer-sized integer, so C never holds a Go pointer.
extern int distckptGoStorageCreate(uintptr_t *file, char *path, uint64_t size_hint, uintptr_t h);
extern int distckptGoStorageWrite(uintptr_t file, uint64_t offset, void *data, size_t size, uintptr_t h);
extern int distckptGoStorageSync(uintptr_t file, uintptr_t h);
extern int distckptGoStorageClose(uintptr_t file, uint64_t size, int discard, uintptr_t h);
extern int distckptGoStorageSize(uint64_t *size, char *path, uintptr_t h);
extern int distckptGoStorageRead(size_t *got, char *path, uint64_t offset, void *data, size_t size, uintptr_t h);
extern int distckptGoStorageList(void *out, char *dir, uintptr_t h);
extern int distckptGoStorageRemove(char *path, uintptr_t h);
extern int distckptGoStorageCommit(char *path, void *data, size_t size, int replace, uintptr_t h);
extern int distckptGoStorageRemoved(char *path, uintptr_t h);
extern int distckptGoUploadBegin(uintptr_t *up, char *path, uint64_t size_hint, uintptr_t h);
extern int distckptGoUploadPart(uintptr_t up, unsigned number, void *data, size_t size, uintptr_t h);
extern int distckptGoUploadComplete(uintptr_t up, uintptr_t h);
extern int distckptGoUploadAbort(uintptr_t up, uintptr_t h);

static int dgo_create(dckpt_storage_file **file, const char *path, uint64_t size_hint, void *ud) {
  uintptr_t f = 0;
  int rc = distckptGoStorageCreate(&f, (char *)path, size_hint, (uintptr_t)ud);
  if (rc == 0) *file = (dckpt_storage_file *)f;
  return rc;
}
static int dgo_write(dckpt_storage_file *file, uint64_t offset, const void *data, size_t size, void *ud) {
  return distckptGoStorageWrite((uintptr_t)file, offset, (void *)data, size, (uintptr_t)ud);
}
static int dgo_sync(dckpt_storage_file *file, void *ud) { return distckptGoStorageSync((uintptr_t)file, (uintptr_t)ud); }
static int dgo_close(dckpt_storage_file *file, uint64_t size, int discard, void *ud) {
  return distckptGoStorageClose((uintptr_t)file, size, discard, (uintptr_t)ud);
}
static int dgo_size(uint64_t *size, const char *path, void *ud) {
  return distckptGoStorageSize(size, (char *)path, (uintptr_t)ud);
}
static int dgo_read(size_t *got, const char *path, uint64_t offset, void *data, size_t size, void *ud) {
  return distckptGoStorageRead(got, (char *)path, offset, data, size, (uintptr_t)ud);
}
static int dgo_list(dckpt_storage_list *out, const char *dir, void *ud) {
  return distckptGoStorageList((void *)out, (char *)dir, (uintptr_t)ud);
}
static int dgo_remove(const char *path, void *ud) { return distckptGoStorageRemove((char *)path, (uintptr_t)ud); }
static int dgo_commit(const char *path, const void *data, size_t size, int replace, void *ud) {
  return distckptGoStorageCommit((char *)path, (void *)data, size, replace, (uintptr_t)ud);
}
static int dgo_removed(const char *path, void *ud) { return distckptGoStorageRemoved((char *)path, (uintptr_t)ud); }

static int dgo_upload_begin(dckpt_upload **up, const char *path, uint64_t size_hint, void *ud) {
  return distckptGoUploadBegin((uintptr_t *)up, (char *)path, size_hint, (uintptr_t)ud);
}
static int dgo_upload_part(dckpt_upload *up, unsigned number, const void *data, size_t size, void *ud) {
  return distckptGoUploadPart((uintptr_t)up, number, (void *)data, size, (uintptr_t)ud);
}
static int dgo_upload_complete(dckpt_upload *up, void *ud) {
  return distckptGoUploadComplete((uintptr_t)up, (uintptr_t)ud);
}
static int dgo_upload_abort(dckpt_upload *up, void *ud) { return distckptGoUploadAbort((uintptr_t)up, (uintptr_t)ud); }

static int dgo_storage_new(dckpt_storage **out, uintptr_t h, int with_commit, unsigned max_in_flight, int with_parts,
                           uint64_t min_part_size) {
  dckpt_storage_callbacks cb = DCKPT_STORAGE_CALLBACKS_INIT;
  if (with_parts) {
    cb.upload_begin = dgo_upload_begin;
    cb.upload_part = dgo_upload_part;
    cb.upload_complete = dgo_upload_complete;
    cb.upload_abort = dgo_upload_abort;
    cb.min_part_size = min_part_size;
  }
  cb.create = dgo_create;
  cb.write = dgo_write;
  cb.sync = dgo_sync;
  cb.close = dgo_close;
  cb.size = dgo_size;
  cb.read = dgo_read;
  cb.list = dgo_list;
  cb.remove = dgo_remove;
  if (with_commit) cb.commit = dgo_commit;
  cb.user_data = (void *)h;
  cb.max_in_flight = max_in_flight;
  return dckpt_storage_new_callbacks(out, &cb);
}

static int dgo_remove_leftovers(dckpt_storage *s, const char *path, double grace, int dry_run, uintptr_t h) {
  return dckpt_storage_remove_leftovers(s, path, grace, dry_run, h ? dgo_removed : NULL, (void *)h);
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"runtime/cgo"
	"sync"
	"time"
	"unsafe"
)

// Storage is where checkpoints live, for storage the host plugs in (an object store, a remote file system). Paths
// are '/'-separated strings exactly as given to Save / Open, joined with plain file names ("<ckpt>/metadata.dckpt");
// the Storage decides what they mean. There are no directories to create or rename: a "directory" is the set of
// paths below a prefix, and a checkpoint is committed by writing its metadata last (FORMAT.md, "Commit on storage
// without rename"). Every method is called from several goroutines (C threads) at once.
type Storage interface {
	// Create starts writing path; nothing is visible there before the file's Close(size, false) returns nil.
	// sizeHint is the final size when known (0: unknown).
	Create(path string, sizeHint uint64) (StorageFile, error)
	// Size is the size of the file at path; an error matching fs.ErrNotExist when there is none.
	Size(path string) (uint64, error)
	// ReadAt reads len(p) bytes at off; it returns fewer only at the end of the file (io.EOF is then accepted too).
	// The library owns p's memory: it is valid only during the call.
	ReadAt(path string, p []byte, off uint64) (int, error)
	// List returns the names directly below dir: files, and the first component of longer paths ("a/b/c" is "b"
	// when listing "a"). Nothing below dir is no error.
	List(dir string) ([]string, error)
	// Remove removes the file at path; nil when there is none.
	Remove(path string) error
}

// StorageFile is a file being written by a Storage.
type StorageFile interface {
	// WriteAt writes p at off. Calls may come from several goroutines at once, for disjoint ranges, in any order;
	// bytes never written read as zeros. The library owns p's memory: it is valid only during the call.
	WriteAt(p []byte, off uint64) error
	// Sync makes what was written so far durable (nothing to do for most object stores).
	Sync() error
	// Close finishes the file, exactly once: discard == false publishes it at its path, durably, with size bytes
	// (zeros past what was written); discard == true abandons it.
	Close(size uint64, discard bool) error
}

// Committer is implemented by a Storage that can write a small file as one atomic, durable step (an object store's
// PUT). Commit writes data to path; with replace == false it fails with an error matching fs.ErrExist when
// something is already there, atomically (S3: a conditional PUT with "If-None-Match: *"). Without it, the library
// commits with Create/WriteAt/Close after checking that nothing is there (a check another writer can race).
type Committer interface {
	Commit(path string, data []byte, replace bool) error
}

// MultipartStorage is implemented by a Storage that takes multipart uploads (S3's). The library then assembles every
// file of more than one part itself: it buffers a few parts per file (never the whole file), sends each part as soon
// as its bytes are written, and completes the upload when the file is closed, or aborts it when the file is discarded
// or a call failed. Smaller files still go through Create/WriteAt/Close.
type MultipartStorage interface {
	// MinPartSize is the size of every part but the last (0: the library's 8 MiB); the library grows it so that a
	// file of its size hint needs at most 10000 parts.
	MinPartSize() uint64
	// BeginUpload starts a multipart upload of path; nothing is visible there before its Complete returns nil.
	BeginUpload(path string, sizeHint uint64) (Upload, error)
}

// Upload is a multipart upload the library is sending.
type Upload interface {
	// UploadPart sends part number (from 1, started in order; several may run at once from different goroutines).
	// The library owns p's memory: it is valid only during the call.
	UploadPart(number int, p []byte) error
	// Complete publishes the object from the parts sent; the last call on the upload (after a failure here the
	// Upload cleans up itself).
	Complete() error
	// Abort drops the upload and its parts (instead of Complete).
	Abort() error
}

// StorageHandle is a storage the library writes to and reads from: the POSIX file system (PosixStorage), an
// in-process memory store (MemoryStorage), or a Go Storage (NewStorage). Pass it in SaveOptions, ReadOptions and
// ExportOptions; a nil *StorageHandle means the storage each path names (S3 for an "s3://bucket/prefix" URL, the
// POSIX file system for a plain path; OpenStorageURL). Safe for concurrent use. Close releases it; a
// Reader opened on it, or a save running on it, keeps it alive until that is closed or done.
type StorageHandle struct {
	mu     sync.Mutex
	ptr    *C.dckpt_storage
	refs   int // the owner's reference (until Close) plus one per Reader and call in flight
	closed bool
	host   *storageHost // nil for the built-in storages
	handle cgo.Handle   // of host
	kind   string       // "posix", "memory", "go"
}

// storageHost is what the callbacks reach through the storage's cgo.Handle.
type storageHost struct {
	s         Storage
	committer Committer        // nil when s implements no Committer
	parts     MultipartStorage // nil when s implements no MultipartStorage
	lastMu    sync.Mutex
	lastErr   error // the most recent error a callback returned (added to the library's message)
}

// NewStorage makes a handle for a Go Storage. maxInFlight bounds the WriteAt, ReadAt and UploadPart calls running at
// once (0: the library's default, 16). If s implements Committer, checkpoints are committed through it; if it
// implements MultipartStorage, files of more than one part go up as multipart uploads the library assembles.
func NewStorage(s Storage, maxInFlight int) (*StorageHandle, error) {
	if s == nil {
		return nil, errorf(CodeInvalid, "NewStorage: nil Storage")
	}
	if maxInFlight < 0 {
		return nil, errorf(CodeInvalid, "NewStorage: maxInFlight must not be negative, not %d", maxInFlight)
	}
	host := &storageHost{s: s}
	if c, ok := s.(Committer); ok {
		host.committer = c
	}
	h := &StorageHandle{host: host, handle: cgo.NewHandle(host), kind: "go", refs: 1}
	withCommit := C.int(0)
	if host.committer != nil {
		withCommit = 1
	}
	withParts, minPart := C.int(0), C.uint64_t(0)
	if m, ok := s.(MultipartStorage); ok {
		host.parts = m
		withParts, minPart = 1, C.uint64_t(m.MinPartSize())
	}
	if err := ccall(func() C.int {
		return C.dgo_storage_new(&h.ptr, C.uintptr_t(h.handle), withCommit, C.unsigned(maxInFlight), withParts,
			minPart)
	}); err != nil {
		h.handle.Delete()
		return nil, err
	}
	runtime.SetFinalizer(h, (*StorageHandle).Close)
	return h, nil
}

// PosixStorage is a handle for the POSIX file system (what a nil *StorageHandle means for a plain path).
func PosixStorage() (*StorageHandle, error) {
	return builtinStorage("posix", func(out **C.dckpt_storage) C.int { return C.dckpt_storage_new_posix(out) })
}

// MemoryStorage is a handle for an in-process store of files, lost when the handle (and every Reader on it) is
// closed; checkpoints on it are committed as on a plugged-in storage. For tests and examples.
func MemoryStorage() (*StorageHandle, error) {
	return builtinStorage("memory", func(out **C.dckpt_storage) C.int { return C.dckpt_storage_new_memory(out) })
}

// builtinStorage makes a handle for one of the library's own storages with its constructor.
func builtinStorage(kind string, create func(out **C.dckpt_storage) C.int) (*StorageHandle, error) {
	// Made into a variable of its own: cgo refuses a pointer into the handle, which holds Go pointers (kind).
	var ptr *C.dckpt_storage
	if err := ccall(func() C.int { return create(&ptr) }); err != nil {
		return nil, err
	}
	h := &StorageHandle{kind: kind, refs: 1, ptr: ptr}
	runtime.SetFinalizer(h, (*StorageHandle).Close)
	return h, nil
}

// Storage is the Go Storage the handle calls, nil for the library's own storages (POSIX, memory, S3).
func (h *StorageHandle) Storage() Storage {
	if h == nil || h.host == nil {
		return nil
	}
	return h.host.s
}

// Close drops the caller's reference; the storage is freed once the Readers opened on it are closed too. Safe to
// call more than once.
func (h *StorageHandle) Close() error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closed {
		h.closed = true
		runtime.SetFinalizer(h, nil)
		h.unrefLocked()
	}
	return nil
}

// acquire takes a reference for a C call or a Reader (nil for a nil handle: the storage the path names). The C storage has
// a reference count of its own, but it cannot tell Go when it is done with the callbacks' cgo.Handle (the C ABI has
// no release callback), so the Go side keeps the handle alive until every Go user is done.
func (h *StorageHandle) acquire() (*C.dckpt_storage, error) {
	if h == nil {
		return nil, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, errorf(CodeState, "the %s storage handle is closed", h.kind)
	}
	h.refs++
	return h.ptr, nil
}

func (h *StorageHandle) release() {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.unrefLocked()
}

func (h *StorageHandle) unrefLocked() {
	h.refs--
	if h.refs == 0 {
		C.dckpt_storage_free(h.ptr)
		h.ptr = nil
		if h.host != nil {
			h.handle.Delete()
		}
	}
}

// explain adds the storage's own error to a failure of a call that used h: the library's message names the path and
// the operation, the Storage's says why (an HTTP status, a Go error). Best effort: with several calls failing at once
// on one handle, the most recent callback error is the one added.
func (h *StorageHandle) explain(err error) error {
	if err == nil || h == nil || h.host == nil {
		return err
	}
	e, ok := err.(*Error)
	if !ok {
		return err
	}
	h.host.lastMu.Lock()
	last := h.host.lastErr
	h.host.lastErr = nil
	h.host.lastMu.Unlock()
	if last != nil && e.cause == nil {
		e.Message = fmt.Sprintf("%s (storage: %v)", e.Message, last)
	}
	return e
}

// PathKind says what is at a path of a storage (Stat).
type PathKind int

// Path kinds, as in distckpt.h.
const (
	PathNone       PathKind = C.DCKPT_PATH_NONE       // nothing, or nothing distckpt wrote
	PathCheckpoint PathKind = C.DCKPT_PATH_CHECKPOINT // a committed checkpoint (its metadata is there)
	PathIncomplete PathKind = C.DCKPT_PATH_INCOMPLETE // only what unfinished saves left
)

func (k PathKind) String() string {
	switch k {
	case PathNone:
		return "none"
	case PathCheckpoint:
		return "checkpoint"
	case PathIncomplete:
		return "incomplete"
	}
	return fmt.Sprintf("path kind %d", int(k))
}

// PathInfo describes what is at a path of a storage laid out for storage without rename (Stat).
type PathInfo struct {
	Kind            PathKind
	Files           uint64 // files distckpt wrote there (committed and leftover)
	Bytes           uint64 // their total size
	LeftoverFiles   uint64 // files no committed checkpoint refers to: unfinished or superseded saves
	LeftoverBytes   uint64
	SavesInProgress int // unfinished saves whose writer marker is younger than the grace period
}

// Stat describes what is at path: a committed checkpoint, leftovers of unfinished saves, or nothing. Saves whose
// marker is younger than grace count as in progress.
func (h *StorageHandle) Stat(path string, grace time.Duration) (PathInfo, error) {
	var ci C.dckpt_path_info
	ci.version = C.DCKPT_PATH_INFO_VERSION
	err := h.onPath(path, func(p *C.dckpt_storage, cpath *C.char) error {
		return h.explain(ccall(func() C.int { return C.dckpt_storage_stat(&ci, p, cpath, C.double(grace.Seconds())) }))
	})
	if err != nil {
		return PathInfo{}, err
	}
	return PathInfo{
		Kind: PathKind(ci.kind), Files: uint64(ci.files), Bytes: uint64(ci.bytes),
		LeftoverFiles: uint64(ci.leftover_files), LeftoverBytes: uint64(ci.leftover_bytes),
		SavesInProgress: int(ci.saves_in_progress),
	}, nil
}

// removedHook carries RemoveLeftovers' callback to C through a cgo.Handle.
type removedHook struct {
	fn  func(path string) error
	err error
}

// RemoveLeftovers removes the leftovers at path (files of abandoned saves: their writer on this host has exited, or,
// on another host, their marker is older than grace; a running writer of this host keeps its files however old; and
// files no committed checkpoint refers to), never the committed checkpoint nor a file distckpt did not write.
// removed (may be nil) is told each path removed; an error from it stops the removal, and RemoveLeftovers returns an
// *Error of code CodeUser that unwraps to it. With dryRun nothing is removed, but removed still hears what would be.
func (h *StorageHandle) RemoveLeftovers(path string, grace time.Duration, dryRun bool,
	removed func(path string) error) error {
	var hook *removedHook
	var hh cgo.Handle
	if removed != nil {
		hook = &removedHook{fn: removed}
		hh = cgo.NewHandle(hook)
		defer hh.Delete()
	}
	dry := C.int(0)
	if dryRun {
		dry = 1
	}
	err := h.onPath(path, func(p *C.dckpt_storage, cpath *C.char) error {
		return ccall(func() C.int {
			return C.dgo_remove_leftovers(p, cpath, C.double(grace.Seconds()), dry, C.uintptr_t(hh))
		})
	})
	if e, ok := err.(*Error); ok && hook != nil && hook.err != nil && e.Code == CodeUser {
		e.cause = hook.err
		return e
	}
	return h.explain(err)
}

// RemoveCheckpoint removes the checkpoint at path and its leftovers: the metadata first (so that it stops existing
// in one step), then its data files. An error matching fs.ErrNotExist when nothing distckpt wrote is there.
func (h *StorageHandle) RemoveCheckpoint(path string) error {
	return h.onPath(path, func(p *C.dckpt_storage, cpath *C.char) error {
		return h.explain(ccall(func() C.int { return C.dckpt_storage_remove_checkpoint(p, cpath) }))
	})
}

// onPath runs fn with the storage held (not closed under it) and path as a C string; acquire's error if it is closed.
func (h *StorageHandle) onPath(path string, fn func(p *C.dckpt_storage, cpath *C.char) error) error {
	p, err := h.acquire()
	if err != nil {
		return err
	}
	defer h.release()
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	return fn(p, cpath)
}
