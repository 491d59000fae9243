//! JSON values (RFC 8259), standard library only: what distckpt's Python binding saves for every leaf of a state
//! dict that is not an array (`{"step": 100}`, strings, lists, config dicts), and the structure document it saves to
//! rebuild nested state. Read them with [`crate::Checkpoint::value`] and [`crate::Checkpoint::structure_json`].
//!
//! The parser is strict and safe on hostile input: the text must be UTF-8 and exactly one JSON value (whitespace
//! around it allowed, nothing else); strings may not hold raw control characters or unpaired surrogate escapes;
//! numbers follow the JSON grammar and must fit an `f64`; nesting deeper than [`MAX_DEPTH`] is refused. It does not
//! recurse (an explicit stack), so no input can overflow the stack, and it never panics: every malformed input is a
//! [`ParseError`] with its byte offset, line and column.
//!
//! Integers keep their exact value: in an `i64` or a `u64` where they fit ([`Number::Int`], [`Number::UInt`]), else
//! as their decimal digits ([`Number::BigInt`], e.g. Python's `2**70`); fractions and exponents are the nearest
//! `f64` ([`Number::Float`]). Objects keep
//! their members in document order, duplicates included; [`Value::get`] returns the last of equal keys, as Python's
//! `json` does.
//!
//! Python's encoding adds tagged one-member objects for what JSON lacks, which [`Value`] decodes on request:
//! `{"$tuple": [...]}` ([`Value::as_tuple`], [`Value::as_sequence`]), `{"$dict": [[key, value], ...]}` for keys that
//! are not strings or start with `$` ([`Value::as_dict_items`]), `{"$bytes": "<base64>"}` ([`Value::as_bytes`]),
//! `{"$float": "nan" | "inf" | "-inf"}` (understood by [`Value::as_f64`]) and `{"$complex": [re, im]}`
//! ([`Value::as_complex`]).
//!
//! With the `serde` feature, [`Value`] is `serde::Serialize` and `serde::Deserialize` (the JSON as stored), and
//! `from_value` reads a value into any `Deserialize` type with the tagged forms decoded. The parser stays this
//! one either way: `serde_json` would read these texts differently (see rust/README.md, "The `serde` feature").

use std::fmt;
use std::ops::Index;
use std::str::FromStr;

#[cfg(feature = "serde")]
mod serde_support;
#[cfg(feature = "serde")]
pub use serde_support::{from_value, DecodeError};

/// How deeply arrays and objects may nest (the top-level value's own brackets count as 1). The same as CPython's
/// default recursion limit: Python's `json` cannot read deeper documents either, so distckpt never writes them.
pub const MAX_DEPTH: usize = 1000;

/// The most digits an integer may have (Python's default `sys.get_int_max_str_digits()`).
pub const MAX_INT_DIGITS: usize = 4300;

/// A JSON number. Integers are always exact.
#[derive(Clone, Debug, PartialEq)]
pub enum Number {
    /// An integer from `i64::MIN` to `i64::MAX`.
    Int(i64),
    /// An integer above `i64::MAX`, up to `u64::MAX`.
    UInt(u64),
    /// An integer beyond 64 bits, as its decimal digits with an optional leading `-` (exactly as written, e.g.
    /// `1180591620717411303424` for Python's `2**70`); [`Number::as_f64`] rounds it.
    BigInt(Box<str>),
    /// A number with a fraction or an exponent, rounded to the nearest `f64`. Always finite.
    Float(f64),
}

impl Number {
    /// The value as an `i64`, if it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Number::Int(i) => Some(i),
            _ => None,
        }
    }
    /// The value as a `u64`, if it is a non-negative integer that fits.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Number::Int(i) => u64::try_from(i).ok(),
            Number::UInt(u) => Some(u),
            Number::BigInt(_) | Number::Float(_) => None,
        }
    }
    /// The value as an `f64` (rounded where an integer has more than 53 bits).
    pub fn as_f64(&self) -> f64 {
        match self {
            Number::Int(i) => *i as f64,
            Number::UInt(u) => *u as f64,
            // Parsed from JSON digits, which Rust's float parser always takes (huge ones give an infinity).
            Number::BigInt(digits) => digits.parse::<f64>().unwrap_or(f64::NAN),
            Number::Float(f) => *f,
        }
    }
    /// Whether the number is an integer (of any size).
    pub fn is_integer(&self) -> bool {
        !matches!(self, Number::Float(_))
    }
}

impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Number::Int(i) => write!(f, "{i}"),
            Number::UInt(u) => write!(f, "{u}"),
            Number::BigInt(ref digits) => f.write_str(digits),
            // Debug gives the shortest text that reads back as the same f64, with an exponent where that is
            // shorter ("1e300"), and "1.0" rather than "1" (still a float when read back). JSON has no NaN or
            // infinity: written as null, as JavaScript does (parsed numbers are always finite).
            Number::Float(x) if x.is_finite() => write!(f, "{x:?}"),
            Number::Float(_) => f.write_str("null"),
        }
    }
}

