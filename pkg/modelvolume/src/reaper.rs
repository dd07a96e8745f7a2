//! The reaper's rules: the only decisions in warmcache that delete. Pure: the binary
//! (`cmd/reaper`) reads the objects, asks these functions, and acts on the answer with UID
//! preconditions. Each rule is named ([`Rule`]), each refusal to act has a reason ([`Keep`]),
//! and every rule acts only on proof read from the API server.
//!
//! | rule | acts on | deletes | when |
//! |---|---|---|---|
//! | `idle-retirement` | a ModelCacheBinding | nothing (sets `Retiring`) | no request reference and no live reading pod since `unreferencedSince` + the idle period |
//! | `retired-binding` | a Retiring (or deleted) binding | exactly what it names ([`named_resources`]): reader views (claims, then PV objects), writer Jobs, writer views (claims, then PVs), the primary claim, the Lease; then its finalizer | past the retiring grace, no request reference and no live reading pod; a stage waits while one of its objects is attached, used by a pod, still terminating, or a claim whose PV would reclaim shared storage |
//! | `orphan-view` | a view PV (read-only, or a writer view) | the PV object only (Retain: the storage is the primary's) | released (its claim proven gone), or its claim's namespace is gone (a definite NotFound) |
//! | `abandoned-primary` | an incomplete primary PV, the provisioner's volume for a primary claim | its views, then its storage (reclaim policy set to Delete; the PV controller and the provisioner delete it) | released for longer than the abandon age (since the later of its creation and its last phase change), no view that may be read |
//! | `expired-primary` | a complete primary PV | its views, then its storage (reclaim Delete) | released, no binding records it or holds its model, retention > 0 passed since its last use, no view that may be read |
//! | `orphan-claim` | a read-only view claim | the claim, then the mount holders that use it | no binding records it as a view, older than the orphan age, and no pod other than mount holders uses it |
//! | `orphan-encryption` | an encrypted cache's StorageClass `<hash>-sc` and key Secret `<hash>` ([`encryption_verdict`]) | the class, then (a later sweep) the Secret | no binding of the cache (any phase), no PV naming it (class: `storageClassName`; Secret: a CSI secret reference, the provisioner's deletion-secret annotations, or its class), no claim asking for the class; the Secret also only once its class is gone |
//!
//! Guards every rule shares: a PV with a VolumeAttachment or a claim a live pod uses is kept this
//! sweep; a namespace is gone only on NotFound ([`NamespaceState`]); Released counts only with
//! the claim it names proven gone ([`looks_released`], [`PvFacts::claim_gone`]); an object is
//! only deleted when it is warmcache's (`app.kubernetes.io/managed-by=warmcache`, and for a
//! binding's objects the binding label naming it); a view PV whose reclaim policy is not Retain
//! is never deleted (deleting it could delete the primary's storage on drivers whose views share
//! its handle).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, SecretReference};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use warmcache_api_modelcache::v2beta1::ModelCacheBinding;
use warmcache_api_modelcache::{
    init_lease_name, reader_pvc_name, writer_job_name, writer_pvc_name,
};

use crate::agent::{COMPONENT_LABEL, MOUNT_HOLDER};
use crate::encryption::{ROLE_ENCRYPTION, SECRET_PARAMETERS, class_name, secret_name};
use crate::keys::{CACHE_KEY_LABEL, MANAGED_BY_LABEL, MANAGED_BY_VALUE, MODEL_LABEL, ROLE_READER};
use crate::view::{RETAIN, writer_view_pv_name_in};
use crate::volume_keys::{
    BINDING_LABEL, COMPLETE_LABEL, LAST_USED_ANNOTATION, ROLE_PRIMARY, ROLE_READER_SHARED,
    ROLE_WRITER, SOURCE_PV_LABEL, VOLUME_ROLE_LABEL,
};

/// Default pause between sweeps (nvsnap's `reapInterval`).
pub const DEFAULT_INTERVAL_SECONDS: u64 = 10 * 60;
/// Default idle period: how long a binding stays without references before it is retired.
/// Retiring a binding keeps its complete primary (retention rule), so a model that comes back
/// after it is read again without a download (warm start).
pub const DEFAULT_IDLE_SECONDS: i64 = 60 * 60;
/// Default age after which a Released incomplete primary is abandoned (nvsnap's AbandonAfter).
pub const DEFAULT_ABANDON_AFTER_SECONDS: i64 = 15 * 60;
/// Default retention of a complete primary since its last use (nvsnap's `retention`, 168 h);
/// 0 keeps complete primaries forever.
pub const DEFAULT_RETENTION_SECONDS: i64 = 168 * 60 * 60;
/// Default age after which a read-only view claim no pod uses is deleted.
pub const DEFAULT_ORPHAN_CLAIM_AFTER_SECONDS: i64 = 10 * 60;
/// Default time between a binding becoming Retiring (or being deleted) and the deletion of what
/// it names: admissions that read it from a cache while it was still Active may still be
/// arriving, and their pods then keep it.
pub const DEFAULT_RETIRING_GRACE_SECONDS: i64 = 60;

/// The reaper's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The control namespace (bindings, primary claims, Leases).
    pub control_namespace: String,
    /// Seconds a binding stays unreferenced before `idle-retirement`.
    pub idle_seconds: i64,
    /// Seconds after creation a Released incomplete primary is abandoned.
    pub abandon_after_seconds: i64,
    /// Seconds a complete primary is kept after its last use; 0 keeps it forever.
    pub retention_seconds: i64,
    /// Seconds a read-only view claim may exist without a pod before it is deleted.
    pub orphan_claim_after_seconds: i64,
    /// Seconds after a binding became Retiring (or was deleted) before `retired-binding`
    /// deletes anything.
    pub retiring_grace_seconds: i64,
}

impl Config {
    /// The defaults, for `control_namespace`.
    pub fn new(control_namespace: impl Into<String>) -> Self {
        Self {
            control_namespace: control_namespace.into(),
            idle_seconds: DEFAULT_IDLE_SECONDS,
            abandon_after_seconds: DEFAULT_ABANDON_AFTER_SECONDS,
            retention_seconds: DEFAULT_RETENTION_SECONDS,
            orphan_claim_after_seconds: DEFAULT_ORPHAN_CLAIM_AFTER_SECONDS,
            retiring_grace_seconds: DEFAULT_RETIRING_GRACE_SECONDS,
        }
    }
}

/// A named rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rule {
    /// An unreferenced binding past the idle period becomes Retiring.
    IdleRetirement,
    /// A Retiring binding's named resources are deleted, then its finalizer.
    RetiredBinding,
    /// A view PV (read-only or writer) left Released or in a gone namespace is deleted
    /// (object only).
    OrphanView,
    /// A Released incomplete primary is deleted with its storage.
    AbandonedPrimary,
    /// A complete primary past its retention is deleted (views first).
    ExpiredPrimary,
    /// A read-only view claim no pod uses is deleted, then its mount holders.
    OrphanClaim,
    /// An encrypted cache's StorageClass, then its key Secret, are deleted once no binding,
    /// volume or claim can need them.
    OrphanEncryption,
}

impl Rule {
    /// Every rule, in the order a sweep applies them.
    pub const ALL: [Self; 7] = [
        Self::IdleRetirement,
        Self::RetiredBinding,
        Self::OrphanClaim,
        Self::OrphanView,
        Self::AbandonedPrimary,
        Self::ExpiredPrimary,
        // After the primary rules: a primary's storage is deleted with its key (DeleteVolume
        // needs it), so the key goes only once the storage has.
        Self::OrphanEncryption,
    ];

    /// The rule's name (metric label, logs, `--dry-run` output).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::IdleRetirement => "idle-retirement",
            Self::RetiredBinding => "retired-binding",
            Self::OrphanView => "orphan-view",
            Self::AbandonedPrimary => "abandoned-primary",
            Self::ExpiredPrimary => "expired-primary",
            Self::OrphanClaim => "orphan-claim",
            Self::OrphanEncryption => "orphan-encryption",
        }
    }
}

/// Why a rule keeps an object this sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Keep {
    /// The binding has a request reference or a live reading pod.
    Referenced,
    /// The binding has no status yet, or no `unreferencedSince`: the controller has not
    /// recorded it idle.
    NotRecordedIdle,
    /// Unreferenced for less than the idle period.
    NotIdleLongEnough,
    /// A VolumeAttachment names the PV (deleting it would wedge behind the attacher).
    Attached,
    /// A live pod uses the claim.
    InUse,
    /// The namespace could not be read (an error other than NotFound): it may exist.
    NamespaceUncertain,
    /// The view is bound to a claim in a live namespace.
    Bound,
    /// Younger than the rule's age.
    Young,
    /// A complete primary inside its retention.
    InsideRetention,
    /// Retention 0: complete primaries are kept forever.
    KeptForever,
    /// A complete primary with a view bound in a live namespace.
    ViewInUse,
    /// A binding records the PV as its primary, or the claim as one of its views.
    NamedByBinding,
    /// The object carries a name the binding names but is not warmcache's (or names another
    /// binding): never touched.
    NotOurs,
    /// A view PV whose reclaim policy is not Retain: deleting it could delete shared storage.
    NotRetain,
    /// Already being deleted; waiting for it to go.
    Terminating,
    /// It changed between the read that decided and the delete (the precondition failed): it
    /// is looked at again next sweep.
    Changed,
    /// Retiring (or deleted) for less than the retiring grace: admissions that read it while
    /// it was Active may still be arriving.
    Settling,
    /// An encrypted cache's Secret or class: a ModelCacheBinding of the cache exists (any
    /// phase, also one being deleted).
    BindingExists,
    /// An encrypted cache's Secret or class: a PersistentVolume names it (the class as its
    /// `storageClassName`; the Secret in a CSI secret reference, in the provisioner's
    /// deletion-secret annotations, or through its class).
    VolumeUses,
    /// An encrypted cache's Secret or class: a PersistentVolumeClaim asks for the class (its
    /// volume may be being provisioned).
    ClaimUses,
    /// An encrypted cache's Secret whose StorageClass still exists: the class goes first, the
    /// Secret in a later sweep.
    ClassExists,
}

impl Keep {
    /// Every reason.
    pub const ALL: [Self; 21] = [
        Self::Referenced,
        Self::NotRecordedIdle,
        Self::NotIdleLongEnough,
        Self::Attached,
        Self::InUse,
        Self::NamespaceUncertain,
        Self::Bound,
        Self::Young,
        Self::InsideRetention,
        Self::KeptForever,
        Self::ViewInUse,
        Self::NamedByBinding,
        Self::NotOurs,
        Self::NotRetain,
        Self::Terminating,
        Self::Changed,
        Self::Settling,
        Self::BindingExists,
        Self::VolumeUses,
        Self::ClaimUses,
        Self::ClassExists,
    ];

