//! The node agent's decisions for a staged (roxReadOnly) download, as a pure function: given a
//! staging pod on the agent's node, its binding, the primary claim and the mount holder, what
//! to do next ([`staging_step`]). The agent (model-volume-controller) does the IO: it measures
//! the staged tree, creates what this returns, copies through the holder's volume path and
//! answers the staging pod's hold container (see [`crate::writer`], "The staging Job").
//!
//! The rules:
//!
//! - Only a staging pod whose download init container **exited 0** and whose hold container is
//!   still running is copied; anything else waits (the Job decides about failures).
//! - The primary claim is created by the agent (`rw-pvc-<hash>` in the control namespace,
//!   ReadWriteOnce, the measured bytes + 10 % rounded up to GiB, at least the operator's floor)
//!   with an atomic create: the create is the election among agents. It records the node and
//!   the staging pod ([`COPY_NODE_ANNOTATION`], [`COPY_POD_ANNOTATION`]) and asks for this node
//!   (`volume.kubernetes.io/selected-node`, what the scheduler would write for a
//!   WaitForFirstConsumer class, since the holder is placed by `nodeName`).
//! - A claim this agent did not create for this pod is never written to: another staging pod's
//!   claim waits, a claim without the agent's records is foreign.
//! - The copy goes through a **mount holder** pod on this node (pause image, restricted) that
//!   mounts the claim read-write; only once it runs and the claim is bound.
//! - After the copy is recorded on the claim ([`crate::volume_keys::COPIED_BYTES_ANNOTATION`]) the hold is answered
//!   `copied` and the holder deleted (so the volume can detach); after
//!   [`MAX_COPY_ATTEMPTS`] failed copies the holder and the claim are deleted and the hold is
//!   answered `failed` (the Job fails, the binding controller writes the failure record).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, ResourceRequirements,
    SeccompProfile, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use warmcache_api_modelcache::v2beta1::{ModelCacheBinding, ReadOnlyView, Transition};
use warmcache_api_modelcache::{identity_hash, reader_pvc_name, writer_job_name};

use crate::keys::{
    BINDING_ANNOTATION, MANAGED_BY_LABEL, MANAGED_BY_VALUE, MODEL_LABEL, MODEL_VOLUME,
    PENDING_LABEL, ROLE_LABEL, ROLE_READER,
};
use crate::lifecycle::copied_bytes;
use crate::view;
use crate::volume_keys::{
    BINDING_LABEL, BINDING_UID_LABEL_ANNOTATION, COPY_ATTEMPTS_ANNOTATION, COPY_NODE_ANNOTATION,
    SOURCE_NAMESPACE_LABEL, WRITER_CONTAINER,
};
use crate::writer::{HOLD_CONTAINER, STAGING_VOLUME_ANNOTATION};

/// Failed copies after which the agent gives up.
pub const MAX_COPY_ATTEMPTS: u32 = 3;

/// Annotation on a primary claim the agent created: the UID of the staging pod it copies.
pub const COPY_POD_ANNOTATION: &str = "warmcache.nvidia.io/copy-pod";
/// Annotation on a primary claim the agent created: the name of that staging pod (in the
/// namespace of [`crate::volume_keys::SOURCE_NAMESPACE_LABEL`], also an annotation there).
pub const COPY_POD_NAME_ANNOTATION: &str = "warmcache.nvidia.io/copy-pod-name";

/// The label of mount holder pods (`app.kubernetes.io/component`).
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
/// [`COMPONENT_LABEL`] of mount holder pods.
pub const MOUNT_HOLDER: &str = "mount-holder";
/// The volume of a mount holder pod.
pub const HOLDER_VOLUME: &str = "nvsnap-primary";
/// Where the holder mounts it (the agent reaches it through the kubelet's pod volume path).
pub const HOLDER_MOUNT_PATH: &str = "/nvsnap-primary";
/// The annotation a scheduler writes on a WaitForFirstConsumer claim: the node to provision for.
pub const SELECTED_NODE_ANNOTATION: &str = "volume.kubernetes.io/selected-node";

/// The staged download of a staging pod, as the agent reads it from the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staged {
    /// The pod's namespace (the writer namespace).
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID (its kubelet directory).
    pub uid: String,
    /// The binding it stages for (control namespace).
    pub binding: String,
    /// The binding's UID the Job recorded.
    pub binding_uid: String,
    /// The emptyDir holding the staged tree.
    pub staging_volume: String,
    /// The Job controlling the pod (its controller ownerReference of kind `batch/v1` Job):
    /// name and UID.
    pub job: Option<(String, String)>,
}

/// Where a staging pod is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StagingState {
    /// Not a staging pod, or one missing its records (nothing to do).
    NotStaging(String),
    /// The download runs (or has not started).
    Downloading,
    /// The download failed: the Job's.
    DownloadFailed,
    /// The hold container ended (answered, or stopped): nothing to do.
    Answered,
    /// The download exited 0 and the hold waits: copy it.
    Staged(Staged),
}

pub(crate) fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

/// Reads a staging pod (its annotations, the download init container and the hold container).
pub fn staging_state(pod: &Pod) -> StagingState {
    let meta = &pod.metadata;
    let (Some(namespace), Some(name), Some(uid)) = (&meta.namespace, &meta.name, &meta.uid) else {
        return StagingState::NotStaging("the pod has no namespace, name or UID".to_owned());
    };
    let (Some(binding), Some(binding_uid), Some(volume)) = (
        annotation(meta, BINDING_ANNOTATION),
        annotation(meta, BINDING_UID_LABEL_ANNOTATION),
        annotation(meta, STAGING_VOLUME_ANNOTATION),
    ) else {
        return StagingState::NotStaging(format!(
            "the pod lacks {BINDING_ANNOTATION}, {BINDING_UID_LABEL_ANNOTATION} or {STAGING_VOLUME_ANNOTATION}"
        ));
    };
    let declared = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|vs| vs.iter().any(|v| v.name == volume && v.empty_dir.is_some()));
    if !declared {
        return StagingState::NotStaging(format!(
            "the pod's staging volume {volume} is not one of its emptyDir volumes"
        ));
    }
    if meta.deletion_timestamp.is_some() {
        return StagingState::Answered;
    }
    let status = pod.status.as_ref();
    let download = status
        .and_then(|s| s.init_container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == WRITER_CONTAINER))
        .and_then(|c| c.state.as_ref());
    match download.and_then(|s| s.terminated.as_ref()) {
        Some(t) if t.exit_code == 0 => {}
        Some(_) => return StagingState::DownloadFailed,
        None => return StagingState::Downloading,
    }
    let hold_running = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == HOLD_CONTAINER))
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.running.is_some());
    if !hold_running {
        let hold_ended = status
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.name == HOLD_CONTAINER))
            .and_then(|c| c.state.as_ref())
            .is_some_and(|s| s.terminated.is_some());
        return if hold_ended {
            StagingState::Answered
        } else {
            StagingState::Downloading
        };
    }
    let job = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.api_version == "batch/v1" && o.kind == "Job")
        .map(|o| (o.name.clone(), o.uid.clone()));
    StagingState::Staged(Staged {
        job,
        namespace: namespace.clone(),
        name: name.clone(),
        uid: uid.clone(),
        binding: binding.to_owned(),
        binding_uid: binding_uid.to_owned(),
        staging_volume: volume.to_owned(),
    })
}

/// The name of the mount holder of `binding`'s primary: `nvsnap-holder-<hash>`.
pub fn holder_name(binding: &ModelCacheBinding) -> String {
    let hash = identity_hash(&binding.spec.identity);
    let short = hash.get(..40).unwrap_or(&hash);
    format!("nvsnap-holder-{short}")
}

fn labels(binding: &ModelCacheBinding) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned()),
        (COMPONENT_LABEL.to_owned(), MOUNT_HOLDER.to_owned()),
        (
            BINDING_LABEL.to_owned(),
            binding.metadata.name.clone().unwrap_or_default(),
        ),
    ])
}

/// The mount holder's image and its pull policy (the agent's settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderImage {
    /// A pause image present on the nodes.
    pub image: String,
    /// `IfNotPresent`, `Always` or `Never`.
    pub pull_policy: String,
}

