//! The lifecycle of one binding as a pure step function: given what the controller observed
//! (the binding, its primary claim and PV, the writer view, the writer Job and its pods, the
//! namespaces and workloads of the pods that read it), what to write next.
//!
//! The controller writes [`Step::status`] first (when it differs from the stored one) and then
//! runs [`Step::actions`] in order; every action is a create or an update of an object with a
//! deterministic name, so a crash between any two calls is finished by the next step from what
//! is stored. The rules it encodes:
//!
//! - **Request references**: the live workloads of the binding's pods are added only while the
//!   binding is Active; stale ones (gone, or another UID) are dropped; when none is left the
//!   time is recorded for the reaper ([`merge_references`]).
//! - **One writer**: the primary claim `rw-pvc-<hash>` in the control namespace, then (RWX) the
//!   writer view and the writer Job in the writer namespace, both under deterministic names, so
//!   the API server's AlreadyExists is the election.
//! - **The primary PV is the claim's own**: nothing is written to, derived from or downloaded
//!   into a PV the primary claim bound unless it was provisioned for that claim
//!   ([`provisioned_for`]); otherwise `ForeignObject` names it.
//! - **Completion**: a succeeded Job makes the controller label the primary PV complete (with
//!   bytes, identity and source namespace) and set Retain ([`Action::MarkComplete`], re-read
//!   until stored); only a PV observed with both makes the cache Ready and releases the writer
//!   claim. Ready is read from the PV, so it survives the Job's TTL.
//! - **Views**: every namespace with a reading pod gets its view recorded in
//!   `status.realized.views`; only views already in the *stored* status are created.
//! - **Failure**: a failed Job sets population Failed with the download's last words, writes
//!   the failure record (`status.failureRecord`, valid [`LifecycleConfig::failure_record_seconds`],
//!   one hour: the webhook leaves new pods on their own download while it holds), deletes the
//!   readers still waiting for the copy whose controller recreates them
//!   ([`reader_after_failure`]: ReplicaSet, StatefulSet, DaemonSet, LeaderWorkerSet) so they
//!   come back on that path (bare pods and Job pods are kept until their wait deadline),
//!   retires the writer view and keeps the primary; once the record has expired
//!   and the Job is gone (its TTL) the next reading pod's step retries with a new Job, and a
//!   later success clears the record.
//! - **Nothing is deleted** except the writer view's claim, and only after completion is
//!   persisted or on failure; PVs and data are the reaper's.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{EnvVar, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use warmcache_api_modelcache::v2beta1::{
    BindingPhase, FailureRecord, ModelCacheBinding, ModelCacheBindingStatus, PopulationState,
    ReadOnlyView, RealizedStorage, RequestReference, Transition,
};
use warmcache_api_modelcache::{identity_hash, writer_pvc_name};

use crate::encryption::{self, EncryptionNames};
use crate::keys::{REVISION_ANNOTATION, TRACE_PARENT_ANNOTATION};
use crate::lease::{Election, LeaseWrite};
use crate::step::DownloadStep;
use crate::view::{self, ViewError};
use crate::volume_keys::{
    BYTES_ANNOTATION, COMPLETE_LABEL, COPIED_BYTES_ANNOTATION, COPY_FAILED_ANNOTATION,
    COPY_NODE_ANNOTATION, COPY_SOURCE_ANNOTATION, COPY_SOURCE_CAPTURE, HANDLE_DIGEST_ANNOTATION,
    MANIFEST_DIGEST_ANNOTATION, SOURCE_NAMESPACE_LABEL, WRITER_CONTAINER,
};
use crate::writer::{self, WriterOptions, bytes_from_termination_message};

/// Condition type: readers can read the complete copy.
pub const READY: &str = "Ready";
/// Condition type: the controller is creating or waiting for something.
pub const PROGRESSING: &str = "Progressing";
/// Condition type: a failure that needs attention.
pub const DEGRADED: &str = "Degraded";

/// Why a condition has its status (the `reason` of Ready, Progressing and Degraded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// No reading pod carries a download step in the writer namespace yet.
    WaitingForDownloadStep,
    /// The writer namespace has no reading pod left and its Job is gone: another namespace of
    /// the sharing domain takes the download over once the grace period has passed.
    WaitingForTakeover,
    /// The primary claim is being created.
    CreatingPrimary,
    /// The primary claim is not bound yet.
    PrimaryClaimPending,
    /// The writer view and Job are being created.
    StartingDownload,
    /// The writer Job is downloading.
    Downloading,
    /// The Job succeeded; completion labels and Retain are being persisted on the primary PV.
    Completing,
    /// The primary PV is complete and retained; readers can read it.
    Downloaded,
    /// Views of reading namespaces are being recorded or created.
    CreatingViews,
    /// Everything the binding needs exists.
    Reconciled,
    /// Nothing is wrong.
    AsExpected,
    /// A complete, retained primary of this cache is being adopted (no download).
    AdoptingRetained,
    /// The storage would be decided differently today ([`crate::drift`]).
    DecisionDrift,
    /// The storage would be decided the same way today.
    NoDrift,
    /// The writer Job failed.
    DownloadFailed,
    /// The recorded download step cannot run as a writer Job.
    InvalidDownloadStep,
    /// The primary's PV cannot be viewed.
    InvalidPrimaryVolume,
    /// An object under one of the binding's names belongs to something else.
    ForeignObject,
    /// The last attempt to store the completion labels and Retain failed (conflicts retried
    /// past their bound, or a re-read that does not show them); the writer claim is kept.
    CompletionNotStored,
    /// The binding is Retiring or being deleted: the reaper's.
    Retiring,
    /// roxReadOnly: the download is staged in the Job's pod; the node agent measures and
    /// copies it into the primary claim it creates.
    Staging,
    /// roxReadOnly: the node agent is copying the staged download into the primary.
    Copying,
    /// Capture sources keep their own download; the node agent of the first one Ready captures
    /// it ([`crate::keys::CAPTURE_LABEL`]).
    WaitingForCapture,
    /// A node agent is copying a capture source's own download into the primary.
    Capturing,
    /// roxReadOnly: the complete primary's claim is being released so the volume detaches.
    ReleasingPrimary,
    /// roxReadOnly: a VolumeAttachment still attaches the complete primary (read-write);
    /// read-only views wait until it is gone.
    WaitingForDetach,
    /// roxReadOnly: the released primary claim is still kept by its finalizers
    /// (`kubernetes.io/pvc-protection`: a pod mounts it) past
    /// [`LifecycleConfig::primary_release_grace_seconds`]; the message names the pods.
    PrimaryClaimHeld,
    /// An encrypted cache's key Secret is gone while its data exists: readers cannot open it,
    /// and a new key never could, so none is created.
    EncryptionKeyMissing,
    /// An encrypted cache's StorageClass cannot be derived: the StorageClass the decision was
    /// taken on is gone or changed.
    EncryptionClassUnavailable,
    /// An encrypted binding names other objects than the ones derived from its identity, or
    /// asks for encryption on a flow that has none.
    InvalidEncryption,
}

impl Reason {
    /// The CamelCase reason.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::WaitingForDownloadStep => "WaitingForDownloadStep",
            Self::WaitingForTakeover => "WaitingForTakeover",
            Self::CreatingPrimary => "CreatingPrimary",
            Self::PrimaryClaimPending => "PrimaryClaimPending",
            Self::StartingDownload => "StartingDownload",
            Self::Downloading => "Downloading",
            Self::Completing => "Completing",
            Self::Downloaded => "Downloaded",
            Self::CreatingViews => "CreatingViews",
            Self::Reconciled => "Reconciled",
            Self::AsExpected => "AsExpected",
            Self::AdoptingRetained => "AdoptingRetained",
            Self::DecisionDrift => "DecisionDrift",
            Self::NoDrift => "NoDrift",
            Self::DownloadFailed => "DownloadFailed",
            Self::InvalidDownloadStep => "InvalidDownloadStep",
            Self::InvalidPrimaryVolume => "InvalidPrimaryVolume",
            Self::ForeignObject => "ForeignObject",
            Self::CompletionNotStored => "CompletionNotStored",
            Self::Retiring => "Retiring",
            Self::Staging => "Staging",
            Self::Copying => "Copying",
            Self::WaitingForCapture => "WaitingForCapture",
            Self::Capturing => "Capturing",
            Self::ReleasingPrimary => "ReleasingPrimary",
            Self::WaitingForDetach => "WaitingForDetach",
            Self::PrimaryClaimHeld => "PrimaryClaimHeld",
            Self::EncryptionKeyMissing => "EncryptionKeyMissing",
            Self::EncryptionClassUnavailable => "EncryptionClassUnavailable",
            Self::InvalidEncryption => "InvalidEncryption",
        }
    }
}

/// A condition the controller records (it keeps `lastTransitionTime` when the status did not
/// change, and sets `observedGeneration`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedCondition {
    /// [`READY`], [`PROGRESSING`], [`DEGRADED`] or [`crate::drift::DECISION_DRIFT`].
    pub type_: &'static str,
    /// Whether it holds.
    pub status: bool,
    /// Why.
    pub reason: Reason,
    /// In words.
    pub message: String,
}

/// A write the controller makes, in order, after the status.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Create the primary claim in the control namespace.
    CreatePrimaryClaim(PersistentVolumeClaim),
    /// Warm start: make the retained complete primary PV `pv` bindable by the new primary claim
    /// (clear `claimRef.uid` and `claimRef.resourceVersion`, update with its resourceVersion),
    /// then [`Action::CreatePrimaryClaim`] pre-bound to it follows.
    AdoptPrimary {
        /// The PV.
        pv: String,
        /// Its resourceVersion as observed.
        resource_version: String,
    },
    /// Create the writer view's PV, then its claim (each AlreadyExists is fine).
    CreateWriterView(PersistentVolume, PersistentVolumeClaim),
    /// The writer view's PV still names a released claim: clear `claimRef.uid` and
    /// `claimRef.resourceVersion` (update with its resourceVersion) so the new claim binds.
    RebindWriterView {
        /// The PV.
        pv: String,
        /// Its resourceVersion as observed.
        resource_version: String,
    },
    /// Create the writer Job (AlreadyExists: another replica or an earlier reconcile won).
    CreateJob(Box<k8s_openapi::api::batch::v1::Job>),
    /// Label the primary PV complete and set Retain with its resourceVersion, re-reading and
    /// retrying on conflicts (bounded) until both are stored.
    MarkComplete {
        /// The primary PV.
        pv: String,
        /// Labels to add.
        labels: BTreeMap<String, String>,
        /// Annotations to add.
        annotations: BTreeMap<String, String>,
    },
    /// Delete the writer view's claim in the writer namespace (with its UID as precondition):
    /// only after a stored completion, or on failure.
    ReleaseWriterClaim {
        /// Writer namespace.
        namespace: String,
        /// `rw-pvc-<hash>`.
        name: String,
        /// The observed UID.
        uid: String,
    },
    /// Release a writer view claim an earlier writer namespace left behind
    /// ([`Observed::stale_writer_claims`]): the controller first reads the writer Lease afresh
    /// and keeps the claim when the Lease names its namespace (the caches may lag a takeover),
    /// then deletes it with its UID as precondition.
    ReleaseStaleWriterClaim {
        /// Its namespace.
        namespace: String,
        /// `rw-pvc-<hash>`.
        name: String,
        /// The observed UID.
        uid: String,
    },
    /// Delete the primary claim in the control namespace (with its UID as precondition).
    /// roxReadOnly: the complete primary's, so the volume detaches; only after the completion
    /// labels and Retain are observed on its PV, which stays Released for the read-only views.
    /// Either flow: a claim a capture failed on, so the next capture starts on a fresh volume
    /// (the reaper removes the incomplete PV it leaves).
    ReleasePrimaryClaim {
        /// `rw-pvc-<hash>`.
        name: String,
        /// The observed UID.
        uid: String,
    },
    /// Create a read-only view (PV, then claim) recorded in the stored status.
    CreateView(PersistentVolume, PersistentVolumeClaim),
    /// Delete the readers of the binding in these namespaces that still wait for the copy, are
    /// not Ready and are controlled by a kind that recreates them ([`reader_after_failure`]; UID
    /// and resourceVersion as preconditions): while the failure record holds, admission leaves
    /// the new pods on their own download. Waiting readers nothing recreates (bare pods, Job
    /// pods) are kept and reported.
    DeleteWaitingReaders {
        /// Reader namespaces.
        namespaces: Vec<String>,
    },
    /// Write the writer Lease ([`crate::lease`]): a create (AlreadyExists: another controller
    /// chose first) or an update with its resourceVersion and UID (a conflict: someone else
    /// wrote first). When it precedes a [`Action::CreateJob`], a lost write stops the actions:
    /// the next reconcile decides again from the winner.
    WriteLease(LeaseWrite),
    /// Create an encrypted cache's key Secret. The controller generates the key at the create
    /// (no action carries it); AlreadyExists means another replica or an earlier reconcile won,
    /// and that key stays.
    CreateKeySecret(EncryptionNames),
    /// Create an encrypted cache's StorageClass (AlreadyExists is fine: it is checked on the next
    /// reconcile).
    CreateEncryptedClass(Box<StorageClass>),
    /// roxReadOnly: record the commit the completed staging Job resolved on the complete primary
    /// PV ([`REVISION_ANNOTATION`]); only added, never changed.
    RecordRevision {
        /// The PV.
        pv: String,
        /// The commit.
        revision: String,
    },
}

/// What to do next.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The status to store (the controller adds conditions from [`Step::conditions`]).
    pub status: ModelCacheBindingStatus,
    /// Ready, Progressing and Degraded.
    pub conditions: Vec<WantedCondition>,
    /// Writes to make after the status, in order.
    pub actions: Vec<Action>,
    /// When the controller should look again although nothing it watches may change (the end
    /// of a takeover's grace period, the expiry of a failure record).
    pub recheck_at: Option<Timestamp>,
}

/// A download step and the pod it was recorded on.
#[derive(Debug, Clone, PartialEq)]
pub struct StepSource {
    /// The step.
    pub step: DownloadStep,
    /// Values of the literal secrets the step copies from the pod.
    pub pod_env: Vec<EnvVar>,
}

/// Operator settings of the lifecycle.
#[derive(Debug, Clone, PartialEq)]
pub struct LifecycleConfig {
    /// Size of the RWX primary claim (nothing is measured before the download).
    pub primary_size: Quantity,
    /// Extra mount options of read-only views (those negating a required one are dropped).
    pub extra_mount_options: Vec<String>,
    /// Writer Job settings.
    pub writer: WriterOptions,
    /// Seconds the holder of the writer Lease has been gone (its Job gone, no reading pod with
    /// a step left in its namespace) before another namespace takes the download over.
    pub takeover_grace_seconds: i64,
    /// Seconds a failure record holds (admission leaves new pods on their own download, waiting
    /// readers are deleted, no retry starts).
    pub failure_record_seconds: i64,
    /// roxReadOnly: seconds the released primary claim may stay (kept by its finalizers, a pod
    /// still mounting it) before the binding reports `Degraded` / [`Reason::PrimaryClaimHeld`].
    pub primary_release_grace_seconds: i64,
}

/// Default of [`LifecycleConfig::primary_release_grace_seconds`]: five minutes (the node agent
/// deletes its mount holder as soon as the copy is recorded).
pub const DEFAULT_PRIMARY_RELEASE_GRACE_SECONDS: i64 = 300;

/// Default validity of a failure record: one hour (nvsnap's failed-record TTL).
pub const DEFAULT_FAILURE_RECORD_SECONDS: i64 = 3600;

/// Seconds past `status.failureRecord.retryAfter` that admission still treats a failure
/// record as holding ([`crate::check_joinable`]): the webhook's clock may run behind the
/// controller's that wrote `retryAfter`, and a pod joined before the controller sees the record
/// expire would wait on a cache no writer retries yet.
pub const FAILURE_RECORD_CLOCK_MARGIN_SECONDS: i64 = 30;

/// The longest failure message recorded (`status.failureRecord.message`).
pub const MAX_FAILURE_MESSAGE_BYTES: usize = 2048;

impl Default for LifecycleConfig {
    fn default() -> Self {
        Self {
            primary_size: Quantity("100Gi".to_owned()),
            extra_mount_options: Vec::new(),
            writer: WriterOptions::default(),
            takeover_grace_seconds: crate::lease::DEFAULT_TAKEOVER_GRACE_SECONDS,
            failure_record_seconds: DEFAULT_FAILURE_RECORD_SECONDS,
            primary_release_grace_seconds: DEFAULT_PRIMARY_RELEASE_GRACE_SECONDS,
        }
    }
}

/// Everything the step reads. Objects are as observed (cache or fresh reads); `None` when not
/// found.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    /// The binding.
    pub binding: &'a ModelCacheBinding,
    /// The time to record.
    pub now: Time,
    /// Live workloads of the binding's pods (top-level owners), not yet deduplicated.
    pub seen_references: Vec<RequestReference>,
    /// UIDs of stored references found stale (NotFound, or the name has another UID).
    pub stale_references: BTreeSet<String>,
    /// Namespaces with a live pod of the binding.
    pub reader_namespaces: BTreeSet<String>,
    /// The W3C `traceparent` a reading pod of each namespace carries (the webhook's admission
    /// trace; the pod whose step the writer runs is preferred): the writer Job and each view
    /// continue it ([`TRACE_PARENT_ANNOTATION`] on the objects built), and the completion
    /// continues the Job's.
    pub traceparents: BTreeMap<String, String>,
    /// The model URI of a pod whose handle matches the binding.
    pub model_uri: Option<String>,
    /// The writer ([`crate::lease::elect`]): its namespace, and the Lease writes.
    pub writer: Election,
    /// A download step recorded on a pod of the writer namespace ([`Election::namespace`]).
    pub step: Option<StepSource>,
    /// Live capture sources of the binding (`namespace/name`, sorted): pods labelled
    /// [`crate::keys::CAPTURE_LABEL`] whose handle is the binding's.
    pub capture_sources: Vec<String>,
    /// The primary claim in the control namespace.
    pub primary_claim: Option<&'a PersistentVolumeClaim>,
    /// The PV the primary claim is bound to.
    pub primary_pv: Option<&'a PersistentVolume>,
    /// The writer view's PV.
    pub writer_view_pv: Option<&'a PersistentVolume>,
    /// The writer view's claim (in the writer namespace).
    pub writer_view_claim: Option<&'a PersistentVolumeClaim>,
    /// The writer view claim of the previous writer, when the election takes the download over
    /// ([`Election::previous`]): released with the takeover.
    pub previous_writer_claim: Option<&'a PersistentVolumeClaim>,
    /// This binding's writer view claims (`rw-pvc-<hash>` labelled with it, role writer) in
    /// namespaces other than the control namespace and [`Election::namespace`], where no writer
    /// Job of the binding exists: left behind by an earlier writer (a crash between a takeover's
    /// Lease write and the release of the previous claim). Released on every reconcile whose
    /// election writes nothing, never the stored holder's ([`Election::stored`]).
    pub stale_writer_claims: Vec<&'a PersistentVolumeClaim>,
    /// The writer Job.
    pub job: Option<&'a Job>,
    /// The writer Job's pods.
    pub job_pods: Vec<&'a Pod>,
    /// Namespaces whose view PV and claim both exist.
    pub existing_views: BTreeSet<String>,
    /// An object under one of the binding's names that belongs to something else (its
    /// description): nothing is created until it is gone.
    pub foreign: Option<String>,
    /// Why the last attempt to store completion on the primary PV failed, if it did.
    pub completion_error: Option<String>,
    /// Complete primaries of this cache left by an earlier binding (PVs labelled complete with
    /// this binding's identity hash), for a warm start.
    pub retained: Vec<&'a PersistentVolume>,
    /// roxReadOnly: the VolumeAttachments (names) of each candidate primary PV (the bound one
    /// and the retained ones), by PV name. Read-only views wait until the complete primary has
    /// none: a block driver such as NVMesh refuses a read-only attach while the volume is
    /// attached read-write anywhere, even by a finished pod.
    pub attachments: BTreeMap<String, Vec<String>>,
    /// roxReadOnly: the pods (`namespace/name`, not finished) that mount the primary claim,
    /// read once the claim is being deleted: `kubernetes.io/pvc-protection` keeps it while they
    /// do. Empty otherwise.
    pub primary_claim_holders: Vec<String>,
    /// An encrypted binding's objects as read (all `None` for a binding that is not encrypted).
    pub encryption: EncryptionObserved<'a>,
    /// Settings.
    pub config: &'a LifecycleConfig,
}

