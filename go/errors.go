package distckpt

/*
#include <distckpt/distckpt.h>
*/
import "C"

import (
	"fmt"
	"io/fs"
	"runtime"
	"strings"
)

// Code is a distckpt status code (dckpt_status). The values are fixed by the C ABI and never renumbered.
type Code int

// Status codes, as in distckpt.h.
const (
	CodeOK          Code = C.DCKPT_OK
	CodeError       Code = C.DCKPT_ERROR
	CodeInvalid     Code = C.DCKPT_EINVAL
	CodeNotFound    Code = C.DCKPT_ENOTFOUND
	CodeCorrupt     Code = C.DCKPT_ECORRUPT
	CodeVersion     Code = C.DCKPT_EVERSION
	CodeIO          Code = C.DCKPT_EIO
	CodeTimeout     Code = C.DCKPT_ETIMEOUT
	CodeUser        Code = C.DCKPT_EUSER
	CodeNoMem       Code = C.DCKPT_ENOMEM
	CodeUnsupported Code = C.DCKPT_EUNSUPPORTED
	CodeExists      Code = C.DCKPT_EEXISTS
	CodeBufSize     Code = C.DCKPT_EBUFSIZE
	CodePeer        Code = C.DCKPT_EPEER
	CodeNoSpace     Code = C.DCKPT_ENOSPC
	CodeState       Code = C.DCKPT_ESTATE
	CodeInternal    Code = C.DCKPT_EINTERNAL
)

// String is the library's short name for the code ("corrupt", "not found", ...).
func (c Code) String() string {
	if s := C.dckpt_status_name(C.int(c)); s != nil {
		return C.GoString(s)
	}
	return fmt.Sprintf("status %d", int(c))
}

// Error is a failure reported by libdistckpt (or by this package, with the code it would have used).
type Error struct {
	Code    Code
	Message string // the library's message: it names the checkpoint, entry and file involved
	cause   error  // for CodeUser: the error a Go callback returned
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "distckpt: " + e.Code.String()
	}
	return e.Code.String() + ": " + e.Message
}

// Is makes errors.Is(err, ErrCorrupt) (and the other sentinels) match any *Error with the same code. It also matches
// the io/fs sentinels, so that code handling file system errors handles the library's alike: fs.ErrNotExist matches
// CodeNotFound, fs.ErrExist matches CodeExists, and fs.ErrPermission matches a CodeIO failure whose message carries
// the system's text for EACCES or EPERM (the C ABI has no code of its own for a permission error: the library
// reports it as DCKPT_EIO with strerror's text, "Permission denied" or "Operation not permitted").
func (e *Error) Is(target error) bool {
	switch target {
	case fs.ErrNotExist:
		return e.Code == CodeNotFound
	case fs.ErrExist:
		return e.Code == CodeExists
	case fs.ErrPermission:
		return e.Code == CodeIO && (strings.Contains(e.Message, "Permission denied") ||
			strings.Contains(e.Message, "Operation not permitted"))
	}
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.cause == nil && t.Code == e.Code
}

// Unwrap returns the error a progress callback returned to abort the operation, if that is why it failed.
func (e *Error) Unwrap() error { return e.cause }

// Sentinels for errors.Is. They carry no message; every *Error with the same code matches them.
var (
	ErrGeneric     = &Error{Code: CodeError}
	ErrInvalid     = &Error{Code: CodeInvalid}
	ErrNotFound    = &Error{Code: CodeNotFound}
	ErrCorrupt     = &Error{Code: CodeCorrupt}
	ErrVersion     = &Error{Code: CodeVersion}
	ErrIO          = &Error{Code: CodeIO}
	ErrTimeout     = &Error{Code: CodeTimeout}
	ErrUser        = &Error{Code: CodeUser}
	ErrNoMem       = &Error{Code: CodeNoMem}
	ErrUnsupported = &Error{Code: CodeUnsupported}
	ErrExists      = &Error{Code: CodeExists}
	ErrBufSize     = &Error{Code: CodeBufSize}
	ErrPeer        = &Error{Code: CodePeer}
	ErrNoSpace     = &Error{Code: CodeNoSpace}
	ErrState       = &Error{Code: CodeState}
	ErrInternal    = &Error{Code: CodeInternal}
)

// errorf builds an *Error for a failure this package detects itself, with the code the library would use.
func errorf(code Code, format string, args ...interface{}) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ccall runs f, which makes one C call and returns its status, and turns a failure into an *Error. The goroutine is
// locked to its OS thread across the call and the read of dckpt_error_last(), which is per thread.
func ccall(f func() C.int) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	rc := f()
	if rc == C.DCKPT_OK {
		return nil
	}
	msg := C.GoString(C.dckpt_error_last())
	return &Error{Code: Code(rc), Message: msg}
}