/// The mount holder pod: on `node`, in the control namespace, mounting the primary claim
/// read-write so the kubelet attaches and mounts it; `image` runs nothing but a pause. Passes
/// Pod Security "restricted"; tolerates every taint (GPU nodes are usually tainted).
pub fn holder_pod(binding: &ModelCacheBinding, node: &str, image: &HolderImage) -> Pod {
    pause_pod(
        ObjectMeta {
            name: Some(holder_name(binding)),
            namespace: binding.metadata.namespace.clone(),
            labels: Some(labels(binding)),
            annotations: Some(BTreeMap::from([(
                BINDING_UID_LABEL_ANNOTATION.to_owned(),
                binding.metadata.uid.clone().unwrap_or_default(),
            )])),
            ..ObjectMeta::default()
        },
        node,
        image,
        (
            HOLDER_VOLUME,
            HOLDER_MOUNT_PATH,
            &warmcache_api_modelcache::writer_pvc_name(&binding.spec.identity),
        ),
        false,
    )
}

/// A pause pod on `node` mounting `claim` (volume name, mount path, claim), read-only or not.
fn pause_pod(
    metadata: ObjectMeta,
    node: &str,
    image: &HolderImage,
    (volume, path, claim): (&str, &str, &str),
    read_only: bool,
) -> Pod {
    let restricted = SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            add: None,
            drop: Some(vec!["ALL".to_owned()]),
        }),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        run_as_user: Some(65_535),
        run_as_group: Some(65_535),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            localhost_profile: None,
        }),
        ..SecurityContext::default()
    };
    let small = BTreeMap::from([
        ("cpu".to_owned(), Quantity("10m".to_owned())),
        ("memory".to_owned(), Quantity("16Mi".to_owned())),
    ]);
    Pod {
        metadata,
        spec: Some(PodSpec {
            node_name: Some(node.to_owned()),
            restart_policy: Some("Always".to_owned()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(0),
            tolerations: Some(vec![Toleration {
                operator: Some("Exists".to_owned()),
                ..Toleration::default()
            }]),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(65_535),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".to_owned(),
                    localhost_profile: None,
                }),
                ..PodSecurityContext::default()
            }),
            containers: vec![Container {
                name: "hold".to_owned(),
                image: Some(image.image.clone()),
                image_pull_policy: Some(image.pull_policy.clone()),
                volume_mounts: Some(vec![VolumeMount {
                    name: volume.to_owned(),
                    mount_path: path.to_owned(),
                    read_only: read_only.then_some(true),
                    ..VolumeMount::default()
                }]),
                resources: Some(ResourceRequirements {
                    requests: Some(small.clone()),
                    limits: Some(small),
                    ..ResourceRequirements::default()
                }),
                security_context: Some(restricted),
                ..Container::default()
            }],
            volumes: Some(vec![Volume {
                name: volume.to_owned(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.to_owned(),
                    read_only: Some(read_only),
                }),
                ..Volume::default()
            }]),
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// The pod a primary claim is filled from (a staging pod, or a capture source): what the
/// election records on the claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourcePod<'a> {
    /// Its namespace.
    pub namespace: &'a str,
    /// Its name.
    pub name: &'a str,
    /// Its UID.
    pub uid: &'a str,
}

impl<'a> From<&'a Staged> for SourcePod<'a> {
    fn from(s: &'a Staged) -> Self {
        SourcePod {
            namespace: &s.namespace,
            name: &s.name,
            uid: &s.uid,
        }
    }
}

/// What an election records on a primary claim: the node ([`COPY_NODE_ANNOTATION`]) and the
/// pod ([`COPY_POD_ANNOTATION`], [`COPY_POD_NAME_ANNOTATION`], and its namespace under
/// [`SOURCE_NAMESPACE_LABEL`]) the claim is filled from on that node.
pub fn election_annotations(source: SourcePod<'_>, node: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (COPY_NODE_ANNOTATION.to_owned(), node.to_owned()),
        (COPY_POD_ANNOTATION.to_owned(), source.uid.to_owned()),
        (COPY_POD_NAME_ANNOTATION.to_owned(), source.name.to_owned()),
        (
            SOURCE_NAMESPACE_LABEL.to_owned(),
            source.namespace.to_owned(),
        ),
    ])
}

/// The primary claim the agent creates for the pod `source` on `node`: ReadWriteOnce, sized
/// from the measured `bytes` ([`view::sized`]: 10 % headroom, whole GiB, at least `min_bytes`),
/// with the election's records ([`election_annotations`]), the binding's UID, and this node as
/// the selected node (the holder is placed by `nodeName`). Its atomic create is the election.
pub fn elected_primary_claim(
    binding: &ModelCacheBinding,
    source: SourcePod<'_>,
    node: &str,
    bytes: u64,
    min_bytes: u64,
) -> PersistentVolumeClaim {
    let mut claim = view::primary_claim(binding, view::sized(bytes, min_bytes));
    if let Some(spec) = claim.spec.as_mut() {
        spec.access_modes = Some(vec!["ReadWriteOnce".to_owned()]);
    }
    let mut annotations = election_annotations(source, node);
    annotations.insert(SELECTED_NODE_ANNOTATION.to_owned(), node.to_owned());
    annotations.insert(
        BINDING_UID_LABEL_ANNOTATION.to_owned(),
        binding.metadata.uid.clone().unwrap_or_default(),
    );
    claim.metadata.annotations = Some(annotations);
    claim
}

/// The primary claim the agent creates for `staged` on `node` ([`elected_primary_claim`]).
pub fn staged_primary_claim(
    binding: &ModelCacheBinding,
    staged: &Staged,
    node: &str,
    bytes: u64,
    min_bytes: u64,
) -> PersistentVolumeClaim {
    elected_primary_claim(binding, staged.into(), node, bytes, min_bytes)
}

/// The failed copies recorded on a claim.
pub fn copy_attempts(claim: &PersistentVolumeClaim) -> u32 {
    annotation(&claim.metadata, COPY_ATTEMPTS_ANNOTATION)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// An object to delete with its UID as precondition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Doomed {
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
}

pub(crate) fn doomed(meta: &ObjectMeta) -> Option<Doomed> {
    if meta.deletion_timestamp.is_some() {
        return None;
    }
    Some(Doomed {
        name: meta.name.clone()?,
        uid: meta.uid.clone()?,
    })
}

/// What the agent does next for one staged download.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentStep {
    /// Nothing now (the reason, for the log).
    Wait(String),
    /// Measure the staged tree and create the primary claim sized from it
    /// ([`staged_primary_claim`]); AlreadyExists means another agent won.
    CreateClaim,
    /// Create the mount holder ([`holder_pod`]).
    CreateHolder(Box<Pod>),
    /// Delete a mount holder that ended (it is recreated).
    DeleteHolder(Doomed),
    /// Copy the staged tree into the holder's volume (`pods/<holder uid>/volumes/
    /// kubernetes.io~csi/<pv>/mount` under the kubelet root), then record the bytes and the
    /// manifest digest on the claim; a failure increments [`COPY_ATTEMPTS_ANNOTATION`].
    Copy {
        /// The holder pod's UID.
        holder_uid: String,
        /// The PV the claim is bound to.
        pv: String,
    },
    /// The copy is recorded: answer the hold `copied` and delete the holder, if any.
    AnswerCopied {
        /// The holder to delete.
        holder: Option<Doomed>,
    },
    /// Give up: delete the holder and the claim, answer the hold `failed` with these words.
    GiveUp {
        /// The holder to delete.
        holder: Option<Doomed>,
        /// The primary claim to delete.
        claim: Option<Doomed>,
        /// Why.
        words: String,
    },
    /// The claim was created for another staging pod that is gone, and records no copy: delete
    /// it (and the mount holder of the binding, wherever it runs) so a new election follows.
    DropClaim {
        /// The claim.
        claim: Doomed,
    },
    /// An object under the binding's names that the agent did not create for this pod.
    Foreign(String),
}

