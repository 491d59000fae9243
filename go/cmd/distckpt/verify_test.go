package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
)

type verifyOut struct {
	Path   string
	OK     bool
	Chunks int
	Bytes  uint64
	Bad    []badJSON
	Error  *jsonError
}

// chunkAt returns chunk i of entry name.
func chunkAt(t *testing.T, ckpt, name string, i int) distckpt.Chunk {
	t.Helper()
	r, err := distckpt.Open(ckpt, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	e, err := r.Entry(name)
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := r.Chunks(e.Index)
	if err != nil {
		t.Fatal(err)
	}
	return chunks[i]
}

func fixture(t *testing.T) string {
	t.Helper()
	ckpt := filepath.Join(t.TempDir(), "ckpt")
	fixtures.Write(t, ckpt, fixtures.Options{Step: 1})
	return ckpt
}

func TestVerifyIntact(t *testing.T) {
	ckpt := fixture(t)
	out, errOut, code := cli(t, "verify", ckpt)
	wantCode(t, code, exitOK, out, errOut)
	if !strings.HasPrefix(out, "OK: ") || strings.Contains(errOut, "\r") {
		t.Fatalf("stdout %q stderr %q", out, errOut)
	}
	var o verifyOut
	if code := cliJSON(t, &o, "verify", "--workers", "2", ckpt); code != exitOK || !o.OK || o.Chunks < 10 ||
		len(o.Bad) != 0 || o.Error != nil {
		t.Fatalf("%d %+v", code, o)
	}
}

func TestVerifyNamesEveryFlippedChunk(t *testing.T) {
	ckpt := fixture(t)
	a := chunkAt(t, ckpt, "model.layers.0.w", 3)
	b := chunkAt(t, ckpt, fixtures.BytesEntry, 0)
	fixtures.FlipByte(t, ckpt, a.File, int64(a.FileOffset+100))
	fixtures.FlipByte(t, ckpt, b.File, int64(b.FileOffset+1))

	out, errOut, code := cli(t, "verify", ckpt)
	wantCode(t, code, exitFound, out, errOut)
	wantLine := fmt.Sprintf("BAD model.layers.0.w chunk 3: file %s offset %d length %d: corrupt:", a.File, a.FileOffset,
		a.Length)
	if !strings.Contains(out, wantLine) || !strings.Contains(out, "BAD "+fixtures.BytesEntry+" chunk 0") ||
		!strings.Contains(out, "FAILED: ") || !strings.Contains(out, "2 of ") {
		t.Fatalf("want %q in:\n%s", wantLine, out)
	}

	var o verifyOut
	if code := cliJSON(t, &o, "verify", ckpt); code != exitFound || o.OK || len(o.Bad) != 2 {
		t.Fatalf("%d %+v", code, o)
	}
	got := o.Bad[1]
	if o.Bad[0].Entry != fixtures.BytesEntry || got.Entry != "model.layers.0.w" || got.Chunk != 3 ||
		got.File != a.File || got.FileOffset != a.FileOffset || got.Code != "corrupt" ||
		!strings.Contains(got.Message, "checksum mismatch") {
		t.Fatalf("bad chunks %+v", o.Bad)
	}
}

func TestVerifyTruncatedDataFile(t *testing.T) {
	ckpt := fixture(t)
	fixtures.Truncate(t, ckpt, "data-00000.bin", 8192)
	var o verifyOut
	if code := cliJSON(t, &o, "verify", ckpt); code != exitFound || o.OK || len(o.Bad) == 0 {
		t.Fatalf("%d %+v", code, o)
	}
	if !strings.Contains(o.Bad[0].Message, "truncated") || o.Bad[0].File != "data-00000.bin" {
		t.Fatalf("first bad chunk %+v", o.Bad[0])
	}
}

func TestVerifyMissingDataFile(t *testing.T) {
	ckpt := fixture(t)
	if err := os.Remove(filepath.Join(ckpt, "data-00000.bin")); err != nil {
		t.Fatal(err)
	}
	var o verifyOut
	if code := cliJSON(t, &o, "verify", ckpt); code != exitFound || len(o.Bad) == 0 {
		t.Fatalf("%d %+v", code, o)
	}
}

func TestVerifyBrokenMetadata(t *testing.T) {
	for name, damage := range map[string]func(ckpt string){
		"garbage": func(ckpt string) {
			if err := os.WriteFile(filepath.Join(ckpt, "metadata.dckpt"), make([]byte, 300), 0o644); err != nil {
				t.Fatal(err)
			}
		},
		"truncated": func(ckpt string) { fixtures.Truncate(t, ckpt, "metadata.dckpt", 200) },
		"flipped": func(ckpt string) {
			st, _ := os.Stat(filepath.Join(ckpt, "metadata.dckpt"))
			fixtures.FlipByte(t, ckpt, "metadata.dckpt", st.Size()/2)
		},
	} {
		t.Run(name, func(t *testing.T) {
			ckpt := fixture(t)
			damage(ckpt)
			var o verifyOut
			code := cliJSON(t, &o, "verify", ckpt)
			if name == "flipped" && code == exitOK {
				t.Skip("this byte of the metadata was not covered by any check (e.g. padding)")
			}
			// Corrupt metadata exits 5 in every command. A flipped byte may land in a stored checksum: then the metadata
			// opens and the chunk is reported as bad (exit 1).
			want := exitCorrupt
			if name == "flipped" && o.Error == nil {
				want = exitFound
			}
			if code != want || o.OK || (o.Error == nil && (name != "flipped" || len(o.Bad) == 0)) {
				t.Fatalf("%d %+v", code, o)
			}
			out, _, _ := cli(t, "verify", ckpt)
			if !strings.Contains(out, "FAILED") {
				t.Fatalf("stdout: %s", out)
			}
		})
	}
}

func TestVerifyMissingCheckpointAndStaging(t *testing.T) {
	dir := t.TempDir()
	if _, _, code := cli(t, "verify", filepath.Join(dir, "nope")); code != exitNotFound {
		t.Fatalf("missing: exit %d", code)
	}
	staging := fixtures.Staging(t, dir, "step-1", "00000000000000ab", "h", 1, 0)
	if _, _, code := cli(t, "verify", staging); code == exitOK {
		t.Fatal("verify accepted a half-written checkpoint")
	}
}

// bigFixture saves one 40 MiB tensor as a single chunk.
func bigFixture(t *testing.T) string {
	t.Helper()
	st := distckpt.NewState()
	data := make([]byte, 40<<20)
	for i := range data {
		data[i] = byte(i * 13)
	}
	if err := st.AddTensorData("big", distckpt.U8, []uint64{uint64(len(data))}, data); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "big")
	if _, err := distckpt.Save(path, st, &distckpt.SaveOptions{NoSync: true}); err != nil {
		t.Fatal(err)
	}
	return path
}

