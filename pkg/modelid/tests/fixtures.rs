//! Table of real pod shapes: every `tests/fixtures/*.yaml` holds one object (a Pod or a workload)
//! and optionally, as a second YAML document, the LeaderWorkerSet the caller would supply. The
//! expected result is a comment at the top:
//!
//! - `# expect: {"uri": "...", "source": ..., ...}`: the exact `webhook identify` report;
//! - `# expect: {"uri": null, "code": "no-downloader", "reasonContains": "..."}`: unresolved, with
//!   the stable reason code (and optionally a fragment of the message);
//! - `# expect: {"error": "missing" | "mismatch"}`: the LeaderWorkerSet group error.
//!
//! A long expectation may span several `# expect:` lines; they are concatenated. To add a case,
//! drop a file in the directory; a file without an expectation fails and prints what it resolves to.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use serde_json::{Value, json};
use warmcache_modelid::{
    GroupError, Outcome, lws_from_object, pod_from_object, resolve_with_group,
};

fn actual(doc: &str) -> Value {
    let docs: Vec<Value> = serde_saphyr::from_multiple(doc).expect("fixture is YAML");
    let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    let pod = pod_from_object(&docs[0]).expect("fixture object gives a pod");
    let group = docs
        .get(1)
        .map(|d| lws_from_object(d).expect("second document is a LeaderWorkerSet"));
    let first = resolve_with_group(&pod, group.as_ref());
    let again = resolve_with_group(&pod, group.as_ref());
    assert_eq!(first, again, "resolution is deterministic");
    match first {
        Ok(o @ Outcome::Resolved(_)) => o.report().unwrap(),
        Ok(Outcome::Unresolved(u)) => {
            json!({"uri": null, "code": u.code(), "reason": u.to_string()})
        }
        Err(GroupError::Missing { .. }) => json!({"error": "missing"}),
        Err(GroupError::Mismatch { .. }) => json!({"error": "mismatch"}),
    }
}

fn expectation(doc: &str) -> Option<Value> {
    let text: String = doc
        .lines()
        .filter_map(|l| l.strip_prefix("# expect:"))
        .collect::<Vec<_>>()
        .join(" ");
    (!text.trim().is_empty()).then(|| serde_json::from_str(&text).expect("expectation is JSON"))
}

fn matches(expect: &Value, got: &Value) -> bool {
    if expect.get("code").is_some() {
        if got.get("code") != expect.get("code") || !got["uri"].is_null() {
            return false;
        }
        if let Some(frag) = expect.get("reasonContains").and_then(Value::as_str) {
            return got["reason"].as_str().is_some_and(|r| r.contains(frag));
        }
        return true;
    }
    expect == got
}

#[test]
fn fixtures_resolve_as_expected() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 60,
        "the table holds the section (g) vectors and 40+ more; found {}",
        files.len()
    );
    let mut failures = Vec::new();
    for f in &files {
        let doc = std::fs::read_to_string(f).unwrap();
        let got = actual(&doc);
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        match expectation(&doc) {
            Some(expect) if matches(&expect, &got) => {}
            Some(expect) => failures.push(format!("{name}\n  expected {expect}\n  got      {got}")),
            None => failures.push(format!("{name}: no `# expect:` line\n  got {got}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} fixtures differ:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}
