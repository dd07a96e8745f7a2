//! Rendering a managed `KVCacheBackend` into the objects the operator applies: the leader
//! Deployment and Service, and one member DaemonSet per group, all in the workload namespace.
//!
//! Everything here is a function of the backend and a [`RenderContext`]: no clock, no cluster
//! reads, so the same backend always renders byte-for-byte the same objects.
//!
//! # Pod Security
//!
//! Every container runs with `runAsNonRoot`, seccomp `RuntimeDefault`, no privilege escalation
//! and all capabilities dropped, which passes the `restricted` Pod Security level. The leader
//! always does. A member group does not when its store needs the host:
//!
//! - a disk tier (`localDisks`) and `hostPaths` are `hostPath` volumes, which even the `baseline`
//!   level forbids: the tier must be a directory of the node, since the point is a disk that
//!   outlives the Pod;
//! - RDMA and EFA groups use the host network and add `IPC_LOCK` (pinning transfer buffers) and
//!   `SYS_RESOURCE` (raising the locked-memory limit); they are never privileged.
//!
//! The workload namespace must therefore allow such Pods (see docs/kvcache-local-disk.md).
//! `runAsNonRoot` needs an image whose user is a numeric, non-zero uid (the published store
//! images run as 65532). For other images the operator's `--store-image-user` rules
//! ([`RenderContext::image_users`], [`crate::security`]) run a matching image's Pods as a given
//! uid, or as the image's own user without `runAsNonRoot`; a group's `securityContext` is merged
//! over the result.
//!
//! # Resources
//!
//! Every container has requests. Limits are set where exceeding them is harmless:
//!
//! - the `local-disk-survey` init container has small requests and limits (CPU and memory): it
//!   counts directory entries in a stream (`find ... | wc -l`), so its memory does not grow with
//!   the size of the tier;
//! - the member requests what the store really holds in host memory ([`crate::memory`]): its
//!   segment (DRAM only), its transfer buffer (the store's 1 GiB default when
//!   `localBufferSize` is unset), and with a tier the 1.25 GiB offload staging buffer, and a
//!   little CPU. It has **no memory limit**: the segment is the cache itself, the store's
//!   remaining overhead (the transfer engine, about 100 MiB) is not described by any field, and
//!   an OOM kill loses every key in the segment at once. It has
//!   no CPU limit either: throttling lands on the data path of every transfer. Fabric device
//!   limits (RDMA, EFA) are set, as extended resources require;
//! - the leader requests CPU and memory and has **no limits**: its memory is the index of every
//!   key, which grows with the keys stored and which no field sizes, so a fixed limit would be
//!   wrong for someone, and an OOM kill drops the whole index; a CPU limit would throttle the
//!   metadata path every read and write goes through.
//!
//! A `LimitRange` with default limits in the workload namespace would put limits back; see
//! docs/kvcache-local-disk.md.
//!
//! # Leader election access
//!
//! With an active `highAvailability` block (the block and more than one replica) the leaders
//! elect one of them through the Lease `<backend>-leader` in the workload namespace, so the
//! rendered objects include what that needs: the ServiceAccount, Role and RoleBinding
//! `<backend>-leader` (create the Lease; read and renew that one Lease). With
//! `memberAddressing: Lease` the members find the serving leader by reading the same Lease, and
//! get their own ServiceAccount, Role and RoleBinding `<backend>-member`, which can only read it.
//! Without HA no account is rendered and no Pod mounts an API token.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, Deployment, DeploymentSpec,
    DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar,
    EnvVarSource, ExecAction, HTTPGetAction, HostPathVolumeSource, Lifecycle, LifecycleHandler,
    LocalObjectReference, ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SeccompProfile, SecurityContext, Service, ServiceAccount, ServicePort,
    ServiceSpec, TCPSocketAction, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;
use sha2::{Digest, Sha256};
use warmcache_api_kvcache::v1alpha1::{
    API_VERSION, AllocationStrategy, EvictionPolicy, HostPathType, KIND, KVCacheBackend, Leader,
    LocalDisk, Managed, Medium, MemberAddressing, MemberGroup, Protocol,
};
use warmcache_api_kvcache::{
    BUCKET_KEYS_FLOOR, BUCKET_SIZE_FLOOR_BYTES, LEADER_ADMIN_PORT, LEADER_RPC_PORT,
    MEMBER_REST_BASE_PORT, SYSTEM_NAMESPACE,
};

use crate::error::RenderError;
use crate::names::{self, LEADER_COMPONENT, MEMBER_ACCESS_COMPONENT, POD_SPEC_HASH_ANNOTATION};
use crate::quantity;
use crate::security::{ImageUser, StoreUser};
use crate::validate::member_path;

