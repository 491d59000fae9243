package distckpt

/*
#include <stdint.h>
#include <stdlib.h>
#include <distckpt/distckpt.h>

extern int distckptGoText(char *text, size_t size, uintptr_t h);
extern int distckptGoStorageRemoved(char *path, uintptr_t h);

static int dgo_text(const char *text, size_t size, void *ud) { return distckptGoText((char *)text, size, (uintptr_t)ud); }
static int dgo_tier_removed(const char *path, void *ud) {
  return distckptGoStorageRemoved((char *)path, (uintptr_t)ud);
}
static int dgo_tiers_describe(const char *dir, uintptr_t h) { return dckpt_tiers_describe(dir, dgo_text, (void *)h); }
static int dgo_tiers_prune(const char *dir, int dry_run, uintptr_t h) {
  return dckpt_tiers_prune_abandoned(dir, dry_run, h ? dgo_tier_removed : NULL, (void *)h);
}
*/
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

// DescribeTier returns the JSON document the core writes about a checkpoint manager's node-local tier at dir (its
// steps, their parts and replicas with rank, size, run and state, completion markers, whether this node alone could
// restore each step, and which steps are abandoned; schema in docs/manager.md, "Looking at a tier"). It only reads,
// and never follows a symbolic link.
func DescribeTier(dir string) ([]byte, error) {
	var out []byte
	h := cgo.NewHandle(&out)
	defer h.Delete()
	cdir := C.CString(dir)
	defer C.free(unsafe.Pointer(cdir))
	if err := ccall(func() C.int { return C.dgo_tiers_describe(cdir, C.uintptr_t(h)) }); err != nil {
		return nil, err
	}
	return out, nil
}

// PruneAbandonedTier removes what DescribeTier calls abandoned at dir: staging directories whose writer is gone, and
// steps with no completion marker, nothing in progress and a newer complete step beside them. Never a complete step,
// anything in progress, anything reached through a link, or a name the manager does not write. removed (may be nil)
// is told each path first; an error from it stops the prune. With dryRun nothing is removed.
func PruneAbandonedTier(dir string, dryRun bool, removed func(path string) error) error {
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
	cdir := C.CString(dir)
	defer C.free(unsafe.Pointer(cdir))
	err := ccall(func() C.int { return C.dgo_tiers_prune(cdir, dry, C.uintptr_t(hh)) })
	if e, ok := err.(*Error); ok && hook != nil && hook.err != nil && e.Code == CodeUser {
		e.cause = hook.err
		return e
	}
	return err
}