// Issue 11: --progress=log prints plain progress lines on stderr off a terminal (CI logs), advancing within a single
// 40 MiB chunk; the default (auto) prints nothing there.
func TestVerifyProgressLog(t *testing.T) {
	ckpt := bigFixture(t)
	out, errOut, code := cli(t, "verify", "--progress=log", ckpt)
	wantCode(t, code, exitOK, out, errOut)
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	if len(lines) < 4 || strings.Contains(errOut, "\r") || strings.Contains(errOut, "\x1b") {
		t.Fatalf("want several plain lines, got:\n%q", errOut)
	}
	if !strings.HasPrefix(lines[0], "verifying "+ckpt+": 0% (0 B / 40.0 MiB") ||
		!strings.HasPrefix(lines[len(lines)-1], "verifying "+ckpt+": 100% (40.0 MiB / 40.0 MiB") {
		t.Fatalf("lines:\n%s", errOut)
	}
	mid := false
	for _, l := range lines {
		mid = mid || (strings.Contains(l, "%") && !strings.Contains(l, ": 0%") && !strings.Contains(l, ": 100%"))
	}
	if !mid {
		t.Fatalf("no progress within the chunk:\n%s", errOut)
	}
	if _, errOut, _ := cli(t, "verify", ckpt); errOut != "" {
		t.Fatalf("--progress=auto off a terminal printed %q", errOut)
	}
	if _, errOut, _ := cli(t, "verify", "--progress", "bar", ckpt); !strings.Contains(errOut, "\r") ||
		!strings.Contains(errOut, "verifying") {
		t.Fatalf("--progress=bar: %q", errOut)
	}
	for _, args := range [][]string{{"--progress", "none"}, {"--no-progress"}, {"--progress=log", "--no-progress"}} {
		if _, errOut, code := cli(t, append(append([]string{"verify"}, args...), ckpt)...); code != exitOK || errOut != "" {
			t.Fatalf("%v: %d %q", args, code, errOut)
		}
	}
	if _, errOut, code := cli(t, "verify", "--progress", "loud", ckpt); code != exitUsage ||
		!strings.Contains(errOut, "auto, bar, log or none") {
		t.Fatalf("--progress loud: %d %s", code, errOut)
	}
	// export-safetensors takes the same flag.
	if _, errOut, code := cli(t, "export-safetensors", "--progress=log", ckpt, t.TempDir()); code != exitOK ||
		!strings.Contains(errOut, "exporting "+ckpt+": 100%") {
		t.Fatalf("export --progress=log: %d\n%s", code, errOut)
	}
}

func TestProgressLoggerThrottles(t *testing.T) {
	var b strings.Builder
	l := &progressLogger{w: &b, label: "x", start: time.Now(), every: time.Hour, step: 10}
	for done := uint64(0); done <= 1000; done++ {
		_ = l.update(done, 1000)
	}
	if n := strings.Count(b.String(), "\n"); n != 11 {
		t.Fatalf("%d lines for 0..100%% in steps of 10%%:\n%s", n, b.String())
	}
}
