//! Ordered teardown of a deleted backend and the per-node emptying of its disk tier (reference
//! section 6), as pure decisions over what the controller read from its caches.
//!
//! [`teardown_step`] says what a reconcile of a backend with a `deletionTimestamp` does next:
//! wait while consumers hold it, delete the workloads and wait until they are gone, empty the
//! tier (when `cleanAfterDelete` asks for it), then remove the finalizer. [`cleanup_pass`] is one
//! pass of the tier cleanup: which cleanup Pods to create or delete, which Warning Events to
//! record on Nodes, and whether the cleanup is done.
//!
//! Every decision is a function of what is stored (the Pods with their labels, phases and
//! creation timestamps; the Nodes; the backends), so a controller that crashed between two API
//! calls resumes from the state it left: a Pod it created is found by its deterministic name, a
//! Pod it had not created yet is created, and the per-node clock is the Pod's own
//! `creationTimestamp`. The one repeat a crash can cause: a crash after some cleanup Pods were
//! deleted at the end of the cleanup but before the finalizer was removed makes the next pass
//! create those nodes' Pods again; each empties an already empty directory and succeeds, or is
//! given up after its own deadline.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, HostPathVolumeSource, Node, Pod, PodSecurityContext, PodSpec,
    ResourceRequirements, SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use warmcache_api_kvcache::v1alpha1::{API_VERSION, KIND, KVCacheBackend, MemberGroup};

use crate::condition::cap_message;
use crate::names::{self, APP_NAME, LABEL_COMPONENT, LABEL_INSTANCE, LABEL_NAME};
use crate::render::shell_quote;
use crate::validate::{clean, overlaps};

/// Label naming the backend a cleanup Pod empties the tier of.
pub const LABEL_CLEANUP_OF: &str = "kvcache.gpustack.ai/tier-cleanup-of";
/// Label carrying the UID of that backend (its incarnation).
pub const LABEL_CLEANUP_UID: &str = "kvcache.gpustack.ai/tier-cleanup-uid";
/// `app.kubernetes.io/component` of a cleanup Pod.
pub const CLEANUP_COMPONENT: &str = "tier-cleanup";
/// The cleanup Pod's only container.
pub const CLEANUP_CONTAINER: &str = "clean";
/// The cleanup Pod's volume (the tier directory of its node).
pub const CLEANUP_VOLUME: &str = "tier";
/// Where the cleanup container mounts the tier.
pub const CLEANUP_MOUNT: &str = "/tier";
/// How long a node's cleanup may take, counted from its Pod's `creationTimestamp`; after that
/// the node is given up (reported) and the deletion goes on.
pub const CLEANUP_DEADLINE: SignedDuration = SignedDuration::from_mins(5);
/// Requeue interval while a teardown is in progress (workloads going, cleanup pending).
pub const TEARDOWN_REQUEUE: Duration = Duration::from_secs(2);
/// Longest Pod name (a DNS subdomain).
pub const MAX_POD_NAME: usize = 253;
/// Prefix of a cleanup Pod's name when `<backend>-tier-clean-<hash>` would be too long.
pub const FALLBACK_POD_PREFIX: &str = "kvcache-tier-clean-";
/// CPU request of the cleanup container.
pub const CLEANUP_CPU_REQUEST: &str = "10m";
/// CPU limit of the cleanup container: unlinking a full tier (hundreds of thousands of bucket
/// files) must fit in the deadline.
pub const CLEANUP_CPU_LIMIT: &str = "500m";
/// Memory request of the cleanup container.
pub const CLEANUP_MEMORY_REQUEST: &str = "16Mi";
/// Memory limit of the cleanup container (`sh`, `find`, `rm`, `ls`, `wc`: streaming, flat).
pub const CLEANUP_MEMORY_LIMIT: &str = "64Mi";
/// Termination grace of a cleanup Pod: stopping `rm` halfway loses nothing more than stopping
/// it at once.
pub const CLEANUP_TERMINATION_GRACE_SECONDS: i64 = 5;

