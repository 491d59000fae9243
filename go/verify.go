package distckpt

/*
#include <stddef.h>
#include <distckpt/distckpt.h>

// Weak, so that this package still links against and runs with a libdistckpt built before it existed (same ABI
// version: functions are only ever added); Verify then reports progress per chunk instead of within chunks.
#pragma weak dckpt_reader_verify_chunk_progress

static int distckpt_go_has_chunk_progress(void) { return dckpt_reader_verify_chunk_progress != NULL; }
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sort"
	"sync"
)

// VerifyOptions configures Verify. The zero value (or nil) means the defaults.
type VerifyOptions struct {
	Workers int // chunks checked at once; 0: max(4, number of CPUs)
	// Progress is told the bytes checked so far out of the total: first (0, total), then as the chunks being checked
	// advance (at least every 8 MiB within a large chunk, summed over the chunks checked in parallel), ending at
	// (total, total) when every chunk was checked. done never decreases. It is called by one goroutine at a time.
	Progress ProgressFunc
}

// chunkProgress is whether the loaded library reports progress within a chunk
// (dckpt_reader_verify_chunk_progress); without it, Verify reports once per chunk. Tests turn it off.
var chunkProgress = C.distckpt_go_has_chunk_progress() != 0

// BadChunk is a chunk that failed verification.
type BadChunk struct {
	Entry      string // entry (tensor or bytes) name
	EntryIndex int
	Chunk      int    // chunk index within the entry
	File       string // data file name inside the checkpoint
	FileOffset uint64 // where the chunk starts in File
	Length     uint64 // chunk bytes
	Err        error  // the library's report (an *Error: ErrCorrupt for a checksum mismatch or a short file)
}

// VerifyResult summarises a Verify run.
type VerifyResult struct {
	Chunks int        // chunks checked
	Bytes  uint64     // chunk bytes checked
	Bad    []BadChunk // every chunk that failed, ordered by entry and chunk
}

// VerifyError is returned by Verify when at least one chunk failed. errors.Is(err, ErrCorrupt) holds when any bad
// chunk is corrupt (likewise for the other codes).
type VerifyError struct {
	Path   string
	Chunks int
	Bad    []BadChunk
}

func (e *VerifyError) Error() string {
	first := e.Bad[0]
	return fmt.Sprintf("checkpoint '%s': %d of %d chunks failed verification; first: entry '%s' chunk %d (file '%s' "+
		"offset %d): %v", e.Path, len(e.Bad), e.Chunks, first.Entry, first.Chunk, first.File, first.FileOffset, first.Err)
}

// Is reports whether any bad chunk's error matches target.
func (e *VerifyError) Is(target error) bool {
	for _, b := range e.Bad {
		if errors.Is(b.Err, target) {
			return true
		}
	}
	return false
}

type verifyJob struct {
	entry Entry
	chunk Chunk
}

// Verify re-reads and re-hashes every chunk of the checkpoint, several chunks at once, and reports every chunk that
// fails, not only the first. It returns a *VerifyError if any chunk failed; the result is filled in either way. A
// checkpoint another library wrote (Info.Checksummed false) has no checksums: Verify checks nothing and returns the
// library's *Error of code CodeUnsupported saying so (errors.Is(err, ErrUnsupported)).
func (r *Reader) Verify(opts *VerifyOptions) (VerifyResult, error) {
	var o VerifyOptions
	if opts != nil {
		o = *opts
	}
	if o.Workers <= 0 {
		o.Workers = runtime.NumCPU()
		if o.Workers < 4 {
			o.Workers = 4
		}
	}
	p, err := r.acquire()
	if err != nil {
		return VerifyResult{}, err
	}
	defer r.release()

	info, err := readerInfo(p)
	if err != nil {
		return VerifyResult{}, err
	}
	if !info.Checksummed {
		// A checkpoint another library wrote: nothing to check. The library says so (ErrUnsupported, naming the
		// checkpoint and its format) without reading anything; every chunk failing with it would say it N times.
		return VerifyResult{}, ccall(func() C.int { return C.dckpt_reader_verify(p, nil, nil) })
	}
	var jobs []verifyJob
	var total uint64
	for i := 0; i < info.NumEntries; i++ {
		e, err := readerEntry(p, i)
		if err != nil {
			return VerifyResult{}, err
		}
		for c := 0; c < e.NumChunks; c++ {
			ch, err := readerChunk(p, i, c)
			if err != nil {
				return VerifyResult{}, err
			}
			jobs = append(jobs, verifyJob{e, ch})
			total += ch.Length
		}
	}
	// File order reads each data file front to back.
	sort.SliceStable(jobs, func(a, b int) bool {
		if jobs[a].chunk.File != jobs[b].chunk.File {
			return jobs[a].chunk.File < jobs[b].chunk.File
		}
		return jobs[a].chunk.FileOffset < jobs[b].chunk.FileOffset
	})

	var (
		mu       sync.Mutex // guards res, abortErr, inflight and reported
		res      = VerifyResult{}
		abortErr error
		next     = make(chan verifyJob)
		wg       sync.WaitGroup
		done     = make(chan struct{})
		inflight = make([]uint64, o.Workers) // bytes of each worker's current chunk checked so far
		reported uint64                      // the last done given to o.Progress
	)
	if o.Progress != nil {
		if err := o.Progress(0, total); err != nil {
			return res, &Error{Code: CodeUser, Message: "verification aborted by the progress callback", cause: err}
		}
	}
	// report gives o.Progress the bytes checked so far: whole chunks plus the checked part of the chunks in flight.
	// Called with mu held.
	report := func() error {
		if abortErr != nil {
			return abortErr
		}
		cur := res.Bytes
		for _, b := range inflight {
			cur += b
		}
		if cur <= reported {
			return nil
		}
		reported = cur
		if perr := o.Progress(cur, total); perr != nil {
			abortErr = perr
			close(done)
			return perr
		}
		return nil
	}
	worker := func(w int) {
		defer wg.Done()
		var hook *progressHook
		if o.Progress != nil && chunkProgress {
			// The library reports (done, total) of the one chunk, from its I/O threads, possibly slightly out of
			// order: keep the largest.
			hook = newProgressHook(func(chunkDone, _ uint64) error {
				mu.Lock()
				defer mu.Unlock()
				if chunkDone > inflight[w] {
					inflight[w] = chunkDone
				}
				return report()
			})
			defer hook.free()
		}
		for j := range next {
			err := ccall(func() C.int {
				if hook != nil {
					return C.dckpt_reader_verify_chunk_progress(p, C.size_t(j.entry.Index), C.size_t(j.chunk.Index),
						hook.cfn(), hook.userData())
				}
				return C.dckpt_reader_verify_chunk(p, C.size_t(j.entry.Index), C.size_t(j.chunk.Index))
			})
			mu.Lock()
			checked := inflight[w]
			inflight[w] = 0
			if err != nil && abortErr != nil && errors.Is(err, ErrUser) {
				// Cut short by the abort; it counts as checked only if its last bytes were checked before the abort.
				if checked == j.chunk.Length {
					res.Chunks++
					res.Bytes += j.chunk.Length
				}
				mu.Unlock()
				continue
			}
			res.Chunks++
			res.Bytes += j.chunk.Length
			if err != nil {
				res.Bad = append(res.Bad, BadChunk{
					Entry: j.entry.Name, EntryIndex: j.entry.Index, Chunk: j.chunk.Index, File: j.chunk.File,
					FileOffset: j.chunk.FileOffset, Length: j.chunk.Length, Err: err,
				})
			}
			if o.Progress != nil {
				_ = report()
			}
			mu.Unlock()
		}
	}
	wg.Add(o.Workers)
	for i := 0; i < o.Workers; i++ {
		go worker(i)
	}
feed:
	for _, j := range jobs {
		select {
		case next <- j:
		case <-done:
			break feed
		}
	}
	close(next)
	wg.Wait()

	sort.Slice(res.Bad, func(a, b int) bool {
		if res.Bad[a].EntryIndex != res.Bad[b].EntryIndex {
			return res.Bad[a].EntryIndex < res.Bad[b].EntryIndex
		}
		return res.Bad[a].Chunk < res.Bad[b].Chunk
	})
	if abortErr != nil {
		return res, &Error{Code: CodeUser, Message: fmt.Sprintf("checkpoint '%s': verification aborted by the "+
			"progress callback after %d of %d chunks", r.path, res.Chunks, len(jobs)), cause: abortErr}
	}
	if len(res.Bad) > 0 {
		return res, &VerifyError{Path: r.path, Chunks: res.Chunks, Bad: res.Bad}
	}
	return res, nil
}
