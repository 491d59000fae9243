package distckpt_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
)

func writeFixture(t *testing.T, o fixtures.Options) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "step-100")
	fixtures.Write(t, path, o)
	return path
}

func open(t *testing.T, path string) *distckpt.Reader {
	t.Helper()
	r, err := distckpt.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func TestOpenReadsInfoEntriesAndUserMetadata(t *testing.T) {
	r := open(t, writeFixture(t, fixtures.Options{Step: 100}))
	info, err := r.Info()
	if err != nil {
		t.Fatal(err)
	}
	if info.FormatMajor != 1 || info.NumEntries != len(fixtures.Standard)+1 || info.NumFiles != 1 ||
		info.ChecksumBlockSize != fixtures.BlockSize || info.Writer == "" {
		t.Fatalf("info = %+v", info)
	}
	entries, err := r.Entries()
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(entries); i++ {
		if entries[i-1].Name >= entries[i].Name {
			t.Fatalf("entries not sorted: %q then %q", entries[i-1].Name, entries[i].Name)
		}
	}
	byName := map[string]distckpt.Entry{}
	for _, e := range entries {
		byName[e.Name] = e
	}
	for _, s := range fixtures.Standard {
		e := byName[s.Name]
		if e.Kind != distckpt.TensorEntry || e.DType != s.DType || len(e.Shape) != len(s.Shape) {
			t.Fatalf("%s: %+v", s.Name, e)
		}
		want := uint64(s.DType.Size())
		for _, d := range s.Shape {
			want *= d
		}
		if e.NBytes != want {
			t.Fatalf("%s: nbytes %d, want %d", s.Name, e.NBytes, want)
		}
	}
	if e := byName[fixtures.BytesEntry]; e.Kind != distckpt.BytesEntry || e.NumChunks != 1 {
		t.Fatalf("bytes entry: %+v", e)
	}
	user, err := r.UserMetadata()
	if err != nil {
		t.Fatal(err)
	}
	if user["step"] != "100" || user["framework"] != "fixtures" {
		t.Fatalf("user metadata = %v", user)
	}
}

func TestReadWholeTensorsAndBytes(t *testing.T) {
	r := open(t, writeFixture(t, fixtures.Options{Step: 1, Seed: 3}))
	for _, s := range fixtures.Standard {
		got, err := r.Read(s.Name)
		if err != nil {
			t.Fatal(err)
		}
		if want := fixtures.Encode(s.Name, s.DType, s.Shape, 3); !bytes.Equal(got, want) {
			t.Fatalf("%s: read %d bytes that differ from the saved ones", s.Name, len(got))
		}
	}
	b, err := r.Read(fixtures.BytesEntry)
	if err != nil || string(b) != "rng state for seed 3" {
		t.Fatalf("bytes entry = %q, %v", b, err)
	}
}

func TestReadWithoutMappingReadsTheSameBytes(t *testing.T) {
	path := writeFixture(t, fixtures.Options{Step: 1, Seed: 5})
	r, err := distckpt.Open(path, &distckpt.ReadOptions{NoMap: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, s := range fixtures.Standard {
		got, err := r.Read(s.Name)
		if err != nil {
			t.Fatal(err)
		}
		if want := fixtures.Encode(s.Name, s.DType, s.Shape, 5); !bytes.Equal(got, want) {
			t.Fatalf("%s: read %d bytes that differ from the saved ones", s.Name, len(got))
		}
	}
	st, err := r.IOStats()
	if err != nil || st.BytesMapped != 0 || st.BytesRead == 0 {
		t.Fatalf("io stats without mapping = %+v, %v", st, err)
	}
}

func TestReadRegionAcrossPieces(t *testing.T) {
	r := open(t, writeFixture(t, fixtures.Options{Step: 1}))
	s := fixtures.Standard[1] // model.layers.0.w, saved as a 2x2 grid
	full := fixtures.Encode(s.Name, s.DType, s.Shape, 0)
	off, lens := []uint64{5, 20}, []uint64{20, 30}
	got, err := r.ReadRegion(s.Name, off, lens)
	if err != nil {
		t.Fatal(err)
	}
	if want := fixtures.Box(full, s.Shape, off, lens, 4); !bytes.Equal(got, want) {
		t.Fatal("region differs from the saved data")
	}
	if _, err := r.ReadRegion(s.Name, []uint64{30, 0}, []uint64{10, 1}); !errors.Is(err, distckpt.ErrInvalid) {
		t.Fatalf("out-of-bounds region: %v", err)
	}
	if err := r.ReadInto(s.Name, off, lens, make([]byte, 3)); !errors.Is(err, distckpt.ErrInvalid) {
		t.Fatalf("short buffer: %v", err)
	}
	if _, err := r.ReadRegion("no.such", off, lens); !errors.Is(err, distckpt.ErrNotFound) {
		t.Fatalf("missing tensor: %v", err)
	}
}

func TestChunksTileTheTensor(t *testing.T) {
	r := open(t, writeFixture(t, fixtures.Options{Step: 1}))
	e, err := r.Entry("model.layers.0.w")
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := r.Chunks(e.Index)
	if err != nil {
		t.Fatal(err)
	}
	var vol uint64
	for _, c := range chunks {
		if c.File != "data-00000.bin" || c.FileOffset%4096 != 0 || c.Length == 0 {
			t.Fatalf("chunk %+v", c)
		}
		vol += c.Length
	}
	if vol != e.NBytes || len(chunks) != e.NumChunks {
		t.Fatalf("%d chunks of %d bytes for a %d-byte tensor", len(chunks), vol, e.NBytes)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := distckpt.Open(filepath.Join(dir, "missing"), nil); !errors.Is(err, distckpt.ErrNotFound) {
		t.Fatalf("missing checkpoint: %v", err)
	}
	path := writeFixture(t, fixtures.Options{Step: 1})
	if err := os.WriteFile(filepath.Join(path, "metadata.dckpt"), []byte("garbage, not FlatBuffers"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := distckpt.Open(path, nil)
	if !errors.Is(err, distckpt.ErrCorrupt) {
		t.Fatalf("garbage metadata: %v", err)
	}
	var e *distckpt.Error
	if !errors.As(err, &e) || e.Code != distckpt.CodeCorrupt || e.Message == "" {
		t.Fatalf("error %#v", err)
	}
	path = writeFixture(t, fixtures.Options{Step: 1})
	fixtures.Truncate(t, path, "metadata.dckpt", 100)
	if _, err := distckpt.Open(path, nil); !errors.Is(err, distckpt.ErrCorrupt) {
		t.Fatalf("truncated metadata: %v", err)
	}
	staging := fixtures.Staging(t, dir, "step-7", "0123456789abcdef", "h", 1, 0)
	if _, err := distckpt.Open(staging, nil); err == nil {
		t.Fatal("opened a staging directory")
	}
}

func TestCloseIsIdempotentAndLaterCallsFail(t *testing.T) {
	r, err := distckpt.Open(writeFixture(t, fixtures.Options{Step: 1}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Entries(); !errors.Is(err, distckpt.ErrState) {
		t.Fatalf("Entries after Close: %v", err)
	}
	if _, err := r.Read("optim.step"); !errors.Is(err, distckpt.ErrState) {
		t.Fatalf("Read after Close: %v", err)
	}
}

func TestConcurrentReadsAndClose(t *testing.T) {
	r, err := distckpt.Open(writeFixture(t, fixtures.Options{Step: 1}), nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				if _, err := r.Read("model.embed"); err != nil && !errors.Is(err, distckpt.ErrState) {
					t.Error(err)
					return
				}
			}
		}()
	}
	r.Close()
	wg.Wait()
}

// Readers that are never closed are released by their finalizer (a backstop, not a substitute for Close).
func TestFinalizerReleasesUnclosedReaders(t *testing.T) {
	path := writeFixture(t, fixtures.Options{Step: 1})
	for i := 0; i < 20; i++ {
		if _, err := distckpt.Open(path, nil); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.GC()
	r := open(t, path)
	if _, err := r.Read("model.embed"); err != nil {
		t.Fatal(err)
	}
}

// Issue 10: a Reader pins the checkpoint's files when it opens. After the path is replaced (removed and written again,
// or overwritten) or removed, it keeps reading what it opened, with verification on (no false corruption) or off (no
// other checkpoint's data).
func TestAnOpenReaderKeepsReadingTheCheckpointItOpened(t *testing.T) {
	for _, noVerify := range []bool{false, true} {
		path := writeFixture(t, fixtures.Options{Step: 1, Seed: 1})
		r, err := distckpt.Open(path, &distckpt.ReadOptions{NoVerify: noVerify})
		if err != nil {
			t.Fatal(err)
		}
		name := fixtures.Standard[0].Name
		want, err := r.Read(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(path); err != nil {
			t.Fatal(err)
		}
		fixtures.Write(t, path, fixtures.Options{Step: 2, Seed: 2})
		got, err := r.Read(name)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("noVerify=%v: after the path was replaced: err %v, same bytes %v", noVerify, err, bytes.Equal(got, want))
		}
		if fresh := open(t, path); fresh != nil {
			if other, _ := fresh.Read(name); bytes.Equal(other, want) {
				t.Fatal("the replacement has the same bytes: the test proves nothing")
			}
		}
		if err := os.RemoveAll(path); err != nil {
			t.Fatal(err)
		}
		if got, err := r.Read(name); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("noVerify=%v: after a removal: %v", noVerify, err)
		}
		r.Close()
	}
}

// A data file that is a symbolic link (here to a valid copy outside) is refused, naming it; a link to the checkpoint
// directory itself works.
func TestALinkInsideTheCheckpointIsRefused(t *testing.T) {
	path := writeFixture(t, fixtures.Options{Step: 1})
	latest := filepath.Join(filepath.Dir(path), "latest")
	if err := os.Symlink(filepath.Base(path), latest); err != nil {
		t.Fatal(err)
	}
	if _, err := open(t, latest).Read(fixtures.Standard[0].Name); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(path, "data-00000.bin")
	outside := filepath.Join(t.TempDir(), "outside.bin")
	if err := os.Rename(data, outside); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, data); err != nil {
		t.Fatal(err)
	}
	_, err := open(t, path).Read(fixtures.Standard[0].Name)
	if !errors.Is(err, distckpt.ErrCorrupt) || !strings.Contains(err.Error(), "data-00000.bin' is a symbolic link") {
		t.Fatalf("got %v", err)
	}
}
