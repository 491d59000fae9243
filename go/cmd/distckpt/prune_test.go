package main

import (
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"distckpt.dev/go/internal/fixtures"
	"distckpt.dev/go/internal/testhooks"
)

type pruneOut struct {
	DryRun     bool `json:"dry_run"`
	Order      string
	FreedBytes uint64 `json:"freed_bytes"`
	Actions    []struct {
		Name, Status, Action, Reason string
		Deleted                      bool
		Error                        *jsonError
	}
}

func (o pruneOut) action(t *testing.T, name string) string {
	t.Helper()
	for _, a := range o.Actions {
		if a.Name == name {
			return a.Action
		}
	}
	t.Fatalf("no action for %s: %+v", name, o.Actions)
	return ""
}

// remaining lists the directory's entries.
func remaining(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

func TestPruneKeepLastByStep(t *testing.T) {
	// Names sort differently from steps, so the order must come from the metadata.
	dir := t.TempDir()
	for name, step := range map[string]int{"a": 300, "b": 100, "c": 400, "d": 200} {
		write(t, dir, name, fixtures.Options{Step: step})
	}
	var o pruneOut
	if code := cliJSON(t, &o, "prune", dir, "--keep-last", "2"); code != exitOK {
		t.Fatalf("exit %d %+v", code, o)
	}
	if o.Order != "step" || o.FreedBytes == 0 {
		t.Fatalf("%+v", o)
	}
	if got := strings.Join(remaining(t, dir), " "); got != "a c" {
		t.Fatalf("left %s", got)
	}
}

func TestPruneKeepEvery(t *testing.T) {
	dir := newStore(t, 500, 1000, 1500, 2000, 2500, 3000)
	var o pruneOut
	cliJSON(t, &o, "prune", "--keep-last", "1", "--keep-every", "1000", dir)
	if got := strings.Join(remaining(t, dir), " "); got != "step-1000 step-2000 step-3000" {
		t.Fatalf("left %s (%+v)", got, o.Actions)
	}
}

func TestPruneFallsBackToMtime(t *testing.T) {
	dir := t.TempDir()
	old := write(t, dir, "z-old", fixtures.Options{Step: 900})
	write(t, dir, "a-new", fixtures.Options{Step: -1})
	fixtures.Age(t, old, 2*time.Hour)
	var o pruneOut
	cliJSON(t, &o, "prune", "--keep-last", "1", dir)
	if o.Order != "mtime" || strings.Join(remaining(t, dir), " ") != "a-new" {
		t.Fatalf("order %s, left %v", o.Order, remaining(t, dir))
	}
}

func TestPruneDryRunDeletesNothing(t *testing.T) {
	dir := newStore(t, 1, 2, 3)
	fixtures.Staging(t, dir, "step-4", "0000000000000004", fixtures.Hostname(t), fixtures.DeadPID(t), 3*time.Hour)
	before := remaining(t, dir)
	var o pruneOut
	if code := cliJSON(t, &o, "prune", "--keep-last", "1", "--dry-run", dir); code != exitOK || !o.DryRun {
		t.Fatalf("%d %+v", code, o)
	}
	if o.action(t, "step-1") != "delete" || o.action(t, "step-4.dckpt-staging-0000000000000004") != "delete" ||
		o.action(t, "step-3") != "keep" || o.FreedBytes == 0 {
		t.Fatalf("plan %+v", o.Actions)
	}
	for _, a := range o.Actions {
		if a.Deleted {
			t.Errorf("dry run deleted %s", a.Name)
		}
	}
	if got := remaining(t, dir); strings.Join(got, " ") != strings.Join(before, " ") {
		t.Fatalf("dry run changed %v to %v", before, got)
	}
	out, _, _ := cli(t, "prune", "--keep-last", "1", "--dry-run", dir)
	if !strings.Contains(out, "would delete  step-1") || !strings.Contains(out, "would free") {
		t.Fatalf("plan:\n%s", out)
	}
}

func TestPruneStagingRules(t *testing.T) {
	dir := newStore(t, 1)
	host := fixtures.Hostname(t)
	dead := fixtures.DeadPID(t)
	old := 3 * time.Hour
	cases := map[string]struct {
		path   string
		action string
	}{
		"live writer, old":          {fixtures.Staging(t, dir, "s1", "01", host, os.Getpid(), old), "keep"},
		"dead writer, old":          {fixtures.Staging(t, dir, "s2", "02", host, dead, old), "delete"},
		"dead writer, recent":       {fixtures.Staging(t, dir, "s3", "03", host, dead, 10*time.Minute), "keep"},
		"other host, old":           {fixtures.Staging(t, dir, "s4", "04", "elsewhere.example", 12, old), "delete"},
		"other host, recent":        {fixtures.Staging(t, dir, "s5", "05", "elsewhere.example", 12, time.Minute), "keep"},
		"garbage marker, old":       {fixtures.Staging(t, dir, "s6", "06", host, dead, old), "delete"},
		"no marker, no data, old":   {fixtures.Staging(t, dir, "s7", "07", host, dead, old), "delete"},
		"no marker, metadata (old)": {write(t, dir, "s8.dckpt-staging-08", fixtures.Options{Step: 8}), "delete"},
		"no marker, metadata (new)": {write(t, dir, "s9.dckpt-staging-09", fixtures.Options{Step: 9}), "keep"},
	}
	if err := os.WriteFile(filepath.Join(cases["garbage marker, old"].path, "STAGING"), []byte("\x00\x01"), 0o644); err != nil {
		t.Fatal(err)
	}
	fixtures.Age(t, cases["garbage marker, old"].path, old)
	if err := os.Remove(filepath.Join(cases["no marker, no data, old"].path, "STAGING")); err != nil {
		t.Fatal(err)
	}
	fixtures.Age(t, cases["no marker, no data, old"].path, old)
	fixtures.Age(t, cases["no marker, metadata (old)"].path, old)

	var o pruneOut
	if code := cliJSON(t, &o, "prune", "--keep-last", "1", dir); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	for name, c := range cases {
		base := filepath.Base(c.path)
		if got := o.action(t, base); got != c.action {
			t.Errorf("%s (%s): %s, want %s", name, base, got, c.action)
		}
		_, err := os.Stat(c.path)
		if gone := os.IsNotExist(err); gone != (c.action == "delete") {
			t.Errorf("%s: gone=%v after the prune", name, gone)
		}
	}
	// --grace 0 still never removes a staging directory whose writer runs on this host.
	cliJSON(t, &o, "prune", "--keep-last", "1", "--grace", "0s", dir)
	if _, err := os.Stat(cases["live writer, old"].path); err != nil {
		t.Fatal("removed the staging directory of a running writer")
	}
	if _, err := os.Stat(cases["other host, recent"].path); err == nil {
		t.Fatal("--grace 0s kept an idle remote staging directory")
	}
}

func TestPruneLeftovers(t *testing.T) {
	dir := newStore(t, 1)
	oldAside := write(t, dir, "step-0.dckpt-old-00000000000000aa", fixtures.Options{Step: 0})
	recentAside := write(t, dir, "step-0.dckpt-old-00000000000000bb", fixtures.Options{Step: 0})
	deleting := write(t, dir, "step-0.dckpt-deleting-00000000000000cc", fixtures.Options{Step: 0})
	fixtures.Age(t, oldAside, 2*time.Hour)
	fixtures.Age(t, deleting, 2*time.Hour)
	var o pruneOut
	cliJSON(t, &o, "prune", "--keep-last", "5", dir)
	if got := strings.Join(remaining(t, dir), " "); got != "step-0.dckpt-old-00000000000000bb step-1" {
		t.Fatalf("left %s", got)
	}
	_ = recentAside
}

func TestPruneNeverTouches(t *testing.T) {
	dir := newStore(t, 1, 2, 3, 4, 5)
	// step-1: a symlink points at it. step-2: a live writer is committing over it. step-3: corrupt metadata.
	if err := os.Symlink("step-1", filepath.Join(dir, "best")); err != nil {
		t.Fatal(err)
	}
	fixtures.Staging(t, dir, "step-2", "0000000000000002", fixtures.Hostname(t), os.Getpid(), time.Hour*5)
	if err := os.WriteFile(filepath.Join(dir, "step-3", "metadata.dckpt"), []byte("junk"), 0o644); err != nil {
		t.Fatal(err)
	}
	var o pruneOut
	if code := cliJSON(t, &o, "prune", "--keep-last", "1", dir); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	got := strings.Join(remaining(t, dir), " ")
	if got != "best step-1 step-2 step-2.dckpt-staging-0000000000000002 step-3 step-5" {
		t.Fatalf("left %s\n%+v", got, o.Actions)
	}
	if o.action(t, "step-3") != "keep" || o.action(t, "best") != "keep" {
		t.Fatalf("%+v", o.Actions)
	}
}

func TestPruneRenamesBeforeRemoving(t *testing.T) {
	dir := newStore(t, 1, 2)
	// Make the removal fail after the rename: the checkpoint must already be gone from its name, and the leftover
	// recognisable as being deleted (the next prune removes it).
	defer func(f func(string) error) { testhooks.RemoveAll = f }(testhooks.RemoveAll)
	var removing []string
	testhooks.RemoveAll = func(path string) error {
		removing = append(removing, filepath.Base(path))
		return &os.PathError{Op: "unlinkat", Path: path, Err: os.ErrPermission}
	}
	var o pruneOut
	code := cliJSON(t, &o, "prune", "--keep-last", "1", dir)
	left := remaining(t, dir)
	if code != exitPermission || len(left) != 2 || !strings.HasPrefix(left[0], "step-1.dckpt-deleting-") ||
		left[1] != "step-2" || len(removing) != 1 || removing[0] != left[0] {
		t.Fatalf("exit %d, left %v, removing %v", code, left, removing)
	}
	if a := o.Actions[len(o.Actions)-2]; a.Name != "step-1" || a.Deleted || a.Error == nil {
		t.Fatalf("action %+v", a)
	}
	var ls lsOut
	cliJSON(t, &ls, "ls", dir)
	if ls.Checkpoints[ls.byName(t, left[0])].Status != statusDeleting {
		t.Fatalf("ls: %+v", ls)
	}
	// The leftover goes once it has been idle for the grace period.
	testhooks.RemoveAll = os.RemoveAll
	fixtures.Age(t, filepath.Join(dir, left[0]), 2*time.Hour)
	cliJSON(t, &o, "prune", "--keep-last", "1", dir)
	if got := strings.Join(remaining(t, dir), " "); got != "step-2" {
		t.Fatalf("left %s", got)
	}
}

func TestPruneRefusals(t *testing.T) {
	dir := newStore(t, 1)
	if _, errOut, code := cli(t, "prune", dir); code != exitUsage || !strings.Contains(errOut, "--keep-last") {
		t.Fatalf("no --keep-last: %d %s", code, errOut)
	}
	if _, _, code := cli(t, "prune", "--keep-last", "1", filepath.Join(dir, "step-1")); code != exitUsage {
		t.Fatalf("a checkpoint as DIR: %d", code)
	}
	if strings.Join(remaining(t, dir), " ") != "step-1" {
		t.Fatal("a refused prune deleted something")
	}
}

// snapshotTree maps every path under root (not following links) to its content, or to "dir" / "link -> target".
func snapshotTree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case d.Type()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			out[rel] = "link -> " + target
		case d.IsDir():
			out[rel] = "dir"
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Issue 10: prune never deletes anything outside the directory it was given, whatever links are inside it: links in
// checkpoints (to files and directories outside), a link in place of a data file, top-level links to checkpoints and
// directories outside named like checkpoints, staging and leftover directories, and a checkpoint swapped for a link
// between the scan and its deletion.
func TestPruneNeverDeletesAnythingOutsideItsDirectory(t *testing.T) {
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	if err := os.MkdirAll(filepath.Join(outside, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"precious", "sub/also-precious"} {
		if err := os.WriteFile(filepath.Join(outside, f), []byte("keep "+f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fixtures.Write(t, filepath.Join(outside, "step-0"), fixtures.Options{Step: 0})
	before := snapshotTree(t, outside)

	dir := filepath.Join(base, "store")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for s := 1; s <= 6; s++ {
		fixtures.Write(t, filepath.Join(dir, "step-"+itoa(s)), fixtures.Options{Step: s, Seed: float32(s)})
	}
	link := func(target, name string) {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	link(outside, "step-1/evil-dir")
	link(filepath.Join(outside, "precious"), "step-1/evil-file")
	link("../../outside/sub", "step-2/relative-evil")
	data := filepath.Join(dir, "step-3", "data-00000.bin")
	if err := os.Remove(data); err != nil {
		t.Fatal(err)
	}
	link(filepath.Join(outside, "precious"), "step-3/data-00000.bin")
	link(filepath.Join(outside, "step-0"), "step-0")  // an old checkpoint outside, by step
	link(outside, "x.dckpt-staging-00000000000000aa") // staging-shaped links
	link(outside, "x.dckpt-old-00000000000000bb")     // leftover-shaped links
	link(filepath.Join(outside, "sub"), "y.dckpt-deleting-00000000000000cc")
	staging := fixtures.Staging(t, dir, "z", "00000000000000dd", fixtures.Hostname(t), fixtures.DeadPID(t), 3*time.Hour)
	if err := os.Symlink(outside, filepath.Join(staging, "evil")); err != nil {
		t.Fatal(err)
	}
	fixtures.Age(t, staging, 3*time.Hour)

	// Between the scan and the deletions, step-4 is swapped for a link to the outside directory.
	defer func(f func(string) error) { testhooks.RemoveAll = f }(testhooks.RemoveAll)
	swapped := false
	testhooks.RemoveAll = func(path string) error {
		if !swapped {
			swapped = true
			victim := filepath.Join(dir, "step-4")
			if err := os.RemoveAll(victim); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, victim); err != nil {
				t.Fatal(err)
			}
		}
		return os.RemoveAll(path)
	}
	var o pruneOut
	cliJSON(t, &o, "prune", "--keep-last", "1", "--grace", "0s", dir)
	if !swapped {
		t.Fatalf("nothing was deleted: %+v", o.Actions)
	}
	if after := snapshotTree(t, outside); !reflect.DeepEqual(after, before) {
		t.Fatalf("prune changed what lies outside its directory:\nbefore %v\nafter  %v", before, after)
	}
	for _, kept := range []string{"step-0", "x.dckpt-staging-00000000000000aa", "x.dckpt-old-00000000000000bb",
		"y.dckpt-deleting-00000000000000cc", "step-6"} {
		if _, err := os.Lstat(filepath.Join(dir, kept)); err != nil {
			t.Errorf("%s is gone: links are never followed or deleted by prune, and the newest checkpoint stays", kept)
		}
	}
	for _, gone := range []string{"step-1", "step-2", "step-3", filepath.Base(staging)} {
		if _, err := os.Lstat(filepath.Join(dir, gone)); err == nil {
			t.Errorf("%s is still there", gone)
		}
	}
}
