"""Nested state <-> flat named entries, and the safe encoding of non-array leaves.

Flattening follows torch.distributed.checkpoint's rules, so that names match DCP's:

- Mappings are always traversed. Their keys must be ``str`` or ``int``; an entry's name is the path of keys joined
  with ``"."`` (``{"model": {"layers": [{"w": ...}]}}`` gives ``model.layers.0.w``).
- Lists and tuples are traversed only when they hold an array somewhere inside; otherwise the whole list is one
  object leaf.
- Objects with ``state_dict()`` and ``load_state_dict()`` (torch modules and optimizers, or anything "Stateful") are
  saved through ``state_dict()``; loading fills that dict and then calls ``load_state_dict`` with it.
- A ``Shard`` or a list of Shards is one array leaf.

Every other leaf is an object, stored as a bytes entry. The encoding is JSON (UTF-8) extended with tagged forms for
what JSON lacks: ``{"$tuple": [...]}``, ``{"$dict": [[key, value], ...]}`` (non-string keys, or keys starting with
``$``), ``{"$bytes": "<base64>"}``, ``{"$float": "nan" | "inf" | "-inf"}`` and ``{"$complex": [re, im]}``. A value
that cannot be encoded so is refused unless the caller passed ``allow_pickle=True``; then it is pickled, and loading
it needs ``allow_pickle=True`` too. Nothing is ever unpickled otherwise.

The structure saved with the checkpoint (``dckpt_state_set_structure``; FORMAT.md calls it opaque to the core) is a
JSON document other bindings can read as well::

    {"distckpt_structure": 1, "root": NODE}
    NODE := {"dict": [[KEY, NODE], ...]}                KEY: a string or an integer, in insertion order
          | {"list": [NODE, ...]} | {"tuple": [NODE, ...]}
          | {"array": NAME}  (+ "scalar": true for a numpy scalar)
          | {"object": NAME, "encoding": "json" | "pickle"}

Both are normative in core/format/FORMAT.md, appendix A (what every reader must accept and reject); the shared
fixtures in tests/fixtures/values/ hold Python, Rust and Go to it.
"""

from __future__ import annotations

import base64
import json
import math
import pickle
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .errors import CorruptCheckpointError, InvalidArgumentError, PickleNotAllowedError, VersionError

STRUCTURE_VERSION = 1
#: How deeply structure nodes may nest below the root (FORMAT.md A.2): deeper state is refused when saved.
MAX_STRUCTURE_DEPTH = 200
Path = Tuple[Any, ...]
Node = Dict[str, Any]
Step = Tuple[bool, Any]  #: one step of a path for nest(): (is it a sequence index, the key or index)


@dataclass
class Leaf:
    path: Path
    name: str
    value: Any
    is_array: bool
    node: Node  # its node in the structure (object nodes get their "encoding" when saved)


@dataclass
class Flat:
    """A flattened tree: its structure node, its leaves in traversal order, and its stateful objects."""

    root: Node
    leaves: List[Leaf]
    #: path -> (object, the dict its state_dict() returned), for load_state_dict after a load
    stateful: Dict[Path, Tuple[Any, Dict[Any, Any]]]


def _is_stateful(x: Any) -> bool:
    return callable(getattr(x, "state_dict", None)) and callable(getattr(x, "load_state_dict", None))


def _check_key(key: Any, path: Path) -> None:
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise InvalidArgumentError(
            f"state key {key!r} at {_display(path)} is a {type(key).__name__}; keys of dicts that hold arrays must "
            "be str or int"
        )


def _display(path: Path) -> str:
    return "'" + ".".join(str(p) for p in path) + "'" if path else "the root"


# The walks below are classes rather than recursive closures: a nested function that calls itself is a reference
# cycle (function -> closure cell -> function), which would keep the leaves it saw (GPU tensors: gigabytes) alive
# after the call until the garbage collector happens to run.


