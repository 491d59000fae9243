package s3_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sort"
	"strings"
	"sync"
	"testing"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
	"distckpt.dev/go/internal/mototest"
	"distckpt.dev/go/s3"
)

func client(t *testing.T, cfg func(*s3.Config)) *s3.Client {
	t.Helper()
	mototest.Start(t)
	c := s3.ConfigFromEnv()
	if cfg != nil {
		cfg(&c)
	}
	cl, err := s3.New(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.CreateBucket("bkt"); err != nil {
		t.Fatal(err)
	}
	return cl
}

func TestObjectOperationsAgainstMoto(t *testing.T) {
	c := client(t, func(cfg *s3.Config) { cfg.MultipartThreshold, cfg.PartSize = 6<<20, 5<<20 })
	if _, err := c.Size("s3://bkt/none"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Size of a missing object: %v", err)
	}
	f, err := c.Create("s3://bkt/dir/a b+c.bin", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.WriteAt([]byte("world"), 6); err != nil {
		t.Fatal(err)
	}
	if err := f.WriteAt([]byte("hello"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Size("s3://bkt/dir/a b+c.bin"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("an object is visible before Close")
	}
	if err := f.Close(13, false); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Size("s3://bkt/dir/a b+c.bin"); err != nil || n != 13 {
		t.Fatalf("Size: %d, %v", n, err)
	}
	p := make([]byte, 8)
	n, err := c.ReadAt("s3://bkt/dir/a b+c.bin", p, 3)
	if err != nil || string(p[:n]) != "lo\x00world" {
		t.Fatalf("ReadAt: %q, %v", p[:n], err)
	}
	n, err = c.ReadAt("s3://bkt/dir/a b+c.bin", p, 10)
	if n != 3 || (err != nil && err != io.EOF) || string(p[:n]) != "d\x00\x00" {
		t.Fatalf("ReadAt at the end: %q, %v", p[:n], err)
	}
	if n, err := c.ReadAt("s3://bkt/dir/a b+c.bin", p, 13); n != 0 || err != io.EOF {
		t.Fatalf("ReadAt past the end: %d, %v", n, err)
	}
	discarded, _ := c.Create("s3://bkt/dir/discarded", 0)
	_ = discarded.WriteAt([]byte("x"), 0)
	if err := discarded.Close(1, true); err != nil {
		t.Fatal(err)
	}

	// A multipart upload (11 MiB in parts of 5 MiB).
	big := bytes.Repeat([]byte("0123456789abcdef"), 11<<16)
	f, _ = c.Create("s3://bkt/dir/sub/big", uint64(len(big)))
	if err := f.WriteAt(big, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(uint64(len(big)), false); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 100)
	if n, err := c.ReadAt("s3://bkt/dir/sub/big", got, 6<<20); err != nil || !bytes.Equal(got[:n], big[6<<20:6<<20+100]) {
		t.Fatalf("reading the multipart object: %d, %v", n, err)
	}

	// Listing, across pages (moto pages at 1000 keys).
	for i := 0; i < 1005; i++ {
		if err := c.Commit(fmt.Sprintf("s3://bkt/many/k%04d", i), []byte{1}, true); err != nil {
			t.Fatal(err)
		}
	}
	names, err := c.List("s3://bkt/many")
	if err != nil || len(names) != 1005 {
		t.Fatalf("List of 1005 keys: %d, %v", len(names), err)
	}
	names, err = c.List("s3://bkt/dir/")
	sort.Strings(names)
	if err != nil || strings.Join(names, ",") != "a b+c.bin,sub" {
		t.Fatalf("List: %v, %v", names, err)
	}
	if names, err := c.List("s3://bkt/nothing-here"); err != nil || len(names) != 0 {
		t.Fatalf("List of an empty prefix: %v, %v", names, err)
	}

	// Commit: conditional unless replace.
	if err := c.Commit("s3://bkt/dir/meta", []byte("v1"), false); err != nil {
		t.Fatal(err)
	}
	err = c.Commit("s3://bkt/dir/meta", []byte("v2"), false)
	if err == nil {
		t.Log("this moto ignores If-None-Match: * on PUT (see the package comment)")
	} else if !errors.Is(err, fs.ErrExist) {
		t.Fatalf("a conditional commit over an object: %v", err)
	}
	if err := c.Commit("s3://bkt/dir/meta", []byte("v3"), true); err != nil {
		t.Fatal(err)
	}

	if err := c.Remove("s3://bkt/dir/a b+c.bin"); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove("s3://bkt/dir/a b+c.bin"); err != nil {
		t.Fatalf("removing a missing object: %v", err)
	}
	if _, err := c.Size("s3://bkt/dir/a b+c.bin"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("the object is still there")
	}
	if _, err := c.Size("s3://no-such-bucket/x"); err == nil || !strings.Contains(err.Error(), "s3://no-such-bucket/x") {
		t.Fatalf("an error names the path: %v", err)
	}
}

func TestCheckpointOnS3(t *testing.T) {
	c := client(t, nil)
	h, err := distckpt.NewStorage(c, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	path := "s3://bkt/run/step-100"
	_, err = distckpt.Save(path, fixtures.State(t, fixtures.Options{Step: 100}), &distckpt.SaveOptions{
		Storage: h, ChecksumBlockSize: fixtures.BlockSize,
	})
	if err != nil {
		t.Fatal(err)
	}
	names, err := c.List(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("objects: %v", names)
	r, err := distckpt.Open(path, &distckpt.ReadOptions{Storage: h})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if res, err := r.Verify(nil); err != nil || res.Chunks == 0 {
		t.Fatalf("Verify: %+v, %v", res, err)
	}
	for _, e := range fixtures.Standard {
		got, err := r.Read(e.Name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, fixtures.Encode(e.Name, e.DType, e.Shape, 0)) {
			t.Fatalf("%s read back different bytes", e.Name)
		}
	}
	if info, err := h.Stat(path, 0); err != nil || info.Kind != distckpt.PathCheckpoint {
		t.Fatalf("Stat: %+v, %v", info, err)
	}
	_, err = distckpt.Save(path, fixtures.State(t, fixtures.Options{Step: 100}), &distckpt.SaveOptions{Storage: h})
	if !errors.Is(err, fs.ErrExist) {
		t.Fatalf("saving again without overwrite: %v", err)
	}
	if err := h.RemoveCheckpoint(path); err != nil {
		t.Fatal(err)
	}
	if names, err := c.List(path); err != nil || len(names) != 0 {
		t.Fatalf("left after RemoveCheckpoint: %v, %v", names, err)
	}
}

// partCounter is the Client with its multipart uploads counted (the library streams files through them).
type partCounter struct {
	*s3.Client
	mu      sync.Mutex
	parts   []int // part numbers in the order they were sent
	aborted int
	fail    int // > 0: that part number fails
}

func (p *partCounter) BeginUpload(path string, sizeHint uint64) (distckpt.Upload, error) {
	u, err := p.Client.BeginUpload(path, sizeHint)
	if err != nil {
		return nil, err
	}
	return &countedUpload{Upload: u, p: p}, nil
}

type countedUpload struct {
	distckpt.Upload
	p *partCounter
}

func (u *countedUpload) UploadPart(number int, data []byte) error {
	u.p.mu.Lock()
	u.p.parts = append(u.p.parts, number)
	fail := u.p.fail == number
	u.p.mu.Unlock()
	if fail {
		return errors.New("connection reset")
	}
	return u.Upload.UploadPart(number, data)
}

func (u *countedUpload) Abort() error {
	u.p.mu.Lock()
	u.p.aborted++
	u.p.mu.Unlock()
	return u.Upload.Abort()
}

func TestLargeDataFilesStreamAsMultipartUploads(t *testing.T) {
	// A 12 MiB tensor in parts of 5 MiB: the library assembles the parts and sends them through BeginUpload while it
	// writes the data file; the metadata goes up with one PUT.
	c := client(t, func(cfg *s3.Config) { cfg.PartSize = 5 << 20 })
	p := &partCounter{Client: c}
	h, err := distckpt.NewStorage(p, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	data := make([]byte, 12<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	state := distckpt.NewState()
	if err := state.AddTensorData("w", distckpt.U8, []uint64{uint64(len(data))}, data); err != nil {
		t.Fatal(err)
	}
	path := "s3://bkt/big/step-1"
	if _, err := distckpt.Save(path, state, &distckpt.SaveOptions{Storage: h}); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	parts := append([]int(nil), p.parts...)
	p.mu.Unlock()
	sort.Ints(parts)
	if fmt.Sprint(parts) != "[1 2 3]" {
		t.Fatalf("parts sent: %v, want 1..3", parts)
	}
	r, err := distckpt.Open(path, &distckpt.ReadOptions{Storage: h})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Verify(nil); err != nil {
		t.Fatal(err)
	}
	got, err := r.Read("w")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %d bytes, %v", len(got), err)
	}

	// A failed part fails the save, aborts the upload, and no data file appears.
	p.fail = 2
	failed := "s3://bkt/big/failed"
	if _, err := distckpt.Save(failed, state, &distckpt.SaveOptions{Storage: h}); err == nil ||
		!strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("a save whose part fails: %v", err)
	}
	if p.aborted != 1 {
		t.Fatalf("aborted uploads: %d, want 1", p.aborted)
	}
	names, err := c.List(failed)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.HasPrefix(n, "data-") {
			t.Fatalf("a data file of the failed save is visible: %v", names)
		}
	}
}
