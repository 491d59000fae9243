package distckpt

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Python's save (python/distckpt/_tree.py) stores every leaf of a state dict that is not an array as a bytes entry
// holding JSON, extended with tagged forms for what JSON lacks, and describes the nesting in the checkpoint's
// structure string. Value and ParsedStructure read both from Go.

// Tuple is a Python tuple, stored as {"$tuple": [...]}.
type Tuple []any

// DictItem is one key/value pair of a Dict.
type DictItem struct {
	Key   any
	Value any
}

// Dict is a Python dict whose keys are not all strings (or start with "$"), stored as {"$dict": [[key, value], ...]},
// in insertion order. A key may be a json.Number, a string, a Tuple, ...
type Dict []DictItem

// Value decodes the bytes entry `name` as Python's save wrote it: JSON, with integers and floats as json.Number (so
// that an integer keeps every digit; use Int64 or Float64), strings, bools, nil, []any for lists and map[string]any
// for dicts with string keys, and the tagged forms as Go values: {"$tuple": [...]} a Tuple, {"$dict": [[k, v], ...]} a
// Dict, {"$bytes": "<base64>"} a []byte, {"$float": "nan"|"inf"|"-inf"} a float64, {"$complex": [re, im]} a
// complex128. A step saved from Python as {"step": 100} reads as json.Number("100").
//
// An entry Python pickled (saved with allow_pickle=True) gives ErrUnsupported: Go does not unpickle, and unpickling
// runs code. An entry that does not hold JSON gives ErrCorrupt when the checkpoint's structure says it is JSON, else
// ErrInvalid; a tensor entry gives ErrInvalid, a missing one ErrNotFound. Every error names the checkpoint and entry.
//
// A 0-d tensor of a bool, integer or float dtype is a value too: Python saves a numpy scalar ({"step": np.int64(5)})
// that way, so Value gives what the same number saved as JSON gives (json.Number; a bool; float64 for NaN and the
// infinities, as {"$float": ...} does). Rust's Checkpoint::value agrees. Complex and FP8 0-d tensors give ErrInvalid.
func (r *Reader) Value(name string) (any, error) {
	e, err := r.Entry(name)
	if err != nil {
		return nil, err
	}
	if e.Kind != BytesEntry {
		if len(e.Shape) == 0 {
			return r.scalarValue(e)
		}
		return nil, errorf(CodeInvalid, "checkpoint '%s': entry '%s' is a %s tensor, not a value; read it with Read",
			r.path, name, e.DType)
	}
	encoding := ""
	if s, err := r.ParsedStructure(); err == nil && s != nil {
		if n := s.Find(name); n != nil && n.Kind == ObjectNode {
			encoding = n.Encoding
		}
	}
	pickled := func() error {
		return errorf(CodeUnsupported, "checkpoint '%s': entry '%s' was saved by Python with pickle; Go does not "+
			"unpickle (it would run code): load it in Python with allow_pickle=True, or save the value as numbers, "+
			"strings, lists and dicts", r.path, name)
	}
	if encoding == "pickle" {
		return nil, pickled()
	}
	data, err := r.Read(name)
	if err != nil {
		return nil, err
	}
	v, err := DecodeValue(data)
	if err == nil {
		return v, nil
	}
	if encoding == "" && len(data) >= 2 && data[0] == 0x80 && data[1] >= 2 && data[1] <= 5 {
		return nil, pickled() // a pickle's PROTO opcode, in a checkpoint without Python's structure
	}
	if encoding == "json" {
		return nil, errorf(CodeCorrupt, "checkpoint '%s': entry '%s' is not valid distckpt JSON (%v)", r.path, name, err)
	}
	return nil, errorf(CodeInvalid, "checkpoint '%s': entry '%s' does not hold a JSON value (%v); read its bytes with "+
		"Read", r.path, name, err)
}

