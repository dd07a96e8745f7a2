//! Every vector of reference section 10 (and our boundary and ratchet cases) through the
//! validator: admitted vectors yield no refusal, refused ones yield the expected path and reason.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{Value, json};
use warmcache_api_kvcache::v1alpha1::KVCacheBackend;
use warmcache_kvcache::vectors::{self, Vector, Verdict};
use warmcache_kvcache::{FieldError, FieldErrorKind, ValidationContext, from_value, validate};

fn decode(value: &Value) -> Result<KVCacheBackend, Vec<FieldError>> {
    from_value(value.clone())
}

/// The refusals of one vector: shape problems of `new`, else the validator's list.
fn verdict(vector: &Vector, ctx: &ValidationContext) -> Vec<FieldError> {
    let old = vector.old.as_ref().map(|o| {
        decode(o).unwrap_or_else(|e| panic!("{} {}: old object: {e:?}", vector.id, vector.what))
    });
    match decode(&vector.new) {
        Err(shape) => shape,
        Ok(new) => validate(&new, old.as_ref(), ctx),
    }
}

fn check(vector: &Vector) -> Result<(), String> {
    let errors = verdict(vector, &ValidationContext::default());
    let shown = || {
        errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n  ")
    };
    match &vector.verdict {
        Verdict::Admitted if errors.is_empty() => Ok(()),
        Verdict::Admitted => Err(format!(
            "{} {}: refused:\n  {}",
            vector.id,
            vector.what,
            shown()
        )),
        Verdict::Refused { path, reason, .. } => {
            if errors
                .iter()
                .any(|e| e.path == *path && e.reason.contains(reason))
            {
                Ok(())
            } else {
                Err(format!(
                    "{} {}: expected {path}: ...{reason}..., got:\n  {}",
                    vector.id,
                    vector.what,
                    shown()
                ))
            }
        }
    }
}

