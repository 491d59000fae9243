package distckpt_test

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	distckpt "distckpt.dev/go"
	"distckpt.dev/go/internal/fixtures"
)

// chunkOf finds chunk `chunk` of entry `name`.
func chunkOf(t *testing.T, r *distckpt.Reader, name string, chunk int) distckpt.Chunk {
	t.Helper()
	e, err := r.Entry(name)
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := r.Chunks(e.Index)
	if err != nil {
		t.Fatal(err)
	}
	return chunks[chunk]
}

func TestVerifyCleanCheckpoint(t *testing.T) {
	r := open(t, writeFixture(t, fixtures.Options{Step: 1}))
	var calls, last atomic.Uint64
	res, err := r.Verify(&distckpt.VerifyOptions{Workers: 3, Progress: func(done, total uint64) error {
		calls.Add(1)
		last.Store(done)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	info, _ := r.Info()
	if res.Bytes != info.TotalBytes || len(res.Bad) != 0 || res.Chunks < len(fixtures.Standard) {
		t.Fatalf("result %+v, data bytes %d", res, info.TotalBytes)
	}
	if calls.Load() != uint64(res.Chunks)+1 || last.Load() != res.Bytes {
		t.Fatalf("%d progress calls ending at %d for %d chunks", calls.Load(), last.Load(), res.Chunks)
	}
}

func TestVerifyReportsEveryBadChunk(t *testing.T) {
	path := writeFixture(t, fixtures.Options{Step: 1})
	r := open(t, path)
	a := chunkOf(t, r, "model.layers.1.w", 2)
	b := chunkOf(t, r, "optim.step", 0)
	fixtures.FlipByte(t, path, a.File, int64(a.FileOffset+a.Length-1))
	fixtures.FlipByte(t, path, b.File, int64(b.FileOffset))

	res, err := r.Verify(nil)
	if !errors.Is(err, distckpt.ErrCorrupt) {
		t.Fatalf("Verify: %v", err)
	}
	var verr *distckpt.VerifyError
	if !errors.As(err, &verr) || len(verr.Bad) != 2 || len(res.Bad) != 2 {
		t.Fatalf("want 2 bad chunks, got %v", err)
	}
	got := res.Bad[0]
	if got.Entry != "model.layers.1.w" || got.Chunk != 2 || got.File != a.File || got.FileOffset != a.FileOffset {
		t.Fatalf("first bad chunk %+v, want chunk %+v", got, a)
	}
	if !errors.Is(got.Err, distckpt.ErrCorrupt) || !strings.Contains(got.Err.Error(), "model.layers.1.w") {
		t.Fatalf("bad chunk error: %v", got.Err)
	}
	if res.Bad[1].Entry != "optim.step" || res.Bad[1].FileOffset != b.FileOffset {
		t.Fatalf("second bad chunk %+v", res.Bad[1])
	}
	t.Logf("reported: %v", got.Err)
}

func TestVerifyTruncatedDataFile(t *testing.T) {
	path := writeFixture(t, fixtures.Options{Step: 1})
	r := open(t, path)
	last := chunkOf(t, r, "optim.step", 0)
	fixtures.Truncate(t, path, last.File, int64(last.FileOffset))
	res, err := r.Verify(nil)
	if !errors.Is(err, distckpt.ErrCorrupt) {
		t.Fatalf("Verify: %v", err)
	}
	found := false
	for _, b := range res.Bad {
		found = found || b.Entry == "optim.step"
	}
	if !found {
		t.Fatalf("truncated tail chunk not reported: %+v", res.Bad)
	}
	t.Logf("reported: %v", err)
}

func TestVerifyProgressAbort(t *testing.T) {
	r := open(t, writeFixture(t, fixtures.Options{Step: 1}))
	stop := errors.New("operator pressed ^C")
	res, err := r.Verify(&distckpt.VerifyOptions{Workers: 1, Progress: func(done, total uint64) error {
		if done > 0 {
			return stop
		}
		return nil
	}})
	if !errors.Is(err, stop) || !errors.Is(err, distckpt.ErrUser) {
		t.Fatalf("Verify: %v", err)
	}
	if res.Chunks == 0 {
		t.Fatal("no chunk checked before the abort")
	}
}
