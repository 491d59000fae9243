//! Values saved from Python as JSON bytes entries, the structure document, and the scalar copies in the user metadata:
//! read from a checkpoint that distckpt's Python package wrote (tests/data/python_values, made by
//! tests/data/make_python_values.py), and from checkpoints written here that are not Python's.
mod common;

use common::{data, fixture, TempDir};
use distckpt::json::{self, Number, Value};
use distckpt::{Checkpoint, ErrorCode, SaveOptions, SaveState};

fn python() -> Checkpoint {
    Checkpoint::open(data("python_values")).unwrap()
}

#[test]
fn scalars_saved_from_python_are_values_and_user_metadata() {
    let ckpt = python();
    assert_eq!(ckpt.value("step").unwrap().as_i64(), Some(100));
    assert_eq!(ckpt.user("step"), Some("100"));
    assert_eq!(ckpt.value("lr").unwrap().as_f64(), Some(0.001));
    assert_eq!(ckpt.user("lr"), Some("0.001"));
    assert_eq!(ckpt.value("done").unwrap(), Value::Bool(true));
    assert_eq!(ckpt.user("done"), Some("true"));
    assert!(ckpt.value("nothing").unwrap().is_null());
    assert_eq!(ckpt.value("name").unwrap().as_str(), Some("run-é 🚀"));
    assert_eq!(ckpt.user("name"), Some("run-é 🚀"));
    assert_eq!(ckpt.user("framework"), Some("numpy"), "the caller's own user metadata is there too");
    assert_eq!(
        ckpt.value("escapes").unwrap().as_str(),
        Some("quote \" backslash \\ tab \t newline \n control \u{1} nul \0 smile 😀")
    );
    assert_eq!(ckpt.value("pair.1").unwrap().as_str(), Some("label"));
    // Integers at and beyond 64 bits.
    assert_eq!(ckpt.value("neg").unwrap().as_i64(), Some(i64::MIN));
    assert_eq!(ckpt.value("u64max").unwrap().as_u64(), Some(u64::MAX));
    assert_eq!(ckpt.value("big").unwrap(), Value::Number(Number::BigInt("18446744073709551617".into())));
    assert_eq!(ckpt.value("big").unwrap().to_string(), "18446744073709551617", "exact beyond 64 bits");
    assert_eq!(ckpt.user("big"), Some("18446744073709551617"), "the user metadata keeps the exact digits");
    // Floats JSON cannot hold.
    assert!(ckpt.value("nan").unwrap().as_f64().unwrap().is_nan());
    assert_eq!(ckpt.user("nan"), Some("nan"));
    assert_eq!(ckpt.value("ninf").unwrap().as_f64(), Some(f64::NEG_INFINITY));
}

