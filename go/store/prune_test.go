package store

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
	"distckpt.dev/go/internal/testhooks"
)

func left(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return strings.Join(names, " ")
}

func actionOf(t *testing.T, res PruneResult, name string) PruneAction {
	t.Helper()
	for _, a := range res.Actions {
		if a.Checkpoint.Name == name {
			return a
		}
	}
	t.Fatalf("no action for %s: %+v", name, res.Actions)
	return PruneAction{}
}

func TestPruneKeepsTheNewestByStep(t *testing.T) {
	dir := t.TempDir()
	// Names sort differently from steps, so the order must come from the metadata.
	for name, step := range map[string]int{"a": 300, "b": 100, "c": 400, "d": 200} {
		fixtures.Write(t, filepath.Join(dir, name), fixtures.Options{Step: step})
	}
	res, err := Prune(dir, PrunePolicy{KeepLast: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.Order != ByStep || res.FreedBytes == 0 || res.Grace != DefaultGrace || !actionOf(t, res, "b").Deleted {
		t.Fatalf("%+v", res)
	}
	if got := left(t, dir); got != "a c" {
		t.Fatalf("left %s", got)
	}
}

func TestPruneKeepEvery(t *testing.T) {
	dir := newStore(t, 500, 1000, 1500, 2000, 2500, 3000)
	if _, err := Prune(dir, PrunePolicy{KeepLast: 1, KeepEvery: 1000}); err != nil {
		t.Fatal(err)
	}
	if got := left(t, dir); got != "step-1000 step-2000 step-3000" {
		t.Fatalf("left %s", got)
	}
}

func TestPruneDryRunDeletesNothing(t *testing.T) {
	dir := newStore(t, 1, 2, 3)
	fixtures.Staging(t, dir, "step-4", "0000000000000004", fixtures.Hostname(t), fixtures.DeadPID(t), 3*time.Hour)
	before := left(t, dir)
	res, err := Prune(dir, PrunePolicy{KeepLast: 1, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if !res.DryRun || actionOf(t, res, "step-1").Action != Delete || actionOf(t, res, "step-3").Action != Keep ||
		actionOf(t, res, "step-4.dckpt-staging-0000000000000004").Action != Delete || res.FreedBytes == 0 {
		t.Fatalf("plan %+v", res)
	}
	for _, a := range res.Actions {
		if a.Deleted {
			t.Errorf("dry run deleted %s", a.Checkpoint.Name)
		}
	}
	if got := left(t, dir); got != before {
		t.Fatalf("dry run changed %s to %s", before, got)
	}
}

// The zero Grace is DefaultGrace (an hour), not "none": a tool that leaves it out must not remove the staging
// directory of a writer on another host that is only a few minutes idle.
func TestPruneGraceDefaultsToAnHour(t *testing.T) {
	dir := newStore(t, 1)
	remote := fixtures.Staging(t, dir, "step-2", "02", "elsewhere.example", 12, 10*time.Minute)
	live := fixtures.Staging(t, dir, "step-3", "03", fixtures.Hostname(t), os.Getpid(), 5*time.Hour)
	res, err := Prune(dir, PrunePolicy{KeepLast: 1})
	if err != nil {
		t.Fatal(err)
	}
	if a := actionOf(t, res, filepath.Base(remote)); a.Action != Keep || !strings.Contains(a.Reason, "grace") {
		t.Fatalf("remote staging: %+v", a)
	}
	res, err = Prune(dir, PrunePolicy{KeepLast: 1, Grace: NoGrace})
	if err != nil {
		t.Fatal(err)
	}
	if !actionOf(t, res, filepath.Base(remote)).Deleted || res.Grace != 0 {
		t.Fatalf("NoGrace kept an idle remote staging directory: %+v", res)
	}
	if a := actionOf(t, res, filepath.Base(live)); a.Action != Keep || !strings.Contains(a.Reason, "running") {
		t.Fatalf("NoGrace touched the staging directory of a running writer: %+v", a)
	}
	// Idle since the newest time of the directory and of its files: aged two hours, it is garbage under the default.
	fresh := fixtures.Staging(t, dir, "step-4", "04", "elsewhere.example", 12, 0)
	res, _ = Prune(dir, PrunePolicy{KeepLast: 1, DryRun: true})
	if a := actionOf(t, res, "step-4.dckpt-staging-04"); a.Action != Keep {
		t.Fatalf("fresh: %+v", a)
	}
	fixtures.Age(t, fresh, 2*time.Hour)
	res, _ = Prune(dir, PrunePolicy{KeepLast: 1, DryRun: true})
	if a := actionOf(t, res, "step-4.dckpt-staging-04"); a.Action != Delete || !strings.Contains(a.Reason, "idle 2h") {
		t.Fatalf("aged: %+v", a)
	}
}

func TestPruneRefusals(t *testing.T) {
	dir := newStore(t, 1)
	for _, p := range []PrunePolicy{{}, {KeepLast: -1}, {KeepLast: 1, KeepEvery: -2}} {
		if _, err := Prune(dir, p); !errors.Is(err, distckpt.ErrInvalid) {
			t.Errorf("%+v: %v", p, err)
		}
	}
	ckpt := filepath.Join(dir, "step-1")
	if _, err := Prune(ckpt, PrunePolicy{KeepLast: 1}); !errors.Is(err, distckpt.ErrInvalid) ||
		!strings.Contains(err.Error(), ckpt) {
		t.Errorf("a checkpoint as the store: %v", err)
	}
	missing := filepath.Join(dir, "missing")
	if _, err := Prune(missing, PrunePolicy{KeepLast: 1}); !errors.Is(err, fs.ErrNotExist) ||
		!strings.Contains(err.Error(), missing) {
		t.Errorf("missing: %v", err)
	}
	if got := left(t, dir); got != "step-1" {
		t.Fatalf("a refused prune deleted something: %s", got)
	}
}

func TestPruneNeverTouches(t *testing.T) {
	dir := newStore(t, 1, 2, 3, 4, 5)
	// step-1: a symlink points at it. step-2: a live writer is committing over it. step-3: corrupt metadata.
	if err := os.Symlink("step-1", filepath.Join(dir, "best")); err != nil {
		t.Fatal(err)
	}
	fixtures.Staging(t, dir, "step-2", "0000000000000002", fixtures.Hostname(t), os.Getpid(), 5*time.Hour)
	if err := os.WriteFile(filepath.Join(dir, "step-3", MetadataFile), []byte("junk"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "old-notes", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	fixtures.Age(t, filepath.Join(dir, "old-notes"), 100*time.Hour)
	res, err := Prune(dir, PrunePolicy{KeepLast: 1, Grace: NoGrace})
	if err != nil {
		t.Fatal(err)
	}
	if got := left(t, dir); got != "best old-notes step-1 step-2 step-2.dckpt-staging-0000000000000002 step-3 step-5" {
		t.Fatalf("left %s\n%+v", got, res.Actions)
	}
	if a := actionOf(t, res, "step-1"); a.Action != Keep || !strings.Contains(a.Reason, "symbolic link") {
		t.Errorf("step-1: %+v", a)
	}
	if a := actionOf(t, res, "step-2"); a.Action != Keep || !strings.Contains(a.Reason, "committing") {
		t.Errorf("step-2: %+v", a)
	}
	for _, a := range res.Actions {
		if a.Checkpoint.Name == "old-notes" {
			t.Errorf("a directory that is not a checkpoint is in the plan: %+v", a)
		}
	}
}

func TestPruneRenamesBeforeRemovingAndReportsFailures(t *testing.T) {
	dir := newStore(t, 1, 2)
	defer func(f func(string) error) { testhooks.RemoveAll = f }(testhooks.RemoveAll)
	var removing []string
	testhooks.RemoveAll = func(path string) error {
		removing = append(removing, filepath.Base(path))
		return &os.PathError{Op: "unlinkat", Path: path, Err: os.ErrPermission}
	}
	res, err := Prune(dir, PrunePolicy{KeepLast: 1})
	var perr *PruneError
	if !errors.As(err, &perr) || len(perr.Failed) != 1 || !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("err %v", err)
	}
	got := strings.Fields(left(t, dir))
	if len(got) != 2 || !strings.HasPrefix(got[0], "step-1"+DeletingInfix) || got[1] != "step-2" ||
		len(removing) != 1 || removing[0] != got[0] {
		t.Fatalf("left %v, removing %v", got, removing)
	}
	if a := actionOf(t, res, "step-1"); a.Deleted || a.Err == nil || res.FreedBytes != 0 {
		t.Fatalf("action %+v", a)
	}
	cks, _ := List(dir, nil)
	if byName(t, cks, got[0]).Status != Deleting {
		t.Fatalf("the leftover is not recognisable: %+v", cks)
	}
}

// A checkpoint or a leftover swapped for a symbolic link (or another directory) after the store was listed is not
// deleted: not the link, not what it points to. Before this check, prune renamed and removed the link.
func TestPruneDoesNotDeleteWhatChangedSinceTheListing(t *testing.T) {
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	fixtures.Write(t, outside, fixtures.Options{Step: 0})
	dir := filepath.Join(base, "store")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for s := 1; s <= 4; s++ {
		fixtures.Write(t, filepath.Join(dir, "step-"+string(rune('0'+s))), fixtures.Options{Step: s})
	}
	staging := fixtures.Staging(t, dir, "step-9", "09", fixtures.Hostname(t), fixtures.DeadPID(t), 3*time.Hour)
	swapForLink := func(victim string) {
		if err := os.RemoveAll(victim); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, victim); err != nil {
			t.Fatal(err)
		}
	}
	// The staging directory becomes a link just before the library is asked to remove it.
	defer func(f func(string, time.Duration) error) { testhooks.RemoveLeftover = f }(testhooks.RemoveLeftover)
	askedFor := ""
	testhooks.RemoveLeftover = func(path string, grace time.Duration) error {
		askedFor = path
		swapForLink(path)
		return distckpt.RemoveLeftover(path, grace)
	}
	// step-2 becomes a link, and step-3 another directory, once the first committed checkpoint is being removed.
	defer func(f func(string) error) { testhooks.RemoveAll = f }(testhooks.RemoveAll)
	swapped := false
	testhooks.RemoveAll = func(path string) error {
		if !swapped {
			swapped = true
			swapForLink(filepath.Join(dir, "step-2"))
			if err := os.Rename(filepath.Join(dir, "step-3"), filepath.Join(base, "moved")); err != nil {
				t.Fatal(err)
			}
			fixtures.Write(t, filepath.Join(dir, "step-3"), fixtures.Options{Step: 3})
		}
		return os.RemoveAll(path)
	}
	before := snapshot(t, outside)
	res, err := Prune(dir, PrunePolicy{KeepLast: 1, Grace: NoGrace})
	var perr *PruneError
	if !errors.As(err, &perr) || len(perr.Failed) != 3 {
		t.Fatalf("want 3 refused deletions, got %v\n%+v", err, res.Actions)
	}
	if !swapped || askedFor != staging {
		t.Fatalf("nothing was deleted (asked to remove %q)", askedFor)
	}
	if got := left(t, dir); got != "step-2 step-3 step-4 "+filepath.Base(staging) {
		t.Fatalf("left %s", got)
	}
	for _, name := range []string{"step-2", "step-3", filepath.Base(staging)} {
		if a := actionOf(t, res, name); a.Deleted || a.Err == nil || !strings.Contains(a.Err.Error(), "changed") {
			t.Errorf("%s: %+v", name, a)
		}
	}
	for _, link := range []string{filepath.Join(dir, "step-2"), staging} {
		if target, err := os.Readlink(link); err != nil || target != outside {
			t.Errorf("the link that replaced %s was not left alone: %q %v", link, target, err)
		}
	}
	if after := snapshot(t, outside); !reflect.DeepEqual(before, after) {
		t.Fatalf("prune changed what a link points to")
	}
}

// snapshot maps every path under root (not following links) to its size, or to "dir".
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out[p] = info.Mode().String() + " " + info.ModTime().String()
		if info.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[p] += " " + string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// An incremental checkpoint's bases are kept with it, whatever the policy; the rest goes, newest first.
func TestPruneKeepsTheBasesOfKeptCheckpoints(t *testing.T) {
	dir := t.TempDir()
	fixtures.Write(t, filepath.Join(dir, "a"), fixtures.Options{Step: 100})
	fixtures.Write(t, filepath.Join(dir, "b"), fixtures.Options{Step: 200, Seed: 1})
	fixtures.Write(t, filepath.Join(dir, "c"), fixtures.Options{Step: 300, Base: "a"}) // a's values: all in a
	fixtures.Write(t, filepath.Join(dir, "d"), fixtures.Options{Step: 400, Seed: 1, Base: "b"})
	res, err := Prune(dir, PrunePolicy{KeepLast: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got := left(t, dir); got != "b d" {
		t.Fatalf("left %s: %+v", got, res.Actions)
	}
	if a := actionOf(t, res, "b"); a.Action != Keep || !strings.Contains(a.Reason, "refers to it (d)") {
		t.Fatalf("%+v", a)
	}
	// c referred to a; both went, c first (the library refuses to remove a base while others refer to it).
	if !actionOf(t, res, "a").Deleted || !actionOf(t, res, "c").Deleted {
		t.Fatalf("%+v", res.Actions)
	}
	r, err := distckpt.Open(filepath.Join(dir, "d"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if v, err := r.Verify(nil); err != nil || len(v.Bad) != 0 {
		t.Fatalf("%+v %v", v, err)
	}
}