// scalarValue reads a 0-d tensor entry as the number it holds (see Value).
func (r *Reader) scalarValue(e Entry) (any, error) {
	switch e.DType {
	case Bool, U8, I8, U16, I16, U32, I32, U64, I64, F16, BF16, F32, F64:
	default:
		return nil, errorf(CodeInvalid, "checkpoint '%s': entry '%s' is a 0-d %s tensor, which has no plain number "+
			"for a value; read it with Read", r.path, e.Name, e.DType)
	}
	data, err := r.Read(e.Name)
	if err != nil {
		return nil, err
	}
	if len(data) != e.DType.Size() {
		return nil, errorf(CodeCorrupt, "checkpoint '%s': 0-d entry '%s' holds %d bytes, not one %s", r.path, e.Name,
			len(data), e.DType)
	}
	le := binary.LittleEndian
	var f float64
	switch e.DType {
	case Bool:
		return data[0] != 0, nil
	case U8:
		return json.Number(strconv.FormatUint(uint64(data[0]), 10)), nil
	case I8:
		return json.Number(strconv.FormatInt(int64(int8(data[0])), 10)), nil
	case U16:
		return json.Number(strconv.FormatUint(uint64(le.Uint16(data)), 10)), nil
	case I16:
		return json.Number(strconv.FormatInt(int64(int16(le.Uint16(data))), 10)), nil
	case U32:
		return json.Number(strconv.FormatUint(uint64(le.Uint32(data)), 10)), nil
	case I32:
		return json.Number(strconv.FormatInt(int64(int32(le.Uint32(data))), 10)), nil
	case U64:
		return json.Number(strconv.FormatUint(le.Uint64(data), 10)), nil
	case I64:
		return json.Number(strconv.FormatInt(int64(le.Uint64(data)), 10)), nil
	case F16:
		f = halfToFloat64(le.Uint16(data))
	case BF16:
		f = float64(math.Float32frombits(uint32(le.Uint16(data)) << 16))
	case F32:
		f = float64(math.Float32frombits(le.Uint32(data)))
	case F64:
		f = math.Float64frombits(le.Uint64(data))
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return f, nil // what {"$float": "nan" | "inf" | "-inf"} decodes to
	}
	text := strconv.FormatFloat(f, 'g', -1, 64)
	if !strings.ContainsAny(text, ".e") {
		text += ".0" // a float stays a float, as Python's JSON writes it (1.0, not 1)
	}
	return json.Number(text), nil
}

// halfToFloat64 widens an IEEE binary16 value exactly.
func halfToFloat64(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp, frac := int(h>>10&0x1f), float64(h&0x3ff)
	switch exp {
	case 0:
		return sign * math.Ldexp(frac, -24)
	case 0x1f:
		if frac != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	}
	return sign * math.Ldexp(1+frac/1024, exp-15)
}

// DecodeValue decodes the JSON of a Python object leaf as Value does (for bytes read by other means), following
// core/format/FORMAT.md appendix A: it rejects what a distckpt reader must reject (text that is not RFC 8259 JSON in
// UTF-8, a member name twice in an object, nesting deeper than 500, an unknown tag or a '$' key outside a tagged form,
// a malformed tagged form, a $dict key Python could not hash or two equal $dict keys).
func DecodeValue(data []byte) (any, error) {
	raw, dup, err := parseStrictJSON(data, MaxValueDepth)
	if err != nil {
		return nil, err
	}
	if dup != "" {
		return nil, fmt.Errorf("member %q appears twice in an object", dup)
	}
	return fromTagged(raw)
}

// MaxValueDepth is how deeply the JSON of an object leaf may nest, arrays and objects counted, the outermost as 1
// (FORMAT.md A.4).
const MaxValueDepth = 500

// maxStructureJSONDepth bounds the JSON nesting of a structure document; deeper text is not taken for JSON at all
// (as Rust's parser, and Python's json well before that, give up), so it is not a distckpt structure.
const maxStructureJSONDepth = 1000