    /// The reason's name (metric label, logs).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Referenced => "referenced",
            Self::NotRecordedIdle => "not_recorded_idle",
            Self::NotIdleLongEnough => "not_idle_long_enough",
            Self::Attached => "attached",
            Self::InUse => "in_use",
            Self::NamespaceUncertain => "namespace_uncertain",
            Self::Bound => "bound",
            Self::Young => "young",
            Self::InsideRetention => "inside_retention",
            Self::KeptForever => "kept_forever",
            Self::ViewInUse => "view_in_use",
            Self::NamedByBinding => "named_by_binding",
            Self::NotOurs => "not_ours",
            Self::NotRetain => "not_retain",
            Self::Terminating => "terminating",
            Self::Changed => "changed",
            Self::Settling => "settling",
            Self::BindingExists => "binding_exists",
            Self::VolumeUses => "volume_uses",
            Self::ClaimUses => "claim_uses",
            Self::ClassExists => "class_exists",
        }
    }

    /// The reason in words.
    pub const fn words(self) -> &'static str {
        match self {
            Self::Referenced => "it has a request reference or a live pod reading it",
            Self::NotRecordedIdle => "the binding controller has not recorded it unreferenced",
            Self::NotIdleLongEnough => "it has been unreferenced for less than the idle period",
            Self::Attached => "a VolumeAttachment still attaches the volume",
            Self::InUse => "a live pod uses the claim",
            Self::NamespaceUncertain => {
                "its namespace could not be read (only NotFound proves it gone)"
            }
            Self::Bound => "it is bound to a claim in a live namespace",
            Self::Young => "it is younger than the rule's age",
            Self::InsideRetention => "its last use is inside the retention",
            Self::KeptForever => "retention is 0: complete primaries are kept forever",
            Self::ViewInUse => "one of its views is bound in a live namespace",
            Self::NamedByBinding => "a ModelCacheBinding records it (its primary, or a view)",
            Self::NotOurs => "it is not warmcache's, or belongs to another binding",
            Self::NotRetain => "its reclaim policy is not Retain",
            Self::Terminating => "it is being deleted",
            Self::Changed => "it changed since it was read",
            Self::Settling => "it became Retiring less than the retiring grace ago",
            Self::BindingExists => "a ModelCacheBinding of its cache exists",
            Self::VolumeUses => {
                "a PersistentVolume names it (its storage, or a view of it, needs the key)"
            }
            Self::ClaimUses => {
                "a PersistentVolumeClaim asks for its StorageClass (a volume may be being provisioned)"
            }
            Self::ClassExists => {
                "its StorageClass still exists: the class goes first, the Secret in a later sweep"
            }
        }
    }
}

/// Whether a namespace exists, as read from the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NamespaceState {
    /// The GET returned it (Terminating counts as live: its objects are going anyway).
    Live,
    /// The GET returned NotFound.
    Gone,
    /// The GET failed otherwise (500, Forbidden, timeout): it may exist.
    Unknown,
}

fn seconds_since(now: Timestamp, then: Timestamp) -> i64 {
    now.as_second().saturating_sub(then.as_second())
}

fn label<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Whether `meta` is warmcache's (`app.kubernetes.io/managed-by: warmcache`) and, for
/// `Some(binding)`, carries the binding label naming it (every object the binding controller
/// creates for a binding does).
pub fn is_ours(meta: &ObjectMeta, binding: Option<&str>) -> bool {
    if label(meta, MANAGED_BY_LABEL) != Some(MANAGED_BY_VALUE) {
        return false;
    }
    binding.is_none_or(|ours| label(meta, BINDING_LABEL) == Some(ours))
}

/// Whether `pod` has not terminated (Succeeded and Failed pods hold no claim; an attachment
/// they leave is caught by the VolumeAttachment guard).
pub fn is_live(pod: &Pod) -> bool {
    !matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Whether `pod` is a mount holder (warmcache's pause pod that keeps a volume attached).
pub fn is_mount_holder(pod: &Pod) -> bool {
    label(&pod.metadata, COMPONENT_LABEL) == Some(MOUNT_HOLDER)
        && label(&pod.metadata, MANAGED_BY_LABEL) == Some(MANAGED_BY_VALUE)
}

/// The claims `pod` mounts.
pub fn claims_of(pod: &Pod) -> impl Iterator<Item = &str> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.as_str())
}

/// Whether `pod` reads `binding`'s cache: the webhook's model label, or the compile-cache set
/// label ([`CACHE_KEY_LABEL`]), with the binding's hash.
pub fn reads_binding(pod: &Pod, binding: &ModelCacheBinding) -> bool {
    let hash = warmcache_api_modelcache::identity_hash(&binding.spec.identity);
    [MODEL_LABEL, CACHE_KEY_LABEL]
        .iter()
        .any(|key| label(&pod.metadata, key) == Some(hash.as_str()))
}

/// What the binding-level rules decide for a binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BindingVerdict {
    /// Keep it as it is.
    Keep(Rule, Keep),
    /// `idle-retirement`: set phase Retiring (with the resourceVersion read).
    Retire,
    /// `retired-binding`: delete what it names ([`named_resources`], [`cleanup_step`]).
    Cleanup,
}

/// The binding-level decision for `binding`, which `live_readers` live pods read now (pods
/// labelled with its model hash, listed afresh).
pub fn binding_verdict(
    binding: &ModelCacheBinding,
    live_readers: usize,
    now: Timestamp,
    config: &Config,
) -> BindingVerdict {
    let retiring = binding.is_retiring() || binding.metadata.deletion_timestamp.is_some();
    let rule = if retiring {
        Rule::RetiredBinding
    } else {
        Rule::IdleRetirement
    };
    let status = binding.status.as_ref();
    let referenced = status.is_some_and(|s| !s.request_references.is_empty());
    if referenced || live_readers > 0 {
        return BindingVerdict::Keep(rule, Keep::Referenced);
    }
    if retiring {
        let since = [
            status.and_then(|s| s.last_phase_transition_time.as_ref()),
            binding.metadata.deletion_timestamp.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(|t| t.0)
        .max();
        if since.is_some_and(|t| seconds_since(now, t) < config.retiring_grace_seconds) {
            return BindingVerdict::Keep(rule, Keep::Settling);
        }
        return BindingVerdict::Cleanup;
    }
    let Some(since) = status
        .filter(|s| s.phase.is_some())
        .and_then(|s| s.unreferenced_since.as_ref())
    else {
        return BindingVerdict::Keep(rule, Keep::NotRecordedIdle);
    };
    if seconds_since(now, since.0) < config.idle_seconds {
        return BindingVerdict::Keep(rule, Keep::NotIdleLongEnough);
    }
    BindingVerdict::Retire
}

/// The kinds of object a binding names, in the order retirement deletes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A read-only view claim (`status.realized.views`; `ro-pvc-<hash>` in the writer
    /// namespace of a regularModelCache).
    ReaderClaim,
    /// A read-only view PV (object only).
    ReaderVolume,
    /// A writer Job (deleted with its pods).
    Job,
    /// A writer view claim in a writer namespace.
    WriterClaim,
    /// A writer view PV (object only; Retain).
    WriterVolume,
    /// The primary claim in the control namespace (its PV stays Released with Retain: the
    /// retention rules own the data).
    PrimaryClaim,
    /// The writer Lease.
    Lease,
}

impl Kind {
    /// The kind's name (metric label, logs).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ReaderClaim | Self::WriterClaim | Self::PrimaryClaim => "PersistentVolumeClaim",
            Self::ReaderVolume | Self::WriterVolume => "PersistentVolume",
            Self::Job => "Job",
            Self::Lease => "Lease",
        }
    }

    /// The deletion stage: a stage starts only when every object of the earlier ones is gone.
    pub const fn stage(self) -> u8 {
        match self {
            Self::ReaderClaim => 0,
            Self::ReaderVolume => 1,
            Self::Job => 2,
            Self::WriterClaim => 3,
            Self::WriterVolume => 4,
            Self::PrimaryClaim => 5,
            Self::Lease => 6,
        }
    }
}

/// One object a binding names.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Target {
    /// What it is.
    pub kind: Kind,
    /// Its namespace (none for PVs).
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind.as_str(), self.name),
            None => write!(f, "{} {}", self.kind.as_str(), self.name),
        }
    }
}

/// The namespaces `binding`'s writers ran in: `spec.resources.writerNamespace` and the writer
/// the status records (a helmModelCache writer may have moved).
pub fn writer_namespaces(binding: &ModelCacheBinding) -> Vec<String> {
    let mut out = vec![binding.spec.resources.writer_namespace.clone()];
    if let Some(w) = binding.status.as_ref().and_then(|s| s.writer.as_ref())
        && !out.contains(&w.namespace)
    {
        out.push(w.namespace.clone());
    }
    out
}

/// Every object `binding` names, sorted by deletion stage: what `spec.resources` records (the
/// writer claim and Job in each writer namespace, the reader claim of a regularModelCache, PVs,
/// the Lease), the views `status.realized.views` records, the writer view PVs of its writer
/// namespaces and the primary claim in its own namespace. A recorded name is taken only when it
/// is the one warmcache derives from the binding's identity (a hand-written binding cannot name
/// someone else's object), PVs of `spec.resources` aside (they must carry the binding's label).
///
/// Never its primary PV (`status.realized.boundPersistentVolumeName`): the data outlives the
/// binding and is the retention rules'. Nor the StorageClass and Secret of an encrypted cache:
/// they hold what reads and deletes its data, which a later binding may adopt, so they live as
/// long as the data, not the binding; `orphan-encryption` ([`encryption_verdict`]) deletes them
/// once no binding of the cache, no volume and no claim can need them.
pub fn named_resources(binding: &ModelCacheBinding) -> Vec<Target> {
    let identity = &binding.spec.identity;
    let control = binding.metadata.namespace.clone().unwrap_or_default();
    let resources = &binding.spec.resources;
    let realized = binding.status.as_ref().and_then(|s| s.realized.as_ref());
    let primary_pv = realized.and_then(|r| r.bound_persistent_volume_name.as_deref());
    let writer_claim = writer_pvc_name(identity);
    let reader_claim = reader_pvc_name(identity);
    let writer_job = writer_job_name(identity);
    let writers = writer_namespaces(binding);
    let mut out = Vec::new();
    let mut push = |kind, namespace: Option<&str>, name: &str| {
        let t = Target {
            kind,
            namespace: namespace.map(str::to_owned),
            name: name.to_owned(),
        };
        if !name.is_empty()
            && Some(name) != primary_pv.filter(|_| namespace.is_none())
            && !out.contains(&t)
        {
            out.push(t);
        }
    };
    for v in realized.map(|r| r.views.as_slice()).unwrap_or_default() {
        let expected = crate::view::reader_view(binding, &v.namespace);
        if v.persistent_volume_claim_name == reader_claim {
            push(Kind::ReaderClaim, Some(&v.namespace), &reader_claim);
        }
        if v.persistent_volume_name == expected.persistent_volume_name {
            push(Kind::ReaderVolume, None, &expected.persistent_volume_name);
        }
    }
    for ns in &writers {
        if resources.job_names.contains(&writer_job) {
            push(Kind::Job, Some(ns), &writer_job);
        }
        for claim in &resources.persistent_volume_claim_names {
            if *claim == writer_claim {
                push(Kind::WriterClaim, Some(ns), claim);
            } else if *claim == reader_claim {
                push(Kind::ReaderClaim, Some(ns), claim);
            }
        }
        push(
            Kind::WriterVolume,
            None,
            &writer_view_pv_name_in(binding, ns),
        );
    }
    for pv in &resources.persistent_volume_names {
        push(Kind::WriterVolume, None, pv);
    }
    push(Kind::PrimaryClaim, Some(&control), &writer_claim);
    if resources.lease_name == init_lease_name(identity) {
        push(Kind::Lease, Some(&control), &resources.lease_name);
    }
    out.sort_by_key(|t| t.kind.stage());
    out
}

