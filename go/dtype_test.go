package distckpt_test

import (
	"errors"
	"testing"

	distckpt "distckpt.dev/go"
)

func TestDTypeNamesAndSizes(t *testing.T) {
	for _, tc := range []struct {
		d    distckpt.DType
		name string
		size int
	}{
		{distckpt.Bool, "BOOL", 1}, {distckpt.BF16, "BF16", 2}, {distckpt.F32, "F32", 4}, {distckpt.C128, "C128", 16},
		{distckpt.F8E4M3FN, "F8_E4M3", 1},
	} {
		if tc.d.String() != tc.name || tc.d.Size() != tc.size {
			t.Errorf("%d: %q size %d, want %q size %d", int(tc.d), tc.d.String(), tc.d.Size(), tc.name, tc.size)
		}
		if d, err := distckpt.ParseDType(tc.name); err != nil || d != tc.d {
			t.Errorf("ParseDType(%q) = %v, %v", tc.name, d, err)
		}
	}
	if d, err := distckpt.ParseDType("float32"); err != nil || d != distckpt.F32 {
		t.Errorf("ParseDType(float32) = %v, %v", d, err)
	}
	if _, err := distckpt.ParseDType("float7"); !errors.Is(err, distckpt.ErrInvalid) {
		t.Errorf("ParseDType(float7): %v", err)
	}
	if distckpt.DType(99).Size() != 0 || distckpt.DType(99).String() != "" {
		t.Error("unknown dtype")
	}
}
