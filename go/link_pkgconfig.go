//go:build !distckpt_nopkgconfig && !distckpt_static

package distckpt

// By default the compiler and linker flags come from pkg-config (distckpt.pc, installed by scripts/build_lib.sh):
// libdistckpt.so, found at run time through the .pc file's rpath. Build with -tags distckpt_static to link the static
// archive instead (link_static.go), or with -tags distckpt_nopkgconfig to supply the flags through CGO_CFLAGS /
// CGO_LDFLAGS (link_env.go).

// #cgo pkg-config: distckpt
import "C"
