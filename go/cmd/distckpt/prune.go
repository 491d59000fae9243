package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"
)

var pruneCommand = &command{
	name:    "prune",
	args:    "--keep-last N [--keep-every K] [--grace D] [--dry-run] [--json] DIR",
	summary: "delete old committed checkpoints and abandoned staging directories under DIR",
	help: `
Committed checkpoints are ordered by their user metadata "step" when every one has an integer step, otherwise by
their directory's modification time. The last N are kept, and with --keep-every K also every checkpoint whose step is
a multiple of K. Others are deleted safely: each is first renamed to <name>.dckpt-deleting-<nonce> (so it disappears
atomically, never half-deleted under its own name), then removed.

Never deleted: a checkpoint that a symbolic link in DIR points to; a checkpoint with a staging directory of the same
name next to it (an overwrite may be committing); corrupt or unreadable checkpoints (they might be a newer format
version: look at them with ls and inspect); symbolic links themselves (never followed).

Garbage is removed once it has been idle (newest modification time of the directory and the files in it) for longer
than --grace: <name>.dckpt-staging-<nonce> directories left by crashed writers (complete-unrenamed ones too: their save
died before its rename and never reported success), <name>.dckpt-old-<nonce> directories left by overwrites, and
<name>.dckpt-deleting-<nonce> left by an interrupted prune. A staging directory whose STAGING
marker names a process on this host that is still running is never removed, however old.

--dry-run prints the plan and deletes nothing. Exit status: 0 done; 3 a deletion failed (the rest went on).

JSON: {"directory": str, "dry_run": bool, "order": "step"|"mtime", "keep_last": int, "keep_every": int|null,
  "grace_seconds": float, "freed_bytes": int (would be freed, for a dry run),
  "actions": [{"name": str, "path": str, "status": str (as in ls), "step": int|null, "bytes": int,
               "action": "keep"|"delete", "reason": str, "deleted": bool, "error": {"code", "message"}|null}]}`,
	run: runPrune,
}

type pruneAction struct {
	Name    string     `json:"name"`
	Path    string     `json:"path"`
	Status  string     `json:"status"`
	Step    *int64     `json:"step"`
	Bytes   uint64     `json:"bytes"`
	Action  string     `json:"action"`
	Reason  string     `json:"reason"`
	Deleted bool       `json:"deleted"`
	Error   *jsonError `json:"error"`
	entry   *entry
}

type prunePolicy struct {
	keepLast  int
	keepEvery int
	grace     time.Duration
}