/// Termination grace of a member Pod without a tier.
pub const MEMBER_TERMINATION_GRACE_SECONDS: i64 = 60;
/// Seconds the preStop hook waits for the unmount call beyond the grace it asks for.
pub const PRESTOP_TIMEOUT_MARGIN_SECONDS: i64 = 10;
/// Lease time-to-live of a key the leader renders unless `leader.extraArgs` overrides it.
pub const DEFAULT_KV_LEASE_TTL: &str = "5m";
/// Name of the init container that surveys the tier directory.
pub const SURVEY_CONTAINER: &str = "local-disk-survey";
/// Name of the tier volume.
pub const TIER_VOLUME: &str = "local-disk";
/// Where the survey writes its result.
pub const TERMINATION_LOG: &str = "/dev/termination-log";
/// Extended resource of a shared RDMA device.
pub const RDMA_SHARED_RESOURCE: &str = "device.gpustack.ai/rdma.shared";
/// Extended resource of a dedicated (exclusive) RDMA device, requested when a group asks for
/// more than one fabric interface.
pub const RDMA_EXCLUSIVE_RESOURCE: &str = "device.gpustack.ai/rdma";
/// Extended resource of an EFA device.
pub const EFA_RESOURCE: &str = "vpc.amazonaws.com/efa";
/// CPU request of the leader (no limit: see the module documentation).
pub const LEADER_CPU_REQUEST: &str = "100m";
/// Memory request of the leader (no limit: see the module documentation).
pub const LEADER_MEMORY_REQUEST: &str = "256Mi";
/// CPU request of a member (no limit: see the module documentation).
pub const MEMBER_CPU_REQUEST: &str = "100m";
/// CPU request of the `local-disk-survey` init container.
pub const SURVEY_CPU_REQUEST: &str = "10m";
/// CPU limit of the `local-disk-survey` init container.
pub const SURVEY_CPU_LIMIT: &str = "100m";
/// Memory request of the `local-disk-survey` init container.
pub const SURVEY_MEMORY_REQUEST: &str = "16Mi";
/// Memory limit of the `local-disk-survey` init container (`sh`, `find`, `wc` and `ls /`).
pub const SURVEY_MEMORY_LIMIT: &str = "64Mi";
/// Writable directory of the leader's tenant-quota policy file (multi-tenancy only): the leader
/// saves admin-API changes by writing a sibling file and renaming it over the policy.
pub const QUOTA_POLICY_DIR: &str = "/var/lib/mooncake";
/// The policy file the leader's `-tenant_quota_connector_uri` names.
pub const QUOTA_POLICY_FILE: &str = "/var/lib/mooncake/tenant-quota-policy.yaml";
/// Where the policy ConfigMap `<backend>-tenant-quota-policy` is mounted (read-only), read once
/// by the seeding init container.
pub const QUOTA_POLICY_SEED_DIR: &str = "/etc/mooncake/tenant-quota-policy";
/// The seed file in that ConfigMap.
pub const QUOTA_POLICY_SEED_FILE: &str =
    "/etc/mooncake/tenant-quota-policy/tenant-quota-policy.yaml";
/// Volume of the writable policy directory (an emptyDir).
pub const QUOTA_POLICY_VOLUME: &str = "tenant-quota-policy";
/// Volume of the policy ConfigMap (optional: the consumers' reconciler writes it).
pub const QUOTA_POLICY_SEED_VOLUME: &str = "tenant-quota-policy-seed";
/// Init container that copies the seed onto the writable volume, or writes an empty policy.
pub const QUOTA_POLICY_INIT_CONTAINER: &str = "seed-tenant-quota-policy";
/// The empty policy the leader starts from when no ConfigMap exists yet.
pub const EMPTY_QUOTA_POLICY: &str = "version: 1\ntenants: []\n";
/// The seeding command: the variables it reads carry every value, so nothing is quoted into it.
/// A failed copy fails the init container (the fallback runs only when no seed exists).
pub const QUOTA_POLICY_SEED_COMMAND: &str = "if [ -f \"$POLICY_SEED\" ]; then cp \"$POLICY_SEED\" \"$POLICY_FILE\"; else printf '%s' \"$POLICY_EMPTY\" > \"$POLICY_FILE\"; fi";

/// Name of the ConfigMap holding a backend's tenant-quota policy (written by its consumers'
/// reconciler, not rendered here).
pub fn quota_policy_name(backend: &str) -> String {
    format!("{backend}-tenant-quota-policy")
}

/// API group of the Lease the leaders elect through.
pub const LEASE_API_GROUP: &str = "coordination.k8s.io";
/// Visibility variables set to `void` for groups that do not store in GPU memory, so that a
/// vendor container runtime hands the member no accelerator.
pub const VISIBLE_DEVICES_ENVS: [&str; 5] = [
    "AMD_VISIBLE_DEVICES",
    "CAMBRICON_VISIBLE_DEVICES",
    "IX_VISIBLE_DEVICES",
    "MTHREADS_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
];

/// Inputs of rendering that are not in the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderContext {
    /// Namespace of the workloads (the operator's system namespace, `gpustack-system`).
    pub namespace: String,
    /// The `kv-cache-backend-image` setting: the image used when the backend names none.
    pub default_image: Option<String>,
    /// The operator's `--store-image-user` rules: which images run as a given uid or as their
    /// own user instead of under `runAsNonRoot` ([`crate::security`]). Empty keeps every Pod
    /// restricted.
    pub image_users: Vec<ImageUser>,
}

impl Default for RenderContext {
    fn default() -> Self {
        Self {
            namespace: SYSTEM_NAMESPACE.to_owned(),
            default_image: None,
            image_users: Vec::new(),
        }
    }
}

/// The objects rendered for a managed backend.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    /// With an active `highAvailability`: `<backend>-leader`, then `<backend>-member` when the
    /// members address the leader through its Lease. Empty otherwise.
    pub service_accounts: Vec<ServiceAccount>,
    /// The Roles of those accounts (same names), on the Lease `<backend>-leader` only.
    pub roles: Vec<Role>,
    /// The RoleBindings of those accounts to their Roles (same names).
    pub role_bindings: Vec<RoleBinding>,
    /// `<backend>-leader`.
    pub leader: Deployment,
    /// `<backend>-leader`, ClusterIP.
    pub service: Service,
    /// `<backend>-member-<i>`, in group order.
    pub members: Vec<DaemonSet>,
}

impl Rendered {
    /// The objects as a YAML stream (documents separated by `---`): the ServiceAccounts, Roles
    /// and RoleBindings (HA only), so that they exist before a Pod names them, then the
    /// Deployment, the Service and the DaemonSets in group order.
    pub fn to_yaml_stream(&self) -> Result<String, serde_saphyr::SerializeError> {
        let mut out = String::new();
        for account in &self.service_accounts {
            push_document(&mut out, account)?;
        }
        for role in &self.roles {
            push_document(&mut out, role)?;
        }
        for binding in &self.role_bindings {
            push_document(&mut out, binding)?;
        }
        push_document(&mut out, &self.leader)?;
        push_document(&mut out, &self.service)?;
        for member in &self.members {
            push_document(&mut out, member)?;
        }
        Ok(out)
    }
}

fn push_document<T: Serialize>(
    out: &mut String,
    object: &T,
) -> Result<(), serde_saphyr::SerializeError> {
    out.push_str("---\n");
    let text = serde_saphyr::to_string(object)?;
    out.push_str(&text);
    if !text.ends_with('\n') {
        out.push('\n');
    }
    Ok(())
}