def _contains_array(x: Any, is_array: Callable[[Any], bool], depth: int = 0) -> bool:
    if is_array(x) or _is_stateful(x):
        return True
    if depth > 100:
        return False
    if isinstance(x, Mapping):
        return any(_contains_array(v, is_array, depth + 1) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(_contains_array(v, is_array, depth + 1) for v in x)
    return False


class _Flattener:
    def __init__(self, is_array: Callable[[Any], bool]) -> None:
        self.is_array = is_array
        self.leaves: List[Leaf] = []
        self.stateful: Dict[Path, Tuple[Any, Dict[Any, Any]]] = {}
        self.names: Dict[str, Path] = {}

    def leaf(self, x: Any, path: Path, array: bool) -> Node:
        name = ".".join(str(p) for p in path)
        if name in self.names:
            raise InvalidArgumentError(
                f"two leaves have the entry name '{name}': {self.names[name]} and {path}; rename a key (a key "
                "containing '.' can collide with a nested one)"
            )
        self.names[name] = path
        node: Node = {"array": name} if array else {"object": name}
        if array and isinstance(x, np.generic):
            node["scalar"] = True
        self.leaves.append(Leaf(path, name, x, array, node))
        return node

    def visit(self, x: Any, path: Path) -> Node:
        if len(path) > MAX_STRUCTURE_DEPTH:
            raise InvalidArgumentError(
                f"the state nests deeper than {MAX_STRUCTURE_DEPTH} levels at {_display(path[:3] + ('...',))}; "
                "readers refuse such a structure"
            )
        if self.is_array(x):
            return self.leaf(x, path, True)
        if _is_stateful(x) and path:
            sd = x.state_dict()
            self.stateful[path] = (x, sd)
            return self.visit(sd, path)
        if isinstance(x, Mapping):
            items = []
            for k, v in x.items():
                _check_key(k, path + (k,))
                items.append([k, self.visit(v, path + (k,))])
            return {"dict": items}
        if isinstance(x, (list, tuple)) and _contains_array(x, self.is_array):
            kind = "tuple" if isinstance(x, tuple) else "list"
            return {kind: [self.visit(v, path + (i,)) for i, v in enumerate(x)]}
        if not path:
            raise InvalidArgumentError("a state dict must be a mapping (dict)")
        return self.leaf(x, path, False)


def flatten(tree: Mapping[Any, Any], is_array: Callable[[Any], bool]) -> Flat:
    """Flattens a state dict. ``is_array`` decides which leaves are tensors."""
    if not isinstance(tree, Mapping):
        raise InvalidArgumentError(f"a state dict must be a mapping (dict), not {type(tree).__name__}")
    walk = _Flattener(is_array)
    root = walk.visit(tree, ())
    return Flat(root, walk.leaves, walk.stateful)


def nest(paths: Sequence[Tuple[Step, ...]], leaves: Sequence[Any]) -> Dict[Any, Any]:
    """Nested dicts and lists holding ``leaves`` at ``paths`` (each step ``(is_sequence, key)``): what
    :func:`flatten` turns back into the names ``"."``-joined paths give.

    A sequence whose indices run 0..n-1 becomes a list; one with gaps (a ``None`` element of a pytree list has no
    leaves) a dict keyed by index, which flattens to the same names. The root is always a dict.
    """
    names: Dict[str, Tuple[Step, ...]] = {}
    for path in paths:
        name = ".".join(str(k) for _, k in path)
        if name in names and names[name] != path:
            raise InvalidArgumentError(
                f"two pytree paths give the distckpt name '{name}': {names[name]} and {path} (a dict key with '.' "
                "next to a nested dict?)"
            )
        names[name] = path
    # Build with dicts everywhere, remembering which were sequences, then turn dense sequences into lists.
    root: Dict[Any, Any] = {}
    is_seq: Dict[int, bool] = {}
    for path, leaf in zip(paths, leaves):
        node = root
        for depth, (_, key) in enumerate(path[:-1]):
            child_seq = path[depth + 1][0]
            child = node.get(key)
            if child is None:
                child = node[key] = {}
                is_seq[id(child)] = child_seq
            node = child
        node[path[-1][1]] = leaf

    return {k: _finish_nested(v, is_seq) for k, v in root.items()}


def _finish_nested(node: Any, is_seq: Dict[int, bool]) -> Any:
    """nest()'s second pass: a dict that stands for a dense sequence becomes a list."""
    if not isinstance(node, dict) or id(node) not in is_seq:
        return node
    out = {k: _finish_nested(v, is_seq) for k, v in node.items()}
    if is_seq[id(node)] and sorted(out) == list(range(len(out))):
        return [out[i] for i in range(len(out))]
    return out


class _Replacer:
    def __init__(self, flat: Flat, replacements: Dict[Path, Any]) -> None:
        self.flat = flat
        self.replacements = replacements

    def visit(self, x: Any, path: Path) -> Any:
        replacements, stateful = self.replacements, self.flat.stateful
        if path in replacements:
            return replacements[path]
        if path in stateful and stateful[path][0] is x:
            obj, sd = stateful[path]
            self.visit(sd, path)
            obj.load_state_dict(sd)
            return obj
        if isinstance(x, Mapping):
            for k in list(x.keys()):
                v = x[k]
                nv = self.visit(v, path + (k,))
                if nv is not v:
                    x[k] = nv  # type: ignore[index]
            return x
        if isinstance(x, list):
            for i, v in enumerate(x):
                nv = self.visit(v, path + (i,))
                if nv is not v:
                    x[i] = nv
            return x
        if isinstance(x, tuple) and any(
            len(p) > len(path) and p[: len(path)] == path for p in (*replacements, *stateful)
        ):
            items = [self.visit(v, path + (i,)) for i, v in enumerate(x)]
            make = getattr(type(x), "_make", None)  # namedtuples
            return make(items) if make is not None else type(x)(items)
        return x


def replace_leaves(tree: Any, flat: Flat, replacements: Dict[Path, Any]) -> Any:
    """Puts new leaf values into ``tree`` (dicts and lists in place; tuples rebuilt), then calls load_state_dict on
    the stateful objects. Returns the tree (the same object for a dict root)."""
    return _Replacer(flat, replacements).visit(tree, ())


# ---- Structure documents --------------------------------------------------------------------------------------------


def dump_structure(root: Node) -> bytes:
    return json.dumps({"distckpt_structure": STRUCTURE_VERSION, "root": root}, separators=(",", ":")).encode()


def parse_structure(raw: bytes, checkpoint: str) -> Optional[Node]:
    """The root node of a saved structure, validated; None if the checkpoint has none, or another binding's."""
    if not raw:
        return None
    duplicates: List[str] = []
    try:
        doc = _strict_json(raw, duplicates)
    except (ValueError, RecursionError):
        return None  # not ours: the core keeps the structure opaque, and other bindings may store anything there
    if not isinstance(doc, dict) or "distckpt_structure" not in doc:
        return None
    version = doc["distckpt_structure"]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CorruptCheckpointError(f"checkpoint '{checkpoint}': bad structure version {version!r}")
    if version > STRUCTURE_VERSION:
        raise VersionError(
            f"checkpoint '{checkpoint}' describes its nested state with structure version {version}; this distckpt "
            f"reads version {STRUCTURE_VERSION}: upgrade distckpt (or read the entries by name with distckpt.open)"
        )
    if duplicates:
        raise CorruptCheckpointError(
            f"checkpoint '{checkpoint}': malformed structure: member {duplicates[0]!r:.80} appears twice in an object"
        )
    root = doc.get("root")
    _validate(root, checkpoint, 0, set())
    assert isinstance(root, dict)  # _validate checked it
    if "dict" not in root:
        raise CorruptCheckpointError(f"checkpoint '{checkpoint}': the structure's root is not a dict")
    return root


#: The members that name a node's kind: a node has exactly one (FORMAT.md A.2).
_NODE_KINDS = ("dict", "list", "tuple", "array", "object")


def _validate(node: Any, checkpoint: str, depth: int, names: set) -> None:
    def bad(why: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"checkpoint '{checkpoint}': malformed structure: {why}")

    if depth > MAX_STRUCTURE_DEPTH:
        raise bad("nested too deeply")
    if not isinstance(node, dict) or len(node) == 0:
        raise bad(f"node {node!r:.80} is not an object")
    kinds = [k for k in _NODE_KINDS if k in node]
    if len(kinds) > 1:
        raise bad(f"node {node!r:.80} has more than one kind ({', '.join(kinds)})")
    if "dict" in node:
        items = node["dict"]
        if not isinstance(items, list):
            raise bad("'dict' is not a list")
        keys = set()
        for item in items:
            if not (isinstance(item, list) and len(item) == 2):
                raise bad("a dict item is not a [key, node] pair")
            k = item[0]
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                raise bad(f"dict key {k!r:.80} is not a string or an integer")
            if k in keys:
                raise bad(f"dict key {k!r:.80} appears twice")
            keys.add(k)
            _validate(item[1], checkpoint, depth + 1, names)
    elif "list" in node or "tuple" in node:
        items = node["list"] if "list" in node else node["tuple"]
        if not isinstance(items, list):
            raise bad("'list' is not a list")
        for item in items:
            _validate(item, checkpoint, depth + 1, names)
    elif "array" in node or "object" in node:
        if "array" in node:
            if not isinstance(node["array"], str):
                raise bad("'array' is not a name")
            if not isinstance(node.get("scalar", False), bool):
                raise bad(f"array node {node!r:.80}: 'scalar' is not true or false")
        elif not isinstance(node["object"], str) or node.get("encoding") not in ("json", "pickle"):
            raise bad(f"object node {node!r:.80} lacks a name or a known encoding")
        name = leaf_name(node)
        if name in names:
            raise bad(f"two leaves name the entry '{name:.80}'")
        names.add(name)
    else:
        raise bad(f"unknown node kind {sorted(node)!r:.80}")


def iter_nodes(node: Node) -> Iterator[Node]:
    """Every leaf node (array and object) under ``node``."""
    if "dict" in node:
        for _, child in node["dict"]:
            yield from iter_nodes(child)
    elif "list" in node or "tuple" in node:
        for child in node["list"] if "list" in node else node["tuple"]:
            yield from iter_nodes(child)
    else:
        yield node


def leaf_name(node: Node) -> str:
    """The entry name of an array or object node."""
    return str(node["array"] if "array" in node else node["object"])


def build(node: Node, get: Callable[[Node], Any]) -> Any:
    """Rebuilds the nested value of ``node``; ``get(leaf_node)`` supplies each leaf."""
    if "dict" in node:
        return {k: build(child, get) for k, child in node["dict"]}
    if "list" in node:
        return [build(child, get) for child in node["list"]]
    if "tuple" in node:
        return tuple(build(child, get) for child in node["tuple"])
    return get(node)


# ---- Object leaves ---------------------------------------------------------------------------------------------------


class _NotJson(Exception):
    pass


def _to_json(v: Any, depth: int = 0) -> Any:
    if depth > 100:
        raise _NotJson("nested too deeply")
    t = type(v)
    if t is str and _SURROGATE.search(v):
        raise _NotJson("str with unpaired surrogates")  # not encodable as UTF-8: it would fail in encode() below
    if v is None or t is bool or t is str or t is int:
        return v
    if t is float:
        if math.isfinite(v):
            return v
        return {"$float": "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")}
    if t is complex:
        return {"$complex": [_to_json(v.real), _to_json(v.imag)]}
    if t is bytes or t is bytearray:
        return {"$bytes": base64.b64encode(bytes(v)).decode("ascii")}
    if t is list:
        return [_to_json(x, depth + 1) for x in v]
    if t is tuple:
        return {"$tuple": [_to_json(x, depth + 1) for x in v]}
    if t is dict:
        if all(type(k) is str and not k.startswith("$") for k in v):
            return {k: _to_json(x, depth + 1) for k, x in v.items()}
        return {"$dict": [[_to_json(k, depth + 1), _to_json(x, depth + 1)] for k, x in v.items()]}
    raise _NotJson(f"{t.__module__}.{t.__qualname__}")


