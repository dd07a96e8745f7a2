//! Opening a fresh ReadWriteMany root for a non-root writer, as pure decisions of the node agent.
//!
//! Some ReadWriteMany drivers (OCI File Storage's CSI driver: `fsGroupPolicy:
//! ReadWriteOnceWithFSType`) apply no fsGroup to a ReadWriteMany volume, so every fresh export is
//! owned by root, mode 0755, and a non-root writer gets EACCES (seed 002). The decision records
//! writer identity `root` for such a driver. Without the node agent the writer then runs as uid
//! 0; with it ([`crate::WriterOptions::open_root_wait_seconds`]) the writer runs as the step's
//! non-root user, labelled [`OPEN_ROOT_LABEL`], and its wrapper waits until its landing is
//! writable. The agent of the writer's node gives the volume's root directory (only that
//! directory, never anything under it) to the writer's user and group, through the writer pod's
//! kubelet mount of the writer view PV.
//!
//! The rules, so a pod labelled like a writer cannot make the agent change any other directory:
//!
//! - Only a pod of the binding's own writer Job (its controller Job is `writer_job_name` of the
//!   binding, in the writer namespace the binding's status names), for a `rwxReadOnly` binding
//!   whose decision says `root`, with the binding's UID recorded, is opened
//!   ([`open_root_request`]).
//! - Its user and group are the writer container's `runAsUser` (not 0) and `runAsGroup`, which
//!   the binding controller sets on every such writer.
//! - The volume must be the writer view claim `rw-pvc-<hash>` of the pod's namespace, Bound to the
//!   writer view PV the binding controller derives for that namespace, labelled for the binding,
//!   pre-bound to that claim, on the primary's driver and volume handle ([`trusted_writer_view`]).
//! - The agent changes the owner only after the mount table shows the kubelet's mount at
//!   `pods/<pod uid>/volumes/kubernetes.io~csi/<pv>/mount` (otherwise that path is the node's own
//!   disk), and only of a root-owned directory: one already owned by the writer is left as it is,
//!   one owned by anyone else is refused (`warmcache_nodefs::open_root`).

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use warmcache_api_modelcache::v2beta1::{ModelCacheBinding, Transition, WriterIdentity};
use warmcache_api_modelcache::{writer_job_name, writer_pvc_name};

use crate::keys::{BINDING_ANNOTATION, MODEL_VOLUME};
use crate::view::writer_view_pv_name_in;
use crate::volume_keys::{
    BINDING_LABEL, BINDING_UID_LABEL_ANNOTATION, ROLE_WRITER, VOLUME_ROLE_LABEL, WRITER_CONTAINER,
};
pub use crate::writer::OPEN_ROOT_LABEL;

/// A writer whose root the agent is to open, as read from its pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenRoot {
    /// The pod's namespace (a writer namespace of the binding).
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID (its kubelet directory).
    pub uid: String,
    /// The binding (control namespace).
    pub binding: String,
    /// The writer view claim the pod mounts (`rw-pvc-<hash>` in its namespace).
    pub claim: String,
    /// The user the root is given to.
    pub user: u32,
    /// The group the root is given to.
    pub group: u32,
}

/// What a pod asks of the agent's root opening.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenRootState {
    /// Not a writer asking for its root (no [`OPEN_ROOT_LABEL`]).
    NotAsked,
    /// The writer ended or is being deleted: nothing to open any more.
    Finished,
    /// Not now (the binding is not in the agent's cache yet).
    Wait(String),
    /// A pod asking for something the agent never does (the reason, for the log).
    Refused(String),
    /// Open this writer's root.
    Open(OpenRoot),
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