/// What the agent observed for `staged`.
#[derive(Debug, Clone, Copy)]
pub struct AgentObserved<'a> {
    /// The agent's node.
    pub node: &'a str,
    /// The staged download.
    pub staged: &'a Staged,
    /// Its binding, if it exists.
    pub binding: Option<&'a ModelCacheBinding>,
    /// The primary claim, if it exists.
    pub claim: Option<&'a PersistentVolumeClaim>,
    /// The mount holder, if it exists.
    pub holder: Option<&'a Pod>,
    /// The mount holder's image.
    pub holder_image: &'a HolderImage,
    /// Whether the staging pod the claim was created for ([`COPY_POD_ANNOTATION`],
    /// [`COPY_POD_NAME_ANNOTATION`]) is gone: not found, another UID, finished or being deleted,
    /// read afresh by the agent. Only a definite answer is `true`.
    pub claim_pod_gone: bool,
}

/// The next step for a staged download (see the module documentation).
pub fn staging_step(obs: &AgentObserved<'_>) -> AgentStep {
    let staged = obs.staged;
    let Some(b) = obs.binding else {
        return AgentStep::Wait(format!(
            "binding {} is gone; the staging pod is left to its Job's deadline",
            staged.binding
        ));
    };
    if b.metadata.uid.as_deref() != Some(staged.binding_uid.as_str()) {
        return AgentStep::Foreign(format!(
            "staging pod {}/{} names binding {} with UID {}, which is not the binding's",
            staged.namespace, staged.name, staged.binding, staged.binding_uid
        ));
    }
    if b.spec.decision.transition != Transition::RoxReadOnly {
        return AgentStep::Foreign(format!(
            "binding {} is not roxReadOnly; only block caches are staged",
            staged.binding
        ));
    }
    // Only the binding's own staging Job, in its writer namespace, fills its primary: a pod
    // anyone else labels and annotates like one is never copied.
    let writer = b.status.as_ref().and_then(|s| s.writer.as_ref());
    let writer_ns = writer.map_or(b.spec.resources.writer_namespace.as_str(), |w| {
        w.namespace.as_str()
    });
    let job_name = writer_job_name(&b.spec.identity);
    let job_ok = staged.job.as_ref().is_some_and(|(name, uid)| {
        *name == job_name
            && writer
                .and_then(|w| w.job_uid.as_ref())
                .is_none_or(|u| u == uid)
    });
    if staged.namespace != writer_ns || !job_ok {
        return AgentStep::Foreign(format!(
            "pod {}/{} is not binding {}'s staging Job {writer_ns}/{job_name}; it is never copied",
            staged.namespace, staged.name, staged.binding
        ));
    }
    let Some(claim) = obs.claim else {
        return AgentStep::CreateClaim;
    };
    let claim_name = claim.metadata.name.clone().unwrap_or_default();
    let ours = claim
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(BINDING_LABEL))
        == b.metadata.name.as_ref()
        && annotation(&claim.metadata, BINDING_UID_LABEL_ANNOTATION) == b.metadata.uid.as_deref();
    let pod = annotation(&claim.metadata, COPY_POD_ANNOTATION);
    let node = annotation(&claim.metadata, COPY_NODE_ANNOTATION);
    if !ours || pod.is_none() || node.is_none() {
        return AgentStep::Foreign(format!(
            "claim {claim_name} exists but no node agent created it for binding {}; it is never written to",
            staged.binding
        ));
    }
    let holder = obs
        .holder
        .filter(|h| {
            h.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(obs.node)
                && h.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(COMPONENT_LABEL))
                    == Some(&MOUNT_HOLDER.to_owned())
        })
        .and_then(|h| doomed(&h.metadata));
    if pod != Some(staged.uid.as_str()) || node != Some(obs.node) {
        // Another staging pod's claim: once that pod is gone (evicted, its node lost, its Job
        // retried) before a copy was recorded, the claim is dropped so this pod's agent can be
        // elected; a recorded copy is the binding controller's to complete.
        if copied_bytes(claim).is_none() && obs.claim_pod_gone {
            return match doomed(&claim.metadata) {
                Some(claim) => AgentStep::DropClaim { claim },
                None => AgentStep::Wait(format!("claim {claim_name} is being deleted")),
            };
        }
        return AgentStep::Wait(format!(
            "claim {claim_name} is being filled from staging pod {} on node {}",
            pod.unwrap_or_default(),
            node.unwrap_or_default()
        ));
    }
    if copied_bytes(claim).is_some() {
        return AgentStep::AnswerCopied { holder };
    }
    let attempts = copy_attempts(claim);
    if attempts >= MAX_COPY_ATTEMPTS {
        return AgentStep::GiveUp {
            holder,
            claim: doomed(&claim.metadata),
            words: format!("the copy into claim {claim_name} failed {attempts} times"),
        };
    }
    let Some(h) = obs.holder else {
        return AgentStep::CreateHolder(Box::new(holder_pod(b, obs.node, obs.holder_image)));
    };
    if h.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(obs.node) {
        return AgentStep::Foreign(format!(
            "mount holder {} is not on node {}",
            h.metadata.name.clone().unwrap_or_default(),
            obs.node
        ));
    }
    let phase = h.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Failed" | "Succeeded")) {
        return match doomed(&h.metadata) {
            Some(d) => AgentStep::DeleteHolder(d),
            None => AgentStep::Wait("the ended mount holder is being deleted".to_owned()),
        };
    }
    let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let pv = claim.spec.as_ref().and_then(|s| s.volume_name.clone());
    let running = phase == Some("Running")
        && h.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|cs| cs.iter().all(|c| c.ready));
    match (bound, pv, running, &h.metadata.uid) {
        (true, Some(pv), true, Some(uid)) => AgentStep::Copy {
            holder_uid: uid.clone(),
            pv,
        },
        _ => AgentStep::Wait(format!(
            "waiting for claim {claim_name} to bind and its mount holder to run"
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// hostPath readers
// ---------------------------------------------------------------------------------------------
//
// A hostPath reader (reader mode `hostPath`, block storage) mounts the node directory
// `<bind root>/<hash>` with `HostToContainer` propagation and waits for the completion marker
// there. The agent of its node makes that directory a verified read-only bind of the binding's
// read-only view, reached through a **view holder**: a pause pod on the node, in a reader's
// namespace (a pod mounts only claims of its own namespace), mounting that namespace's view
// claim (`ro-pvc-<hash>`, which the binding controller creates for every namespace with a pod
// naming the binding, hostPath readers included) read-only. All readers of one model on a node
// share one bind and one holder. The rules:
//
// - Only `<bind root>/<hash>` of the pod's own model label is ever bound (a pod naming another
//   host directory is refused), and only for a roxReadOnly binding named by that hash whose data
//   identity (the primary's volume handle) is recorded.
// - The view is trusted only when its PV is the one the binding records for that namespace,
//   labelled for the binding, pre-bound to the view claim, and its volume handle is the
//   primary's handle derived for that namespace ([`view::view_volume_handle`]); the claim must
//   be Bound to it and the holder running and ready. The bind's source is then the kubelet's
//   mount of exactly that PV in exactly that holder.
// - A pending reader is un-pended only after the bind was verified against the mount table (the
//   agent's IO, `ensure_read_only_bind_over_empty`), and only when the binding records a view
//   for its own namespace (the binding controller accepted the namespace).
// - With no live reader of the model left on the node, the bind is removed and the holders
//   deleted (UID preconditions); the directory and anything in it stay.

/// Label of view holders: what they hold ([`HOLDS_HOST_VIEW`]).
pub const HOLDS_LABEL: &str = "warmcache.nvidia.io/holds";
/// [`HOLDS_LABEL`] of view holders: the read-only view bound for hostPath readers.
pub const HOLDS_HOST_VIEW: &str = "host-view";
/// The volume of a view holder.
pub const VIEW_HOLDER_VOLUME: &str = "nvsnap-view";
/// Where a view holder mounts it.
pub const VIEW_HOLDER_MOUNT_PATH: &str = "/nvsnap-view";

/// A hostPath reader, as the agent reads it from the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostReader {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID.
    pub uid: String,
    /// Its model label: the binding's identity hash.
    pub hash: String,
    /// The binding it names.
    pub binding: String,
    /// The node directory it mounts (`<bind root>/<hash>`).
    pub target: String,
    /// Labelled pending ([`PENDING_LABEL`] `"true"`).
    pub pending: bool,
    /// Not finished (a pod being deleted still runs its containers, so it counts).
    pub live: bool,
}

/// What a pod is to the hostPath-reader part of the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostReaderState {
    /// Not a hostPath reader (a pvc reader, or not a reader).
    NotHostReader,
    /// Looks like one but is never served (why, for the log).
    Refused(String),
    /// A hostPath reader.
    Reader(HostReader),
}

/// Whether `hash` is what a model label holds: 1 to 64 lowercase hex digits (so it is one path
/// component and names no other directory).
pub fn is_model_hash(hash: &str) -> bool {
    !hash.is_empty()
        && hash.len() <= 64
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The bind target of the model `hash` under `bind_root` (`<bind root>/<hash>`).
pub fn bind_target(bind_root: &str, hash: &str) -> String {
    format!("{}/{hash}", bind_root.trim_end_matches('/'))
}

/// Reads a pod as a hostPath reader of a model under `bind_root`.
pub fn host_reader(pod: &Pod, bind_root: &str) -> HostReaderState {
    let meta = &pod.metadata;
    let label = |k: &str| {
        meta.labels
            .as_ref()
            .and_then(|l| l.get(k))
            .map(String::as_str)
    };
    if label(ROLE_LABEL) != Some(ROLE_READER) {
        return HostReaderState::NotHostReader;
    }
    let Some(path) = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .and_then(|vs| vs.iter().find(|v| v.name == MODEL_VOLUME))
        .and_then(|v| v.host_path.as_ref())
        .map(|h| h.path.clone())
    else {
        return HostReaderState::NotHostReader;
    };
    let (Some(namespace), Some(name), Some(uid)) = (&meta.namespace, &meta.name, &meta.uid) else {
        return HostReaderState::Refused("the pod has no namespace, name or UID".to_owned());
    };
    let Some(hash) = label(MODEL_LABEL).filter(|h| is_model_hash(h)) else {
        return HostReaderState::Refused(format!(
            "pod {namespace}/{name} has no model label of hex digits ({MODEL_LABEL})"
        ));
    };
    let target = bind_target(bind_root, hash);
    if path.trim_end_matches('/') != target {
        return HostReaderState::Refused(format!(
            "pod {namespace}/{name} mounts host directory {path}, not {target}: only the bind root's directory of its model is ever bound"
        ));
    }
    let Some(binding) = annotation(meta, BINDING_ANNOTATION) else {
        return HostReaderState::Refused(format!(
            "pod {namespace}/{name} names no binding ({BINDING_ANNOTATION})"
        ));
    };
    HostReaderState::Reader(HostReader {
        namespace: namespace.clone(),
        name: name.clone(),
        uid: uid.clone(),
        hash: hash.to_owned(),
        binding: binding.to_owned(),
        target,
        pending: label(PENDING_LABEL) == Some("true"),
        live: !matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        ),
    })
}

/// The view holder of the model `hash` on `node` (one per namespace it runs in):
/// `nvsnap-view-<40 hex of the hash>-<8 hex of the node>`.
pub fn view_holder_name(hash: &str, node: &str) -> String {
    let short = hash.get(..40).unwrap_or(hash);
    format!("nvsnap-view-{short}-{}", view::namespace_suffix(node))
}

/// Whether `pod` is a view holder (of any model).
pub fn is_view_holder(pod: &Pod) -> bool {
    let labels = pod.metadata.labels.as_ref();
    let get = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    get(COMPONENT_LABEL) == Some(MOUNT_HOLDER)
        && get(HOLDS_LABEL) == Some(HOLDS_HOST_VIEW)
        && get(MANAGED_BY_LABEL) == Some(MANAGED_BY_VALUE)
}

/// The view holder pod of `binding`'s model on `node` in `namespace`: mounting that namespace's
/// view claim read-only (`persistentVolumeClaim.readOnly` and the mount), so the kubelet attaches
/// and mounts the view read-only.
pub fn view_holder_pod(
    binding: &ModelCacheBinding,
    namespace: &str,
    node: &str,
    image: &HolderImage,
) -> Pod {
    let hash = identity_hash(&binding.spec.identity);
    let mut labels = labels(binding);
    labels.insert(MODEL_LABEL.to_owned(), hash.clone());
    labels.insert(HOLDS_LABEL.to_owned(), HOLDS_HOST_VIEW.to_owned());
    pause_pod(
        ObjectMeta {
            name: Some(view_holder_name(&hash, node)),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                BINDING_UID_LABEL_ANNOTATION.to_owned(),
                binding.metadata.uid.clone().unwrap_or_default(),
            )])),
            ..ObjectMeta::default()
        },
        node,
        image,
        (
            VIEW_HOLDER_VOLUME,
            VIEW_HOLDER_MOUNT_PATH,
            &reader_pvc_name(&binding.spec.identity),
        ),
        true,
    )
}

