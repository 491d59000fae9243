//! The `serde` feature, checked with serde_json as an independent parser and serializer: json::Value as stored
//! (Serialize, Deserialize), and values read as Python saved them (`Checkpoint::value_as`, `json::from_value`) against
//! the shared value fixtures (tests/fixtures/values, FORMAT.md appendix A) and the checkpoint distckpt's Python
//! package wrote (tests/data/python_values).
mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use common::{data, TempDir};
use distckpt::json::{self, DecodeError, Number, Value};
use distckpt::{Checkpoint, ErrorCode, SaveOptions, SaveState};
use serde::de::{Deserialize, IgnoredAny, IntoDeserializer};
use serde_json::json;

fn python() -> Checkpoint {
    Checkpoint::open(data("python_values")).unwrap()
}

// ---- The shared value fixtures ------------------------------------------------------------------------------------

struct Case {
    name: String,
    bytes: Vec<u8>,
    /// The README's typed form of the decoded value (None: an invalid fixture).
    expected: Option<Value>,
    encoding: String,
}

/// Every value fixture, saved as the bytes entries of one checkpoint whose structure gives each its encoding.
fn value_fixtures(tmp: &TempDir) -> (Vec<Case>, Checkpoint) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/values/value");
    let mut files: Vec<String> =
        fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    files.sort();
    let mut cases = Vec::new();
    for file in &files {
        let (name, valid) = match (file.strip_suffix(".expected.json"), file.strip_suffix(".invalid.json")) {
            (Some(n), _) => (n, true),
            (_, Some(n)) => (n, false),
            _ => continue,
        };
        let side = json::parse(&fs::read(dir.join(file)).unwrap()).unwrap();
        let encoding = side.get("encoding").and_then(Value::as_str).unwrap_or("json").to_string();
        let input = format!("{name}.{}", if encoding == "pickle" { "pickle" } else { "json" });
        cases.push(Case {
            name: name.to_string(),
            bytes: fs::read(dir.join(input)).unwrap(),
            expected: valid.then(|| side["decoded"].clone()),
            encoding,
        });
    }
    assert!(cases.len() >= 100, "{} value fixtures", cases.len());
    let mut state = SaveState::new().unwrap();
    let mut items = Vec::new();
    for c in &cases {
        state.add_bytes(&c.name, &c.bytes).unwrap();
        items.push(format!(r#"["{0}",{{"object":"{0}","encoding":"{1}"}}]"#, c.name, c.encoding));
    }
    let structure = format!(r#"{{"distckpt_structure":1,"root":{{"dict":[{}]}}}}"#, items.join(","));
    state.set_structure(structure.as_bytes()).unwrap();
    let path = tmp.join("values");
    state.save(&path, &SaveOptions { sync: false, ..Default::default() }).unwrap();
    (cases, Checkpoint::open(&path).unwrap())
}

/// The float of the README's typed form ("1.5", "-0.0", "nan", "inf", "1e+300") as serde_json::Value holds it:
/// a number, or null for what JSON cannot hold (serde_json's own rule for non-finite floats).
fn float_json(text: &Value) -> serde_json::Value {
    let x: f64 = text.as_str().unwrap().parse().unwrap();
    serde_json::Number::from_f64(x).map_or(serde_json::Value::Null, serde_json::Value::Number)
}

/// What `value_as::<serde_json::Value>` must give for a decoded value in the README's typed form, written from the
/// module documentation of json::from_value: tuples are arrays, bytes arrays of numbers, a complex number [re, im],
/// dict keys strings (an integer key as its digits); None where serde_json::Value cannot take the value (a dict key
/// that is neither a string nor an integer, an integer beyond f64's range), which must be an InvalidArgument error.
fn expected_json(want: &Value) -> Option<serde_json::Value> {
    let [(kind, body)] = want.as_object().unwrap() else { panic!("bad typed form {want}") };
    Some(match kind.as_str() {
        "none" => serde_json::Value::Null,
        "bool" => serde_json::Value::Bool(body.as_bool().unwrap()),
        "int" => {
            let digits = body.as_str().unwrap();
            match (digits.parse::<i64>(), digits.parse::<u64>()) {
                (Ok(i), _) => json!(i),
                (_, Ok(u)) => json!(u),
                // Beyond 64 bits: the nearest f64, as serde_json reads such an integer from text.
                _ => serde_json::Value::Number(serde_json::Number::from_f64(digits.parse::<f64>().unwrap())?),
            }
        }
        "float" => float_json(body),
        "str" => json!(body.as_str().unwrap()),
        "bytes" => {
            let hex = body.as_str().unwrap();
            (0..hex.len()).step_by(2).map(|i| json!(u8::from_str_radix(&hex[i..i + 2], 16).unwrap())).collect()
        }
        "complex" => serde_json::Value::Array(vec![float_json(&body[0]), float_json(&body[1])]),
        "list" | "tuple" => body.as_array().unwrap().iter().map(expected_json).collect::<Option<_>>()?,
        "dict" => {
            let mut map = serde_json::Map::new();
            for item in body.as_array().unwrap() {
                let (key_kind, key) = &item[0].as_object().unwrap()[0];
                let key = match key_kind.as_str() {
                    "str" | "int" => key.as_str().unwrap().to_string(),
                    _ => return None,
                };
                map.insert(key, expected_json(&item[1])?); // equal keys: the last one, as serde_json keeps it
            }
            serde_json::Value::Object(map)
        }
        other => panic!("unknown typed form {other}"),
    })
}

/// Equal, except where `ours` has the integer 0 and serde_json the float -0.0: serde_json reads the JSON integer `-0`
/// as a float, where FORMAT.md A-J3 makes it the integer 0 (one reason the crate keeps its own parser).
fn same_but_serde_json_minus_zero(ours: &serde_json::Value, theirs: &serde_json::Value) -> bool {
    use serde_json::Value as J;
    match (ours, theirs) {
        (J::Number(a), J::Number(b))
            if a.as_u64() == Some(0) && b.as_f64().is_some_and(|x| x == 0.0 && x.is_sign_negative()) =>
        {
            true
        }
        (J::Array(a), J::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_but_serde_json_minus_zero(x, y))
        }
        (J::Object(a), J::Object(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|((k, x), (l, y))| k == l && same_but_serde_json_minus_zero(x, y))
        }
        _ => ours == theirs,
    }
}

fn contains_big_int(v: &Value) -> bool {
    match v {
        Value::Number(Number::BigInt(_)) => true,
        Value::Array(items) => items.iter().any(contains_big_int),
        Value::Object(members) => members.iter().any(|(_, x)| contains_big_int(x)),
        _ => false,
    }
}

#[test]
fn value_fixtures_through_serde() {
    // serde reads with recursion, and the fixtures nest up to 500 levels (FORMAT.md A-L1): more than a test thread's
    // stack in a debug build.
    std::thread::Builder::new().stack_size(256 << 20).spawn(value_fixtures_on_a_big_stack).unwrap().join().unwrap();
}

fn value_fixtures_on_a_big_stack() {
    let tmp = TempDir::new("serde-values");
    let (cases, ckpt) = value_fixtures(&tmp);
    let mut failures = Vec::new();
    let mut counts = BTreeMap::<&str, usize>::new();
    for c in &cases {
        let mut fail = |what: String| failures.push(format!("{}: {what}", c.name));
        let decoded = ckpt.value_as::<serde_json::Value>(&c.name);
        let Some(want) = &c.expected else {
            // Invalid: the same error as value() gives, or Corrupt where only the tagged forms break the rules.
            let code = ckpt.value(&c.name).err().map_or(ErrorCode::Corrupt, |e| e.code());
            match decoded {
                Err(e) if e.code() == code && e.to_string().contains(&format!("'{}'", c.name)) => {}
                other => fail(format!("invalid, want a {code:?} error naming the entry, got {other:?}")),
            }
            // Checked in full before anything is read: even a target that ignores everything gets the error.
            if ckpt.value_as::<IgnoredAny>(&c.name).err().map(|e| e.code()) != Some(code) {
                fail("invalid, but read as IgnoredAny".into());
            }
            *counts.entry("invalid").or_default() += 1;
            continue;
        };
        let value = ckpt.value(&c.name).unwrap();

        // As Python saved it.
        match (expected_json(want), decoded) {
            (Some(w), Ok(got)) if got == w => *counts.entry("decoded").or_default() += 1,
            (None, Err(e)) if e.code() == ErrorCode::InvalidArgument => {
                *counts.entry("not for serde_json::Value").or_default() += 1
            }
            (w, got) => fail(format!("value_as::<serde_json::Value>: got {got:?}, want {w:?}")),
        }

        // As stored: serde_json's reading of the same bytes, where serde_json reads them (it stops at 128 levels).
        match serde_json::from_slice::<serde_json::Value>(&c.bytes) {
            Ok(theirs) => match serde_json::to_value(&value) {
                Ok(ours) if ours == theirs => *counts.entry("as stored, to_value").or_default() += 1,
                Ok(ours) if same_but_serde_json_minus_zero(&ours, &theirs) => {
                    *counts.entry("as stored, serde_json reads -0 as a float").or_default() += 1
                }
                // serde_json::Value holds no integer beyond 64 bits (it read the text as the nearest f64).
                Err(_) if contains_big_int(&value) => *counts.entry("as stored, big integer").or_default() += 1,
                other => fail(format!("serde_json::to_value gives {other:?}, serde_json read {theirs}")),
            },
            Err(e) if e.to_string().contains("recursion limit") => {
                *counts.entry("as stored, deeper than serde_json reads").or_default() += 1
            }
            Err(e) => fail(format!("serde_json cannot read a valid fixture: {e}")),
        }
        // Deserialize, fed by serde_json's parser, builds what json::parse builds (big integers apart, which
        // serde_json hands over as f64).
        if let Ok(ours) = serde_json::from_slice::<Value>(&c.bytes) {
            let minus_zero = || {
                let (a, b) = (serde_json::to_value(&value).unwrap(), serde_json::to_value(&ours).unwrap());
                same_but_serde_json_minus_zero(&a, &b)
            };
            if !contains_big_int(&value) && ours != value && !minus_zero() {
                fail(format!("Deserialize through serde_json gives {ours}, json::parse {value}"));
            }
        }
        // Serialize writes JSON that json::parse reads back as the same value.
        match serde_json::to_string(&value) {
            Ok(text) if json::parse(text.as_bytes()).as_ref() == Ok(&value) => {}
            other => fail(format!("Serialize wrote {other:?}")),
        }
    }
    assert!(failures.is_empty(), "{} of {} fixtures failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
    eprintln!("value fixtures through serde: {counts:?}");
    assert!(counts["decoded"] >= 40 && counts["invalid"] >= 50 && counts["as stored, to_value"] >= 40, "{counts:?}");
}

// ---- Values saved from Python, into Rust types --------------------------------------------------------------------

#[derive(serde::Deserialize, Debug, PartialEq)]
enum Letter {
    #[serde(rename = "x")]
    X,
}

#[derive(serde::Deserialize, Debug, PartialEq)]
struct Inner {
    b: Vec<u8>,
}

#[derive(serde::Deserialize, Debug, PartialEq)]
struct Cfg1 {
    a: Inner,
}

/// The keys of cfg[0], `{1: "one", "$k": [1, 2], (1, 2): "tuple key"}`: an integer, a string and a tuple.
#[derive(serde::Deserialize, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(untagged)]
enum Key {
    Int(i64),
    Str(String),
    Pair(i64, i64),
}

/// Bytes through `deserialize_byte_buf` (serde_bytes' path), not as a sequence.
#[derive(Debug, PartialEq)]
struct Bytes(Vec<u8>);

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Bytes;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_byte_buf<E>(self, b: Vec<u8>) -> Result<Bytes, E> {
                Ok(Bytes(b))
            }
        }
        d.deserialize_byte_buf(V)
    }
}

