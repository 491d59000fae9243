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
	// Now is the time idleness is measured against; zero means time.Now().
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
// and "<name>.dckpt-deleting-<nonce>" directories of an interrupted prune.
//
// A committed checkpoint is first renamed to "<name>.dckpt-deleting-<nonce>", so it disappears from its name at once
// and is never seen half-deleted, then removed; a directory that is no longer the one listed (swapped for a link or
// another directory meanwhile) is put back and not deleted.
//
// Never deleted, whatever the policy: symbolic links and what they point to (never followed); a checkpoint a symbolic
// link in dir points to; a checkpoint with a staging directory of the same name next to it that is kept (an overwrite
// may be committing over it); Corrupt or Unreadable checkpoints (they may be of a newer format version); a staging
// directory whose STAGING marker names a running process on this host, however old; and any directory that is not a
// checkpoint or the leftover of one.
//
// The error is an *distckpt.Error of code CodeInvalid for a bad policy or a dir that is itself a checkpoint, the file
// system's when dir cannot be read, and a *PruneError (with the result filled in) when some deletions failed.
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
	if exists(filepath.Join(dir, MetadataFile)) {
		return res, &distckpt.Error{Code: distckpt.CodeInvalid, Message: fmt.Sprintf("'%s' is a checkpoint; prune "+
			"takes the directory that holds checkpoints", dir)}
	}
	entries, err := scan(dir)
	if err != nil {
		return res, err
	}
	now := p.Now
	if now.IsZero() {
		now = time.Now()
	}
	res.Actions, res.Order = plan(entries, p, res.Grace, now)

	var failed []PruneAction
	for i := range res.Actions {
		a := &res.Actions[i]
		if a.Action != Delete {
			continue
		}
		if p.DryRun {
			res.FreedBytes += a.Checkpoint.DiskBytes
			continue
		}
		var err error
		if a.Checkpoint.Status == Committed {
			err = deleteCheckpoint(&a.Checkpoint)
		} else {
			err = deleteLeftover(&a.Checkpoint)
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

// plan decides what happens to every directory of the store. It touches nothing.
func plan(entries []*Checkpoint, p PrunePolicy, grace time.Duration, now time.Time) ([]PruneAction, Order) {
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
		if c.Symlink != "" {
			keep(c, "symbolic link (not followed)")
			continue
		}
		idle := now.Sub(c.LastActive)
		switch c.Status {
		case Incomplete:
			w := c.Writer
			switch {
			case w != nil && w.State == WriterRunning:
				keep(c, fmt.Sprintf("being written: writer pid %d on this host is running", w.PID))
			case idle <= grace:
				keep(c, fmt.Sprintf("active %s ago, within the %s grace period", HumanDuration(idle), grace))
			case w != nil && w.State == WriterExited:
				del(c, fmt.Sprintf("abandoned: writer pid %d on this host has exited; idle %s", w.PID,
					HumanDuration(idle)))
			case w != nil:
				del(c, fmt.Sprintf("abandoned: idle %s (writer pid %d on host %s)", HumanDuration(idle), w.PID, w.Host))
			default:
				del(c, fmt.Sprintf("abandoned: idle %s, no STAGING marker", HumanDuration(idle)))
			}
			if last := actions[len(actions)-1]; last.Action == Keep && c.FinalName != "" {
				pinned[c.FinalName] = "a staging directory next to it may be committing over it"
			}
		case CompleteUnrenamed:
			// Every rank had finished, but the save died before its rename: it never reported success, so it is
			// garbage once nothing has touched it for the grace period (FORMAT.md section 6).
			if idle <= grace {
				keep(c, fmt.Sprintf("complete but not renamed, active %s ago: a commit may be in progress",
					HumanDuration(idle)))
				if c.FinalName != "" {
					pinned[c.FinalName] = "a staging directory next to it may be committing over it"
				}
			} else {
				del(c, fmt.Sprintf("a save that died before its rename (it never reported success); idle %s",
					HumanDuration(idle)))
			}
		case Replaced, Deleting:
			if idle <= grace {
				keep(c, fmt.Sprintf("leftover, but active %s ago, within the %s grace period", HumanDuration(idle),
					grace))
			} else {
				what := map[Status]string{Replaced: "overwrite", Deleting: "prune"}[c.Status]
				del(c, fmt.Sprintf("leftover of an interrupted %s, idle %s", what, HumanDuration(idle)))
			}
		case Corrupt, Unreadable:
			keep(c, "metadata cannot be read: not touched (check it with ls/inspect)")
		}
		// NotACheckpoint: not ours, never mentioned. Committed: below.
	}

	// Committed checkpoints: newest last.
	order := ByStep
	for _, c := range committed {
		if c.Step == nil {
			order = ByModTime
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
	for i, c := range committed {
		fromEnd := len(committed) - i
		switch {
		case fromEnd <= p.KeepLast:
			keep(c, fmt.Sprintf("among the last %d (by %s)", p.KeepLast, order))
		case p.KeepEvery > 0 && c.Step != nil && *c.Step%int64(p.KeepEvery) == 0:
			keep(c, fmt.Sprintf("step is a multiple of %d", p.KeepEvery))
		case pinned[c.Name] != "":
			keep(c, pinned[c.Name])
		default:
			del(c, fmt.Sprintf("older than the last %d (by %s)", p.KeepLast, order))
		}
	}
	return actions, order
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

// deleteLeftover removes a leftover directory after checking it is still the one listed.
func deleteLeftover(c *Checkpoint) error {
	if err := sameDirectory(c.Path, c.fi); err != nil {
		return err
	}
	return testhooks.RemoveAll(c.Path)
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