fn run(vectors: Vec<Vector>) {
    let failures: Vec<String> = vectors.iter().filter_map(|v| check(v).err()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn valid_vectors_v1_to_v14_are_admitted() {
    let valid = vectors::valid();
    let ids: Vec<&str> = valid.iter().map(|v| v.id).collect();
    for n in 1..=14 {
        assert!(ids.contains(&format!("V{n}").as_str()), "V{n} missing");
    }
    run(valid);
}

#[test]
fn invalid_vectors_x1_to_x33_are_refused_with_their_path() {
    let invalid = vectors::invalid();
    let ids: Vec<&str> = invalid.iter().map(|v| v.id).collect();
    for n in 1..=33 {
        assert!(ids.contains(&format!("X{n}").as_str()), "X{n} missing");
    }
    run(invalid);
}

#[test]
fn boundary_vectors() {
    run(vectors::boundaries());
}

#[test]
fn ratchet_vectors() {
    run(vectors::ratchets());
}

/// X1-X33 one by one, so that a failure names the vector in the test list too.
macro_rules! vector_tests {
    ($($name:ident => $id:literal),* $(,)?) => {$(
        #[test]
        fn $name() {
            let all: Vec<Vector> = vectors::all().into_iter().filter(|v| v.id == $id).collect();
            assert!(!all.is_empty(), "no vector {}", $id);
            run(all);
        }
    )*};
}

vector_tests! {
    v01 => "V1", v02 => "V2", v03 => "V3", v04 => "V4", v05 => "V5", v06 => "V6", v07 => "V7",
    v08 => "V8", v09 => "V9", v10 => "V10", v11 => "V11", v12 => "V12", v13 => "V13", v14 => "V14",
    x01 => "X1", x02 => "X2", x03 => "X3", x04 => "X4", x05 => "X5", x06 => "X6", x07 => "X7",
    x08 => "X8", x09 => "X9", x10 => "X10", x11 => "X11", x12 => "X12", x13 => "X13", x14 => "X14",
    x15 => "X15", x16 => "X16", x17 => "X17", x18 => "X18", x19 => "X19", x20 => "X20", x21 => "X21",
    x22 => "X22", x23 => "X23", x24 => "X24", x25 => "X25", x26 => "X26", x27 => "X27", x28 => "X28",
    x29 => "X29", x30 => "X30", x31 => "X31", x32 => "X32", x33 => "X33",
}

#[test]
fn x27_reports_the_move_and_the_tier_removal() {
    let vector = vectors::invalid()
        .into_iter()
        .find(|v| v.id == "X27")
        .unwrap();
    let errors = verdict(&vector, &ValidationContext::default());
    let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
    assert!(
        paths.contains(&"spec.connection.managed.members[0]"),
        "{errors:?}"
    );
    assert!(
        paths.contains(&"spec.connection.managed.members[0].localDisks"),
        "{errors:?}"
    );
}

#[test]
fn x28_reports_one_move_naming_position_1() {
    let vector = vectors::invalid()
        .into_iter()
        .find(|v| v.id == "X28")
        .unwrap();
    let errors = verdict(&vector, &ValidationContext::default());
    let moves: Vec<&FieldError> = errors
        .iter()
        .filter(|e| e.reason.contains("now carries the group"))
        .collect();
    assert_eq!(moves.len(), 1, "{errors:?}");
    assert!(moves[0].reason.contains("position 1"));
}

#[test]
fn path_rules_report_only_the_first_problem() {
    // Leading whitespace AND relative AND '..': only the whitespace rule is reported.
    let new = vectors::with(vectors::v2(), |o| {
        vectors::tier0(o)["path"] = json!(" var/../x")
    });
    let errors = validate(&decode(&new).unwrap(), None, &ValidationContext::default());
    let on_path: Vec<&FieldError> = errors
        .iter()
        .filter(|e| e.path.ends_with(".path"))
        .collect();
    assert_eq!(on_path.len(), 1, "{errors:?}");
    assert!(on_path[0].reason.contains("whitespace"));
}

#[test]
fn kinds_follow_the_reference() {
    let kind_of = |id: &str| {
        let vector = vectors::all().into_iter().find(|v| v.id == id).unwrap();
        let Verdict::Refused { path, .. } = vector.verdict else {
            panic!("{id} is admitted")
        };
        verdict(&vector, &ValidationContext::default())
            .into_iter()
            .find(|e| e.path == path)
            .unwrap()
            .kind
    };
    assert_eq!(kind_of("X10"), FieldErrorKind::Required);
    assert_eq!(kind_of("X11"), FieldErrorKind::Forbidden);
    assert_eq!(kind_of("X12"), FieldErrorKind::Forbidden);
    assert_eq!(kind_of("X13"), FieldErrorKind::Required);
    assert_eq!(kind_of("X18"), FieldErrorKind::Forbidden);
    assert_eq!(kind_of("X19"), FieldErrorKind::Forbidden);
    assert_eq!(kind_of("X22"), FieldErrorKind::Forbidden);
    assert_eq!(kind_of("X24"), FieldErrorKind::Forbidden);
    assert_eq!(kind_of("X30"), FieldErrorKind::Forbidden);
}

#[test]
fn the_default_image_setting_decides_for_a_backend_without_image() {
    let new = vectors::with(vectors::v2(), |o| {
        o["spec"].as_object_mut().unwrap().remove("image");
    });
    let backend = decode(&new).unwrap();
    assert!(!validate(&backend, None, &ValidationContext::default()).is_empty());
    let blank = ValidationContext {
        default_image: Some("  ".into()),
    };
    assert!(!validate(&backend, None, &blank).is_empty());
    let setting = ValidationContext {
        default_image: Some(vectors::IMAGE.into()),
    };
    assert_eq!(validate(&backend, None, &setting), vec![]);
}

#[test]
fn finalizer_removal_of_a_deleting_object_that_fails_today_is_admitted() {
    // Stored under older rules: every webhook-only rule broken at once.
    let bad = vectors::with(vectors::v2(), |o| {
        o["metadata"]["name"] = json!("k".repeat(60));
        o["metadata"]["finalizers"] = json!(["worker.gpustack.ai/kvcache"]);
        o["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        vectors::tier0(o)["capacity"] = json!("1Mi");
        vectors::tier0(o)["keyLimit"] = json!(3);
        vectors::members(o)[0]["capacityPerMember"] = json!("1Mi");
        vectors::managed(o)["leader"]["extraArgs"] = json!(["-enable_offload=false", "nodash"]);
        vectors::members(o)[0]["extraEnv"] = json!([{"name": "MOONCAKE_MASTER", "value": "x"}]);
        o["spec"].as_object_mut().unwrap().remove("image");
    });
    let old = decode(&bad).unwrap();
    assert!(
        validate(&old, None, &ValidationContext::default()).len() >= 6,
        "the stored object must fail today's rules for this test to mean anything"
    );
    let mut new = old.clone();
    new.metadata.finalizers = None;
    assert_eq!(
        validate(&new, Some(&old), &ValidationContext::default()),
        vec![]
    );
}

#[test]
fn refusals_are_deterministic_and_name_a_field_path() {
    for vector in vectors::all() {
        let first = verdict(&vector, &ValidationContext::default());
        let second = verdict(&vector, &ValidationContext::default());
        assert_eq!(first, second, "{}", vector.id);
        for error in &first {
            assert!(
                error.path.starts_with("spec") || error.path.starts_with("metadata"),
                "{}: {error}",
                vector.id
            );
            assert!(!error.reason.is_empty());
        }
    }
}