/// A named object as read from the API server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// NotFound.
    Gone,
    /// It exists.
    Present {
        /// Its UID (the delete's precondition).
        uid: String,
        /// [`is_ours`] for the binding.
        ours: bool,
        /// It has a deletionTimestamp.
        terminating: bool,
        /// Why it must not be deleted yet even though it is ours: [`Keep::Attached`] for a PV
        /// a VolumeAttachment names, [`Keep::InUse`] for a claim a live pod uses.
        busy: Option<Keep>,
    },
}

/// The next step of a binding's retirement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cleanup {
    /// Delete these objects (with their UIDs as preconditions): the earliest stage that still
    /// has objects of the binding.
    Delete(Vec<(Target, String)>),
    /// An object of the current stage cannot go yet: try again later.
    Wait(Target, Keep),
    /// Everything the binding names is gone (or is not warmcache's and stays): delete the
    /// binding and remove its finalizer.
    Finish,
}

/// The next retirement step from what was read of each named object. Objects that are not
/// warmcache's are never deleted and do not hold the retirement up.
pub fn cleanup_step(seen: &[(Target, Seen)]) -> Cleanup {
    let mut stages: BTreeMap<u8, Vec<&(Target, Seen)>> = BTreeMap::new();
    for entry in seen {
        stages.entry(entry.0.kind.stage()).or_default().push(entry);
    }
    for entries in stages.values() {
        let mut delete = Vec::new();
        let mut waiting = None;
        for (target, state) in entries {
            let Seen::Present {
                uid,
                ours: true,
                terminating,
                busy,
            } = state
            else {
                continue;
            };
            if let Some(reason) = busy {
                return Cleanup::Wait(target.clone(), *reason);
            }
            if *terminating {
                waiting.get_or_insert_with(|| target.clone());
            } else {
                delete.push((target.clone(), uid.clone()));
            }
        }
        if !delete.is_empty() {
            return Cleanup::Delete(delete);
        }
        if let Some(target) = waiting {
            return Cleanup::Wait(target, Keep::Terminating);
        }
    }
    Cleanup::Finish
}

/// What a PV is to the volume rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PvClass {
    /// A view of a primary: warmcache's, role `reader-shared` (read-only) or `writer` (the
    /// writer view; Released once its download is complete, or left by an earlier writer
    /// namespace).
    View,
    /// A primary: bound (or once bound) to a claim `rw-pvc-<48 hex>` of the control namespace,
    /// not a view.
    Primary {
        /// Labelled complete.
        complete: bool,
    },
    /// Anything else (a writer view, someone else's volume): no volume rule applies.
    Other,
}

fn is_primary_claim_name(name: &str) -> bool {
    name.strip_prefix(warmcache_api_modelcache::names::WRITER_PVC_PREFIX)
        .is_some_and(|h| {
            h.len() == 48
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

fn csi_read_only(pv: &PersistentVolume) -> bool {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .and_then(|c| c.read_only)
        .unwrap_or(false)
}

/// The class of `pv` for the control namespace `control`.
pub fn classify(pv: &PersistentVolume, control: &str) -> PvClass {
    let role = label(&pv.metadata, VOLUME_ROLE_LABEL);
    if matches!(role, Some(ROLE_READER_SHARED | ROLE_WRITER)) {
        return if is_ours(&pv.metadata, None) {
            PvClass::View
        } else {
            PvClass::Other
        };
    }
    if role.is_some_and(|r| r != ROLE_PRIMARY) || csi_read_only(pv) {
        return PvClass::Other;
    }
    let claim = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let primary_claim = claim.is_some_and(|c| {
        c.namespace.as_deref() == Some(control)
            && c.name.as_deref().is_some_and(is_primary_claim_name)
    });
    if !primary_claim {
        return PvClass::Other;
    }
    if label(&pv.metadata, COMPLETE_LABEL) == Some("true") {
        // The binding controller labels a primary complete (with warmcache's label) only after
        // it verified the PV was provisioned for its claim.
        return if is_ours(&pv.metadata, None) {
            PvClass::Primary { complete: true }
        } else {
            PvClass::Other
        };
    }
    // An incomplete primary carries no label of ours: it must be the volume a provisioner made
    // for that claim (named after the claim's UID, annotated by the PV's own driver), not a
    // retained volume someone bound to the claim name by hand.
    let uid = claim.and_then(|c| c.uid.as_deref()).unwrap_or_default();
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    let driver = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.driver.as_str());
    let provisioned_by = annotation(&pv.metadata, PROVISIONED_BY_ANNOTATION);
    if uid.is_empty() || !name.ends_with(uid) || driver.is_none() || provisioned_by != driver {
        return PvClass::Other;
    }
    PvClass::Primary { complete: false }
}

/// The annotation an external provisioner puts on the PVs it creates: its driver name.
pub const PROVISIONED_BY_ANNOTATION: &str = "pv.kubernetes.io/provisioned-by";

/// Whether `pv` looks Released and names the UID of the claim it was bound to (a PV whose
/// `claimRef.uid` was just cleared for a rebind still shows Released until the PV controller
/// catches up: it is not released). The caller still proves the claim gone
/// ([`PvFacts::claim_gone`]).
pub fn looks_released(pv: &PersistentVolume) -> bool {
    phase(pv) == Some("Released")
        && pv
            .spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .and_then(|c| c.uid.as_deref())
            .is_some_and(|u| !u.is_empty())
}

fn phase(pv: &PersistentVolume) -> Option<&str> {
    pv.status.as_ref().and_then(|s| s.phase.as_deref())
}

fn reclaim_policy(pv: &PersistentVolume) -> Option<&str> {
    pv.spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
}

/// The namespace of the claim `pv` is bound (or pre-bound) to.
pub fn claim_namespace(pv: &PersistentVolume) -> Option<&str> {
    pv.spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|c| c.namespace.as_deref())
}

/// Whether `pv` is a read-only view (role `reader-shared`), not the writer view.
pub fn is_read_only_view(pv: &PersistentVolume) -> bool {
    label(&pv.metadata, VOLUME_ROLE_LABEL) == Some(ROLE_READER_SHARED)
}

/// The primary a view PV was derived from ([`SOURCE_PV_LABEL`]).
pub fn source_of(view: &PersistentVolume) -> Option<&str> {
    label(&view.metadata, SOURCE_PV_LABEL)
}

/// When `pv` was last used: the latest of its creation and [`LAST_USED_ANNOTATION`] (stamped
/// when the binding that read it retires).
pub fn last_used(pv: &PersistentVolume) -> Option<Timestamp> {
    let created = pv.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let stamped = annotation(&pv.metadata, LAST_USED_ANNOTATION).and_then(|t| t.parse().ok());
    created.max(stamped)
}

/// A view of a primary (read-only or writer), as the primary rules see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewFacts {
    /// The view PV.
    pub name: String,
    /// A VolumeAttachment names it.
    pub attached: bool,
    /// [`looks_released`]: anything else (Bound, Available, a rebind in flight) may be read.
    pub released: bool,
    /// The namespace of its claim.
    pub namespace: NamespaceState,
}

impl ViewFacts {
    /// Whether the view may be read: not released, in a namespace not known to be gone.
    pub fn may_be_read(&self) -> bool {
        !self.released && self.namespace != NamespaceState::Gone
    }
}

/// What is known about a PV besides the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PvFacts {
    /// A VolumeAttachment names it.
    pub attached: bool,
    /// A live pod uses the claim it is bound to.
    pub claim_in_use: bool,
    /// The claim of its `claimRef` was read afresh: NotFound, or another UID. Only then is a
    /// Released PV released.
    pub claim_gone: bool,
    /// The namespace of its claim (Live when it has none).
    pub namespace: NamespaceState,
    /// A ModelCacheBinding records it as `status.realized.boundPersistentVolumeName`.
    pub named_by_binding: bool,
    /// For a primary: its views, read-only and writer ([`source_of`] names it).
    pub views: Vec<ViewFacts>,
}

/// What the volume rules decide for a PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PvVerdict {
    /// No volume rule applies.
    Ignore,
    /// The rule keeps it this sweep.
    Keep(Rule, Keep),
    /// `orphan-view`: delete the PV object (its reclaim policy is Retain).
    DeleteObject(Rule),
    /// `abandoned-primary` / `expired-primary`: delete these view PV objects first, then set the
    /// primary's reclaim policy to Delete so the PV controller and the provisioner delete it
    /// and its storage.
    Reclaim {
        /// The rule.
        rule: Rule,
        /// View PV objects to delete first.
        views: Vec<String>,
    },
}

