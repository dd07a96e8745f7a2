//! `worker.gpustack.ai/v1alpha1`: the `KVCacheBackend` resource.
//!
//! A `KVCacheBackend` describes one Mooncake KV-cache store. A *managed* backend is run by the
//! operator: one leader Deployment (`mooncake_master`) plus one member DaemonSet per member group
//! (`mc_store_rest_server`), all in [`SYSTEM_NAMESPACE`](crate::SYSTEM_NAMESPACE); one group may
//! add a local-disk offload tier. An *external* backend only publishes the endpoints of a store
//! running elsewhere.
//!
//! The CEL rules the CRD carries are in [`rules`]; the status vocabulary (condition types and
//! phases) is in [`condition`] and [`phase`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{LocalObjectReference, SecurityContext};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub mod rules;

/// API group of the resource.
pub const GROUP: &str = "worker.gpustack.ai";
/// API version of this module's types.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of objects of this module's types.
pub const API_VERSION: &str = "worker.gpustack.ai/v1alpha1";
/// Kind of the resource.
pub const KIND: &str = "KVCacheBackend";

/// Condition types written to `status.conditions`.
pub mod condition {
    /// The leader answers on its admin port and reports its service ready.
    pub const LEADER_AVAILABLE: &str = "LeaderAvailable";
    /// Every running member Pod has mounted its segment with the leader.
    pub const MEMBERS_MOUNTED: &str = "MembersMounted";
    /// `status.capacity` holds figures read from the leader's metrics.
    pub const CAPACITY_OBSERVED: &str = "CapacityObserved";
    /// The backend may be deleted: False exactly while `status.usedBy` is non-empty.
    pub const DELETABLE: &str = "Deletable";
    /// Whether the disk tier was empty on every node when the backend started. Written once, only
    /// for backends with a tier.
    pub const TIER_WAS_EMPTY: &str = "TierWasEmpty";
}

/// Values of `status.phase`.
pub mod phase {
    /// Coming up: the leader does not serve yet.
    pub const PROVISIONING: &str = "Provisioning";
    /// The leader serves and at least one member has mounted its segment.
    pub const READY: &str = "Ready";
    /// The leader serves, but a member group is short or stuck.
    pub const DEGRADED: &str = "Degraded";
    /// The leader is unreachable or unschedulable after it was up.
    pub const ERROR: &str = "Error";
    /// The backend is being torn down (also while consumers in `usedBy` hold it).
    pub const DELETING: &str = "Deleting";
}

/// Desired state of a KV-cache store.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "worker.gpustack.ai",
    version = "v1alpha1",
    kind = "KVCacheBackend",
    plural = "kvcachebackends",
    shortname = "kvcb",
    category = "gpustack",
    status = "KVCacheBackendStatus",
    derive = "PartialEq",
    doc = "A KV-cache store (Mooncake) for inference engines: either run by the operator (managed: a leader plus member groups, optionally with a local-disk offload tier) or run elsewhere and only published here (external).",
    printcolumn = r#"{"name": "Type", "type": "string", "jsonPath": ".spec.type"}"#,
    printcolumn = r#"{"name": "Phase", "type": "string", "jsonPath": ".status.phase"}"#,
    printcolumn = r#"{"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoints[?(@.name=='Client')].address"}"#,
    printcolumn = r#"{"name": "Capacity", "type": "string", "jsonPath": ".status.capacity.total"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct KVCacheBackendSpec {
    /// Store implementation. Only Mooncake exists. Immutable.
    #[serde(rename = "type", default)]
    #[x_kube(validation = rules::type_immutable())]
    pub type_: BackendType,

    /// Container image of the store (leader, members, and the operator's helper Pods). When
    /// unset, the cluster setting "kv-cache-backend-image" decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub image: Option<String>,

    /// Pull policy of the store image. When unset it follows the tag: Always for ":latest" or no
    /// tag, IfNotPresent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<ImagePullPolicy>,

    /// Secrets (in the system namespace) used to pull the store image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,

    /// How clients reach the store: run it here (managed) or point at one running elsewhere
    /// (external). Exactly one of the two; the choice is immutable.
    pub connection: Connection,

    /// Transport between clients and members. Defaults to protocol Auto; a member group may
    /// override it.
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub transport: Transport,
}

/// Store implementation behind a backend.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[schemars(transform = crate::schema::no_type_description)]
pub enum BackendType {
    /// Mooncake: `mooncake_master` as the leader, `mc_store_rest_server` as each member.
    #[default]
    Mooncake,
}

/// Image pull policy, as for a container.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[schemars(transform = crate::schema::no_type_description)]
pub enum ImagePullPolicy {
    /// Pull on every container start.
    Always,
    /// Pull only when the image is not on the node.
    IfNotPresent,
    /// Never pull; the image must be on the node.
    Never,
}

