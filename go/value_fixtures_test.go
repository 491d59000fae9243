package distckpt_test

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	distckpt "distckpt.dev/go"
)

// The shared value fixtures (tests/fixtures/values/, README.md there), read by DecodeValue, ParseStructure and
// Reader.Value: every valid one decodes to its expected result, every invalid one is rejected with its error kind.
// Python (python/tests/test_value_fixtures.py) and Rust (rust/distckpt/tests/value_fixtures.rs) read the same files.

const valueFixtures = "../tests/fixtures/values"

type fixtureCase struct {
	name, input string
	valid       bool
	decoded     any    // the typed form (valid)
	errKind     string // "corrupt", "version" or "pickle" (invalid)
	encoding    string // of a value: "json" or "pickle"
}

func fixtureCases(t *testing.T, kind string) []fixtureCase {
	t.Helper()
	dir := filepath.Join(valueFixtures, kind)
	files, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []fixtureCase
	inputs := map[string]bool{}
	for _, f := range files {
		name := f.Name()
		var c fixtureCase
		switch {
		case strings.HasSuffix(name, ".expected.json"):
			c = fixtureCase{name: strings.TrimSuffix(name, ".expected.json"), valid: true}
		case strings.HasSuffix(name, ".invalid.json"):
			c = fixtureCase{name: strings.TrimSuffix(name, ".invalid.json")}
		default:
			continue
		}
		raw, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(strings.NewReader(string(raw)))
		dec.UseNumber()
		var side map[string]any
		if err := dec.Decode(&side); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		c.decoded = side["decoded"]
		c.errKind, _ = side["error"].(string)
		c.encoding = "json"
		if e, ok := side["encoding"].(string); ok {
			c.encoding = e
		}
		c.input = c.name + "." + c.encoding
		if c.encoding == "json" {
			c.input = c.name + ".json"
		}
		inputs[c.input] = true
		c.input = filepath.Join(dir, c.input)
		out = append(out, c)
	}
	for _, f := range files {
		n := f.Name()
		if !inputs[n] && !strings.HasSuffix(n, ".expected.json") && !strings.HasSuffix(n, ".invalid.json") {
			t.Errorf("%s/%s has no .expected.json or .invalid.json", kind, n)
		}
	}
	if len(out) < 40 {
		t.Fatalf("only %d %s fixtures", len(out), kind)
	}
	return out
}

func errorOfKind(kind string) error {
	switch kind {
	case "corrupt":
		return distckpt.ErrCorrupt
	case "version":
		return distckpt.ErrVersion
	case "pickle":
		return distckpt.ErrUnsupported
	}
	return fmt.Errorf("unknown error kind %q", kind)
}

func TestValueFixtures(t *testing.T) {
	cases := fixtureCases(t, "value")
	// Every value is also saved as a bytes entry of one checkpoint whose structure gives its encoding, and read back
	// with Reader.Value: the path a program takes.
	st := distckpt.NewState()
	var items []string
	for _, c := range cases {
		data, err := os.ReadFile(c.input)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.AddBytes(c.name, data); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		items = append(items, fmt.Sprintf(`[%q,{"object":%q,"encoding":%q}]`, c.name, c.name, c.encoding))
	}
	st.SetStructure([]byte(`{"distckpt_structure":1,"root":{"dict":[` + strings.Join(items, ",") + `]}}`))
	path := filepath.Join(t.TempDir(), "values")
	if _, err := distckpt.Save(path, st, &distckpt.SaveOptions{NoSync: true}); err != nil {
		t.Fatal(err)
	}
	r := open(t, path)

	valid, invalid := 0, 0
	for _, c := range cases {
		c := c
		t.Run(c.name, func(t *testing.T) {
			data, err := os.ReadFile(c.input)
			if err != nil {
				t.Fatal(err)
			}
			fromReader, readerErr := r.Value(c.name)
			if !c.valid {
				invalid++
				if !errors.Is(readerErr, errorOfKind(c.errKind)) {
					t.Errorf("Reader.Value gave %v, %v; want a %s error", fmtGo(fromReader), readerErr, c.errKind)
				} else if !strings.Contains(readerErr.Error(), "'"+c.name+"'") {
					t.Errorf("the error does not name the entry: %v", readerErr)
				}
				if c.encoding == "json" {
					if v, err := distckpt.DecodeValue(data); err == nil {
						t.Errorf("DecodeValue accepted it: %s", fmtGo(v))
					}
				}
				return
			}
			valid++
			v, err := distckpt.DecodeValue(data)
			if err != nil {
				t.Fatalf("DecodeValue: %v", err)
			}
			if err := matchTyped(v, c.decoded, "value"); err != nil {
				t.Errorf("DecodeValue: %v", err)
			}
			if readerErr != nil {
				t.Fatalf("Reader.Value: %v", readerErr)
			}
			if err := matchTyped(fromReader, c.decoded, "value"); err != nil {
				t.Errorf("Reader.Value: %v", err)
			}
		})
	}
	t.Logf("%d valid and %d invalid value fixtures", valid, invalid)
}

