package distckpt_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
)

// Checkpoints other libraries wrote, read in place by the library: the safetensors fixtures of
// tests/fixtures/safetensors, written by the real safetensors package. Every tensor is compared with what safetensors
// itself loads (expected.json's sha256, and the bytes in expected/*.bin); nothing here parses a safetensors file.

// safetensorsForms are the ways to name the fixtures: the hub directory, its index file, and the single file.
func safetensorsForms() []struct{ path, which string } {
	dir := fixtures.SafetensorsDir()
	return []struct{ path, which string }{
		{filepath.Join(dir, "hub"), "hub"},
		{filepath.Join(dir, "hub", "model.safetensors.index.json"), "hub"},
		{filepath.Join(dir, "single.safetensors"), "single"},
	}
}

func sortedNames(m map[string]*fixtures.SafetensorsTensor) []string {
	var out []string
	for n := range m {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// box2 is the box [off, off+len) of a row-major 2-D array of elem-byte elements with cols columns.
func box2(all []byte, elem, cols int, off, n [2]int) []byte {
	var out []byte
	for r := off[0]; r < off[0]+n[0]; r++ {
		start := (r*cols + off[1]) * elem
		out = append(out, all[start:start+n[1]*elem]...)
	}
	return out
}

func TestSafetensorsReadsEveryTensorAsSafetensorsLoadsIt(t *testing.T) {
	for _, f := range safetensorsForms() {
		want := fixtures.SafetensorsExpected(t, f.which)
		r := open(t, f.path)
		info, err := r.Info()
		if err != nil {
			t.Fatal(err)
		}
		format, err := r.Format()
		if err != nil {
			t.Fatal(err)
		}
		checksummed, err := r.Checksummed()
		if err != nil {
			t.Fatal(err)
		}
		if format != distckpt.FormatSafetensors || !format.Foreign() || checksummed || info.Format != format ||
			info.Checksummed || info.Writer != "safetensors" {
			t.Fatalf("%s: format %q checksummed %v, info %+v", f.path, format, checksummed, info)
		}
		if wantFiles := map[string]int{"hub": 3, "single": 1}[f.which]; info.NumFiles != wantFiles {
			t.Errorf("%s: %d files, want %d", f.path, info.NumFiles, wantFiles)
		}
		entries, err := r.Entries()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name)
		}
		if !reflect.DeepEqual(names, sortedNames(want)) {
			t.Fatalf("%s: entries %v, want %v", f.path, names, sortedNames(want))
		}
		for _, e := range entries {
			w := want[e.Name]
			if e.Kind != distckpt.TensorEntry || e.DType.String() != w.DType || !reflect.DeepEqual(e.Shape, w.Shape) ||
				e.NBytes != uint64(w.Bytes) {
				t.Errorf("%s: %+v, want %+v", e.Name, e, w)
			}
			data, err := r.Read(e.Name)
			if err != nil {
				t.Fatalf("%s: %v", e.Name, err)
			}
			sum := sha256.Sum256(data)
			if hex.EncodeToString(sum[:]) != w.SHA256 || !bytes.Equal(data, w.Data) {
				t.Errorf("%s %s: the bytes read differ from those safetensors loads", f.path, e.Name)
			}
			chunks, err := r.Chunks(e.Index)
			if err != nil {
				t.Fatal(err)
			}
			if len(chunks) != 1 || chunks[0].File != w.File || chunks[0].FileOffset != w.FileOffset ||
				chunks[0].Length != uint64(w.Bytes) || chunks[0].Checksum != 0 {
				t.Errorf("%s: chunks %+v, want one in %s at %d with no checksum", e.Name, chunks, w.File, w.FileOffset)
			}
		}
	}
}