/// Where the store runs. Exactly one of managed or external.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(
    validation = rules::connection_neither(),
    validation = rules::connection_both(),
    validation = rules::connection_branch_immutable()
)]
#[serde(rename_all = "camelCase")]
pub struct Connection {
    /// Run the store in this cluster: a leader Deployment and one member DaemonSet per group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed: Option<Managed>,

    /// Publish a store that runs elsewhere; the operator renders nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<External>,
}

/// A store run by the operator.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Managed {
    /// The leader (`mooncake_master`): keeps the key directory and hands out segments.
    pub leader: Leader,

    /// Member groups. Each group is one DaemonSet whose Pods contribute memory (and optionally
    /// a local-disk tier) to the store. A group is identified by its position in this list:
    /// append new groups at the end and remove groups from the end. Medium and the tier are
    /// fixed per position; at most one group may declare localDisks.
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(
        merge_strategy = ListMerge::Atomic,
        validation = rules::one_tier_group(),
        validation = rules::medium_immutable(),
        validation = rules::tier_cannot_be_added(),
        validation = rules::tier_cannot_be_removed(),
        validation = rules::tier_path_immutable()
    )]
    pub members: Vec<MemberGroup>,

    /// How members leave: the time a tier member gets to hand its keys back before it stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_in: Option<ScaleIn>,
}

/// The leader of a managed store.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = rules::leader_replicas_need_ha())]
#[serde(rename_all = "camelCase")]
pub struct Leader {
    /// Leader Pods. More than 1 requires highAvailability (one serves, the others wait on a
    /// Kubernetes Lease).
    #[serde(default = "default_leader_replicas")]
    #[schemars(range(min = 1, max = 5))]
    pub replicas: i32,

    /// Leader election. Its presence turns it on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_availability: Option<HighAvailability>,

    /// How the leader picks the segment a new key goes to.
    #[serde(default)]
    pub allocation_strategy: AllocationStrategy,

    /// Per-tenant key spaces and quotas in the leader. Unset means off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multi_tenancy: Option<bool>,

    /// Extra leader flags, appended last in the given order. One entry is one token, "-flag" or
    /// "-flag=value". Flags the operator derives from this spec are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    pub extra_args: Option<Vec<String>>,

    /// Extra environment variables of the leader container, appended last. Variables the
    /// operator renders are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub extra_env: Option<Vec<EnvEntry>>,
}

fn default_leader_replicas() -> i32 {
    1
}

impl Default for Leader {
    fn default() -> Self {
        Self {
            replicas: default_leader_replicas(),
            high_availability: None,
            allocation_strategy: AllocationStrategy::default(),
            multi_tenancy: None,
            extra_args: None,
            extra_env: None,
        }
    }
}

/// Leader election among several leader replicas.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HighAvailability {
    /// Leader snapshots. Refused for new use (a leader restoring one can serve another key's
    /// bytes instead of a miss); kept only so older objects still read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<Snapshot>,

    /// How members find the serving leader: through the leader Service, or by reading the
    /// election Lease themselves.
    #[serde(default)]
    pub member_addressing: MemberAddressing,
}

/// Leader snapshot settings (legacy; refused by the operator's webhook).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// PersistentVolumeClaim (in the system namespace) the snapshots are written to.
    #[schemars(length(min = 1, max = 253))]
    pub persistent_volume_claim_name: String,

    /// Seconds between snapshots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub interval_seconds: Option<i32>,

    /// Snapshots kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub retention_count: Option<i32>,
}

/// How members address the leader when leader election is on.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[schemars(transform = crate::schema::no_type_description)]
pub enum MemberAddressing {
    /// Members read the election Lease to find the serving leader.
    Lease,
    /// Members dial the leader Service.
    #[default]
    Service,
}

/// How the leader places a new key.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[schemars(transform = crate::schema::no_type_description)]
pub enum AllocationStrategy {
    /// Any segment with room.
    Random,
    /// The segment with the largest free share first.
    #[default]
    FreeRatioFirst,
}

/// One environment variable.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
pub struct EnvEntry {
    /// Variable name.
    pub name: String,

    /// Variable value. Unset means empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// Scale-in behaviour of tier members.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScaleIn {
    /// Seconds a stopping tier member gets to unmount its local disk before it is killed; added
    /// to its termination grace period. Ignored for groups without a tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub grace_period_seconds: Option<i32>,
}

/// A store running elsewhere.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct External {
    /// Where the store answers: a Client endpoint (published to consumers) and an Admin endpoint
    /// (scraped for status), each host:port.
    #[schemars(length(min = 1))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub endpoints: Vec<Endpoint>,
}

/// A named network endpoint of the store.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Role of the endpoint.
    pub name: EndpointName,

    /// host:port, dialled as written.
    #[schemars(length(max = 259))]
    pub address: String,
}