/// Everything about the backend the renderer needs, resolved once.
struct Plan<'a> {
    name: &'a str,
    namespace: &'a str,
    owner: Option<OwnerReference>,
    backend: &'a KVCacheBackend,
    managed: &'a Managed,
    image: String,
    ha_active: bool,
    lease_addressing: bool,
    image_users: &'a [ImageUser],
}

/// Renders a managed backend. Fails for an external backend and for values the validator
/// refuses; everything [`crate::validate()`] admits renders.
///
/// The owner reference (controller, without `blockOwnerDeletion`) is set only when the backend
/// has a `metadata.uid`, as a stored object does; a namespaced dependent may name this
/// cluster-scoped owner, and the garbage collector deletes the workloads with the backend.
pub fn render(backend: &KVCacheBackend, ctx: &RenderContext) -> Result<Rendered, RenderError> {
    let connection = &backend.spec.connection;
    let managed = match (&connection.managed, &connection.external) {
        (Some(managed), None) => managed,
        (None, Some(_)) => return Err(RenderError::External),
        _ => return Err(RenderError::Connection),
    };
    let name = backend
        .metadata
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or(RenderError::NoName)?;
    // Trimmed, as the validator reads it: padding around spec.image (or the default image)
    // is admitted, and the kubelet refuses an image with surrounding whitespace.
    let image = backend
        .spec
        .image
        .as_deref()
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .or_else(|| {
            ctx.default_image
                .as_deref()
                .map(str::trim)
                .filter(|i| !i.is_empty())
        })
        .ok_or_else(|| RenderError::NoImage {
            path: "spec.image".into(),
        })?
        .to_owned();
    let leader = &managed.leader;
    let ha_active = ha_active(leader);
    let lease_addressing = lease_addressing(leader);
    let owner = backend.metadata.uid.as_ref().map(|uid| OwnerReference {
        api_version: API_VERSION.to_owned(),
        kind: KIND.to_owned(),
        name: name.to_owned(),
        uid: uid.clone(),
        controller: Some(true),
        block_owner_deletion: None,
    });
    let plan = Plan {
        name,
        namespace: &ctx.namespace,
        owner,
        backend,
        managed,
        image,
        ha_active,
        lease_addressing,
        image_users: &ctx.image_users,
    };
    let members = managed
        .members
        .iter()
        .enumerate()
        .map(|(i, group)| member_daemonset(&plan, i, group))
        .collect::<Result<Vec<_>, _>>()?;
    let mut access = Vec::new();
    if plan.ha_active {
        access.push(lease_access(
            &plan,
            names::leader_name(name),
            LEADER_COMPONENT,
            &["get", "list", "watch", "update", "patch"],
            true,
        ));
    }
    if plan.lease_addressing {
        access.push(lease_access(
            &plan,
            names::member_access_name(name),
            MEMBER_ACCESS_COMPONENT,
            &["get", "list", "watch"],
            false,
        ));
    }
    let (service_accounts, (roles, role_bindings)) = access
        .into_iter()
        .map(|(account, role, binding)| (account, (role, binding)))
        .unzip();
    Ok(Rendered {
        service_accounts,
        roles,
        role_bindings,
        leader: leader_deployment(&plan),
        service: leader_service(&plan),
        members,
    })
}

fn metadata(plan: &Plan<'_>, name: String, component: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(plan.namespace.to_owned()),
        labels: Some(names::labels(plan.name, component)),
        owner_references: plan.owner.clone().map(|o| vec![o]),
        ..ObjectMeta::default()
    }
}

/// The ServiceAccount `name`, a Role allowing `verbs` on the Lease `<backend>-leader` (and
/// creating Leases when `create`, which RBAC cannot narrow to one name), and the RoleBinding
/// between them.
fn lease_access(
    plan: &Plan<'_>,
    name: String,
    component: &str,
    verbs: &[&str],
    create: bool,
) -> (ServiceAccount, Role, RoleBinding) {
    let lease = names::leader_name(plan.name);
    let strings = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let mut rules = vec![PolicyRule {
        api_groups: Some(strings(&[LEASE_API_GROUP])),
        resources: Some(strings(&["leases"])),
        resource_names: Some(vec![lease]),
        verbs: strings(verbs),
        ..PolicyRule::default()
    }];
    if create {
        rules.push(PolicyRule {
            api_groups: Some(strings(&[LEASE_API_GROUP])),
            resources: Some(strings(&["leases"])),
            verbs: strings(&["create"]),
            ..PolicyRule::default()
        });
    }
    let account = ServiceAccount {
        metadata: metadata(plan, name.clone(), component),
        // Only the Pods that need the token mount it (they say so themselves).
        automount_service_account_token: Some(false),
        ..ServiceAccount::default()
    };
    let role = Role {
        metadata: metadata(plan, name.clone(), component),
        rules: Some(rules),
    };
    let binding = RoleBinding {
        metadata: metadata(plan, name.clone(), component),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Role".to_owned(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name,
            namespace: Some(plan.namespace.to_owned()),
            api_group: None,
        }]),
    };
    (account, role, binding)
}

fn quantities(items: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    items
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
        .collect()
}

/// The container security context every container starts from (restricted Pod Security).
fn restricted_container_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            add: None,
        }),
        ..SecurityContext::default()
    }
}

/// The Pod security context of a store Pod running `image`: restricted, unless a
/// `--store-image-user` rule names the image ([`crate::security`]).
fn store_pod_context(plan: &Plan<'_>, image: &str) -> PodSecurityContext {
    let mut context = restricted_pod_context();
    match crate::security::user_for(plan.image_users, image) {
        None => {}
        Some(StoreUser::Uid(uid)) => context.run_as_user = Some(uid),
        Some(StoreUser::Image) => context.run_as_non_root = None,
    }
    context
}

fn restricted_pod_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            localhost_profile: None,
        }),
        ..PodSecurityContext::default()
    }
}

fn pull_secrets(backend: &KVCacheBackend) -> Option<Vec<LocalObjectReference>> {
    backend
        .spec
        .image_pull_secrets
        .clone()
        .filter(|s| !s.is_empty())
}

fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: field_path.to_owned(),
            }),
            ..EnvVarSource::default()
        }),
    }
}

fn plain_env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.into()),
        value_from: None,
    }
}

