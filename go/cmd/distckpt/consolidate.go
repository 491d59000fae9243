package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	distckpt "distckpt.dev/go"
)

var consolidateCommand = &command{
	name: "consolidate",
	args: "[--format safetensors] [--overwrite] [--no-verify] [--progress auto|bar|log|none] [--json] " +
		"CKPT OUT.safetensors",
	summary: "write the whole checkpoint's tensors as ONE safetensors file (via the C++ core's exporter)",
	help: `
Writes every tensor of CKPT, however many ranks saved it, into the single file OUT (which must end in .safetensors),
for tools that load one file. It is the exporter of export-safetensors with no shard size limit: tensors stream
through the core's fixed buffer, so memory stays bounded whatever the checkpoint's size. The file is written into a
temporary directory beside OUT and renamed onto OUT only when complete; an existing OUT is replaced only with
--overwrite. Bytes entries (values that are not tensors) have no place in safetensors and are left out (listed in
"skipped"). User metadata goes into the file's __metadata__. A torch.save file: "python -m distckpt consolidate"
(--format torch is a usage error here); --format safetensors, as there, also lets OUT have another suffix.
Exit status as in export-safetensors.

JSON: {"schema_version": 1, "checkpoint": str, "out": str, "format": "safetensors", "tensors": int,
  "skipped": [str], "bytes": int (OUT's size), "seconds": float}`,
	run: runConsolidate,
}

// singleShard is larger than any checkpoint: the exporter then writes one file.
const singleShard = uint64(1) << 62

func runConsolidate(c *ctx, args []string) int {
	fs := c.flags()
	format := fs.String("format", "", "`safetensors` (the only format here; default: from OUT's suffix)")
	overwrite := fs.Bool("overwrite", false, "replace an existing OUT")
	noVerify := fs.Bool("no-verify", false, "do not check checksums while reading")
	progress := c.progressFlags(fs)
	pos, st := c.parse(fs, args, 2, 2)
	if st >= 0 {
		return st
	}
	mode, err := progress()
	if err != nil {
		return c.usageError("%v", err)
	}
	ckpt, out := pos[0], pos[1]
	switch *format {
	case "", "safetensors":
	case "torch":
		return c.usageError("--format torch: this CLI writes safetensors only; use python -m distckpt consolidate")
	default:
		return c.usageError("--format must be safetensors (or, in python -m distckpt, torch), not %q", *format)
	}
	if *format == "" && !strings.HasSuffix(strings.ToLower(out), ".safetensors") {
		return c.usageError("OUT %q must end in .safetensors (for a torch.save file use python -m distckpt consolidate)", out)
	}
	// Opened first, so that a failure of the metadata (exit status 4 to 7) is told from bad data met while exporting.
	r, err := distckpt.Open(ckpt, &distckpt.ReadOptions{NoVerify: true})
	if err != nil {
		return c.fail(err, ckpt)
	}
	entries, err := r.Entries()
	r.Close()
	if err != nil {
		return c.fail(err, ckpt)
	}
	tensors, skipped := 0, []string{}
	for _, e := range entries {
		if e.Kind == distckpt.TensorEntry {
			tensors++
		} else {
			skipped = append(skipped, e.Name)
		}
	}
	if st, err := os.Lstat(out); err == nil {
		if st.IsDir() {
			return c.failWith(exitFailure, fmt.Errorf("%s is a directory; name the file to write", out), out)
		}
		if !*overwrite {
			return c.failWith(exitFailure, fmt.Errorf("%s already exists (--overwrite replaces it)", out), out)
		}
	}
	parent := filepath.Dir(out)
	// The exporter names its files itself: it writes into a private directory beside OUT (the same file system),
	// whose one file is then renamed onto OUT.
	work, err := os.MkdirTemp(parent, "."+filepath.Base(out)+".*.tmp")
	if err != nil {
		return c.fail(err, parent)
	}
	defer os.RemoveAll(work)

	rep := newProgress(mode, c.stderr, "consolidating "+ckpt)
	start := time.Now()
	err = distckpt.ExportSafetensors(ckpt, work, &distckpt.ExportOptions{
		MaxShardBytes: singleShard, Prefix: "model", NoVerify: *noVerify, Progress: reportTo(rep),
	})
	if rep != nil {
		rep.finish()
	}
	if err != nil {
		return c.failWith(dataExitStatus(err), err, ckpt)
	}
	single := filepath.Join(work, "model-00001-of-00001.safetensors")
	if err := publish(single, out); err != nil {
		return c.failWith(exitStatus(err), err, out)
	}
	seconds := time.Since(start).Seconds()
	info, err := os.Stat(out)
	if err != nil {
		return c.fail(err, out)
	}
	if c.json {
		c.writeJSON(struct {
			Checkpoint string   `json:"checkpoint"`
			Out        string   `json:"out"`
			Format     string   `json:"format"`
			Tensors    int      `json:"tensors"`
			Skipped    []string `json:"skipped"`
			Bytes      int64    `json:"bytes"`
			Seconds    float64  `json:"seconds"`
		}{ckpt, out, "safetensors", tensors, skipped, info.Size(), seconds})
		return exitOK
	}
	fmt.Fprintf(c.stdout, "%s  %s\nconsolidated %d tensors into one file in %.2fs\n", out,
		humanBytes(uint64(info.Size())), tensors, seconds)
	if len(skipped) > 0 {
		fmt.Fprintf(c.stdout, "left out %d values that are not tensors: %s\n", len(skipped), strings.Join(skipped, ", "))
	}
	return exitOK
}

// publish makes the finished file src durable and renames it onto dst, then makes the rename durable.
func publish(src, dst string) error {
	f, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("the exporter reported success but wrote no single file: %w", err)
	}
	err = f.Sync()
	f.Close()
	if err != nil {
		return err
	}
	if err := os.Rename(src, dst); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(dst)); err == nil {
		d.Sync() // some file systems cannot sync a directory; the rename has happened either way
		d.Close()
	}
	return nil
}
