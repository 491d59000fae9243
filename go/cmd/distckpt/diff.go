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
	args:    "[--no-data] [--json] A B",
	summary: "entries added, removed and changed (dtype, shape, data) between two checkpoints, and user metadata changes",
	help: `
Data are compared by chunk checksum when both checkpoints store the entry in the same chunks (metadata only, no
data read). When the layouts differ (saved with another sharding or checksum block size), the data are read from
both and compared chunk by chunk, unless --no-data is given: then such entries are listed as "uncompared".
Exit status: 0 the same (every compared entry and the user metadata), 1 they differ (or a chunk read to compare them
is bad); a checkpoint that cannot be opened gives the status of its failure (4 not found, 5 corrupt metadata, ...:
see "distckpt help").

JSON: {"schema_version": 1, "a": str, "b": str, "same": bool,
  "added": [ENTRY], "removed": [ENTRY],
  "changed": [{"name": str, "changes": ["kind"|"dtype"|"shape"|"data"], "a": ENTRY, "b": ENTRY,
               "compared": "checksum"|"data"|null, "differing_chunks": int|null}],
  "uncompared": [str], "unchanged": int,
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
	Metadata   struct {
		Added   map[string]string      `json:"added"`
		Removed map[string]string      `json:"removed"`
		Changed map[string]valueChange `json:"changed"`
	} `json:"metadata"`
}

// compareData tells whether entry ea of a and eb of b (same kind, dtype and shape) hold the same bytes. It uses the
// chunk checksums when both are comparable, else reads the data chunk by chunk unless readData is false.
// method is "checksum", "data" or "" (not compared).
func compareData(a, b *distckpt.Reader, ea, eb distckpt.Entry, readData bool) (method string, differing int, err error) {
	ca, err := a.Chunks(ea.Index)
	if err != nil {
		return "", 0, err
	}
	cb, err := b.Chunks(eb.Index)
	if err != nil {
		return "", 0, err
	}
	ia, err := a.Info()
	if err != nil {
		return "", 0, err
	}
	ib, err := b.Info()
	if err != nil {
		return "", 0, err
	}
	if checksumsComparable(ca, cb, ia.ChecksumBlockSize, ib.ChecksumBlockSize) {
		for i := range ca {
			if ca[i].Checksum != cb[i].Checksum {
				differing++
			}
		}
		return "checksum", differing, nil
	}
	if !readData {
		return "", 0, nil
	}
	if ea.Kind == distckpt.BytesEntry {
		da, err := a.Read(ea.Name)
		if err != nil {
			return "", 0, err
		}
		db, err := b.Read(eb.Name)
		if err != nil {
			return "", 0, err
		}
		if !bytes.Equal(da, db) {
			differing = 1
		}
		return "data", differing, nil
	}
	// One of A's chunks at a time: memory stays bounded by the largest chunk.
	for _, ch := range ca {
		da, err := a.ReadRegion(ea.Name, ch.Offsets, ch.Lengths)
		if err != nil {
			return "", 0, err
		}
		db, err := b.ReadRegion(eb.Name, ch.Offsets, ch.Lengths)
		if err != nil {
			return "", 0, err
		}
		if !bytes.Equal(da, db) {
			differing++
		}
	}
	return "data", differing, nil
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
	pos, st := c.parse(fs, args, 2, 2)
	if st >= 0 {
		return st
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

	out := diffJSON{A: pos[0], B: pos[1], Added: []entryJSON{}, Removed: []entryJSON{}, Changed: []changeJSON{},
		Uncompared: []string{}}
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
			method, differing, err := compareData(ra, rb, ea, eb, !*noData)
			if err != nil {
				return c.failWith(dataExitStatus(err), err, pos[0], pos[1])
			}
			if method == "" {
				out.Uncompared = append(out.Uncompared, ea.Name)
				continue
			}
			if differing == 0 {
				out.Unchanged++
				continue
			}
			changes = append(changes, "data")
			ch.Compared, ch.DifferingChunks = &method, &differing
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
			}
		}
		fmt.Fprintf(tw, "~ %s\t%s\t%s\n", ch.Name, entrySummary(ch.B), strings.Join(what, "; "))
	}
	for _, name := range out.Uncompared {
		fmt.Fprintf(tw, "? %s\t%s\tstored in different layouts; data not compared (--no-data)\n", name,
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
	return status
}

func entrySummary(e entryJSON) string {
	if e.Kind == "bytes" {
		return fmt.Sprintf("bytes, %s", humanBytes(e.Bytes))
	}
	return fmt.Sprintf("%s %s, %s", *e.DType, shapeString(e.Shape), humanBytes(e.Bytes))
}