// planPrune decides what happens to every entry of the store. It touches nothing.
func planPrune(entries []*entry, p prunePolicy, now time.Time) (actions []*pruneAction, order string) {
	keep := func(e *entry, reason string) {
		actions = append(actions, &pruneAction{entry: e, Action: "keep", Reason: reason})
	}
	del := func(e *entry, reason string) {
		actions = append(actions, &pruneAction{entry: e, Action: "delete", Reason: reason})
	}

	// What must not be deleted whatever the policy: symlink targets, and names a kept staging directory will commit.
	pinned := map[string]string{}
	var committed []*entry
	for _, e := range entries {
		if e.Symlink != "" {
			target := e.Symlink
			if !filepath.IsAbs(target) {
				target = filepath.Join(filepath.Dir(e.Path), target)
			}
			if filepath.Dir(filepath.Clean(target)) == filepath.Clean(filepath.Dir(e.Path)) {
				pinned[filepath.Base(target)] = "a symbolic link points to it (" + e.Name + ")"
			}
		} else if e.Status == statusCommitted {
			committed = append(committed, e)
		}
	}

	// Garbage first, so that staging directories that stay can pin their target.
	for _, e := range entries {
		if e.Symlink != "" {
			keep(e, "symbolic link (not followed)")
			continue
		}
		idle := now.Sub(e.LastActive)
		switch e.Status {
		case statusStaging:
			switch {
			case e.Writer != nil && e.Writer.State == "running":
				keep(e, fmt.Sprintf("being written: writer pid %d on this host is running", e.Writer.PID))
			case idle <= p.grace:
				keep(e, fmt.Sprintf("active %s ago, within the %s grace period", humanDuration(idle), p.grace))
			case e.Writer != nil && e.Writer.State == "exited":
				del(e, fmt.Sprintf("abandoned: writer pid %d on this host has exited; idle %s", e.Writer.PID,
					humanDuration(idle)))
			case e.Writer != nil:
				del(e, fmt.Sprintf("abandoned: idle %s (writer pid %d on host %s)", humanDuration(idle), e.Writer.PID,
					e.Writer.Host))
			default:
				del(e, fmt.Sprintf("abandoned: idle %s, no STAGING marker", humanDuration(idle)))
			}
			if last := actions[len(actions)-1]; last.Action == "keep" && e.FinalName != "" {
				pinned[e.FinalName] = "a staging directory next to it may be committing over it"
			}
		case statusUnrenamed:
			// Every rank had finished, but the save died before its rename: it never reported success, so it is
			// garbage once nothing has touched it for the grace period (FORMAT.md section 6).
			if idle <= p.grace {
				keep(e, fmt.Sprintf("complete but not renamed, active %s ago: a commit may be in progress",
					humanDuration(idle)))
				if e.FinalName != "" {
					pinned[e.FinalName] = "a staging directory next to it may be committing over it"
				}
			} else {
				del(e, fmt.Sprintf("a save that died before its rename (it never reported success); idle %s",
					humanDuration(idle)))
			}
		case statusReplaced, statusDeleting:
			if idle <= p.grace {
				keep(e, fmt.Sprintf("leftover, but active %s ago, within the %s grace period", humanDuration(idle),
					p.grace))
			} else {
				del(e, fmt.Sprintf("leftover of an interrupted %s, idle %s", map[string]string{
					statusReplaced: "overwrite", statusDeleting: "prune"}[e.Status], humanDuration(idle)))
			}
		case statusCorrupt, statusError:
			keep(e, "metadata cannot be read: not touched (check it with ls/inspect)")
		case statusOther:
			// Not ours: never mentioned.
		}
	}

	// Committed checkpoints: newest last.
	order = "step"
	for _, e := range committed {
		if e.Step == nil {
			order = "mtime"
		}
	}
	sort.SliceStable(committed, func(i, j int) bool {
		a, b := committed[i], committed[j]
		if order == "step" && *a.Step != *b.Step {
			return *a.Step < *b.Step
		}
		if !a.ModTime.Equal(b.ModTime) {
			return a.ModTime.Before(b.ModTime)
		}
		return naturalLess(a.Name, b.Name)
	})
	for i, e := range committed {
		fromEnd := len(committed) - i
		switch {
		case fromEnd <= p.keepLast:
			keep(e, fmt.Sprintf("among the last %d (by %s)", p.keepLast, order))
		case p.keepEvery > 0 && e.Step != nil && *e.Step%int64(p.keepEvery) == 0:
			keep(e, fmt.Sprintf("step is a multiple of %d", p.keepEvery))
		case pinned[e.Name] != "":
			keep(e, pinned[e.Name])
		default:
			del(e, fmt.Sprintf("older than the last %d (by %s)", p.keepLast, order))
		}
	}
	for _, a := range actions {
		a.Name, a.Path, a.Status, a.Step, a.Bytes = a.entry.Name, a.entry.Path, a.entry.Status, a.entry.Step,
			a.entry.DiskBytes
	}
	return actions, order
}

// deleteCheckpoint makes a committed checkpoint disappear atomically (a rename within its directory), then removes it.
func deleteCheckpoint(path string) error {
	nonce := make([]byte, 8)
	if _, err := rand.Read(nonce); err != nil {
		return err
	}
	aside := filepath.Clean(path) + deletingInfix + hex.EncodeToString(nonce)
	if err := os.Rename(path, aside); err != nil {
		return err
	}
	syncDir(filepath.Dir(aside))
	return removeAll(aside)
}

// removeAll is os.RemoveAll; tests make it fail.
var removeAll = os.RemoveAll