func TestSafetensorsUserMetadataAndOneShardAlone(t *testing.T) {
	dir := fixtures.SafetensorsDir()
	for path, want := range map[string]map[string]string{
		filepath.Join(dir, "hub"):                                     {"format": "pt"}, // the first file's
		filepath.Join(dir, "hub", "model-00002-of-00003.safetensors"): {"format": "np"},
		filepath.Join(dir, "single.safetensors"):                      {"format": "np"},
	} {
		user, err := open(t, path).UserMetadata()
		if err != nil || !reflect.DeepEqual(user, want) {
			t.Errorf("%s: user metadata %v (%v), want %v", path, user, err, want)
		}
	}
	want := fixtures.SafetensorsExpected(t, "hub")
	shard := "model-00002-of-00003.safetensors"
	r := open(t, filepath.Join(dir, "hub", shard))
	entries, err := r.Entries()
	if err != nil {
		t.Fatal(err)
	}
	var got, in []string
	for _, e := range entries {
		got = append(got, e.Name)
	}
	for _, n := range sortedNames(want) {
		if want[n].File == shard {
			in = append(in, n)
		}
	}
	if !reflect.DeepEqual(got, in) {
		t.Fatalf("%s alone: %v, want %v", shard, got, in)
	}
}

func TestSafetensorsRegionReadsAlignedOrNot(t *testing.T) {
	want := fixtures.SafetensorsExpected(t, "hub")
	r := open(t, filepath.Join(fixtures.SafetensorsDir(), "hub"))
	for _, c := range []struct {
		name       string
		elem, cols int
		off, n     [2]int
	}{
		{"layers.0.mlp.up.weight", 4, 8, [2]int{3, 2}, [2]int{4, 3}}, // F32, aligned
		{"rope.inv_freq", 4, 3, [2]int{2, 1}, [2]int{5, 2}},          // F32 at an odd offset
		{"token_type_ids", 8, 5, [2]int{1, 0}, [2]int{2, 5}},         // I64 at an odd offset
		{"rope.bias", 2, 4, [2]int{0, 1}, [2]int{6, 2}},              // BF16 at an odd offset
		{"embed.weight", 2, 8, [2]int{11, 7}, [2]int{1, 1}},          // the last element
	} {
		w := want[c.name]
		got, err := r.ReadRegion(c.name, []uint64{uint64(c.off[0]), uint64(c.off[1])},
			[]uint64{uint64(c.n[0]), uint64(c.n[1])})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !bytes.Equal(got, box2(w.Data, c.elem, c.cols, c.off, c.n)) {
			t.Errorf("%s %v+%v: wrong bytes", c.name, c.off, c.n)
		}
	}
	if _, err := r.ReadRegion("rope.inv_freq", []uint64{9, 0}, []uint64{2, 3}); !errors.Is(err, distckpt.ErrInvalid) {
		t.Errorf("a region outside the shape: %v", err)
	}
}

func TestSafetensorsVerifySaysTheFormatHasNoChecksums(t *testing.T) {
	for _, f := range safetensorsForms() {
		r := open(t, f.path)
		called := false
		res, err := r.Verify(&distckpt.VerifyOptions{Progress: func(done, total uint64) error {
			called = true
			return nil
		}})
		var e *distckpt.Error
		if !errors.Is(err, distckpt.ErrUnsupported) || !errors.As(err, &e) {
			t.Fatalf("%s: Verify: %v", f.path, err)
		}
		if !strings.Contains(e.Message, f.path) || !strings.Contains(e.Message, "safetensors") ||
			!strings.Contains(e.Message, "no checksums") {
			t.Errorf("%s: %q", f.path, e.Message)
		}
		if res.Chunks != 0 || res.Bytes != 0 || len(res.Bad) != 0 || called {
			t.Errorf("%s: nothing is checked, got %+v (progress called: %v)", f.path, res, called)
		}
	}
	// A distckpt checkpoint is what it always was.
	r := open(t, writeFixture(t, fixtures.Options{Step: 1}))
	info, err := r.Info()
	if err != nil || info.Format != distckpt.FormatDistckpt || info.Format.Foreign() || !info.Checksummed {
		t.Fatalf("distckpt checkpoint: %+v %v", info, err)
	}
	if _, err := r.Verify(nil); err != nil {
		t.Fatal(err)
	}
}
