package main

import (
	"fmt"
	"strings"
	"testing"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
	"distckpt.dev/go/internal/memstore"
	"distckpt.dev/go/internal/mototest"
	"distckpt.dev/go/s3"
)

// useMem makes "mem://PATH" URLs name PATH in a fresh in-memory Go storage for the test.
func useMem(t *testing.T) *memstore.Store {
	t.Helper()
	ms := memstore.New()
	storageSchemes["mem"] = func(url string) (*distckpt.StorageHandle, string, error) {
		h, err := distckpt.NewStorage(ms, 0)
		return h, strings.TrimSuffix(strings.TrimPrefix(url, "mem://"), "/"), err
	}
	t.Cleanup(func() { delete(storageSchemes, "mem") })
	return ms
}

// saveTo saves the standard fixture with the given step at url through the CLI's storage for it.
func saveTo(t *testing.T, url string, step int) {
	t.Helper()
	h, path, err := remote(url)
	if err != nil || h == nil {
		t.Fatalf("no storage for %s: %v", url, err)
	}
	defer h.Close()
	_, err = distckpt.Save(path, fixtures.State(t, fixtures.Options{Step: step, Seed: float32(step)}),
		&distckpt.SaveOptions{Storage: h, ChecksumBlockSize: fixtures.BlockSize})
	if err != nil {
		t.Fatal(err)
	}
}

// interruptedSave leaves what a writer that died before its commit leaves at path, its marker aged past any grace.
func interruptedSave(t *testing.T, ms *memstore.Store, url string) {
	t.Helper()
	ms.KeepOnRemove.Store(true)
	ms.Fail = func(op, path string) error {
		if op == "commit" {
			return fmt.Errorf("killed")
		}
		return nil
	}
	h, path, _ := remote(url)
	_, err := distckpt.Save(path, fixtures.State(t, fixtures.Options{Step: 1}), &distckpt.SaveOptions{Storage: h})
	h.Close()
	ms.Fail = nil
	ms.KeepOnRemove.Store(false)
	if err == nil {
		t.Fatal("the interrupted save succeeded")
	}
	for _, p := range ms.Paths() {
		if strings.HasPrefix(p, path+"/STAGING") {
			text, _ := ms.Get(p)
			var lines []string
			for _, line := range strings.Split(string(text), "\n") {
				if strings.HasPrefix(line, "host: ") {
					line = "host: some-other-host"
				} else if strings.HasPrefix(line, "started_utc: ") {
					line = "started_utc: 2001-01-01T00:00:00Z"
				}
				lines = append(lines, line)
			}
			ms.Put(p, []byte(strings.Join(lines, "\n")))
		}
	}
}