// jsonObject is a JSON object with its members in document order, duplicates included.
type jsonObject struct {
	keys []string
	vals []any
}

// get is the last member named key, as Python's json keeps it.
func (o *jsonObject) get(key string) (any, bool) {
	for i := len(o.keys) - 1; i >= 0; i-- {
		if o.keys[i] == key {
			return o.vals[i], true
		}
	}
	return nil, false
}

func (o *jsonObject) has(key string) bool {
	_, ok := o.get(key)
	return ok
}

// parseStrictJSON parses exactly one RFC 8259 JSON value: UTF-8 (encoding/json would replace bad bytes and unpaired
// surrogate escapes with U+FFFD; they are errors here), nested at most maxDepth deep, numbers with a fraction or
// exponent within an f64. Objects come back as *jsonObject, arrays as []any, numbers as json.Number. dup is the first
// member name found twice in one object ("" if none).
func parseStrictJSON(data []byte, maxDepth int) (v any, dup string, err error) {
	if !utf8.Valid(data) {
		return nil, "", fmt.Errorf("not UTF-8")
	}
	if err := scanJSONText(data, maxDepth); err != nil {
		return nil, "", err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	p := &strictParser{dec: dec}
	v, err = p.value()
	if err != nil {
		return nil, "", err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, "", fmt.Errorf("data after the JSON value")
	}
	return v, p.dup, nil
}

// scanJSONText checks what encoding/json lets through: the nesting depth, and surrogate escapes that do not pair.
func scanJSONText(data []byte, maxDepth int) error {
	depth, inString := 0, false
	hex4 := func(at int) (rune, bool) {
		if at+6 > len(data) || data[at] != '\\' || data[at+1] != 'u' {
			return 0, false
		}
		n, err := strconv.ParseUint(string(data[at+2:at+6]), 16, 16)
		return rune(n), err == nil
	}
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch {
		case inString && c == '\\':
			if r, ok := hex4(i); ok {
				switch {
				case r >= 0xD800 && r < 0xDC00:
					if lo, ok := hex4(i + 6); !ok || lo < 0xDC00 || lo > 0xDFFF {
						return fmt.Errorf("an unpaired surrogate escape at byte %d", i)
					}
					i += 11
				case r >= 0xDC00 && r <= 0xDFFF:
					return fmt.Errorf("an unpaired surrogate escape at byte %d", i)
				default:
					i += 5
				}
			} else {
				i++ // the escaped character (encoding/json checks that it is a valid escape)
			}
		case c == '"':
			inString = !inString
		case !inString && (c == '[' || c == '{'):
			depth++
			if depth > maxDepth {
				return fmt.Errorf("nested deeper than %d levels", maxDepth)
			}
		case !inString && (c == ']' || c == '}'):
			depth--
		}
	}
	return nil
}

type strictParser struct {
	dec *json.Decoder
	dup string
}

func (p *strictParser) value() (any, error) {
	tok, err := p.dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '[':
			out := []any{}
			for p.dec.More() {
				v, err := p.value()
				if err != nil {
					return nil, err
				}
				out = append(out, v)
			}
			_, err := p.dec.Token() // ']'
			return out, err
		case '{':
			obj := &jsonObject{}
			seen := map[string]bool{}
			for p.dec.More() {
				k, err := p.dec.Token()
				if err != nil {
					return nil, err
				}
				key := k.(string) // encoding/json only gives a string here
				if seen[key] && p.dup == "" {
					p.dup = key
				}
				seen[key] = true
				v, err := p.value()
				if err != nil {
					return nil, err
				}
				obj.keys, obj.vals = append(obj.keys, key), append(obj.vals, v)
			}
			_, err := p.dec.Token() // '}'
			return obj, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	case json.Number:
		if !isIntegerLiteral(t) {
			if _, err := strconv.ParseFloat(string(t), 64); err != nil {
				return nil, fmt.Errorf("number %.40s is beyond an f64", t)
			}
		}
		return t, nil
	}
	return tok, nil // string, bool, nil
}