#: How deeply the JSON of an object leaf may nest: arrays and objects, the outermost counting 1 (FORMAT.md A.4).
MAX_VALUE_DEPTH = 500
_SURROGATE = re.compile("[\ud800-\udfff]")


class _BadValue(ValueError):
    pass


def _strict_json(raw: bytes, duplicates: Optional[List[str]] = None) -> Any:
    """RFC 8259 JSON from UTF-8 bytes, as Rust's and Go's readers take it: no NaN/Infinity literals, no number beyond
    an f64, no unpaired surrogate escapes. Duplicate member names raise, or are collected in ``duplicates``."""

    def pairs(items: List[Tuple[str, Any]]) -> Dict[str, Any]:
        d = dict(items)
        if len(d) != len(items):
            seen: set = set()
            dup = next(k for k, _ in items if k in seen or seen.add(k))  # type: ignore[func-returns-value]
            if duplicates is None:
                raise _BadValue(f"member {dup!r:.80} appears twice in an object")
            duplicates.append(dup)
        return d

    def constant(word: str) -> Any:
        raise _BadValue(f"{word} is not JSON")

    def number(text: str) -> float:
        f = float(text)
        if not math.isfinite(f):
            raise _BadValue(f"number {text:.40} is beyond an f64")
        return f

    text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray, memoryview)) else raw
    doc = json.loads(text, object_pairs_hook=pairs, parse_constant=constant, parse_float=number)
    stack = [doc]
    while stack:  # Python's json turns an unpaired surrogate escape into a lone surrogate; Rust and Go refuse it
        x = stack.pop()
        if isinstance(x, str):
            if _SURROGATE.search(x):
                raise _BadValue("a string holds an unpaired surrogate escape")
        elif isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x)
            stack.extend(x.values())
    return doc


