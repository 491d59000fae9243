package main

import (
	"errors"
	"fmt"
	"time"

	distckpt "distckpt.dev/go"
)

var verifyCommand = &command{
	name:    "verify",
	args:    "[--workers N] [--progress auto|bar|log|none] [--json] CKPT",
	summary: "re-hash every chunk in parallel and name each bad one; exit status 1 on any bad chunk",
	help: `
Reads every chunk of CKPT and checks its XXH3-64 checksums, N chunks at a time, and reports every chunk that fails
(not only the first) with its entry, chunk index, data file and file offset. Progress counts bytes, within large
chunks too: --progress=auto (the default) draws a bar on stderr when it is a terminal, bar always draws it, log prints
a plain line to stderr every 10% or 5 seconds (for CI logs), none (or --no-progress) prints nothing.
Exit status: 0 intact; 1 bad chunks (checksum mismatch, truncated or missing data file); 4 not found (or not
committed); 5 corrupt metadata; 6 unsupported format version; 7 permission denied; 3 another failure, and also:
CKPT is a checkpoint another library wrote (a safetensors directory or file, a PyTorch DCP directory), which the
library reads in place but whose format carries no checksums, so there is nothing to verify: verify checks nothing,
says so ("NOT VERIFIED: ...", error code "unsupported", "checksummed": false), and exits 3: it is neither intact
(0) nor damaged (1). A script tells this case from other failures by --json's "checksummed": false. Opening it
checked its structure (every tensor inside its file, of the size its shape needs).

JSON: {"schema_version": 1, "path": str, "ok": bool, "chunks": int (checked), "bytes": int
  (checked), "seconds": float, "format": "distckpt"|"safetensors"|"torch-dcp"|null (null: CKPT did not open),
  "checksummed": bool|null,
  "bad": [{"entry": str, "chunk": int, "file": str, "file_offset": int, "length": int,
           "code": str, "message": str}],
  "error": {"code": str, "message": str}|null (metadata or other failure before any chunk was checked)}`,
	run: runVerify,
}

type badJSON struct {
	Entry      string `json:"entry"`
	Chunk      int    `json:"chunk"`
	File       string `json:"file"`
	FileOffset uint64 `json:"file_offset"`
	Length     uint64 `json:"length"`
	Code       string `json:"code"`
	Message    string `json:"message"`
}

type verifyJSON struct {
	Path        string           `json:"path"`
	OK          bool             `json:"ok"`
	Chunks      int              `json:"chunks"`
	Bytes       uint64           `json:"bytes"`
	Seconds     float64          `json:"seconds"`
	Format      *distckpt.Format `json:"format"`
	Checksummed *bool            `json:"checksummed"`
	Bad         []badJSON        `json:"bad"`
	Error       *jsonError       `json:"error"`
}

func runVerify(c *ctx, args []string) int {
	fs := c.flags()
	workers := fs.Int("workers", 0, "check `N` chunks at once (0: max(4, CPUs))")
	progress := c.progressFlags(fs)
	pos, st := c.parse(fs, args, 1, 1)
	if st >= 0 {
		return st
	}
	if *workers < 0 {
		return c.usageError("--workers must be >= 0")
	}
	mode, err := progress()
	if err != nil {
		return c.usageError("%v", err)
	}
	path := pos[0]
	out := verifyJSON{Path: path, Bad: []badJSON{}}
	start := time.Now()
	r, err := distckpt.Open(path, nil)
	if err != nil {
		status := argStatus(err, path)
		out.Error = c.report(err, path)
		if c.json {
			c.writeJSON(out)
		} else if status == exitCorrupt || status == exitVersion {
			fmt.Fprintf(c.stdout, "FAILED: %s: the metadata cannot be read\n", path)
		}
		return status
	}
	defer r.Close()
	info, err := r.Info()
	if err != nil {
		out.Error = c.report(err, path)
		if c.json {
			c.writeJSON(out)
		}
		return exitStatus(err)
	}
	out.Format, out.Checksummed = &info.Format, &info.Checksummed
	if !info.Checksummed {
		// A checkpoint another library wrote: the library's own message (ErrUnsupported) says there is nothing to
		// check. Not intact, not damaged: exit 3 (see the help).
		_, err := r.Verify(nil)
		if err == nil {
			err = fmt.Errorf("checkpoint '%s' (%s) carries no checksums", path, info.Format)
		}
		out.Error, out.Seconds = c.report(err, path), time.Since(start).Seconds()
		if c.json {
			c.writeJSON(out)
		} else {
			fmt.Fprintf(c.stdout, "NOT VERIFIED: %s: a %s checkpoint, whose format carries no checksums: nothing "+
				"to verify\n", path, formatName(info.Format))
		}
		return exitFailure
	}

	rep := newProgress(mode, c.stderr, "verifying "+path)
	res, err := r.Verify(&distckpt.VerifyOptions{Workers: *workers, Progress: reportTo(rep)})
	if rep != nil {
		rep.finish()
	}
	out.Chunks, out.Bytes, out.Seconds = res.Chunks, res.Bytes, time.Since(start).Seconds()
	for _, b := range res.Bad {
		j := badJSON{Entry: b.Entry, Chunk: b.Chunk, File: b.File, FileOffset: b.FileOffset, Length: b.Length}
		if e := errorJSON(b.Err); e != nil {
			j.Code, j.Message = e.Code, e.Message
		}
		out.Bad = append(out.Bad, j)
	}
	var verr *distckpt.VerifyError
	if err != nil && !errors.As(err, &verr) {
		out.Error = c.report(err, path)
		if c.json {
			c.writeJSON(out)
		}
		return exitStatus(err)
	}
	out.OK = len(out.Bad) == 0
	if c.json {
		c.writeJSON(out)
	} else {
		for _, b := range out.Bad {
			fmt.Fprintf(c.stdout, "BAD %s chunk %d: file %s offset %d length %d: %s: %s\n", b.Entry, b.Chunk, b.File,
				b.FileOffset, b.Length, b.Code, b.Message)
		}
		if out.OK {
			fmt.Fprintf(c.stdout, "OK: %s: %d chunks, %s verified in %.2fs\n", path, out.Chunks, humanBytes(out.Bytes),
				out.Seconds)
		} else {
			fmt.Fprintf(c.stdout, "FAILED: %s: %d of %d chunks are bad (%s checked in %.2fs)\n", path, len(out.Bad),
				out.Chunks, humanBytes(out.Bytes), out.Seconds)
		}
	}
	if out.OK {
		return exitOK
	}
	// Damaged data first; a chunk that could not be read for another reason (permissions, I/O) gives its own status.
	status := exitFailure
	for i, b := range res.Bad {
		s := dataExitStatus(b.Err)
		if s == exitFound {
			return exitFound
		}
		if i == 0 {
			status = s
		}
	}
	return status
}
