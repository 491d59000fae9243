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
// The leftovers are judged by the library, the same for every language (distckpt.ScanLeftovers and
// distckpt.RemoveLeftover): which directories are leftovers (those names only, never a symbolic link), whether their
// writer is alive, how long they have been idle, whether they are garbage, and why. This package adds the listing
// order and the policy of which committed checkpoints to keep.
//
// Nothing in this package follows a symbolic link to delete anything, and nothing deletes a directory that is not a
// checkpoint or the leftover of one. Checkpoints other libraries wrote (a safetensors hub directory, which the library
// reads in place) are listed as Foreign and never deleted.
//
// List, Stat and Prune also take a URL, "s3://bucket/prefix" (objects.go): the checkpoints are the prefixes below it,
// each a set of objects committed by writing its metadata last (FORMAT.md section 6.2), and the library classifies
// them and removes what unfinished saves left (distckpt.StorageHandle's Stat, RemoveLeftovers and RemoveCheckpoint)
// under the same rules: nothing distckpt did not write is removed, saves in progress are left alone, and the newest
// checkpoints are kept.
package store

import (
	"errors"
	"fmt"
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
	// checkpoint being written now, or abandoned by a crashed writer. Checkpoint.Writer says which, where it can. A
	// directory with a marker but without such a name is not a leftover (NotACheckpoint), and never deleted.
	Incomplete Status = "incomplete"
	// CompleteUnrenamed: "<name>.dckpt-staging-<nonce>" without a marker but with metadata: every rank finished, but
	// the save has not (yet) renamed it into place, so it never reported success.
	CompleteUnrenamed Status = "complete-unrenamed"
	// Replaced: "<name>.dckpt-old-<nonce>", a checkpoint an overwrite moved aside (garbage once idle).
	Replaced Status = "replaced"
	// Deleting: "<name>.dckpt-deleting-<nonce>", a checkpoint a prune renamed before removing it (garbage once idle).
	Deleting Status = "deleting"
	// Foreign: a checkpoint another library wrote, which the library reads in place (no metadata.dckpt, but a
	// Hugging Face safetensors index or .safetensors files, or a PyTorch DCP checkpoint; Info.Format says which).
	// Listed with its summary and user metadata; not distckpt's to manage, so Prune never touches it.
	Foreign Status = "foreign"
	// NotACheckpoint: any other directory. List reports these only with ListOptions.All; Prune never touches them.
	NotACheckpoint Status = "not-a-checkpoint"
)

// Leftover reports whether the status is one of the leftovers of a save, an overwrite or a prune (Incomplete,
// CompleteUnrenamed, Replaced, Deleting): directories Prune removes once they have been idle for the grace period.
func (s Status) Leftover() bool {
	return s == Incomplete || s == CompleteUnrenamed || s == Replaced || s == Deleting
}

