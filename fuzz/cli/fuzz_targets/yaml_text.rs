//! Fuzzes the shared input convention: any bytes, read as YAML the way every command reads it,
//! must give documents or a bounded error without panicking; every string found (keys and
//! values), shown in a message, must be bounded and free of invisible characters, and escaping
//! must keep distinct strings distinct.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use warmcache_cli::{input, text, yaml};

fn strings<'v>(v: &'v Value, out: &mut Vec<&'v str>) {
    match v {
        Value::String(s) => out.push(s),
        Value::Array(items) => items.iter().for_each(|i| strings(i, out)),
        Value::Object(map) => {
            for (k, v) in map {
                out.push(k);
                strings(v, out);
            }
        }
        _ => {}
    }
}

fn check_shown(s: &str) {
    let shown = text::shown(s);
    assert!(!shown.chars().any(text::is_invisible), "{shown:?}");
    // 64 kept characters, each escaped to at most 8 bytes (\u{xxxxx}), quotes and the note.
    assert!(shown.len() <= 120 * 10 + 40, "{}", shown.len());
    let path = text::path(s);
    assert!(!path.chars().any(text::is_invisible), "{path:?}");
}

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = input::read_bounded(data, "fuzz input", input::MAX_INPUT_BYTES) else {
        return;
    };
    match yaml::documents(&raw) {
        Ok(docs) => {
            let mut found = Vec::new();
            for doc in &docs {
                assert!(!doc.is_null());
                strings(doc, &mut found);
            }
            for s in found {
                check_shown(s);
            }
        }
        Err(e) => assert!(e.message.len() <= 2048 + 40, "{}", e.message.len()),
    }
    check_shown(&raw);
    if let Some((a, b)) = raw.split_once('\u{0}') {
        if a != b {
            assert_ne!(text::escape(a), text::escape(b));
        }
    }
});
