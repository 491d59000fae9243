package main

import (
	"fmt"
	"strings"

	distckpt "distckpt.dev/go"
)

var inspectCommand = &command{
	name:    "inspect",
	aliases: []string{"info"}, // python -m distckpt's name
	args:    "[--layout NAME] [--json] CKPT",
	summary: "show a checkpoint's entries (dtype, shape, bytes, chunks) and user metadata",
	help: `
--layout NAME also shows which chunk of entry NAME covers which box of the tensor ([start:end) per dimension) and
where it is stored (data file, offset, length, checksum).

"info" is another name for inspect (python -m distckpt's); both CLIs print the same JSON (docs/cli.md).

JSON: {"schema_version": 1, "path": str, "format_major": int, "format_minor": int, "writer": str, "num_entries": int,
  "num_files": int, "total_bytes": int, "metadata_bytes": int, "checksum_block_size": int,
  "user": {str: str},
  "entries": [{"name": str, "kind": "tensor"|"bytes", "dtype": str|null, "shape": [int]|null, "bytes": int,
               "chunks": int}],
  "layout": null | {"name": str, "chunks": [{"index": int, "offsets": [int], "lengths": [int], "file": str,
               "file_offset": int, "length": int, "checksum": str (16 hex digits)}]}}`,
	run: runInspect,
}

type entryJSON struct {
	Name   string   `json:"name"`
	Kind   string   `json:"kind"`
	DType  *string  `json:"dtype"`
	Shape  []uint64 `json:"shape"`
	Bytes  uint64   `json:"bytes"`
	Chunks int      `json:"chunks"`
}

func toEntryJSON(e distckpt.Entry) entryJSON {
	j := entryJSON{Name: e.Name, Kind: e.Kind.String(), Bytes: e.NBytes, Chunks: e.NumChunks}
	if e.Kind == distckpt.TensorEntry {
		d := e.DType.String()
		j.DType, j.Shape = &d, e.Shape
	}
	return j
}

type chunkJSON struct {
	Index      int      `json:"index"`
	Offsets    []uint64 `json:"offsets"`
	Lengths    []uint64 `json:"lengths"`
	File       string   `json:"file"`
	FileOffset uint64   `json:"file_offset"`
	Length     uint64   `json:"length"`
	Checksum   string   `json:"checksum"`
}

// describe is "F32 [64, 32]" for a tensor and "bytes" for a bytes entry.
func describe(e distckpt.Entry) (dtype, shape string) {
	if e.Kind == distckpt.BytesEntry {
		return "-", "bytes"
	}
	return e.DType.String(), shapeString(e.Shape)
}

func runInspect(c *ctx, args []string) int {
	fs := c.flags()
	layout := fs.String("layout", "", "show the chunk layout of entry `NAME`")
	pos, st := c.parse(fs, args, 1, 1)
	if st >= 0 {
		return st
	}
	r, err := distckpt.Open(pos[0], &distckpt.ReadOptions{NoVerify: true})
	if err != nil {
		return c.fail(err, pos[0])
	}
	defer r.Close()
	info, err := r.Info()
	if err != nil {
		return c.fail(err, pos[0])
	}
	entries, err := r.Entries()
	if err != nil {
		return c.fail(err, pos[0])
	}
	user, err := r.UserMetadata()
	if err != nil {
		return c.fail(err, pos[0])
	}
	var chunks []distckpt.Chunk
	var laid distckpt.Entry
	if *layout != "" {
		if laid, err = r.Entry(*layout); err != nil {
			return c.fail(err, pos[0])
		}
		if chunks, err = r.Chunks(laid.Index); err != nil {
			return c.fail(err, pos[0])
		}
	}

	if c.json {
		type layoutJSON struct {
			Name   string      `json:"name"`
			Chunks []chunkJSON `json:"chunks"`
		}
		out := struct {
			Path string `json:"path"`
			distckpt.Info
			User    map[string]string `json:"user"`
			Entries []entryJSON       `json:"entries"`
			Layout  *layoutJSON       `json:"layout"`
		}{Path: pos[0], Info: info, User: user, Entries: []entryJSON{}}
		for _, e := range entries {
			out.Entries = append(out.Entries, toEntryJSON(e))
		}
		if *layout != "" {
			out.Layout = &layoutJSON{Name: laid.Name, Chunks: []chunkJSON{}}
			for _, ch := range chunks {
				out.Layout.Chunks = append(out.Layout.Chunks, chunkJSON{ch.Index, ch.Offsets, ch.Lengths, ch.File,
					ch.FileOffset, ch.Length, fmt.Sprintf("%016x", ch.Checksum)})
			}
		}
		c.writeJSON(out)
		return exitOK
	}

	tensors := 0
	for _, e := range entries {
		if e.Kind == distckpt.TensorEntry {
			tensors++
		}
	}
	fmt.Fprintf(c.stdout, "checkpoint  %s\n", pos[0])
	fmt.Fprintf(c.stdout, "format      %d.%d, written by %s\n", info.FormatMajor, info.FormatMinor, info.Writer)
	fmt.Fprintf(c.stdout, "contents    %s (%s, %s) in %s: %s data, %s metadata\n",
		plural(info.NumEntries, "entry", "entries"), plural(tensors, "tensor", "tensors"),
		plural(info.NumEntries-tensors, "bytes entry", "bytes entries"), plural(info.NumFiles, "data file", "data files"),
		humanBytes(info.TotalBytes), humanBytes(info.MetadataBytes))
	fmt.Fprintf(c.stdout, "checksums   XXH3-64 per %s block\n", humanBytes(info.ChecksumBlockSize))
	if len(user) > 0 {
		var kv []string
		for _, k := range sortedKeys(user) {
			kv = append(kv, fmt.Sprintf("%s=%s", k, user[k]))
		}
		fmt.Fprintf(c.stdout, "user        %s\n", strings.Join(kv, " "))
	}
	fmt.Fprintln(c.stdout)
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "NAME\tDTYPE\tSHAPE\tBYTES\tCHUNKS")
	for _, e := range entries {
		dtype, shape := describe(e)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", e.Name, dtype, shape, humanBytes(e.NBytes), e.NumChunks)
	}
	tw.Flush()
	if *layout != "" {
		dtype, shape := describe(laid)
		fmt.Fprintf(c.stdout, "\nlayout of %s (%s %s, %s in %d chunks)\n", laid.Name, dtype, shape, humanBytes(laid.NBytes),
			laid.NumChunks)
		tw := newTable(c.stdout)
		fmt.Fprintln(tw, "CHUNK\tBOX\tFILE\tOFFSET\tLENGTH\tCHECKSUM")
		for _, ch := range chunks {
			box := boxString(ch.Offsets, ch.Lengths)
			if laid.Kind == distckpt.BytesEntry {
				box = "-"
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%016x\n", ch.Index, box, ch.File, ch.FileOffset, ch.Length, ch.Checksum)
		}
		tw.Flush()
	}
	return exitOK
}