func TestCLIOnMemoryStorage(t *testing.T) {
	ms := useMem(t)
	for _, s := range []int{100, 200, 300} {
		saveTo(t, fmt.Sprintf("mem://run/step-%d", s), s)
	}
	interruptedSave(t, ms, "mem://run/step-400")
	ms.Put("run/notes/readme.txt", []byte("not a checkpoint"))

	var ls lsOut
	out, errOut, code := cli(t, "ls", "mem://run")
	wantCode(t, code, exitOK, out, errOut)
	if !strings.Contains(out, "step-300") || !strings.Contains(out, "incomplete") {
		t.Fatalf("ls:\n%s", out)
	}
	wantCode(t, cliJSON(t, &ls, "ls", "mem://run"), exitOK, "", "")
	if len(ls.Checkpoints) != 4 {
		t.Fatalf("ls listed %+v", ls)
	}
	for i, want := range []string{"committed", "committed", "committed", "incomplete"} {
		if c := ls.Checkpoints[i]; c.Status != want || (want == "committed" && (c.Step == nil || *c.Step != int64(100*(i+1)))) {
			t.Fatalf("checkpoint %d: %+v", i, c)
		}
	}
	wantCode(t, cliJSON(t, &ls, "ls", "--all", "mem://run"), exitOK, "", "")
	if len(ls.Checkpoints) != 5 || ls.Checkpoints[ls.byName(t, "notes")].Status != "not-a-checkpoint" {
		t.Fatalf("ls --all listed %+v", ls)
	}
	wantCode(t, cliJSON(t, &ls, "ls", "mem://run/step-200"), exitOK, "", "")
	if len(ls.Checkpoints) != 1 || ls.Checkpoints[0].Name != "step-200" {
		t.Fatalf("ls of a checkpoint listed %+v", ls)
	}

	out, errOut, code = cli(t, "inspect", "mem://run/step-200")
	wantCode(t, code, exitOK, out, errOut)
	if !strings.Contains(out, "model.embed") {
		t.Fatalf("inspect:\n%s", out)
	}
	out, errOut, code = cli(t, "verify", "--progress", "none", "mem://run/step-200")
	wantCode(t, code, exitOK, out, errOut)
	out, errOut, code = cli(t, "inspect", "mem://run/step-400")
	wantCode(t, code, exitNotFound, out, errOut)
	if !strings.Contains(errOut, "run/step-400") {
		t.Fatalf("the error does not name the path: %s", errOut)
	}
	// A damaged data file: verify names it and exits 1.
	for _, p := range ms.Paths() {
		if strings.HasPrefix(p, "run/step-200/data-") {
			b, _ := ms.Get(p)
			b[10] ^= 0xff
			ms.Put(p, b)
		}
	}
	out, errOut, code = cli(t, "verify", "--progress", "none", "mem://run/step-200")
	wantCode(t, code, exitFound, out, errOut)

	// prune: the dry run removes nothing; then step-100 and the leftovers of step-400 go.
	before := len(ms.Paths())
	var pr struct {
		Order   string
		Actions []struct {
			Name, Status, Action string
			Deleted              bool
		}
	}
	wantCode(t, cliJSON(t, &pr, "prune", "--keep-last", "2", "--grace", "0", "--dry-run", "mem://run"), exitOK, "", "")
	if len(ms.Paths()) != before {
		t.Fatal("a dry run removed something")
	}
	out, errOut, code = cli(t, "prune", "--keep-last", "2", "--grace", "0", "mem://run")
	wantCode(t, code, exitOK, out, errOut)
	var left []string
	for _, p := range ms.Paths() {
		left = append(left, p[:strings.LastIndex(p, "/")])
	}
	got := strings.Join(dedup(left), ",")
	if got != "run/notes,run/step-200,run/step-300" {
		t.Fatalf("after prune: %s\n%s", got, out)
	}
	out, errOut, code = cli(t, "prune", "--keep-last", "1", "mem://run/step-300")
	wantCode(t, code, exitUsage, out, errOut)
	out, errOut, code = cli(t, "ls", "nosuch://x")
	if code == exitOK || !strings.Contains(errOut, "nosuch") {
		t.Fatalf("an unknown scheme: %d %s", code, errOut)
	}
}

func dedup(s []string) []string {
	var out []string
	for i, x := range s {
		if i == 0 || x != s[i-1] {
			out = append(out, x)
		}
	}
	return out
}

func TestCLIOnS3(t *testing.T) {
	mototest.Start(t)
	c, err := s3.NewFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CreateBucket("ckpts"); err != nil {
		t.Fatal(err)
	}
	for _, s := range []int{1, 2, 3} {
		saveTo(t, fmt.Sprintf("s3://ckpts/run/step-%d", s), s)
	}
	var ls lsOut
	wantCode(t, cliJSON(t, &ls, "ls", "s3://ckpts/run"), exitOK, "", "")
	if len(ls.Checkpoints) != 3 || ls.Checkpoints[2].Name != "step-3" || ls.Checkpoints[2].Status != "committed" ||
		*ls.Checkpoints[2].Step != 3 || ls.Checkpoints[2].Bytes == 0 || *ls.Checkpoints[2].Entries == 0 {
		t.Fatalf("ls: %+v", ls)
	}
	out, errOut, code := cli(t, "inspect", "s3://ckpts/run/step-2")
	wantCode(t, code, exitOK, out, errOut)
	out, errOut, code = cli(t, "verify", "--progress", "none", "s3://ckpts/run/step-2")
	wantCode(t, code, exitOK, out, errOut)
	out, errOut, code = cli(t, "verify", "s3://ckpts/run/step-9")
	wantCode(t, code, exitNotFound, out, errOut)
	if !strings.Contains(errOut, "s3://ckpts/run/step-9") {
		t.Fatalf("the error does not name the URL: %s", errOut)
	}
	out, errOut, code = cli(t, "prune", "--keep-last", "2", "s3://ckpts/run")
	wantCode(t, code, exitOK, out, errOut)
	wantCode(t, cliJSON(t, &ls, "ls", "s3://ckpts/run/"), exitOK, "", "")
	if len(ls.Checkpoints) != 2 || ls.Checkpoints[0].Name != "step-2" {
		t.Fatalf("ls after prune: %+v\nprune said:\n%s", ls, out)
	}
	if names, err := c.List("s3://ckpts/run/step-1"); err != nil || len(names) != 0 {
		t.Fatalf("step-1 left %v, %v", names, err)
	}
}
