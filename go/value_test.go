package distckpt_test

import (
	"encoding/json"
	"errors"
	"math"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	distckpt "distckpt.dev/go"
)

// pythonEntries are the bytes entries python/distckpt's save wrote for
//
//	{"model": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, "step": 100, "big": 12345678901234567890,
//	 "cfg": {"lr": 1e-3, "name": "run", "t": (1, 2), "b": b"\x00\x01\x02", "f": float("nan"),
//	         "c": complex(1, float("-inf"))},
//	 "hist": [{"d": {1: "one", (2, 3): "pair"}, "$x": 1}, None], "epoch": 3.5, "flag": True, 7: "int key"}
//
// copied byte for byte from that checkpoint, with its structure document.
var pythonEntries = map[string]string{
	"7":        `"int key"`,
	"big":      `12345678901234567890`,
	"cfg.b":    `{"$bytes":"AAEC"}`,
	"cfg.c":    `{"$complex":[1.0,{"$float":"-inf"}]}`,
	"cfg.f":    `{"$float":"nan"}`,
	"cfg.lr":   `0.001`,
	"cfg.name": `"run"`,
	"cfg.t":    `{"$tuple":[1,2]}`,
	"epoch":    `3.5`,
	"flag":     `true`,
	"hist":     `[{"$dict":[["d",{"$dict":[[1,"one"],[{"$tuple":[2,3]},"pair"]]}],["$x",1]]},null]`,
	"step":     `100`,
}

const pythonStructure = `{"distckpt_structure":1,"root":{"dict":[["model",{"dict":[["w",{"array":"model.w"}]]}],` +
	`["step",{"object":"step","encoding":"json"}],["big",{"object":"big","encoding":"json"}],["cfg",{"dict":[` +
	`["lr",{"object":"cfg.lr","encoding":"json"}],["name",{"object":"cfg.name","encoding":"json"}],` +
	`["t",{"object":"cfg.t","encoding":"json"}],["b",{"object":"cfg.b","encoding":"json"}],` +
	`["f",{"object":"cfg.f","encoding":"json"}],["c",{"object":"cfg.c","encoding":"json"}]]}],` +
	`["hist",{"object":"hist","encoding":"json"}],["epoch",{"object":"epoch","encoding":"json"}],` +
	`["flag",{"object":"flag","encoding":"json"}],[7,{"object":"7","encoding":"json"}],` +
	`["pickled",{"object":"pickled","encoding":"pickle"}],["broken",{"object":"broken","encoding":"json"}]]}}`

// pickleOfASet is pickle.dumps({1, 2}, protocol=5).
const pickleOfASet = "\x80\x05\x95\t\x00\x00\x00\x00\x00\x00\x00\x8f\x94(K\x01K\x02\x90."

