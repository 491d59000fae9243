// Package store looks after a directory of distckpt checkpoints (a checkpoint store): it lists the checkpoints with
// their status, step, size and date, tells committed checkpoints from the leftovers of crashed or interrupted writers,
// and prunes old checkpoints and garbage safely. It is what the distckpt CLI's ls and prune commands run, so a tool of
// one's own gets the same rules:
//
//	cks, err := store.List("/ckpts", nil)
//	...
//	res, err := store.Prune("/ckpts", store.PrunePolicy{KeepLast: 3, DryRun: true})
//
// A store is a directory whose sub-directories are checkpoints ("step-100", ...) and, next to them, what the library
// leaves behind when a save or an overwrite does not finish (FORMAT.md sections 1 and 6):
// "<name>.dckpt-staging-<nonce>" directories of writers (running, or crashed), "<name>.dckpt-old-<nonce>"
// checkpoints an overwrite moved aside, and "<name>.dckpt-deleting-<nonce>" checkpoints a prune was removing.
// Verification of the data itself is distckpt.Reader.Verify.
//
// Nothing in this package follows a symbolic link to delete anything, and nothing deletes a directory that is not a
// checkpoint or the leftover of one.
package store

import (
	"bufio"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	distckpt "distckpt.dev/go"
)

// Status says what a directory in a store is.
type Status string

// The statuses List reports. New ones may be added; a tool should treat a status it does not know as "not a committed
// checkpoint, leave it alone".
const (
	// Committed: metadata.dckpt, no STAGING marker, and the metadata opens (it is read, not its data: see
	// distckpt.Reader.Verify).
	Committed Status = "committed"
	// Corrupt: metadata.dckpt that the library rejects as damaged, truncated or of an unsupported (newer) format
	// version. Prune never deletes it.
	Corrupt Status = "corrupt"
	// Unreadable: metadata.dckpt that could not be read for another reason (permissions, I/O error). Prune never
	// deletes it.
	Unreadable Status = "unreadable"
	// Incomplete: "<name>.dckpt-staging-<nonce>" with a STAGING marker (or without one and without metadata): a
	// checkpoint being written now, or abandoned by a crashed writer. Checkpoint.Writer says which, where it can.
	Incomplete Status = "incomplete"
	// CompleteUnrenamed: "<name>.dckpt-staging-<nonce>" without a marker but with metadata: every rank finished, but
	// the save has not (yet) renamed it into place, so it never reported success.
	CompleteUnrenamed Status = "complete-unrenamed"
	// Replaced: "<name>.dckpt-old-<nonce>", a checkpoint an overwrite moved aside (garbage once idle).
	Replaced Status = "replaced"
	// Deleting: "<name>.dckpt-deleting-<nonce>", a checkpoint a prune renamed before removing it (garbage once idle).
	Deleting Status = "deleting"
	// NotACheckpoint: any other directory. List reports these only with ListOptions.All; Prune never touches them.
	NotACheckpoint Status = "not-a-checkpoint"
)

// Leftover reports whether the status is one of the leftovers of a save, an overwrite or a prune (Incomplete,
// CompleteUnrenamed, Replaced, Deleting): directories Prune removes once they have been idle for the grace period.
func (s Status) Leftover() bool {
	return s == Incomplete || s == CompleteUnrenamed || s == Replaced || s == Deleting
}

// Names the library gives to the files and directories of a store (FORMAT.md sections 1 and 6).
const (
	MetadataFile  = "metadata.dckpt"   // a checkpoint's metadata; its presence (without a marker) marks a commit
	StagingMarker = "STAGING"          // the marker file a writer keeps in its staging directory until the commit
	StagingInfix  = ".dckpt-staging-"  // "<name>.dckpt-staging-<nonce>": a save in progress (or abandoned)
	ReplacedInfix = ".dckpt-old-"      // "<name>.dckpt-old-<nonce>": a checkpoint an overwrite moved aside
	DeletingInfix = ".dckpt-deleting-" // "<name>.dckpt-deleting-<nonce>": a checkpoint being removed by Prune
)

// WriterState says whether the process named by a STAGING marker is still alive.
type WriterState string

// Writer states. Only a process on this host can be checked.
const (
	WriterRunning WriterState = "running" // on this host, and a process with its pid exists
	WriterExited  WriterState = "exited"  // on this host, and no process has its pid
	WriterUnknown WriterState = "unknown" // on another host (or the marker does not say)
)

// Writer is what a STAGING marker says about the process that is writing (or was writing) a checkpoint.
type Writer struct {
	Host      string
	PID       int       // -1 if the marker does not say
	Started   time.Time // zero if the marker does not say
	FinalPath string    // where the checkpoint will be committed
	State     WriterState
}