/// The volume rules for `pv` (see the module table).
pub fn pv_verdict(
    pv: &PersistentVolume,
    facts: &PvFacts,
    now: Timestamp,
    config: &Config,
) -> PvVerdict {
    let class = classify(pv, &config.control_namespace);
    let rule = match class {
        PvClass::Other => return PvVerdict::Ignore,
        PvClass::View => Rule::OrphanView,
        PvClass::Primary { complete: false } => Rule::AbandonedPrimary,
        PvClass::Primary { complete: true } => Rule::ExpiredPrimary,
    };
    if pv.metadata.deletion_timestamp.is_some() {
        return PvVerdict::Keep(rule, Keep::Terminating);
    }
    if facts.attached {
        return PvVerdict::Keep(rule, Keep::Attached);
    }
    if facts.claim_in_use {
        return PvVerdict::Keep(rule, Keep::InUse);
    }
    let released = looks_released(pv) && facts.claim_gone;
    match class {
        PvClass::Other => PvVerdict::Ignore,
        PvClass::View => {
            if reclaim_policy(pv) != Some(RETAIN) {
                return PvVerdict::Keep(rule, Keep::NotRetain);
            }
            if released {
                return PvVerdict::DeleteObject(rule);
            }
            match facts.namespace {
                NamespaceState::Gone if claim_namespace(pv).is_some() => {
                    PvVerdict::DeleteObject(rule)
                }
                NamespaceState::Unknown => PvVerdict::Keep(rule, Keep::NamespaceUncertain),
                _ => PvVerdict::Keep(rule, Keep::Bound),
            }
        }
        PvClass::Primary { complete: false } => {
            if !released {
                return PvVerdict::Ignore;
            }
            // Released for longer than the abandon age: counted from the later of its creation
            // and its last phase change (when the PV controller records it).
            let since = [
                pv.metadata.creation_timestamp.as_ref(),
                pv.status
                    .as_ref()
                    .and_then(|s| s.last_phase_transition_time.as_ref()),
            ]
            .into_iter()
            .flatten()
            .map(|t| t.0)
            .max();
            let age = since.map_or(0, |t| seconds_since(now, t));
            if age < config.abandon_after_seconds {
                return PvVerdict::Keep(rule, Keep::Young);
            }
            primary_reclaim(rule, facts)
        }
        PvClass::Primary { complete: true } => {
            if !released {
                return PvVerdict::Ignore;
            }
            if facts.named_by_binding {
                return PvVerdict::Keep(rule, Keep::NamedByBinding);
            }
            if config.retention_seconds <= 0 {
                return PvVerdict::Keep(rule, Keep::KeptForever);
            }
            let idle = last_used(pv).map_or(0, |t| seconds_since(now, t));
            if idle < config.retention_seconds {
                return PvVerdict::Keep(rule, Keep::InsideRetention);
            }
            primary_reclaim(rule, facts)
        }
    }
}

/// A primary's storage goes only when none of its views (they share its data) is attached or
/// may be read; its views go first.
fn primary_reclaim(rule: Rule, facts: &PvFacts) -> PvVerdict {
    if facts.views.iter().any(|v| v.attached) {
        return PvVerdict::Keep(rule, Keep::Attached);
    }
    if facts.views.iter().any(ViewFacts::may_be_read) {
        return PvVerdict::Keep(rule, Keep::ViewInUse);
    }
    PvVerdict::Reclaim {
        rule,
        views: facts.views.iter().map(|v| v.name.clone()).collect(),
    }
}

/// What the `orphan-claim` rule decides for a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimVerdict {
    /// No rule applies (not a read-only view claim of warmcache).
    Ignore,
    /// Kept this sweep.
    Keep(Keep),
    /// Delete the claim (UID precondition), then the mount holders that use it.
    Delete,
}

/// The `orphan-claim` rule for `claim`; `recorded` says whether a binding records it in
/// `status.realized.views` (its view is wanted: the binding controller would create it again,
/// and the binding's retirement deletes it); `users` are the live pods of its namespace that
/// mount it.
pub fn claim_verdict(
    claim: &PersistentVolumeClaim,
    recorded: bool,
    users: &[&Pod],
    now: Timestamp,
    config: &Config,
) -> ClaimVerdict {
    let m = &claim.metadata;
    if !is_ours(m, None) || label(m, VOLUME_ROLE_LABEL) != Some(ROLE_READER) {
        return ClaimVerdict::Ignore;
    }
    if m.deletion_timestamp.is_some() {
        return ClaimVerdict::Keep(Keep::Terminating);
    }
    if recorded {
        return ClaimVerdict::Keep(Keep::NamedByBinding);
    }
    let age = m
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| seconds_since(now, t.0));
    if age < config.orphan_claim_after_seconds {
        return ClaimVerdict::Keep(Keep::Young);
    }
    if users.iter().any(|p| is_live(p) && !is_mount_holder(p)) {
        return ClaimVerdict::Keep(Keep::InUse);
    }
    ClaimVerdict::Delete
}

// ---- orphan-encryption ----

/// Annotation the external-provisioner records on a PV it provisioned with a provisioner
/// secret: the name of the Secret DeleteVolume receives.
pub const DELETION_SECRET_NAME_ANNOTATION: &str =
    "volume.kubernetes.io/provisioner-deletion-secret-name";
/// Its namespace ([`DELETION_SECRET_NAME_ANNOTATION`]).
pub const DELETION_SECRET_NAMESPACE_ANNOTATION: &str =
    "volume.kubernetes.io/provisioner-deletion-secret-namespace";
/// The deprecated annotation that names the StorageClass of a claim or PV (before
/// `spec.storageClassName`); still honoured by the PV controller.
pub const BETA_STORAGE_CLASS_ANNOTATION: &str = "volume.beta.kubernetes.io/storage-class";

/// An encrypted cache's object ([`crate::encryption`]) as the reaper reads it.
#[derive(Clone, Copy, Debug)]
pub enum EncryptionObject<'a> {
    /// The key Secret: its metadata only (the reaper never reads a key).
    Secret(&'a ObjectMeta),
    /// The encrypted StorageClass.
    StorageClass(&'a StorageClass),
}

impl<'a> EncryptionObject<'a> {
    /// Its metadata.
    pub const fn meta(self) -> &'a ObjectMeta {
        match self {
            Self::Secret(m) => m,
            Self::StorageClass(c) => &c.metadata,
        }
    }

    /// `Secret <namespace>/<name>` or `StorageClass <name>` (logs, `--dry-run`).
    pub fn describe(self) -> String {
        let m = self.meta();
        let name = m.name.as_deref().unwrap_or_default();
        match self {
            Self::Secret(_) => format!(
                "Secret {}/{name}",
                m.namespace.as_deref().unwrap_or_default()
            ),
            Self::StorageClass(_) => format!("StorageClass {name}"),
        }
    }
}

/// The identity hash of the cache `object` belongs to, when it is warmcache's encryption object
/// of the control namespace: labelled `app.kubernetes.io/managed-by=warmcache`,
/// `nvsnap.io/role=encryption` and `nvsnap.io/model=<hash>` (an identity hash), and named as
/// the binding controller names it for that hash: the Secret `<hash>` in the control
/// namespace; the class `<hash>-sc`, whose CSI secret parameters ([`SECRET_PARAMETERS`]) all
/// name that Secret (a class of another control namespace is that one's). `None` otherwise:
/// never touched.
pub fn encryption_hash<'a>(object: EncryptionObject<'a>, config: &Config) -> Option<&'a str> {
    let meta = object.meta();
    if !is_ours(meta, None) || label(meta, VOLUME_ROLE_LABEL) != Some(ROLE_ENCRYPTION) {
        return None;
    }
    let hash =
        label(meta, MODEL_LABEL).filter(|h| warmcache_api_modelcache::is_identity_hash(h))?;
    let name = meta.name.as_deref()?;
    let secret = secret_name(hash);
    let control = config.control_namespace.as_str();
    let ok = match object {
        EncryptionObject::Secret(_) => name == secret && meta.namespace.as_deref() == Some(control),
        EncryptionObject::StorageClass(class) => {
            let params = class.parameters.as_ref();
            let param = |key: &str| params.and_then(|p| p.get(key)).map(String::as_str);
            name == class_name(hash)
                && SECRET_PARAMETERS
                    .iter()
                    .all(|(n, ns)| param(n) == Some(secret.as_str()) && param(ns) == Some(control))
        }
    };
    ok.then_some(hash)
}

/// The StorageClass `pv` was provisioned on: `spec.storageClassName`, else the deprecated
/// annotation.
pub fn volume_class(pv: &PersistentVolume) -> Option<&str> {
    pv.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .filter(|c| !c.is_empty())
        .or_else(|| annotation(&pv.metadata, BETA_STORAGE_CLASS_ANNOTATION))
}

/// The StorageClass `claim` asks for: `spec.storageClassName`, else the deprecated annotation.
pub fn claim_class(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .filter(|c| !c.is_empty())
        .or_else(|| annotation(&claim.metadata, BETA_STORAGE_CLASS_ANNOTATION))
}

/// Every Secret `pv` names, as (namespace, name): its CSI secret references (controller
/// publish and expand, node stage, publish and expand) and the provisioner's deletion-secret
/// annotations (what DeleteVolume receives). A reference without a namespace names the Secret
/// in any namespace (`None`).
pub fn volume_secrets(pv: &PersistentVolume) -> Vec<(Option<&str>, &str)> {
    let mut out = Vec::new();
    if let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) {
        let refs: [Option<&SecretReference>; 5] = [
            csi.controller_publish_secret_ref.as_ref(),
            csi.controller_expand_secret_ref.as_ref(),
            csi.node_stage_secret_ref.as_ref(),
            csi.node_publish_secret_ref.as_ref(),
            csi.node_expand_secret_ref.as_ref(),
        ];
        for r in refs.into_iter().flatten() {
            if let Some(name) = r.name.as_deref().filter(|n| !n.is_empty()) {
                out.push((r.namespace.as_deref().filter(|n| !n.is_empty()), name));
            }
        }
    }
    if let Some(name) =
        annotation(&pv.metadata, DELETION_SECRET_NAME_ANNOTATION).filter(|n| !n.is_empty())
    {
        let namespace = annotation(&pv.metadata, DELETION_SECRET_NAMESPACE_ANNOTATION)
            .filter(|n| !n.is_empty());
        out.push((namespace, name));
    }
    out
}

/// What the lists of one sweep say uses encrypted caches' objects, collected page by page (only
/// names are kept).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EncryptionUses {
    /// The identity hashes of the control namespace's bindings (any phase).
    pub bindings: BTreeSet<String>,
    /// The StorageClasses PVs were provisioned on ([`volume_class`]).
    pub volume_classes: BTreeSet<String>,
    /// The Secrets PVs name ([`volume_secrets`]).
    pub volume_secrets: BTreeSet<(Option<String>, String)>,
    /// The StorageClasses claims ask for ([`claim_class`]).
    pub claim_classes: BTreeSet<String>,
    /// The StorageClasses that exist (the encrypted ones listed).
    pub classes: BTreeSet<String>,
}

impl EncryptionUses {
    /// Records a binding of the control namespace.
    pub fn add_binding(&mut self, binding: &ModelCacheBinding) {
        self.bindings
            .insert(warmcache_api_modelcache::identity_hash(
                &binding.spec.identity,
            ));
    }

