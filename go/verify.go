package distckpt

/*
#include <distckpt/distckpt.h>
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
	Workers  int          // chunks checked at once; 0: max(4, number of CPUs)
	Progress ProgressFunc // bytes checked so far out of the total; called by one goroutine at a time
}

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
// fails, not only the first. It returns a *VerifyError if any chunk failed; the result is filled in either way.
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
		mu       sync.Mutex
		res      = VerifyResult{}
		abortErr error
		next     = make(chan verifyJob)
		wg       sync.WaitGroup
		done     = make(chan struct{})
	)
	if o.Progress != nil {
		if err := o.Progress(0, total); err != nil {
			return res, &Error{Code: CodeUser, Message: "verification aborted by the progress callback", cause: err}
		}
	}
	worker := func() {
		defer wg.Done()
		for j := range next {
			err := ccall(func() C.int {
				return C.dckpt_reader_verify_chunk(p, C.size_t(j.entry.Index), C.size_t(j.chunk.Index))
			})
			mu.Lock()
			res.Chunks++
			res.Bytes += j.chunk.Length
			if err != nil {
				res.Bad = append(res.Bad, BadChunk{
					Entry: j.entry.Name, EntryIndex: j.entry.Index, Chunk: j.chunk.Index, File: j.chunk.File,
					FileOffset: j.chunk.FileOffset, Length: j.chunk.Length, Err: err,
				})
			}
			if o.Progress != nil && abortErr == nil {
				if perr := o.Progress(res.Bytes, total); perr != nil {
					abortErr = perr
					close(done)
				}
			}
			mu.Unlock()
		}
	}
	wg.Add(o.Workers)
	for i := 0; i < o.Workers; i++ {
		go worker()
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
