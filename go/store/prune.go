package store

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/testhooks"
)

// DefaultGrace is the grace period of a PrunePolicy whose Grace is zero.
const DefaultGrace = time.Hour

// NoGrace, as PrunePolicy.Grace, removes garbage as soon as Prune runs (a staging directory whose writer is a running
// process on this host is still never removed).
const NoGrace time.Duration = -1

// PrunePolicy says what Prune keeps.
type PrunePolicy struct {
	// KeepLast keeps the newest KeepLast committed checkpoints; it must be at least 1 (Prune never deletes every
	// checkpoint). "Newest" is by user metadata "step" when every committed checkpoint has an integer step, otherwise
	// by the directory's modification time.
	KeepLast int
	// KeepEvery, if > 0, also keeps every committed checkpoint whose step is a multiple of KeepEvery.
	KeepEvery int
	// Grace is how long garbage (leftover staging, replaced and deleting directories) must have been idle before it is
	// removed. Zero means DefaultGrace, so a policy that leaves it out is safe for writers on other hosts of a shared
	// file system; NoGrace (any negative value) means no grace period.
	Grace time.Duration
	// DryRun plans and reports, but deletes nothing.
	DryRun bool
	// Now is ignored.
	//
	// Deprecated: idleness is measured by the library, which judges the leftovers, against the real clock; nothing
	// else in a prune depends on the time. To test the grace period, age the files (os.Chtimes) instead.
	Now time.Time
}

// grace is the grace period the policy means (Grace with its zero and negative values resolved).
func (p PrunePolicy) grace() time.Duration {
	switch {
	case p.Grace == 0:
		return DefaultGrace
	case p.Grace < 0:
		return 0
	}
	return p.Grace
}

// Action is what Prune does with a directory.
type Action string

// Prune's actions.
const (
	Keep   Action = "keep"
	Delete Action = "delete"
)

// Order is how Prune ranks committed checkpoints from oldest to newest.
type Order string

// Orders.
const (
	ByStep    Order = "step"  // user metadata "step" (every committed checkpoint has an integer one)
	ByModTime Order = "mtime" // the directory's modification time
	ByName    Order = "name"  // the name, in natural order (below a URL: an object store keeps no time distckpt reads)
)

// PruneAction is Prune's decision about one directory of the store, and its outcome.
type PruneAction struct {
	Checkpoint Checkpoint
	Action     Action
	Reason     string // why, in words ("among the last 3 (by step)", "abandoned: writer pid 12 on this host has exited")
	Deleted    bool   // it was deleted (never with DryRun)
	Err        error  // why the deletion failed
}

// PruneResult reports a Prune.
type PruneResult struct {
	Dir     string
	DryRun  bool
	Order   Order
	Grace   time.Duration // the grace period applied
	Actions []PruneAction // every checkpoint and leftover of the store, garbage first; other directories are not listed
	// FreedBytes is the disk bytes of the directories deleted (with DryRun: of those that would be deleted).
	FreedBytes uint64
}

// PruneError is returned by Prune when some deletions failed; the others went on.
type PruneError struct {
	Dir    string
	Failed []PruneAction
}

// Error names the store, the number of failed deletions and the first failure.
func (e *PruneError) Error() string {
	return fmt.Sprintf("prune %s: %d deletion(s) failed; first: %v", e.Dir, len(e.Failed), e.Failed[0].Err)
}

// Unwrap returns the first failed deletion's error (for errors.Is(err, fs.ErrPermission) and the like).
func (e *PruneError) Unwrap() error { return e.Failed[0].Err }

