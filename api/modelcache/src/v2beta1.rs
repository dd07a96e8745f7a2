//! `nvca.nvcf.nvidia.io/v2beta1` ModelCacheBinding.
//!
//! Field doc comments here become the CRD's schema descriptions, i.e. what
//! `kubectl explain modelcachebinding.<path>` prints.
//!
//! # Rules the API server enforces (CEL, `x-kubernetes-validations`)
//!
//! | where | rule | refusal message |
//! |---|---|---|
//! | object | [`RULE_STATUS_KEPT`] | [`MSG_STATUS_KEPT`] |
//! | `spec` | [`RULE_SPEC_IMMUTABLE`] | [`MSG_SPEC_IMMUTABLE`] |
//! | `spec.decision` | [`RULE_ACCESS_MODES_MATCH_TRANSITION`] | [`MSG_ACCESS_MODES_MATCH_TRANSITION`] |
//! | `spec.decision` | [`RULE_ENCRYPTION_NEEDS_ROX`] | [`MSG_ENCRYPTION_NEEDS_ROX`] |
//! | `spec.decision` | [`RULE_WRITER_IDENTITY_WITH_RWX`] | [`MSG_WRITER_IDENTITY_WITH_RWX`] |
//! | `status` | [`RULE_PHASE_KEPT`] | [`MSG_PHASE_KEPT`] |
//! | `status` | [`RULE_RETIRING_IS_FINAL`] | [`MSG_RETIRING_IS_FINAL`] |
//! | `status` | [`RULE_PROVIDER_DATA_IDENTITY_IMMUTABLE`] | [`MSG_PROVIDER_DATA_IDENTITY_IMMUTABLE`] |
//! | `status` | [`RULE_RESOLVED_REVISION_IMMUTABLE`] | [`MSG_RESOLVED_REVISION_IMMUTABLE`] |
//!
//! Rules that read `oldSelf` are transition rules: the API server runs them only on update and
//! only when the old object has the field the rule sits on, so creating a binding and the first
//! status write are always allowed by them. Status rules bite through the `/status` subresource
//! (the main endpoint keeps the stored status); the spec rule bites through the main endpoint
//! (`/status` keeps the stored spec).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::names::sha256_digest;

/// API version string of this module's types: `nvca.nvcf.nvidia.io/v2beta1`.
pub const API_VERSION: &str = "nvca.nvcf.nvidia.io/v2beta1";

/// Version part of [`API_VERSION`].
pub const VERSION: &str = "v2beta1";

/// CEL (object): once a status was recorded, it cannot be removed.
pub const RULE_STATUS_KEPT: &str = "!has(oldSelf.status) || has(self.status)";
/// Refusal message of [`RULE_STATUS_KEPT`].
pub const MSG_STATUS_KEPT: &str = "status cannot be removed once it has been recorded";

/// CEL (`spec`): the spec never changes after creation.
pub const RULE_SPEC_IMMUTABLE: &str = "self == oldSelf";
/// Refusal message of [`RULE_SPEC_IMMUTABLE`].
pub const MSG_SPEC_IMMUTABLE: &str = "spec is immutable: the storage decision of a binding is fixed when it is created; delete the binding and let a new one be decided";

/// CEL (`spec.decision`): the required access modes are exactly the ones the transition needs.
pub const RULE_ACCESS_MODES_MATCH_TRANSITION: &str = "self.transition == 'rwxReadOnly' ? (size(self.requiredAccessModes) == 1 && 'ReadWriteMany' in self.requiredAccessModes) : (size(self.requiredAccessModes) == 2 && 'ReadWriteOnce' in self.requiredAccessModes && 'ReadOnlyMany' in self.requiredAccessModes)";
/// Refusal message of [`RULE_ACCESS_MODES_MATCH_TRANSITION`].
pub const MSG_ACCESS_MODES_MATCH_TRANSITION: &str = "requiredAccessModes must be exactly the transition's modes: [ReadWriteMany] for rwxReadOnly, [ReadWriteOnce, ReadOnlyMany] for roxReadOnly";

/// CEL (`spec.decision`): an encrypted cache needs the roxReadOnly transition.
pub const RULE_ENCRYPTION_NEEDS_ROX: &str =
    "!self.encryptionRequired || self.transition == 'roxReadOnly'";
/// Refusal message of [`RULE_ENCRYPTION_NEEDS_ROX`].
pub const MSG_ENCRYPTION_NEEDS_ROX: &str =
    "encryptionRequired is only supported with the roxReadOnly transition";

/// CEL (`spec.decision`): a writer identity is recorded exactly for the rwxReadOnly transition.
pub const RULE_WRITER_IDENTITY_WITH_RWX: &str =
    "has(self.writerIdentity) == (self.transition == 'rwxReadOnly')";
/// Refusal message of [`RULE_WRITER_IDENTITY_WITH_RWX`].
pub const MSG_WRITER_IDENTITY_WITH_RWX: &str = "writerIdentity is required for the rwxReadOnly transition and must be absent for roxReadOnly, whose writer owns its volume";

/// CEL (`status`): once a phase was recorded, it cannot be removed.
pub const RULE_PHASE_KEPT: &str = "!has(oldSelf.phase) || has(self.phase)";
/// Refusal message of [`RULE_PHASE_KEPT`].
pub const MSG_PHASE_KEPT: &str = "status.phase cannot be removed once it has been recorded";

/// CEL (`status`): Retiring is final.
pub const RULE_RETIRING_IS_FINAL: &str = "!has(oldSelf.phase) || oldSelf.phase != 'Retiring' || (has(self.phase) && self.phase == 'Retiring')";
/// Refusal message of [`RULE_RETIRING_IS_FINAL`].
pub const MSG_RETIRING_IS_FINAL: &str =
    "phase Retiring is final: a Retiring binding can never become Active again";

/// CEL (`status`): `realized.providerDataIdentity`, once recorded, stays present and unchanged.
pub const RULE_PROVIDER_DATA_IDENTITY_IMMUTABLE: &str = "!has(oldSelf.realized) || !has(oldSelf.realized.providerDataIdentity) || (has(self.realized) && has(self.realized.providerDataIdentity) && self.realized.providerDataIdentity == oldSelf.realized.providerDataIdentity)";
/// Refusal message of [`RULE_PROVIDER_DATA_IDENTITY_IMMUTABLE`].
pub const MSG_PROVIDER_DATA_IDENTITY_IMMUTABLE: &str = "status.realized.providerDataIdentity is immutable once recorded: it must stay present and unchanged";

