package distckpt_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
	"distckpt.dev/go/internal/memstore"
)

func newMem(t *testing.T, maxInFlight int) (*memstore.Store, *distckpt.StorageHandle) {
	t.Helper()
	ms := memstore.New()
	h, err := distckpt.NewStorage(ms, maxInFlight)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return ms, h
}

func saveOn(t *testing.T, h *distckpt.StorageHandle, path string, o fixtures.Options) error {
	t.Helper()
	_, err := distckpt.Save(path, fixtures.State(t, o), &distckpt.SaveOptions{
		Storage: h, ChecksumBlockSize: fixtures.BlockSize, IOThreads: 8, Overwrite: o.Overwrite,
	})
	return err
}

// checkFixture reads every tensor of the standard fixture whole and a region across pieces, and verifies it.
func checkFixture(t *testing.T, r *distckpt.Reader, seed float32) {
	t.Helper()
	for _, e := range fixtures.Standard {
		got, err := r.Read(e.Name)
		if err != nil {
			t.Fatal(err)
		}
		if want := fixtures.Encode(e.Name, e.DType, e.Shape, seed); !bytes.Equal(got, want) {
			t.Fatalf("%s: read back different bytes", e.Name)
		}
	}
	// Resharded: a box across the 2x2 pieces of model.layers.0.w.
	shape := []uint64{32, 64}
	off, lens := []uint64{10, 20}, []uint64{12, 30}
	got, err := r.ReadRegion("model.layers.0.w", off, lens)
	if err != nil {
		t.Fatal(err)
	}
	full := fixtures.Encode("model.layers.0.w", distckpt.F32, shape, seed)
	if want := fixtures.Box(full, shape, off, lens, 4); !bytes.Equal(got, want) {
		t.Fatal("a region across pieces read back different bytes")
	}
	if _, err := r.Verify(nil); err != nil {
		t.Fatal(err)
	}
}