#[test]
fn every_tagged_form_saved_from_python() {
    let ckpt = python();
    let flags = ckpt.value("flags").unwrap();
    assert_eq!(flags.to_string(), r#"[true,null,1.5,"x"]"#);
    assert_eq!(
        (flags[0].as_bool(), flags[1].is_null(), flags[2].as_f64(), flags[3].as_str()),
        (Some(true), true, Some(1.5), Some("x"))
    );

    let shape = ckpt.value("shape").unwrap();
    let dims: Vec<u64> = shape.as_tuple().unwrap().iter().filter_map(Value::as_u64).collect();
    assert_eq!(dims, [2, 3]);

    // ((1, 2), [3, (4,)])
    let nested = ckpt.value("nested").unwrap();
    assert_eq!(nested.as_tuple().map(<[Value]>::len), Some(2));
    assert_eq!(nested[0].as_tuple().unwrap().iter().filter_map(Value::as_i64).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(nested[1][0].as_i64(), Some(3));
    assert_eq!(nested[1][1].as_tuple().unwrap()[0].as_i64(), Some(4));

    // [{1: "one", "$k": [1, 2], (1, 2): "tuple key"}, {"a": {"b": [1]}}]
    let cfg = ckpt.value("cfg").unwrap();
    let items = cfg[0].as_dict_items().unwrap();
    assert_eq!(items.len(), 3);
    assert_eq!((items[0].0.as_i64(), items[0].1.as_str()), (Some(1), Some("one")));
    assert_eq!((items[1].0.as_str(), items[1].1[1].as_i64()), (Some("$k"), Some(2)));
    assert_eq!(items[2].0.as_tuple().map(<[Value]>::len), Some(2));
    assert_eq!(items[2].1.as_str(), Some("tuple key"));
    assert_eq!(cfg[1]["a"]["b"][0].as_i64(), Some(1));

    assert_eq!(ckpt.value("blob").unwrap().as_bytes(), Some(vec![0, 1, 0xff]));
    assert_eq!(ckpt.value("z").unwrap().as_complex(), Some((1.5, -2.0)));
    let (re, im) = ckpt.value("zinf").unwrap().as_complex().unwrap();
    assert!(re == f64::INFINITY && im.is_nan());
}

#[test]
fn the_structure_saved_from_python() {
    let ckpt = python();
    let doc = ckpt.structure_json().unwrap();
    assert_eq!(doc["distckpt_structure"].as_i64(), Some(1));
    let root = &doc["root"]["dict"];
    let keys: Vec<&str> = root.as_array().unwrap().iter().filter_map(|kv| kv[0].as_str()).collect();
    assert_eq!(&keys[..4], ["model", "pair", "scale", "step"]);
    let model = &root[0][1]["dict"];
    assert_eq!(model[0][1]["array"].as_str(), Some("model.w"));
    assert_eq!(model[1][1]["list"][1]["array"].as_str(), Some("model.layers.1"));
    assert_eq!(root[1][1]["tuple"][1]["object"].as_str(), Some("pair.1"));
    assert_eq!(root[2][1]["scalar"].as_bool(), Some(true));

    // Every leaf names an entry: arrays are tensors, JSON objects have values, the pickled one says so.
    let mut stack = vec![&doc["root"]];
    let (mut arrays, mut objects) = (0, 0);
    while let Some(node) = stack.pop() {
        if let Some(items) = node["dict"].as_array() {
            stack.extend(items.iter().map(|kv| &kv[1]));
        } else if let Some(children) = node["list"].as_array().or(node["tuple"].as_array()) {
            stack.extend(children);
        } else if let Some(name) = node["array"].as_str() {
            assert!(ckpt.entry(name).unwrap().is_tensor(), "{name}");
            arrays += 1;
        } else {
            let name = node["object"].as_str().unwrap();
            match node["encoding"].as_str().unwrap() {
                "json" => assert!(ckpt.value(name).is_ok(), "{name}"),
                "pickle" => assert_eq!(ckpt.value(name).unwrap_err().code(), ErrorCode::Unsupported),
                other => panic!("{name}: encoding {other}"),
            }
            objects += 1;
        }
    }
    assert_eq!((arrays, objects), (5, 20));
    assert_eq!(arrays + objects, ckpt.len());
}

#[test]
fn what_is_not_a_json_value_says_so() {
    let ckpt = python();
    let path = data("python_values").display().to_string();
    // Pickled by Python.
    let err = ckpt.value("obj").unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unsupported);
    for needle in ["entry 'obj'", path.as_str(), "pickle", "allow_pickle=True", "read_bytes()"] {
        assert!(err.to_string().contains(needle), "{needle:?} missing from: {err}");
    }
    // A tensor, and no entry at all.
    let err = ckpt.value("model.w").unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.to_string().contains("is a tensor") && err.to_string().contains("'model.w'"), "{err}");
    let err = ckpt.value("no.such").unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    assert!(err.to_string().contains("no.such"), "{err}");

    // The C++ fixtures have no structure; their bytes entries are JSON or text.
    let mlp = Checkpoint::open(fixture("mlp")).unwrap();
    assert!(mlp.structure_json().is_none());
    let config = mlp.value("config.json").unwrap();
    assert_eq!(config["layers"].as_array().unwrap().iter().filter_map(Value::as_i64).collect::<Vec<_>>(), [32, 64, 10]);
    assert_eq!(config["activation"].as_str(), Some("relu"));
    assert_eq!(mlp.user("step"), Some("1000"));
    let dtypes = Checkpoint::open(fixture("dtypes")).unwrap();
    let err = dtypes.value("notes.txt").unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    for needle in ["'notes.txt'", "is not JSON", "line 1, column", "read_bytes()"] {
        assert!(err.to_string().contains(needle), "{needle:?} missing from: {err}");
    }
}

