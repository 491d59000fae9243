package distckpt

/*
#include <stdlib.h>
#include <string.h>
#include <distckpt/distckpt.h>
*/
import "C"

import (
	"fmt"
	"sort"
	"unsafe"
)

// State is what one process saves: tensors made of pieces of a global shape, opaque bytes entries, and user
// metadata. It keeps references to the slices it is given until Save copies them. Not safe for concurrent use.
type State struct {
	names     []string // tensors and bytes entries, in the order they were added
	tensors   map[string]*tensorSpec
	blobs     map[string][]byte
	user      map[string]string
	structure []byte
}

type tensorSpec struct {
	dtype  DType
	shape  []uint64
	pieces []pieceSpec
}

type pieceSpec struct {
	offsets, lengths []uint64
	data             []byte
}

// NewState returns an empty state.
func NewState() *State {
	return &State{tensors: map[string]*tensorSpec{}, blobs: map[string][]byte{}, user: map[string]string{}}
}

func (s *State) checkNew(name string) error {
	if _, ok := s.tensors[name]; ok {
		return errorf(CodeInvalid, "entry '%s' is already in the state", name)
	}
	if _, ok := s.blobs[name]; ok {
		return errorf(CodeInvalid, "entry '%s' is already in the state", name)
	}
	return nil
}

// AddTensor declares a tensor with its global shape (empty for a scalar). Its data comes from AddPiece.
func (s *State) AddTensor(name string, dtype DType, shape []uint64) error {
	if err := s.checkNew(name); err != nil {
		return err
	}
	if dtype.Size() == 0 {
		return errorf(CodeInvalid, "tensor '%s': unknown dtype %d", name, int(dtype))
	}
	if len(shape) > int(C.DCKPT_MAX_DIMS) {
		return errorf(CodeInvalid, "tensor '%s': %d dimensions, at most %d are supported", name, len(shape),
			int(C.DCKPT_MAX_DIMS))
	}
	s.tensors[name] = &tensorSpec{dtype: dtype, shape: append([]uint64(nil), shape...)}
	s.names = append(s.names, name)
	return nil
}

// AddPiece adds this process's box [offsets, offsets+lengths) of tensor `name`, held row-major (little-endian) in
// data, whose length must be the box's volume times the dtype size.
func (s *State) AddPiece(name string, offsets, lengths []uint64, data []byte) error {
	t, ok := s.tensors[name]
	if !ok {
		return errorf(CodeNotFound, "tensor '%s' was not declared with AddTensor", name)
	}
	if len(offsets) != len(t.shape) || len(lengths) != len(t.shape) {
		return errorf(CodeInvalid, "tensor '%s' has %d dimensions; the piece has %d offsets and %d lengths", name,
			len(t.shape), len(offsets), len(lengths))
	}
	want := uint64(t.dtype.Size())
	for d := range t.shape {
		if offsets[d] > t.shape[d] || lengths[d] > t.shape[d]-offsets[d] {
			return errorf(CodeInvalid, "tensor '%s': piece [%d, %d) of dimension %d is outside the shape %v", name,
				offsets[d], offsets[d]+lengths[d], d, t.shape)
		}
		want *= lengths[d] // cannot overflow a real buffer: it is bounded by len(data) below
	}
	if want != uint64(len(data)) {
		return errorf(CodeInvalid, "tensor '%s': the piece needs %d bytes of %s data, got %d", name, want,
			t.dtype, len(data))
	}
	t.pieces = append(t.pieces, pieceSpec{
		offsets: append([]uint64(nil), offsets...), lengths: append([]uint64(nil), lengths...), data: data,
	})
	return nil
}

// AddTensorData declares a tensor and adds all of it as one piece.
func (s *State) AddTensorData(name string, dtype DType, shape []uint64, data []byte) error {
	if err := s.AddTensor(name, dtype, shape); err != nil {
		return err
	}
	if err := s.AddPiece(name, make([]uint64, len(shape)), shape, data); err != nil {
		delete(s.tensors, name)
		s.names = s.names[:len(s.names)-1]
		return err
	}
	return nil
}

// AddBytes adds an opaque bytes entry.
func (s *State) AddBytes(name string, data []byte) error {
	if err := s.checkNew(name); err != nil {
		return err
	}
	s.blobs[name] = data
	s.names = append(s.names, name)
	return nil
}

// SetUser sets a free-form metadata key (for example "step"; `distckpt ls` and `prune` read it).
func (s *State) SetUser(key, value string) { s.user[key] = value }

// SetStructure sets the opaque description bindings use to rebuild nested state.
func (s *State) SetStructure(data []byte) { s.structure = append([]byte(nil), data...) }

