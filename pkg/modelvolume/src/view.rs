//! The storage objects of one cache, derived without a client: the primary claim in the control
//! namespace, the read-write writer view of the primary in the writer's namespace (RWX flow),
//! and the read-only view of each reader namespace.
//!
//! Every view is a static PersistentVolume copied from the primary's bound PV and pre-bound
//! (`claimRef`) to a claim with an empty class: a class-only claim would get a new, empty volume,
//! and a pre-bound pair whose classes differ never binds. A read-only view carries
//! `csi.readOnly: true`, ReadOnlyMany, Retain, the decision's mount options plus the operator's
//! extras that negate none of them, and the primary's volume handle, or, on drivers whose handles
//! encode the namespace ([`warmcache_catalog::volume_handle_encodes_namespace`]), the handle with
//! its last `:` segment rewritten to the reader's namespace. `csi.readOnly` alone does not make a
//! reader read-only on a real node (the kubelet takes the publish flag from the pod): the pods the
//! webhook renders mount the claim read-only on the pod side too.
//!
//! Names: the view claim is `ro-pvc-<hash>` ([`reader_pvc_name`], the name the webhook renders
//! into pods), its PV `ro-pvc-<hash>-<8 hex of SHA-256(namespace)>`; the writer view claim is
//! `rw-pvc-<hash>` ([`writer_pvc_name`]) in the writer namespace, its PV
//! `rw-pvc-<hash>-<8 hex>`. One namespace gets one name, so a namespace never gets two views of
//! one primary.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use warmcache_api_modelcache::v2beta1::{ModelCacheBinding, ReadOnlyView};
use warmcache_api_modelcache::{identity_hash, reader_pvc_name, sha256_digest, writer_pvc_name};
use warmcache_catalog::{negate_each_other, volume_handle_encodes_namespace};

use crate::keys::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, MODEL_LABEL, ROLE_LABEL, ROLE_READER};
use crate::volume_keys::{
    BINDING_LABEL, ROLE_READER_SHARED, ROLE_WRITER, SOURCE_PV_LABEL, VOLUME_ROLE_LABEL,
};

/// Access mode of every read-only view.
pub const READ_ONLY_MANY: &str = "ReadOnlyMany";
/// Access mode of the RWX primary and of the writer view.
pub const READ_WRITE_MANY: &str = "ReadWriteMany";
/// Reclaim policy of every volume of a cache.
pub const RETAIN: &str = "Retain";

const GIB: u64 = 1 << 30;

/// Why a view cannot be derived from the primary's PV.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    /// The primary PV has no name (not read from the API server).
    #[error("the primary PersistentVolume has no name")]
    PrimaryUnnamed,
    /// The primary PV is not a CSI volume.
    #[error("PersistentVolume {pv}: the primary is not a CSI volume, so no view can name its data")]
    NotCsi {
        /// The primary PV.
        pv: String,
    },
    /// The primary PV's volume handle is empty.
    #[error("PersistentVolume {pv}: the primary has an empty CSI volume handle")]
    EmptyHandle {
        /// The primary PV.
        pv: String,
    },
    /// The driver's handles encode the namespace, but this one has no `:` segment to rewrite.
    #[error(
        "PersistentVolume {pv}: provider {provider} encodes the namespace in its volume handles, but handle {handle:?} has no ':' segment to rewrite"
    )]
    NoNamespaceSegment {
        /// The primary PV.
        pv: String,
        /// The decision's provider.
        provider: String,
        /// The primary's handle.
        handle: String,
    },
    /// The primary PV has no capacity.
    #[error("PersistentVolume {pv}: the primary has no spec.capacity.storage")]
    NoCapacity {
        /// The primary PV.
        pv: String,
    },
}

/// 8 hex characters (4 bytes) of SHA-256 of `namespace`: the per-namespace suffix of view PVs.
pub fn namespace_suffix(namespace: &str) -> String {
    sha256_digest(namespace)["sha256:".len().."sha256:".len() + 8].to_owned()
}

