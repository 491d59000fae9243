package main

// ls, prune, inspect and verify on storage other than a POSIX directory: "s3://bucket/prefix" URLs (package
// distckpt.dev/go/s3, configured from the AWS_* environment). There, a checkpoint is a prefix with metadata.dckpt
// (written last: the commit), and what unfinished saves leave is recognised by the library (dckpt_storage_stat):
// STAGING.<nonce> markers and nonced data files.

import (
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/s3"
	"distckpt.dev/go/store"
)

// storageOpener makes the storage for a URL of its scheme, and the path the library is given for it.
type storageOpener func(url string) (h *distckpt.StorageHandle, path string, err error)

// storageSchemes maps a URL scheme to its storage; tests add one of their own.
var storageSchemes = map[string]storageOpener{
	"s3": func(url string) (*distckpt.StorageHandle, string, error) {
		c, err := s3.NewFromEnv()
		if err != nil {
			return nil, "", err
		}
		h, err := distckpt.NewStorage(c, 0)
		return h, strings.TrimSuffix(url, "/"), err
	},
}

// remote returns the storage for arg when it is a URL of a known scheme ("s3://..."), nil for a plain path (POSIX:
// the existing behaviour). An unknown scheme is an error.
func remote(arg string) (*distckpt.StorageHandle, string, error) {
	scheme, _, ok := strings.Cut(arg, "://")
	if !ok || strings.ContainsAny(scheme, "/.") {
		return nil, arg, nil
	}
	open, known := storageSchemes[scheme]
	if !known {
		return nil, "", &distckpt.Error{Code: distckpt.CodeUnsupported,
			Message: fmt.Sprintf("%s: unknown storage %q (supported: s3://bucket/prefix, or a local path)", arg, scheme)}
	}
	return open(arg)
}

// openReader opens the checkpoint at arg (a path or a URL); close releases the reader and its storage.
func openReader(arg string, opts *distckpt.ReadOptions) (*distckpt.Reader, error) {
	h, path, err := remote(arg)
	if err != nil {
		return nil, err
	}
	if h == nil {
		return distckpt.Open(arg, opts)
	}
	defer h.Close() // the reader keeps it alive
	o := distckpt.ReadOptions{}
	if opts != nil {
		o = *opts
	}
	o.Storage = h
	return distckpt.Open(path, &o)
}

// objectEntry is one child of a prefix of an object store, as ls and prune see it.
type objectEntry struct {
	ckpt store.Checkpoint
	info distckpt.PathInfo
}

// scanObjects lists the checkpoints (committed or not) directly below dir; with all, the other children too. A dir
// that is itself a checkpoint is listed alone.
func scanObjects(h *distckpt.StorageHandle, dir string, all bool, grace time.Duration) ([]objectEntry, error) {
	self, err := h.Stat(dir, grace)
	if err != nil {
		return nil, err
	}
	var paths []string
	if self.Kind == distckpt.PathCheckpoint {
		paths = []string{dir}
	} else {
		names, err := h.Storage().List(dir)
		if err != nil {
			return nil, fmt.Errorf("listing %s: %w", dir, err)
		}
		if len(names) == 0 && self.Kind == distckpt.PathNone {
			return nil, &distckpt.Error{Code: distckpt.CodeNotFound, Message: fmt.Sprintf("%s: nothing there", dir)}
		}
		sort.Slice(names, func(i, j int) bool { return store.NaturalLess(names[i], names[j]) })
		for _, n := range names {
			paths = append(paths, dir+"/"+n)
		}
	}
	var out []objectEntry
	for _, p := range paths {
		info, err := h.Stat(p, grace)
		if err != nil {
			return nil, err
		}
		name := p[strings.LastIndex(p, "/")+1:]
		e := objectEntry{ckpt: store.Checkpoint{Name: name, Path: p, DiskBytes: info.Bytes}, info: info}
		switch info.Kind {
		case distckpt.PathCheckpoint:
			describeCommitted(h, &e.ckpt)
		case distckpt.PathIncomplete:
			e.ckpt.Status = store.Incomplete
		default:
			if !all {
				continue
			}
			e.ckpt.Status = store.NotACheckpoint
		}
		out = append(out, e)
	}
	return out, nil
}

