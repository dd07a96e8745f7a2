//! Table of pods shaped like the output of public charts: every `tests/fixtures/*.yaml` holds one
//! object (a Pod or a workload; optionally a LeaderWorkerSet as the second document) with its
//! context and expected verdict in comments at the top:
//!
//! - `# case: {"storage": "weka"|"nvmesh"|"lustre"|"absent", "readerMode": "hostPath",
//!   "namespaceLabels": {...}}` (all optional; default: weka, pvc readers, no labels);
//! - `# expect: {...}`: the keys of the verdict summary (`common::summary`) that must match:
//!   `{"verdict": "skip", "reason": "landing-shared", "message": "*PROMETHEUS*"}`, or
//!   `{"verdict": "rewrite", "layout": "hub", "mainEnv": {"HF_HUB_OFFLINE": "1"}, ...}`. A string
//!   ending in `*` matches by prefix, one starting with `*` by suffix, one
//!   with both by substring; a `null` value requires
//!   the key to be absent or null.
//!
//! A long expectation may span several `# expect:` lines. A file without one fails and prints
//! what it gives. Every fixture is also admitted a second time to check idempotence.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;
use warmcache_modelid::{lws_from_object, pod_from_object};
use warmcache_modelvolume::{BindingAction, Verdict};

fn comment_json(doc: &str, prefix: &str) -> Option<Value> {
    let text: String = doc
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .collect::<Vec<_>>()
        .join(" ");
    (!text.trim().is_empty()).then(|| serde_json::from_str(&text).expect("comment is JSON"))
}

#[test]
fn fixtures_admit_as_expected() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 20, "found {} fixtures", files.len());
    let mut failures = Vec::new();
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let doc = std::fs::read_to_string(f).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&doc).expect("fixture is YAML");
        let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
        let pod = pod_from_object(&docs[0]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let lws = docs
            .get(1)
            .map(|d| lws_from_object(d).expect("second document is a LeaderWorkerSet"));
        let case = comment_json(&doc, "# case:").unwrap_or(Value::Null);
        let storage = case["storage"].as_str().unwrap_or("weka");
        let options = common::options(case["readerMode"].as_str());
        let labels: BTreeMap<String, String> = case["namespaceLabels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        let verdict = common::run(&pod, &labels, lws.as_ref(), &options, storage, None);
        let got = common::summary(&verdict);
        match comment_json(&doc, "# expect:") {
            Some(expect) if common::contains(&expect, &got) => {}
            Some(expect) => failures.push(format!(
                "{name}\n  expected {expect}\n  got      {}",
                serde_json::to_string_pretty(&got).unwrap()
            )),
            None => failures.push(format!(
                "{name}: no `# expect:` line\n  got {}",
                serde_json::to_string_pretty(&got).unwrap()
            )),
        }
        if let Verdict::Rewrite(r) = &verdict
            && let Err(e) = common::valid(&r.pod)
        {
            failures.push(format!("{name}: the rewritten pod is not valid: {e}"));
        }
        // Idempotence: admitting what was admitted changes nothing.
        let admitted = verdict.admitted(&pod);
        let binding = match &verdict {
            Verdict::Rewrite(r) => match &r.binding {
                BindingAction::Create(b) => Some(common::stored(b, None, None)),
                BindingAction::Join { .. } => None,
            },
            _ => None,
        };
        let again = common::run(
            &admitted,
            &labels,
            lws.as_ref(),
            &options,
            storage,
            binding.as_ref(),
        );
        if again.admitted(&admitted) != admitted {
            failures.push(format!(
                "{name}: a second admission changed the pod ({:?})",
                common::summary(&again)
            ));
        }
        if let Verdict::Rewrite(_) = verdict
            && !matches!(again, Verdict::Unchanged(_))
        {
            failures.push(format!(
                "{name}: a rewritten pod is not unchanged on re-admission"
            ));
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
