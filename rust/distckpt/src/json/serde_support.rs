//! `serde` for JSON values (feature `serde`), two ways:
//!
//! - **As stored.** [`Value`] is `Serialize` and `Deserialize`: the JSON itself, tags and all, members in order
//!   (`serde_json::to_value(&v)`, `serde_json::from_str::<Value>(text)`, or any other serde format).
//! - **As Python saved it.** [`from_value`] (and `Checkpoint::value_as`) reads a value into any `Deserialize` type with
//!   Python's tagged forms decoded (FORMAT.md A.3): a `$tuple` is a sequence, a `$dict` a map, `$bytes` bytes,
//!   `$float` an `f64`, `$complex` a pair `(re, im)`. The value is first checked against the appendix's rules for
//!   those forms (A-V2 to A-V4), so a value Python would refuse to load is an error here too.
//!
//! serde's data model stops at 128-bit integers, and `serde_json::Value` (without its `arbitrary_precision` feature)
//! at 64: integers beyond 64 bits ([`Number::BigInt`]) serialize as `i128`/`u128` where they fit (exact in JSON text;
//! `serde_json::to_value` refuses them), and decode to the nearest `f64` (what `serde_json` itself reads from the same
//! text) unless the target asks for an `i128`/`u128`. Nothing here is lossy without saying so: a value that cannot
//! be represented is an error, and [`Value`]'s own accessors and `Display` always keep the exact digits.

use std::collections::HashSet;
use std::fmt;

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{self, Serialize, SerializeMap, SerializeSeq, Serializer};

use super::{Number, Value};

// ---- As stored --------------------------------------------------------------------------------------------------

impl Serialize for Number {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Number::Int(i) => s.serialize_i64(*i),
            Number::UInt(u) => s.serialize_u64(*u),
            Number::Float(x) => s.serialize_f64(*x),
            Number::BigInt(digits) => {
                if let Ok(i) = digits.parse::<i128>() {
                    s.serialize_i128(i)
                } else if let Ok(u) = digits.parse::<u128>() {
                    s.serialize_u128(u)
                } else {
                    Err(ser::Error::custom(format!(
                        "the integer {} has more than 128 bits, which serde cannot represent (Display writes it exactly)",
                        abbreviated(digits)
                    )))
                }
            }
        }
    }
}

/// The JSON as stored: objects are maps with their members in document order (duplicates included, as parsed).
impl Serialize for Value {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Null => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Number(n) => n.serialize(s),
            Value::String(text) => s.serialize_str(text),
            Value::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Value::Object(members) => {
                let mut map = s.serialize_map(Some(members.len()))?;
                for (k, v) in members {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

/// Builds a [`Value`] from any self-describing format, keeping what [`super::parse`] keeps: integers exact (`Int` up
/// to `i64::MAX`, then `UInt`, then `BigInt` for 128-bit ones), members in order. What JSON lacks takes Python's
/// tagged form, as distckpt's Python binding writes it: a non-finite float is `{"$float": "nan" | "inf" | "-inf"}`,
/// bytes are `{"$bytes": "<base64>"}`. Map keys must be strings.
impl<'de> de::Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        de::Deserialize::deserialize(d)
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        de::Deserialize::deserialize(d)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, i: i64) -> Result<Value, E> {
        Ok(Value::Number(Number::Int(i)))
    }
    fn visit_u64<E>(self, u: u64) -> Result<Value, E> {
        Ok(Value::Number(i64::try_from(u).map_or(Number::UInt(u), Number::Int)))
    }
    fn visit_i128<E>(self, i: i128) -> Result<Value, E> {
        Ok(match (i64::try_from(i), u64::try_from(i)) {
            (Ok(i), _) => Value::Number(Number::Int(i)),
            (_, Ok(u)) => Value::Number(Number::UInt(u)),
            _ => Value::Number(Number::BigInt(i.to_string().into())),
        })
    }
    fn visit_u128<E: de::Error>(self, u: u128) -> Result<Value, E> {
        match i128::try_from(u) {
            Ok(i) => self.visit_i128(i),
            Err(_) => Ok(Value::Number(Number::BigInt(u.to_string().into()))),
        }
    }
    fn visit_f64<E>(self, x: f64) -> Result<Value, E> {
        if x.is_finite() {
            return Ok(Value::Number(Number::Float(x)));
        }
        let text = if x.is_nan() {
            "nan"
        } else if x > 0.0 {
            "inf"
        } else {
            "-inf"
        };
        Ok(Value::Object(vec![("$float".to_string(), Value::String(text.to_string()))]))
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_string()))
    }
    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
    fn visit_bytes<E>(self, b: &[u8]) -> Result<Value, E> {
        Ok(Value::Object(vec![("$bytes".to_string(), Value::String(base64_encode(b)))]))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut members = Vec::with_capacity(map.size_hint().unwrap_or(0).min(4096));
        while let Some((k, v)) = map.next_entry::<String, Value>()? {
            members.push((k, v));
        }
        Ok(Value::Object(members))
    }
}