/// A JSON value. Objects are member lists in document order.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Array(Vec<Value>),
    Object(Vec<(String, Value)>),
}

static NULL: Value = Value::Null;

impl Value {
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
    /// An integer that fits an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Number(n) => n.as_i64(),
            _ => None,
        }
    }
    /// A non-negative integer that fits a `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Number(n) => n.as_u64(),
            _ => None,
        }
    }
    /// Any number as an `f64`, and Python's tagged `{"$float": "nan" | "inf" | "-inf"}` (how distckpt saves the
    /// floats JSON cannot hold).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Number(n) => Some(n.as_f64()),
            _ => match self.tagged("$float")?.as_str()? {
                "nan" => Some(f64::NAN),
                "inf" => Some(f64::INFINITY),
                "-inf" => Some(f64::NEG_INFINITY),
                _ => None,
            },
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
    /// A JSON array (a Python list). For a Python tuple see [`as_tuple`](Self::as_tuple), for either
    /// [`as_sequence`](Self::as_sequence).
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
    /// A JSON object's members, in document order.
    pub fn as_object(&self) -> Option<&[(String, Value)]> {
        match self {
            Value::Object(m) => Some(m),
            _ => None,
        }
    }
    /// The member `key` of an object (the last one, if the key appears more than once); None for anything else.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_object()?.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v)
    }
    /// Element `index` of an array or a tagged tuple.
    pub fn get_index(&self, index: usize) -> Option<&Value> {
        self.as_sequence()?.get(index)
    }

    /// The tag and body of one of Python's tagged forms: a one-member object whose key starts with `$`
    /// (`{"$tuple": [1, 2]}` gives `("$tuple", [1, 2])`). Python writes a dict with such keys as `$dict`, so a
    /// one-member `$` object it saved is always a tag.
    pub fn tag(&self) -> Option<(&str, &Value)> {
        match self.as_object()? {
            [(k, v)] if k.starts_with('$') => Some((k, v)),
            _ => None,
        }
    }
    fn tagged(&self, tag: &str) -> Option<&Value> {
        self.tag().filter(|(t, _)| *t == tag).map(|(_, v)| v)
    }
    /// A Python tuple: `{"$tuple": [...]}`.
    pub fn as_tuple(&self) -> Option<&[Value]> {
        self.tagged("$tuple")?.as_array()
    }
    /// A Python list or tuple.
    pub fn as_sequence(&self) -> Option<&[Value]> {
        self.as_array().or_else(|| self.as_tuple())
    }
    /// A Python dict whose keys are not all strings, or include one starting with `$`: `{"$dict": [[key, value],
    /// ...]}`, as (key, value) pairs in order. Dicts with only plain string keys are JSON objects
    /// ([`as_object`](Self::as_object)).
    pub fn as_dict_items(&self) -> Option<Vec<(&Value, &Value)>> {
        self.tagged("$dict")?
            .as_array()?
            .iter()
            .map(|item| match item.as_array()? {
                [k, v] => Some((k, v)),
                _ => None,
            })
            .collect()
    }
    /// A Python complex: `{"$complex": [re, im]}` (each part a number or a tagged `$float`).
    pub fn as_complex(&self) -> Option<(f64, f64)> {
        match self.tagged("$complex")?.as_array()? {
            [re, im] => Some((re.as_f64()?, im.as_f64()?)),
            _ => None,
        }
    }
    /// Python bytes: `{"$bytes": "<base64>"}`, decoded (None if the base64 is malformed).
    pub fn as_bytes(&self) -> Option<Vec<u8>> {
        base64_decode(self.tagged("$bytes")?.as_str()?)
    }
}

/// `value["key"]`: the member, or `Null` if there is none (never panics).
impl Index<&str> for Value {
    type Output = Value;
    fn index(&self, key: &str) -> &Value {
        self.get(key).unwrap_or(&NULL)
    }
}

/// `value[i]`: element `i` of an array or a tagged tuple, or `Null` if there is none (never panics).
impl Index<usize> for Value {
    type Output = Value;
    fn index(&self, index: usize) -> &Value {
        self.get_index(index).unwrap_or(&NULL)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Value {
        Value::Bool(b)
    }
}
impl From<i64> for Value {
    fn from(i: i64) -> Value {
        Value::Number(Number::Int(i))
    }
}
impl From<f64> for Value {
    fn from(x: f64) -> Value {
        Value::Number(Number::Float(x))
    }
}
impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_string())
    }
}

