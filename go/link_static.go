//go:build distckpt_static && !distckpt_nopkgconfig

package distckpt

// With -tags distckpt_static, the library is linked from the static archive libdistckpt.a through pkg-config's
// distckpt-static.pc (scripts/build_lib.sh writes it beside distckpt.pc): the binary carries the library inside it
// and needs no libdistckpt.so, no rpath and no LD_LIBRARY_PATH; it loads nothing but the C library. (A
// program that joins a Gloo group would load the Gloo plugin, libdistckpt_gloo.so, from beside its executable or
// from DCKPT_GLOO_PLUGIN; the Go package makes no Gloo communicator.)
//
// Only one of link_pkgconfig.go (the default: distckpt.pc, libdistckpt.so), link_env.go (-tags distckpt_nopkgconfig)
// and this file is compiled. With both tags, none is: give the whole static link through the environment, e.g.
//
//	CGO_CFLAGS="-I$ROOT/include" \
//	CGO_LDFLAGS="$ROOT/lib/libdistckpt.a -lm -ldl -pthread" \
//	  go build -tags "distckpt_static distckpt_nopkgconfig"

// #cgo pkg-config: distckpt-static
import "C"