// isIntegerLiteral tells a JSON integer (Python int) from a number with a fraction or exponent (Python float).
func isIntegerLiteral(n json.Number) bool {
	return !strings.ContainsAny(string(n), ".eE")
}

// fromTagged turns the tagged forms of _tree.py's _to_json back into Go values (FORMAT.md A.3).
func fromTagged(v any) (any, error) {
	switch x := v.(type) {
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			d, err := fromTagged(e)
			if err != nil {
				return nil, err
			}
			out[i] = d
		}
		return out, nil
	case *jsonObject:
		if len(x.keys) == 1 {
			if d, known, err := fromTag(x.keys[0], x.vals[0]); known {
				return d, err
			}
		}
		out := make(map[string]any, len(x.keys))
		for i, k := range x.keys {
			if strings.HasPrefix(k, "$") {
				if len(x.keys) == 1 {
					return nil, fmt.Errorf("unknown tag %.40q", k)
				}
				return nil, fmt.Errorf("key %.40q starts with '$' outside a tagged form ($dict escapes it)", k)
			}
			d, err := fromTagged(x.vals[i])
			if err != nil {
				return nil, err
			}
			out[k] = d
		}
		return out, nil
	}
	return v, nil
}

// fromTag decodes one tagged form; known is false for a tag this version does not define.
func fromTag(tag string, body any) (v any, known bool, err error) {
	switch tag {
	case "$tuple":
		items, ok := body.([]any)
		if !ok {
			return nil, true, fmt.Errorf("$tuple does not hold a list")
		}
		t, err := fromTagged(items)
		if err != nil {
			return nil, true, err
		}
		return Tuple(t.([]any)), true, nil
	case "$dict":
		items, ok := body.([]any)
		if !ok {
			return nil, true, fmt.Errorf("$dict does not hold a list")
		}
		out := make(Dict, len(items))
		seen := map[string]bool{}
		for i, it := range items {
			pair, ok := it.([]any)
			if !ok || len(pair) != 2 {
				return nil, true, fmt.Errorf("a $dict item is not a [key, value] pair")
			}
			k, err := fromTagged(pair[0])
			if err != nil {
				return nil, true, err
			}
			key, never, err := hashKey(k)
			if err != nil {
				return nil, true, err
			}
			if !never {
				if seen[key] {
					return nil, true, fmt.Errorf("a $dict has two equal keys (%.80s)", fmtKey(k))
				}
				seen[key] = true
			}
			val, err := fromTagged(pair[1])
			if err != nil {
				return nil, true, err
			}
			out[i] = DictItem{Key: k, Value: val}
		}
		return out, true, nil
	case "$bytes":
		s, ok := body.(string)
		if !ok {
			return nil, true, fmt.Errorf("$bytes does not hold a string")
		}
		b, err := base64.StdEncoding.Strict().DecodeString(s)
		if err != nil || base64.StdEncoding.EncodeToString(b) != s { // Strict still skips '\r' and '\n'
			return nil, true, fmt.Errorf("$bytes is not canonical base64 with padding")
		}
		return b, true, nil
	case "$float":
		switch body {
		case "nan":
			return math.NaN(), true, nil
		case "inf":
			return math.Inf(1), true, nil
		case "-inf":
			return math.Inf(-1), true, nil
		}
		return nil, true, fmt.Errorf("$float holds %.40v, not nan, inf or -inf", body)
	case "$complex":
		parts, ok := body.([]any)
		if !ok || len(parts) != 2 {
			return nil, true, fmt.Errorf("$complex does not hold [re, im]")
		}
		var f [2]float64
		for i, p := range parts {
			d, err := fromTagged(p)
			if err != nil {
				return nil, true, err
			}
			switch n := d.(type) {
			case json.Number:
				if f[i], err = n.Float64(); err != nil {
					return nil, true, fmt.Errorf("$complex part %.40s is beyond an f64", n)
				}
			case float64:
				f[i] = n
			default:
				return nil, true, fmt.Errorf("$complex part %.40s is not a number", fmtKey(p))
			}
		}
		return complex(f[0], f[1]), true, nil
	}
	return nil, false, nil
}

