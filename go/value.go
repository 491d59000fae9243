package distckpt

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
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
func (r *Reader) Value(name string) (any, error) {
	e, err := r.Entry(name)
	if err != nil {
		return nil, err
	}
	if e.Kind != BytesEntry {
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

// DecodeValue decodes the JSON of a Python object leaf as Value does (for bytes read by other means).
func DecodeValue(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var raw any
	if err := dec.Decode(&raw); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("data after the JSON value")
	}
	return fromTagged(raw, 0)
}

// fromTagged turns the tagged forms of _tree.py's _to_json back into Go values.
func fromTagged(v any, depth int) (any, error) {
	if depth > 200 {
		return nil, fmt.Errorf("nested too deeply")
	}
	switch x := v.(type) {
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			d, err := fromTagged(e, depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = d
		}
		return out, nil
	case map[string]any:
		if len(x) == 1 {
			for tag, body := range x {
				switch tag {
				case "$tuple":
					items, ok := body.([]any)
					if !ok {
						return nil, fmt.Errorf("$tuple holds %T, not a list", body)
					}
					t, err := fromTagged(items, depth+1)
					if err != nil {
						return nil, err
					}
					return Tuple(t.([]any)), nil
				case "$dict":
					items, ok := body.([]any)
					if !ok {
						return nil, fmt.Errorf("$dict holds %T, not a list", body)
					}
					out := make(Dict, len(items))
					for i, it := range items {
						pair, ok := it.([]any)
						if !ok || len(pair) != 2 {
							return nil, fmt.Errorf("a $dict item is not a [key, value] pair")
						}
						k, err := fromTagged(pair[0], depth+1)
						if err != nil {
							return nil, err
						}
						val, err := fromTagged(pair[1], depth+1)
						if err != nil {
							return nil, err
						}
						out[i] = DictItem{Key: k, Value: val}
					}
					return out, nil
				case "$bytes":
					s, ok := body.(string)
					if !ok {
						return nil, fmt.Errorf("$bytes holds %T, not a string", body)
					}
					return base64.StdEncoding.DecodeString(s)
				case "$float":
					switch body {
					case "nan":
						return math.NaN(), nil
					case "inf":
						return math.Inf(1), nil
					case "-inf":
						return math.Inf(-1), nil
					}
					return nil, fmt.Errorf("$float holds %v, not nan, inf or -inf", body)
				case "$complex":
					parts, ok := body.([]any)
					if !ok || len(parts) != 2 {
						return nil, fmt.Errorf("$complex does not hold [re, im]")
					}
					var f [2]float64
					for i, p := range parts {
						d, err := fromTagged(p, depth+1)
						if err != nil {
							return nil, err
						}
						switch n := d.(type) {
						case json.Number:
							if f[i], err = n.Float64(); err != nil {
								return nil, err
							}
						case float64:
							f[i] = n
						default:
							return nil, fmt.Errorf("$complex part %v is not a number", p)
						}
					}
					return complex(f[0], f[1]), nil
				}
			}
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			d, err := fromTagged(e, depth+1)
			if err != nil {
				return nil, err
			}
			out[k] = d
		}
		return out, nil
	}
	return v, nil
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
// ({"distckpt_structure": 1, "root": NODE}, see python/distckpt/_tree.py). It returns nil and no error when the
// checkpoint has no structure or another writer's (the core keeps it opaque), ErrVersion for a newer structure
// version, and ErrCorrupt for a malformed document.
func (r *Reader) ParsedStructure() (*Structure, error) {
	raw, err := r.Structure()
	if err != nil || len(raw) == 0 {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return nil, nil // not ours
	}
	vraw, ok := doc["distckpt_structure"]
	if !ok {
		return nil, nil
	}
	bad := func(format string, args ...any) error {
		return errorf(CodeCorrupt, "checkpoint '%s': malformed structure: %s", r.path, fmt.Sprintf(format, args...))
	}
	vnum, ok := vraw.(json.Number)
	version, verr := vnum.Int64()
	if !ok || verr != nil {
		return nil, bad("version %v is not an integer", vraw)
	}
	if version > StructureVersion {
		return nil, errorf(CodeVersion, "checkpoint '%s' describes its nested state with structure version %d; this "+
			"package reads version %d: upgrade it (or read the entries by name)", r.path, version, StructureVersion)
	}
	root, err := parseNode(doc["root"], 0, bad)
	if err != nil {
		return nil, err
	}
	if root.Kind != DictNode {
		return nil, bad("the root is a %s, not a dict", root.Kind)
	}
	return &Structure{Version: int(version), Root: root}, nil
}

func parseNode(v any, depth int, bad func(string, ...any) error) (*StructureNode, error) {
	if depth > 200 {
		return nil, bad("nested too deeply")
	}
	m, ok := v.(map[string]any)
	if !ok || len(m) == 0 {
		return nil, bad("node %.80s is not an object", fmt.Sprint(v))
	}
	children := func(key string) ([]*StructureNode, error) {
		items, ok := m[key].([]any)
		if !ok {
			return nil, bad("'%s' is not a list", key)
		}
		out := make([]*StructureNode, len(items))
		for i, it := range items {
			n, err := parseNode(it, depth+1, bad)
			if err != nil {
				return nil, err
			}
			out[i] = n
		}
		return out, nil
	}
	switch {
	case m["dict"] != nil:
		items, ok := m["dict"].([]any)
		if !ok {
			return nil, bad("'dict' is not a list")
		}
		n := &StructureNode{Kind: DictNode}
		for _, it := range items {
			pair, ok := it.([]any)
			if !ok || len(pair) != 2 {
				return nil, bad("a dict item is not a [key, node] pair")
			}
			switch k := pair[0].(type) {
			case string:
			case json.Number:
				if _, err := k.Int64(); err != nil {
					return nil, bad("dict key %s is not an integer", k)
				}
			default:
				return nil, bad("dict key %.80s is not a string or an integer", fmt.Sprint(pair[0]))
			}
			c, err := parseNode(pair[1], depth+1, bad)
			if err != nil {
				return nil, err
			}
			n.Keys = append(n.Keys, pair[0])
			n.Children = append(n.Children, c)
		}
		return n, nil
	case m["list"] != nil:
		c, err := children("list")
		return &StructureNode{Kind: ListNode, Children: c}, err
	case m["tuple"] != nil:
		c, err := children("tuple")
		return &StructureNode{Kind: TupleNode, Children: c}, err
	case m["array"] != nil:
		name, ok := m["array"].(string)
		if !ok {
			return nil, bad("'array' is not a name")
		}
		scalar, _ := m["scalar"].(bool)
		return &StructureNode{Kind: ArrayNode, Entry: name, Scalar: scalar}, nil
	case m["object"] != nil:
		name, ok := m["object"].(string)
		enc, _ := m["encoding"].(string)
		if !ok || (enc != "json" && enc != "pickle") {
			return nil, bad("object node %.80s lacks a name or a known encoding", fmt.Sprint(m))
		}
		return &StructureNode{Kind: ObjectNode, Entry: name, Encoding: enc}, nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return nil, bad("unknown node kind %s", strings.Join(keys, ","))
}