func savePython(t *testing.T, structure string, extra map[string]string) string {
	t.Helper()
	st := distckpt.NewState()
	if err := st.AddTensorData("model.w", distckpt.F32, []uint64{2, 3}, make([]byte, 24)); err != nil {
		t.Fatal(err)
	}
	for name, data := range pythonEntries {
		if err := st.AddBytes(name, []byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	for name, data := range extra {
		if err := st.AddBytes(name, []byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	st.SetUser("step", "100") // what Python's save records for the top-level scalar
	if structure != "" {
		st.SetStructure([]byte(structure))
	}
	path := filepath.Join(t.TempDir(), "step-100")
	if _, err := distckpt.Save(path, st, &distckpt.SaveOptions{NoSync: true}); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestValueReadsPythonLeaves(t *testing.T) {
	path := savePython(t, pythonStructure, map[string]string{"pickled": pickleOfASet, "broken": "{not json"})
	r := open(t, path)
	value := func(name string) any {
		t.Helper()
		v, err := r.Value(name)
		if err != nil {
			t.Fatalf("Value(%s): %v", name, err)
		}
		return v
	}
	if v := value("step"); v != json.Number("100") {
		t.Fatalf("step = %#v", v)
	}
	if n, _ := value("step").(json.Number).Int64(); n != 100 {
		t.Fatal("step.Int64")
	}
	if v := value("big"); v != json.Number("12345678901234567890") {
		t.Fatalf("big = %#v (every digit must survive)", v)
	}
	for name, want := range map[string]any{
		"7": "int key", "cfg.name": "run", "flag": true, "epoch": json.Number("3.5"), "cfg.lr": json.Number("0.001"),
		"cfg.t": distckpt.Tuple{json.Number("1"), json.Number("2")}, "cfg.b": []byte{0, 1, 2},
		"cfg.c": complex(1, math.Inf(-1)),
		"hist": []any{distckpt.Dict{
			{Key: "d", Value: distckpt.Dict{
				{Key: json.Number("1"), Value: "one"},
				{Key: distckpt.Tuple{json.Number("2"), json.Number("3")}, Value: "pair"}}},
			{Key: "$x", Value: json.Number("1")}}, nil},
	} {
		if got := value(name); !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %#v, want %#v", name, got, want)
		}
	}
	if f, ok := value("cfg.f").(float64); !ok || !math.IsNaN(f) {
		t.Errorf("cfg.f = %#v", value("cfg.f"))
	}

	for name, want := range map[string]error{
		"pickled": distckpt.ErrUnsupported, "broken": distckpt.ErrCorrupt, "model.w": distckpt.ErrInvalid,
		"missing": distckpt.ErrNotFound,
	} {
		_, err := r.Value(name)
		if !errors.Is(err, want) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "'"+name+"'") {
			t.Errorf("Value(%s): %v, want %v naming the checkpoint and the entry", name, err, want)
		}
	}
	if _, err := r.Value("pickled"); !strings.Contains(err.Error(), "pickle") {
		t.Errorf("pickle: %v", err)
	}
}

// Without Python's structure: a pickle is still recognised, other non-JSON is ErrInvalid.
func TestValueWithoutStructure(t *testing.T) {
	r := open(t, savePython(t, "", map[string]string{"pickled": pickleOfASet, "text": "plain text"}))
	if v, err := r.Value("step"); err != nil || v != json.Number("100") {
		t.Fatalf("step: %#v %v", v, err)
	}
	if _, err := r.Value("pickled"); !errors.Is(err, distckpt.ErrUnsupported) {
		t.Errorf("pickled: %v", err)
	}
	if _, err := r.Value("text"); !errors.Is(err, distckpt.ErrInvalid) || !strings.Contains(err.Error(), "'text'") {
		t.Errorf("text: %v", err)
	}
	if s, err := r.ParsedStructure(); s != nil || err != nil {
		t.Errorf("ParsedStructure without one: %+v %v", s, err)
	}
}

// The golden checkpoint's bytes entry is JSON too.
func TestValueOfTheGoldenCheckpoint(t *testing.T) {
	r := open(t, goldenPaths[0])
	v, err := r.Value("train.state")
	want := map[string]any{"step": json.Number("42"), "rng": []any{json.Number("1"), json.Number("2"), json.Number("3")}}
	if err != nil || !reflect.DeepEqual(v, want) {
		t.Fatalf("%#v %v", v, err)
	}
	if s, err := r.ParsedStructure(); s != nil || err != nil { // {"golden": true}: another writer's structure
		t.Fatalf("%+v %v", s, err)
	}
}

func TestParsedStructure(t *testing.T) {
	r := open(t, savePython(t, pythonStructure, map[string]string{"pickled": pickleOfASet, "broken": "x"}))
	s, err := r.ParsedStructure()
	if err != nil || s == nil || s.Version != 1 || s.Root.Kind != distckpt.DictNode {
		t.Fatalf("%+v %v", s, err)
	}
	var got []string
	for _, l := range s.Leaves() {
		var parts []string
		for _, p := range l.Path {
			parts = append(parts, reflect.TypeOf(p).Name()+":"+strings.Trim(strings.TrimSpace(fmtAny(p)), `"`))
		}
		got = append(got, strings.Join(parts, "/")+"="+string(l.Node.Kind)+":"+l.Node.Entry+":"+l.Node.Encoding)
	}
	want := []string{
		"string:model/string:w=array:model.w:", "string:step=object:step:json", "string:big=object:big:json",
		"string:cfg/string:lr=object:cfg.lr:json", "string:cfg/string:name=object:cfg.name:json",
		"string:cfg/string:t=object:cfg.t:json", "string:cfg/string:b=object:cfg.b:json",
		"string:cfg/string:f=object:cfg.f:json", "string:cfg/string:c=object:cfg.c:json",
		"string:hist=object:hist:json", "string:epoch=object:epoch:json", "string:flag=object:flag:json",
		"Number:7=object:7:json", "string:pickled=object:pickled:pickle", "string:broken=object:broken:json",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("leaves:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if n := s.Find("cfg.t"); n == nil || n.Kind != distckpt.ObjectNode || s.Find("nope") != nil {
		t.Fatalf("Find: %+v", n)
	}
	list := `{"distckpt_structure":1,"root":{"dict":[["l",{"list":[{"array":"l.0","scalar":true},{"tuple":[]}]}]]}}`
	r = open(t, savePython(t, list, nil))
	if s, err = r.ParsedStructure(); err != nil || len(s.Leaves()) != 1 || !s.Leaves()[0].Node.Scalar ||
		!reflect.DeepEqual(s.Leaves()[0].Path, []any{"l", 0}) {
		t.Fatalf("list: %+v %v", s, err)
	}

	for doc, want := range map[string]error{
		`{"distckpt_structure":2,"root":{"dict":[]}}`:                      distckpt.ErrVersion,
		`{"distckpt_structure":1,"root":{"list":[]}}`:                      distckpt.ErrCorrupt,
		`{"distckpt_structure":1,"root":{"dict":[["a",{"object":"a"}]]}}`:  distckpt.ErrCorrupt,
		`{"distckpt_structure":1,"root":{"dict":[[1.5,{"array":"a"}]]}}`:   distckpt.ErrCorrupt,
		`{"distckpt_structure":1,"root":{"dict":[["a",{"frob":"a"}]]}}`:    distckpt.ErrCorrupt,
		`{"distckpt_structure":"one","root":{"dict":[]}}`:                  distckpt.ErrCorrupt,
		`{"distckpt_structure":1,"root":{"dict":[["a",{"array":"a"}]]}}  `: nil,
	} {
		r := open(t, savePython(t, doc, nil))
		s, err := r.ParsedStructure()
		if !errors.Is(err, want) || (want == nil) != (s != nil) {
			t.Errorf("%s: %+v %v, want %v", doc, s, err, want)
		}
	}
}

func fmtAny(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// Issue 27: a numpy scalar ({"step": np.int64(5)}) is saved by Python as a 0-d tensor, not as JSON; Value reads a 0-d
// tensor of a bool, integer or float dtype as the number JSON would have given (../tests/fixtures/python_scalars,
// written by tests/fixtures/make_python_scalars.py; Rust's Checkpoint::value agrees, rust/distckpt/tests/values.rs).
func TestValueOfZeroDTensorsFromPython(t *testing.T) {
	const path = "../tests/fixtures/python_scalars"
	r := open(t, path)
	if e, err := r.Entry("step"); err != nil || e.Kind == distckpt.BytesEntry || len(e.Shape) != 0 || e.DType != distckpt.I64 {
		t.Fatalf("step is not a 0-d I64 tensor: %+v %v", e, err)
	}
	for name, want := range map[string]any{
		"step": json.Number("5"), "epoch": json.Number("-3"), "seen": json.Number("18446744073709551615"),
		"lr": json.Number("0.5"), "loss": json.Number("0.125"), "half": json.Number("1.5"), "done": true,
		"zero_d": json.Number("7"), // a 0-d array, not only a numpy scalar
	} {
		if v, err := r.Value(name); err != nil || !reflect.DeepEqual(v, want) {
			t.Errorf("Value(%s) = %#v, %v; want %#v", name, v, err, want)
		}
	}
	if v, err := r.Value("bad"); err != nil || !math.IsNaN(v.(float64)) {
		t.Errorf("Value(bad) = %#v, %v; want NaN", v, err)
	}
	if n, err := func() (int64, error) { v, _ := r.Value("step"); return v.(json.Number).Int64() }(); n != 5 || err != nil {
		t.Errorf("step.Int64() = %d, %v", n, err)
	}
	if user, err := r.UserMetadata(); err != nil || user["step"] != "5" {
		t.Errorf("user metadata step: %q %v", user["step"], err)
	}
	// No plain number for a complex scalar; a tensor of more dimensions is still not a value.
	for _, name := range []string{"z", "model.w"} {
		_, err := r.Value(name)
		if !errors.Is(err, distckpt.ErrInvalid) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "'"+name+"'") {
			t.Errorf("Value(%s): %v, want ErrInvalid naming the checkpoint and the entry", name, err)
		}
	}
	// A 0-d tensor that C wrote (no structure), and a float with an integral value stays a float.
	st := distckpt.NewState()
	if err := st.AddTensorData("whole", distckpt.F64, nil, []byte{0, 0, 0, 0, 0, 0, 0x59, 0x40}); err != nil { // 100.0
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "c")
	if _, err := distckpt.Save(out, st, &distckpt.SaveOptions{NoSync: true}); err != nil {
		t.Fatal(err)
	}
	if v, err := open(t, out).Value("whole"); err != nil || v != json.Number("100.0") {
		t.Errorf("Value(whole) = %#v, %v; want json.Number(\"100.0\")", v, err)
	}
}
