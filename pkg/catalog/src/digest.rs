//! The three digests a storage decision carries.
//!
//! | digest | format | over | changes when |
//! |---|---|---|---|
//! | catalog revision | `sha256:<hex>` | the exact catalog payload bytes | anything in the payload changes, comments and other drivers included |
//! | profile digest | `sha256:<hex>` | canonical JSON of the selected driver's profile, the workflow and the transition | the selected driver's entry or the derived flow changes |
//! | StorageClass configuration digest | `v1:sha256:<hex>` | canonical JSON of the StorageClass configuration | provisioner, parameters, reclaim policy, binding mode, mount options or topologies change |
//!
//! A binding records the profile digest (`spec.decision.catalogDigest`), so an edit to another
//! driver or a comment is not drift; the revision is kept for diagnostics.

use k8s_openapi::api::core::v1::TopologySelectorTerm;
use k8s_openapi::api::storage::v1::StorageClass;
use serde::Serialize;
use sha2::{Digest, Sha256};
use warmcache_api_modelcache::v2beta1::{AccessMode, Workflow};

use crate::flow::Flow;
use crate::loader::{DriverProfile, WriterIdentity};

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Catalog revision: `sha256:` and the lowercase hex SHA-256 of the exact payload (the
/// ConfigMap value, or the file), without any normalization.
pub fn catalog_revision(payload: &str) -> String {
    format!("sha256:{}", sha256_hex(payload.as_bytes()))
}

/// The canonical profile hashed by [`profile_digest`]. Field order is the serialization
/// order; do not reorder.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CanonicalProfile<'a> {
    provisioner: &'a str,
    provider: &'a str,
    /// Sorted by name: the modes are a set, their order in the catalog means nothing.
    access_modes: Vec<&'static str>,
    /// Catalog order: mount options are applied in order.
    reader_mount_options: &'a [String],
    encryption_supported: bool,
    /// `null` when the catalog leaves it to the CSIDriver.
    writer_identity: Option<&'static str>,
    workflow: &'static str,
    /// `rwxReadOnly`, `roxReadOnly` or `disabled`.
    transition: &'static str,
}

/// The canonical JSON text of a profile (what [`profile_digest`] hashes): compact JSON of an
/// object with, in this order, `provisioner`, `provider`, `accessModes` (sorted by name),
/// `readerMountOptions` (catalog order), `encryptionSupported` (false when absent),
/// `writerIdentity` (null when absent), `workflow` and `transition`.
pub fn canonical_profile(driver: &DriverProfile, workflow: Workflow, flow: Flow) -> String {
    let mut access_modes: Vec<&'static str> = driver
        .access_modes
        .iter()
        .map(|m: &AccessMode| m.as_str())
        .collect();
    access_modes.sort_unstable();
    let profile = CanonicalProfile {
        provisioner: &driver.name,
        provider: &driver.provider,
        access_modes,
        reader_mount_options: &driver.reader_mount_options,
        encryption_supported: driver.encryption_supported,
        writer_identity: driver.writer_identity.map(WriterIdentity::as_str),
        workflow: workflow.as_str(),
        transition: flow.as_str(),
    };
    // Serializing a struct of strings, bools and lists cannot fail; the fallback keeps the
    // function total without a panic path.
    serde_json::to_string(&profile).unwrap_or_default()
}

/// Profile digest: `sha256:` and the hex SHA-256 of [`canonical_profile`]. Only the selected
/// driver's entry, the workflow and the derived transition feed it, so editing another driver
/// or a comment keeps it; changing this driver's modes, options, encryption support or writer
/// identity changes it.
pub fn profile_digest(driver: &DriverProfile, workflow: Workflow, flow: Flow) -> String {
    format!(
        "sha256:{}",
        sha256_hex(canonical_profile(driver, workflow, flow).as_bytes())
    )
}

#[derive(Serialize)]
struct Parameter<'a> {
    name: &'a str,
    value: &'a str,
}