// SaveOptions configures Save. The zero value (or nil) means the library's defaults.
type SaveOptions struct {
	Overwrite         bool         // replace an existing checkpoint at the path
	NoSync            bool         // skip fsync (tests, scratch data); the commit is still atomic but not durable
	IOThreads         int          // 0: default
	ChecksumBlockSize uint64       // 0: default (1 MiB); else a power of two >= 4096
	Progress          ProgressFunc // bytes written so far
	// Storage is where the checkpoint is written (nil: the storage the path names: S3 for an "s3://" URL, else the
	// POSIX file system). On a storage other than POSIX the checkpoint is committed by writing its metadata last, and
	// path is the storage's (an "s3://bucket/prefix" URL, an object key prefix, ...).
	Storage *StorageHandle
	// Base makes an incremental save: an earlier checkpoint beside path (its path in the same directory, or its name)
	// whose chunks are not written again where the bytes are equal (same entry and region, same XXH3-128); the
	// checkpoint refers to them and needs those checkpoints to be read (Info.Bases). "": a self-contained save.
	Base string
	// FullEvery, with Base: the FullEvery-th save of a chain (counted from the last self-contained one) is written
	// whole instead. 0: no bound.
	FullEvery int
	// Compression stores chunks compressed, losslessly: with CompressionZstd every checksum block is compressed on
	// its own, its elements' bytes grouped by position first (2-, 4- and 8-byte dtypes); a block that does not shrink
	// is stored raw. The checkpoint is format 3.0 (Info.StoredBytes, Info.CompressedChunks, Chunk.Codec); reads
	// decode it, checking both the stored and the decoded bytes. CompressionNone (the zero value): stored raw.
	Compression Compression
	// CompressionLevel, with Compression: 0 is the library's default coding; -7 (fastest) to -1 and 1 to 22 are
	// zstd's levels (distckpt.h, dckpt_save_options.compression_level). With CompressionZstd, a level outside them
	// fails the save with ErrInvalid; without compression it is not used.
	CompressionLevel int
}

// Compression says how chunks are stored (dckpt_compression): SaveOptions.Compression, and Chunk.Codec as its
// String.
type Compression int

// Compressions, as in distckpt.h. A newer library may report others.
const (
	// CompressionNone: chunks stored raw (the default).
	CompressionNone Compression = C.DCKPT_COMPRESSION_NONE
	// CompressionZstd: zstd over byte-grouped elements, per checksum block.
	CompressionZstd Compression = C.DCKPT_COMPRESSION_ZSTD
)

// String is "none" or "zstd" (Chunk.Codec; inspect's "codec").
func (c Compression) String() string {
	switch c {
	case CompressionNone:
		return "none"
	case CompressionZstd:
		return "zstd"
	}
	return fmt.Sprintf("compression %d", int(c))
}

// SaveInfo reports what Save wrote.
type SaveInfo struct {
	NumFiles      int     `json:"num_files"`
	NumEntries    int     `json:"num_entries"`
	BytesWritten  uint64  `json:"bytes_written"`
	TotalBytes    uint64  `json:"total_bytes"`
	MetadataBytes uint64  `json:"metadata_bytes"`
	Seconds       float64 `json:"seconds"`
	BytesReused   uint64  `json:"bytes_reused"` // of TotalBytes, those an incremental save refers to in its bases
}

// cState owns a C state and the C copies of the buffers it borrows. cgo forbids C from keeping Go pointers after a
// call returns, and a C state keeps its buffers until dckpt_save, so Save copies every buffer into C memory first.
type cState struct {
	ptr  *C.dckpt_state
	bufs []unsafe.Pointer
}

func (c *cState) free() {
	C.dckpt_state_free(c.ptr)
	for _, b := range c.bufs {
		C.free(b)
	}
}

func (c *cState) cbytes(name string, b []byte) (unsafe.Pointer, error) {
	n := len(b)
	if n == 0 {
		n = 1 // a valid pointer even for empty data
	}
	p := C.malloc(C.size_t(n))
	if p == nil {
		return nil, errorf(CodeNoMem, "entry '%s': out of memory copying %d bytes for the save", name, len(b))
	}
	c.bufs = append(c.bufs, p)
	if len(b) > 0 {
		C.memcpy(p, unsafe.Pointer(&b[0]), C.size_t(len(b)))
	}
	return p, nil
}