/// Warning on a Node: its tier was not (confirmed) emptied.
pub const EVENT_TIER_NOT_CLEANED: &str = "KVCacheTierNotCleaned";
/// Warning on a Node: skipped because another backend's tier overlaps.
pub const EVENT_TIER_SHARED_PATH: &str = "KVCacheTierSharedPath";
/// Warning on a Node: a running cleanup was stopped because of an overlap.
pub const EVENT_TIER_PARTLY_EMPTIED: &str = "KVCacheTierPartlyEmptied";

/// Why a teardown decision cannot be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TeardownError {
    /// The backend has no name.
    #[error("the KVCacheBackend has no metadata.name")]
    NoName,
    /// The backend has no UID (it is not a stored object).
    #[error(
        "KVCacheBackend {0:?} has no metadata.uid, so its cleanup Pods cannot be told from an earlier incarnation's"
    )]
    NoUid(String),
}

/// FNV-1a, 64 bits.
pub fn fnv64a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Name of the cleanup Pod of `backend` on `node`: `<backend>-tier-clean-<fnv64a(backend "/"
/// node)>` (16 lower-case hexadecimal digits), or `kvcache-tier-clean-<hash>` when that would
/// be longer than 253 characters.
pub fn cleanup_pod_name(backend: &str, node: &str) -> String {
    let hash = format!("{:016x}", fnv64a(format!("{backend}/{node}").as_bytes()));
    let name = format!("{backend}-tier-clean-{hash}");
    if name.len() <= MAX_POD_NAME {
        name
    } else {
        format!("{FALLBACK_POD_PREFIX}{hash}")
    }
}

/// The tier a deleted backend empties: the first group with `cleanAfterDelete: true` and a
/// non-blank path.
#[derive(Clone, Debug, PartialEq)]
pub struct CleanupTarget<'a> {
    /// Position of the group.
    pub index: usize,
    /// The group.
    pub group: &'a MemberGroup,
    /// The tier path, cleaned.
    pub path: String,
}

/// The tier `backend` empties on deletion, if any (reference section 6, step 3).
pub fn cleanup_target(backend: &KVCacheBackend) -> Option<CleanupTarget<'_>> {
    let managed = backend.spec.connection.managed.as_ref()?;
    managed
        .members
        .iter()
        .enumerate()
        .find_map(|(index, group)| {
            let tier = group.local_disk()?;
            (tier.clean_after_delete && !tier.path.trim().is_empty()).then(|| CleanupTarget {
                index,
                group,
                path: clean(&tier.path),
            })
        })
}

/// The image a cleanup Pod runs: the group's image, else the backend's, else the
/// `kv-cache-backend-image` setting (`default_image`). `Err` says why there is none.
pub fn cleanup_image(
    backend: &KVCacheBackend,
    group: &MemberGroup,
    default_image: Option<&str>,
) -> Result<String, String> {
    let nonblank = |i: Option<&str>| {
        i.map(str::trim)
            .filter(|i| !i.is_empty())
            .map(str::to_owned)
    };
    nonblank(group.image.as_deref())
        .or_else(|| nonblank(backend.spec.image.as_deref()))
        .or_else(|| nonblank(default_image))
        .ok_or_else(|| {
            "neither the member group nor spec.image names an image, and the kv-cache-backend-image setting is empty"
                .to_owned()
        })
}

