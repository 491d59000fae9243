package distckpt

/*
#include <stdlib.h>
#include <distckpt/distckpt.h>
*/
import "C"

import "unsafe"

// DType is an element type (dckpt_dtype). Every dtype is stored little-endian.
type DType int

// Element types, as in distckpt.h.
const (
	Bool     DType = C.DCKPT_DTYPE_BOOL
	U8       DType = C.DCKPT_DTYPE_U8
	I8       DType = C.DCKPT_DTYPE_I8
	U16      DType = C.DCKPT_DTYPE_U16
	I16      DType = C.DCKPT_DTYPE_I16
	U32      DType = C.DCKPT_DTYPE_U32
	I32      DType = C.DCKPT_DTYPE_I32
	U64      DType = C.DCKPT_DTYPE_U64
	I64      DType = C.DCKPT_DTYPE_I64
	F16      DType = C.DCKPT_DTYPE_F16
	BF16     DType = C.DCKPT_DTYPE_BF16
	F32      DType = C.DCKPT_DTYPE_F32
	F64      DType = C.DCKPT_DTYPE_F64
	C64      DType = C.DCKPT_DTYPE_C64
	C128     DType = C.DCKPT_DTYPE_C128
	F8E4M3FN DType = C.DCKPT_DTYPE_F8_E4M3FN
	F8E5M2   DType = C.DCKPT_DTYPE_F8_E5M2
)

// String is the canonical name ("F32", "BF16", "F8_E4M3"), as safetensors spells it where it has one; "" for an
// unknown dtype.
func (d DType) String() string {
	if s := C.dckpt_dtype_name(C.int(d)); s != nil {
		return C.GoString(s)
	}
	return ""
}

// Size is the number of bytes of one element; 0 for an unknown dtype.
func (d DType) Size() int { return int(C.dckpt_dtype_size(C.int(d))) }

// ParseDType accepts a canonical name ("F32") or a numpy-style one ("float32").
func ParseDType(name string) (DType, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var out C.int
	err := ccall(func() C.int { return C.dckpt_dtype_from_name(&out, cname) })
	return DType(out), err
}