/// Role of a store endpoint.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[schemars(transform = crate::schema::no_type_description)]
pub enum EndpointName {
    /// The leader RPC endpoint clients connect to.
    Client,
    /// The leader admin endpoint (HTTP API and Prometheus metrics).
    Admin,
}

/// Transport between clients and members.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
pub struct Transport {
    /// Transfer protocol. Auto uses TCP.
    #[serde(default)]
    pub protocol: Protocol,
}

/// Transfer protocol of the store's transfer engine.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[schemars(transform = crate::schema::no_type_description)]
pub enum Protocol {
    /// Let the operator choose (TCP).
    #[default]
    Auto,
    /// Plain TCP.
    #[serde(rename = "TCP")]
    Tcp,
    /// RDMA (InfiniBand or RoCE); members use the host network.
    #[serde(rename = "RDMA")]
    Rdma,
    /// AWS Elastic Fabric Adapter; members use the host network.
    #[serde(rename = "EFA")]
    Efa,
    /// Huawei Ascend (CANN).
    #[serde(rename = "CANN")]
    Cann,
    /// AMD ROCm.
    #[serde(rename = "ROCM")]
    Rocm,
    /// Moore Threads MUSA.
    #[serde(rename = "MUSA")]
    Musa,
    /// MetaX MACA.
    #[serde(rename = "MACA")]
    Maca,
}

/// A group of members: one DaemonSet whose Pods each contribute a memory segment.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemberGroup {
    /// Nodes that run one member of this group each (copied to the DaemonSet's Pod template).
    pub node_selector: BTreeMap<String, String>,

    /// Memory the segment lives in. Immutable for the group at this position.
    pub medium: Medium,

    /// Segment size each member contributes, e.g. 64Gi. Must be greater than 0.
    #[schemars(schema_with = "crate::schema::quantity")]
    pub capacity_per_member: Quantity,

    /// Size of each member's local transfer buffer. Added to the Pod's memory request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::quantity")]
    pub local_buffer_size: Option<Quantity>,

    /// Extra member settings, each one token "-key" or "-key=value", passed as "-D key=value".
    /// Settings the operator derives from this spec are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    pub extra_args: Option<Vec<String>>,

    /// Extra environment variables of the member container, appended last. Variables the
    /// operator renders are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub extra_env: Option<Vec<EnvEntry>>,

    /// Image for this group's members, overriding spec.image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub image: Option<String>,

    /// The local-disk offload tier of this group: at most one entry, and at most one group per
    /// backend. It can neither be added to nor removed from an existing group, and its path is
    /// immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["path".into()]))]
    pub local_disks: Option<Vec<LocalDisk>>,

    /// Transport of this group, overriding spec.transport.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<Transport>,

    /// Fabric devices (RDMA or EFA) each member requests.
    #[serde(default = "default_fabric_interface_count")]
    #[schemars(range(min = 1))]
    pub fabric_interface_count: i32,

    /// Merged onto the security context the operator renders for the member container; added
    /// capabilities are unioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,

    /// Extra host directories or files mounted into each member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    pub host_paths: Option<Vec<HostPathMount>>,

    /// RuntimeClass of the member Pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub runtime_class_name: Option<String>,
}

fn default_fabric_interface_count() -> i32 {
    1
}

impl MemberGroup {
    /// The group's disk tier, when it declares one.
    pub fn local_disk(&self) -> Option<&LocalDisk> {
        self.local_disks.as_deref().and_then(<[LocalDisk]>::first)
    }
}

/// Memory a member segment lives in.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[schemars(transform = crate::schema::no_type_description)]
pub enum Medium {
    /// Host memory.
    #[serde(rename = "DRAM")]
    Dram,
    /// GPU memory.
    #[serde(rename = "VRAM")]
    Vram,
}

/// A local-disk offload tier: keys evicted from memory are written to this host directory.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = rules::watermark_needs_capacity())]
#[serde(rename_all = "camelCase")]
pub struct LocalDisk {
    /// Absolute host directory of the tier, mounted at the same path. It must exist on every
    /// selected node and be writable by the store's user. Immutable.
    #[schemars(length(max = 4096))]
    pub path: String,

    /// Most bytes the tier may hold. 0 or unset leaves the store's own ceiling. Required (above
    /// 0) when eviction.watermark is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::quantity")]
    pub capacity: Option<Quantity>,

    /// Most keys the tier may hold. 0 or unset means no limit is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub key_limit: Option<i64>,

    /// Eviction from the tier. Unset keeps the store's default behaviour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction: Option<Eviction>,

    /// Empty the directory on every node when the backend is deleted.
    #[serde(default)]
    pub clean_after_delete: bool,
}