    /// Records a PV (any PV: not only warmcache's).
    pub fn add_volume(&mut self, pv: &PersistentVolume) {
        if let Some(class) = volume_class(pv) {
            self.volume_classes.insert(class.to_owned());
        }
        for (namespace, name) in volume_secrets(pv) {
            self.volume_secrets
                .insert((namespace.map(str::to_owned), name.to_owned()));
        }
    }

    /// Records a claim (any namespace).
    pub fn add_claim(&mut self, claim: &PersistentVolumeClaim) {
        if let Some(class) = claim_class(claim) {
            self.claim_classes.insert(class.to_owned());
        }
    }

    /// Records an existing StorageClass.
    pub fn add_class(&mut self, name: &str) {
        self.classes.insert(name.to_owned());
    }

    /// The facts of `object`, warmcache's encryption object of the cache `hash`
    /// ([`encryption_hash`]) in the control namespace `control`.
    pub fn facts(
        &self,
        object: EncryptionObject<'_>,
        hash: &str,
        control: &str,
    ) -> EncryptionFacts {
        let class = class_name(hash);
        let secret = secret_name(hash);
        let secret_named = self.volume_secrets.iter().any(|(namespace, name)| {
            *name == secret && namespace.as_deref().is_none_or(|n| n == control)
        });
        let class_named = self.volume_classes.contains(&class);
        EncryptionFacts {
            binding: self.bindings.contains(hash),
            volume: match object {
                EncryptionObject::StorageClass(_) => class_named,
                // A volume of the class needs the key its parameters name, even without a
                // reference of its own.
                EncryptionObject::Secret(_) => secret_named || class_named,
            },
            claim: self.claim_classes.contains(&class),
            class_exists: self.classes.contains(&class),
        }
    }
}

/// What is known about an encrypted cache's Secret or class besides the object.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EncryptionFacts {
    /// A ModelCacheBinding of the control namespace has the cache's identity hash (any phase,
    /// also one being deleted).
    pub binding: bool,
    /// A PV names it: for the class, its `storageClassName`; for the Secret, a CSI secret
    /// reference or the provisioner's deletion-secret annotations naming it (or the class).
    pub volume: bool,
    /// A claim in any namespace asks for the class `<hash>-sc`.
    pub claim: bool,
    /// The class `<hash>-sc` exists (only the Secret's verdict reads it).
    pub class_exists: bool,
}

/// What `orphan-encryption` decides for an encrypted cache's Secret or class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncryptionVerdict {
    /// Not warmcache's encryption object of this control namespace: never touched.
    Ignore,
    /// Kept this sweep.
    Keep(Keep),
    /// Delete it, with the UID (and resourceVersion) read as preconditions.
    Delete,
}