def _from_json(v: Any, depth: int = 0) -> Any:
    """The value of decoded JSON ``v`` (``depth``: the arrays and objects around it). Raises ValueError for what
    FORMAT.md appendix A says a reader rejects."""
    if not isinstance(v, (list, dict)):
        return v
    if depth >= MAX_VALUE_DEPTH:
        raise _BadValue(f"nested deeper than {MAX_VALUE_DEPTH} levels")
    # Loops, not comprehensions: before Python 3.12 a comprehension is a frame of its own, which would halve how deep
    # a value can nest before RecursionError.
    if isinstance(v, list):
        out_list = []
        for x in v:
            out_list.append(_from_json(x, depth + 1))
        return out_list
    if len(v) == 1:
        ((tag, body),) = v.items()
        if tag == "$tuple":
            items = []
            for x in _body_list(body, tag, depth):
                items.append(_from_json(x, depth + 2))
            return tuple(items)
        if tag == "$dict":
            out = {}
            for item in _body_list(body, tag, depth):
                pair = _body_list(item, "$dict item", depth + 1)
                if len(pair) != 2:
                    raise _BadValue("a $dict item is not a [key, value] pair")
                k = _from_json(pair[0], depth + 3)
                if isinstance(k, (list, dict)):
                    raise _BadValue("a $dict key is a list or a dict")
                out[k] = _from_json(pair[1], depth + 3)  # TypeError for an unhashable key (a tuple holding a list)
            if len(out) != len(body):
                raise _BadValue("a $dict has two equal keys")
            return out
        if tag == "$bytes":
            if not isinstance(body, str):
                raise _BadValue("$bytes does not hold a string")
            raw = base64.b64decode(body, validate=True)
            if base64.b64encode(raw).decode("ascii") != body:
                raise _BadValue("$bytes is not canonical base64 with padding")
            return raw
        if tag == "$float":
            if body not in ("nan", "inf", "-inf"):
                raise _BadValue(f"$float holds {body!r:.40}, not 'nan', 'inf' or '-inf'")
            return float(body)
        if tag == "$complex":
            parts = [_from_json(x, depth + 2) for x in _body_list(body, tag, depth)]
            if len(parts) != 2 or any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in parts):
                raise _BadValue("$complex does not hold [re, im] numbers")
            return complex(parts[0], parts[1])
    for k in v:
        if k.startswith("$"):
            raise _BadValue(f"unknown tag {k!r:.40}" if len(v) == 1 else f"key {k!r:.40} starts with '$' unescaped")
    out_dict = {}
    for k, x in v.items():
        out_dict[k] = _from_json(x, depth + 1)
    return out_dict


