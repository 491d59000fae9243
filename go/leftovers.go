package distckpt

/*
#include <stdint.h>
#include <stdlib.h>
#include <distckpt/distckpt.h>

// Weak, so that this package still links against and runs with a libdistckpt built before the core judged leftovers
// (same ABI version: functions are only ever added); ScanLeftovers and RemoveLeftover then report ErrUnsupported.
#pragma weak dckpt_scan_leftovers
#pragma weak dckpt_remove_leftover

static int distckpt_go_has_leftovers(void) {
  return dckpt_scan_leftovers != NULL && dckpt_remove_leftover != NULL;
}

// The Go side of the scan's callback (leftovers_callback.go); user_data is a cgo.Handle carried as an integer, so C
// never holds a Go pointer.
extern int distckptGoLeftover(dckpt_leftover_info *info, uintptr_t h);

static int dgo_leftover(const dckpt_leftover_info *info, void *ud) {
  return distckptGoLeftover((dckpt_leftover_info *)info, (uintptr_t)ud);
}

static int dgo_scan_leftovers(const char *dir, const char *final_name, double grace, uintptr_t h) {
  return dckpt_scan_leftovers(dir, final_name, grace, dgo_leftover, (void *)h);
}
*/
import "C"

import (
	"fmt"
	"runtime/cgo"
	"time"
	"unsafe"
)

// LeftoverKind says what a leftover directory is (dckpt_leftover_kind).
type LeftoverKind int

// Leftover kinds, as in distckpt.h. A newer library may report others.
const (
	// LeftoverStaging: "<name>.dckpt-staging-<nonce>", a save in progress, or abandoned.
	LeftoverStaging LeftoverKind = C.DCKPT_LEFTOVER_STAGING
	// LeftoverCompleteUnrenamed: a staging directory whose save finished every rank but died before its rename (it
	// never reported success).
	LeftoverCompleteUnrenamed LeftoverKind = C.DCKPT_LEFTOVER_COMPLETE_UNRENAMED
	// LeftoverReplaced: "<name>.dckpt-old-<nonce>", a checkpoint an overwrite moved aside.
	LeftoverReplaced LeftoverKind = C.DCKPT_LEFTOVER_REPLACED
	// LeftoverDeleting: "<name>.dckpt-deleting-<nonce>", a checkpoint a prune moved aside.
	LeftoverDeleting LeftoverKind = C.DCKPT_LEFTOVER_DELETING
)

func (k LeftoverKind) String() string {
	switch k {
	case LeftoverStaging:
		return "staging"
	case LeftoverCompleteUnrenamed:
		return "complete-unrenamed"
	case LeftoverReplaced:
		return "replaced"
	case LeftoverDeleting:
		return "deleting"
	}
	return fmt.Sprintf("leftover kind %d", int(k))
}

// WriterState says whether the writer a staging directory's STAGING marker names is alive (dckpt_writer_state). Only
// a process of this host can be asked.
type WriterState int

// Writer states, as in distckpt.h.
const (
	WriterUnknown WriterState = C.DCKPT_WRITER_UNKNOWN // no marker, another host's writer, or the marker does not say
	WriterRunning WriterState = C.DCKPT_WRITER_RUNNING // on this host, and a process with its pid exists
	WriterExited  WriterState = C.DCKPT_WRITER_EXITED  // on this host, and no process has its pid
)

func (s WriterState) String() string {
	switch s {
	case WriterRunning:
		return "running"
	case WriterExited:
		return "exited"
	}
	return "unknown"
}

// Leftover is one directory an unfinished save, overwrite or prune left beside checkpoints on a file system
// (FORMAT.md 6.1), as the library judged it (dckpt_leftover_info).
type Leftover struct {
	Path      string // the directory: the dir scanned joined with Name
	Name      string // its own name ("step-100.dckpt-staging-1f2e")
	FinalName string // the checkpoint name it belongs to ("step-100")
	Kind      LeftoverKind
	Bytes     uint64        // regular files below it (links not followed)
	Idle      time.Duration // since the newest change of the directory or of an entry directly in it
	// Writer, WriterPID, WriterHost and WriterStarted are what a staging directory's STAGING marker says: WriterPID
	// is -1, WriterHost "" and WriterStarted zero where there is no marker or it does not say.
	Writer        WriterState
	WriterPID     int64
	WriterHost    string
	WriterStarted time.Time
	// Garbage: removable under the grace period it was judged with (RemoveLeftover judges again).
	Garbage bool
	// Reason says why, in words ("abandoned: writer pid 12 on this host has exited; idle 2h01m").
	Reason string
}

// leftoverScan collects what the scan's callback is given (leftovers_callback.go).
type leftoverScan struct {
	found []Leftover
}

// ScanLeftovers reports every leftover directly in the directory dir, in name order (with finalName non-empty, only
// the leftovers of that checkpoint). Garbage: a staging directory idle for longer than grace whose writer is not a live
// process of this host, and a moved-aside directory idle that long. Only directories with a leftover's name are
// looked at; symbolic links are never followed nor reported. A missing dir has none. ErrInvalid for a negative grace;
// ErrUnsupported if the loaded library predates dckpt_scan_leftovers.
func ScanLeftovers(dir, finalName string, grace time.Duration) ([]Leftover, error) {
	if C.distckpt_go_has_leftovers() == 0 {
		return nil, noLeftoverJudge("dckpt_scan_leftovers")
	}
	scan := &leftoverScan{}
	h := cgo.NewHandle(scan)
	defer h.Delete()
	cdir := C.CString(dir)
	defer C.free(unsafe.Pointer(cdir))
	var cname *C.char
	if finalName != "" {
		cname = C.CString(finalName)
		defer C.free(unsafe.Pointer(cname))
	}
	if err := ccall(func() C.int {
		return C.dgo_scan_leftovers(cdir, cname, C.double(grace.Seconds()), C.uintptr_t(h))
	}); err != nil {
		return nil, err
	}
	return scan.found, nil
}

// RemoveLeftover judges the leftover directory at path anew and removes it if it is garbage now under grace: it is
// first moved to a "<name>.dckpt-deleting-<nonce>" name, checked there to be the same directory (device and inode),
// then removed without following links. An error matching ErrNotFound (and fs.ErrNotExist) if path is not a leftover
// directory (a symbolic link never is); ErrState, saying why, if it is not garbage (a live writer, idle for no longer
// than grace) or changed while being removed.
func RemoveLeftover(path string, grace time.Duration) error {
	if C.distckpt_go_has_leftovers() == 0 {
		return noLeftoverJudge("dckpt_remove_leftover")
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	return ccall(func() C.int { return C.dckpt_remove_leftover(cpath, C.double(grace.Seconds())) })
}

func noLeftoverJudge(fn string) error {
	return errorf(CodeUnsupported, "the loaded libdistckpt %s has no %s; upgrade it", LibraryVersion(), fn)
}
