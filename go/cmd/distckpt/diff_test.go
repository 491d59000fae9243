package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
)

type diffOut struct {
	Same    bool
	Added   []entryJSON
	Removed []entryJSON
	Changed []struct {
		Name            string
		Changes         []string
		Compared        *string
		DifferingChunks *int `json:"differing_chunks"`
	}
	Uncompared []string
	Unchanged  int
	Metadata   struct {
		Added   map[string]string
		Removed map[string]string
		Changed map[string]valueChange
	}
}

func write(t *testing.T, dir, name string, o fixtures.Options) string {
	t.Helper()
	p := filepath.Join(dir, name)
	fixtures.Write(t, p, o)
	return p
}

func TestDiffIdentical(t *testing.T) {
	dir := t.TempDir()
	a := write(t, dir, "a", fixtures.Options{Step: 1})
	b := write(t, dir, "b", fixtures.Options{Step: 1})
	var o diffOut
	if code := cliJSON(t, &o, "diff", a, b); code != exitOK || !o.Same || o.Unchanged != len(fixtures.Standard)+1 {
		t.Fatalf("%d %+v", code, o)
	}
	out, _, code := cli(t, "diff", a, b)
	if code != exitOK || !strings.Contains(out, "same: 0 added, 0 removed, 0 changed") {
		t.Fatalf("%d %s", code, out)
	}
}

func TestDiffEveryKindOfChange(t *testing.T) {
	dir := t.TempDir()
	a := write(t, dir, "a", fixtures.Options{Step: 1, Omit: []string{"optim.step"}, User: map[string]string{"lr": "0.1"}})
	// B: optim.step added, bytes entry removed, model.norm retyped, model.layers.0.bias reshaped, data of model.embed
	// changed (through a different seed, applied to the whole state: so every entry's data differs).
	b := write(t, dir, "b", fixtures.Options{
		Step: 2, NoBytes: true, Seed: 1,
		Retype:  map[string]distckpt.DType{"model.norm": distckpt.F32},
		Reshape: map[string][]uint64{"model.layers.0.bias": {8, 8}},
		User:    map[string]string{"note": "resumed"},
	})
	var o diffOut
	if code := cliJSON(t, &o, "diff", a, b); code != exitFound || o.Same {
		t.Fatalf("%d %+v", code, o)
	}
	if len(o.Added) != 1 || o.Added[0].Name != "optim.step" || len(o.Removed) != 1 ||
		o.Removed[0].Name != fixtures.BytesEntry {
		t.Errorf("added %+v removed %+v", o.Added, o.Removed)
	}
	changes := map[string]string{}
	for _, c := range o.Changed {
		changes[c.Name] = strings.Join(c.Changes, ",")
		if c.Name == "model.embed" && (c.Compared == nil || *c.Compared != "checksum" || *c.DifferingChunks != 2) {
			t.Errorf("model.embed: %+v", c)
		}
	}
	if changes["model.norm"] != "dtype" || changes["model.layers.0.bias"] != "shape" || changes["model.embed"] != "data" {
		t.Errorf("changes %v", changes)
	}
	m := o.Metadata
	if m.Changed["step"] != (valueChange{"1", "2"}) || m.Added["note"] != "resumed" || m.Removed["lr"] != "0.1" {
		t.Errorf("metadata %+v", m)
	}
	out, _, _ := cli(t, "diff", a, b)
	for _, s := range []string{"+ optim.step", "- " + fixtures.BytesEntry, "dtype BF16 -> F32", "shape [64] -> [8, 8]",
		"data differs (2 of 2 chunks, by checksum)", `~ metadata step: "1" -> "2"`, `+ metadata note = "resumed"`} {
		if !strings.Contains(out, s) {
			t.Errorf("diff output lacks %q:\n%s", s, out)
		}
	}
}

func TestDiffAcrossLayoutsReadsData(t *testing.T) {
	dir := t.TempDir()
	a := write(t, dir, "a", fixtures.Options{Step: 1})
	// The same values, sharded differently: checksums are not comparable, the data are.
	b := write(t, dir, "b", fixtures.Options{Step: 1, Grids: map[string][]uint64{"model.layers.0.w": {1, 4}}})
	c := write(t, dir, "c", fixtures.Options{Step: 1, Seed: 2, Grids: map[string][]uint64{"model.layers.0.w": {1, 4}}})
	var o diffOut
	if code := cliJSON(t, &o, "diff", a, b); code != exitOK || !o.Same {
		t.Fatalf("resharded copy: %d %+v", code, o)
	}
	cliJSON(t, &o, "diff", a, c)
	found := false
	for _, ch := range o.Changed {
		if ch.Name == "model.layers.0.w" {
			found = ch.Compared != nil && *ch.Compared == "data" && *ch.DifferingChunks == 4
		}
	}
	if !found {
		t.Fatalf("resharded, changed tensor not found by data: %+v", o.Changed)
	}
	var n diffOut
	if code := cliJSON(t, &n, "diff", "--no-data", a, b); code != exitOK || len(n.Uncompared) != 1 ||
		n.Uncompared[0] != "model.layers.0.w" {
		t.Fatalf("--no-data: %d %+v", code, n)
	}
}

func TestDiffUnreadable(t *testing.T) {
	dir := t.TempDir()
	a := write(t, dir, "a", fixtures.Options{Step: 1})
	if _, _, code := cli(t, "diff", a, filepath.Join(dir, "missing")); code != exitNotFound {
		t.Fatalf("exit %d", code)
	}
}