/// The names of `binding`'s read-only view in `namespace` (the entry recorded in
/// `status.realized.views` before the objects are created).
pub fn reader_view(binding: &ModelCacheBinding, namespace: &str) -> ReadOnlyView {
    let claim = reader_pvc_name(&binding.spec.identity);
    ReadOnlyView {
        namespace: namespace.to_owned(),
        persistent_volume_name: format!("{claim}-{}", namespace_suffix(namespace)),
        persistent_volume_claim_name: claim,
    }
}

/// Name of the writer view's PV in `spec.resources.writerNamespace`
/// ([`writer_view_pv_name_in`]).
pub fn writer_view_pv_name(binding: &ModelCacheBinding) -> String {
    writer_view_pv_name_in(binding, &binding.spec.resources.writer_namespace)
}

/// Name of the writer view's PV for a writer in `namespace`
/// (`rw-pvc-<hash>-<8 hex of the namespace>`): each writer namespace its own.
pub fn writer_view_pv_name_in(binding: &ModelCacheBinding, namespace: &str) -> String {
    format!(
        "{}-{}",
        writer_pvc_name(&binding.spec.identity),
        namespace_suffix(namespace)
    )
}

/// The size of a view of `bytes` measured bytes: 10% headroom, rounded up to whole GiB, at least
/// 1 GiB (nvsnap's VolumeSize).
pub fn view_size(bytes: u64) -> Quantity {
    sized(bytes, 0)
}

/// [`view_size`], at least `floor` bytes (rounded up to GiB): the size of a block primary with
/// the operator's minimum.
pub fn sized(bytes: u64, floor: u64) -> Quantity {
    let with_headroom = bytes.saturating_add(bytes / 100 * 10);
    let gib = with_headroom.div_ceil(GIB).max(1).max(floor.div_ceil(GIB));
    Quantity(format!("{gib}Gi"))
}

/// The mount options of a read-only view: `required` (the decision's, in order), then each of
/// `extras` that is not already there, does not negate a required option
/// ([`negate_each_other`]) and would not make the mount writable (`rw`, `noro`, `ro=<value>`).
pub fn view_mount_options(required: &[String], extras: &[String]) -> Vec<String> {
    let mut options: Vec<String> = Vec::new();
    for o in required {
        if !options.contains(o) {
            options.push(o.clone());
        }
    }
    for extra in extras {
        let e = extra.trim();
        let name = e.split_once('=').map_or(e, |(n, _)| n);
        let writable = matches!(name, "rw" | "noro") || (name == "ro" && e.contains('='));
        if e.is_empty()
            || writable
            || options.iter().any(|o| o == e)
            || required.iter().any(|r| negate_each_other(r, e))
        {
            continue;
        }
        options.push(e.to_owned());
    }
    options
}

/// The volume handle of a view in `namespace`: the primary's, or, when `provider`'s handles
/// encode the namespace, the primary's with its last `:` segment replaced by `namespace`.
pub fn view_volume_handle(
    pv: &str,
    provider: &str,
    handle: &str,
    namespace: &str,
) -> Result<String, ViewError> {
    if !volume_handle_encodes_namespace(provider) {
        return Ok(handle.to_owned());
    }
    match handle.rsplit_once(':') {
        Some((id, _)) if !id.is_empty() => Ok(format!("{id}:{namespace}")),
        _ => Err(ViewError::NoNamespaceSegment {
            pv: pv.to_owned(),
            provider: provider.to_owned(),
            handle: handle.to_owned(),
        }),
    }
}

fn labels(binding: &ModelCacheBinding, role: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned()),
        (
            MODEL_LABEL.to_owned(),
            identity_hash(&binding.spec.identity),
        ),
        (VOLUME_ROLE_LABEL.to_owned(), role.to_owned()),
        (
            BINDING_LABEL.to_owned(),
            binding.metadata.name.clone().unwrap_or_default(),
        ),
    ])
}

fn primary_name(primary: &PersistentVolume) -> Result<String, ViewError> {
    primary
        .metadata
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or(ViewError::PrimaryUnnamed)
}

/// The primary's storage capacity.
pub fn primary_capacity(primary: &PersistentVolume) -> Result<Quantity, ViewError> {
    let pv = primary_name(primary)?;
    primary
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .cloned()
        .ok_or(ViewError::NoCapacity { pv })
}