def _body_list(body: Any, tag: str, depth: int) -> List[Any]:
    """The array body of a tagged form whose object is ``depth`` deep."""
    if not isinstance(body, list):
        raise _BadValue(f"{tag} does not hold a list")
    if depth + 1 >= MAX_VALUE_DEPTH:
        raise _BadValue(f"nested deeper than {MAX_VALUE_DEPTH} levels")
    return body


#: The longest str a top-level leaf may have and still be copied into the user metadata (scalar_text).
MAX_USER_SCALAR_CHARS = 256


def scalar_text(value: Any) -> Optional[str]:
    """The text under which a top-level scalar leaf (``step``, ``epoch``, ``lr``, ``run_name``) is also recorded in the
    checkpoint's user metadata, where ``distckpt ls`` and the Rust, Go and C readers see it without parsing JSON: ints
    in decimal, floats as Python's ``repr`` (shortest round trip; ``inf``/``nan`` as such), bools as ``true`` and
    ``false``, short strs as themselves. None for anything else (arrays, containers, long strings, None)."""
    if isinstance(value, (np.generic, np.ndarray)):
        if isinstance(value, np.ndarray) and value.ndim != 0:
            return None
        if value.dtype.kind not in "biuf":
            return None
        value = value.item()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str) and len(value) <= MAX_USER_SCALAR_CHARS and "\x00" not in value:
        return value  # C readers see user metadata as NUL-terminated strings
    return None


