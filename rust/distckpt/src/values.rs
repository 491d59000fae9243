//! Non-array values: bytes entries that hold JSON (what distckpt's Python binding saves for every leaf of a state dict
//! that is not an array) and the structure document, read as [`json::Value`]s.

use crate::checkpoint::{Checkpoint, EntryKind};
use crate::dtype::Dtype;
use crate::error::{Error, ErrorCode, Result};
use crate::float;
use crate::json;

/// The dtypes whose 0-d tensors [`Checkpoint::value`] reads as a number: bool, the integers and the IEEE-like floats
/// (not complex, whose JSON form is a tagged pair, nor FP8, which no numpy scalar is).
fn scalar_dtype(dtype: Dtype) -> bool {
    use Dtype::*;
    matches!(dtype, Bool | U8 | I8 | U16 | I16 | U32 | I32 | U64 | I64 | F16 | BF16 | F32 | F64)
}

/// The first byte of a pickle of protocol 2 or later (the PROTO opcode): never the first byte of UTF-8 text.
const PICKLE_PROTO: u8 = 0x80;

impl Checkpoint {
    /// The value of a bytes entry saved as JSON, parsed: a scalar, string, list or dict leaf that Python's
    /// `distckpt.save` stored (`{"step": 100}` gives entry `step` holding `100`; nested dicts give dotted names such as
    /// `optimizer.param_groups`). Python's tagged forms (`$tuple`, `$dict`, `$bytes`, `$float`, `$complex`) are
    /// decoded by the accessors of [`json::Value`]. Scalar leaves are also in the user metadata as text
    /// ([`Checkpoint::user`]), where no parsing is needed.
    ///
    /// Errors name the checkpoint and the entry: `NotFound` if there is no such entry; `InvalidArgument` for a tensor,
    /// or for bytes that are not JSON (a blob saved from C, C++ or Rust, for [`read_bytes`](Self::read_bytes));
    /// `Unsupported` for a value Python pickled (`allow_pickle=True`), which nothing but Python can load; `Corrupt` for
    /// an entry the checkpoint's structure says is JSON but is not.
    ///
    /// A 0-d tensor of a bool, integer or float dtype is a value too: Python saves a numpy scalar
    /// (`{"step": np.int64(5)}`) that way, so `value` gives what the same number saved as JSON gives (a
    /// [`json::Number`], F16/BF16 widened exactly; a bool; `{"$float": "nan" | "inf" | "-inf"}`, which
    /// [`json::Value::as_f64`] reads). Go's `Reader.Value` agrees. Complex and FP8 0-d tensors stay
    /// `InvalidArgument`.
    pub fn value(&self, name: &str) -> Result<json::Value> {
        let entry = self.entry(name)?;
        if entry.kind() != EntryKind::Bytes && entry.shape().is_empty() && scalar_dtype(entry.dtype()) {
            return self.scalar_value(name, entry.dtype());
        }
        if entry.kind() != EntryKind::Bytes {
            return Err(Error::new(
                ErrorCode::InvalidArgument,
                format!(
                    "{} is a tensor ({} {:?}), not a bytes entry holding a value: read it with read() or view()",
                    self.describe(name),
                    entry.dtype(),
                    entry.shape()
                ),
            ));
        }
        let encoding = self.structure_json().and_then(|s| object_encoding(&s, name));
        let bytes = self.read_bytes(name)?;
        if encoding.as_deref() == Some("pickle") || (encoding.is_none() && bytes.first() == Some(&PICKLE_PROTO)) {
            return Err(Error::new(
                ErrorCode::Unsupported,
                format!(
                    "{} was saved by Python with pickle (allow_pickle=True), not as JSON: only Python can load it, with \
                     allow_pickle=True if it trusts the checkpoint (unpickling runs code); read_bytes() gives the raw \
                     pickle",
                    self.describe(name)
                ),
            ));
        }
        // FORMAT.md A.1 and A.4: no member name twice in an object, and at most VALUE_MAX_DEPTH deep.
        let parsed = json::parse_with_max_depth(&bytes, VALUE_MAX_DEPTH).map_err(|e| e.to_string()).and_then(|v| {
            match first_duplicate_member(&v) {
                Some(key) => Err(format!("member {key:?} appears twice in an object")),
                None => Ok(v),
            }
        });
        parsed.map_err(|e| match encoding.as_deref() {
            Some("json") => Error::new(
                ErrorCode::Corrupt,
                format!("{}: the checkpoint's structure says it holds JSON, but it does not: {e}", self.describe(name)),
            ),
            _ => Error::new(
                ErrorCode::InvalidArgument,
                format!(
                    "{} is not JSON ({e}): it is a blob, not a value saved from Python; read_bytes() gives its {} raw \
                     bytes",
                    self.describe(name),
                    bytes.len()
                ),
            ),
        })
    }

    /// The value of `name` ([`Checkpoint::value`]) read into `T` with Python's tagged forms decoded
    /// ([`json::from_value`], feature `serde`): `let step: u64 = ckpt.value_as("step")?`, a tuple as `(u32, u32)`, a
    /// list of dicts as `Vec<MyStruct>` (serde derive), anything as `serde_json::Value`. A value that breaks FORMAT.md
    /// appendix A's rules for tagged forms is `Corrupt`; one that does not fit `T` is `InvalidArgument` with serde's
    /// reason. Both name the checkpoint, the entry and `T`.
    #[cfg(feature = "serde")]
    pub fn value_as<T: serde::de::DeserializeOwned>(&self, name: &str) -> Result<T> {
        let value = self.value(name)?;
        json::from_value(&value).map_err(|e| {
            let code = match e {
                json::DecodeError::Malformed(_) => ErrorCode::Corrupt,
                json::DecodeError::Mismatch(_) => ErrorCode::InvalidArgument,
            };
            Error::new(code, format!("{}: cannot read it as {}: {e}", self.describe(name), std::any::type_name::<T>()))
        })
    }