/// What the controller read of an encrypted binding's objects.
#[derive(Debug, Clone, Copy, Default)]
pub struct EncryptionObserved<'a> {
    /// The key Secret's metadata (the controller never reads the key).
    pub secret: Option<&'a ObjectMeta>,
    /// The encrypted StorageClass.
    pub class: Option<&'a StorageClass>,
    /// The StorageClass the decision was taken on (`nvcf-sc`), read when the encrypted class is
    /// missing: it is derived from it.
    pub base_class: Option<&'a StorageClass>,
}

/// The stored references merged with the live ones seen: stale ones dropped, new ones added
/// only while `active`, one per UID, ordered by (namespace, kind, name, uid) so the stored list
/// does not churn.
pub fn merge_references(
    stored: &[RequestReference],
    seen: &[RequestReference],
    stale: &BTreeSet<String>,
    active: bool,
) -> Vec<RequestReference> {
    let mut by_uid: BTreeMap<String, RequestReference> = BTreeMap::new();
    for r in stored.iter().filter(|r| !stale.contains(&r.uid)) {
        by_uid.insert(r.uid.clone(), r.clone());
    }
    if active {
        for r in seen
            .iter()
            .filter(|r| !stale.contains(&r.uid) && !r.uid.is_empty())
        {
            by_uid.entry(r.uid.clone()).or_insert_with(|| r.clone());
        }
    }
    let mut refs: Vec<RequestReference> = by_uid.into_values().collect();
    refs.sort_by(|a, b| {
        (&a.namespace, &a.kind, &a.name, &a.uid).cmp(&(&b.namespace, &b.kind, &b.name, &b.uid))
    });
    refs
}

fn job_condition(job: &Job, type_: &str) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

/// The writer's last words: the termination message of the download container of the Job's
/// most recent pod that ended, or the Job's own failure message.
pub fn last_words(job: &Job, pods: &[&Pod]) -> String {
    let mut ended: Vec<(String, String)> = pods
        .iter()
        .filter_map(|p| {
            let status = p.status.as_ref()?;
            // A staging pod whose hold failed speaks through the hold (the agent's words);
            // otherwise the download container, an init container in a staging pod.
            let ended = |c: &&k8s_openapi::api::core::v1::ContainerStatus| {
                c.state.as_ref().and_then(|s| s.terminated.clone())
            };
            let hold = status
                .container_statuses
                .iter()
                .flatten()
                .filter(|c| c.name == writer::HOLD_CONTAINER)
                .find_map(|c| ended(&c).filter(|t| t.exit_code != 0));
            let t = hold.or_else(|| {
                status
                    .container_statuses
                    .iter()
                    .flatten()
                    .chain(status.init_container_statuses.iter().flatten())
                    .filter(|c| c.name == WRITER_CONTAINER)
                    .find_map(|c| ended(&c))
            })?;
            let at = t
                .finished_at
                .as_ref()
                .map(|f| f.0.to_string())
                .unwrap_or_default();
            let words = t
                .message
                .clone()
                .filter(|m| !m.trim().is_empty())
                .unwrap_or_else(|| {
                    format!(
                        "exit code {}{}",
                        t.exit_code,
                        t.reason
                            .as_deref()
                            .map(|r| format!(" ({r})"))
                            .unwrap_or_default()
                    )
                });
            Some((at, words))
        })
        .collect();
    ended.sort();
    if let Some((_, words)) = ended.pop() {
        return words.trim().to_owned();
    }
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Failed"))
        .map(|c| {
            format!(
                "{}: {}",
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default()
            )
        })
        .unwrap_or_else(|| "the writer Job failed without a message".to_owned())
}

/// The byte count of the Job's succeeded pod, from its termination message.
pub fn measured_bytes(pods: &[&Pod]) -> Option<u64> {
    pods.iter().find_map(|p| {
        p.status
            .as_ref()?
            .container_statuses
            .iter()
            .flatten()
            .find(|c| c.name == WRITER_CONTAINER)?
            .state
            .as_ref()?
            .terminated
            .as_ref()
            .filter(|t| t.exit_code == 0)?
            .message
            .as_deref()
            .and_then(bytes_from_termination_message)
    })
}

/// The commit the writer of `job` recorded (`revision=` in the termination message of its
/// `download` container, or init container in the block flow's staging pod, once it exited 0),
/// read only when `job` has completed and only from pods it owns (by UID): a failed Job's
/// download (its copy failed, say) or a pod left from an earlier Job of the same name never
/// names the commit the copy holds.
pub fn resolved_revision(job: &Job, pods: &[&Pod]) -> Option<String> {
    if !job_condition(job, "Complete") {
        return None;
    }
    let uid = job.metadata.uid.as_deref().filter(|u| !u.is_empty())?;
    pods.iter()
        .filter(|p| {
            p.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.uid == uid)
        })
        .find_map(|p| {
            let status = p.status.as_ref()?;
            status
                .container_statuses
                .iter()
                .flatten()
                .chain(status.init_container_statuses.iter().flatten())
                .filter(|c| c.name == WRITER_CONTAINER)
                .find_map(|c| {
                    let t = c.state.as_ref()?.terminated.as_ref()?;
                    (t.exit_code == 0)
                        .then(|| {
                            t.message
                                .as_deref()
                                .and_then(writer::revision_from_termination_message)
                        })
                        .flatten()
                })
        })
}

/// The commit a complete primary PV records ([`REVISION_ANNOTATION`]), when it is one.
pub fn recorded_revision(pv: &PersistentVolume) -> Option<String> {
    pv.metadata
        .annotations
        .as_ref()?
        .get(REVISION_ANNOTATION)
        .filter(|r| crate::handle::is_commit(r))
        .cloned()
}

/// Whether the primary PV stores the completion labels and Retain.
pub fn is_complete(binding: &ModelCacheBinding, pv: &PersistentVolume) -> bool {
    let labels = pv.metadata.labels.as_ref();
    let annotations = pv.metadata.annotations.as_ref();
    labels
        .and_then(|l| l.get(COMPLETE_LABEL))
        .map(String::as_str)
        == Some("true")
        && annotations
            .and_then(|a| a.get(HANDLE_DIGEST_ANNOTATION))
            .is_some_and(|d| *d == binding.spec.identity.cache_handle_digest)
        && pv
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
            == Some(view::RETAIN)
}

/// The bytes a complete primary PV records.
pub fn recorded_bytes(pv: &PersistentVolume) -> Option<u64> {
    pv.metadata
        .annotations
        .as_ref()?
        .get(BYTES_ANNOTATION)?
        .parse()
        .ok()
}

/// The labels and annotations that mark `binding`'s primary complete, written from
/// `source_namespace`.
pub fn completion_marks(
    binding: &ModelCacheBinding,
    bytes: Option<u64>,
    source_namespace: &str,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let labels = BTreeMap::from([
        (COMPLETE_LABEL.to_owned(), "true".to_owned()),
        (
            crate::keys::MODEL_LABEL.to_owned(),
            identity_hash(&binding.spec.identity),
        ),
        (
            SOURCE_NAMESPACE_LABEL.to_owned(),
            source_namespace.to_owned(),
        ),
        (
            crate::keys::MANAGED_BY_LABEL.to_owned(),
            crate::keys::MANAGED_BY_VALUE.to_owned(),
        ),
    ]);
    let mut annotations = BTreeMap::from([(
        HANDLE_DIGEST_ANNOTATION.to_owned(),
        binding.spec.identity.cache_handle_digest.clone(),
    )]);
    if let Some(b) = bytes {
        annotations.insert(BYTES_ANNOTATION.to_owned(), b.to_string());
    }
    (labels, annotations)
}

fn is_bound(claim: &PersistentVolumeClaim) -> bool {
    claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

fn job_is_ours(binding: &ModelCacheBinding, job: &Job) -> bool {
    job.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::volume_keys::BINDING_UID_LABEL_ANNOTATION))
        .is_some_and(|uid| Some(uid) == binding.metadata.uid.as_ref())
}

/// Whether the writer view's PV is bound (or pre-bound) to another claim than `claim`.
fn writer_view_needs_rebind(pv: &PersistentVolume, claim: Option<&PersistentVolumeClaim>) -> bool {
    let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return false;
    };
    match (&claim_ref.uid, claim.and_then(|c| c.metadata.uid.as_ref())) {
        (None, _) => false,
        (Some(bound), Some(current)) => bound != current,
        (Some(_), None) => true,
    }
}

struct Builder {
    conditions: Vec<WantedCondition>,
    actions: Vec<Action>,
    recheck_at: Option<Timestamp>,
}

impl Builder {
    fn set(
        &mut self,
        type_: &'static str,
        status: bool,
        reason: Reason,
        message: impl Into<String>,
    ) {
        self.conditions.retain(|c| c.type_ != type_);
        self.conditions.push(WantedCondition {
            type_,
            status,
            reason,
            message: message.into(),
        });
    }
}

/// What to do next for `obs.binding` (see the module documentation).
pub fn step(obs: &Observed<'_>) -> Step {
    let b = obs.binding;
    let stored = b.status.clone().unwrap_or_default();
    let mut status = stored.clone();
    let mut out = Builder {
        conditions: Vec::new(),
        actions: Vec::new(),
        recheck_at: None,
    };
    status.observed_generation = b.metadata.generation;
    let retiring = b.is_retiring() || b.metadata.deletion_timestamp.is_some();
    if status.phase.is_none() {
        status.phase = Some(BindingPhase::Active);
        status.last_phase_transition_time = Some(obs.now.clone());
    }
    let active = !retiring && status.phase == Some(BindingPhase::Active);

    // References.
    status.request_references = merge_references(
        &stored.request_references,
        &obs.seen_references,
        &obs.stale_references,
        active,
    );
    let count = i64::try_from(status.request_references.len()).unwrap_or(i64::MAX);
    status.request_reference_count = Some(count);
    if count == 0 {
        if status.unreferenced_since.is_none() {
            status.unreferenced_since = Some(obs.now.clone());
        }
    } else {
        status.unreferenced_since = None;
    }
    if status.model_uri.is_none() {
        status.model_uri.clone_from(&obs.model_uri);
    }
    let mut realized = status.realized.clone().unwrap_or_default();

    if retiring {
        out.set(
            PROGRESSING,
            false,
            Reason::Retiring,
            "the binding is Retiring or being deleted: the reaper deletes what it names; nothing is created for it",
        );
        status.realized = Some(realized).filter(|r| *r != RealizedStorage::default());
        return finish(status, out);
    }

    if let Some(what) = &obs.foreign {
        degraded(
            &mut out,
            Reason::ForeignObject,
            format!(
                "{what} exists under one of this binding's names but was not created for it; it is never adopted or deleted, and nothing more is created until it is gone"
            ),
        );
        status.realized = Some(realized);
        return finish(status, out);
    }
    if obs.writer.stored.is_some() {
        status.writer.clone_from(&obs.writer.stored);
    }
    release_stale_writer_claims(obs, &mut out);
    match b.spec.decision.transition {
        Transition::RwxReadOnly => rwx(
            obs,
            &mut realized,
            &mut status.failure_record,
            &mut status.resolved_revision,
            &mut out,
        ),
        Transition::RoxReadOnly => rox(
            obs,
            &mut realized,
            &mut status.failure_record,
            &mut status.resolved_revision,
            &mut out,
        ),
    }
    status.realized = Some(realized);
    finish(status, out)
}

fn finish(status: ModelCacheBindingStatus, out: Builder) -> Step {
    let mut conditions = out.conditions;
    conditions.sort_by_key(|c| match c.type_ {
        READY => 0,
        PROGRESSING => 1,
        _ => 2,
    });
    Step {
        status,
        conditions,
        actions: out.actions,
        recheck_at: out.recheck_at,
    }
}

fn degraded(out: &mut Builder, reason: Reason, message: String) {
    out.set(READY, false, reason, message.clone());
    out.set(PROGRESSING, false, reason, message.clone());
    out.set(DEGRADED, true, reason, message);
}

fn rwx(
    obs: &Observed<'_>,
    realized: &mut RealizedStorage,
    failure: &mut Option<FailureRecord>,
    revision: &mut Option<String>,
    out: &mut Builder,
) {
    let b = obs.binding;
    let claim_name = writer_pvc_name(&b.spec.identity);
    let writer_ns = obs.writer.namespace.as_str();
    if b.spec.decision.encryption_required {
        // Admission never decides this (encryption is roxReadOnly only); a hand-written binding
        // would otherwise get an unencrypted cache.
        degraded(
            out,
            Reason::InvalidEncryption,
            "the decision requires encryption, which only the roxReadOnly flow provides; nothing is created for this binding".to_owned(),
        );
        return;
    }

    // 1. The primary claim (a warm start adopts a retained complete primary).
    let Some(primary_claim) = obs.primary_claim else {
        // A capture that failed released its claim: none is created while the record holds.
        if realized.population_state == Some(PopulationState::Failed)
            && failure_holds(obs, failure.as_ref(), out)
        {
            return;
        }
        if let Some(pv) = adoptable(b, &obs.retained) {
            let name = pv.metadata.name.clone().unwrap_or_default();
            let mut claim = view::primary_claim(b, obs.config.primary_size.clone());
            if let Some(spec) = claim.spec.as_mut() {
                spec.volume_name = Some(name.clone());
                // The claim asks for no more than the retained volume holds.
                if let Ok(capacity) = view::primary_capacity(pv)
                    && let Some(r) = spec.resources.as_mut()
                {
                    r.requests = Some(BTreeMap::from([("storage".to_owned(), capacity)]));
                }
            }
            if let Some(rv) = &pv.metadata.resource_version {
                out.actions.push(Action::AdoptPrimary {
                    pv: name.clone(),
                    resource_version: rv.clone(),
                });
            }
            out.actions.push(Action::CreatePrimaryClaim(claim));
            realized
                .population_state
                .get_or_insert(PopulationState::Pending);
            let m = format!(
                "adopting the complete, retained PersistentVolume {name} of this cache instead of downloading again"
            );
            out.set(READY, false, Reason::AdoptingRetained, m.clone());
            out.set(PROGRESSING, true, Reason::AdoptingRetained, m);
            out.set(DEGRADED, false, Reason::AsExpected, "");
            return;
        }
        realized
            .population_state
            .get_or_insert(PopulationState::Pending);
        out.actions
            .push(Action::CreatePrimaryClaim(view::primary_claim(
                b,
                obs.config.primary_size.clone(),
            )));
        out.set(
            READY,
            false,
            Reason::CreatingPrimary,
            format!("creating the primary claim {claim_name}"),
        );
        out.set(
            PROGRESSING,
            true,
            Reason::CreatingPrimary,
            format!("creating the primary claim {claim_name}"),
        );
        out.set(DEGRADED, false, Reason::AsExpected, "");
        return;
    };
    let primary = match obs.primary_pv {
        Some(pv) if is_bound(primary_claim) => pv,
        _ => {
            realized
                .population_state
                .get_or_insert(PopulationState::Pending);
            let m = format!(
                "the primary claim {claim_name} is not bound yet (StorageClass {})",
                b.spec.storage_class.name
            );
            out.set(READY, false, Reason::PrimaryClaimPending, m.clone());
            out.set(PROGRESSING, true, Reason::PrimaryClaimPending, m);
            out.set(DEGRADED, false, Reason::AsExpected, "");
            return;
        }
    };
    // Nothing is written to (or derived from) a PV the claim bound that was not provisioned
    // for it: a foreign Available PV of the class would otherwise be filled and retained.
    if let Err(why) = provisioned_for(b, primary_claim, primary) {
        degraded(
            out,
            Reason::ForeignObject,
            format!(
                "the primary claim {claim_name} is bound to {why}; nothing is written to that PersistentVolume, no view is derived from it and no download starts (release the claim, e.g. delete it, so a new one is provisioned)"
            ),
        );
        return;
    }
    let pv_name = primary.metadata.name.clone().unwrap_or_default();
    realized.bound_persistent_volume_name = Some(pv_name.clone()).filter(|n| !n.is_empty());
    if let Err(e) = view::primary_capacity(primary)
        .and_then(|_| view::read_only_view(b, primary, writer_ns, None, &[]).map(|_| ()))
    {
        degraded(out, Reason::InvalidPrimaryVolume, e.to_string());
        return;
    }

    // 2. Views of reading namespaces: recorded first, created once stored.
    let stored_views: BTreeSet<String> = b
        .status
        .as_ref()
        .and_then(|s| s.realized.as_ref())
        .map(|r| r.views.iter().map(|v| v.namespace.clone()).collect())
        .unwrap_or_default();
    let failed_before = realized.population_state == Some(PopulationState::Failed);

    // 3. Completion, read from the PV.
    if is_complete(b, primary) {
        let bytes = record_complete(primary, realized, failure, revision);
        release_writer_claim(obs, out);
        let pending = views(obs, primary, bytes, &stored_views, realized, out);
        out.set(
            READY,
            true,
            Reason::Downloaded,
            format!(
                "the model is complete on PersistentVolume {pv_name}{}",
                bytes.map(|n| format!(" ({n} bytes)")).unwrap_or_default()
            ),
        );
        views_progress(pending, out);
        out.set(DEGRADED, false, Reason::AsExpected, "");
        return;
    }

    // 3b. A capture source's download, copied by the node agent and recorded on the claim (no
    // Job writes a capture binding's primary): label the PV complete. The claim stays, as a
    // Job's does: readers are served from views of the PV, which is shared while written.
    if obs.job.is_none()
        && let Some(bytes) = copied_bytes(primary_claim)
    {
        mark_copied(
            obs,
            primary_claim,
            &pv_name,
            bytes,
            realized,
            out,
            "persisting the completion of the captured copy",
            "the write is retried",
        );
        return;
    }
    if obs.job.is_none() && capture_failed(obs, primary_claim, realized, failure, out) {
        return;
    }

    // 4. The writer Job (the Lease's bookkeeping, if any, after the other writes).
    if let Some(job) = obs.job {
        let record = obs.writer.record.clone().map(Action::WriteLease);
        if !job_is_ours(b, job) {
            return foreign_job(writer_ns, job, out);
        }
        if job_condition(job, "Complete") {
            let bytes = measured_bytes(&obs.job_pods);
            let source = job.metadata.namespace.as_deref().unwrap_or(writer_ns);
            let (labels, mut annotations) = completion_marks(b, bytes, source);
            if let Some(commit) = resolved_revision(job, &obs.job_pods) {
                annotations.insert(REVISION_ANNOTATION.to_owned(), commit);
            }
            // The completion continues the trace the Job carries.
            if let Some(tp) = job
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(TRACE_PARENT_ANNOTATION))
            {
                annotations.insert(TRACE_PARENT_ANNOTATION.to_owned(), tp.clone());
            }
            out.actions.push(Action::MarkComplete {
                pv: pv_name.clone(),
                labels,
                annotations,
            });
            realized.population_state = Some(PopulationState::Populating);
            out.set(READY, false, Reason::Completing, format!("the download succeeded; labelling PersistentVolume {pv_name} complete and Retain"));
            out.set(
                PROGRESSING,
                true,
                Reason::Completing,
                "persisting completion before the writer claim is released",
            );
            match &obs.completion_error {
                Some(e) => out.set(DEGRADED, true, Reason::CompletionNotStored, format!(
                    "{e}; the writer claim is kept until the completion labels and Retain are stored, and the write is retried"
                )),
                None => out.set(DEGRADED, false, Reason::AsExpected, ""),
            }
            out.actions.extend(record);
            return;
        }
        if job_condition(job, "Failed") {
            job_failed(obs, job, realized, failure, out);
            out.actions.extend(record);
            return;
        }
        realized.population_state = Some(PopulationState::Populating);
        let pending = views(obs, primary, None, &stored_views, realized, out);
        let m = format!(
            "the writer Job {}/{} is downloading",
            writer_ns,
            job.metadata.name.clone().unwrap_or_default()
        );
        out.set(READY, false, Reason::Downloading, m.clone());
        out.set(
            PROGRESSING,
            true,
            Reason::Downloading,
            if pending == 0 {
                m
            } else {
                format!("{m}; {pending} view(s) being created")
            },
        );
        out.set(DEGRADED, false, Reason::AsExpected, "");
        out.actions.extend(record);
        return;
    }

    // 5. No Job: start (or retry) the download, with the writer view; never while a node agent
    // captures into the primary (two writers).
    if capturing(primary_claim, out) {
        realized.population_state = Some(PopulationState::Populating);
        let pending = views(obs, primary, None, &stored_views, realized, out);
        if pending > 0 {
            out.set(
                PROGRESSING,
                true,
                Reason::Capturing,
                format!("{pending} view(s) being created while the capture runs"),
            );
        }
        return;
    }
    let primary_pv = primary;
    start_download(obs, realized, failure, out, failed_before, |out| {
        writer_view_actions(obs, primary_pv, out)
    });
}

