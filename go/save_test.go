package distckpt_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
)

func TestSaveShardedTensorBytesAndUserMetadata(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ckpt")
	st := distckpt.NewState()
	full := fixtures.Encode("w", distckpt.I32, []uint64{6, 4}, 0)
	if err := st.AddTensor("w", distckpt.I32, []uint64{6, 4}); err != nil {
		t.Fatal(err)
	}
	for _, rows := range [][2]uint64{{0, 2}, {2, 4}} {
		off, lens := []uint64{rows[0], 0}, []uint64{rows[1], 4}
		if err := st.AddPiece("w", off, lens, fixtures.Box(full, []uint64{6, 4}, off, lens, 4)); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.AddTensorData("empty", distckpt.F16, []uint64{0, 3}, nil); err != nil {
		t.Fatal(err)
	}
	if err := st.AddBytes("blob", []byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	st.SetUser("step", "42")
	st.SetStructure([]byte(`{"w": 0}`))
	var progressed uint64
	info, err := distckpt.Save(path, st, &distckpt.SaveOptions{NoSync: true, Progress: func(done, total uint64) error {
		progressed = done
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if info.NumEntries != 3 || info.TotalBytes != 6*4*4+3 || progressed == 0 {
		t.Fatalf("info %+v, progress %d", info, progressed)
	}
	r := open(t, path)
	got, err := r.Read("w")
	if err != nil || string(got) != string(full) {
		t.Fatalf("w: %v", err)
	}
	if e, err := r.Entry("empty"); err != nil || e.NBytes != 0 || e.DType != distckpt.F16 {
		t.Fatalf("empty: %+v %v", e, err)
	}
	if s, err := r.Structure(); err != nil || string(s) != `{"w": 0}` {
		t.Fatalf("structure %q %v", s, err)
	}
	if u, _ := r.UserMetadata(); u["step"] != "42" {
		t.Fatalf("user %v", u)
	}
}

func TestSaveIncompleteTilingFailsAndLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	st := distckpt.NewState()
	if err := st.AddTensor("w", distckpt.F32, []uint64{4, 4}); err != nil {
		t.Fatal(err)
	}
	if err := st.AddPiece("w", []uint64{0, 0}, []uint64{2, 4}, make([]byte, 32)); err != nil {
		t.Fatal(err)
	}
	_, err := distckpt.Save(filepath.Join(dir, "ckpt"), st, &distckpt.SaveOptions{NoSync: true})
	if !errors.Is(err, distckpt.ErrInvalid) {
		t.Fatalf("half a tensor: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("a failed save left %v", ents)
	}
}

func TestStateChecksPiecesBeforeSaving(t *testing.T) {
	st := distckpt.NewState()
	if err := st.AddTensor("w", distckpt.F32, []uint64{4}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		off, lens []uint64
		n         int
	}{
		{[]uint64{0}, []uint64{4}, 15},    // short buffer
		{[]uint64{2}, []uint64{4}, 16},    // outside the shape
		{[]uint64{0, 0}, []uint64{4}, 16}, // rank mismatch
	} {
		if err := st.AddPiece("w", tc.off, tc.lens, make([]byte, tc.n)); !errors.Is(err, distckpt.ErrInvalid) {
			t.Errorf("AddPiece(%v, %v, %d bytes): %v", tc.off, tc.lens, tc.n, err)
		}
	}
	if err := st.AddPiece("nope", []uint64{0}, []uint64{1}, make([]byte, 4)); !errors.Is(err, distckpt.ErrNotFound) {
		t.Errorf("undeclared tensor: %v", err)
	}
	if err := st.AddBytes("w", nil); !errors.Is(err, distckpt.ErrInvalid) {
		t.Errorf("duplicate name: %v", err)
	}
	if err := st.AddTensor("x", distckpt.DType(99), nil); !errors.Is(err, distckpt.ErrInvalid) {
		t.Errorf("unknown dtype: %v", err)
	}
}

func TestSaveRefusesToReplaceUnlessOverwrite(t *testing.T) {
	path := writeFixture(t, fixtures.Options{Step: 1})
	_, err := distckpt.Save(path, fixtures.State(t, fixtures.Options{Step: 2}), &distckpt.SaveOptions{NoSync: true})
	if !errors.Is(err, distckpt.ErrExists) {
		t.Fatalf("second save: %v", err)
	}
	fixtures.Write(t, path, fixtures.Options{Step: 2, Overwrite: true})
	if u, _ := open(t, path).UserMetadata(); u["step"] != "2" {
		t.Fatalf("overwrite kept %v", u)
	}
}

func TestSaveProgressAbortUnwrapsToCallbackError(t *testing.T) {
	stop := errors.New("stop")
	path := filepath.Join(t.TempDir(), "ckpt")
	_, err := distckpt.Save(path, fixtures.State(t, fixtures.Options{Step: 1}), &distckpt.SaveOptions{
		NoSync: true, Progress: func(done, total uint64) error { return stop },
	})
	if !errors.Is(err, distckpt.ErrUser) || !errors.Is(err, stop) {
		t.Fatalf("aborted save: %v", err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("aborted save left %s: %v", path, err)
	}
}
