package distckpt

/*
#include <stdlib.h>
#include <distckpt/distckpt.h>

// Weak, so that this package still links against a libdistckpt from before incremental checkpoints: it is called
// only when the library filled dckpt_checkpoint_info version 4, which means it has it.
#pragma weak dckpt_reader_base
*/
import "C"

import (
	"errors"
	"runtime"
	"sync"
	"unsafe"
)

// ReadOptions configures Open. The zero value (or nil) means the library's defaults: verify checksums on every read.
type ReadOptions struct {
	NoVerify  bool // skip checksum verification on Read (Verify always checks)
	IOThreads int  // 0: the library's default
	// NoMap reads everything with read calls instead of mapping the metadata and page-cache-resident data (a mapped
	// file truncated by another process raises SIGBUS; set this where files may change under a reader).
	NoMap bool
	// Storage is where the checkpoint is read from (nil: the storage the path names: S3 for an "s3://" URL, else the
	// POSIX file system). The Reader keeps it alive until the Reader is closed.
	Storage *StorageHandle
}

// Reader is an open, committed checkpoint. It is safe for concurrent use by several goroutines; Close waits for the
// calls in flight and makes every later call fail with ErrState.
type Reader struct {
	mu      sync.RWMutex
	ptr     *C.dckpt_reader
	path    string
	storage *StorageHandle // holds a reference until Close
}