/// CEL (`status`): `resolvedRevision`, once recorded, never changes: readers were told which
/// commit their copy holds. A write without it is allowed (a controller of an earlier version
/// drops fields it does not know; the complete PV keeps the commit and it is recorded again).
pub const RULE_RESOLVED_REVISION_IMMUTABLE: &str = "!has(oldSelf.resolvedRevision) || !has(self.resolvedRevision) || self.resolvedRevision == oldSelf.resolvedRevision";
/// Refusal message of [`RULE_RESOLVED_REVISION_IMMUTABLE`].
pub const MSG_RESOLVED_REVISION_IMMUTABLE: &str = "status.resolvedRevision cannot change once recorded: the copy holds that commit; a refresh downloads into a new binding";

/// Every CEL rule of the CRD with its refusal message, in schema order (object, spec,
/// spec.decision, status).
pub const CEL_RULES: [(&str, &str); 9] = [
    (RULE_STATUS_KEPT, MSG_STATUS_KEPT),
    (RULE_SPEC_IMMUTABLE, MSG_SPEC_IMMUTABLE),
    (
        RULE_ACCESS_MODES_MATCH_TRANSITION,
        MSG_ACCESS_MODES_MATCH_TRANSITION,
    ),
    (RULE_ENCRYPTION_NEEDS_ROX, MSG_ENCRYPTION_NEEDS_ROX),
    (RULE_WRITER_IDENTITY_WITH_RWX, MSG_WRITER_IDENTITY_WITH_RWX),
    (RULE_PHASE_KEPT, MSG_PHASE_KEPT),
    (RULE_RETIRING_IS_FINAL, MSG_RETIRING_IS_FINAL),
    (
        RULE_PROVIDER_DATA_IDENTITY_IMMUTABLE,
        MSG_PROVIDER_DATA_IDENTITY_IMMUTABLE,
    ),
    (
        RULE_RESOLVED_REVISION_IMMUTABLE,
        MSG_RESOLVED_REVISION_IMMUTABLE,
    ),
];

// Schema patterns (RE2 and Rust `regex` agree on these).
const SHA256_PATTERN: &str = "^sha256:[a-f0-9]{64}$";
const CONFIGURATION_DIGEST_PATTERN: &str = "^v1:sha256:[a-f0-9]{64}$";
const DNS1123_LABEL_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
const DNS1123_SUBDOMAIN_PATTERN: &str =
    "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
const VERSION_PATTERN: &str = "^v[0-9]+((alpha|beta)[0-9]+)?$";
const MOUNT_OPTION_PATTERN: &str = "^\\S(.*\\S)?$";
const COMMIT_PATTERN: &str = "^[0-9a-f]{40}$";

/// Which cache this is and the storage decision taken for it, recorded before any claim, Job or
/// PersistentVolume existed. Immutable: the API server refuses any change after creation.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[kube(
    group = "nvca.nvcf.nvidia.io",
    version = "v2beta1",
    kind = "ModelCacheBinding",
    plural = "modelcachebindings",
    singular = "modelcachebinding",
    shortname = "mcb",
    namespaced,
    status = "ModelCacheBindingStatus",
    derive = "PartialEq",
    doc = "A shared, read-only model cache: one per (workflow, sharing domain, cache handle). The spec freezes the storage decision taken before any claim, Job or PersistentVolume existed and never changes; the status lists the workloads using the cache and what exists on the storage. Bindings live in the control namespace (nvca-modelcache-init by default) and are named model-cache-<48 hex characters of SHA-256 of that workflow, sharing domain and cache handle>, so two sharing domains caching one model never share or adopt a binding.",
    printcolumn(
        name = "Workflow",
        type_ = "string",
        json_path = ".spec.identity.workflow",
        description = "Who reads the cache: regularModelCache (one namespace) or helmModelCache (a sharing domain)"
    ),
    printcolumn(
        name = "Provider",
        type_ = "string",
        json_path = ".spec.decision.provider",
        description = "Storage provider the cache was decided on"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Active or Retiring"
    ),
    printcolumn(
        name = "Model",
        type_ = "string",
        json_path = ".status.modelUri",
        description = "The model identity URI the cache holds (from the first reading pod)"
    ),
    printcolumn(
        name = "Revision",
        type_ = "string",
        json_path = ".status.resolvedRevision",
        description = "The commit the copy holds, recorded by the download (a floating revision such as main or a tag is pinned to it until a refresh)"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether readers can read the complete copy"
    ),
    printcolumn(
        name = "Population",
        type_ = "string",
        json_path = ".status.realized.populationState",
        description = "Pending, Populating, Ready or Failed"
    ),
    printcolumn(
        name = "Bytes",
        type_ = "integer",
        json_path = ".status.realized.bytes",
        description = "Bytes the download wrote, as measured by the writer"
    ),
    printcolumn(
        name = "Readers",
        type_ = "integer",
        json_path = ".status.requestReferenceCount",
        priority = 1,
        description = "Number of workloads using the cache"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new(RULE_STATUS_KEPT).message(MSG_STATUS_KEPT)
)]
#[x_kube(validation = Rule::new(RULE_SPEC_IMMUTABLE).message(MSG_SPEC_IMMUTABLE))]
#[schemars(transform = unwrap_descriptions)]
#[serde(rename_all = "camelCase")]
pub struct ModelCacheBindingSpec {
    /// Which cache this binding is: workflow, sharing domain and cache handle (the latter two
    /// as digests).
    pub identity: BindingIdentity,
    /// The storage decision, taken once from the model cache StorageClass and the storage
    /// capability catalog. Catalog, StorageClass or feature-gate changes after creation never
    /// alter it.
    pub decision: BindingDecision,
    /// The StorageClass the decision was taken on, pinned by UID and configuration digest so
    /// drift can be detected before any side effect.
    pub storage_class: BindingStorageClass,
    /// Deterministic names of the Kubernetes objects this binding owns. Retirement deletes
    /// exactly these (and the views in status.realized.views), nothing else.
    pub resources: BindingResources,
}