/// Whether the leaders elect one of them: a `highAvailability` block and more than one replica.
/// (The block with one replica renders a plain single leader.)
pub fn ha_active(leader: &Leader) -> bool {
    leader.high_availability.is_some() && leader.replicas > 1
}

/// Whether the members find the serving leader through its Lease rather than its Service.
pub fn lease_addressing(leader: &Leader) -> bool {
    ha_active(leader)
        && leader
            .high_availability
            .as_ref()
            .is_some_and(|ha| ha.member_addressing == MemberAddressing::Lease)
}

/// The leader's command-line flags, in their fixed order (reference section 4.1).
pub fn leader_args(backend_name: &str, namespace: &str, managed: &Managed) -> Vec<String> {
    let leader = &managed.leader;
    let ha_active = ha_active(leader);
    let leader_name = names::leader_name(backend_name);
    let mut args = vec![
        format!("-rpc_port={LEADER_RPC_PORT}"),
        format!("-metrics_port={LEADER_ADMIN_PORT}"),
        format!("-default_kv_lease_ttl={DEFAULT_KV_LEASE_TTL}"),
    ];
    if ha_active {
        args.extend([
            "-enable_ha=true".to_owned(),
            "-ha_backend_type=k8s".to_owned(),
            format!("-ha_backend_connstring={namespace}/{leader_name}"),
            "-rpc_address=$(KUBERNETES_POD_IP)".to_owned(),
            format!("-cluster_id={leader_name}"),
        ]);
    }
    // A legacy snapshot block is never rendered: snapshots are refused (see the validator).
    args.push(
        match leader.allocation_strategy {
            AllocationStrategy::FreeRatioFirst => "-allocation_strategy=free_ratio_first",
            AllocationStrategy::Random => "-allocation_strategy=random",
        }
        .to_owned(),
    );
    if leader.multi_tenancy == Some(true) {
        // The connector URI goes with the switch: the file connector refuses the empty default,
        // and the leader does not start without it. The connector type stays at its default
        // (file), the only source the workload provides.
        args.push("-enable_multi_tenants=true".to_owned());
        args.push(format!("-tenant_quota_connector_uri={QUOTA_POLICY_FILE}"));
    }
    if managed.members.iter().any(|g| g.local_disk().is_some()) {
        args.push("-enable_offload=true".to_owned());
        args.push("-offload_on_evict=true".to_owned());
    }
    // Only with HA: the variables these refer to are rendered only then, and the kubelet would
    // pass an unresolved "$(KUBERNETES_POD_NAME)" on literally.
    if ha_active {
        args.push("-pod_name=$(KUBERNETES_POD_NAME)".to_owned());
        args.push("-pod_namespace=$(KUBERNETES_POD_NAMESPACE)".to_owned());
    }
    args.extend(leader.extra_args.iter().flatten().cloned());
    args
}

fn leader_deployment(plan: &Plan<'_>) -> Deployment {
    let leader = &plan.managed.leader;
    let replicas = if plan.ha_active { leader.replicas } else { 1 };
    let leader_name = names::leader_name(plan.name);

    let mut env = Vec::new();
    if plan.ha_active {
        env.push(field_env("KUBERNETES_POD_NAME", "metadata.name"));
        env.push(field_env("KUBERNETES_POD_NAMESPACE", "metadata.namespace"));
        env.push(field_env("KUBERNETES_POD_IP", "status.podIP"));
    }
    for entry in leader.extra_env.iter().flatten() {
        env.push(plain_env(
            &entry.name,
            entry.value.clone().unwrap_or_default(),
        ));
    }

    let http_probe = |path: &str, period: i32, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::Int(LEADER_ADMIN_PORT),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Probe::default()
    };
    let mut container = Container {
        name: "leader".to_owned(),
        image: Some(plan.image.clone()),
        image_pull_policy: Some(
            crate::image::pull_policy(&plan.image, plan.backend.spec.image_pull_policy).to_owned(),
        ),
        command: Some(vec!["mooncake_master".to_owned()]),
        args: Some(leader_args(plan.name, plan.namespace, plan.managed)),
        ports: Some(vec![
            ContainerPort {
                name: Some("rpc".to_owned()),
                container_port: LEADER_RPC_PORT,
                protocol: Some("TCP".to_owned()),
                ..ContainerPort::default()
            },
            ContainerPort {
                name: Some("admin".to_owned()),
                container_port: LEADER_ADMIN_PORT,
                protocol: Some("TCP".to_owned()),
                ..ContainerPort::default()
            },
        ]),
        env: (!env.is_empty()).then_some(env),
        // Requests only: see "Resources" in the module documentation for the missing limits.
        resources: Some(ResourceRequirements {
            requests: Some(quantities(&[
                ("cpu", LEADER_CPU_REQUEST),
                ("memory", LEADER_MEMORY_REQUEST),
            ])),
            ..ResourceRequirements::default()
        }),
        readiness_probe: Some(http_probe("/get_all_segments", 5, 3)),
        liveness_probe: Some(http_probe("/health", 10, 6)),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        security_context: Some(restricted_container_context()),
        ..Container::default()
    };
    let tenancy = leader.multi_tenancy == Some(true);
    let (init_containers, volumes) = if tenancy {
        // The leader runs from a writable copy of the policy (it rewrites the file on every
        // admin-API change); the ConfigMap is only its seed, and is not mounted here.
        container.volume_mounts = Some(vec![VolumeMount {
            name: QUOTA_POLICY_VOLUME.to_owned(),
            mount_path: QUOTA_POLICY_DIR.to_owned(),
            ..VolumeMount::default()
        }]);
        (
            Some(vec![quota_policy_seed_container(plan)]),
            Some(quota_policy_volumes(plan.name)),
        )
    } else {
        (None, None)
    };

    let (strategy, progress_deadline) = if replicas > 1 {
        (
            DeploymentStrategy {
                type_: Some("RollingUpdate".to_owned()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(replicas)),
                }),
            },
            Some(i32::MAX),
        )
    } else {
        (
            DeploymentStrategy {
                type_: Some("Recreate".to_owned()),
                rolling_update: None,
            },
            None,
        )
    };

    Deployment {
        metadata: metadata(plan, leader_name.clone(), LEADER_COMPONENT),
        spec: DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(names::selector_labels(plan.name, LEADER_COMPONENT)),
                match_expressions: None,
            },
            strategy: Some(strategy),
            progress_deadline_seconds: progress_deadline,
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(names::labels(plan.name, LEADER_COMPONENT)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    automount_service_account_token: Some(plan.ha_active),
                    service_account_name: plan.ha_active.then(|| leader_name.clone()),
                    image_pull_secrets: pull_secrets(plan.backend),
                    security_context: Some(store_pod_context(plan, &plan.image)),
                    init_containers,
                    containers: vec![container],
                    volumes,
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        },
        status: None,
    }
}