fn recorded_views(binding: &ModelCacheBinding) -> Vec<&ReadOnlyView> {
    binding
        .status
        .iter()
        .flat_map(|s| s.realized.iter())
        .flat_map(|r| r.views.iter())
        .collect()
}

fn ended(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn pod_namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or_default()
}

/// The namespace whose view the bind of `readers`' model comes from: among the namespaces of
/// live readers for which `binding` records a view, the one a usable holder (on the node, not
/// ended, not being deleted) already runs in, else the first by name. `None` when no live
/// reader's namespace has a recorded view.
pub fn bind_namespace(
    readers: &[HostReader],
    binding: &ModelCacheBinding,
    holders: &[&Pod],
) -> Option<String> {
    let views = recorded_views(binding);
    let candidates: std::collections::BTreeSet<&str> = readers
        .iter()
        .filter(|r| r.live && views.iter().any(|v| v.namespace == r.namespace))
        .map(|r| r.namespace.as_str())
        .collect();
    holders
        .iter()
        .filter(|h| !ended(h) && h.metadata.deletion_timestamp.is_none())
        .map(|h| pod_namespace(h))
        .filter(|ns| candidates.contains(ns))
        .min()
        .or_else(|| candidates.first().copied())
        .map(str::to_owned)
}

/// A reader to un-pend: its namespace, name and UID (the patch's precondition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unpend {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

/// A holder to delete, in its namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoomedIn {
    /// Its namespace.
    pub namespace: String,
    /// Name and UID.
    pub pod: Doomed,
}

fn doomed_in(pod: &Pod) -> Option<DoomedIn> {
    Some(DoomedIn {
        namespace: pod.metadata.namespace.clone()?,
        pod: doomed(&pod.metadata)?,
    })
}

/// What the agent does next for the hostPath readers of one model on its node.
#[derive(Debug, Clone, PartialEq)]
pub enum HostBindStep {
    /// Nothing now (why, for the log).
    Wait(String),
    /// Something that must not be bound (why); the readers stay pending.
    Foreign(String),
    /// Create the view holder ([`view_holder_pod`]).
    CreateHolder(Box<Pod>),
    /// Delete ended view holders (they are recreated).
    DeleteHolders(Vec<DoomedIn>),
    /// Make `target` a verified read-only bind of the holder's mount of `pv`
    /// (`pods/<holder uid>/volumes/kubernetes.io~csi/<pv>/mount` under the kubelet root), only
    /// over an empty directory when nothing is bound there; once the mount table shows it,
    /// un-pend `unpend` and delete the holders no longer used (`retire`).
    Bind {
        /// The holder pod's UID.
        holder_uid: String,
        /// The view PV.
        pv: String,
        /// The node directory.
        target: String,
        /// Pending readers to un-pend once the bind is verified.
        unpend: Vec<Unpend>,
        /// Holders of the model in other namespaces, deleted once the bind is verified.
        retire: Vec<DoomedIn>,
    },
    /// No live reader of the model is left on the node: unbind `target`, then delete `holders`.
    Unbind {
        /// The node directory.
        target: String,
        /// Every view holder of the model on the node.
        holders: Vec<DoomedIn>,
    },
}