#[test]
fn blobs_structures_and_hostile_values_written_here() {
    let tmp = TempDir::new("values");
    let path = tmp.join("ckpt");
    let deep = "[".repeat(100_000);
    let pickle_like = [0x80u8, 5, 0x95, 0];
    let entries: Vec<(&str, &[u8])> = vec![
        ("blob", b"\x00\x01binary"),
        ("bad_utf8", b"\"\xff\""),
        ("claimed_json", b"{\"a\":"),
        ("deep", deep.as_bytes()),
        ("empty", b""),
        ("json", b" {\"a\": [1, 2.5, \"\\u00e9\"]} "),
        ("pickle_like", &pickle_like),
        ("surrogate", b"\"\\ud800\""),
        ("trailing", b"1 2"),
    ];
    // A Python-style structure that says "claimed_json" is JSON (it is not: Corrupt) and "json" is JSON.
    let structure = r#"{"distckpt_structure":1,"root":{"dict":[["claimed_json",{"object":"claimed_json","encoding":"json"}],["json",{"object":"json","encoding":"json"}]]}}"#;
    let mut s = SaveState::new().unwrap();
    for (name, bytes) in &entries {
        s.add_bytes(name, bytes).unwrap();
    }
    s.set_structure(structure.as_bytes()).unwrap();
    s.save(&path, &SaveOptions { sync: false, ..Default::default() }).unwrap();

    let ckpt = Checkpoint::open(&path).unwrap();
    assert_eq!(ckpt.structure_json().unwrap().to_string(), structure);
    let v = ckpt.value("json").unwrap();
    assert_eq!((v["a"][0].as_i64(), v["a"][1].as_f64(), v["a"][2].as_str()), (Some(1), Some(2.5), Some("é")));
    let want = [
        ("blob", ErrorCode::InvalidArgument, "is not JSON"),
        ("bad_utf8", ErrorCode::InvalidArgument, "invalid UTF-8"),
        ("claimed_json", ErrorCode::Corrupt, "the checkpoint's structure says it holds JSON"),
        ("deep", ErrorCode::InvalidArgument, "deeper than 500 levels"), // FORMAT.md A.4
        ("empty", ErrorCode::InvalidArgument, "expected a value, found the end of the text"),
        ("pickle_like", ErrorCode::Unsupported, "pickle"),
        ("surrogate", ErrorCode::InvalidArgument, "unpaired surrogate"),
        ("trailing", ErrorCode::InvalidArgument, "expected the end of the text"),
    ];
    for (name, code, needle) in want {
        let err = ckpt.value(name).unwrap_err();
        assert_eq!(err.code(), code, "{name}: {err}");
        let msg = err.to_string();
        assert!(
            msg.contains(needle) && msg.contains(&format!("entry '{name}'")) && msg.contains("ckpt"),
            "{name}: {msg}"
        );
    }
    assert_eq!(ckpt.read_bytes("blob").unwrap(), b"\x00\x01binary", "the raw bytes stay readable");

    // A structure that is not JSON is another binding's: no document, and values still parse.
    let path2 = tmp.join("opaque");
    let mut s = SaveState::new().unwrap();
    s.add_bytes("x", b"[1]").unwrap().set_structure(b"\x00not json").unwrap();
    s.save(&path2, &SaveOptions { sync: false, ..Default::default() }).unwrap();
    let ckpt = Checkpoint::open(&path2).unwrap();
    assert!(ckpt.structure_json().is_none());
    assert_eq!(ckpt.value("x").unwrap(), json::parse(b"[1]").unwrap());
}

/// Issue 27: a numpy scalar (`{"step": np.int64(5)}`) is saved by Python as a 0-d tensor, not as JSON; value() reads
/// a 0-d tensor of a bool, integer or float dtype as the number (tests/fixtures/python_scalars, written by
/// tests/fixtures/make_python_scalars.py; Go's Reader.Value gives the same, go/value_test.go).
#[test]
fn zero_d_numeric_tensors_from_python_are_values() {
    let ckpt = Checkpoint::open(fixture("python_scalars")).unwrap();
    assert!(ckpt.entry("step").unwrap().is_tensor(), "np.int64 is stored as a 0-d tensor");
    assert!(ckpt.entry("step").unwrap().shape().is_empty());
    assert_eq!(ckpt.value("step").unwrap(), Value::Number(Number::Int(5)));
    assert_eq!(ckpt.value("step").unwrap().as_i64(), Some(5));
    assert_eq!(ckpt.user("step"), Some("5"), "Python copies it into the user metadata too");
    assert_eq!(ckpt.value("epoch").unwrap().as_i64(), Some(-3));
    assert_eq!(ckpt.value("seen").unwrap(), Value::Number(Number::UInt(u64::MAX)));
    assert_eq!(ckpt.value("lr").unwrap(), Value::Number(Number::Float(0.5)));
    assert_eq!(ckpt.value("loss").unwrap().as_f64(), Some(0.125));
    assert_eq!(ckpt.value("half").unwrap().as_f64(), Some(1.5));
    assert!(ckpt.value("bad").unwrap().as_f64().unwrap().is_nan());
    assert_eq!(ckpt.value("bad").unwrap().to_string(), r#"{"$float":"nan"}"#);
    assert_eq!(ckpt.value("done").unwrap(), Value::Bool(true));
    assert_eq!(ckpt.value("zero_d").unwrap().as_i64(), Some(7), "a 0-d array, not only a numpy scalar");
    // No plain number for a complex scalar, and a tensor of more dimensions is still not a value.
    for name in ["z", "model.w"] {
        let err = ckpt.value(name).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{name}: {err}");
        assert!(err.to_string().contains("is a tensor") && err.to_string().contains(name), "{err}");
    }
    // The numpy scalar of tests/data/python_values, and a 0-d tensor C wrote (no structure at all).
    assert_eq!(python().value("scale").unwrap().as_f64(), Some(0.5));
    assert_eq!(Checkpoint::open(fixture("dtypes")).unwrap().value("scalar.f32").unwrap().as_f64(), Some(3.5));
}
