//! The shared value fixtures (tests/fixtures/values/, README.md there), read as a Rust program reads them: every value
//! is saved as a bytes entry of one checkpoint and read back with `Checkpoint::value`, then decoded in full with the
//! accessors of `json::Value` (`tag`, `as_tuple`, `as_dict_items`, `as_bytes`, `as_f64`, `as_complex`); every
//! structure document is parsed with `json::parse`, as `Checkpoint::structure_json` does, and checked against
//! FORMAT.md appendix A. Each valid fixture must give its expected result, each invalid one its error kind. Python
//! (python/tests/test_value_fixtures.py) and Go (go/value_fixtures_test.go) read the same files.
//!
//! The crate leaves the tagged forms to its caller (the accessors decode one on request), and has no validator for
//! structure documents: `decode` and `structure` below are the appendix's reader rules written over the crate's
//! accessors, which a program that needs the whole value or the whole structure would do the same way.
mod common;

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use common::TempDir;
use distckpt::json::{self, Number, Value};
use distckpt::{Checkpoint, ErrorCode, SaveOptions, SaveState};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/values")
}

struct Case {
    name: String,
    input: PathBuf,
    /// The typed form of the decoded value (None for an invalid fixture).
    expected: Option<Value>,
    error: String,
    encoding: String,
}

fn cases(kind: &str) -> Vec<Case> {
    let dir = fixtures().join(kind);
    let mut names: Vec<String> =
        fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    let mut out = Vec::new();
    let mut inputs = HashSet::new();
    for file in &names {
        let (name, valid) = if let Some(n) = file.strip_suffix(".expected.json") {
            (n, true)
        } else if let Some(n) = file.strip_suffix(".invalid.json") {
            (n, false)
        } else {
            continue;
        };
        let side = json::parse(&fs::read(dir.join(file)).unwrap()).unwrap();
        let encoding = side.get("encoding").and_then(Value::as_str).unwrap_or("json").to_string();
        let input = format!("{name}.{}", if encoding == "pickle" { "pickle" } else { "json" });
        inputs.insert(input.clone());
        out.push(Case {
            name: name.to_string(),
            input: dir.join(input),
            expected: valid.then(|| side["decoded"].clone()),
            error: side.get("error").and_then(Value::as_str).unwrap_or("").to_string(),
            encoding,
        });
    }
    for file in &names {
        if !file.ends_with(".expected.json") && !file.ends_with(".invalid.json") {
            assert!(inputs.contains(file), "{kind}/{file} has no .expected.json or .invalid.json");
        }
    }
    assert!(out.len() >= 40, "only {} {kind} fixtures", out.len());
    out
}

// ---- Values -------------------------------------------------------------------------------------------------------

/// A value decoded in full.
#[derive(Debug)]
enum Decoded {
    None,
    Bool(bool),
    Int(String), // exact decimal digits
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    Complex(f64, f64),
    List(Vec<Decoded>),
    Tuple(Vec<Decoded>),
    Dict(Vec<(Decoded, Decoded)>),
}

fn int_digits(n: &Number) -> Option<String> {
    match n {
        Number::Int(i) => Some(i.to_string()),
        Number::UInt(u) => Some(u.to_string()),
        Number::BigInt(d) => Some(d.to_string()),
        Number::Float(_) => None,
    }
}

/// FORMAT.md A.3 over the crate's accessors.
fn decode(v: &Value) -> Result<Decoded, String> {
    Ok(match v {
        Value::Null => Decoded::None,
        Value::Bool(b) => Decoded::Bool(*b),
        Value::Number(n) => match int_digits(n) {
            Some(d) => Decoded::Int(d),
            None => Decoded::Float(n.as_f64()),
        },
        Value::String(s) => Decoded::Str(s.clone()),
        Value::Array(items) => Decoded::List(items.iter().map(decode).collect::<Result<_, _>>()?),
        Value::Object(members) => match v.tag() {
            Some(("$tuple", _)) => {
                let items = v.as_tuple().ok_or("$tuple does not hold a list")?;
                Decoded::Tuple(items.iter().map(decode).collect::<Result<_, _>>()?)
            }
            Some(("$dict", _)) => {
                let items = v.as_dict_items().ok_or("$dict does not hold [key, value] pairs")?;
                let mut seen = HashSet::new();
                let mut out = Vec::new();
                for (k, x) in items {
                    let key = decode(k)?;
                    if let Some(h) = hash_key(&key)? {
                        if !seen.insert(h) {
                            return Err(format!("a $dict has two equal keys ({k})"));
                        }
                    }
                    out.push((key, decode(x)?));
                }
                Decoded::Dict(out)
            }
            Some(("$bytes", _)) => Decoded::Bytes(v.as_bytes().ok_or("$bytes is not canonical base64")?),
            Some(("$float", _)) => Decoded::Float(v.as_f64().ok_or("$float is not nan, inf or -inf")?),
            Some(("$complex", _)) => {
                let (re, im) = v.as_complex().ok_or("$complex does not hold [re, im] numbers")?;
                Decoded::Complex(re, im)
            }
            Some((tag, _)) => return Err(format!("unknown tag {tag:?}")),
            None => {
                let mut out = Vec::new();
                for (k, x) in members {
                    if k.starts_with('$') {
                        return Err(format!("key {k:?} starts with '$' outside a tagged form"));
                    }
                    out.push((Decoded::Str(k.clone()), decode(x)?));
                }
                Decoded::Dict(out)
            }
        },
    })
}