/// The canonical StorageClass configuration. Field order is the serialization order.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CanonicalStorageClass<'a> {
    provisioner: &'a str,
    parameters: Vec<Parameter<'a>>,
    reclaim_policy: &'a str,
    volume_binding_mode: &'a str,
    mount_options: &'a [String],
    allowed_topologies: &'a [TopologySelectorTerm],
}

/// The canonical JSON text of a StorageClass configuration (what
/// [`storage_class_digest`] hashes): compact JSON of an object with, in this order,
/// `provisioner`, `parameters` (a list of `{name, value}` sorted by name), `reclaimPolicy` and
/// `volumeBindingMode` (`""` when unset), `mountOptions` and `allowedTopologies` (original
/// order, `[]` when unset). Metadata and `allowVolumeExpansion` are not part of it.
pub fn canonical_storage_class(class: &StorageClass) -> String {
    let parameters = class
        .parameters
        .iter()
        .flatten()
        .map(|(name, value)| Parameter { name, value })
        .collect();
    let canonical = CanonicalStorageClass {
        provisioner: &class.provisioner,
        parameters,
        reclaim_policy: class.reclaim_policy.as_deref().unwrap_or_default(),
        volume_binding_mode: class.volume_binding_mode.as_deref().unwrap_or_default(),
        mount_options: class.mount_options.as_deref().unwrap_or_default(),
        allowed_topologies: class.allowed_topologies.as_deref().unwrap_or_default(),
    };
    serde_json::to_string(&canonical).unwrap_or_default()
}