// Prune deletes the committed checkpoints of the store dir that the policy does not keep, and the garbage that has
// been idle for longer than the grace period: staging directories of crashed writers (complete-unrenamed ones too:
// their save died before its rename and never reported success), "<name>.dckpt-old-<nonce>" directories of overwrites
// and "<name>.dckpt-deleting-<nonce>" directories of an interrupted prune. Which directories are garbage, and why, is
// the library's judgement (distckpt.ScanLeftovers, with the policy's grace period).
//
// A committed checkpoint is first renamed to "<name>.dckpt-deleting-<nonce>", so it disappears from its name at once
// and is never seen half-deleted, then removed; a directory that is no longer the one listed (swapped for a link or
// another directory meanwhile) is put back and not deleted. A leftover is removed by distckpt.RemoveLeftover, which
// judges it anew and, likewise, moves it aside and checks it is the directory it judged before removing it; one that
// is no longer garbage, or no longer a leftover directory, is reported as a failed deletion.
//
// Never deleted, whatever the policy: a checkpoint a kept incremental checkpoint refers to (Info.Bases), and the bases
// of those in turn; symbolic links and what they point to (never followed); a checkpoint a symbolic
// link in dir points to; a checkpoint with a staging directory of the same name next to it that is kept (an overwrite
// may be committing over it); Corrupt or Unreadable checkpoints (they may be of a newer format version); a staging
// directory whose STAGING marker names a running process on this host, however old; and any directory that is not a
// checkpoint or the leftover of one.
//
// dir may be a URL ("s3://bucket/prefix"): then a committed checkpoint is removed by the library metadata first
// (distckpt.StorageHandle.RemoveCheckpoint: it stops existing in one step, then its data files go), and only if it
// still is a checkpoint with no save in progress; what unfinished or superseded saves left is removed by
// RemoveLeftovers, which judges every marker anew (stale: older than the grace period, or a writer of this host that
// has exited). Committed checkpoints are ordered by step, else by name (ByName). Never removed there: an object
// distckpt did not write, the files of a save in progress (a prefix with one is kept whole, and so is a committed
// checkpoint an overwrite may be committing over), and checkpoints whose metadata does not open.
//
// The error is an *distckpt.Error of code CodeInvalid for a bad policy or a dir that is itself a checkpoint, the file
// system's (or the storage's) when dir cannot be read, and a *PruneError (with the result filled in) when some
// deletions failed.
func Prune(dir string, p PrunePolicy) (PruneResult, error) {
	res := PruneResult{Dir: dir, DryRun: p.DryRun, Grace: p.grace()}
	if p.KeepLast < 1 {
		return res, &distckpt.Error{Code: distckpt.CodeInvalid, Message: fmt.Sprintf("prune %s: KeepLast must be at "+
			"least 1 (prune never deletes every checkpoint), not %d", dir, p.KeepLast)}
	}
	if p.KeepEvery < 0 {
		return res, &distckpt.Error{Code: distckpt.CodeInvalid, Message: fmt.Sprintf("prune %s: KeepEvery must not "+
			"be negative", dir)}
	}
	var entries []*Checkpoint
	var rm remover = dirRemover{}
	if distckpt.IsURL(dir) {
		s, err := openObjects(dir)
		if err != nil {
			return res, err
		}
		defer s.close()
		if entries, err = s.forPrune(res.Grace); err != nil {
			return res, err
		}
		rm = s
	} else {
		if exists(filepath.Join(dir, MetadataFile)) {
			return res, &distckpt.Error{Code: distckpt.CodeInvalid, Message: fmt.Sprintf("'%s' is a checkpoint; "+
				"prune takes the directory that holds checkpoints", dir)}
		}
		var err error
		if entries, err = scan(dir, res.Grace); err != nil {
			return res, err
		}
	}
	res.Actions, res.Order = plan(entries, p, res.Grace)

	var failed []PruneAction
	for _, i := range deletionOrder(res.Actions) {
		a := &res.Actions[i]
		if p.DryRun {
			res.FreedBytes += a.Checkpoint.DiskBytes
			continue
		}
		var err error
		if a.Checkpoint.Status == Committed {
			err = rm.removeCheckpoint(&a.Checkpoint)
		} else {
			err = rm.removeLeftovers(&a.Checkpoint, res.Grace)
		}
		if errors.Is(err, fs.ErrNotExist) {
			err = nil // someone else removed it first
		}
		if err != nil {
			a.Err = err
			failed = append(failed, *a)
			continue
		}
		a.Deleted = true
		res.FreedBytes += a.Checkpoint.DiskBytes
	}
	if len(failed) > 0 {
		return res, &PruneError{Dir: dir, Failed: failed}
	}
	return res, nil
}

