package main

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

// What a directory under a checkpoint store is (the "status" field of ls and prune). See FORMAT.md sections 1 and 6.
const (
	statusCommitted = "committed"  // metadata.dckpt, no STAGING marker, and the metadata opens
	statusCorrupt   = "corrupt"    // metadata.dckpt that the library rejects as corrupt or of an unsupported version
	statusError     = "unreadable" // metadata.dckpt that could not be read for another reason (permissions, I/O)
	statusStaging   = "incomplete" // <name>.dckpt-staging-<nonce> with a STAGING marker: being written, or abandoned
	// <name>.dckpt-staging-<nonce> without a marker but with metadata: complete, not yet renamed into place.
	statusUnrenamed = "complete-unrenamed"
	statusReplaced  = "replaced"         // <name>.dckpt-old-<nonce>: a checkpoint an overwrite moved aside
	statusDeleting  = "deleting"         // <name>.dckpt-deleting-<nonce>: being removed by prune
	statusOther     = "not-a-checkpoint" // none of the above (listed by ls --all only)
)

const (
	metadataFile  = "metadata.dckpt"
	stagingMarker = "STAGING"
	stagingInfix  = ".dckpt-staging-"
	replacedInfix = ".dckpt-old-"
	deletingInfix = ".dckpt-deleting-"
)

// timeNow is the clock; tests move it.
var timeNow = time.Now

// writerInfo is what a STAGING marker says about the process that is writing (or was writing) a checkpoint.
type writerInfo struct {
	Host      string    `json:"host"`
	PID       int       `json:"pid"`
	Started   time.Time `json:"-"`
	FinalPath string    `json:"final_path"`
	// "running" (this host, the pid exists), "exited" (this host, no such pid), "unknown" (another host).
	State string `json:"state"`
}

// entry is one directory of a checkpoint store.
type entry struct {
	Name       string
	Path       string
	Status     string
	FinalName  string // for staging, replaced and deleting directories: the checkpoint name they belong to
	Symlink    string // the link's target, if the directory is reached through a symbolic link
	Step       *int64 // user metadata "step", when it is an integer
	StepRaw    string // user metadata "step" as stored
	Entries    *int
	DataBytes  *uint64
	DiskBytes  uint64    // sizes of the files under the directory
	Date       time.Time // committed: when metadata.dckpt was written; staging: the marker's start time
	ModTime    time.Time // the directory's own mtime
	LastActive time.Time // newest mtime of the directory and the files directly in it
	Writer     *writerInfo
	Err        error
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

// scanStore classifies every directory directly under dir, sorted by name.
func scanStore(dir string) ([]*entry, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []*entry
	for _, de := range ents {
		path := filepath.Join(dir, de.Name())
		symlink := ""
		if de.Type()&fs.ModeSymlink != 0 {
			if symlink, err = os.Readlink(path); err != nil {
				continue
			}
		}
		st, err := os.Stat(path)
		if err != nil || !st.IsDir() {
			continue
		}
		e := classify(path)
		e.Symlink = symlink
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return naturalLess(out[i].Name, out[j].Name) })
	return out, nil
}

// classify looks at one directory.
func classify(path string) *entry {
	e := &entry{Name: filepath.Base(path), Path: path}
	e.DiskBytes, e.ModTime, e.LastActive = dirUsage(path)
	hasMarker := exists(filepath.Join(path, stagingMarker))
	if final, ok := splitSuffixedName(e.Name, deletingInfix); ok {
		e.Status, e.FinalName = statusDeleting, final
		return e
	}
	if final, ok := splitSuffixedName(e.Name, replacedInfix); ok {
		e.Status, e.FinalName = statusReplaced, final
		return e
	}
	if final, ok := splitSuffixedName(e.Name, stagingInfix); ok || hasMarker {
		e.FinalName = final
		if !hasMarker && exists(filepath.Join(path, metadataFile)) {
			// Committed data whose final rename has not happened: a commit in progress, or one that was interrupted.
			e.Status = statusUnrenamed
			e.Date = e.ModTime
			return e
		}
		// With a marker, or without one and without metadata (a writer that has only just created the directory).
		e.Status = statusStaging
		if hasMarker {
			e.Writer = readMarker(filepath.Join(path, stagingMarker))
		}
		if e.Writer != nil {
			e.Date = e.Writer.Started
		}
		if e.Date.IsZero() {
			e.Date = e.ModTime
		}
		return e
	}
	mst, err := os.Stat(filepath.Join(path, metadataFile))
	if err != nil {
		e.Status = statusOther
		return e
	}
	e.Date = mst.ModTime()
	r, err := distckpt.Open(path, &distckpt.ReadOptions{NoVerify: true})
	if err != nil {
		e.Err = err
		if errors.Is(err, distckpt.ErrCorrupt) || errors.Is(err, distckpt.ErrVersion) {
			e.Status = statusCorrupt
		} else {
			e.Status = statusError
		}
		return e
	}
	defer r.Close()
	e.Status = statusCommitted
	if info, err := r.Info(); err == nil {
		e.Entries, e.DataBytes = &info.NumEntries, &info.TotalBytes
	}
	if user, err := r.UserMetadata(); err == nil {
		if s, ok := user["step"]; ok {
			e.StepRaw = s
			if v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64); err == nil {
				e.Step = &v
			}
		}
	}
	return e
}

// dirUsage sums the sizes of the files under path and finds its own mtime and the newest mtime of it and the
// entries directly in it (a writer's data files show its activity).
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
func readMarker(path string) *writerInfo {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	w := &writerInfo{PID: -1}
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
func writerState(host string, pid int) string {
	me, err := os.Hostname()
	if err != nil || host == "" || host != me || pid <= 0 {
		return "unknown"
	}
	if err := syscall.Kill(pid, 0); err == nil || errors.Is(err, syscall.EPERM) {
		return "running"
	}
	return "exited"
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