/// Identity of a cache.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BindingIdentity {
    /// Contract version of the identity and decision records. Currently v1alpha1.
    #[schemars(length(min = 1, max = 32), pattern(VERSION_PATTERN))]
    pub version: String,
    /// Who reads the cache. regularModelCache: only the namespace of the first request (the
    /// namespace has no sharing-domain label). helmModelCache: every namespace carrying the same
    /// nvca.nvcf.nvidia.io/model-cache-sharing-domain label value.
    pub workflow: Workflow,
    /// Digest of the raw sharing domain ("sha256:" and 64 lowercase hex digits): the namespace
    /// name for regularModelCache, the sharing-domain label value for helmModelCache.
    #[schemars(pattern(SHA256_PATTERN))]
    pub sharing_domain_digest: String,
    /// Digest of the raw cache handle ("sha256:" and 64 lowercase hex digits). The cache handle
    /// is the model identity URI, for example hf://Qwen/Qwen3-0.6B@v1; the binding name is
    /// derived from the same handle.
    #[schemars(pattern(SHA256_PATTERN))]
    pub cache_handle_digest: String,
}

impl BindingIdentity {
    /// The identity of the cache for `cache_handle` in `sharing_domain`, with both digests
    /// computed by [`sha256_digest`] and the current contract version
    /// ([`crate::SELECTION_VERSION`]).
    pub fn new(workflow: Workflow, sharing_domain: &str, cache_handle: &str) -> Self {
        Self {
            version: crate::SELECTION_VERSION.to_owned(),
            workflow,
            sharing_domain_digest: sha256_digest(sharing_domain),
            cache_handle_digest: sha256_digest(cache_handle),
        }
    }
}

/// Who reads a cache (the seed names are kept).
///
/// `regularModelCache`: readers only in the namespace of the first request.
/// `helmModelCache`: readers in every namespace of one sharing domain.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Workflow {
    // Readers only in the namespace of the first request.
    RegularModelCache,
    // Readers in every namespace of one sharing domain.
    HelmModelCache,
}

impl Workflow {
    /// The serialized value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::RegularModelCache => "regularModelCache",
            Self::HelmModelCache => "helmModelCache",
        }
    }
}

/// The storage decision, frozen at creation.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(
    validation = Rule::new(RULE_ACCESS_MODES_MATCH_TRANSITION).message(MSG_ACCESS_MODES_MATCH_TRANSITION),
    validation = Rule::new(RULE_ENCRYPTION_NEEDS_ROX).message(MSG_ENCRYPTION_NEEDS_ROX),
    validation = Rule::new(RULE_WRITER_IDENTITY_WITH_RWX).message(MSG_WRITER_IDENTITY_WITH_RWX)
)]
#[serde(rename_all = "camelCase")]
pub struct BindingDecision {
    /// Storage provider from the capability catalog entry of the provisioner (a free label such
    /// as nvmesh, weka, ociFss, netappTrident), kept for diagnostics and drift checks.
    #[schemars(length(min = 1, max = 253))]
    pub provider: String,
    /// CSI provisioner of the model cache StorageClass (its provisioner field), the catalog's
    /// lookup key.
    #[schemars(length(min = 1, max = 253))]
    pub provisioner: String,
    /// How readers reach the data. rwxReadOnly: one ReadWriteMany volume, written once and
    /// mounted read-only by every reader. roxReadOnly: a ReadWriteOnce volume written once, then
    /// one derived ReadOnlyMany view per reader namespace.
    pub transition: Transition,
    /// Access modes the transition needs, exactly: ReadWriteMany for rwxReadOnly; ReadWriteOnce
    /// and ReadOnlyMany for roxReadOnly.
    #[schemars(length(min = 1, max = 4), extend("x-kubernetes-list-type" = "set"))]
    pub required_access_modes: Vec<AccessMode>,
    /// Mount options put on every read-only view (the catalog's readerMountOptions for the
    /// driver, in catalog order). Omitted when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(min = 1, max = 32),
        inner(length(min = 1, max = 256), pattern(MOUNT_OPTION_PATTERN)),
        extend("x-kubernetes-list-type" = "atomic")
    )]
    pub required_mount_options: Vec<String>,
    /// Digest ("sha256:" and 64 lowercase hex digits) of the catalog profile of the selected
    /// driver for this workflow (provisioner, provider, access modes, reader mount options,
    /// encryption support, writer identity, workflow, transition). Edits to unrelated catalog
    /// entries do not change it.
    #[schemars(pattern(SHA256_PATTERN))]
    pub catalog_digest: String,
    /// Whether the cached data is encrypted at rest. Only the roxReadOnly transition supports
    /// encryption.
    pub encryption_required: bool,
    /// Who owns the files the download Job writes on the ReadWriteMany volume (rwxReadOnly
    /// only): fsGroup (the writer stays non-root and the driver applies the pod's fsGroup) or
    /// root (the driver does not apply fsGroup, so the writer runs as uid 0). Taken from the
    /// catalog entry, else from the CSIDriver's fsGroupPolicy, and frozen here so a later driver
    /// or catalog change never alters how an existing cache is written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = not_nullable)]
    pub writer_identity: Option<WriterIdentity>,
}

/// Who owns the files a ReadWriteMany cache's writer creates.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum WriterIdentity {
    // The writer stays non-root; the driver applies the pod's fsGroup.
    FsGroup,
    // The writer runs as uid 0; the driver does not apply fsGroup.
    Root,
}

impl WriterIdentity {
    /// The serialized value (also the catalog spelling).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::FsGroup => "fsGroup",
            Self::Root => "root",
        }
    }
}

/// How readers reach a cache's data (the flow decided from the catalog).
///
/// `rwxReadOnly`: one ReadWriteMany volume, mounted read-only by readers.
/// `roxReadOnly`: a ReadWriteOnce volume written once, then ReadOnlyMany views.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Transition {
    // One ReadWriteMany volume; readers mount it read-only.
    RwxReadOnly,
    // A ReadWriteOnce volume written once, then one ReadOnlyMany view per reader namespace.
    RoxReadOnly,
}

