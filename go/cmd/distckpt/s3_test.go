package main

import (
	"time"

	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"distckpt.dev/go/internal/fixtures"
	"distckpt.dev/go/internal/mototest"
)

// twinStores saves the same checkpoints step-1..3 below an s3:// URL (a moto server) and in a local directory, and
// returns both.
func twinStores(t *testing.T) (srv *mototest.Server, url, dir string) {
	t.Helper()
	srv = mototest.Start(t)
	srv.CreateBucket(t, "ckpts")
	url, dir = "s3://ckpts/run", t.TempDir()
	for _, s := range []int{1, 2, 3} {
		o := fixtures.Options{Step: s, Seed: float32(s)}
		fixtures.Write(t, url+"/step-"+itoa(s), o)
		fixtures.Write(t, filepath.Join(dir, "step-"+itoa(s)), o)
	}
	return srv, url, dir
}

// nonced is a data file's name on storage without rename (FORMAT.md section 6.2): the save's nonce in it.
var nonced = regexp.MustCompile(`data-([0-9]+)\.[0-9a-f]{16}\.bin`)

// jsonOf runs a command with --json and returns its document as it would be for a checkpoint in a directory: without
// the fields that name the arguments or time the run, the nonces out of data file names, and without the metadata's
// size (which holds those names).
func jsonOf(t *testing.T, args ...string) (map[string]interface{}, int) {
	t.Helper()
	out, errOut, code := cli(t, append(args, "--json")...)
	var doc map[string]interface{}
	if err := json.Unmarshal([]byte(nonced.ReplaceAllString(out, "data-$1.bin")), &doc); err != nil {
		t.Fatalf("distckpt %s --json: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, out, errOut)
	}
	for _, k := range []string{"path", "a", "b", "checkpoint", "out", "seconds", "directory", "metadata_bytes"} {
		delete(doc, k)
	}
	return doc, code
}

func TestEveryCommandOnAnS3URLAsOnADirectory(t *testing.T) {
	_, url, dir := twinStores(t)
	at := func(root, name string) string { return root + "/" + name }
	for _, args := range []func(root string) []string{
		func(r string) []string { return []string{"inspect", "--layout", "model.embed", at(r, "step-2")} },
		func(r string) []string { return []string{"du", "--depth", "3", at(r, "step-2")} },
		func(r string) []string { return []string{"diff", at(r, "step-1"), at(r, "step-2")} },
		func(r string) []string { return []string{"diff", "--data", at(r, "step-2"), at(r, "step-2")} },
		func(r string) []string { return []string{"verify", "--progress", "none", at(r, "step-3")} },
	} {
		onS3, codeS3 := jsonOf(t, args(url)...)
		onDir, codeDir := jsonOf(t, args(dir)...)
		if codeS3 != codeDir || !reflect.DeepEqual(onS3, onDir) {
			t.Fatalf("%v: exit %d on S3, %d in a directory\nS3:        %v\ndirectory: %v", args(url), codeS3,
				codeDir, onS3, onDir)
		}
	}
	// Text output too, but for the paths.
	for _, cmd := range []string{"inspect", "du"} {
		s3Text, errOut, code := cli(t, cmd, url+"/step-2")
		wantCode(t, code, exitOK, s3Text, errOut)
		dirText, _, _ := cli(t, cmd, dir+"/step-2")
		if nonced.ReplaceAllString(strings.ReplaceAll(s3Text, url, dir), "data-$1.bin") != dirText {
			t.Fatalf("%s on S3:\n%s\nin a directory:\n%s", cmd, s3Text, dirText)
		}
	}

	// export-safetensors and consolidate read the checkpoint at the URL and write the same local files.
	outS3, outDir := filepath.Join(t.TempDir(), "s3"), filepath.Join(t.TempDir(), "dir")
	for _, pair := range [][2]string{{url, outS3}, {dir, outDir}} {
		out, errOut, code := cli(t, "export-safetensors", "--max-shard-size", "16KiB", pair[0]+"/step-3", pair[1])
		wantCode(t, code, exitOK, out, errOut)
		out, errOut, code = cli(t, "consolidate", "--progress", "none", pair[0]+"/step-3", pair[1]+"/one.safetensors")
		wantCode(t, code, exitOK, out, errOut)
	}
	files, _ := filepath.Glob(filepath.Join(outDir, "*"))
	if len(files) < 3 {
		t.Fatalf("exported %v", files)
	}
	for _, f := range files {
		a, errA := os.ReadFile(filepath.Join(outS3, filepath.Base(f)))
		b, errB := os.ReadFile(f)
		if errA != nil || errB != nil || !bytes.Equal(a, b) {
			t.Fatalf("%s differs between the S3 and the directory export (%v, %v)", filepath.Base(f), errA, errB)
		}
	}
	tensors, meta := readSafetensors(t, filepath.Join(outS3, "one.safetensors"))
	if len(tensors) != len(fixtures.Standard) || meta["step"] != "3" {
		t.Fatalf("consolidated %d tensors, metadata %v", len(tensors), meta)
	}
	for _, e := range fixtures.Standard {
		if got := tensors[e.Name].Data; !bytes.Equal(got, fixtures.Encode(e.Name, e.DType, e.Shape, 3)) {
			t.Fatalf("%s: consolidated from S3, the bytes differ", e.Name)
		}
	}
}

func TestLsAndPruneOnAnS3URL(t *testing.T) {
	srv, url, dir := twinStores(t)
	srv.Put(t, url+"/notes/readme.txt", []byte("not a checkpoint"))
	srv.Put(t, url+"/step-1/README.txt", []byte("an operator's note"))
	// Started two seconds ago: in progress within the default grace, abandoned with none (markers have whole seconds).
	fixtures.ObjectStaging(t, srv.Put, url+"/step-4", "00000000000000e5", "some-other-host", 3, 2*time.Second, 100)

	var s3ls, dirls lsOut
	wantCode(t, cliJSON(t, &s3ls, "ls", url), exitOK, "", "")
	wantCode(t, cliJSON(t, &dirls, "ls", dir), exitOK, "", "")
	if len(s3ls.Checkpoints) != 4 || s3ls.Directory != url {
		t.Fatalf("ls %s: %+v", url, s3ls)
	}
	for i, c := range dirls.Checkpoints {
		s := s3ls.Checkpoints[i]
		if s.Name != c.Name || s.Status != c.Status || *s.Step != *c.Step || *s.Entries != *c.Entries ||
			*s.DataBytes != *c.DataBytes || s.Path != url+"/"+c.Name || s.Date != nil || s.Bytes == 0 {
			t.Fatalf("%s on S3: %+v\nin a directory: %+v", c.Name, s, c)
		}
	}
	if c := s3ls.Checkpoints[3]; c.Name != "step-4" || c.Status != statusStaging {
		t.Fatalf("step-4: %+v", c)
	}
	wantCode(t, cliJSON(t, &s3ls, "ls", "--all", url), exitOK, "", "")
	if len(s3ls.Checkpoints) != 5 || s3ls.Checkpoints[s3ls.byName(t, "notes")].Status != statusOther {
		t.Fatalf("ls --all: %+v", s3ls)
	}
	wantCode(t, cliJSON(t, &s3ls, "ls", url+"/step-2"), exitOK, "", "")
	if len(s3ls.Checkpoints) != 1 || s3ls.Checkpoints[0].Name != "step-2" {
		t.Fatalf("ls of a checkpoint: %+v", s3ls)
	}
	out, errOut, code := cli(t, "ls", url)
	wantCode(t, code, exitOK, out, errOut)
	if !strings.Contains(out, "step-3") || !strings.Contains(out, "1 save(s) in progress") {
		t.Fatalf("ls:\n%s", out)
	}

	before := fixtures.ObjectsBelow(t, url)
	var pr pruneOut
	wantCode(t, cliJSON(t, &pr, "prune", "--keep-last", "2", "--dry-run", url), exitOK, "", "")
	if got := fixtures.ObjectsBelow(t, url); !reflect.DeepEqual(got, before) || !pr.DryRun || pr.Order != "step" ||
		pr.action(t, "step-1") != "delete" || pr.action(t, "step-4") != "keep" || pr.FreedBytes == 0 {
		t.Fatalf("dry run: %+v\nbefore %v\nafter  %v", pr, before, got)
	}
	out, errOut, code = cli(t, "prune", "--keep-last", "2", url)
	wantCode(t, code, exitOK, out, errOut)
	left := strings.Join(fixtures.ObjectsBelow(t, url), " ")
	if strings.Contains(left, "step-1/metadata.dckpt") || !strings.Contains(left, "step-1/README.txt") ||
		!strings.Contains(left, "notes/readme.txt") || !strings.Contains(left, "step-4/STAGING.") ||
		!strings.Contains(left, "step-2/metadata.dckpt") || !strings.Contains(left, "step-3/metadata.dckpt") {
		t.Fatalf("after prune:\n%s\nprune said:\n%s", left, out)
	}
	// With no grace period the other host's save, started two seconds ago, is abandoned.
	wantCode(t, cliJSON(t, &pr, "prune", "--keep-last", "2", "--grace", "0", url), exitOK, "", "")
	if left := strings.Join(fixtures.ObjectsBelow(t, url), " "); strings.Contains(left, "step-4/") {
		t.Fatalf("after prune --grace 0: %s (%+v)", left, pr)
	}
}

func TestS3URLFailures(t *testing.T) {
	_, url, _ := twinStores(t)
	missing := url + "/step-9"
	out := t.TempDir()
	for _, args := range [][]string{
		{"ls", "s3://ckpts/nothing"}, {"inspect", missing}, {"verify", missing}, {"du", missing},
		{"diff", url + "/step-1", missing}, {"export-safetensors", missing, out},
		{"consolidate", missing, filepath.Join(out, "x.safetensors")}, {"prune", "--keep-last", "1", "s3://ckpts/nothing"},
	} {
		stdout, errOut, code := cli(t, args...)
		name := args[len(args)-1]
		if args[0] == "export-safetensors" || args[0] == "consolidate" {
			name = args[1]
		}
		if code != exitNotFound || !strings.Contains(errOut, name) {
			t.Errorf("%v: exit %d, want %d naming %s\nstdout: %s\nstderr: %s", args, code, exitNotFound, name, stdout,
				errOut)
		}
	}
	gs := "gs://ckpts/run/step-1"
	for _, args := range [][]string{
		{"ls", gs}, {"inspect", gs}, {"verify", gs}, {"du", gs}, {"diff", url + "/step-1", gs},
		{"export-safetensors", gs, out}, {"consolidate", gs, filepath.Join(out, "x.safetensors")},
		{"prune", "--keep-last", "1", "gs://ckpts/run"},
	} {
		stdout, errOut, code := cli(t, args...)
		if code != exitUsage || !strings.Contains(errOut, "gs") {
			t.Errorf("%v: exit %d, want %d naming the scheme\nstdout: %s\nstderr: %s", args, code, exitUsage, stdout,
				errOut)
		}
	}
	stdout, errOut, code := cli(t, "prune", "--keep-last", "1", url+"/step-2")
	if code != exitUsage || !strings.Contains(errOut, "is a checkpoint") {
		t.Fatalf("prune of a checkpoint URL: exit %d\n%s%s", code, stdout, errOut)
	}
	var doc map[string]json.RawMessage
	if code := cliJSON(t, &doc, "inspect", missing); code != exitNotFound || doc["error"] == nil {
		t.Fatalf("inspect --json of a missing URL: %d %s", code, doc)
	}
}