// hashKey is a text equal for two $dict keys exactly when Python finds them equal (FORMAT.md A.3: 1, 1.0, True and
// (1+0j) are one key; NaN equals nothing, so a key holding one is never a duplicate: never is true). Lists and dicts
// are not hashable in Python, and are errors.
func hashKey(k any) (key string, never bool, err error) {
	switch x := k.(type) {
	case nil:
		return "N", false, nil
	case bool:
		if x {
			return "I1", false, nil
		}
		return "I0", false, nil
	case json.Number:
		if isIntegerLiteral(x) {
			n, ok := new(big.Int).SetString(string(x), 10)
			if !ok {
				return "", false, fmt.Errorf("bad integer %.40s", x)
			}
			return "I" + n.String(), false, nil
		}
		f, _ := x.Float64() // in range: parseStrictJSON checked it
		k, never := floatKey(f)
		return k, never, nil
	case float64:
		k, never := floatKey(x)
		return k, never, nil
	case complex128:
		re, n1 := floatKey(real(x))
		if imag(x) == 0 {
			return re, n1, nil
		}
		im, n2 := floatKey(imag(x))
		return "C" + re + "," + im, n1 || n2, nil
	case string:
		return "S" + x, false, nil
	case []byte:
		return "B" + hex.EncodeToString(x), false, nil
	case Tuple:
		var b strings.Builder
		b.WriteString("T")
		never := false
		for _, e := range x {
			ek, n, err := hashKey(e)
			if err != nil {
				return "", false, err
			}
			never = never || n
			fmt.Fprintf(&b, "%d:%s", len(ek), ek)
		}
		return b.String(), never, nil
	}
	return "", false, fmt.Errorf("a $dict key is a %s, which Python cannot hash", kindName(k))
}

func floatKey(f float64) (string, bool) {
	switch {
	case math.IsNaN(f):
		return "", true
	case math.IsInf(f, 0):
		return "F" + strconv.FormatFloat(f, 'g', -1, 64), false
	case f == math.Trunc(f):
		n, _ := new(big.Float).SetFloat64(f).Int(nil) // exact: an integral f64 is an integer
		return "I" + n.String(), false
	}
	return "F" + strconv.FormatFloat(f, 'g', -1, 64), false
}

func kindName(v any) string {
	switch v.(type) {
	case []any:
		return "list"
	case map[string]any, Dict:
		return "dict"
	}
	return fmt.Sprintf("%T", v)
}

