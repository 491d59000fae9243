package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"distckpt.dev/go/internal/fixtures"
)

func TestExportSafetensors(t *testing.T) {
	ckpt := filepath.Join(newStore(t, 9), "step-9")
	out := filepath.Join(t.TempDir(), "hf", "export") // created by the command
	var o struct {
		Index   string
		Tensors int
		Files   []struct {
			Name  string
			Bytes int64
		}
	}
	stdout, errOut, code := cli(t, "export-safetensors", "--json", "--max-shard-size", "16KiB", "--prefix", "w", ckpt, out)
	wantCode(t, code, exitOK, stdout, errOut)
	cliJSON(t, &o, "export-safetensors", "--max-shard-size", "16KiB", "--prefix", "w", ckpt, out)
	if o.Index != "w.safetensors.index.json" || o.Tensors != len(fixtures.Standard) || len(o.Files) < 2 {
		t.Fatalf("%+v", o)
	}
	for _, f := range o.Files {
		st, err := os.Stat(filepath.Join(out, f.Name))
		if err != nil || st.Size() != f.Bytes || !strings.HasPrefix(f.Name, "w-") {
			t.Errorf("%+v: %v", f, err)
		}
	}
	text, _, code := cli(t, "export-safetensors", ckpt, out)
	if code != exitOK || !strings.Contains(text, "model.safetensors.index.json") || !strings.Contains(text, "exported 7 tensors") {
		t.Fatalf("%d %s", code, text)
	}
}

func TestExportOfBrokenCheckpoints(t *testing.T) {
	dir := t.TempDir()
	_, errOut, code := cli(t, "export-safetensors", filepath.Join(dir, "missing"), t.TempDir())
	if code != exitNotFound || !strings.Contains(errOut, "missing") {
		t.Fatalf("missing: exit %d: %s", code, errOut)
	}
	ckpt := write(t, dir, "bad", fixtures.Options{Step: 1})
	c := chunkAt(t, ckpt, "model.embed", 0)
	fixtures.FlipByte(t, ckpt, c.File, int64(c.FileOffset))
	var e struct{ Error *jsonError }
	if code := cliJSON(t, &e, "export-safetensors", ckpt, t.TempDir()); code != exitFound || e.Error == nil ||
		e.Error.Code != "corrupt" {
		t.Fatalf("corrupt data: exit %d %+v", code, e.Error)
	}
}

func TestExportRenameFlag(t *testing.T) {
	ckpt := filepath.Join(newStore(t, 9), "step-9")
	out := t.TempDir()
	var o struct {
		Tensors int
	}
	stdout, errOut, code := cli(t, "export-safetensors", "--json", "--rename", `optim\..*=`, "--rename",
		`model\.(.*)=m.\1`, "--buffer-size", "64KiB", "--io-threads", "2", ckpt, out)
	wantCode(t, code, exitOK, stdout, errOut)
	cliJSON(t, &o, "export-safetensors", "--rename", `optim\..*=`, "--rename", `model\.(.*)=m.\1`, ckpt, out)
	if o.Tensors != len(fixtures.Standard)-2 {
		t.Fatalf("%+v: the two optim tensors should be left out", o)
	}
	idx, err := os.ReadFile(filepath.Join(out, "model.safetensors.index.json"))
	if err != nil || !strings.Contains(string(idx), `"m.layers.0.w"`) || strings.Contains(string(idx), "optim") {
		t.Fatalf("%v: %s", err, idx)
	}
	// Rules the core refuses, and a flag without '=': usage errors naming the problem.
	for _, c := range []struct{ rule, says string }{
		{`model\.layers\.\d+\.w=w`, "'model.layers.0.w'"},
		{`model.(=x`, "rule 1"},
		{`no-equals-sign`, "PATTERN=REPLACEMENT"},
	} {
		_, errOut, code := cli(t, "export-safetensors", "--rename", c.rule, ckpt, t.TempDir())
		if code != exitUsage || !strings.Contains(errOut, c.says) {
			t.Errorf("--rename %s: exit %d: %s", c.rule, code, errOut)
		}
	}
}