impl Transition {
    /// The serialized value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::RwxReadOnly => "rwxReadOnly",
            Self::RoxReadOnly => "roxReadOnly",
        }
    }

    /// The access modes this transition records in `requiredAccessModes`, in the order the
    /// controller writes them.
    pub const fn required_access_modes(self) -> &'static [AccessMode] {
        match self {
            Self::RwxReadOnly => &[AccessMode::ReadWriteMany],
            Self::RoxReadOnly => &[AccessMode::ReadWriteOnce, AccessMode::ReadOnlyMany],
        }
    }
}

/// A PersistentVolume access mode.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum AccessMode {
    // Read-write by a single node.
    ReadWriteOnce,
    // Read-only by many nodes.
    ReadOnlyMany,
    // Read-write by many nodes.
    ReadWriteMany,
    // Read-write by a single pod.
    ReadWriteOncePod,
}

impl AccessMode {
    /// The serialized value (the Kubernetes access mode name).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ReadWriteOnce => "ReadWriteOnce",
            Self::ReadOnlyMany => "ReadOnlyMany",
            Self::ReadWriteMany => "ReadWriteMany",
            Self::ReadWriteOncePod => "ReadWriteOncePod",
        }
    }
}

/// The model cache StorageClass as it was when the decision was taken.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BindingStorageClass {
    /// Name of the StorageClass (nvcf-sc).
    #[schemars(length(min = 1, max = 253), pattern(DNS1123_SUBDOMAIN_PATTERN))]
    pub name: String,
    /// UID of the StorageClass object; a StorageClass recreated under the same name has another
    /// UID and counts as drift.
    #[schemars(length(min = 1, max = 128))]
    pub uid: String,
    /// Reclaim policy of the StorageClass. Only Retain is accepted: cached data is deleted by
    /// explicit retirement, never by releasing a claim.
    pub reclaim_policy: ReclaimPolicy,
    /// Digest ("v1:sha256:" and 64 lowercase hex digits) of the StorageClass configuration:
    /// provisioner, sorted parameters, reclaim policy, volume binding mode, mount options and
    /// allowed topologies (metadata excluded).
    #[schemars(pattern(CONFIGURATION_DIGEST_PATTERN))]
    pub configuration_digest: String,
}

/// Reclaim policy of the model cache StorageClass. Only `Retain` is accepted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum ReclaimPolicy {
    // Volumes are kept when their claim is released.
    Retain,
}

/// Kubernetes objects a binding owns, by deterministic name. All names are DNS-1123
/// subdomains. Optional lists are omitted when empty.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BindingResources {
    /// Namespace the writer (download) Job and its read-write claim run in: the namespace of
    /// the first request, where its registry credentials are.
    #[schemars(length(min = 1, max = 63), pattern(DNS1123_LABEL_PATTERN))]
    pub writer_namespace: String,
    /// PersistentVolumeClaims the binding owns (the writer claim rw-pvc-HASH; for
    /// regularModelCache also the reader claim ro-pvc-HASH, where HASH is the 48 hex characters
    /// of the binding name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(min = 1, max = 32),
        inner(length(min = 1, max = 253), pattern(DNS1123_SUBDOMAIN_PATTERN)),
        extend("x-kubernetes-list-type" = "set")
    )]
    pub persistent_volume_claim_names: Vec<String>,
    /// PersistentVolumes the binding owns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(min = 1, max = 32),
        inner(length(min = 1, max = 253), pattern(DNS1123_SUBDOMAIN_PATTERN)),
        extend("x-kubernetes-list-type" = "set")
    )]
    pub persistent_volume_names: Vec<String>,
    /// Jobs the binding owns (the writer Job writer-job-HASH).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(min = 1, max = 32),
        inner(length(min = 1, max = 253), pattern(DNS1123_SUBDOMAIN_PATTERN)),
        extend("x-kubernetes-list-type" = "set")
    )]
    pub job_names: Vec<String>,
    /// StorageClasses the binding owns (encrypted caches only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(min = 1, max = 32),
        inner(length(min = 1, max = 253), pattern(DNS1123_SUBDOMAIN_PATTERN)),
        extend("x-kubernetes-list-type" = "set")
    )]
    pub storage_class_names: Vec<String>,
    /// Secrets the binding owns (encryption keys of encrypted caches).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(min = 1, max = 32),
        inner(length(min = 1, max = 253), pattern(DNS1123_SUBDOMAIN_PATTERN)),
        extend("x-kubernetes-list-type" = "set")
    )]
    pub secret_names: Vec<String>,
    /// Lease that serializes writers of this cache (helmModelCache). Omitted when not used.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = 253), pattern(DNS1123_SUBDOMAIN_PATTERN))]
    pub lease_name: String,
}

