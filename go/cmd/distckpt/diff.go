package main

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"

	distckpt "distckpt.dev/go"
)

var diffCommand = &command{
	name:    "diff",
	args:    "[--data | --no-data] [--json] A B",
	summary: "entries added, removed and changed (dtype, shape, data) between two checkpoints, and user metadata changes",
	help: `
Data are compared by their recorded chunk checksums when both checkpoints store the entry in the same chunks
(metadata only, no data read): an entry reported unchanged that way has the same recorded checksums, and a copy whose
data bytes were damaged or altered behind the library's back still has them (the output says how many entries were
judged so: "by_checksum"). --data reads the bytes of every entry from both checkpoints through the reader, verifying
their checksums, one chunk (in slabs of at most 64 MiB per side) at a time, and compares them: a chunk whose data
fail their checksum (or whose data file is missing) makes its entry differ, with "bad" saying on which side and why.
When the layouts differ (saved with another sharding or checksum block size), the data are read from both and
compared chunk by chunk, unless --no-data is given: then such entries are listed as "uncompared".
A or B may be a checkpoint another library wrote, read in place (a safetensors directory or file: see inspect). Its
format has no checksums, so its entries are always compared by reading the data of both sides (with --no-data they
are "uncompared"), and nothing read from it is verified. Its user metadata is the files' __metadata__ (safetensors'
"format": "pt" included), compared like a distckpt checkpoint's: a distckpt checkpoint and its export-safetensors
copy hold the same tensors but differ there, and in the bytes entries safetensors cannot hold ("removed").
Exit status: 0 the same (every compared entry and the user metadata), 1 they differ (or a chunk read to compare them
is bad); a checkpoint that cannot be opened gives the status of its failure (4 not found, 5 corrupt metadata, ...:
see "distckpt help").

JSON: {"schema_version": 1, "a": str, "b": str, "same": bool,
  "added": [ENTRY], "removed": [ENTRY],
  "changed": [{"name": str, "changes": ["kind"|"dtype"|"shape"|"data"], "a": ENTRY, "b": ENTRY,
               "compared": "checksum"|"data"|null, "differing_chunks": int|null,
               "bad": null | {"side": "a"|"b", "error": {"code": str, "message": str}}}],
  "uncompared": [str], "unchanged": int, "data_read": bool (--data), "by_checksum": int (unchanged entries judged by
  their recorded checksums only),
  "metadata": {"added": {str: str}, "removed": {str: str}, "changed": {str: {"a": str, "b": str}}}}
ENTRY is {"name", "kind", "dtype", "shape", "bytes", "chunks"} as in inspect.`,
	run: runDiff,
}

type changeJSON struct {
	Name            string    `json:"name"`
	Changes         []string  `json:"changes"`
	A               entryJSON `json:"a"`
	B               entryJSON `json:"b"`
	Compared        *string   `json:"compared"`
	DifferingChunks *int      `json:"differing_chunks"`
	Bad             *badData  `json:"bad"`
}

type valueChange struct {
	A string `json:"a"`
	B string `json:"b"`
}

type diffJSON struct {
	A          string       `json:"a"`
	B          string       `json:"b"`
	Same       bool         `json:"same"`
	Added      []entryJSON  `json:"added"`
	Removed    []entryJSON  `json:"removed"`
	Changed    []changeJSON `json:"changed"`
	Uncompared []string     `json:"uncompared"`
	Unchanged  int          `json:"unchanged"`
	DataRead   bool         `json:"data_read"`
	ByChecksum int          `json:"by_checksum"`
	Metadata   struct {
		Added   map[string]string      `json:"added"`
		Removed map[string]string      `json:"removed"`
		Changed map[string]valueChange `json:"changed"`
	} `json:"metadata"`
}

// How compareData compares the data of two entries of the same kind, dtype and shape.
type dataMode int

const (
	checksumsFirst dataMode = iota // recorded checksums where comparable, else read the data
	checksumsOnly                  // --no-data: never read; entries stored in different layouts stay uncompared
	readAlways                     // --data: read and compare the bytes of every entry, verifying their checksums
)

// regionLimit bounds the bytes diff --data holds per side: a chunk larger than this is read in slabs.
var regionLimit uint64 = 64 << 20

// badData is a chunk whose data could not be trusted while reading it (checksum mismatch, missing or truncated data
// file): the entry's data then count as differing, and the error says on which side and why.
type badData struct {
	Side  string     `json:"side"` // "a" or "b"
	Error *jsonError `json:"error"`
}

