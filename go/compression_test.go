package distckpt_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
)

// compressibleF32 is a row-major float32 tensor whose values lie in [1, 2): one exponent, so the grouped sign and
// exponent bytes take one value and the mantissas repeat every 1024 elements.
func compressibleF32(n int) []byte {
	out := make([]byte, 4*n)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(1+float32(i%1024)/1024))
	}
	return out
}

// compressedState holds "w", a [256, 512] F32 tensor saved as two pieces of 128 rows (2 chunks), and "noise", 64 KiB
// of random bytes that do not shrink.
func compressedState(t *testing.T) (*distckpt.State, []byte, []byte) {
	t.Helper()
	shape := []uint64{256, 512}
	w := compressibleF32(256 * 512)
	noise := make([]byte, 64<<10)
	rand.New(rand.NewSource(7)).Read(noise)
	st := distckpt.NewState()
	fixtures.Must(t, st.AddTensor("w", distckpt.F32, shape))
	for _, rows := range [][2]uint64{{0, 128}, {128, 128}} {
		off, lens := []uint64{rows[0], 0}, []uint64{rows[1], 512}
		fixtures.Must(t, st.AddPiece("w", off, lens, fixtures.Box(w, shape, off, lens, 4)))
	}
	fixtures.Must(t, st.AddBytes("noise", noise))
	st.SetUser("step", "1")
	return st, w, noise
}

func TestCompressedSaveRoundTripsAndVerifies(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "packed")
	st, w, noise := compressedState(t)
	saved, err := distckpt.Save(path, st, &distckpt.SaveOptions{NoSync: true, ChecksumBlockSize: 64 << 10,
		Compression: distckpt.CompressionZstd, CompressionLevel: 3})
	if err != nil {
		t.Fatal(err)
	}
	if saved.TotalBytes != uint64(len(w)+len(noise)) || saved.BytesWritten >= saved.TotalBytes {
		t.Fatalf("save: %+v", saved)
	}
	r := open(t, path)
	info, err := r.Info()
	if err != nil {
		t.Fatal(err)
	}
	if info.FormatMajor != 3 || info.FormatMinor != 0 || info.TotalBytes != saved.TotalBytes ||
		info.StoredBytes >= info.TotalBytes || info.StoredBytes <= uint64(len(noise)) || info.CompressedChunks < 2 {
		t.Fatalf("info %+v", info)
	}

	// Every chunk of w is compressed, to well under its size; the stored lengths add up to Info.StoredBytes.
	var stored uint64
	for _, name := range []string{"w", "noise"} {
		e, err := r.Entry(name)
		fixtures.Must(t, err)
		chunks, err := r.Chunks(e.Index)
		fixtures.Must(t, err)
		for _, ch := range chunks {
			stored += ch.StoredLength
			switch {
			case name == "w" && (ch.Codec != "zstd" || ch.StoredLength == 0 || ch.StoredLength > ch.Length/2 ||
				ch.Length != 128*512*4):
				t.Errorf("w chunk %d: %+v", ch.Index, ch)
			case ch.Codec != "zstd" && ch.Codec != "none":
				t.Errorf("%s chunk %d: codec %q", name, ch.Index, ch.Codec)
			case ch.Codec == "none" && ch.StoredLength != ch.Length:
				t.Errorf("%s chunk %d stored raw: %+v", name, ch.Index, ch)
			}
		}
	}
	if stored != info.StoredBytes {
		t.Errorf("chunks store %d bytes, Info.StoredBytes %d", stored, info.StoredBytes)
	}

	// Exact values: whole, a region across both pieces and several checksum blocks, and without mappings.
	if got, err := r.Read("w"); err != nil || !bytes.Equal(got, w) {
		t.Fatalf("read w: %v", err)
	}
	if got, err := r.Read("noise"); err != nil || !bytes.Equal(got, noise) {
		t.Fatalf("read noise: %v", err)
	}
	off, lens := []uint64{100, 3}, []uint64{60, 300}
	if got, err := r.ReadRegion("w", off, lens); err != nil ||
		!bytes.Equal(got, fixtures.Box(w, []uint64{256, 512}, off, lens, 4)) {
		t.Fatalf("region: %v", err)
	}
	nomap, err := distckpt.Open(path, &distckpt.ReadOptions{NoMap: true})
	fixtures.Must(t, err)
	defer nomap.Close()
	if got, err := nomap.Read("w"); err != nil || !bytes.Equal(got, w) {
		t.Fatalf("read w without mappings: %v", err)
	}

	// Verify checks every chunk; its progress counts the decoded bytes, up to the total.
	var last, lastTotal uint64
	res, err := r.Verify(&distckpt.VerifyOptions{Progress: func(done, total uint64) error {
		if done > total {
			t.Errorf("progress %d of %d", done, total)
		}
		last, lastTotal = done, total
		return nil
	}})
	if err != nil || res.Chunks != 3 || res.Bytes != info.TotalBytes || last != lastTotal ||
		lastTotal != info.TotalBytes {
		t.Fatalf("verify: %+v %v (progress %d of %d)", res, err, last, lastTotal)
	}

	// An incremental save of the same values refers to the compressed chunks as they are stored.
	st2, _, _ := compressedState(t)
	again, err := distckpt.Save(filepath.Join(dir, "next"), st2, &distckpt.SaveOptions{NoSync: true,
		ChecksumBlockSize: 64 << 10, Compression: distckpt.CompressionZstd, Base: "packed"})
	if err != nil || again.BytesReused != again.TotalBytes {
		t.Fatalf("incremental: %+v %v", again, err)
	}
	next := open(t, filepath.Join(dir, "next"))
	if ni, err := next.Info(); err != nil || ni.StoredBytes != info.StoredBytes ||
		ni.CompressedChunks != info.CompressedChunks || len(ni.Bases) != 1 {
		t.Fatalf("incremental info %+v %v", ni, err)
	}
	if got, err := next.Read("w"); err != nil || !bytes.Equal(got, w) {
		t.Fatalf("read w through the base: %v", err)
	}

	// A damaged stored byte of a compressed chunk: verify and reads name it corrupt.
	e, err := r.Entry("w")
	fixtures.Must(t, err)
	chunks, err := r.Chunks(e.Index)
	fixtures.Must(t, err)
	damaged := fixtures.CopyDir(t, path, filepath.Join(dir, "damaged"))
	f, err := os.OpenFile(filepath.Join(damaged, chunks[1].File), os.O_RDWR, 0)
	fixtures.Must(t, err)
	b := []byte{0}
	_, err = f.ReadAt(b, int64(chunks[1].FileOffset+chunks[1].StoredLength/2))
	fixtures.Must(t, err)
	b[0] ^= 0xff
	_, err = f.WriteAt(b, int64(chunks[1].FileOffset+chunks[1].StoredLength/2))
	fixtures.Must(t, err)
	fixtures.Must(t, f.Close())
	bad := open(t, damaged)
	if _, err := bad.Verify(nil); !errors.Is(err, distckpt.ErrCorrupt) {
		t.Fatalf("verify of a damaged compressed chunk: %v", err)
	}
	if _, err := bad.ReadRegion("w", []uint64{128, 0}, []uint64{128, 512}); !errors.Is(err, distckpt.ErrCorrupt) {
		t.Fatalf("read of a damaged compressed chunk: %v", err)
	}
}