func TestStructureFixtures(t *testing.T) {
	for _, c := range fixtureCases(t, "structure") {
		c := c
		t.Run(c.name, func(t *testing.T) {
			raw, err := os.ReadFile(c.input)
			if err != nil {
				t.Fatal(err)
			}
			s, err := distckpt.ParseStructure(raw, "fixtures")
			if !c.valid {
				if !errors.Is(err, errorOfKind(c.errKind)) {
					t.Fatalf("got %+v, %v; want a %s error", s, err, c.errKind)
				}
				for _, other := range []string{"corrupt", "version", "pickle"} {
					if other != c.errKind && errors.Is(err, errorOfKind(other)) {
						t.Errorf("%v is also a %s error", err, other)
					}
				}
				if !strings.Contains(err.Error(), "'fixtures'") {
					t.Errorf("the error does not name the checkpoint: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.decoded == nil {
				if s != nil {
					t.Fatalf("not a distckpt structure, but parsed as %+v", s)
				}
				return
			}
			if s == nil {
				t.Fatal("no structure")
			}
			if err := matchNode(s.Root, c.decoded, "root"); err != nil {
				t.Error(err)
			}
		})
	}
}

func fmtGo(v any) string { return fmt.Sprintf("%#v", v) }

// one returns the single member of a typed-form object: its kind and body.
func one(want any, at string) (string, any, error) {
	m, ok := want.(map[string]any)
	if !ok || len(m) != 1 {
		return "", nil, fmt.Errorf("%s: bad expected form %v", at, want)
	}
	for k, v := range m {
		return k, v, nil
	}
	panic("unreachable")
}

func sameFloat(got float64, want string) bool {
	w, err := strconv.ParseFloat(want, 64)
	if err != nil {
		return false
	}
	if math.IsNaN(w) {
		return math.IsNaN(got)
	}
	return math.Float64bits(got) == math.Float64bits(w)
}

// matchTyped compares a decoded value with the README's typed form.
func matchTyped(got, want any, at string) error {
	kind, body, err := one(want, at)
	if err != nil {
		return err
	}
	mismatch := func() error { return fmt.Errorf("%s: got %s, want %s %v", at, fmtGo(got), kind, body) }
	switch kind {
	case "none":
		if got != nil {
			return mismatch()
		}
	case "bool":
		if b, ok := got.(bool); !ok || b != body.(bool) {
			return mismatch()
		}
	case "int":
		n, ok := got.(json.Number)
		if !ok || strings.ContainsAny(string(n), ".eE") {
			return mismatch()
		}
		g, _ := new(big.Int).SetString(string(n), 10)
		w, _ := new(big.Int).SetString(body.(string), 10)
		if g == nil || w == nil || g.Cmp(w) != 0 {
			return mismatch()
		}
	case "float":
		var f float64
		switch x := got.(type) {
		case json.Number:
			if !strings.ContainsAny(string(x), ".eE") {
				return mismatch() // an int
			}
			f, _ = x.Float64()
		case float64:
			f = x
		default:
			return mismatch()
		}
		if !sameFloat(f, body.(string)) {
			return mismatch()
		}
	case "str":
		if s, ok := got.(string); !ok || s != body.(string) {
			return mismatch()
		}
	case "bytes":
		if b, ok := got.([]byte); !ok || hex.EncodeToString(b) != body.(string) {
			return mismatch()
		}
	case "complex":
		parts := body.([]any)
		c, ok := got.(complex128)
		if !ok || !sameFloat(real(c), parts[0].(string)) || !sameFloat(imag(c), parts[1].(string)) {
			return mismatch()
		}
	case "list", "tuple":
		var items []any
		switch x := got.(type) {
		case []any:
			if kind != "list" {
				return mismatch()
			}
			items = x
		case distckpt.Tuple:
			if kind != "tuple" {
				return mismatch()
			}
			items = x
		default:
			return mismatch()
		}
		want := body.([]any)
		if len(items) != len(want) {
			return fmt.Errorf("%s: %d items, want %d", at, len(items), len(want))
		}
		for i := range items {
			if err := matchTyped(items[i], want[i], fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
	case "dict":
		want := body.([]any)
		switch x := got.(type) {
		case distckpt.Dict: // {"$dict": ...}: in order
			if len(x) != len(want) {
				return fmt.Errorf("%s: %d items, want %d", at, len(x), len(want))
			}
			for i, it := range x {
				pair := want[i].([]any)
				if err := matchTyped(it.Key, pair[0], fmt.Sprintf("%s key %d", at, i)); err != nil {
					return err
				}
				if err := matchTyped(it.Value, pair[1], fmt.Sprintf("%s[%v]", at, it.Key)); err != nil {
					return err
				}
			}
		case map[string]any: // a plain object: Go's map has no order, so the keys are compared as a set
			if len(x) != len(want) {
				return fmt.Errorf("%s: %d members, want %d", at, len(x), len(want))
			}
			for _, p := range want {
				pair := p.([]any)
				kk, key, err := one(pair[0], at)
				if err != nil {
					return err
				}
				v, ok := x[fmt.Sprint(key)]
				if kk != "str" || !ok {
					return fmt.Errorf("%s: no member %v %v", at, kk, key)
				}
				if err := matchTyped(v, pair[1], fmt.Sprintf("%s[%q]", at, key)); err != nil {
					return err
				}
			}
		default:
			return mismatch()
		}
	default:
		return fmt.Errorf("%s: unknown expected kind %q", at, kind)
	}
	return nil
}

// matchNode compares a parsed structure node with the README's typed form of a node.
func matchNode(n *distckpt.StructureNode, want any, at string) error {
	m, ok := want.(map[string]any)
	if !ok {
		return fmt.Errorf("%s: bad expected node %v", at, want)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	mismatch := func() error { return fmt.Errorf("%s: got %+v, want %v", at, *n, want) }
	switch {
	case m["dict"] != nil:
		items := m["dict"].([]any)
		if n.Kind != distckpt.DictNode || len(n.Children) != len(items) {
			return mismatch()
		}
		for i, it := range items {
			pair := it.([]any)
			kk, key, err := one(pair[0], at)
			if err != nil {
				return err
			}
			switch k := n.Keys[i].(type) {
			case string:
				if kk != "str" || k != key.(string) {
					return fmt.Errorf("%s: key %d is %q, want %s %v", at, i, k, kk, key)
				}
			case json.Number:
				g, _ := new(big.Int).SetString(string(k), 10)
				w, _ := new(big.Int).SetString(fmt.Sprint(key), 10)
				if kk != "int" || g == nil || w == nil || g.Cmp(w) != 0 {
					return fmt.Errorf("%s: key %d is %s, want %s %v", at, i, k, kk, key)
				}
			default:
				return fmt.Errorf("%s: key %d is a %T", at, i, k)
			}
			if err := matchNode(n.Children[i], pair[1], fmt.Sprintf("%s/%v", at, key)); err != nil {
				return err
			}
		}
	case m["list"] != nil || m["tuple"] != nil:
		kind, items := distckpt.ListNode, m["list"]
		if items == nil {
			kind, items = distckpt.TupleNode, m["tuple"]
		}
		if n.Kind != kind || len(n.Children) != len(items.([]any)) {
			return mismatch()
		}
		for i, c := range items.([]any) {
			if err := matchNode(n.Children[i], c, fmt.Sprintf("%s/%d", at, i)); err != nil {
				return err
			}
		}
	case m["array"] != nil:
		if n.Kind != distckpt.ArrayNode || n.Entry != m["array"] || n.Scalar != m["scalar"] || len(keys) != 2 {
			return mismatch()
		}
	case m["object"] != nil:
		if n.Kind != distckpt.ObjectNode || n.Entry != m["object"] || n.Encoding != m["encoding"] || len(keys) != 2 {
			return mismatch()
		}
	default:
		return fmt.Errorf("%s: bad expected node %v", at, want)
	}
	return nil
}