// plan decides what happens to every directory of the store: the library's judgement for the leftovers, the policy for
// the committed checkpoints. It touches nothing.
func plan(entries []*Checkpoint, p PrunePolicy, grace time.Duration) ([]PruneAction, Order) {
	var actions []PruneAction
	keep := func(c *Checkpoint, reason string) {
		actions = append(actions, PruneAction{Checkpoint: *c, Action: Keep, Reason: reason})
	}
	del := func(c *Checkpoint, reason string) {
		actions = append(actions, PruneAction{Checkpoint: *c, Action: Delete, Reason: reason})
	}

	// What must not be deleted whatever the policy: symlink targets, and names a kept staging directory will commit.
	pinned := map[string]string{}
	var committed []*Checkpoint
	for _, c := range entries {
		if c.Symlink != "" {
			target := c.Symlink
			if !filepath.IsAbs(target) {
				target = filepath.Join(filepath.Dir(c.Path), target)
			}
			if filepath.Dir(filepath.Clean(target)) == filepath.Clean(filepath.Dir(c.Path)) {
				pinned[filepath.Base(target)] = "a symbolic link points to it (" + c.Name + ")"
			}
		} else if c.Status == Committed {
			committed = append(committed, c)
		}
	}

	// Garbage first, so that staging directories that stay can pin their target.
	for _, c := range entries {
		if c.Objects != nil {
			objectGarbage(c, grace, keep, del, pinned)
			continue
		}
		if c.Symlink != "" {
			keep(c, "symbolic link (not followed)")
			continue
		}
		if l := c.leftover; l != nil {
			if l.Garbage && c.Status.Leftover() {
				del(c, l.Reason)
				continue
			}
			keep(c, l.Reason)
			if c.Status != Replaced && c.Status != Deleting && c.FinalName != "" {
				pinned[c.FinalName] = "a staging directory next to it may be committing over it"
			}
			continue
		}
		if c.Status == Corrupt || c.Status == Unreadable {
			keep(c, "metadata cannot be read: not touched (check it with ls/inspect)")
		}
		if c.Status == Foreign {
			keep(c, "written by another library ("+foreignFormat(c)+"): not distckpt's to prune")
		}
		// NotACheckpoint: not ours, never mentioned. Committed: below.
	}

	// Committed checkpoints: newest last.
	order := ByStep
	for _, c := range committed {
		if c.Step == nil {
			order = ByModTime
			if c.Objects != nil {
				order = ByName // all are below one URL: none has a modification time
			}
		}
	}
	sort.SliceStable(committed, func(i, j int) bool {
		a, b := committed[i], committed[j]
		if order == ByStep && *a.Step != *b.Step {
			return *a.Step < *b.Step
		}
		if !a.ModTime.Equal(b.ModTime) {
			return a.ModTime.Before(b.ModTime)
		}
		return naturalLess(a.Name, b.Name)
	})
	var decided []PruneAction
	for i, c := range committed {
		fromEnd := len(committed) - i
		a := PruneAction{Checkpoint: *c, Action: Keep}
		switch {
		case fromEnd <= p.KeepLast:
			a.Reason = fmt.Sprintf("among the last %d (by %s)", p.KeepLast, order)
		case p.KeepEvery > 0 && c.Step != nil && *c.Step%int64(p.KeepEvery) == 0:
			a.Reason = fmt.Sprintf("step is a multiple of %d", p.KeepEvery)
		case pinned[c.Name] != "":
			a.Reason = pinned[c.Name]
		default:
			a.Action, a.Reason = Delete, fmt.Sprintf("older than the last %d (by %s)", p.KeepLast, order)
		}
		if a.Action == Keep {
			// Below a URL, what other saves left beside a kept checkpoint goes (garbage: listed before the policy's
			// decisions); a deleted one's leftovers go with it.
			if g := objectLeftoversBeside(c, grace); g != nil {
				actions = append(actions, *g)
			}
		}
		decided = append(decided, a)
	}
	keepBases(decided)
	return append(actions, decided...), order
}

// deletionOrder lists the indices of the Delete actions in their order, except that a checkpoint that another one
// being deleted refers to (a base of an incremental checkpoint) comes after it: the library refuses to remove a base
// while a checkpoint that refers to it is there.
func deletionOrder(actions []PruneAction) []int {
	var order []int
	done := map[int]bool{}
	for len(order) < countDeletes(actions) {
		progressed := false
		for i := range actions {
			if actions[i].Action != Delete || done[i] || referredToByPending(actions, done, i) {
				continue
			}
			order, done[i], progressed = append(order, i), true, true
		}
		if !progressed { // a cycle (a replaced base): the library judges each removal
			for i := range actions {
				if actions[i].Action == Delete && !done[i] {
					order, done[i] = append(order, i), true
				}
			}
		}
	}
	return order
}

func countDeletes(actions []PruneAction) int {
	n := 0
	for i := range actions {
		if actions[i].Action == Delete {
			n++
		}
	}
	return n
}