/// The `orphan-encryption` rule for `object`. An encrypted cache's Secret and StorageClass live
/// as long as anything can need them: the driver needs the key to open the data and to
/// DeleteVolume the primary's storage, so deleting it earlier would leave a volume that can be
/// neither read nor deleted. Kept while a binding of the cache exists (it adopts them), while a
/// PV names them, while a claim asks for the class (CreateVolume may be in flight before its PV
/// exists); the Secret also while the class exists, so the class goes in one sweep and the
/// Secret in a later one, from fresh lists (a new binding of the cache recreates the class
/// before it provisions anything, and that keeps the Secret).
pub fn encryption_verdict(
    object: EncryptionObject<'_>,
    facts: &EncryptionFacts,
    config: &Config,
) -> EncryptionVerdict {
    if encryption_hash(object, config).is_none() {
        return EncryptionVerdict::Ignore;
    }
    let keep = if object.meta().deletion_timestamp.is_some() {
        Some(Keep::Terminating)
    } else if facts.binding {
        Some(Keep::BindingExists)
    } else if facts.volume {
        Some(Keep::VolumeUses)
    } else if facts.claim {
        Some(Keep::ClaimUses)
    } else if matches!(object, EncryptionObject::Secret(_)) && facts.class_exists {
        Some(Keep::ClassExists)
    } else {
        None
    };
    keep.map_or(EncryptionVerdict::Delete, EncryptionVerdict::Keep)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use k8s_openapi::api::core::v1::{
        CSIPersistentVolumeSource, ObjectReference, PersistentVolumeClaimVolumeSource,
        PersistentVolumeSpec, PersistentVolumeStatus, PodSpec, PodStatus, Volume,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use warmcache_api_modelcache::v2beta1::{
        BindingPhase, ModelCacheBindingStatus, RealizedStorage, RequestReference, Transition,
        WriterStatus,
    };

    fn binding() -> ModelCacheBinding {
        let mut b = crate::testing::binding(Transition::RwxReadOnly);
        let id = b.spec.identity.clone();
        b.spec.resources.job_names = vec![warmcache_api_modelcache::writer_job_name(&id)];
        b.spec.resources.persistent_volume_claim_names = vec![writer_pvc_name(&id)];
        b
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn config() -> Config {
        Config::new("nvca-modelcache-init")
    }

    fn idle_binding(since: i64) -> ModelCacheBinding {
        let mut b = binding();
        b.status = Some(ModelCacheBindingStatus {
            phase: Some(BindingPhase::Active),
            unreferenced_since: Some(Time(at(since))),
            ..ModelCacheBindingStatus::default()
        });
        b
    }

    #[test]
    fn idle_retirement_waits_for_the_idle_period_and_for_no_reader() {
        let c = config();
        let b = idle_binding(0);
        assert_eq!(
            binding_verdict(&b, 0, at(DEFAULT_IDLE_SECONDS - 1), &c),
            BindingVerdict::Keep(Rule::IdleRetirement, Keep::NotIdleLongEnough)
        );
        assert_eq!(
            binding_verdict(&b, 0, at(DEFAULT_IDLE_SECONDS), &c),
            BindingVerdict::Retire
        );
        assert_eq!(
            binding_verdict(&b, 1, at(DEFAULT_IDLE_SECONDS), &c),
            BindingVerdict::Keep(Rule::IdleRetirement, Keep::Referenced)
        );
        let mut referenced = b.clone();
        if let Some(s) = referenced.status.as_mut() {
            s.request_references.push(RequestReference {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                namespace: "team-a".into(),
                name: "vllm".into(),
                uid: "u-1".into(),
            });
        }
        assert_eq!(
            binding_verdict(&referenced, 0, at(10 * DEFAULT_IDLE_SECONDS), &c),
            BindingVerdict::Keep(Rule::IdleRetirement, Keep::Referenced)
        );
        // No status, or no unreferencedSince: the controller has not said it is idle.
        let mut fresh = binding();
        assert_eq!(
            binding_verdict(&fresh, 0, at(10 * DEFAULT_IDLE_SECONDS), &c),
            BindingVerdict::Keep(Rule::IdleRetirement, Keep::NotRecordedIdle)
        );
        fresh.status = Some(ModelCacheBindingStatus {
            phase: Some(BindingPhase::Active),
            ..ModelCacheBindingStatus::default()
        });
        assert_eq!(
            binding_verdict(&fresh, 0, at(10 * DEFAULT_IDLE_SECONDS), &c),
            BindingVerdict::Keep(Rule::IdleRetirement, Keep::NotRecordedIdle)
        );
    }

    #[test]
    fn a_retiring_or_deleted_binding_is_cleaned_unless_a_reference_came_back() {
        let c = config();
        let mut b = idle_binding(0);
        b.status.as_mut().unwrap().phase = Some(BindingPhase::Retiring);
        b.status.as_mut().unwrap().last_phase_transition_time = Some(Time(at(100)));
        // Admissions that read it while Active may still be arriving: not yet.
        assert_eq!(
            binding_verdict(&b, 0, at(100 + DEFAULT_RETIRING_GRACE_SECONDS - 1), &c),
            BindingVerdict::Keep(Rule::RetiredBinding, Keep::Settling)
        );
        assert_eq!(
            binding_verdict(&b, 0, at(100 + DEFAULT_RETIRING_GRACE_SECONDS), &c),
            BindingVerdict::Cleanup
        );
        b.status.as_mut().unwrap().last_phase_transition_time = None;
        assert_eq!(binding_verdict(&b, 0, at(1), &c), BindingVerdict::Cleanup);
        assert_eq!(
            binding_verdict(&b, 2, at(1), &c),
            BindingVerdict::Keep(Rule::RetiredBinding, Keep::Referenced)
        );
        let mut deleted = binding();
        deleted.metadata.deletion_timestamp = Some(Time(at(0)));
        assert_eq!(
            binding_verdict(&deleted, 0, at(1), &c),
            BindingVerdict::Keep(Rule::RetiredBinding, Keep::Settling)
        );
        assert_eq!(
            binding_verdict(&deleted, 0, at(DEFAULT_RETIRING_GRACE_SECONDS), &c),
            BindingVerdict::Cleanup
        );
    }

    fn with_views(mut b: ModelCacheBinding) -> ModelCacheBinding {
        let views = ["team-a", "team-b"]
            .iter()
            .map(|ns| crate::view::reader_view(&b, ns))
            .collect();
        let s = b
            .status
            .get_or_insert_with(ModelCacheBindingStatus::default);
        s.realized = Some(RealizedStorage {
            bound_persistent_volume_name: Some("pvc-primary".into()),
            views,
            ..RealizedStorage::default()
        });
        s.writer = Some(WriterStatus {
            namespace: "team-b".into(),
            job_name: "writer-job-x".into(),
            ..WriterStatus::default()
        });
        b
    }

    #[test]
    fn named_resources_are_what_the_binding_records_in_deletion_order() {
        let mut b = with_views(binding());
        b.spec.resources.lease_name = init_lease_name(&b.spec.identity);
        b.spec.resources.persistent_volume_names = vec!["pvc-primary".into(), "extra-pv".into()];
        let targets = named_resources(&b);
        let lease = b.spec.resources.lease_name.clone();
        let stages: Vec<u8> = targets.iter().map(|t| t.kind.stage()).collect();
        let mut sorted = stages.clone();
        sorted.sort_unstable();
        assert_eq!(stages, sorted, "{targets:?}");
        let find = |kind: Kind| -> Vec<String> {
            targets
                .iter()
                .filter(|t| t.kind == kind)
                .map(ToString::to_string)
                .collect()
        };
        let writer_ns = b.spec.resources.writer_namespace.clone();
        let hash = warmcache_api_modelcache::identity_hash(&b.spec.identity);
        assert!(
            find(Kind::ReaderClaim)
                .contains(&format!("PersistentVolumeClaim team-b/ro-pvc-{hash}"))
        );
        assert_eq!(find(Kind::ReaderVolume).len(), 2);
        assert_eq!(
            find(Kind::Job),
            [
                format!("Job {writer_ns}/writer-job-{hash}"),
                format!("Job team-b/writer-job-{hash}")
            ]
        );
        assert!(
            find(Kind::WriterClaim)
                .contains(&format!("PersistentVolumeClaim team-b/rw-pvc-{hash}"))
        );
        assert_eq!(
            find(Kind::PrimaryClaim),
            [format!(
                "PersistentVolumeClaim nvca-modelcache-init/rw-pvc-{hash}"
            )]
        );
        assert_eq!(
            find(Kind::Lease),
            [format!("Lease nvca-modelcache-init/{lease}")]
        );
        // A recorded name that is not the one derived from the identity is never a target: a
        // hand-written binding cannot name another component's Lease, Job or claim.
        let mut forged = b.clone();
        forged.spec.resources.lease_name = "binding-controller".into();
        forged.spec.resources.job_names = vec!["backup".into()];
        forged.spec.resources.persistent_volume_claim_names = vec!["data".into()];
        if let Some(r) = forged.status.as_mut().and_then(|s| s.realized.as_mut()) {
            r.views[0].persistent_volume_claim_name = "data".into();
            r.views[0].persistent_volume_name = "someone-elses-pv".into();
        }
        let forged_targets = named_resources(&forged);
        for name in ["binding-controller", "backup", "data", "someone-elses-pv"] {
            assert!(
                forged_targets.iter().all(|t| t.name != name),
                "{name}: {forged_targets:?}"
            );
        }
        let volumes = find(Kind::WriterVolume);
        assert!(volumes.contains(&"PersistentVolume extra-pv".to_owned()));
        assert!(
            targets.iter().all(|t| t.name != "pvc-primary"),
            "the primary PV is never a retirement target: {targets:?}"
        );
    }

    fn present(ours: bool) -> Seen {
        Seen::Present {
            uid: "uid".into(),
            ours,
            terminating: false,
            busy: None,
        }
    }

    fn target(kind: Kind, name: &str) -> Target {
        Target {
            kind,
            namespace: None,
            name: name.into(),
        }
    }

    #[test]
    fn cleanup_goes_stage_by_stage_and_never_touches_what_is_not_ours() {
        let claim = target(Kind::ReaderClaim, "c");
        let view = target(Kind::ReaderVolume, "v");
        let job = target(Kind::Job, "j");
        let lease = target(Kind::Lease, "l");
        let all = |c: Seen, v: Seen, j: Seen, l: Seen| {
            vec![
                (claim.clone(), c),
                (view.clone(), v),
                (job.clone(), j),
                (lease.clone(), l),
            ]
        };
        assert_eq!(
            cleanup_step(&all(
                present(true),
                present(true),
                present(true),
                present(true)
            )),
            Cleanup::Delete(vec![(claim.clone(), "uid".into())])
        );
        let terminating = Seen::Present {
            uid: "uid".into(),
            ours: true,
            terminating: true,
            busy: None,
        };
        assert_eq!(
            cleanup_step(&all(terminating, present(true), Seen::Gone, Seen::Gone)),
            Cleanup::Wait(claim.clone(), Keep::Terminating)
        );
        assert_eq!(
            cleanup_step(&all(Seen::Gone, present(true), present(true), Seen::Gone)),
            Cleanup::Delete(vec![(view.clone(), "uid".into())])
        );
        let attached = Seen::Present {
            uid: "uid".into(),
            ours: true,
            terminating: false,
            busy: Some(Keep::Attached),
        };
        assert_eq!(
            cleanup_step(&all(Seen::Gone, attached, present(true), Seen::Gone)),
            Cleanup::Wait(view.clone(), Keep::Attached)
        );
        // An object with a named name that is not ours stays and does not hold anything up.
        assert_eq!(
            cleanup_step(&all(
                present(false),
                Seen::Gone,
                present(false),
                present(true)
            )),
            Cleanup::Delete(vec![(lease.clone(), "uid".into())])
        );
        assert_eq!(
            cleanup_step(&all(present(false), Seen::Gone, Seen::Gone, Seen::Gone)),
            Cleanup::Finish
        );
    }

    fn pv(
        name: &str,
        role: Option<&str>,
        claim_ns: &str,
        claim: &str,
        phase: &str,
    ) -> PersistentVolume {
        let mut labels = BTreeMap::new();
        if let Some(r) = role {
            labels.insert(VOLUME_ROLE_LABEL.to_owned(), r.to_owned());
            labels.insert(MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned());
        }
        // As a provisioner names and annotates a PV it made for a claim of UID CLAIM_UID.
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(labels),
                annotations: Some(BTreeMap::from([(
                    PROVISIONED_BY_ANNOTATION.to_owned(),
                    "csi.example.com".to_owned(),
                )])),
                creation_timestamp: Some(Time(at(0))),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeSpec {
                persistent_volume_reclaim_policy: Some("Retain".into()),
                claim_ref: Some(ObjectReference {
                    namespace: Some(claim_ns.into()),
                    name: Some(claim.into()),
                    uid: Some(CLAIM_UID.into()),
                    ..ObjectReference::default()
                }),
                csi: Some(CSIPersistentVolumeSource {
                    driver: "csi.example.com".into(),
                    volume_handle: "vol-1".into(),
                    read_only: Some(role == Some(ROLE_READER_SHARED)),
                    ..CSIPersistentVolumeSource::default()
                }),
                ..PersistentVolumeSpec::default()
            }),
            status: Some(PersistentVolumeStatus {
                phase: Some(phase.into()),
                ..PersistentVolumeStatus::default()
            }),
        }
    }

    const CLAIM_UID: &str = "0f0e0d0c";
    const PRIMARY: &str = "pvc-0f0e0d0c";

    fn facts() -> PvFacts {
        PvFacts {
            attached: false,
            claim_in_use: false,
            claim_gone: true,
            namespace: NamespaceState::Live,
            named_by_binding: false,
            views: Vec::new(),
        }
    }

    const PRIMARY_CLAIM: &str = "rw-pvc-0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn orphan_views_go_only_when_released_or_their_namespace_is_surely_gone() {
        let c = config();
        let now = at(1);
        let released = pv(
            "ro-1",
            Some(ROLE_READER_SHARED),
            "team-a",
            "ro-pvc-x",
            "Released",
        );
        assert_eq!(
            pv_verdict(&released, &facts(), now, &c),
            PvVerdict::DeleteObject(Rule::OrphanView)
        );
        let bound = pv(
            "ro-1",
            Some(ROLE_READER_SHARED),
            "team-a",
            "ro-pvc-x",
            "Bound",
        );
        assert_eq!(
            pv_verdict(&bound, &facts(), now, &c),
            PvVerdict::Keep(Rule::OrphanView, Keep::Bound)
        );
        let gone = PvFacts {
            namespace: NamespaceState::Gone,
            ..facts()
        };
        assert_eq!(
            pv_verdict(&bound, &gone, now, &c),
            PvVerdict::DeleteObject(Rule::OrphanView)
        );
        let unknown = PvFacts {
            namespace: NamespaceState::Unknown,
            ..facts()
        };
        assert_eq!(
            pv_verdict(&bound, &unknown, now, &c),
            PvVerdict::Keep(Rule::OrphanView, Keep::NamespaceUncertain)
        );
        let attached = PvFacts {
            attached: true,
            ..gone.clone()
        };
        assert_eq!(
            pv_verdict(&released, &attached, now, &c),
            PvVerdict::Keep(Rule::OrphanView, Keep::Attached)
        );
        let mut delete_policy = released.clone();
        delete_policy
            .spec
            .as_mut()
            .unwrap()
            .persistent_volume_reclaim_policy = Some("Delete".into());
        assert_eq!(
            pv_verdict(&delete_policy, &facts(), now, &c),
            PvVerdict::Keep(Rule::OrphanView, Keep::NotRetain)
        );
        // A look-alike: the role label without warmcache's managed-by label.
        let mut foreign = released.clone();
        foreign
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(MANAGED_BY_LABEL);
        assert_eq!(pv_verdict(&foreign, &facts(), now, &c), PvVerdict::Ignore);
    }

    #[test]
    fn abandoned_primaries_are_released_incomplete_and_old_enough() {
        let c = config();
        let p = pv(
            PRIMARY,
            None,
            "nvca-modelcache-init",
            PRIMARY_CLAIM,
            "Released",
        );
        assert_eq!(
            pv_verdict(&p, &facts(), at(DEFAULT_ABANDON_AFTER_SECONDS - 1), &c),
            PvVerdict::Keep(Rule::AbandonedPrimary, Keep::Young)
        );
        let late = at(DEFAULT_ABANDON_AFTER_SECONDS);
        // Created long ago but Released a minute ago: young.
        let mut just_released = p.clone();
        just_released
            .status
            .as_mut()
            .unwrap()
            .last_phase_transition_time = Some(Time(at(DEFAULT_ABANDON_AFTER_SECONDS - 60)));
        assert_eq!(
            pv_verdict(&just_released, &facts(), late, &c),
            PvVerdict::Keep(Rule::AbandonedPrimary, Keep::Young)
        );
        assert_eq!(
            pv_verdict(&p, &facts(), late, &c),
            PvVerdict::Reclaim {
                rule: Rule::AbandonedPrimary,
                views: vec![]
            }
        );
        // Its claim read afresh still exists (or the PV's claimRef.uid was just cleared for a
        // rebind, and its phase lags): not released.
        let claim_back = PvFacts {
            claim_gone: false,
            ..facts()
        };
        assert_eq!(pv_verdict(&p, &claim_back, late, &c), PvVerdict::Ignore);
        let mut rebinding = p.clone();
        rebinding
            .spec
            .as_mut()
            .unwrap()
            .claim_ref
            .as_mut()
            .unwrap()
            .uid = None;
        assert_eq!(
            pv_verdict(&rebinding, &facts(), late, &c),
            PvVerdict::Ignore
        );
        // A writer view of it still bound (a download writing through it): kept; released, it
        // goes first.
        let writer_view = |released| ViewFacts {
            name: "rw-view".into(),
            attached: false,
            released,
            namespace: NamespaceState::Live,
        };
        let writing = PvFacts {
            views: vec![writer_view(false)],
            ..facts()
        };
        assert_eq!(
            pv_verdict(&p, &writing, late, &c),
            PvVerdict::Keep(Rule::AbandonedPrimary, Keep::ViewInUse)
        );
        let written = PvFacts {
            views: vec![writer_view(true)],
            ..facts()
        };
        assert_eq!(
            pv_verdict(&p, &written, late, &c),
            PvVerdict::Reclaim {
                rule: Rule::AbandonedPrimary,
                views: vec!["rw-view".into()]
            }
        );
        // Not the provisioner's volume for that claim: a retained PV recycled by hand onto the
        // claim name (another claim UID in its name), or annotated by another driver.
        let mut recycled = p.clone();
        recycled.metadata.name = Some("pvc-aaaaaaaa".into());
        assert_eq!(pv_verdict(&recycled, &facts(), late, &c), PvVerdict::Ignore);
        let mut other_driver = p.clone();
        other_driver
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(PROVISIONED_BY_ANNOTATION.into(), "nfs.example.com".into());
        assert_eq!(
            pv_verdict(&other_driver, &facts(), late, &c),
            PvVerdict::Ignore
        );
        let bound = pv(
            PRIMARY,
            None,
            "nvca-modelcache-init",
            PRIMARY_CLAIM,
            "Bound",
        );
        assert_eq!(
            pv_verdict(&bound, &facts(), at(99_999), &c),
            PvVerdict::Ignore
        );
        // Same claim name in another namespace, or a claim name that is not ours: not a primary.
        for (ns, claim) in [
            ("team-a", PRIMARY_CLAIM),
            ("nvca-modelcache-init", "rw-pvc-short"),
            ("nvca-modelcache-init", "data"),
        ] {
            let other = pv(PRIMARY, None, ns, claim, "Released");
            assert_eq!(
                pv_verdict(&other, &facts(), at(99_999), &c),
                PvVerdict::Ignore,
                "{ns}/{claim}"
            );
        }
        // A writer view never counts as a primary: Released, it is an orphan view (object
        // only).
        let writer = pv(
            "rw-1",
            Some(ROLE_WRITER),
            "nvca-modelcache-init",
            PRIMARY_CLAIM,
            "Released",
        );
        assert_eq!(
            pv_verdict(&writer, &facts(), at(99_999), &c),
            PvVerdict::DeleteObject(Rule::OrphanView)
        );
    }

    fn complete(stamp: Option<i64>) -> PersistentVolume {
        let mut p = pv(
            PRIMARY,
            Some(ROLE_PRIMARY),
            "nvca-modelcache-init",
            PRIMARY_CLAIM,
            "Released",
        );
        p.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(COMPLETE_LABEL.into(), "true".into());
        if let Some(s) = stamp {
            p.metadata.annotations = Some(BTreeMap::from([(
                LAST_USED_ANNOTATION.to_owned(),
                at(s).to_string(),
            )]));
        }
        p
    }

    #[test]
    fn complete_primaries_are_kept_for_their_retention_and_while_read() {
        let c = config();
        let r = DEFAULT_RETENTION_SECONDS;
        let view = |bound: bool, namespace| ViewFacts {
            name: "ro-1".into(),
            attached: false,
            released: !bound,
            namespace,
        };
        assert_eq!(
            pv_verdict(&complete(None), &facts(), at(r - 1), &c),
            PvVerdict::Keep(Rule::ExpiredPrimary, Keep::InsideRetention)
        );
        // The stamp of the last retirement moves the clock.
        assert_eq!(
            pv_verdict(&complete(Some(100)), &facts(), at(r + 99), &c),
            PvVerdict::Keep(Rule::ExpiredPrimary, Keep::InsideRetention)
        );
        let with_views = PvFacts {
            views: vec![
                view(false, NamespaceState::Live),
                view(true, NamespaceState::Gone),
            ],
            ..facts()
        };
        assert_eq!(
            pv_verdict(&complete(None), &with_views, at(r), &c),
            PvVerdict::Reclaim {
                rule: Rule::ExpiredPrimary,
                views: vec!["ro-1".into(), "ro-1".into()]
            }
        );
        for (bound, ns) in [
            (true, NamespaceState::Live),
            (true, NamespaceState::Unknown),
        ] {
            let read = PvFacts {
                views: vec![view(bound, ns)],
                ..facts()
            };
            assert_eq!(
                pv_verdict(&complete(None), &read, at(r), &c),
                PvVerdict::Keep(Rule::ExpiredPrimary, Keep::ViewInUse)
            );
        }
        let named = PvFacts {
            named_by_binding: true,
            ..facts()
        };
        assert_eq!(
            pv_verdict(&complete(None), &named, at(10 * r), &c),
            PvVerdict::Keep(Rule::ExpiredPrimary, Keep::NamedByBinding)
        );
        let forever = Config {
            retention_seconds: 0,
            ..config()
        };
        assert_eq!(
            pv_verdict(&complete(None), &facts(), at(100 * r), &forever),
            PvVerdict::Keep(Rule::ExpiredPrimary, Keep::KeptForever)
        );
    }

    fn pod(claim: &str, holder: bool, phase: &str) -> Pod {
        let mut labels = BTreeMap::new();
        if holder {
            labels.insert(COMPONENT_LABEL.to_owned(), MOUNT_HOLDER.to_owned());
            labels.insert(MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned());
        }
        Pod {
            metadata: ObjectMeta {
                labels: Some(labels),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                volumes: Some(vec![Volume {
                    name: "m".into(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: claim.into(),
                        read_only: Some(true),
                    }),
                    ..Volume::default()
                }]),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                ..PodStatus::default()
            }),
        }
    }

    #[test]
    fn orphan_claims_are_old_view_claims_only_mount_holders_use() {
        let c = config();
        let b = binding();
        let (_, claim) = crate::view::read_only_view(
            &b,
            &crate::testing::primary_pv(),
            "team-a",
            Some(1 << 20),
            &[],
        )
        .unwrap();
        let mut claim = claim;
        claim.metadata.creation_timestamp = Some(Time(at(0)));
        let name = claim.metadata.name.clone().unwrap();
        let late = at(DEFAULT_ORPHAN_CLAIM_AFTER_SECONDS);
        assert_eq!(
            claim_verdict(
                &claim,
                false,
                &[],
                at(DEFAULT_ORPHAN_CLAIM_AFTER_SECONDS - 1),
                &c
            ),
            ClaimVerdict::Keep(Keep::Young)
        );
        let reader = pod(&name, false, "Running");
        let holder = pod(&name, true, "Running");
        let done = pod(&name, false, "Succeeded");
        assert_eq!(
            claim_verdict(&claim, false, &[&reader], late, &c),
            ClaimVerdict::Keep(Keep::InUse)
        );
        assert_eq!(
            claim_verdict(&claim, false, &[&holder, &done], late, &c),
            ClaimVerdict::Delete
        );
        assert_eq!(claims_of(&holder).collect::<Vec<_>>(), [name.as_str()]);
        // A claim that only looks like a view (no managed-by label) is never touched.
        let mut foreign = claim.clone();
        foreign
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(MANAGED_BY_LABEL);
        assert_eq!(
            claim_verdict(&foreign, false, &[], late, &c),
            ClaimVerdict::Ignore
        );
        // A view a binding records stays: the binding controller would only create it again.
        assert_eq!(
            claim_verdict(&claim, true, &[], late, &c),
            ClaimVerdict::Keep(Keep::NamedByBinding)
        );
        // The primary claim is not a view claim.
        let primary = crate::view::primary_claim(&b, crate::view::view_size(1));
        assert_eq!(
            claim_verdict(&primary, false, &[], late, &c),
            ClaimVerdict::Ignore
        );
    }

    #[test]
    fn ownership_needs_warmcache_and_the_binding_label() {
        let mut m = ObjectMeta {
            labels: Some(BTreeMap::from([(
                MANAGED_BY_LABEL.to_owned(),
                MANAGED_BY_VALUE.to_owned(),
            )])),
            ..ObjectMeta::default()
        };
        assert!(is_ours(&m, None));
        assert!(!is_ours(&m, Some("model-cache-a")), "no binding label");
        m.labels
            .as_mut()
            .unwrap()
            .insert(BINDING_LABEL.into(), "model-cache-b".into());
        assert!(!is_ours(&m, Some("model-cache-a")));
        assert!(is_ours(&m, Some("model-cache-b")));
        m.labels.as_mut().unwrap().remove(MANAGED_BY_LABEL);
        assert!(!is_ours(&m, Some("model-cache-b")));
    }

    /// An encrypted binding and its Secret (metadata) and class, as the binding controller
    /// makes them.
    fn encrypted_cache() -> (ModelCacheBinding, ObjectMeta, StorageClass) {
        use crate::encryption::{EncryptionKey, KEY_BYTES, encryption_names, key_secret};
        let mut b = crate::testing::binding(Transition::RoxReadOnly);
        b.spec.decision.encryption_required = true;
        let hash = warmcache_api_modelcache::identity_hash(&b.spec.identity);
        b.spec.resources.secret_names = vec![hash.clone()];
        b.spec.resources.storage_class_names = vec![format!("{hash}-sc")];
        let names = encryption_names(&b).unwrap().unwrap();
        let secret = key_secret(&b, &names, &EncryptionKey::from_bytes([7; KEY_BYTES]));
        let mut parameters = BTreeMap::new();
        for (name, namespace) in SECRET_PARAMETERS {
            parameters.insert(name.to_owned(), names.secret.clone());
            parameters.insert(namespace.to_owned(), names.namespace.clone());
        }
        let class = StorageClass {
            metadata: ObjectMeta {
                name: Some(names.class.clone()),
                labels: secret.metadata.labels.clone(),
                ..ObjectMeta::default()
            },
            provisioner: b.spec.decision.provisioner.clone(),
            parameters: Some(parameters),
            reclaim_policy: Some("Retain".into()),
            ..StorageClass::default()
        };
        (b, secret.metadata, class)
    }

    fn verdicts(
        uses: &EncryptionUses,
        secret: &ObjectMeta,
        class: &StorageClass,
    ) -> (EncryptionVerdict, EncryptionVerdict) {
        let c = config();
        let one = |object: EncryptionObject<'_>| {
            let Some(hash) = encryption_hash(object, &c) else {
                return EncryptionVerdict::Ignore;
            };
            let facts = uses.facts(object, hash, &c.control_namespace);
            encryption_verdict(object, &facts, &c)
        };
        (
            one(EncryptionObject::Secret(secret)),
            one(EncryptionObject::StorageClass(class)),
        )
    }

    fn reference(namespace: Option<&str>, name: &str) -> SecretReference {
        SecretReference {
            name: Some(name.into()),
            namespace: namespace.map(Into::into),
        }
    }

    #[test]
    fn encryption_objects_are_kept_while_a_binding_of_their_cache_exists() {
        let (b, secret, class) = encrypted_cache();
        let mut uses = EncryptionUses::default();
        uses.add_class(class.metadata.name.as_deref().unwrap());
        // Any phase, also being deleted: the binding is only its identity here.
        let mut deleting = b.clone();
        deleting.metadata.deletion_timestamp = Some(Time(at(0)));
        uses.add_binding(&deleting);
        assert_eq!(
            verdicts(&uses, &secret, &class),
            (
                EncryptionVerdict::Keep(Keep::BindingExists),
                EncryptionVerdict::Keep(Keep::BindingExists)
            )
        );
        // A binding of another cache does not count.
        let mut other = b;
        other.spec.identity = warmcache_api_modelcache::v2beta1::BindingIdentity::new(
            warmcache_api_modelcache::v2beta1::Workflow::HelmModelCache,
            "domain-2",
            crate::testing::HANDLE,
        );
        let mut uses = EncryptionUses::default();
        uses.add_binding(&other);
        assert_eq!(
            verdicts(&uses, &secret, &class),
            (EncryptionVerdict::Delete, EncryptionVerdict::Delete)
        );
    }

    #[test]
    fn encryption_objects_are_kept_while_a_volume_names_them() {
        let (_, secret, class) = encrypted_cache();
        let hash = secret.name.clone().unwrap();
        let control = "nvca-modelcache-init";
        let class_name = class.metadata.name.clone().unwrap();
        // The primary: provisioned on the class, the references the provisioner records.
        let mut primary = crate::testing::primary_pv();
        primary.spec.as_mut().unwrap().storage_class_name = Some(class_name.clone());
        let uses_of = |pv: &PersistentVolume| {
            let mut uses = EncryptionUses::default();
            uses.add_volume(pv);
            uses
        };
        assert_eq!(
            verdicts(&uses_of(&primary), &secret, &class),
            (
                EncryptionVerdict::Keep(Keep::VolumeUses),
                EncryptionVerdict::Keep(Keep::VolumeUses)
            ),
            "the class names the key: its volumes keep both"
        );
        // The same through the deprecated class annotation.
        let mut beta = crate::testing::primary_pv();
        beta.spec.as_mut().unwrap().storage_class_name = None;
        beta.metadata.annotations = Some(BTreeMap::from([(
            BETA_STORAGE_CLASS_ANNOTATION.to_owned(),
            class_name.clone(),
        )]));
        assert_eq!(
            verdicts(&uses_of(&beta), &secret, &class).1,
            EncryptionVerdict::Keep(Keep::VolumeUses)
        );
        // A read-only view: no class, only secret references. Each reference of the CSI source
        // keeps the Secret (not the class: a view needs the key, not the class).
        type Set = fn(&mut CSIPersistentVolumeSource, SecretReference);
        let setters: [Set; 5] = [
            |c, r| c.node_publish_secret_ref = Some(r),
            |c, r| c.node_stage_secret_ref = Some(r),
            |c, r| c.controller_publish_secret_ref = Some(r),
            |c, r| c.controller_expand_secret_ref = Some(r),
            |c, r| c.node_expand_secret_ref = Some(r),
        ];
        for (i, set) in setters.iter().enumerate() {
            for (namespace, kept) in [(Some(control), true), (None, true), (Some("team-a"), false)]
            {
                let mut view = crate::testing::primary_pv();
                view.spec.as_mut().unwrap().storage_class_name = Some(String::new());
                set(
                    view.spec.as_mut().unwrap().csi.as_mut().unwrap(),
                    reference(namespace, &hash),
                );
                let want = if kept {
                    EncryptionVerdict::Keep(Keep::VolumeUses)
                } else {
                    EncryptionVerdict::Delete
                };
                assert_eq!(
                    verdicts(&uses_of(&view), &secret, &class),
                    (want, EncryptionVerdict::Delete),
                    "reference {i} in {namespace:?}"
                );
            }
            // Another Secret's name in the control namespace: not ours.
            let mut other = crate::testing::primary_pv();
            set(
                other.spec.as_mut().unwrap().csi.as_mut().unwrap(),
                reference(Some(control), "registry-credentials"),
            );
            assert_eq!(
                verdicts(&uses_of(&other), &secret, &class),
                (EncryptionVerdict::Delete, EncryptionVerdict::Delete)
            );
        }
        // The annotations DeleteVolume reads the Secret from.
        let mut deletable = crate::testing::primary_pv();
        deletable.metadata.annotations = Some(BTreeMap::from([
            (DELETION_SECRET_NAME_ANNOTATION.to_owned(), hash.clone()),
            (
                DELETION_SECRET_NAMESPACE_ANNOTATION.to_owned(),
                control.to_owned(),
            ),
        ]));
        assert_eq!(
            verdicts(&uses_of(&deletable), &secret, &class),
            (
                EncryptionVerdict::Keep(Keep::VolumeUses),
                EncryptionVerdict::Delete
            )
        );
    }

    #[test]
    fn encryption_objects_are_kept_while_a_claim_asks_for_the_class() {
        let (_, secret, class) = encrypted_cache();
        let class_name = class.metadata.name.clone().unwrap();
        let b = binding();
        let mut claim = crate::view::primary_claim(&b, crate::view::view_size(1));
        claim.spec.as_mut().unwrap().storage_class_name = Some(class_name.clone());
        let mut uses = EncryptionUses::default();
        uses.add_class(&class_name);
        uses.add_claim(&claim);
        assert_eq!(
            verdicts(&uses, &secret, &class),
            (
                EncryptionVerdict::Keep(Keep::ClaimUses),
                EncryptionVerdict::Keep(Keep::ClaimUses)
            )
        );
        let mut beta = claim.clone();
        beta.spec.as_mut().unwrap().storage_class_name = None;
        beta.metadata.annotations = Some(BTreeMap::from([(
            BETA_STORAGE_CLASS_ANNOTATION.to_owned(),
            class_name,
        )]));
        let mut uses = EncryptionUses::default();
        uses.add_claim(&beta);
        assert_eq!(
            verdicts(&uses, &secret, &class).1,
            EncryptionVerdict::Keep(Keep::ClaimUses)
        );
    }

    #[test]
    fn the_class_goes_first_and_the_secret_in_a_later_sweep() {
        let (_, secret, class) = encrypted_cache();
        let mut uses = EncryptionUses::default();
        uses.add_class(class.metadata.name.as_deref().unwrap());
        // An unrelated volume and claim.
        uses.add_volume(&crate::testing::primary_pv());
        assert_eq!(
            verdicts(&uses, &secret, &class),
            (
                EncryptionVerdict::Keep(Keep::ClassExists),
                EncryptionVerdict::Delete
            )
        );
        // The next sweep's lists: the class is gone.
        uses.classes.clear();
        assert_eq!(
            verdicts(&uses, &secret, &class).0,
            EncryptionVerdict::Delete
        );
        // Being deleted already: waited on, not deleted again.
        let mut terminating = secret.clone();
        terminating.deletion_timestamp = Some(Time(at(0)));
        assert_eq!(
            verdicts(&uses, &terminating, &class).0,
            EncryptionVerdict::Keep(Keep::Terminating)
        );
    }

    #[test]
    fn only_warmcaches_encryption_objects_of_the_control_namespace_are_looked_at() {
        let (_, secret, class) = encrypted_cache();
        let c = config();
        let hash = secret.name.clone().unwrap();
        assert_eq!(
            encryption_hash(EncryptionObject::Secret(&secret), &c),
            Some(hash.as_str())
        );
        assert_eq!(
            encryption_hash(EncryptionObject::StorageClass(&class), &c),
            Some(hash.as_str())
        );
        let uses = EncryptionUses::default();
        let ignored = |s: &ObjectMeta, k: &StorageClass| {
            assert_eq!(
                verdicts(&uses, s, k),
                (EncryptionVerdict::Ignore, EncryptionVerdict::Ignore)
            );
        };
        // Without any one of the three labels.
        for key in [MANAGED_BY_LABEL, MODEL_LABEL, VOLUME_ROLE_LABEL] {
            let mut s = secret.clone();
            s.labels.as_mut().unwrap().remove(key);
            let mut k = class.clone();
            k.metadata.labels.as_mut().unwrap().remove(key);
            ignored(&s, &k);
        }
        // Another role, another manager.
        let mut s = secret.clone();
        s.labels
            .as_mut()
            .unwrap()
            .insert(VOLUME_ROLE_LABEL.into(), ROLE_PRIMARY.into());
        let mut k = class.clone();
        k.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(MANAGED_BY_LABEL.into(), "helm".into());
        ignored(&s, &k);
        // A name that is not the one derived from its model label (another cache's, or a
        // user's name with our labels), or a model label that is not an identity hash.
        let other = "0".repeat(48);
        let mut s = secret.clone();
        s.labels
            .as_mut()
            .unwrap()
            .insert(MODEL_LABEL.into(), other.clone());
        let mut k = class.clone();
        k.metadata.name = Some(format!("{hash}-other"));
        ignored(&s, &k);
        let mut s = secret.clone();
        s.name = Some("registry-credentials".into());
        s.labels
            .as_mut()
            .unwrap()
            .insert(MODEL_LABEL.into(), "registry-credentials".into());
        let mut k = class.clone();
        k.metadata.name = Some("nvcf-sc".into());
        k.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(MODEL_LABEL.into(), "nvcf".into());
        ignored(&s, &k);
        // The Secret outside the control namespace; a class whose parameters name a Secret of
        // another control namespace (another installation's) or another Secret.
        let mut s = secret.clone();
        s.namespace = Some("team-a".into());
        let mut k = class.clone();
        k.parameters.as_mut().unwrap().insert(
            SECRET_PARAMETERS[1].1.to_owned(),
            "other-control-namespace".into(),
        );
        ignored(&s, &k);
        let mut k = class.clone();
        k.parameters
            .as_mut()
            .unwrap()
            .insert(SECRET_PARAMETERS[0].0.to_owned(), "someone-elses".into());
        assert_eq!(verdicts(&uses, &secret, &k).1, EncryptionVerdict::Ignore);
        let mut k = class.clone();
        k.parameters = None;
        assert_eq!(verdicts(&uses, &secret, &k).1, EncryptionVerdict::Ignore);
        // Ours and unused: both go (the class first: it is not in the listed classes here).
        assert_eq!(
            verdicts(&uses, &secret, &class),
            (EncryptionVerdict::Delete, EncryptionVerdict::Delete)
        );
    }

    #[test]
    fn names_are_unique_and_bounded() {
        let rules: std::collections::BTreeSet<_> = Rule::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(rules.len(), Rule::ALL.len());
        let keeps: std::collections::BTreeSet<_> = Keep::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(keeps.len(), Keep::ALL.len());
        assert!(Keep::ALL.iter().all(|k| !k.words().is_empty()));
    }
}