/// A text equal for two $dict keys exactly when Python finds them equal (1 == 1.0 == True, (2+0j) == 2); None for a
/// key holding a NaN, which equals nothing. Lists and dicts cannot be keys.
fn hash_key(k: &Decoded) -> Result<Option<String>, String> {
    fn float(f: f64) -> Option<String> {
        if f.is_nan() {
            None
        } else if f.is_finite() && f == f.trunc() {
            Some(format!("I{}", if f == 0.0 { "0".to_string() } else { format!("{f:.0}") }))
        } else {
            Some(format!("F{f:e}"))
        }
    }
    Ok(match k {
        Decoded::None => Some("N".into()),
        Decoded::Bool(b) => Some(format!("I{}", *b as u8)),
        Decoded::Int(d) => Some(format!("I{}", if d == "-0" { "0" } else { d })),
        Decoded::Float(f) => float(*f),
        Decoded::Complex(re, im) if *im == 0.0 => float(*re),
        Decoded::Complex(re, im) => float(*re).zip(float(*im)).map(|(a, b)| format!("C{a},{b}")),
        Decoded::Str(s) => Some(format!("S{s}")),
        Decoded::Bytes(b) => Some(format!("B{b:?}")),
        Decoded::Tuple(items) => {
            let mut out = String::from("T");
            for it in items {
                match hash_key(it)? {
                    Some(h) => out.push_str(&format!("{}:{h}", h.len())),
                    None => return Ok(None),
                }
            }
            Some(out)
        }
        Decoded::List(_) | Decoded::Dict(_) => return Err("a $dict key is a list or a dict".into()),
    })
}

fn one(want: &Value) -> (&str, &Value) {
    match want.as_object() {
        Some([(k, v)]) => (k, v),
        _ => panic!("bad expected form {want}"),
    }
}

fn same_float(got: f64, want: &Value) -> bool {
    let w: f64 = want.as_str().unwrap().parse().unwrap();
    if w.is_nan() {
        got.is_nan()
    } else {
        got.to_bits() == w.to_bits()
    }
}