/// Whether a Node carries every label of `selector` (an empty selector selects every node).
pub fn selects(selector: &BTreeMap<String, String>, node: &Node) -> bool {
    let labels = node.metadata.labels.as_ref();
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// The cleanup script, emptying the directory `dir` (the Pod mounts the tier at
/// [`CLEANUP_MOUNT`]). With `set -e` it removes every entry of `dir`, dotfiles included, one
/// batch of names at a time (no glob: a full tier has more names than an argument list holds),
/// never `dir` itself and never through a symbolic link (`rm -rf` removes a link, not its
/// target); then it probes that `dir` can still be listed, and exits non-zero unless `dir` has
/// no entry left. A failure makes the kubelet run it again (`restartPolicy: OnFailure`).
pub fn cleanup_script(dir: &str) -> String {
    format!(
        "set -e\n\
         tier={quoted}\n\
         find \"$tier/.\" ! -name . -prune -exec rm -rf -- {{}} +\n\
         ls -A \"$tier\" > /dev/null\n\
         left=$(( $(find \"$tier/.\" ! -name . -prune -print | wc -l) ))\n\
         if [ \"$left\" -ne 0 ]; then\n  \
         echo \"$tier still holds $left entries after emptying it\" >&2\n  \
         exit 1\n\
         fi\n",
        quoted = shell_quote(dir),
    )
}

/// The cleanup Pod of `backend` on `node` (reference section 6), in `namespace`.
///
/// - `nodeName` is pinned: the scheduler is bypassed, so the Pod runs on a cordoned or tainted
///   node too (no tolerations are added);
/// - `restartPolicy: OnFailure`: the kubelet retries in place, keeping the `creationTimestamp`
///   the deadline counts from;
/// - labels [`LABEL_CLEANUP_OF`] = backend name and [`LABEL_CLEANUP_UID`] = backend UID, plus
///   `app.kubernetes.io/name`/`instance`/`component` (`tier-cleanup`); a controller
///   ownerReference to the backend without `blockOwnerDeletion`; no finalizer;
/// - the backend's `imagePullSecrets`; the pull policy as for the members;
/// - one container [`CLEANUP_CONTAINER`] running [`cleanup_script`] on [`CLEANUP_MOUNT`], the
///   volume [`CLEANUP_VOLUME`]: hostPath = the cleaned tier path, type `Directory` (a missing
///   directory is never created; the Pod stays pending and the deadline reports it).
///
/// Hardening, as far as emptying a directory of any owner allows: the tier's entries belong to
/// the store's uid (65532 in the published images) or to whatever wrote there before, and the
/// directory itself may be root's, so no one non-root uid can remove them all, and Linux gives a
/// non-root container no effective capabilities. So the container runs as uid 0 / gid 0 with
/// every capability dropped except `DAC_OVERRIDE` (remove entries whatever their mode and
/// owner): no `CHOWN`, `FOWNER`, `SETUID`, `NET_RAW` or any other; no privilege escalation, not
/// privileged, a read-only root filesystem, seccomp `RuntimeDefault`, no service account token,
/// no service links, small requests and limits. The tier is the only writable mount. What this
/// cannot remove (an immutable file, a mount point inside the tier) makes the script fail, the
/// kubelet retry, and the deadline report the node.
pub fn cleanup_pod(
    backend: &KVCacheBackend,
    target: &CleanupTarget<'_>,
    node: &str,
    image: &str,
    namespace: &str,
) -> Result<Pod, TeardownError> {
    let name = backend
        .metadata
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or(TeardownError::NoName)?;
    let uid = backend
        .metadata
        .uid
        .as_deref()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| TeardownError::NoUid(name.to_owned()))?;
    let mut labels = names::labels(name, CLEANUP_COMPONENT);
    labels.insert(LABEL_CLEANUP_OF.to_owned(), name.to_owned());
    labels.insert(LABEL_CLEANUP_UID.to_owned(), uid.to_owned());
    let quantities = |items: &[(&str, &str)]| -> BTreeMap<String, Quantity> {
        items
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
            .collect()
    };
    let container = Container {
        name: CLEANUP_CONTAINER.to_owned(),
        image: Some(image.to_owned()),
        image_pull_policy: Some(
            crate::image::pull_policy(image, backend.spec.image_pull_policy).to_owned(),
        ),
        command: Some(vec![
            "sh".to_owned(),
            "-c".to_owned(),
            cleanup_script(CLEANUP_MOUNT),
        ]),
        volume_mounts: Some(vec![VolumeMount {
            name: CLEANUP_VOLUME.to_owned(),
            mount_path: CLEANUP_MOUNT.to_owned(),
            ..VolumeMount::default()
        }]),
        resources: Some(ResourceRequirements {
            requests: Some(quantities(&[
                ("cpu", CLEANUP_CPU_REQUEST),
                ("memory", CLEANUP_MEMORY_REQUEST),
            ])),
            limits: Some(quantities(&[
                ("cpu", CLEANUP_CPU_LIMIT),
                ("memory", CLEANUP_MEMORY_LIMIT),
            ])),
            ..ResourceRequirements::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_user: Some(0),
            run_as_group: Some(0),
            run_as_non_root: Some(false),
            capabilities: Some(Capabilities {
                add: Some(vec!["DAC_OVERRIDE".to_owned()]),
                drop: Some(vec!["ALL".to_owned()]),
            }),
            ..SecurityContext::default()
        }),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Container::default()
    };
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(cleanup_pod_name(name, node)),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels),
            owner_references: Some(vec![OwnerReference {
                api_version: API_VERSION.to_owned(),
                kind: KIND.to_owned(),
                name: name.to_owned(),
                uid: uid.to_owned(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.to_owned()),
            restart_policy: Some("OnFailure".to_owned()),
            image_pull_secrets: backend
                .spec
                .image_pull_secrets
                .clone()
                .filter(|s| !s.is_empty()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(CLEANUP_TERMINATION_GRACE_SECONDS),
            security_context: Some(PodSecurityContext {
                run_as_user: Some(0),
                run_as_group: Some(0),
                run_as_non_root: Some(false),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".to_owned(),
                    localhost_profile: None,
                }),
                ..PodSecurityContext::default()
            }),
            containers: vec![container],
            volumes: Some(vec![Volume {
                name: CLEANUP_VOLUME.to_owned(),
                host_path: Some(HostPathVolumeSource {
                    path: target.path.clone(),
                    type_: Some("Directory".to_owned()),
                }),
                ..Volume::default()
            }]),
            ..PodSpec::default()
        }),
        status: None,
    })
}

