package main

import (
	"errors"
	"fmt"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/store"
)

var pruneCommand = &command{
	name:    "prune",
	args:    "--keep-last N [--keep-every K] [--grace D] [--dry-run] [--json] DIR",
	summary: "delete old committed checkpoints and abandoned staging directories under DIR (or an s3:// prefix)",
	help: `
Committed checkpoints are ordered by their user metadata "step" when every one has an integer step, otherwise by
their directory's modification time. The last N are kept, and with --keep-every K also every checkpoint whose step is
a multiple of K. Others are deleted safely: each is first renamed to <name>.dckpt-deleting-<nonce> (so it disappears
atomically, never half-deleted under its own name), then removed; one that changed since it was listed (swapped for
a link or another directory) is put back and not deleted.

Never deleted: a checkpoint that a symbolic link in DIR points to; a checkpoint with a staging directory of the same
name next to it (an overwrite may be committing); corrupt or unreadable checkpoints (they might be a newer format
version: look at them with ls and inspect); symbolic links themselves (never followed); directories that are neither
checkpoints nor leftovers of one.

Garbage is removed once it has been idle (newest modification time of the directory and the files in it) for longer
than --grace: <name>.dckpt-staging-<nonce> directories left by crashed writers (complete-unrenamed ones too: their save
died before its rename and never reported success), <name>.dckpt-old-<nonce> directories left by overwrites, and
<name>.dckpt-deleting-<nonce> left by an interrupted prune. A staging directory whose STAGING
marker names a process on this host that is still running is never removed, however old.

Below an s3://bucket/prefix URL (store.Prune's rules there): committed checkpoints are ordered by step, else by name
(natural order: "order": "name"), and one to delete is removed metadata first (it stops existing in one step), then
its data files, unless a save started there since the listing. What unfinished or superseded saves left
(STAGING.<nonce> markers older than --grace or of an exited writer of this host, data files no metadata names) is
removed, beside kept checkpoints too. A prefix where a save is in progress is kept whole, and so is a committed
checkpoint one may be overwriting. Objects distckpt did not write are never removed.

--dry-run prints the plan and deletes nothing. Exit status: 0 done; a deletion that failed gives the status of its
error (3, or 7 for a permission error: see "distckpt help"), and the rest went on.

JSON: {"schema_version": 1, "directory": str, "dry_run": bool, "order": "step"|"mtime"|"name",
  "keep_last": int, "keep_every": int|null, "grace_seconds": float, "freed_bytes": int (would be freed, for a dry run),
  "actions": [{"name": str, "path": str, "status": str (as in ls), "step": int|null, "bytes": int,
               "action": "keep"|"delete", "reason": str, "deleted": bool, "error": {"code", "message"}|null}]}`,
	run: runPrune,
}

type pruneActionJSON struct {
	Name    string     `json:"name"`
	Path    string     `json:"path"`
	Status  string     `json:"status"`
	Step    *int64     `json:"step"`
	Bytes   uint64     `json:"bytes"`
	Action  string     `json:"action"`
	Reason  string     `json:"reason"`
	Deleted bool       `json:"deleted"`
	Error   *jsonError `json:"error"`
}

func runPrune(c *ctx, args []string) int {
	fs := c.flags()
	keepLast := fs.Int("keep-last", 0, "keep the newest `N` committed checkpoints (required, >= 1)")
	keepEvery := fs.Int("keep-every", 0, "also keep every checkpoint whose step is a multiple of `K`")
	grace := fs.Duration("grace", store.DefaultGrace, "leave garbage alone until it has been idle for `D`")
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
	policy := store.PrunePolicy{KeepLast: *keepLast, KeepEvery: *keepEvery, Grace: *grace, DryRun: *dryRun,
		Now: timeNow()}
	if *grace == 0 {
		policy.Grace = store.NoGrace
	}
	res, err := store.Prune(dir, policy)
	var perr *store.PruneError
	var invalid *distckpt.Error
	if errors.As(err, &invalid) && invalid.Code == distckpt.CodeInvalid {
		// The policy was checked above: DIR is itself a checkpoint.
		return c.usageError("%s", invalid.Message)
	}
	if err != nil && !errors.As(err, &perr) {
		return c.fail(err, dir)
	}
	status := exitOK
	if perr != nil {
		for _, a := range perr.Failed {
			fmt.Fprintf(c.stderr, "distckpt prune: %v\n", a.Err)
		}
		status = exitStatus(perr.Failed[0].Err)
	}

	if c.json {
		out := struct {
			Directory    string            `json:"directory"`
			DryRun       bool              `json:"dry_run"`
			Order        string            `json:"order"`
			KeepLast     int               `json:"keep_last"`
			KeepEvery    *int              `json:"keep_every"`
			GraceSeconds float64           `json:"grace_seconds"`
			FreedBytes   uint64            `json:"freed_bytes"`
			Actions      []pruneActionJSON `json:"actions"`
		}{dir, *dryRun, string(res.Order), *keepLast, nil, grace.Seconds(), res.FreedBytes, []pruneActionJSON{}}
		if *keepEvery > 0 {
			out.KeepEvery = keepEvery
		}
		for _, a := range res.Actions {
			out.Actions = append(out.Actions, pruneActionJSON{
				Name: a.Checkpoint.Name, Path: a.Checkpoint.Path, Status: string(a.Checkpoint.Status),
				Step: a.Checkpoint.Step, Bytes: a.Checkpoint.DiskBytes, Action: string(a.Action), Reason: a.Reason,
				Deleted: a.Deleted, Error: errorJSON(a.Err),
			})
		}
		c.writeJSON(out)
		return status
	}
	desc := fmt.Sprintf("keep the last %d by %s", *keepLast, res.Order)
	if *keepEvery > 0 {
		desc += fmt.Sprintf(", and every step that is a multiple of %d", *keepEvery)
	}
	mode := ""
	if *dryRun {
		mode = " (dry run: nothing is deleted)"
	}
	fmt.Fprintf(c.stdout, "prune %s: %s; garbage idle for more than %s%s\n", dir, desc, *grace, mode)
	tw := newTable(c.stdout)
	for _, a := range res.Actions {
		verb := string(a.Action)
		if a.Action == store.Delete {
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
		if a.Checkpoint.Step != nil {
			step = fmt.Sprintf("step %d", *a.Checkpoint.Step)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", verb, a.Checkpoint.Name, a.Checkpoint.Status, step,
			humanBytes(a.Checkpoint.DiskBytes), a.Reason)
	}
	tw.Flush()
	verb := "freed"
	if *dryRun {
		verb = "would free"
	}
	fmt.Fprintf(c.stdout, "%s %s\n", verb, humanBytes(res.FreedBytes))
	return status
}