#[test]
fn python_values_read_into_rust_types() {
    let ckpt = python();
    assert_eq!(ckpt.value_as::<u64>("step").unwrap(), 100);
    assert_eq!(ckpt.value_as::<f64>("lr").unwrap(), 0.001);
    assert!(ckpt.value_as::<bool>("done").unwrap());
    assert_eq!(ckpt.value_as::<Option<u32>>("nothing").unwrap(), None);
    assert_eq!(ckpt.value_as::<()>("nothing").unwrap(), ());
    assert_eq!(ckpt.value_as::<String>("name").unwrap(), "run-é 🚀");
    assert_eq!(ckpt.value_as::<String>("pair.1").unwrap(), "label");
    // Tuples and lists, nested: ((1, 2), [3, (4,)]).
    assert_eq!(ckpt.value_as::<(u32, u32)>("shape").unwrap(), (2, 3));
    assert_eq!(ckpt.value_as::<Vec<u64>>("shape").unwrap(), [2, 3]);
    assert_eq!(ckpt.value_as::<((i32, i32), (i32, (i32,)))>("nested").unwrap(), ((1, 2), (3, (4,))));
    assert_eq!(
        ckpt.value_as::<(bool, Option<u8>, f64, Letter)>("flags").unwrap(),
        (true, None, 1.5, Letter::X),
        "a string is a unit variant"
    );
    // A list of dicts: a $dict with keys of three kinds, then a plain dict into a struct.
    let (dict, cfg1): (BTreeMap<Key, serde_json::Value>, Cfg1) = ckpt.value_as("cfg").unwrap();
    assert_eq!(
        dict,
        BTreeMap::from([
            (Key::Int(1), json!("one")),
            (Key::Str("$k".into()), json!([1, 2])),
            (Key::Pair(1, 2), json!("tuple key")),
        ])
    );
    assert_eq!(cfg1, Cfg1 { a: Inner { b: vec![1] } });
    // Bytes, non-finite floats, complex numbers, integers at and beyond 64 bits.
    assert_eq!(ckpt.value_as::<Vec<u8>>("blob").unwrap(), [0, 1, 0xff]);
    assert_eq!(ckpt.value_as::<Bytes>("blob").unwrap(), Bytes(vec![0, 1, 0xff]));
    assert!(ckpt.value_as::<f64>("nan").unwrap().is_nan());
    assert_eq!(ckpt.value_as::<f32>("ninf").unwrap(), f32::NEG_INFINITY);
    assert_eq!(ckpt.value_as::<(f64, f64)>("z").unwrap(), (1.5, -2.0));
    let [re, im] = ckpt.value_as::<[f64; 2]>("zinf").unwrap();
    assert!(re == f64::INFINITY && im.is_nan());
    assert_eq!(ckpt.value_as::<i64>("neg").unwrap(), i64::MIN);
    assert_eq!(ckpt.value_as::<u64>("u64max").unwrap(), u64::MAX);
    assert_eq!(ckpt.value_as::<u128>("big").unwrap(), (1u128 << 64) + 1, "exact through a 128-bit target");
    assert_eq!(ckpt.value_as::<i128>("big").unwrap(), (1i128 << 64) + 1);
    assert_eq!(ckpt.value_as::<f64>("big").unwrap(), 18446744073709551617.0);
    assert_eq!(ckpt.value_as::<serde_json::Value>("big").unwrap(), json!(18446744073709551617.0));
    // A numpy scalar (a 0-d tensor) reads as the number it holds, as value() does.
    assert_eq!(ckpt.value_as::<f64>("scale").unwrap(), 0.5);
    // Anything, into serde_json.
    assert_eq!(
        ckpt.value_as::<serde_json::Value>("cfg").unwrap_err().code(),
        ErrorCode::InvalidArgument,
        "a tuple key has no place in a JSON object"
    );
    assert_eq!(ckpt.value_as::<serde_json::Value>("nested").unwrap(), json!([[1, 2], [3, [4]]]));
    assert_eq!(ckpt.value_as::<serde_json::Value>("zinf").unwrap(), json!([null, null]));
}