/// Eviction from a disk tier.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(
    validation = rules::policy_while_disabled(),
    validation = rules::watermark_while_disabled()
)]
pub struct Eviction {
    /// Only an explicit false turns eviction off; policy and watermark must then be unset.
    #[serde(default = "default_true")]
    pub enabled: bool,

    /// Order in which keys leave the tier. Unset keeps the store's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<EvictionPolicy>,

    /// Disk usage band, in percent of capacity, that starts (high) and stops (low) eviction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark: Option<Watermark>,
}

fn default_true() -> bool {
    true
}

impl Default for Eviction {
    fn default() -> Self {
        Self {
            enabled: true,
            policy: None,
            watermark: None,
        }
    }
}

/// Order in which keys are evicted from a tier.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[schemars(transform = crate::schema::no_type_description)]
pub enum EvictionPolicy {
    /// Oldest written first.
    #[serde(rename = "FIFO")]
    Fifo,
    /// Least recently used first.
    #[serde(rename = "LRU")]
    Lru,
}

/// Eviction band of a tier, in percent of its capacity.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(validation = rules::watermark_low_below_high())]
pub struct Watermark {
    /// Usage (percent of capacity) at which eviction starts.
    #[schemars(range(min = 1, max = 100))]
    pub high: i32,

    /// Usage (percent of capacity) at which eviction stops. Must be below high.
    #[schemars(range(min = 1, max = 100))]
    pub low: i32,
}

/// A host path mounted into each member of a group.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HostPathMount {
    /// Absolute path on the node.
    #[schemars(length(max = 1024), regex(pattern = r"^(/[^/]+)+$"))]
    pub path: String,

    /// Absolute path in the member container.
    #[schemars(length(max = 1024), regex(pattern = r"^(/[^/]+)+$"))]
    pub mount_path: String,

    /// Check the kubelet makes on the host path before mounting it. Unset or "" checks nothing.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<HostPathType>,

    /// Mount read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
}

/// Kubelet check on a host path, as for a hostPath volume.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[schemars(transform = crate::schema::no_type_description)]
pub enum HostPathType {
    /// No check ("").
    #[serde(rename = "")]
    Unchecked,
    /// Create an empty directory (0755) when nothing exists at the path.
    DirectoryOrCreate,
    /// A directory must exist.
    Directory,
    /// Create an empty file (0644) when nothing exists at the path.
    FileOrCreate,
    /// A file must exist.
    File,
    /// A UNIX socket must exist.
    Socket,
    /// A character device must exist.
    CharDevice,
    /// A block device must exist.
    BlockDevice,
}

/// Observed state of a KV-cache store, written by the operator (usedBy: by its consumers).
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KVCacheBackendStatus {
    /// Summary: Provisioning, Ready, Degraded, Error or Deleting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,

    /// Why the backend is in its phase; empty when Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_message: Option<String>,

    /// LeaderAvailable, MembersMounted, CapacityObserved, Deletable and (with a tier)
    /// TierWasEmpty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Option<Vec<Condition>>,

    /// Endpoints consumers use. Managed: the leader Service; external: as in the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub endpoints: Option<Vec<Endpoint>>,

    /// Capacity the leader reports. Absent until a read of the leader's metrics succeeds with
    /// the leader ready, and cleared when a read fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Capacity>,

    /// Segments the leader lists, joined with the member Pods that mounted them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["segmentID".into()]))]
    pub members: Option<Vec<MemberStatus>>,

    /// Consumers of this backend, written by them. The backend cannot be deleted while this is
    /// non-empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["kind".into(), "namespace".into(), "name".into()]))]
    pub used_by: Option<Vec<ConsumerReference>>,
}

/// Capacity of the store as the leader reports it: memory segments plus the declared disk-tier
/// ceiling (not the disk's usage).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
pub struct Capacity {
    /// Total bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::quantity")]
    pub total: Option<Quantity>,

    /// Allocated bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::quantity")]
    pub used: Option<Quantity>,
}

/// One segment mounted with the leader.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    /// Segment identifier the leader reports.
    #[serde(rename = "segmentID")]
    pub segment_id: String,

    /// Client identifier of the member that mounted the segment.
    #[serde(rename = "clientID")]
    pub client_id: String,

    /// Segment name (the member's advertised address).
    pub segment_name: String,

    /// Node of the member Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,

    /// Medium of the member's group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub medium: Option<String>,

    /// Protocol the member uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,

    /// Segment state in the store's words (for example OK, Draining, Unmounting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

/// A consumer of a backend.
#[derive(
    Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
pub struct ConsumerReference {
    /// Kind of the consumer, for example KVCachePool.
    pub kind: String,

    /// Namespace of the consumer; empty for a cluster-scoped one.
    #[serde(default)]
    pub namespace: String,

    /// Name of the consumer.
    pub name: String,
}
