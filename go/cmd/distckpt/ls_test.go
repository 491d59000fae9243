package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"distckpt.dev/go/internal/fixtures"
)

type lsOut struct {
	Directory   string
	Checkpoints []struct {
		Name, Path, Status string
		Step               *int64
		StepRaw            *string `json:"step_raw"`
		Entries            *int
		DataBytes          *uint64 `json:"data_bytes"`
		Bytes              uint64
		Date               *string
		FinalName          *string `json:"final_name"`
		Symlink            *string
		Writer             *struct {
			Host      string
			PID       int
			FinalPath string `json:"final_path"`
			State     string
			Started   *string
		}
		Error *jsonError
	}
}

func (o lsOut) byName(t *testing.T, name string) int {
	t.Helper()
	for i, c := range o.Checkpoints {
		if c.Name == name {
			return i
		}
	}
	t.Fatalf("%s not listed: %+v", name, o)
	return -1
}

func TestLsEveryStatus(t *testing.T) {
	dir := newStore(t, 1000, 200, 300)
	fixtures.Write(t, filepath.Join(dir, "nostep"), fixtures.Options{Step: -1})
	fixtures.Write(t, filepath.Join(dir, "garbage-meta"), fixtures.Options{Step: 5})
	if err := os.WriteFile(filepath.Join(dir, "garbage-meta", "metadata.dckpt"), []byte("not flatbuffers"), 0o644); err != nil {
		t.Fatal(err)
	}
	fixtures.Write(t, filepath.Join(dir, "truncated-meta"), fixtures.Options{Step: 6})
	fixtures.Truncate(t, filepath.Join(dir, "truncated-meta"), "metadata.dckpt", 64)
	host := fixtures.Hostname(t)
	fixtures.Staging(t, dir, "step-400", "00000000000000aa", host, os.Getpid(), 0)
	fixtures.Staging(t, dir, "step-500", "00000000000000bb", host, fixtures.DeadPID(t), 0)
	fixtures.Staging(t, dir, "step-600", "00000000000000cc", "elsewhere.example", 77, 0)
	// A commit interrupted between removing the marker and the rename.
	fixtures.Write(t, filepath.Join(dir, "step-700.dckpt-staging-00000000000000dd"), fixtures.Options{Step: 700})
	fixtures.Write(t, filepath.Join(dir, "step-200.dckpt-old-00000000000000ee"), fixtures.Options{Step: 200})
	if err := os.Mkdir(filepath.Join(dir, "notes"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("step-1000", filepath.Join(dir, "latest")); err != nil {
		t.Fatal(err)
	}

	var o lsOut
	if code := cliJSON(t, &o, "ls", dir); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	want := map[string]string{
		"step-200": statusCommitted, "step-300": statusCommitted, "step-1000": statusCommitted, "latest": statusCommitted,
		"nostep": statusCommitted, "garbage-meta": statusCorrupt, "truncated-meta": statusCorrupt,
		"step-400.dckpt-staging-00000000000000aa": statusStaging, "step-500.dckpt-staging-00000000000000bb": statusStaging,
		"step-600.dckpt-staging-00000000000000cc": statusStaging,
		"step-700.dckpt-staging-00000000000000dd": statusUnrenamed, "step-200.dckpt-old-00000000000000ee": statusReplaced,
	}
	if len(o.Checkpoints) != len(want) {
		t.Fatalf("listed %d, want %d: %+v", len(o.Checkpoints), len(want), o.Checkpoints)
	}
	for name, status := range want {
		if got := o.Checkpoints[o.byName(t, name)].Status; got != status {
			t.Errorf("%s: status %q, want %q", name, got, status)
		}
	}
	// Natural order: step-200 before step-1000.
	if o.byName(t, "step-200") > o.byName(t, "step-1000") {
		t.Error("not in natural name order")
	}
	c := o.Checkpoints[o.byName(t, "step-1000")]
	if c.Step == nil || *c.Step != 1000 || c.Entries == nil || *c.Entries != len(fixtures.Standard)+1 ||
		c.Bytes <= *c.DataBytes || c.Date == nil || c.Error != nil {
		t.Errorf("step-1000: %+v", c)
	}
	if c := o.Checkpoints[o.byName(t, "latest")]; c.Symlink == nil || *c.Symlink != "step-1000" {
		t.Errorf("latest: %+v", c)
	}
	if c := o.Checkpoints[o.byName(t, "nostep")]; c.Step != nil || c.StepRaw != nil {
		t.Errorf("nostep: %+v", c)
	}
	if c := o.Checkpoints[o.byName(t, "garbage-meta")]; c.Error == nil || c.Error.Code != "corrupt" || c.Entries != nil {
		t.Errorf("garbage-meta: %+v", c)
	}
	for name, state := range map[string]string{"step-400": "running", "step-500": "exited", "step-600": "unknown"} {
		c := o.Checkpoints[o.byName(t, name+".dckpt-staging-00000000000000"+map[string]string{
			"step-400": "aa", "step-500": "bb", "step-600": "cc"}[name])]
		if c.Writer == nil || c.Writer.State != state || c.FinalName == nil || *c.FinalName != name ||
			c.Writer.FinalPath != filepath.Join(dir, name) || c.Writer.Started == nil {
			t.Errorf("%s staging: %+v %+v", name, c, c.Writer)
		}
	}

	var all lsOut
	cliJSON(t, &all, "ls", "--all", dir)
	if all.Checkpoints[all.byName(t, "notes")].Status != statusOther {
		t.Error("--all does not list other directories")
	}

	out, errOut, code := cli(t, "ls", dir)
	wantCode(t, code, exitOK, out, errOut)
	for _, s := range []string{"NAME", "step-1000", "committed", "incomplete", "writer pid", "is running",
		"has exited", "on host elsewhere.example", "corrupt", "complete-unrenamed", "symlink to step-1000"} {
		if !strings.Contains(out, s) {
			t.Errorf("ls output lacks %q:\n%s", s, out)
		}
	}
}

func TestLsOfACheckpointAndOfNothing(t *testing.T) {
	dir := newStore(t, 7)
	var o lsOut
	cliJSON(t, &o, "ls", filepath.Join(dir, "step-7"))
	if len(o.Checkpoints) != 1 || o.Checkpoints[0].Status != statusCommitted {
		t.Fatalf("%+v", o)
	}
	out, _, code := cli(t, "ls", t.TempDir())
	if code != exitOK || !strings.Contains(out, "no checkpoints") {
		t.Fatalf("empty store: %d %s", code, out)
	}
	var e struct{ Error *jsonError }
	if code := cliJSON(t, &e, "ls", filepath.Join(dir, "missing")); code != exitNotFound || e.Error == nil {
		t.Fatalf("missing directory: %d %+v", code, e)
	}
}

// Issue 27: a checkpoint directory the user may not look inside is listed as unreadable (with and without --all),
// never left out or called not-a-checkpoint. As root, whom chmod does not stop, the binary runs as nobody.
func TestLsShowsADirectoryItCannotReadAsUnreadable(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	base, err := os.MkdirTemp("", "distckpt-ls-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(base, "store", "step-2"), 0o755); os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := buildCLI(t, base)
	dir := filepath.Join(base, "store")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	fixtures.Write(t, filepath.Join(dir, "step-1"), fixtures.Options{Step: 1})
	fixtures.Write(t, filepath.Join(dir, "step-2"), fixtures.Options{Step: 2})
	if err := os.Mkdir(filepath.Join(dir, "notes"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, filepath.Join(dir, "step-1")} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "step-2"), 0); err != nil {
		t.Fatal(err)
	}
	uid := os.Geteuid()
	if uid == 0 {
		uid = nobody
		if _, errOut, code := runAs(t, bin, uid, "version"); code != exitOK {
			t.Skipf("the binary cannot run as uid %d here (needed to deny reads to root): %s", nobody, errOut)
		}
	}
	for _, args := range [][]string{{"ls", dir}, {"ls", "--all", dir}} {
		stdout, stderr, code := runAs(t, bin, uid, append(args, "--json")...)
		wantCode(t, code, exitOK, stdout, stderr)
		var o lsOut
		if err := json.Unmarshal([]byte(stdout), &o); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, stdout)
		}
		c := o.Checkpoints[o.byName(t, "step-2")]
		if c.Status != statusError || c.Error == nil || c.Error.Code != "permission denied" ||
			!strings.Contains(c.Error.Message, filepath.Join(dir, "step-2")) {
			t.Errorf("%v: step-2 %+v (error %+v), want unreadable with a permission error naming it", args, c, c.Error)
		}
		if c := o.Checkpoints[o.byName(t, "step-1")]; c.Status != statusCommitted {
			t.Errorf("%v: step-1 %+v", args, c)
		}
		if len(args) == 3 && o.Checkpoints[o.byName(t, "notes")].Status != statusOther {
			t.Errorf("--all: notes is not %s", statusOther)
		}
		if len(args) == 2 && len(o.Checkpoints) != 2 {
			t.Errorf("ls without --all: %+v", o.Checkpoints)
		}
		stdout, stderr, code = runAs(t, bin, uid, args...)
		wantCode(t, code, exitOK, stdout, stderr)
		var line string
		for _, l := range strings.Split(stdout, "\n") {
			if strings.HasPrefix(l, "step-2 ") {
				line = l
			}
		}
		if !strings.Contains(line, statusError) || !strings.Contains(line, "permission denied") ||
			strings.Contains(stdout, "step-2  not-a-checkpoint") {
			t.Errorf("%v: table line for step-2 %q:\n%s", args, line, stdout)
		}
	}
}
