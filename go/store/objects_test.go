package store

import (
	"errors"
	"io/fs"
	"strconv"
	"strings"
	"testing"
	"time"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
	"distckpt.dev/go/internal/mototest"
)

// Nonces of the hand-made leftovers below (16 hex digits, as the library's).
const (
	nonceRunning   = "00000000000000a1"
	nonceAbandoned = "00000000000000b2"
	nonceBeside    = "00000000000000c3"
	nonceDeadPID   = "00000000000000d4"
)

// newBucketStore makes, below s3://ckpts/run, committed checkpoints step-100..300, and beside them what other writers
// and tools leave:
//   - step-400: a save in progress (a writer on another host, started a minute ago);
//   - step-500: an abandoned save (another host, started two hours ago);
//   - step-600: a save whose writer was a process of this host that has exited (started just now);
//   - step-300: the files of an abandoned overwrite beside the committed checkpoint;
//   - notes/readme.txt and step-100/README.txt: objects distckpt did not write.
func newBucketStore(t *testing.T) (*mototest.Server, string) {
	t.Helper()
	srv := mototest.Start(t)
	srv.CreateBucket(t, "ckpts")
	url := "s3://ckpts/run"
	for _, s := range []int{100, 200, 300} {
		fixtures.Write(t, url+"/step-"+strconv.Itoa(s), fixtures.Options{Step: s, Seed: float32(s)})
	}
	fixtures.ObjectStaging(t, srv.Put, url+"/step-400", nonceRunning, "some-other-host", 12, time.Minute, 1000)
	fixtures.ObjectStaging(t, srv.Put, url+"/step-500", nonceAbandoned, "some-other-host", 12, 2*time.Hour, 2000)
	fixtures.ObjectStaging(t, srv.Put, url+"/step-600", nonceDeadPID, fixtures.Hostname(t), fixtures.DeadPID(t), 0,
		3000)
	fixtures.ObjectStaging(t, srv.Put, url+"/step-300", nonceBeside, "some-other-host", 12, 2*time.Hour, 4000)
	srv.Put(t, url+"/notes/readme.txt", []byte("not a checkpoint"))
	srv.Put(t, url+"/step-100/README.txt", []byte("a note an operator left"))
	return srv, url
}

func TestListAndStatBelowAURL(t *testing.T) {
	_, url := newBucketStore(t)
	cks, err := List(url+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range cks {
		names = append(names, c.Name+":"+string(c.Status))
	}
	want := "step-100:committed step-200:committed step-300:committed step-400:incomplete step-500:incomplete " +
		"step-600:incomplete"
	if got := strings.Join(names, " "); got != want {
		t.Fatalf("listed %s\nwant     %s", got, want)
	}
	c := byName(t, cks, "step-200")
	if c.Step == nil || *c.Step != 200 || c.Info == nil || c.Info.NumEntries != len(fixtures.Standard)+1 ||
		c.Objects == nil || c.DiskBytes == 0 || c.DiskBytes != c.Objects.Bytes || c.Path != url+"/step-200" ||
		!c.Date.IsZero() || c.User["framework"] != "fixtures" {
		t.Fatalf("step-200: %+v", c)
	}
	if o := byName(t, cks, "step-300").Objects; o.LeftoverFiles == 0 || o.LeftoverBytes < 4000 || o.SavesInProgress != 0 {
		t.Fatalf("step-300's leftovers: %+v", o)
	}
	if o := byName(t, cks, "step-400").Objects; o.SavesInProgress != 1 {
		t.Fatalf("step-400: %+v", o)
	}
	if o := byName(t, cks, "step-500").Objects; o.SavesInProgress != 0 || o.LeftoverFiles == 0 {
		t.Fatalf("step-500: %+v", o)
	}

	all, err := List(url, &ListOptions{All: true})
	if err != nil || len(all) != len(cks)+1 || byName(t, all, "notes").Status != NotACheckpoint {
		t.Fatalf("List All: %+v, %v", all, err)
	}
	one, err := List(url+"/step-300", nil)
	if err != nil || len(one) != 1 || one[0].Name != "step-300" || one[0].Status != Committed {
		t.Fatalf("List of a checkpoint URL: %+v, %v", one, err)
	}
	st, err := Stat(url + "/step-400")
	if err != nil || st.Status != Incomplete || st.FinalName != "step-400" {
		t.Fatalf("Stat(step-400): %+v, %v", st, err)
	}
	if st, err := Stat(url + "/notes"); err != nil || st.Status != NotACheckpoint {
		t.Fatalf("Stat(notes): %+v, %v", st, err)
	}
	for _, missing := range []string{url + "/step-9", "s3://ckpts/nothing"} {
		if _, err := Stat(missing); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
			t.Fatalf("Stat(%s): %v", missing, err)
		}
		if _, err := List(missing, nil); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("List(%s): %v", missing, err)
		}
	}
	if _, err := List("gs://ckpts/run", nil); !errors.Is(err, distckpt.ErrUnsupported) {
		t.Fatalf("List of a gs:// URL: %v", err)
	}
}