// referredToByPending: another Delete action not yet ordered is an incremental checkpoint with actions[i] as a base.
func referredToByPending(actions []PruneAction, done map[int]bool, i int) bool {
	for j := range actions {
		if j == i || done[j] || actions[j].Action != Delete || actions[j].Checkpoint.Info == nil {
			continue
		}
		for _, b := range actions[j].Checkpoint.Info.Bases {
			if b == actions[i].Checkpoint.Name {
				return true
			}
		}
	}
	return false
}

// keepBases keeps every checkpoint that a kept one refers to (its bases: an incremental checkpoint reads their data
// files), and theirs in turn, whatever the policy said: deleting one would break the kept checkpoint.
func keepBases(decided []PruneAction) {
	byName := map[string]*PruneAction{}
	for i := range decided {
		byName[decided[i].Checkpoint.Name] = &decided[i]
	}
	for changed := true; changed; {
		changed = false
		for i := range decided {
			a := &decided[i]
			if a.Action != Keep || a.Checkpoint.Info == nil {
				continue
			}
			for _, base := range a.Checkpoint.Info.Bases {
				if b := byName[base]; b != nil && b.Action == Delete {
					b.Action, b.Reason = Keep, "a kept incremental checkpoint refers to it ("+a.Checkpoint.Name+")"
					changed = true
				}
			}
		}
	}
}

// remover removes what Prune decided to delete: from a directory (dirRemover) or below a URL (objectStore).
type remover interface {
	removeCheckpoint(c *Checkpoint) error
	removeLeftovers(c *Checkpoint, grace time.Duration) error
}

// dirRemover removes directories of a store on a file system.
type dirRemover struct{}

func (dirRemover) removeCheckpoint(c *Checkpoint) error { return deleteCheckpoint(c) }
func (dirRemover) removeLeftovers(c *Checkpoint, grace time.Duration) error {
	return deleteLeftover(c, grace)
}

// sameDirectory checks that path is still the directory List saw (not a link, not another directory put in its
// place).
func sameDirectory(path string, listed os.FileInfo) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if !fi.IsDir() || listed == nil || !os.SameFile(fi, listed) {
		return fmt.Errorf("'%s' changed since the store was listed (it is no longer the same directory): not deleted",
			path)
	}
	return nil
}

// deleteCheckpoint makes a committed checkpoint disappear atomically (a rename within its directory), checks that what
// it renamed is the directory it listed, then removes it.
func deleteCheckpoint(c *Checkpoint) error {
	path := filepath.Clean(c.Path)
	if err := sameDirectory(path, c.fi); err != nil {
		return err
	}
	nonce := make([]byte, 8)
	if _, err := rand.Read(nonce); err != nil {
		return err
	}
	aside := path + DeletingInfix + hex.EncodeToString(nonce)
	if err := os.Rename(path, aside); err != nil {
		return err
	}
	if err := sameDirectory(aside, c.fi); err != nil {
		// Swapped between the check and the rename: put it back unless its name was taken meanwhile (then it stays
		// under the deleting name, which prune never deletes when it is a link).
		if _, lerr := os.Lstat(path); errors.Is(lerr, fs.ErrNotExist) {
			_ = os.Rename(aside, path)
		}
		return err
	}
	syncDir(filepath.Dir(aside))
	return testhooks.RemoveAll(aside)
}

// deleteLeftover has the library judge the leftover anew and remove it if it is still garbage: moved to a deleting
// name, found there to be the directory it judged, then removed without following links.
func deleteLeftover(c *Checkpoint, grace time.Duration) error {
	err := testhooks.RemoveLeftover(c.Path, grace)
	if errors.Is(err, distckpt.ErrNotFound) {
		if _, lerr := os.Lstat(c.Path); lerr == nil {
			// Something else is there now (a link, a file): not what was listed.
			return &distckpt.Error{Code: distckpt.CodeState, Message: fmt.Sprintf("'%s' changed since the store "+
				"was listed (it is no longer a leftover directory): not deleted", c.Path)}
		}
	}
	return err
}

// syncDir makes a rename in dir durable; failures are ignored (the removal goes on either way).
func syncDir(dir string) {
	if f, err := os.Open(dir); err == nil {
		_ = f.Sync()
		f.Close()
	}
}

// HumanDuration prints a duration the way Prune's reasons (and the CLI's ls) do: "3h12m", "45m", "20s".
func HumanDuration(d time.Duration) string {
	switch {
	case d >= time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	case d >= time.Minute:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	default:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	}
}

// foreignFormat names the format of a Foreign checkpoint ("safetensors").
func foreignFormat(c *Checkpoint) string {
	if c.Info != nil {
		return string(c.Info.Format)
	}
	return "foreign"
}