def encode_object(value: Any, name: str, allow_pickle: bool) -> Tuple[bytes, str]:
    """(bytes, encoding) for an object leaf: JSON when possible, pickle only with allow_pickle."""
    try:
        doc = _to_json(value)
    except _NotJson as e:
        if allow_pickle:
            return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), "pickle"
        raise PickleNotAllowedError(
            f"entry '{name}': a {e} value cannot be stored as JSON; pass allow_pickle=True to pickle it (loading it "
            "will need allow_pickle=True too), or convert it to numbers, strings, lists and dicts"
        ) from None
    return json.dumps(doc, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8"), "json"


def decode_object(data: bytes, encoding: str, name: str, checkpoint: str, allow_pickle: bool) -> Any:
    if encoding == "json":
        try:
            return _from_json(_strict_json(data))
        except (ValueError, RecursionError, TypeError, OverflowError, KeyError, IndexError) as e:
            raise CorruptCheckpointError(
                f"checkpoint '{checkpoint}': entry '{name}' is not valid distckpt JSON ({e})"
            ) from None
    if encoding == "pickle":
        if not allow_pickle:
            raise pickle_refused([name], checkpoint)
        return pickle.loads(data)  # noqa: S301 - the caller opted in with allow_pickle=True
    raise CorruptCheckpointError(f"checkpoint '{checkpoint}': entry '{name}' has unknown encoding {encoding!r}")


def pickle_refused(names: List[str], checkpoint: str) -> PickleNotAllowedError:
    shown = ", ".join(f"'{n}'" for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return PickleNotAllowedError(
        f"checkpoint '{checkpoint}': {shown} {'was' if len(names) == 1 else 'were'} saved with pickle; loading "
        "pickled data can run arbitrary code, so pass allow_pickle=True only if you trust this checkpoint"
    )