/// The bytes the node agent recorded on the primary claim after its copy
/// ([`COPIED_BYTES_ANNOTATION`]), if it did.
pub fn copied_bytes(claim: &PersistentVolumeClaim) -> Option<u64> {
    claim
        .metadata
        .annotations
        .as_ref()?
        .get(COPIED_BYTES_ANNOTATION)?
        .trim()
        .parse()
        .ok()
}

/// Degraded `ForeignObject` for a Job under the binding's name that was not created for it.
fn foreign_job(writer_ns: &str, job: &Job, out: &mut Builder) {
    degraded(
        out,
        Reason::ForeignObject,
        format!(
            "Job {}/{} exists but was not created for this binding (annotation {} differs); it is never adopted or deleted",
            writer_ns,
            job.metadata.name.clone().unwrap_or_default(),
            crate::volume_keys::BINDING_UID_LABEL_ANNOTATION
        ),
    );
}

/// Progressing once the copy is complete: `Reconciled` when every reading namespace has its
/// view, else `CreatingViews` with how many are pending.
fn views_progress(pending: usize, out: &mut Builder) {
    if pending == 0 {
        out.set(
            PROGRESSING,
            false,
            Reason::Reconciled,
            "every reading namespace has its view",
        );
    } else {
        out.set(
            PROGRESSING,
            true,
            Reason::CreatingViews,
            format!("{pending} view(s) of reading namespaces are being recorded or created"),
        );
    }
}

/// Records a complete primary in `realized` (population Ready, bytes, source namespace, data
/// identity) and clears the failure record.
fn record_complete(
    primary: &PersistentVolume,
    realized: &mut RealizedStorage,
    failure: &mut Option<FailureRecord>,
    revision: &mut Option<String>,
) -> Option<u64> {
    if revision.is_none() {
        *revision = recorded_revision(primary);
    }
    let bytes = recorded_bytes(primary);
    realized.population_state = Some(PopulationState::Ready);
    *failure = None;
    realized.bound_persistent_volume_name = primary.metadata.name.clone();
    realized.bytes = bytes.and_then(|n| i64::try_from(n).ok());
    realized.source_namespace = primary
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SOURCE_NAMESPACE_LABEL))
        .cloned();
    if realized.provider_data_identity.is_none() {
        realized.provider_data_identity = primary
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|c| c.volume_handle.clone());
    }
    bytes
}

/// The block flow (roxReadOnly). The writer namespace runs the staging Job
/// ([`writer::writer_job_in`]); the node agent of its pod's node measures the staged tree,
/// creates the primary claim sized from it, copies the tree in and records the bytes on the
/// claim ([`COPIED_BYTES_ANNOTATION`]); this step then labels the primary PV complete and
/// Retain, releases the primary claim once that is observed, waits until no VolumeAttachment
/// attaches the PV, and only then creates read-only views, derived from the Released PV.
fn rox(
    obs: &Observed<'_>,
    realized: &mut RealizedStorage,
    failure: &mut Option<FailureRecord>,
    revision: &mut Option<String>,
    out: &mut Builder,
) {
    let b = obs.binding;
    let claim_name = writer_pvc_name(&b.spec.identity);
    let writer_ns = obs.writer.namespace.as_str();
    let record = obs.writer.record.clone().map(Action::WriteLease);
    let stored_views: BTreeSet<String> = b
        .status
        .as_ref()
        .and_then(|s| s.realized.as_ref())
        .map(|r| r.views.iter().map(|v| v.namespace.clone()).collect())
        .unwrap_or_default();

    // The primary claim, when it exists, must be bound to a PV provisioned for it.
    let bound = match (obs.primary_claim, obs.primary_pv) {
        (Some(claim), Some(pv)) if is_bound(claim) => {
            if let Err(why) = provisioned_for(b, claim, pv) {
                degraded(
                    out,
                    Reason::ForeignObject,
                    format!(
                        "the primary claim {claim_name} is bound to {why}; nothing is labelled complete, no view is derived from it (release the claim, e.g. delete it, so a new one is provisioned)"
                    ),
                );
                return;
            }
            Some((claim, pv))
        }
        _ => None,
    };

    // An encrypted cache: its names, and its Secret and class must be warmcache's for it.
    let encrypted = match encryption::encryption_names(b) {
        Ok(names) => names,
        Err(e) => {
            degraded(out, Reason::InvalidEncryption, e.to_string());
            return;
        }
    };
    if let Some(names) = &encrypted
        && let Err(what) = foreign_encryption(obs, names)
    {
        degraded(out, Reason::ForeignObject, what);
        return;
    }

    // 1. A complete primary: the bound one, or the retained one its released claim left
    // (also while the PV controller has not yet moved it from Bound to Released).
    let complete = bound
        .map(|(_, pv)| pv)
        .filter(|pv| is_complete(b, pv))
        .or_else(|| {
            obs.primary_claim
                .is_none()
                .then(|| released_primary(b, &obs.retained))
                .flatten()
        });
    if let Some(primary) = complete {
        let pv_name = primary.metadata.name.clone().unwrap_or_default();
        if let Err(e) = view::read_only_view(b, primary, writer_ns, None, &[]) {
            degraded(out, Reason::InvalidPrimaryVolume, e.to_string());
            return;
        }
        let bytes = record_complete(primary, realized, failure, revision);
        // The staging Job completes after the copy: the commit its download resolved goes onto
        // the complete PV then, so a later binding adopting the PV finds it.
        if recorded_revision(primary).is_none()
            && let Some(job) = obs.job.filter(|j| job_is_ours(b, j))
            && let Some(commit) = resolved_revision(job, &obs.job_pods)
        {
            revision.get_or_insert_with(|| commit.clone());
            out.actions.push(Action::RecordRevision {
                pv: pv_name.clone(),
                revision: commit,
            });
        }
        let words = format!(
            "the model is complete on PersistentVolume {pv_name}{}",
            bytes.map(|n| format!(" ({n} bytes)")).unwrap_or_default()
        );
        out.set(READY, true, Reason::Downloaded, words);
        out.set(DEGRADED, false, Reason::AsExpected, "");
        if let Some(names) = &encrypted
            && obs.encryption.secret.is_none()
        {
            // Readers could not open it: no view, not Ready, and admission leaves new pods on
            // their own download until the key is back or the volume is gone.
            degraded(
                out,
                Reason::EncryptionKeyMissing,
                format!(
                    "the key Secret {}/{} of this encrypted cache is gone: PersistentVolume {pv_name} cannot be opened, and a new key could not open it either, so none is created and no reader is served; restore the Secret from a backup, or delete PersistentVolume {pv_name} (the driver cannot delete its storage without the key: remove it on the storage system) so the next download starts over with a new key",
                    names.namespace, names.secret
                ),
            );
            out.actions.extend(record);
            return;
        }
        if let Some(claim) = obs.primary_claim {
            // Bound to the complete PV (else `complete` would be a retained PV and the claim
            // would be absent): released so the volume detaches.
            match &claim.metadata.deletion_timestamp {
                None => {
                    if let (Some(name), Some(uid)) = (&claim.metadata.name, &claim.metadata.uid) {
                        out.actions.push(Action::ReleasePrimaryClaim {
                            name: name.clone(),
                            uid: uid.clone(),
                        });
                    }
                    out.set(
                        PROGRESSING,
                        true,
                        Reason::ReleasingPrimary,
                        format!(
                            "releasing the primary claim {claim_name} so PersistentVolume {pv_name} detaches before read-only views attach it"
                        ),
                    );
                }
                Some(deleted) => held_primary_claim(obs, out, claim, deleted, &pv_name),
            }
            out.actions.extend(record);
            return;
        }
        if let Some(attached) = obs.attachments.get(&pv_name).filter(|a| !a.is_empty()) {
            out.set(
                PROGRESSING,
                true,
                Reason::WaitingForDetach,
                format!(
                    "PersistentVolume {pv_name} is still attached (VolumeAttachment {}); read-only views wait until it detaches",
                    attached.join(", ")
                ),
            );
            out.actions.extend(record);
            return;
        }
        let pending = views(obs, primary, bytes, &stored_views, realized, out);
        views_progress(pending, out);
        out.actions.extend(record);
        return;
    }

    // 2. The agent recorded its copy on the bound primary claim: label the PV complete.
    if let Some((claim, pv)) = bound
        && let Some(bytes) = copied_bytes(claim)
    {
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        mark_copied(
            obs,
            claim,
            &pv_name,
            bytes,
            realized,
            out,
            "persisting completion before the primary claim is released",
            "the primary claim is kept until the completion labels and Retain are stored, and the write is retried",
        );
        out.actions.extend(record);
        return;
    }

    // 2b. The node agent gave up capturing a capture source's download into the claim.
    if let Some(claim) = obs.primary_claim
        && capture_failed(obs, claim, realized, failure, out)
    {
        out.actions.extend(record);
        return;
    }

    // 3. The staging Job.
    let failed_before = realized.population_state == Some(PopulationState::Failed);
    if let Some(job) = obs.job {
        if !job_is_ours(b, job) {
            return foreign_job(writer_ns, job, out);
        }
        // The agent provisions the primary on the encrypted class: it must (still) exist.
        if let Some(names) = &encrypted
            && !job_condition(job, "Failed")
            && !encryption_prerequisites(obs, names, out)
        {
            out.actions.extend(record);
            return;
        }
        if job_condition(job, "Failed") {
            job_failed(obs, job, realized, failure, out);
            out.actions.extend(record);
            return;
        }
        realized.population_state = Some(PopulationState::Populating);
        let job_name = job.metadata.name.clone().unwrap_or_default();
        let (reason, m) = match obs.primary_claim {
            Some(_) => (
                Reason::Copying,
                format!(
                    "the node agent is copying the download staged by Job {writer_ns}/{job_name} into the primary claim {claim_name}"
                ),
            ),
            None if job_condition(job, "Complete") => (
                Reason::Staging,
                format!(
                    "the staging Job {writer_ns}/{job_name} completed but no copy is recorded on a primary claim; a new staging Job starts once it is gone (its TTL)"
                ),
            ),
            None => (
                Reason::Staging,
                format!(
                    "the staging Job {writer_ns}/{job_name} is downloading; the node agent of its node copies the staged tree into a primary sized from its bytes"
                ),
            ),
        };
        out.set(READY, false, reason, m.clone());
        out.set(PROGRESSING, true, reason, m);
        out.set(DEGRADED, false, Reason::AsExpected, "");
        out.actions.extend(record);
        return;
    }
    if let Some(claim) = obs.primary_claim {
        // A claim without a Job: created for a capture source, or for a staging pod of a Job
        // that is gone, and recording no copy; nothing here writes to it. The new staging Job's
        // agent finds that pod gone, drops the claim and is elected again (`crate::agent`,
        // `AgentStep::DropClaim`).
        realized.population_state = Some(PopulationState::Populating);
        if capturing(claim, out) {
            out.actions.extend(record);
            return;
        }
    }

    // 4. No Job: start (or retry) the staging download; an encrypted cache's key and class
    // come first.
    start_download(obs, realized, failure, out, failed_before, |out| {
        encrypted
            .as_ref()
            .is_none_or(|names| encryption_prerequisites(obs, names, out))
    });
}

/// An encrypted cache's Secret or class under its name that is not warmcache's for this cache:
/// its description.
fn foreign_encryption(obs: &Observed<'_>, names: &EncryptionNames) -> Result<(), String> {
    let b = obs.binding;
    if let Some(meta) = obs.encryption.secret {
        encryption::check_ours(meta, b).map_err(|why| {
            format!(
                "Secret {}/{} (the key of this encrypted cache): {why}",
                names.namespace, names.secret
            )
        })?;
    }
    if let Some(class) = obs.encryption.class {
        encryption::check_class(class, b, names).map_err(|why| {
            format!(
                "StorageClass {} (this encrypted cache's): {why}",
                names.class
            )
        })?;
    }
    Ok(())
}

/// Encrypted roxReadOnly: what the primary needs before the agent provisions it: the key Secret
/// (created only while no primary claim exists: data written under a key that is gone cannot be
/// opened with a new one) and the encrypted StorageClass (derived from the StorageClass the
/// decision was taken on). `false` when one cannot be had (Degraded is set).
fn encryption_prerequisites(
    obs: &Observed<'_>,
    names: &EncryptionNames,
    out: &mut Builder,
) -> bool {
    let b = obs.binding;
    if obs.encryption.secret.is_none() {
        if let Some(claim) = obs.primary_claim {
            degraded(
                out,
                Reason::EncryptionKeyMissing,
                format!(
                    "the key Secret {}/{} of this encrypted cache is gone while the primary claim {} exists; a new key could not open what was written under the old one, so none is created (restore the Secret, or delete the claim so the download starts over)",
                    names.namespace,
                    names.secret,
                    claim.metadata.name.as_deref().unwrap_or_default()
                ),
            );
            return false;
        }
        out.actions.push(Action::CreateKeySecret(names.clone()));
    }
    if obs.encryption.class.is_none() {
        match encryption::encrypted_class(b, names, obs.encryption.base_class) {
            Ok(class) => out
                .actions
                .push(Action::CreateEncryptedClass(Box::new(class))),
            Err(e) => {
                degraded(out, Reason::EncryptionClassUnavailable, e.to_string());
                return false;
            }
        }
    }
    true
}

/// No Job: start (or retry) the download unless a failure record still holds (a failure stored
/// before records existed gets one from now). `before_job` queues what the Job needs first
/// (the writer view of the RWX flow) after the Lease write; `false` stops (it set a condition).
fn start_download(
    obs: &Observed<'_>,
    realized: &mut RealizedStorage,
    failure: &mut Option<FailureRecord>,
    out: &mut Builder,
    failed_before: bool,
    before_job: impl FnOnce(&mut Builder) -> bool,
) {
    let b = obs.binding;
    let writer_ns = obs.writer.namespace.as_str();
    if failed_before && failure.is_none() {
        let retry = obs
            .now
            .0
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(
                obs.config.failure_record_seconds.max(0),
            ))
            .unwrap_or(Timestamp::MAX);
        *failure = Some(FailureRecord {
            failed_at: obs.now.clone(),
            retry_after: Time(retry),
            job_uid: None,
            message: "the download failed before this failure record existed".to_owned(),
        });
    }
    if failed_before && failure_holds(obs, failure.as_ref(), out) {
        return;
    }
    if obs.step.is_none() && !obs.capture_sources.is_empty() {
        if !failed_before {
            realized.population_state = Some(PopulationState::Pending);
        }
        let m = format!(
            "{} capture source pod(s) download on their own ({}); the node agent of the first one Ready captures its download into the primary (the agent must run on their nodes: chart value modelVolumeController.enabled)",
            obs.capture_sources.len(),
            sample(&obs.capture_sources)
        );
        out.set(READY, false, Reason::WaitingForCapture, m.clone());
        out.set(PROGRESSING, true, Reason::WaitingForCapture, m);
        if !failed_before {
            out.set(DEGRADED, false, Reason::AsExpected, "");
        }
        return;
    }
    let Some(source) = &obs.step else {
        out.actions
            .extend(obs.writer.record.clone().map(Action::WriteLease));
        if !failed_before {
            realized.population_state = Some(PopulationState::Pending);
        }
        if let Some((to, at)) = &obs.writer.takeover_at {
            let m = format!(
                "the writer namespace {writer_ns} has no reading pod with a download step left and its Job is gone; namespace {to} takes the download over at {at} unless a pod of {writer_ns} comes back first"
            );
            out.set(READY, false, Reason::WaitingForTakeover, m.clone());
            out.set(PROGRESSING, true, Reason::WaitingForTakeover, m);
            out.recheck_at = Some(*at);
        } else {
            let m = if b.spec.resources.lease_name.is_empty() {
                format!(
                    "no reading pod in the writer namespace {writer_ns} carries a download step yet"
                )
            } else {
                format!(
                    "no reading pod in the writer namespace {writer_ns}, nor in another namespace of the sharing domain, carries a download step yet"
                )
            };
            out.set(READY, false, Reason::WaitingForDownloadStep, m.clone());
            out.set(PROGRESSING, true, Reason::WaitingForDownloadStep, m);
        }
        if !failed_before {
            out.set(DEGRADED, false, Reason::AsExpected, "");
        }
        return;
    };
    let job = match writer::writer_job_in(
        b,
        writer_ns,
        &source.step,
        &source.pod_env,
        &obs.config.writer,
    ) {
        Ok(job) => job,
        Err(e) => {
            degraded(out, Reason::InvalidDownloadStep, e.to_string());
            return;
        }
    };
    // The Lease first (a lost election stops here), then the previous writer's claim.
    if let Some(claim) = &obs.writer.claim {
        out.actions.push(Action::WriteLease(claim.clone()));
        if obs.writer.previous.is_some()
            && let Some(old) = obs.previous_writer_claim
        {
            release_claim(old, out);
        }
    }
    if !before_job(out) {
        return;
    }
    let mut job = job;
    if let Some(tp) = obs.traceparents.get(writer_ns) {
        job.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(TRACE_PARENT_ANNOTATION.to_owned(), tp.clone());
        // The staging pod too: the node agent continues the trace from it.
        if b.spec.decision.transition == Transition::RoxReadOnly
            && let Some(meta) = job.spec.as_mut().and_then(|s| s.template.metadata.as_mut())
        {
            meta.annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(TRACE_PARENT_ANNOTATION.to_owned(), tp.clone());
        }
    }
    out.actions.push(Action::CreateJob(Box::new(job)));
    out.actions
        .extend(obs.writer.record.clone().map(Action::WriteLease));
    realized.population_state = Some(PopulationState::Populating);
    let kind = match b.spec.decision.transition {
        Transition::RwxReadOnly => "writer",
        Transition::RoxReadOnly => "staging",
    };
    let m = match &obs.writer.previous {
        Some(from) => format!(
            "namespace {writer_ns} takes the download over from {from} (its Job is gone and no reading pod with a download step is left there); starting the {kind} Job"
        ),
        None => format!("starting the {kind} Job in namespace {writer_ns}"),
    };
    out.set(READY, false, Reason::StartingDownload, m.clone());
    out.set(PROGRESSING, true, Reason::StartingDownload, m);
    out.set(DEGRADED, false, Reason::AsExpected, "");
}

/// The node agent recorded `bytes` copied into `claim` (bound to PersistentVolume `pv_name`):
/// label the PV complete and Retain (with the claim's source namespace, trace and manifest
/// digest), conditions `Completing`; `progress` and `retry` are the flow's words for what comes
/// next and for a failed completion write.
#[allow(clippy::too_many_arguments)]
fn mark_copied(
    obs: &Observed<'_>,
    claim: &PersistentVolumeClaim,
    pv_name: &str,
    bytes: u64,
    realized: &mut RealizedStorage,
    out: &mut Builder,
    progress: &str,
    retry: &str,
) {
    let b = obs.binding;
    let claim_annotations = claim.metadata.annotations.as_ref();
    let source = claim_annotations
        .and_then(|a| a.get(SOURCE_NAMESPACE_LABEL))
        .map_or(obs.writer.namespace.as_str(), String::as_str);
    let (labels, mut annotations) = completion_marks(b, Some(bytes), source);
    for key in [TRACE_PARENT_ANNOTATION, MANIFEST_DIGEST_ANNOTATION] {
        if let Some(v) = claim_annotations.and_then(|a| a.get(key)) {
            annotations.insert(key.to_owned(), v.clone());
        }
    }
    out.actions.push(Action::MarkComplete {
        pv: pv_name.to_owned(),
        labels,
        annotations,
    });
    realized.population_state = Some(PopulationState::Populating);
    realized.bound_persistent_volume_name = Some(pv_name.to_owned());
    out.set(
        READY,
        false,
        Reason::Completing,
        format!(
            "the node agent copied {bytes} bytes; labelling PersistentVolume {pv_name} complete and Retain"
        ),
    );
    out.set(PROGRESSING, true, Reason::Completing, progress);
    match &obs.completion_error {
        Some(e) => out.set(
            DEGRADED,
            true,
            Reason::CompletionNotStored,
            format!("{e}; {retry}"),
        ),
        None => out.set(DEGRADED, false, Reason::AsExpected, ""),
    }
}

/// While a failure record holds: readers still waiting are deleted (their controllers recreate
/// them on their own download), the conditions say until when, and `true`.
fn failure_holds(obs: &Observed<'_>, failure: Option<&FailureRecord>, out: &mut Builder) -> bool {
    let Some(record) = failure.filter(|r| r.holds_at(obs.now.0)) else {
        return false;
    };
    let retry = record.retry_after.0;
    delete_waiting_readers(obs, out);
    out.recheck_at = Some(retry);
    let m = format!(
        "the download failed ({}); new pods download on their own until {retry}, then a reading pod's step retries it",
        record.message
    );
    out.set(READY, false, Reason::DownloadFailed, m.clone());
    out.set(PROGRESSING, false, Reason::DownloadFailed, m);
    true
}

