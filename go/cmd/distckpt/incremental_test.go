package main

import (
	"path/filepath"
	"strings"
	"testing"

	"distckpt.dev/go/internal/fixtures"
)

// inspect, du and flatten on an incremental checkpoint: its bases, the bytes that lie there, and a self-contained
// copy (in place too) that no longer needs them.
func TestIncrementalInspectDuAndFlatten(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	fixtures.Write(t, a, fixtures.Options{Step: 1})
	fixtures.Write(t, b, fixtures.Options{Step: 2, Base: "a"}) // the same values: every chunk lies in a

	var doc struct {
		FormatMajor  int      `json:"format_major"`
		TotalBytes   uint64   `json:"total_bytes"`
		Bases        []string `json:"bases"`
		ChainLength  int      `json:"chain_length"`
		BytesInBases uint64   `json:"bytes_in_bases"`
		Layout       struct {
			Chunks []struct {
				File string `json:"file"`
				Base string `json:"base"`
			} `json:"chunks"`
		} `json:"layout"`
	}
	if code := cliJSON(t, &doc, "inspect", "--layout", "model.embed", b); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	if doc.FormatMajor != 2 || len(doc.Bases) != 1 || doc.Bases[0] != "a" || doc.ChainLength != 1 ||
		doc.BytesInBases != doc.TotalBytes || len(doc.Layout.Chunks) == 0 || doc.Layout.Chunks[0].Base != "a" {
		t.Fatalf("%+v", doc)
	}
	out, _, code := cli(t, "inspect", "--layout", "model.embed", b)
	if code != exitOK || !strings.Contains(out, "bases       a (incremental:") || !strings.Contains(out, "../a/data-") {
		t.Fatalf("exit %d:\n%s", code, out)
	}

	var du struct {
		Bases        []string `json:"bases"`
		BytesOwned   uint64   `json:"bytes_owned"`
		BytesInBases uint64   `json:"bytes_in_bases"`
		TotalBytes   uint64   `json:"total_bytes"`
	}
	if code := cliJSON(t, &du, "du", b); code != exitOK || du.BytesOwned != 0 || du.BytesInBases != du.TotalBytes ||
		len(du.Bases) != 1 {
		t.Fatalf("exit %d: %+v", code, du)
	}

	// A's removal is refused while b refers to it; a flattened b needs no base.
	c := filepath.Join(dir, "c")
	var flat struct {
		BytesCopied    uint64 `json:"bytes_copied"`
		BytesFromBases uint64 `json:"bytes_from_bases"`
	}
	if code := cliJSON(t, &flat, "flatten", b, c); code != exitOK || flat.BytesCopied != doc.TotalBytes ||
		flat.BytesFromBases != doc.TotalBytes {
		t.Fatalf("exit %d: %+v", code, flat)
	}
	if code := cliJSON(t, &doc, "inspect", c); code != exitOK || len(doc.Bases) != 0 || doc.FormatMajor != 1 {
		t.Fatalf("exit %d: %+v", code, doc)
	}
	if _, errOut, code := cli(t, "flatten", b, c); code == exitOK || !strings.Contains(errOut, "exists") {
		t.Fatalf("flatten over an existing checkpoint without --overwrite: exit %d: %s", code, errOut)
	}
	if _, _, code := cli(t, "flatten", "--overwrite", b, b); code != exitOK {
		t.Fatalf("in place: exit %d", code)
	}
	if code := cliJSON(t, &doc, "inspect", b); code != exitOK || len(doc.Bases) != 0 {
		t.Fatalf("exit %d: %+v", code, doc)
	}
	if code := cliJSON(t, &flat, "verify", b); code != exitOK {
		t.Fatalf("verify: exit %d", code)
	}
}
