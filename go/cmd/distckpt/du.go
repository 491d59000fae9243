package main

import (
	"fmt"
	"sort"
	"strings"

	distckpt "distckpt.dev/go"
)

var duCommand = &command{
	name:    "du",
	args:    "[--depth N] [--sep S] [--json] CKPT",
	summary: "bytes of a checkpoint by entry-name prefix (model.layers.* versus optim.*)",
	help: `
Groups the entries by the first 1..N components of their names (split at S, default "."), as a tree: with the
default depth 2, "model.*" and under it "model.layers.*" and "model.embed". A group named "P.*" holds every entry
whose name starts with "P."; a group without ".*" is a single entry. Bytes are the entries' stored data bytes. For an
incremental checkpoint, IN BASES is how many of them lie in the data files of its bases (the checkpoints it refers
to) rather than its own: the bytes it owns are the rest. For a checkpoint with compressed chunks (format 3.0),
STORED is what they take in the data files, and a last line gives the whole checkpoint's stored size as a share of
its data bytes; "stored_bytes" in JSON (equal to the bytes when nothing is compressed).

JSON: {"schema_version": 1, "path": str, "total_bytes": int, "entries": int, "bases": [str],
  "bytes_owned": int, "bytes_in_bases": int, "stored_bytes": int, "compressed_chunks": int,
  "groups": [{"prefix": str, "depth": int, "entries": int, "bytes": int, "percent": float, "bytes_in_bases": int,
              "stored_bytes": int}]}
Groups come in tree order: each group is followed by its sub-groups, largest first.`,
	run: runDu,
}

type duGroup struct {
	Prefix  string  `json:"prefix"`
	Depth   int     `json:"depth"`
	Entries int     `json:"entries"`
	Bytes   uint64  `json:"bytes"`
	Percent float64 `json:"percent"`
	InBases uint64  `json:"bytes_in_bases"`
	Stored  uint64  `json:"stored_bytes"`
	key     string
	parent  string
}

// duGroups sums entry bytes per name prefix, up to depth components, in tree order (largest first at each level).
// inBases gives, per entry name, its bytes that lie in base checkpoints (nil: none do); stored, what its chunks take
// in data files (nil: its bytes, nothing being compressed).
func duGroups(entries []distckpt.Entry, depth int, sep string, inBases, stored map[string]uint64) ([]*duGroup,
	uint64) {
	groups := map[string]*duGroup{}
	var total uint64
	for _, e := range entries {
		total += e.NBytes
		parts := strings.Split(e.Name, sep)
		for d := 1; d <= depth && d <= len(parts); d++ {
			key := strings.Join(parts[:d], sep)
			leaf := d == len(parts)
			prefix := key
			if !leaf {
				prefix = key + sep + "*"
			}
			id := prefix // a leaf "a.b" and a group "a.b.*" are different rows
			g := groups[id]
			if g == nil {
				parent := ""
				if d > 1 {
					parent = strings.Join(parts[:d-1], sep) + sep + "*"
				}
				g = &duGroup{Prefix: prefix, Depth: d, key: id, parent: parent}
				groups[id] = g
			}
			g.Entries++
			g.Bytes += e.NBytes
			g.InBases += inBases[e.Name]
			if stored != nil {
				g.Stored += stored[e.Name]
			} else {
				g.Stored += e.NBytes
			}
		}
	}
	children := map[string][]*duGroup{}
	for _, g := range groups {
		if total > 0 {
			g.Percent = float64(g.Bytes) * 100 / float64(total)
		}
		children[g.parent] = append(children[g.parent], g)
	}
	var out []*duGroup
	var walk func(parent string)
	walk = func(parent string) {
		kids := children[parent]
		sort.Slice(kids, func(i, j int) bool {
			if kids[i].Bytes != kids[j].Bytes {
				return kids[i].Bytes > kids[j].Bytes
			}
			return kids[i].Prefix < kids[j].Prefix
		})
		for _, k := range kids {
			out = append(out, k)
			walk(k.key)
		}
	}
	walk("")
	return out, total
}

