package store

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
)

// newStore writes committed fixtures step-<s> under a new directory.
func newStore(t *testing.T, steps ...int) string {
	t.Helper()
	dir := t.TempDir()
	for _, s := range steps {
		fixtures.Write(t, filepath.Join(dir, "step-"+strconv.Itoa(s)), fixtures.Options{Step: s, Seed: float32(s)})
	}
	return dir
}

func byName(t *testing.T, cks []Checkpoint, name string) Checkpoint {
	t.Helper()
	for _, c := range cks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("%s not listed", name)
	return Checkpoint{}
}

func TestListEveryStatus(t *testing.T) {
	dir := newStore(t, 1000, 200)
	fixtures.Write(t, filepath.Join(dir, "nostep"), fixtures.Options{Step: -1})
	fixtures.Write(t, filepath.Join(dir, "floatstep"), fixtures.Options{Step: -1, User: map[string]string{"step": "1.5"}})
	fixtures.Write(t, filepath.Join(dir, "garbage-meta"), fixtures.Options{Step: 5})
	garbage := filepath.Join(dir, "garbage-meta", MetadataFile)
	if err := os.WriteFile(garbage, []byte("not flatbuffers"), 0o644); err != nil {
		t.Fatal(err)
	}
	host := fixtures.Hostname(t)
	fixtures.Staging(t, dir, "step-400", "00000000000000aa", host, os.Getpid(), 0)
	fixtures.Staging(t, dir, "step-500", "00000000000000bb", host, fixtures.DeadPID(t), 0)
	fixtures.Staging(t, dir, "step-600", "00000000000000cc", "elsewhere.example", 77, 0)
	fixtures.Write(t, filepath.Join(dir, "step-700.dckpt-staging-00000000000000dd"), fixtures.Options{Step: 700})
	fixtures.Write(t, filepath.Join(dir, "step-200.dckpt-old-00000000000000ee"), fixtures.Options{Step: 200})
	fixtures.Write(t, filepath.Join(dir, "step-1.dckpt-deleting-00000000000000ff"), fixtures.Options{Step: 1})
	if err := os.Mkdir(filepath.Join(dir, "notes"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "README"), []byte("a file, not listed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("step-1000", filepath.Join(dir, "latest")); err != nil {
		t.Fatal(err)
	}

	cks, err := List(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Status{
		"step-200": Committed, "step-1000": Committed, "latest": Committed, "nostep": Committed,
		"floatstep": Committed, "garbage-meta": Corrupt,
		"step-400.dckpt-staging-00000000000000aa": Incomplete, "step-500.dckpt-staging-00000000000000bb": Incomplete,
		"step-600.dckpt-staging-00000000000000cc": Incomplete,
		"step-700.dckpt-staging-00000000000000dd": CompleteUnrenamed,
		"step-200.dckpt-old-00000000000000ee":     Replaced, "step-1.dckpt-deleting-00000000000000ff": Deleting,
	}
	if len(cks) != len(want) {
		t.Fatalf("listed %d, want %d: %+v", len(cks), len(want), cks)
	}
	var names []string
	for _, c := range cks {
		names = append(names, c.Name)
		if c.Status != want[c.Name] {
			t.Errorf("%s: %s, want %s", c.Name, c.Status, want[c.Name])
		}
		if c.Status.Leftover() != strings.Contains(c.Name, ".dckpt-") {
			t.Errorf("%s: Leftover() = %v", c.Name, c.Status.Leftover())
		}
	}
	if !sort.SliceIsSorted(names, func(i, j int) bool { return naturalLess(names[i], names[j]) }) {
		t.Errorf("not in natural order: %v", names)
	}
	c := byName(t, cks, "step-1000")
	if c.Step == nil || *c.Step != 1000 || c.StepRaw != "1000" || c.Info == nil ||
		c.Info.NumEntries != len(fixtures.Standard)+1 || c.User["framework"] != "fixtures" ||
		c.DiskBytes <= c.Info.TotalBytes || c.Date.IsZero() || c.Err != nil || c.Path != filepath.Join(dir, "step-1000") {
		t.Errorf("step-1000: %+v", c)
	}
	if c := byName(t, cks, "floatstep"); c.Step != nil || c.StepRaw != "1.5" {
		t.Errorf("floatstep: %+v", c)
	}
	if c := byName(t, cks, "latest"); c.Symlink != "step-1000" {
		t.Errorf("latest: %+v", c)
	}
	if c := byName(t, cks, "garbage-meta"); !errors.Is(c.Err, distckpt.ErrCorrupt) || c.Info != nil ||
		!strings.Contains(c.Err.Error(), "garbage-meta") {
		t.Errorf("garbage-meta: %+v", c)
	}
	for name, state := range map[string]WriterState{
		"step-400.dckpt-staging-00000000000000aa": WriterRunning,
		"step-500.dckpt-staging-00000000000000bb": WriterExited,
		"step-600.dckpt-staging-00000000000000cc": WriterUnknown,
	} {
		c := byName(t, cks, name)
		final := strings.SplitN(name, ".", 2)[0]
		if c.Writer == nil || c.Writer.State != state || c.FinalName != final ||
			c.Writer.FinalPath != filepath.Join(dir, final) || c.Writer.Started.IsZero() {
			t.Errorf("%s: %+v %+v", name, c, c.Writer)
		}
	}
	if c := byName(t, cks, "step-700.dckpt-staging-00000000000000dd"); c.FinalName != "step-700" || c.Writer != nil {
		t.Errorf("unrenamed: %+v", c)
	}

	all, err := List(dir, &ListOptions{All: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(want)+1 || byName(t, all, "notes").Status != NotACheckpoint {
		t.Errorf("All: %d listed", len(all))
	}
}

func TestListOfACheckpointAndOfNothing(t *testing.T) {
	dir := newStore(t, 7)
	cks, err := List(filepath.Join(dir, "step-7"), nil)
	if err != nil || len(cks) != 1 || cks[0].Status != Committed || *cks[0].Step != 7 {
		t.Fatalf("%+v %v", cks, err)
	}
	staging := fixtures.Staging(t, dir, "step-8", "08", "h", 1, 0)
	if cks, err := List(staging, nil); err != nil || len(cks) != 1 || cks[0].Status != Incomplete {
		t.Fatalf("staging: %+v %v", cks, err)
	}
	if cks, err := List(t.TempDir(), nil); err != nil || len(cks) != 0 {
		t.Fatalf("empty: %+v %v", cks, err)
	}
	missing := filepath.Join(dir, "missing")
	if _, err := List(missing, nil); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("missing: %v", err)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := List(file, nil); err == nil || !strings.Contains(err.Error(), file) {
		t.Fatalf("a file: %v", err)
	}
	if _, err := Stat(file); err == nil {
		t.Fatal("Stat of a file")
	}
	if c, err := Stat(filepath.Join(dir, "step-7")); err != nil || c.Status != Committed {
		t.Fatalf("Stat: %+v %v", c, err)
	}
}

func TestNaturalOrder(t *testing.T) {
	names := []string{"step-1000", "step-99", "step-100", "a", "step-100.dckpt-staging-00ff", "step-0100x"}
	sort.Slice(names, func(i, j int) bool { return naturalLess(names[i], names[j]) })
	if got := strings.Join(names, " "); got != "a step-99 step-100 step-100.dckpt-staging-00ff step-0100x step-1000" {
		t.Fatalf("order: %s", got)
	}
}

// Only the names the library gives leftovers make a directory one: a STAGING marker in a directory named otherwise
// (or with a nonce that is not lower-case hex) is not a leftover, nor a committed checkpoint even with metadata, and
// Prune never deletes it, however old.
func TestOnlyLeftoverNamesAreLeftovers(t *testing.T) {
	dir := newStore(t, 1)
	fixtures.Write(t, filepath.Join(dir, "half-written"), fixtures.Options{Step: 0})
	odd := []string{"half-written", "step-2.dckpt-staging-ABCD", "step-3.dckpt-staging-", "x.dckpt-old-1g"}
	for _, name := range odd {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(path, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(path, StagingMarker), []byte("pid: 1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		fixtures.Age(t, path, 100*time.Hour)
	}
	aged := fixtures.Staging(t, dir, "step-4", "04", "elsewhere.example", 12, 100*time.Hour)
	all, err := List(dir, &ListOptions{All: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range odd {
		if c := byName(t, all, name); c.Status != NotACheckpoint || c.Writer != nil {
			t.Errorf("%s: %+v", name, c)
		}
	}
	if c := byName(t, all, filepath.Base(aged)); c.Status != Incomplete {
		t.Errorf("a staging directory: %+v", c)
	}
	if cks, err := List(filepath.Join(dir, "half-written"), nil); err != nil || len(cks) != 1 ||
		cks[0].Status != NotACheckpoint {
		t.Errorf("List of a marked directory that is not a leftover: %+v %v", cks, err)
	}
	if _, err := Prune(dir, PrunePolicy{KeepLast: 1, Grace: NoGrace}); err != nil {
		t.Fatal(err)
	}
	want := "half-written step-1 step-2.dckpt-staging-ABCD step-3.dckpt-staging- x.dckpt-old-1g"
	if got := left(t, dir); got != want {
		t.Fatalf("left %s, want %s", got, want)
	}
}