// compareData tells whether entry ea of a and eb of b (same kind, dtype and shape) hold the same bytes. By default it
// uses the recorded chunk checksums when both are comparable, else reads the data chunk by chunk (see dataMode).
// method is "checksum", "data" or "" (not compared). bad is the first chunk of either side whose data failed to
// read as damaged (only when reading); other read failures are returned as err.
func compareData(a, b *distckpt.Reader, ea, eb distckpt.Entry, mode dataMode) (method string, differing int,
	bad *badData, err error) {
	ca, err := a.Chunks(ea.Index)
	if err != nil {
		return "", 0, nil, err
	}
	cb, err := b.Chunks(eb.Index)
	if err != nil {
		return "", 0, nil, err
	}
	ia, err := a.Info()
	if err != nil {
		return "", 0, nil, err
	}
	ib, err := b.Info()
	if err != nil {
		return "", 0, nil, err
	}
	// A checkpoint another library wrote has no checksums (all 0): its data are only ever compared by reading them.
	checksummed := ia.Checksummed && ib.Checksummed
	if mode != readAlways && checksummed && checksumsComparable(ca, cb, ia.ChecksumBlockSize, ib.ChecksumBlockSize) {
		for i := range ca {
			if ca[i].Checksum != cb[i].Checksum {
				differing++
			}
		}
		return "checksum", differing, nil, nil
	}
	if mode == checksumsOnly {
		return "", 0, nil, nil
	}
	// damaged records a read failure that means bad data (dataExitStatus) and reports whether it was one.
	damaged := func(side string, err error) bool {
		if dataExitStatus(err) != exitFound {
			return false
		}
		if bad == nil {
			bad = &badData{Side: side, Error: errorJSON(err)}
		}
		return true
	}
	if ea.Kind == distckpt.BytesEntry {
		da, errA := a.Read(ea.Name)
		db, errB := b.Read(eb.Name)
		for _, r := range []struct {
			side string
			err  error
		}{{"a", errA}, {"b", errB}} {
			if r.err != nil && !damaged(r.side, r.err) {
				return "", 0, nil, r.err
			}
		}
		if bad != nil || !bytes.Equal(da, db) {
			differing = 1
		}
		return "data", differing, bad, nil
	}
	// One of A's chunks at a time, in slabs of at most regionLimit bytes, into two reused buffers: memory stays
	// bounded whatever the chunk sizes.
	var bufA, bufB []byte
	for _, ch := range ca {
		chunkDiffers := false
		for _, box := range slabs(ch.Offsets, ch.Lengths, uint64(ea.DType.Size()), regionLimit) {
			n := uint64(ea.DType.Size())
			for _, l := range box.lengths {
				n *= l
			}
			if uint64(cap(bufA)) < n {
				bufA, bufB = make([]byte, n), make([]byte, n)
			}
			da, db := bufA[:n], bufB[:n]
			errA := a.ReadInto(ea.Name, box.offsets, box.lengths, da)
			errB := b.ReadInto(eb.Name, box.offsets, box.lengths, db)
			badA := errA != nil && damaged("a", errA)
			badB := errB != nil && damaged("b", errB)
			if (errA != nil && !badA) || (errB != nil && !badB) {
				if errA != nil && !badA {
					return "", 0, nil, errA
				}
				return "", 0, nil, errB
			}
			if badA || badB || !bytes.Equal(da, db) {
				chunkDiffers = true
				break
			}
		}
		if chunkDiffers {
			differing++
		}
	}
	return "data", differing, bad, nil
}

type region struct{ offsets, lengths []uint64 }

// slabs splits the box [offsets, offsets+lengths) into row-major slabs of at most limit bytes each (a single element
// is never split, so a slab holds at least one).
func slabs(offsets, lengths []uint64, elem, limit uint64) []region {
	size := elem
	for _, l := range lengths {
		size *= l
	}
	if size <= limit || len(lengths) == 0 {
		return []region{{offsets, lengths}}
	}
	row := size / lengths[0] // the bytes of one step along the first dimension (size > 0: no length is 0)
	var out []region
	if row <= limit {
		step := limit / row
		for i := uint64(0); i < lengths[0]; i += step {
			n := step
			if lengths[0]-i < n {
				n = lengths[0] - i
			}
			o := append([]uint64{offsets[0] + i}, offsets[1:]...)
			l := append([]uint64{n}, lengths[1:]...)
			out = append(out, region{o, l})
		}
		return out
	}
	for i := uint64(0); i < lengths[0]; i++ {
		for _, sub := range slabs(offsets[1:], lengths[1:], elem, limit) {
			out = append(out, region{append([]uint64{offsets[0] + i}, sub.offsets...),
				append([]uint64{1}, sub.lengths...)})
		}
	}
	return out
}

