//! The node agent's decisions for a **capture source**, as pure functions: a pod whose engine
//! downloads by its own script an artifact no writer Job can reproduce (an NGC model pulled in
//! the main container) into one of its emptyDir volumes. The webhook labels it
//! ([`CAPTURE_LABEL`]) and names the landing ([`CAPTURE_VOLUME_ANNOTATION`],
//! [`CAPTURE_PATH_ANNOTATION`]); once it is Ready, the agent of its node copies that landing into
//! the binding's primary through the same safe copy as a staged download, and later pods read
//! the copy. [`capture_source`] reads the pod, [`capture_step`] decides the next step; the agent
//! (model-volume-controller) does the IO.
//!
//! The rules (`docs/node-agent.md`, "Capture after Ready"):
//!
//! - **What is trusted.** Labels and annotations on a pod are the pod author's, so nothing on the
//!   pod alone is enough. The binding it names must exist in the control namespace with the UID
//!   the pod records; the pod's handle must be a capture handle ([`is_capture_handle`]) whose
//!   digest is the binding's `cacheHandleDigest`; and the pod's **namespace**, read from the API
//!   (its labels are an administrator's), must be in the binding's sharing domain
//!   ([`crate::sharing_domain`]: the same workflow and the digest of the same domain).
//!   So only a namespace that could have filled the cache through a writer Job can fill it by
//!   capture: the trust boundary is the Job path's.
//! - **What is copied.** Only one of the pod's declared `emptyDir` volumes, at a clean relative
//!   path ([`is_clean_path`]); the agent reaches it without following any symbolic link (the
//!   pod controls that tree).
//! - **When.** The pod runs on the agent's node and is Ready (phase Running, condition Ready,
//!   not being deleted); the binding is not being deleted, not Retiring, not complete, and has
//!   no failure record that still holds.
//! - **The election.** roxReadOnly: the agent measures the landing and creates the primary
//!   claim sized from its bytes ([`capture_primary_claim`]); the atomic create is the election. rwxReadOnly: the binding controller's claim exists; once it is Bound the
//!   agent adds the election's annotations with a merge patch carrying the claim's
//!   resourceVersion, only while it names no pod (a conflict: someone else won; re-read).
//! - **Another pod's election** is waited on while that pod lives (Ready or not); once it is gone
//!   (not found, another UID, finished or being deleted) and no copy is recorded, the election
//!   is undone (roxReadOnly: the claim and the binding's mount holder are deleted;
//!   rwxReadOnly: the mount holder is deleted and the annotations removed with a resourceVersion
//!   precondition) and runs again.
//! - **The copy** goes through the binding's mount holder on this node
//!   ([`crate::agent::holder_pod`]), once the claim is Bound and the holder runs; it is recorded
//!   on the claim (`copied-bytes`, `manifest-sha256`) and the holder is deleted. After
//!   [`MAX_COPY_ATTEMPTS`] failed copies the agent deletes the holder and annotates the claim
//!   [`COPY_FAILED_ANNOTATION`] with its words; the claim is kept (the binding controller
//!   writes the failure record and releases it).
//!
//! **Cache capture sources** ([`cache_capture_source`]; `docs/node-agent.md`, "Compile-cache
//! sets"): a pod labelled [`CACHE_CAPTURE_LABEL`] and [`CACHE_KEY_LABEL`] names its
//! compile-cache set's binding ([`CACHE_BINDING_ANNOTATION`], [`CACHE_BINDING_UID_ANNOTATION`],
//! [`CACHE_HANDLE_ANNOTATION`]). Its landing is always the root of its scratch emptyDir
//! [`SCRATCH_VOLUME`], its handle must be a cache-set handle
//! ([`crate::cacheset::is_cache_set_handle`]) of the set binding's digest, and every other rule
//! above holds unchanged; only what [`crate::cacheset::travels`] accepts is measured and copied
//! ([`CaptureKind::filtered`]). A pod may be both kinds of source at once ([`capture_sources`]):
//! two independent captures of two bindings, each through the same steps.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use warmcache_api_modelcache::sha256_digest;
use warmcache_api_modelcache::v2beta1::{ModelCacheBinding, PopulationState, Transition};

use crate::agent::{
    COMPONENT_LABEL, COPY_POD_ANNOTATION, COPY_POD_NAME_ANNOTATION, Doomed, HolderImage,
    MAX_COPY_ATTEMPTS, MOUNT_HOLDER, SourcePod, annotation, copy_attempts, doomed,
    elected_primary_claim, election_annotations, holder_pod,
};
use crate::cacheset::is_cache_set_handle;
use crate::handle::is_capture_handle;
use crate::keys::{
    BINDING_ANNOTATION, BINDING_UID_ANNOTATION, CACHE_BINDING_ANNOTATION,
    CACHE_BINDING_UID_ANNOTATION, CACHE_CAPTURE_LABEL, CACHE_HANDLE_ANNOTATION, CACHE_KEY_LABEL,
    CAPTURE_LABEL, CAPTURE_PATH_ANNOTATION, CAPTURE_VOLUME_ANNOTATION, HANDLE_ANNOTATION,
    SCRATCH_VOLUME,
};
use crate::lifecycle::copied_bytes;
use crate::volume_keys::{
    BINDING_LABEL, BINDING_UID_LABEL_ANNOTATION, COPY_ATTEMPTS_ANNOTATION, COPY_FAILED_ANNOTATION,
    COPY_NODE_ANNOTATION, COPY_SOURCE_ANNOTATION, COPY_SOURCE_CAPTURE, SOURCE_NAMESPACE_LABEL,
};

/// Longest capture path accepted (bytes), and longest component.
pub const MAX_CAPTURE_PATH_BYTES: usize = 4096;
const MAX_COMPONENT_BYTES: usize = 255;

/// What a capture fills, and so what it takes from the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CaptureKind {
    /// The model the engine downloaded by itself (a capture handle): the landing copied whole.
    Model,
    /// The pod's compile caches (a cache-set handle): the scratch emptyDir's entries that
    /// [`crate::cacheset::travels`] accepts, nothing else.
    CacheSet,
}

impl CaptureKind {
    /// Both kinds, in the order [`capture_sources`] reads them.
    pub const ALL: [CaptureKind; 2] = [CaptureKind::Model, CaptureKind::CacheSet];

    /// A fixed word for metrics labels and span fields (`model`, `cache_set`).
    pub const fn label(self) -> &'static str {
        match self {
            CaptureKind::Model => "model",
            CaptureKind::CacheSet => "cache_set",
        }
    }

    /// Whether the measure and the copy take only what [`crate::cacheset::travels`] accepts
    /// (relative to the landing, `/`-separated).
    pub const fn filtered(self) -> bool {
        matches!(self, CaptureKind::CacheSet)
    }

    /// How the pod is named in the words of a refusal or a failure.
    const fn who(self) -> &'static str {
        match self {
            CaptureKind::Model => "capture pod",
            CaptureKind::CacheSet => "cache capture pod",
        }
    }

    /// What the handle must be, in the words of a refusal.
    const fn handle_words(self) -> &'static str {
        match self {
            CaptureKind::Model => "capture handle",
            CaptureKind::CacheSet => "cache-set handle",
        }
    }

    fn handle_ok(self, handle: &str) -> bool {
        match self {
            CaptureKind::Model => is_capture_handle(handle),
            CaptureKind::CacheSet => is_cache_set_handle(handle),
        }
    }
}

/// A capture source as the agent reads it from its pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureSource {
    /// What the capture fills (the model, or the pod's compile-cache set).
    pub kind: CaptureKind,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID (its kubelet directory).
    pub uid: String,
    /// The node it runs on, once scheduled.
    pub node: Option<String>,
    /// The binding it names (control namespace).
    pub binding: String,
    /// The binding UID it records.
    pub binding_uid: String,
    /// Its cache handle (a capture handle; a cache-set handle for [`CaptureKind::CacheSet`]).
    pub handle: String,
    /// The emptyDir volume the landing lies in (one of the pod's declared emptyDir volumes).
    pub volume: String,
    /// The landing inside it: clean, relative, `/`-separated; empty for the volume's root.
    pub path: String,
    /// Ready: phase Running, condition Ready true, not being deleted.
    pub ready: bool,
    /// Finished (Succeeded, Failed) or being deleted.
    pub ended: bool,
}

/// What a pod is to the capture part of the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaptureState {
    /// Not labelled as a capture source.
    NotCapture,
    /// Labelled as one but never copied (why, for the log): a record missing or malformed, a
    /// handle that is not a capture handle, a volume that is not one of its emptyDirs, a path
    /// that is not clean.
    Refused(String),
    /// A capture source.
    Source(CaptureSource),
}

/// Whether `path` is a clean landing path inside a volume: empty (the volume's root), or
/// `/`-separated components none of which is empty, `.` or `..`; no NUL byte, relative, at most
/// [`MAX_CAPTURE_PATH_BYTES`] bytes (255 a component).
pub fn is_clean_path(path: &str) -> bool {
    if path.is_empty() {
        return true;
    }
    path.len() <= MAX_CAPTURE_PATH_BYTES
        && !path.contains('\0')
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && c.len() <= MAX_COMPONENT_BYTES)
}