/// Observed state of a binding.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new(RULE_PHASE_KEPT).message(MSG_PHASE_KEPT),
    validation = Rule::new(RULE_RETIRING_IS_FINAL).message(MSG_RETIRING_IS_FINAL),
    validation = Rule::new(RULE_PROVIDER_DATA_IDENTITY_IMMUTABLE).message(MSG_PROVIDER_DATA_IDENTITY_IMMUTABLE),
    validation = Rule::new(RULE_RESOLVED_REVISION_IMMUTABLE).message(MSG_RESOLVED_REVISION_IMMUTABLE)
)]
#[schemars(transform = unwrap_descriptions)]
#[serde(rename_all = "camelCase")]
pub struct ModelCacheBindingStatus {
    /// Lifecycle phase. Active: new requests may reference the cache. Retiring: the binding had
    /// no references past the idle period; new references are refused, the resources it names
    /// are being deleted, and it can never become Active again. Absent until the first status
    /// write after creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = not_nullable)]
    pub phase: Option<BindingPhase>,
    /// When the phase last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = not_nullable)]
    pub last_phase_transition_time: Option<Time>,
    /// Workloads using this cache: the top-level controller of each reading pod (or the pod
    /// itself when it has none). A reference is stale when that object is gone or has another
    /// UID. Keyed by uid.
    #[serde(default)]
    #[schemars(
        extend(
            "x-kubernetes-list-type" = "map",
            "x-kubernetes-list-map-keys" = ["uid"]
        ),
        transform = no_default
    )]
    pub request_references: Vec<RequestReference>,
    /// What exists on the storage. Absent until the controller realizes something.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = not_nullable)]
    pub realized: Option<RealizedStorage>,
    /// Number of entries in requestReferences (for the printer column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0), transform = not_nullable)]
    pub request_reference_count: Option<i64>,
    /// When requestReferences last became empty; absent while it is not empty. The reaper
    /// retires a binding that stayed unreferenced past the idle period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = not_nullable)]
    pub unreferenced_since: Option<Time>,
    /// The model identity URI the cache holds (for example hf://Qwen/Qwen3-0.6B@v1), copied
    /// from a reading pod whose cache handle matches spec.identity.cacheHandleDigest. For
    /// display only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), transform = not_nullable)]
    pub model_uri: Option<String>,
    /// The commit (40 lowercase hex digits) the copy holds, as the download resolved it: a
    /// floating revision (none, a branch, a tag) is pinned to it, and later pods naming the same
    /// revision read this copy until a refresh (another nvsnap.io/cache-salt, the namespace's
    /// refresh label, or the webhook's maximum age of floating revisions) downloads into a new
    /// binding. Absent for sources without commits and until the download finished. Recorded
    /// from the complete primary PV (annotation nvsnap.io/model-revision), where the download's
    /// writer put it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(COMMIT_PATTERN), transform = not_nullable)]
    pub resolved_revision: Option<String>,
    /// The metadata.generation the controller last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0), transform = not_nullable)]
    pub observed_generation: Option<i64>,
    /// The writer of the download as last recorded: for helmModelCache a copy of the writer
    /// Lease (spec.resources.leaseName in the control namespace, the record that decides),
    /// which moves to another namespace of the sharing domain when the writer namespace has no
    /// reading pod left and its Job has been gone past the takeover grace period; for
    /// regularModelCache always spec.resources.writerNamespace. Absent until a writer is chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = not_nullable)]
    pub writer: Option<WriterStatus>,
    /// The failure record of the last failed download (nvsnap's failed-<key> record): while
    /// the current time is before retryAfter, admission leaves new pods of this model on their
    /// own download and the controller deletes readers still waiting for the copy; after it,
    /// admission joins again and the controller retries with a new Job. Cleared by a later
    /// success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = not_nullable)]
    pub failure_record: Option<FailureRecord>,
    /// Standard conditions, keyed by type: Ready (readers can read the complete copy),
    /// Progressing (the controller is creating or waiting for something) and Degraded (a
    /// failure that needs attention, with the reason).
    #[serde(default)]
    #[schemars(schema_with = "conditions_schema", transform = no_default)]
    pub conditions: Vec<Condition>,
}

/// The writer of a cache's download.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WriterStatus {
    /// Namespace the writer Job runs in (where its credentials are).
    #[schemars(length(min = 1, max = 63), pattern(DNS1123_LABEL_PATTERN))]
    pub namespace: String,
    /// Name of the writer Job (writer-job-HASH).
    #[schemars(length(min = 1, max = 63), pattern(DNS1123_LABEL_PATTERN))]
    pub job_name: String,
    /// UID of the writer Job, once it exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128), transform = not_nullable)]
    pub job_uid: Option<String>,
    /// Starting (chosen, no Job recorded yet), Running (its Job exists) or Gone (its Job was
    /// found gone; another namespace may take the download over after the grace period).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = not_nullable)]
    pub state: Option<WriterState>,
    /// How many times another namespace took the download over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0), transform = not_nullable)]
    pub takeovers: Option<i32>,
}

/// State of a cache's writer.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum WriterState {
    // Chosen; no Job recorded yet.
    Starting,
    // Its Job exists.
    Running,
    // Its Job is gone.
    Gone,
}

impl WriterState {
    /// The serialized value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "Starting",
            Self::Running => "Running",
            Self::Gone => "Gone",
        }
    }

    /// The value serialized by [`WriterState::as_str`].
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "Starting" => Some(Self::Starting),
            "Running" => Some(Self::Running),
            "Gone" => Some(Self::Gone),
            _ => None,
        }
    }
}

/// The record of a failed download, valid until `retryAfter`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureRecord {
    /// When the controller saw the writer Job fail.
    pub failed_at: Time,
    /// Until when the failure holds (failedAt plus the record's validity, one hour by
    /// default): before it, admission leaves new pods on their own download; from it on,
    /// admission joins again and a retry download may start.
    pub retry_after: Time,
    /// UID of the failed Job (one record per failed Job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128), transform = not_nullable)]
    pub job_uid: Option<String>,
    /// The download's last words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 4096))]
    pub message: String,
}

impl FailureRecord {
    /// Whether the record still holds at `now` (`now` before `retryAfter`).
    pub fn holds_at(&self, now: k8s_openapi::jiff::Timestamp) -> bool {
        now < self.retry_after.0
    }
}

/// Lifecycle phase of a binding. `Retiring` is final.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum BindingPhase {
    // Requests may reference the binding.
    Active,
    // Idle; its resources are being deleted. Final.
    Retiring,
}

impl BindingPhase {
    /// The serialized value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Active => "Active",
            Self::Retiring => "Retiring",
        }
    }
}

/// A workload that uses the cache.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RequestReference {
    /// API version of the workload (for example apps/v1).
    #[schemars(length(min = 1, max = 317))]
    pub api_version: String,
    /// Kind of the workload (for example Deployment, LeaderWorkerSet, Pod).
    #[schemars(length(min = 1, max = 63))]
    pub kind: String,
    /// Namespace of the workload.
    #[schemars(length(min = 1, max = 63), pattern(DNS1123_LABEL_PATTERN))]
    pub namespace: String,
    /// Name of the workload.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// UID of the workload; the list key. A workload recreated under the same name has another
    /// UID and is another reference.
    #[schemars(length(min = 1, max = 128))]
    pub uid: String,
}