/// At most three entries of `items`, and how many more.
fn sample(items: &[String]) -> String {
    let shown: Vec<&str> = items.iter().take(3).map(String::as_str).collect();
    match items.len().saturating_sub(3) {
        0 => shown.join(", "),
        more => format!("{}, and {more} more", shown.join(", ")),
    }
}

/// A node agent was elected to capture into `claim` ([`COPY_SOURCE_ANNOTATION`] `capture`, and
/// [`crate::agent::COPY_POD_ANNOTATION`]) and has recorded neither a copy nor a give-up: the
/// conditions say so, and `true`. A staging pod's claim is never this.
fn capturing(claim: &PersistentVolumeClaim, out: &mut Builder) -> bool {
    let a = claim.metadata.annotations.as_ref();
    let get = |k: &str| a.and_then(|a| a.get(k)).map(String::as_str);
    let (Some(COPY_SOURCE_CAPTURE), Some(_), None, None) = (
        get(COPY_SOURCE_ANNOTATION),
        get(crate::agent::COPY_POD_ANNOTATION),
        get(COPIED_BYTES_ANNOTATION),
        get(COPY_FAILED_ANNOTATION),
    ) else {
        return false;
    };
    let pod = match (
        get(SOURCE_NAMESPACE_LABEL),
        get(crate::agent::COPY_POD_NAME_ANNOTATION),
    ) {
        (Some(ns), Some(name)) => format!("{ns}/{name}"),
        _ => "a pod".to_owned(),
    };
    let m = format!(
        "the node agent on node {} is copying {pod}'s own download into the primary claim {}",
        get(COPY_NODE_ANNOTATION).unwrap_or("?"),
        claim.metadata.name.as_deref().unwrap_or_default()
    );
    out.set(READY, false, Reason::Capturing, m.clone());
    out.set(PROGRESSING, true, Reason::Capturing, m);
    out.set(DEGRADED, false, Reason::AsExpected, "");
    true
}

/// The node agent gave up capturing into `claim` ([`COPY_FAILED_ANNOTATION`], no copy
/// recorded): the failure record with its words, and the claim released so the next capture,
/// once the record expires, starts on a fresh volume. `false` when it did not give up.
fn capture_failed(
    obs: &Observed<'_>,
    claim: &PersistentVolumeClaim,
    realized: &mut RealizedStorage,
    failure: &mut Option<FailureRecord>,
    out: &mut Builder,
) -> bool {
    if copied_bytes(claim).is_some() {
        return false;
    }
    let Some(words) = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(COPY_FAILED_ANNOTATION))
    else {
        return false;
    };
    realized.population_state = Some(PopulationState::Failed);
    let kept = match failure.as_ref() {
        Some(r) if r.job_uid.is_some() && r.job_uid == claim.metadata.uid => r.clone(),
        _ => {
            let retry = obs
                .now
                .0
                .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(
                    obs.config.failure_record_seconds.max(0),
                ))
                .unwrap_or(Timestamp::MAX);
            FailureRecord {
                failed_at: obs.now.clone(),
                retry_after: Time(retry),
                job_uid: claim.metadata.uid.clone(),
                message: warmcache_cli::text::bounded(
                    &format!("capturing the engine's own download failed: {words}"),
                    MAX_FAILURE_MESSAGE_BYTES,
                ),
            }
        }
    };
    let retry = kept.retry_after.0;
    if kept.holds_at(obs.now.0) {
        delete_waiting_readers(obs, out);
        out.recheck_at = Some(retry);
    }
    let m = format!("the capture failed: {}", kept.message);
    *failure = Some(kept);
    if claim.metadata.deletion_timestamp.is_none()
        && let (Some(name), Some(uid)) = (&claim.metadata.name, &claim.metadata.uid)
    {
        out.actions.push(Action::ReleasePrimaryClaim {
            name: name.clone(),
            uid: uid.clone(),
        });
    }
    out.set(READY, false, Reason::DownloadFailed, m.clone());
    out.set(
        PROGRESSING,
        false,
        Reason::DownloadFailed,
        format!(
            "the primary claim is released; new pods download on their own until {retry}, then the next capture source Ready is captured again"
        ),
    );
    out.set(DEGRADED, true, Reason::DownloadFailed, m);
    true
}

/// The writer view's PV and claim for the RWX writer Job (created, or the PV rebound to a new
/// claim); `false` when the primary cannot be viewed (Degraded is set).
fn writer_view_actions(obs: &Observed<'_>, primary: &PersistentVolume, out: &mut Builder) -> bool {
    let b = obs.binding;
    let writer_ns = obs.writer.namespace.as_str();
    match (obs.writer_view_pv, obs.writer_view_claim) {
        (Some(pv), claim) if writer_view_needs_rebind(pv, claim) => {
            if let (Some(name), Some(rv)) = (&pv.metadata.name, &pv.metadata.resource_version) {
                out.actions.push(Action::RebindWriterView {
                    pv: name.clone(),
                    resource_version: rv.clone(),
                });
            }
            if claim.is_none() {
                match view::writer_view_in(b, primary, writer_ns) {
                    Ok((pv, claim)) => out.actions.push(Action::CreateWriterView(pv, claim)),
                    Err(e) => {
                        degraded(out, Reason::InvalidPrimaryVolume, e.to_string());
                        return false;
                    }
                }
            }
        }
        (Some(_), Some(_)) => {}
        _ => match view::writer_view_in(b, primary, writer_ns) {
            Ok((pv, claim)) => out.actions.push(Action::CreateWriterView(pv, claim)),
            Err(e) => {
                degraded(out, Reason::InvalidPrimaryVolume, e.to_string());
                return false;
            }
        },
    }
    true
}

/// A failed writer (or staging) Job: population Failed with its last words, the failure
/// record, and while it holds the waiting readers' deletion.
fn job_failed(
    obs: &Observed<'_>,
    job: &Job,
    realized: &mut RealizedStorage,
    failure: &mut Option<FailureRecord>,
    out: &mut Builder,
) {
    let words = last_words(job, &obs.job_pods);
    realized.population_state = Some(PopulationState::Failed);
    release_writer_claim(obs, out);
    let kept = failure_record(obs, failure.as_ref(), job, &words);
    let holds = kept.holds_at(obs.now.0);
    let retry = kept.retry_after.0;
    *failure = Some(kept);
    if holds {
        delete_waiting_readers(obs, out);
        out.recheck_at = Some(retry);
    }
    let m = format!(
        "the writer Job {} failed: {words}",
        job.metadata.name.clone().unwrap_or_default()
    );
    out.set(READY, false, Reason::DownloadFailed, m.clone());
    out.set(PROGRESSING, false, Reason::DownloadFailed, format!(
        "the primary claim is kept; new pods download on their own until {retry}, then the download is retried by a reading pod's step once the failed Job is gone (its TTL)"
    ));
    out.set(DEGRADED, true, Reason::DownloadFailed, m);
}

/// The annotation the external provisioner puts on a PV it provisioned: its name.
pub const PROVISIONED_BY_ANNOTATION: &str = "pv.kubernetes.io/provisioned-by";

/// Whether `pv`, bound to `b`'s primary claim `claim`, was provisioned for it: its
/// `claimRef.uid` is the claim's UID, [`PROVISIONED_BY_ANNOTATION`] names the decision's
/// provisioner, and it carries no other binding's or cache's labels
/// ([`crate::volume_keys::BINDING_LABEL`], [`crate::keys::MODEL_LABEL`]). A retained primary a
/// warm start adopted passes too (the provisioner made it for an earlier binding of this cache,
/// and the PV controller records the new claim's UID). `Err` names the PV and what differs.
pub fn provisioned_for(
    b: &ModelCacheBinding,
    claim: &PersistentVolumeClaim,
    pv: &PersistentVolume,
) -> Result<(), String> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    let mut wrong = Vec::new();
    let bound = pv
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.uid.as_deref());
    let claim_uid = claim.metadata.uid.as_deref();
    if claim_uid.is_none_or(str::is_empty) || bound != claim_uid {
        wrong.push(format!(
            "spec.claimRef.uid is {} (the claim's is {})",
            bound.unwrap_or("unset"),
            claim_uid.unwrap_or("unset")
        ));
    }
    let by = pv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PROVISIONED_BY_ANNOTATION));
    if by != Some(&b.spec.decision.provisioner) {
        wrong.push(format!(
            "{PROVISIONED_BY_ANNOTATION} is {} (the decision's provisioner is {})",
            by.map_or("unset", String::as_str),
            b.spec.decision.provisioner
        ));
    }
    let labels = pv.metadata.labels.as_ref();
    if let Some(other) = labels
        .and_then(|l| l.get(crate::volume_keys::BINDING_LABEL))
        .filter(|n| Some(*n) != b.metadata.name.as_ref())
    {
        wrong.push(format!(
            "it is labelled for ModelCacheBinding {other} ({})",
            crate::volume_keys::BINDING_LABEL
        ));
    }
    let hash = identity_hash(&b.spec.identity);
    if let Some(other) = labels
        .and_then(|l| l.get(crate::keys::MODEL_LABEL))
        .filter(|h| **h != hash)
    {
        wrong.push(format!(
            "it is labelled for another cache ({} {other})",
            crate::keys::MODEL_LABEL
        ));
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "PersistentVolume {name}, which was not provisioned for it: {}",
            wrong.join(", ")
        ))
    }
}

/// A retained primary `b` may adopt: complete for this cache (labels, handle digest, Retain),
/// on the decision's provisioner (its CSI driver, and [`PROVISIONED_BY_ANNOTATION`]) and the
/// binding's StorageClass, not a read-only view, and free
/// (Released or Available, its claimRef, if any, naming the claim the binding would create).
/// The first in name order.
pub fn adoptable<'p>(
    b: &ModelCacheBinding,
    retained: &[&'p PersistentVolume],
) -> Option<&'p PersistentVolume> {
    retained_candidate(b, retained, false)
}

/// roxReadOnly: the complete primary's claim was released (`deleted`) but is still there, kept
/// by its finalizers: `kubernetes.io/pvc-protection` while a pod mounts it (a mount holder the
/// node agent did not delete). Progressing names the pods; past the grace period Degraded says
/// so too (`PrimaryClaimHeld`), else the step asks to look again at its end. Nothing is deleted:
/// the pods are someone else's to remove.
fn held_primary_claim(
    obs: &Observed<'_>,
    out: &mut Builder,
    claim: &PersistentVolumeClaim,
    deleted: &Time,
    pv_name: &str,
) {
    let claim_name = claim.metadata.name.clone().unwrap_or_default();
    let finalizers = claim
        .metadata
        .finalizers
        .as_ref()
        .map(|f| f.join(", "))
        .unwrap_or_default();
    let holders = if obs.primary_claim_holders.is_empty() {
        "no running pod of the control namespace mounts it".to_owned()
    } else {
        format!(
            "pods still mount it: {}",
            obs.primary_claim_holders.join(", ")
        )
    };
    let words = format!(
        "the primary claim {claim_name} was released at {} and is kept by its finalizers ({finalizers}); {holders}; PersistentVolume {pv_name} stays attached and read-only views wait until it is gone",
        deleted.0
    );
    out.set(PROGRESSING, true, Reason::ReleasingPrimary, words.clone());
    let grace = obs.config.primary_release_grace_seconds;
    let deadline = deleted
        .0
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(grace))
        .unwrap_or(Timestamp::MAX);
    if obs.now.0 >= deadline {
        out.set(
            DEGRADED,
            true,
            Reason::PrimaryClaimHeld,
            format!("{words} (for more than {grace} s); delete those pods (the node agent's mount holder, or a workload mounting the primary by hand) so the volume detaches"),
        );
    } else {
        out.recheck_at = Some(deadline);
    }
}

/// roxReadOnly: the complete primary whose claim was released ([`Action::ReleasePrimaryClaim`]),
/// to view when the primary claim is gone: an [`adoptable`] PV, or one still `Bound` to the
/// primary claim's name in the control namespace (the claim is deleted, and the PV controller
/// has not yet recorded the PV as Released). Without the second, the reconcile that sees the
/// claim gone before the PV's new phase would find no complete primary: Ready would go back
/// to Staging, and with the staging Job gone (its TTL) a second download would start.
pub fn released_primary<'p>(
    b: &ModelCacheBinding,
    retained: &[&'p PersistentVolume],
) -> Option<&'p PersistentVolume> {
    retained_candidate(b, retained, true)
}

fn retained_candidate<'p>(
    b: &ModelCacheBinding,
    retained: &[&'p PersistentVolume],
    bound_to_released_claim: bool,
) -> Option<&'p PersistentVolume> {
    let claim = writer_pvc_name(&b.spec.identity);
    let control = b.metadata.namespace.clone().unwrap_or_default();
    let mut candidates: Vec<&PersistentVolume> = retained
        .iter()
        .copied()
        .filter(|pv| {
            let Some(spec) = pv.spec.as_ref() else {
                return false;
            };
            let csi_ok = spec.csi.as_ref().is_some_and(|c| {
                c.driver == b.spec.decision.provisioner && c.read_only != Some(true)
            });
            let class_ok = spec.storage_class_name.as_deref()
                == Some(crate::encryption::primary_class(b).as_str());
            let names_claim = |r: &k8s_openapi::api::core::v1::ObjectReference| {
                r.name.as_deref() == Some(claim.as_str())
                    && r.namespace.as_deref() == Some(control.as_str())
            };
            let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
            let free = matches!(phase, Some("Released" | "Available"))
                || (bound_to_released_claim
                    && phase == Some("Bound")
                    && spec.claim_ref.as_ref().is_some_and(names_claim));
            let claim_ok = spec.claim_ref.as_ref().is_none_or(names_claim);
            let provisioned = pv
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(PROVISIONED_BY_ANNOTATION))
                == Some(&b.spec.decision.provisioner);
            pv.metadata.deletion_timestamp.is_none()
                && is_complete(b, pv)
                && provisioned
                && csi_ok
                && class_ok
                && free
                && claim_ok
        })
        .collect();
    candidates.sort_by_key(|pv| pv.metadata.name.clone());
    candidates.first().copied()
}

/// The failure record of the failed `job`: the stored one when it is this Job's (so its time
/// does not move), else a new one from now.
fn failure_record(
    obs: &Observed<'_>,
    stored: Option<&FailureRecord>,
    job: &Job,
    words: &str,
) -> FailureRecord {
    let uid = job.metadata.uid.clone();
    if let Some(r) = stored.filter(|r| uid.is_some() && r.job_uid == uid) {
        return r.clone();
    }
    let now = obs.now.0;
    let retry = now
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(
            obs.config.failure_record_seconds.max(0),
        ))
        .unwrap_or(Timestamp::MAX);
    FailureRecord {
        failed_at: Time(now),
        retry_after: Time(retry),
        job_uid: uid,
        message: warmcache_cli::text::bounded(words, MAX_FAILURE_MESSAGE_BYTES),
    }
}

fn delete_waiting_readers(obs: &Observed<'_>, out: &mut Builder) {
    if !obs.reader_namespaces.is_empty() {
        out.actions.push(Action::DeleteWaitingReaders {
            namespaces: obs.reader_namespaces.iter().cloned().collect(),
        });
    }
}

/// Whether `pod` is a reader of `binding` still waiting for the copy: it names the binding (and
/// its UID, when it records one), was rewritten as a reader (`nvsnap.io/model-role=reader`,
/// with the wait init container), is not warmcache's own, not being deleted, not finished, not
/// Ready, and its wait container has not completed. Such a pod is deleted after a failed
/// download so its controller recreates it on its own download path, when it has one that
/// does ([`reader_after_failure`]).
pub fn waiting_reader(binding: &ModelCacheBinding, pod: &Pod) -> bool {
    let meta = &pod.metadata;
    let annotations = meta.annotations.clone().unwrap_or_default();
    let labels = meta.labels.clone().unwrap_or_default();
    let names_binding = annotations.get(crate::keys::BINDING_ANNOTATION)
        == binding.metadata.name.as_ref()
        && annotations
            .get(crate::keys::BINDING_UID_ANNOTATION)
            .is_none_or(|u| Some(u) == binding.metadata.uid.as_ref());
    let reader = labels.get(crate::keys::ROLE_LABEL).map(String::as_str)
        == Some(crate::keys::ROLE_READER)
        && labels
            .get(crate::keys::MANAGED_BY_LABEL)
            .map(String::as_str)
            != Some(crate::keys::MANAGED_BY_VALUE);
    let waits = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.name == crate::keys::WAIT_CONTAINER));
    if !(names_binding && reader && waits) || meta.deletion_timestamp.is_some() {
        return false;
    }
    let status = pod.status.as_ref();
    let finished = status
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| matches!(p, "Succeeded" | "Failed"));
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let wait_done = status
        .and_then(|s| s.init_container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == crate::keys::WAIT_CONTAINER))
        .and_then(|c| c.state.as_ref()?.terminated.as_ref())
        .is_some_and(|t| t.exit_code == 0);
    !finished && !ready && !wait_done
}

/// Controller kinds that recreate a pod that is deleted: ReplicaSet, StatefulSet and
/// DaemonSet (`apps`), LeaderWorkerSet (`leaderworkerset.x-k8s.io`). A Job's pod is not among
/// them (a deleted one counts as failed), nor a bare pod or an unknown kind.
pub const RECREATING_OWNERS: [(&str, &str); 4] = [
    ("apps", "ReplicaSet"),
    ("apps", "StatefulSet"),
    ("apps", "DaemonSet"),
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"),
];

/// What happens to a reader still waiting for a failed download ([`reader_after_failure`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitingReader {
    /// Not a waiting reader of the binding: left alone.
    NotWaiting,
    /// Waiting, and its controller recreates it: deleted (UID and resourceVersion as
    /// preconditions), the new pod is left on its own download.
    Delete,
    /// Waiting, but nothing would recreate it (a bare pod, a Job's pod, an unknown controller
    /// kind): kept, it stops at its wait deadline; the reason says who owns it.
    Keep(String),
}

/// Whether `pod`'s controller ownerReference is a kind that recreates a deleted pod
/// ([`RECREATING_OWNERS`]); `Err` names what controls it (nothing, or the kind).
pub fn recreated_by_controller(pod: &Pod) -> Result<(), String> {
    let controller = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    let Some(owner) = controller else {
        return Err("no controller owns it (a bare pod)".to_owned());
    };
    let group = owner
        .api_version
        .split_once('/')
        .map_or("", |(group, _)| group);
    if RECREATING_OWNERS.contains(&(group, owner.kind.as_str())) && !owner.uid.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "its controller {} {} ({}) does not recreate deleted pods",
            owner.kind, owner.name, owner.api_version
        ))
    }
}

/// What to do with `pod` after `binding`'s download failed, while the failure record holds:
/// delete it only when it is a [`waiting_reader`] its controller recreates
/// ([`recreated_by_controller`]); a waiting reader nothing recreates is kept.
pub fn reader_after_failure(binding: &ModelCacheBinding, pod: &Pod) -> WaitingReader {
    if !waiting_reader(binding, pod) {
        return WaitingReader::NotWaiting;
    }
    match recreated_by_controller(pod) {
        Ok(()) => WaitingReader::Delete,
        Err(why) => WaitingReader::Keep(why),
    }
}

/// Releases [`Observed::stale_writer_claims`] ([`Action::ReleaseStaleWriterClaim`]) unless this reconcile's
/// election writes the Lease (a first writer or a takeover: the previous holder's claim is then
/// released after that write, see [`rwx`]); the claims of the elected and of the stored holder's
/// namespace, and of the control namespace (the primary), are never released here.
fn release_stale_writer_claims(obs: &Observed<'_>, out: &mut Builder) {
    if obs.writer.claim.is_some() {
        return;
    }
    let control = obs.binding.metadata.namespace.as_deref();
    let holder = obs.writer.stored.as_ref().map(|w| w.namespace.as_str());
    let elected = Some(obs.writer.namespace.as_str());
    let name = writer_pvc_name(&obs.binding.spec.identity);
    for claim in &obs.stale_writer_claims {
        let ns = claim.metadata.namespace.as_deref();
        if ns.is_none() || ns == control || ns == holder || ns == elected {
            continue;
        }
        if claim.metadata.name.as_deref() != Some(name.as_str())
            || claim.metadata.deletion_timestamp.is_some()
        {
            continue;
        }
        if let (Some(ns), Some(name), Some(uid)) = (
            &claim.metadata.namespace,
            &claim.metadata.name,
            &claim.metadata.uid,
        ) {
            out.actions.push(Action::ReleaseStaleWriterClaim {
                namespace: ns.clone(),
                name: name.clone(),
                uid: uid.clone(),
            });
        }
    }
}