func TestGoStorageSaveOpenVerifyReshardedRead(t *testing.T) {
	ms, h := newMem(t, 0)
	if err := saveOn(t, h, "bucket/run/step-100", fixtures.Options{Step: 100}); err != nil {
		t.Fatal(err)
	}
	if _, ok := ms.Get("bucket/run/step-100/metadata.dckpt"); !ok {
		t.Fatalf("no metadata.dckpt among %v", ms.Paths())
	}
	for _, p := range ms.Paths() {
		if strings.Contains(p, "STAGING") {
			t.Fatalf("a committed checkpoint kept its marker: %v", ms.Paths())
		}
	}
	if ms.Commits.Load() != 1 {
		t.Fatalf("the metadata was committed %d times through Committer, want 1", ms.Commits.Load())
	}
	r, err := distckpt.Open("bucket/run/step-100", &distckpt.ReadOptions{Storage: h})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	checkFixture(t, r, 0)
	user, err := r.UserMetadata()
	if err != nil || user["step"] != "100" {
		t.Fatalf("user metadata %v, %v", user, err)
	}
	info, err := h.Stat("bucket/run/step-100", 0)
	if err != nil || info.Kind != distckpt.PathCheckpoint || info.Files == 0 || info.LeftoverFiles != 0 {
		t.Fatalf("Stat: %+v, %v", info, err)
	}
	// Nothing of it is on the file system.
	if _, err := os.Stat("bucket"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the save touched the file system: %v", err)
	}
	// Saving again without Overwrite: ErrExists; with it, the new content replaces the old.
	if err := saveOn(t, h, "bucket/run/step-100", fixtures.Options{Step: 100}); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("a second save without Overwrite: %v", err)
	}
	if err := saveOn(t, h, "bucket/run/step-100", fixtures.Options{Step: 100, Seed: 3, Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	r2, err := distckpt.Open("bucket/run/step-100", &distckpt.ReadOptions{Storage: h, NoMap: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	checkFixture(t, r2, 3)
}

func TestGoStorageBoundsCallsInFlight(t *testing.T) {
	ms, h := newMem(t, 2)
	if err := saveOn(t, h, "c", fixtures.Options{Step: 1}); err != nil {
		t.Fatal(err)
	}
	r, err := distckpt.Open("c", &distckpt.ReadOptions{Storage: h, IOThreads: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Verify(&distckpt.VerifyOptions{Workers: 8}); err != nil {
		t.Fatal(err)
	}
	if got := ms.MaxInFlight.Load(); got < 1 || got > 2 {
		t.Fatalf("%d WriteAt/ReadAt calls ran at once with maxInFlight 2", got)
	}
}

func TestGoStorageErrorsNameThePath(t *testing.T) {
	ms, h := newMem(t, 0)
	if _, err := distckpt.Open("nowhere/ckpt", &distckpt.ReadOptions{Storage: h}); !errors.Is(err, fs.ErrNotExist) ||
		!strings.Contains(err.Error(), "nowhere/ckpt") {
		t.Fatalf("opening a missing checkpoint: %v", err)
	}
	if err := saveOn(t, h, "ckpt", fixtures.Options{Step: 1}); err != nil {
		t.Fatal(err)
	}
	ms.Fail = func(op, path string) error {
		if op == "read" && strings.Contains(path, "data-") {
			return errors.New("connection reset by peer")
		}
		return nil
	}
	r, err := distckpt.Open("ckpt", &distckpt.ReadOptions{Storage: h})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, err = r.Read("model.embed")
	if err == nil || !strings.Contains(err.Error(), "ckpt/data-") {
		t.Fatalf("a failing read: %v (want the data file's path)", err)
	}
	if !strings.Contains(err.Error(), "connection reset by peer") {
		t.Fatalf("the storage's own error is not in the message: %v", err)
	}
	ms.Fail = func(op, path string) error {
		if op == "create" {
			return fmt.Errorf("quota exceeded for %s", path)
		}
		return nil
	}
	if err := saveOn(t, h, "other", fixtures.Options{Step: 2}); err == nil || !strings.Contains(err.Error(), "other") {
		t.Fatalf("a failing create: %v (want the path)", err)
	}
}

func TestPanickingGoStorageGivesAnError(t *testing.T) {
	ms, h := newMem(t, 0)
	ms.Panic = func(op, path string) bool { return op == "write" }
	err := saveOn(t, h, "ckpt", fixtures.Options{Step: 1})
	if err == nil {
		t.Fatal("a save whose storage panics succeeded")
	}
	if !strings.Contains(err.Error(), "panic") {
		t.Logf("the panic is not named in: %v", err)
	}
	ms.Panic = func(op, path string) bool { return op == "size" || op == "read" }
	if _, err := distckpt.Open("ckpt", &distckpt.ReadOptions{Storage: h}); err == nil {
		t.Fatal("an open whose storage panics succeeded")
	}
	ms.Panic = nil
	if _, err := distckpt.Open("ckpt", &distckpt.ReadOptions{Storage: h}); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the failed save left something that opens: %v", err)
	}
}

func TestInterruptedSaveLeavesNoCheckpointAndLeftoversAreRemoved(t *testing.T) {
	ms, h := newMem(t, 0)
	// The writer dies at the commit: it cannot clean up what it wrote (removes do nothing).
	ms.KeepOnRemove.Store(true)
	ms.Fail = func(op, path string) error {
		if op == "commit" {
			return errors.New("killed")
		}
		return nil
	}
	if err := saveOn(t, h, "run/step-5", fixtures.Options{Step: 5}); err == nil {
		t.Fatal("the save succeeded")
	}
	ms.Fail = nil
	ms.KeepOnRemove.Store(false)
	if len(ms.Paths()) == 0 {
		t.Fatal("the interrupted save left nothing behind; the test needs leftovers")
	}
	if _, err := distckpt.Open("run/step-5", &distckpt.ReadOptions{Storage: h}); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("an interrupted save is visible: %v", err)
	}
	// Just written by this (running) process: in progress, nothing is leftover yet.
	young, err := h.Stat("run/step-5", 0)
	if err != nil || young.Kind != distckpt.PathIncomplete || young.SavesInProgress != 1 || young.LeftoverFiles != 0 {
		t.Fatalf("Stat of a save in progress: %+v, %v", young, err)
	}
	ageMarkers(t, ms, "run/step-5/")
	info, err := h.Stat("run/step-5", 0)
	if err != nil || info.Kind != distckpt.PathIncomplete || info.LeftoverFiles == 0 || info.SavesInProgress != 0 {
		t.Fatalf("Stat of the leftovers: %+v, %v", info, err)
	}
	var dry []string
	if err := h.RemoveLeftovers("run/step-5", 0, true, func(p string) error { dry = append(dry, p); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(dry) == 0 || len(ms.Paths()) == 0 {
		t.Fatalf("dry run: reported %v, left %v", dry, ms.Paths())
	}
	stop := errors.New("stop here")
	if err := h.RemoveLeftovers("run/step-5", 0, true, func(string) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("a callback's error: %v", err)
	}
	var removed []string
	if err := h.RemoveLeftovers("run/step-5", 0, false, func(p string) error { removed = append(removed, p); return nil }); err != nil {
		t.Fatal(err)
	}
	if left := ms.Paths(); len(left) != 0 || len(removed) != len(dry) {
		t.Fatalf("removed %v, left %v", removed, left)
	}
	if info, err := h.Stat("run/step-5", 0); err != nil || info.Kind != distckpt.PathNone {
		t.Fatalf("Stat after the removal: %+v, %v", info, err)
	}
}

func TestRemoveCheckpointOnGoStorage(t *testing.T) {
	ms, h := newMem(t, 0)
	ms.Put("ckpt-keep/notes.txt", []byte("not ours"))
	if err := saveOn(t, h, "ckpt", fixtures.Options{Step: 1}); err != nil {
		t.Fatal(err)
	}
	if err := h.RemoveCheckpoint("ckpt"); err != nil {
		t.Fatal(err)
	}
	if got := ms.Paths(); len(got) != 1 || got[0] != "ckpt-keep/notes.txt" {
		t.Fatalf("left %v", got)
	}
	if err := h.RemoveCheckpoint("ckpt"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("removing it again: %v", err)
	}
}

func TestBuiltInStorages(t *testing.T) {
	mem, err := distckpt.MemoryStorage()
	if err != nil {
		t.Fatal(err)
	}
	if err := saveOn(t, mem, "m/ckpt", fixtures.Options{Step: 7}); err != nil {
		t.Fatal(err)
	}
	r, err := distckpt.Open("m/ckpt", &distckpt.ReadOptions{Storage: mem})
	if err != nil {
		t.Fatal(err)
	}
	// The reader keeps the storage alive after its handle is closed.
	mem.Close()
	mem.Close()
	checkFixture(t, r, 0)
	r.Close()
	if _, err := distckpt.Open("m/ckpt", &distckpt.ReadOptions{Storage: mem}); !errors.Is(err, distckpt.ErrState) {
		t.Fatalf("opening on a closed handle: %v", err)
	}

	posix, err := distckpt.PosixStorage()
	if err != nil {
		t.Fatal(err)
	}
	defer posix.Close()
	path := filepath.Join(t.TempDir(), "ckpt")
	if err := saveOn(t, posix, path, fixtures.Options{Step: 7}); err != nil {
		t.Fatal(err)
	}
	rp, err := distckpt.Open(path, nil) // the same as the nil storage
	if err != nil {
		t.Fatal(err)
	}
	defer rp.Close()
	checkFixture(t, rp, 0)
}

func TestExportFromGoStorage(t *testing.T) {
	_, h := newMem(t, 0)
	if err := saveOn(t, h, "ckpt", fixtures.Options{Step: 1}); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	if err := distckpt.ExportSafetensors("ckpt", out, &distckpt.ExportOptions{Storage: h}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, "model.safetensors.index.json")); err != nil {
		t.Fatal(err)
	}
	ms2, h2 := newMem(t, 0)
	if err := distckpt.ExportSafetensors("ckpt", "exported", &distckpt.ExportOptions{Storage: h, OutStorage: h2}); err != nil {
		t.Fatal(err)
	}
	if _, ok := ms2.Get("exported/model.safetensors.index.json"); !ok {
		t.Fatalf("exported to the Go storage: %v", ms2.Paths())
	}
}

// ageMarkers makes the STAGING markers below prefix those of a writer on another host that started long ago.
func ageMarkers(t *testing.T, ms *memstore.Store, prefix string) {
	t.Helper()
	n := 0
	for _, p := range ms.Paths() {
		if !strings.HasPrefix(p, prefix) || !strings.Contains(p[len(prefix):], "STAGING") {
			continue
		}
		text, _ := ms.Get(p)
		var lines []string
		for _, line := range strings.Split(string(text), "\n") {
			switch {
			case strings.HasPrefix(line, "host: "):
				line = "host: some-other-host"
			case strings.HasPrefix(line, "started_utc: "):
				line = "started_utc: 2001-01-01T00:00:00Z"
			}
			lines = append(lines, line)
		}
		ms.Put(p, []byte(strings.Join(lines, "\n")))
		n++
	}
	if n == 0 {
		t.Fatalf("no STAGING marker below %s: %v", prefix, ms.Paths())
	}
}