// Names the library gives to the files and directories of a store (FORMAT.md sections 1 and 6). The leftovers are
// recognised by the library (distckpt.ScanLeftovers), not by these constants, which are here for reference.
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
	FinalPath string    // where the checkpoint will be committed: beside the staging directory, under its FinalName
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
	// Info and User are a committed (or foreign) checkpoint's summary and user metadata (nil otherwise).
	Info *distckpt.Info
	User map[string]string
	// DiskBytes is the sum of the sizes of the regular files under the directory.
	DiskBytes uint64
	// Date is when a committed checkpoint's metadata was written, a staging directory's writer started (its
	// marker's start time, else the directory's modification time), or a foreign checkpoint's files were last
	// modified (LastActive).
	Date time.Time
	// ModTime is the directory's own modification time; LastActive the newest modification time of the directory and
	// of the entries directly in it (a writer's data files show its activity). Prune's grace period counts from
	// LastActive: for a leftover, the library measures it (the time of the listing less the idle time it found).
	ModTime    time.Time
	LastActive time.Time
	// Writer is what the STAGING marker of an Incomplete directory says (nil if there is no readable marker, or it
	// names no host, pid or start time).
	Writer *Writer
	// Err is why the metadata of a Corrupt or Unreadable checkpoint could not be read (a *distckpt.Error).
	Err error
	// Objects is, below a URL (an object store), what the library found at the checkpoint's prefix: the files
	// distckpt wrote there, those of unfinished or superseded saves, and the saves in progress. Nil in a directory.
	// There, Date, ModTime and LastActive are unknown (zero), and Writer is nil.
	Objects *distckpt.PathInfo

	// fi is what Lstat said about Path when the store was listed: Prune deletes only that very directory.
	fi os.FileInfo
	// leftover is the library's judgement of a leftover (nil for any other directory): Prune acts on it.
	leftover *distckpt.Leftover
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
//
// Checkpoints other libraries wrote are listed as Foreign: a sub-directory the library opens as one (a safetensors
// hub directory, ...), and dir itself when it holds no checkpoint directory but is one (a hub directory given
// directly). A store directory with a stray .safetensors file beside its checkpoints is listed as a store. A path to a
// .safetensors or .safetensors.index.json file is listed as that one Foreign checkpoint.
//
// dir may be a URL ("s3://bucket/prefix"): the prefixes below it are listed the same way (a checkpoint, or only what
// unfinished saves left: Incomplete), and a prefix with nothing below it is an error matching fs.ErrNotExist.
func List(dir string, opts *ListOptions) ([]Checkpoint, error) {
	var o ListOptions
	if opts != nil {
		o = *opts
	}
	if distckpt.IsURL(dir) {
		return listObjects(dir, o)
	}
	if exists(filepath.Join(dir, MetadataFile)) || exists(filepath.Join(dir, StagingMarker)) {
		c, err := Stat(dir)
		if err != nil {
			return nil, err
		}
		return []Checkpoint{*c}, nil
	}
	if st, err := os.Stat(dir); err == nil && st.Mode().IsRegular() {
		if c := foreignFile(dir); c != nil {
			return []Checkpoint{*c}, nil
		}
	}
	all, err := scan(dir, DefaultGrace)
	if err != nil {
		return nil, err
	}
	shown := listed(all, o.All)
	if !holdsCheckpoint(all) {
		// No checkpoint directory below: dir may be a checkpoint another library wrote, given directly.
		if c := classify(filepath.Clean(dir)); c.Status == Foreign {
			if fi, symlink, err := lookAt(filepath.Clean(dir)); err == nil {
				c.Symlink, c.fi = symlink, fi
			}
			return []Checkpoint{*c}, nil
		}
	}
	return shown, nil
}

// holdsCheckpoint reports whether any of the directories found is a checkpoint, a foreign one, or a leftover of one.
func holdsCheckpoint(found []*Checkpoint) bool {
	for _, c := range found {
		if c.Status != NotACheckpoint {
			return true
		}
	}
	return false
}

// foreignFile describes the one-file checkpoint at path (a .safetensors file, or an index and the shards it names) if
// the library opens it as a foreign checkpoint, else nil.
func foreignFile(path string) *Checkpoint {
	r, err := distckpt.Open(path, &distckpt.ReadOptions{NoVerify: true})
	if err != nil {
		return nil
	}
	r.Close()
	st, err := os.Stat(path)
	if err != nil {
		return nil
	}
	c := &Checkpoint{Name: filepath.Base(path), Path: path, DiskBytes: uint64(st.Size()), ModTime: st.ModTime(),
		LastActive: st.ModTime(), Date: st.ModTime()}
	readCommitted(c, nil)
	if c.Status != Committed || c.Info == nil || !c.Info.Format.Foreign() {
		return nil
	}
	c.Status = Foreign
	return c
}

// Stat describes one directory (a checkpoint, a leftover, or anything else) the way List would. The error is the file
// system's when path does not exist or is not a directory. path may be a URL ("s3://bucket/prefix/step-100"); nothing
// below it is then an error matching fs.ErrNotExist.
func Stat(path string) (*Checkpoint, error) {
	if distckpt.IsURL(path) {
		return statObject(path)
	}
	path = filepath.Clean(path)
	fi, symlink, err := lookAt(path)
	if err != nil {
		return nil, err
	}
	leftovers, scanned, err := leftoversIn(filepath.Dir(path), DefaultGrace)
	if err != nil {
		return nil, err
	}
	return describe(path, fi, symlink, leftovers[filepath.Base(path)], scanned), nil
}