/// The two volumes of the tenant-quota policy: the writable directory the leader runs from, and
/// the optional ConfigMap it is seeded from (a backend no consumer has bound yet has none, and
/// the seed then writes an empty policy).
fn quota_policy_volumes(backend: &str) -> Vec<Volume> {
    vec![
        Volume {
            name: QUOTA_POLICY_VOLUME.to_owned(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        },
        Volume {
            name: QUOTA_POLICY_SEED_VOLUME.to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: quota_policy_name(backend),
                optional: Some(true),
                default_mode: Some(0o644),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
    ]
}

/// The init container that puts a policy document on the writable volume before the leader
/// starts: the seed when one is mounted, else an empty policy. It runs the leader's image.
fn quota_policy_seed_container(plan: &Plan<'_>) -> Container {
    Container {
        name: QUOTA_POLICY_INIT_CONTAINER.to_owned(),
        image: Some(plan.image.clone()),
        image_pull_policy: Some(
            crate::image::pull_policy(&plan.image, plan.backend.spec.image_pull_policy).to_owned(),
        ),
        command: Some(vec![
            "sh".to_owned(),
            "-c".to_owned(),
            QUOTA_POLICY_SEED_COMMAND.to_owned(),
        ]),
        env: Some(vec![
            plain_env("POLICY_SEED", QUOTA_POLICY_SEED_FILE),
            plain_env("POLICY_FILE", QUOTA_POLICY_FILE),
            plain_env("POLICY_EMPTY", EMPTY_QUOTA_POLICY),
        ]),
        volume_mounts: Some(vec![
            VolumeMount {
                name: QUOTA_POLICY_VOLUME.to_owned(),
                mount_path: QUOTA_POLICY_DIR.to_owned(),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: QUOTA_POLICY_SEED_VOLUME.to_owned(),
                mount_path: QUOTA_POLICY_SEED_DIR.to_owned(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
        ]),
        // A copy of one small file: the survey's small requests and limits fit it.
        resources: Some(small_task_resources()),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        security_context: Some(restricted_container_context()),
        ..Container::default()
    }
}

fn leader_service(plan: &Plan<'_>) -> Service {
    let port = |name: &str, number: i32| ServicePort {
        name: Some(name.to_owned()),
        port: number,
        target_port: Some(IntOrString::String(name.to_owned())),
        protocol: Some("TCP".to_owned()),
        ..ServicePort::default()
    };
    Service {
        metadata: metadata(plan, names::leader_name(plan.name), LEADER_COMPONENT),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            selector: Some(names::selector_labels(plan.name, LEADER_COMPONENT)),
            ports: Some(vec![
                port("rpc", LEADER_RPC_PORT),
                port("admin", LEADER_ADMIN_PORT),
            ]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// The protocol the group's members use, as the store spells it.
pub fn store_protocol(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Auto | Protocol::Tcp => "tcp",
        Protocol::Rdma => "rdma",
        Protocol::Efa => "efa",
        Protocol::Cann => "ascend",
        Protocol::Rocm => "hip",
        Protocol::Musa => "musa",
        Protocol::Maca => "maca",
    }
}

/// The group's protocol: its own override, else the backend's.
pub fn group_protocol(backend: &KVCacheBackend, group: &MemberGroup) -> Protocol {
    group
        .transport
        .as_ref()
        .map_or(backend.spec.transport.protocol, |t| t.protocol)
}

/// A watermark percentage as the ratio the store reads: exactly two decimals (90 -> `0.90`).
pub fn watermark_ratio(percent: i32) -> String {
    format!("{}.{:02}", percent / 100, percent % 100)
}

fn bytes(path: &str, text: &Quantity) -> Result<i64, RenderError> {
    let amount = quantity::parse(text).map_err(|source| RenderError::Quantity {
        path: path.to_owned(),
        source,
    })?;
    amount.ceil_i64().ok_or_else(|| RenderError::TooLarge {
        path: path.to_owned(),
        value: text.0.clone(),
    })
}

/// The member container's environment, in its fixed order (reference section 4.4).
pub fn member_env(
    backend: &KVCacheBackend,
    namespace: &str,
    index: usize,
    group: &MemberGroup,
) -> Result<Vec<EnvVar>, RenderError> {
    let path = member_path(index);
    let name = backend.metadata.name.as_deref().unwrap_or_default();
    let leader_name = names::leader_name(name);
    let managed = backend.spec.connection.managed.as_ref();
    let lease = managed.is_some_and(|m| lease_addressing(&m.leader));
    let master = if lease {
        format!("k8s://{namespace}/{leader_name}")
    } else {
        format!("{leader_name}.{namespace}.svc:{LEADER_RPC_PORT}")
    };
    let mut env = vec![
        plain_env("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
        plain_env("MOONCAKE_MASTER", master),
        plain_env(
            "MOONCAKE_PROTOCOL",
            store_protocol(group_protocol(backend, group)),
        ),
        field_env("MOONCAKE_LOCAL_HOSTNAME", "status.podIP"),
        plain_env("MC_TE_METRIC", "1"),
    ];
    if group.medium != Medium::Vram {
        for var in VISIBLE_DEVICES_ENVS {
            env.push(plain_env(var, "void"));
        }
    }
    let segment = bytes(
        &format!("{path}.capacityPerMember"),
        &group.capacity_per_member,
    )?;
    if segment > 0 {
        env.push(plain_env(
            "MOONCAKE_GLOBAL_SEGMENT_SIZE",
            segment.to_string(),
        ));
    }
    if let Some(buffer) = &group.local_buffer_size {
        let buffer = bytes(&format!("{path}.localBufferSize"), buffer)?;
        if buffer > 0 {
            env.push(plain_env("MOONCAKE_LOCAL_BUFFER_SIZE", buffer.to_string()));
        }
    }
    if let Some(tier) = group.local_disk() {
        tier_env(&mut env, &format!("{path}.localDisks[0]"), tier)?;
    }
    for entry in group.extra_env.iter().flatten() {
        env.push(plain_env(
            &entry.name,
            entry.value.clone().unwrap_or_default(),
        ));
    }
    Ok(env)
}

fn tier_env(env: &mut Vec<EnvVar>, path: &str, tier: &LocalDisk) -> Result<(), RenderError> {
    env.push(plain_env("MOONCAKE_OFFLOAD_ENABLED", "true"));
    env.push(plain_env(
        "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH",
        tier.path.clone(),
    ));
    env.push(plain_env(
        "MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES",
        BUCKET_SIZE_FLOOR_BYTES.to_string(),
    ));
    env.push(plain_env(
        "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT",
        BUCKET_KEYS_FLOOR.to_string(),
    ));
    if let Some(capacity) = &tier.capacity {
        let capacity = bytes(&format!("{path}.capacity"), capacity)?;
        if capacity > 0 {
            env.push(plain_env(
                "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES",
                capacity.to_string(),
            ));
            env.push(plain_env(
                "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE",
                capacity.to_string(),
            ));
        }
    }
    if let Some(keys) = tier.key_limit.filter(|k| *k > 0) {
        env.push(plain_env(
            "MOONCAKE_OFFLOAD_TOTAL_KEYS_LIMIT",
            keys.to_string(),
        ));
    }
    if let Some(eviction) = &tier.eviction {
        if !eviction.enabled {
            env.push(plain_env("MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY", "none"));
            env.push(plain_env(
                "MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION",
                "false",
            ));
        } else {
            if let Some(policy) = eviction.policy {
                let policy = match policy {
                    EvictionPolicy::Fifo => "fifo",
                    EvictionPolicy::Lru => "lru",
                };
                env.push(plain_env("MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY", policy));
            }
            if let Some(watermark) = &eviction.watermark {
                env.push(plain_env(
                    "MOONCAKE_OFFLOAD_DISK_EVICTION_HIGH_WATERMARK_RATIO",
                    watermark_ratio(watermark.high),
                ));
                env.push(plain_env(
                    "MOONCAKE_OFFLOAD_DISK_EVICTION_LOW_WATERMARK_RATIO",
                    watermark_ratio(watermark.low),
                ));
            }
        }
    }
    Ok(())
}

/// `value` quoted for `sh` with single quotes.
pub fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// The survey script: counts the entries of the tier directory and of `/` (the control), and
/// writes `entries=<n> control=<m>` to the termination log; `entries=-1` when the tier cannot be
/// listed. It always exits 0, so the member starts whatever it finds.
///
/// The tier is counted with `find` piped into `wc`, one name at a time, rather than from an `ls`
/// listing: `ls` sorts (and the shell would hold) every name first, and a tier of a few terabytes
/// holds hundreds of thousands of bucket files, which would outgrow the container's memory limit
/// and fail the init container, keeping the member from starting at all.
pub fn survey_script(tier_path: &str) -> String {
    survey_script_to(tier_path, TERMINATION_LOG)
}

fn survey_script_to(tier_path: &str, log: &str) -> String {
    format!(
        "tier={quoted}\n\
         if [ -d \"$tier\" ] && [ -r \"$tier\" ] && [ -x \"$tier\" ]; then\n  \
         entries=$(( $(find \"$tier/.\" ! -name . -prune -print | wc -l) ))\n\
         else\n  entries=-1\nfi\n\
         control=$(( $(ls -A / | wc -l) ))\n\
         printf 'entries=%s control=%s' \"$entries\" \"$control\" > {log}\n\
         exit 0\n",
        quoted = shell_quote(tier_path),
        log = shell_quote(log),
    )
}

/// The preStop script: asks the member's REST endpoint to hand its tier back within `grace`
/// seconds, waiting at most `grace + 10` seconds for the answer.
pub fn prestop_script(port: i32, grace: i64) -> String {
    let timeout = grace + PRESTOP_TIMEOUT_MARGIN_SECONDS;
    format!(
        "import json, urllib.request\n\
         body = json.dumps({{\"grace_period_seconds\": {grace}}}).encode()\n\
         request = urllib.request.Request(\"http://127.0.0.1:{port}/api/unmount_local_disk\", data=body, \
         headers={{\"Content-Type\": \"application/json\"}}, method=\"POST\")\n\
         urllib.request.urlopen(request, timeout={timeout}).read()\n"
    )
}

/// Merges the group's `securityContext` over `base`: every field the group sets wins, except
/// that added capabilities are the union of both (base first).
pub fn merge_security_context(
    base: SecurityContext,
    overlay: Option<&SecurityContext>,
) -> SecurityContext {
    let Some(overlay) = overlay else {
        return base;
    };
    let mut merged = base.clone();
    macro_rules! take {
        ($($field:ident),*) => {
            $(if overlay.$field.is_some() { merged.$field = overlay.$field.clone(); })*
        };
    }
    take!(
        allow_privilege_escalation,
        app_armor_profile,
        privileged,
        proc_mount,
        read_only_root_filesystem,
        run_as_group,
        run_as_non_root,
        run_as_user,
        se_linux_options,
        seccomp_profile,
        windows_options
    );
    if let Some(caps) = &overlay.capabilities {
        let base_caps = base.capabilities.unwrap_or_default();
        let mut add = base_caps.add.unwrap_or_default();
        for cap in caps.add.iter().flatten() {
            if !add.contains(cap) {
                add.push(cap.clone());
            }
        }
        merged.capabilities = Some(Capabilities {
            add: (!add.is_empty()).then_some(add),
            drop: caps.drop.clone().or(base_caps.drop),
        });
    }
    merged
}

/// SHA-256 (hex) of a pod template without its nodeSelector and without the hash annotation.
pub fn pod_spec_hash(template: &PodTemplateSpec) -> Result<String, serde_json::Error> {
    let mut value = serde_json::to_value(template)?;
    if let Some(spec) = value.get_mut("spec").and_then(|s| s.as_object_mut()) {
        spec.remove("nodeSelector");
    }
    if let Some(annotations) = value
        .get_mut("metadata")
        .and_then(|m| m.get_mut("annotations"))
        .and_then(|a| a.as_object_mut())
    {
        annotations.remove(POD_SPEC_HASH_ANNOTATION);
        if annotations.is_empty()
            && let Some(metadata) = value.get_mut("metadata").and_then(|m| m.as_object_mut())
        {
            metadata.remove("annotations");
        }
    }
    let bytes = serde_json::to_vec(&value)?;
    Ok(hex::encode(Sha256::digest(&bytes)))
}

fn host_path_type(t: HostPathType) -> &'static str {
    match t {
        HostPathType::Unchecked => "",
        HostPathType::DirectoryOrCreate => "DirectoryOrCreate",
        HostPathType::Directory => "Directory",
        HostPathType::FileOrCreate => "FileOrCreate",
        HostPathType::File => "File",
        HostPathType::Socket => "Socket",
        HostPathType::CharDevice => "CharDevice",
        HostPathType::BlockDevice => "BlockDevice",
    }
}

fn member_daemonset(
    plan: &Plan<'_>,
    index: usize,
    group: &MemberGroup,
) -> Result<DaemonSet, RenderError> {
    let component = names::member_component(index);
    let ds_name = names::member_name(plan.name, index);
    let port =
        MEMBER_REST_BASE_PORT + i32::try_from(index).unwrap_or(i32::MAX - MEMBER_REST_BASE_PORT);
    let protocol = group_protocol(plan.backend, group);
    let fabric = matches!(protocol, Protocol::Rdma | Protocol::Efa);
    let tier = group.local_disk();
    let image = match group.image.as_deref().filter(|i| !i.trim().is_empty()) {
        Some(image) => image.to_owned(),
        None => plan.image.clone(),
    };
    let member_image = image.clone();
    let pull_policy =
        crate::image::pull_policy(&image, plan.backend.spec.image_pull_policy).to_owned();

    let mut args = Vec::new();
    if index > 0 {
        args.push("--port".to_owned());
        args.push(port.to_string());
    }
    for entry in group.extra_args.iter().flatten() {
        args.push("-D".to_owned());
        args.push(entry.trim_start_matches('-').to_owned());
    }

    // Memory request: everything the store holds in host memory (crate::memory).
    let memory = crate::memory::member_memory(index, group)?.request;
    // No memory or CPU limit: see "Resources" in the module documentation.
    let mut requests = quantities(&[("cpu", MEMBER_CPU_REQUEST)]);
    if memory > 0 {
        requests.insert("memory".to_owned(), Quantity(memory.to_string()));
    }
    let mut limits = BTreeMap::new();
    match protocol {
        Protocol::Rdma => {
            // One interface is a seat on a shared adapter; more ask for that many dedicated
            // (exclusive) devices, since shared tokens may repeat one endpoint and satisfy the
            // count without granting distinct interfaces.
            let count = group.fabric_interface_count.max(1);
            let resource = if count > 1 {
                RDMA_EXCLUSIVE_RESOURCE
            } else {
                RDMA_SHARED_RESOURCE
            };
            limits.insert(resource.to_owned(), Quantity(count.to_string()));
        }
        Protocol::Efa => {
            limits.insert(
                EFA_RESOURCE.to_owned(),
                Quantity(group.fabric_interface_count.max(1).to_string()),
            );
        }
        _ => {}
    }

    let mut base_context = restricted_container_context();
    if fabric {
        base_context.capabilities = Some(Capabilities {
            add: Some(vec!["IPC_LOCK".to_owned(), "SYS_RESOURCE".to_owned()]),
            drop: Some(vec!["ALL".to_owned()]),
        });
    }
    let member_context = merge_security_context(base_context, group.security_context.as_ref());

    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    for (j, host_path) in group.host_paths.iter().flatten().enumerate() {
        let volume = format!("host-path-{j}");
        volumes.push(Volume {
            name: volume.clone(),
            host_path: Some(HostPathVolumeSource {
                path: host_path.path.clone(),
                type_: host_path.type_.map(|t| host_path_type(t).to_owned()),
            }),
            ..Volume::default()
        });
        mounts.push(VolumeMount {
            name: volume,
            mount_path: host_path.mount_path.clone(),
            read_only: host_path.read_only,
            ..VolumeMount::default()
        });
    }

    let grace = plan
        .managed
        .scale_in
        .as_ref()
        .and_then(|s| s.grace_period_seconds)
        .map_or(0, i64::from);
    let mut init_containers = Vec::new();
    let mut lifecycle = None;
    let mut termination_grace = MEMBER_TERMINATION_GRACE_SECONDS;
    if let Some(tier) = tier {
        volumes.push(Volume {
            name: TIER_VOLUME.to_owned(),
            host_path: Some(HostPathVolumeSource {
                path: tier.path.clone(),
                type_: Some("Directory".to_owned()),
            }),
            ..Volume::default()
        });
        mounts.push(VolumeMount {
            name: TIER_VOLUME.to_owned(),
            mount_path: tier.path.clone(),
            ..VolumeMount::default()
        });
        termination_grace += grace;
        lifecycle = Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(vec![
                        "python3".to_owned(),
                        "-c".to_owned(),
                        prestop_script(port, grace),
                    ]),
                }),
                ..LifecycleHandler::default()
            }),
            ..Lifecycle::default()
        });
        // The survey runs as the member does, without the member's added capabilities.
        let mut survey_context = member_context.clone();
        survey_context.capabilities = Some(Capabilities {
            add: None,
            drop: Some(vec!["ALL".to_owned()]),
        });
        init_containers.push(Container {
            name: SURVEY_CONTAINER.to_owned(),
            image: Some(image.clone()),
            image_pull_policy: Some(pull_policy.clone()),
            command: Some(vec![
                "sh".to_owned(),
                "-c".to_owned(),
                survey_script(&tier.path),
            ]),
            volume_mounts: Some(vec![VolumeMount {
                name: TIER_VOLUME.to_owned(),
                mount_path: tier.path.clone(),
                read_only: Some(true),
                ..VolumeMount::default()
            }]),
            termination_message_path: Some(TERMINATION_LOG.to_owned()),
            termination_message_policy: Some("File".to_owned()),
            resources: Some(small_task_resources()),
            security_context: Some(survey_context),
            ..Container::default()
        });
    }

    let member = Container {
        name: "member".to_owned(),
        image: Some(image),
        image_pull_policy: Some(pull_policy),
        command: Some(vec!["mc_store_rest_server".to_owned()]),
        args: (!args.is_empty()).then_some(args),
        env: Some(member_env(plan.backend, plan.namespace, index, group)?),
        resources: Some(ResourceRequirements {
            requests: Some(requests),
            limits: (!limits.is_empty()).then_some(limits),
            ..ResourceRequirements::default()
        }),
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(port),
                host: None,
            }),
            period_seconds: Some(5),
            failure_threshold: Some(3),
            ..Probe::default()
        }),
        lifecycle,
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        security_context: Some(member_context),
        ..Container::default()
    };

    let mut template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(names::labels(plan.name, &component)),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            node_selector: (!group.node_selector.is_empty()).then(|| group.node_selector.clone()),
            dns_policy: Some(
                if fabric {
                    "ClusterFirstWithHostNet"
                } else {
                    "ClusterFirst"
                }
                .to_owned(),
            ),
            host_network: fabric.then_some(true),
            termination_grace_period_seconds: Some(termination_grace),
            automount_service_account_token: Some(plan.lease_addressing),
            service_account_name: plan
                .lease_addressing
                .then(|| names::member_access_name(plan.name)),
            image_pull_secrets: pull_secrets(plan.backend),
            runtime_class_name: group.runtime_class_name.clone(),
            security_context: Some(store_pod_context(plan, &member_image)),
            init_containers: (!init_containers.is_empty()).then_some(init_containers),
            containers: vec![member],
            volumes: (!volumes.is_empty()).then_some(volumes),
            ..PodSpec::default()
        }),
    };
    let hash = pod_spec_hash(&template).map_err(|e| RenderError::Hash {
        name: ds_name.clone(),
        message: e.to_string(),
    })?;
    if let Some(metadata) = template.metadata.as_mut() {
        metadata.annotations = Some(BTreeMap::from([(
            POD_SPEC_HASH_ANNOTATION.to_owned(),
            hash,
        )]));
    }

    Ok(DaemonSet {
        metadata: metadata(plan, ds_name, &component),
        spec: DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(names::selector_labels(plan.name, &component)),
                match_expressions: None,
            },
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("OnDelete".to_owned()),
                rolling_update: None,
            }),
            template,
            ..DaemonSetSpec::default()
        },
        status: None,
    })
}