/// What exists on the storage for this binding.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RealizedStorage {
    /// PersistentVolume bound to the primary (writer) claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        pattern(DNS1123_SUBDOMAIN_PATTERN),
        transform = not_nullable
    )]
    pub bound_persistent_volume_name: Option<String>,
    /// Provider-side identity of the cached data (for example the CSI volume handle of the
    /// primary volume). Recorded only once the data exists; it can never change or be removed
    /// afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), transform = not_nullable)]
    pub provider_data_identity: Option<String>,
    /// Progress of the download into the primary volume. Pending: no writer has started.
    /// Populating: the writer Job is downloading. Ready: the data is complete and readers may
    /// mount it. Failed: the download failed; readers fall back to their own download.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = not_nullable)]
    pub population_state: Option<PopulationState>,
    /// Bytes the download wrote, as the writer measured them (du -sb of the volume root) and
    /// recorded in the completion marker and its termination message. Present once Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0), transform = not_nullable)]
    pub bytes: Option<i64>,
    /// Namespace the completed download was written from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), pattern(DNS1123_LABEL_PATTERN), transform = not_nullable)]
    pub source_namespace: Option<String>,
    /// Per-namespace read-only views of the primary volume (a PersistentVolume derived from the
    /// primary's, pre-bound to a claim in the reader namespace). The controller records an entry
    /// here BEFORE it creates the view's objects, so retirement can always name and delete them,
    /// even after a crash between the two steps. Keyed by namespace.
    #[serde(default)]
    #[schemars(
        extend(
            "x-kubernetes-list-type" = "map",
            "x-kubernetes-list-map-keys" = ["namespace"]
        ),
        transform = no_default
    )]
    pub views: Vec<ReadOnlyView>,
}

/// Progress of the download into the primary volume.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum PopulationState {
    // Waiting for a writer.
    Pending,
    // A writer is downloading.
    Populating,
    // The data is complete; readers may mount it.
    Ready,
    // The download failed; readers fall back to their own download.
    Failed,
}

/// A read-only view of the primary volume in one reader namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadOnlyView {
    /// Reader namespace; the list key.
    #[schemars(length(min = 1, max = 63), pattern(DNS1123_LABEL_PATTERN))]
    pub namespace: String,
    /// The derived read-only PersistentVolume (cluster-scoped).
    #[schemars(length(min = 1, max = 253), pattern(DNS1123_SUBDOMAIN_PATTERN))]
    pub persistent_volume_name: String,
    /// The claim in the reader namespace, pre-bound to the PersistentVolume.
    #[schemars(length(min = 1, max = 253), pattern(DNS1123_SUBDOMAIN_PATTERN))]
    pub persistent_volume_claim_name: String,
}

/// Schema transform that joins the lines of every description in a subtree: doc comments are
/// wrapped at source width, `kubectl explain` wraps at the terminal's. Blank-line paragraph
/// breaks are kept.
fn unwrap_descriptions(schema: &mut schemars::Schema) {
    fn visit(key: &str, value: &mut serde_json::Value) {
        match value {
            serde_json::Value::String(text) if key == "description" => {
                *text = text
                    .split("\n\n")
                    .map(|paragraph| paragraph.split('\n').collect::<Vec<_>>().join(" "))
                    .collect::<Vec<_>>()
                    .join("\n\n");
            }
            serde_json::Value::Object(map) => {
                map.iter_mut().for_each(|(key, child)| visit(key, child));
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(|item| visit("", item)),
            _ => {}
        }
    }
    if let Some(obj) = schema.as_object_mut() {
        obj.iter_mut().for_each(|(key, child)| visit(key, child));
    }
}

/// Schema transform for an `Option` field that is omitted when `None` (never sent as `null`):
/// drops the `null` alternative schemars adds, so the CRD does not mark the field nullable. The
/// API server then prunes an explicit `null` instead of storing it, and `has()` in CEL rules
/// means "has a value".
fn not_nullable(schema: &mut schemars::Schema) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    obj.remove("nullable");
    if let Some(serde_json::Value::Array(types)) = obj.get_mut("type") {
        types.retain(|t| t != "null");
        if types.len() == 1 {
            let only = types.remove(0);
            obj.insert("type".into(), only);
        }
    }
    if let Some(serde_json::Value::Array(values)) = obj.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
    // `anyOf: [<schema>, <null>]` form: keep the non-null branch.
    if let Some(serde_json::Value::Array(branches)) = obj.get("anyOf") {
        let is_null = |b: &serde_json::Value| {
            b.get("type").and_then(serde_json::Value::as_str) == Some("null")
                || b.get("enum") == Some(&serde_json::json!([null]))
                || b.get("const") == Some(&serde_json::Value::Null)
        };
        let rest: Vec<serde_json::Value> =
            branches.iter().filter(|b| !is_null(b)).cloned().collect();
        if rest.len() == 1 && branches.len() == 2 {
            obj.remove("anyOf");
            if let Some(serde_json::Value::Object(inner)) = rest.into_iter().next() {
                for (k, v) in inner {
                    obj.entry(k).or_insert(v);
                }
            }
        }
    }
}

/// Schema transform that drops the `default` schemars derives from `#[serde(default)]`: the API
/// server stores status lists exactly as the controller writes them.
fn no_default(schema: &mut schemars::Schema) {
    if let Some(obj) = schema.as_object_mut() {
        obj.remove("default");
    }
}

/// Schema of `status.conditions`: the metav1.Condition list with the constraints the upstream
/// type carries (kubebuilder markers), keyed by type.
fn conditions_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "Standard conditions, keyed by type.",
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "description": "One aspect of the binding's current state.",
            "type": "object",
            "required": ["lastTransitionTime", "message", "reason", "status", "type"],
            "properties": {
                "lastTransitionTime": {
                    "description": "When the condition last changed status.",
                    "type": "string",
                    "format": "date-time"
                },
                "message": {
                    "description": "Human-readable detail of the last transition; may be empty.",
                    "type": "string",
                    "maxLength": 32768
                },
                "observedGeneration": {
                    "description": "metadata.generation the condition was computed from.",
                    "type": "integer",
                    "format": "int64",
                    "minimum": 0
                },
                "reason": {
                    "description": "CamelCase reason of the last transition.",
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 1024,
                    "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
                },
                "status": {
                    "description": "True, False or Unknown.",
                    "type": "string",
                    "enum": ["True", "False", "Unknown"]
                },
                "type": {
                    "description": "Condition type, CamelCase or <domain>/CamelCase.",
                    "type": "string",
                    "maxLength": 316,
                    "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
                }
            }
        }
    })
}