// Checkpoint is one directory of a store, as List found it.
type Checkpoint struct {
	Name   string // the directory's name in the store
	Path   string // the store's path joined with Name
	Status Status
	// FinalName: for a staging, replaced or deleting directory, the name of the checkpoint it belongs to ("step-100"
	// for "step-100.dckpt-staging-1f2e").
	FinalName string
	// Symlink is the link's target when the directory is reached through a symbolic link in the store. Prune never
	// deletes a link nor what it points to, and keeps the checkpoint a link in the store points to.
	Symlink string
	// Step is the user metadata "step" of a committed checkpoint when it is a decimal integer; StepRaw is the value as
	// stored ("" when there is none). Python's save records a top-level scalar such as {"step": 100} there as "100".
	Step    *int64
	StepRaw string
	// Info and User are a committed checkpoint's summary and user metadata (nil otherwise).
	Info *distckpt.Info
	User map[string]string
	// DiskBytes is the sum of the sizes of the regular files under the directory.
	DiskBytes uint64
	// Date is when a committed checkpoint's metadata was written, or a staging directory's writer started (its
	// marker's start time, else the directory's modification time).
	Date time.Time
	// ModTime is the directory's own modification time; LastActive the newest modification time of the directory and
	// of the entries directly in it (a writer's data files show its activity). Prune's grace period counts from
	// LastActive.
	ModTime    time.Time
	LastActive time.Time
	// Writer is what the STAGING marker of an Incomplete directory says (nil if there is no readable marker).
	Writer *Writer
	// Err is why the metadata of a Corrupt or Unreadable checkpoint could not be read (a *distckpt.Error).
	Err error

	// fi is what Lstat said about Path when the store was listed: Prune deletes only that very directory.
	fi os.FileInfo
}

// ListOptions configures List. The zero value (or nil) means the defaults.
type ListOptions struct {
	// All also lists directories that are not checkpoints (NotACheckpoint).
	All bool
}

// List describes every checkpoint directly under dir (and every leftover of one), in natural name order ("step-99"
// before "step-100"). If dir is itself a checkpoint (it holds metadata.dckpt) or a staging directory (it holds a
// STAGING marker), the result is that one directory. Entries of dir that are not directories, and symbolic links that
// do not lead to a directory, are skipped. The error is the file system's (an *fs.PathError naming dir) when dir cannot
// be read; a checkpoint whose metadata cannot be read is listed as Corrupt or Unreadable with its Err set.
func List(dir string, opts *ListOptions) ([]Checkpoint, error) {
	var o ListOptions
	if opts != nil {
		o = *opts
	}
	if exists(filepath.Join(dir, MetadataFile)) || exists(filepath.Join(dir, StagingMarker)) {
		c, err := Stat(dir)
		if err != nil {
			return nil, err
		}
		return []Checkpoint{*c}, nil
	}
	all, err := scan(dir)
	if err != nil {
		return nil, err
	}
	out := make([]Checkpoint, 0, len(all))
	for _, c := range all {
		if c.Status != NotACheckpoint || o.All {
			out = append(out, *c)
		}
	}
	return out, nil
}

// Stat describes one directory (a checkpoint, a leftover, or anything else) the way List would. The error is the file
// system's when path does not exist or is not a directory.
func Stat(path string) (*Checkpoint, error) {
	path = filepath.Clean(path)
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	symlink := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		if symlink, err = os.Readlink(path); err != nil {
			return nil, err
		}
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, &fs.PathError{Op: "stat", Path: path, Err: syscall.ENOTDIR}
	}
	c := classify(path)
	c.Symlink, c.fi = symlink, fi
	return c, nil
}

// scan classifies every directory directly under dir, sorted by name.
func scan(dir string) ([]*Checkpoint, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []*Checkpoint
	for _, de := range ents {
		path := filepath.Join(dir, de.Name())
		fi, err := os.Lstat(path)
		if err != nil {
			continue // gone meanwhile
		}
		symlink := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if symlink, err = os.Readlink(path); err != nil {
				continue
			}
		}
		st, err := os.Stat(path)
		if err != nil || !st.IsDir() {
			continue
		}
		c := classify(path)
		c.Symlink, c.fi = symlink, fi
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return naturalLess(out[i].Name, out[j].Name) })
	return out, nil
}

