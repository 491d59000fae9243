package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	distckpt "distckpt.dev/go"
)

var exportCommand = &command{
	name: "export-safetensors",
	args: "[--max-shard-size SIZE] [--prefix P] [--rename PATTERN=REPLACEMENT]... [--buffer-size SIZE] " +
		"[--io-threads N] [--no-verify] [--progress auto|bar|log|none] [--json] CKPT OUT",
	summary: "write the checkpoint's tensors as safetensors shards plus an index (via the C++ core's exporter)",
	help: `
Writes OUT/<P>-00001-of-0000N.safetensors ... and OUT/<P>.safetensors.index.json through the library's exporter
(dckpt_export_safetensors); OUT is created if missing and files of the same names are replaced. Bytes entries are
skipped; user metadata goes into each file's __metadata__. SIZE accepts 5GB (10^9), 512MiB (2^20) or a byte count;
the default is 5GB. Checksums are verified while reading unless --no-verify. --progress as in verify (bytes written).

--rename PATTERN=REPLACEMENT (repeatable, tried in order; split at the first '=', so write a '=' inside a pattern as
\x3d) renames tensors on the way out, in the core (capi/API.md, "Export to the Hugging Face hub"): PATTERN is an
ECMAScript regular expression that must match the whole name, REPLACEMENT literal text with \1..\9 or \g<N> for
groups; the first rule that matches decides, unmatched names are kept, and an empty REPLACEMENT leaves the tensors
out (e.g. --rename 'optimizer\..*='). Two tensors renamed to one name fail before anything is written (exit status
2 names both). --buffer-size SIZE bounds the tensor bytes held in memory (default 64MiB); --io-threads N writes N
files at once (default 1).
Exit status: 1 a chunk failed its checksum (or a data file is missing); otherwise as in "distckpt help".

JSON: {"schema_version": 1, "checkpoint": str, "out": str, "index": str (file name), "tensors": int, "seconds": float,
  "files": [{"name": str, "bytes": int}]}`,
	run: runExport,
}

func runExport(c *ctx, args []string) int {
	fs := c.flags()
	maxShard := fs.String("max-shard-size", "5GB", "largest .safetensors file, `SIZE`")
	prefix := fs.String("prefix", "model", "file name prefix `P`")
	noVerify := fs.Bool("no-verify", false, "do not check checksums while reading")
	var rename renameFlags
	fs.Var(&rename, "rename", "rename rule `PATTERN=REPLACEMENT` (repeatable)")
	bufferSize := fs.String("buffer-size", "", "tensor bytes held in memory at once, `SIZE` (default 64MiB)")
	ioThreads := fs.Int("io-threads", 0, "files written at once, `N` (default 1)")
	progress := c.progressFlags(fs)
	pos, st := c.parse(fs, args, 2, 2)
	if st >= 0 {
		return st
	}
	mode, err := progress()
	if err != nil {
		return c.usageError("%v", err)
	}
	shard, err := parseSize(*maxShard)
	if err != nil || shard == 0 {
		return c.usageError("--max-shard-size: invalid size %q", *maxShard)
	}
	var buffer uint64
	if *bufferSize != "" {
		if buffer, err = parseSize(*bufferSize); err != nil || buffer == 0 {
			return c.usageError("--buffer-size: invalid size %q", *bufferSize)
		}
	}
	if *ioThreads < 0 {
		return c.usageError("--io-threads must be >= 0")
	}
	if *prefix == "" || filepath.Base(*prefix) != *prefix {
		return c.usageError("--prefix must be a plain file name prefix")
	}
	ckpt, out := pos[0], pos[1]
	// Opened first, so that a failure of the metadata (exit status 4 to 7) is told from bad data met while exporting.
	r, err := distckpt.Open(ckpt, &distckpt.ReadOptions{NoVerify: true})
	if err != nil {
		return c.fail(err, ckpt)
	}
	r.Close()
	if err := os.MkdirAll(out, 0o755); err != nil {
		return c.fail(err, out)
	}
	rep := newProgress(mode, c.stderr, "exporting "+ckpt)
	start := time.Now()
	err = distckpt.ExportSafetensors(ckpt, out, &distckpt.ExportOptions{
		MaxShardBytes: shard, Prefix: *prefix, NoVerify: *noVerify, Progress: reportTo(rep),
		Rename: rename.rules, BufferBytes: buffer, IOThreads: *ioThreads,
	})
	if rep != nil {
		rep.finish()
	}
	if err != nil {
		// A rule the core refuses (bad pattern, two tensors renamed to one name) is a bad flag value.
		if len(rename.rules) > 0 && errors.Is(err, distckpt.ErrInvalid) && strings.Contains(err.Error(), "rename") {
			return c.usageError("--rename: %v", err)
		}
		return c.failWith(dataExitStatus(err), err, ckpt)
	}
	seconds := time.Since(start).Seconds()

	indexName := *prefix + ".safetensors.index.json"
	raw, err := os.ReadFile(filepath.Join(out, indexName))
	if err != nil {
		return c.failWith(exitFailure, fmt.Errorf("the exporter reported success but wrote no index: %w", err), out)
	}
	var index struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(raw, &index); err != nil {
		return c.failWith(exitFailure, fmt.Errorf("%s: %w", filepath.Join(out, indexName), err), out)
	}
	type fileJSON struct {
		Name  string `json:"name"`
		Bytes int64  `json:"bytes"`
	}
	seen := map[string]bool{}
	files := []fileJSON{}
	for _, f := range index.WeightMap {
		if seen[f] {
			continue
		}
		seen[f] = true
		st, err := os.Stat(filepath.Join(out, f))
		if err != nil {
			return c.failWith(exitFailure, fmt.Errorf("%s lists %s: %w", filepath.Join(out, indexName), f, err), out)
		}
		files = append(files, fileJSON{f, st.Size()})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	if c.json {
		c.writeJSON(struct {
			Checkpoint string     `json:"checkpoint"`
			Out        string     `json:"out"`
			Index      string     `json:"index"`
			Tensors    int        `json:"tensors"`
			Seconds    float64    `json:"seconds"`
			Files      []fileJSON `json:"files"`
		}{ckpt, out, indexName, len(index.WeightMap), seconds, files})
		return exitOK
	}
	var total int64
	for _, f := range files {
		fmt.Fprintf(c.stdout, "%s  %s\n", filepath.Join(out, f.Name), humanBytes(uint64(f.Bytes)))
		total += f.Bytes
	}
	fmt.Fprintf(c.stdout, "%s\nexported %d tensors into %d files (%s) in %.2fs\n", filepath.Join(out, indexName),
		len(index.WeightMap), len(files), humanBytes(uint64(total)), seconds)
	return exitOK
}

// renameFlags collects repeated --rename PATTERN=REPLACEMENT flags, split at the first '='; the core checks the rules.
type renameFlags struct{ rules []distckpt.RenameRule }

func (r *renameFlags) String() string { return "" }

func (r *renameFlags) Set(s string) error {
	i := strings.IndexByte(s, '=')
	if i < 0 {
		return fmt.Errorf("%q: expected PATTERN=REPLACEMENT (an empty REPLACEMENT leaves the tensors out)", s)
	}
	r.rules = append(r.rules, distckpt.RenameRule{Pattern: s[:i], Replacement: s[i+1:]})
	return nil
}
