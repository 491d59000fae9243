package main

import (
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"distckpt.dev/go/internal/fixtures"
)

// The Go package has no checkpoint manager, so these tiers are laid out by hand as manager.h describes them, each
// part a real checkpoint written by the library with the user keys a manager gives its parts. (The C++ and Python
// tests look at tiers a real CheckpointManager wrote.)

// tierPartAt writes rank's part of step (of a world of ranks, written by run) into the tier.
func tierPartAt(t *testing.T, tier string, step, rank, ranks int, run string) string {
	t.Helper()
	path := filepath.Join(tier, stepName(step), partName(rank))
	fixtures.Write(t, path, fixtures.Options{Step: -1, Seed: float32(step), User: map[string]string{
		"dckpt.part": "rank=" + itoa(rank) + " ranks=" + itoa(ranks) + " step=" + itoa(step),
		"dckpt.run":  run,
	}})
	return path
}

func tierMarker(t *testing.T, tier string, step, rank int, run string) {
	t.Helper()
	fixtures.Must(t, os.WriteFile(filepath.Join(tier, stepName(step), "complete-"+pad(rank, 5)), []byte(run), 0o644))
}

func stepName(step int) string { return "step-" + pad(step, 10) }
func partName(rank int) string { return "part-" + pad(rank, 5) }

func pad(n, digits int) string {
	s := itoa(n)
	return strings.Repeat("0", digits-len(s)) + s
}

// exampleTier is a node of a 2-rank job (rank 0 here, rank 1's part replicated here) after a crash:
//   - step 1: both parts of run A, never marked: abandoned (run A marked step 2 since);
//   - step 2: both parts, marked by rank 0: complete and restorable from this node alone;
//   - step 3: rank 0's part, rank 1's replica still being received by a writer that has exited (abandoned), marked by
//     nobody: not abandoned (run A marked no newer step);
//   - a symbolic link named like a step, to a directory outside the tier.
func exampleTier(t *testing.T) (tier, outside, dead string) {
	t.Helper()
	tier = filepath.Join(t.TempDir(), "tier")
	for _, step := range []int{1, 2} {
		tierPartAt(t, tier, step, 0, 2, "run-a")
		tierPartAt(t, tier, step, 1, 2, "run-a")
	}
	tierMarker(t, tier, 2, 0, "run-a")
	tierPartAt(t, tier, 3, 0, 2, "run-a")
	dead = fixtures.Staging(t, filepath.Join(tier, stepName(3)), partName(1), "00000000000000bb", fixtures.Hostname(t),
		fixtures.DeadPID(t), time.Second)
	outside = filepath.Join(t.TempDir(), "outside")
	fixtures.Must(t, os.MkdirAll(outside, 0o755))
	fixtures.Must(t, os.WriteFile(filepath.Join(outside, "keep.txt"), []byte("not the manager's"), 0o644))
	fixtures.Must(t, os.Symlink(outside, filepath.Join(tier, stepName(9))))
	return tier, outside, dead
}

type tiersJSON struct {
	SchemaVersion int `json:"schema_version"`
	tierDoc
	Steps []struct {
		tierStep
		Markers []struct {
			Rank int
			Run  string
		}
	} `json:"steps"`
}