// lookAt finds what path is: its Lstat, and the link's target when it is a symbolic link. The error is the file
// system's when it is missing or does not lead to a directory.
func lookAt(path string) (fi os.FileInfo, symlink string, err error) {
	if fi, err = os.Lstat(path); err != nil {
		return nil, "", err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		if symlink, err = os.Readlink(path); err != nil {
			return nil, "", err
		}
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, "", err
	}
	if !st.IsDir() {
		return nil, "", &fs.PathError{Op: "stat", Path: path, Err: syscall.ENOTDIR}
	}
	return fi, symlink, nil
}

// scan classifies every directory directly under dir, sorted by name; the core judges the leftovers among them with
// the grace period given (only Prune acts on that judgement).
func scan(dir string, grace time.Duration) ([]*Checkpoint, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	// After the listing, so that every leftover listed and still there is judged.
	leftovers, scanned, err := leftoversIn(dir, grace)
	if err != nil {
		return nil, err
	}
	var out []*Checkpoint
	for _, de := range ents {
		path := filepath.Join(dir, de.Name())
		fi, symlink, err := lookAt(path)
		if err != nil {
			continue // gone meanwhile, or not a directory
		}
		out = append(out, describe(path, fi, symlink, leftovers[de.Name()], scanned))
	}
	sort.Slice(out, func(i, j int) bool { return naturalLess(out[i].Name, out[j].Name) })
	return out, nil
}

// leftoversIn has the core judge the leftovers directly in dir (distckpt.ScanLeftovers), by name, and says when.
func leftoversIn(dir string, grace time.Duration) (map[string]*distckpt.Leftover, time.Time, error) {
	found, err := distckpt.ScanLeftovers(dir, "", grace)
	scanned := time.Now()
	if err != nil {
		return nil, scanned, err
	}
	byName := make(map[string]*distckpt.Leftover, len(found))
	for i := range found {
		byName[found[i].Name] = &found[i]
	}
	return byName, scanned, nil
}

// describe makes the Checkpoint of the directory at path: fi is its Lstat, symlink the link's target ("" if it is
// none), l the core's judgement when it is a leftover (the core never judges a link: a link named like a leftover is
// described by what it leads to, and Prune keeps it), scanned when l was made.
func describe(path string, fi os.FileInfo, symlink string, l *distckpt.Leftover, scanned time.Time) *Checkpoint {
	var c *Checkpoint
	if l != nil && symlink == "" {
		c = fromLeftover(path, fi, l, scanned)
	} else {
		c = classify(path)
	}
	c.Symlink, c.fi = symlink, fi
	return c
}

// leftoverStatus is the Status of each kind of leftover.
var leftoverStatus = map[distckpt.LeftoverKind]Status{
	distckpt.LeftoverStaging:           Incomplete,
	distckpt.LeftoverCompleteUnrenamed: CompleteUnrenamed,
	distckpt.LeftoverReplaced:          Replaced,
	distckpt.LeftoverDeleting:          Deleting,
}

// writerStates maps the core's writer states to the store's.
var writerStates = map[distckpt.WriterState]WriterState{
	distckpt.WriterRunning: WriterRunning,
	distckpt.WriterExited:  WriterExited,
	distckpt.WriterUnknown: WriterUnknown,
}

