//go:build !distckpt_nopkgconfig

package distckpt

// By default the compiler and linker flags come from pkg-config (distckpt.pc, installed by scripts/build_lib.sh).
// Build with -tags distckpt_nopkgconfig to supply them through CGO_CFLAGS / CGO_LDFLAGS instead (link_env.go).

// #cgo pkg-config: distckpt
import "C"