/// What one cleanup pass saw: everything is read from the controller's caches.
#[derive(Clone, Debug)]
pub struct CleanupInput<'a> {
    /// The deleted backend (with its `metadata.uid`).
    pub backend: &'a KVCacheBackend,
    /// Namespace of the cleanup Pods (the system namespace).
    pub namespace: &'a str,
    /// Every Node of the cluster; the pass applies the target group's nodeSelector itself.
    pub nodes: &'a [&'a Node],
    /// Every KVCacheBackend (one snapshot for the pass; this backend may be among them).
    pub backends: &'a [&'a KVCacheBackend],
    /// This backend's cleanup Pods: those labelled [`LABEL_CLEANUP_OF`] = its name, whatever
    /// their [`LABEL_CLEANUP_UID`].
    pub pods: &'a [&'a Pod],
    /// The clock.
    pub now: Timestamp,
    /// The cleanup image ([`cleanup_image`]), or why there is none.
    pub image: Result<String, String>,
}

/// Why a cleanup Pod is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeleteReason {
    /// It carries another incarnation's UID (an earlier backend of the same name).
    StaleIncarnation,
    /// Another backend's tier overlaps on its node: it is stopped.
    SharedPath,
    /// The cleanup is done: every cleanup Pod of this incarnation goes, running ones included.
    Finished,
}

/// One API call a cleanup pass asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum CleanupAction {
    /// Create this Pod (AlreadyExists means an earlier pass created it: tolerate it).
    CreatePod(Box<Pod>),
    /// Delete the Pod `name` in the namespace, with a UID precondition when `uid` is known, so
    /// that a Pod created since under the same name is not the one deleted.
    DeletePod {
        /// Pod name.
        name: String,
        /// UID of the Pod the pass saw.
        uid: Option<String>,
        /// Why.
        why: DeleteReason,
    },
    /// Record a Warning Event on the Node `node`.
    NodeEvent {
        /// Node name.
        node: String,
        /// Event reason (reference section 7).
        reason: &'static str,
        /// Event message, the same on every pass for the same situation.
        message: String,
    },
}

