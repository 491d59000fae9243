package main

import (
	"fmt"
	"strings"
	"time"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/store"
)

// The statuses of ls and prune (store.Status values).
const (
	statusCommitted = string(store.Committed)
	statusCorrupt   = string(store.Corrupt)
	statusError     = string(store.Unreadable)
	statusStaging   = string(store.Incomplete)
	statusUnrenamed = string(store.CompleteUnrenamed)
	statusReplaced  = string(store.Replaced)
	statusDeleting  = string(store.Deleting)
	statusForeign   = string(store.Foreign)
	statusOther     = string(store.NotACheckpoint)
)

// timeNow is the clock; tests move it.
var timeNow = time.Now

var lsCommand = &command{
	name:    "ls",
	args:    "[--all] [--json] DIR",
	summary: "list the checkpoints under DIR (or an s3:// prefix) with step, size, entries, date and status",
	help: `
Lists every checkpoint directory directly under DIR (or DIR itself if it is a checkpoint), in natural name order.
Checkpoints other libraries wrote are listed too, as "foreign" with their format in the note: a directory below DIR
that the library reads in place (a Hugging Face safetensors directory: an index and its shards, or .safetensors
files), DIR itself when it is one and holds no checkpoint directory, or DIR naming one .safetensors (or index) file.
Loose .safetensors files beside checkpoint directories are not listed (a store's checkpoints are directories).
In a Hugging Face hub cache (~/.cache/huggingface/hub), ls of the cache lists each repository (models--ORG--NAME)
as one checkpoint, read at the snapshot its refs/main names; ls of a repository lists it; ls of its snapshots/
lists each revision. A snapshot's SIZE is 0 (its files are links into the repository's blobs/); a snapshot whose
link leads anywhere but a file of its repository's blobs/ is corrupt, the note saying which link.
DIR may be an s3://bucket/prefix URL: there a checkpoint is a prefix whose metadata.dckpt is committed, one with only
what unfinished saves left (STAGING.<nonce> markers, nonced data files) is incomplete, anything else
not-a-checkpoint; SIZE is the bytes of the files distckpt wrote there, and DATE is not known ("-", JSON null).
STATUS is one of:
  committed           a complete checkpoint (metadata.dckpt, no STAGING marker) whose metadata opens
  incomplete          <name>.dckpt-staging-<nonce> with a STAGING marker: being written now, or abandoned by a
                      crashed writer (the note says whether the writer's process is still running)
  complete-unrenamed  a staging directory whose commit finished writing but was not renamed into place
  foreign             a checkpoint another library wrote, read in place (no checksums; prune never touches it)
  corrupt             metadata.dckpt that the library rejects (damaged, truncated, or a newer format version), or
                      a directory of safetensors files whose header or index the library rejects
  unreadable          metadata.dckpt that could not be read (permissions, I/O error), or a directory that could not
                      be looked inside (so whether it holds a checkpoint is unknown); listed without --all
  replaced            <name>.dckpt-old-<nonce>: a checkpoint moved aside by an overwrite (garbage)
  deleting            <name>.dckpt-deleting-<nonce>: being removed by prune (garbage)
  not-a-checkpoint    any other directory (shown with --all only)
STEP is the user metadata "step" (Python's save records a top-level scalar such as {"step": 100} there).
SIZE is the bytes of the files on disk; DATE is the commit time (or the writer's start time for staging).
A listing is not a check: damaged checkpoints are listed with their status and ls still exits 0 (see verify).

JSON: {"schema_version": 1, "directory": str, "checkpoints": [{
  "name": str, "path": str, "status": str (as above),
  "step": int|null (user metadata "step" when it is an integer), "step_raw": str|null,
  "entries": int|null, "data_bytes": int|null (committed and foreign only), "bytes": int (on disk),
  "format": "distckpt"|"safetensors"|"torch-dcp"|null (committed and foreign only),
  "checksummed": bool|null (committed and foreign only; false for foreign),
  "date": RFC 3339 UTC|null, "final_name": str|null (staging/replaced/deleting), "symlink": str|null,
  "writer": {"host": str, "pid": int, "final_path": str, "state": "running"|"exited"|"unknown",
             "started": RFC 3339 UTC|null}|null,
  "error": {"code": str, "message": str}|null}]}`,
	run: runLs,
}

type lsWriterJSON struct {
	Host      string  `json:"host"`
	PID       int     `json:"pid"`
	FinalPath string  `json:"final_path"`
	State     string  `json:"state"`
	Started   *string `json:"started"`
}

type lsJSON struct {
	Name        string           `json:"name"`
	Path        string           `json:"path"`
	Status      string           `json:"status"`
	Step        *int64           `json:"step"`
	StepRaw     *string          `json:"step_raw"`
	Entries     *int             `json:"entries"`
	DataBytes   *uint64          `json:"data_bytes"`
	Bytes       uint64           `json:"bytes"`
	Format      *distckpt.Format `json:"format"`
	Checksummed *bool            `json:"checksummed"`
	Date        *string          `json:"date"`
	FinalName   *string          `json:"final_name"`
	Symlink     *string          `json:"symlink"`
	Writer      *lsWriterJSON    `json:"writer"`
	Error       *jsonError       `json:"error"`
}

func strOrNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func checkpointJSON(c *store.Checkpoint) lsJSON {
	j := lsJSON{
		Name: c.Name, Path: c.Path, Status: string(c.Status), Step: c.Step, StepRaw: strOrNil(c.StepRaw),
		Bytes: c.DiskBytes, Date: jsonTime(c.Date), FinalName: strOrNil(c.FinalName), Symlink: strOrNil(c.Symlink),
		Error: errorJSON(c.Err),
	}
	if c.Info != nil {
		j.Entries, j.DataBytes = &c.Info.NumEntries, &c.Info.TotalBytes
		j.Format, j.Checksummed = &c.Info.Format, &c.Info.Checksummed
	}
	if w := c.Writer; w != nil {
		j.Writer = &lsWriterJSON{w.Host, w.PID, w.FinalPath, string(w.State), jsonTime(w.Started)}
	}
	return j
}

// note is the human-readable remark ls prints for a directory.
func note(c *store.Checkpoint) string {
	if c.Objects != nil {
		return objectNote(c)
	}
	var parts []string
	if c.Symlink != "" {
		parts = append(parts, "symlink to "+c.Symlink)
	}
	switch c.Status {
	case store.Incomplete:
		if w := c.Writer; w != nil {
			switch w.State {
			case store.WriterRunning:
				parts = append(parts, fmt.Sprintf("writer pid %d on this host is running", w.PID))
			case store.WriterExited:
				parts = append(parts, fmt.Sprintf("writer pid %d on this host has exited", w.PID))
			default:
				parts = append(parts, fmt.Sprintf("writer pid %d on host %s", w.PID, w.Host))
			}
		} else {
			parts = append(parts, "no STAGING marker yet")
		}
		idle := timeNow().Sub(c.LastActive)
		if idle > 0 {
			parts = append(parts, "idle "+store.HumanDuration(idle))
		}
	case store.CompleteUnrenamed:
		parts = append(parts, fmt.Sprintf("complete; rename it to %q to commit it by hand", c.FinalName))
	case store.Foreign:
		format := "another library's format"
		if c.Info != nil {
			format = formatName(c.Info.Format)
		}
		parts = append(parts, format+", read in place (no checksums)")
	case store.Corrupt, store.Unreadable:
		parts = append(parts, errorJSON(c.Err).Message)
	}
	return strings.Join(parts, "; ")
}

// objectNote is note for a checkpoint below a URL: what the library found at its prefix.
func objectNote(c *store.Checkpoint) string {
	var parts []string
	o := c.Objects
	switch c.Status {
	case store.Incomplete:
		if o.SavesInProgress > 0 {
			parts = append(parts, fmt.Sprintf("%d save(s) in progress", o.SavesInProgress))
		}
		if o.LeftoverFiles > 0 {
			parts = append(parts, fmt.Sprintf("%d file(s) of unfinished saves (%s)", o.LeftoverFiles,
				humanBytes(o.LeftoverBytes)))
		}
	case store.Committed:
		if o.SavesInProgress > 0 {
			parts = append(parts, fmt.Sprintf("%d save(s) in progress over it", o.SavesInProgress))
		}
		if o.LeftoverFiles > 0 {
			parts = append(parts, fmt.Sprintf("%d file(s) of other saves (%s)", o.LeftoverFiles,
				humanBytes(o.LeftoverBytes)))
		}
	case store.Corrupt, store.Unreadable:
		parts = append(parts, errorJSON(c.Err).Message)
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
	// A directory the store could not look inside is Unreadable (store.classify), never left out.
	shown, err := store.List(dir, &store.ListOptions{All: *all})
	if err != nil {
		return c.fail(err, dir)
	}
	if c.json {
		out := struct {
			Directory   string   `json:"directory"`
			Checkpoints []lsJSON `json:"checkpoints"`
		}{Directory: dir, Checkpoints: []lsJSON{}}
		for i := range shown {
			out.Checkpoints = append(out.Checkpoints, checkpointJSON(&shown[i]))
		}
		c.writeJSON(out)
		return exitOK
	}
	if len(shown) == 0 {
		fmt.Fprintf(c.stdout, "no checkpoints under %s\n", dir)
		// A checkpoint manager's local tier holds parts, not checkpoints: say where to look.
		if isManagerTier(dir) {
			fmt.Fprintf(c.stdout, "%s is a checkpoint manager's local tier: see distckpt tiers %s\n", dir, dir)
		}
		return exitOK
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "NAME\tSTATUS\tSTEP\tENTRIES\tSIZE\tDATE\tNOTE")
	for i := range shown {
		e := &shown[i]
		step, entries := "-", "-"
		if e.Step != nil {
			step = fmt.Sprint(*e.Step)
		} else if e.StepRaw != "" {
			step = e.StepRaw
		}
		if e.Info != nil {
			entries = fmt.Sprint(e.Info.NumEntries)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Name, e.Status, step, entries, humanBytes(e.DiskBytes),
			formatTime(e.Date), note(e))
	}
	tw.Flush()
	return exitOK
}
