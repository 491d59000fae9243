package main

import (
	"path/filepath"
	"strings"
	"testing"

	"distckpt.dev/go/internal/fixtures"
)

type duOut struct {
	TotalBytes  uint64 `json:"total_bytes"`
	StoredBytes uint64 `json:"stored_bytes"`
	Entries     int
	Groups      []struct {
		Prefix      string
		Depth       int
		Entries     int
		Bytes       uint64
		Percent     float64
		StoredBytes uint64 `json:"stored_bytes"`
	}
}

func TestDuByPrefix(t *testing.T) {
	ckpt := filepath.Join(newStore(t, 1), "step-1")
	var o duOut
	if code := cliJSON(t, &o, "du", ckpt); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	got := map[string][2]uint64{}
	var order []string
	for _, g := range o.Groups {
		got[g.Prefix] = [2]uint64{uint64(g.Entries), g.Bytes}
		order = append(order, g.Prefix)
		if g.StoredBytes != g.Bytes { // stored raw
			t.Errorf("%s: %d bytes stored as %d", g.Prefix, g.Bytes, g.StoredBytes)
		}
	}
	const mat = 64 * 32 * 4 // every 2-d fixture tensor holds 2048 F32
	want := map[string][2]uint64{
		"model.*":           {5, 3*mat + 64*8 + 32*2},
		"model.layers.*":    {3, 2*mat + 64*8},
		"model.embed":       {1, mat},
		"model.norm":        {1, 64},
		"optim.*":           {2, mat + 8},
		"optim.m.*":         {1, mat},
		"optim.step":        {1, 8},
		"extra.*":           {1, uint64(len("rng state for seed 1"))},
		fixtures.BytesEntry: {1, uint64(len("rng state for seed 1"))},
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %v, want %v", k, got[k], v)
		}
	}
	if len(got) != len(want) || o.Entries != len(fixtures.Standard)+1 {
		t.Errorf("groups %v", order)
	}
	// Tree order: model.* (largest) first, its children right after it.
	if strings.Join(order[:4], " ") != "model.* model.layers.* model.embed model.norm" {
		t.Errorf("order %v", order)
	}
	if o.TotalBytes != want["model.*"][1]+want["optim.*"][1]+want["extra.*"][1] || o.StoredBytes != o.TotalBytes {
		t.Errorf("total %d, stored %d", o.TotalBytes, o.StoredBytes)
	}
}

func TestDuDepthAndText(t *testing.T) {
	ckpt := filepath.Join(newStore(t, 1), "step-1")
	var o duOut
	cliJSON(t, &o, "du", "--depth", "1", ckpt)
	if len(o.Groups) != 3 || o.Groups[0].Prefix != "model.*" || o.Groups[0].Percent < 50 {
		t.Fatalf("%+v", o.Groups)
	}
	out, errOut, code := cli(t, "du", "--depth", "3", ckpt)
	wantCode(t, code, exitOK, out, errOut)
	for _, s := range []string{"model.layers.0.*", "    model.layers.0.*", "(total)", "100.0%"} {
		if !strings.Contains(out, s) {
			t.Errorf("du lacks %q:\n%s", s, out)
		}
	}
	if strings.Contains(out, "STORED") || strings.Contains(out, "stored") { // only a compressed checkpoint's
		t.Errorf("du of a checkpoint stored raw:\n%s", out)
	}
}
