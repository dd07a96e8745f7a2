//! docs/catalog.md says what the code does: every refusal line it prints as an example is the
//! exact line the loader produces for that example, every kind of refusal is documented, and
//! every non-durable reason is in its table.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;

use common::{doc, driver};
use warmcache_catalog::{BUILTIN_CATALOG, CatalogFile, LoadError, NonDurable, Refusal};

fn docs() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/catalog.md");
    std::fs::read_to_string(path).unwrap()
}

/// The name of a refusal kind. Exhaustive on purpose: a new kind does not compile until it is
/// added here; add it to [`ALL_KINDS`] too, and the test below requires a documented example.
fn kind(refusal: &Refusal) -> &'static str {
    match refusal {
        Refusal::UnknownField { .. } => "UnknownField",
        Refusal::Missing { .. } => "Missing",
        Refusal::ListNotStated { .. } => "ListNotStated",
        Refusal::WrongType { .. } => "WrongType",
        Refusal::WrongConstant { .. } => "WrongConstant",
        Refusal::NoDrivers => "NoDrivers",
        Refusal::Blank { .. } => "Blank",
        Refusal::SurroundingWhitespace { .. } => "SurroundingWhitespace",
        Refusal::LineBreak { .. } => "LineBreak",
        Refusal::TooLong { .. } => "TooLong",
        Refusal::TooManyItems { .. } => "TooManyItems",
        Refusal::DuplicateDriver { .. } => "DuplicateDriver",
        Refusal::InvalidAccessMode { .. } => "InvalidAccessMode",
        Refusal::DuplicateAccessMode { .. } => "DuplicateAccessMode",
        Refusal::DuplicateMountOption { .. } => "DuplicateMountOption",
        Refusal::MountOptionWithComma { .. } => "MountOptionWithComma",
        Refusal::WritableMountOption { .. } => "WritableMountOption",
        Refusal::ConflictingMountOptions { .. } => "ConflictingMountOptions",
        Refusal::RoxShapeWithoutRo { .. } => "RoxShapeWithoutRo",
        Refusal::RoxWithoutWriter { .. } => "RoxWithoutWriter",
        Refusal::InvalidWriterIdentity { .. } => "InvalidWriterIdentity",
        Refusal::WrongConfigMapName { .. } => "WrongConfigMapName",
        Refusal::MissingData => "MissingData",
        Refusal::EmptyData => "EmptyData",
        Refusal::NotYaml { .. } => "NotYaml",
    }
}

const ALL_KINDS: [&str; 25] = [
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
    "WrongConfigMapName",
    "MissingData",
    "EmptyData",
    "NotYaml",
];

/// A ConfigMap manifest with `data` lines (already indented by two spaces).
fn config_map(name: &str, data: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n{data}")
}

