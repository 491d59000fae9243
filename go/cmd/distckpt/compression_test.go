package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
)

// inspect and du of a compressed checkpoint (format 3.0): what its chunks take in the data files, which are
// compressed, and how each is stored.
func TestCompressedInspectAndDu(t *testing.T) {
	ckpt := filepath.Join(t.TempDir(), "packed")
	fixtures.Write(t, ckpt, fixtures.Options{Step: 1, Compression: distckpt.CompressionZstd})

	var doc struct {
		FormatMajor      int    `json:"format_major"`
		FormatVersion    string `json:"format_version"`
		TotalBytes       uint64 `json:"total_bytes"`
		StoredBytes      uint64 `json:"stored_bytes"`
		CompressedChunks int    `json:"compressed_chunks"`
		Layout           struct {
			Chunks []struct {
				Length       uint64 `json:"length"`
				Codec        string `json:"codec"`
				StoredLength uint64 `json:"stored_length"`
			} `json:"chunks"`
		} `json:"layout"`
	}
	if code := cliJSON(t, &doc, "inspect", "--layout", "model.embed", ckpt); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	if doc.FormatMajor != 3 || doc.FormatVersion != "3.0" || doc.CompressedChunks == 0 ||
		doc.StoredBytes >= doc.TotalBytes || len(doc.Layout.Chunks) != 2 {
		t.Fatalf("%+v", doc)
	}
	for i, ch := range doc.Layout.Chunks {
		if ch.Codec != "zstd" || ch.StoredLength == 0 || ch.StoredLength >= ch.Length {
			t.Errorf("chunk %d: %+v", i, ch)
		}
	}

	out, errOut, code := cli(t, "inspect", "--layout", "model.embed", ckpt)
	wantCode(t, code, exitOK, out, errOut)
	ratio := fmt.Sprintf("(%.2f of the data)", float64(doc.StoredBytes)/float64(doc.TotalBytes))
	line := fmt.Sprintf("compressed  %d chunks; %s stored %s", doc.CompressedChunks, humanBytes(doc.StoredBytes), ratio)
	suffix := fmt.Sprintf("  zstd, %d B stored", doc.Layout.Chunks[1].StoredLength)
	if !strings.Contains(out, "format      3.0") || !strings.Contains(out, line) || !strings.Contains(out, suffix) {
		t.Fatalf("inspect lacks %q or %q:\n%s", line, suffix, out)
	}

	var du struct {
		TotalBytes       uint64 `json:"total_bytes"`
		StoredBytes      uint64 `json:"stored_bytes"`
		CompressedChunks int    `json:"compressed_chunks"`
		Groups           []struct {
			Prefix      string `json:"prefix"`
			Bytes       uint64 `json:"bytes"`
			StoredBytes uint64 `json:"stored_bytes"`
		} `json:"groups"`
	}
	if code := cliJSON(t, &du, "du", "--depth", "1", ckpt); code != exitOK || du.TotalBytes != doc.TotalBytes ||
		du.StoredBytes != doc.StoredBytes || du.CompressedChunks != doc.CompressedChunks || len(du.Groups) != 3 {
		t.Fatalf("du: exit %d: %+v", code, du)
	}
	var sum uint64
	for _, g := range du.Groups {
		sum += g.StoredBytes
		if g.StoredBytes == 0 || g.StoredBytes > g.Bytes {
			t.Errorf("group %+v", g)
		}
	}
	if sum != du.StoredBytes {
		t.Errorf("groups store %d bytes, the checkpoint %d", sum, du.StoredBytes)
	}
	out, errOut, code = cli(t, "du", ckpt)
	wantCode(t, code, exitOK, out, errOut)
	footer := fmt.Sprintf("%s stored (%.2f of the data; %d chunks compressed)", humanBytes(doc.StoredBytes),
		float64(doc.StoredBytes)/float64(doc.TotalBytes), doc.CompressedChunks)
	if !strings.Contains(regexpFields(out), "BYTES SHARE STORED ENTRIES PREFIX") || !strings.Contains(out, footer) {
		t.Fatalf("du text lacks a STORED column or %q:\n%s", footer, out)
	}

	if code := cliJSON(t, &struct{}{}, "verify", ckpt); code != exitOK {
		t.Fatalf("verify: exit %d", code)
	}
}