fn release_writer_claim(obs: &Observed<'_>, out: &mut Builder) {
    if let Some(claim) = obs.writer_view_claim {
        release_claim(claim, out);
    }
}

fn release_claim(claim: &PersistentVolumeClaim, out: &mut Builder) {
    if claim.metadata.deletion_timestamp.is_some() {
        return;
    }
    if let (Some(ns), Some(name), Some(uid)) = (
        &claim.metadata.namespace,
        &claim.metadata.name,
        &claim.metadata.uid,
    ) {
        out.actions.push(Action::ReleaseWriterClaim {
            namespace: ns.clone(),
            name: name.clone(),
            uid: uid.clone(),
        });
    }
}

/// Records views of new reading namespaces in `realized` and queues the creation of stored
/// ones that do not exist; returns how many are not complete yet.
fn views(
    obs: &Observed<'_>,
    primary: &PersistentVolume,
    bytes: Option<u64>,
    stored: &BTreeSet<String>,
    realized: &mut RealizedStorage,
    out: &mut Builder,
) -> usize {
    let b = obs.binding;
    let mut pending = 0;
    for ns in &obs.reader_namespaces {
        if !realized.views.iter().any(|v| &v.namespace == ns) {
            realized.views.push(view::reader_view(b, ns));
        }
    }
    realized.views.sort_by(|a, c| a.namespace.cmp(&c.namespace));
    let recorded: Vec<ReadOnlyView> = realized.views.clone();
    for v in &recorded {
        if obs.existing_views.contains(&v.namespace) {
            continue;
        }
        pending += 1;
        if !stored.contains(&v.namespace) {
            continue;
        }
        match view::read_only_view(
            b,
            primary,
            &v.namespace,
            bytes,
            &obs.config.extra_mount_options,
        ) {
            Ok((pv, mut claim)) => {
                if let Some(tp) = obs.traceparents.get(&v.namespace) {
                    claim
                        .metadata
                        .annotations
                        .get_or_insert_with(BTreeMap::new)
                        .insert(TRACE_PARENT_ANNOTATION.to_owned(), tp.clone());
                }
                out.actions.push(Action::CreateView(pv, claim));
            }
            Err(e) => {
                degraded(
                    out,
                    Reason::InvalidPrimaryVolume,
                    view_error(&v.namespace, &e),
                );
                return pending;
            }
        }
    }
    pending
}

