package distckpt

import (
	"path/filepath"
	"testing"
)

// A library without dckpt_reader_verify_chunk_progress (older than the header, same ABI) still verifies, with progress
// per chunk: (0, total) then (total, total) for a checkpoint of one chunk.
func TestVerifyProgressWithoutChunkProgress(t *testing.T) {
	defer func(v bool) { chunkProgress = v }(chunkProgress)
	chunkProgress = false
	st := NewState()
	data := make([]byte, 20<<20)
	if err := st.AddTensorData("w", U8, []uint64{uint64(len(data))}, data); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "c")
	if _, err := Save(path, st, &SaveOptions{NoSync: true}); err != nil {
		t.Fatal(err)
	}
	r, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var calls [][2]uint64
	if _, err := r.Verify(&VerifyOptions{Progress: func(done, total uint64) error {
		calls = append(calls, [2]uint64{done, total})
		return nil
	}}); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 2 || calls[0][0] != 0 || calls[1][0] != uint64(len(data)) || calls[1][1] != uint64(len(data)) {
		t.Fatalf("calls %v", calls)
	}
}