/// The outcome of a cleanup pass.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct CleanupPlan {
    /// The calls to make, in order.
    pub actions: Vec<CleanupAction>,
    /// Whether every selected node is finished (emptied, skipped or given up). When true the
    /// actions include the deletion of every cleanup Pod of this incarnation, and the controller
    /// removes the finalizer once they are made.
    pub done: bool,
    /// Nodes still pending after this pass (for the phase message), sorted.
    pub pending: Vec<String>,
    /// Every selected node this pass found finished, with how (sorted by node). On the pass
    /// that is `done` this is the cleanup's result for every node, which the controller counts
    /// once the finalizer is off.
    pub finished: Vec<(String, NodeOutcome)>,
}

/// How the cleanup of one node ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeOutcome {
    /// Its cleanup Pod succeeded: the directory is empty.
    Emptied,
    /// Not confirmed empty within [`CLEANUP_DEADLINE`] (`KVCacheTierNotCleaned`).
    GivenUpDeadline,
    /// No image to run the cleanup with (`KVCacheTierNotCleaned`).
    GivenUpNoImage,
    /// Skipped: another live backend's tier overlaps there (`KVCacheTierSharedPath`).
    SharedPath,
}

impl NodeOutcome {
    /// Every outcome, for metrics exported with zeros.
    pub const ALL: [NodeOutcome; 4] = [
        NodeOutcome::Emptied,
        NodeOutcome::GivenUpDeadline,
        NodeOutcome::GivenUpNoImage,
        NodeOutcome::SharedPath,
    ];

    /// A stable metric label.
    pub fn label(self) -> &'static str {
        match self {
            NodeOutcome::Emptied => "emptied",
            NodeOutcome::GivenUpDeadline => "given_up_deadline",
            NodeOutcome::GivenUpNoImage => "given_up_no_image",
            NodeOutcome::SharedPath => "shared_path",
        }
    }
}

fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

fn terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

/// Another backend whose tier overlaps `path` on `node`, when emptying it there would remove
/// that backend's data: a managed backend of another name with a tier group whose cleaned path
/// is equal to `path` or nested either way and whose nodeSelector selects the node, unless that
/// backend is itself being deleted and empties that tier too (`cleanAfterDelete`). The first
/// such backend by name.
fn sharing_backend<'a>(
    name: &str,
    path: &str,
    node: &Node,
    backends: &[&'a KVCacheBackend],
) -> Option<&'a str> {
    let mut found: Option<&'a str> = None;
    for other in backends {
        let Some(other_name) = other.metadata.name.as_deref() else {
            continue;
        };
        if other_name == name {
            continue;
        }
        let Some(managed) = other.spec.connection.managed.as_ref() else {
            continue;
        };
        let deleting = other.metadata.deletion_timestamp.is_some();
        let shares = managed.members.iter().any(|group| {
            group.local_disk().is_some_and(|tier| {
                !tier.path.trim().is_empty()
                    && overlaps(&clean(&tier.path), path)
                    && selects(&group.node_selector, node)
                    && !(deleting && tier.clean_after_delete)
            })
        });
        if shares && found.is_none_or(|f| other_name < f) {
            found = Some(other_name);
        }
    }
    found
}

