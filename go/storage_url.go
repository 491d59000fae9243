package distckpt

// Storage named by a URL, and listing what is below a path of any storage. The core resolves URLs
// (dckpt_storage_open_url): "s3://bucket/prefix" is S3 configured from the AWS_* environment, a plain path the POSIX
// file system, any other scheme ErrUnsupported naming it. Every call that takes a path with a nil *StorageHandle
// (Open, Save, ExportSafetensors, Stat, RemoveLeftovers, RemoveCheckpoint, List) resolves it the same way.

/*
#include <stdint.h>
#include <stdlib.h>
#include <distckpt/distckpt.h>

// Weak, as in s3.go: OpenStorageURL and List report ErrUnsupported on a library built before them.
#pragma weak dckpt_storage_open_url
#pragma weak dckpt_storage_list_dir
#pragma weak dckpt_url_scheme

// The length of path's URL scheme by the core's rule (0: a plain path, or a library without dckpt_url_scheme).
static size_t distckpt_go_url_scheme(const char *path) {
  size_t n = 0;
  if (dckpt_url_scheme == NULL || dckpt_url_scheme(&n, path) != DCKPT_OK) return 0;
  return n;
}

static int distckpt_go_has_urls(void) { return dckpt_storage_open_url != NULL && dckpt_storage_list_dir != NULL; }

// The Go side of the listing's callback (list_callback.go); user_data is a cgo.Handle carried as an integer.
extern int distckptGoName(char *name, uintptr_t h);

static int dgo_name(const char *name, void *ud) { return distckptGoName((char *)name, (uintptr_t)ud); }

static int dgo_storage_list(dckpt_storage *s, const char *dir, uintptr_t h) {
  return dckpt_storage_list_dir(s, dir, dgo_name, (void *)h);
}
*/
import "C"

import (
	"runtime/cgo"
	"strings"
	"unsafe"
)

// IsURL reports whether path names storage by a URL ("scheme://...") rather than a path of the file system: the
// form the core resolves to a storage of the scheme (s3), or rejects naming the scheme. The rule is the core's
// (dckpt_url_scheme).
func IsURL(path string) bool {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	return C.distckpt_go_url_scheme(cpath) > 0
}

// OpenStorageURL makes a handle for the storage url names: "s3://..." S3 from the AWS_* environment, a plain path the
// POSIX file system. Any other scheme is an error of code CodeUnsupported naming it. Paths given with the handle are
// URLs (or plain paths) too. One handle for many calls on one bucket shares its connections.
func OpenStorageURL(url string) (*StorageHandle, error) {
	if C.distckpt_go_has_urls() == 0 {
		return nil, errorf(CodeUnsupported, "the loaded libdistckpt %s cannot open storage by URL "+
			"(dckpt_storage_open_url); upgrade it", LibraryVersion())
	}
	kind := "posix"
	if IsURL(url) {
		kind, _, _ = strings.Cut(url, "://")
	}
	curl := C.CString(url)
	defer C.free(unsafe.Pointer(curl))
	return builtinStorage(kind, func(out **C.dckpt_storage) C.int { return C.dckpt_storage_open_url(out, curl) })
}

// List returns the names directly below dir, each once, in byte order: files and "directories" (on an object store,
// the first component of longer keys: "run/step-1/metadata.dckpt" is "step-1" below "run"). A dir with nothing below
// it has none. On a nil handle, dir is a URL or a path and names its storage itself.
func (h *StorageHandle) List(dir string) ([]string, error) {
	if C.distckpt_go_has_urls() == 0 {
		return nil, errorf(CodeUnsupported, "the loaded libdistckpt %s cannot list storage (dckpt_storage_list_dir); "+
			"upgrade it", LibraryVersion())
	}
	var names []string
	hh := cgo.NewHandle(&names)
	defer hh.Delete()
	err := h.onPath(dir, func(p *C.dckpt_storage, cdir *C.char) error {
		return h.explain(ccall(func() C.int { return C.dgo_storage_list(p, cdir, C.uintptr_t(hh)) }))
	})
	if err != nil {
		return nil, err
	}
	return names, nil
}

// ListDir is List on the storage dir names: "s3://bucket/prefix" or a directory.
func ListDir(dir string) ([]string, error) { return (*StorageHandle)(nil).List(dir) }