/// What the agent observed for the hostPath readers of the model `hash` on its node.
#[derive(Debug, Clone, Copy)]
pub struct HostBindObserved<'a> {
    /// The agent's node.
    pub node: &'a str,
    /// The bind root.
    pub bind_root: &'a str,
    /// The model (the binding's identity hash).
    pub hash: &'a str,
    /// This node's hostPath readers of the model.
    pub readers: &'a [HostReader],
    /// The binding `model-cache-<hash>`, if it exists.
    pub binding: Option<&'a ModelCacheBinding>,
    /// This node's view holders of the model, in any namespace.
    pub holders: &'a [&'a Pod],
    /// The view claim of [`bind_namespace`]'s namespace, read afresh.
    pub view_claim: Option<&'a PersistentVolumeClaim>,
    /// The view PV the binding records for that namespace, read afresh.
    pub view_pv: Option<&'a PersistentVolume>,
    /// The mount holder's image.
    pub holder_image: &'a HolderImage,
}

/// The next step for the hostPath readers of one model on the node (see the rules above).
pub fn host_bind_step(obs: &HostBindObserved<'_>) -> HostBindStep {
    let target = bind_target(obs.bind_root, obs.hash);
    let all_holders = || obs.holders.iter().filter_map(|h| doomed_in(h)).collect();
    if !is_model_hash(obs.hash) {
        return HostBindStep::Foreign(format!("{} is not a model hash", obs.hash));
    }
    let live: Vec<&HostReader> = obs
        .readers
        .iter()
        .filter(|r| r.live && r.hash == obs.hash)
        .collect();
    if live.is_empty() {
        return HostBindStep::Unbind {
            target,
            holders: all_holders(),
        };
    }
    let Some(b) = obs.binding else {
        return HostBindStep::Wait(format!("the binding of model {} is not there", obs.hash));
    };
    let name = b.metadata.name.clone().unwrap_or_default();
    if identity_hash(&b.spec.identity) != obs.hash {
        return HostBindStep::Foreign(format!("binding {name} is not of model {}", obs.hash));
    }
    if b.spec.decision.transition != Transition::RoxReadOnly {
        return HostBindStep::Foreign(format!(
            "binding {name} is not roxReadOnly; hostPath readers are served only for block storage"
        ));
    }
    let Some(handle) = b
        .status
        .as_ref()
        .and_then(|s| s.realized.as_ref())
        .and_then(|r| r.provider_data_identity.as_deref())
    else {
        return HostBindStep::Wait(format!("binding {name} records no complete primary yet"));
    };
    let readers: Vec<HostReader> = live
        .iter()
        .filter(|r| r.binding == name)
        .map(|r| (*r).clone())
        .collect();
    let ended_holders: Vec<DoomedIn> = obs
        .holders
        .iter()
        .filter(|h| ended(h))
        .filter_map(|h| doomed_in(h))
        .collect();
    if !ended_holders.is_empty() {
        return HostBindStep::DeleteHolders(ended_holders);
    }
    let Some(ns) = bind_namespace(&readers, b, obs.holders) else {
        return HostBindStep::Wait(format!(
            "binding {name} records no view for a namespace of this node's readers yet"
        ));
    };
    let views = recorded_views(b);
    let Some(view) = views.iter().find(|v| v.namespace == ns) else {
        return HostBindStep::Wait(format!("binding {name} records no view of {ns}"));
    };
    let holder = obs.holders.iter().find(|h| {
        pod_namespace(h) == ns
            && h.metadata.name.as_deref() == Some(&view_holder_name(obs.hash, obs.node))
    });
    let Some(holder) = holder else {
        return HostBindStep::CreateHolder(Box::new(view_holder_pod(
            b,
            &ns,
            obs.node,
            obs.holder_image,
        )));
    };
    if holder.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(obs.node) {
        return HostBindStep::Foreign(format!(
            "view holder {ns}/{} is not on node {}",
            holder.metadata.name.clone().unwrap_or_default(),
            obs.node
        ));
    }
    if holder.metadata.deletion_timestamp.is_some() {
        return HostBindStep::Wait(format!("view holder in {ns} is being deleted"));
    }
    // The view: the recorded PV, the binding's, pre-bound to the claim, and a handle derived
    // from the primary's for this namespace.
    let claim_name = &view.persistent_volume_claim_name;
    let Some(claim) = obs.view_claim else {
        return HostBindStep::Wait(format!("view claim {ns}/{claim_name} is not there yet"));
    };
    let binding_of = |m: &ObjectMeta| {
        m.labels
            .as_ref()
            .and_then(|l| l.get(BINDING_LABEL))
            .cloned()
    };
    if binding_of(&claim.metadata).as_deref() != Some(name.as_str())
        || claim.metadata.name.as_deref() != Some(claim_name.as_str())
    {
        return HostBindStep::Foreign(format!(
            "claim {ns}/{claim_name} is not binding {name}'s view"
        ));
    }
    let Some(pv) = obs.view_pv else {
        return HostBindStep::Wait(format!(
            "view PV {} is not there yet",
            view.persistent_volume_name
        ));
    };
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    let spec = pv.spec.as_ref();
    let claim_ref = spec.and_then(|s| s.claim_ref.as_ref());
    let pv_handle = spec
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.as_str());
    let expected = view::view_volume_handle(&pv_name, &b.spec.decision.provider, handle, &ns);
    let problem = if pv_name != view.persistent_volume_name {
        Some(format!(
            "is not the recorded {}",
            view.persistent_volume_name
        ))
    } else if binding_of(&pv.metadata).as_deref() != Some(name.as_str()) {
        Some(format!("is not labelled for binding {name}"))
    } else if claim_ref.and_then(|r| r.namespace.as_deref()) != Some(ns.as_str())
        || claim_ref.and_then(|r| r.name.as_deref()) != Some(claim_name.as_str())
    {
        Some(format!("is not pre-bound to {ns}/{claim_name}"))
    } else {
        match &expected {
            Ok(h) if pv_handle == Some(h.as_str()) => None,
            Ok(h) => Some(format!(
                "has volume handle {}, not {h} (the primary's {handle} for {ns})",
                pv_handle.unwrap_or_default()
            )),
            Err(e) => Some(e.to_string()),
        }
    };
    if let Some(p) = problem {
        return HostBindStep::Foreign(format!("view PV {pv_name} {p}: never bound"));
    }
    let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
        && claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == Some(pv_name.as_str());
    let running = holder.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && holder
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|cs| !cs.is_empty() && cs.iter().all(|c| c.ready));
    let (true, true, Some(holder_uid)) = (bound, running, holder.metadata.uid.clone()) else {
        return HostBindStep::Wait(format!(
            "waiting for view claim {ns}/{claim_name} to bind and its holder to run"
        ));
    };
    let unpend = readers
        .iter()
        .filter(|r| r.pending && views.iter().any(|v| v.namespace == r.namespace))
        .map(|r| Unpend {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            uid: r.uid.clone(),
        })
        .collect();
    let retire = obs
        .holders
        .iter()
        .filter(|h| pod_namespace(h) != ns)
        .filter_map(|h| doomed_in(h))
        .collect();
    HostBindStep::Bind {
        holder_uid,
        pv: pv_name,
        target,
        unpend,
        retire,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{binding, init_step};
    use crate::volume_keys::COPIED_BYTES_ANNOTATION;
    use crate::writer::{WriterOptions, writer_job};
    use k8s_openapi::api::core::v1::HostPathVolumeSource;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus,
        PersistentVolumeClaimStatus, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use warmcache_api_modelcache::v2beta1::{
        ModelCacheBindingStatus, RealizedStorage, WriterStatus,
    };

    const NODE: &str = "gpu-1";
    const PAUSE: &str = "registry.k8s.io/pause:3.10";

    static PAUSE_IMAGE: std::sync::LazyLock<HolderImage> = std::sync::LazyLock::new(pause);

    fn pause() -> HolderImage {
        HolderImage {
            image: PAUSE.into(),
            pull_policy: "IfNotPresent".into(),
        }
    }

    fn status(name: &str, state: ContainerState) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(state),
            ready: true,
            ..ContainerStatus::default()
        }
    }

    fn exited(code: i32) -> ContainerState {
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        }
    }

    fn running() -> ContainerState {
        ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..ContainerState::default()
        }
    }

    /// The staging Job's pod, as the Job controller creates it from the template.
    fn staging_pod(
        b: &ModelCacheBinding,
        download: Option<ContainerState>,
        hold: Option<ContainerState>,
    ) -> Pod {
        let job = writer_job(b, &init_step(), &[], &WriterOptions::default()).unwrap();
        let template = job.spec.clone().unwrap().template;
        let mut meta = template.metadata.unwrap();
        meta.namespace = Some("team-a".into());
        meta.name = Some("dl-abc".into());
        meta.uid = Some("pod-uid".into());
        meta.owner_references = Some(vec![OwnerReference {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            name: job.metadata.name.clone().unwrap(),
            uid: "job-uid".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        Pod {
            metadata: meta,
            spec: template.spec,
            status: Some(PodStatus {
                init_container_statuses: download.map(|s| vec![status(WRITER_CONTAINER, s)]),
                container_statuses: hold.map(|s| vec![status(HOLD_CONTAINER, s)]),
                ..PodStatus::default()
            }),
        }
    }

    fn staged(b: &ModelCacheBinding) -> Staged {
        match staging_state(&staging_pod(b, Some(exited(0)), Some(running()))) {
            StagingState::Staged(s) => s,
            other => panic!("{other:?}"),
        }
    }

    fn obs<'a>(
        b: &'a ModelCacheBinding,
        s: &'a Staged,
        claim: Option<&'a PersistentVolumeClaim>,
        holder: Option<&'a Pod>,
    ) -> AgentObserved<'a> {
        AgentObserved {
            node: NODE,
            staged: s,
            binding: Some(b),
            claim,
            holder,
            holder_image: &PAUSE_IMAGE,
            claim_pod_gone: false,
        }
    }

    #[test]
    fn only_a_download_that_exited_0_with_its_hold_waiting_is_staged() {
        let b = binding(Transition::RoxReadOnly);
        assert_eq!(
            staging_state(&staging_pod(&b, None, None)),
            StagingState::Downloading
        );
        assert_eq!(
            staging_state(&staging_pod(&b, Some(exited(1)), None)),
            StagingState::DownloadFailed
        );
        assert_eq!(
            staging_state(&staging_pod(&b, Some(exited(0)), None)),
            StagingState::Downloading
        );
        assert_eq!(
            staging_state(&staging_pod(&b, Some(exited(0)), Some(exited(0)))),
            StagingState::Answered
        );
        let s = staged(&b);
        assert_eq!(s.staging_volume, crate::writer::STAGING_VOLUME);
        assert_eq!(s.binding_uid, b.metadata.uid.clone().unwrap());
        // A pod naming a staging volume it does not declare as an emptyDir is not staged (the
        // agent would otherwise read some other directory of the kubelet).
        let mut pod = staging_pod(&b, Some(exited(0)), Some(running()));
        pod.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(STAGING_VOLUME_ANNOTATION.into(), "../../etc".into());
        assert!(matches!(staging_state(&pod), StagingState::NotStaging(_)));
        // An RWX writer pod is not a staging pod.
        let rwx = binding(Transition::RwxReadOnly);
        let job = writer_job(&rwx, &init_step(), &[], &WriterOptions::default()).unwrap();
        let t = job.spec.unwrap().template;
        let mut meta = t.metadata.unwrap();
        meta.namespace = Some("team-a".into());
        meta.name = Some("w".into());
        meta.uid = Some("u".into());
        let pod = Pod {
            metadata: meta,
            spec: t.spec,
            status: None,
        };
        assert!(matches!(staging_state(&pod), StagingState::NotStaging(_)));
    }

    fn bound(mut claim: PersistentVolumeClaim) -> PersistentVolumeClaim {
        claim.metadata.uid = Some("claim-uid".into());
        claim.spec.as_mut().unwrap().volume_name = Some("pvc-1234".into());
        claim.status = Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            ..PersistentVolumeClaimStatus::default()
        });
        claim
    }

    fn ready(mut pod: Pod, phase: &str) -> Pod {
        pod.metadata.uid = Some("holder-uid".into());
        pod.status = Some(PodStatus {
            phase: Some(phase.into()),
            container_statuses: Some(vec![status("hold", running())]),
            ..PodStatus::default()
        });
        pod
    }

    /// From the staged download to the answer: claim, holder, copy, answer.
    #[test]
    fn a_staged_download_gets_a_sized_claim_a_holder_a_copy_and_an_answer() {
        let b = binding(Transition::RoxReadOnly);
        let s = staged(&b);
        assert_eq!(
            staging_step(&obs(&b, &s, None, None)),
            AgentStep::CreateClaim
        );

        // The claim: RWO, sized from the bytes with headroom (floored), asking for this node.
        let claim = staged_primary_claim(&b, &s, NODE, 15 * (1 << 30), 1 << 30);
        let spec = claim.spec.as_ref().unwrap();
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
        let size = &spec.resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"];
        assert_eq!(size.0, "17Gi");
        let floored = staged_primary_claim(&b, &s, NODE, 10, 40 << 30);
        assert_eq!(
            floored.spec.unwrap().resources.unwrap().requests.unwrap()["storage"].0,
            "40Gi"
        );
        let a = claim.metadata.annotations.as_ref().unwrap();
        assert_eq!(a[SELECTED_NODE_ANNOTATION], NODE);
        assert_eq!(a[COPY_POD_ANNOTATION], "pod-uid");

        // Not bound, no holder: the holder (on this node, restricted, pause).
        let AgentStep::CreateHolder(h) = staging_step(&obs(&b, &s, Some(&claim), None)) else {
            panic!()
        };
        let hs = h.spec.as_ref().unwrap();
        assert_eq!(hs.node_name.as_deref(), Some(NODE));
        assert_eq!(hs.automount_service_account_token, Some(false));
        let c = &hs.containers[0];
        assert_eq!(c.image.as_deref(), Some(PAUSE));
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        let claim_name = &hs.volumes.as_ref().unwrap()[0]
            .persistent_volume_claim
            .as_ref()
            .unwrap()
            .claim_name;
        assert_eq!(Some(claim_name), claim.metadata.name.as_ref());

        // Holder pending: wait. Bound and running: copy through it.
        let pending = ready((*h).clone(), "Pending");
        assert!(matches!(
            staging_step(&obs(&b, &s, Some(&bound(claim.clone())), Some(&pending))),
            AgentStep::Wait(_)
        ));
        let holder = ready((*h).clone(), "Running");
        let claim = bound(claim);
        assert_eq!(
            staging_step(&obs(&b, &s, Some(&claim), Some(&holder))),
            AgentStep::Copy {
                holder_uid: "holder-uid".into(),
                pv: "pvc-1234".into()
            }
        );
        // An ended holder is deleted (and recreated next).
        let ended = ready((*h).clone(), "Failed");
        assert!(matches!(
            staging_step(&obs(&b, &s, Some(&claim), Some(&ended))),
            AgentStep::DeleteHolder(_)
        ));

        // Recorded: answer and delete the holder.
        let mut copied = claim.clone();
        copied
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(COPIED_BYTES_ANNOTATION.into(), "123".into());
        assert_eq!(
            staging_step(&obs(&b, &s, Some(&copied), Some(&holder))),
            AgentStep::AnswerCopied {
                holder: Some(Doomed {
                    name: holder_name(&b),
                    uid: "holder-uid".into()
                })
            }
        );

        // Three failed copies: give up, deleting holder and claim by UID.
        let mut failing = claim.clone();
        failing
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(COPY_ATTEMPTS_ANNOTATION.into(), "3".into());
        let AgentStep::GiveUp {
            holder,
            claim: doomed_claim,
            words,
        } = staging_step(&obs(&b, &s, Some(&failing), Some(&holder)))
        else {
            panic!()
        };
        assert!(holder.is_some());
        assert_eq!(doomed_claim.unwrap().uid, "claim-uid");
        assert!(words.contains("3 times"), "{words}");
    }

    /// Claims and holders the agent did not create for this pod on this node are never used.
    #[test]
    fn foreign_or_other_agents_objects_are_never_written() {
        let b = binding(Transition::RoxReadOnly);
        let s = staged(&b);
        let claim = bound(staged_primary_claim(&b, &s, NODE, 1, 0));
        // A claim without the agent's records.
        let mut bare = view::primary_claim(&b, Quantity("1Gi".into()));
        bare.metadata.uid = Some("x".into());
        assert!(matches!(
            staging_step(&obs(&b, &s, Some(&bare), None)),
            AgentStep::Foreign(_)
        ));
        // Another staging pod's (a retried Job pod on another node): waits while that pod
        // lives; dropped once it is gone, unless a copy is recorded.
        let mut first = s.clone();
        first.uid = "first-pod-uid".into();
        let other = bound(staged_primary_claim(&b, &first, "gpu-2", 1, 0));
        assert!(matches!(
            staging_step(&obs(&b, &s, Some(&other), None)),
            AgentStep::Wait(_)
        ));
        let mut gone = obs(&b, &s, Some(&other), None);
        gone.claim_pod_gone = true;
        assert_eq!(
            staging_step(&gone),
            AgentStep::DropClaim {
                claim: Doomed {
                    name: other.metadata.name.clone().unwrap(),
                    uid: "claim-uid".into()
                }
            }
        );
        let mut copied_other = other.clone();
        copied_other
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(COPIED_BYTES_ANNOTATION.into(), "5".into());
        let mut gone = obs(&b, &s, Some(&copied_other), None);
        gone.claim_pod_gone = true;
        assert!(
            matches!(staging_step(&gone), AgentStep::Wait(_)),
            "a recorded copy is kept"
        );
        // A binding recreated under the same name (another UID).
        let mut b2 = b.clone();
        b2.metadata.uid = Some("new-uid".into());
        assert!(matches!(
            staging_step(&obs(&b2, &s, Some(&claim), None)),
            AgentStep::Foreign(_)
        ));
        // A holder on another node.
        let mut far = ready(holder_pod(&b, "gpu-2", &pause()), "Running");
        far.metadata.uid = Some("far".into());
        assert!(matches!(
            staging_step(&obs(&b, &s, Some(&claim), Some(&far))),
            AgentStep::Foreign(_)
        ));
        // An RWX binding is never staged.
        let rwx = binding(Transition::RwxReadOnly);
        let mut s2 = s.clone();
        s2.binding_uid = rwx.metadata.uid.clone().unwrap();
        assert!(matches!(
            staging_step(&obs(&rwx, &s2, None, None)),
            AgentStep::Foreign(_)
        ));
        // A pod that only looks like the staging pod: another namespace, no Job, another Job,
        // or not the Job the Lease recorded.
        let mut elsewhere = s.clone();
        elsewhere.namespace = "team-z".into();
        assert!(matches!(
            staging_step(&obs(&b, &elsewhere, None, None)),
            AgentStep::Foreign(_)
        ));
        let mut bare = s.clone();
        bare.job = None;
        assert!(matches!(
            staging_step(&obs(&b, &bare, None, None)),
            AgentStep::Foreign(_)
        ));
        let mut other_job = s.clone();
        other_job.job = Some(("my-job".into(), "job-uid".into()));
        assert!(matches!(
            staging_step(&obs(&b, &other_job, None, None)),
            AgentStep::Foreign(_)
        ));
        let mut leased = b.clone();
        leased.status.get_or_insert_with(Default::default).writer = Some(WriterStatus {
            namespace: "team-a".into(),
            job_name: writer_job_name(&b.spec.identity),
            job_uid: Some("another-job-uid".into()),
            ..WriterStatus::default()
        });
        assert!(matches!(
            staging_step(&obs(&leased, &s, None, None)),
            AgentStep::Foreign(_)
        ));
        // The binding is gone: nothing.
        let mut gone = obs(&b, &s, None, None);
        gone.binding = None;
        assert!(matches!(staging_step(&gone), AgentStep::Wait(_)));
    }

    // ---- hostPath readers ----

    const ROOT: &str = "/var/lib/containerd/nvsnap-models";

    /// A roxReadOnly binding on NVMesh whose primary is complete (handle `vol-1:team-a`) and
    /// whose status records views of `views`.
    fn complete_block(views: &[&str]) -> ModelCacheBinding {
        let mut b = binding(Transition::RoxReadOnly);
        b.spec.decision.provider = "nvmesh".into();
        b.status = Some(ModelCacheBindingStatus {
            realized: Some(RealizedStorage {
                provider_data_identity: Some("vol-1:team-a".into()),
                views: views.iter().map(|ns| view::reader_view(&b, ns)).collect(),
                ..RealizedStorage::default()
            }),
            ..ModelCacheBindingStatus::default()
        });
        b
    }

    fn host_pod(b: &ModelCacheBinding, ns: &str, name: &str, path: Option<&str>) -> Pod {
        let hash = identity_hash(&b.spec.identity);
        Pod {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                labels: Some(BTreeMap::from([
                    (MODEL_LABEL.into(), hash.clone()),
                    (ROLE_LABEL.into(), ROLE_READER.into()),
                    (PENDING_LABEL.into(), "true".into()),
                ])),
                annotations: Some(BTreeMap::from([(
                    BINDING_ANNOTATION.into(),
                    b.metadata.name.clone().unwrap(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some(NODE.into()),
                volumes: Some(vec![Volume {
                    name: MODEL_VOLUME.into(),
                    host_path: Some(HostPathVolumeSource {
                        path: path.map_or_else(|| bind_target(ROOT, &hash), str::to_owned),
                        type_: Some("DirectoryOrCreate".into()),
                    }),
                    ..Volume::default()
                }]),
                ..PodSpec::default()
            }),
            status: None,
        }
    }

    fn reader_of(pod: &Pod) -> HostReader {
        match host_reader(pod, ROOT) {
            HostReaderState::Reader(r) => r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_the_bind_roots_directory_of_the_pods_model_is_a_host_reader() {
        let b = complete_block(&["team-a"]);
        let hash = identity_hash(&b.spec.identity);
        let r = reader_of(&host_pod(&b, "team-a", "r1", None));
        assert_eq!(r.target, format!("{ROOT}/{hash}"));
        assert!(r.pending && r.live);
        assert_eq!(r.binding, b.metadata.name.clone().unwrap());
        // Another host directory, or a label that is not a hash: never bound.
        for path in [
            "/etc",
            &format!("{ROOT}/../{hash}"),
            &format!("{ROOT}/other"),
        ] {
            assert!(
                matches!(
                    host_reader(&host_pod(&b, "team-a", "r1", Some(path)), ROOT),
                    HostReaderState::Refused(_)
                ),
                "{path}"
            );
        }
        let mut pod = host_pod(&b, "team-a", "r1", Some(&format!("{ROOT}/..")));
        pod.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(MODEL_LABEL.into(), "..".into());
        assert!(matches!(
            host_reader(&pod, ROOT),
            HostReaderState::Refused(_)
        ));
        // A pvc reader is not a host reader.
        let mut pvc = host_pod(&b, "team-a", "r1", None);
        pvc.spec.as_mut().unwrap().volumes.as_mut().unwrap()[0].host_path = None;
        assert_eq!(host_reader(&pvc, ROOT), HostReaderState::NotHostReader);
        assert!(is_model_hash(&hash) && !is_model_hash("") && !is_model_hash("A0"));
        assert_eq!(bind_target("/r/", "ab"), "/r/ab");
    }

    /// The view of `ns` as the binding controller creates it, its claim Bound to it.
    fn view_objects(b: &ModelCacheBinding, ns: &str) -> (PersistentVolumeClaim, PersistentVolume) {
        let mut primary = PersistentVolume::default();
        primary.metadata.name = Some("pvc-primary".into());
        primary.spec = Some(k8s_openapi::api::core::v1::PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([("storage".into(), Quantity("1Gi".into()))])),
            csi: Some(k8s_openapi::api::core::v1::CSIPersistentVolumeSource {
                driver: "nvmesh-csi.excelero.com".into(),
                volume_handle: "vol-1:team-a".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        let (pv, mut claim) = view::read_only_view(b, &primary, ns, Some(1000), &[]).unwrap();
        claim.status = Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            ..PersistentVolumeClaimStatus::default()
        });
        (claim, pv)
    }

    fn host_obs<'a>(
        b: &'a ModelCacheBinding,
        readers: &'a [HostReader],
        holders: &'a [&'a Pod],
        view: Option<&'a (PersistentVolumeClaim, PersistentVolume)>,
    ) -> HostBindObserved<'a> {
        HostBindObserved {
            node: NODE,
            bind_root: ROOT,
            hash: &readers[0].hash,
            readers,
            binding: Some(b),
            holders,
            view_claim: view.map(|v| &v.0),
            view_pv: view.map(|v| &v.1),
            holder_image: &PAUSE_IMAGE,
        }
    }

    /// Two readers of one model on the node (two namespaces of the sharing domain): one holder,
    /// in the first namespace with a recorded view, one bind, both un-pended only with it.
    #[test]
    fn host_readers_get_one_holder_one_verified_bind_then_are_unpended() {
        let b = complete_block(&["team-a", "team-b"]);
        let hash = identity_hash(&b.spec.identity);
        let readers = [
            reader_of(&host_pod(&b, "team-b", "r2", None)),
            reader_of(&host_pod(&b, "team-a", "r1", None)),
        ];
        // The primary not complete yet: wait.
        let mut incomplete = b.clone();
        incomplete
            .status
            .as_mut()
            .unwrap()
            .realized
            .as_mut()
            .unwrap()
            .provider_data_identity = None;
        assert!(matches!(
            host_bind_step(&host_obs(&incomplete, &readers, &[], None)),
            HostBindStep::Wait(_)
        ));
        // No view recorded for these namespaces yet: wait.
        let unrecorded = complete_block(&["team-z"]);
        assert!(matches!(
            host_bind_step(&host_obs(&unrecorded, &readers, &[], None)),
            HostBindStep::Wait(_)
        ));
        // A holder in team-a (the first by name), on this node, mounting team-a's view claim
        // read-only.
        let HostBindStep::CreateHolder(holder) = host_bind_step(&host_obs(&b, &readers, &[], None))
        else {
            panic!("a holder first")
        };
        assert_eq!(holder.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(
            holder.metadata.name.as_deref(),
            Some(view_holder_name(&hash, NODE).as_str())
        );
        assert!(view_holder_name(&hash, NODE).len() <= 63);
        assert!(is_view_holder(&holder));
        let spec = holder.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some(NODE));
        let v = &spec.volumes.as_ref().unwrap()[0];
        let pvc = v.persistent_volume_claim.as_ref().unwrap();
        assert_eq!(pvc.claim_name, reader_pvc_name(&b.spec.identity));
        assert_eq!(pvc.read_only, Some(true));
        assert_eq!(
            spec.containers[0].volume_mounts.as_ref().unwrap()[0].read_only,
            Some(true)
        );
        assert_eq!(spec.automount_service_account_token, Some(false));
        // Not running yet, or the view not there: wait.
        let pending_holder = *holder.clone();
        assert!(matches!(
            host_bind_step(&host_obs(&b, &readers, &[&pending_holder], None)),
            HostBindStep::Wait(_)
        ));
        let view = view_objects(&b, "team-a");
        assert!(matches!(
            host_bind_step(&host_obs(&b, &readers, &[&pending_holder], Some(&view))),
            HostBindStep::Wait(_)
        ));
        // Running, the claim bound to the view: bind, then un-pend both readers.
        let running_holder = ready(*holder.clone(), "Running");
        let step = host_bind_step(&host_obs(&b, &readers, &[&running_holder], Some(&view)));
        let HostBindStep::Bind {
            holder_uid,
            pv,
            target,
            unpend,
            retire,
        } = step
        else {
            panic!("{step:?}")
        };
        assert_eq!(holder_uid, "holder-uid");
        assert_eq!(pv, view.1.metadata.name.clone().unwrap());
        assert_eq!(target, format!("{ROOT}/{hash}"));
        let names: Vec<&str> = unpend.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["r2", "r1"]);
        assert!(retire.is_empty());
        // Already un-pended readers are not patched again; the bind is still verified.
        let mut done = readers.clone();
        for r in &mut done {
            r.pending = false;
        }
        assert!(matches!(
            host_bind_step(&host_obs(&b, &done, &[&running_holder], Some(&view))),
            HostBindStep::Bind { ref unpend, .. } if unpend.is_empty()
        ));
        // A reader of a namespace without a recorded view is served by the bind but not
        // un-pended by the agent; team-a gone: its holder is kept only while it has a reader.
        let only_b = complete_block(&["team-b"]);
        let HostBindStep::CreateHolder(h) =
            host_bind_step(&host_obs(&only_b, &readers[..1], &[&running_holder], None))
        else {
            panic!("a holder in team-b")
        };
        assert_eq!(h.metadata.namespace.as_deref(), Some("team-b"));
        let mut hb = ready(*h, "Running");
        hb.metadata.uid = Some("holder-b".into());
        let view_b = view_objects(&only_b, "team-b");
        let step = host_bind_step(&host_obs(
            &only_b,
            &readers[..1],
            &[&running_holder, &hb],
            Some(&view_b),
        ));
        let HostBindStep::Bind {
            holder_uid, retire, ..
        } = step
        else {
            panic!("{step:?}")
        };
        assert_eq!(holder_uid, "holder-b");
        assert_eq!(retire.len(), 1);
        assert_eq!(retire[0].namespace, "team-a");
        // No live reader left: unbind, then delete every holder.
        let mut finished = readers.clone();
        for r in &mut finished {
            r.live = false;
        }
        assert_eq!(
            host_bind_step(&host_obs(&b, &finished, &[&running_holder], Some(&view))),
            HostBindStep::Unbind {
                target: format!("{ROOT}/{hash}"),
                holders: vec![DoomedIn {
                    namespace: "team-a".into(),
                    pod: Doomed {
                        name: view_holder_name(&hash, NODE),
                        uid: "holder-uid".into()
                    }
                }],
            }
        );
        // An ended holder is deleted (and recreated).
        let ended_holder = ready(*holder, "Failed");
        assert!(matches!(
            host_bind_step(&host_obs(&b, &readers, &[&ended_holder], Some(&view))),
            HostBindStep::DeleteHolders(ref d) if d.len() == 1
        ));
    }

    #[test]
    fn a_view_not_derived_from_the_primary_is_never_bound() {
        let b = complete_block(&["team-a"]);
        let readers = [reader_of(&host_pod(&b, "team-a", "r1", None))];
        let HostBindStep::CreateHolder(holder) = host_bind_step(&host_obs(&b, &readers, &[], None))
        else {
            panic!()
        };
        let holder = ready(*holder, "Running");
        let good = view_objects(&b, "team-a");
        assert!(matches!(
            host_bind_step(&host_obs(&b, &readers, &[&holder], Some(&good))),
            HostBindStep::Bind { .. }
        ));
        let foreign = |f: &dyn Fn(&mut (PersistentVolumeClaim, PersistentVolume))| {
            let mut v = good.clone();
            f(&mut v);
            let step = host_bind_step(&host_obs(&b, &readers, &[&holder], Some(&v)));
            assert!(matches!(step, HostBindStep::Foreign(_)), "{step:?}");
        };
        // Another volume's handle, the primary's own (another namespace's) handle, no label,
        // pre-bound elsewhere, a claim that is not the binding's.
        foreign(&|v| {
            v.1.spec
                .as_mut()
                .unwrap()
                .csi
                .as_mut()
                .unwrap()
                .volume_handle = "vol-2:team-a".into()
        });
        foreign(&|v| {
            v.1.spec
                .as_mut()
                .unwrap()
                .csi
                .as_mut()
                .unwrap()
                .volume_handle = "vol-1:team-b".into()
        });
        foreign(&|v| {
            v.1.metadata.labels.as_mut().unwrap().remove(BINDING_LABEL);
        });
        foreign(&|v| {
            v.1.spec
                .as_mut()
                .unwrap()
                .claim_ref
                .as_mut()
                .unwrap()
                .namespace = Some("team-x".into())
        });
        foreign(&|v| {
            v.0.metadata.labels.as_mut().unwrap().remove(BINDING_LABEL);
        });
        // A claim not bound to the view: wait.
        let mut unbound = good.clone();
        unbound.0.spec.as_mut().unwrap().volume_name = Some("other".into());
        assert!(matches!(
            host_bind_step(&host_obs(&b, &readers, &[&holder], Some(&unbound))),
            HostBindStep::Wait(_)
        ));
        // Not block storage: never.
        let mut rwx = b.clone();
        rwx.spec.decision.transition = Transition::RwxReadOnly;
        assert!(matches!(
            host_bind_step(&host_obs(&rwx, &readers, &[&holder], Some(&good))),
            HostBindStep::Foreign(_)
        ));
    }
}