/// One pass of the tier cleanup (reference section 6). Returns `done` immediately (with
/// nothing to do but delete leftover cleanup Pods of this incarnation) when the backend has no
/// [`cleanup_target`] or no Node matches the target group's nodeSelector now.
///
/// For each selected Node, in name order:
/// 1. **shared path**: another backend's tier overlaps here ([`DeleteReason::SharedPath`]): this
///    backend's cleanup Pod there, if it belongs to this UID, is not terminating and has not
///    succeeded, is deleted (stopped), and the Node gets `KVCacheTierSharedPath` and, when a Pod
///    was stopped, `KVCacheTierPartlyEmptied`. The node is finished. (A Pod that already
///    succeeded emptied the directory before the overlap was seen; stopping it would stop
///    nothing, so the node counts as emptied.)
/// 2. **ensure the Pod** [`cleanup_pod_name`]: another incarnation's Pod is deleted and the node
///    stays pending without a clock; a Pod that succeeded finishes the node; any other Pod is in
///    flight (never deleted to retry); no Pod: without an image, `KVCacheTierNotCleaned` and the
///    node is finished; otherwise the Pod is created and the node is pending.
/// 3. **deadline**: a Pod in flight older than [`CLEANUP_DEADLINE`] (from its own
///    `creationTimestamp`) gives the node up with `KVCacheTierNotCleaned`; younger, it is pending.
///
/// No pending node: done, and every Pod of this incarnation that is not terminating yet is
/// deleted ([`DeleteReason::Finished`]). Event messages carry no elapsed time, so the repeats of
/// later passes fold.
pub fn cleanup_pass(input: &CleanupInput<'_>) -> Result<CleanupPlan, TeardownError> {
    let backend = input.backend;
    let name = backend
        .metadata
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or(TeardownError::NoName)?;
    let uid = backend
        .metadata
        .uid
        .as_deref()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| TeardownError::NoUid(name.to_owned()))?;
    let mut plan = CleanupPlan::default();
    let ours = |pod: &Pod| label(pod, LABEL_CLEANUP_OF) == Some(name);
    let pods: BTreeMap<&str, &Pod> = input
        .pods
        .iter()
        .filter(|p| ours(p))
        .filter_map(|p| p.metadata.name.as_deref().map(|n| (n, *p)))
        .collect();
    let mut deleted: Vec<String> = Vec::new();
    let mut delete = |plan: &mut CleanupPlan, pod: &Pod, why: DeleteReason| {
        let Some(pod_name) = pod.metadata.name.clone() else {
            return;
        };
        if deleted.contains(&pod_name) {
            return;
        }
        deleted.push(pod_name.clone());
        plan.actions.push(CleanupAction::DeletePod {
            name: pod_name,
            uid: pod.metadata.uid.clone(),
            why,
        });
    };

    if let Some(target) = cleanup_target(backend) {
        let path = target.path.as_str();
        let mut nodes: Vec<(&str, &Node)> = input
            .nodes
            .iter()
            .filter(|n| selects(&target.group.node_selector, n))
            .filter_map(|n| n.metadata.name.as_deref().map(|name| (name, *n)))
            .collect();
        nodes.sort_by(|a, b| a.0.cmp(b.0));
        nodes.dedup_by(|a, b| a.0 == b.0);
        for (node_name, node) in nodes {
            let pod_name = cleanup_pod_name(name, node_name);
            let pod = pods.get(pod_name.as_str()).copied();
            let event = |reason: &'static str, message: String| CleanupAction::NodeEvent {
                node: node_name.to_owned(),
                reason,
                message: cap_message(&message),
            };

            if let Some(other) = sharing_backend(name, path, node, input.backends) {
                let this_incarnation = pod.filter(|p| label(p, LABEL_CLEANUP_UID) == Some(uid));
                if this_incarnation.is_some_and(|p| phase(p) == "Succeeded") {
                    plan.finished
                        .push((node_name.to_owned(), NodeOutcome::Emptied));
                    continue;
                }
                let stopped = this_incarnation.filter(|p| !terminating(p));
                if let Some(stopped) = stopped {
                    delete(&mut plan, stopped, DeleteReason::SharedPath);
                }
                plan.actions.push(event(
                    EVENT_TIER_SHARED_PATH,
                    format!(
                        "{path} was not emptied for deleted KVCacheBackend \"{name}\": KVCacheBackend \"{other}\" \
                         declares an overlapping path on this node and emptying it would remove that backend's data"
                    ),
                ));
                if stopped.is_some() {
                    plan.actions.push(event(
                        EVENT_TIER_PARTLY_EMPTIED,
                        format!(
                            "{path} may hold a partial result: emptying it for deleted KVCacheBackend \"{name}\" was \
                             already running when KVCacheBackend \"{other}\" was found to declare an overlapping \
                             path, and was stopped; check that backend's data on this node"
                        ),
                    ));
                }
                plan.finished
                    .push((node_name.to_owned(), NodeOutcome::SharedPath));
                continue;
            }

            match pod {
                Some(pod) if label(pod, LABEL_CLEANUP_UID) != Some(uid) => {
                    if !terminating(pod) {
                        delete(&mut plan, pod, DeleteReason::StaleIncarnation);
                    }
                    plan.pending.push(node_name.to_owned());
                }
                Some(pod) if phase(pod) == "Succeeded" => {
                    plan.finished
                        .push((node_name.to_owned(), NodeOutcome::Emptied));
                }
                Some(pod) => {
                    let age = pod
                        .metadata
                        .creation_timestamp
                        .as_ref()
                        .map(|created| input.now.duration_since(created.0));
                    if age.is_some_and(|age| age > CLEANUP_DEADLINE) {
                        plan.actions.push(event(
                            EVENT_TIER_NOT_CLEANED,
                            format!(
                                "{path} was not confirmed empty for deleted KVCacheBackend \"{name}\": its cleanup was \
                                 still {} after 5m0s and the deletion was not held open for it; a Pod that never left \
                                 pending usually means the directory does not exist on this node",
                                phase(pod).to_lowercase()
                            ),
                        ));
                        plan.finished
                            .push((node_name.to_owned(), NodeOutcome::GivenUpDeadline));
                    } else {
                        plan.pending.push(node_name.to_owned());
                    }
                }
                None => match &input.image {
                    Err(why) => {
                        plan.actions.push(event(
                            EVENT_TIER_NOT_CLEANED,
                            format!(
                                "{path} still holds data from deleted KVCacheBackend \"{name}\": no image could be \
                                 resolved to empty it, and the deletion was not held open for it ({why})"
                            ),
                        ));
                        plan.finished
                            .push((node_name.to_owned(), NodeOutcome::GivenUpNoImage));
                    }
                    Ok(image) => {
                        let pod = cleanup_pod(backend, &target, node_name, image, input.namespace)?;
                        plan.actions.push(CleanupAction::CreatePod(Box::new(pod)));
                        plan.pending.push(node_name.to_owned());
                    }
                },
            }
        }
    }

    // Pods of another incarnation on nodes this pass did not look at belong to no live backend:
    // they go too (their owner is gone, so the garbage collector would remove them as well).
    for pod in pods.values() {
        if label(pod, LABEL_CLEANUP_UID) != Some(uid) && !terminating(pod) {
            delete(&mut plan, pod, DeleteReason::StaleIncarnation);
        }
    }
    plan.done = plan.pending.is_empty();
    if plan.done {
        for pod in pods.values() {
            if label(pod, LABEL_CLEANUP_UID) == Some(uid) && !terminating(pod) {
                delete(&mut plan, pod, DeleteReason::Finished);
            }
        }
    }
    Ok(plan)
}

