//! Property tests: on generated catalogs (valid and broken in every way the format can be), the
//! loader and the packaged schema agree. Any catalog the loader accepts, the schema accepts; any
//! catalog the schema accepts, the loader accepts unless its only fault is a duplicate driver
//! name (which a schema cannot express). And no input makes the loader panic.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::LazyLock;

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use warmcache_catalog::{Catalog, CatalogFile, Refusal};

static SCHEMA: LazyLock<jsonschema::Validator> = LazyLock::new(common::schema);

/// `None` = the key is absent. Mostly one of `valid`, sometimes one of `invalid`.
fn field(valid: Vec<Option<Value>>, invalid: Vec<Option<Value>>) -> BoxedStrategy<Option<Value>> {
    prop_oneof![
        10 => proptest::sample::select(valid),
        1 => proptest::sample::select(invalid),
    ]
    .boxed()
}

fn name() -> BoxedStrategy<Option<Value>> {
    field(
        vec![
            Some(json!("a.csi")),
            Some(json!("b.csi")),
            Some(json!("c.csi")),
            Some(json!("nvmesh-csi.excelero.com")),
            Some(json!("a\u{85}")),
        ],
        vec![
            Some(json!("")),
            Some(json!("  ")),
            Some(json!(" a.csi")),
            Some(json!("a.csi\u{feff}")),
            Some(json!("a\u{2028}b")),
            Some(json!("x".repeat(254))),
            Some(json!(5)),
            None,
        ],
    )
}

fn provider() -> BoxedStrategy<Option<Value>> {
    field(
        vec![Some(json!("nvmesh")), Some(json!("weka"))],
        vec![
            Some(json!("")),
            Some(json!("weka\n")),
            Some(json!(null)),
            None,
        ],
    )
}

fn mode() -> BoxedStrategy<Value> {
    prop_oneof![
        12 => proptest::sample::select(vec![
            json!("ReadWriteOnce"),
            json!("ReadOnlyMany"),
            json!("ReadWriteMany"),
        ]),
        1 => proptest::sample::select(vec![json!("ReadWriteOncePod"), json!("readwritemany"), json!(1)]),
    ]
    .boxed()
}

fn modes() -> BoxedStrategy<Option<Value>> {
    prop_oneof![
        12 => proptest::collection::vec(mode(), 0..4).prop_map(|v| Some(Value::Array(v))),
        1 => proptest::sample::select(vec![None, Some(Value::Null), Some(json!("ReadWriteMany"))]),
    ]
    .boxed()
}

fn option() -> BoxedStrategy<Value> {
    prop_oneof![
        10 => proptest::sample::select(vec![
            json!("ro"),
            json!("ro"),
            json!("rw"),
            json!("noro"),
            json!("ro=0"),
            json!("norecovery,rw"),
            json!("norecovery"),
            json!("recovery"),
            json!("uuid"),
            json!("nouuid"),
            json!("noatime"),
            json!("context=a b"),
            json!("x\u{85}"),
        ]),
        1 => proptest::sample::select(vec![
            json!(""),
            json!(" ro"),
            json!("ro\t"),
            json!("a\nb"),
            json!("a\rb"),
            json!("\u{feff}x"),
            json!("\u{a0}"),
            json!("o".repeat(257)),
            json!(7),
            json!(null),
        ]),
    ]
    .boxed()
}

fn options() -> BoxedStrategy<Option<Value>> {
    prop_oneof![
        16 => proptest::collection::vec(option(), 0..4).prop_map(|v| Some(Value::Array(v))),
        1 => (0usize..3).prop_map(|extra| {
            Some(Value::Array((0..31 + extra).map(|i| json!(format!("o{i}"))).collect()))
        }),
        1 => proptest::sample::select(vec![None, Some(Value::Null)]),
    ]
    .boxed()
}

fn driver() -> BoxedStrategy<Value> {
    let fields = (
        name(),
        provider(),
        modes(),
        options(),
        field(
            vec![None, Some(json!(true)), Some(json!(false))],
            vec![Some(json!("true")), Some(json!(null))],
        ),
        field(
            vec![None, Some(json!("fsGroup")), Some(json!("root"))],
            vec![Some(json!("Root")), Some(json!(null))],
        ),
        field(
            vec![None],
            vec![Some(json!({"regularModelCache": "rwxReadOnly"}))],
        ),
    );
    prop_oneof![
        30 => fields.prop_map(|(name, provider, modes, options, enc, writer, transitions)| {
            let mut m = Map::new();
            for (key, value) in [
                ("name", name),
                ("provider", provider),
                ("accessModes", modes),
                ("readerMountOptions", options),
                ("encryptionSupported", enc),
                ("writerIdentity", writer),
                ("transitions", transitions),
            ] {
                if let Some(value) = value {
                    m.insert(key.to_owned(), value);
                }
            }
            Value::Object(m)
        }),
        1 => Just(json!("csi.weka.io")),
    ]
    .boxed()
}

/// A driver that satisfies every rule but name uniqueness (names come from a small pool, so
/// duplicates happen).
fn coherent_driver() -> BoxedStrategy<Value> {
    (
        proptest::sample::select(vec!["a.csi", "b.csi", "c.csi", "d.csi", "e.csi", "f.csi"]),
        proptest::sample::select(vec!["nvmesh", "weka", "ociFss"]),
        proptest::sample::subsequence(
            vec!["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany"],
            0..=3,
        ),
        proptest::sample::subsequence(
            vec!["norecovery", "nouuid", "noatime", "context=a b", "x\u{85}"],
            0..=5,
        ),
        any::<bool>(),
        proptest::sample::select(vec![None, Some("fsGroup"), Some("root")]),
        any::<bool>(),
    )
        .prop_map(
            |(name, provider, mut modes, mut options, encrypted, writer, reverse)| {
                if modes == ["ReadOnlyMany"] {
                    modes.push("ReadWriteMany");
                }
                options.insert(0, "ro");
                if reverse {
                    modes.reverse();
                    options.reverse();
                }
                let mut d = json!({
                    "name": name,
                    "provider": provider,
                    "accessModes": modes,
                    "readerMountOptions": options,
                    "encryptionSupported": encrypted,
                });
                if let Some(writer) = writer {
                    d["writerIdentity"] = json!(writer);
                }
                d
            },
        )
        .boxed()
}

