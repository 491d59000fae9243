package distckpt_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
)

// Issue 38: a Hugging Face hub cache (the layout huggingface_hub downloads into) opens in place, through the core:
// a snapshot, one of its files, and the repository itself (at refs/main). The snapshot's files are links into the
// repository's blobs/; every other link is refused, naming the file.

func TestHubCacheOpensLikeTheHubDirectory(t *testing.T) {
	want := fixtures.SafetensorsExpected(t, "hub")
	repo, snapshot := fixtures.HubCache(t, t.TempDir(), "org/tiny")
	for _, path := range []string{snapshot, repo, filepath.Join(snapshot, "model.safetensors.index.json")} {
		r := open(t, path)
		info, err := r.Info()
		if err != nil || info.Format != distckpt.FormatSafetensors || info.NumFiles != 3 || info.SourceVersion != "" {
			t.Fatalf("%s: %+v %v", path, info, err)
		}
		for name, w := range want {
			data, err := r.Read(name)
			if err != nil {
				t.Fatalf("%s: %s: %v", path, name, err)
			}
			if !bytes.Equal(data, w.Data) {
				t.Errorf("%s: %s: the bytes differ from those safetensors loads", path, name)
			}
		}
	}
}

func TestHubCacheRefusesLinksOutOfItsBlobs(t *testing.T) {
	for _, tc := range []struct{ name, target, says string }{
		{"outside the repository", "../../../../outside.safetensors", "does not lead to a file"},
		{"/etc/passwd", "/etc/passwd", "does not lead to a file"},
		{"a directory", "../../blobs/adir", "is a directory"},
		{"a chain", "../../blobs/alias", "never a chain of links"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo, snapshot := fixtures.HubCache(t, t.TempDir(), "org/tiny")
			fixtures.Must(t, os.Mkdir(filepath.Join(repo, "blobs", "adir"), 0o755))
			shard := filepath.Join(snapshot, "model-00002-of-00003.safetensors")
			target, err := os.Readlink(shard)
			fixtures.Must(t, err)
			fixtures.Must(t, os.Symlink(filepath.Base(target), filepath.Join(repo, "blobs", "alias")))
			fixtures.Must(t, os.Remove(shard))
			fixtures.Must(t, os.Symlink(tc.target, shard))
			_, err = distckpt.Open(repo, nil)
			var e *distckpt.Error
			if !errors.Is(err, distckpt.ErrCorrupt) || !errors.As(err, &e) || !strings.Contains(e.Message, shard) ||
				!strings.Contains(e.Message, tc.says) {
				t.Fatalf("open: %v", err)
			}
		})
	}
	repo, _ := fixtures.HubCache(t, t.TempDir(), "org/tiny")
	fixtures.Must(t, os.WriteFile(filepath.Join(repo, "refs", "main"), []byte("../x"), 0o644))
	_, err := distckpt.Open(repo, nil)
	if !errors.Is(err, distckpt.ErrCorrupt) || !strings.Contains(err.Error(), filepath.Join(repo, "refs", "main")) {
		t.Fatalf("refs/main ../x: %v", err)
	}
}