func TestUncompressedSaveStoresEveryChunkRaw(t *testing.T) {
	r := open(t, writeFixture(t, fixtures.Options{Step: 1}))
	info, err := r.Info()
	fixtures.Must(t, err)
	if info.FormatMajor != 1 || info.StoredBytes != info.TotalBytes || info.CompressedChunks != 0 {
		t.Fatalf("info %+v", info)
	}
	chunks, err := r.Chunks(0)
	fixtures.Must(t, err)
	for _, ch := range chunks {
		if ch.Codec != "none" || ch.StoredLength != ch.Length {
			t.Errorf("chunk %+v", ch)
		}
	}
	if distckpt.CompressionNone.String() != "none" || distckpt.CompressionZstd.String() != "zstd" {
		t.Errorf("names %q %q", distckpt.CompressionNone, distckpt.CompressionZstd)
	}
}

func TestCompressionOptionsOutOfRangeFailTheSave(t *testing.T) {
	dir := t.TempDir()
	for _, o := range []distckpt.SaveOptions{
		{Compression: distckpt.CompressionZstd, CompressionLevel: 23},
		{Compression: distckpt.CompressionZstd, CompressionLevel: 1 << 40},
		{Compression: distckpt.Compression(7)},
		{Compression: distckpt.Compression(-1)},
	} {
		path := filepath.Join(dir, "ckpt")
		st, _, _ := compressedState(t)
		o.NoSync = true
		if _, err := distckpt.Save(path, st, &o); !errors.Is(err, distckpt.ErrInvalid) {
			t.Errorf("%+v: %v", o, err)
		}
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Errorf("%+v: the failed save left %s (%v)", o, path, err)
		}
	}
}