func (s *State) build() (*cState, error) {
	c := &cState{}
	if err := ccall(func() C.int { return C.dckpt_state_new(&c.ptr) }); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			c.free()
		}
	}()
	for _, name := range s.names {
		cname := C.CString(name)
		c.bufs = append(c.bufs, unsafe.Pointer(cname))
		if t, isTensor := s.tensors[name]; isTensor {
			shape := append([]uint64(nil), t.shape...)
			if err := ccall(func() C.int {
				return C.dckpt_state_add_tensor(c.ptr, cname, C.int(t.dtype), C.size_t(len(shape)), u64Ptr(shape))
			}); err != nil {
				return nil, err
			}
			for _, pc := range t.pieces {
				data, err := c.cbytes(name, pc.data)
				if err != nil {
					return nil, err
				}
				if err := ccall(func() C.int {
					return C.dckpt_state_add_piece(c.ptr, cname, u64Ptr(pc.offsets), u64Ptr(pc.lengths), data)
				}); err != nil {
					return nil, err
				}
			}
		} else {
			b := s.blobs[name]
			data, err := c.cbytes(name, b)
			if err != nil {
				return nil, err
			}
			if err := ccall(func() C.int {
				return C.dckpt_state_add_bytes(c.ptr, cname, data, C.uint64_t(len(b)))
			}); err != nil {
				return nil, err
			}
		}
	}
	keys := make([]string, 0, len(s.user))
	for k := range s.user {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ck, cv := C.CString(k), C.CString(s.user[k])
		c.bufs = append(c.bufs, unsafe.Pointer(ck), unsafe.Pointer(cv))
		if err := ccall(func() C.int { return C.dckpt_state_set_user(c.ptr, ck, cv) }); err != nil {
			return nil, err
		}
	}
	if len(s.structure) > 0 {
		data, err := c.cbytes("(structure)", s.structure)
		if err != nil {
			return nil, err
		}
		if err := ccall(func() C.int {
			return C.dckpt_state_set_structure(c.ptr, (*C.char)(data), C.size_t(len(s.structure)))
		}); err != nil {
			return nil, err
		}
	}
	ok = true
	return c, nil
}

// Save writes state to the directory path as one process, atomically: the checkpoint is written under a staging
// name and renamed into place, so path either holds the complete checkpoint or nothing new (at an "s3://" URL, or on
// another storage without rename, it is committed by writing its metadata last). ErrExists if path exists and
// opts.Overwrite is not set.
func Save(path string, state *State, opts *SaveOptions) (SaveInfo, error) {
	var copts C.dckpt_save_options
	if err := ccall(func() C.int { return C.dckpt_save_options_init(&copts, C.DCKPT_SAVE_OPTIONS_VERSION) }); err != nil {
		return SaveInfo{}, err
	}
	var hook *progressHook
	var storage *StorageHandle
	if opts != nil {
		storage = opts.Storage
		ptr, err := storage.acquire()
		if err != nil {
			return SaveInfo{}, err
		}
		defer storage.release()
		copts.storage = ptr
		if opts.Overwrite {
			copts.overwrite = 1
		}
		if opts.NoSync {
			copts.sync = 0
		}
		copts.io_threads = C.unsigned(opts.IOThreads)
		copts.checksum_block_size = C.uint64_t(opts.ChecksumBlockSize)
		if opts.Base != "" {
			cbase := C.CString(opts.Base)
			defer C.free(unsafe.Pointer(cbase))
			copts.base = cbase
		}
		copts.full_every = C.unsigned(opts.FullEvery)
		if int(C.int(opts.Compression)) != int(opts.Compression) ||
			int(C.int(opts.CompressionLevel)) != opts.CompressionLevel { // the library judges what fits
			return SaveInfo{}, errorf(CodeInvalid, "saving '%s': compression %d, level %d: out of range", path,
				int(opts.Compression), opts.CompressionLevel)
		}
		copts.compression = C.int(opts.Compression)
		copts.compression_level = C.int(opts.CompressionLevel)
		hook = newProgressHook(opts.Progress)
		copts.progress = hook.cfn()
		copts.progress_user_data = hook.userData()
	}
	cs, err := state.build()
	if err != nil {
		return SaveInfo{}, hook.finish(err)
	}
	defer cs.free()
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var info C.dckpt_save_info
	info.version = C.DCKPT_SAVE_INFO_VERSION
	err = storage.explain(hook.finish(ccall(func() C.int { return C.dckpt_save(&info, cpath, cs.ptr, nil, &copts) })))
	if err != nil {
		return SaveInfo{}, err
	}
	return SaveInfo{
		NumFiles: int(info.num_files), NumEntries: int(info.num_entries), BytesWritten: uint64(info.bytes_written),
		TotalBytes: uint64(info.total_bytes), MetadataBytes: uint64(info.metadata_bytes), Seconds: float64(info.seconds),
		BytesReused: uint64(info.bytes_reused),
	}, nil
}
