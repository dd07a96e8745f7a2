//! KVCacheBackend API types (worker.gpustack.ai/v1alpha1) and CRD.
//!
//! This crate owns the `KVCacheBackend` custom resource: its Rust types, the OpenAPI schema the
//! CRD carries (enums, bounds, list types, defaults) and the CEL rules (`x-kubernetes-validations`)
//! that need nothing but the object and its previous version. Rules that need more than that
//! (cluster settings, path analysis, extraArgs/extraEnv key lists, ratchets that fire only when a
//! value moves, moved member groups) belong to the operator's validating webhook, not here.
//!
//! Code names the versioned types, `v1alpha1::KVCacheBackend`, so another version can be added
//! as a new module. The CRD comes from [`kube::CustomResourceExt::crd`]:
//!
//! ```
//! use kube::CustomResourceExt;
//! use warmcache_api_kvcache::v1alpha1;
//!
//! let crd = v1alpha1::KVCacheBackend::crd();
//! assert_eq!(crd.spec.group, "worker.gpustack.ai");
//! ```
//!
//! The constants at the crate root are the fixed facts that the operator, the webhook and the
//! tests share: where workloads run, which ports the store listens on, and the floors below which
//! the store never takes offload work.

pub mod v1alpha1;

mod schema;

/// Name of the cluster Setting whose value is the store image used when a backend (or a member
/// group) names no image of its own.
pub const IMAGE_SETTING_NAME: &str = "kv-cache-backend-image";

/// The operator's finalizer on every backend: held until the backend's workloads are gone and,
/// when asked, its disk tier emptied on every node.
pub const FINALIZER: &str = "worker.gpustack.ai/kvcache";

/// Namespace that holds every workload rendered for a backend (the operator's own system
/// namespace). Backends are cluster-scoped; their leader and members are not.
pub const SYSTEM_NAMESPACE: &str = "gpustack-system";

/// Leader (`mooncake_master`) RPC port; the Service port is named `rpc`. Clients dial
/// `<backend>-leader.gpustack-system.svc:50051`.
pub const LEADER_RPC_PORT: i32 = 50051;

/// Leader admin and Prometheus port; the Service port is named `admin`.
pub const LEADER_ADMIN_PORT: i32 = 9003;

/// REST port of the member group at index 0. The group at index `i` listens on
/// `MEMBER_REST_BASE_PORT + i`, so groups sharing a host network never collide.
pub const MEMBER_REST_BASE_PORT: i32 = 8080;

/// Bucket size the operator renders for every disk tier, in bytes (16Mi). It is also the
/// smallest useful tier `capacity` and the smallest `capacityPerMember` of a group with a tier:
/// a tier is written one bucket at a time.
pub const BUCKET_SIZE_FLOOR_BYTES: i64 = 16_777_216;

/// Number of keys per bucket the operator renders for every disk tier. It is also the smallest
/// useful tier `keyLimit`.
pub const BUCKET_KEYS_FLOOR: i64 = 64;
