//go:build distckpt_nopkgconfig

package distckpt

// With -tags distckpt_nopkgconfig, pkg-config is not run: point cgo at the library through the environment, e.g.
//
//	CGO_CFLAGS="-I$ROOT/include" CGO_LDFLAGS="-L$ROOT/lib -Wl,-rpath,$ROOT/lib" go build -tags distckpt_nopkgconfig
//
// where $ROOT is the install tree printed by scripts/build_lib.sh.

// #cgo LDFLAGS: -ldistckpt
import "C"