impl ModelCacheBinding {
    /// The recorded phase, if any (absent before the first status write).
    pub fn phase(&self) -> Option<BindingPhase> {
        self.status.as_ref().and_then(|s| s.phase)
    }

    /// Whether the binding is Retiring (and so must never gain a new reference).
    pub fn is_retiring(&self) -> bool {
        self.phase() == Some(BindingPhase::Retiring)
    }

    /// Whether `status.requestReferences` holds a reference with this UID.
    pub fn has_request_reference(&self, uid: &str) -> bool {
        self.status
            .as_ref()
            .is_some_and(|s| s.request_references.iter().any(|r| r.uid == uid))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::{CustomResourceExt, Resource};
    use serde_json::json;

    use super::*;

    fn identity() -> BindingIdentity {
        BindingIdentity::new(
            Workflow::HelmModelCache,
            "nca-123",
            "hf://Qwen/Qwen3-0.6B@v1",
        )
    }

    fn spec() -> ModelCacheBindingSpec {
        ModelCacheBindingSpec {
            identity: identity(),
            decision: BindingDecision {
                provider: "nvmesh".into(),
                provisioner: "nvmesh-csi.excelero.com".into(),
                transition: Transition::RoxReadOnly,
                required_access_modes: Transition::RoxReadOnly.required_access_modes().to_vec(),
                required_mount_options: vec!["ro".into(), "norecovery".into(), "nouuid".into()],
                catalog_digest: sha256_digest("profile"),
                encryption_required: true,
                writer_identity: None,
            },
            storage_class: BindingStorageClass {
                name: crate::MODEL_CACHE_STORAGE_CLASS.into(),
                uid: "uid-1".into(),
                reclaim_policy: ReclaimPolicy::Retain,
                configuration_digest: format!("v1:{}", sha256_digest("class")),
            },
            resources: BindingResources {
                writer_namespace: "team-a".into(),
                persistent_volume_claim_names: vec![crate::writer_pvc_name(&identity())],
                job_names: vec![crate::writer_job_name(&identity())],
                lease_name: crate::init_lease_name(&identity()),
                ..BindingResources::default()
            },
        }
    }

    fn binding() -> ModelCacheBinding {
        let mut binding = ModelCacheBinding::new(&crate::binding_name(&identity()), spec());
        binding.metadata.namespace = Some(crate::DEFAULT_CONTROL_NAMESPACE.into());
        binding.metadata.finalizers = Some(vec![crate::FINALIZER.into()]);
        binding
    }

    #[test]
    fn resource_identity() {
        assert_eq!(ModelCacheBinding::group(&()), crate::GROUP);
        assert_eq!(ModelCacheBinding::version(&()), VERSION);
        assert_eq!(ModelCacheBinding::kind(&()), crate::KIND);
        assert_eq!(ModelCacheBinding::plural(&()), crate::PLURAL);
        assert_eq!(ModelCacheBinding::api_version(&()), API_VERSION);
        assert_eq!(ModelCacheBinding::crd_name(), crate::CRD_NAME);
        assert_eq!(ModelCacheBinding::shortnames(), &["mcb"]);
    }

    #[test]
    fn crd_names_scope_subresources_and_columns() {
        let crd = ModelCacheBinding::crd();
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(
            crd.spec.names.singular.as_deref(),
            Some("modelcachebinding")
        );
        assert_eq!(crd.spec.names.short_names, Some(vec!["mcb".to_owned()]));
        assert_eq!(crd.spec.names.list_kind, None); // defaulted by the API server
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, VERSION);
        assert!(version.served && version.storage);
        let subresources = version.subresources.as_ref().expect("subresources");
        assert!(subresources.status.is_some());
        assert!(subresources.scale.is_none());
        let columns: Vec<(&str, &str, &str)> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| (c.name.as_str(), c.type_.as_str(), c.json_path.as_str()))
            .collect();
        assert_eq!(
            columns,
            [
                ("Workflow", "string", ".spec.identity.workflow"),
                ("Provider", "string", ".spec.decision.provider"),
                ("Phase", "string", ".status.phase"),
                ("Model", "string", ".status.modelUri"),
                ("Revision", "string", ".status.resolvedRevision"),
                (
                    "Ready",
                    "string",
                    ".status.conditions[?(@.type==\"Ready\")].status"
                ),
                ("Population", "string", ".status.realized.populationState"),
                ("Bytes", "integer", ".status.realized.bytes"),
                ("Readers", "integer", ".status.requestReferenceCount"),
                ("Age", "date", ".metadata.creationTimestamp"),
            ]
        );
    }

    #[test]
    fn crd_survives_yaml() {
        let crd = ModelCacheBinding::crd();
        let yaml = serde_saphyr::to_string(&crd).expect("to yaml");
        let back: CustomResourceDefinition = serde_saphyr::from_str(&yaml).expect("from yaml");
        assert_eq!(back, crd);
    }

    #[test]
    fn serializes_with_api_names() {
        let mut binding = binding();
        binding.status = Some(ModelCacheBindingStatus {
            phase: Some(BindingPhase::Active),
            request_references: vec![RequestReference {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                namespace: "team-a".into(),
                name: "vllm".into(),
                uid: "u-1".into(),
            }],
            realized: Some(RealizedStorage {
                provider_data_identity: Some("vol-1".into()),
                population_state: Some(PopulationState::Populating),
                views: vec![ReadOnlyView {
                    namespace: "team-a".into(),
                    persistent_volume_name: "ro-pv-1".into(),
                    persistent_volume_claim_name: "ro-pvc-1".into(),
                }],
                ..RealizedStorage::default()
            }),
            ..ModelCacheBindingStatus::default()
        });
        let value = serde_json::to_value(&binding).expect("serializes");
        assert_eq!(value["apiVersion"], API_VERSION);
        assert_eq!(value["kind"], "ModelCacheBinding");
        let spec = &value["spec"];
        assert_eq!(spec["identity"]["workflow"], "helmModelCache");
        assert_eq!(spec["identity"]["version"], "v1alpha1");
        assert_eq!(spec["decision"]["transition"], "roxReadOnly");
        assert_eq!(
            spec["decision"]["requiredAccessModes"],
            json!(["ReadWriteOnce", "ReadOnlyMany"])
        );
        assert_eq!(spec["storageClass"]["reclaimPolicy"], "Retain");
        assert_eq!(
            spec["resources"]["leaseName"],
            crate::init_lease_name(&identity())
        );
        // Empty optional lists are omitted, never sent as [] (the schema requires minItems 1).
        let resources = spec["resources"].as_object().expect("object");
        assert!(!resources.contains_key("secretNames"));
        assert!(!resources.contains_key("storageClassNames"));
        assert!(!resources.contains_key("persistentVolumeNames"));
        let status = &value["status"];
        assert_eq!(status["phase"], "Active");
        assert_eq!(status["requestReferences"][0]["apiVersion"], "apps/v1");
        assert_eq!(status["realized"]["populationState"], "Populating");
        assert_eq!(
            status["realized"]["views"][0]["persistentVolumeClaimName"],
            "ro-pvc-1"
        );
        // Status lists are always sent, so a patch that empties them is explicit.
        assert_eq!(status["conditions"], json!([]));
        assert!(status.get("lastPhaseTransitionTime").is_none());
        assert!(
            status["realized"]
                .get("boundPersistentVolumeName")
                .is_none()
        );

        let back: ModelCacheBinding = serde_json::from_value(value.clone()).expect("deserializes");
        assert_eq!(back, binding);
        assert_eq!(serde_json::to_value(&back).expect("serializes"), value);
    }

    #[test]
    fn minimal_status_deserializes() {
        let status: ModelCacheBindingStatus = serde_json::from_value(json!({})).expect("empty");
        assert_eq!(status, ModelCacheBindingStatus::default());
        let spec_json = serde_json::to_value(spec()).expect("spec");
        let without_optional = json!({
            "identity": spec_json["identity"],
            "decision": {
                "provider": "weka",
                "provisioner": "csi.weka.io",
                "transition": "rwxReadOnly",
                "requiredAccessModes": ["ReadWriteMany"],
                "catalogDigest": sha256_digest("p"),
                "encryptionRequired": false,
            },
            "storageClass": spec_json["storageClass"],
            "resources": {"writerNamespace": "team-a"},
        });
        let parsed: ModelCacheBindingSpec =
            serde_json::from_value(without_optional.clone()).expect("minimal spec");
        assert!(parsed.decision.required_mount_options.is_empty());
        assert!(parsed.resources.lease_name.is_empty());
        assert_eq!(
            serde_json::to_value(&parsed).expect("spec"),
            without_optional
        );
    }

    #[test]
    fn enum_strings_match_serde() {
        for w in [Workflow::RegularModelCache, Workflow::HelmModelCache] {
            assert_eq!(serde_json::to_value(w).expect("w"), w.as_str());
        }
        for t in [Transition::RwxReadOnly, Transition::RoxReadOnly] {
            assert_eq!(serde_json::to_value(t).expect("t"), t.as_str());
        }
        for m in [
            AccessMode::ReadWriteOnce,
            AccessMode::ReadOnlyMany,
            AccessMode::ReadWriteMany,
            AccessMode::ReadWriteOncePod,
        ] {
            assert_eq!(serde_json::to_value(m).expect("m"), m.as_str());
        }
        for p in [BindingPhase::Active, BindingPhase::Retiring] {
            assert_eq!(serde_json::to_value(p).expect("p"), p.as_str());
        }
        assert!(serde_json::from_value::<Workflow>(json!("RegularModelCache")).is_err());
        assert!(serde_json::from_value::<ReclaimPolicy>(json!("Delete")).is_err());
    }

    #[test]
    fn identity_digests_the_raw_values() {
        let id = BindingIdentity::new(Workflow::RegularModelCache, "team-a", "ngc://org/m:1");
        assert_eq!(id.version, crate::SELECTION_VERSION);
        assert_eq!(id.sharing_domain_digest, sha256_digest("team-a"));
        assert_eq!(id.cache_handle_digest, sha256_digest("ngc://org/m:1"));
    }

    #[test]
    fn transition_modes_satisfy_the_crd_rules() {
        // The modes a controller records from `required_access_modes` pass the decision rules,
        // with the writer identity the rules require, for every transition and the encryption
        // setting the rules allow.
        let crd = ModelCacheBinding::crd();
        let schema = serde_json::to_value(
            crd.spec.versions[0]
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref()),
        )
        .expect("schema");
        let validator = kube_cel::Validator::new();
        for transition in [Transition::RwxReadOnly, Transition::RoxReadOnly] {
            let mut b = binding();
            b.spec.decision.transition = transition;
            b.spec.decision.required_access_modes = transition.required_access_modes().to_vec();
            b.spec.decision.encryption_required = transition == Transition::RoxReadOnly;
            b.spec.decision.writer_identity =
                (transition == Transition::RwxReadOnly).then_some(WriterIdentity::FsGroup);
            let value = serde_json::to_value(&b).expect("binding");
            assert!(
                validator.validate(&schema, &value, None).is_ok(),
                "{transition:?}"
            );
        }
    }

    #[test]
    fn phase_helpers() {
        let mut b = binding();
        assert_eq!(b.phase(), None);
        assert!(!b.is_retiring());
        assert!(!b.has_request_reference("u-1"));
        b.status = Some(ModelCacheBindingStatus {
            phase: Some(BindingPhase::Retiring),
            request_references: vec![RequestReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                namespace: "team-a".into(),
                name: "p".into(),
                uid: "u-1".into(),
            }],
            ..ModelCacheBindingStatus::default()
        });
        assert_eq!(b.phase(), Some(BindingPhase::Retiring));
        assert!(b.is_retiring());
        assert!(b.has_request_reference("u-1"));
        assert!(!b.has_request_reference("u-2"));
    }

    #[test]
    fn descriptions_read_as_single_lines() {
        let schema = serde_json::to_value(ModelCacheBinding::crd()).expect("crd");
        let text = schema.to_string();
        assert!(
            !text.contains("\\n"),
            "a description still holds a line break"
        );
        let decision = &schema["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["decision"];
        assert!(
            decision["properties"]["transition"]["description"]
                .as_str()
                .is_some_and(|d| d.starts_with("How readers reach the data."))
        );
    }
}