fn view_error(namespace: &str, e: &ViewError) -> String {
    format!("the view of namespace {namespace}: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{binding, init_step};
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, ObjectReference,
        PersistentVolumeClaimStatus, PodStatus,
    };
    use k8s_openapi::jiff::Timestamp;

    /// The fixture's primary PV as the provisioner leaves it for [`bound_claim`]: provisioned
    /// by the decision's provisioner, bound to that claim's UID.
    fn primary_pv() -> PersistentVolume {
        let mut pv = crate::testing::primary_pv();
        pv.metadata.annotations = Some(BTreeMap::from([(
            PROVISIONED_BY_ANNOTATION.to_owned(),
            "shared-fs.csi-test.warmcache.io".to_owned(),
        )]));
        pv.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            uid: Some("primary-claim-uid".into()),
            ..ObjectReference::default()
        });
        pv
    }

    fn now() -> Time {
        Time(Timestamp::from_second(1_800_000_000).unwrap())
    }

    fn reference(ns: &str, name: &str, uid: &str) -> RequestReference {
        RequestReference {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: ns.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    fn bound_claim(b: &ModelCacheBinding) -> PersistentVolumeClaim {
        let mut c = view::primary_claim(b, Quantity("100Gi".into()));
        c.metadata.uid = Some("primary-claim-uid".into());
        c.status = Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            ..PersistentVolumeClaimStatus::default()
        });
        c
    }

    /// The primary of `b` as a retained complete PV its released claim left (42 bytes, Retain,
    /// Released, no claimRef).
    fn released_complete(b: &ModelCacheBinding) -> PersistentVolume {
        let mut complete = primary_pv();
        let (l, a) = completion_marks(b, Some(42), "team-a");
        complete.metadata.labels = Some(l);
        complete
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(a);
        let spec = complete.spec.as_mut().unwrap();
        spec.persistent_volume_reclaim_policy = Some("Retain".into());
        spec.claim_ref = None;
        complete.status = Some(k8s_openapi::api::core::v1::PersistentVolumeStatus {
            phase: Some("Released".into()),
            ..Default::default()
        });
        complete
    }

    fn job_with(b: &ModelCacheBinding, condition: Option<&str>) -> Job {
        let mut job = writer::writer_job(b, &init_step(), &[], &WriterOptions::default()).unwrap();
        job.status = condition.map(|c| JobStatus {
            conditions: Some(vec![JobCondition {
                type_: c.into(),
                status: "True".into(),
                ..JobCondition::default()
            }]),
            ..JobStatus::default()
        });
        job
    }

    fn pod_terminated(exit: i32, message: &str) -> Pod {
        Pod {
            status: Some(PodStatus {
                container_statuses: Some(vec![ContainerStatus {
                    name: WRITER_CONTAINER.into(),
                    state: Some(ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code: exit,
                            message: Some(message.into()),
                            ..ContainerStateTerminated::default()
                        }),
                        ..ContainerState::default()
                    }),
                    ..ContainerStatus::default()
                }]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    fn observed<'a>(b: &'a ModelCacheBinding, config: &'a LifecycleConfig) -> Observed<'a> {
        Observed {
            binding: b,
            now: now(),
            seen_references: Vec::new(),
            stale_references: BTreeSet::new(),
            reader_namespaces: BTreeSet::new(),
            traceparents: BTreeMap::new(),
            model_uri: None,
            writer: crate::lease::fixed(b, None),
            step: None,
            capture_sources: Vec::new(),
            primary_claim: None,
            primary_pv: None,
            writer_view_pv: None,
            writer_view_claim: None,
            previous_writer_claim: None,
            stale_writer_claims: Vec::new(),
            job: None,
            job_pods: Vec::new(),
            existing_views: BTreeSet::new(),
            foreign: None,
            completion_error: None,
            retained: Vec::new(),
            attachments: BTreeMap::new(),
            primary_claim_holders: Vec::new(),
            encryption: EncryptionObserved::default(),
            config,
        }
    }

    fn condition<'s>(s: &'s Step, type_: &str) -> &'s WantedCondition {
        s.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    fn population(s: &Step) -> Option<PopulationState> {
        s.status.realized.as_ref().and_then(|r| r.population_state)
    }

    #[test]
    fn references_are_added_while_active_and_pruned_when_stale() {
        let stored = vec![reference("a", "x", "1"), reference("a", "y", "2")];
        let seen = vec![
            reference("b", "z", "3"),
            reference("a", "x", "1"),
            reference("b", "z", "3"),
        ];
        let stale = BTreeSet::from(["2".to_owned()]);
        let merged = merge_references(&stored, &seen, &stale, true);
        let uids: Vec<&str> = merged.iter().map(|r| r.uid.as_str()).collect();
        assert_eq!(uids, ["1", "3"]);
        let retiring = merge_references(&stored, &seen, &stale, false);
        let uids: Vec<&str> = retiring.iter().map(|r| r.uid.as_str()).collect();
        assert_eq!(uids, ["1"], "a Retiring binding gains no reference");
    }

    #[test]
    fn first_step_records_active_and_creates_the_primary_claim() {
        let b = binding(Transition::RwxReadOnly);
        let config = LifecycleConfig::default();
        let mut obs = observed(&b, &config);
        obs.seen_references = vec![reference("team-a", "vllm", "w-1")];
        obs.model_uri = Some("hf://Qwen/Qwen3-0.6B@v1".into());
        let s = step(&obs);
        assert_eq!(s.status.phase, Some(BindingPhase::Active));
        assert_eq!(s.status.observed_generation, Some(1));
        assert_eq!(s.status.request_reference_count, Some(1));
        assert_eq!(s.status.unreferenced_since, None);
        assert_eq!(
            s.status.model_uri.as_deref(),
            Some("hf://Qwen/Qwen3-0.6B@v1")
        );
        assert!(matches!(
            s.actions.as_slice(),
            [Action::CreatePrimaryClaim(_)]
        ));
        assert_eq!(population(&s), Some(PopulationState::Pending));
        assert_eq!(condition(&s, READY).reason, Reason::CreatingPrimary);
        assert!(!condition(&s, DEGRADED).status);
    }

    #[test]
    fn no_references_records_the_time_once() {
        let mut b = binding(Transition::RwxReadOnly);
        let config = LifecycleConfig::default();
        let s = step(&observed(&b, &config));
        assert_eq!(s.status.unreferenced_since, Some(now()));
        let earlier = Time(Timestamp::from_second(1_700_000_000).unwrap());
        b.status = Some(ModelCacheBindingStatus {
            unreferenced_since: Some(earlier.clone()),
            ..ModelCacheBindingStatus::default()
        });
        let s = step(&observed(&b, &config));
        assert_eq!(s.status.unreferenced_since, Some(earlier));
    }

    #[test]
    fn an_unbound_primary_waits() {
        let b = binding(Transition::RwxReadOnly);
        let config = LifecycleConfig::default();
        let mut claim = bound_claim(&b);
        claim.status = None;
        let mut obs = observed(&b, &config);
        obs.primary_claim = Some(&claim);
        let s = step(&obs);
        assert!(s.actions.is_empty());
        assert_eq!(
            condition(&s, PROGRESSING).reason,
            Reason::PrimaryClaimPending
        );
    }

    #[test]
    fn a_bound_primary_without_a_step_waits_for_one() {
        let b = binding(Transition::RwxReadOnly);
        let config = LifecycleConfig::default();
        let claim = bound_claim(&b);
        let pv = primary_pv();
        let mut obs = observed(&b, &config);
        obs.primary_claim = Some(&claim);
        obs.primary_pv = Some(&pv);
        let s = step(&obs);
        assert!(s.actions.is_empty());
        assert_eq!(condition(&s, READY).reason, Reason::WaitingForDownloadStep);
        assert_eq!(
            s.status
                .realized
                .as_ref()
                .unwrap()
                .bound_persistent_volume_name
                .as_deref(),
            Some("pvc-primary")
        );
    }

    #[test]
    fn a_step_starts_the_writer_view_then_the_job() {
        let b = binding(Transition::RwxReadOnly);
        let config = LifecycleConfig::default();
        let claim = bound_claim(&b);
        let pv = primary_pv();
        let mut obs = observed(&b, &config);
        obs.primary_claim = Some(&claim);
        obs.primary_pv = Some(&pv);
        obs.step = Some(StepSource {
            step: init_step(),
            pod_env: Vec::new(),
        });
        let s = step(&obs);
        match s.actions.as_slice() {
            [
                Action::CreateWriterView(vpv, vclaim),
                Action::CreateJob(job),
            ] => {
                assert_eq!(vclaim.metadata.namespace.as_deref(), Some("team-a"));
                assert_eq!(
                    vpv.spec
                        .as_ref()
                        .unwrap()
                        .csi
                        .as_ref()
                        .unwrap()
                        .volume_handle,
                    "handle-1"
                );
                assert_eq!(job.metadata.namespace.as_deref(), Some("team-a"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(population(&s), Some(PopulationState::Populating));
        // An invalid step is reported, nothing created.
        let mut bad = init_step();
        bad.container.command = None;
        obs.step = Some(StepSource {
            step: bad,
            pod_env: Vec::new(),
        });
        let s = step(&obs);
        assert!(s.actions.is_empty());
        assert_eq!(condition(&s, DEGRADED).reason, Reason::InvalidDownloadStep);
        assert!(condition(&s, DEGRADED).status);
    }

    #[test]
    fn views_are_recorded_before_they_are_created() {
        let mut b = binding(Transition::RwxReadOnly);
        let config = LifecycleConfig::default();
        let claim = bound_claim(&b);
        let pv = primary_pv();
        let job = job_with(&b, None);
        let mut obs = observed(&b, &config);
        obs.primary_claim = Some(&claim);
        obs.primary_pv = Some(&pv);
        obs.job = Some(&job);
        obs.reader_namespaces = BTreeSet::from(["team-a".to_owned(), "team-b".to_owned()]);
        let s = step(&obs);
        let views: Vec<&str> = s
            .status
            .realized
            .as_ref()
            .unwrap()
            .views
            .iter()
            .map(|v| v.namespace.as_str())
            .collect();
        assert_eq!(views, ["team-a", "team-b"]);
        assert!(s.actions.is_empty(), "not stored yet: {:?}", s.actions);
        assert_eq!(condition(&s, READY).reason, Reason::Downloading);

        // Stored: created, once per namespace; existing ones are not created again.
        b.status = Some(s.status.clone());
        let mut obs = observed(&b, &config);
        obs.primary_claim = Some(&claim);
        obs.primary_pv = Some(&pv);
        obs.job = Some(&job);
        obs.reader_namespaces = BTreeSet::from(["team-a".to_owned(), "team-b".to_owned()]);
        obs.existing_views = BTreeSet::from(["team-a".to_owned()]);
        let s = step(&obs);
        match s.actions.as_slice() {
            [Action::CreateView(vpv, vclaim)] => {
                assert_eq!(vclaim.metadata.namespace.as_deref(), Some("team-b"));
                assert_eq!(
                    vpv.spec.as_ref().unwrap().csi.as_ref().unwrap().read_only,
                    Some(true)
                );
            }
            other => panic!("{other:?}"),
        }
        // A namespace whose pods are gone keeps its recorded view (the reaper's).
        obs.reader_namespaces = BTreeSet::new();
        let s = step(&obs);
        assert_eq!(s.status.realized.as_ref().unwrap().views.len(), 2);
    }

    #[test]
    fn success_marks_the_pv_then_ready_releases_the_writer_claim() {
        let b = binding(Transition::RwxReadOnly);
        let config = LifecycleConfig::default();
        let claim = bound_claim(&b);
        let pv = primary_pv();
        let job = job_with(&b, Some("Complete"));
        let done = pod_terminated(0, "123456");
        let (vpv, mut vclaim) = view::writer_view(&b, &pv).unwrap();
        vclaim.metadata.uid = Some("writer-claim-uid".into());
        let mut obs = observed(&b, &config);
        obs.primary_claim = Some(&claim);
        obs.primary_pv = Some(&pv);
        obs.job = Some(&job);
        obs.job_pods = vec![&done];
        obs.writer_view_pv = Some(&vpv);
        obs.writer_view_claim = Some(&vclaim);
        let s = step(&obs);
        let (labels, annotations) = match s.actions.as_slice() {
            [
                Action::MarkComplete {
                    pv,
                    labels,
                    annotations,
                },
            ] => {
                assert_eq!(pv, "pvc-primary");
                (labels.clone(), annotations.clone())
            }
            other => panic!("the writer claim is kept until completion is stored: {other:?}"),
        };
        assert_eq!(labels[COMPLETE_LABEL], "true");
        assert_eq!(labels[SOURCE_NAMESPACE_LABEL], "team-a");
        assert_eq!(annotations[BYTES_ANNOTATION], "123456");
        assert_eq!(s.status.resolved_revision, None, "no commit recorded");
        assert!(!annotations.contains_key(REVISION_ANNOTATION));
        // A download that resolved a commit: it goes onto the PV with the completion, and the
        // status takes it from the complete PV (so a binding adopting the PV finds it too).
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let mut ours = job.clone();
        ours.metadata.uid = Some("job-uid".into());
        let mut pinned = pod_terminated(0, &format!("123456 revision={sha}"));
        pinned.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                uid: "job-uid".into(),
                kind: "Job".into(),
                ..Default::default()
            },
        ]);
        let mut with_commit = obs.clone();
        with_commit.job = Some(&ours);
        with_commit.job_pods = vec![&pinned];
        let committed = step(&with_commit);
        let [Action::MarkComplete { annotations: a, .. }] = committed.actions.as_slice() else {
            panic!("MarkComplete");
        };
        assert_eq!(a.get(REVISION_ANNOTATION).map(String::as_str), Some(sha));
        obs.job_pods = vec![&done];
        assert_eq!(population(&s), Some(PopulationState::Populating));
        assert!(!condition(&s, DEGRADED).status);
        obs.completion_error = Some("5 conflicting writes".into());
        let s = step(&obs);
        let d = condition(&s, DEGRADED);
        assert!(d.status && d.reason == Reason::CompletionNotStored, "{d:?}");
        assert!(
            matches!(s.actions.as_slice(), [Action::MarkComplete { .. }]),
            "retried, claim kept"
        );
        obs.completion_error = None;

        // Labels stored but Retain not: still not complete.
        let mut half = pv.clone();
        half.metadata.labels = Some(labels.clone());
        half.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(annotations.clone());
        half.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Delete".into());
        obs.primary_pv = Some(&half);
        let s = step(&obs);
        assert!(matches!(
            s.actions.as_slice(),
            [Action::MarkComplete { .. }]
        ));

        // Both stored: Ready, bytes and identity recorded, the writer claim released; the Job
        // may be gone by then.
        let mut complete = half.clone();
        complete
            .spec
            .as_mut()
            .unwrap()
            .persistent_volume_reclaim_policy = Some("Retain".into());
        obs.primary_pv = Some(&complete);
        obs.job = None;
        obs.job_pods = Vec::new();
        let s = step(&obs);
        assert_eq!(population(&s), Some(PopulationState::Ready));
        let r = s.status.realized.as_ref().unwrap();
        assert_eq!(r.bytes, Some(123_456));
        assert_eq!(r.provider_data_identity.as_deref(), Some("handle-1"));
        assert_eq!(r.source_namespace.as_deref(), Some("team-a"));
        assert!(matches!(
            s.actions.as_slice(),
            [Action::ReleaseWriterClaim { namespace, uid, .. }] if namespace == "team-a" && uid == "writer-claim-uid"
        ));
        assert!(condition(&s, READY).status);
        assert_eq!(condition(&s, PROGRESSING).reason, Reason::Reconciled);
        // Another cache's completion marks do not count.
        let mut other = complete.clone();
        other
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(HANDLE_DIGEST_ANNOTATION.into(), "sha256:other".into());
        assert!(!is_complete(&b, &other));
    }

    #[test]
    fn ready_views_are_sized_from_the_measured_bytes() {
        let mut b = binding(Transition::RwxReadOnly);
        let config = LifecycleConfig::default();
        let claim = bound_claim(&b);
        let mut pv = primary_pv();
        let (labels, annotations) = completion_marks(&b, Some(3 << 30), "team-a");
        pv.metadata.labels = Some(labels);
        pv.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(annotations);
        b.status = Some(ModelCacheBindingStatus {
            realized: Some(RealizedStorage {
                views: vec![view::reader_view(&b, "team-b")],
                ..RealizedStorage::default()
            }),
            ..ModelCacheBindingStatus::default()
        });
        let mut obs = observed(&b, &config);
        obs.primary_claim = Some(&claim);
        obs.primary_pv = Some(&pv);
        let s = step(&obs);
        match s.actions.as_slice() {
            [Action::CreateView(vpv, _)] => {
                assert_eq!(
                    vpv.spec.as_ref().unwrap().capacity.as_ref().unwrap()["storage"].0,
                    "4Gi"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(condition(&s, PROGRESSING).reason, Reason::CreatingViews);
    }

    #[test]
    fn failure_records_last_words_retires_the_writer_view_and_retries_later() {
        let b = binding(Transition::RwxReadOnly);
        let config = LifecycleConfig::default();
        let claim = bound_claim(&b);
        let pv = primary_pv();
        let mut job = job_with(&b, Some("Failed"));
        job.metadata.uid = Some("job-uid-1".into());
        let failed = pod_terminated(1, "nvsnap: download exited 1: 401 Unauthorized");
        let (mut vpv, mut vclaim) = view::writer_view(&b, &pv).unwrap();
        vclaim.metadata.uid = Some("writer-claim-uid".into());
        let mut obs = observed(&b, &config);
        obs.primary_claim = Some(&claim);
        obs.primary_pv = Some(&pv);
        obs.job = Some(&job);
        obs.job_pods = vec![&failed];
        obs.writer_view_pv = Some(&vpv);
        obs.writer_view_claim = Some(&vclaim);
        obs.step = Some(StepSource {
            step: init_step(),
            pod_env: Vec::new(),
        });
        let s = step(&obs);
        assert_eq!(population(&s), Some(PopulationState::Failed));
        let d = condition(&s, DEGRADED);
        assert!(d.status);
        assert_eq!(d.reason, Reason::DownloadFailed);
        assert!(d.message.contains("401 Unauthorized"), "{}", d.message);
        assert!(
            matches!(s.actions.as_slice(), [Action::ReleaseWriterClaim { .. }]),
            "{:?}",
            s.actions
        );
        // The failure record: valid one hour from now, naming the Job.
        let record = s.status.failure_record.clone().unwrap();
        assert_eq!(record.failed_at, now());
        assert_eq!(record.retry_after.0.as_second(), now().0.as_second() + 3600);
        assert_eq!(record.job_uid, job.metadata.uid);
        assert!(record.message.contains("401 Unauthorized"));
        assert_eq!(s.recheck_at, Some(record.retry_after.0));
        // With readers: the waiting ones are deleted while the record holds.
        obs.reader_namespaces = BTreeSet::from(["team-a".to_owned(), "team-b".to_owned()]);
        let s = step(&obs);
        assert!(
            s.actions.contains(&Action::DeleteWaitingReaders {
                namespaces: vec!["team-a".into(), "team-b".into()]
            }),
            "{:?}",
            s.actions
        );
        // A later reconcile of the same failed Job keeps the record's time.
        let mut again = b.clone();
        again.status = Some(s.status.clone());
        let mut obs2 = observed(&again, &config);
        obs2.now = Time(Timestamp::from_second(now().0.as_second() + 60).unwrap());
        obs2.primary_claim = Some(&claim);
        obs2.primary_pv = Some(&pv);
        obs2.job = Some(&job);
        obs2.job_pods = vec![&failed];
        let s2 = step(&obs2);
        assert_eq!(s2.status.failure_record, Some(record.clone()));

        // The Job is gone (TTL) but the record holds: no retry, readers still deleted.
        let mut stored = b.clone();
        stored.status = Some(s.status.clone());
        let mut held = observed(&stored, &config);
        held.now = Time(Timestamp::from_second(now().0.as_second() + 3599).unwrap());
        held.primary_claim = Some(&claim);
        held.primary_pv = Some(&pv);
        held.writer_view_pv = Some(&vpv);
        held.reader_namespaces = BTreeSet::from(["team-a".to_owned()]);
        held.step = Some(StepSource {
            step: init_step(),
            pod_env: Vec::new(),
        });
        let s3 = step(&held);
        assert!(
            matches!(s3.actions.as_slice(), [Action::DeleteWaitingReaders { .. }]),
            "{:?}",
            s3.actions
        );
        assert_eq!(population(&s3), Some(PopulationState::Failed));
        assert_eq!(condition(&s3, READY).reason, Reason::DownloadFailed);
        assert_eq!(s3.recheck_at, Some(record.retry_after.0));

        // Expired and the Job gone: retry through the same view PV, whose claimRef still names
        // the released claim; no reader is deleted any more.
        vpv.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            uid: Some("writer-claim-uid".into()),
            ..ObjectReference::default()
        });
        vpv.metadata.resource_version = Some("77".into());
        let mut obs = observed(&stored, &config);
        obs.now = record.retry_after.clone();
        obs.reader_namespaces = BTreeSet::from(["team-a".to_owned()]);
        obs.primary_claim = Some(&claim);
        obs.primary_pv = Some(&pv);
        obs.writer_view_pv = Some(&vpv);
        obs.step = Some(StepSource {
            step: init_step(),
            pod_env: Vec::new(),
        });
        let s = step(&obs);
        match s.actions.as_slice() {
            [
                Action::RebindWriterView {
                    resource_version, ..
                },
                Action::CreateWriterView(..),
                Action::CreateJob(_),
            ] => {
                assert_eq!(resource_version, "77");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(population(&s), Some(PopulationState::Populating));
        assert!(
            !condition(&s, DEGRADED).status,
            "a retry clears the failure"
        );
        assert_eq!(
            s.status.failure_record.as_ref(),
            Some(&record),
            "the record stays until a success"
        );
    }

    #[test]
    fn success_clears_the_failure_record() {
        let mut b = binding(Transition::RwxReadOnly);
        let config = LifecycleConfig::default();
        let claim = bound_claim(&b);
        let mut pv = primary_pv();
        let (labels, annotations) = completion_marks(&b, Some(1 << 20), "team-a");
        pv.metadata.labels = Some(labels);
        pv.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(annotations);
        b.status = Some(ModelCacheBindingStatus {
            failure_record: Some(FailureRecord {
                failed_at: now(),
                retry_after: now(),
                job_uid: Some("old".into()),
                message: "boom".into(),
            }),
            ..ModelCacheBindingStatus::default()
        });
        let mut obs = observed(&b, &config);
        obs.primary_claim = Some(&claim);
        obs.primary_pv = Some(&pv);
        let s = step(&obs);
        assert_eq!(population(&s), Some(PopulationState::Ready));
        assert_eq!(s.status.failure_record, None);
    }

    #[test]
    fn a_failure_stored_without_a_record_gets_one() {
        let mut b = binding(Transition::RwxReadOnly);
        let config = LifecycleConfig::default();
        let claim = bound_claim(&b);
        let pv = primary_pv();
        b.status = Some(ModelCacheBindingStatus {
            realized: Some(RealizedStorage {
                population_state: Some(PopulationState::Failed),
                ..RealizedStorage::default()
            }),
            ..ModelCacheBindingStatus::default()
        });
        let mut obs = observed(&b, &config);
        obs.primary_claim = Some(&claim);
        obs.primary_pv = Some(&pv);
        obs.step = Some(StepSource {
            step: init_step(),
            pod_env: Vec::new(),
        });
        let s = step(&obs);
        let r = s.status.failure_record.clone().unwrap();
        assert_eq!(r.failed_at, now());
        assert!(
            s.actions.is_empty(),
            "no retry while it holds: {:?}",
            s.actions
        );
    }

    fn reader(b: &ModelCacheBinding) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "r", "namespace": "team-a", "uid": "pod-1",
                "labels": { crate::keys::ROLE_LABEL: crate::keys::ROLE_READER },
                "annotations": {
                    crate::keys::BINDING_ANNOTATION: b.metadata.name.clone().unwrap(),
                    crate::keys::BINDING_UID_ANNOTATION: b.metadata.uid.clone().unwrap(),
                },
            },
            "spec": {
                "initContainers": [{ "name": crate::keys::WAIT_CONTAINER, "image": "x" }],
                "containers": [{ "name": "vllm", "image": "x" }],
            },
            "status": { "phase": "Pending" },
        }))
        .unwrap()
    }

    #[test]
    fn waiting_readers_are_the_rewritten_ones_not_ready_still_in_their_wait() {
        let b = binding(Transition::RwxReadOnly);
        let pod = reader(&b);
        assert!(waiting_reader(&b, &pod));
        // Its wait exited non-zero (the failure marker) and restarts: still waiting.
        let mut failed_wait = pod.clone();
        failed_wait.status = Some(
            serde_json::from_value(serde_json::json!({
                "phase": "Pending",
                "initContainerStatuses": [{
                    "name": crate::keys::WAIT_CONTAINER, "image": "x", "imageID": "", "ready": false,
                    "restartCount": 1,
                    "state": { "terminated": { "exitCode": 1 } },
                }],
            }))
            .unwrap(),
        );
        assert!(waiting_reader(&b, &failed_wait));
        let mut not = Vec::new();
        let mut ready = pod.clone();
        ready.status = Some(
            serde_json::from_value(serde_json::json!({
                "phase": "Running",
                "conditions": [{ "type": "Ready", "status": "True" }],
            }))
            .unwrap(),
        );
        not.push(ready);
        let mut past_wait = failed_wait.clone();
        past_wait
            .status
            .as_mut()
            .unwrap()
            .init_container_statuses
            .as_mut()
            .unwrap()[0]
            .state
            .as_mut()
            .unwrap()
            .terminated
            .as_mut()
            .unwrap()
            .exit_code = 0;
        not.push(past_wait);
        let mut other = pod.clone();
        other.metadata.annotations.as_mut().unwrap().insert(
            crate::keys::BINDING_ANNOTATION.into(),
            "model-cache-other".into(),
        );
        not.push(other);
        let mut no_wait = pod.clone();
        no_wait.spec.as_mut().unwrap().init_containers = None;
        not.push(no_wait);
        let mut not_reader = pod.clone();
        not_reader.metadata.labels = None;
        not.push(not_reader);
        let mut ours = pod.clone();
        ours.metadata.labels.as_mut().unwrap().insert(
            crate::keys::MANAGED_BY_LABEL.into(),
            crate::keys::MANAGED_BY_VALUE.into(),
        );
        not.push(ours);
        let mut done = pod.clone();
        done.status.as_mut().unwrap().phase = Some("Failed".into());
        not.push(done);
        let mut other_uid = pod.clone();
        other_uid
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(crate::keys::BINDING_UID_ANNOTATION.into(), "other".into());
        not.push(other_uid);
        for p in &not {
            assert!(!waiting_reader(&b, p), "{p:?}");
        }
    }

    fn owned_by(pod: &Pod, api_version: &str, kind: &str, controller: Option<bool>) -> Pod {
        let mut p = pod.clone();
        p.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: api_version.into(),
                kind: kind.into(),
                name: "owner".into(),
                uid: "owner-uid".into(),
                controller,
                block_owner_deletion: None,
            },
        ]);
        p
    }

    #[test]
    fn only_waiting_readers_whose_controller_recreates_them_are_deleted() {
        let b = binding(Transition::RwxReadOnly);
        let pod = reader(&b);
        for (api_version, kind) in [
            ("apps/v1", "ReplicaSet"),
            ("apps/v1", "StatefulSet"),
            ("apps/v1", "DaemonSet"),
            ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"),
        ] {
            let p = owned_by(&pod, api_version, kind, Some(true));
            assert_eq!(
                reader_after_failure(&b, &p),
                WaitingReader::Delete,
                "{kind}"
            );
        }
        // Nothing recreates a bare pod, a Job's pod (a deleted one counts as failed), a pod of
        // an unknown kind, a kind of that name in another group, or a pod whose only owner is
        // not its controller.
        let kept = [
            pod.clone(),
            owned_by(&pod, "batch/v1", "Job", Some(true)),
            owned_by(&pod, "argoproj.io/v1alpha1", "Workflow", Some(true)),
            owned_by(&pod, "tekton.dev/v1", "TaskRun", Some(true)),
            owned_by(&pod, "example.com/v1", "ReplicaSet", Some(true)),
            owned_by(&pod, "apps/v1", "ReplicaSet", None),
            owned_by(&pod, "apps/v1", "ReplicaSet", Some(false)),
        ];
        for p in &kept {
            match reader_after_failure(&b, p) {
                WaitingReader::Keep(why) => assert!(!why.is_empty()),
                other => panic!("{other:?} for {:?}", p.metadata.owner_references),
            }
        }
        assert!(
            recreated_by_controller(&pod)
                .unwrap_err()
                .contains("bare pod")
        );
        assert!(
            recreated_by_controller(&kept[1])
                .unwrap_err()
                .contains("Job owner")
        );
        // Not waiting: never deleted, whatever owns it.
        let mut ready = owned_by(&pod, "apps/v1", "ReplicaSet", Some(true));
        ready.status = Some(
            serde_json::from_value(serde_json::json!({
                "phase": "Running",
                "conditions": [{ "type": "Ready", "status": "True" }],
            }))
            .unwrap(),
        );
        assert_eq!(reader_after_failure(&b, &ready), WaitingReader::NotWaiting);
    }

    #[test]
    fn an_earlier_writers_claim_left_behind_is_released_on_the_next_reconcile() {
        let mut b = binding(Transition::RwxReadOnly);
        b.spec.resources.lease_name = warmcache_api_modelcache::init_lease_name(&b.spec.identity);
        let config = LifecycleConfig::default();
        let claim = bound_claim(&b);
        let pv = primary_pv();
        let writer_claim = |ns: &str, uid: &str| {
            let (_, mut c) = view::writer_view_in(&b, &pv, ns).unwrap();
            c.metadata.uid = Some(uid.into());
            c
        };
        let (old, current, primary) = (
            writer_claim("team-a", "old-claim"),
            writer_claim("team-b", "current-claim"),
            writer_claim("nvca-modelcache-init", "primary-claim-uid"),
        );
        // A takeover to team-b stored (the crash came after the Lease write): team-b holds and
        // its Job runs.
        let lease = crate::lease::writer_lease(
            &b,
            None,
            "team-b",
            Some("job-2"),
            warmcache_api_modelcache::v2beta1::WriterState::Running,
            1,
            now().0,
            60,
        );
        let view_of = crate::lease::view(&b, Some(&lease));
        let steps = BTreeSet::from(["team-b".to_owned()]);
        let election = crate::lease::elect(&crate::lease::ElectionInput {
            binding: &b,
            lease: &view_of,
            holder_job: Some("job-2"),
            step_namespaces: &steps,
            now: now().0,
            grace_seconds: 60,
        });
        assert_eq!(election.namespace, "team-b");
        let job = job_with(&b, None);
        let mut obs = observed(&b, &config);
        obs.writer = election.clone();
        obs.primary_claim = Some(&claim);
        obs.primary_pv = Some(&pv);
        obs.job = Some(&job);
        obs.stale_writer_claims = vec![&old, &current, &primary];
        let s = step(&obs);
        let released: Vec<_> = s
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::ReleaseStaleWriterClaim { namespace, uid, .. } => {
                    Some((namespace.as_str(), uid.as_str()))
                }
                _ => None,
            })
            .collect();
        assert_eq!(released, vec![("team-a", "old-claim")], "{:?}", s.actions);
        // Never while the election writes the Lease (the takeover releases the previous
        // holder's claim itself, after its write), nor a claim being deleted.
        let mut writing = election;
        writing.claim = Some(crate::lease::LeaseWrite::Update(Box::new(lease)));
        obs.writer = writing;
        assert!(
            !step(&obs)
                .actions
                .iter()
                .any(|a| matches!(a, Action::ReleaseStaleWriterClaim { .. }))
        );
        obs.writer = crate::lease::fixed(&b, Some("job-2"));
        let mut deleting = old.clone();
        deleting.metadata.deletion_timestamp = Some(now());
        obs.stale_writer_claims = vec![&deleting];
        assert!(
            !step(&obs)
                .actions
                .iter()
                .any(|a| matches!(a, Action::ReleaseStaleWriterClaim { .. }))
        );
    }

    #[test]
    fn a_takeover_writes_the_lease_first_then_releases_the_old_claim_and_starts_the_job() {
        let mut b = binding(Transition::RwxReadOnly);
        b.spec.resources.lease_name = warmcache_api_modelcache::init_lease_name(&b.spec.identity);
        let config = LifecycleConfig::default();
        let claim = bound_claim(&b);
        let pv = primary_pv();
        let (_, mut old_claim) = view::writer_view(&b, &pv).unwrap();
        old_claim.metadata.uid = Some("old-writer-claim".into());
        let lease = crate::lease::writer_lease(
            &b,
            None,
            "team-a",
            Some("job-1"),
            warmcache_api_modelcache::v2beta1::WriterState::Gone,
            0,
            Timestamp::from_second(1_700_000_000).unwrap(),
            60,
        );
        let view_of = crate::lease::view(&b, Some(&lease));
        let steps = BTreeSet::from(["team-b".to_owned()]);
        let election = crate::lease::elect(&crate::lease::ElectionInput {
            binding: &b,
            lease: &view_of,
            holder_job: None,
            step_namespaces: &steps,
            now: now().0,
            grace_seconds: 60,
        });
        assert_eq!(election.namespace, "team-b");
        let mut obs = observed(&b, &config);
        obs.writer = election;
        obs.previous_writer_claim = Some(&old_claim);
        obs.primary_claim = Some(&claim);
        obs.primary_pv = Some(&pv);
        obs.step = Some(StepSource {
            step: init_step(),
            pod_env: Vec::new(),
        });
        let s = step(&obs);
        match s.actions.as_slice() {
            [
                Action::WriteLease(crate::lease::LeaseWrite::TakeOver(_)),
                Action::ReleaseWriterClaim { namespace, uid, .. },
                Action::CreateWriterView(vpv, vclaim),
                Action::CreateJob(job),
            ] => {
                assert_eq!(
                    (namespace.as_str(), uid.as_str()),
                    ("team-a", "old-writer-claim")
                );
                assert_eq!(vclaim.metadata.namespace.as_deref(), Some("team-b"));
                assert_eq!(
                    vpv.metadata.name.as_deref(),
                    Some(view::writer_view_pv_name_in(&b, "team-b").as_str())
                );
                assert_eq!(job.metadata.namespace.as_deref(), Some("team-b"));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            condition(&s, PROGRESSING)
                .message
                .contains("takes the download over")
        );

        // Within the grace period: waiting, with a recheck at its end, no Job.
        let fresh = crate::lease::writer_lease(
            &b,
            None,
            "team-a",
            Some("job-1"),
            warmcache_api_modelcache::v2beta1::WriterState::Gone,
            0,
            now().0,
            60,
        );
        let view_of = crate::lease::view(&b, Some(&fresh));
        let mut obs = observed(&b, &config);
        obs.writer = crate::lease::elect(&crate::lease::ElectionInput {
            binding: &b,
            lease: &view_of,
            holder_job: None,
            step_namespaces: &steps,
            now: now().0,
            grace_seconds: 60,
        });
        obs.primary_claim = Some(&claim);
        obs.primary_pv = Some(&pv);
        let s = step(&obs);
        assert!(s.actions.is_empty(), "{:?}", s.actions);
        assert_eq!(condition(&s, READY).reason, Reason::WaitingForTakeover);
        assert_eq!(
            s.recheck_at.map(|t| t.as_second()),
            Some(now().0.as_second() + 60)
        );
        assert_eq!(
            s.status.writer.as_ref().map(|w| w.namespace.as_str()),
            Some("team-a")
        );
    }

    #[test]
    fn the_job_views_and_completion_carry_the_readers_trace() {
        let mut b = binding(Transition::RwxReadOnly);
        let config = LifecycleConfig::default();
        let claim = bound_claim(&b);
        let pv = primary_pv();
        let tp_a = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let tp_b = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let mut obs = observed(&b, &config);
        obs.primary_claim = Some(&claim);
        obs.primary_pv = Some(&pv);
        obs.traceparents = BTreeMap::from([
            ("team-a".to_owned(), tp_a.to_owned()),
            ("team-b".to_owned(), tp_b.to_owned()),
        ]);
        obs.step = Some(StepSource {
            step: init_step(),
            pod_env: Vec::new(),
        });
        let s = step(&obs);
        let Some(Action::CreateJob(job)) = s.actions.last() else {
            panic!("{:?}", s.actions)
        };
        assert_eq!(
            job.metadata.annotations.as_ref().unwrap()[TRACE_PARENT_ANNOTATION],
            tp_a
        );
        // Completion continues the Job's trace.
        let mut done = job_with(&b, Some("Complete"));
        done.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(TRACE_PARENT_ANNOTATION.into(), tp_a.into());
        let mut obs2 = observed(&b, &config);
        obs2.primary_claim = Some(&claim);
        obs2.primary_pv = Some(&pv);
        obs2.job = Some(&done);
        let s = step(&obs2);
        let [Action::MarkComplete { annotations, .. }] = s.actions.as_slice() else {
            panic!("{:?}", s.actions)
        };
        assert_eq!(annotations[TRACE_PARENT_ANNOTATION], tp_a);
        // Each view continues the trace of its namespace's reader.
        let mut complete = pv.clone();
        let (labels, annotations) = completion_marks(&b, Some(1), "team-a");
        complete.metadata.labels = Some(labels);
        complete
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(annotations);
        b.status = Some(ModelCacheBindingStatus {
            realized: Some(RealizedStorage {
                views: vec![view::reader_view(&b, "team-b")],
                ..RealizedStorage::default()
            }),
            ..ModelCacheBindingStatus::default()
        });
        let mut obs3 = observed(&b, &config);
        obs3.primary_claim = Some(&claim);
        obs3.primary_pv = Some(&complete);
        obs3.traceparents = BTreeMap::from([("team-b".to_owned(), tp_b.to_owned())]);
        let s = step(&obs3);
        let [Action::CreateView(_, vclaim)] = s.actions.as_slice() else {
            panic!("{:?}", s.actions)
        };
        assert_eq!(
            vclaim.metadata.annotations.as_ref().unwrap()[TRACE_PARENT_ANNOTATION],
            tp_b
        );
    }

    #[test]
    fn a_primary_bound_to_a_pv_not_provisioned_for_it_is_never_written() {
        let b = binding(Transition::RwxReadOnly);
        let config = LifecycleConfig::default();
        let claim = bound_claim(&b);
        let ours = primary_pv();
        assert_eq!(provisioned_for(&b, &claim, &ours), Ok(()));
        let mut foreign = Vec::new();
        // A static PV of the class (no provisioner recorded), one of another provisioner, one
        // bound to another claim, one labelled for another binding or cache.
        let mut static_pv = ours.clone();
        static_pv.metadata.annotations = None;
        foreign.push((static_pv, "unset"));
        let mut other_provisioner = ours.clone();
        other_provisioner.metadata.annotations = Some(BTreeMap::from([(
            PROVISIONED_BY_ANNOTATION.to_owned(),
            "other.csi".to_owned(),
        )]));
        foreign.push((other_provisioner, "other.csi"));
        let mut other_claim = ours.clone();
        other_claim.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            uid: Some("someone-else".into()),
            ..ObjectReference::default()
        });
        foreign.push((other_claim, "someone-else"));
        let mut other_binding = ours.clone();
        other_binding.metadata.labels = Some(BTreeMap::from([(
            crate::volume_keys::BINDING_LABEL.to_owned(),
            "model-cache-other".to_owned(),
        )]));
        foreign.push((other_binding, "model-cache-other"));
        let mut other_cache = ours.clone();
        other_cache.metadata.labels = Some(BTreeMap::from([(
            crate::keys::MODEL_LABEL.to_owned(),
            "0123".to_owned(),
        )]));
        foreign.push((other_cache, "0123"));
        let done = job_with(&b, Some("Complete"));
        for (pv, why) in &foreign {
            let e = provisioned_for(&b, &claim, pv).unwrap_err();
            assert!(e.contains("pvc-primary") && e.contains(why), "{e}");
            // Not with a step (no writer view or Job), not with a succeeded Job (no completion
            // labels or Retain), not when it even carries this cache's completion labels.
            let mut complete = pv.clone();
            let (labels, annotations) = completion_marks(&b, Some(1), "team-a");
            if *why != "0123" && *why != "model-cache-other" {
                complete
                    .metadata
                    .labels
                    .get_or_insert_with(BTreeMap::new)
                    .extend(labels);
            }
            complete
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .extend(annotations);
            complete
                .spec
                .as_mut()
                .unwrap()
                .persistent_volume_reclaim_policy = Some(view::RETAIN.into());
            for (pv, job) in [(pv, None), (pv, Some(&done)), (&complete, None)] {
                let mut obs = observed(&b, &config);
                obs.primary_claim = Some(&claim);
                obs.primary_pv = Some(pv);
                obs.job = job;
                obs.reader_namespaces = BTreeSet::from(["team-a".to_owned()]);
                obs.step = Some(StepSource {
                    step: init_step(),
                    pod_env: Vec::new(),
                });
                let s = step(&obs);
                assert!(s.actions.is_empty(), "{why}: {:?}", s.actions);
                let d = condition(&s, DEGRADED);
                assert!(d.status);
                assert_eq!(d.reason, Reason::ForeignObject);
                assert!(d.message.contains("pvc-primary"), "{}", d.message);
                assert!(!condition(&s, READY).status);
                let realized = s.status.realized.clone().unwrap_or_default();
                assert_eq!(realized.bound_persistent_volume_name, None);
                assert!(realized.views.is_empty());
            }
        }
        // A warm start adopts only a retained primary its provisioner recorded.
        let mut retained = retained_pv(&b, "Released");
        assert!(adoptable(&b, &[&retained]).is_some());
        retained
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .remove(PROVISIONED_BY_ANNOTATION);
        assert!(adoptable(&b, &[&retained]).is_none());
    }

    #[test]
    fn a_foreign_job_is_never_adopted() {
        let b = binding(Transition::RwxReadOnly);
        let config = LifecycleConfig::default();
        let claim = bound_claim(&b);
        let pv = primary_pv();
        let mut job = job_with(&b, Some("Complete"));
        job.metadata.annotations.as_mut().unwrap().insert(
            crate::volume_keys::BINDING_UID_LABEL_ANNOTATION.into(),
            "someone-else".into(),
        );
        let mut obs = observed(&b, &config);
        obs.primary_claim = Some(&claim);
        obs.primary_pv = Some(&pv);
        obs.job = Some(&job);
        let s = step(&obs);
        assert!(s.actions.is_empty());
        assert_eq!(condition(&s, DEGRADED).reason, Reason::ForeignObject);
    }

    #[test]
    fn a_foreign_object_stops_every_write_but_the_status() {
        let b = binding(Transition::RwxReadOnly);
        let config = LifecycleConfig::default();
        let mut obs = observed(&b, &config);
        obs.seen_references = vec![reference("team-a", "vllm", "w-1")];
        obs.foreign = Some("PersistentVolumeClaim team-a/ro-pvc-x".into());
        let s = step(&obs);
        assert!(s.actions.is_empty());
        assert_eq!(
            s.status.request_references.len(),
            1,
            "references are still kept"
        );
        let d = condition(&s, DEGRADED);
        assert!(d.status && d.reason == Reason::ForeignObject);
        assert!(d.message.contains("team-a/ro-pvc-x"));
    }

    fn retained_pv(b: &ModelCacheBinding, phase: &str) -> PersistentVolume {
        let mut pv = primary_pv();
        pv.metadata.name = Some("pvc-old".into());
        let (labels, annotations) = completion_marks(b, Some(1 << 30), "team-a");
        pv.metadata.labels = Some(labels);
        pv.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(annotations);
        pv.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            namespace: b.metadata.namespace.clone(),
            name: Some(writer_pvc_name(&b.spec.identity)),
            uid: Some("old-claim-uid".into()),
            ..ObjectReference::default()
        });
        pv.status = Some(k8s_openapi::api::core::v1::PersistentVolumeStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        pv
    }

    #[test]
    fn a_retained_complete_primary_is_adopted_instead_of_downloading() {
        let b = binding(Transition::RwxReadOnly);
        let config = LifecycleConfig::default();
        let old = retained_pv(&b, "Released");
        let mut obs = observed(&b, &config);
        obs.retained = vec![&old];
        obs.step = Some(StepSource {
            step: init_step(),
            pod_env: Vec::new(),
        });
        let s = step(&obs);
        match s.actions.as_slice() {
            [
                Action::AdoptPrimary {
                    pv,
                    resource_version,
                },
                Action::CreatePrimaryClaim(claim),
            ] => {
                assert_eq!(pv, "pvc-old");
                assert_eq!(resource_version, "5");
                let spec = claim.spec.as_ref().unwrap();
                assert_eq!(spec.volume_name.as_deref(), Some("pvc-old"));
                assert_eq!(
                    spec.resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"].0,
                    "100Gi"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(condition(&s, PROGRESSING).reason, Reason::AdoptingRetained);

        // Not adoptable: still bound elsewhere, another cache, a view, another driver, not
        // retained.
        let bound = retained_pv(&b, "Bound");
        let mut other_cache = retained_pv(&b, "Released");
        other_cache
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(HANDLE_DIGEST_ANNOTATION.into(), "sha256:x".into());
        let mut view_pv = retained_pv(&b, "Released");
        view_pv
            .spec
            .as_mut()
            .unwrap()
            .csi
            .as_mut()
            .unwrap()
            .read_only = Some(true);
        let mut other_driver = retained_pv(&b, "Released");
        other_driver
            .spec
            .as_mut()
            .unwrap()
            .csi
            .as_mut()
            .unwrap()
            .driver = "other.csi".into();
        let mut deleting = retained_pv(&b, "Released");
        deleting
            .spec
            .as_mut()
            .unwrap()
            .persistent_volume_reclaim_policy = Some("Delete".into());
        let mut elsewhere = retained_pv(&b, "Released");
        elsewhere
            .spec
            .as_mut()
            .unwrap()
            .claim_ref
            .as_mut()
            .unwrap()
            .namespace = Some("team-z".into());
        for pv in [
            &bound,
            &other_cache,
            &view_pv,
            &other_driver,
            &deleting,
            &elsewhere,
        ] {
            assert!(adoptable(&b, &[pv]).is_none(), "{:?}", pv.metadata);
            obs.retained = vec![pv];
            assert!(
                matches!(step(&obs).actions.as_slice(), [Action::CreatePrimaryClaim(c)] if c.spec.as_ref().unwrap().volume_name.is_none())
            );
        }
    }

    fn staging_pod(download: (i32, &str), hold: Option<(i32, &str)>) -> Pod {
        let terminated = |name: &str, (exit, message): (i32, &str)| ContainerStatus {
            name: name.into(),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: exit,
                    message: Some(message.into()),
                    ..ContainerStateTerminated::default()
                }),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        };
        Pod {
            status: Some(PodStatus {
                init_container_statuses: Some(vec![terminated(WRITER_CONTAINER, download)]),
                container_statuses: hold.map(|h| vec![terminated(writer::HOLD_CONTAINER, h)]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    fn copied(mut claim: PersistentVolumeClaim, bytes: &str) -> PersistentVolumeClaim {
        claim
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend([
                (COPIED_BYTES_ANNOTATION.to_owned(), bytes.to_owned()),
                (MANIFEST_DIGEST_ANNOTATION.to_owned(), "ab".repeat(32)),
                (SOURCE_NAMESPACE_LABEL.to_owned(), "team-a".to_owned()),
            ]);
        claim
    }

    /// The commit a block download resolved: recorded on the complete primary PV once the
    /// staging Job has completed (only from its own pods), and the status (of this binding, or
    /// of a later one adopting the retained PV) takes it from the PV.
    #[test]
    fn the_resolved_commit_goes_onto_the_block_primary_and_into_the_status() {
        let config = LifecycleConfig::default();
        let b = binding(Transition::RoxReadOnly);
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let complete = released_complete(&b);
        let mut job = job_with(&b, Some("Complete"));
        job.metadata.uid = Some("staging-uid".into());
        let message = format!("42 revision={sha}");
        let mut staged = staging_pod((0, &message), Some((0, "")));
        staged.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                uid: "staging-uid".into(),
                kind: "Job".into(),
                ..Default::default()
            },
        ]);
        let mut o = observed(&b, &config);
        o.retained = vec![&complete];
        o.job = Some(&job);
        o.job_pods = vec![&staged];
        let s = step(&o);
        assert!(condition(&s, READY).status);
        assert_eq!(s.status.resolved_revision.as_deref(), Some(sha));
        assert!(
            s.actions.contains(&Action::RecordRevision {
                pv: "pvc-primary".into(),
                revision: sha.into(),
            }),
            "{:?}",
            s.actions
        );
        // Recorded on the PV: no action; a later binding adopting it (no Job) reads it there.
        let mut recorded = complete.clone();
        recorded
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(REVISION_ANNOTATION.into(), sha.into());
        o.retained = vec![&recorded];
        let s = step(&o);
        assert!(
            !s.actions
                .iter()
                .any(|a| matches!(a, Action::RecordRevision { .. }))
        );
        let mut later = observed(&b, &config);
        later.retained = vec![&recorded];
        assert_eq!(step(&later).status.resolved_revision.as_deref(), Some(sha));
    }

    /// An encrypted block cache: the key Secret and the encrypted class come before the staging
    /// Job, derived only from the StorageClass the decision recorded; a foreign Secret or class
    /// stops everything; a key that is gone is never recreated once a primary exists; the
    /// encrypted flow on ReadWriteMany, or a binding naming other objects, creates nothing.
    #[test]
    fn an_encrypted_block_cache_gets_its_key_and_class_before_the_staging_job() {
        use crate::encryption::{self, EncryptionNames};
        use k8s_openapi::api::storage::v1::StorageClass;

        let config = LifecycleConfig::default();
        let mut b = binding(Transition::RoxReadOnly);
        b.spec.decision.encryption_required = true;
        let hash = identity_hash(&b.spec.identity);
        b.spec.resources.secret_names = vec![hash.clone()];
        b.spec.resources.storage_class_names = vec![format!("{hash}-sc")];
        let base = StorageClass {
            metadata: ObjectMeta {
                name: Some("nvcf-sc".into()),
                uid: Some(b.spec.storage_class.uid.clone()),
                ..ObjectMeta::default()
            },
            provisioner: b.spec.decision.provisioner.clone(),
            reclaim_policy: Some("Retain".into()),
            ..StorageClass::default()
        };
        b.spec.storage_class.configuration_digest = warmcache_catalog::storage_class_digest(&base);
        let names = EncryptionNames {
            secret: hash.clone(),
            namespace: "nvca-modelcache-init".into(),
            class: format!("{hash}-sc"),
        };

        let mut o = observed(&b, &config);
        o.step = Some(StepSource {
            step: init_step(),
            pod_env: Vec::new(),
        });
        o.encryption.base_class = Some(&base);
        let s = step(&o);
        let [
            Action::CreateKeySecret(n),
            Action::CreateEncryptedClass(class),
            Action::CreateJob(_),
        ] = &s.actions[..]
        else {
            panic!("{:?}", s.actions);
        };
        assert_eq!(n, &names);
        assert_eq!(
            **class,
            encryption::encrypted_class(&b, &names, Some(&base)).unwrap()
        );
        assert_eq!(condition(&s, PROGRESSING).reason, Reason::StartingDownload);

        // Both exist (as created): only the Job.
        let secret = encryption::key_secret(
            &b,
            &names,
            &encryption::EncryptionKey::from_bytes([7; encryption::KEY_BYTES]),
        );
        o.encryption = EncryptionObserved {
            secret: Some(&secret.metadata),
            class: Some(class),
            base_class: None,
        };
        let s = step(&o);
        assert!(
            matches!(&s.actions[..], [Action::CreateJob(_)]),
            "{:?}",
            s.actions
        );

        // The class is derived only from the StorageClass the decision was taken on.
        let mut recreated = base.clone();
        recreated.metadata.uid = Some("another".into());
        o.encryption = EncryptionObserved {
            secret: Some(&secret.metadata),
            class: None,
            base_class: Some(&recreated),
        };
        let s = step(&o);
        assert!(s.actions.is_empty(), "{:?}", s.actions);
        assert_eq!(
            condition(&s, DEGRADED).reason,
            Reason::EncryptionClassUnavailable
        );
        o.encryption.base_class = None;
        assert_eq!(
            condition(&step(&o), DEGRADED).reason,
            Reason::EncryptionClassUnavailable
        );

        // A Secret under the key's name that is not warmcache's: nothing is created.
        let mut foreign = secret.metadata.clone();
        foreign.labels = None;
        o.encryption = EncryptionObserved {
            secret: Some(&foreign),
            class: Some(class),
            base_class: None,
        };
        let s = step(&o);
        assert!(s.actions.is_empty(), "{:?}", s.actions);
        assert_eq!(condition(&s, DEGRADED).reason, Reason::ForeignObject);
        assert!(
            condition(&s, DEGRADED)
                .message
                .contains(&format!("Secret nvca-modelcache-init/{hash}"))
        );

        // The agent's primary claim exists and the key is gone: never a new key.
        let claim = bound_claim(&b);
        assert_eq!(
            claim.spec.as_ref().unwrap().storage_class_name.as_deref(),
            Some(names.class.as_str())
        );
        let staging = job_with(&b, None);
        o.job = Some(&staging);
        o.primary_claim = Some(&claim);
        o.encryption = EncryptionObserved {
            secret: None,
            class: Some(class),
            base_class: None,
        };
        let s = step(&o);
        assert!(s.actions.is_empty(), "{:?}", s.actions);
        assert_eq!(condition(&s, DEGRADED).reason, Reason::EncryptionKeyMissing);

        // Staging without a claim yet: a class deleted meanwhile is created again.
        o.primary_claim = None;
        o.encryption = EncryptionObserved {
            secret: Some(&secret.metadata),
            class: None,
            base_class: Some(&base),
        };
        let s = step(&o);
        assert!(
            matches!(&s.actions[..], [Action::CreateEncryptedClass(_)]),
            "{:?}",
            s.actions
        );
        assert_eq!(condition(&s, READY).reason, Reason::Staging);

        // Complete and retained, the key gone: not Ready (readers could not open it), no view,
        // Degraded says so, and no key is created.
        let mut complete = released_complete(&b);
        complete.spec.as_mut().unwrap().storage_class_name = Some(names.class.clone());
        o.job = None;
        o.retained = vec![&complete];
        o.encryption = EncryptionObserved {
            secret: None,
            class: Some(class),
            base_class: None,
        };
        o.reader_namespaces = BTreeSet::from(["team-b".to_owned()]);
        let s = step(&o);
        assert!(!condition(&s, READY).status, "{:?}", s.conditions);
        assert_eq!(condition(&s, DEGRADED).reason, Reason::EncryptionKeyMissing);
        assert!(s.actions.is_empty(), "{:?}", s.actions);
        assert!(s.status.realized.as_ref().unwrap().views.is_empty());

        // A binding that names other objects, or encryption on ReadWriteMany: nothing.
        let mut other = b.clone();
        other.spec.resources.secret_names = vec!["registry-credentials".into()];
        let mut o2 = observed(&other, &config);
        o2.step = o.step.clone();
        let s = step(&o2);
        assert!(s.actions.is_empty(), "{:?}", s.actions);
        assert_eq!(condition(&s, DEGRADED).reason, Reason::InvalidEncryption);
        let mut rwx = binding(Transition::RwxReadOnly);
        rwx.spec.decision.encryption_required = true;
        let mut o3 = observed(&rwx, &config);
        o3.step = o.step.clone();
        let s = step(&o3);
        assert!(s.actions.is_empty(), "{:?}", s.actions);
        assert_eq!(condition(&s, DEGRADED).reason, Reason::InvalidEncryption);
    }

    /// The block flow from the first reading pod to its view: the staging Job (no claim: the
    /// agent sizes it), staging, the agent's copy, completion from the bytes it recorded, the
    /// primary claim released after completion is observed, the detach gate, then views.
    #[test]
    fn the_block_flow_stages_copies_completes_releases_then_views_after_detach() {
        let config = LifecycleConfig::default();
        let b = binding(Transition::RoxReadOnly);

        // A reading pod's step: the staging Job, and nothing else.
        let mut o = observed(&b, &config);
        o.step = Some(StepSource {
            step: init_step(),
            pod_env: Vec::new(),
        });
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        o.traceparents = BTreeMap::from([("team-a".to_owned(), tp.to_owned())]);
        let s = step(&o);
        let [Action::CreateJob(job)] = &s.actions[..] else {
            panic!("{:?}", s.actions);
        };
        let pod_meta = job
            .spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .as_ref()
            .unwrap();
        assert_eq!(
            pod_meta.annotations.as_ref().unwrap()[TRACE_PARENT_ANNOTATION],
            tp,
            "the staging pod carries the reader's trace to the node agent"
        );
        let template = &job.spec.as_ref().unwrap().template;
        assert!(
            template
                .metadata
                .as_ref()
                .unwrap()
                .labels
                .as_ref()
                .unwrap()
                .contains_key(writer::STAGING_LABEL)
        );
        assert_eq!(condition(&s, PROGRESSING).reason, Reason::StartingDownload);
        assert!(condition(&s, PROGRESSING).message.contains("staging Job"));

        // Staging: the Job runs, no claim yet.
        let running = job_with(&b, None);
        o.job = Some(&running);
        let s = step(&o);
        assert!(s.actions.is_empty(), "{:?}", s.actions);
        assert_eq!(condition(&s, READY).reason, Reason::Staging);
        assert_eq!(population(&s), Some(PopulationState::Populating));

        // The agent created and is filling the primary claim.
        let claim = bound_claim(&b);
        let pv = primary_pv();
        o.primary_claim = Some(&claim);
        o.primary_pv = Some(&pv);
        let s = step(&o);
        assert!(s.actions.is_empty(), "{:?}", s.actions);
        assert_eq!(condition(&s, READY).reason, Reason::Copying);

        // A bad record is not a copy.
        let garbage = copied(bound_claim(&b), "12 GiB");
        o.primary_claim = Some(&garbage);
        assert_eq!(condition(&step(&o), READY).reason, Reason::Copying);

        // The agent recorded its copy: the PV is labelled complete with those bytes.
        let done = copied(bound_claim(&b), "123456789");
        o.primary_claim = Some(&done);
        let s = step(&o);
        let [
            Action::MarkComplete {
                pv: name,
                labels,
                annotations,
            },
        ] = &s.actions[..]
        else {
            panic!("{:?}", s.actions);
        };
        assert_eq!(Some(name), pv.metadata.name.as_ref());
        assert_eq!(labels.get(COMPLETE_LABEL).map(String::as_str), Some("true"));
        assert_eq!(
            labels.get(SOURCE_NAMESPACE_LABEL).map(String::as_str),
            Some("team-a")
        );
        assert_eq!(
            annotations.get(BYTES_ANNOTATION).map(String::as_str),
            Some("123456789")
        );
        assert_eq!(
            annotations.get(MANIFEST_DIGEST_ANNOTATION),
            Some(&"ab".repeat(32))
        );
        assert_eq!(condition(&s, READY).reason, Reason::Completing);

        // Completion observed on the PV: Ready, and the primary claim is released (UID).
        let mut complete = pv.clone();
        let (l, a) = completion_marks(&b, Some(123_456_789), "team-a");
        complete.metadata.labels = Some(l);
        complete
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(a);
        complete
            .spec
            .as_mut()
            .unwrap()
            .persistent_volume_reclaim_policy = Some("Retain".into());
        o.primary_pv = Some(&complete);
        o.reader_namespaces = BTreeSet::from(["team-b".to_owned()]);
        let s = step(&o);
        assert_eq!(
            s.actions,
            vec![Action::ReleasePrimaryClaim {
                name: writer_pvc_name(&b.spec.identity),
                uid: "primary-claim-uid".into(),
            }]
        );
        assert!(condition(&s, READY).status);
        assert_eq!(condition(&s, PROGRESSING).reason, Reason::ReleasingPrimary);
        assert_eq!(population(&s), Some(PopulationState::Ready));

        // Released, but kept by pvc-protection: a pod still mounts it. No second delete;
        // Progressing names the pod, and past the grace period Degraded says so too. Nothing
        // is deleted.
        let mut held = done.clone();
        let deleted_at = now();
        held.metadata.deletion_timestamp = Some(deleted_at.clone());
        held.metadata.finalizers = Some(vec!["kubernetes.io/pvc-protection".into()]);
        o.primary_claim = Some(&held);
        o.primary_claim_holders = vec!["nvca-modelcache-init/holder-0".into()];
        let s = step(&o);
        assert!(s.actions.is_empty(), "{:?}", s.actions);
        let progressing = condition(&s, PROGRESSING);
        assert_eq!(progressing.reason, Reason::ReleasingPrimary);
        assert!(
            progressing
                .message
                .contains("nvca-modelcache-init/holder-0")
                && progressing.message.contains("kubernetes.io/pvc-protection"),
            "{}",
            progressing.message
        );
        assert!(!condition(&s, DEGRADED).status);
        let grace = config.primary_release_grace_seconds;
        assert_eq!(
            s.recheck_at.map(|t| t.as_second()),
            Some(deleted_at.0.as_second() + grace),
            "looked at again when the grace period ends"
        );
        o.now = Time(Timestamp::from_second(deleted_at.0.as_second() + grace).unwrap());
        let s = step(&o);
        assert!(s.actions.is_empty(), "{:?}", s.actions);
        let degraded = condition(&s, DEGRADED);
        assert!(degraded.status);
        assert_eq!(degraded.reason, Reason::PrimaryClaimHeld);
        assert!(degraded.message.contains("nvca-modelcache-init/holder-0"));
        assert!(
            condition(&s, READY).status,
            "still Ready: the copy is complete"
        );
        assert_eq!(condition(&s, PROGRESSING).reason, Reason::ReleasingPrimary);
        o.now = now();
        o.primary_claim = Some(&done);
        o.primary_claim_holders.clear();

        // The claim is gone, the PV Released; still attached: no view yet.
        let mut released = complete.clone();
        released.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            namespace: b.metadata.namespace.clone(),
            name: Some(writer_pvc_name(&b.spec.identity)),
            uid: Some("primary-claim-uid".into()),
            ..ObjectReference::default()
        });
        released.status = Some(k8s_openapi::api::core::v1::PersistentVolumeStatus {
            phase: Some("Released".into()),
            ..Default::default()
        });
        o.primary_claim = None;
        o.primary_pv = None;
        o.job = None;
        o.step = None;
        o.retained = vec![&released];
        o.attachments = BTreeMap::from([("pvc-primary".to_owned(), vec!["csi-0123".to_owned()])]);
        let s = step(&o);
        assert!(s.actions.is_empty(), "{:?}", s.actions);
        assert_eq!(condition(&s, PROGRESSING).reason, Reason::WaitingForDetach);
        assert!(condition(&s, PROGRESSING).message.contains("csi-0123"));
        assert!(condition(&s, READY).status);

        // Detached: the view is recorded, then (once stored) created read-only from the PV.
        o.attachments.clear();
        let s = step(&o);
        assert!(s.actions.is_empty(), "recorded first: {:?}", s.actions);
        let recorded = s.status.clone();
        let mut stored = b.clone();
        stored.status = Some(recorded);
        let mut o2 = observed(&stored, &config);
        o2.retained = vec![&released];
        o2.reader_namespaces = BTreeSet::from(["team-b".to_owned()]);
        let s = step(&o2);
        let [Action::CreateView(view_pv, view_claim)] = &s.actions[..] else {
            panic!("{:?}", s.actions);
        };
        let csi = view_pv.spec.as_ref().unwrap().csi.as_ref().unwrap();
        assert_eq!(csi.read_only, Some(true));
        assert_eq!(view_claim.metadata.namespace.as_deref(), Some("team-b"));
        assert_eq!(s.status.realized.as_ref().unwrap().bytes, Some(123_456_789));
    }

    /// The agent gave up (its words in the hold's termination message): the Job fails, the
    /// failure record carries the words, waiting readers are deleted; no retry while it holds.
    #[test]
    fn a_copy_the_agent_gave_up_on_fails_the_binding_with_its_words() {
        let config = LifecycleConfig::default();
        let b = binding(Transition::RoxReadOnly);
        let mut o = observed(&b, &config);
        let job = job_with(&b, Some("Failed"));
        let pod = staging_pod(
            (0, "5000"),
            Some((
                42,
                "nvsnap: the node agent could not copy the staged download: no space left on device",
            )),
        );
        o.job = Some(&job);
        o.job_pods = vec![&pod];
        o.reader_namespaces = BTreeSet::from(["team-b".to_owned()]);
        let s = step(&o);
        assert_eq!(population(&s), Some(PopulationState::Failed));
        let record = s.status.failure_record.as_ref().unwrap();
        assert!(
            record.message.contains("no space left on device"),
            "{}",
            record.message
        );
        assert_eq!(
            s.actions,
            vec![Action::DeleteWaitingReaders {
                namespaces: vec!["team-b".into()]
            }]
        );
        // A failed download itself speaks through the download init container.
        let failed = staging_pod((1, "nvsnap: download exited 3: HTTP 401"), None);
        assert_eq!(
            last_words(&job, &[&failed]),
            "nvsnap: download exited 3: HTTP 401"
        );
    }

    /// The block flow never writes to, labels or views a primary PV not provisioned for its
    /// claim, and never views a PV that is not complete.
    #[test]
    fn the_block_flow_never_labels_a_foreign_pv() {
        let config = LifecycleConfig::default();
        let b = binding(Transition::RoxReadOnly);
        let mut o = observed(&b, &config);
        let claim = copied(bound_claim(&b), "100");
        let mut foreign = primary_pv();
        foreign.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            uid: Some("someone-else".into()),
            ..ObjectReference::default()
        });
        o.primary_claim = Some(&claim);
        o.primary_pv = Some(&foreign);
        let s = step(&o);
        assert!(s.actions.is_empty(), "{:?}", s.actions);
        assert_eq!(condition(&s, DEGRADED).reason, Reason::ForeignObject);
        // A Released PV that is not complete is not a primary to view.
        let mut incomplete = retained_pv(&b, "Released");
        incomplete.metadata.labels = None;
        let mut o = observed(&b, &config);
        o.retained = vec![&incomplete];
        o.reader_namespaces = BTreeSet::from(["team-b".to_owned()]);
        let s = step(&o);
        assert!(
            s.actions
                .iter()
                .all(|a| !matches!(a, Action::CreateView(..)))
        );
        assert!(!condition(&s, READY).status);
    }

    /// The reconcile that sees the released primary claim gone may still read its PV `Bound`
    /// (the PV controller records Released a moment later): the copy stays complete (Ready, no
    /// regression to Staging, no second staging Job although the Job is gone and a reading
    /// pod's step is there), the detach gate holds, and views follow. A warm start (RWX) still
    /// adopts only a free PV, and a PV bound to another claim is never a released primary.
    #[test]
    fn a_released_primary_not_yet_marked_released_stays_ready_and_starts_no_download() {
        let config = LifecycleConfig::default();
        let b = binding(Transition::RoxReadOnly);
        let still_bound = retained_pv(&b, "Bound");
        let mut o = observed(&b, &config);
        o.retained = vec![&still_bound];
        o.step = Some(StepSource {
            step: init_step(),
            pod_env: Vec::new(),
        });
        o.reader_namespaces = BTreeSet::from(["team-a".to_owned(), "team-b".to_owned()]);
        o.attachments = BTreeMap::from([("pvc-old".to_owned(), vec!["csi-0123".to_owned()])]);
        let s = step(&o);
        assert!(s.actions.is_empty(), "{:?}", s.actions);
        assert!(condition(&s, READY).status);
        assert_eq!(condition(&s, READY).reason, Reason::Downloaded);
        assert_eq!(condition(&s, PROGRESSING).reason, Reason::WaitingForDetach);
        assert_eq!(population(&s), Some(PopulationState::Ready));
        assert_eq!(s.status.realized.as_ref().unwrap().bytes, Some(1 << 30));

        // The staging Job, complete, still there: the same (not "Staging").
        let job = job_with(&b, Some("Complete"));
        o.job = Some(&job);
        assert_eq!(condition(&step(&o), READY).reason, Reason::Downloaded);
        o.job = None;

        // Detached: the views are recorded, then created from it.
        o.attachments.clear();
        let s = step(&o);
        assert!(s.actions.is_empty(), "recorded first: {:?}", s.actions);
        let mut stored = b.clone();
        stored.status = Some(s.status.clone());
        let mut o2 = observed(&stored, &config);
        o2.retained = vec![&still_bound];
        o2.reader_namespaces = o.reader_namespaces.clone();
        let s = step(&o2);
        assert_eq!(
            s.actions
                .iter()
                .filter(|a| matches!(a, Action::CreateView(..)))
                .count(),
            2,
            "{:?}",
            s.actions
        );

        // Not for a warm start of the RWX flow (adoption needs the PV free), and never a PV
        // bound to a claim of another name.
        assert!(adoptable(&b, &[&still_bound]).is_none());
        let mut other = still_bound.clone();
        other
            .spec
            .as_mut()
            .unwrap()
            .claim_ref
            .as_mut()
            .unwrap()
            .name = Some("someone".into());
        let mut o = observed(&b, &config);
        o.retained = vec![&other];
        o.step = Some(StepSource {
            step: init_step(),
            pod_env: Vec::new(),
        });
        let s = step(&o);
        assert!(!condition(&s, READY).status);
        assert!(matches!(s.actions.as_slice(), [Action::CreateJob(_)]));
    }

    #[test]
    fn retiring_bindings_create_nothing() {
        let mut b = binding(Transition::RwxReadOnly);
        b.status = Some(ModelCacheBindingStatus {
            phase: Some(BindingPhase::Retiring),
            request_references: vec![reference("a", "x", "1")],
            ..ModelCacheBindingStatus::default()
        });
        let config = LifecycleConfig::default();
        let mut obs = observed(&b, &config);
        obs.seen_references = vec![reference("b", "y", "2")];
        let s = step(&obs);
        assert!(s.actions.is_empty());
        assert_eq!(s.status.phase, Some(BindingPhase::Retiring));
        assert_eq!(s.status.request_references.len(), 1);
        assert_eq!(condition(&s, PROGRESSING).reason, Reason::Retiring);
    }

    #[test]
    fn last_words_fall_back_to_the_exit_code_and_job_message() {
        let b = binding(Transition::RwxReadOnly);
        let mut job = job_with(&b, Some("Failed"));
        let silent = pod_terminated(137, " ");
        assert_eq!(last_words(&job, &[&silent]), "exit code 137");
        job.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].reason =
            Some("DeadlineExceeded".into());
        assert!(last_words(&job, &[]).starts_with("DeadlineExceeded"));
        assert_eq!(measured_bytes(&[&silent]), None);
        assert_eq!(measured_bytes(&[&pod_terminated(0, "42\n")]), Some(42));
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let b = binding(Transition::RwxReadOnly);
        let mut done = job_with(&b, Some("Complete"));
        done.metadata.uid = Some("job-uid-1".into());
        let owned = |mut p: Pod, uid: &str| {
            p.metadata.owner_references = Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    uid: uid.into(),
                    kind: "Job".into(),
                    ..Default::default()
                },
            ]);
            p
        };
        let pinned = owned(
            pod_terminated(0, &format!("42 revision={sha}\n")),
            "job-uid-1",
        );
        assert_eq!(measured_bytes(&[&pinned]), Some(42));
        assert_eq!(resolved_revision(&done, &[&pinned]).as_deref(), Some(sha));
        let plain = owned(pod_terminated(0, "42"), "job-uid-1");
        assert_eq!(resolved_revision(&done, &[&plain]), None);
        let failed_writer = owned(
            pod_terminated(1, &format!("42 revision={sha}")),
            "job-uid-1",
        );
        assert_eq!(
            resolved_revision(&done, &[&failed_writer]),
            None,
            "only a writer that exited 0"
        );
        let earlier = owned(
            pod_terminated(0, &format!("42 revision={sha}")),
            "job-uid-0",
        );
        assert_eq!(
            resolved_revision(&done, &[&earlier]),
            None,
            "only the pods of this Job (by UID)"
        );
        let mut failed = job_with(&b, Some("Failed"));
        failed.metadata.uid = Some("job-uid-1".into());
        assert_eq!(
            resolved_revision(&failed, &[&pinned]),
            None,
            "a failed Job's download never names the copy (its copy may have failed)"
        );
    }

    /// `claim` as the node agent leaves it when it is elected to capture pod team-b/engine-0.
    fn elected_for_capture(mut claim: PersistentVolumeClaim) -> PersistentVolumeClaim {
        claim
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend([
                (
                    COPY_SOURCE_ANNOTATION.to_owned(),
                    COPY_SOURCE_CAPTURE.to_owned(),
                ),
                (
                    crate::agent::COPY_POD_ANNOTATION.to_owned(),
                    "pod-uid".to_owned(),
                ),
                (
                    crate::agent::COPY_POD_NAME_ANNOTATION.to_owned(),
                    "engine-0".to_owned(),
                ),
                (SOURCE_NAMESPACE_LABEL.to_owned(), "team-b".to_owned()),
                (COPY_NODE_ANNOTATION.to_owned(), "node-1".to_owned()),
            ]);
        claim
    }

    fn gave_up(mut claim: PersistentVolumeClaim) -> PersistentVolumeClaim {
        claim
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(
                COPY_FAILED_ANNOTATION.to_owned(),
                "the copy into claim x failed 3 times".to_owned(),
            );
        claim
    }

    #[test]
    fn capture_sources_wait_then_a_capture_completes_the_shared_filesystem_primary() {
        let config = LifecycleConfig::default();
        let b = binding(Transition::RwxReadOnly);
        let claim = bound_claim(&b);
        let pv = primary_pv();
        let mut o = observed(&b, &config);
        o.primary_claim = Some(&claim);
        o.primary_pv = Some(&pv);
        o.capture_sources = vec!["team-b/engine-0".into(), "team-b/engine-1".into()];
        // Capture sources download on their own: nothing to start.
        let s = step(&o);
        assert_eq!(condition(&s, READY).reason, Reason::WaitingForCapture);
        assert!(
            condition(&s, READY).message.contains("team-b/engine-0"),
            "{}",
            condition(&s, READY).message
        );
        assert!(
            !s.actions
                .iter()
                .any(|a| matches!(a, Action::CreateJob(_) | Action::CreateWriterView(..))),
            "{:?}",
            s.actions
        );

        // Elected: capturing. Even a step that appeared meanwhile starts no second writer.
        let capturing = elected_for_capture(bound_claim(&b));
        o.primary_claim = Some(&capturing);
        o.step = Some(StepSource {
            step: init_step(),
            pod_env: Vec::new(),
        });
        let s = step(&o);
        assert_eq!(condition(&s, READY).reason, Reason::Capturing);
        assert!(condition(&s, READY).message.contains("node-1"));
        assert!(
            !s.actions
                .iter()
                .any(|a| matches!(a, Action::CreateJob(_) | Action::CreateWriterView(..))),
            "{:?}",
            s.actions
        );
        assert_eq!(population(&s), Some(PopulationState::Populating));

        // The copy is recorded: the PV is labelled complete, from the capture's namespace.
        let done = copied(elected_for_capture(bound_claim(&b)), "987654");
        o.primary_claim = Some(&done);
        let s = step(&o);
        let [
            Action::MarkComplete {
                pv: name,
                labels,
                annotations,
            },
        ] = &s.actions[..]
        else {
            panic!("{:?}", s.actions);
        };
        assert_eq!(Some(name), pv.metadata.name.as_ref());
        assert_eq!(labels.get(COMPLETE_LABEL).map(String::as_str), Some("true"));
        assert_eq!(
            annotations.get(BYTES_ANNOTATION).map(String::as_str),
            Some("987654")
        );
        assert!(annotations.contains_key(MANIFEST_DIGEST_ANNOTATION));
        assert_eq!(condition(&s, READY).reason, Reason::Completing);

        // Once the PV is complete, the ordinary completion takes over: Ready.
        let mut complete = primary_pv();
        let (l, a) = completion_marks(&b, Some(987_654), "team-a");
        complete.metadata.labels = Some(l);
        complete
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(a);
        o.primary_pv = Some(&complete);
        let s = step(&o);
        assert!(condition(&s, READY).status);
        assert_eq!(population(&s), Some(PopulationState::Ready));
    }

    #[test]
    fn a_capture_the_agent_gave_up_on_fails_the_binding_and_releases_its_claim() {
        let config = LifecycleConfig::default();
        for transition in [Transition::RwxReadOnly, Transition::RoxReadOnly] {
            let b = binding(transition);
            let claim = gave_up(elected_for_capture(bound_claim(&b)));
            let pv = primary_pv();
            let mut o = observed(&b, &config);
            o.primary_claim = Some(&claim);
            o.primary_pv = Some(&pv);
            o.reader_namespaces = BTreeSet::from(["team-b".to_owned()]);
            let s = step(&o);
            assert_eq!(
                population(&s),
                Some(PopulationState::Failed),
                "{transition:?}"
            );
            let record = s.status.failure_record.clone().unwrap();
            assert!(
                record.message.contains("failed 3 times"),
                "{}",
                record.message
            );
            assert_eq!(record.job_uid.as_deref(), Some("primary-claim-uid"));
            assert!(
                s.actions.iter().any(|a| matches!(
                    a,
                    Action::ReleasePrimaryClaim { uid, .. } if uid == "primary-claim-uid"
                )),
                "{transition:?}: {:?}",
                s.actions
            );
            assert!(
                s.actions
                    .iter()
                    .any(|a| matches!(a, Action::DeleteWaitingReaders { .. }))
            );
            assert_eq!(condition(&s, READY).reason, Reason::DownloadFailed);
            assert!(condition(&s, DEGRADED).status);

            // The record is kept (not renewed) on the next reconcile, and once the claim is
            // gone nothing is provisioned while it holds.
            let mut failed = b.clone();
            failed.status = Some(s.status.clone());
            let mut o = observed(&failed, &config);
            o.primary_claim = Some(&claim);
            o.primary_pv = Some(&pv);
            let again = step(&o);
            assert_eq!(again.status.failure_record, Some(record.clone()));
            let o = observed(&failed, &config);
            let gone = step(&o);
            assert!(
                !gone
                    .actions
                    .iter()
                    .any(|a| matches!(a, Action::CreatePrimaryClaim(_) | Action::CreateJob(_))),
                "{transition:?}: {:?}",
                gone.actions
            );
            assert_eq!(condition(&gone, READY).reason, Reason::DownloadFailed);
        }
    }

    #[test]
    fn a_staging_claim_left_without_its_job_is_not_a_capture() {
        // The block flow's recovery: the claim of a staging pod whose Job is gone carries the
        // agent's election but no capture source; a new staging Job starts.
        let config = LifecycleConfig::default();
        let b = binding(Transition::RoxReadOnly);
        let mut claim = elected_for_capture(bound_claim(&b));
        claim
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .remove(COPY_SOURCE_ANNOTATION);
        let pv = primary_pv();
        let mut o = observed(&b, &config);
        o.primary_claim = Some(&claim);
        o.primary_pv = Some(&pv);
        o.step = Some(StepSource {
            step: init_step(),
            pod_env: Vec::new(),
        });
        let s = step(&o);
        assert!(
            s.actions.iter().any(|a| matches!(a, Action::CreateJob(_))),
            "{:?}",
            s.actions
        );
        // The same claim elected for a capture starts nothing.
        let capture = elected_for_capture(bound_claim(&b));
        o.primary_claim = Some(&capture);
        let s = step(&o);
        assert_eq!(condition(&s, READY).reason, Reason::Capturing);
        assert!(!s.actions.iter().any(|a| matches!(a, Action::CreateJob(_))));
    }
}