/// Whether `name` could be a volume name: a DNS-1123 label (so it is one path component, never
/// `.` or `..`).
fn is_volume_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// Whether `pod` is Ready: phase Running, condition Ready `True`, not being deleted.
pub fn pod_ready(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    pod.metadata.deletion_timestamp.is_none()
        && status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether `pod` has finished (Succeeded, Failed) or is being deleted.
pub fn pod_ended(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        || matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
}

/// Reads a pod as a capture source (see the module documentation).
pub fn capture_source(pod: &Pod) -> CaptureState {
    let meta = &pod.metadata;
    let labelled = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(CAPTURE_LABEL))
        .is_some_and(|v| v == "true");
    if !labelled {
        return CaptureState::NotCapture;
    }
    let (Some(namespace), Some(name), Some(uid)) = (&meta.namespace, &meta.name, &meta.uid) else {
        return CaptureState::Refused("the pod has no namespace, name or UID".to_owned());
    };
    let who = format!("{} {namespace}/{name}", CaptureKind::Model.who());
    let (Some(binding), Some(binding_uid), Some(handle), Some(volume)) = (
        annotation(meta, BINDING_ANNOTATION),
        annotation(meta, BINDING_UID_ANNOTATION),
        annotation(meta, HANDLE_ANNOTATION),
        annotation(meta, CAPTURE_VOLUME_ANNOTATION),
    ) else {
        return CaptureState::Refused(format!(
            "{who} lacks {BINDING_ANNOTATION}, {BINDING_UID_ANNOTATION}, {HANDLE_ANNOTATION} or {CAPTURE_VOLUME_ANNOTATION}"
        ));
    };
    if !is_capture_handle(handle) {
        return CaptureState::Refused(format!(
            "{who}: its handle is not a capture handle (no fill=capture); only a capture binding is filled from a pod"
        ));
    }
    if !is_volume_name(volume) || !declares_empty_dir(pod, volume) {
        return CaptureState::Refused(format!(
            "{who}: its capture volume {volume:?} is not one of its emptyDir volumes"
        ));
    }
    // Absent: the volume's root (the annotation may be left out then).
    let path = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(CAPTURE_PATH_ANNOTATION))
        .map_or("", String::as_str);
    if !is_clean_path(path) {
        return CaptureState::Refused(format!(
            "{who}: its capture path {path:?} is not a clean relative path (no empty, `.` or `..` component)"
        ));
    }
    CaptureState::Source(CaptureSource {
        kind: CaptureKind::Model,
        namespace: namespace.clone(),
        name: name.clone(),
        uid: uid.clone(),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        binding: binding.to_owned(),
        binding_uid: binding_uid.to_owned(),
        handle: handle.to_owned(),
        volume: volume.to_owned(),
        path: path.to_owned(),
        ready: pod_ready(pod),
        ended: pod_ended(pod),
    })
}

/// Whether `pod` declares `volume` as an `emptyDir`.
fn declares_empty_dir(pod: &Pod, volume: &str) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|vs| vs.iter().any(|v| v.name == volume && v.empty_dir.is_some()))
}

/// Reads a pod as a **cache capture source** (see the module documentation): labelled
/// [`CACHE_CAPTURE_LABEL`] `true`, with its set's [`CACHE_KEY_LABEL`], naming the set's binding
/// (name, UID) and handle (a cache-set handle); its landing is the root of its declared emptyDir
/// [`SCRATCH_VOLUME`]. The binding it names must be the one its cache key names
/// (`model-cache-<key>`).
pub fn cache_capture_source(pod: &Pod) -> CaptureState {
    let meta = &pod.metadata;
    let labels = meta.labels.as_ref();
    let labelled = labels
        .and_then(|l| l.get(CACHE_CAPTURE_LABEL))
        .is_some_and(|v| v == "true");
    if !labelled {
        return CaptureState::NotCapture;
    }
    let (Some(namespace), Some(name), Some(uid)) = (&meta.namespace, &meta.name, &meta.uid) else {
        return CaptureState::Refused("the pod has no namespace, name or UID".to_owned());
    };
    let who = format!("{} {namespace}/{name}", CaptureKind::CacheSet.who());
    let key = labels
        .and_then(|l| l.get(CACHE_KEY_LABEL))
        .filter(|k| !k.is_empty());
    let (Some(key), Some(binding), Some(binding_uid), Some(handle)) = (
        key,
        annotation(meta, CACHE_BINDING_ANNOTATION),
        annotation(meta, CACHE_BINDING_UID_ANNOTATION),
        annotation(meta, CACHE_HANDLE_ANNOTATION),
    ) else {
        return CaptureState::Refused(format!(
            "{who} lacks the label {CACHE_KEY_LABEL} or {CACHE_BINDING_ANNOTATION}, {CACHE_BINDING_UID_ANNOTATION} or {CACHE_HANDLE_ANNOTATION}"
        ));
    };
    if !is_cache_set_handle(handle) {
        return CaptureState::Refused(format!(
            "{who}: its handle is not a cache-set handle (cache://<sha256>?rank=<n>); only a compile-cache set is filled from its scratch directory"
        ));
    }
    if !warmcache_api_modelcache::is_identity_hash(key)
        || binding.strip_prefix(warmcache_api_modelcache::names::BINDING_NAME_PREFIX) != Some(key)
    {
        return CaptureState::Refused(format!(
            "{who}: its {CACHE_KEY_LABEL} {key:?} does not name binding {binding}"
        ));
    }
    if !declares_empty_dir(pod, SCRATCH_VOLUME) {
        return CaptureState::Refused(format!(
            "{who}: its scratch volume {SCRATCH_VOLUME} is not one of its emptyDir volumes"
        ));
    }
    CaptureState::Source(CaptureSource {
        kind: CaptureKind::CacheSet,
        namespace: namespace.clone(),
        name: name.clone(),
        uid: uid.clone(),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        binding: binding.to_owned(),
        binding_uid: binding_uid.to_owned(),
        handle: handle.to_owned(),
        volume: SCRATCH_VOLUME.to_owned(),
        path: String::new(),
        ready: pod_ready(pod),
        ended: pod_ended(pod),
    })
}

/// Every capture `pod` is labelled for, model first: its model capture ([`capture_source`]) and
/// its compile-cache set's ([`cache_capture_source`]), each a source or a refusal, with its
/// kind; empty for a pod that is neither. The two are independent: one refused leaves the other
/// as it is.
pub fn capture_sources(pod: &Pod) -> Vec<(CaptureKind, CaptureState)> {
    CaptureKind::ALL
        .into_iter()
        .map(|kind| match kind {
            CaptureKind::Model => (kind, capture_source(pod)),
            CaptureKind::CacheSet => (kind, cache_capture_source(pod)),
        })
        .filter(|(_, s)| *s != CaptureState::NotCapture)
        .collect()
}

/// Whether `pod` is labelled as a capture source (of either kind) naming the binding `binding`
/// (for the watches: a change of the binding, its claim or its holder reaches its sources).
pub fn is_capture_source_of(pod: &Pod, binding: &str) -> bool {
    let labels = pod.metadata.labels.as_ref();
    let annotations = pod.metadata.annotations.as_ref();
    crate::reading::Reads::ALL.iter().any(|how| {
        let keys = how.keys();
        labels.is_some_and(|l| l.contains_key(keys.capture))
            && annotations
                .and_then(|a| a.get(keys.binding))
                .map(String::as_str)
                == Some(binding)
    })
}

/// What a capture's election records on the primary claim: the election's annotations
/// ([`election_annotations`]: node, pod, its name and namespace) and
/// [`COPY_SOURCE_ANNOTATION`] `capture` (the binding controller starts no writer Job while it is
/// there, and tells a capture from a staging copy).
pub fn capture_election_annotations(
    source: &CaptureSource,
    node: &str,
) -> BTreeMap<String, String> {
    let mut a = election_annotations(source_pod(source), node);
    a.insert(
        COPY_SOURCE_ANNOTATION.to_owned(),
        COPY_SOURCE_CAPTURE.to_owned(),
    );
    a
}

/// The primary claim the agent creates for a roxReadOnly capture on `node`
/// ([`elected_primary_claim`]: ReadWriteOnce, sized from the measured `bytes`, at least
/// `min_bytes`), marked as a capture's ([`capture_election_annotations`]).
pub fn capture_primary_claim(
    binding: &ModelCacheBinding,
    source: &CaptureSource,
    node: &str,
    bytes: u64,
    min_bytes: u64,
) -> PersistentVolumeClaim {
    let mut claim = elected_primary_claim(binding, source_pod(source), node, bytes, min_bytes);
    claim
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .extend(capture_election_annotations(source, node));
    claim
}

/// The annotations an undone rwxReadOnly election removes (the election's and the failed
/// attempts).
pub const ELECTION_KEYS: [&str; 6] = [
    COPY_NODE_ANNOTATION,
    COPY_POD_ANNOTATION,
    COPY_POD_NAME_ANNOTATION,
    SOURCE_NAMESPACE_LABEL,
    COPY_SOURCE_ANNOTATION,
    COPY_ATTEMPTS_ANNOTATION,
];

