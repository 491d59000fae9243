package main

import (
	"path/filepath"
	"strings"
	"testing"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
)

type diffOut struct {
	Same    bool
	Added   []entryJSON
	Removed []entryJSON
	Changed []struct {
		Name            string
		Changes         []string
		Compared        *string
		DifferingChunks *int `json:"differing_chunks"`
	}
	Uncompared []string
	Unchanged  int
	Metadata   struct {
		Added   map[string]string
		Removed map[string]string
		Changed map[string]valueChange
	}
}

func write(t *testing.T, dir, name string, o fixtures.Options) string {
	t.Helper()
	p := filepath.Join(dir, name)
	fixtures.Write(t, p, o)
	return p
}

func TestDiffIdentical(t *testing.T) {
	dir := t.TempDir()
	a := write(t, dir, "a", fixtures.Options{Step: 1})
	b := write(t, dir, "b", fixtures.Options{Step: 1})
	var o diffOut
	if code := cliJSON(t, &o, "diff", a, b); code != exitOK || !o.Same || o.Unchanged != len(fixtures.Standard)+1 {
		t.Fatalf("%d %+v", code, o)
	}
	out, _, code := cli(t, "diff", a, b)
	if code != exitOK || !strings.Contains(out, "same: 0 added, 0 removed, 0 changed") {
		t.Fatalf("%d %s", code, out)
	}
}

func TestDiffEveryKindOfChange(t *testing.T) {
	dir := t.TempDir()
	a := write(t, dir, "a", fixtures.Options{Step: 1, Omit: []string{"optim.step"}, User: map[string]string{"lr": "0.1"}})
	// B: optim.step added, bytes entry removed, model.norm retyped, model.layers.0.bias reshaped, data of model.embed
	// changed (through a different seed, applied to the whole state: so every entry's data differs).
	b := write(t, dir, "b", fixtures.Options{
		Step: 2, NoBytes: true, Seed: 1,
		Retype:  map[string]distckpt.DType{"model.norm": distckpt.F32},
		Reshape: map[string][]uint64{"model.layers.0.bias": {8, 8}},
		User:    map[string]string{"note": "resumed"},
	})
	var o diffOut
	if code := cliJSON(t, &o, "diff", a, b); code != exitFound || o.Same {
		t.Fatalf("%d %+v", code, o)
	}
	if len(o.Added) != 1 || o.Added[0].Name != "optim.step" || len(o.Removed) != 1 ||
		o.Removed[0].Name != fixtures.BytesEntry {
		t.Errorf("added %+v removed %+v", o.Added, o.Removed)
	}
	changes := map[string]string{}
	for _, c := range o.Changed {
		changes[c.Name] = strings.Join(c.Changes, ",")
		if c.Name == "model.embed" && (c.Compared == nil || *c.Compared != "checksum" || *c.DifferingChunks != 2) {
			t.Errorf("model.embed: %+v", c)
		}
	}
	if changes["model.norm"] != "dtype" || changes["model.layers.0.bias"] != "shape" || changes["model.embed"] != "data" {
		t.Errorf("changes %v", changes)
	}
	m := o.Metadata
	if m.Changed["step"] != (valueChange{"1", "2"}) || m.Added["note"] != "resumed" || m.Removed["lr"] != "0.1" {
		t.Errorf("metadata %+v", m)
	}
	out, _, _ := cli(t, "diff", a, b)
	for _, s := range []string{"+ optim.step", "- " + fixtures.BytesEntry, "dtype BF16 -> F32", "shape [64] -> [8, 8]",
		"data differs (2 of 2 chunks, by checksum)", `~ metadata step: "1" -> "2"`, `+ metadata note = "resumed"`} {
		if !strings.Contains(out, s) {
			t.Errorf("diff output lacks %q:\n%s", s, out)
		}
	}
}

func TestDiffAcrossLayoutsReadsData(t *testing.T) {
	dir := t.TempDir()
	a := write(t, dir, "a", fixtures.Options{Step: 1})
	// The same values, sharded differently: checksums are not comparable, the data are.
	b := write(t, dir, "b", fixtures.Options{Step: 1, Grids: map[string][]uint64{"model.layers.0.w": {1, 4}}})
	c := write(t, dir, "c", fixtures.Options{Step: 1, Seed: 2, Grids: map[string][]uint64{"model.layers.0.w": {1, 4}}})
	var o diffOut
	if code := cliJSON(t, &o, "diff", a, b); code != exitOK || !o.Same {
		t.Fatalf("resharded copy: %d %+v", code, o)
	}
	cliJSON(t, &o, "diff", a, c)
	found := false
	for _, ch := range o.Changed {
		if ch.Name == "model.layers.0.w" {
			found = ch.Compared != nil && *ch.Compared == "data" && *ch.DifferingChunks == 4
		}
	}
	if !found {
		t.Fatalf("resharded, changed tensor not found by data: %+v", o.Changed)
	}
	var n diffOut
	if code := cliJSON(t, &n, "diff", "--no-data", a, b); code != exitOK || len(n.Uncompared) != 1 ||
		n.Uncompared[0] != "model.layers.0.w" {
		t.Fatalf("--no-data: %d %+v", code, n)
	}
}

func TestDiffUnreadable(t *testing.T) {
	dir := t.TempDir()
	a := write(t, dir, "a", fixtures.Options{Step: 1})
	if _, _, code := cli(t, "diff", a, filepath.Join(dir, "missing")); code != exitNotFound {
		t.Fatalf("exit %d", code)
	}
}
