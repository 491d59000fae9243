// Command ckpt-operator is a small tool of an operator's own, built outside the distckpt repository from the
// distckpt Go package the way go/README.md ("Use it from your own module") says. It looks after a directory of
// checkpoints with the store API and checks what it finds against what it is told to expect:
//
//	ckpt-operator make DIR STEP...
//	    saves a small checkpoint DIR/step-STEP for each STEP, as a Python training script would: a tensor, the step
//	    as a JSON value entry "step", the user metadata "step", and Python's structure document
//	ckpt-operator check [--keep-last N] [--expect-steps S,S,...] [--expect-prune NAME,...] DIR
//	    lists DIR (store.List), verifies every committed checkpoint with progress (Reader.Verify), prints its step
//	    (user metadata, and the "step" value entry where there is one: they must agree), then plans a prune with
//	    --keep-last N as a dry run (store.Prune) and checks that it deleted nothing
//
// Exit status: 0 everything as expected; 1 a mismatch (a step, a listing status, a bad chunk, the prune plan);
// 2 a usage error or a failure to read DIR.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/store"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "make":
		os.Exit(makeStore(os.Args[2:]))
	case "check":
		os.Exit(check(os.Args[2:]))
	}
	usage()
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: ckpt-operator make DIR STEP... | check [--keep-last N] [--expect-steps S,...] "+
		"[--expect-prune NAME,...] DIR")
	os.Exit(2)
}

func makeStore(args []string) int {
	if len(args) < 2 {
		usage()
	}
	dir := args[0]
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	for _, s := range args[1:] {
		step, err := strconv.Atoi(s)
		if err != nil {
			usage()
		}
		st := distckpt.NewState()
		w := make([]byte, 256*1024*4) // a 256K-element F32 tensor
		for i := range w {
			w[i] = byte(i + step)
		}
		if err := st.AddTensorData("model.w", distckpt.F32, []uint64{512, 512}, w); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		if err := st.AddBytes("step", []byte(strconv.Itoa(step))); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		st.SetUser("step", strconv.Itoa(step))
		st.SetStructure([]byte(`{"distckpt_structure":1,"root":{"dict":[["model",{"dict":[["w",{"array":"model.w"}]]}],` +
			`["step",{"object":"step","encoding":"json"}]]}}`))
		path := filepath.Join(dir, fmt.Sprintf("step-%d", step))
		if _, err := distckpt.Save(path, st, nil); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		fmt.Printf("saved %s\n", path)
	}
	return 0
}

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func check(args []string) int {
	fs := flag.NewFlagSet("check", flag.ExitOnError)
	keepLast := fs.Int("keep-last", 2, "the prune policy's KeepLast")
	expectSteps := fs.String("expect-steps", "", "the steps of the committed checkpoints, in any order")
	expectPrune := fs.String("expect-prune", "", "the checkpoints a dry-run prune would delete, in any order")
	_ = fs.Parse(args)
	if fs.NArg() != 1 {
		usage()
	}
	dir := fs.Arg(0)
	mismatches := 0
	mismatch := func(format string, a ...any) {
		mismatches++
		fmt.Printf("MISMATCH: "+format+"\n", a...)
	}

	cks, err := store.List(dir, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var steps []string
	for _, c := range cks {
		if c.Status != store.Committed {
			mismatch("%s is %s, not committed", c.Name, c.Status)
			continue
		}
		fmt.Printf("%s: step %s, %d entries, %d bytes on disk\n", c.Name, c.StepRaw, c.Info.NumEntries, c.DiskBytes)
		steps = append(steps, c.StepRaw)

		r, err := distckpt.Open(c.Path, nil)
		if err != nil {
			mismatch("%v", err)
			continue
		}
		lastPct := -100
		res, err := r.Verify(&distckpt.VerifyOptions{Progress: func(done, total uint64) error {
			pct := 100
			if total > 0 {
				pct = int(done * 100 / total)
			}
			if pct/25 != lastPct/25 || done == total {
				fmt.Printf("  verifying %s: %d%%\n", c.Name, pct)
				lastPct = pct
			}
			return nil
		}})
		var verr *distckpt.VerifyError
		if errors.As(err, &verr) {
			for _, b := range verr.Bad {
				mismatch("%s: entry %s chunk %d: %v", c.Name, b.Entry, b.Chunk, b.Err)
			}
		} else if err != nil {
			mismatch("%s: %v", c.Name, err)
		} else {
			fmt.Printf("  %s: %d chunks, %d bytes intact\n", c.Name, res.Chunks, res.Bytes)
		}
		// A checkpoint saved from Python also holds the step as a JSON value entry.
		if _, err := r.Entry("step"); err == nil {
			v, err := r.Value("step")
			if n, ok := v.(json.Number); err != nil || !ok || n.String() != c.StepRaw {
				mismatch("%s: the \"step\" value is %v (%v), the user metadata says %s", c.Name, v, err, c.StepRaw)
			}
		}
		r.Close()
	}
	if want := splitList(*expectSteps); *expectSteps != "" && !sameSet(steps, want) {
		mismatch("steps %v, expected %v", steps, want)
	}

	res, err := store.Prune(dir, store.PrunePolicy{KeepLast: *keepLast, DryRun: true})
	if err != nil {
		mismatch("prune: %v", err)
	}
	var doomed []string
	for _, a := range res.Actions {
		fmt.Printf("prune --dry-run: %s %s (%s)\n", a.Action, a.Checkpoint.Name, a.Reason)
		if a.Action == store.Delete {
			doomed = append(doomed, a.Checkpoint.Name)
		}
		if a.Deleted {
			mismatch("a dry run deleted %s", a.Checkpoint.Name)
		}
	}
	if !sameSet(doomed, splitList(*expectPrune)) {
		mismatch("a prune would delete %v, expected %v", doomed, splitList(*expectPrune))
	}
	if after, err := store.List(dir, nil); err != nil || len(after) != len(cks) {
		mismatch("the dry run changed the store: %d listed before, %d after (%v)", len(cks), len(after), err)
	}
	if mismatches > 0 {
		fmt.Printf("%d mismatch(es)\n", mismatches)
		return 1
	}
	fmt.Println("all as expected")
	return 0
}

func sameSet(a, b []string) bool {
	a, b = append([]string(nil), a...), append([]string(nil), b...)
	sort.Strings(a)
	sort.Strings(b)
	return strings.Join(a, ",") == strings.Join(b, ",")
}