fn claim(
    namespace: &str,
    name: &str,
    pv: &str,
    mode: &str,
    size: Quantity,
    labels: BTreeMap<String, String>,
) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec![mode.to_owned()]),
            storage_class_name: Some(String::new()),
            volume_name: Some(pv.to_owned()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_owned(), size)])),
                limits: None,
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

/// Copy of `primary`'s spec as a static PV named `name`, pre-bound to `namespace/claim_name`.
#[allow(clippy::too_many_arguments)]
fn derived_pv(
    primary: &PersistentVolume,
    name: &str,
    namespace: &str,
    claim_name: &str,
    mode: &str,
    size: Quantity,
    handle: String,
    read_only: bool,
    mount_options: Option<Vec<String>>,
    labels: BTreeMap<String, String>,
) -> Result<PersistentVolume, ViewError> {
    let pv = primary_name(primary)?;
    let mut spec = primary.spec.clone().unwrap_or_default();
    let Some(csi) = spec.csi.as_mut() else {
        return Err(ViewError::NotCsi { pv });
    };
    csi.volume_handle = handle;
    csi.read_only = Some(read_only);
    spec.storage_class_name = Some(String::new());
    spec.access_modes = Some(vec![mode.to_owned()]);
    spec.persistent_volume_reclaim_policy = Some(RETAIN.to_owned());
    spec.capacity = Some(BTreeMap::from([("storage".to_owned(), size)]));
    spec.claim_ref = Some(ObjectReference {
        namespace: Some(namespace.to_owned()),
        name: Some(claim_name.to_owned()),
        kind: Some("PersistentVolumeClaim".to_owned()),
        api_version: Some("v1".to_owned()),
        ..ObjectReference::default()
    });
    if let Some(options) = mount_options {
        spec.mount_options = Some(options).filter(|o| !o.is_empty());
    }
    let mut labels = labels;
    labels.insert(SOURCE_PV_LABEL.to_owned(), pv);
    Ok(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    })
}

fn primary_handle(primary: &PersistentVolume) -> Result<String, ViewError> {
    let pv = primary_name(primary)?;
    let Some(csi) = primary.spec.as_ref().and_then(|s| s.csi.as_ref()) else {
        return Err(ViewError::NotCsi { pv });
    };
    if csi.volume_handle.is_empty() {
        return Err(ViewError::EmptyHandle { pv });
    }
    Ok(csi.volume_handle.clone())
}

/// The read-only view of `binding`'s primary (`primary`, its bound PV) in `namespace`: the PV
/// and its pre-bound claim. Sized from `bytes` when the download was measured
/// ([`view_size`]), else the primary's capacity; `extra_mount_options` are the operator's
/// ([`view_mount_options`]).
///
/// # Errors
///
/// [`ViewError`] when the primary is not a named CSI volume with a handle and a capacity, or its
/// handle has no namespace segment on a driver that needs one.
pub fn read_only_view(
    binding: &ModelCacheBinding,
    primary: &PersistentVolume,
    namespace: &str,
    bytes: Option<u64>,
    extra_mount_options: &[String],
) -> Result<(PersistentVolume, PersistentVolumeClaim), ViewError> {
    let names = reader_view(binding, namespace);
    let pv_name = primary_name(primary)?;
    let handle = view_volume_handle(
        &pv_name,
        &binding.spec.decision.provider,
        &primary_handle(primary)?,
        namespace,
    )?;
    let size = match bytes {
        Some(b) => view_size(b),
        None => primary_capacity(primary)?,
    };
    let options = view_mount_options(
        &binding.spec.decision.required_mount_options,
        extra_mount_options,
    );
    let pv = derived_pv(
        primary,
        &names.persistent_volume_name,
        namespace,
        &names.persistent_volume_claim_name,
        READ_ONLY_MANY,
        size.clone(),
        handle,
        true,
        Some(options),
        labels(binding, ROLE_READER_SHARED),
    )?;
    let mut claim_labels = labels(binding, ROLE_READER);
    claim_labels.insert(ROLE_LABEL.to_owned(), ROLE_READER.to_owned());
    let claim = claim(
        namespace,
        &names.persistent_volume_claim_name,
        &names.persistent_volume_name,
        READ_ONLY_MANY,
        size,
        claim_labels,
    );
    Ok((pv, claim))
}