// checksumsComparable: the same chunk boxes and lengths, and each chunk hashed the same way (one block in both, or
// the same block size).
func checksumsComparable(ca, cb []distckpt.Chunk, ba, bb uint64) bool {
	if len(ca) != len(cb) {
		return false
	}
	for i := range ca {
		if !reflect.DeepEqual(ca[i].Offsets, cb[i].Offsets) || !reflect.DeepEqual(ca[i].Lengths, cb[i].Lengths) ||
			ca[i].Length != cb[i].Length {
			return false
		}
		if ba != bb && (ca[i].Length > ba || ca[i].Length > bb) {
			return false
		}
	}
	return true
}

func openForDiff(path string) (*distckpt.Reader, map[string]distckpt.Entry, []distckpt.Entry, map[string]string, error) {
	r, err := distckpt.Open(path, nil)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	entries, err := r.Entries()
	if err != nil {
		r.Close()
		return nil, nil, nil, nil, err
	}
	user, err := r.UserMetadata()
	if err != nil {
		r.Close()
		return nil, nil, nil, nil, err
	}
	byName := map[string]distckpt.Entry{}
	for _, e := range entries {
		byName[e.Name] = e
	}
	return r, byName, entries, user, nil
}

func runDiff(c *ctx, args []string) int {
	fs := c.flags()
	noData := fs.Bool("no-data", false, "never read data; entries stored in different layouts are left uncompared")
	readData := fs.Bool("data", false, "read and compare the bytes of every entry (verifying their checksums), "+
		"not only the recorded checksums")
	pos, st := c.parse(fs, args, 2, 2)
	if st >= 0 {
		return st
	}
	mode := checksumsFirst
	switch {
	case *noData && *readData:
		return c.usageError("--data and --no-data exclude each other")
	case *noData:
		mode = checksumsOnly
	case *readData:
		mode = readAlways
	}
	ra, mapA, listA, userA, err := openForDiff(pos[0])
	if err != nil {
		return c.fail(err, pos[0])
	}
	defer ra.Close()
	rb, mapB, listB, userB, err := openForDiff(pos[1])
	if err != nil {
		return c.fail(err, pos[1])
	}
	defer rb.Close()

	out := diffJSON{A: pos[0], B: pos[1], DataRead: mode == readAlways, Added: []entryJSON{}, Removed: []entryJSON{},
		Changed: []changeJSON{}, Uncompared: []string{}}
	out.Metadata.Added, out.Metadata.Removed = map[string]string{}, map[string]string{}
	out.Metadata.Changed = map[string]valueChange{}
	for _, ea := range listA {
		eb, ok := mapB[ea.Name]
		if !ok {
			out.Removed = append(out.Removed, toEntryJSON(ea))
			continue
		}
		var changes []string
		if ea.Kind != eb.Kind {
			changes = append(changes, "kind")
		} else if ea.Kind == distckpt.TensorEntry {
			if ea.DType != eb.DType {
				changes = append(changes, "dtype")
			}
			if !reflect.DeepEqual(ea.Shape, eb.Shape) {
				changes = append(changes, "shape")
			}
		}
		ch := changeJSON{Name: ea.Name, A: toEntryJSON(ea), B: toEntryJSON(eb)}
		if len(changes) == 0 {
			method, differing, bad, err := compareData(ra, rb, ea, eb, mode)
			if err != nil {
				return c.failWith(dataExitStatus(err), err, pos[0], pos[1])
			}
			if method == "" {
				out.Uncompared = append(out.Uncompared, ea.Name)
				continue
			}
			if differing == 0 {
				out.Unchanged++
				if method == "checksum" {
					out.ByChecksum++
				}
				continue
			}
			changes = append(changes, "data")
			ch.Compared, ch.DifferingChunks, ch.Bad = &method, &differing, bad
		}
		ch.Changes = changes
		out.Changed = append(out.Changed, ch)
	}
	for _, eb := range listB {
		if _, ok := mapA[eb.Name]; !ok {
			out.Added = append(out.Added, toEntryJSON(eb))
		}
	}
	for k, va := range userA {
		if vb, ok := userB[k]; !ok {
			out.Metadata.Removed[k] = va
		} else if va != vb {
			out.Metadata.Changed[k] = valueChange{va, vb}
		}
	}
	for k, vb := range userB {
		if _, ok := userA[k]; !ok {
			out.Metadata.Added[k] = vb
		}
	}
	metaChanges := len(out.Metadata.Added) + len(out.Metadata.Removed) + len(out.Metadata.Changed)
	out.Same = len(out.Added)+len(out.Removed)+len(out.Changed)+metaChanges == 0
	status := exitOK
	if !out.Same {
		status = exitFound
	}
	if c.json {
		c.writeJSON(out)
		return status
	}

	fmt.Fprintf(c.stdout, "--- a: %s\n+++ b: %s\n", pos[0], pos[1])
	tw := newTable(c.stdout)
	for _, e := range out.Added {
		fmt.Fprintf(tw, "+ %s\t%s\tadded\n", e.Name, entrySummary(e))
	}
	for _, e := range out.Removed {
		fmt.Fprintf(tw, "- %s\t%s\tremoved\n", e.Name, entrySummary(e))
	}
	for _, ch := range out.Changed {
		var what []string
		for _, k := range ch.Changes {
			switch k {
			case "kind":
				what = append(what, fmt.Sprintf("kind %s -> %s", ch.A.Kind, ch.B.Kind))
			case "dtype":
				what = append(what, fmt.Sprintf("dtype %s -> %s", *ch.A.DType, *ch.B.DType))
			case "shape":
				what = append(what, fmt.Sprintf("shape %s -> %s", shapeString(ch.A.Shape), shapeString(ch.B.Shape)))
			case "data":
				what = append(what, fmt.Sprintf("data differs (%d of %d chunks, by %s)", *ch.DifferingChunks,
					ch.A.Chunks, *ch.Compared))
				if ch.Bad != nil {
					what = append(what, fmt.Sprintf("%s's data are damaged: %s", ch.Bad.Side, ch.Bad.Error.Message))
				}
			}
		}
		fmt.Fprintf(tw, "~ %s\t%s\t%s\n", ch.Name, entrySummary(ch.B), strings.Join(what, "; "))
	}
	for _, name := range out.Uncompared {
		fmt.Fprintf(tw, "? %s\t%s\tdata not compared (--no-data: stored in different layouts, or without checksums)\n", name,
			entrySummary(toEntryJSON(mapA[name])))
	}
	tw.Flush()
	for _, k := range sortedKeys(out.Metadata.Added) {
		fmt.Fprintf(c.stdout, "+ metadata %s = %q\n", k, out.Metadata.Added[k])
	}
	for _, k := range sortedKeys(out.Metadata.Removed) {
		fmt.Fprintf(c.stdout, "- metadata %s = %q\n", k, out.Metadata.Removed[k])
	}
	changedKeys := map[string]string{}
	for k := range out.Metadata.Changed {
		changedKeys[k] = ""
	}
	for _, k := range sortedKeys(changedKeys) {
		v := out.Metadata.Changed[k]
		fmt.Fprintf(c.stdout, "~ metadata %s: %q -> %q\n", k, v.A, v.B)
	}
	verdict := "differ"
	if out.Same {
		verdict = "same"
	}
	fmt.Fprintf(c.stdout, "%s: %d added, %d removed, %d changed, %d unchanged, %d uncompared; %s changed\n",
		verdict, len(out.Added), len(out.Removed), len(out.Changed), out.Unchanged, len(out.Uncompared),
		plural(metaChanges, "metadata key", "metadata keys"))
	if out.ByChecksum > 0 {
		// A copy whose data files were damaged, or changed behind the library's back, keeps its recorded checksums.
		fmt.Fprintf(c.stdout, "%s: same recorded checksums; data not read — use --data to compare the bytes\n",
			plural(out.ByChecksum, "unchanged entry", "unchanged entries"))
	}
	return status
}

func entrySummary(e entryJSON) string {
	if e.Kind == "bytes" {
		return fmt.Sprintf("bytes, %s", humanBytes(e.Bytes))
	}
	return fmt.Sprintf("%s %s, %s", *e.DType, shapeString(e.Shape), humanBytes(e.Bytes))
}