// flipDataByte flips the first data byte of the first chunk of entry name in checkpoint dir.
func flipDataByte(t *testing.T, dir, name string) {
	t.Helper()
	r, err := distckpt.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := r.Entry(name)
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := r.Chunks(e.Index)
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, chunks[0].File), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, int64(chunks[0].FileOffset)); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, int64(chunks[0].FileOffset)); err != nil {
		t.Fatal(err)
	}
}

// Issue 27: a copy whose data bytes differ keeps its recorded checksums. diff says that it compared only those, and
// diff --data reads the bytes (verifying them), names the entry that differs and exits 1.
func TestDiffDataReadsTheBytes(t *testing.T) {
	for _, limit := range []uint64{regionLimit, 96} { // 96 bytes: every chunk is read in several slabs
		old := regionLimit
		regionLimit = limit
		dir := t.TempDir()
		a := write(t, dir, "a", fixtures.Options{Step: 1})
		b := filepath.Join(dir, "b")
		fixtures.CopyDir(t, a, b)
		var o diffOut
		if code := cliJSON(t, &o, "diff", "--data", a, b); code != exitOK || !o.Same {
			t.Fatalf("limit %d: diff --data of an exact copy: %d %+v", limit, code, o)
		}
		const victim = "model.layers.0.w"
		flipDataByte(t, b, victim)

		out, errOut, code := cli(t, "diff", a, b)
		wantCode(t, code, exitOK, out, errOut)
		if !strings.Contains(out, "same: 0 added, 0 removed, 0 changed") ||
			!strings.Contains(out, "same recorded checksums; data not read — use --data to compare the bytes") {
			t.Errorf("diff without --data does not give the caveat:\n%s", out)
		}
		var j struct {
			Same       bool
			DataRead   bool `json:"data_read"`
			ByChecksum int  `json:"by_checksum"`
		}
		if code := cliJSON(t, &j, "diff", a, b); code != exitOK || !j.Same || j.DataRead ||
			j.ByChecksum != len(fixtures.Standard)+1 {
			t.Errorf("diff --json without --data: %d %+v", code, j)
		}

		out, errOut, code = cli(t, "diff", "--data", a, b)
		if code != exitFound || !strings.Contains(out, "~ "+victim) || !strings.Contains(out, "by data") ||
			!strings.Contains(out, "b's data are damaged") || strings.Contains(out, "data not read") {
			t.Errorf("limit %d: diff --data: exit %d\n%s%s", limit, code, out, errOut)
		}
		var d struct {
			Same     bool
			DataRead bool `json:"data_read"`
			Changed  []struct {
				Name            string
				Changes         []string
				Compared        *string
				DifferingChunks *int `json:"differing_chunks"`
				Bad             *badData
			}
			Unchanged int
		}
		if code := cliJSON(t, &d, "diff", "--data", a, b); code != exitFound || d.Same || !d.DataRead ||
			len(d.Changed) != 1 || d.Unchanged != len(fixtures.Standard) {
			t.Fatalf("limit %d: diff --data --json: %d %+v", limit, code, d)
		}
		ch := d.Changed[0]
		if ch.Name != victim || strings.Join(ch.Changes, ",") != "data" || ch.Compared == nil || *ch.Compared != "data" ||
			ch.DifferingChunks == nil || *ch.DifferingChunks != 1 || ch.Bad == nil || ch.Bad.Side != "b" ||
			ch.Bad.Error == nil || ch.Bad.Error.Code != "corrupt" {
			t.Errorf("limit %d: changed %+v bad %+v", limit, ch, ch.Bad)
		}
		if _, errOut, code := cli(t, "diff", "--data", "--no-data", a, b); code != exitUsage ||
			!strings.Contains(errOut, "exclude") {
			t.Errorf("--data --no-data: exit %d %s", code, errOut)
		}
		regionLimit = old
	}
}

// slabs covers a box exactly, in row-major order, with pieces of at most the limit (one element at least).
func TestSlabsCoverTheBox(t *testing.T) {
	offsets, lengths := []uint64{2, 3, 1}, []uint64{5, 3, 7}
	for _, limit := range []uint64{1, 4, 8, 27, 28, 84, 85, 1000} {
		seen := map[[3]uint64]int{}
		var order [][3]uint64
		for _, s := range slabs(offsets, lengths, 4, limit) {
			size := uint64(4)
			for _, l := range s.lengths {
				size *= l
			}
			if size > limit && size != 4 {
				t.Errorf("limit %d: slab %+v of %d bytes", limit, s, size)
			}
			for i := s.offsets[0]; i < s.offsets[0]+s.lengths[0]; i++ {
				for j := s.offsets[1]; j < s.offsets[1]+s.lengths[1]; j++ {
					for k := s.offsets[2]; k < s.offsets[2]+s.lengths[2]; k++ {
						seen[[3]uint64{i, j, k}]++
						order = append(order, [3]uint64{i, j, k})
					}
				}
			}
		}
		if len(seen) != 5*3*7 || len(order) != 5*3*7 {
			t.Errorf("limit %d: covered %d elements (%d distinct), want %d", limit, len(order), len(seen), 5*3*7)
		}
		for i := 1; i < len(order); i++ {
			p, q := order[i-1], order[i]
			if !(p[0] < q[0] || p[0] == q[0] && (p[1] < q[1] || p[1] == q[1] && p[2] < q[2])) {
				t.Errorf("limit %d: not row-major at %v then %v", limit, p, q)
				break
			}
		}
	}
}