/// The read-write view of `binding`'s RWX primary in the writer namespace
/// (`spec.resources.writerNamespace`): the PV (the primary's handle, ReadWriteMany, Retain,
/// the primary's own mount options) and its pre-bound claim `rw-pvc-<hash>`, which the writer
/// Job mounts.
///
/// # Errors
///
/// [`ViewError`] as for [`read_only_view`].
pub fn writer_view(
    binding: &ModelCacheBinding,
    primary: &PersistentVolume,
) -> Result<(PersistentVolume, PersistentVolumeClaim), ViewError> {
    writer_view_in(binding, primary, &binding.spec.resources.writer_namespace)
}

/// [`writer_view`] for a writer in `namespace` (the writer the Lease names, see
/// [`crate::lease`]).
///
/// # Errors
///
/// [`ViewError`] as for [`read_only_view`].
pub fn writer_view_in(
    binding: &ModelCacheBinding,
    primary: &PersistentVolume,
    namespace: &str,
) -> Result<(PersistentVolume, PersistentVolumeClaim), ViewError> {
    let namespace = namespace.to_owned();
    let claim_name = writer_pvc_name(&binding.spec.identity);
    let pv_name = writer_view_pv_name_in(binding, &namespace);
    let handle = primary_handle(primary)?;
    let size = primary_capacity(primary)?;
    let pv = derived_pv(
        primary,
        &pv_name,
        &namespace,
        &claim_name,
        READ_WRITE_MANY,
        size.clone(),
        handle,
        false,
        None,
        labels(binding, ROLE_WRITER),
    )?;
    let claim = claim(
        &namespace,
        &claim_name,
        &pv_name,
        READ_WRITE_MANY,
        size,
        labels(binding, ROLE_WRITER),
    );
    Ok((pv, claim))
}

