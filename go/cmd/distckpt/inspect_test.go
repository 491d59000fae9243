package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"distckpt.dev/go/internal/fixtures"
)

func TestInspectText(t *testing.T) {
	ckpt := filepath.Join(newStore(t, 3), "step-3")
	out, errOut, code := cli(t, "inspect", ckpt, "--layout", "model.layers.0.w")
	wantCode(t, code, exitOK, out, errOut)
	for _, s := range []string{"format      1.2", "step=3", "model.embed", "F32", "[64, 32]", "BF16", "optim.step",
		"I64", "[]", fixtures.BytesEntry, "bytes", "layout of model.layers.0.w", "[0:16, 32:64]", "data-00000.bin"} {
		if !strings.Contains(out, s) {
			t.Errorf("inspect output lacks %q:\n%s", s, out)
		}
	}
	if strings.Contains(out, "compressed") || strings.Contains(out, "stored") { // only a compressed checkpoint's
		t.Errorf("inspect of a checkpoint stored raw:\n%s", out)
	}
}

// Issue 38: a DCP checkpoint's planner data is a user value of thousands of characters: the text output shows its
// start and its size, --json all of it; the format is DCP's with its .metadata's version, never distckpt's.
func TestInspectOfADCPCheckpointSummarisesLongValues(t *testing.T) {
	dcp := filepath.Join(fixtures.SafetensorsDir(), "..", "dcp", "fsdp2_2ranks")
	var doc struct {
		Format        string            `json:"format"`
		FormatVersion *string           `json:"format_version"`
		FormatMajor   *int              `json:"format_major"`
		FormatMinor   *int              `json:"format_minor"`
		User          map[string]string `json:"user"`
	}
	if code := cliJSON(t, &doc, "inspect", "--json", dcp); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	planner := doc.User["torch_dcp.planner_data"]
	if doc.Format != "torch-dcp" || doc.FormatVersion == nil || *doc.FormatVersion != "1.0.0" ||
		doc.FormatMajor != nil || doc.FormatMinor != nil || len(planner) < 1000 {
		t.Fatalf("%+v", doc)
	}
	out, errOut, code := cli(t, "inspect", dcp)
	wantCode(t, code, exitOK, out, errOut)
	cut := "torch_dcp.planner_data=" + planner[:100] + "… (" + itoa(len(planner)) + " bytes; --json for all)"
	if !strings.Contains(out, cut) || strings.Contains(out, planner[:101]) ||
		!strings.Contains(out, "format      PyTorch DCP 1.0.0 (written by another library, read in place)") {
		t.Errorf("inspect text lacks %q:\n%s", cut, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if len(line) > 400 {
			t.Errorf("a line of %d characters: %.120s...", len(line), line)
		}
	}
	// A distckpt checkpoint: its own format version, in both forms.
	ckpt := filepath.Join(newStore(t, 3), "step-3")
	if code := cliJSON(t, &doc, "inspect", "--json", ckpt); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	if doc.Format != "distckpt" || doc.FormatVersion == nil || *doc.FormatVersion != "1.2" || doc.FormatMajor == nil ||
		*doc.FormatMajor != 1 || doc.FormatMinor == nil || *doc.FormatMinor != 2 {
		t.Fatalf("%+v", doc)
	}
}

func TestInspectJSONAndLayout(t *testing.T) {
	ckpt := filepath.Join(newStore(t, 3), "step-3")
	var o struct {
		FormatMajor       int    `json:"format_major"`
		ChecksumBlockSize uint64 `json:"checksum_block_size"`
		TotalBytes        uint64 `json:"total_bytes"`
		StoredBytes       uint64 `json:"stored_bytes"`
		CompressedChunks  *int   `json:"compressed_chunks"`
		User              map[string]string
		Entries           []struct {
			Name, Kind string
			DType      *string
			Shape      []uint64
			Bytes      uint64
			Chunks     int
		}
		Layout *struct {
			Name   string
			Chunks []struct {
				Index            int
				Offsets, Lengths []uint64
				File             string
				FileOffset       uint64 `json:"file_offset"`
				Length           uint64
				Checksum         string
				Codec            string
				StoredLength     uint64 `json:"stored_length"`
			}
		}
	}
	if code := cliJSON(t, &o, "inspect", "--layout", "model.embed", ckpt); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	if o.FormatMajor != 1 || o.ChecksumBlockSize != fixtures.BlockSize || o.User["step"] != "3" ||
		len(o.Entries) != len(fixtures.Standard)+1 || o.StoredBytes != o.TotalBytes || o.CompressedChunks == nil ||
		*o.CompressedChunks != 0 {
		t.Fatalf("%+v", o)
	}
	for _, e := range o.Entries {
		if e.Name == "model.embed" && (e.Kind != "tensor" || *e.DType != "F32" || e.Bytes != 64*32*4 || e.Chunks != 2) {
			t.Errorf("model.embed: %+v", e)
		}
		if e.Name == fixtures.BytesEntry && (e.Kind != "bytes" || e.DType != nil || e.Shape != nil) {
			t.Errorf("bytes entry: %+v", e)
		}
	}
	if o.Layout == nil || len(o.Layout.Chunks) != 2 {
		t.Fatalf("layout %+v", o.Layout)
	}
	c := o.Layout.Chunks[1]
	if c.Offsets[0] != 32 || c.Lengths[0] != 32 || c.Lengths[1] != 32 || c.File != "data-00000.bin" ||
		c.FileOffset%4096 != 0 || c.Length != 32*32*4 || len(c.Checksum) != 16 || c.Codec != "none" ||
		c.StoredLength != c.Length {
		t.Errorf("chunk 1: %+v", c)
	}
}

func TestInspectErrors(t *testing.T) {
	dir := newStore(t, 3)
	ckpt := filepath.Join(dir, "step-3")
	out, errOut, code := cli(t, "inspect", "--layout", "no.such.tensor", ckpt)
	wantCode(t, code, exitNotFound, out, errOut)
	if !strings.Contains(errOut, "no.such.tensor") {
		t.Errorf("error does not name the entry: %s", errOut)
	}
	if err := os.WriteFile(filepath.Join(ckpt, "metadata.dckpt"), []byte("DCK1 but not really"), 0o644); err != nil {
		t.Fatal(err)
	}
	var e struct{ Error *jsonError }
	if code := cliJSON(t, &e, "inspect", ckpt); code != exitCorrupt || e.Error == nil || e.Error.Code != "corrupt" {
		t.Fatalf("corrupt metadata: %d %+v", code, e.Error)
	}
	staging := fixtures.Staging(t, dir, "step-9", "0000000000000001", "h", 1, 0)
	if _, _, code := cli(t, "inspect", staging); code != exitNotFound {
		t.Fatalf("inspect of a staging directory: exit %d", code)
	}
}