    /// A 0-d tensor of a [`scalar_dtype`] read as the number it holds (see [`Checkpoint::value`]).
    fn scalar_value(&self, name: &str, dtype: Dtype) -> Result<json::Value> {
        let raw = self.read_raw(name)?;
        let bytes = |n: usize| -> Result<&[u8]> {
            raw.get(..n).filter(|_| raw.len() == n).ok_or_else(|| {
                Error::new(
                    ErrorCode::Corrupt,
                    format!("{} is a 0-d {dtype} tensor of {} bytes, not {n}", self.describe(name), raw.len()),
                )
            })
        };
        let int = |i: i64| Ok(json::Value::Number(json::Number::Int(i)));
        let f = match dtype {
            Dtype::Bool => return Ok(json::Value::Bool(bytes(1)?[0] != 0)),
            Dtype::U8 => return int(bytes(1)?[0] as i64),
            Dtype::I8 => return int(bytes(1)?[0] as i8 as i64),
            Dtype::U16 => return int(u16::from_le_bytes(bytes(2)?.try_into().unwrap()) as i64),
            Dtype::I16 => return int(i16::from_le_bytes(bytes(2)?.try_into().unwrap()) as i64),
            Dtype::U32 => return int(u32::from_le_bytes(bytes(4)?.try_into().unwrap()) as i64),
            Dtype::I32 => return int(i32::from_le_bytes(bytes(4)?.try_into().unwrap()) as i64),
            Dtype::I64 => return int(i64::from_le_bytes(bytes(8)?.try_into().unwrap())),
            Dtype::U64 => {
                let u = u64::from_le_bytes(bytes(8)?.try_into().unwrap());
                // As the JSON parser does: Int up to i64::MAX, UInt above.
                return Ok(json::Value::Number(match i64::try_from(u) {
                    Ok(i) => json::Number::Int(i),
                    Err(_) => json::Number::UInt(u),
                }));
            }
            Dtype::F16 => float::f16_to_f32(u16::from_le_bytes(bytes(2)?.try_into().unwrap())) as f64,
            Dtype::BF16 => float::bf16_to_f32(u16::from_le_bytes(bytes(2)?.try_into().unwrap())) as f64,
            Dtype::F32 => f32::from_le_bytes(bytes(4)?.try_into().unwrap()) as f64,
            Dtype::F64 => f64::from_le_bytes(bytes(8)?.try_into().unwrap()),
            _ => unreachable!("scalar_dtype admits only the dtypes above"),
        };
        if f.is_finite() {
            return Ok(json::Value::Number(json::Number::Float(f)));
        }
        // JSON numbers are finite: the tagged form Python writes for these floats.
        let text = if f.is_nan() {
            "nan"
        } else if f > 0.0 {
            "inf"
        } else {
            "-inf"
        };
        Ok(json::Value::Object(vec![("$float".to_string(), json::Value::String(text.to_string()))]))
    }

    /// The structure document parsed as JSON, or None if the checkpoint has none or it is not JSON (the format keeps
    /// it opaque: a binding may store anything). Python's is `{"distckpt_structure": 1, "root": NODE}`, a NODE
    /// being `{"dict": [[key, NODE], ...]}`, `{"list": [NODE, ...]}`, `{"tuple": [NODE, ...]}`,
    /// `{"array": name}` (with `"scalar": true` for a numpy scalar) or `{"object": name, "encoding": "json" |
    /// "pickle"}`: it says how the entries nest, and how each non-array leaf is encoded.
    pub fn structure_json(&self) -> Option<json::Value> {
        let raw = self.structure();
        if raw.is_empty() {
            return None;
        }
        json::parse(raw).ok()
    }
}

/// How deeply the JSON of a value may nest (FORMAT.md A.4; arrays and objects, the outermost counting 1).
const VALUE_MAX_DEPTH: usize = 500;

/// The first member name that appears twice in one object of `v` (FORMAT.md A.1: readers reject such JSON).
fn first_duplicate_member(v: &json::Value) -> Option<&str> {
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        if let Some(items) = v.as_array() {
            stack.extend(items);
        } else if let Some(members) = v.as_object() {
            let mut seen = std::collections::HashSet::new();
            for (k, child) in members {
                if !seen.insert(k.as_str()) {
                    return Some(k);
                }
                stack.push(child);
            }
        }
    }
    None
}

/// The "encoding" of the object node named `name` in a Python structure document of version 1 (FORMAT.md A.2: a
/// newer version is not read), if it has one.
fn object_encoding(doc: &json::Value, name: &str) -> Option<String> {
    if doc.get("distckpt_structure")?.as_i64() != Some(1) {
        return None;
    }
    // Depth-first over the nodes, with a stack: the parser limits the depth, but nothing here needs to recurse.
    let mut stack = vec![doc.get("root")?];
    while let Some(node) = stack.pop() {
        if node.get("object").and_then(json::Value::as_str) == Some(name) {
            return node.get("encoding").and_then(json::Value::as_str).map(str::to_string);
        }
        if let Some(items) = node.get("dict").and_then(json::Value::as_array) {
            stack.extend(items.iter().filter_map(|item| item.get_index(1)));
        }
        for kind in ["list", "tuple"] {
            if let Some(children) = node.get(kind).and_then(json::Value::as_array) {
                stack.extend(children);
            }
        }
    }
    None
}