/// The primary claim of an RWX cache: `rw-pvc-<hash>` in the binding's namespace (the control
/// namespace), ReadWriteMany on the binding's StorageClass (an encrypted cache's own class,
/// [`crate::encryption::primary_class`]), of `size` (the operator's nominal RWX size: nothing is
/// measured before the download).
pub fn primary_claim(binding: &ModelCacheBinding, size: Quantity) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(writer_pvc_name(&binding.spec.identity)),
            namespace: binding.metadata.namespace.clone(),
            labels: Some(labels(binding, crate::volume_keys::ROLE_PRIMARY)),
            // Whose claim it is, so a node agent electing itself on it (a capture) can tell a
            // claim of an earlier binding of the same name.
            annotations: binding.metadata.uid.as_ref().map(|uid| {
                BTreeMap::from([(
                    crate::volume_keys::BINDING_UID_LABEL_ANNOTATION.to_owned(),
                    uid.clone(),
                )])
            }),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec![READ_WRITE_MANY.to_owned()]),
            storage_class_name: Some(crate::encryption::primary_class(binding)),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_owned(), size)])),
                limits: None,
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{binding, primary_pv};
    use warmcache_api_modelcache::v2beta1::Transition;

    #[test]
    fn sizes_have_headroom_and_round_up_to_gib() {
        assert_eq!(view_size(0).0, "1Gi");
        assert_eq!(view_size(1).0, "1Gi");
        assert_eq!(view_size(GIB - GIB / 10).0, "1Gi");
        // 1 GiB + 10% does not fit in 1 GiB.
        assert_eq!(view_size(GIB).0, "2Gi");
        assert_eq!(view_size(10 * GIB).0, "11Gi");
        assert_eq!(view_size(u64::MAX).0, format!("{}Gi", u64::MAX / GIB + 1));
        // A block primary's floor: rounded up to GiB, and only when above the headroom size.
        assert_eq!(sized(10, 40 * GIB).0, "40Gi");
        assert_eq!(sized(10, GIB + 1).0, "2Gi");
        assert_eq!(sized(15 * GIB, GIB).0, "17Gi");
        assert_eq!(sized(0, u64::MAX).0, format!("{}Gi", u64::MAX / GIB + 1));
    }

    #[test]
    fn extras_never_negate_or_unprotect_required_options() {
        let required = vec!["ro".to_owned(), "norecovery".to_owned()];
        let extras: Vec<String> = [
            "recovery",
            "rw",
            "noro",
            "ro=0",
            "nouuid",
            "ro",
            "",
            " noatime ",
            "nouuid",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        assert_eq!(
            view_mount_options(&required, &extras),
            ["ro", "norecovery", "nouuid", "noatime"]
        );
        let required = vec!["uuid".to_owned()];
        assert_eq!(
            view_mount_options(&required, &["nouuid".to_owned()]),
            ["uuid"]
        );
    }

    #[test]
    fn handles_are_reused_or_rewritten_per_provider() {
        assert_eq!(
            view_volume_handle("pv", "weka", "vol:team-a", "team-b").as_deref(),
            Ok("vol:team-a")
        );
        assert_eq!(
            view_volume_handle("pv", "nvmesh", "vol-1:control", "team-b").as_deref(),
            Ok("vol-1:team-b")
        );
        assert!(matches!(
            view_volume_handle("pv", "nvmesh", "vol-1", "team-b"),
            Err(ViewError::NoNamespaceSegment { .. })
        ));
    }

    #[test]
    fn read_only_view_is_derived_from_the_primary() {
        let b = binding(Transition::RwxReadOnly);
        let primary = primary_pv();
        let (pv, claim) =
            read_only_view(&b, &primary, "team-b", Some(5 * GIB), &["noatime".into()]).unwrap();
        let names = reader_view(&b, "team-b");
        assert_eq!(
            pv.metadata.name.as_ref(),
            Some(&names.persistent_volume_name)
        );
        assert!(names.persistent_volume_name.starts_with("ro-pvc-"));
        assert_eq!(
            names.persistent_volume_claim_name,
            reader_pvc_name(&b.spec.identity)
        );
        let spec = pv.spec.unwrap();
        let csi = spec.csi.unwrap();
        assert_eq!(csi.read_only, Some(true));
        assert_eq!(csi.volume_handle, "handle-1");
        assert_eq!(csi.driver, "shared-fs.csi-test.warmcache.io");
        assert_eq!(
            csi.volume_attributes,
            primary
                .spec
                .as_ref()
                .unwrap()
                .csi
                .as_ref()
                .unwrap()
                .volume_attributes
        );
        assert_eq!(spec.storage_class_name.as_deref(), Some(""));
        assert_eq!(spec.access_modes, Some(vec!["ReadOnlyMany".to_owned()]));
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Retain")
        );
        assert_eq!(spec.mount_options, Some(vec!["noatime".to_owned()]));
        assert_eq!(spec.capacity.unwrap()["storage"].0, "6Gi");
        let claim_ref = spec.claim_ref.unwrap();
        assert_eq!(claim_ref.namespace.as_deref(), Some("team-b"));
        assert_eq!(
            claim_ref.name.as_ref(),
            Some(&names.persistent_volume_claim_name)
        );
        assert_eq!(claim_ref.uid, None);
        let labels = pv.metadata.labels.unwrap();
        assert_eq!(labels[SOURCE_PV_LABEL], "pvc-primary");
        assert_eq!(labels[VOLUME_ROLE_LABEL], ROLE_READER_SHARED);
        let cspec = claim.spec.unwrap();
        assert_eq!(claim.metadata.namespace.as_deref(), Some("team-b"));
        assert_eq!(cspec.storage_class_name.as_deref(), Some(""));
        assert_eq!(
            cspec.volume_name.as_ref(),
            Some(&names.persistent_volume_name)
        );
        assert_eq!(cspec.access_modes, Some(vec!["ReadOnlyMany".to_owned()]));
        assert_eq!(
            cspec.resources.unwrap().requests.unwrap()["storage"].0,
            "6Gi"
        );
        // Unmeasured: the primary's capacity.
        let (pv, _) = read_only_view(&b, &primary, "team-b", None, &[]).unwrap();
        assert_eq!(pv.spec.unwrap().capacity.unwrap()["storage"].0, "100Gi");
    }

    #[test]
    fn one_view_name_per_namespace_and_cache() {
        let b = binding(Transition::RwxReadOnly);
        let a1 = reader_view(&b, "team-a");
        let a2 = reader_view(&b, "team-a");
        let other = reader_view(&b, "team-b");
        assert_eq!(a1, a2);
        assert_ne!(a1.persistent_volume_name, other.persistent_volume_name);
        assert_eq!(
            a1.persistent_volume_claim_name,
            other.persistent_volume_claim_name
        );
        assert!(a1.persistent_volume_name.len() <= 253);
    }

    #[test]
    fn nvmesh_views_rewrite_the_namespace_segment() {
        let mut b = binding(Transition::RoxReadOnly);
        b.spec.decision.provider = "nvmesh".into();
        b.spec.decision.required_mount_options = vec!["ro".into(), "norecovery".into()];
        let mut primary = primary_pv();
        primary
            .spec
            .as_mut()
            .unwrap()
            .csi
            .as_mut()
            .unwrap()
            .volume_handle = "nvmesh-vol:nvca-modelcache-init".into();
        let (pv, _) =
            read_only_view(&b, &primary, "team-b", Some(1), &["recovery".into()]).unwrap();
        let spec = pv.spec.unwrap();
        assert_eq!(spec.csi.unwrap().volume_handle, "nvmesh-vol:team-b");
        assert_eq!(
            spec.mount_options,
            Some(vec!["ro".to_owned(), "norecovery".to_owned()])
        );
    }

    #[test]
    fn views_need_a_named_csi_primary() {
        let b = binding(Transition::RwxReadOnly);
        let mut not_csi = primary_pv();
        not_csi.spec.as_mut().unwrap().csi = None;
        assert!(matches!(
            read_only_view(&b, &not_csi, "team-b", None, &[]),
            Err(ViewError::NotCsi { .. })
        ));
        assert!(matches!(
            writer_view(&b, &not_csi),
            Err(ViewError::NotCsi { .. })
        ));
        let mut unnamed = primary_pv();
        unnamed.metadata.name = None;
        assert_eq!(
            writer_view(&b, &unnamed).unwrap_err(),
            ViewError::PrimaryUnnamed
        );
        let mut empty = primary_pv();
        empty
            .spec
            .as_mut()
            .unwrap()
            .csi
            .as_mut()
            .unwrap()
            .volume_handle = String::new();
        assert!(matches!(
            read_only_view(&b, &empty, "team-b", None, &[]),
            Err(ViewError::EmptyHandle { .. })
        ));
    }

    #[test]
    fn writer_view_is_read_write_in_the_writer_namespace() {
        let b = binding(Transition::RwxReadOnly);
        let (pv, claim) = writer_view(&b, &primary_pv()).unwrap();
        let spec = pv.spec.unwrap();
        assert_eq!(spec.csi.as_ref().unwrap().read_only, Some(false));
        assert_eq!(spec.csi.unwrap().volume_handle, "handle-1");
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteMany".to_owned()]));
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Retain")
        );
        assert_eq!(spec.storage_class_name.as_deref(), Some(""));
        assert_eq!(spec.mount_options, Some(vec!["vers=4.1".to_owned()]));
        assert_eq!(spec.claim_ref.unwrap().namespace.as_deref(), Some("team-a"));
        assert_eq!(claim.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(claim.metadata.name, Some(writer_pvc_name(&b.spec.identity)));
        assert_eq!(
            claim.spec.unwrap().volume_name,
            pv.metadata.name,
            "pre-bound"
        );
    }

    #[test]
    fn primary_claim_is_rwx_on_the_binding_class() {
        let b = binding(Transition::RwxReadOnly);
        let c = primary_claim(&b, Quantity("100Gi".into()));
        assert_eq!(
            c.metadata.namespace.as_deref(),
            Some("nvca-modelcache-init")
        );
        let spec = c.spec.unwrap();
        assert_eq!(spec.storage_class_name.as_deref(), Some("nvcf-sc"));
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteMany".to_owned()]));
        assert_eq!(spec.volume_name, None);
    }
}