/// StorageClass configuration digest: `v1:sha256:` and the hex SHA-256 of
/// [`canonical_storage_class`].
pub fn storage_class_digest(class: &StorageClass) -> String {
    format!(
        "v1:sha256:{}",
        sha256_hex(canonical_storage_class(class).as_bytes())
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::TopologySelectorLabelRequirement;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use warmcache_api_modelcache::v2beta1::Transition;

    use super::*;

    fn is_digest(s: &str, prefix: &str) -> bool {
        s.strip_prefix(prefix).is_some_and(|hex| {
            hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
    }

    fn nvmesh() -> DriverProfile {
        DriverProfile {
            name: "nvmesh-csi.excelero.com".into(),
            provider: "nvmesh".into(),
            access_modes: vec![AccessMode::ReadWriteOnce, AccessMode::ReadOnlyMany],
            reader_mount_options: vec!["ro".into(), "norecovery".into(), "nouuid".into()],
            encryption_supported: true,
            writer_identity: None,
        }
    }

    const ROX: Flow = Flow::Enabled(Transition::RoxReadOnly);

    #[test]
    fn revision_hashes_the_raw_payload() {
        // sha256("") is well known.
        assert_eq!(
            catalog_revision(""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_ne!(catalog_revision("a: 1\n"), catalog_revision("a: 1\n# c\n"));
        assert!(is_digest(&catalog_revision("x"), "sha256:"));
    }

    #[test]
    fn canonical_profile_is_exact() {
        assert_eq!(
            canonical_profile(&nvmesh(), Workflow::HelmModelCache, ROX),
            r#"{"provisioner":"nvmesh-csi.excelero.com","provider":"nvmesh","accessModes":["ReadOnlyMany","ReadWriteOnce"],"readerMountOptions":["ro","norecovery","nouuid"],"encryptionSupported":true,"writerIdentity":null,"workflow":"helmModelCache","transition":"roxReadOnly"}"#
        );
        assert!(is_digest(
            &profile_digest(&nvmesh(), Workflow::HelmModelCache, ROX),
            "sha256:"
        ));
    }

    #[test]
    fn profile_digest_follows_the_profile_only() {
        let base = profile_digest(&nvmesh(), Workflow::RegularModelCache, ROX);
        // Access modes are a set.
        let mut reordered = nvmesh();
        reordered.access_modes.reverse();
        assert_eq!(
            profile_digest(&reordered, Workflow::RegularModelCache, ROX),
            base
        );
        // Everything else in the profile matters.
        let mut changed: Vec<DriverProfile> = Vec::new();
        let mut d = nvmesh();
        d.encryption_supported = false;
        changed.push(d);
        let mut d = nvmesh();
        d.reader_mount_options.swap(1, 2);
        changed.push(d);
        let mut d = nvmesh();
        d.reader_mount_options.pop();
        changed.push(d);
        let mut d = nvmesh();
        d.access_modes.push(AccessMode::ReadWriteMany);
        changed.push(d);
        let mut d = nvmesh();
        d.writer_identity = Some(WriterIdentity::Root);
        changed.push(d);
        let mut d = nvmesh();
        d.provider = "other".into();
        changed.push(d);
        let mut d = nvmesh();
        d.name = "other.csi".into();
        changed.push(d);
        for d in &changed {
            assert_ne!(
                profile_digest(d, Workflow::RegularModelCache, ROX),
                base,
                "{d:?}"
            );
        }
        assert_ne!(
            profile_digest(&nvmesh(), Workflow::HelmModelCache, ROX),
            base
        );
        assert_ne!(
            profile_digest(
                &nvmesh(),
                Workflow::RegularModelCache,
                Flow::Enabled(Transition::RwxReadOnly)
            ),
            base
        );
    }

    fn class() -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some("nvcf-sc".into()),
                uid: Some("u1".into()),
                resource_version: Some("1".into()),
                ..ObjectMeta::default()
            },
            provisioner: "csi.weka.io".into(),
            parameters: Some(BTreeMap::from([
                ("b".to_owned(), "2".to_owned()),
                ("a".to_owned(), "1".to_owned()),
            ])),
            reclaim_policy: Some("Retain".into()),
            volume_binding_mode: Some("WaitForFirstConsumer".into()),
            mount_options: Some(vec!["nconnect=4".into(), "hard".into()]),
            allowed_topologies: Some(vec![TopologySelectorTerm {
                match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                    key: "zone".into(),
                    values: vec!["z1".into()],
                }]),
            }]),
            allow_volume_expansion: Some(true),
        }
    }

    #[test]
    fn canonical_storage_class_is_exact() {
        assert_eq!(
            canonical_storage_class(&class()),
            r#"{"provisioner":"csi.weka.io","parameters":[{"name":"a","value":"1"},{"name":"b","value":"2"}],"reclaimPolicy":"Retain","volumeBindingMode":"WaitForFirstConsumer","mountOptions":["nconnect=4","hard"],"allowedTopologies":[{"matchLabelExpressions":[{"key":"zone","values":["z1"]}]}]}"#
        );
        let bare = StorageClass {
            provisioner: "p".into(),
            ..StorageClass::default()
        };
        assert_eq!(
            canonical_storage_class(&bare),
            r#"{"provisioner":"p","parameters":[],"reclaimPolicy":"","volumeBindingMode":"","mountOptions":[],"allowedTopologies":[]}"#
        );
        assert!(is_digest(&storage_class_digest(&class()), "v1:sha256:"));
    }

    #[test]
    fn storage_class_digest_ignores_metadata_and_expansion() {
        let base = storage_class_digest(&class());
        let mut c = class();
        c.metadata.resource_version = Some("99".into());
        c.metadata.labels = Some(BTreeMap::from([("x".to_owned(), "y".to_owned())]));
        c.allow_volume_expansion = None;
        assert_eq!(storage_class_digest(&c), base);

        let mut c = class();
        c.mount_options = Some(vec!["hard".into(), "nconnect=4".into()]);
        assert_ne!(storage_class_digest(&c), base, "mount option order matters");
        let mut c = class();
        c.parameters = None;
        assert_ne!(storage_class_digest(&c), base);
        let mut c = class();
        c.volume_binding_mode = Some("Immediate".into());
        assert_ne!(storage_class_digest(&c), base);
        let mut c = class();
        c.provisioner = "csi.other".into();
        assert_ne!(storage_class_digest(&c), base);
        let mut c = class();
        c.allowed_topologies = None;
        assert_ne!(storage_class_digest(&c), base);
    }
}
