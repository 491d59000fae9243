//go:build distckpt_nopkgconfig && !distckpt_static

package distckpt

// With -tags distckpt_nopkgconfig, pkg-config is not run: point cgo at the library through the environment, e.g.
//
//	CGO_CFLAGS="-I$ROOT/include" CGO_LDFLAGS="-L$ROOT/lib -Wl,-rpath,$ROOT/lib" go build -tags distckpt_nopkgconfig
//
// where $ROOT is the install tree printed by scripts/build_lib.sh. Adding the distckpt_static tag as well links the
// static archive, with every flag from the environment (link_static.go).

// #cgo LDFLAGS: -ldistckpt
import "C"
