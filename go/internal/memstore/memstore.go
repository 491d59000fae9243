// Package memstore is an in-memory distckpt.Storage for tests: a map of paths to bytes behind a mutex, with counters
// and fault injection.
package memstore

import (
	"fmt"
	"io"
	"io/fs"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	distckpt "distckpt.dev/go"
)

// Store is a map of '/'-separated paths to file contents. It implements distckpt.Storage and distckpt.Committer.
type Store struct {
	mu    sync.Mutex
	files map[string][]byte

	// Fail, if set, is asked before each operation ("create", "write", "close", "size", "read", "list", "remove",
	// "commit") on path; a non-nil error fails it.
	Fail func(op, path string) error
	// Panic, if set, is asked likewise; true panics.
	Panic func(op, path string) bool
	// KeepOnRemove makes Remove do nothing (a writer that crashed before it could clean up).
	KeepOnRemove atomic.Bool

	inFlight, MaxInFlight atomic.Int64 // WriteAt and ReadAt calls running now, and the most at once
	Commits, Creates      atomic.Int64
}

// New returns an empty store.
func New() *Store { return &Store{files: map[string][]byte{}} }

func (s *Store) check(op, path string) error {
	if s.Panic != nil && s.Panic(op, path) {
		panic(fmt.Sprintf("memstore: injected panic in %s %s", op, path))
	}
	if s.Fail != nil {
		return s.Fail(op, path)
	}
	return nil
}

func (s *Store) enter() {
	n := s.inFlight.Add(1)
	for {
		m := s.MaxInFlight.Load()
		if n <= m || s.MaxInFlight.CompareAndSwap(m, n) {
			break
		}
	}
}

// Paths lists every file, sorted.
func (s *Store) Paths() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for p := range s.files {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// Get returns a file's contents.
func (s *Store) Get(path string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.files[path]
	return b, ok
}

// Put sets a file's contents.
func (s *Store) Put(path string, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.files[path] = append([]byte(nil), data...)
}

type file struct {
	s    *Store
	path string
	mu   sync.Mutex
	buf  []byte
}

// Create starts a file; it appears at Close.
func (s *Store) Create(path string, sizeHint uint64) (distckpt.StorageFile, error) {
	if err := s.check("create", path); err != nil {
		return nil, err
	}
	s.Creates.Add(1)
	return &file{s: s, path: path, buf: make([]byte, 0, sizeHint)}, nil
}

func (f *file) WriteAt(p []byte, off uint64) error {
	f.s.enter()
	defer f.s.inFlight.Add(-1)
	if err := f.s.check("write", f.path); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	end := off + uint64(len(p))
	if end > uint64(len(f.buf)) {
		if end > uint64(cap(f.buf)) {
			nb := make([]byte, end, 2*end)
			copy(nb, f.buf)
			f.buf = nb
		} else {
			f.buf = f.buf[:end]
		}
	}
	copy(f.buf[off:], p)
	return nil
}

func (f *file) Sync() error { return nil }

func (f *file) Close(size uint64, discard bool) error {
	if discard {
		return nil
	}
	if err := f.s.check("close", f.path); err != nil {
		return err
	}
	f.mu.Lock()
	data := make([]byte, size)
	copy(data, f.buf)
	f.mu.Unlock()
	f.s.Put(f.path, data)
	return nil
}

// Size is a file's size.
func (s *Store) Size(path string) (uint64, error) {
	if err := s.check("size", path); err != nil {
		return 0, err
	}
	b, ok := s.Get(path)
	if !ok {
		return 0, fmt.Errorf("memstore: %s: %w", path, fs.ErrNotExist)
	}
	return uint64(len(b)), nil
}

// ReadAt reads from a file.
func (s *Store) ReadAt(path string, p []byte, off uint64) (int, error) {
	s.enter()
	defer s.inFlight.Add(-1)
	if err := s.check("read", path); err != nil {
		return 0, err
	}
	b, ok := s.Get(path)
	if !ok {
		return 0, fmt.Errorf("memstore: %s: %w", path, fs.ErrNotExist)
	}
	if off >= uint64(len(b)) {
		return 0, io.EOF
	}
	return copy(p, b[off:]), nil
}

// List names what is directly below dir.
func (s *Store) List(dir string) ([]string, error) {
	if err := s.check("list", dir); err != nil {
		return nil, err
	}
	prefix := strings.TrimSuffix(dir, "/") + "/"
	if dir == "" {
		prefix = ""
	}
	seen := map[string]bool{}
	var out []string
	for _, p := range s.Paths() {
		if !strings.HasPrefix(p, prefix) {
			continue
		}
		name := strings.SplitN(p[len(prefix):], "/", 2)[0]
		if name != "" && !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	return out, nil
}

// Remove removes a file (nothing when KeepOnRemove is set).
func (s *Store) Remove(path string) error {
	if err := s.check("remove", path); err != nil {
		return err
	}
	if s.KeepOnRemove.Load() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.files, path)
	return nil
}

// Commit writes a file in one step; fs.ErrExist when !replace and it is there.
func (s *Store) Commit(path string, data []byte, replace bool) error {
	if err := s.check("commit", path); err != nil {
		return err
	}
	s.Commits.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.files[path]; ok && !replace {
		return fmt.Errorf("memstore: %s: %w", path, fs.ErrExist)
	}
	s.files[path] = append([]byte(nil), data...)
	return nil
}