/// One object the teardown waits for: a rendered workload still present (found by the
/// backend's labels, including groups already removed from the spec).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// Kind (`Deployment`, `Service`, `DaemonSet`, ...).
    pub kind: String,
    /// Name.
    pub name: String,
    /// Whether it already has a `deletionTimestamp`.
    pub terminating: bool,
}

/// What a reconcile of a deleted backend does next (reference section 6, steps 1-4).
#[derive(Clone, Debug, PartialEq)]
pub enum TeardownStep<'a> {
    /// Consumers in `status.usedBy` hold the backend: phase Deleting, `Deletable=False`, and no
    /// requeue timer (a consumer's status write wakes the controller).
    WaitForConsumers {
        /// The consumers, as `Kind/namespace/name` (or `Kind/name`), sampled.
        message: String,
    },
    /// Delete these workloads (the ones not terminating yet) and requeue after
    /// [`TEARDOWN_REQUEUE`] until none is left.
    DeleteWorkloads {
        /// Workloads to delete now.
        delete: Vec<Workload>,
        /// Phase message.
        message: String,
    },
    /// The workloads are gone: run [`cleanup_pass`] on this target; apply its actions, and when
    /// it is done remove the finalizer; otherwise requeue after [`TEARDOWN_REQUEUE`].
    CleanTier(CleanupTarget<'a>),
    /// Nothing is left to wait for: remove the finalizer.
    RemoveFinalizer,
}