/// Reads a pod of this node labelled [`OPEN_ROOT_LABEL`] against its binding (see the module
/// documentation for the rules).
pub fn open_root_request(pod: &Pod, binding: Option<&ModelCacheBinding>) -> OpenRootState {
    let meta = &pod.metadata;
    if meta
        .labels
        .as_ref()
        .and_then(|l| l.get(OPEN_ROOT_LABEL))
        .map(String::as_str)
        != Some("true")
    {
        return OpenRootState::NotAsked;
    }
    let (Some(namespace), Some(name), Some(uid)) = (&meta.namespace, &meta.name, &meta.uid) else {
        return OpenRootState::Refused("the pod has no namespace, name or UID".to_owned());
    };
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if meta.deletion_timestamp.is_some() || matches!(phase, Some("Succeeded" | "Failed")) {
        return OpenRootState::Finished;
    }
    let who = format!("pod {namespace}/{name}");
    let (Some(binding_name), Some(binding_uid)) = (
        annotation(meta, BINDING_ANNOTATION),
        annotation(meta, BINDING_UID_LABEL_ANNOTATION),
    ) else {
        return OpenRootState::Refused(format!(
            "{who} lacks {BINDING_ANNOTATION} or {BINDING_UID_LABEL_ANNOTATION}"
        ));
    };
    let Some(b) = binding else {
        return OpenRootState::Wait(format!("binding {binding_name} is not in the cache"));
    };
    if b.metadata.uid.as_deref() != Some(binding_uid) {
        return OpenRootState::Refused(format!(
            "{who} names binding {binding_name} with UID {binding_uid}, which is not the binding's"
        ));
    }
    if b.spec.decision.transition != Transition::RwxReadOnly
        || b.spec.decision.writer_identity != Some(WriterIdentity::Root)
    {
        return OpenRootState::Refused(format!(
            "binding {binding_name} is not a rwxReadOnly cache whose writer identity is root; \
             only such fresh roots are opened"
        ));
    }
    // Only the binding's own writer Job, in its writer namespace.
    let writer = b.status.as_ref().and_then(|s| s.writer.as_ref());
    let writer_ns = writer.map_or(b.spec.resources.writer_namespace.as_str(), |w| {
        w.namespace.as_str()
    });
    let job_name = writer_job_name(&b.spec.identity);
    let job_ok = meta.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true)
            && o.api_version == "batch/v1"
            && o.kind == "Job"
            && o.name == job_name
            && writer
                .and_then(|w| w.job_uid.as_ref())
                .is_none_or(|u| *u == o.uid)
    });
    if namespace != writer_ns || !job_ok {
        return OpenRootState::Refused(format!(
            "{who} is not binding {binding_name}'s writer Job {writer_ns}/{job_name}"
        ));
    }
    let spec = pod.spec.as_ref();
    let Some(container) = spec
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .find(|c| c.name == WRITER_CONTAINER)
    else {
        return OpenRootState::Refused(format!("{who} has no container {WRITER_CONTAINER}"));
    };
    let security = container.security_context.as_ref();
    let user = security
        .and_then(|s| s.run_as_user)
        .and_then(|u| u32::try_from(u).ok())
        .filter(|u| *u != 0);
    let group = security
        .and_then(|s| s.run_as_group)
        .and_then(|g| u32::try_from(g).ok());
    let (Some(user), Some(group)) = (user, group) else {
        return OpenRootState::Refused(format!(
            "{who}'s container {WRITER_CONTAINER} does not set a non-root runAsUser and a runAsGroup"
        ));
    };
    let claim = writer_pvc_name(&b.spec.identity);
    let mounts_view = spec.and_then(|s| s.volumes.as_ref()).is_some_and(|vs| {
        vs.iter().any(|v| {
            v.name == MODEL_VOLUME
                && v.persistent_volume_claim
                    .as_ref()
                    .is_some_and(|c| c.claim_name == claim && c.read_only != Some(true))
        })
    });
    if !mounts_view {
        return OpenRootState::Refused(format!(
            "{who} does not mount the writer view claim {claim} as volume {MODEL_VOLUME}"
        ));
    }
    OpenRootState::Open(OpenRoot {
        namespace: namespace.clone(),
        name: name.clone(),
        uid: uid.clone(),
        binding: binding_name.to_owned(),
        claim,
        user,
        group,
    })
}

