// Package distckpt reads, verifies and writes distckpt checkpoints through libdistckpt's C ABI (distckpt.h).
//
// Linking: cgo finds the library with pkg-config (distckpt.pc, laid out by scripts/build_lib.sh):
//
//	export PKG_CONFIG_PATH=$(scripts/build_lib.sh)/lib/pkgconfig
//	go build ./...                          # libdistckpt.so, through the .pc file's rpath
//	go build -tags distckpt_static ./...    # libdistckpt.a inside the binary (distckpt-static.pc): no rpath needed
//
// or, without pkg-config, through the standard cgo environment and the distckpt_nopkgconfig build tag:
//
//	CGO_CFLAGS="-I$ROOT/include" CGO_LDFLAGS="-L$ROOT/lib -Wl,-rpath,$ROOT/lib" go build -tags distckpt_nopkgconfig ./...
//
// The package refuses to compile against a header of another ABI version, and panics at start-up if the loaded
// library reports a different ABI version from the header it was compiled with.
//
// From a module of one's own: require distckpt.dev/go v0.0.0 and replace it with a checkout's go/ directory (see
// go/README.md, "Use it from your own module").
//
// Threading: a *Reader may be used from any number of goroutines at once (the C reader is thread-safe); Close waits
// for calls in flight. A *State is not safe for concurrent modification. Errors are *Error values that match the
// sentinels (ErrCorrupt, ErrNotFound, ...) and the io/fs ones (fs.ErrNotExist, ...) with errors.Is.
//
// Values Python saved as bytes entries read back with Reader.Value, its nested structure with
// Reader.ParsedStructure. Package distckpt.dev/go/store lists and prunes directories of checkpoints.
package distckpt

/*
#include <distckpt/distckpt.h>

#if DCKPT_ABI_VERSION != 1
#error "the Go package distckpt is written for DCKPT_ABI_VERSION 1; this distckpt.h declares another ABI version"
#endif
*/
import "C"

import "fmt"

// ABIVersion is the C ABI version this package was compiled against (DCKPT_ABI_VERSION).
const ABIVersion = int(C.DCKPT_ABI_VERSION)

// HeaderVersion is the version string of the distckpt.h this package was compiled against.
const HeaderVersion = C.DCKPT_VERSION_STRING

func init() {
	if got := int(C.dckpt_abi_version()); got != ABIVersion {
		panic(fmt.Sprintf("distckpt: libdistckpt %s has ABI version %d, but this Go package was built against "+
			"distckpt.h ABI version %d; rebuild it against the library it runs with", LibraryVersion(), got, ABIVersion))
	}
}

// LibraryVersion is the version string of the loaded libdistckpt ("0.1.0").
func LibraryVersion() string { return C.GoString(C.dckpt_version_string()) }