// Open opens the committed checkpoint in directory path (or at an "s3://bucket/prefix" URL). Its metadata is verified and validated first: a damaged or
// truncated metadata file gives ErrCorrupt, an unsupported format version ErrVersion, a missing or uncommitted
// (staging) checkpoint ErrNotFound.
//
// Checkpoints other libraries wrote are read in place, with no conversion (Info.Format says which): a Hugging Face
// safetensors directory (a "*.safetensors.index.json" and its shards, or ".safetensors" files), one ".safetensors"
// file, the index file's own path, or a PyTorch DCP directory. The library parses their files (this package has no
// parser of its own) and every read serves them; they carry no checksums, so nothing read from them is verified.
func Open(path string, opts *ReadOptions) (*Reader, error) {
	var copts C.dckpt_read_options
	if err := ccall(func() C.int { return C.dckpt_read_options_init(&copts, C.DCKPT_READ_OPTIONS_VERSION) }); err != nil {
		return nil, err
	}
	var storage *StorageHandle
	if opts != nil {
		storage = opts.Storage
		ptr, err := storage.acquire()
		if err != nil {
			return nil, err
		}
		copts.storage = ptr
		if opts.NoVerify {
			copts.verify = 0
		}
		copts.io_threads = C.unsigned(opts.IOThreads)
		if opts.NoMap {
			copts.map_files = 0
		}
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var ptr *C.dckpt_reader
	if err := ccall(func() C.int { return C.dckpt_reader_open(&ptr, cpath, nil, &copts) }); err != nil {
		err = storage.explain(err)
		storage.release()
		return nil, err
	}
	r := &Reader{ptr: ptr, path: path, storage: storage}
	runtime.SetFinalizer(r, (*Reader).Close)
	return r, nil
}

// Path is the directory the reader was opened on.
func (r *Reader) Path() string { return r.path }

// Close releases the reader. It is safe to call more than once; only the first call does anything.
func (r *Reader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ptr != nil {
		C.dckpt_reader_free(r.ptr)
		r.ptr = nil
		r.storage.release()
		r.storage = nil
		runtime.SetFinalizer(r, nil)
	}
	return nil
}

// acquire pins the C reader for one call; release must follow. Calls hold the read side of the lock, so several run
// at once and Close waits for them.
func (r *Reader) acquire() (*C.dckpt_reader, error) {
	r.mu.RLock()
	if r.ptr == nil {
		r.mu.RUnlock()
		return nil, errorf(CodeState, "checkpoint '%s': the reader is closed", r.path)
	}
	return r.ptr, nil
}

func (r *Reader) release() {
	r.mu.RUnlock()
	runtime.KeepAlive(r)
}

// Format says who wrote a checkpoint: distckpt, or another library whose files the core reads in place with no
// conversion (FORMAT.md section 2.4). Its values are the C ABI's dckpt_checkpoint_info.source, "" being distckpt.
type Format string

// The formats the library reads. A newer library may name others: treat an unknown one as foreign.
const (
	FormatDistckpt    Format = "distckpt"    // metadata.dckpt; every chunk carries checksums
	FormatSafetensors Format = "safetensors" // a Hugging Face safetensors file, hub directory or index file
	FormatTorchDCP    Format = "torch-dcp"   // a PyTorch Distributed Checkpoint directory
)

// Foreign reports whether another library wrote the checkpoint (anything but FormatDistckpt). Such a checkpoint
// carries no checksums: what is read from it cannot be verified.
func (f Format) Foreign() bool { return f != FormatDistckpt }

// Info describes the checkpoint as a whole.
type Info struct {
	FormatMajor       int    `json:"format_major"`
	FormatMinor       int    `json:"format_minor"`
	Writer            string `json:"writer"`
	NumEntries        int    `json:"num_entries"`
	NumFiles          int    `json:"num_files"`
	TotalBytes        uint64 `json:"total_bytes"` // data bytes
	MetadataBytes     uint64 `json:"metadata_bytes"`
	ChecksumBlockSize uint64 `json:"checksum_block_size"`
	// Format is who wrote it: FormatDistckpt, or the format of a checkpoint another library wrote (a safetensors
	// file or hub directory, a PyTorch DCP directory), read in place.
	Format Format `json:"format"`
	// Checksummed is true when every chunk carries checksums (distckpt); false for a foreign checkpoint, whose bytes
	// cannot be verified: Verify then fails with ErrUnsupported saying so, and Chunk.Checksum is 0.
	Checksummed bool `json:"checksummed"`
	// SourceVersion is the version a foreign format records of itself, as it records it ("1.0.0" for a DCP
	// .metadata that has one); "" for safetensors (which records none), an older DCP checkpoint, and a distckpt
	// checkpoint, whose format version is FormatMajor.FormatMinor (those of a foreign checkpoint describe the
	// library's in-memory description of it, not the foreign format).
	SourceVersion string `json:"source_version"`
	// Bases names the checkpoints an incremental checkpoint reads data files of: siblings in the same directory (or
	// below the same prefix). Empty for a self-contained checkpoint. Removing a base breaks this checkpoint; the
	// library refuses to remove or overwrite one while others refer to it.
	Bases []string `json:"bases"`
	// ChainLength is the number of saves since the last self-contained checkpoint of its chain (0: it reads no base).
	ChainLength int `json:"chain_length"`
	// BytesInBases is how many of TotalBytes lie in its bases' data files.
	BytesInBases uint64 `json:"bytes_in_bases"`
	// StoredBytes is what the chunks take in data files (its own and its bases'): TotalBytes less what compression
	// saved (SaveOptions.Compression). Equal to TotalBytes when no chunk is compressed.
	StoredBytes uint64 `json:"stored_bytes"`
	// CompressedChunks is how many chunks are stored compressed (Chunk.Codec not "none"); 0 below format 3.0.
	CompressedChunks int `json:"compressed_chunks"`
}

// Info returns the checkpoint's summary.
func (r *Reader) Info() (Info, error) {
	p, err := r.acquire()
	if err != nil {
		return Info{}, err
	}
	defer r.release()
	return readerInfo(p)
}

func readerInfo(p *C.dckpt_reader) (Info, error) {
	var ci C.dckpt_checkpoint_info
	ci.version = C.DCKPT_CHECKPOINT_INFO_VERSION
	err := ccall(func() C.int { return C.dckpt_reader_info(&ci, p) })
	for older := 4; errors.Is(err, ErrVersion) && older >= 1; older-- {
		// A library of the same ABI from before this version of the struct: version 4 has no stored_bytes (read as
		// TotalBytes: nothing compressed), version 2 no source_version (read as ""), and version 1, from a library
		// that reads distckpt checkpoints only, leaves source NULL (read below as distckpt, checksummed).
		ci = C.dckpt_checkpoint_info{version: C.uint(older)}
		err = ccall(func() C.int { return C.dckpt_reader_info(&ci, p) })
	}
	if err != nil {
		return Info{}, err
	}
	format, checksummed := FormatDistckpt, true
	if ci.source != nil {
		if s := C.GoString(ci.source); s != "" {
			format = Format(s)
		}
		checksummed = ci.checksummed != 0
	}
	sourceVersion := ""
	if ci.version >= 3 && ci.source_version != nil {
		sourceVersion = C.GoString(ci.source_version)
	}
	bases := []string{}
	if ci.version >= 4 {
		for k := 0; k < int(ci.num_bases); k++ {
			var name *C.char
			if err := ccall(func() C.int { return C.dckpt_reader_base(&name, p, C.size_t(k)) }); err != nil {
				return Info{}, err
			}
			bases = append(bases, C.GoString(name))
		}
	}
	storedBytes, compressedChunks := uint64(ci.total_bytes), 0
	if ci.version >= 5 {
		storedBytes, compressedChunks = uint64(ci.stored_bytes), int(ci.compressed_chunks)
	}
	return Info{
		StoredBytes:       storedBytes,
		CompressedChunks:  compressedChunks,
		Bases:             bases,
		ChainLength:       int(ci.chain_length),
		BytesInBases:      uint64(ci.bytes_in_bases),
		Format:            format,
		Checksummed:       checksummed,
		SourceVersion:     sourceVersion,
		FormatMajor:       int(ci.format_major),
		FormatMinor:       int(ci.format_minor),
		Writer:            C.GoString(ci.writer),
		NumEntries:        int(ci.num_entries),
		NumFiles:          int(ci.num_files),
		TotalBytes:        uint64(ci.total_bytes),
		MetadataBytes:     uint64(ci.metadata_bytes),
		ChecksumBlockSize: uint64(ci.checksum_block_size),
	}, nil
}

// Format says who wrote the checkpoint (Info.Format): FormatDistckpt, or FormatSafetensors or FormatTorchDCP for a
// checkpoint another library wrote that the library reads in place. Every read works on either.
func (r *Reader) Format() (Format, error) {
	info, err := r.Info()
	return info.Format, err
}

// Checksummed reports whether the checkpoint's chunks carry checksums (Info.Checksummed): false for a checkpoint
// another library wrote, whose bytes cannot be verified (Verify fails with ErrUnsupported saying so).
func (r *Reader) Checksummed() (bool, error) {
	info, err := r.Info()
	return info.Checksummed, err
}

// EntryKind tells a tensor from an opaque bytes entry.
type EntryKind int

// Entry kinds, as in distckpt.h.
const (
	TensorEntry EntryKind = C.DCKPT_ENTRY_TENSOR
	BytesEntry  EntryKind = C.DCKPT_ENTRY_BYTES
)

func (k EntryKind) String() string {
	switch k {
	case TensorEntry:
		return "tensor"
	case BytesEntry:
		return "bytes"
	}
	return "unknown"
}

// Entry describes one named entry of a checkpoint.
type Entry struct {
	Index     int       // position in the checkpoint's entries (sorted by name)
	Name      string    //
	Kind      EntryKind //
	DType     DType     // tensors only
	Shape     []uint64  // tensors only; empty for a scalar
	NBytes    uint64    // stored size in bytes
	NumChunks int       //
}

// Entries lists every entry, sorted by name.
func (r *Reader) Entries() ([]Entry, error) {
	p, err := r.acquire()
	if err != nil {
		return nil, err
	}
	defer r.release()
	info, err := readerInfo(p)
	if err != nil {
		return nil, err
	}
	out := make([]Entry, info.NumEntries)
	for i := range out {
		if out[i], err = readerEntry(p, i); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Entry looks an entry up by name; ErrNotFound if there is none.
func (r *Reader) Entry(name string) (Entry, error) {
	p, err := r.acquire()
	if err != nil {
		return Entry{}, err
	}
	defer r.release()
	idx, err := readerFind(p, name)
	if err != nil {
		return Entry{}, err
	}
	return readerEntry(p, idx)
}

func readerFind(p *C.dckpt_reader, name string) (int, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var idx C.size_t
	err := ccall(func() C.int { return C.dckpt_reader_find(&idx, p, cname) })
	return int(idx), err
}

func readerEntry(p *C.dckpt_reader, index int) (Entry, error) {
	var ei C.dckpt_entry_info
	ei.version = C.DCKPT_ENTRY_INFO_VERSION
	if err := ccall(func() C.int { return C.dckpt_reader_entry(&ei, p, C.size_t(index)) }); err != nil {
		return Entry{}, err
	}
	return Entry{
		Index:     index,
		Name:      C.GoString(ei.name),
		Kind:      EntryKind(ei.kind),
		DType:     DType(ei.dtype),
		Shape:     copyU64(ei.shape, int(ei.ndim)),
		NBytes:    uint64(ei.nbytes),
		NumChunks: int(ei.num_chunks),
	}, nil
}

// copyU64 copies n values out of a borrowed C array.
func copyU64(p *C.uint64_t, n int) []uint64 {
	out := make([]uint64, n)
	if n > 0 {
		copy(out, unsafe.Slice((*uint64)(unsafe.Pointer(p)), n))
	}
	return out
}

// Chunk is one stored piece of an entry: the box [Offsets, Offsets+Lengths) of the tensor, held in File at
// FileOffset. A bytes entry has one chunk with an empty box.
type Chunk struct {
	Index      int
	Offsets    []uint64
	Lengths    []uint64
	File       string // data file name inside the checkpoint directory (of Base, when that is not "")
	FileOffset uint64
	Length     uint64 // bytes
	Checksum   uint64 // XXH3-64, see FORMAT.md section 5; 0 in a checkpoint another library wrote (it has none)
	Base       string // "" for the checkpoint's own file; else the base checkpoint (Info.Bases) whose file it is
	// Codec is how the chunk is stored: "none" (raw) or "zstd" (compressed per checksum block; Compression's
	// String). Reads decode it; its Length and Checksum are of the decoded bytes.
	Codec string
	// StoredLength is the bytes it takes in File from FileOffset: Length when stored raw.
	StoredLength uint64
}

// Chunks lists the chunks of entry number `entry` (Entry.Index).
func (r *Reader) Chunks(entry int) ([]Chunk, error) {
	p, err := r.acquire()
	if err != nil {
		return nil, err
	}
	defer r.release()
	e, err := readerEntry(p, entry)
	if err != nil {
		return nil, err
	}
	out := make([]Chunk, e.NumChunks)
	for i := range out {
		if out[i], err = readerChunk(p, entry, i); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func readerChunk(p *C.dckpt_reader, entry, chunk int) (Chunk, error) {
	var ci C.dckpt_chunk_info
	ci.version = C.DCKPT_CHUNK_INFO_VERSION
	err := ccall(func() C.int { return C.dckpt_reader_chunk(&ci, p, C.size_t(entry), C.size_t(chunk)) })
	for older := 2; errors.Is(err, ErrVersion) && older >= 1; older-- {
		// A library from before chunk info version 3 (no codec: stored raw) or 2 (no base).
		ci = C.dckpt_chunk_info{version: C.uint(older)}
		err = ccall(func() C.int { return C.dckpt_reader_chunk(&ci, p, C.size_t(entry), C.size_t(chunk)) })
	}
	if err != nil {
		return Chunk{}, err
	}
	base := ""
	if ci.version >= 2 && ci.base != nil {
		base = C.GoString(ci.base)
	}
	codec, stored := CompressionNone, uint64(ci.length)
	if ci.version >= 3 {
		codec, stored = Compression(ci.codec), uint64(ci.stored_length)
	}
	return Chunk{
		Codec:        codec.String(),
		StoredLength: stored,
		Base:         base,
		Index:        chunk,
		Offsets:      copyU64(ci.offsets, int(ci.ndim)),
		Lengths:      copyU64(ci.lengths, int(ci.ndim)),
		File:         C.GoString(ci.file),
		FileOffset:   uint64(ci.file_offset),
		Length:       uint64(ci.length),
		Checksum:     uint64(ci.checksum),
	}, nil
}

// Read returns the whole of entry `name`: a tensor's elements in row-major order (little-endian), or a bytes
// entry's blob.
func (r *Reader) Read(name string) ([]byte, error) {
	p, err := r.acquire()
	if err != nil {
		return nil, err
	}
	defer r.release()
	idx, err := readerFind(p, name)
	if err != nil {
		return nil, err
	}
	e, err := readerEntry(p, idx)
	if err != nil {
		return nil, err
	}
	if e.Kind == BytesEntry {
		b, err := readBytes(p, name, e.NBytes)
		return b, r.storage.explain(err)
	}
	dst := make([]byte, e.NBytes)
	return dst, r.storage.explain(readRegion(p, name, make([]uint64, len(e.Shape)), e.Shape, dst))
}

func readBytes(p *C.dckpt_reader, name string, size uint64) ([]byte, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	dst := make([]byte, size)
	var got C.uint64_t
	err := ccall(func() C.int {
		return C.dckpt_reader_read_bytes(&got, p, cname, bytesPtr(dst), C.uint64_t(len(dst)))
	})
	if err != nil {
		return nil, err
	}
	return dst[:got], nil
}

// ReadRegion returns the box [offsets, offsets+lengths) of tensor `name`, row-major. Only the bytes the box needs are
// read (rounded out to checksum blocks when verifying).
func (r *Reader) ReadRegion(name string, offsets, lengths []uint64) ([]byte, error) {
	e, err := r.Entry(name)
	if err != nil {
		return nil, err
	}
	if len(offsets) != len(lengths) {
		return nil, errorf(CodeInvalid, "checkpoint '%s', tensor '%s': %d offsets but %d lengths", r.path, name,
			len(offsets), len(lengths))
	}
	n := uint64(e.DType.Size())
	for _, l := range lengths {
		if l != 0 && n > ^uint64(0)/l {
			return nil, errorf(CodeInvalid, "checkpoint '%s', tensor '%s': the region is too large", r.path, name)
		}
		n *= l
	}
	if n > uint64(maxInt) {
		return nil, errorf(CodeInvalid, "checkpoint '%s', tensor '%s': a %d-byte region does not fit in memory",
			r.path, name, n)
	}
	dst := make([]byte, n)
	return dst, r.ReadInto(name, offsets, lengths, dst)
}

const maxInt = int(^uint(0) >> 1)

// ReadInto reads the box [offsets, offsets+lengths) of tensor `name` into dst, whose length must be exactly the
// box's volume times the dtype size.
func (r *Reader) ReadInto(name string, offsets, lengths []uint64, dst []byte) error {
	if len(offsets) != len(lengths) {
		return errorf(CodeInvalid, "checkpoint '%s', tensor '%s': %d offsets but %d lengths", r.path, name,
			len(offsets), len(lengths))
	}
	p, err := r.acquire()
	if err != nil {
		return err
	}
	defer r.release()
	return r.storage.explain(readRegion(p, name, offsets, lengths, dst))
}

func readRegion(p *C.dckpt_reader, name string, offsets, lengths []uint64, dst []byte) error {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	return ccall(func() C.int {
		return C.dckpt_reader_read(p, cname, C.size_t(len(offsets)), u64Ptr(offsets), u64Ptr(lengths),
			bytesPtr(dst), C.uint64_t(len(dst)))
	})
}

// u64Ptr and bytesPtr pass Go slices (which hold no Go pointers) to a C call that does not keep them; nil if empty.
func u64Ptr(s []uint64) *C.uint64_t {
	if len(s) == 0 {
		return nil
	}
	return (*C.uint64_t)(unsafe.Pointer(&s[0]))
}

func bytesPtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

// UserMetadata returns the free-form key/values saved with the checkpoint (for example "step").
func (r *Reader) UserMetadata() (map[string]string, error) {
	p, err := r.acquire()
	if err != nil {
		return nil, err
	}
	defer r.release()
	var n C.size_t
	if err := ccall(func() C.int { return C.dckpt_reader_num_user(&n, p) }); err != nil {
		return nil, err
	}
	out := make(map[string]string, int(n))
	for i := 0; i < int(n); i++ {
		var k, v *C.char
		if err := ccall(func() C.int { return C.dckpt_reader_user(&k, &v, p, C.size_t(i)) }); err != nil {
			return nil, err
		}
		out[C.GoString(k)] = C.GoString(v)
	}
	return out, nil
}

// Structure returns the opaque description bindings use to rebuild nested state (may be empty).
func (r *Reader) Structure() ([]byte, error) {
	p, err := r.acquire()
	if err != nil {
		return nil, err
	}
	defer r.release()
	var data *C.char
	var size C.size_t
	if err := ccall(func() C.int { return C.dckpt_reader_structure(&data, &size, p) }); err != nil {
		return nil, err
	}
	return C.GoBytes(unsafe.Pointer(data), C.int(size)), nil
}

// IOStats are the reader's I/O counters since it was opened.
type IOStats struct {
	BytesRead      uint64 `json:"bytes_read"`
	ReadCalls      uint64 `json:"read_calls"`
	BytesVerified  uint64 `json:"bytes_verified"`
	BytesDelivered uint64 `json:"bytes_delivered"`
	// BytesMapped were delivered straight from the page cache through a mapping (not in BytesRead).
	BytesMapped uint64 `json:"bytes_mapped"`
	// BytesReadDirect of BytesRead were read past the page cache (O_DIRECT) for device destinations.
	BytesReadDirect uint64 `json:"bytes_read_direct"`
}

// IOStats returns the reader's I/O counters.
func (r *Reader) IOStats() (IOStats, error) {
	p, err := r.acquire()
	if err != nil {
		return IOStats{}, err
	}
	defer r.release()
	var s C.dckpt_io_stats
	s.version = C.DCKPT_IO_STATS_VERSION
	if err := ccall(func() C.int { return C.dckpt_reader_io_stats(&s, p) }); err != nil {
		return IOStats{}, err
	}
	return IOStats{
		BytesRead:       uint64(s.bytes_read),
		ReadCalls:       uint64(s.read_calls),
		BytesVerified:   uint64(s.bytes_verified),
		BytesDelivered:  uint64(s.bytes_delivered),
		BytesMapped:     uint64(s.bytes_mapped),
		BytesReadDirect: uint64(s.bytes_read_direct),
	}, nil
}