/// The writer view PV whose kubelet mount may be opened for `writer`, once the claim it mounts,
/// that claim's PV and the binding's primary PV (all read afresh) check out (see the module
/// documentation).
///
/// # Errors
///
/// What does not match, for the log; nothing is opened then.
pub fn trusted_writer_view(
    binding: &ModelCacheBinding,
    writer: &OpenRoot,
    claim: &PersistentVolumeClaim,
    pv: &PersistentVolume,
    primary: &PersistentVolume,
) -> Result<String, String> {
    let pv_name = writer_view_pv_name_in(binding, &writer.namespace);
    let claim_spec = claim.spec.as_ref();
    if claim.metadata.name.as_deref() != Some(writer.claim.as_str())
        || claim.metadata.namespace.as_deref() != Some(writer.namespace.as_str())
        || claim.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound")
        || claim_spec.and_then(|s| s.volume_name.as_deref()) != Some(pv_name.as_str())
    {
        return Err(format!(
            "claim {}/{} is not Bound to the writer view PV {pv_name}",
            writer.namespace, writer.claim
        ));
    }
    let labels = pv.metadata.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
    let pv_spec = pv.spec.as_ref();
    let claim_ref = pv_spec.and_then(|s| s.claim_ref.as_ref());
    if pv.metadata.name.as_deref() != Some(pv_name.as_str())
        || label(BINDING_LABEL) != Some(writer.binding.as_str())
        || label(VOLUME_ROLE_LABEL) != Some(ROLE_WRITER)
        || claim_ref.and_then(|r| r.namespace.as_deref()) != Some(writer.namespace.as_str())
        || claim_ref.and_then(|r| r.name.as_deref()) != Some(writer.claim.as_str())
    {
        return Err(format!(
            "PV {pv_name} is not binding {}'s writer view pre-bound to {}/{}",
            writer.binding, writer.namespace, writer.claim
        ));
    }
    let recorded = binding
        .status
        .as_ref()
        .and_then(|s| s.realized.as_ref())
        .and_then(|r| r.bound_persistent_volume_name.as_deref());
    let csi = |pv: &PersistentVolume| {
        pv.spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|c| (c.driver.clone(), c.volume_handle.clone()))
            .filter(|(_, handle)| !handle.is_empty())
    };
    if recorded.is_none() || primary.metadata.name.as_deref() != recorded {
        return Err(format!(
            "PV {} is not the primary binding {} records",
            primary.metadata.name.clone().unwrap_or_default(),
            writer.binding
        ));
    }
    match (csi(pv), csi(primary)) {
        (Some(view), Some(primary)) if view == primary => Ok(pv_name),
        _ => Err(format!(
            "PV {pv_name} is not on the primary's CSI driver and volume handle"
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{
        Container, ObjectReference, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
        PersistentVolumeClaimVolumeSource, PodSpec, PodStatus, SecurityContext, Volume,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use warmcache_api_modelcache::v2beta1::{
        ModelCacheBindingStatus, RealizedStorage, WriterStatus,
    };

    use super::*;
    use crate::testing::{binding, primary_pv};
    use crate::view::writer_view_in;

    fn root_binding() -> ModelCacheBinding {
        let mut b = binding(Transition::RwxReadOnly);
        b.spec.decision.writer_identity = Some(WriterIdentity::Root);
        b.status = Some(ModelCacheBindingStatus {
            realized: Some(RealizedStorage {
                bound_persistent_volume_name: Some("pvc-primary".into()),
                ..RealizedStorage::default()
            }),
            ..ModelCacheBindingStatus::default()
        });
        b
    }

    fn writer_pod(b: &ModelCacheBinding) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some("team-a".into()),
                name: Some("writer-abc".into()),
                uid: Some("pod-uid-1".into()),
                labels: Some(BTreeMap::from([(
                    OPEN_ROOT_LABEL.to_owned(),
                    "true".to_owned(),
                )])),
                annotations: Some(BTreeMap::from([
                    (
                        BINDING_ANNOTATION.to_owned(),
                        b.metadata.name.clone().unwrap(),
                    ),
                    (
                        BINDING_UID_LABEL_ANNOTATION.to_owned(),
                        "binding-uid-1".to_owned(),
                    ),
                ])),
                owner_references: Some(vec![OwnerReference {
                    api_version: "batch/v1".into(),
                    kind: "Job".into(),
                    name: writer_job_name(&b.spec.identity),
                    uid: "job-uid-1".into(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some("gpu-1".into()),
                containers: vec![Container {
                    name: WRITER_CONTAINER.into(),
                    security_context: Some(SecurityContext {
                        run_as_user: Some(1000),
                        run_as_group: Some(2000),
                        ..SecurityContext::default()
                    }),
                    ..Container::default()
                }],
                volumes: Some(vec![Volume {
                    name: MODEL_VOLUME.into(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: writer_pvc_name(&b.spec.identity),
                        read_only: Some(false),
                    }),
                    ..Volume::default()
                }]),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                ..PodStatus::default()
            }),
        }
    }

    fn refused(state: OpenRootState, needle: &str) {
        match state {
            OpenRootState::Refused(why) => assert!(why.contains(needle), "{why}"),
            other => panic!("expected a refusal naming {needle:?}, got {other:?}"),
        }
    }

    #[test]
    fn only_the_bindings_own_non_root_writer_is_opened() {
        let b = root_binding();
        let pod = writer_pod(&b);
        let OpenRootState::Open(open) = open_root_request(&pod, Some(&b)) else {
            panic!("the writer is opened");
        };
        assert_eq!((open.user, open.group), (1000, 2000));
        assert_eq!(open.claim, writer_pvc_name(&b.spec.identity));
        assert_eq!(
            (open.namespace.as_str(), open.uid.as_str()),
            ("team-a", "pod-uid-1")
        );

        // Not asking.
        let mut p = pod.clone();
        p.metadata.labels = None;
        assert_eq!(open_root_request(&p, Some(&b)), OpenRootState::NotAsked);
        // Ended, or being deleted.
        let mut p = pod.clone();
        p.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert_eq!(open_root_request(&p, Some(&b)), OpenRootState::Finished);
        let mut p = pod.clone();
        p.metadata.deletion_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap(),
        ));
        assert_eq!(open_root_request(&p, Some(&b)), OpenRootState::Finished);
        // The binding not cached yet.
        assert!(matches!(
            open_root_request(&pod, None),
            OpenRootState::Wait(_)
        ));
        // Another binding's UID.
        let mut p = pod.clone();
        p.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(BINDING_UID_LABEL_ANNOTATION.into(), "other".into());
        refused(open_root_request(&p, Some(&b)), "not the binding's");
        // A decision that is not root, or not rwxReadOnly.
        let mut fs_group = b.clone();
        fs_group.spec.decision.writer_identity = Some(WriterIdentity::FsGroup);
        refused(
            open_root_request(&pod, Some(&fs_group)),
            "writer identity is root",
        );
        let mut block = b.clone();
        block.spec.decision.transition = Transition::RoxReadOnly;
        refused(
            open_root_request(&pod, Some(&block)),
            "writer identity is root",
        );
        // Another namespace, another Job, a Job of another UID than the status records.
        let mut p = pod.clone();
        p.metadata.namespace = Some("intruder".into());
        refused(open_root_request(&p, Some(&b)), "writer Job");
        let mut p = pod.clone();
        p.metadata.owner_references.as_mut().unwrap()[0].name = "my-job".into();
        refused(open_root_request(&p, Some(&b)), "writer Job");
        let mut recorded = b.clone();
        recorded.status.as_mut().unwrap().writer = Some(WriterStatus {
            namespace: "team-a".into(),
            job_uid: Some("another-job".into()),
            ..WriterStatus::default()
        });
        refused(open_root_request(&pod, Some(&recorded)), "writer Job");
        // The writer namespace the status names (a takeover) is the one that counts.
        let mut moved = b.clone();
        moved.status.as_mut().unwrap().writer = Some(WriterStatus {
            namespace: "team-b".into(),
            ..WriterStatus::default()
        });
        refused(open_root_request(&pod, Some(&moved)), "team-b/");
        // Root, or no group: never given.
        let mut p = pod.clone();
        p.spec.as_mut().unwrap().containers[0]
            .security_context
            .as_mut()
            .unwrap()
            .run_as_user = Some(0);
        refused(open_root_request(&p, Some(&b)), "non-root runAsUser");
        let mut p = pod.clone();
        p.spec.as_mut().unwrap().containers[0]
            .security_context
            .as_mut()
            .unwrap()
            .run_as_group = None;
        refused(open_root_request(&p, Some(&b)), "runAsGroup");
        // Another volume under the model volume's name, or the view read-only.
        let mut p = pod.clone();
        p.spec.as_mut().unwrap().volumes.as_mut().unwrap()[0]
            .persistent_volume_claim
            .as_mut()
            .unwrap()
            .claim_name = "my-data".into();
        refused(open_root_request(&p, Some(&b)), "writer view claim");
        let mut p = pod;
        p.spec.as_mut().unwrap().volumes.as_mut().unwrap()[0]
            .persistent_volume_claim
            .as_mut()
            .unwrap()
            .read_only = Some(true);
        refused(open_root_request(&p, Some(&b)), "writer view claim");
    }

    fn bound_claim(pv: &PersistentVolume, claim: &PersistentVolumeClaim) -> PersistentVolumeClaim {
        let mut c = claim.clone();
        c.spec = Some(PersistentVolumeClaimSpec {
            volume_name: pv.metadata.name.clone(),
            ..c.spec.clone().unwrap_or_default()
        });
        c.status = Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            ..PersistentVolumeClaimStatus::default()
        });
        c
    }

    #[test]
    fn only_the_derived_writer_view_on_the_primarys_handle_is_trusted() {
        let b = root_binding();
        let OpenRootState::Open(open) = open_root_request(&writer_pod(&b), Some(&b)) else {
            panic!("the writer is opened");
        };
        let primary = primary_pv();
        let (pv, claim) = writer_view_in(&b, &primary, "team-a").unwrap();
        let claim = bound_claim(&pv, &claim);
        assert_eq!(
            trusted_writer_view(&b, &open, &claim, &pv, &primary),
            Ok(writer_view_pv_name_in(&b, "team-a"))
        );

        // The claim not Bound, or bound elsewhere.
        let mut c = claim.clone();
        c.status = None;
        assert!(trusted_writer_view(&b, &open, &c, &pv, &primary).is_err());
        let mut c = claim.clone();
        c.spec.as_mut().unwrap().volume_name = Some("someone-elses-pv".into());
        assert!(trusted_writer_view(&b, &open, &c, &pv, &primary).is_err());
        // A PV not labelled for the binding, not the writer's, or pre-bound elsewhere.
        let mut p = pv.clone();
        p.metadata.labels.as_mut().unwrap().remove(BINDING_LABEL);
        assert!(trusted_writer_view(&b, &open, &claim, &p, &primary).is_err());
        let mut p = pv.clone();
        p.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(VOLUME_ROLE_LABEL.into(), "reader".into());
        assert!(trusted_writer_view(&b, &open, &claim, &p, &primary).is_err());
        let mut p = pv.clone();
        p.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            namespace: Some("intruder".into()),
            name: Some(open.claim.clone()),
            ..ObjectReference::default()
        });
        assert!(trusted_writer_view(&b, &open, &claim, &p, &primary).is_err());
        // Another handle or driver than the primary's.
        let mut p = pv.clone();
        p.spec.as_mut().unwrap().csi.as_mut().unwrap().volume_handle = "handle-2".into();
        assert!(trusted_writer_view(&b, &open, &claim, &p, &primary).is_err());
        let mut p = pv.clone();
        p.spec.as_mut().unwrap().csi.as_mut().unwrap().driver = "other.csi".into();
        assert!(trusted_writer_view(&b, &open, &claim, &p, &primary).is_err());
        // A primary the binding does not record.
        let mut other = primary.clone();
        other.metadata.name = Some("pvc-other".into());
        assert!(trusted_writer_view(&b, &open, &claim, &pv, &other).is_err());
        let mut unrecorded = b.clone();
        unrecorded.status = None;
        assert!(trusted_writer_view(&unrecorded, &open, &claim, &pv, &primary).is_err());
    }
}