/// Compares a decoded value with the README's typed form.
fn check(got: &Decoded, want: &Value, at: &str) -> Result<(), String> {
    let (kind, body) = one(want);
    let ok = match (kind, got) {
        ("none", Decoded::None) => true,
        ("bool", Decoded::Bool(b)) => body.as_bool() == Some(*b),
        ("int", Decoded::Int(d)) => body.as_str() == Some(d.as_str()) || (d == "-0" && body.as_str() == Some("0")),
        ("float", Decoded::Float(f)) => same_float(*f, body),
        ("str", Decoded::Str(s)) => body.as_str() == Some(s.as_str()),
        ("bytes", Decoded::Bytes(b)) => {
            body.as_str() == Some(b.iter().map(|x| format!("{x:02x}")).collect::<String>().as_str())
        }
        ("complex", Decoded::Complex(re, im)) => same_float(*re, &body[0]) && same_float(*im, &body[1]),
        ("list", Decoded::List(items)) | ("tuple", Decoded::Tuple(items)) => {
            let want = body.as_array().unwrap();
            if items.len() != want.len() {
                return Err(format!("{at}: {} items, want {}", items.len(), want.len()));
            }
            for (i, (g, w)) in items.iter().zip(want).enumerate() {
                check(g, w, &format!("{at}[{i}]"))?;
            }
            true
        }
        ("dict", Decoded::Dict(items)) => {
            let want = body.as_array().unwrap();
            if items.len() != want.len() {
                return Err(format!("{at}: {} items, want {}", items.len(), want.len()));
            }
            for (i, ((k, v), w)) in items.iter().zip(want).enumerate() {
                check(k, &w[0], &format!("{at} key {i}"))?;
                check(v, &w[1], &format!("{at}[{i}]"))?;
            }
            true
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(short(format!("{at}: got {got:?}, want {want}")))
    }
}

#[test]
fn value_fixtures() {
    // `decode` recurses once per level, up to 500 (FORMAT.md A.4): more than a test thread's stack in a debug build.
    std::thread::Builder::new().stack_size(256 << 20).spawn(value_fixtures_on_a_big_stack).unwrap().join().unwrap();
}

fn value_fixtures_on_a_big_stack() {
    let cases = cases("value");
    let tmp = TempDir::new("value-fixtures");
    let path = tmp.join("values");
    let data: Vec<Vec<u8>> = cases.iter().map(|c| fs::read(&c.input).unwrap()).collect();
    let mut state = SaveState::new().unwrap();
    let mut items = Vec::new();
    for (c, data) in cases.iter().zip(&data) {
        state.add_bytes(&c.name, data).unwrap();
        items.push(format!(r#"["{0}",{{"object":"{0}","encoding":"{1}"}}]"#, c.name, c.encoding));
    }
    let structure = format!(r#"{{"distckpt_structure":1,"root":{{"dict":[{}]}}}}"#, items.join(","));
    state.set_structure(structure.as_bytes()).unwrap();
    state.save(&path, &SaveOptions { sync: false, ..Default::default() }).unwrap();
    let ckpt = Checkpoint::open(&path).unwrap();

    let mut failures = Vec::new();
    let (mut valid, mut invalid) = (0, 0);
    for c in &cases {
        let got = ckpt.value(&c.name);
        let result = match (&c.expected, got) {
            (Some(want), Ok(v)) => {
                valid += 1;
                decode(&v).and_then(|d| check(&d, want, "value"))
            }
            (Some(_), Err(e)) => Err(format!("value(): {e}")),
            (None, Ok(v)) => {
                invalid += 1;
                match (c.error.as_str(), decode(&v)) {
                    ("corrupt", Err(_)) => Ok(()),
                    (_, d) => Err(format!("accepted ({}); want a {} error", short(format!("{d:?}")), c.error)),
                }
            }
            (None, Err(e)) => {
                invalid += 1;
                let code = match c.error.as_str() {
                    "corrupt" => ErrorCode::Corrupt,
                    "pickle" => ErrorCode::Unsupported,
                    other => panic!("{}: unknown error kind {other}", c.name),
                };
                if e.code() != code {
                    Err(format!("{:?} ({e}); want {code:?}", e.code()))
                } else if !e.to_string().contains(&format!("'{}'", c.name)) {
                    Err(format!("the error does not name the entry: {e}"))
                } else {
                    Ok(())
                }
            }
        };
        if let Err(e) = result {
            failures.push(format!("{}: {e}", c.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} value fixtures failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    assert!(valid >= 50 && invalid >= 50, "{valid} valid, {invalid} invalid");
    eprintln!("{valid} valid and {invalid} invalid value fixtures");
}

fn short(mut s: String) -> String {
    if s.len() > 200 {
        let cut = (0..=200).rev().find(|i| s.is_char_boundary(*i)).unwrap();
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

// ---- Structure documents ------------------------------------------------------------------------------------------

#[derive(Debug, PartialEq)]
enum Outcome {
    NotOurs,
    Corrupt(String),
    Version,
}

fn first_duplicate_member(v: &Value) -> Option<&str> {
    match v {
        Value::Array(items) => items.iter().find_map(first_duplicate_member),
        Value::Object(members) => {
            let mut seen = HashSet::new();
            for (k, _) in members {
                if !seen.insert(k.as_str()) {
                    return Some(k);
                }
            }
            members.iter().find_map(|(_, c)| first_duplicate_member(c))
        }
        _ => None,
    }
}

/// FORMAT.md A.2: the root node of a structure document, checked; Err for a document that is not one or is bad.
fn structure(raw: &[u8]) -> Result<Value, Outcome> {
    let doc = json::parse(raw).map_err(|_| Outcome::NotOurs)?; // what Checkpoint::structure_json does
    let version = match doc.as_object() {
        Some(_) => doc.get("distckpt_structure").ok_or(Outcome::NotOurs)?,
        None => return Err(Outcome::NotOurs),
    };
    let digits = match version {
        Value::Number(n) => int_digits(n).ok_or_else(|| Outcome::Corrupt("version not an integer".into()))?,
        _ => return Err(Outcome::Corrupt("version not an integer".into())),
    };
    if digits.starts_with('-') || digits == "0" {
        return Err(Outcome::Corrupt("version below 1".into()));
    }
    if digits != "1" {
        return Err(Outcome::Version);
    }
    if let Some(k) = first_duplicate_member(&doc) {
        return Err(Outcome::Corrupt(format!("member {k:?} twice")));
    }
    let root = doc.get("root").ok_or_else(|| Outcome::Corrupt("no root".into()))?;
    check_node(root, 0, &mut HashSet::new()).map_err(Outcome::Corrupt)?;
    if root.get("dict").is_none() {
        return Err(Outcome::Corrupt("the root is not a dict".into()));
    }
    Ok(root.clone())
}

fn check_node<'a>(node: &'a Value, depth: usize, names: &mut HashSet<&'a str>) -> Result<(), String> {
    if depth > 200 {
        return Err("nested too deeply".into());
    }
    let members = node.as_object().filter(|m| !m.is_empty()).ok_or_else(|| format!("node {node} is not an object"))?;
    let kinds: Vec<&str> =
        ["dict", "list", "tuple", "array", "object"].into_iter().filter(|k| node.get(k).is_some()).collect();
    let kind = match kinds.as_slice() {
        [k] => *k,
        [] => return Err(format!("unknown node kind {:?}", members.iter().map(|(k, _)| k).collect::<Vec<_>>())),
        _ => return Err(format!("more than one kind: {kinds:?}")),
    };
    let body = &node[kind];
    match kind {
        "dict" => {
            let mut keys = HashSet::new();
            for item in body.as_array().ok_or("'dict' is not a list")? {
                let key = match item.as_array() {
                    Some([Value::String(s), _]) => format!("S{s}"),
                    Some([Value::Number(n), _]) => format!("I{}", int_digits(n).ok_or("a float key")?),
                    _ => return Err(format!("dict item {item} is not a [string or integer key, node] pair")),
                };
                if !keys.insert(key) {
                    return Err(format!("dict key {} twice", item[0]));
                }
                check_node(&item[1], depth + 1, names)?;
            }
        }
        "list" | "tuple" => {
            for child in body.as_array().ok_or("not a list")? {
                check_node(child, depth + 1, names)?;
            }
        }
        _ => {
            let name = body.as_str().ok_or("a leaf name that is not a string")?;
            if kind == "array" && node.get("scalar").is_some_and(|s| s.as_bool().is_none()) {
                return Err("'scalar' is not true or false".into());
            }
            if kind == "object" && !matches!(node.get("encoding").and_then(Value::as_str), Some("json" | "pickle")) {
                return Err("no known encoding".into());
            }
            if !names.insert(name) {
                return Err(format!("two leaves name the entry {name:?}"));
            }
        }
    }
    Ok(())
}

/// Compares a checked node with the README's typed form of a node.
fn check_struct(node: &Value, want: &Value, at: &str) -> Result<(), String> {
    let fail = || Err(format!("{at}: got {node}, want {want}"));
    if let Some(items) = want.get("dict").and_then(Value::as_array) {
        let got = node["dict"].as_array().unwrap_or(&[]);
        if node.get("dict").is_none() || got.len() != items.len() {
            return fail();
        }
        for (i, (g, w)) in got.iter().zip(items).enumerate() {
            let (kind, key) = one(&w[0]);
            let same_key = match (&g[0], kind) {
                (Value::String(s), "str") => key.as_str() == Some(s.as_str()),
                (Value::Number(n), "int") => int_digits(n).as_deref() == key.as_str(),
                _ => false,
            };
            if !same_key {
                return Err(format!("{at}: key {i} is {}, want {}", g[0], w[0]));
            }
            check_struct(&g[1], &w[1], &format!("{at}/{}", g[0]))?;
        }
        return Ok(());
    }
    for kind in ["list", "tuple"] {
        if let Some(items) = want.get(kind).and_then(Value::as_array) {
            let got = match node.get(kind).and_then(Value::as_array) {
                Some(g) if g.len() == items.len() => g,
                _ => return fail(),
            };
            for (i, (g, w)) in got.iter().zip(items).enumerate() {
                check_struct(g, w, &format!("{at}/{i}"))?;
            }
            return Ok(());
        }
    }
    let same = if want.get("array").is_some() {
        node.get("array") == want.get("array")
            && node.get("scalar").and_then(Value::as_bool).unwrap_or(false) == want["scalar"].as_bool().unwrap()
    } else {
        node.get("object") == want.get("object") && node.get("encoding") == want.get("encoding")
    };
    if same {
        Ok(())
    } else {
        fail()
    }
}

#[test]
fn structure_fixtures() {
    let cases = cases("structure");
    let mut failures = Vec::new();
    for c in &cases {
        let raw = fs::read(&c.input).unwrap();
        let got = structure(&raw);
        let result = match (&c.expected, got) {
            (Some(Value::Null), Err(Outcome::NotOurs)) => Ok(()),
            (Some(want), Ok(root)) if !want.is_null() => check_struct(&root, want, "root"),
            (None, Err(Outcome::Corrupt(_))) if c.error == "corrupt" => Ok(()),
            (None, Err(Outcome::Version)) if c.error == "version" => Ok(()),
            (want, got) => {
                Err(format!("got {got:?}, want {}", want.as_ref().map_or(c.error.clone(), |w| w.to_string())))
            }
        };
        if let Err(e) = result {
            failures.push(format!("{}: {e}", c.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} structure fixtures failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