fn source_pod(source: &CaptureSource) -> SourcePod<'_> {
    SourcePod {
        namespace: &source.namespace,
        name: &source.name,
        uid: &source.uid,
    }
}

/// Whether the pod an election recorded (`uid`) is gone, from a fresh read of it (`None`: not
/// found): another UID under its name, finished, or being deleted.
pub fn elected_pod_gone(uid: &str, fresh: Option<&Pod>) -> bool {
    match fresh {
        None => true,
        Some(p) => p.metadata.uid.as_deref() != Some(uid) || pod_ended(p),
    }
}

/// What the agent does next for one capture source.
#[derive(Debug, Clone, PartialEq)]
pub enum CaptureStep {
    /// Nothing to do for this pod until it or its binding changes (why, for the log).
    Skip(String),
    /// Nothing now; look again later (why, for the log).
    Wait(String),
    /// Never copied: the pod's records do not match its binding or the binding's sharing
    /// domain, or an object under the binding's names is not what the agent expects (why).
    Refused(String),
    /// roxReadOnly, no claim: measure the landing and create the primary claim sized from it
    /// ([`capture_primary_claim`]); AlreadyExists means another agent won.
    CreateClaim,
    /// rwxReadOnly, the binding controller's claim Bound and naming no pod: add the election's
    /// annotations ([`capture_election_annotations`]) with a merge patch carrying
    /// `resource_version`; a conflict means someone else won.
    Elect {
        /// The claim.
        claim: String,
        /// Its resourceVersion, the patch's precondition.
        resource_version: String,
    },
    /// The claim was elected for another capture pod that is gone and records no copy: delete
    /// the binding's mount holder (wherever it runs), then undo the election: roxReadOnly
    /// (`drop_claim`) deletes the claim (UID precondition), rwxReadOnly removes
    /// [`ELECTION_KEYS`] (resourceVersion precondition).
    Reelect {
        /// The claim.
        claim: Doomed,
        /// Its resourceVersion.
        resource_version: String,
        /// Delete the claim (roxReadOnly) rather than its annotations.
        drop_claim: bool,
    },
    /// Create the mount holder ([`holder_pod`]).
    CreateHolder(Box<Pod>),
    /// Delete a mount holder that ended, or one on another node left by an earlier election
    /// (it is recreated here).
    DeleteHolder(Doomed),
    /// Copy the landing into the holder's volume (`pods/<holder uid>/volumes/kubernetes.io~csi/
    /// <pv>/mount` under the kubelet root), then record the bytes and the manifest digest on
    /// the claim; a failure increments the failed attempts.
    Copy {
        /// The holder pod's UID.
        holder_uid: String,
        /// The PV the claim is bound to.
        pv: String,
    },
    /// Nothing left to do (the copy is recorded, the capture was given up, or the binding is
    /// complete): delete this node's mount holder, if any (so the volume can detach).
    Done {
        /// This node's mount holder of the binding.
        holder: Option<Doomed>,
        /// Why, for the log.
        why: String,
    },
    /// Give up after [`MAX_COPY_ATTEMPTS`] failed copies: delete the holder, then annotate the
    /// claim [`COPY_FAILED_ANNOTATION`] with `words` (resourceVersion precondition); the claim
    /// is kept.
    GiveUp {
        /// The holder to delete.
        holder: Option<Doomed>,
        /// Why.
        words: String,
    },
}

/// What the agent observed for one capture source.
#[derive(Debug, Clone, Copy)]
pub struct CaptureObserved<'a> {
    /// The agent's node.
    pub node: &'a str,
    /// The capture source.
    pub source: &'a CaptureSource,
    /// The labels of the pod's namespace, read from the API; `None` when it was not found.
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    /// The binding the pod names, if it exists.
    pub binding: Option<&'a ModelCacheBinding>,
    /// The primary claim (`rw-pvc-<hash>` in the control namespace), if it exists.
    pub claim: Option<&'a PersistentVolumeClaim>,
    /// The mount holder (`nvsnap-holder-<hash>` in the control namespace), if it exists.
    pub holder: Option<&'a Pod>,
    /// The mount holder's image.
    pub holder_image: &'a HolderImage,
    /// Whether the pod the claim's election names is gone, read afresh
    /// ([`elected_pod_gone`]). Only a definite answer is `true`; `false` for this pod.
    pub claim_pod_gone: bool,
    /// The time, for the failure record.
    pub now: Timestamp,
}

/// Whether `binding` lets `source` (in a namespace labelled `labels`) fill it: the binding UID
/// the pod records, a capture handle of the binding's handle digest, and a namespace of the
/// binding's sharing domain. `Err` says which does not hold.
pub fn check_source(
    binding: &ModelCacheBinding,
    source: &CaptureSource,
    labels: &BTreeMap<String, String>,
) -> Result<(), String> {
    let who = format!("{} {}/{}", source.kind.who(), source.namespace, source.name);
    let name = binding.metadata.name.as_deref().unwrap_or_default();
    if binding.metadata.uid.as_deref() != Some(source.binding_uid.as_str()) {
        return Err(format!(
            "{who} names binding {name} with UID {}, which is not the binding's",
            source.binding_uid
        ));
    }
    let identity = &binding.spec.identity;
    if !source.kind.handle_ok(&source.handle)
        || sha256_digest(&source.handle) != identity.cache_handle_digest
    {
        return Err(format!(
            "{who}: its handle is not binding {name}'s {} (digests differ)",
            source.kind.handle_words()
        ));
    }
    let domain = crate::scope::sharing_domain(&source.namespace, labels);
    if domain.workflow != identity.workflow
        || sha256_digest(&domain.domain) != identity.sharing_domain_digest
    {
        return Err(format!(
            "{who}: namespace {} is not in binding {name}'s sharing domain; only a namespace that shares the cache can fill it",
            source.namespace
        ));
    }
    Ok(())
}

