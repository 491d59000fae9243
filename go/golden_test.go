package distckpt_test

import (
	"strings"
	"testing"

	distckpt "distckpt.dev/go"
)

// The golden checkpoints written by tests/golden/make_golden.cc, one per format version, must stay readable forever,
// from Go too (v2_0 is an incremental checkpoint that reads most of its chunks from its sibling v1_2; v3_0 has
// compressed chunks).
var goldenPaths = []string{"../tests/golden/v1_all_dtypes", "../tests/golden/v1_1_all_dtypes",
	"../tests/golden/v1_2_all_dtypes", "../tests/golden/v2_0_all_dtypes", "../tests/golden/v3_0_all_dtypes"}

// goldenByte mirrors GoldenByte in tests/golden/golden_values.h.
func goldenByte(name string, element, b uint64) byte {
	h := uint64(1469598103934665603)
	for i := 0; i < len(name); i++ {
		h = (h ^ uint64(name[i])) * 1099511628211
	}
	return byte((h >> 24) + element*29 + b*7 + (element >> 7))
}

func TestGoldenAllDtypes(t *testing.T) {
	for _, p := range goldenPaths {
		t.Run(p[len("../tests/golden/"):], func(t *testing.T) { checkGolden(t, p) })
	}
}

func checkGolden(t *testing.T, goldenPath string) {
	r := open(t, goldenPath)
	entries, err := r.Entries()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 17+5+1 {
		t.Fatalf("%d entries", len(entries))
	}
	tensors := 0
	for _, e := range entries {
		data, err := r.Read(e.Name)
		if err != nil {
			t.Fatal(err)
		}
		if e.Kind == distckpt.BytesEntry {
			if e.Name != "train.state" || string(data) != `{"step": 42, "rng": [1, 2, 3]}` {
				t.Errorf("bytes entry %s = %q", e.Name, data)
			}
			continue
		}
		tensors++
		if strings.HasPrefix(e.Name, "dtypes.") && e.DType.String() != strings.TrimPrefix(e.Name, "dtypes.") {
			t.Errorf("%s has dtype %s", e.Name, e.DType)
		}
		size := uint64(e.DType.Size())
		if uint64(len(data)) != e.NBytes {
			t.Fatalf("%s: %d bytes, want %d", e.Name, len(data), e.NBytes)
		}
		for i := range data {
			if want := goldenByte(e.Name, uint64(i)/size, uint64(i)%size); data[i] != want {
				t.Fatalf("%s byte %d = %d, want %d", e.Name, i, data[i], want)
			}
		}
	}
	if tensors != 22 {
		t.Errorf("%d tensors", tensors)
	}
	if e, err := r.Entry("shapes.rank8"); err != nil || len(e.Shape) != 8 {
		t.Errorf("rank8: %+v %v", e, err)
	}
	if u, _ := r.UserMetadata(); u["step"] != "42" || u["framework"] != "golden" {
		t.Errorf("user %v", u)
	}
	if s, _ := r.Structure(); string(s) != `{"golden": true}` {
		t.Errorf("structure %q", s)
	}
	if res, err := r.Verify(nil); err != nil || res.Chunks == 0 {
		t.Fatalf("verify: %+v %v", res, err)
	}
}
