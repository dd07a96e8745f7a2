//! Every catalog vector through the loader and through the packaged JSON Schema: each verdict
//! is the expected one, and the two agree (duplicate driver names are the one documented
//! exception: only the loader can refuse them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Expect, schema, vectors};
use warmcache_catalog::{Catalog, LoadError, parse_yaml};

#[test]
fn every_vector_has_the_expected_verdict_from_both() {
    let schema = schema();
    let mut failures = Vec::new();
    for vector in vectors() {
        let value = match parse_yaml(&vector.yaml) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("{}: not YAML: {e}", vector.name));
                continue;
            }
        };
        let loader = Catalog::from_value(&value);
        let schema_ok = schema.is_valid(&value);
        // The text entry point gives the same verdict as the value entry point.
        assert_eq!(
            Catalog::from_yaml(&vector.yaml).is_ok(),
            loader.is_ok(),
            "{}",
            vector.name
        );
        match (&vector.expect, &loader) {
            (Expect::Accept, Ok(_)) => {
                if !schema_ok {
                    failures.push(format!("{}: loader accepts, schema refuses", vector.name));
                }
            }
            (Expect::Accept, Err(errors)) => {
                failures.push(format!("{}: refused:\n{errors}", vector.name));
            }
            (Expect::Refuse(..) | Expect::RefuseLoaderOnly(..), Ok(_)) => {
                failures.push(format!("{}: accepted", vector.name));
            }
            (Expect::Refuse(path, matches), Err(errors)) => {
                if !errors.has(path, matches) {
                    failures.push(format!(
                        "{}: expected a refusal at {path}, got:\n{errors}",
                        vector.name
                    ));
                }
                if schema_ok {
                    failures.push(format!("{}: loader refuses, schema accepts", vector.name));
                }
            }
            (Expect::RefuseLoaderOnly(path, matches), Err(errors)) => {
                if !errors.has(path, matches) {
                    failures.push(format!(
                        "{}: expected a refusal at {path}, got:\n{errors}",
                        vector.name
                    ));
                }
                if !schema_ok {
                    failures.push(format!(
                        "{}: the schema now refuses it too; make it a plain Refuse vector",
                        vector.name
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_refusal_is_one_line_with_a_path() {
    for vector in vectors() {
        let Err(LoadError::Invalid(errors)) = Catalog::from_yaml(&vector.yaml) else {
            continue;
        };
        assert!(!errors.0.is_empty(), "{}", vector.name);
        for error in &errors {
            let line = error.to_string();
            assert!(
                !line.contains('\n') && !line.contains('\r'),
                "{}: {line:?}",
                vector.name
            );
            let (path, reason) = line.split_once(": ").expect("path: reason");
            assert_eq!(path, error.path.as_str());
            assert!(!path.is_empty() && !reason.is_empty(), "{line}");
        }
    }
}

#[test]
fn all_refusals_of_a_document_are_reported_in_order() {
    let yaml = common::doc(&format!(
        "{}{}",
        common::driver(
            "\" \"",
            "[ReadOnlyMany, Bogus]",
            "[ro, rw]",
            "transitions: {}"
        ),
        common::driver(
            "b.csi",
            "[ReadWriteOnce, ReadOnlyMany]",
            "[nouuid]",
            "writerIdentity: x"
        )
    ))
    .replace("kind: StorageCapabilityCatalog", "kind: Other");
    let Err(LoadError::Invalid(errors)) = Catalog::from_yaml(&yaml) else {
        panic!("refused");
    };
    let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "kind",
            "drivers[0].transitions",
            "drivers[0].name",
            "drivers[0].accessModes[1]",
            "drivers[0].readerMountOptions[1]",
            "drivers[0].accessModes",
            "drivers[1].writerIdentity",
            "drivers[1].readerMountOptions",
        ],
        "{lines:#?}"
    );
    // A driver without a usable name is named by its path in messages.
    assert!(
        lines[5].contains("driver \"drivers[0]\" lists ReadOnlyMany with no writer mode"),
        "{}",
        lines[5]
    );
}

#[test]
fn transitions_refusal_explains_that_flows_are_derived() {
    let yaml = common::doc(&common::driver(
        "csi.weka.io",
        "[ReadWriteMany]",
        "[]",
        "transitions:\n  helmModelCache: rwxReadOnly",
    ));
    let err = Catalog::from_yaml(&yaml).unwrap_err();
    let text = err.field_errors().expect("invalid").to_string();
    assert_eq!(
        text,
        "drivers[0].transitions: unknown field \"transitions\": the flow is derived from accessModes and never declared; remove it"
    );
}

#[test]
fn yaml_errors_are_not_field_errors() {
    for text in [
        "drivers: [\n",
        "a: b: c\n",
        "a: 1\na: 2\n",
        "\"unterminated\n",
    ] {
        match Catalog::from_yaml(text) {
            Err(LoadError::Yaml(e)) => {
                assert!(!e.message.is_empty());
                assert!(!e.to_string().contains('\n'), "{e}");
                assert!(
                    e.to_string()
                        .starts_with("parse storage capability catalog"),
                    "{e}"
                );
            }
            other => panic!("{text:?}: {other:?}"),
        }
    }
}

#[test]
fn a_second_document_is_a_yaml_error_that_says_so() {
    let text = format!(
        "{}---\n{}",
        common::doc(&common::driver("a.csi", "[]", "[]", "")),
        "a: 1\n"
    );
    let Err(LoadError::Yaml(e)) = Catalog::from_yaml(&text) else {
        panic!("a file with two documents must be refused");
    };
    assert!(
        e.message
            .contains("multiple YAML documents detected (a catalog file holds exactly one)"),
        "{e}"
    );
}

#[test]
fn accepted_catalog_keeps_document_order_and_values() {
    let yaml = common::doc(&format!(
        "{}{}",
        common::driver(
            "b.csi",
            "[ReadOnlyMany, ReadWriteOnce]",
            "[nouuid, ro]",
            "encryptionSupported: true"
        ),
        common::driver("a.csi", "[ReadWriteMany]", "[]", "writerIdentity: root")
    ));
    let catalog = Catalog::from_yaml(&yaml).unwrap();
    let names: Vec<&str> = catalog.drivers().iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["b.csi", "a.csi"]);
    let b = catalog.driver("b.csi").unwrap();
    assert_eq!(b.reader_mount_options, ["nouuid", "ro"]);
    assert!(b.encryption_supported);
    assert_eq!(b.writer_identity, None);
    let a = catalog.driver("a.csi").unwrap();
    assert!(!a.encryption_supported);
    assert_eq!(
        a.writer_identity,
        Some(warmcache_catalog::WriterIdentity::Root)
    );
    assert!(catalog.driver("A.csi").is_none(), "lookup is exact");
    assert!(catalog.driver("b.csi ").is_none(), "lookup is exact");
}

#[test]
fn the_schema_is_a_valid_2020_12_schema_with_the_documented_id() {
    let schema: serde_json::Value = serde_json::from_str(warmcache_catalog::SCHEMA).unwrap();
    assert!(jsonschema::meta::is_valid(&schema));
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    assert_eq!(schema["$id"], warmcache_catalog::SCHEMA_ID);
    let description = schema["description"].as_str().unwrap();
    assert!(
        description.contains("driver names must be unique"),
        "{description}"
    );
    // The negating pairs the schema lists are the loader's.
    let text = warmcache_catalog::SCHEMA;
    for (a, b) in warmcache_catalog::NEGATING_MOUNT_OPTIONS {
        assert!(
            text.contains(&format!("{{ \"contains\": {{ \"const\": \"{a}\" }} }}, {{ \"contains\": {{ \"const\": \"{b}\" }} }}")),
            "{a}/{b}"
        );
    }
}