// describeCommitted opens a committed checkpoint for its step, summary and user metadata.
func describeCommitted(h *distckpt.StorageHandle, c *store.Checkpoint) {
	r, err := distckpt.Open(c.Path, &distckpt.ReadOptions{Storage: h, NoVerify: true})
	if err != nil {
		c.Status, c.Err = store.Unreadable, err
		if errors.Is(err, distckpt.ErrCorrupt) || errors.Is(err, distckpt.ErrVersion) {
			c.Status = store.Corrupt
		}
		return
	}
	defer r.Close()
	c.Status = store.Committed
	if info, err := r.Info(); err == nil {
		c.Info = &info
	}
	if user, err := r.UserMetadata(); err == nil {
		c.User = user
		if raw, ok := user["step"]; ok {
			c.StepRaw = raw
			if s, err := strconv.ParseInt(raw, 10, 64); err == nil {
				c.Step = &s
			}
		}
	}
}

// objectNote is ls's remark for a child of an object store.
func objectNote(e *objectEntry) string {
	var parts []string
	switch e.ckpt.Status {
	case store.Incomplete:
		if e.info.SavesInProgress > 0 {
			parts = append(parts, fmt.Sprintf("%d save(s) in progress", e.info.SavesInProgress))
		}
		if e.info.LeftoverFiles > 0 {
			parts = append(parts, fmt.Sprintf("%d leftover file(s) of unfinished saves (%s)", e.info.LeftoverFiles,
				humanBytes(e.info.LeftoverBytes)))
		}
	case store.Committed:
		if e.info.LeftoverFiles > 0 {
			parts = append(parts, fmt.Sprintf("%d leftover file(s) of other saves (%s)", e.info.LeftoverFiles,
				humanBytes(e.info.LeftoverBytes)))
		}
	case store.Corrupt, store.Unreadable:
		parts = append(parts, errorJSON(e.ckpt.Err).Message)
	}
	return strings.Join(parts, "; ")
}

func runLsObjects(c *ctx, h *distckpt.StorageHandle, dir, path string, all bool) int {
	entries, err := scanObjects(h, path, all, store.DefaultGrace)
	if err != nil {
		return c.fail(err, dir)
	}
	shown := make([]store.Checkpoint, len(entries))
	for i := range entries {
		shown[i] = entries[i].ckpt
	}
	// An object store keeps no dates distckpt can read.
	return writeListing(c, dir, shown, func(i int) (string, string) { return "-", objectNote(&entries[i]) })
}

