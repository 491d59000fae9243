package distckpt_test

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
)

// reapedPID is the pid of a child process that has exited and been waited for: no process has it (until the system
// hands it out again, which takes a full turn of the pid space).
func reapedPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatalf("running a child process: %v", err)
	}
	return cmd.ProcessState.Pid()
}

func leftoverNamed(t *testing.T, ls []distckpt.Leftover, name string) distckpt.Leftover {
	t.Helper()
	for _, l := range ls {
		if l.Name == name {
			return l
		}
	}
	t.Fatalf("%s not reported: %+v", name, ls)
	return distckpt.Leftover{}
}

func mkdirWith(t *testing.T, dir string, files ...string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestScanLeftoversJudgesEveryKind(t *testing.T) {
	dir := t.TempDir()
	host := fixtures.Hostname(t)
	dead := reapedPID(t)
	live := fixtures.Staging(t, dir, "step-1", "0a", host, os.Getpid(), 3*time.Hour)
	exited := fixtures.Staging(t, dir, "step-2", "0b", host, dead, 2*time.Hour)
	recent := fixtures.Staging(t, dir, "step-3", "0c", host, dead, 10*time.Minute)
	unrenamed := mkdirWith(t, filepath.Join(dir, "step-4.dckpt-staging-0d"), "metadata.dckpt")
	fixtures.Age(t, unrenamed, 2*time.Hour)
	replaced := mkdirWith(t, filepath.Join(dir, "step-5.dckpt-old-0e"), "metadata.dckpt")
	fixtures.Age(t, replaced, 2*time.Hour)
	deleting := mkdirWith(t, filepath.Join(dir, "step-6.dckpt-deleting-0f"))
	// Not leftovers: a marker in a directory without a leftover's name, a name with an upper-case nonce, a file.
	mkdirWith(t, filepath.Join(dir, "notes"), "STAGING")
	mkdirWith(t, filepath.Join(dir, "step-7.dckpt-staging-0A"), "STAGING")
	if err := os.WriteFile(filepath.Join(dir, "step-8.dckpt-old-01"), nil, 0o644); err != nil {
		t.Fatal(err)
	}

	ls, err := distckpt.ScanLeftovers(dir, "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range ls {
		names = append(names, l.Name)
	}
	want := "step-1.dckpt-staging-0a step-2.dckpt-staging-0b step-3.dckpt-staging-0c step-4.dckpt-staging-0d " +
		"step-5.dckpt-old-0e step-6.dckpt-deleting-0f"
	if got := strings.Join(names, " "); got != want {
		t.Fatalf("reported %s\nwant     %s", got, want)
	}

	l := leftoverNamed(t, ls, filepath.Base(live))
	if l.Kind != distckpt.LeftoverStaging || l.Writer != distckpt.WriterRunning || l.Garbage ||
		l.WriterPID != int64(os.Getpid()) || l.WriterHost != host || l.FinalName != "step-1" ||
		l.Path != live || !strings.Contains(l.Reason, "running") {
		t.Errorf("live writer: %+v", l)
	}
	l = leftoverNamed(t, ls, filepath.Base(exited))
	marker, err := os.Stat(filepath.Join(exited, "STAGING"))
	if err != nil {
		t.Fatal(err)
	}
	if l.Writer != distckpt.WriterExited || !l.Garbage || l.WriterPID != int64(dead) ||
		l.Bytes != uint64(marker.Size())+8192 || l.Idle < 2*time.Hour-time.Minute || l.Idle > 3*time.Hour ||
		time.Since(l.WriterStarted) < 2*time.Hour-time.Minute || time.Since(l.WriterStarted) > 3*time.Hour ||
		!strings.Contains(l.Reason, "has exited") {
		t.Errorf("exited writer: %+v", l)
	}
	if l := leftoverNamed(t, ls, filepath.Base(recent)); l.Garbage || !strings.Contains(l.Reason, "grace") {
		t.Errorf("within the grace period: %+v", l)
	}
	if l := leftoverNamed(t, ls, filepath.Base(unrenamed)); l.Kind != distckpt.LeftoverCompleteUnrenamed ||
		!l.Garbage || l.Writer != distckpt.WriterUnknown || l.WriterPID != -1 || l.WriterHost != "" ||
		!l.WriterStarted.IsZero() {
		t.Errorf("complete-unrenamed: %+v", l)
	}
	if l := leftoverNamed(t, ls, filepath.Base(replaced)); l.Kind != distckpt.LeftoverReplaced || !l.Garbage ||
		l.FinalName != "step-5" || !strings.Contains(l.Reason, "overwrite") {
		t.Errorf("replaced: %+v", l)
	}
	if l := leftoverNamed(t, ls, filepath.Base(deleting)); l.Kind != distckpt.LeftoverDeleting || l.Garbage ||
		l.Idle > time.Minute {
		t.Errorf("deleting, just made: %+v", l)
	}

	// A longer grace period turns the exited writer's directory into one that is kept; a name narrows the scan.
	ls, err = distckpt.ScanLeftovers(dir, "step-2", 3*time.Hour)
	if err != nil || len(ls) != 1 || ls[0].Name != filepath.Base(exited) || ls[0].Garbage {
		t.Fatalf("step-2 under a 3h grace: %+v %v", ls, err)
	}
	// Not even a grace period of zero makes a live writer's directory garbage.
	ls, err = distckpt.ScanLeftovers(dir, "step-1", 0)
	if err != nil || len(ls) != 1 || ls[0].Garbage {
		t.Fatalf("live writer without grace: %+v %v", ls, err)
	}
}

func TestScanLeftoversErrors(t *testing.T) {
	dir := t.TempDir()
	if ls, err := distckpt.ScanLeftovers(filepath.Join(dir, "missing"), "", time.Hour); err != nil || len(ls) != 0 {
		t.Fatalf("a missing directory: %+v %v", ls, err)
	}
	if _, err := distckpt.ScanLeftovers(dir, "", -time.Second); !errors.Is(err, distckpt.ErrInvalid) {
		t.Fatalf("a negative grace: %v", err)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var e *distckpt.Error
	if _, err := distckpt.ScanLeftovers(file, "", time.Hour); !errors.As(err, &e) || e.Code != distckpt.CodeIO ||
		!strings.Contains(err.Error(), file) {
		t.Fatalf("a file: %v", err)
	}
}

func TestRemoveLeftover(t *testing.T) {
	dir := t.TempDir()
	host := fixtures.Hostname(t)
	exited := fixtures.Staging(t, dir, "step-1", "01", host, reapedPID(t), 2*time.Hour)
	live := fixtures.Staging(t, dir, "step-2", "02", host, os.Getpid(), 2*time.Hour)
	recent := fixtures.Staging(t, dir, "step-3", "03", "elsewhere.example", 12, time.Minute)

	if err := distckpt.RemoveLeftover(exited, 3*time.Hour); !errors.Is(err, distckpt.ErrState) ||
		!strings.Contains(err.Error(), exited) {
		t.Fatalf("within the grace period: %v", err)
	}
	if err := distckpt.RemoveLeftover(exited, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := distckpt.RemoveLeftover(live, 0); !errors.Is(err, distckpt.ErrState) ||
		!strings.Contains(err.Error(), "running") {
		t.Fatalf("a live writer: %v", err)
	}
	if err := distckpt.RemoveLeftover(recent, time.Hour); !errors.Is(err, distckpt.ErrState) {
		t.Fatalf("a recent remote writer: %v", err)
	}
	if err := distckpt.RemoveLeftover(recent, 0); err != nil {
		t.Fatalf("a remote writer without grace: %v", err)
	}
	if err := distckpt.RemoveLeftover(exited, 0); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("removed twice: %v", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != filepath.Base(live) {
		t.Fatalf("left %v (nothing but the live writer's directory, no deleting-named directory)", ents)
	}
	if err := distckpt.RemoveLeftover(filepath.Join(dir, "step-4"), 0); !errors.Is(err, distckpt.ErrNotFound) {
		t.Fatalf("not a leftover's name: %v", err)
	}
}

// A symbolic link named like a leftover is not one: it is neither reported nor removed, and what it points to is not
// looked into.
func TestLeftoverLinksAreNeverFollowed(t *testing.T) {
	base := t.TempDir()
	outside := fixtures.Staging(t, base, "outside", "01", fixtures.Hostname(t), reapedPID(t), 5*time.Hour)
	dir := mkdirWith(t, filepath.Join(base, "store"))
	for _, name := range []string{"a.dckpt-staging-0a", "b.dckpt-old-0b", "c.dckpt-deleting-0c"} {
		if err := os.Symlink(outside, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	ls, err := distckpt.ScanLeftovers(dir, "", 0)
	if err != nil || len(ls) != 0 {
		t.Fatalf("links reported: %+v %v", ls, err)
	}
	for _, name := range []string{"a.dckpt-staging-0a", "b.dckpt-old-0b", "c.dckpt-deleting-0c"} {
		link := filepath.Join(dir, name)
		if err := distckpt.RemoveLeftover(link, 0); !errors.Is(err, distckpt.ErrNotFound) {
			t.Errorf("%s: %v", name, err)
		}
		if target, err := os.Readlink(link); err != nil || target != outside {
			t.Errorf("%s: the link changed: %q %v", name, target, err)
		}
	}
	if _, err := os.Stat(filepath.Join(outside, "STAGING")); err != nil {
		t.Fatalf("what the links point to changed: %v", err)
	}
}