// classify looks at one directory.
func classify(path string) *Checkpoint {
	c := &Checkpoint{Name: filepath.Base(path), Path: path}
	c.DiskBytes, c.ModTime, c.LastActive = dirUsage(path)
	hasMarker := exists(filepath.Join(path, StagingMarker))
	if final, ok := splitSuffixedName(c.Name, DeletingInfix); ok {
		c.Status, c.FinalName = Deleting, final
		return c
	}
	if final, ok := splitSuffixedName(c.Name, ReplacedInfix); ok {
		c.Status, c.FinalName = Replaced, final
		return c
	}
	if final, ok := splitSuffixedName(c.Name, StagingInfix); ok || hasMarker {
		c.FinalName = final
		if !hasMarker && exists(filepath.Join(path, MetadataFile)) {
			// Committed data whose final rename has not happened: a commit in progress, or one that was interrupted.
			c.Status = CompleteUnrenamed
			c.Date = c.ModTime
			return c
		}
		// With a marker, or without one and without metadata (a writer that has only just created the directory).
		c.Status = Incomplete
		if hasMarker {
			c.Writer = readMarker(filepath.Join(path, StagingMarker))
		}
		if c.Writer != nil {
			c.Date = c.Writer.Started
		}
		if c.Date.IsZero() {
			c.Date = c.ModTime
		}
		return c
	}
	mst, err := os.Stat(filepath.Join(path, MetadataFile))
	if err != nil {
		c.Status = NotACheckpoint
		return c
	}
	c.Date = mst.ModTime()
	r, err := distckpt.Open(path, &distckpt.ReadOptions{NoVerify: true})
	if err != nil {
		c.Err = err
		if errors.Is(err, distckpt.ErrCorrupt) || errors.Is(err, distckpt.ErrVersion) {
			c.Status = Corrupt
		} else {
			c.Status = Unreadable
		}
		return c
	}
	defer r.Close()
	c.Status = Committed
	if info, err := r.Info(); err == nil {
		c.Info = &info
	}
	if user, err := r.UserMetadata(); err == nil {
		c.User = user
		if s, ok := user["step"]; ok {
			c.StepRaw = s
			if v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64); err == nil {
				c.Step = &v
			}
		}
	}
	return c
}

// dirUsage sums the sizes of the files under path and finds its own mtime and the newest mtime of it and the
// entries directly in it.
func dirUsage(path string) (bytes uint64, mtime, active time.Time) {
	if st, err := os.Stat(path); err == nil {
		mtime, active = st.ModTime(), st.ModTime()
	}
	_ = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if info.Mode().IsRegular() {
			bytes += uint64(info.Size())
		}
		if filepath.Dir(p) == path && info.ModTime().After(active) {
			active = info.ModTime()
		}
		return nil
	})
	return bytes, mtime, active
}

// readMarker parses a STAGING marker ("host: h", "pid: 123", "started_utc: ...", "final_path: ..." lines; see
// core/storage/storage.cc). nil if it cannot be read.
func readMarker(path string) *Writer {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	w := &Writer{PID: -1}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch strings.TrimSpace(k) {
		case "host":
			w.Host = v
		case "pid":
			if p, err := strconv.Atoi(v); err == nil {
				w.PID = p
			}
		case "started_utc":
			if t, err := time.Parse("2006-01-02T15:04:05Z", v); err == nil {
				w.Started = t
			}
		case "final_path":
			w.FinalPath = v
		}
	}
	w.State = writerState(w.Host, w.PID)
	return w
}

// writerState says whether the writer named by a marker is alive. Only a process on this host can be checked.
func writerState(host string, pid int) WriterState {
	me, err := os.Hostname()
	if err != nil || host == "" || host != me || pid <= 0 {
		return WriterUnknown
	}
	if err := syscall.Kill(pid, 0); err == nil || errors.Is(err, syscall.EPERM) {
		return WriterRunning
	}
	return WriterExited
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// splitSuffixedName parses "<final><infix><lower-hex nonce>" as the library does (storage.cc ParseSuffixedName).
func splitSuffixedName(name, infix string) (string, bool) {
	pos := strings.LastIndex(name, infix)
	if pos <= 0 {
		return "", false
	}
	nonce := name[pos+len(infix):]
	if nonce == "" {
		return "", false
	}
	for _, c := range nonce {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return "", false
		}
	}
	return name[:pos], true
}

// naturalLess orders names with their digit runs compared as numbers: step-99 < step-100.
func naturalLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := digitPrefix(a), digitPrefix(b)
		if da != "" && db != "" {
			na, nb := strings.TrimLeft(da, "0"), strings.TrimLeft(db, "0")
			if len(na) != len(nb) {
				return len(na) < len(nb)
			}
			if na != nb {
				return na < nb
			}
			a, b = a[len(da):], b[len(db):]
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func digitPrefix(s string) string {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i]
}

// NaturalLess is the order List uses for names: digit runs compare as numbers (step-99 < step-100).
func NaturalLess(a, b string) bool { return naturalLess(a, b) }
