//! The shipped catalog: the compiled-in copy is the file, byte for byte; its content is the
//! qualified set; the ConfigMap manifest holds exactly that file; and what it gives each
//! provisioner and workflow.
//!
//! Regenerate the ConfigMap manifest (and its chart copy) after editing the catalog file:
//! `cargo xtask gen`; `cargo xtask gen --check` in hack/test.sh fails while either is stale.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use warmcache_api_modelcache::v2beta1::{AccessMode, Workflow};
use warmcache_catalog::{
    BUILTIN_CATALOG, BUILTIN_CATALOG_PATH, CONFIG_MAP_MANIFEST_PATH, CatalogFile, CatalogSnapshot,
    FileForm, SCHEMA, SCHEMA_PATH, WriterIdentity, explain, render_config_map,
};

fn repo_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

#[test]
fn compiled_copy_is_the_file_byte_for_byte() {
    let on_disk = std::fs::read(repo_file(BUILTIN_CATALOG_PATH)).unwrap();
    assert_eq!(BUILTIN_CATALOG.as_bytes(), on_disk.as_slice());
    let schema_on_disk = std::fs::read(repo_file(SCHEMA_PATH)).unwrap();
    assert_eq!(SCHEMA.as_bytes(), schema_on_disk.as_slice());
}

#[test]
fn config_map_manifest_holds_the_file_byte_for_byte() {
    let path = repo_file(CONFIG_MAP_MANIFEST_PATH);
    let expected = render_config_map(BUILTIN_CATALOG);
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        actual == expected,
        "{CONFIG_MAP_MANIFEST_PATH} is stale; regenerate it with `cargo xtask gen`"
    );
    let file = CatalogFile::parse(&actual).unwrap();
    assert_eq!(file.form, FileForm::ConfigMap);
    let builtin = CatalogSnapshot::builtin().unwrap();
    assert_eq!(file.snapshot.catalog(), builtin.catalog());
    assert_eq!(file.snapshot.revision(), builtin.revision());
}

#[test]
fn shipped_content_is_the_qualified_set() {
    use AccessMode::{ReadOnlyMany as Rox, ReadWriteMany as Rwx, ReadWriteOnce as Rwo};
    let snapshot = CatalogSnapshot::builtin().unwrap();
    assert!(snapshot.is_builtin());
    type Row<'a> = (&'a str, &'a str, Vec<AccessMode>, Vec<&'a str>, bool);
    let rows: Vec<Row<'_>> = snapshot
        .catalog()
        .drivers()
        .iter()
        .map(|d| {
            assert_eq!(d.writer_identity, None::<WriterIdentity>, "{}", d.name);
            (
                d.name.as_str(),
                d.provider.as_str(),
                d.access_modes.clone(),
                d.reader_mount_options.iter().map(String::as_str).collect(),
                d.encryption_supported,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (
                "nvmesh-csi.excelero.com",
                "nvmesh",
                vec![Rwo, Rox],
                vec!["ro", "norecovery", "nouuid"],
                true
            ),
            ("csi.weka.io", "weka", vec![Rwx], vec![], false),
            (
                "fss.csi.oraclecloud.com",
                "ociFss",
                vec![Rwx],
                vec![],
                false
            ),
            (
                "csi.trident.netapp.io",
                "netappTrident",
                vec![Rwx],
                vec![],
                false
            ),
            (
                "lustre.csi.oraclecloud.com",
                "ociLustre",
                vec![],
                vec![],
                false
            ),
        ]
    );
}

#[test]
fn shipped_flows_per_provisioner_and_workflow() {
    let snapshot = CatalogSnapshot::builtin().unwrap();
    let rows = [
        ("nvmesh-csi.excelero.com", "roxReadOnly", "roxReadOnly"),
        ("csi.weka.io", "rwxReadOnly", "rwxReadOnly"),
        ("fss.csi.oraclecloud.com", "rwxReadOnly", "rwxReadOnly"),
        ("csi.trident.netapp.io", "rwxReadOnly", "rwxReadOnly"),
        ("lustre.csi.oraclecloud.com", "disabled", "disabled"),
        ("ebs.csi.aws.com", "disabled", "disabled"),
    ];
    for (provisioner, regular, helm) in rows {
        let r = explain(&snapshot, provisioner, Workflow::RegularModelCache);
        let h = explain(&snapshot, provisioner, Workflow::HelmModelCache);
        assert_eq!(
            (r.transition, h.transition),
            (regular, helm),
            "{provisioner}"
        );
        assert_eq!(r.catalog_revision, snapshot.revision());
        assert_eq!(r.reason.is_some(), regular == "disabled", "{provisioner}");
    }
    let nvmesh = explain(
        &snapshot,
        "nvmesh-csi.excelero.com",
        Workflow::HelmModelCache,
    );
    assert_eq!(
        serde_json::to_value(&nvmesh).unwrap(),
        serde_json::json!({
            "provisioner": "nvmesh-csi.excelero.com",
            "provider": "nvmesh",
            "workflow": "helmModelCache",
            "transition": "roxReadOnly",
            "requiredAccessModes": ["ReadWriteOnce", "ReadOnlyMany"],
            "requiredMountOptions": ["ro", "norecovery", "nouuid"],
            "profileDigest": nvmesh.profile_digest.clone().unwrap(),
            "catalogRevision": snapshot.revision(),
        })
    );
    let unknown = explain(&snapshot, "ebs.csi.aws.com", Workflow::RegularModelCache);
    assert_eq!(unknown.provider, None);
    assert_eq!(unknown.profile_digest, None);
    assert!(unknown.required_access_modes.is_empty());
    assert!(
        unknown
            .reason
            .as_deref()
            .unwrap()
            .contains("no entry for provisioner \"ebs.csi.aws.com\"")
    );
}

#[test]
fn explanation_keys_are_in_the_documented_order() {
    let snapshot = CatalogSnapshot::builtin().unwrap();
    let text = serde_json::to_string(&explain(
        &snapshot,
        "csi.weka.io",
        Workflow::RegularModelCache,
    ))
    .unwrap();
    let keys = [
        "\"provisioner\"",
        "\"provider\"",
        "\"workflow\"",
        "\"transition\"",
        "\"requiredAccessModes\"",
        "\"requiredMountOptions\"",
        "\"profileDigest\"",
        "\"catalogRevision\"",
    ];
    let positions: Vec<usize> = keys.iter().map(|k| text.find(k).unwrap()).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{text}");
    assert!(!text.contains("\"reason\""), "{text}");
}