#[test]
fn errors_name_the_checkpoint_the_entry_and_the_type() {
    let ckpt = python();
    let err = ckpt.value_as::<String>("step").unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    for part in ["'step'", "python_values", "String", "invalid type: integer `100`"] {
        assert!(err.message().contains(part), "{part:?} missing from: {err}");
    }
    let err = ckpt.value_as::<u64>("big").unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    let err = ckpt.value_as::<(u32, u32, u32)>("shape").unwrap_err();
    assert!(err.message().contains("invalid length 2"), "{err}");
    // What value() refuses, value_as refuses the same way.
    assert_eq!(ckpt.value_as::<serde_json::Value>("model.w").unwrap_err().code(), ErrorCode::InvalidArgument);
    assert_eq!(ckpt.value_as::<serde_json::Value>("obj").unwrap_err().code(), ErrorCode::Unsupported);
    assert_eq!(ckpt.value_as::<serde_json::Value>("nope").unwrap_err().code(), ErrorCode::NotFound);
}

#[test]
fn from_value_checks_the_tagged_forms_first() {
    let parse = |t: &str| json::parse(t.as_bytes()).unwrap();
    for (text, why) in [
        (r#"{"$set":[1]}"#, "unknown tag"),
        (r#"{"$tuple":[1],"x":2}"#, "not alone"),
        (r#"[{"$bytes":"aGk"}]"#, "canonical base64"),
        (r#"{"$dict":[[1,"a"],[1.0,"b"]]}"#, "two equal keys"),
        (r#"{"$dict":[[[1],"a"]]}"#, "cannot hash"),
        (r#"{"a":1,"a":2}"#, "appears twice"),
    ] {
        match json::from_value::<IgnoredAny>(&parse(text)) {
            Err(DecodeError::Malformed(m)) => assert!(m.contains(why), "{text}: {m}"),
            other => panic!("{text}: {other:?}"),
        }
    }
    // A NaN key equals nothing, not even another NaN: valid, but serde_json::Value has no float keys.
    let v = parse(r#"{"$dict":[[{"$float":"nan"},1],[{"$float":"nan"},2]]}"#);
    assert!(json::from_value::<IgnoredAny>(&v).is_ok());
    match json::from_value::<serde_json::Value>(&v) {
        Err(DecodeError::Mismatch(m)) => assert!(m.contains("floating point"), "{m}"),
        other => panic!("{other:?}"),
    }
    // Borrowing from the value.
    let v = parse(r#"{"$tuple":["borrowed",{"k":"v"}]}"#);
    let (s, m): (&str, BTreeMap<&str, &str>) = json::from_value(&v).unwrap();
    assert_eq!((s, m["k"]), ("borrowed", "v"));
    // An externally tagged enum variant: a one-member object.
    #[derive(serde::Deserialize, Debug, PartialEq)]
    enum Shape {
        Square(u32),
        Rect { w: u32, h: u32 },
    }
    assert_eq!(json::from_value::<Shape>(&parse(r#"{"Square":3}"#)).unwrap(), Shape::Square(3));
    assert_eq!(json::from_value::<Shape>(&parse(r#"{"Rect":{"w":1,"h":2}}"#)).unwrap(), Shape::Rect { w: 1, h: 2 });
}

// ---- json::Value as stored ----------------------------------------------------------------------------------------

#[test]
fn every_value_python_saved_round_trips_through_serde_json() {
    let ckpt = python();
    let mut n = 0;
    for e in ckpt.entries().filter(|e| !e.is_tensor()) {
        let Ok(v) = ckpt.value(e.name()) else { continue };
        // Text: exact, 128-bit integers included.
        let text = serde_json::to_string(&v).unwrap();
        assert_eq!(json::parse(text.as_bytes()).unwrap(), v, "{}: {text}", e.name());
        let back: Value = serde_json::from_str(&v.to_string()).unwrap();
        // serde_json::Value: the same as serde_json reading the stored bytes, but for integers beyond 64 bits.
        let theirs: serde_json::Value = serde_json::from_slice(&ckpt.read_bytes(e.name()).unwrap()).unwrap();
        if contains_big_int(&v) {
            assert!(serde_json::to_value(&v).is_err(), "{}: serde_json::Value has no 65-bit integers", e.name());
            assert!(matches!(back, Value::Number(Number::Float(_))), "{}: serde_json reads it as f64", e.name());
        } else {
            assert_eq!(serde_json::to_value(&v).unwrap(), theirs, "{}", e.name());
            assert_eq!(back, v, "{}", e.name());
        }
        n += 1;
    }
    assert!(n >= 19, "{n} values");
    // The structure document too.
    let doc = ckpt.structure_json().unwrap();
    assert_eq!(
        serde_json::to_value(&doc).unwrap(),
        serde_json::from_slice::<serde_json::Value>(ckpt.structure()).unwrap()
    );
}

#[test]
fn deserialize_builds_values_with_python_tags_for_what_json_lacks() {
    let from = |d: serde::de::value::F64Deserializer<serde::de::value::Error>| Value::deserialize(d).unwrap();
    assert_eq!(from(f64::NAN.into_deserializer()).to_string(), r#"{"$float":"nan"}"#);
    assert_eq!(from(f64::NEG_INFINITY.into_deserializer()).as_f64(), Some(f64::NEG_INFINITY));
    assert_eq!(from(0.25f64.into_deserializer()), Value::Number(Number::Float(0.25)));
    let bytes = serde::de::value::BytesDeserializer::<serde::de::value::Error>::new(&[0, 1, 0xff, 7]);
    let v = Value::deserialize(bytes).unwrap();
    assert_eq!((v.to_string().as_str(), v.as_bytes()), (r#"{"$bytes":"AAH/Bw=="}"#, Some(vec![0, 1, 0xff, 7])));
    let big = |u: u128| {
        Value::deserialize(u.into_deserializer() as serde::de::value::U128Deserializer<serde::de::value::Error>)
            .unwrap()
    };
    assert_eq!(big(u128::MAX), Value::Number(Number::BigInt(u128::MAX.to_string().into())));
    assert_eq!(big(u64::MAX as u128), Value::Number(Number::UInt(u64::MAX)));
    assert_eq!(big(5), Value::Number(Number::Int(5)));
    // Serialize the other way: a 128-bit integer is exact in JSON text; beyond 128 bits there is no serde form.
    let digits = "3".repeat(40);
    assert_eq!(
        serde_json::to_string(&Value::Number(Number::BigInt(u128::MAX.to_string().into()))).unwrap(),
        u128::MAX.to_string()
    );
    let err = serde_json::to_string(&Value::Number(Number::BigInt(digits.into()))).unwrap_err();
    assert!(err.to_string().contains("more than 128 bits"), "{err}");
    // Members keep their order and duplicates in both directions.
    let v: Value = serde_json::from_str(r#"{"b":1,"a":2,"b":3}"#).unwrap();
    assert_eq!(v.to_string(), r#"{"b":1,"a":2,"b":3}"#);
    assert_eq!(serde_json::to_string(&v).unwrap(), r#"{"b":1,"a":2,"b":3}"#);
}
