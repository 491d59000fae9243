package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"distckpt.dev/go/internal/fixtures"
)

// nobody runs the CLI binary as an unprivileged user, so that permission errors happen when the tests run as root.
const nobody = 65534

// buildCLI builds the distckpt binary into dir.
func buildCLI(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "distckpt")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// runAs runs the binary as user uid (when it is not ours) and returns stdout, stderr and the exit status.
func runAs(t *testing.T, bin string, uid int, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if uid != os.Geteuid() {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return out.String(), errOut.String(), ee.ExitCode()
	}
	if err != nil {
		t.Fatalf("%s %v: %v", bin, args, err)
	}
	return out.String(), errOut.String(), 0
}

// Issue 11: the same failure gives the same exit status in every command, and the message names the path. Each
// failure is met by every command: the checkpoint commands get the damaged checkpoint as CKPT (diff as either side),
// the store commands (ls, prune) get it as DIR or inside DIR.
func TestSameFailureSameExitStatusInEveryCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	// World-readable, so that the unprivileged user can reach it.
	base, err := os.MkdirTemp("", "distckpt-exit-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := buildCLI(t, base)
	good := filepath.Join(base, "good")
	fixtures.Write(t, good, fixtures.Options{Step: 1})

	type failure struct {
		name   string
		ckpt   string // what a checkpoint command gets
		store  string // what ls and prune get
		status int    // expected from the checkpoint commands
		// expected from ls and prune; listed: the store holds the damage, and the listing names it (exit 0)
		storeStatus int
		listed      string
		uid         int
	}
	mk := func(name string) string {
		d := filepath.Join(base, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	var failures []failure

	missing := filepath.Join(base, "missing", "step-1")
	failures = append(failures, failure{name: "missing", ckpt: missing, store: filepath.Join(base, "missing"),
		status: exitNotFound, storeStatus: exitNotFound})

	file := filepath.Join(base, "a-file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	failures = append(failures, failure{name: "not a directory", ckpt: file, store: file, status: exitNotFound,
		storeStatus: exitNotFound})

	corruptStore := mk("corrupt-store")
	corrupt := filepath.Join(corruptStore, "step-2")
	fixtures.Write(t, corrupt, fixtures.Options{Step: 2})
	if err := os.WriteFile(filepath.Join(corrupt, "metadata.dckpt"), []byte("not flatbuffers"), 0o644); err != nil {
		t.Fatal(err)
	}
	failures = append(failures, failure{name: "corrupt metadata", ckpt: corrupt, store: corruptStore,
		status: exitCorrupt, storeStatus: exitOK, listed: "step-2"})

	stagingStore := mk("staging-store")
	staging := fixtures.Staging(t, stagingStore, "step-3", "00000000000000ab", "elsewhere.example", 1, 0)
	failures = append(failures, failure{name: "uncommitted staging directory", ckpt: staging, store: stagingStore,
		status: exitNotFound, storeStatus: exitOK, listed: "step-3.dckpt-staging-00000000000000ab"})

	// Permission errors: a metadata file the user may not read; a store directory the user may not list. As root,
	// the binary runs as nobody, which must be able to start it (and to load libdistckpt.so).
	uid := os.Geteuid()
	if uid == 0 {
		uid = nobody
		cmd := exec.Command(bin, "version")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Logf("skipping the permission cases: the binary cannot run as uid %d here: %v %s", nobody, err, out)
			uid = -1
		}
	}
	permStore := mk("perm-store")
	perm := filepath.Join(permStore, "step-4")
	fixtures.Write(t, perm, fixtures.Options{Step: 4})
	if err := os.Chmod(filepath.Join(perm, "metadata.dckpt"), 0); err != nil {
		t.Fatal(err)
	}
	lockedStore := mk("locked-store")
	fixtures.Write(t, filepath.Join(lockedStore, "step-5"), fixtures.Options{Step: 5})
	if err := os.Chmod(lockedStore, 0o311); err != nil { // may be entered, not listed
		t.Fatal(err)
	}
	if uid >= 0 {
		failures = append(failures, failure{name: "permission denied", ckpt: perm, store: lockedStore,
			status: exitPermission, storeStatus: exitPermission, uid: uid})
	}

	for _, f := range failures {
		if f.uid == 0 {
			f.uid = os.Geteuid()
		}
		out := t.TempDir()
		if err := os.Chmod(filepath.Dir(out), 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(out, 0o777); err != nil {
			t.Fatal(err)
		}
		runs := []struct {
			args   []string
			status int
			names  string
		}{
			{[]string{"inspect", f.ckpt}, f.status, f.ckpt},
			{[]string{"verify", f.ckpt}, f.status, f.ckpt},
			{[]string{"du", f.ckpt}, f.status, f.ckpt},
			{[]string{"diff", f.ckpt, good}, f.status, f.ckpt},
			{[]string{"diff", good, f.ckpt}, f.status, f.ckpt},
			{[]string{"export-safetensors", f.ckpt, out}, f.status, f.ckpt},
			{[]string{"ls", f.store}, f.storeStatus, f.store},
			{[]string{"prune", "--keep-last", "1", "--dry-run", f.store}, f.storeStatus, f.store},
		}
		for _, r := range runs {
			for _, asJSON := range []bool{false, true} {
				args := r.args
				if asJSON {
					args = append(append([]string(nil), args...), "--json")
				}
				stdout, stderr, code := runAs(t, bin, f.uid, args...)
				if code != r.status {
					t.Errorf("%s: distckpt %s: exit %d, want %d\nstdout: %s\nstderr: %s", f.name,
						strings.Join(args, " "), code, r.status, stdout, stderr)
					continue
				}
				if code == exitOK {
					if !strings.Contains(stdout, f.listed) {
						t.Errorf("%s: distckpt %s: the listing does not name %s:\n%s", f.name, strings.Join(args, " "),
							f.listed, stdout)
					}
					continue
				}
				if !strings.Contains(stderr, r.names) {
					t.Errorf("%s: distckpt %s: the message does not name %s: %s", f.name, strings.Join(args, " "),
						r.names, stderr)
				}
				if asJSON {
					var doc struct {
						SchemaVersion *int `json:"schema_version"`
						Error         *jsonError
					}
					if err := json.Unmarshal([]byte(stdout), &doc); err != nil || doc.Error == nil ||
						doc.SchemaVersion == nil || !strings.Contains(doc.Error.Message, r.names) {
						t.Errorf("%s: distckpt %s: JSON error document %s (%v)", f.name, strings.Join(args, " "),
							stdout, err)
					}
				}
			}
		}
	}
	// A chunk that cannot be read for lack of permission is not corruption.
	if uid < 0 {
		return
	}
	dataPerm := filepath.Join(base, "data-perm")
	fixtures.Write(t, dataPerm, fixtures.Options{Step: 6})
	if err := os.Chmod(filepath.Join(dataPerm, "data-00000.bin"), 0); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := runAs(t, bin, uid, "verify", dataPerm); code != exitPermission {
		t.Errorf("verify with an unreadable data file: exit %d, want %d: %s", code, exitPermission, stderr)
	}
}

func TestVersionFlag(t *testing.T) {
	want, _, code := cli(t, "version")
	if code != exitOK || !strings.HasPrefix(want, "distckpt ") || !strings.Contains(want, "library") ||
		!strings.Contains(want, "ABI 1") {
		t.Fatalf("version: %d %q", code, want)
	}
	for _, flag := range []string{"--version", "-V", "-version"} {
		if got, errOut, code := cli(t, flag); code != exitOK || got != want {
			t.Errorf("%s: exit %d, %q (want %q) %s", flag, code, got, want, errOut)
		}
	}
	var v struct {
		SchemaVersion int `json:"schema_version"`
		CLI, Library  string
		Header        string
		ABI           int
	}
	if code := cliJSON(t, &v, "--version"); code != exitOK || v.SchemaVersion != 1 || v.CLI == "" || v.Library == "" ||
		v.ABI != 1 {
		t.Fatalf("--version --json: %d %+v", code, v)
	}
}

// Flag help prints the --flag forms the usage lines use, never the flag package's -flag.
func TestFlagHelpUsesDoubleDashes(t *testing.T) {
	singleDash := regexp.MustCompile(`(?m)^\s+-[a-zA-Z]`)
	for _, c := range commands() {
		out, _, code := cli(t, c.name, "--help")
		if code != exitOK || !strings.Contains(out, "--json") {
			t.Errorf("%s --help: exit %d\n%s", c.name, code, out)
		}
		if m := singleDash.FindString(out); m != "" {
			t.Errorf("%s --help lists a flag as %q:\n%s", c.name, strings.TrimSpace(m), out)
		}
		_, errOut, code := cli(t, c.name, "--bogus")
		if code != exitUsage || !strings.Contains(errOut, "--bogus") || singleDash.MatchString(errOut) {
			t.Errorf("%s --bogus: exit %d\n%s", c.name, code, errOut)
		}
	}
	out, _, _ := cli(t, "help", "prune")
	if !strings.Contains(out, "--keep-last N") || !strings.Contains(out, "(default 1h0m0s)") {
		t.Errorf("help prune:\n%s", out)
	}
}

// Every --json document starts with "schema_version", and every command's help says so.
func TestEveryJSONDocumentHasASchemaVersion(t *testing.T) {
	dir := newStore(t, 1, 2)
	a, b := filepath.Join(dir, "step-1"), filepath.Join(dir, "step-2")
	for _, args := range [][]string{
		{"ls", dir}, {"inspect", a}, {"verify", a}, {"du", a}, {"diff", a, b},
		{"prune", "--keep-last", "5", dir}, {"export-safetensors", a, t.TempDir()}, {"version"},
		{"inspect", filepath.Join(dir, "missing")},
	} {
		out, errOut, _ := cli(t, append(args, "--json")...)
		if !strings.HasPrefix(out, "{\n  \"schema_version\": 1,") {
			t.Errorf("%v: %s%s", args, out, errOut)
		}
		var v map[string]interface{}
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
	for _, c := range commands() {
		if !strings.Contains(c.help, `"schema_version": 1`) {
			t.Errorf("%s: help does not document schema_version", c.name)
		}
	}
}