/// (input, the refusal line docs/catalog.md shows for it).
fn examples() -> Vec<(String, &'static str)> {
    let one = |name: &str, modes: &str, options: &str, extra: &str| {
        doc(&driver(name, modes, options, extra))
    };
    let empty = one("csi.weka.io", "[]", "[]", "");
    let options_33: Vec<String> = (0..33).map(|i| format!("o{i}")).collect();
    vec![
        (
            one("csi.weka.io", "[ReadWriteMany]", "[]", "transitions: {}"),
            "drivers[0].transitions: unknown field \"transitions\": the flow is derived from accessModes and never declared; remove it",
        ),
        (
            one("csi.weka.io", "[]", "[]", "mountOptions: [ro]"),
            "drivers[0].mountOptions: unknown field \"mountOptions\": allowed fields here are name, provider, accessModes, readerMountOptions, encryptionSupported, writerIdentity",
        ),
        (
            empty.replace("v1alpha1", "v1beta1"),
            "apiVersion: unsupported apiVersion \"storage.nvcf.nvidia.com/v1beta1\": must be storage.nvcf.nvidia.com/v1alpha1",
        ),
        (
            empty.replace("kind: StorageCapabilityCatalog", "kind: Catalog"),
            "kind: unsupported kind \"Catalog\": must be StorageCapabilityCatalog",
        ),
        (
            empty.replace("kind: StorageCapabilityCatalog\n", ""),
            "kind: required field is missing: kind: StorageCapabilityCatalog",
        ),
        (
            "- a\n".to_owned(),
            "(root): must be a mapping with apiVersion, kind and drivers, found a list",
        ),
        (
            doc("").replace("drivers:\n", "drivers: []\n"),
            "drivers: storage capability catalog has no drivers: list at least one driver",
        ),
        (
            doc("").replace("drivers:\n", ""),
            "drivers: required field is missing: the list of drivers, one per CSI provisioner",
        ),
        (doc(""), "drivers: must be a list of drivers, found null"),
        (
            doc("  - csi.weka.io\n"),
            "drivers[0]: must be a mapping, found a string",
        ),
        (
            doc("  - provider: weka\n    accessModes: []\n    readerMountOptions: []\n"),
            "drivers[0].name: required field is missing: the exact StorageClass provisioner this entry describes",
        ),
        (
            one("\"\"", "[]", "[]", ""),
            "drivers[0].name: blank name: an empty provisioner or provider cannot name a driver",
        ),
        (
            one("\" csi.weka.io\"", "[]", "[]", ""),
            "drivers[0].name: value \" csi.weka.io\" has surrounding whitespace: remove it",
        ),
        (
            one(&"a".repeat(254), "[]", "[]", ""),
            "drivers[0].name: too long: 254 characters, at most 253 allowed",
        ),
        (
            doc(&format!(
                "{}{}",
                driver("x.csi", "[]", "[]", ""),
                driver("x.csi", "[]", "[]", "")
            )),
            "drivers[1].name: catalog lists driver \"x.csi\" twice (first at drivers[0]): keep one entry per provisioner",
        ),
        (
            empty.replace("    accessModes: []\n", ""),
            "drivers[0].accessModes: driver \"csi.weka.io\" has no accessModes: state it as a list, [] when nothing applies",
        ),
        (
            empty.replace("    readerMountOptions: []\n", ""),
            "drivers[0].readerMountOptions: driver \"csi.weka.io\" has no readerMountOptions: state it as a list, [] when nothing applies",
        ),
        (
            one("csi.weka.io", "ReadWriteMany", "[]", ""),
            "drivers[0].accessModes: must be a list, found a string",
        ),
        (
            one("csi.weka.io", "[ReadWriteOncePod]", "[]", ""),
            "drivers[0].accessModes[0]: invalid accessMode \"ReadWriteOncePod\": must be ReadWriteOnce, ReadOnlyMany or ReadWriteMany",
        ),
        (
            one("csi.weka.io", "[ReadWriteMany, ReadWriteMany]", "[]", ""),
            "drivers[0].accessModes[1]: duplicate accessMode \"ReadWriteMany\" (first at index 0)",
        ),
        (
            one("x.csi", "[ReadOnlyMany]", "[ro]", ""),
            "drivers[0].accessModes: driver \"x.csi\" lists ReadOnlyMany with no writer mode: nothing could populate the cache; add the qualified writer mode (ReadWriteOnce or ReadWriteMany) or remove ReadOnlyMany",
        ),
        (
            one("x.csi", "[ReadWriteOnce, ReadOnlyMany]", "[norecovery]", ""),
            "drivers[0].readerMountOptions: driver \"x.csi\" qualifies ReadWriteOnce with ReadOnlyMany, so its readers get derived read-only volumes: it must list readerMountOption \"ro\"",
        ),
        (
            one("csi.weka.io", "[ReadWriteMany]", "[\"\"]", ""),
            "drivers[0].readerMountOptions[0]: blank readerMountOption: a mount option must have a value; remove the empty entry",
        ),
        (
            one("csi.weka.io", "[ReadWriteMany]", "[\"ro \"]", ""),
            "drivers[0].readerMountOptions[0]: value \"ro \" has surrounding whitespace: remove it",
        ),
        (
            one("csi.weka.io", "[ReadWriteMany]", "[\"a\\nb\"]", ""),
            "drivers[0].readerMountOptions[0]: value \"a\\nb\" holds a line break: a mount option is one line",
        ),
        (
            one("csi.weka.io", "[ReadWriteMany]", "[ro, ro]", ""),
            "drivers[0].readerMountOptions[1]: duplicate readerMountOption \"ro\" (first at index 0)",
        ),
        (
            one(
                "x.csi",
                "[ReadWriteOnce, ReadOnlyMany]",
                "[ro, \"norecovery,rw\"]",
                "",
            ),
            "drivers[0].readerMountOptions[1]: readerMountOption \"norecovery,rw\" holds a comma: each entry is one mount option (entries are joined with commas); list each option separately",
        ),
        (
            one("csi.weka.io", "[ReadWriteMany]", "[rw]", ""),
            "drivers[0].readerMountOptions[0]: readerMountOption \"rw\" would make reader volumes writable: readers of a shared cache are read-only; remove it",
        ),
        (
            one(
                "csi.weka.io",
                "[ReadWriteOnce, ReadOnlyMany]",
                "[ro, norecovery, recovery]",
                "",
            ),
            "drivers[0].readerMountOptions[2]: readerMountOptions \"norecovery\" and \"recovery\" conflict: keep the one the qualification run used",
        ),
        (
            one(
                "csi.weka.io",
                "[ReadWriteMany]",
                &format!("[{}]", options_33.join(", ")),
                "",
            ),
            "drivers[0].readerMountOptions: too many items: 33, at most 32 allowed",
        ),
        (
            one("csi.weka.io", "[ReadWriteMany]", "[5]", ""),
            "drivers[0].readerMountOptions[0]: must be a string, found a number",
        ),
        (
            one("csi.weka.io", "[]", "[]", "encryptionSupported: \"yes\""),
            "drivers[0].encryptionSupported: must be a boolean, found a string",
        ),
        (
            one(
                "csi.weka.io",
                "[ReadWriteMany]",
                "[]",
                "writerIdentity: nonroot",
            ),
            "drivers[0].writerIdentity: invalid writerIdentity \"nonroot\": must be fsGroup or root",
        ),
        (
            config_map(
                "storage-capabilities",
                "  storage-provider-capabilities.yaml: |\n    x: 1\n",
            )
            .replace(
                "  storage-provider-capabilities.yaml: |\n    x: 1\n",
                &indent(BUILTIN_CATALOG),
            ),
            "metadata.name: the catalog ConfigMap must be named \"nvcf-storage-capabilities\", found \"storage-capabilities\": the controllers read only that name",
        ),
        (
            config_map("nvcf-storage-capabilities", &indent(BUILTIN_CATALOG))
                .replace("apiVersion: v1\n", "apiVersion: v2\n"),
            "apiVersion: unsupported apiVersion \"v2\": must be v1",
        ),
        (
            config_map("nvcf-storage-capabilities", "  other: x\n"),
            "data[storage-provider-capabilities.yaml]: the ConfigMap has no \"storage-provider-capabilities.yaml\" data: put the catalog document there",
        ),
        (
            config_map(
                "nvcf-storage-capabilities",
                "  storage-provider-capabilities.yaml: \"\"\n",
            ),
            "data[storage-provider-capabilities.yaml]: the ConfigMap's \"storage-provider-capabilities.yaml\" data is empty: put the catalog document there",
        ),
        (
            config_map(
                "nvcf-storage-capabilities",
                "  storage-provider-capabilities.yaml:\n    drivers: []\n",
            ),
            "data[storage-provider-capabilities.yaml]: must be a string holding the catalog document, found a mapping",
        ),
        (
            config_map(
                "nvcf-storage-capabilities",
                "  storage-provider-capabilities.yaml: \"drivers: [\"\n",
            ),
            "data[storage-provider-capabilities.yaml]: parse storage capability catalog: not YAML: unclosed bracket '[' at line 1, column 10",
        ),
    ]
}

