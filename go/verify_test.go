package distckpt_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
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

// bigCheckpoint saves tensors of the given sizes (MiB), each as one piece (one chunk).
func bigCheckpoint(t *testing.T, mibs ...int) string {
	t.Helper()
	st := distckpt.NewState()
	for i, mib := range mibs {
		data := make([]byte, mib<<20)
		for j := range data {
			data[j] = byte(j*7 + i)
		}
		if err := st.AddTensorData(fmt.Sprintf("big.%d", i), distckpt.U8, []uint64{uint64(len(data))}, data); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "big")
	if _, err := distckpt.Save(path, st, &distckpt.SaveOptions{NoSync: true}); err != nil {
		t.Fatal(err)
	}
	return path
}

// progressCalls verifies with a progress callback and returns every done it was given, checking that they increase
// and end at the total.
func progressCalls(t *testing.T, r *distckpt.Reader, workers int) []uint64 {
	t.Helper()
	var mu sync.Mutex
	var calls []uint64
	var total uint64
	res, err := r.Verify(&distckpt.VerifyOptions{Workers: workers, Progress: func(done, tot uint64) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, done)
		total = tot
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(calls); i++ {
		if calls[i] <= calls[i-1] {
			t.Fatalf("progress went from %d to %d: %v", calls[i-1], calls[i], calls)
		}
	}
	if len(calls) == 0 || calls[0] != 0 || calls[len(calls)-1] != total || total != res.Bytes {
		t.Fatalf("progress %v, total %d, verified %d", calls, total, res.Bytes)
	}
	return calls
}

// Issue 11: a single 40 MiB chunk advances by bytes (the library reports at least every 8 MiB within a chunk), not 0%
// then 100%.
func TestVerifyProgressWithinALargeChunk(t *testing.T) {
	r := open(t, bigCheckpoint(t, 40))
	e, err := r.Entry("big.0")
	if err != nil || e.NumChunks != 1 {
		t.Fatalf("want one chunk: %+v %v", e, err)
	}
	calls := progressCalls(t, r, 1)
	if len(calls) < 4 {
		t.Fatalf("only %d progress calls for a 40 MiB chunk: %v", len(calls), calls)
	}
	t.Logf("%d calls: %v", len(calls), calls)
}

// Chunks verified in parallel: the progress is the sum over the workers, and still only grows.
func TestVerifyProgressSumsParallelChunks(t *testing.T) {
	r := open(t, bigCheckpoint(t, 24, 24, 16))
	calls := progressCalls(t, r, 3)
	if len(calls) < 3+4 {
		t.Fatalf("only %d progress calls for three large chunks: %v", len(calls), calls)
	}
}

// Aborting inside a large chunk stops the verification there.
func TestVerifyProgressAbortWithinAChunk(t *testing.T) {
	r := open(t, bigCheckpoint(t, 40))
	stop := errors.New("stop")
	var calls atomic.Int32
	res, err := r.Verify(&distckpt.VerifyOptions{Workers: 1, Progress: func(done, total uint64) error {
		calls.Add(1)
		if done > 0 && done < total {
			return stop
		}
		return nil
	}})
	if !errors.Is(err, stop) || res.Chunks != 0 || len(res.Bad) != 0 || calls.Load() != 2 {
		t.Fatalf("%+v %v, %d calls", res, err, calls.Load())
	}
}
