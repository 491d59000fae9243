package main

import (
	"fmt"
	"time"

	distckpt "distckpt.dev/go"
)

var flattenCommand = &command{
	name:    "flatten",
	args:    "[--overwrite] [--json] CKPT DEST",
	summary: "write a self-contained copy of an incremental checkpoint (no bases needed to read it)",
	help: `
Writes DEST, a copy of CKPT that holds every chunk in data files of its own: the chunks CKPT refers to in its bases
(the checkpoints an incremental save made it read, shown by inspect) are read from there, checked against their
checksums and written. Committed atomically, as a save. DEST may be CKPT itself with --overwrite: CKPT then becomes
self-contained in place, and its bases can be pruned (refused, naming them, while other incremental checkpoints refer
to CKPT). A self-contained CKPT is simply copied. The library makes the copy (dckpt_flatten); a bad chunk stops it
with exit status 1 and no DEST.

JSON: {"schema_version": 1, "checkpoint": str, "out": str, "bytes_copied": int, "bytes_from_bases": int,
  "files": int, "seconds": float}`,
	run: runFlatten,
}

func runFlatten(c *ctx, args []string) int {
	fs := c.flags()
	overwrite := fs.Bool("overwrite", false, "replace an existing checkpoint at DEST (DEST may be CKPT)")
	pos, st := c.parse(fs, args, 2, 2)
	if st >= 0 {
		return st
	}
	start := time.Now()
	info, err := distckpt.Flatten(pos[0], pos[1], *overwrite, nil)
	if err != nil {
		return c.fail(err, pos[0], pos[1])
	}
	seconds := time.Since(start).Seconds()
	if c.json {
		c.writeJSON(struct {
			Checkpoint     string  `json:"checkpoint"`
			Out            string  `json:"out"`
			BytesCopied    uint64  `json:"bytes_copied"`
			BytesFromBases uint64  `json:"bytes_from_bases"`
			Files          int     `json:"files"`
			Seconds        float64 `json:"seconds"`
		}{pos[0], pos[1], info.BytesCopied, info.BytesFromBases, info.NumFiles, seconds})
		return exitOK
	}
	fmt.Fprintf(c.stdout, "%s -> %s: %s copied (%s of it from bases), %d data files, %.2f s\n", pos[0], pos[1],
		humanBytes(info.BytesCopied), humanBytes(info.BytesFromBases), info.NumFiles, seconds)
	return exitOK
}
