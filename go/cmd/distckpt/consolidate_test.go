package main

import (
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
)

// readSafetensors reads a safetensors file through the library, which reads it in place (the core is the one
// safetensors parser; python/tests/test_safetensors.py loads the exporter's files with the real safetensors package):
// its tensors' dtype, shape and bytes, and its __metadata__ (the user metadata).
func readSafetensors(t *testing.T, path string) (map[string]struct {
	DType string
	Shape []uint64
	Data  []byte
}, map[string]string) {
	t.Helper()
	r, err := distckpt.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if f, err := r.Format(); err != nil || f != distckpt.FormatSafetensors {
		t.Fatalf("%s: format %q (%v)", path, f, err)
	}
	entries, err := r.Entries()
	if err != nil {
		t.Fatal(err)
	}
	tensors := map[string]struct {
		DType string
		Shape []uint64
		Data  []byte
	}{}
	for _, e := range entries {
		data, err := r.Read(e.Name)
		if err != nil {
			t.Fatal(err)
		}
		tensors[e.Name] = struct {
			DType string
			Shape []uint64
			Data  []byte
		}{e.DType.String(), e.Shape, data}
	}
	meta, err := r.UserMetadata()
	if err != nil {
		t.Fatal(err)
	}
	return tensors, meta
}

func TestConsolidateWritesOneSafetensorsFile(t *testing.T) {
	ckpt := filepath.Join(newStore(t, 9), "step-9") // tensors in several chunks each (the fixture's grids)
	dir := t.TempDir()
	out := filepath.Join(dir, "model.safetensors")
	var o struct {
		Checkpoint, Out string
		Tensors         int
		Skipped         []string
		Bytes           int64
	}
	if code := cliJSON(t, &o, "consolidate", ckpt, out); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	if o.Out != out || o.Tensors != len(fixtures.Standard) || len(o.Skipped) != 1 || o.Skipped[0] != fixtures.BytesEntry {
		t.Fatalf("%+v", o)
	}
	st, err := os.Stat(out)
	if err != nil || st.Size() != o.Bytes {
		t.Fatalf("%v %+v", err, o)
	}
	// One file and nothing else: the exporter's directory and index are gone.
	names, _ := os.ReadDir(dir)
	if len(names) != 1 {
		t.Fatalf("left in %s: %v", dir, names)
	}
	tensors, meta := readSafetensors(t, out)
	if meta["step"] != "9" {
		t.Errorf("__metadata__ %v", meta)
	}
	if len(tensors) != len(fixtures.Standard) {
		t.Fatalf("%d tensors", len(tensors))
	}
	for _, e := range fixtures.Standard {
		got, ok := tensors[e.Name]
		if !ok {
			t.Fatalf("no %s", e.Name)
		}
		if got.DType != e.DType.String() || len(got.Shape) != len(e.Shape) {
			t.Errorf("%s: %s %v", e.Name, got.DType, got.Shape)
		}
		for i := range e.Shape {
			if got.Shape[i] != e.Shape[i] {
				t.Errorf("%s: shape %v, want %v", e.Name, got.Shape, e.Shape)
			}
		}
		if !bytes.Equal(got.Data, fixtures.Encode(e.Name, e.DType, e.Shape, 9)) {
			t.Errorf("%s: values differ", e.Name)
		}
	}

	// An existing OUT is kept unless --overwrite; then it is replaced by the same bytes.
	before, _ := os.ReadFile(out)
	stdout, errOut, code := cli(t, "consolidate", ckpt, out)
	if code != exitFailure || !strings.Contains(errOut, "already exists") {
		t.Fatalf("exit %d: %s %s", code, stdout, errOut)
	}
	stdout, errOut, code = cli(t, "consolidate", "--overwrite", ckpt, out)
	wantCode(t, code, exitOK, stdout, errOut)
	if !strings.Contains(stdout, "consolidated 7 tensors into one file") ||
		!strings.Contains(stdout, fixtures.BytesEntry) {
		t.Errorf("%s", stdout)
	}
	after, _ := os.ReadFile(out)
	if !bytes.Equal(before, after) {
		t.Errorf("a second consolidation wrote different bytes")
	}
}

func TestConsolidateRefusesBadArguments(t *testing.T) {
	dir := t.TempDir()
	ckpt := write(t, dir, "ok", fixtures.Options{Step: 1})
	for _, args := range [][]string{
		{"consolidate", ckpt},
		{"consolidate", ckpt, filepath.Join(dir, "model.pt")},
	} {
		if _, errOut, code := cli(t, args...); code != exitUsage {
			t.Errorf("%v: exit %d %s", args, code, errOut)
		}
	}
	_, errOut, code := cli(t, "consolidate", filepath.Join(dir, "missing"), filepath.Join(dir, "m.safetensors"))
	if code != exitNotFound || !strings.Contains(errOut, "missing") {
		t.Fatalf("missing: exit %d: %s", code, errOut)
	}
	_, errOut, code = cli(t, "consolidate", ckpt, filepath.Join(dir, "nodir", "m.safetensors"))
	if code != exitNotFound || !strings.Contains(errOut, "nodir") {
		t.Fatalf("no directory: exit %d: %s", code, errOut)
	}
	// Bad data: exit 1, a JSON error "corrupt", and nothing published or left behind.
	c := chunkAt(t, ckpt, "model.embed", 0)
	fixtures.FlipByte(t, ckpt, c.File, int64(c.FileOffset))
	out := filepath.Join(dir, "bad.safetensors")
	var e struct{ Error *jsonError }
	if code := cliJSON(t, &e, "consolidate", ckpt, out); code != exitFound || e.Error == nil || e.Error.Code != "corrupt" {
		t.Fatalf("corrupt data: exit %d %+v", code, e.Error)
	}
	var left []string
	entries, _ := os.ReadDir(dir)
	for _, x := range entries {
		left = append(left, x.Name())
	}
	sort.Strings(left)
	if strings.Join(left, ",") != "ok" {
		t.Fatalf("left in %s: %v", dir, left)
	}
}