fn write_string(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    f.write_str("\"")?;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        let esc = match c {
            '"' => "\\\"",
            '\\' => "\\\\",
            '\n' => "\\n",
            '\r' => "\\r",
            '\t' => "\\t",
            c if (c as u32) < 0x20 => "",
            _ => continue,
        };
        f.write_str(&s[start..i])?;
        if esc.is_empty() {
            write!(f, "\\u{:04x}", c as u32)?;
        } else {
            f.write_str(esc)?;
        }
        start = i + c.len_utf8();
    }
    f.write_str(&s[start..])?;
    f.write_str("\"")
}

/// Compact JSON text (`,` and `:` without spaces, as distckpt's Python writer uses); non-ASCII characters are
/// written as themselves.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("null"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Number(n) => write!(f, "{n}"),
            Value::String(s) => write_string(f, s),
            Value::Array(items) => {
                f.write_str("[")?;
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{v}")?;
                }
                f.write_str("]")
            }
            Value::Object(members) => {
                f.write_str("{")?;
                for (i, (k, v)) in members.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write_string(f, k)?;
                    write!(f, ":{v}")?;
                }
                f.write_str("}")
            }
        }
    }
}

impl FromStr for Value {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Value, ParseError> {
        parse(s.as_bytes())
    }
}

/// Why a text is not JSON, and where: `offset` is in bytes from the start, `line` and `column` count from 1
/// (columns in characters).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    pub offset: usize,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at line {}, column {} (byte {})", self.message, self.line, self.column, self.offset)
    }
}

impl std::error::Error for ParseError {}

/// Parses one JSON value from UTF-8 text, nested at most [`MAX_DEPTH`] deep.
pub fn parse(text: &[u8]) -> Result<Value, ParseError> {
    parse_with_max_depth(text, MAX_DEPTH)
}

/// [`parse`] with another nesting limit (0 admits scalars only).
pub fn parse_with_max_depth(text: &[u8], max_depth: usize) -> Result<Value, ParseError> {
    if let Err(e) = std::str::from_utf8(text) {
        return Err(error_at(text, e.valid_up_to(), "invalid UTF-8".to_string()));
    }
    Parser { text, pos: 0, max_depth }.document().map_err(|(pos, message)| error_at(text, pos, message))
}

fn error_at(text: &[u8], offset: usize, message: String) -> ParseError {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let line_start = before.iter().rposition(|b| *b == b'\n').map_or(0, |p| p + 1);
    // Characters, not bytes: count the bytes that start a UTF-8 sequence.
    let column = before[line_start..].iter().filter(|b| (**b & 0xC0) != 0x80).count() + 1;
    ParseError { offset, line, column, message }
}

/// An array or object being parsed: what the explicit stack holds instead of recursion.
enum Open {
    Array(Vec<Value>),
    /// The members so far and the key whose value is being parsed.
    Object(Vec<(String, Value)>, String),
}

type Step<T> = Result<T, (usize, String)>;

