package main

import (
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
)

// The CLI on checkpoints other libraries wrote: the safetensors fixtures of tests/fixtures/safetensors, written by the
// real safetensors package and read in place by the library; values compared with expected.json and expected/*.bin.

func hubDir() string { return filepath.Join(fixtures.SafetensorsDir(), "hub") }

// safetensorsPaths are the hub, its index file and the single file, each with expected.json's name for it.
func safetensorsPaths() [][2]string {
	dir := fixtures.SafetensorsDir()
	return [][2]string{
		{hubDir(), "hub"},
		{filepath.Join(hubDir(), "model.safetensors.index.json"), "hub"},
		{filepath.Join(dir, "single.safetensors"), "single"},
	}
}

// importHub saves every tensor of the hub as a distckpt checkpoint at path, with the user metadata given (the hub's
// is {"format": "pt"}): the same tensors and values in another format.
func importHub(t *testing.T, path string, user map[string]string) {
	t.Helper()
	want := fixtures.SafetensorsExpected(t, "hub")
	st := distckpt.NewState()
	for name, w := range want {
		dtype, err := distckpt.ParseDType(w.DType)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.AddTensorData(name, dtype, w.Shape, w.Data); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	for k, v := range user {
		st.SetUser(k, v)
	}
	if _, err := distckpt.Save(path, st, nil); err != nil {
		t.Fatal(err)
	}
}

func TestInspectShowsTheFormatOfASafetensorsCheckpoint(t *testing.T) {
	want := fixtures.SafetensorsExpected(t, "hub")
	for _, p := range safetensorsPaths() {
		out, errOut, code := cli(t, "inspect", p[0])
		wantCode(t, code, exitOK, out, errOut)
		for _, line := range []string{
			"format      safetensors (written by another library, read in place)",
			"checksums   none: the safetensors format carries none, so its bytes cannot be verified",
		} {
			if !strings.Contains(out, line) {
				t.Errorf("%s: no %q in\n%s", p[0], line, out)
			}
		}
	}
	// The layout of a tensor at an odd offset: where the file holds it, no checksum.
	out, errOut, code := cli(t, "inspect", "--layout", "rope.inv_freq", hubDir())
	wantCode(t, code, exitOK, out, errOut)
	w := want["rope.inv_freq"]
	row := regexpFields("0 [0:10, 0:3] " + w.File + " " + itoa(int(w.FileOffset)) + " 120 -")
	if !strings.Contains(regexpFields(out), row) {
		t.Errorf("layout: no %q in\n%s", row, out)
	}
}

// regexpFields collapses runs of spaces (a table's padding) to one.
func regexpFields(s string) string { return strings.Join(strings.Fields(s), " ") }

func TestInspectJSONOfASafetensorsCheckpointIsTheSharedDocument(t *testing.T) {
	want := fixtures.SafetensorsExpected(t, "hub")
	var doc map[string]interface{}
	if code := cliJSON(t, &doc, "inspect", hubDir()); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	var keys []string
	for k := range doc {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	// docs/cli.md's fields, no more: python -m distckpt prints the same document (python/tests/test_cli_agreement.py).
	shared := []string{"bases", "bytes_in_bases", "chain_length", "checksum_block_size", "compressed_chunks",
		"entries", "format", "format_major", "format_minor", "format_version", "layout", "metadata_bytes", "num_entries",
		"num_files", "path", "schema_version", "stored_bytes", "total_bytes", "user", "writer"}
	if !reflect.DeepEqual(keys, shared) {
		t.Fatalf("keys %v, want %v", keys, shared)
	}
	// Issue 38: the format, and no distckpt format version for a format that is not distckpt's (safetensors has none).
	if doc["format"] != "safetensors" || doc["format_version"] != nil || doc["format_major"] != nil ||
		doc["format_minor"] != nil {
		t.Errorf("format fields: %v", doc)
	}
	var d struct {
		Writer  string
		Entries []struct {
			Name  string
			Kind  string
			DType string
			Shape []uint64
			Bytes int
		}
	}
	cliJSON(t, &d, "inspect", hubDir())
	if d.Writer != "safetensors" || len(d.Entries) != len(want) {
		t.Fatalf("%+v", d)
	}
	for _, e := range d.Entries {
		w := want[e.Name]
		if w == nil || e.Kind != "tensor" || e.DType != w.DType || !reflect.DeepEqual(e.Shape, w.Shape) ||
			e.Bytes != w.Bytes {
			t.Errorf("%+v, want %+v", e, w)
		}
	}
}

func TestVerifyOfASafetensorsCheckpointSaysItHasNoChecksums(t *testing.T) {
	for _, p := range safetensorsPaths() {
		out, errOut, code := cli(t, "verify", p[0])
		wantCode(t, code, exitFailure, out, errOut)
		if !strings.HasPrefix(out, "NOT VERIFIED: "+p[0]+": a safetensors checkpoint, whose format carries no "+
			"checksums") || strings.Contains(out, "OK") || strings.Contains(out, "FAILED") {
			t.Errorf("%s: stdout %q", p[0], out)
		}
		if !strings.Contains(errOut, "no checksums") || !strings.Contains(errOut, p[0]) {
			t.Errorf("%s: stderr %q", p[0], errOut)
		}
		var v struct {
			OK          bool
			Chunks      int
			Format      *string
			Checksummed *bool
			Bad         []interface{}
			Error       *jsonError
		}
		if code := cliJSON(t, &v, "verify", p[0]); code != exitFailure {
			t.Fatalf("%s: exit %d", p[0], code)
		}
		if v.OK || v.Chunks != 0 || v.Format == nil || *v.Format != "safetensors" || v.Checksummed == nil ||
			*v.Checksummed || len(v.Bad) != 0 || v.Error == nil || v.Error.Code != "unsupported" {
			t.Errorf("%s: %+v", p[0], v)
		}
	}
	// A distckpt checkpoint's verify --json says what it is too.
	ckpt := filepath.Join(newStore(t, 1), "step-1")
	var v struct {
		OK          bool
		Format      string
		Checksummed bool
	}
	if code := cliJSON(t, &v, "verify", ckpt); code != exitOK || !v.OK || v.Format != "distckpt" || !v.Checksummed {
		t.Fatalf("exit %d %+v", code, v)
	}
}

type lsRow struct {
	Name        string
	Status      string
	Entries     *int
	DataBytes   *uint64 `json:"data_bytes"`
	Format      *string
	Checksummed *bool
}

func lsRows(t *testing.T, args ...string) []lsRow {
	t.Helper()
	var doc struct{ Checkpoints []lsRow }
	if code := cliJSON(t, &doc, append([]string{"ls"}, args...)...); code != exitOK {
		t.Fatalf("ls %v: exit %d", args, code)
	}
	return doc.Checkpoints
}

func TestLsListsForeignCheckpointsAndPruneLeavesThemAlone(t *testing.T) {
	want := fixtures.SafetensorsExpected(t, "hub")
	var total uint64
	for _, w := range want {
		total += uint64(w.Bytes)
	}
	dir := newStore(t, 1, 2, 3)
	fixtures.CopyDir(t, hubDir(), filepath.Join(dir, "hf-model"))
	if err := os.MkdirAll(filepath.Join(dir, "notes"), 0o755); err != nil {
		t.Fatal(err)
	}
	rows := lsRows(t, dir)
	var names []string
	for _, r := range rows {
		names = append(names, r.Name+":"+r.Status)
	}
	if !reflect.DeepEqual(names, []string{"hf-model:foreign", "step-1:committed", "step-2:committed",
		"step-3:committed"}) {
		t.Fatalf("ls: %v", names)
	}
	hf := rows[0]
	if hf.Format == nil || *hf.Format != "safetensors" || hf.Checksummed == nil || *hf.Checksummed ||
		hf.Entries == nil || *hf.Entries != len(want) || hf.DataBytes == nil || *hf.DataBytes != total {
		t.Errorf("hf-model: %+v", hf)
	}
	if r := rows[1]; r.Format == nil || *r.Format != "distckpt" || r.Checksummed == nil || !*r.Checksummed {
		t.Errorf("step-1: %+v", r)
	}
	out, errOut, code := cli(t, "ls", dir)
	wantCode(t, code, exitOK, out, errOut)
	if !strings.Contains(regexpFields(out), "hf-model foreign - 13") ||
		!strings.Contains(out, "safetensors, read in place (no checksums)") {
		t.Errorf("ls:\n%s", out)
	}

	// The hub directory itself, its index file and the single file: each is that one checkpoint.
	for _, p := range safetensorsPaths() {
		rows := lsRows(t, p[0])
		if len(rows) != 1 || rows[0].Name != filepath.Base(p[0]) || rows[0].Status != "foreign" {
			t.Errorf("ls %s: %+v", p[0], rows)
		}
	}

	// prune keeps the last checkpoint and never touches the foreign one.
	var res struct {
		Actions []struct{ Name, Action, Reason string }
	}
	if code := cliJSON(t, &res, "prune", "--keep-last", "1", dir); code != exitOK {
		t.Fatalf("prune: exit %d", code)
	}
	acted := map[string]string{}
	for _, a := range res.Actions {
		acted[a.Name] = a.Action + ": " + a.Reason
	}
	if !strings.HasPrefix(acted["hf-model"], "keep: written by another library (safetensors)") ||
		!strings.HasPrefix(acted["step-1"], "delete") || !strings.HasPrefix(acted["step-3"], "keep") {
		t.Errorf("prune: %v", acted)
	}
	for _, f := range []string{"model.safetensors.index.json", "model-00001-of-00003.safetensors"} {
		if _, err := os.Stat(filepath.Join(dir, "hf-model", f)); err != nil {
			t.Errorf("prune touched the foreign checkpoint: %v", err)
		}
	}
	rows = lsRows(t, dir)
	if len(rows) != 2 || rows[0].Name != "hf-model" || rows[1].Name != "step-3" {
		t.Errorf("after prune: %+v", rows)
	}
}

func TestDuOfASafetensorsCheckpoint(t *testing.T) {
	want := fixtures.SafetensorsExpected(t, "hub")
	var total int
	for _, w := range want {
		total += w.Bytes
	}
	var d struct {
		TotalBytes int `json:"total_bytes"`
		Entries    int
		Groups     []struct {
			Prefix string
			Bytes  int
		}
	}
	if code := cliJSON(t, &d, "du", hubDir()); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	rope := want["rope.bias"].Bytes + want["rope.inv_freq"].Bytes
	found := false
	for _, g := range d.Groups {
		found = found || (g.Prefix == "rope.*" && g.Bytes == rope)
	}
	if d.TotalBytes != total || d.Entries != len(want) || !found {
		t.Errorf("%+v (want %d bytes, rope.* %d)", d, total, rope)
	}
}

type diffDoc struct {
	Same       bool
	Changed    []struct{ Name, Compared string }
	Uncompared []string
	Unchanged  int
	ByChecksum int `json:"by_checksum"`
	Metadata   struct{ Added, Removed map[string]string }
}

func TestDiffOfADistckptCheckpointAndASafetensorsCheckpointWithTheSameTensors(t *testing.T) {
	want := fixtures.SafetensorsExpected(t, "hub")
	imported := filepath.Join(t.TempDir(), "imported")
	importHub(t, imported, map[string]string{"format": "pt"}) // the hub's __metadata__
	for _, b := range []string{hubDir(), filepath.Join(hubDir(), "model.safetensors.index.json")} {
		var d diffDoc
		if code := cliJSON(t, &d, "diff", imported, b); code != exitOK {
			t.Fatalf("diff %s: exit %d %+v", b, code, d)
		}
		// Compared by reading both sides' data: the safetensors side has no checksums to compare.
		if !d.Same || d.Unchanged != len(want) || d.ByChecksum != 0 || len(d.Uncompared) != 0 {
			t.Errorf("diff %s: %+v", b, d)
		}
	}
	out, errOut, code := cli(t, "diff", hubDir(), imported)
	wantCode(t, code, exitOK, out, errOut)
	// Without reading data, nothing can be compared.
	var d diffDoc
	if code := cliJSON(t, &d, "diff", "--no-data", imported, hubDir()); code != exitOK || len(d.Uncompared) != len(want) {
		t.Errorf("--no-data: exit %d %+v", code, d)
	}
	// Other user metadata is a difference, as between any two checkpoints (an export or import may not carry it).
	bare := filepath.Join(t.TempDir(), "bare")
	importHub(t, bare, map[string]string{"step": "7"})
	d = diffDoc{}
	if code := cliJSON(t, &d, "diff", bare, hubDir()); code != exitFound || d.Same || len(d.Changed) != 0 ||
		d.Unchanged != len(want) || d.Metadata.Removed["step"] != "7" || d.Metadata.Added["format"] != "pt" {
		t.Errorf("other user metadata: exit %d %+v", code, d)
	}
}

func TestDiffOfTwoSafetensorsCheckpointsReadsTheirData(t *testing.T) {
	// The same layout on both sides and no checksums (all 0): only reading the data can tell them apart.
	want := fixtures.SafetensorsExpected(t, "hub")
	changed := fixtures.CopyDir(t, hubDir(), filepath.Join(t.TempDir(), "hub"))
	w := want["token_type_ids"] // at an odd offset of the third shard
	path := filepath.Join(changed, w.File)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	raw[w.FileOffset+uint64(w.Bytes-1)] ^= 0x01
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	var d diffDoc
	if code := cliJSON(t, &d, "diff", hubDir(), changed); code != exitFound {
		t.Fatalf("exit %d %+v", code, d)
	}
	if d.Same || len(d.Changed) != 1 || d.Changed[0].Name != "token_type_ids" || d.Changed[0].Compared != "data" ||
		d.Unchanged != len(want)-1 {
		t.Errorf("%+v", d)
	}
	var same diffDoc
	if code := cliJSON(t, &same, "diff", hubDir(), fixtures.CopyDir(t, hubDir(), filepath.Join(t.TempDir(), "copy"))); code != exitOK ||
		!same.Same || same.Unchanged != len(want) || same.ByChecksum != 0 {
		t.Errorf("an identical copy: exit %d %+v", code, same)
	}
}
