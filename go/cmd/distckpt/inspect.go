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
where it is stored (data file, offset, length, checksum; a compressed chunk also its codec and stored length).

A checkpoint saved with compression (format 3.0) has a "compressed" line: how many chunks are stored compressed,
what the data takes in the data files, and that as a share of the data bytes.

"info" is another name for inspect (python -m distckpt's); both CLIs print the same JSON (docs/cli.md).

CKPT may also be a checkpoint another library wrote, which the library reads in place (` + foreignFormatsHelp + `).
The "format" line says which, and that it has no checksums; its chunks are where the files hold the tensors (any
offset), with checksum "-" in --layout. User values longer than 100 characters are cut in the text output, with
their size; --json gives them whole.

In JSON, "format" is "distckpt", "safetensors" or "torch-dcp"; "format_version" the version that format records
of itself ("1.2" for distckpt, "2.0" for an incremental checkpoint, "3.0" for one with compressed chunks; a DCP
.metadata's "1.0.0"; null where it records none: safetensors, older DCP); "format_major" and "format_minor" are
distckpt's format version, null for a checkpoint another library wrote. Such a checkpoint's "writer" is the library
("safetensors", "torch.distributed.checkpoint") and its checksums are 0. "stored_bytes" is "total_bytes" less what
compression saved; a chunk's "stored_length" is what it takes in its file ("length" when its "codec" is "none").

JSON: {"schema_version": 1, "path": str, "format": str, "format_version": str|null, "format_major": int|null,
  "format_minor": int|null, "writer": str, "num_entries": int,
  "num_files": int, "total_bytes": int, "metadata_bytes": int, "checksum_block_size": int,
  "bases": [str], "chain_length": int, "bytes_in_bases": int,
  "stored_bytes": int (what the chunks take in data files), "compressed_chunks": int,
  "user": {str: str},
  "entries": [{"name": str, "kind": "tensor"|"bytes", "dtype": str|null, "shape": [int]|null, "bytes": int,
               "chunks": int}],
  "layout": null | {"name": str, "chunks": [{"index": int, "offsets": [int], "lengths": [int], "file": str,
               "file_offset": int, "length": int, "checksum": str (16 hex digits), "base": str,
               "codec": "none"|"zstd", "stored_length": int}]}}`,
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
	Index        int      `json:"index"`
	Offsets      []uint64 `json:"offsets"`
	Lengths      []uint64 `json:"lengths"`
	File         string   `json:"file"`
	FileOffset   uint64   `json:"file_offset"`
	Length       uint64   `json:"length"`
	Checksum     string   `json:"checksum"`
	Base         string   `json:"base"`          // "" for the checkpoint's own file; else the base checkpoint it lies in
	Codec        string   `json:"codec"`         // "none" (raw) or "zstd"
	StoredLength uint64   `json:"stored_length"` // bytes it takes in its file (Length when raw)
}

// formatName is how the text output names a checkpoint's format: "safetensors", "PyTorch DCP", or the library's name
// for a format newer than this CLI.
func formatName(f distckpt.Format) string {
	switch f {
	case distckpt.FormatTorchDCP:
		return "PyTorch DCP"
	case "":
		return string(distckpt.FormatDistckpt)
	}
	return string(f)
}

// formatVersion is inspect's "format_version": distckpt's MAJOR.MINOR, or the version a foreign format records of
// itself ("" where it records none).
func formatVersion(info distckpt.Info) string {
	if info.Format.Foreign() {
		return info.SourceVersion
	}
	return fmt.Sprintf("%d.%d", info.FormatMajor, info.FormatMinor)
}

// longValue is the most of a user value inspect's text output shows (--json shows it whole).
const longValue = 100

// summarise is a user value as inspect's text shows it: whole if short, else its first longValue characters and
// its size (python -m distckpt inspect has the same rule).
func summarise(v string) string {
	runes := []rune(v)
	if len(runes) <= longValue {
		return v
	}
	return fmt.Sprintf("%s… (%d bytes; --json for all)", string(runes[:longValue]), len(v))
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
		// The fields docs/cli.md gives, in its order: python -m distckpt prints the same document (not all of
		// distckpt.Info, which has grown fields that document does not have).
		out := struct {
			Path              string            `json:"path"`
			Format            distckpt.Format   `json:"format"`
			FormatVersion     *string           `json:"format_version"`
			FormatMajor       *int              `json:"format_major"`
			FormatMinor       *int              `json:"format_minor"`
			Writer            string            `json:"writer"`
			NumEntries        int               `json:"num_entries"`
			NumFiles          int               `json:"num_files"`
			TotalBytes        uint64            `json:"total_bytes"`
			MetadataBytes     uint64            `json:"metadata_bytes"`
			ChecksumBlockSize uint64            `json:"checksum_block_size"`
			Bases             []string          `json:"bases"`
			ChainLength       int               `json:"chain_length"`
			BytesInBases      uint64            `json:"bytes_in_bases"`
			StoredBytes       uint64            `json:"stored_bytes"`
			CompressedChunks  int               `json:"compressed_chunks"`
			User              map[string]string `json:"user"`
			Entries           []entryJSON       `json:"entries"`
			Layout            *layoutJSON       `json:"layout"`
		}{Path: pos[0], Format: info.Format, FormatVersion: strOrNil(formatVersion(info)), Writer: info.Writer,
			NumEntries: info.NumEntries, NumFiles: info.NumFiles, TotalBytes: info.TotalBytes,
			MetadataBytes: info.MetadataBytes, ChecksumBlockSize: info.ChecksumBlockSize, Bases: info.Bases,
			ChainLength: info.ChainLength, BytesInBases: info.BytesInBases, StoredBytes: info.StoredBytes,
			CompressedChunks: info.CompressedChunks, User: user, Entries: []entryJSON{}}
		if out.Bases == nil {
			out.Bases = []string{}
		}
		if !info.Format.Foreign() { // distckpt's own format version: a foreign format has none
			out.FormatMajor, out.FormatMinor = &info.FormatMajor, &info.FormatMinor
		}
		for _, e := range entries {
			out.Entries = append(out.Entries, toEntryJSON(e))
		}
		if *layout != "" {
			out.Layout = &layoutJSON{Name: laid.Name, Chunks: []chunkJSON{}}
			for _, ch := range chunks {
				out.Layout.Chunks = append(out.Layout.Chunks, chunkJSON{ch.Index, ch.Offsets, ch.Lengths, ch.File,
					ch.FileOffset, ch.Length, fmt.Sprintf("%016x", ch.Checksum), ch.Base, ch.Codec, ch.StoredLength})
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
	if info.Format.Foreign() {
		version := ""
		if info.SourceVersion != "" {
			version = " " + info.SourceVersion
		}
		fmt.Fprintf(c.stdout, "format      %s%s (written by another library, read in place)\n", formatName(info.Format),
			version)
		fmt.Fprintf(c.stdout, "contents    %s in %s: %s data\n", plural(tensors, "tensor", "tensors"),
			plural(info.NumFiles, "data file", "data files"), humanBytes(info.TotalBytes))
	} else {
		fmt.Fprintf(c.stdout, "format      %d.%d, written by %s\n", info.FormatMajor, info.FormatMinor, info.Writer)
		fmt.Fprintf(c.stdout, "contents    %s (%s, %s) in %s: %s data, %s metadata\n",
			plural(info.NumEntries, "entry", "entries"), plural(tensors, "tensor", "tensors"),
			plural(info.NumEntries-tensors, "bytes entry", "bytes entries"),
			plural(info.NumFiles, "data file", "data files"), humanBytes(info.TotalBytes), humanBytes(info.MetadataBytes))
	}
	if info.CompressedChunks > 0 {
		data := info.TotalBytes
		if data == 0 {
			data = 1
		}
		fmt.Fprintf(c.stdout, "compressed  %s; %s stored (%.2f of the data)\n",
			plural(info.CompressedChunks, "chunk", "chunks"), humanBytes(info.StoredBytes),
			float64(info.StoredBytes)/float64(data))
	}
	if len(info.Bases) > 0 {
		fmt.Fprintf(c.stdout, "bases       %s (incremental: %s of the data lies there; %s since the last self-contained save)\n",
			strings.Join(info.Bases, ", "), humanBytes(info.BytesInBases), plural(info.ChainLength, "save", "saves"))
	}
	if info.Checksummed {
		fmt.Fprintf(c.stdout, "checksums   XXH3-64 per %s block\n", humanBytes(info.ChecksumBlockSize))
	} else {
		fmt.Fprintf(c.stdout, "checksums   none: the %s format carries none, so its bytes cannot be verified\n",
			formatName(info.Format))
	}
	if len(user) > 0 {
		var kv []string
		for _, k := range sortedKeys(user) {
			kv = append(kv, fmt.Sprintf("%s=%s", k, summarise(user[k])))
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
			sum := fmt.Sprintf("%016x", ch.Checksum)
			if !info.Checksummed {
				sum = "-"
			}
			file := ch.File
			if ch.Base != "" {
				file = "../" + ch.Base + "/" + ch.File
			}
			if ch.Codec != distckpt.CompressionNone.String() { // as python -m distckpt inspect shows it
				sum += fmt.Sprintf("  %s, %d B stored", ch.Codec, ch.StoredLength)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\n", ch.Index, box, file, ch.FileOffset, ch.Length, sum)
		}
		tw.Flush()
	}
	return exitOK
}