struct Parser<'t> {
    text: &'t [u8],
    pos: usize,
    max_depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    /// "found 'x'" / "found the end of the text", for error messages.
    fn found(&self) -> String {
        match std::str::from_utf8(&self.text[self.pos..]).ok().and_then(|s| s.chars().next()) {
            None => "found the end of the text".to_string(),
            Some(c) if c.is_control() || c == '\u{feff}' => format!("found U+{:04X}", c as u32),
            Some(c) => format!("found {c:?}"),
        }
    }

    fn fail<T>(&self, expected: &str) -> Step<T> {
        Err((self.pos, format!("expected {expected}, {}", self.found())))
    }

    fn document(mut self) -> Step<Value> {
        let mut stack: Vec<Open> = Vec::new();
        'value: loop {
            self.skip_ws();
            let mut value = match self.peek() {
                Some(open @ (b'[' | b'{')) => {
                    if stack.len() >= self.max_depth {
                        return Err((
                            self.pos,
                            format!("arrays and objects nest deeper than {} levels", self.max_depth),
                        ));
                    }
                    self.pos += 1;
                    self.skip_ws();
                    if open == b'[' {
                        if self.peek() == Some(b']') {
                            self.pos += 1;
                            Value::Array(Vec::new())
                        } else {
                            stack.push(Open::Array(Vec::new()));
                            continue 'value;
                        }
                    } else if self.peek() == Some(b'}') {
                        self.pos += 1;
                        Value::Object(Vec::new())
                    } else {
                        let key = self.key()?;
                        stack.push(Open::Object(Vec::new(), key));
                        continue 'value;
                    }
                }
                Some(b'"') => Value::String(self.string()?),
                Some(b'-' | b'0'..=b'9') => Value::Number(self.number()?),
                Some(b't') => self.literal("true", Value::Bool(true))?,
                Some(b'f') => self.literal("false", Value::Bool(false))?,
                Some(b'n') => self.literal("null", Value::Null)?,
                _ => return self.fail("a value"),
            };
            // Put the finished value into the array or object around it; close every container it completes.
            loop {
                self.skip_ws();
                match stack.last_mut() {
                    None => {
                        if self.pos != self.text.len() {
                            return self.fail("the end of the text after the value");
                        }
                        return Ok(value);
                    }
                    Some(Open::Array(items)) => {
                        items.push(value);
                        match self.peek() {
                            Some(b',') => {
                                self.pos += 1;
                                continue 'value;
                            }
                            Some(b']') => {
                                self.pos += 1;
                                let Some(Open::Array(items)) = stack.pop() else { unreachable!() };
                                value = Value::Array(items);
                            }
                            _ => return self.fail("',' or ']' after an array element"),
                        }
                    }
                    Some(Open::Object(members, key)) => {
                        members.push((std::mem::take(key), value));
                        match self.peek() {
                            Some(b',') => {
                                self.pos += 1;
                                self.skip_ws();
                                let next = self.key()?;
                                if let Some(Open::Object(_, key)) = stack.last_mut() {
                                    *key = next;
                                }
                                continue 'value;
                            }
                            Some(b'}') => {
                                self.pos += 1;
                                let Some(Open::Object(members, _)) = stack.pop() else { unreachable!() };
                                value = Value::Object(members);
                            }
                            _ => return self.fail("',' or '}' after an object member"),
                        }
                    }
                }
            }
        }
    }

    /// `"key" :` of an object member (whitespace before it already skipped).
    fn key(&mut self) -> Step<String> {
        if self.peek() != Some(b'"') {
            return self.fail("a string key of an object member");
        }
        let key = self.string()?;
        self.skip_ws();
        if self.peek() != Some(b':') {
            return self.fail("':' after an object key");
        }
        self.pos += 1;
        Ok(key)
    }

    fn literal(&mut self, word: &str, value: Value) -> Step<Value> {
        if self.text[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(value)
        } else {
            // Show the word that is there ("found \"free\""), not just its first letter.
            let rest = std::str::from_utf8(&self.text[self.pos..]).unwrap_or("");
            let end = rest.find(|c: char| !c.is_alphanumeric()).unwrap_or(rest.len());
            let shown: String = rest[..end].chars().take(16).collect();
            Err((self.pos, format!("expected '{word}', found {shown:?}")))
        }
    }

    /// A string starting at the opening quote. The text is known to be UTF-8, so runs between escapes are copied
    /// whole.
    fn string(&mut self) -> Step<String> {
        let start = self.pos;
        self.pos += 1;
        let mut out: Vec<u8> = Vec::new();
        let mut run = self.pos;
        loop {
            let Some(b) = self.peek() else {
                return Err((start, "unterminated string (no closing '\"')".to_string()));
            };
            match b {
                b'"' => {
                    out.extend_from_slice(&self.text[run..self.pos]);
                    self.pos += 1;
                    return String::from_utf8(out).map_err(|_| (start, "invalid UTF-8 in a string".to_string()));
                }
                b'\\' => {
                    out.extend_from_slice(&self.text[run..self.pos]);
                    self.escape(&mut out)?;
                    run = self.pos;
                }
                0x00..=0x1F => {
                    return Err((self.pos, format!("control character U+{b:04X} in a string: it must be escaped")));
                }
                _ => self.pos += 1,
            }
        }
    }

    /// One escape sequence, at its backslash.
    fn escape(&mut self, out: &mut Vec<u8>) -> Step<()> {
        let at = self.pos;
        self.pos += 1;
        let Some(c) = self.peek() else {
            return Err((at, "unterminated escape sequence".to_string()));
        };
        self.pos += 1;
        let ch = match c {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let hi = self.hex4(at)?;
                match hi {
                    0xD800..=0xDBFF => {
                        // A high surrogate must be followed by an escaped low one: together, one character.
                        if !self.text[self.pos..].starts_with(b"\\u") {
                            return Err((at, format!("unpaired surrogate \\u{hi:04x} in a string")));
                        }
                        let lo_at = self.pos;
                        self.pos += 2;
                        let lo = self.hex4(lo_at)?;
                        if !(0xDC00..=0xDFFF).contains(&lo) {
                            return Err((
                                at,
                                format!("unpaired surrogate \\u{hi:04x} in a string (followed by \\u{lo:04x})"),
                            ));
                        }
                        let code = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
                        char::from_u32(code).ok_or((at, format!("invalid escaped character U+{code:X}")))?
                    }
                    0xDC00..=0xDFFF => return Err((at, format!("unpaired surrogate \\u{hi:04x} in a string"))),
                    _ => char::from_u32(hi).ok_or((at, format!("invalid escaped character U+{hi:04X}")))?,
                }
            }
            _ => return Err((at, format!("invalid escape '\\{}' in a string", char::from(c).escape_default()))),
        };
        let mut buf = [0u8; 4];
        out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
        Ok(())
    }

    /// The four hex digits of a `\u` escape that started at `at`.
    fn hex4(&mut self, at: usize) -> Step<u32> {
        let digits = self.text.get(self.pos..self.pos + 4).filter(|d| d.iter().all(u8::is_ascii_hexdigit));
        let Some(digits) = digits else {
            return Err((at, "a \\u escape needs 4 hex digits".to_string()));
        };
        self.pos += 4;
        Ok(digits.iter().fold(0u32, |acc, d| acc * 16 + char::from(*d).to_digit(16).unwrap_or(0)))
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
    fn number(&mut self) -> Step<Number> {
        let start = self.pos;
        let digits = |p: &mut Self| {
            let from = p.pos;
            while matches!(p.peek(), Some(b'0'..=b'9')) {
                p.pos += 1;
            }
            p.pos - from
        };
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.pos += 1;
                if matches!(self.peek(), Some(b'0'..=b'9')) {
                    return Err((start, "a number may not have a leading zero".to_string()));
                }
            }
            Some(b'1'..=b'9') => {
                digits(self);
            }
            _ => return self.fail("a digit in a number"),
        }
        let mut integer = true;
        if self.peek() == Some(b'.') {
            integer = false;
            self.pos += 1;
            if digits(self) == 0 {
                return self.fail("a digit after the decimal point");
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            integer = false;
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if digits(self) == 0 {
                return self.fail("a digit in the exponent");
            }
        }
        // ASCII by construction.
        let text = std::str::from_utf8(&self.text[start..self.pos]).unwrap_or("");
        if integer {
            if let Ok(i) = text.parse::<i64>() {
                return Ok(Number::Int(i));
            }
            if let Ok(u) = text.parse::<u64>() {
                return Ok(Number::UInt(u));
            }
            // Python refuses to convert integers of more than 4300 digits (sys.get_int_max_str_digits), so it
            // never writes them; neither does anything else sane.
            if text.trim_start_matches('-').len() <= MAX_INT_DIGITS {
                return Ok(Number::BigInt(text.into()));
            }
            let shown = format!("{}... ({} digits)", &text[..40], text.len());
            return Err((start, format!("integer {shown} is out of range (more than {MAX_INT_DIGITS} digits)")));
        }
        match text.parse::<f64>() {
            Ok(x) if x.is_finite() => Ok(Number::Float(x)),
            _ => {
                let shown = if text.len() > 40 {
                    format!("{}... ({} characters)", &text[..40], text.len())
                } else {
                    text.to_string()
                };
                Err((start, format!("number {shown} is out of range (beyond an f64)")))
            }
        }
    }
}