// fromLeftover describes a leftover directory (fi: its Lstat) from the core's judgement.
func fromLeftover(path string, fi os.FileInfo, l *distckpt.Leftover, scanned time.Time) *Checkpoint {
	c := &Checkpoint{Name: l.Name, Path: path, FinalName: l.FinalName, DiskBytes: l.Bytes, ModTime: fi.ModTime(),
		LastActive: scanned.Add(-l.Idle), leftover: l}
	status, known := leftoverStatus[l.Kind]
	if !known {
		status = Status(l.Kind.String()) // a kind of a newer library: not committed, left alone
	}
	c.Status = status
	switch status {
	case Incomplete:
		if l.WriterPID > 0 || l.WriterHost != "" || !l.WriterStarted.IsZero() {
			state, known := writerStates[l.Writer]
			if !known {
				state = WriterUnknown
			}
			c.Writer = &Writer{Host: l.WriterHost, PID: int(l.WriterPID), Started: l.WriterStarted,
				FinalPath: filepath.Join(filepath.Dir(path), l.FinalName), State: state}
		}
		c.Date = c.ModTime
		if c.Writer != nil && !c.Writer.Started.IsZero() {
			c.Date = c.Writer.Started
		}
	case CompleteUnrenamed:
		c.Date = c.ModTime
	}
	return c
}

// classify looks at a directory that is not a leftover.
func classify(path string) *Checkpoint {
	c := &Checkpoint{Name: filepath.Base(path), Path: path}
	c.DiskBytes, c.ModTime, c.LastActive = dirUsage(path)
	if exists(filepath.Join(path, StagingMarker)) {
		// A writer's marker in a directory without a staging directory's name: not committed, and not a leftover
		// the library knows how to judge, so it is left alone.
		c.Status = NotACheckpoint
		return c
	}
	mst, err := os.Stat(filepath.Join(path, MetadataFile))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			classifyForeign(c)
			return c
		}
		// The directory could not be looked inside (no search permission, an I/O error): whether it holds a
		// checkpoint is unknown, and calling it not-a-checkpoint would hide one that someone else can read.
		c.Status, c.Err = Unreadable, fmt.Errorf("cannot look inside %s (whether it is a checkpoint is unknown): %w",
			path, err)
		return c
	}
	c.Date = mst.ModTime()
	readCommitted(c, nil)
	return c
}

// classifyForeign describes a directory without metadata.dckpt: Foreign if the library opens it as a checkpoint
// another library wrote, Corrupt or Unreadable (with Err) if it holds such files but the library rejects them, else
// NotACheckpoint. The library decides (it finds the safetensors index or files, or DCP's .metadata, and reads their
// headers only); nothing here parses another library's files.
func classifyForeign(c *Checkpoint) {
	readCommitted(c, nil)
	switch {
	case c.Status == Committed && c.Info != nil && c.Info.Format.Foreign():
		c.Status, c.Date = Foreign, c.LastActive
	case c.Status == Committed || errors.Is(c.Err, distckpt.ErrNotFound):
		// Not a checkpoint of any kind the library knows (or, without a metadata file, a distckpt checkpoint after
		// all: it was removed meanwhile).
		c.Status, c.Err, c.Info, c.User, c.Step, c.StepRaw = NotACheckpoint, nil, nil, nil, nil, ""
	}
}

// readCommitted opens the checkpoint with a metadata file at c.Path (on storage: nil, the one the path names) and sets c's status, summary,
// user metadata and step from it: Committed, or Corrupt or Unreadable with Err when it does not open.
func readCommitted(c *Checkpoint, storage *distckpt.StorageHandle) {
	r, err := distckpt.Open(c.Path, &distckpt.ReadOptions{NoVerify: true, Storage: storage})
	if err != nil {
		c.Err = err
		if errors.Is(err, distckpt.ErrCorrupt) || errors.Is(err, distckpt.ErrVersion) {
			c.Status = Corrupt
		} else {
			c.Status = Unreadable
		}
		return
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
}

// dirUsage sums the sizes of the files under path and finds its own mtime and the newest mtime of it and the
// entries directly in it (for the directories that are not leftovers: the core measures those).
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

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
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

// listed is what List returns of the entries found: the checkpoints and leftovers, with all the other entries too.
func listed(found []*Checkpoint, all bool) []Checkpoint {
	out := make([]Checkpoint, 0, len(found))
	for _, c := range found {
		if c.Status != NotACheckpoint || all {
			out = append(out, *c)
		}
	}
	return out
}
