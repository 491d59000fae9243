package store

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
)

// A checkpoint another library wrote is Foreign (the library opens it), one whose files the library rejects is
// Corrupt with the library's error, and Prune leaves both alone.
func TestForeignCheckpointsInAStore(t *testing.T) {
	hub := filepath.Join(fixtures.SafetensorsDir(), "hub")
	dir := newStore(t, 1, 2)
	fixtures.CopyDir(t, hub, filepath.Join(dir, "llm"))
	fixtures.CopyDir(t, hub, filepath.Join(dir, "truncated"))
	shard := filepath.Join(dir, "truncated", "model-00003-of-00003.safetensors")
	st, err := os.Stat(shard)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(shard, st.Size()-10); err != nil { // the last tensor's bytes are cut
		t.Fatal(err)
	}

	cks, err := List(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	llm := byName(t, cks, "llm")
	if llm.Status != Foreign || llm.Info == nil || llm.Info.Format != distckpt.FormatSafetensors ||
		llm.Info.Checksummed || llm.User["format"] != "pt" || llm.Step != nil || llm.Date.IsZero() {
		t.Errorf("llm: %+v", llm)
	}
	bad := byName(t, cks, "truncated")
	if bad.Status != Corrupt || !errors.Is(bad.Err, distckpt.ErrCorrupt) {
		t.Errorf("truncated: %s %v", bad.Status, bad.Err)
	}
	if c, err := Stat(filepath.Join(dir, "llm")); err != nil || c.Status != Foreign {
		t.Errorf("Stat: %+v %v", c, err)
	}
	// The hub directory given directly (it holds no checkpoint directory) is that one checkpoint.
	if cks, err := List(hub, nil); err != nil || len(cks) != 1 || cks[0].Status != Foreign || cks[0].Name != "hub" {
		t.Errorf("List(hub): %+v %v", cks, err)
	}

	res, err := Prune(dir, PrunePolicy{KeepLast: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range res.Actions {
		if (a.Checkpoint.Name == "llm" || a.Checkpoint.Name == "truncated") && a.Action != Keep {
			t.Errorf("prune: %+v", a)
		}
	}
	for _, name := range []string{"llm", "truncated", "step-2"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("prune removed %s: %v", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "step-1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("step-1 kept: %v", err)
	}
}