fn catalog() -> BoxedStrategy<Value> {
    prop_oneof![
        1 => proptest::collection::vec(coherent_driver(), 1..4).prop_map(|drivers| json!({
            "apiVersion": "storage.nvcf.nvidia.com/v1alpha1",
            "kind": "StorageCapabilityCatalog",
            "drivers": drivers,
        })),
        1 => any_catalog(),
    ]
    .boxed()
}

fn any_catalog() -> BoxedStrategy<Value> {
    (
        field(
            vec![Some(json!("storage.nvcf.nvidia.com/v1alpha1"))],
            vec![Some(json!("v1")), None],
        ),
        field(
            vec![Some(json!("StorageCapabilityCatalog"))],
            vec![Some(json!("ConfigMap")), None],
        ),
        prop_oneof![
            20 => proptest::collection::vec(driver(), 0..4).prop_map(|d| Some(Value::Array(d))),
            1 => proptest::sample::select(vec![None, Some(Value::Null)]),
        ],
        field(vec![None], vec![Some(json!({"name": "x"}))]),
    )
        .prop_map(|(api_version, kind, drivers, metadata)| {
            let mut m = Map::new();
            for (key, value) in [
                ("apiVersion", api_version),
                ("kind", kind),
                ("drivers", drivers),
                ("metadata", metadata),
            ] {
                if let Some(value) = value {
                    m.insert(key.to_owned(), value);
                }
            }
            Value::Object(m)
        })
        .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn loader_and_schema_agree(value in catalog()) {
        let loader = Catalog::from_value(&value);
        let schema_ok = SCHEMA.is_valid(&value);
        match loader {
            Ok(_) => prop_assert!(schema_ok, "the loader accepts but the schema refuses: {value}"),
            Err(errors) => {
                prop_assert!(!errors.0.is_empty());
                let only_duplicates = errors
                    .iter()
                    .all(|e| matches!(e.refusal, Refusal::DuplicateDriver { .. }));
                prop_assert!(
                    !schema_ok || only_duplicates,
                    "the schema accepts but the loader refuses: {value}\n{errors}"
                );
            }
        }
    }

    #[test]
    fn yaml_text_never_panics(text in "(?s).{0,200}") {
        let _ = Catalog::from_yaml(&text);
        let _ = CatalogFile::parse(&text);
    }

    #[test]
    fn yaml_shaped_text_never_panics(
        lines in proptest::collection::vec(
            proptest::sample::select(vec![
                "apiVersion: storage.nvcf.nvidia.com/v1alpha1",
                "kind: StorageCapabilityCatalog",
                "kind: ConfigMap",
                "drivers:",
                "  - name: a",
                "    provider: p",
                "    accessModes: [ReadWriteOnce, ReadOnlyMany]",
                "    readerMountOptions: [ro]",
                "    readerMountOptions: &x [ro]",
                "    accessModes: *x",
                "data:",
                "  storage-provider-capabilities.yaml: |",
                "    drivers: []",
                "metadata: {name: nvcf-storage-capabilities}",
                "- [",
                "  ? complex",
                "<<: {a: 1}",
                "!!binary aGVsbG8=",
            ]),
            0..16,
        )
    ) {
        let text = lines.join("\n");
        let _ = Catalog::from_yaml(&text);
        let _ = CatalogFile::parse(&text);
    }
}

/// The generator is worth something only if it produces valid catalogs (for "the loader
/// accepts => the schema accepts") and every kind of refusal.
#[test]
fn generator_reaches_valid_catalogs_and_every_refusal_kind() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = catalog();
    let mut accepted = 0;
    let mut duplicate_only = 0;
    let mut kinds = std::collections::BTreeSet::new();
    for _ in 0..4000 {
        let value = strategy.new_tree(&mut runner).unwrap().current();
        match Catalog::from_value(&value) {
            Ok(_) => accepted += 1,
            Err(errors) => {
                if errors
                    .iter()
                    .all(|e| matches!(e.refusal, Refusal::DuplicateDriver { .. }))
                {
                    duplicate_only += 1;
                }
                for e in &errors {
                    let kind = format!("{:?}", e.refusal);
                    kinds.insert(
                        kind.split([' ', '{', '('])
                            .next()
                            .unwrap_or_default()
                            .to_owned(),
                    );
                }
            }
        }
    }
    assert!(
        accepted > 1000,
        "only {accepted} accepted catalogs generated"
    );
    assert!(duplicate_only > 0, "no duplicate-only catalog generated");
    for kind in [
        "UnknownField",
        "Missing",
        "ListNotStated",
        "WrongType",
        "WrongConstant",
        "NoDrivers",
        "Blank",
        "SurroundingWhitespace",
        "LineBreak",
        "TooLong",
        "TooManyItems",
        "DuplicateDriver",
        "InvalidAccessMode",
        "DuplicateAccessMode",
        "DuplicateMountOption",
        "MountOptionWithComma",
        "WritableMountOption",
        "ConflictingMountOptions",
        "RoxShapeWithoutRo",
        "RoxWithoutWriter",
        "InvalidWriterIdentity",
    ] {
        assert!(
            kinds.contains(kind),
            "the generator never produces {kind}: {kinds:?}"
        );
    }
}
