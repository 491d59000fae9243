package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"distckpt.dev/go/internal/fixtures"
)

// Issue 38: the CLI on a Hugging Face hub cache, laid out as huggingface_hub downloads into it. ls of the cache
// root lists each repository as one checkpoint (read at refs/main), ls of a repository lists it, ls of its
// snapshots/ lists each revision; inspect reads a repository and a snapshot. A snapshot with a link out of its blobs/
// is corrupt, its message naming the file.

func TestLsAndInspectOfAHubCache(t *testing.T) {
	cache := t.TempDir()
	repo, snapshot := fixtures.HubCache(t, cache, "org/tiny")
	fixtures.Must(t, os.MkdirAll(filepath.Join(cache, ".locks", "models--org--tiny"), 0o755)) // huggingface_hub's locks
	for _, tc := range []struct{ dir, name string }{
		{cache, "models--org--tiny"},
		{repo, "models--org--tiny"},
		{filepath.Join(repo, "snapshots"), fixtures.HubCacheRevision},
		{snapshot, fixtures.HubCacheRevision},
	} {
		var doc struct {
			Checkpoints []lsJSON `json:"checkpoints"`
		}
		if code := cliJSON(t, &doc, "ls", "--json", tc.dir); code != exitOK {
			t.Fatalf("ls %s: exit %d", tc.dir, code)
		}
		if len(doc.Checkpoints) != 1 {
			t.Fatalf("ls %s: %+v", tc.dir, doc.Checkpoints)
		}
		c := doc.Checkpoints[0]
		if c.Name != tc.name || c.Status != statusForeign || c.Format == nil || *c.Format != "safetensors" ||
			c.Entries == nil || *c.Entries == 0 {
			t.Errorf("ls %s: %+v", tc.dir, c)
		}
		out, errOut, code := cli(t, "ls", tc.dir)
		wantCode(t, code, exitOK, out, errOut)
		if !strings.Contains(out, "foreign") || strings.Contains(out, "corrupt") {
			t.Errorf("ls %s:\n%s", tc.dir, out)
		}
	}
	for _, path := range []string{repo, snapshot} {
		out, errOut, code := cli(t, "inspect", path)
		wantCode(t, code, exitOK, out, errOut)
		if !strings.Contains(out, "format      safetensors (written by another library, read in place)") {
			t.Errorf("inspect %s:\n%s", path, out)
		}
		var doc map[string]interface{}
		if code := cliJSON(t, &doc, "inspect", "--json", path); code != exitOK {
			t.Fatalf("inspect --json %s: exit %d", path, code)
		}
		if doc["format"] != "safetensors" || doc["format_version"] != nil || doc["format_major"] != nil ||
			doc["num_files"] != float64(3) {
			t.Errorf("inspect --json %s: %v", path, doc)
		}
	}

	// A link out of the repository: ls says corrupt (and exits 0), inspect exits 5 naming the file.
	shard := filepath.Join(snapshot, "model-00001-of-00003.safetensors")
	fixtures.Must(t, os.Remove(shard))
	fixtures.Must(t, os.Symlink("/etc/passwd", shard))
	out, errOut, code := cli(t, "ls", filepath.Join(repo, "snapshots"))
	wantCode(t, code, exitOK, out, errOut)
	if !strings.Contains(out, "corrupt") || !strings.Contains(out, "/etc/passwd") {
		t.Errorf("ls of a snapshot with a link out of its blobs:\n%s", out)
	}
	out, errOut, code = cli(t, "inspect", repo)
	wantCode(t, code, exitCorrupt, out, errOut)
	if !strings.Contains(errOut, shard) || !strings.Contains(errOut, "does not lead to a file") {
		t.Errorf("inspect: %s", errOut)
	}
}

// Issue 38: --help names every format of another library the CLI reads (python -m distckpt --help names the same).
func TestHelpNamesEveryForeignFormat(t *testing.T) {
	_, usage, code := cli(t, "--help")
	wantCode(t, code, exitOK, "", usage)
	inspectHelp, errOut, code := cli(t, "help", "inspect")
	wantCode(t, code, exitOK, inspectHelp, errOut)
	for _, text := range []string{usage, inspectHelp} {
		flat := regexpFields(text)
		for _, format := range []string{"safetensors directory", ".safetensors.index.json", "hub cache snapshot",
			"models--ORG--NAME", "PyTorch DCP directory"} {
			if !strings.Contains(flat, format) {
				t.Errorf("no %q in\n%s", format, text)
			}
		}
	}
}
