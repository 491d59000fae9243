package distckpt

/*
#include <stdint.h>
#include <stdlib.h>
#include <distckpt/distckpt.h>
extern int distckptGoProgress(uint64_t done, uint64_t total, void *user_data);
*/
import "C"

import (
	"errors"
	"runtime/cgo"
	"sync"
	"unsafe"
)

// ProgressFunc is told how many of the operation's bytes are done so far. Returning a non-nil error aborts the
// operation, which then fails with an *Error of code CodeUser that unwraps to the returned error.
type ProgressFunc func(done, total uint64) error

// progressHook lets C code call a ProgressFunc through dckpt_progress_fn. The user_data given to C is a C-allocated
// cgo.Handle, so no Go pointer is kept by C.
type progressHook struct {
	fn     ProgressFunc
	mu     sync.Mutex
	err    error
	handle cgo.Handle
	cdata  *C.uintptr_t
}

// newProgressHook returns nil for a nil fn; a hook must be freed after the C call that uses it has returned.
func newProgressHook(fn ProgressFunc) *progressHook {
	if fn == nil {
		return nil
	}
	h := &progressHook{fn: fn}
	h.handle = cgo.NewHandle(h)
	h.cdata = (*C.uintptr_t)(C.malloc(C.size_t(unsafe.Sizeof(C.uintptr_t(0)))))
	*h.cdata = C.uintptr_t(h.handle)
	return h
}

// cfn and cdata are the values to store in an options struct (NULL, NULL for a nil hook).
func (h *progressHook) cfn() C.dckpt_progress_fn {
	if h == nil {
		return nil
	}
	return C.dckpt_progress_fn(C.distckptGoProgress)
}

func (h *progressHook) userData() unsafe.Pointer {
	if h == nil {
		return nil
	}
	return unsafe.Pointer(h.cdata)
}

// free releases the hook's handle and C memory; no C call may use it afterwards.
func (h *progressHook) free() {
	if h == nil {
		return
	}
	h.handle.Delete()
	C.free(unsafe.Pointer(h.cdata))
}

// finish frees the hook and, if the callback aborted the operation, attaches its error to err.
func (h *progressHook) finish(err error) error {
	if h == nil {
		return err
	}
	h.free()
	var e *Error
	if h.err != nil && errors.As(err, &e) && e.Code == CodeUser {
		e.cause = h.err
	}
	return err
}

//export distckptGoProgress
func distckptGoProgress(done, total C.uint64_t, userData unsafe.Pointer) C.int {
	h := cgo.Handle(*(*C.uintptr_t)(userData)).Value().(*progressHook)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil {
		return 1
	}
	if err := h.fn(uint64(done), uint64(total)); err != nil {
		h.err = err
		return 1
	}
	return 0
}