// pruneObjects plans and applies prune's policy to the checkpoints below dir on an object store: committed ones the
// policy does not keep are removed (metadata first: dckpt_storage_remove_checkpoint), and leftovers of unfinished or
// superseded saves older than the grace period are removed (dckpt_storage_remove_leftovers), next to kept
// checkpoints too. Checkpoints are ordered by step when all have an integer one, else by name (natural order):
// object stores give no modification time here.
func pruneObjects(h *distckpt.StorageHandle, dir string, p store.PrunePolicy, grace time.Duration) (store.PruneResult,
	error) {
	res := store.PruneResult{Dir: dir, DryRun: p.DryRun, Grace: grace, Order: store.ByStep}
	self, err := h.Stat(dir, grace)
	if err != nil {
		return res, err
	}
	if self.Kind == distckpt.PathCheckpoint {
		return res, &distckpt.Error{Code: distckpt.CodeInvalid, Message: fmt.Sprintf("'%s' is a checkpoint; prune "+
			"takes the prefix that holds checkpoints", dir)}
	}
	entries, err := scanObjects(h, dir, false, grace)
	if err != nil {
		return res, err
	}
	var committed []*objectEntry
	for i := range entries {
		if e := &entries[i]; e.ckpt.Status == store.Committed {
			committed = append(committed, e)
			if e.ckpt.Step == nil {
				res.Order = "name"
			}
		}
	}
	sort.SliceStable(committed, func(i, j int) bool {
		a, b := committed[i].ckpt, committed[j].ckpt
		if res.Order == store.ByStep && *a.Step != *b.Step {
			return *a.Step < *b.Step
		}
		return store.NaturalLess(a.Name, b.Name)
	})
	keep := map[*objectEntry]string{}
	for i, e := range committed {
		if i >= len(committed)-p.KeepLast {
			keep[e] = fmt.Sprintf("among the last %d (by %s)", p.KeepLast, res.Order)
		} else if p.KeepEvery > 0 && e.ckpt.Step != nil && *e.ckpt.Step%int64(p.KeepEvery) == 0 {
			keep[e] = fmt.Sprintf("step is a multiple of %d", p.KeepEvery)
		}
	}
	var failed []store.PruneAction
	act := func(a store.PruneAction, do func() error, freed uint64) {
		if a.Action == store.Delete {
			if p.DryRun {
				res.FreedBytes += freed
			} else if err := do(); err != nil && !errors.Is(err, fs.ErrNotExist) {
				a.Err = err
				failed = append(failed, a)
			} else {
				a.Deleted = true
				res.FreedBytes += freed
			}
		}
		res.Actions = append(res.Actions, a)
	}
	removeLeftovers := func(path string) func() error {
		return func() error { return h.RemoveLeftovers(path, grace, false, nil) }
	}
	// Garbage first, as for a directory store.
	for i := range entries {
		e := &entries[i]
		switch {
		case e.ckpt.Status == store.Incomplete && e.info.LeftoverFiles > 0:
			act(store.PruneAction{Checkpoint: e.ckpt, Action: store.Delete,
				Reason: fmt.Sprintf("leftovers of unfinished saves, idle for more than %s", store.HumanDuration(grace))},
				removeLeftovers(e.ckpt.Path), e.info.LeftoverBytes)
		case e.ckpt.Status == store.Incomplete:
			act(store.PruneAction{Checkpoint: e.ckpt, Action: store.Keep, Reason: "a save is in progress"}, nil, 0)
		case e.ckpt.Status == store.Committed && e.info.LeftoverFiles > 0 && keep[e] != "":
			g := e.ckpt
			g.Status, g.DiskBytes = store.Incomplete, e.info.LeftoverBytes
			act(store.PruneAction{Checkpoint: g, Action: store.Delete,
				Reason: "files of superseded or unfinished saves next to the kept checkpoint"},
				removeLeftovers(e.ckpt.Path), e.info.LeftoverBytes)
		}
	}
	for _, e := range committed {
		if reason, ok := keep[e]; ok {
			act(store.PruneAction{Checkpoint: e.ckpt, Action: store.Keep, Reason: reason}, nil, 0)
			continue
		}
		path := e.ckpt.Path
		act(store.PruneAction{Checkpoint: e.ckpt, Action: store.Delete,
			Reason: fmt.Sprintf("older than the last %d (by %s)", p.KeepLast, res.Order)},
			func() error { return h.RemoveCheckpoint(path) }, e.info.Bytes)
	}
	for i := range entries {
		if e := &entries[i]; e.ckpt.Status == store.Corrupt || e.ckpt.Status == store.Unreadable {
			act(store.PruneAction{Checkpoint: e.ckpt, Action: store.Keep,
				Reason: "its metadata does not open: never deleted (look at it with ls and inspect)"}, nil, 0)
		}
	}
	if len(failed) > 0 {
		return res, &store.PruneError{Dir: dir, Failed: failed}
	}
	return res, nil
}