impl TeardownStep<'_> {
    /// When to reconcile again, if the step does not finish the teardown.
    pub fn requeue(&self) -> Option<Duration> {
        match self {
            Self::WaitForConsumers { .. } | Self::RemoveFinalizer => None,
            Self::DeleteWorkloads { .. } | Self::CleanTier(_) => Some(TEARDOWN_REQUEUE),
        }
    }
}

/// The next teardown step of `backend` (which has a `deletionTimestamp`) given the workloads
/// still present.
pub fn teardown_step<'a>(backend: &'a KVCacheBackend, workloads: &[Workload]) -> TeardownStep<'a> {
    let consumers: Vec<String> = backend
        .status
        .as_ref()
        .and_then(|s| s.used_by.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            if c.namespace.is_empty() {
                format!("{}/{}", c.kind, c.name)
            } else {
                format!("{}/{}/{}", c.kind, c.namespace, c.name)
            }
        })
        .collect();
    if !consumers.is_empty() {
        return TeardownStep::WaitForConsumers {
            message: format!(
                "deletion waits for the {} consumer(s) in status.usedBy to release this backend: {}",
                consumers.len(),
                crate::condition::sample_list(&consumers)
            ),
        };
    }
    if !workloads.is_empty() {
        let listed: Vec<String> = workloads
            .iter()
            .map(|w| format!("{}/{}", w.kind, w.name))
            .collect();
        return TeardownStep::DeleteWorkloads {
            delete: workloads
                .iter()
                .filter(|w| !w.terminating)
                .cloned()
                .collect(),
            message: format!(
                "deleting the workloads, waiting for {} to be gone: {}",
                workloads.len(),
                crate::condition::sample_list(&listed)
            ),
        };
    }
    match cleanup_target(backend) {
        Some(target) => TeardownStep::CleanTier(target),
        None => TeardownStep::RemoveFinalizer,
    }
}

/// Labels of a backend's rendered workloads (`app.kubernetes.io/name` and `instance`), for
/// listing every one of them, groups removed from the spec included.
pub fn workload_labels(backend: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAME.to_owned(), APP_NAME.to_owned()),
        (LABEL_INSTANCE.to_owned(), backend.to_owned()),
    ])
}

/// Whether a Pod is one of the rendered workloads' Pods rather than a cleanup Pod (both carry
/// the backend's name and instance labels).
pub fn is_cleanup_pod(pod: &Pod) -> bool {
    label(pod, LABEL_COMPONENT) == Some(CLEANUP_COMPONENT) || label(pod, LABEL_CLEANUP_OF).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv64a_vectors() {
        // The published FNV-1a 64 test vectors.
        assert_eq!(fnv64a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv64a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv64a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn names() {
        let name = cleanup_pod_name("kvc", "node-a");
        assert_eq!(
            name,
            format!("kvc-tier-clean-{:016x}", fnv64a(b"kvc/node-a"))
        );
        assert_ne!(name, cleanup_pod_name("kvc", "node-b"));
        let long = "n".repeat(240);
        let fallback = cleanup_pod_name(&long, "node-a");
        assert_eq!(
            fallback,
            format!(
                "kvcache-tier-clean-{:016x}",
                fnv64a(format!("{long}/node-a").as_bytes())
            )
        );
        // Exactly at the limit the long form is kept.
        let fits = "m".repeat(MAX_POD_NAME - "-tier-clean-".len() - 16);
        assert_eq!(cleanup_pod_name(&fits, "x").len(), MAX_POD_NAME);
        assert!(cleanup_pod_name(&fits, "x").starts_with(&fits));
        let over = "m".repeat(MAX_POD_NAME - "-tier-clean-".len() - 15);
        assert!(cleanup_pod_name(&over, "x").starts_with(FALLBACK_POD_PREFIX));
    }
}