/// RFC 4648 section 4 with padding: the canonical form `$bytes` holds (FORMAT.md A-V1).
fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let n = group.iter().enumerate().fold(0u32, |n, (i, b)| n | (*b as u32) << (16 - 8 * i));
        for i in 0..4 {
            out.push(if i <= group.len() { ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    out
}

fn abbreviated(digits: &str) -> String {
    if digits.len() <= 24 {
        digits.to_string()
    } else {
        format!("{}...{} ({} digits)", &digits[..8], &digits[digits.len() - 8..], digits.trim_start_matches('-').len())
    }
}

// ---- As Python saved it -----------------------------------------------------------------------------------------

/// Why [`from_value`] could not read a value into the requested type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The value breaks FORMAT.md appendix A's rules for Python's tagged forms (A-V2 to A-V4): an unknown tag, a
    /// malformed tag body, a `$` member beside others, a `$dict` key Python cannot hash or two equal keys, a member
    /// named twice. Python would refuse to load it too.
    Malformed(String),
    /// A well-formed value that does not fit the type (serde's message, e.g. "invalid type: string \"x\", expected
    /// u64").
    Mismatch(String),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Malformed(m) => write!(f, "not a value Python's distckpt could have saved: {m}"),
            DecodeError::Mismatch(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for DecodeError {}

impl de::Error for DecodeError {
    fn custom<T: fmt::Display>(msg: T) -> DecodeError {
        DecodeError::Mismatch(msg.to_string())
    }
}

/// Reads `value`, a value saved by distckpt's Python binding, into `T` with Python's tagged forms decoded (see the
/// module's documentation): `{"$tuple": [1, 2]}` reads as `(u32, u32)`, `Vec<i64>` or `[i64; 2]`; `{"$dict": [[1,
/// "one"]]}` as `HashMap<u32, String>` (or with `String` keys: an integer key gives its decimal digits where the
/// target wants a string, as `serde_json` writes integer keys); `{"$bytes": "AAH/"}` as `Vec<u8>`;
/// `{"$float": "nan"}` as `f64`; `{"$complex": [1.5, -2.0]}` as `(f64, f64)`; a plain object as a struct or a map;
/// `null` as `None` or `()`; a string as a unit enum variant and a one-member object as any other variant.
/// `serde_json::Value` takes anything, with serde_json's own limits (a non-finite float becomes `null`, an integer
/// beyond 64 bits the nearest `f64`).
///
/// Values saved from Python nest at most 500 levels (FORMAT.md A-L1), and serde reads them with recursion: a deeply
/// nested value can need more stack than a thread's default in a debug build.
pub fn from_value<'a, T: de::Deserialize<'a>>(value: &'a Value) -> Result<T, DecodeError> {
    check_python_forms(value).map_err(DecodeError::Malformed)?;
    T::deserialize(Decoder { value, key: false })
}

/// FORMAT.md A-V2 to A-V4 (and A-J4, for values not made by the parser) over the whole value, with an explicit
/// stack: only the known tags, each with a well-formed body; no member starting with `$` beside others; no member
/// named twice; `$dict` keys that Python can hash, none equal to another.
fn check_python_forms(root: &Value) -> Result<(), String> {
    let mut stack = vec![root];
    while let Some(v) = stack.pop() {
        let members = match v {
            Value::Array(items) => {
                stack.extend(items);
                continue;
            }
            Value::Object(members) => members,
            _ => continue,
        };
        let Some((tag, _)) = v.tag() else {
            let mut seen = HashSet::new();
            for (k, x) in members {
                if k.starts_with('$') {
                    return Err(format!("the member {k:?} starts with '$' but is not alone in its object (A-V2)"));
                }
                if !seen.insert(k.as_str()) {
                    return Err(format!("the member {k:?} appears twice in an object (A-J4)"));
                }
                stack.push(x);
            }
            continue;
        };
        match tag {
            "$tuple" => stack.extend(v.as_tuple().ok_or("a $tuple whose body is not an array (A-V3)")?),
            "$dict" => {
                let items =
                    v.as_dict_items().ok_or("a $dict whose body is not an array of [key, value] pairs (A-V3)")?;
                let mut seen = HashSet::new();
                for (k, x) in items {
                    // A key that is or holds a NaN equals no other key.
                    if let Some(id) = key_identity(k)? {
                        if !seen.insert(id) {
                            return Err(format!("a $dict has two equal keys, the second {} (A-V4)", short(k)));
                        }
                    }
                    stack.push(k);
                    stack.push(x);
                }
            }
            "$bytes" => {
                v.as_bytes().ok_or("a $bytes whose body is not a string of canonical base64 (A-V3)")?;
            }
            "$float" => {
                v.as_f64().ok_or("a $float whose body is not \"nan\", \"inf\" or \"-inf\" (A-V3)")?;
            }
            "$complex" => {
                v.as_complex().ok_or("a $complex whose body is not [re, im], each a number or a $float (A-V3)")?;
            }
            other => {
                return Err(format!("unknown tag {other:?}: a later version of distckpt may have written it (A-V2)"))
            }
        }
    }
    Ok(())
}

fn short(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(60) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

/// A text that two `$dict` keys share exactly when Python finds them equal (A-V4): numbers by value whatever their
/// type (`1`, `1.0`, `true` and `1+0j` are one key; so are `2**70` and `1.1805916207174113e+21`), strings and bytes
/// by content, tuples element by element. None for a key that is or holds a NaN, which equals nothing; an error for
/// a key Python cannot hash (a list, a dict).
fn key_identity(k: &Value) -> Result<Option<String>, String> {
    fn float(x: f64) -> Option<String> {
        if x.is_nan() {
            None
        } else if x.is_finite() && x == x.trunc() {
            // `{:.0}` prints an integral f64 with all its digits, so it meets integers of any size; -0.0 is 0.
            Some(if x == 0.0 { "i0".to_string() } else { format!("i{x:.0}") })
        } else {
            Some(format!("f{x:e}"))
        }
    }
    Ok(match k {
        Value::Null => Some("n".to_string()),
        Value::Bool(b) => Some(format!("i{}", u8::from(*b))),
        Value::Number(Number::Float(x)) => float(*x),
        Value::Number(Number::Int(i)) => Some(format!("i{i}")),
        Value::Number(Number::UInt(u)) => Some(format!("i{u}")),
        Value::Number(Number::BigInt(digits)) => Some(format!("i{digits}")),
        Value::String(s) => Some(format!("s{s}")),
        Value::Array(_) => return Err(format!("a $dict key is a list, which Python cannot hash: {} (A-V4)", short(k))),
        Value::Object(_) => match k.tag() {
            Some(("$float", _)) => k.as_f64().and_then(float),
            Some(("$bytes", _)) => k.as_bytes().map(|b| format!("b{b:?}")),
            Some(("$complex", _)) => match k.as_complex() {
                Some((re, 0.0)) => float(re), // -0.0 too: a float pattern compares with ==
                Some((re, im)) => float(re).zip(float(im)).map(|(re, im)| format!("c{re},{im}")),
                None => None, // malformed: reported when the key itself is checked
            },
            Some(("$tuple", _)) => {
                let mut id = String::from("t");
                for item in k.as_tuple().unwrap_or(&[]) {
                    match key_identity(item)? {
                        Some(part) => id.push_str(&format!("{}:{part}", part.len())),
                        None => return Ok(None),
                    }
                }
                Some(id)
            }
            _ => return Err(format!("a $dict key is a dict, which Python cannot hash: {} (A-V4)", short(k))),
        },
    })
}

/// A checked value (see [`check_python_forms`]) as a serde `Deserializer`, decoding the tagged forms. `key`: the
/// value is a `$dict` key, which gives its decimal digits to a target that wants a string key.
#[derive(Clone, Copy)]
struct Decoder<'a> {
    value: &'a Value,
    key: bool,
}

impl<'a> Decoder<'a> {
    fn of(value: &'a Value) -> Decoder<'a> {
        Decoder { value, key: false }
    }

    /// The digits of an integer beyond 64 bits, for a 128-bit target.
    fn big_digits(&self) -> Option<&'a str> {
        match self.value {
            Value::Number(Number::BigInt(digits)) => Some(digits),
            _ => None,
        }
    }
}

impl<'de> IntoDeserializer<'de, DecodeError> for Decoder<'de> {
    type Deserializer = Self;
    fn into_deserializer(self) -> Self {
        self
    }
}

/// The elements of an array, a `$tuple`, `$bytes` (as `u8`s) or `$complex` (as two `f64`s).
struct Seq<I>(I);

impl<'de, I: Iterator<Item = Elem<'de>> + ExactSizeIterator> SeqAccess<'de> for Seq<I> {
    type Error = DecodeError;
    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, DecodeError> {
        self.0
            .next()
            .map(|e| match e {
                Elem::Value(v) => seed.deserialize(Decoder::of(v)),
                Elem::Byte(b) => seed.deserialize(b.into_deserializer()),
                Elem::Float(x) => seed.deserialize(x.into_deserializer()),
            })
            .transpose()
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

enum Elem<'a> {
    Value(&'a Value),
    Byte(u8),
    Float(f64),
}

/// The members of a plain object (string keys) or the items of a `$dict` (keys that are values).
enum Map<'a> {
    Plain(std::slice::Iter<'a, (String, Value)>, Option<&'a Value>),
    Dict(std::vec::IntoIter<(&'a Value, &'a Value)>, Option<&'a Value>),
}

impl<'de> MapAccess<'de> for Map<'de> {
    type Error = DecodeError;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, DecodeError> {
        match self {
            Map::Plain(members, pending) => match members.next() {
                None => Ok(None),
                Some((k, v)) => {
                    *pending = Some(v);
                    seed.deserialize(BorrowedStrDeserializer::new(k)).map(Some)
                }
            },
            Map::Dict(items, pending) => match items.next() {
                None => Ok(None),
                Some((k, v)) => {
                    *pending = Some(v);
                    seed.deserialize(Decoder { value: k, key: true }).map(Some)
                }
            },
        }
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DecodeError> {
        let (Map::Plain(_, pending) | Map::Dict(_, pending)) = self;
        let v = pending.take().ok_or_else(|| DecodeError::Mismatch("a map value asked for before its key".into()))?;
        seed.deserialize(Decoder::of(v))
    }
    fn size_hint(&self) -> Option<usize> {
        Some(match self {
            Map::Plain(members, _) => members.len(),
            Map::Dict(items, _) => items.len(),
        })
    }
}

impl<'de> Deserializer<'de> for Decoder<'de> {
    type Error = DecodeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Number(Number::Int(i)) => visitor.visit_i64(*i),
            Value::Number(Number::UInt(u)) => visitor.visit_u64(*u),
            Value::Number(Number::Float(x)) => visitor.visit_f64(*x),
            Value::Number(n @ Number::BigInt(digits)) => match n.as_f64() {
                x if x.is_finite() => visitor.visit_f64(x),
                _ => Err(DecodeError::Mismatch(format!(
                    "the integer {} is beyond the range of f64 and 128-bit integers; read it with Checkpoint::value()",
                    abbreviated(digits)
                ))),
            },
            Value::String(s) => visitor.visit_borrowed_str(s),
            Value::Array(items) => visitor.visit_seq(Seq(items.iter().map(Elem::Value))),
            Value::Object(members) => match self.value.tag() {
                None => visitor.visit_map(Map::Plain(members.iter(), None)),
                Some(("$tuple", _)) => {
                    let items = self.value.as_tuple().unwrap_or(&[]);
                    visitor.visit_seq(Seq(items.iter().map(Elem::Value)))
                }
                Some(("$dict", _)) => {
                    let items = self.value.as_dict_items().unwrap_or_default();
                    visitor.visit_map(Map::Dict(items.into_iter(), None))
                }
                // As a sequence of u8, which Vec<u8> and serde_json::Value take; a target that asks for bytes gets
                // them as bytes (deserialize_bytes).
                Some(("$bytes", _)) => {
                    visitor.visit_seq(Seq(self.value.as_bytes().unwrap_or_default().into_iter().map(Elem::Byte)))
                }
                Some(("$float", _)) => visitor.visit_f64(self.value.as_f64().unwrap_or(f64::NAN)),
                Some(("$complex", _)) => {
                    let (re, im) = self.value.as_complex().unwrap_or((f64::NAN, f64::NAN));
                    visitor.visit_seq(Seq([re, im].into_iter().map(Elem::Float)))
                }
                Some((tag, _)) => Err(DecodeError::Malformed(format!("unknown tag {tag:?}"))),
            },
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, v: V) -> Result<V::Value, DecodeError> {
        v.visit_newtype_struct(self)
    }

    /// A unit variant is its name as a string; any other variant a one-member object `{"Name": content}`.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        match self.value {
            Value::String(s) => visitor.visit_enum(BorrowedStrDeserializer::new(s)),
            Value::Object(members) if members.len() == 1 && self.value.tag().is_none() => {
                visitor.visit_enum(de::value::MapAccessDeserializer::new(Map::Plain(members.iter(), None)))
            }
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value.tag() {
            Some(("$bytes", _)) => visitor.visit_byte_buf(self.value.as_bytes().unwrap_or_default()),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.deserialize_bytes(visitor)
    }

    fn deserialize_i128<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.big_digits() {
            Some(d) => match d.parse::<i128>() {
                Ok(i) => visitor.visit_i128(i),
                Err(_) => Err(DecodeError::Mismatch(format!("the integer {} does not fit an i128", abbreviated(d)))),
            },
            None => self.deserialize_any(visitor),
        }
    }

    fn deserialize_u128<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.big_digits() {
            Some(d) => match d.parse::<u128>() {
                Ok(u) => visitor.visit_u128(u),
                Err(_) => Err(DecodeError::Mismatch(format!("the integer {} does not fit a u128", abbreviated(d)))),
            },
            None => self.deserialize_any(visitor),
        }
    }

    /// A `$dict` key that is an integer gives its digits to a string target (`HashMap<String, _>`,
    /// `serde_json::Value`'s object keys).
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match (self.key, self.value) {
            (true, Value::Number(n)) if n.is_integer() => visitor.visit_string(n.to_string()),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 u8 u16 u32 u64 f32 f64 char unit unit_struct seq tuple tuple_struct map struct
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::parse;

    #[test]
    fn base64_encode_is_what_as_bytes_decodes() {
        for n in 0..=9 {
            let bytes: Vec<u8> = (0..n).map(|i| (i * 97 + 255) as u8).collect();
            let text = base64_encode(&bytes);
            assert_eq!(text.len(), bytes.len().div_ceil(3) * 4);
            let tagged = Value::Object(vec![("$bytes".into(), Value::String(text.clone()))]);
            assert_eq!(tagged.as_bytes(), Some(bytes), "{text}");
        }
        assert_eq!(base64_encode(b"hi"), "aGk=");
        assert_eq!(base64_encode(&[0, 1, 255]), "AAH/");
    }

    #[test]
    fn dict_keys_equal_as_python_compares_them() {
        let id = |text: &str| key_identity(&parse(text.as_bytes()).unwrap()).unwrap();
        for equal in [
            &["1", "1.0", "true", r#"{"$complex":[1.0,0.0]}"#, r#"{"$complex":[1,-0.0]}"#][..],
            &["0", "-0", "0.0", "-0.0", "false"],
            &["1180591620717411303424", "1.1805916207174113e+21"],
            &[r#"{"$float":"inf"}"#, r#"{"$complex":[{"$float":"inf"},0]}"#],
            &[r#"{"$tuple":[1,"a"]}"#, r#"{"$tuple":[1.0,"a"]}"#],
        ] {
            let ids: Vec<_> = equal.iter().map(|t| id(t)).collect();
            assert!(ids[0].is_some() && ids.iter().all(|i| *i == ids[0]), "{equal:?}: {ids:?}");
        }
        let distinct =
            ["1", "\"1\"", "1.5", "2", r#"{"$bytes":"AQ=="}"#, r#"{"$complex":[1,1]}"#, r#"{"$tuple":[1]}"#, "null"];
        let ids: HashSet<_> = distinct.iter().map(|t| id(t).unwrap()).collect();
        assert_eq!(ids.len(), distinct.len(), "{ids:?}");
        assert_eq!(id(r#"{"$float":"nan"}"#), None);
        assert_eq!(id(r#"{"$tuple":[1,{"$float":"nan"}]}"#), None);
        assert!(key_identity(&parse(b"[1]").unwrap()).is_err());
        assert!(key_identity(&parse(br#"{"$tuple":[{"a":1}]}"#).unwrap()).is_err());
        assert!(key_identity(&parse(br#"{"$dict":[]}"#).unwrap()).is_err());
    }
}
