// godigest prints one line per tensor of a checkpoint: name, dtype, shape and the FNV-1a 64 digest of its row-major
// bytes, read through the Go package. tests/crosslang compares its output with Rust's and Python's. On a read error
// it prints "ERROR <tensor>: <message>" and exits 1.
//
// With --values it prints what a Python save's non-array values look like from Go: "user KEY VALUE" for each user
// metadata pair and "value NAME GOTYPE JSON" (GOTYPE without spaces) for each bytes entry decoded by Reader.Value (re-encoded as JSON).
package main

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"sort"
	"strings"

	distckpt "distckpt.dev/go"
)

func main() {
	args := os.Args[1:]
	values := len(args) > 0 && args[0] == "--values"
	if values {
		args = args[1:]
	}
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: godigest [--values] CHECKPOINT")
		os.Exit(2)
	}
	r, err := distckpt.Open(args[0], nil)
	if err != nil {
		fmt.Printf("ERROR %s: %v\n", args[0], err)
		os.Exit(1)
	}
	defer r.Close()
	if values {
		os.Exit(printValues(r))
	}
	entries, err := r.Entries()
	if err != nil {
		fmt.Printf("ERROR %s: %v\n", args[0], err)
		os.Exit(1)
	}
	failed := false
	for _, e := range entries {
		if e.Kind != distckpt.TensorEntry {
			continue
		}
		data, err := r.Read(e.Name)
		if err != nil {
			fmt.Printf("ERROR %s: %v\n", e.Name, err)
			failed = true
			continue
		}
		h := fnv.New64a()
		h.Write(data)
		fmt.Printf("%s %s %v %016x\n", e.Name, e.DType, e.Shape, h.Sum64())
	}
	if failed {
		os.Exit(1)
	}
}

func printValues(r *distckpt.Reader) int {
	user, err := r.UserMetadata()
	if err != nil {
		fmt.Printf("ERROR user metadata: %v\n", err)
		return 1
	}
	keys := make([]string, 0, len(user))
	for k := range user {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Printf("user %s %s\n", k, user[k])
	}
	entries, err := r.Entries()
	if err != nil {
		fmt.Printf("ERROR entries: %v\n", err)
		return 1
	}
	rc := 0
	for _, e := range entries {
		if e.Kind != distckpt.BytesEntry {
			continue
		}
		v, err := r.Value(e.Name)
		if err == nil {
			var text []byte
			if text, err = json.Marshal(v); err == nil {
				fmt.Printf("value %s %s %s\n", e.Name, strings.ReplaceAll(fmt.Sprintf("%T", v), " ", ""), text)
				continue
			}
		}
		fmt.Printf("ERROR %s: %v\n", e.Name, err)
		rc = 1
	}
	return rc
}
