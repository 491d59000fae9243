package distckpt

// The callback libdistckpt calls with each name List finds (dckpt_name_fn, set up in storage_url.go). The name is the
// library's, valid during the call only: it is copied.

/*
#include <stdint.h>
*/
import "C"

import "runtime/cgo"

//export distckptGoName
func distckptGoName(name *C.char, h C.uintptr_t) C.int {
	names := cgo.Handle(h).Value().(*[]string)
	*names = append(*names, C.GoString(name))
	return 0
}