func fmtKey(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// StructureVersion is the version of Python's structure document that ParsedStructure reads
// ({"distckpt_structure": 1, "root": ...}).
const StructureVersion = 1

// NodeKind is the kind of a StructureNode.
type NodeKind string

// Node kinds of a structure document.
const (
	DictNode   NodeKind = "dict"   // Keys and Children
	ListNode   NodeKind = "list"   // Children
	TupleNode  NodeKind = "tuple"  // Children
	ArrayNode  NodeKind = "array"  // a tensor entry (Entry; Scalar for a numpy scalar)
	ObjectNode NodeKind = "object" // a bytes entry (Entry) holding a value: Encoding "json" (see Value) or "pickle"
)

// StructureNode is one node of the nested state Python saved.
type StructureNode struct {
	Kind NodeKind
	// Keys of a DictNode, in insertion order: a string, or a json.Number for an int key. Children[i] is Keys[i]'s value.
	Keys     []any
	Children []*StructureNode // a DictNode's values, or a ListNode's or TupleNode's elements
	Entry    string           // ArrayNode, ObjectNode: the name of the entry holding the leaf
	Scalar   bool             // ArrayNode: the leaf was a numpy scalar (a 0-d tensor)
	Encoding string           // ObjectNode: "json" or "pickle"
}

// Structure is the parsed structure document of a checkpoint saved from Python.
type Structure struct {
	Version int
	Root    *StructureNode // a DictNode
}

// StructureLeaf is an array or object node with the path of keys and indices (string, json.Number or int) that leads
// to it from the root.
type StructureLeaf struct {
	Path []any
	Node *StructureNode
}

// Leaves lists the array and object nodes in document order, with their paths.
func (s *Structure) Leaves() []StructureLeaf {
	var out []StructureLeaf
	var walk func(n *StructureNode, path []any)
	walk = func(n *StructureNode, path []any) {
		switch n.Kind {
		case DictNode:
			for i, c := range n.Children {
				walk(c, append(append([]any(nil), path...), n.Keys[i]))
			}
		case ListNode, TupleNode:
			for i, c := range n.Children {
				walk(c, append(append([]any(nil), path...), i))
			}
		default:
			out = append(out, StructureLeaf{Path: path, Node: n})
		}
	}
	if s != nil && s.Root != nil {
		walk(s.Root, nil)
	}
	return out
}

// Find returns the array or object node whose entry is name, or nil.
func (s *Structure) Find(name string) *StructureNode {
	for _, l := range s.Leaves() {
		if l.Node.Entry == name {
			return l.Node
		}
	}
	return nil
}

// ParsedStructure parses the checkpoint's structure string as the structure document Python's save writes
// ({"distckpt_structure": 1, "root": NODE}, see python/distckpt/_tree.py and FORMAT.md appendix A). It returns nil
// and no error when the checkpoint has no structure or another writer's (the core keeps it opaque), ErrVersion for a
// newer structure version, and ErrCorrupt for a malformed document.
func (r *Reader) ParsedStructure() (*Structure, error) {
	raw, err := r.Structure()
	if err != nil || len(raw) == 0 {
		return nil, err
	}
	return ParseStructure(raw, r.path)
}

// ParseStructure parses a structure document as ParsedStructure does, for bytes read by other means; checkpoint
// names the checkpoint in its errors.
func ParseStructure(raw []byte, checkpoint string) (*Structure, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	v, dup, err := parseStrictJSON(raw, maxStructureJSONDepth)
	if err != nil {
		return nil, nil // not JSON: not ours
	}
	doc, ok := v.(*jsonObject)
	if !ok {
		return nil, nil
	}
	vraw, ok := doc.get("distckpt_structure")
	if !ok {
		return nil, nil
	}
	bad := func(format string, args ...any) error {
		return errorf(CodeCorrupt, "checkpoint '%s': malformed structure: %s", checkpoint, fmt.Sprintf(format, args...))
	}
	vnum, ok := vraw.(json.Number)
	if !ok || !isIntegerLiteral(vnum) {
		return nil, bad("version %.40s is not an integer", fmtKey(vraw))
	}
	version, _ := new(big.Int).SetString(string(vnum), 10)
	if version.Sign() <= 0 {
		return nil, bad("version %s is not 1 or more", version)
	}
	if version.Cmp(big.NewInt(StructureVersion)) > 0 {
		return nil, errorf(CodeVersion, "checkpoint '%s' describes its nested state with structure version %s; this "+
			"package reads version %d: upgrade it (or read the entries by name)", checkpoint, version, StructureVersion)
	}
	if dup != "" {
		return nil, bad("member %.80q appears twice in an object", dup)
	}
	rootRaw, _ := doc.get("root")
	root, err := parseNode(rootRaw, 0, map[string]bool{}, bad)
	if err != nil {
		return nil, err
	}
	if root.Kind != DictNode {
		return nil, bad("the root is a %s, not a dict", root.Kind)
	}
	return &Structure{Version: int(version.Int64()), Root: root}, nil
}

// MaxStructureDepth is how deeply structure nodes may nest below the root (FORMAT.md A.2).
const MaxStructureDepth = 200

var nodeKinds = []NodeKind{DictNode, ListNode, TupleNode, ArrayNode, ObjectNode}

func parseNode(v any, depth int, names map[string]bool, bad func(string, ...any) error) (*StructureNode, error) {
	if depth > MaxStructureDepth {
		return nil, bad("nested too deeply")
	}
	m, ok := v.(*jsonObject)
	if !ok || len(m.keys) == 0 {
		return nil, bad("node %.80s is not an object", fmtKey(v))
	}
	var kinds []string
	for _, k := range nodeKinds {
		if m.has(string(k)) {
			kinds = append(kinds, string(k))
		}
	}
	if len(kinds) == 0 {
		return nil, bad("unknown node kind %s", strings.Join(m.keys, ","))
	}
	if len(kinds) > 1 {
		return nil, bad("a node has more than one kind (%s)", strings.Join(kinds, ", "))
	}
	body, _ := m.get(kinds[0])
	children := func(items []any) ([]*StructureNode, error) {
		out := make([]*StructureNode, len(items))
		for i, it := range items {
			n, err := parseNode(it, depth+1, names, bad)
			if err != nil {
				return nil, err
			}
			out[i] = n
		}
		return out, nil
	}
	leaf := func(n *StructureNode) (*StructureNode, error) {
		if names[n.Entry] {
			return nil, bad("two leaves name the entry '%.80s'", n.Entry)
		}
		names[n.Entry] = true
		return n, nil
	}
	switch NodeKind(kinds[0]) {
	case DictNode:
		items, ok := body.([]any)
		if !ok {
			return nil, bad("'dict' is not a list")
		}
		n := &StructureNode{Kind: DictNode}
		seen := map[string]bool{}
		for _, it := range items {
			pair, ok := it.([]any)
			if !ok || len(pair) != 2 {
				return nil, bad("a dict item is not a [key, node] pair")
			}
			var key string
			switch k := pair[0].(type) {
			case string:
				key = "S" + k
			case json.Number:
				i, ok := new(big.Int).SetString(string(k), 10) // an integer of any size, as Python's int
				if !ok {
					return nil, bad("dict key %s is not an integer", k)
				}
				key = "I" + i.String()
			default:
				return nil, bad("dict key %.80s is not a string or an integer", fmtKey(pair[0]))
			}
			if seen[key] {
				return nil, bad("dict key %.80s appears twice", fmtKey(pair[0]))
			}
			seen[key] = true
			c, err := parseNode(pair[1], depth+1, names, bad)
			if err != nil {
				return nil, err
			}
			n.Keys = append(n.Keys, pair[0])
			n.Children = append(n.Children, c)
		}
		return n, nil
	case ListNode, TupleNode:
		items, ok := body.([]any)
		if !ok {
			return nil, bad("'%s' is not a list", kinds[0])
		}
		c, err := children(items)
		return &StructureNode{Kind: NodeKind(kinds[0]), Children: c}, err
	case ArrayNode:
		name, ok := body.(string)
		if !ok {
			return nil, bad("'array' is not a name")
		}
		scalar := false
		if s, present := m.get("scalar"); present {
			if scalar, ok = s.(bool); !ok {
				return nil, bad("array node '%.80s': 'scalar' is not true or false", name)
			}
		}
		return leaf(&StructureNode{Kind: ArrayNode, Entry: name, Scalar: scalar})
	default: // ObjectNode
		name, ok := body.(string)
		encRaw, _ := m.get("encoding")
		enc, _ := encRaw.(string)
		if !ok || (enc != "json" && enc != "pickle") {
			return nil, bad("object node %.80s lacks a name or a known encoding", fmtKey(body))
		}
		return leaf(&StructureNode{Kind: ObjectNode, Entry: name, Encoding: enc})
	}
}