func TestPruneBelowAURLKeepsWhatADirectoryKeeps(t *testing.T) {
	_, url := newBucketStore(t)
	before := fixtures.ObjectsBelow(t, url)

	// A dry run plans and removes nothing.
	res, err := Prune(url, PrunePolicy{KeepLast: 2, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := fixtures.ObjectsBelow(t, url); strings.Join(got, " ") != strings.Join(before, " ") {
		t.Fatalf("a dry run removed:\nbefore %v\nafter  %v", before, got)
	}
	if res.Order != ByStep || res.Grace != DefaultGrace || res.FreedBytes == 0 {
		t.Fatalf("dry run: %+v", res)
	}
	plan := map[string]string{}
	for _, a := range res.Actions {
		if a.Deleted {
			t.Fatalf("a dry run says it deleted %s", a.Checkpoint.Name)
		}
		plan[a.Checkpoint.Name+"/"+string(a.Checkpoint.Status)] += string(a.Action)
	}
	want := map[string]string{
		"step-100/committed":  "delete",
		"step-200/committed":  "keep",
		"step-300/committed":  "keep",
		"step-300/incomplete": "delete", // the abandoned overwrite's files beside the kept checkpoint
		"step-400/incomplete": "keep",   // in progress, within the grace period
		"step-500/incomplete": "delete",
		"step-600/incomplete": "delete", // its writer, of this host, has exited
	}
	if len(plan) != len(want) {
		t.Fatalf("plan %v\nwant %v", plan, want)
	}
	for k, v := range want {
		if plan[k] != v {
			t.Fatalf("plan %v\nwant %v", plan, want)
		}
	}

	// A longer grace period keeps the abandoned save of two hours ago too.
	res, err = Prune(url, PrunePolicy{KeepLast: 2, DryRun: true, Grace: 3 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if a := actionOf(t, res, "step-500"); a.Action != Keep {
		t.Fatalf("step-500 with a 3h grace period: %+v", a)
	}

	res, err = Prune(url, PrunePolicy{KeepLast: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range res.Actions {
		if (a.Action == Delete) != a.Deleted {
			t.Fatalf("%s: %s, deleted %v (%v)", a.Checkpoint.Name, a.Action, a.Deleted, a.Err)
		}
	}
	got := strings.Join(fixtures.ObjectsBelow(t, url), " ")
	for _, kept := range []string{"notes/readme.txt", "step-100/README.txt", "step-200/metadata.dckpt",
		"step-300/metadata.dckpt", "step-400/STAGING." + nonceRunning, "step-400/data-00000." + nonceRunning + ".bin"} {
		if !strings.Contains(got, kept) {
			t.Errorf("%s was removed; left: %s", kept, got)
		}
	}
	for _, gone := range []string{"step-100/metadata.dckpt", "step-100/data-", "step-500/", "step-600/",
		nonceBeside} {
		if strings.Contains(got, gone) {
			t.Errorf("%s is still there; left: %s", gone, got)
		}
	}
	// What was kept still opens, and every value reads back.
	for _, s := range []int{200, 300} {
		r, err := distckpt.Open(url+"/step-"+strconv.Itoa(s), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Verify(nil); err != nil {
			t.Fatal(err)
		}
		r.Close()
	}
	cks, err := List(url, nil)
	if err != nil || len(cks) != 3 || cks[2].Name != "step-400" {
		t.Fatalf("after prune: %+v, %v", cks, err)
	}

	// The prefix of a checkpoint is not a store.
	if _, err := Prune(url+"/step-300", PrunePolicy{KeepLast: 1}); !errors.Is(err, distckpt.ErrInvalid) {
		t.Fatalf("Prune of a checkpoint URL: %v", err)
	}
}

func TestPruneBelowAURLOrdersByNameWithoutSteps(t *testing.T) {
	srv := mototest.Start(t)
	srv.CreateBucket(t, "bkt")
	for _, n := range []string{"ckpt-10", "ckpt-9", "ckpt-100"} {
		fixtures.Write(t, "s3://bkt/x/"+n, fixtures.Options{Step: -1})
	}
	res, err := Prune("s3://bkt/x", PrunePolicy{KeepLast: 1, Grace: NoGrace})
	if err != nil {
		t.Fatal(err)
	}
	if res.Order != ByName || !actionOf(t, res, "ckpt-9").Deleted || !actionOf(t, res, "ckpt-10").Deleted ||
		actionOf(t, res, "ckpt-100").Action != Keep {
		t.Fatalf("%+v", res)
	}
	if got := strings.Join(fixtures.ObjectsBelow(t, "s3://bkt/x"), " "); !strings.HasPrefix(got, "ckpt-100/") ||
		strings.Contains(got, "ckpt-9/") {
		t.Fatalf("left %s", got)
	}
}
