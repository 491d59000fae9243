package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"distckpt.dev/go/internal/fixtures"
)

// cli runs the command in-process and returns stdout, stderr and the exit status.
func cli(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return out.String(), errOut.String(), code
}

// cliJSON runs the command with --json and decodes stdout into v.
func cliJSON(t *testing.T, v interface{}, args ...string) int {
	t.Helper()
	out, errOut, code := cli(t, append(args, "--json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("distckpt %s --json: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, out, errOut)
	}
	return code
}

func wantCode(t *testing.T, got, want int, out, errOut string) {
	t.Helper()
	if got != want {
		t.Fatalf("exit status %d, want %d\nstdout:\n%s\nstderr:\n%s", got, want, out, errOut)
	}
}

// store writes committed fixtures step-<s> under a new directory.
func newStore(t *testing.T, steps ...int) string {
	t.Helper()
	dir := t.TempDir()
	for _, s := range steps {
		fixtures.Write(t, filepath.Join(dir, "step-"+itoa(s)), fixtures.Options{Step: s, Seed: float32(s)})
	}
	return dir
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}

func TestUsageAndUnknownCommand(t *testing.T) {
	out, errOut, code := cli(t)
	wantCode(t, code, exitUsage, out, errOut)
	for _, c := range commands() {
		if !strings.Contains(errOut, c.name) {
			t.Errorf("usage does not list %s", c.name)
		}
	}
	_, errOut, code = cli(t, "frobnicate")
	wantCode(t, code, exitUsage, "", errOut)
	out, _, code = cli(t, "help", "prune")
	if code != exitOK || !strings.Contains(out, "--keep-last") || !strings.Contains(out, `"actions"`) {
		t.Fatalf("help prune (%d):\n%s", code, out)
	}
	out, _, code = cli(t, "verify", "-h")
	if code != exitOK || !strings.Contains(out, "-workers") {
		t.Fatalf("verify -h (%d):\n%s", code, out)
	}
}

func TestEveryCommandDocumentsItsJSON(t *testing.T) {
	for _, c := range commands() {
		if !strings.Contains(c.help, "JSON:") {
			t.Errorf("%s: help does not document its --json fields", c.name)
		}
	}
}

func TestArgumentErrors(t *testing.T) {
	for _, args := range [][]string{
		{"verify"}, {"verify", "a", "b"}, {"diff", "a"}, {"ls", "--bogus", "x"}, {"du", "--depth", "0", "x"},
		{"prune", "x"}, {"prune", "x", "--keep-last", "0"}, {"export-safetensors", "a", "b", "--max-shard-size", "lots"},
	} {
		out, errOut, code := cli(t, args...)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d\n%s%s", args, code, exitUsage, out, errOut)
		}
	}
}

func TestFlagsMayFollowArguments(t *testing.T) {
	dir := newStore(t, 1)
	var a, b struct {
		Checkpoints []struct{ Name string }
	}
	cliJSON(t, &a, "ls", dir)
	cliJSON(t, &b, "ls", "--json", dir)
	if len(a.Checkpoints) != 1 || len(b.Checkpoints) != 1 {
		t.Fatalf("%+v %+v", a, b)
	}
}

func TestVersion(t *testing.T) {
	var v struct {
		Library string
		ABI     int
	}
	if code := cliJSON(t, &v, "version"); code != exitOK || v.ABI != 1 || v.Library == "" {
		t.Fatalf("version: %d %+v", code, v)
	}
}

// TestBinaryExitStatus builds the real binary and checks the exit status a script sees.
func TestBinaryExitStatus(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "distckpt")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ckpt := filepath.Join(t.TempDir(), "ckpt")
	fixtures.Write(t, ckpt, fixtures.Options{Step: 1})
	if out, err := exec.Command(bin, "verify", ckpt).CombinedOutput(); err != nil {
		t.Fatalf("verify of a good checkpoint: %v\n%s", err, out)
	}
	fixtures.FlipByte(t, ckpt, "data-00000.bin", 0)
	out, err := exec.Command(bin, "verify", ckpt).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitFound {
		t.Fatalf("verify of a corrupt checkpoint: %v\n%s", err, out)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatal(err)
	}
}

// Issue 27: python -m distckpt's spellings work here too: "info" for inspect, a leading -q, --quiet, and
// consolidate --format safetensors (--format torch is Python's: a usage error naming it).
func TestPythonSpellings(t *testing.T) {
	dir := newStore(t, 1)
	ckpt := filepath.Join(dir, "step-1")
	want, _, code := cli(t, "inspect", "--json", ckpt)
	got, errOut, code2 := cli(t, "info", "--json", ckpt)
	if code != exitOK || code2 != exitOK || got != want {
		t.Errorf("info: exit %d, %s%s\nwant (inspect, exit %d) %s", code2, got, errOut, code, want)
	}
	if _, _, code := cli(t, "info", filepath.Join(dir, "missing")); code != exitNotFound {
		t.Errorf("info of a missing checkpoint: exit %d", code)
	}
	_, errOut, _ = cli(t)
	if !strings.Contains(errOut, "(also: info)") {
		t.Errorf("usage does not name the alias:\n%s", errOut)
	}
	if out, errOut, code := cli(t, "-q", "inspect", ckpt); code != exitOK || !strings.Contains(out, "checkpoint") {
		t.Errorf("-q inspect: exit %d %s%s", code, out, errOut)
	}
	out := t.TempDir()
	for _, args := range [][]string{
		{"-q", "export-safetensors", "--progress", "bar", ckpt, out},
		{"export-safetensors", "--quiet", "--progress", "bar", ckpt, out},
	} {
		if stdout, errOut, code := cli(t, args...); code != exitOK || errOut != "" {
			t.Errorf("%v: exit %d, stderr %q (want no progress)\n%s", args, code, errOut, stdout)
		}
	}
	if _, errOut, code := cli(t, "export-safetensors", "--progress", "bar", ckpt, out); code != exitOK || errOut == "" {
		t.Errorf("--progress bar draws nothing: exit %d", code)
	}
	single := filepath.Join(out, "one.st")
	var j struct {
		Format  string
		Tensors int
	}
	if code := cliJSON(t, &j, "consolidate", "--format", "safetensors", ckpt, single); code != exitOK ||
		j.Format != "safetensors" || j.Tensors != len(fixtures.Standard) {
		t.Errorf("consolidate --format safetensors: exit %d %+v", code, j)
	}
	pt := filepath.Join(out, "x.pt")
	if _, errOut, code := cli(t, "consolidate", "--format", "torch", ckpt, pt); code != exitUsage ||
		!strings.Contains(errOut, "python -m distckpt consolidate") {
		t.Errorf("consolidate --format torch: exit %d %s", code, errOut)
	}
	if _, _, code := cli(t, "consolidate", ckpt, pt); code != exitUsage {
		t.Errorf("consolidate to .pt without --format: exit %d", code)
	}
}
