package main

import (
	"fmt"
	"path/filepath"
	"strings"
)

var lsCommand = &command{
	name:    "ls",
	args:    "[--all] [--json] DIR",
	summary: "list the checkpoints under DIR with step, size, entries, date and status",
	help: `
Lists every checkpoint directory directly under DIR (or DIR itself if it is a checkpoint), in natural name order.
STATUS is one of:
  committed           a complete checkpoint (metadata.dckpt, no STAGING marker) whose metadata opens
  incomplete          <name>.dckpt-staging-<nonce> with a STAGING marker: being written now, or abandoned by a
                      crashed writer (the note says whether the writer's process is still running)
  complete-unrenamed  a staging directory whose commit finished writing but was not renamed into place
  corrupt             metadata.dckpt that the library rejects (damaged, truncated, or a newer format version)
  unreadable          metadata.dckpt that could not be read (permissions, I/O error)
  replaced            <name>.dckpt-old-<nonce>: a checkpoint moved aside by an overwrite (garbage)
  deleting            <name>.dckpt-deleting-<nonce>: being removed by prune (garbage)
  not-a-checkpoint    any other directory (shown with --all only)
SIZE is the bytes of the files on disk; DATE is the commit time (or the writer's start time for staging).

JSON: {"directory": str, "checkpoints": [{
  "name": str, "path": str, "status": str (as above),
  "step": int|null (user metadata "step" when it is an integer), "step_raw": str|null,
  "entries": int|null, "data_bytes": int|null (committed only), "bytes": int (on disk),
  "date": RFC 3339 UTC|null, "final_name": str|null (staging/replaced/deleting), "symlink": str|null,
  "writer": {"host": str, "pid": int, "final_path": str, "state": "running"|"exited"|"unknown",
             "started": RFC 3339 UTC|null}|null,
  "error": {"code": str, "message": str}|null}]}`,
	run: runLs,
}

type lsWriterJSON struct {
	*writerInfo
	Started *string `json:"started"`
}

type lsJSON struct {
	Name      string        `json:"name"`
	Path      string        `json:"path"`
	Status    string        `json:"status"`
	Step      *int64        `json:"step"`
	StepRaw   *string       `json:"step_raw"`
	Entries   *int          `json:"entries"`
	DataBytes *uint64       `json:"data_bytes"`
	Bytes     uint64        `json:"bytes"`
	Date      *string       `json:"date"`
	FinalName *string       `json:"final_name"`
	Symlink   *string       `json:"symlink"`
	Writer    *lsWriterJSON `json:"writer"`
	Error     *jsonError    `json:"error"`
}

func strOrNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (e *entry) json() lsJSON {
	j := lsJSON{
		Name: e.Name, Path: e.Path, Status: e.Status, Step: e.Step, StepRaw: strOrNil(e.StepRaw), Entries: e.Entries,
		DataBytes: e.DataBytes, Bytes: e.DiskBytes, Date: jsonTime(e.Date), FinalName: strOrNil(e.FinalName),
		Symlink: strOrNil(e.Symlink), Error: errorJSON(e.Err),
	}
	if e.Writer != nil {
		j.Writer = &lsWriterJSON{e.Writer, jsonTime(e.Writer.Started)}
	}
	return j
}

// note is the human-readable remark ls and prune print for an entry.
func (e *entry) note() string {
	var parts []string
	if e.Symlink != "" {
		parts = append(parts, "symlink to "+e.Symlink)
	}
	switch e.Status {
	case statusStaging:
		if w := e.Writer; w != nil {
			switch w.State {
			case "running":
				parts = append(parts, fmt.Sprintf("writer pid %d on this host is running", w.PID))
			case "exited":
				parts = append(parts, fmt.Sprintf("writer pid %d on this host has exited", w.PID))
			default:
				parts = append(parts, fmt.Sprintf("writer pid %d on host %s", w.PID, w.Host))
			}
		} else {
			parts = append(parts, "no STAGING marker yet")
		}
		idle := timeNow().Sub(e.LastActive)
		if idle > 0 {
			parts = append(parts, "idle "+humanDuration(idle))
		}
	case statusUnrenamed:
		parts = append(parts, fmt.Sprintf("complete; rename it to %q to commit it by hand", e.FinalName))
	case statusCorrupt, statusError:
		parts = append(parts, errorJSON(e.Err).Message)
	}
	return strings.Join(parts, "; ")
}

func runLs(c *ctx, args []string) int {
	fs := c.flags()
	all := fs.Bool("all", false, "also list directories that are not checkpoints")
	pos, st := c.parse(fs, args, 1, 1)
	if st >= 0 {
		return st
	}
	dir := pos[0]
	var entries []*entry
	if exists(filepath.Join(dir, metadataFile)) || exists(filepath.Join(dir, stagingMarker)) {
		entries = []*entry{classify(filepath.Clean(dir))}
	} else {
		var err error
		if entries, err = scanStore(dir); err != nil {
			return c.fail(exitFailure, err)
		}
	}
	shown := entries[:0]
	for _, e := range entries {
		if e.Status != statusOther || *all {
			shown = append(shown, e)
		}
	}
	if c.json {
		out := struct {
			Directory   string   `json:"directory"`
			Checkpoints []lsJSON `json:"checkpoints"`
		}{Directory: dir, Checkpoints: []lsJSON{}}
		for _, e := range shown {
			out.Checkpoints = append(out.Checkpoints, e.json())
		}
		c.writeJSON(out)
		return exitOK
	}
	if len(shown) == 0 {
		fmt.Fprintf(c.stdout, "no checkpoints under %s\n", dir)
		return exitOK
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "NAME\tSTATUS\tSTEP\tENTRIES\tSIZE\tDATE\tNOTE")
	for _, e := range shown {
		step, entries := "-", "-"
		if e.Step != nil {
			step = fmt.Sprint(*e.Step)
		} else if e.StepRaw != "" {
			step = e.StepRaw
		}
		if e.Entries != nil {
			entries = fmt.Sprint(*e.Entries)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Name, e.Status, step, entries, humanBytes(e.DiskBytes),
			formatTime(e.Date), e.note())
	}
	tw.Flush()
	return exitOK
}