/// The catalog as the value of the ConfigMap data key (a literal block).
fn indent(catalog: &str) -> String {
    let mut out = String::from("  storage-provider-capabilities.yaml: |\n");
    for line in catalog.lines() {
        if !line.is_empty() {
            out.push_str("    ");
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

#[test]
fn every_documented_refusal_line_is_what_the_loader_prints() {
    let docs = docs();
    let mut kinds = BTreeSet::new();
    let mut failures = Vec::new();
    for (input, line) in examples() {
        let errors = match CatalogFile::parse(&input) {
            Err(LoadError::Invalid(errors)) => errors,
            other => panic!("{line}: expected field errors, got {other:?}"),
        };
        match errors.iter().find(|e| e.to_string() == line) {
            Some(error) => {
                kinds.insert(kind(&error.refusal));
            }
            None => failures.push(format!(
                "the loader does not print\n  {line}\nbut\n{errors}"
            )),
        }
        if !docs.contains(&format!("`{line}`")) {
            failures.push(format!("docs/catalog.md does not show\n  `{line}`"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let missing: Vec<&str> = ALL_KINDS
        .iter()
        .copied()
        .filter(|k| !kinds.contains(k))
        .collect();
    assert!(
        missing.is_empty(),
        "refusal kinds without a documented example: {missing:?}"
    );
}

/// Exhaustive on purpose: a new non-durable outcome does not compile until it is listed here
/// and in the test below.
fn _every_non_durable_outcome_is_listed(n: &NonDurable) {
    match n {
        NonDurable::CachingDisabled
        | NonDurable::HelmCachingDisabled
        | NonDurable::StorageClassNotFound
        | NonDurable::StorageClassNotRetain { .. }
        | NonDurable::BlankProvisioner
        | NonDurable::NoCatalogEntry { .. }
        | NonDurable::NoQualifiedFlow { .. }
        | NonDurable::EncryptionUnavailable { .. } => {}
    }
}

#[test]
fn every_non_durable_reason_is_in_the_docs_table() {
    let docs = docs();
    for reason in [
        "CachingDisabled",
        "HelmCachingDisabled",
        "StorageClassNotFound",
        "StorageClassNotRetain",
        "StorageClassProvisionerBlank",
        "NoCatalogEntry",
        "NoQualifiedFlow",
        "EncryptionUnavailable",
    ] {
        assert!(
            docs.contains(&format!("| `{reason}` |")),
            "docs/catalog.md has no row for {reason}"
        );
    }
}
