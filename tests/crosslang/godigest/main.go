// godigest prints one line per tensor of a checkpoint: name, dtype, shape and the FNV-1a 64 digest of its row-major
// bytes, read through the Go package. tests/crosslang compares its output with Rust's and Python's. On a read error
// it prints "ERROR <tensor>: <message>" and exits 1.
package main

import (
	"fmt"
	"hash/fnv"
	"os"

	distckpt "distckpt.dev/go"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: godigest CHECKPOINT")
		os.Exit(2)
	}
	r, err := distckpt.Open(os.Args[1], nil)
	if err != nil {
		fmt.Printf("ERROR %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	defer r.Close()
	entries, err := r.Entries()
	if err != nil {
		fmt.Printf("ERROR %s: %v\n", os.Args[1], err)
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