/// The next step for a capture source (see the module documentation).
pub fn capture_step(obs: &CaptureObserved<'_>) -> CaptureStep {
    let s = obs.source;
    if s.node.as_deref() != Some(obs.node) {
        return CaptureStep::Skip(format!(
            "{} {}/{} is not on this node",
            s.kind.who(),
            s.namespace,
            s.name
        ));
    }
    let Some(b) = obs.binding else {
        return CaptureStep::Skip(format!("binding {} is not there", s.binding));
    };
    let Some(labels) = obs.namespace_labels else {
        return CaptureStep::Wait(format!(
            "namespace {} was not found: its sharing domain is unknown",
            s.namespace
        ));
    };
    if let Err(why) = check_source(b, s, labels) {
        return CaptureStep::Refused(why);
    }
    let name = b.metadata.name.clone().unwrap_or_default();
    let transition = b.spec.decision.transition;

    // The claim, only if it is the binding's.
    let claim = match obs.claim {
        Some(c) => {
            let labelled = c
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(BINDING_LABEL))
                == Some(&name);
            // The agent's claims record the binding's UID; the binding controller's RWX claim
            // may not.
            let uid_ok = annotation(&c.metadata, BINDING_UID_LABEL_ANNOTATION)
                .is_none_or(|u| Some(u) == b.metadata.uid.as_deref());
            if !labelled || !uid_ok {
                return CaptureStep::Refused(format!(
                    "claim {} is not binding {name}'s primary; it is never written to",
                    c.metadata.name.clone().unwrap_or_default()
                ));
            }
            Some(c)
        }
        None => None,
    };
    let holder_on_node = obs.holder.filter(|h| {
        h.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(obs.node)
            && h.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(COMPONENT_LABEL))
                .is_some_and(|v| v == MOUNT_HOLDER)
    });
    let our_holder = holder_on_node.and_then(|h| doomed(&h.metadata));

    // Finished: a recorded copy, a recorded give-up, a complete binding.
    if let Some(c) = claim {
        if copied_bytes(c).is_some() {
            return CaptureStep::Done {
                holder: our_holder,
                why: format!(
                    "the copy into claim {} is recorded",
                    c.metadata.name.clone().unwrap_or_default()
                ),
            };
        }
        if annotation(&c.metadata, COPY_FAILED_ANNOTATION).is_some() {
            return CaptureStep::Done {
                holder: our_holder,
                why: "the capture was given up; the binding controller records the failure"
                    .to_owned(),
            };
        }
    }
    let realized = b.status.as_ref().and_then(|st| st.realized.as_ref());
    if realized.and_then(|r| r.population_state) == Some(PopulationState::Ready) {
        return CaptureStep::Done {
            holder: our_holder,
            why: format!("binding {name} is complete"),
        };
    }
    if b.metadata.deletion_timestamp.is_some() || b.is_retiring() {
        return CaptureStep::Skip(format!("binding {name} is Retiring or being deleted"));
    }
    if let Some(record) = b
        .status
        .as_ref()
        .and_then(|st| st.failure_record.as_ref())
        .filter(|r| r.holds_at(obs.now))
    {
        return CaptureStep::Wait(format!(
            "binding {name}'s failure record holds until {}",
            record.retry_after.0
        ));
    }
    if !s.ready {
        return CaptureStep::Skip(format!(
            "{} {}/{} is not Ready",
            s.kind.who(),
            s.namespace,
            s.name
        ));
    }

    // The election.
    let Some(claim) = claim else {
        return match transition {
            Transition::RoxReadOnly => CaptureStep::CreateClaim,
            Transition::RwxReadOnly => CaptureStep::Wait(format!(
                "the binding controller has not created binding {name}'s primary claim yet"
            )),
        };
    };
    let claim_name = claim.metadata.name.clone().unwrap_or_default();
    let bound = claim.status.as_ref().and_then(|st| st.phase.as_deref()) == Some("Bound");
    let pv = claim.spec.as_ref().and_then(|st| st.volume_name.clone());
    let elected_pod = annotation(&claim.metadata, COPY_POD_ANNOTATION);
    let elected_node = annotation(&claim.metadata, COPY_NODE_ANNOTATION);
    match elected_pod {
        None => {
            return match transition {
                Transition::RoxReadOnly => CaptureStep::Refused(format!(
                    "claim {claim_name} exists but no node agent created it for binding {name}; it is never written to"
                )),
                Transition::RwxReadOnly if !bound => {
                    CaptureStep::Wait(format!("waiting for claim {claim_name} to bind"))
                }
                Transition::RwxReadOnly => match &claim.metadata.resource_version {
                    Some(rv) => CaptureStep::Elect {
                        claim: claim_name,
                        resource_version: rv.clone(),
                    },
                    None => CaptureStep::Wait(format!("claim {claim_name} has no resourceVersion")),
                },
            };
        }
        Some(uid) if uid == s.uid => {
            if elected_node != Some(obs.node) {
                return CaptureStep::Refused(format!(
                    "claim {claim_name} names this pod on node {}, not {}",
                    elected_node.unwrap_or_default(),
                    obs.node
                ));
            }
        }
        Some(other) => {
            if !obs.claim_pod_gone {
                return CaptureStep::Wait(format!(
                    "claim {claim_name} is being filled from pod {other} on node {}",
                    elected_node.unwrap_or_default()
                ));
            }
            return match (doomed(&claim.metadata), &claim.metadata.resource_version) {
                (Some(d), Some(rv)) => CaptureStep::Reelect {
                    claim: d,
                    resource_version: rv.clone(),
                    drop_claim: transition == Transition::RoxReadOnly,
                },
                _ => CaptureStep::Wait(format!("claim {claim_name} is being deleted")),
            };
        }
    }

    // Elected for this pod on this node: holder, copy, or give up.
    let attempts = copy_attempts(claim);
    if attempts >= MAX_COPY_ATTEMPTS {
        return CaptureStep::GiveUp {
            holder: our_holder,
            words: format!(
                "capturing {}pod {}/{} into claim {claim_name} failed {attempts} times",
                match s.kind {
                    CaptureKind::Model => "",
                    CaptureKind::CacheSet => "the compile caches of ",
                },
                s.namespace,
                s.name
            ),
        };
    }
    let Some(h) = obs.holder else {
        return CaptureStep::CreateHolder(Box::new(holder_pod(b, obs.node, obs.holder_image)));
    };
    let holder_name = h.metadata.name.clone().unwrap_or_default();
    let is_holder = h
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(COMPONENT_LABEL))
        .is_some_and(|v| v == MOUNT_HOLDER);
    if !is_holder {
        return CaptureStep::Refused(format!(
            "pod {holder_name} is not a mount holder; it is never used or deleted"
        ));
    }
    let elsewhere = h.spec.as_ref().and_then(|st| st.node_name.as_deref()) != Some(obs.node);
    let phase = h.status.as_ref().and_then(|st| st.phase.as_deref());
    if elsewhere || matches!(phase, Some("Failed" | "Succeeded")) {
        return match doomed(&h.metadata) {
            Some(d) => CaptureStep::DeleteHolder(d),
            None => CaptureStep::Wait(format!("mount holder {holder_name} is being deleted")),
        };
    }
    if h.metadata.deletion_timestamp.is_some() {
        return CaptureStep::Wait(format!("mount holder {holder_name} is being deleted"));
    }
    let running = phase == Some("Running")
        && h.status
            .as_ref()
            .and_then(|st| st.container_statuses.as_ref())
            .is_some_and(|cs| !cs.is_empty() && cs.iter().all(|c| c.ready));
    match (bound, pv, running, &h.metadata.uid) {
        (true, Some(pv), true, Some(uid)) => CaptureStep::Copy {
            holder_uid: uid.clone(),
            pv,
        },
        _ => CaptureStep::Wait(format!(
            "waiting for claim {claim_name} to bind and its mount holder to run"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::holder_name;
    use crate::testing::{HANDLE, binding};
    use crate::view;
    use crate::volume_keys::COPIED_BYTES_ANNOTATION;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStatus, EmptyDirVolumeSource,
        HostPathVolumeSource, PersistentVolumeClaimStatus, PodCondition, PodSpec, PodStatus,
        Volume,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use warmcache_api_modelcache::v2beta1::{
        BindingIdentity, BindingPhase, FailureRecord, ModelCacheBindingStatus, RealizedStorage,
        Workflow,
    };
    use warmcache_api_modelcache::{SHARING_DOMAIN_LABEL, binding_name};

    const NODE: &str = "gpu-1";
    const DOMAIN: &str = "domain-1";
    const VOLUME: &str = "ngc-cache";

    fn capture_handle() -> String {
        format!("{HANDLE}?layout=ngc&fill=capture")
    }

    fn image() -> HolderImage {
        HolderImage {
            image: "registry.k8s.io/pause:3.10".into(),
            pull_policy: "IfNotPresent".into(),
        }
    }

    /// A capture binding of the sharing domain `domain-1` (helmModelCache).
    fn capture_binding(transition: Transition) -> ModelCacheBinding {
        let mut b = binding(transition);
        b.spec.identity = BindingIdentity::new(Workflow::HelmModelCache, DOMAIN, &capture_handle());
        b.metadata.name = Some(binding_name(&b.spec.identity));
        b
    }

    fn labels_of(domain: Option<&str>) -> BTreeMap<String, String> {
        domain
            .map(|d| BTreeMap::from([(SHARING_DOMAIN_LABEL.to_owned(), d.to_owned())]))
            .unwrap_or_default()
    }

    /// A Ready capture pod as the webhook leaves it, on `NODE`, in `team-a`.
    fn capture_pod(b: &ModelCacheBinding) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some("team-a".into()),
                name: Some("nim-0".into()),
                uid: Some("pod-uid".into()),
                labels: Some(BTreeMap::from([(CAPTURE_LABEL.into(), "true".into())])),
                annotations: Some(BTreeMap::from([
                    (BINDING_ANNOTATION.into(), b.metadata.name.clone().unwrap()),
                    (
                        BINDING_UID_ANNOTATION.into(),
                        b.metadata.uid.clone().unwrap(),
                    ),
                    (HANDLE_ANNOTATION.into(), capture_handle()),
                    (CAPTURE_VOLUME_ANNOTATION.into(), VOLUME.into()),
                    (CAPTURE_PATH_ANNOTATION.into(), "ngc/models".into()),
                ])),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some(NODE.into()),
                volumes: Some(vec![Volume {
                    name: VOLUME.into(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Volume::default()
                }]),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
        }
    }

    fn source_of(pod: &Pod) -> CaptureSource {
        match capture_source(pod) {
            CaptureState::Source(s) => s,
            other => panic!("{other:?}"),
        }
    }

    fn annotate(pod: &mut Pod, key: &str, value: &str) {
        pod.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(key.into(), value.into());
    }

    fn refused(pod: &Pod) -> String {
        match capture_source(pod) {
            CaptureState::Refused(why) => why,
            other => panic!("{other:?}"),
        }
    }

    struct World {
        b: ModelCacheBinding,
        source: CaptureSource,
        labels: BTreeMap<String, String>,
        image: HolderImage,
    }

    impl World {
        fn new(transition: Transition) -> World {
            let b = capture_binding(transition);
            let source = source_of(&capture_pod(&b));
            World {
                b,
                source,
                labels: labels_of(Some(DOMAIN)),
                image: image(),
            }
        }

        fn obs<'a>(
            &'a self,
            claim: Option<&'a PersistentVolumeClaim>,
            holder: Option<&'a Pod>,
        ) -> CaptureObserved<'a> {
            CaptureObserved {
                node: NODE,
                source: &self.source,
                namespace_labels: Some(&self.labels),
                binding: Some(&self.b),
                claim,
                holder,
                holder_image: &self.image,
                claim_pod_gone: false,
                now: Timestamp::UNIX_EPOCH,
            }
        }

        fn step(&self, claim: Option<&PersistentVolumeClaim>, holder: Option<&Pod>) -> CaptureStep {
            capture_step(&self.obs(claim, holder))
        }

        /// The claim this pod's agent creates (roxReadOnly), not yet bound.
        fn rox_claim(&self) -> PersistentVolumeClaim {
            let mut c = capture_primary_claim(&self.b, &self.source, NODE, 15 << 30, 1 << 30);
            c.metadata.uid = Some("claim-uid".into());
            c.metadata.resource_version = Some("7".into());
            c
        }

        /// The binding controller's RWX claim, bound, naming no pod.
        fn rwx_claim(&self) -> PersistentVolumeClaim {
            let mut c = view::primary_claim(&self.b, Quantity("64Gi".into()));
            c.metadata.uid = Some("claim-uid".into());
            c.metadata.resource_version = Some("7".into());
            bound(c)
        }
    }

    fn bound(mut claim: PersistentVolumeClaim) -> PersistentVolumeClaim {
        claim.spec.as_mut().unwrap().volume_name = Some("pvc-1234".into());
        claim.status = Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            ..PersistentVolumeClaimStatus::default()
        });
        claim
    }

    fn with(mut claim: PersistentVolumeClaim, key: &str, value: &str) -> PersistentVolumeClaim {
        claim
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        claim
    }

    fn holder(w: &World, phase: &str, node: &str) -> Pod {
        let mut h = holder_pod(&w.b, node, &w.image);
        h.metadata.uid = Some("holder-uid".into());
        h.status = Some(PodStatus {
            phase: Some(phase.into()),
            container_statuses: Some(vec![ContainerStatus {
                name: "hold".into(),
                ready: phase == "Running",
                state: Some(ContainerState {
                    running: Some(ContainerStateRunning::default()),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            }]),
            ..PodStatus::default()
        });
        h
    }

    fn holder_doomed() -> Option<Doomed> {
        Some(Doomed {
            name: holder_name(&capture_binding(Transition::RoxReadOnly)),
            uid: "holder-uid".into(),
        })
    }

    #[test]
    fn clean_paths() {
        for ok in ["", "ngc", "ngc/models", "a b/c.d", "..x/y..", ".hidden/x"] {
            assert!(is_clean_path(ok), "{ok:?}");
        }
        let long = "a".repeat(256);
        for bad in [
            "/", "/etc", "..", "../x", "a/../b", "a/..", ".", "./a", "a/./b", "a//b", "a/", "/a",
            "a\0b", &long,
        ] {
            assert!(!is_clean_path(bad), "{bad:?}");
        }
        assert!(!is_clean_path(&"a/".repeat(2049)));
    }

    #[test]
    fn a_ready_labelled_pod_with_its_records_is_a_capture_source() {
        let b = capture_binding(Transition::RoxReadOnly);
        let s = source_of(&capture_pod(&b));
        assert_eq!(
            s,
            CaptureSource {
                kind: CaptureKind::Model,
                namespace: "team-a".into(),
                name: "nim-0".into(),
                uid: "pod-uid".into(),
                node: Some(NODE.into()),
                binding: b.metadata.name.clone().unwrap(),
                binding_uid: "binding-uid-1".into(),
                handle: capture_handle(),
                volume: VOLUME.into(),
                path: "ngc/models".into(),
                ready: true,
                ended: false,
            }
        );
        // No path annotation: the volume's root.
        let mut root = capture_pod(&b);
        root.metadata
            .annotations
            .as_mut()
            .unwrap()
            .remove(CAPTURE_PATH_ANNOTATION);
        assert_eq!(source_of(&root).path, "");
        // Without the label (or another value): not a capture source.
        let mut plain = capture_pod(&b);
        plain.metadata.labels = None;
        assert_eq!(capture_source(&plain), CaptureState::NotCapture);
        plain.metadata.labels = Some(BTreeMap::from([(CAPTURE_LABEL.into(), "yes".into())]));
        assert_eq!(capture_source(&plain), CaptureState::NotCapture);
        // Not Ready: the condition false, not Running, being deleted; finished: ended.
        let mut p = capture_pod(&b);
        p.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
        assert!(!source_of(&p).ready);
        let mut p = capture_pod(&b);
        p.status.as_mut().unwrap().phase = Some("Pending".into());
        assert!(!source_of(&p).ready);
        let mut p = capture_pod(&b);
        p.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let s = source_of(&p);
        assert!(!s.ready && s.ended);
        let mut p = capture_pod(&b);
        p.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert!(source_of(&p).ended);
    }

    /// Records a pod author controls that would make the agent read another directory, or fill
    /// a cache that is not a capture: refused before anything is looked up.
    #[test]
    fn hostile_records_on_the_pod_are_refused() {
        let b = capture_binding(Transition::RoxReadOnly);
        // A path leaving the volume, absolute, or not clean.
        for path in ["../../../etc", "ngc/../../x", "/etc", "a//b", "./ngc"] {
            let mut p = capture_pod(&b);
            annotate(&mut p, CAPTURE_PATH_ANNOTATION, path);
            assert!(refused(&p).contains("clean relative path"), "{path}");
        }
        // A volume that is not an emptyDir (a hostPath named like it), not declared, or a name
        // that is not a volume name.
        let mut p = capture_pod(&b);
        p.spec.as_mut().unwrap().volumes = Some(vec![Volume {
            name: VOLUME.into(),
            host_path: Some(HostPathVolumeSource {
                path: "/etc".into(),
                type_: None,
            }),
            ..Volume::default()
        }]);
        assert!(refused(&p).contains("not one of its emptyDir volumes"));
        for volume in ["other", "..", "../kubernetes.io~csi", ""] {
            let mut p = capture_pod(&b);
            annotate(&mut p, CAPTURE_VOLUME_ANNOTATION, volume);
            assert!(
                matches!(capture_source(&p), CaptureState::Refused(_)),
                "{volume:?}"
            );
        }
        // A handle that is not a capture handle (a Job cache's), even one whose text holds the
        // part elsewhere.
        for handle in [
            HANDLE.to_owned(),
            format!("{HANDLE}?layout=ngc"),
            format!("{HANDLE}?layout=ngc&salt=fill%3Dcapture"),
            "hf://x/fill=capture".to_owned(),
        ] {
            let mut p = capture_pod(&b);
            annotate(&mut p, HANDLE_ANNOTATION, &handle);
            assert!(refused(&p).contains("not a capture handle"), "{handle}");
        }
        // A record missing.
        for key in [
            BINDING_ANNOTATION,
            BINDING_UID_ANNOTATION,
            HANDLE_ANNOTATION,
            CAPTURE_VOLUME_ANNOTATION,
        ] {
            let mut p = capture_pod(&b);
            p.metadata.annotations.as_mut().unwrap().remove(key);
            assert!(refused(&p).contains("lacks"), "{key}");
        }
    }

    /// A capture label and records forged on a pod of a namespace outside the binding's sharing
    /// domain (or naming another binding UID, or another capture handle) never fill the cache.
    #[test]
    fn a_pod_outside_the_sharing_domain_or_not_matching_its_binding_is_refused() {
        let w = World::new(Transition::RoxReadOnly);
        assert_eq!(w.step(None, None), CaptureStep::CreateClaim);
        let refused_with = |w: &World, words: &str| {
            let step = w.step(None, None);
            match &step {
                CaptureStep::Refused(why) => assert!(why.contains(words), "{why}"),
                other => panic!("{other:?}"),
            }
        };
        // Another domain's label; no label (the namespace shares only with itself); a
        // namespace named like the domain but unlabelled (another workflow); an empty label.
        for (ns, labels) in [
            ("team-a", labels_of(Some("domain-2"))),
            ("team-a", labels_of(None)),
            (DOMAIN, labels_of(None)),
            ("team-a", labels_of(Some(" "))),
        ] {
            let mut w = World::new(Transition::RoxReadOnly);
            w.source.namespace = ns.into();
            w.labels = labels;
            refused_with(&w, "sharing domain");
        }
        // A regularModelCache binding of namespace team-a: only team-a, unlabelled, fills it.
        let mut w = World::new(Transition::RoxReadOnly);
        w.b.spec.identity =
            BindingIdentity::new(Workflow::RegularModelCache, "team-a", &capture_handle());
        refused_with(&w, "sharing domain");
        w.labels = labels_of(None);
        assert_eq!(w.step(None, None), CaptureStep::CreateClaim);
        w.source.namespace = "team-b".into();
        refused_with(&w, "sharing domain");
        // The binding recreated under the same name (another UID).
        let mut w = World::new(Transition::RoxReadOnly);
        w.b.metadata.uid = Some("another-uid".into());
        refused_with(&w, "not the binding's");
        // Another capture handle than the binding's (the digests differ).
        let mut w = World::new(Transition::RoxReadOnly);
        w.source.handle = format!("{HANDLE}?layout=flat&fill=capture");
        refused_with(&w, "digests differ");
        // A binding of a Job's handle is never filled by capture (the pod's handle must be a
        // capture handle and the binding's digest of it).
        let mut w = World::new(Transition::RoxReadOnly);
        w.b.spec.identity = BindingIdentity::new(Workflow::HelmModelCache, DOMAIN, HANDLE);
        w.source.handle = HANDLE.into();
        refused_with(&w, "digests differ");
        // The namespace not found: its domain is unknown, nothing is done.
        let w = World::new(Transition::RoxReadOnly);
        let mut o = w.obs(None, None);
        o.namespace_labels = None;
        assert!(matches!(capture_step(&o), CaptureStep::Wait(_)));
    }

    #[test]
    fn only_a_ready_pod_of_this_node_fills_a_binding_that_is_not_done() {
        let w = World::new(Transition::RoxReadOnly);
        // Another node's pod; not Ready; the binding gone.
        let mut other = World::new(Transition::RoxReadOnly);
        other.source.node = Some("gpu-2".into());
        assert!(matches!(other.step(None, None), CaptureStep::Skip(_)));
        let mut unready = World::new(Transition::RoxReadOnly);
        unready.source.ready = false;
        assert!(matches!(unready.step(None, None), CaptureStep::Skip(_)));
        let mut o = w.obs(None, None);
        o.binding = None;
        assert!(matches!(capture_step(&o), CaptureStep::Skip(_)));
        // Retiring, or being deleted: nothing.
        let mut retiring = World::new(Transition::RoxReadOnly);
        retiring.b.status = Some(ModelCacheBindingStatus {
            phase: Some(BindingPhase::Retiring),
            ..ModelCacheBindingStatus::default()
        });
        assert!(matches!(retiring.step(None, None), CaptureStep::Skip(_)));
        let mut deleting = World::new(Transition::RoxReadOnly);
        deleting.b.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert!(matches!(deleting.step(None, None), CaptureStep::Skip(_)));
        // A failure record that holds: wait; once it expired: capture again.
        let mut failed = World::new(Transition::RoxReadOnly);
        let at = |s: i64| Time(Timestamp::from_second(s).unwrap());
        failed.b.status = Some(ModelCacheBindingStatus {
            failure_record: Some(FailureRecord {
                failed_at: at(0),
                retry_after: at(3600),
                job_uid: None,
                message: "copy failed".into(),
            }),
            ..ModelCacheBindingStatus::default()
        });
        assert!(matches!(failed.step(None, None), CaptureStep::Wait(_)));
        let mut o = failed.obs(None, None);
        o.now = Timestamp::from_second(3600).unwrap();
        assert_eq!(capture_step(&o), CaptureStep::CreateClaim);
        // Complete: done, this node's holder deleted.
        let mut complete = World::new(Transition::RoxReadOnly);
        complete.b.status = Some(ModelCacheBindingStatus {
            realized: Some(RealizedStorage {
                population_state: Some(PopulationState::Ready),
                ..RealizedStorage::default()
            }),
            ..ModelCacheBindingStatus::default()
        });
        assert!(matches!(
            complete.step(None, None),
            CaptureStep::Done { holder: None, .. }
        ));
        let h = holder(&complete, "Running", NODE);
        assert!(matches!(
            complete.step(None, Some(&h)),
            CaptureStep::Done {
                holder: Some(_),
                ..
            }
        ));
        // Another node's holder is that node's agent's to delete.
        let h = holder(&complete, "Running", "gpu-2");
        assert!(matches!(
            complete.step(None, Some(&h)),
            CaptureStep::Done { holder: None, .. }
        ));
    }

    /// roxReadOnly: the claim sized from the bytes (the election), the holder, the copy, the
    /// record; three failed copies give up with the claim kept.
    #[test]
    fn a_block_capture_is_elected_by_its_claim_copied_and_recorded() {
        let w = World::new(Transition::RoxReadOnly);
        assert_eq!(w.step(None, None), CaptureStep::CreateClaim);
        let claim = w.rox_claim();
        let spec = claim.spec.as_ref().unwrap();
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
        assert_eq!(
            spec.resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"].0,
            "17Gi"
        );
        let a = claim.metadata.annotations.as_ref().unwrap();
        assert_eq!(a[COPY_POD_ANNOTATION], "pod-uid");
        assert_eq!(a[COPY_POD_NAME_ANNOTATION], "nim-0");
        assert_eq!(a[COPY_NODE_ANNOTATION], NODE);
        assert_eq!(a[SOURCE_NAMESPACE_LABEL], "team-a");
        assert_eq!(a[BINDING_UID_LABEL_ANNOTATION], "binding-uid-1");
        assert_eq!(a[COPY_SOURCE_ANNOTATION], COPY_SOURCE_CAPTURE);
        assert_eq!(
            a[crate::agent::SELECTED_NODE_ANNOTATION],
            NODE,
            "the holder is placed by nodeName"
        );

        let CaptureStep::CreateHolder(h) = w.step(Some(&claim), None) else {
            panic!("a holder")
        };
        assert_eq!(h.spec.as_ref().unwrap().node_name.as_deref(), Some(NODE));
        assert_eq!(h.metadata.name, Some(holder_name(&w.b)));
        // Pending holder, or claim not bound: wait. Both: copy.
        let pending = holder(&w, "Pending", NODE);
        let claim = bound(claim);
        assert!(matches!(
            w.step(Some(&claim), Some(&pending)),
            CaptureStep::Wait(_)
        ));
        let running = holder(&w, "Running", NODE);
        assert!(matches!(
            w.step(Some(&w.rox_claim()), Some(&running)),
            CaptureStep::Wait(_)
        ));
        assert_eq!(
            w.step(Some(&claim), Some(&running)),
            CaptureStep::Copy {
                holder_uid: "holder-uid".into(),
                pv: "pvc-1234".into()
            }
        );
        // Ended holder, or one left on another node: deleted (recreated here next).
        for h in [holder(&w, "Failed", NODE), holder(&w, "Running", "gpu-2")] {
            assert_eq!(
                w.step(Some(&claim), Some(&h)),
                CaptureStep::DeleteHolder(holder_doomed().unwrap())
            );
        }
        // A pod under the holder's name that is not a mount holder: never used or deleted.
        let mut impostor = running.clone();
        impostor.metadata.labels = None;
        assert!(matches!(
            w.step(Some(&claim), Some(&impostor)),
            CaptureStep::Refused(_)
        ));
        // Recorded: done, the holder deleted.
        let copied = with(claim.clone(), COPIED_BYTES_ANNOTATION, "123");
        assert_eq!(
            w.step(Some(&copied), Some(&running)),
            CaptureStep::Done {
                holder: holder_doomed(),
                why: format!(
                    "the copy into claim {} is recorded",
                    claim.metadata.name.clone().unwrap()
                )
            }
        );
        // Even once the pod is no longer Ready.
        let mut gone = World::new(Transition::RoxReadOnly);
        gone.source.ready = false;
        assert!(matches!(
            gone.step(Some(&copied), Some(&running)),
            CaptureStep::Done {
                holder: Some(_),
                ..
            }
        ));
        // Three failed copies: give up (holder deleted, claim kept and annotated by the IO).
        let failing = with(claim.clone(), COPY_ATTEMPTS_ANNOTATION, "3");
        let CaptureStep::GiveUp { holder: h, words } = w.step(Some(&failing), Some(&running))
        else {
            panic!()
        };
        assert_eq!(h, holder_doomed());
        assert!(
            words.contains("3 times") && words.contains("team-a/nim-0"),
            "{words}"
        );
        let given_up = with(failing, COPY_FAILED_ANNOTATION, &words);
        assert!(matches!(
            w.step(Some(&given_up), Some(&running)),
            CaptureStep::Done {
                holder: Some(_),
                ..
            }
        ));
        assert!(matches!(
            w.step(Some(&given_up), None),
            CaptureStep::Done { holder: None, .. }
        ));
    }

    /// rwxReadOnly: the binding controller's claim, elected by a preconditioned patch once
    /// Bound; then holder and copy as for block storage.
    #[test]
    fn a_shared_filesystem_capture_is_elected_by_a_preconditioned_patch() {
        let w = World::new(Transition::RwxReadOnly);
        assert!(matches!(w.step(None, None), CaptureStep::Wait(_)));
        let mut unbound = w.rwx_claim();
        unbound.status = None;
        assert!(matches!(w.step(Some(&unbound), None), CaptureStep::Wait(_)));
        let claim = w.rwx_claim();
        assert_eq!(
            w.step(Some(&claim), None),
            CaptureStep::Elect {
                claim: claim.metadata.name.clone().unwrap(),
                resource_version: "7".into()
            }
        );
        // After the patch: holder, then copy.
        let mut elected = claim.clone();
        elected
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(capture_election_annotations(&w.source, NODE));
        assert!(matches!(
            w.step(Some(&elected), None),
            CaptureStep::CreateHolder(_)
        ));
        let running = holder(&w, "Running", NODE);
        assert!(matches!(
            w.step(Some(&elected), Some(&running)),
            CaptureStep::Copy { .. }
        ));
        // A claim of another binding, or of a binding recreated under this name: never used.
        let mut foreign = claim.clone();
        foreign
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(BINDING_LABEL.into(), "model-cache-other".into());
        assert!(matches!(
            w.step(Some(&foreign), None),
            CaptureStep::Refused(_)
        ));
        let stale = with(claim, BINDING_UID_LABEL_ANNOTATION, "old-uid");
        assert!(matches!(
            w.step(Some(&stale), None),
            CaptureStep::Refused(_)
        ));
    }

    /// A claim elected for another capture pod waits while that pod lives; once it is gone and
    /// nothing is recorded the election is undone (dropped for block storage, annotations
    /// removed for RWX); a recorded copy is kept.
    #[test]
    fn an_election_of_a_gone_pod_is_undone_and_runs_again() {
        for (transition, drop_claim) in [
            (Transition::RoxReadOnly, true),
            (Transition::RwxReadOnly, false),
        ] {
            let w = World::new(transition);
            let first = SourcePod {
                namespace: "team-a",
                name: "nim-1",
                uid: "first-pod-uid",
            };
            let mut claim = match transition {
                Transition::RoxReadOnly => bound(w.rox_claim()),
                Transition::RwxReadOnly => w.rwx_claim(),
            };
            claim
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .extend(election_annotations(first, "gpu-2"));
            assert!(matches!(w.step(Some(&claim), None), CaptureStep::Wait(_)));
            let mut gone = w.obs(Some(&claim), None);
            gone.claim_pod_gone = true;
            assert_eq!(
                capture_step(&gone),
                CaptureStep::Reelect {
                    claim: Doomed {
                        name: claim.metadata.name.clone().unwrap(),
                        uid: "claim-uid".into()
                    },
                    resource_version: "7".into(),
                    drop_claim
                }
            );
            let copied = with(claim.clone(), COPIED_BYTES_ANNOTATION, "5");
            let mut gone = w.obs(Some(&copied), None);
            gone.claim_pod_gone = true;
            assert!(matches!(capture_step(&gone), CaptureStep::Done { .. }));
        }
        // A block claim without the agents' records is never written to.
        let w = World::new(Transition::RoxReadOnly);
        let mut bare = view::primary_claim(&w.b, Quantity("1Gi".into()));
        bare.metadata.uid = Some("x".into());
        assert!(matches!(w.step(Some(&bare), None), CaptureStep::Refused(_)));
        // This pod named on another node: refused, not waited on forever as someone else's.
        let other_node = with(w.rox_claim(), COPY_NODE_ANNOTATION, "gpu-9");
        assert!(matches!(
            w.step(Some(&other_node), None),
            CaptureStep::Refused(_)
        ));
    }

    #[test]
    fn an_elected_pod_is_gone_only_by_a_definite_read() {
        let b = capture_binding(Transition::RoxReadOnly);
        let pod = capture_pod(&b);
        assert!(elected_pod_gone("pod-uid", None));
        assert!(!elected_pod_gone("pod-uid", Some(&pod)));
        assert!(elected_pod_gone("another-uid", Some(&pod)));
        let mut unready = pod.clone();
        unready.status.as_mut().unwrap().conditions = None;
        assert!(
            !elected_pod_gone("pod-uid", Some(&unready)),
            "alive, not Ready"
        );
        let mut done = pod.clone();
        done.status.as_mut().unwrap().phase = Some("Failed".into());
        assert!(elected_pod_gone("pod-uid", Some(&done)));
        let mut deleting = pod;
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert!(elected_pod_gone("pod-uid", Some(&deleting)));
    }

    // ---- Cache capture sources (compile-cache sets) ----

    fn cache_handle() -> String {
        format!("cache://{}?rank=0", "ab".repeat(32))
    }

    /// The compile-cache set binding of the sharing domain `domain-1` (helmModelCache).
    fn set_binding(transition: Transition) -> ModelCacheBinding {
        let mut b = binding(transition);
        b.spec.identity = BindingIdentity::new(Workflow::HelmModelCache, DOMAIN, &cache_handle());
        b.metadata.name = Some(binding_name(&b.spec.identity));
        b.metadata.uid = Some("set-uid-1".into());
        b
    }

    /// `pod` made a cache capture source of `set` as the webhook leaves one: the labels, the
    /// set's records and the scratch emptyDir.
    fn with_cache_capture(mut pod: Pod, set: &ModelCacheBinding) -> Pod {
        let labels = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.insert(CACHE_CAPTURE_LABEL.into(), "true".into());
        labels.insert(
            CACHE_KEY_LABEL.into(),
            warmcache_api_modelcache::identity_hash(&set.spec.identity),
        );
        let a = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
        a.insert(
            CACHE_BINDING_ANNOTATION.into(),
            set.metadata.name.clone().unwrap(),
        );
        a.insert(
            CACHE_BINDING_UID_ANNOTATION.into(),
            set.metadata.uid.clone().unwrap(),
        );
        a.insert(CACHE_HANDLE_ANNOTATION.into(), cache_handle());
        pod.spec
            .as_mut()
            .unwrap()
            .volumes
            .get_or_insert_with(Vec::new)
            .push(Volume {
                name: SCRATCH_VOLUME.into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            });
        pod
    }

    /// A Ready pod that is only a cache capture source (no model capture label).
    fn cache_pod(set: &ModelCacheBinding) -> Pod {
        let mut p = with_cache_capture(capture_pod(&capture_binding(Transition::RoxReadOnly)), set);
        p.metadata.labels.as_mut().unwrap().remove(CAPTURE_LABEL);
        p
    }

    fn cache_source_of(pod: &Pod) -> CaptureSource {
        match cache_capture_source(pod) {
            CaptureState::Source(s) => s,
            other => panic!("{other:?}"),
        }
    }

    fn cache_refused(pod: &Pod) -> String {
        match cache_capture_source(pod) {
            CaptureState::Refused(why) => why,
            other => panic!("{other:?}"),
        }
    }

    fn cache_world(transition: Transition) -> World {
        let b = set_binding(transition);
        let source = cache_source_of(&cache_pod(&b));
        World {
            b,
            source,
            labels: labels_of(Some(DOMAIN)),
            image: image(),
        }
    }

    #[test]
    fn a_ready_pod_labelled_for_its_compile_caches_is_a_cache_capture_source() {
        let set = set_binding(Transition::RoxReadOnly);
        let s = cache_source_of(&cache_pod(&set));
        assert_eq!(
            s,
            CaptureSource {
                kind: CaptureKind::CacheSet,
                namespace: "team-a".into(),
                name: "nim-0".into(),
                uid: "pod-uid".into(),
                node: Some(NODE.into()),
                binding: set.metadata.name.clone().unwrap(),
                binding_uid: "set-uid-1".into(),
                handle: cache_handle(),
                volume: SCRATCH_VOLUME.into(),
                path: String::new(),
                ready: true,
                ended: false,
            }
        );
        assert!(s.kind.filtered() && !CaptureKind::Model.filtered());
        assert_eq!(
            CaptureKind::ALL.map(CaptureKind::label),
            ["model", "cache_set"]
        );
        // Not labelled, or another value: not a cache capture source (a model source at most).
        let mut plain = cache_pod(&set);
        plain
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(CACHE_CAPTURE_LABEL.into(), "false".into());
        assert_eq!(cache_capture_source(&plain), CaptureState::NotCapture);
        assert!(capture_sources(&plain).is_empty());
        // A model capture source is not a cache capture source, and the reverse.
        let model = capture_pod(&capture_binding(Transition::RoxReadOnly));
        assert_eq!(cache_capture_source(&model), CaptureState::NotCapture);
        assert_eq!(capture_source(&cache_pod(&set)), CaptureState::NotCapture);
        // Readiness as for a model capture.
        let mut p = cache_pod(&set);
        p.status.as_mut().unwrap().phase = Some("Pending".into());
        assert!(!cache_source_of(&p).ready);
        let mut p = cache_pod(&set);
        p.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let s = cache_source_of(&p);
        assert!(!s.ready && s.ended);
    }

    /// Records a pod author controls that would fill a set from elsewhere than the scratch
    /// emptyDir, or fill a binding that is not a set: refused before anything is looked up.
    #[test]
    fn hostile_or_missing_cache_records_are_refused() {
        let set = set_binding(Transition::RoxReadOnly);
        // A handle that is not a cache-set handle: a model's, a capture handle, a malformed one.
        for handle in [
            HANDLE.to_owned(),
            capture_handle(),
            format!("cache://{}?rank=01", "ab".repeat(32)),
            format!("cache://{}", "ab".repeat(32)),
            format!("cache://{}?rank=0", "AB".repeat(32)),
        ] {
            let mut p = cache_pod(&set);
            annotate(&mut p, CACHE_HANDLE_ANNOTATION, &handle);
            assert!(
                cache_refused(&p).contains("not a cache-set handle"),
                "{handle}"
            );
        }
        // The scratch volume not an emptyDir (a hostPath under its name), or not declared.
        let mut p = cache_pod(&set);
        for v in p.spec.as_mut().unwrap().volumes.as_mut().unwrap() {
            if v.name == SCRATCH_VOLUME {
                v.empty_dir = None;
                v.host_path = Some(HostPathVolumeSource {
                    path: "/root".into(),
                    type_: None,
                });
            }
        }
        assert!(cache_refused(&p).contains("not one of its emptyDir volumes"));
        let mut p = cache_pod(&set);
        p.spec
            .as_mut()
            .unwrap()
            .volumes
            .as_mut()
            .unwrap()
            .retain(|v| v.name != SCRATCH_VOLUME);
        assert!(cache_refused(&p).contains("not one of its emptyDir volumes"));
        // The model's capture annotations never move the landing of a set (always the scratch
        // volume's root).
        let s = cache_source_of(&cache_pod(&set));
        assert_eq!((s.volume.as_str(), s.path.as_str()), (SCRATCH_VOLUME, ""));
        // A record missing or empty.
        for key in [
            CACHE_BINDING_ANNOTATION,
            CACHE_BINDING_UID_ANNOTATION,
            CACHE_HANDLE_ANNOTATION,
        ] {
            let mut p = cache_pod(&set);
            p.metadata.annotations.as_mut().unwrap().remove(key);
            assert!(cache_refused(&p).contains("lacks"), "{key}");
            let mut p = cache_pod(&set);
            annotate(&mut p, key, "");
            assert!(cache_refused(&p).contains("lacks"), "{key} empty");
        }
        let mut p = cache_pod(&set);
        p.metadata.labels.as_mut().unwrap().remove(CACHE_KEY_LABEL);
        assert!(cache_refused(&p).contains("lacks"));
        // A cache key that is not the named binding's.
        let mut p = cache_pod(&set);
        p.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(CACHE_KEY_LABEL.into(), "0".repeat(48));
        assert!(cache_refused(&p).contains("does not name binding"));
        // No namespace, name or UID.
        let mut p = cache_pod(&set);
        p.metadata.uid = None;
        assert!(matches!(cache_capture_source(&p), CaptureState::Refused(_)));
    }

    /// The trust rules of a model capture hold for a set unchanged: the binding's UID, the
    /// handle's digest, the sharing domain; and a set never fills a model binding nor the
    /// reverse.
    #[test]
    fn a_cache_capture_is_checked_against_its_set_binding() {
        let w = cache_world(Transition::RoxReadOnly);
        assert_eq!(w.step(None, None), CaptureStep::CreateClaim);
        let refused_with = |w: &World, words: &str| match w.step(None, None) {
            CaptureStep::Refused(why) => assert!(why.contains(words), "{why}"),
            other => panic!("{other:?}"),
        };
        // Another set's handle (another configuration, another rank): the digests differ.
        for other in [
            format!("cache://{}?rank=0", "cd".repeat(32)),
            format!("cache://{}?rank=1", "ab".repeat(32)),
        ] {
            let mut w = cache_world(Transition::RoxReadOnly);
            w.source.handle = other;
            refused_with(&w, "cache-set handle (digests differ)");
        }
        // A set source naming the model's capture binding, and a model source naming a set
        // binding (a pod copying one binding's records onto the other's): refused.
        let mut w = cache_world(Transition::RoxReadOnly);
        w.b = capture_binding(Transition::RoxReadOnly);
        w.source.binding_uid = "binding-uid-1".into();
        refused_with(&w, "digests differ");
        let mut w = World::new(Transition::RoxReadOnly);
        w.b = set_binding(Transition::RoxReadOnly);
        w.source.binding_uid = "set-uid-1".into();
        w.source.handle = cache_handle();
        refused_with(&w, "not binding");
        // Another UID; a namespace outside the domain.
        let mut w = cache_world(Transition::RoxReadOnly);
        w.source.binding_uid = "binding-uid-1".into();
        refused_with(&w, "not the binding's");
        let mut w = cache_world(Transition::RoxReadOnly);
        w.labels = labels_of(Some("domain-2"));
        refused_with(&w, "sharing domain");
        // Not Ready, another node, a complete set: as for a model.
        let mut w = cache_world(Transition::RoxReadOnly);
        w.source.ready = false;
        assert!(matches!(w.step(None, None), CaptureStep::Skip(_)));
        let mut w = cache_world(Transition::RoxReadOnly);
        w.source.node = Some("gpu-2".into());
        assert!(matches!(w.step(None, None), CaptureStep::Skip(_)));
        let mut w = cache_world(Transition::RoxReadOnly);
        w.b.status = Some(ModelCacheBindingStatus {
            realized: Some(RealizedStorage {
                population_state: Some(PopulationState::Ready),
                ..RealizedStorage::default()
            }),
            ..ModelCacheBindingStatus::default()
        });
        assert!(matches!(w.step(None, None), CaptureStep::Done { .. }));
        let mut w = cache_world(Transition::RoxReadOnly);
        w.b.status = Some(ModelCacheBindingStatus {
            phase: Some(BindingPhase::Retiring),
            ..ModelCacheBindingStatus::default()
        });
        assert!(matches!(w.step(None, None), CaptureStep::Skip(_)));
    }

    /// The same steps as a model capture: the claim of the set's binding sized from the bytes,
    /// its holder, the copy, the record; the give-up's words name the compile caches.
    #[test]
    fn a_set_goes_through_the_capture_steps_of_its_own_binding() {
        let w = cache_world(Transition::RoxReadOnly);
        let claim = w.rox_claim();
        assert_eq!(
            claim.metadata.name,
            Some(warmcache_api_modelcache::writer_pvc_name(
                &w.b.spec.identity
            ))
        );
        let a = claim.metadata.annotations.as_ref().unwrap();
        assert_eq!(a[COPY_SOURCE_ANNOTATION], COPY_SOURCE_CAPTURE);
        assert_eq!(a[BINDING_UID_LABEL_ANNOTATION], "set-uid-1");
        let CaptureStep::CreateHolder(h) = w.step(Some(&claim), None) else {
            panic!("a holder")
        };
        assert_eq!(h.metadata.name, Some(holder_name(&w.b)));
        let claim = bound(claim);
        let mut running = holder_pod(&w.b, NODE, &w.image);
        running.metadata.uid = Some("holder-uid".into());
        running.status = holder(&w, "Running", NODE).status;
        assert_eq!(
            w.step(Some(&claim), Some(&running)),
            CaptureStep::Copy {
                holder_uid: "holder-uid".into(),
                pv: "pvc-1234".into()
            }
        );
        let failing = with(claim, COPY_ATTEMPTS_ANNOTATION, "3");
        let CaptureStep::GiveUp { words, .. } = w.step(Some(&failing), Some(&running)) else {
            panic!()
        };
        assert!(
            words.contains("compile caches of pod team-a/nim-0") && words.contains("3 times"),
            "{words}"
        );
        // rwxReadOnly: the binding controller's claim, elected by a patch.
        let w = cache_world(Transition::RwxReadOnly);
        assert!(matches!(
            w.step(Some(&w.rwx_claim()), None),
            CaptureStep::Elect { .. }
        ));
    }

    /// A pod both a model capture source and a cache capture source: two sources of two
    /// bindings, each refused or accepted on its own.
    #[test]
    fn a_pod_can_be_both_sources_and_each_stands_alone() {
        let model = capture_binding(Transition::RoxReadOnly);
        let set = set_binding(Transition::RoxReadOnly);
        let both = with_cache_capture(capture_pod(&model), &set);
        let sources = capture_sources(&both);
        let [
            (CaptureKind::Model, CaptureState::Source(m)),
            (CaptureKind::CacheSet, CaptureState::Source(c)),
        ] = sources.as_slice()
        else {
            panic!("{sources:?}")
        };
        assert_eq!(
            (m.kind, c.kind),
            (CaptureKind::Model, CaptureKind::CacheSet)
        );
        assert_eq!(m.binding, model.metadata.name.clone().unwrap());
        assert_eq!(c.binding, set.metadata.name.clone().unwrap());
        assert_eq!((m.volume.as_str(), m.path.as_str()), (VOLUME, "ngc/models"));
        assert_eq!((c.volume.as_str(), c.path.as_str()), (SCRATCH_VOLUME, ""));
        // The set's records broken: the model capture stays a source.
        let mut broken = both.clone();
        annotate(&mut broken, CACHE_HANDLE_ANNOTATION, HANDLE);
        let sources = capture_sources(&broken);
        assert!(
            matches!(
                sources.as_slice(),
                [
                    (CaptureKind::Model, CaptureState::Source(_)),
                    (CaptureKind::CacheSet, CaptureState::Refused(_))
                ]
            ),
            "{sources:?}"
        );
        // The watches reach each source through its own binding only.
        let model_name = model.metadata.name.clone().unwrap();
        let set_name = set.metadata.name.clone().unwrap();
        assert!(is_capture_source_of(&both, &model_name));
        assert!(is_capture_source_of(&both, &set_name));
        assert!(!is_capture_source_of(&both, "model-cache-other"));
        assert!(is_capture_source_of(&cache_pod(&set), &set_name));
        assert!(!is_capture_source_of(&cache_pod(&set), &model_name));
        let mut unlabelled = both;
        unlabelled.metadata.labels = None;
        assert!(!is_capture_source_of(&unlabelled, &set_name));
        assert!(capture_sources(&unlabelled).is_empty());
    }
}
