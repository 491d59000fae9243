package distckpt_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
)

func TestExportSafetensorsThroughTheCore(t *testing.T) {
	ckpt := writeFixture(t, fixtures.Options{Step: 5})
	out := t.TempDir()
	var progressed uint64
	err := distckpt.ExportSafetensors(ckpt, out, &distckpt.ExportOptions{Prefix: "m", Progress: func(d, _ uint64) error {
		progressed = d
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	index := readIndex(t, filepath.Join(out, "m.safetensors.index.json"))
	if len(index.WeightMap) != len(fixtures.Standard) {
		t.Fatalf("index lists %d tensors, want %d (bytes entries are skipped): %v", len(index.WeightMap),
			len(fixtures.Standard), index.WeightMap)
	}
	if progressed == 0 {
		t.Fatal("no progress reported")
	}
	// The export, read in place through its index by the library (the core is the one safetensors parser;
	// python/tests/test_safetensors.py loads these files with the real safetensors package): every tensor's values.
	r := open(t, filepath.Join(out, "m.safetensors.index.json"))
	if f, err := r.Format(); err != nil || f != distckpt.FormatSafetensors {
		t.Fatalf("format %q (%v)", f, err)
	}
	for _, e := range fixtures.Standard {
		got, err := r.Read(e.Name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, fixtures.Encode(e.Name, e.DType, e.Shape, 0)) {
			t.Errorf("%s: the exported values differ", e.Name)
		}
	}
	if user, _ := r.UserMetadata(); user["step"] != "5" {
		t.Errorf("__metadata__ %v", user)
	}
}

func TestExportMissingCheckpoint(t *testing.T) {
	err := distckpt.ExportSafetensors(filepath.Join(t.TempDir(), "missing"), t.TempDir(), nil)
	if !errors.Is(err, distckpt.ErrNotFound) {
		t.Fatalf("missing checkpoint: %v", err)
	}
}

func TestExportRenameRulesAreAppliedByTheCore(t *testing.T) {
	ckpt := writeFixture(t, fixtures.Options{Step: 5})
	out := t.TempDir()
	err := distckpt.ExportSafetensors(ckpt, out, &distckpt.ExportOptions{
		Rename: []distckpt.RenameRule{
			{Pattern: `optim\..*`, Replacement: ""}, // left out
			{Pattern: `model\.layers\.(\d+)\.w`, Replacement: `layers.\1.weight`},
		},
		BufferBytes: 8192, IOThreads: 2, MaxShardBytes: 10000,
	})
	if err != nil {
		t.Fatal(err)
	}
	index := readIndex(t, filepath.Join(out, "model.safetensors.index.json"))
	want := []string{"layers.0.weight", "layers.1.weight", "model.embed", "model.layers.0.bias", "model.norm"}
	if len(index.WeightMap) != len(want) {
		t.Fatalf("weight_map %v, want the names %v", index.WeightMap, want)
	}
	for _, name := range want {
		if _, ok := index.WeightMap[name]; !ok {
			t.Fatalf("weight_map %v lacks %s", index.WeightMap, name)
		}
	}

	// Two tensors onto one name: ErrInvalid naming both, nothing written.
	out2 := t.TempDir()
	err = distckpt.ExportSafetensors(ckpt, out2, &distckpt.ExportOptions{
		Rename: []distckpt.RenameRule{{Pattern: `model\.layers\.\d+\.w`, Replacement: "w"}},
	})
	if !errors.Is(err, distckpt.ErrInvalid) || !strings.Contains(err.Error(), "'model.layers.0.w'") ||
		!strings.Contains(err.Error(), "'model.layers.1.w'") {
		t.Fatalf("clash: %v", err)
	}
	if entries, _ := os.ReadDir(out2); len(entries) != 0 {
		t.Fatalf("a refused export wrote %v", entries)
	}
}

// readIndex reads the weight_map of a safetensors index the exporter wrote.
func readIndex(t *testing.T, path string) (index struct {
	WeightMap map[string]string `json:"weight_map"`
}) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &index); err != nil {
		t.Fatal(err)
	}
	return index
}