/// Standard base64 with padding (RFC 4648 section 4, what Python's `base64.b64encode` writes); None if malformed.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    fn sextet(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let b = s.as_bytes();
    if b.len() % 4 != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(b.len() / 4 * 3);
    for (i, quad) in b.chunks_exact(4).enumerate() {
        let last = i + 1 == b.len() / 4;
        let pad = quad.iter().rev().take_while(|c| **c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for &c in &quad[..4 - pad] {
            n = (n << 6) | sextet(c)?;
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        // The bits that padding drops must be zero (canonical encoding).
        if bytes[3 - pad..].iter().any(|b| *b != 0) {
            return None;
        }
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Value {
        parse(s.as_bytes()).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    fn err(text: &[u8]) -> ParseError {
        match parse(text) {
            Ok(v) => panic!("{:?} parsed as {v:?}", String::from_utf8_lossy(text)),
            Err(e) => e,
        }
    }

    #[test]
    fn scalars_and_whitespace() {
        assert_eq!(p("null"), Value::Null);
        assert_eq!(p(" \t\r\n true \n"), Value::Bool(true));
        assert_eq!(p("false"), Value::Bool(false));
        assert_eq!(p("\"\""), Value::String(String::new()));
        assert_eq!(p("100").as_i64(), Some(100));
        assert_eq!(p("-0").as_i64(), Some(0));
        assert_eq!(p("0.001").as_f64(), Some(0.001));
        assert_eq!(p("-1.5e-3").as_f64(), Some(-0.0015));
        assert_eq!(p("1E+2").as_f64(), Some(100.0));
        assert!(parse(b"1e400").is_err(), "beyond an f64");
    }

    #[test]
    fn integers_stay_exact() {
        assert_eq!(p("9223372036854775807"), Value::Number(Number::Int(i64::MAX)));
        assert_eq!(p("-9223372036854775808"), Value::Number(Number::Int(i64::MIN)));
        assert_eq!(p("9223372036854775808"), Value::Number(Number::UInt(1 << 63)));
        assert_eq!(p("18446744073709551615").as_u64(), Some(u64::MAX));
        assert_eq!(p("18446744073709551615").as_i64(), None);
        assert_eq!(p("-1").as_u64(), None);
        // Beyond 64 bits: the exact digits (as_f64 rounds).
        assert_eq!(p("18446744073709551617"), Value::Number(Number::BigInt("18446744073709551617".into())));
        assert_eq!(p("18446744073709551617").as_f64(), Some(18446744073709551616.0));
        assert_eq!(p("-18446744073709551617").to_string(), "-18446744073709551617", "exact digits written back");
        assert_eq!(p(&"9".repeat(400)).as_f64(), Some(f64::INFINITY), "a huge integer is exact, its f64 infinite");
        assert!(parse("9".repeat(MAX_INT_DIGITS).as_bytes()).is_ok());
        assert!(parse(format!("-{}", "9".repeat(MAX_INT_DIGITS)).as_bytes()).is_ok());
        assert!(parse("9".repeat(MAX_INT_DIGITS + 1).as_bytes()).is_err());
        assert_eq!(p("-9223372036854775809").as_f64(), Some(-9223372036854775808.0));
        assert_eq!(p("1.0").as_i64(), None, "a float is not an integer");
        assert_eq!(p("2.5").as_u64(), None);
        assert_eq!(p("1e-400").as_f64(), Some(0.0), "underflow rounds to zero, as in Python");
    }

    #[test]
    fn strings_and_escapes() {
        assert_eq!(p(r#""a\"b\\c\/d\b\f\n\r\t""#).as_str(), Some("a\"b\\c/d\u{8}\u{c}\n\r\t"));
        assert_eq!(p(r#""\u0000\u001f\u00e9\u20ac""#).as_str(), Some("\0\u{1f}é€"));
        assert_eq!(p(r#""\ud83d\ude00 \uD83D\uDE80""#).as_str(), Some("😀 🚀"));
        assert_eq!(p("\"run-é 🚀\"").as_str(), Some("run-é 🚀"), "raw UTF-8, as Python writes with ensure_ascii=False");
        assert_eq!(p("\"\u{7f}\u{80}\"").as_str(), Some("\u{7f}\u{80}"), "DEL and C1 controls need no escape");
    }

    #[test]
    fn arrays_and_objects_keep_order_and_duplicates() {
        let v = p(r#" { "b" : [1, [], {}, [[ ]]] , "a":{"x":null}, "b": "last" } "#);
        let keys: Vec<&str> = v.as_object().unwrap().iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["b", "a", "b"]);
        assert_eq!(v["b"].as_str(), Some("last"), "the last of equal keys, as Python's json");
        assert!(v["a"]["x"].is_null() && v.get("a").unwrap().get("x").is_some());
        assert!(v["missing"]["deeper"][3].is_null(), "indexing never panics");
        let first = &v.as_object().unwrap()[0].1;
        assert_eq!(first[0].as_i64(), Some(1));
        assert_eq!(first[1].as_array().map(<[Value]>::len), Some(0));
        assert_eq!(first[3][0].as_array().map(<[Value]>::len), Some(0));
        assert!(first[4].is_null());
        assert_eq!(p("[]"), Value::Array(vec![]));
        assert_eq!(p("{}"), Value::Object(vec![]));
    }

    /// Every tagged form of python/distckpt/_tree.py, as its encoder writes them.
    #[test]
    fn python_tagged_forms() {
        let v = p(r#"{"$tuple":[2,3]}"#);
        assert_eq!(v.as_tuple().map(|t| t.iter().filter_map(Value::as_i64).collect::<Vec<_>>()), Some(vec![2, 3]));
        assert_eq!(v[1].as_i64(), Some(3));
        assert!(v.as_array().is_none() && v.as_sequence().is_some());
        assert_eq!(v.tag().map(|(t, _)| t), Some("$tuple"));

        let d = p(r#"{"$dict":[[1,"one"],["$k",{"$tuple":[]}],[{"$tuple":[1,2]},null]]}"#);
        let items = d.as_dict_items().unwrap();
        assert_eq!(items.len(), 3);
        assert_eq!((items[0].0.as_i64(), items[0].1.as_str()), (Some(1), Some("one")));
        assert_eq!(items[1].0.as_str(), Some("$k"));
        assert_eq!(items[1].1.as_tuple().map(<[Value]>::len), Some(0));
        assert_eq!(items[2].0.as_tuple().map(<[Value]>::len), Some(2));
        assert!(p(r#"{"$dict":[[1]]}"#).as_dict_items().is_none(), "an item must be a pair");

        assert_eq!(p(r#"{"$bytes":"AAH/"}"#).as_bytes(), Some(vec![0, 1, 255]));
        assert_eq!(p(r#"{"$bytes":""}"#).as_bytes(), Some(vec![]));
        assert_eq!(p(r#"{"$bytes":"aGk="}"#).as_bytes(), Some(b"hi".to_vec()));
        assert_eq!(p(r#"{"$bytes":"aA=="}"#).as_bytes(), Some(b"h".to_vec()));
        for bad in ["aGk", "a===", "aG=k", "aGk=aGk=", "aGl=", "****"] {
            assert_eq!(p(&format!(r#"{{"$bytes":"{bad}"}}"#)).as_bytes(), None, "{bad}");
        }

        assert!(p(r#"{"$float":"nan"}"#).as_f64().unwrap().is_nan());
        assert_eq!(p(r#"{"$float":"inf"}"#).as_f64(), Some(f64::INFINITY));
        assert_eq!(p(r#"{"$float":"-inf"}"#).as_f64(), Some(f64::NEG_INFINITY));
        assert_eq!(p(r#"{"$float":"1.5"}"#).as_f64(), None);

        assert_eq!(p(r#"{"$complex":[1.5,-2.0]}"#).as_complex(), Some((1.5, -2.0)));
        let (re, im) = p(r#"{"$complex":[{"$float":"inf"},{"$float":"nan"}]}"#).as_complex().unwrap();
        assert!(re == f64::INFINITY && im.is_nan());
        assert_eq!(p(r#"{"$complex":[1]}"#).as_complex(), None);

        // Not tags: more than one member, or a key without '$'.
        assert!(p(r#"{"$tuple":[1],"x":2}"#).as_tuple().is_none());
        assert!(p(r#"{"tuple":[1]}"#).tag().is_none());
    }

    #[test]
    fn structure_document() {
        let text = r#"{"distckpt_structure":1,"root":{"dict":[["model",{"dict":[["w",{"array":"model.w"}]]}],["step",{"object":"step","encoding":"json"}],[3,{"list":[{"array":"3.0","scalar":true}]}],["t",{"tuple":[{"object":"t.0","encoding":"pickle"}]}]]}}"#;
        let v = p(text);
        assert_eq!(v["distckpt_structure"].as_i64(), Some(1));
        let root = &v["root"]["dict"];
        assert_eq!(root[0][0].as_str(), Some("model"));
        assert_eq!(root[0][1]["dict"][0][1]["array"].as_str(), Some("model.w"));
        assert_eq!(root[1][1]["encoding"].as_str(), Some("json"));
        assert_eq!(root[2][0].as_i64(), Some(3));
        assert_eq!(root[2][1]["list"][0]["scalar"].as_bool(), Some(true));
        assert_eq!(root[3][1]["tuple"][0]["encoding"].as_str(), Some("pickle"));
        assert_eq!(v.to_string(), text, "Display writes the compact form back");
    }

    #[test]
    fn display_round_trips() {
        for text in [
            r#"[null,true,false,0,-1,18446744073709551615,1.5,1e300,-2.5e-300,"a\"\\\n\t\u0001é😀",{},[]]"#,
            r#"{"a":{"b":[1,{"c":""}]},"":0}"#,
        ] {
            let v = p(text);
            assert_eq!(p(&v.to_string()), v, "{text}");
        }
        assert_eq!(p("1.0").to_string(), "1.0");
        assert_eq!(Value::from(f64::NAN).to_string(), "null");
        assert_eq!(Value::from("x\u{1}").to_string(), r#""x\u0001""#);
    }

    #[test]
    fn malformed_inputs_are_errors_with_a_position() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "expected a value, found the end of the text"),
            (b"   ", "expected a value"),
            (b"[1, 2", "expected ',' or ']'"),
            (b"[1,]", "expected a value, found ']'"),
            (b"{\"a\":1,}", "expected a string key"),
            (b"{\"a\" 1}", "expected ':'"),
            (b"{1:2}", "expected a string key"),
            (b"{\"a\":1 \"b\":2}", "expected ',' or '}'"),
            (b"\"abc", "unterminated string"),
            (b"\"a\\", "unterminated escape"),
            (b"\"\\x\"", "invalid escape '\\x'"),
            (b"\"\\u12\"", "4 hex digits"),
            (b"\"\\u12g4\"", "4 hex digits"),
            (b"\"a\nb\"", "control character U+000A"),
            (b"\"\x00\"", "control character U+0000"),
            (b"\"\\ud800\"", "unpaired surrogate \\ud800"),
            (b"\"\\ud800\\u0041\"", "unpaired surrogate \\ud800 in a string (followed by \\u0041)"),
            (b"\"\\udc00\"", "unpaired surrogate \\udc00"),
            (b"\"\\ud800x\"", "unpaired surrogate"),
            (b"01", "leading zero"),
            (b"-", "expected a digit"),
            (b"-a", "expected a digit"),
            (b"+1", "expected a value"),
            (b"1.", "a digit after the decimal point"),
            (b".5", "expected a value"),
            (b"1e", "a digit in the exponent"),
            (b"1e+", "a digit in the exponent"),
            (b"0x10", "expected the end of the text"),
            (b"1e400", "out of range"),
            (b"-1e400", "out of range"),
            (b"NaN", "expected a value"),
            (b"Infinity", "expected a value"),
            (b"tru", "expected 'true', found \"tru\""),
            (b"[free text]", "expected 'false', found \"free\""),
            (b"nul", "expected 'null'"),
            (b"True", "expected a value"),
            (b"{} {}", "expected the end of the text after the value, found '{'"),
            (b"[1] x", "expected the end of the text"),
            (b"1 2", "expected the end of the text"),
            (b"\"a\" \x00", "found U+0000"),
            (b"\xef\xbb\xbf1", "found U+FEFF"),
            (b"[\"\xff\"]", "invalid UTF-8"),
            (b"\"\xc3\"", "invalid UTF-8"),
            (b"\"\xed\xa0\x80\"", "invalid UTF-8"), // a surrogate encoded raw (CESU-8)
            (b"[1]\xff", "invalid UTF-8"),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(
                e.message.contains(want) || e.to_string().contains(want),
                "{:?}: {e} (want {want:?})",
                String::from_utf8_lossy(text)
            );
            assert!(e.offset <= text.len());
        }
        let e = err(b"{\n  \"a\": [1,\n   2 x]}");
        assert_eq!((e.line, e.column, e.offset), (3, 6, 18), "{e}");
        let e = err("[\"é\", @]".as_bytes());
        assert_eq!((e.line, e.column), (1, 7), "columns count characters: {e}");
        assert_eq!(err(b"[\"\xff\"]").offset, 2);
    }

    #[test]
    fn deep_nesting_is_refused_without_recursion() {
        let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(parse(ok.as_bytes()).is_ok());
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        let e = err(deep.as_bytes());
        assert!(e.message.contains("deeper than 1000 levels") && e.offset == MAX_DEPTH, "{e}");
        // Far deeper than any stack: an error, not a crash; objects count too.
        for open in ["[", "{\"a\":", "[{\"a\":"] {
            let e = err(open.repeat(1_000_000).as_bytes());
            assert!(e.message.contains("deeper than"), "{e}");
        }
        assert!(parse_with_max_depth(b"[[1]]", 2).is_ok());
        assert!(parse_with_max_depth(b"[[1]]", 1).is_err());
        assert!(parse_with_max_depth(b"[]", 0).is_err());
        assert!(parse_with_max_depth(b"7", 0).is_ok());
    }

    #[test]
    fn hostile_inputs_never_panic() {
        // Huge numbers, long strings, and every truncation of a document that exercises every construct.
        let long_int = "9".repeat(100_000);
        assert!(err(long_int.as_bytes()).message.contains("out of range"));
        let long_frac = format!("0.{}", "1".repeat(100_000));
        assert_eq!(p(&long_frac).as_f64(), Some(0.1111111111111111));
        let long_exp = format!("1e{}", "9".repeat(10_000));
        assert!(err(long_exp.as_bytes()).message.contains("out of range"));
        assert_eq!(p(&format!("1e-{}", "9".repeat(10_000))).as_f64(), Some(0.0));
        let big_string = format!("\"{}\"", "\\u00e9".repeat(100_000));
        assert_eq!(p(&big_string).as_str().map(|s| s.chars().count()), Some(100_000));

        let doc = r#"{"a":[1,-2.5e3,true,false,null,"s\"\u00e9\ud83d\ude00",{"$tuple":[{}]}],"b":{"c":[[]]}}"#;
        assert!(parse(doc.as_bytes()).is_ok());
        for cut in 0..doc.len() {
            assert!(parse(&doc.as_bytes()[..cut]).is_err(), "prefix {cut} parsed");
        }
        // Every byte replaced by each of a set of troublemakers.
        for i in 0..doc.len() {
            for b in [b'"', b'\\', b'[', b']', b'{', b'}', b',', b':', 0u8, 0x80, 0xff, b'-', b'e', b'0'] {
                let mut t = doc.as_bytes().to_vec();
                t[i] = b;
                let _ = parse(&t);
            }
        }
        // A little deterministic noise (xorshift) built from JSON's own characters.
        let alphabet = b"[]{}\",:\\u0123456789abcdefABCDEF-+.eEtrunlsf \n\x00\x7f\xc3\xa9\xff";
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let len = (x % 40) as usize;
            let t: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    alphabet[(x % alphabet.len() as u64) as usize]
                })
                .collect();
            if let Ok(v) = parse(&t) {
                assert_eq!(p(&v.to_string()), v, "what parses prints back the same: {:?}", String::from_utf8_lossy(&t));
            }
        }
    }
}