// syncDir makes a rename in dir durable; failures are ignored (the removal goes on either way).
func syncDir(dir string) {
	if f, err := os.Open(dir); err == nil {
		_ = f.Sync()
		f.Close()
	}
}

func runPrune(c *ctx, args []string) int {
	fs := c.flags()
	keepLast := fs.Int("keep-last", 0, "keep the newest `N` committed checkpoints (required, >= 1)")
	keepEvery := fs.Int("keep-every", 0, "also keep every checkpoint whose step is a multiple of `K`")
	grace := fs.Duration("grace", time.Hour, "leave garbage alone until it has been idle this long")
	dryRun := fs.Bool("dry-run", false, "print the plan; delete nothing")
	pos, st := c.parse(fs, args, 1, 1)
	if st >= 0 {
		return st
	}
	if *keepLast < 1 {
		return c.usageError("--keep-last N is required and must be >= 1 (prune never deletes every checkpoint)")
	}
	if *keepEvery < 0 || *grace < 0 {
		return c.usageError("--keep-every and --grace must not be negative")
	}
	dir := pos[0]
	if exists(filepath.Join(dir, metadataFile)) {
		return c.usageError("%s is a checkpoint; prune takes the directory that holds checkpoints", dir)
	}
	entries, err := scanStore(dir)
	if err != nil {
		return c.fail(exitFailure, err)
	}
	actions, order := planPrune(entries, prunePolicy{*keepLast, *keepEvery, *grace}, timeNow())

	status := exitOK
	var freed uint64
	for _, a := range actions {
		if a.Action != "delete" {
			continue
		}
		if *dryRun {
			freed += a.Bytes
			continue
		}
		var err error
		if a.Status == statusCommitted {
			err = deleteCheckpoint(a.Path)
		} else {
			err = removeAll(a.Path)
		}
		if errors.Is(err, os.ErrNotExist) {
			err = nil // someone else removed it first
		}
		if err != nil {
			a.Error = errorJSON(err)
			status = exitFailure
			fmt.Fprintf(c.stderr, "distckpt prune: %v\n", err)
			continue
		}
		a.Deleted = true
		freed += a.Bytes
	}

	if c.json {
		out := struct {
			Directory    string         `json:"directory"`
			DryRun       bool           `json:"dry_run"`
			Order        string         `json:"order"`
			KeepLast     int            `json:"keep_last"`
			KeepEvery    *int           `json:"keep_every"`
			GraceSeconds float64        `json:"grace_seconds"`
			FreedBytes   uint64         `json:"freed_bytes"`
			Actions      []*pruneAction `json:"actions"`
		}{dir, *dryRun, order, *keepLast, nil, grace.Seconds(), freed, actions}
		if *keepEvery > 0 {
			out.KeepEvery = keepEvery
		}
		if out.Actions == nil {
			out.Actions = []*pruneAction{}
		}
		c.writeJSON(out)
		return status
	}
	policy := fmt.Sprintf("keep the last %d by %s", *keepLast, order)
	if *keepEvery > 0 {
		policy += fmt.Sprintf(", and every step that is a multiple of %d", *keepEvery)
	}
	mode := ""
	if *dryRun {
		mode = " (dry run: nothing is deleted)"
	}
	fmt.Fprintf(c.stdout, "prune %s: %s; garbage idle for more than %s%s\n", dir, policy, *grace, mode)
	tw := newTable(c.stdout)
	for _, a := range actions {
		verb := a.Action
		if a.Action == "delete" {
			switch {
			case *dryRun:
				verb = "would delete"
			case a.Deleted:
				verb = "deleted"
			default:
				verb = "FAILED to delete"
			}
		}
		step := ""
		if a.Step != nil {
			step = fmt.Sprintf("step %d", *a.Step)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", verb, a.Name, a.Status, step, humanBytes(a.Bytes), a.Reason)
	}
	tw.Flush()
	verb := "freed"
	if *dryRun {
		verb = "would free"
	}
	fmt.Fprintf(c.stdout, "%s %s\n", verb, humanBytes(freed))
	return status
}
