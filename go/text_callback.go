package distckpt

// The callback libdistckpt calls with a whole text (dckpt_text_fn, set up in tiers.go). The text is the library's,
// valid during the call only: it is copied.

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

//export distckptGoText
func distckptGoText(text *C.char, size C.size_t, h C.uintptr_t) C.int {
	out := cgo.Handle(h).Value().(*[]byte)
	*out = C.GoBytes(unsafe.Pointer(text), C.int(size))
	return 0
}