func runDu(c *ctx, args []string) int {
	fs := c.flags()
	depth := fs.Int("depth", 2, "group by up to `N` name components")
	sep := fs.String("sep", ".", "name component separator `S`")
	pos, st := c.parse(fs, args, 1, 1)
	if st >= 0 {
		return st
	}
	if *depth < 1 {
		return c.usageError("--depth must be >= 1")
	}
	if *sep == "" {
		return c.usageError("--sep must not be empty")
	}
	r, err := distckpt.Open(pos[0], &distckpt.ReadOptions{NoVerify: true})
	if err != nil {
		return c.fail(err, pos[0])
	}
	defer r.Close()
	entries, err := r.Entries()
	if err != nil {
		return c.fail(err, pos[0])
	}
	info, err := r.Info()
	if err != nil {
		return c.fail(err, pos[0])
	}
	var inBases, stored map[string]uint64
	incremental, compressed := len(info.Bases) > 0, info.CompressedChunks > 0
	if incremental || compressed {
		inBases, stored = map[string]uint64{}, map[string]uint64{}
		for _, e := range entries {
			chunks, err := r.Chunks(e.Index)
			if err != nil {
				return c.fail(err, pos[0])
			}
			for _, ch := range chunks {
				if ch.Base != "" {
					inBases[e.Name] += ch.Length
				}
				stored[e.Name] += ch.StoredLength
			}
		}
	}
	groups, total := duGroups(entries, *depth, *sep, inBases, stored)
	if c.json {
		out := struct {
			Path         string     `json:"path"`
			TotalBytes   uint64     `json:"total_bytes"`
			Entries      int        `json:"entries"`
			Bases        []string   `json:"bases"`
			BytesOwned   uint64     `json:"bytes_owned"`
			BytesInBases uint64     `json:"bytes_in_bases"`
			StoredBytes  uint64     `json:"stored_bytes"`
			Compressed   int        `json:"compressed_chunks"`
			Groups       []*duGroup `json:"groups"`
		}{pos[0], total, len(entries), info.Bases, total - info.BytesInBases, info.BytesInBases, info.StoredBytes,
			info.CompressedChunks, groups}
		if out.Groups == nil {
			out.Groups = []*duGroup{}
		}
		if out.Bases == nil {
			out.Bases = []string{}
		}
		c.writeJSON(out)
		return exitOK
	}
	tw := newTable(c.stdout)
	header := "BYTES\tSHARE\t"
	if compressed {
		header += "STORED\t"
	}
	if incremental {
		header += "IN BASES\t"
	}
	fmt.Fprintln(tw, header+"ENTRIES\tPREFIX")
	row := func(bytes uint64, percent float64, st, in uint64, n int, label string) {
		line := fmt.Sprintf("%s\t%5.1f%%\t", humanBytes(bytes), percent)
		if compressed {
			line += humanBytes(st) + "\t"
		}
		if incremental {
			line += humanBytes(in) + "\t"
		}
		fmt.Fprintf(tw, "%s%d\t%s\n", line, n, label)
	}
	for _, g := range groups {
		row(g.Bytes, g.Percent, g.Stored, g.InBases, g.Entries, strings.Repeat("  ", g.Depth-1)+g.Prefix)
	}
	row(total, 100.0, info.StoredBytes, info.BytesInBases, len(entries), "(total)")
	tw.Flush()
	if compressed {
		data := total
		if data == 0 {
			data = 1
		}
		fmt.Fprintf(c.stdout, "%s stored (%.2f of the data; %s compressed)\n", humanBytes(info.StoredBytes),
			float64(info.StoredBytes)/float64(data), plural(info.CompressedChunks, "chunk", "chunks"))
	}
	if incremental {
		fmt.Fprintf(c.stdout, "%s owned, %s in bases %s\n", humanBytes(total-info.BytesInBases),
			humanBytes(info.BytesInBases), strings.Join(info.Bases, ", "))
	}
	return exitOK
}