func TestTiersDescribesEachStepAndPart(t *testing.T) {
	tier, _, dead := exampleTier(t)
	var doc tiersJSON
	code := cliJSON(t, &doc, "tiers", tier)
	wantCode(t, code, exitOK, "", "")
	if doc.SchemaVersion != 1 || doc.Dir != tier || !reflect.DeepEqual(doc.Other, []string{stepName(9)}) {
		t.Fatalf("document: %+v", doc)
	}
	if len(doc.Steps) != 3 {
		t.Fatalf("steps: %+v", doc.Steps)
	}
	s1, s2, s3 := doc.Steps[0], doc.Steps[1], doc.Steps[2]
	if s1.Step != 1 || s1.Complete || !s1.Abandoned || s1.RestorableHere {
		t.Errorf("step 1: %+v", s1)
	}
	if s2.Step != 2 || !s2.Complete || s2.Abandoned || !s2.RestorableHere || s2.RestorableRun != "run-a" ||
		len(s2.Markers) != 1 || s2.Markers[0].Rank != 0 || s2.Markers[0].Run != "run-a" {
		t.Errorf("step 2: %+v", s2)
	}
	if s3.Step != 3 || s3.Complete || s3.Abandoned || s3.RestorableHere {
		t.Errorf("step 3: %+v", s3)
	}
	own, copy := s2.Parts[0], s2.Parts[1]
	if own.Name != "part-00000" || *own.Rank != 0 || own.Ranks != 2 || own.Run != "run-a" || own.State != "complete" ||
		own.Replica == nil || *own.Replica || own.Bytes < 4096 {
		t.Errorf("step 2's own part: %+v", own)
	}
	if copy.Name != "part-00001" || *copy.Rank != 1 || copy.Replica == nil || !*copy.Replica {
		t.Errorf("step 2's replica: %+v", copy)
	}
	staging := s3.Parts[1]
	if staging.Name != filepath.Base(dead) || *staging.Rank != 1 || staging.State != "abandoned" ||
		!strings.Contains(staging.Why, "has exited") || staging.Replica != nil || staging.Bytes < 8192 {
		t.Errorf("step 3's staging directory: %+v", staging)
	}

	// The table says the same.
	out, errOut, code := cli(t, "tiers", tier)
	wantCode(t, code, exitOK, out, errOut)
	for _, want := range []string{
		"step 1: not complete, abandoned\n",
		"step 2: complete, restorable from this node alone (run run-a)\n",
		"step 3: not complete\n",
		"  PART  ",
		"part-00001  1     2   copy",
		"abandoned: writer pid",
		"not the manager's (left alone): " + stepName(9) + "\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
}

func TestTiersDamagedParts(t *testing.T) {
	tier := filepath.Join(t.TempDir(), "tier")
	// Step 4: metadata that does not read. Step 5: step 6's part under step 5's name. Step 6: a link named like a
	// part. Each marked complete; beside step 4's part, a file the manager does not write.
	part := tierPartAt(t, tier, 4, 0, 1, "run-a")
	fixtures.Must(t, os.WriteFile(filepath.Join(part, "metadata.dckpt"), []byte("not flatbuffers"), 0o644))
	fixtures.Must(t, os.WriteFile(filepath.Join(tier, stepName(4), "notes.txt"), []byte("x"), 0o644))
	moved := tierPartAt(t, tier, 6, 0, 1, "run-a")
	fixtures.Must(t, os.MkdirAll(filepath.Join(tier, stepName(5)), 0o755))
	fixtures.Must(t, os.Rename(moved, filepath.Join(tier, stepName(5), partName(0))))
	fixtures.Must(t, os.Symlink(t.TempDir(), moved))
	for _, step := range []int{4, 5, 6} {
		tierMarker(t, tier, step, 0, "run-a")
	}

	var doc tiersJSON
	wantCode(t, cliJSON(t, &doc, "tiers", tier), exitOK, "", "")
	why := map[int]string{}
	for _, s := range doc.Steps {
		if len(s.Parts) != 1 || s.Parts[0].State != "damaged" || s.RestorableHere || s.Abandoned {
			t.Errorf("step %d: %+v", s.Step, s)
			continue
		}
		why[int(s.Step)] = s.Parts[0].Why
	}
	for step, want := range map[int]string{4: filepath.Join(stepName(4), partName(0)), 5: "part of step 6",
		6: "left alone"} {
		if !strings.Contains(why[step], want) {
			t.Errorf("step %d: why %q, want it to say %q", step, why[step], want)
		}
	}
	if !reflect.DeepEqual(doc.Other, []string{stepName(4) + "/notes.txt"}) {
		t.Errorf("other: %v", doc.Other)
	}
}

func TestTiersPruneAbandoned(t *testing.T) {
	tier, outside, dead := exampleTier(t)
	before := snapshotTree(t, filepath.Dir(outside))

	var dry struct {
		SchemaVersion int `json:"schema_version"`
		Dir           string
		DryRun        bool `json:"dry_run"`
		Removed       []string
	}
	wantCode(t, cliJSON(t, &dry, "tiers", "--prune-abandoned", "--dry-run", tier), exitOK, "", "")
	want := []string{filepath.Join(tier, stepName(1), partName(0)), filepath.Join(tier, stepName(1), partName(1)), dead}
	if !dry.DryRun || dry.Dir != tier || !reflect.DeepEqual(dry.Removed, want) {
		t.Fatalf("dry run: %+v, want removed %v", dry, want)
	}
	if _, err := os.Stat(dead); err != nil {
		t.Fatalf("the dry run removed %s", dead)
	}

	out, errOut, code := cli(t, "tiers", "--prune-abandoned", tier)
	wantCode(t, code, exitOK, out, errOut)
	for _, p := range want {
		if !strings.Contains(out, "removed "+p+"\n") {
			t.Errorf("not said: removed %s\n%s", p, out)
		}
	}
	var left []string
	fixtures.Must(t, filepath.Walk(tier, func(p string, info os.FileInfo, err error) error {
		if err == nil && p != tier {
			rel, _ := filepath.Rel(tier, p)
			if info.IsDir() && info.Mode()&os.ModeSymlink == 0 {
				rel += "/"
			}
			if !strings.Contains(rel, "/data-") && !strings.HasSuffix(rel, "/metadata.dckpt") {
				left = append(left, rel)
			}
		}
		return err
	}))
	sort.Strings(left)
	wantLeft := []string{stepName(2) + "/", stepName(2) + "/complete-00000", stepName(2) + "/part-00000/",
		stepName(2) + "/part-00001/", stepName(3) + "/", stepName(3) + "/part-00000/", stepName(9)}
	if !reflect.DeepEqual(left, wantLeft) {
		t.Errorf("left in the tier:\n%v\nwant\n%v", left, wantLeft)
	}
	if after := snapshotTree(t, filepath.Dir(outside)); !reflect.DeepEqual(before, after) {
		t.Errorf("the prune changed what the link points to: %v -> %v", before, after)
	}
	out, errOut, code = cli(t, "tiers", "--prune-abandoned", tier)
	wantCode(t, code, exitOK, out, errOut)
	if out != "nothing abandoned in "+tier+"\n" {
		t.Errorf("second prune: %q", out)
	}
}

// A staging directory whose writer is alive, and the steps beside it, stay.
func TestTiersPruneLeavesWhatIsInProgress(t *testing.T) {
	tier := filepath.Join(t.TempDir(), "tier")
	tierPartAt(t, tier, 7, 0, 1, "run-a")
	tierMarker(t, tier, 7, 0, "run-a")
	live := fixtures.Staging(t, filepath.Join(tier, stepName(5)), partName(0), "00000000000000aa", fixtures.Hostname(t),
		os.Getpid(), 2*time.Hour)
	elsewhere := fixtures.Staging(t, filepath.Join(tier, stepName(7)), partName(1), "00000000000000cc",
		"elsewhere.example", 77, time.Minute)
	var doc tiersJSON
	wantCode(t, cliJSON(t, &doc, "tiers", tier), exitOK, "", "")
	if len(doc.Steps) != 2 || doc.Steps[0].Abandoned || doc.Steps[0].Parts[0].State != "in progress" ||
		doc.Steps[1].Parts[1].State != "in progress" {
		t.Fatalf("document: %+v", doc)
	}
	out, errOut, code := cli(t, "tiers", "--prune-abandoned", tier)
	wantCode(t, code, exitOK, out, errOut)
	for _, p := range []string{live, elsewhere} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
}

func TestTiersRefusals(t *testing.T) {
	plain := t.TempDir()
	fixtures.Must(t, os.WriteFile(filepath.Join(plain, "notes.txt"), []byte("x"), 0o644))
	out, errOut, code := cli(t, "tiers", plain)
	wantCode(t, code, exitFailure, out, errOut)
	if !strings.Contains(errOut, "not a checkpoint manager's local tier") || !strings.Contains(errOut, plain) {
		t.Errorf("stderr: %s", errOut)
	}
	out, errOut, code = cli(t, "tiers", filepath.Join(plain, "missing"))
	wantCode(t, code, exitNotFound, out, errOut)
	out, errOut, code = cli(t, "tiers", "--dry-run", plain)
	wantCode(t, code, exitUsage, out, errOut)
	var e struct {
		Error jsonError
	}
	wantCode(t, cliJSON(t, &e, "tiers", "--prune-abandoned", plain), exitFailure, "", "")
	if !strings.Contains(e.Error.Message, "not a checkpoint manager's local tier") {
		t.Errorf("JSON error: %+v", e)
	}
	if _, err := os.Stat(filepath.Join(plain, "notes.txt")); err != nil {
		t.Errorf("the prune of what is not a tier touched it: %v", err)
	}
}

func TestLsOnATierPointsToTiers(t *testing.T) {
	tier, _, _ := exampleTier(t)
	out, errOut, code := cli(t, "ls", tier)
	wantCode(t, code, exitOK, out, errOut)
	want := "no checkpoints under " + tier + "\n" + tier + " is a checkpoint manager's local tier: see distckpt tiers " +
		tier + "\n"
	if out != want {
		t.Errorf("ls on a tier:\n%s\nwant\n%s", out, want)
	}
	// An empty directory is no tier: no pointer.
	empty := t.TempDir()
	out, _, _ = cli(t, "ls", empty)
	if strings.Contains(out, "tiers") {
		t.Errorf("ls on an empty directory: %s", out)
	}
}