/// The small requests and limits of the survey and of the quota-policy seed (each copies or
/// reads a few small files).
fn small_task_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(quantities(&[
            ("cpu", SURVEY_CPU_REQUEST),
            ("memory", SURVEY_MEMORY_REQUEST),
        ])),
        limits: Some(quantities(&[
            ("cpu", SURVEY_CPU_LIMIT),
            ("memory", SURVEY_MEMORY_LIMIT),
        ])),
        ..ResourceRequirements::default()
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use super::*;

    /// A fresh directory under the system's temporary directory.
    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("warmcache-kvcache-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Runs the survey script on `tier` and returns what it wrote to its log.
    fn survey(tier: &Path, log: &Path) -> String {
        let script = survey_script_to(tier.to_str().unwrap(), log.to_str().unwrap());
        let status = Command::new("sh").arg("-c").arg(&script).status().unwrap();
        assert!(status.success(), "the survey always exits 0");
        std::fs::read_to_string(log).unwrap()
    }

    fn control() -> usize {
        std::fs::read_dir("/").unwrap().count()
    }

    #[test]
    fn the_survey_counts_entries_including_dotfiles_but_not_their_content() {
        let dir = scratch("survey");
        let tier = dir.join("it's a tier");
        std::fs::create_dir(&tier).unwrap();
        let log = dir.join("termination-log");
        assert_eq!(
            survey(&tier, &log),
            format!("entries=0 control={}", control())
        );
        std::fs::write(tier.join("1-1.bucket"), b"x").unwrap();
        std::fs::write(tier.join(".hidden"), b"x").unwrap();
        std::fs::create_dir(tier.join("sub")).unwrap();
        std::fs::write(tier.join("sub").join("inner"), b"x").unwrap();
        assert_eq!(
            survey(&tier, &log),
            format!("entries=3 control={}", control())
        );
        // A tier that cannot be listed reads as -1, and the member still starts.
        assert_eq!(
            survey(&dir.join("missing"), &log),
            format!("entries=-1 control={}", control())
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_prestop_hook_posts_the_grace_to_the_members_endpoint() {
        // The hook runs under python3 in the member image; hack/test.sh requires python3, so a
        // machine without it fails here rather than skipping the check.
        assert!(
            Command::new("python3").arg("--version").output().is_ok(),
            "python3 is required to run the rendered preStop hook"
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = i32::from(listener.local_addr().unwrap().port());
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            let mut buffer = [0_u8; 4096];
            // Read the head and the body announced by Content-Length.
            loop {
                let n = stream.read(&mut buffer).unwrap();
                request.extend_from_slice(&buffer[..n]);
                let text = String::from_utf8_lossy(&request).to_string();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let length = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap())
                        })
                        .unwrap_or(0);
                    if body.len() >= length {
                        break;
                    }
                }
                assert!(n > 0, "the connection closed early");
            }
            stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                .unwrap();
            String::from_utf8(request).unwrap()
        });
        let status = Command::new("python3")
            .arg("-c")
            .arg(prestop_script(port, 30))
            .status()
            .unwrap();
        let request = server.join().unwrap();
        assert!(status.success());
        assert!(
            request.starts_with("POST /api/unmount_local_disk HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(
            request
                .to_ascii_lowercase()
                .contains("content-type: application/json"),
            "{request}"
        );
        assert!(
            request.ends_with("\r\n\r\n{\"grace_period_seconds\": 30}"),
            "{request}"
        );
    }
}
