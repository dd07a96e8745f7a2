//! The status of a backend (reference sections 2 and 5), derived from what the controller read:
//! the leader's admin endpoints ([`crate::store`]), the member and leader Pods and DaemonSets
//! from its caches, the survey verdict ([`crate::survey`]) and, while deleting, the teardown step
//! ([`crate::teardown`]).
//!
//! # Conditions
//!
//! Every condition carries the backend's `metadata.generation` as `observedGeneration`.
//!
//! | type | status | reason | when |
//! |---|---|---|---|
//! | `LeaderAvailable` | True | `LeaderServing` | `/health` answers `status: ok` with `service_ready: true` |
//! | | False | `LeaderStarting` | not serving yet, and never was (a fresh backend) |
//! | | False | `LeaderUnreachable` | no 200 from `/health`, after it served once |
//! | | False | `LeaderNotServing` | `/health` answers but not ready (or unreadable), after it served once |
//! | | Unknown | `NoAdminEndpoint` | an external backend without an `Admin` endpoint |
//! | `MembersMounted` | True | `AllMounted` | every member Pod (or, external, at least one segment) is listed |
//! | | False | `LeaderUnavailable` | the leader does not serve |
//! | | False | `ListingFailed` | `/get_segments_detail` failed (5xx, timeout, unreadable); `status.members` kept |
//! | | Unknown | `SegmentListingNotServed` | 404: a master older than 0.3.12; `status.members` empty |
//! | | False | `ListingTooLarge` | more than 5000 segments or 512 KiB of identifiers; `status.members` kept |
//! | | False | `AmbiguousMemberIdentity` | two running member Pods share an address (host network) |
//! | | False | `NoSegments` | the leader lists no segment |
//! | | False | `MembersShort` | a running member Pod is not listed, or a member Pod is stuck |
//! | | False | `MembersStarting` | members are still starting (pulling, initialising, mounting) |
//! | `CapacityObserved` | True | `Observed` | `/metrics` read while the leader serves |
//! | | False | `LeaderNotReady` | the leader does not serve, so its gauges mean nothing yet |
//! | | False | `ScrapeFailed` | `/metrics` failed or lacks one of the four gauges |
//! | `Deletable` | False | `InUse` | exactly while `status.usedBy` is non-empty |
//! | | True | `NotInUse` | otherwise |
//! | `TierWasEmpty` | True/False | `Empty` / `PreexistingContent` | written once by the survey |
//!
//! `LeaderStarting`, `ListingFailed`, `SegmentListingNotServed`, `NoSegments`,
//! `AmbiguousMemberIdentity` and `ListingTooLarge` are the reference's reasons; the others are
//! this operator's (reference section 11 lists the rest of upstream's as unknown).
//!
//! # Capacity
//!
//! `status.capacity` is absent until `/metrics` is read while the leader serves (the store
//! answers zeroed gauges before that), and cleared when a read fails: never zero-filled. `total`
//! is `master_total_capacity_bytes`, plus `master_total_file_capacity_bytes` when a tier is
//! declared; `used` is `master_allocated_bytes`, plus `master_allocated_file_size_bytes`. The
//! tier's part of `total` is a ceiling, not the disk's size; a tier without `capacity` reports the
//! store's default, 2 TiB per member, and the `CapacityObserved` message says so. The message
//! also says what the tier holds and, when that is 0, why: with the offload-on-evict mode this
//! operator renders, the store writes a key to disk only when it is evicted from memory, so the
//! tier stays empty until the segments are nearly full.
//!
//! # Phase
//!
//! `Deleting` while the backend has a `deletionTimestamp`. Otherwise: the leader does not serve
//! -> `Error` when it served before (its `LeaderAvailable` says so), `Provisioning` when it never
//! did. The leader serves -> `Degraded` when a member Pod is stuck or short, a group's DaemonSet
//! selects no node, or the listing failed, is too large or ambiguous; `Provisioning` while no
//! segment is mounted yet; `Ready` otherwise. `phaseMessage` is empty exactly when `Ready`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use warmcache_api_kvcache::v1alpha1::{
    Capacity, Endpoint, EndpointName, KVCacheBackend, KVCacheBackendStatus, Medium, MemberStatus,
    condition, phase,
};
use warmcache_api_kvcache::{LEADER_ADMIN_PORT, LEADER_RPC_PORT};

use crate::condition::{
    ConditionStatus, NewCondition, clip_foreign, find_condition, sample_list, set_condition,
};
use crate::names::{self, LABEL_COMPONENT, LABEL_INSTANCE};
use crate::store::{
    self, Fetch, Gauges, Health, STORE_DEFAULT_TIER_BYTES, SegmentsDetail, StoreError,
};
use crate::survey::TierVerdict;

/// Requeue interval of a settled backend: how often the store is read again.
pub const SETTLED_REQUEUE: Duration = Duration::from_secs(15);
/// How long a running member container may take to mount its segment before a member the
/// leader does not list counts as short.
pub const MOUNT_GRACE: SignedDuration = SignedDuration::from_secs(60);

/// `LeaderAvailable=True`.
pub const REASON_LEADER_SERVING: &str = "LeaderServing";
/// `LeaderAvailable=False` before the leader first served.
pub const REASON_LEADER_STARTING: &str = "LeaderStarting";
/// `LeaderAvailable=False`: no answer after the leader served.
pub const REASON_LEADER_UNREACHABLE: &str = "LeaderUnreachable";
/// `LeaderAvailable=False`: answers, but does not serve, after it served.
pub const REASON_LEADER_NOT_SERVING: &str = "LeaderNotServing";
/// `LeaderAvailable=Unknown`: an external backend without an Admin endpoint.
pub const REASON_NO_ADMIN_ENDPOINT: &str = "NoAdminEndpoint";
/// `MembersMounted=True`.
pub const REASON_ALL_MOUNTED: &str = "AllMounted";
/// `MembersMounted=False`: the leader does not serve.
pub const REASON_LEADER_UNAVAILABLE: &str = "LeaderUnavailable";
/// `MembersMounted=False`: the listing could not be read.
pub const REASON_LISTING_FAILED: &str = "ListingFailed";
/// `MembersMounted=Unknown`: the master does not serve the listing (older than 0.3.12).
pub const REASON_SEGMENT_LISTING_NOT_SERVED: &str = "SegmentListingNotServed";
/// `MembersMounted=False`: the listing is too large to hold.
pub const REASON_LISTING_TOO_LARGE: &str = "ListingTooLarge";
/// `MembersMounted=False`: two member Pods share an address.
pub const REASON_AMBIGUOUS_MEMBER_IDENTITY: &str = "AmbiguousMemberIdentity";
/// `MembersMounted=False`: no segment is listed.
pub const REASON_NO_SEGMENTS: &str = "NoSegments";
/// `MembersMounted=False`: a member is short or stuck.
pub const REASON_MEMBERS_SHORT: &str = "MembersShort";
/// `MembersMounted=False`: members are still starting.
pub const REASON_MEMBERS_STARTING: &str = "MembersStarting";
/// `CapacityObserved=True`.
pub const REASON_OBSERVED: &str = "Observed";
/// `CapacityObserved=False`: the leader does not serve.
pub const REASON_LEADER_NOT_READY: &str = "LeaderNotReady";
/// `CapacityObserved=False`: `/metrics` could not be read.
pub const REASON_SCRAPE_FAILED: &str = "ScrapeFailed";
/// `Deletable=False`.
pub const REASON_IN_USE: &str = "InUse";
/// `Deletable=True`.
pub const REASON_NOT_IN_USE: &str = "NotInUse";

/// Waiting reasons of a container that will not fix themselves without a change: a member Pod
/// showing one is stuck (image pulls in progress are not).
pub const STUCK_WAITING_REASONS: [&str; 8] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// The `Client` address of a managed backend: `<name>-leader.<namespace>.svc:50051`.
pub fn client_address(backend: &str, namespace: &str) -> String {
    format!(
        "{}.{namespace}.svc:{LEADER_RPC_PORT}",
        names::leader_name(backend)
    )
}

/// The `Admin` address of a managed backend: `<name>-leader.<namespace>.svc:9003`.
pub fn managed_admin_address(backend: &str, namespace: &str) -> String {
    format!(
        "{}.{namespace}.svc:{LEADER_ADMIN_PORT}",
        names::leader_name(backend)
    )
}

/// `status.endpoints`: managed, the leader Service's Client and Admin addresses; external, the
/// spec's endpoints as written.
pub fn endpoints(backend: &KVCacheBackend, namespace: &str) -> Vec<Endpoint> {
    let connection = &backend.spec.connection;
    if let Some(external) = &connection.external {
        return external.endpoints.clone();
    }
    let name = backend.metadata.name.as_deref().unwrap_or_default();
    vec![
        Endpoint {
            name: EndpointName::Client,
            address: client_address(name, namespace),
        },
        Endpoint {
            name: EndpointName::Admin,
            address: managed_admin_address(name, namespace),
        },
    ]
}

/// The `host:port` the controller reads the leader's admin endpoints at: the leader Service's
/// Admin address (managed) or the spec's `Admin` endpoint (external; `None` without one).
pub fn admin_address(backend: &KVCacheBackend, namespace: &str) -> Option<String> {
    endpoints(backend, namespace)
        .into_iter()
        .find(|e| e.name == EndpointName::Admin)
        .map(|e| e.address)
}

/// A byte count as a quantity: with the largest binary suffix that divides it exactly (`64Mi`,
/// `2Ti`), else a plain number.
pub fn bytes_quantity(bytes: u64) -> Quantity {
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes == 0 {
        return Quantity("0".to_owned());
    }
    let mut value = bytes;
    let mut suffix = "";
    for s in SUFFIXES {
        if !value.is_multiple_of(1024) {
            break;
        }
        value /= 1024;
        suffix = s;
    }
    Quantity(format!("{value}{suffix}"))
}

/// What the controller read for one status pass, besides the member Pods.
#[derive(Clone, Debug, Default)]
pub struct Observed<'a> {
    /// Namespace of the workloads (the system namespace).
    pub namespace: &'a str,
    /// `GET /health` of [`admin_address`] (`None`: not asked, as without an Admin endpoint).
    pub health: Option<&'a Fetch>,
    /// `GET /metrics` (`None`: not asked).
    pub metrics: Option<&'a Fetch>,
    /// `GET /get_segments_detail` (`None`: not asked).
    pub segments: Option<&'a Fetch>,
    /// The leader Deployment's Pods (managed), for saying why a leader is not up.
    pub leader_pods: &'a [&'a Pod],
    /// The member DaemonSets `<backend>-member-<i>` found (managed).
    pub member_daemonsets: &'a [&'a DaemonSet],
    /// This pass's survey verdict ([`crate::survey::tier_was_empty`]); written only when
    /// `TierWasEmpty` is absent.
    pub tier_verdict: Option<&'a TierVerdict>,
    /// While deleting, the teardown's phase message (what it waits for).
    pub teardown_message: Option<&'a str>,
}

/// Why a Pod is stuck, if it is: unschedulable, a container waiting for a reason that does
/// not fix itself ([`STUCK_WAITING_REASONS`]), or failed.
pub fn pod_problem(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    if let Some(scheduled) = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        && scheduled.reason.as_deref() == Some("Unschedulable")
    {
        return Some(format!(
            "unschedulable: {}",
            clip_foreign(scheduled.message.as_deref().unwrap_or_default())
        ));
    }
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    for container in containers {
        if let Some(waiting) = container.state.as_ref().and_then(|s| s.waiting.as_ref())
            && let Some(reason) = waiting.reason.as_deref()
            && STUCK_WAITING_REASONS.contains(&reason)
        {
            let message = clip_foreign(waiting.message.as_deref().unwrap_or_default());
            let mut problem = if message.is_empty() {
                format!("container {} is {reason}", container.name)
            } else {
                format!("container {} is {reason}: {message}", container.name)
            };
            if crate::security::is_run_as_non_root_refusal(&message) {
                let image =
                    container_image(pod, &container.name).unwrap_or(container.image.as_str());
                problem.push_str("; ");
                problem.push_str(&crate::security::run_as_non_root_hint(&clip_foreign(image)));
            }
            return Some(problem);
        }
    }
    if status.phase.as_deref() == Some("Failed") {
        return Some(format!(
            "failed: {}",
            clip_foreign(
                status
                    .message
                    .as_deref()
                    .or(status.reason.as_deref())
                    .unwrap_or("no reason given")
            )
        ));
    }
    None
}

/// The image the Pod's spec gives container `name` (init or regular).
fn container_image<'a>(pod: &'a Pod, name: &str) -> Option<&'a str> {
    let spec = pod.spec.as_ref()?;
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .find(|c| c.name == name)
        .and_then(|c| c.image.as_deref())
}

/// The store's four gauges as the status reads them: only from a leader whose `/health` says it
/// serves (before that `/metrics` answers zeroed gauges) and whose `/metrics` parses; `None`
/// otherwise (never zero-filled). The controller's tier-bytes metrics take this.
pub fn store_gauges(health: Option<&Fetch>, metrics: Option<&Fetch>) -> Option<Gauges> {
    if !matches!(leader_state(health), LeaderState::Serving(_)) {
        return None;
    }
    store::ok_body(store::METRICS_PATH, metrics?)
        .and_then(store::parse_metrics)
        .ok()
}

/// The phases a backend's status can show ([`backend_status`]), for bounded metric labels.
pub const PHASES: [&str; 5] = [
    phase::PROVISIONING,
    phase::READY,
    phase::DEGRADED,
    phase::ERROR,
    phase::DELETING,
];

/// Label for a backend whose status has no phase yet, or one this operator does not write.
pub const PHASE_UNKNOWN: &str = "Unknown";

/// How many of `backends` show each phase: one entry per [`PHASES`] value and
/// [`PHASE_UNKNOWN`], zeros included, so a metric built from it has a bounded, fixed label set.
pub fn phase_counts<'a>(
    backends: impl IntoIterator<Item = &'a KVCacheBackend>,
) -> Vec<(&'static str, u64)> {
    let mut counts: Vec<(&'static str, u64)> = PHASES
        .iter()
        .copied()
        .chain(std::iter::once(PHASE_UNKNOWN))
        .map(|p| (p, 0))
        .collect();
    for backend in backends {
        let phase = backend.status.as_ref().and_then(|s| s.phase.as_deref());
        let label = PHASES
            .iter()
            .copied()
            .find(|p| Some(*p) == phase)
            .unwrap_or(PHASE_UNKNOWN);
        if let Some(entry) = counts.iter_mut().find(|(p, _)| *p == label) {
            entry.1 += 1;
        }
    }
    counts
}

/// The leader as `/health` shows it.
enum LeaderState {
    Serving(Health),
    /// Not serving; `answered` when a 200 came back (not ready, or unreadable).
    NotServing {
        why: String,
        answered: bool,
    },
    NoAdmin,
}

fn leader_state(health: Option<&Fetch>) -> LeaderState {
    let Some(fetch) = health else {
        return LeaderState::NoAdmin;
    };
    match store::ok_body(store::HEALTH_PATH, fetch) {
        Err(e) => LeaderState::NotServing {
            why: e.to_string(),
            answered: false,
        },
        Ok(body) => match store::parse_health(body) {
            Err(e) => LeaderState::NotServing {
                why: e.to_string(),
                answered: true,
            },
            Ok(h) if h.serving() => LeaderState::Serving(h),
            Ok(h) => LeaderState::NotServing {
                why: format!(
                    "the leader answers /health with status {:?} and service_ready {} (role {}, HA state {})",
                    clip_foreign(&h.status),
                    h.service_ready,
                    clip_foreign(h.role.as_deref().unwrap_or("unknown")),
                    clip_foreign(h.ha_state.as_deref().unwrap_or("unknown")),
                ),
                answered: true,
            },
        },
    }
}

/// The segments listing as read.
enum Listing {
    Ok(SegmentsDetail),
    NotServed,
    Failed(String),
    TooLarge(String),
}

fn listing(segments: Option<&Fetch>) -> Listing {
    let Some(fetch) = segments else {
        return Listing::Failed("the segment listing was not read".to_owned());
    };
    if let Ok(reply) = fetch
        && reply.status == 404
    {
        return Listing::NotServed;
    }
    match store::ok_body(store::SEGMENTS_DETAIL_PATH, fetch).and_then(store::parse_segments_detail)
    {
        Err(e) => Listing::Failed(e.to_string()),
        Ok(detail) => match store::listing_too_large(&detail) {
            Some(why) => Listing::TooLarge(why),
            None => Listing::Ok(detail),
        },
    }
}

/// One member Pod of this backend.
struct MemberPod<'a> {
    pod: &'a Pod,
    name: String,
    group: usize,
    node: Option<String>,
    ips: Vec<String>,
}

fn member_pods<'a>(backend: &str, pods: &[&'a Pod]) -> Vec<MemberPod<'a>> {
    let mut out = Vec::new();
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let labels = pod.metadata.labels.as_ref();
        let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
        if label(LABEL_INSTANCE) != Some(backend) {
            continue;
        }
        let Some(group) = label(LABEL_COMPONENT)
            .and_then(|c| c.strip_prefix("member-"))
            .and_then(|i| i.parse::<usize>().ok())
        else {
            continue;
        };
        let status = pod.status.as_ref();
        let mut ips: Vec<String> = status
            .and_then(|s| s.pod_ip.clone())
            .into_iter()
            .chain(
                status
                    .and_then(|s| s.pod_ips.as_ref())
                    .into_iter()
                    .flatten()
                    .map(|ip| ip.ip.clone()),
            )
            .filter(|ip| !ip.is_empty())
            .collect();
        ips.sort();
        ips.dedup();
        out.push(MemberPod {
            pod,
            name: pod.metadata.name.clone().unwrap_or_default(),
            group,
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            ips,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

fn ready(pod: &Pod) -> bool {
    crate::rollout::is_ready(pod)
}

/// When the `member` container started running, if it runs.
fn member_started(pod: &Pod) -> Option<Timestamp> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == "member")?
        .state
        .as_ref()?
        .running
        .as_ref()?
        .started_at
        .as_ref()
        .map(|t| t.0)
}

fn medium_name(medium: Medium) -> &'static str {
    match medium {
        Medium::Dram => "DRAM",
        Medium::Vram => "VRAM",
    }
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0".to_owned();
    }
    let tenths = (u128::from(part) * 1000 / u128::from(whole)) as u64;
    format!("{}.{}", tenths / 10, tenths % 10)
}

/// The result of joining the listing with the member Pods.
#[derive(Default)]
struct Join {
    members: Vec<MemberStatus>,
    mounted: BTreeSet<String>,
    ambiguous: Vec<String>,
}

fn join(backend: &KVCacheBackend, detail: &SegmentsDetail, pods: &[MemberPod<'_>]) -> Join {
    let groups = backend
        .spec
        .connection
        .managed
        .as_ref()
        .map(|m| m.members.as_slice())
        .unwrap_or_default();
    let mut by_ip: BTreeMap<&str, Vec<&MemberPod<'_>>> = BTreeMap::new();
    for pod in pods.iter().filter(|p| running(p.pod)) {
        for ip in &pod.ips {
            by_ip.entry(ip.as_str()).or_default().push(pod);
        }
    }
    let mut out = Join::default();
    let mut seen = BTreeSet::new();
    // Segments per address, to count how many of the Pods sharing an address have mounted.
    let mut per_ip: BTreeMap<&str, usize> = BTreeMap::new();
    for segment in &detail.segments {
        if !seen.insert(segment.segment_id.clone()) {
            continue;
        }
        let candidates = by_ip
            .get(segment.host())
            .map(Vec::as_slice)
            .unwrap_or_default();
        *per_ip.entry(segment.host()).or_default() += 1;
        let same = |f: &dyn Fn(&MemberPod<'_>) -> Option<String>| -> Option<String> {
            let first = f(candidates.first()?);
            candidates
                .iter()
                .all(|c| f(c) == first)
                .then_some(first)
                .flatten()
        };
        let node = same(&|p| p.node.clone());
        let medium = same(&|p| {
            groups
                .get(p.group)
                .map(|g| medium_name(g.medium).to_owned())
        });
        out.members.push(MemberStatus {
            segment_id: segment.segment_id.clone(),
            client_id: segment.client_id.clone(),
            segment_name: segment.segment_name.clone(),
            node_name: node,
            medium,
            protocol: segment.protocol.clone(),
            state: segment.status.clone(),
        });
    }
    for (ip, candidates) in &by_ip {
        let listed = per_ip.get(ip).copied().unwrap_or(0);
        if candidates.len() > 1 {
            let names: Vec<&str> = candidates.iter().map(|p| p.name.as_str()).collect();
            out.ambiguous
                .push(format!("{} share {ip}", names.join(" and ")));
        }
        // With several Pods on one address, as many count as mounted as there are segments.
        for pod in candidates.iter().take(listed) {
            out.mounted.insert(pod.name.clone());
        }
    }
    out.members.sort_by(|a, b| a.segment_id.cmp(&b.segment_id));
    out
}

/// The members' state, for `MembersMounted` and the phase.
struct MemberView {
    condition: (ConditionStatus, &'static str, String),
    degraded: Option<String>,
    /// No segment is mounted yet (the backend is still coming up).
    none_mounted: bool,
    members: Option<Vec<MemberStatus>>,
}

fn member_view(
    backend: &KVCacheBackend,
    observed: &Observed<'_>,
    member_pods_in: &[&Pod],
    gauges: Option<&Gauges>,
    now: Timestamp,
    previous: Option<Vec<MemberStatus>>,
) -> MemberView {
    let name = backend.metadata.name.as_deref().unwrap_or_default();
    let managed = backend.spec.connection.managed.as_ref();
    let pods = member_pods(name, member_pods_in);
    let detail = match listing(observed.segments) {
        Listing::NotServed => {
            let mounted = gauges.is_some_and(|g| g.total_capacity_bytes > 0);
            return MemberView {
                condition: (
                    ConditionStatus::Unknown,
                    REASON_SEGMENT_LISTING_NOT_SERVED,
                    "the leader does not serve /get_segments_detail (a master older than 0.3.12), so the \
                     members cannot be told from its segments"
                        .to_owned(),
                ),
                degraded: None,
                none_mounted: !mounted,
                members: None,
            };
        }
        Listing::Failed(why) => {
            return MemberView {
                condition: (
                    ConditionStatus::False,
                    REASON_LISTING_FAILED,
                    format!("{why}; status.members is the last listing read"),
                ),
                degraded: Some(format!("the segment listing could not be read: {why}")),
                none_mounted: false,
                members: previous,
            };
        }
        Listing::TooLarge(why) => {
            return MemberView {
                condition: (
                    ConditionStatus::False,
                    REASON_LISTING_TOO_LARGE,
                    format!("{why}; status.members is the last listing held"),
                ),
                degraded: Some(why),
                none_mounted: false,
                members: previous,
            };
        }
        Listing::Ok(detail) => detail,
    };
    let joined = join(backend, &detail, &pods);
    let members = Some(joined.members.clone());
    let segment_count = joined.members.len();

    if managed.is_none() {
        // External: only the leader's word.
        return if segment_count == 0 {
            MemberView {
                condition: (
                    ConditionStatus::False,
                    REASON_NO_SEGMENTS,
                    "the leader lists no segment".to_owned(),
                ),
                degraded: None,
                none_mounted: true,
                members,
            }
        } else {
            MemberView {
                condition: (
                    ConditionStatus::True,
                    REASON_ALL_MOUNTED,
                    format!("the leader lists {segment_count} segment(s)"),
                ),
                degraded: None,
                none_mounted: false,
                members,
            }
        };
    }

    let mut stuck = Vec::new();
    let mut short = Vec::new();
    let mut starting = Vec::new();
    for pod in &pods {
        let at = pod
            .node
            .as_deref()
            .map_or_else(|| pod.name.clone(), |n| format!("{} on {n}", pod.name));
        if joined.mounted.contains(&pod.name) {
            continue;
        }
        if let Some(problem) = pod_problem(pod.pod) {
            stuck.push(format!("{at}: {problem}"));
        } else if running(pod.pod)
            && (ready(pod.pod)
                || member_started(pod.pod).is_some_and(|t| now.duration_since(t) > MOUNT_GRACE))
        {
            short.push(at);
        } else {
            starting.push(at);
        }
    }
    let mut unselected = Vec::new();
    let mut wanted: i64 = 0;
    let mut wanted_known = false;
    for (index, _) in managed.iter().flat_map(|m| m.members.iter().enumerate()) {
        let ds_name = names::member_name(name, index);
        if let Some(status) = observed
            .member_daemonsets
            .iter()
            .find(|d| d.metadata.name.as_deref() == Some(ds_name.as_str()))
            .and_then(|d| d.status.as_ref())
        {
            wanted_known = true;
            wanted += i64::from(status.desired_number_scheduled);
            if status.desired_number_scheduled == 0 {
                unselected.push(ds_name);
            }
        }
    }
    let mounted = joined.mounted.len();
    let pod_count = pods.len();
    let mut degraded = Vec::new();
    if !stuck.is_empty() {
        degraded.push(format!("member Pod(s) stuck: {}", sample_list(&stuck)));
    }
    if !short.is_empty() {
        degraded.push(format!(
            "running member Pod(s) the leader does not list: {}",
            sample_list(&short)
        ));
    }
    if !joined.ambiguous.is_empty() {
        degraded.push(format!(
            "member Pods sharing an address cannot be told apart: {}",
            sample_list(&joined.ambiguous)
        ));
    }
    if !unselected.is_empty() {
        degraded.push(format!(
            "no node matches the nodeSelector of {}",
            sample_list(&unselected)
        ));
    }
    let condition = if !joined.ambiguous.is_empty() {
        (
            ConditionStatus::False,
            REASON_AMBIGUOUS_MEMBER_IDENTITY,
            format!(
                "member Pods on the host network share an address, so the leader's segments cannot be \
                 told apart between them: {}",
                sample_list(&joined.ambiguous)
            ),
        )
    } else if segment_count == 0 {
        let mut message =
            "the leader lists no segment: no member has mounted its memory".to_owned();
        if !degraded.is_empty() {
            message = format!("{message}; {}", degraded.join("; "));
        } else if !starting.is_empty() {
            message = format!("{message} yet; starting: {}", sample_list(&starting));
        }
        (ConditionStatus::False, REASON_NO_SEGMENTS, message)
    } else if !stuck.is_empty() || !short.is_empty() {
        (
            ConditionStatus::False,
            REASON_MEMBERS_SHORT,
            format!(
                "{mounted} of {pod_count} member Pod(s) have mounted their segments; {}",
                degraded.join("; ")
            ),
        )
    } else if !starting.is_empty()
        || (wanted_known && i64::try_from(mounted).unwrap_or(i64::MAX) < wanted)
    {
        let mut message = if wanted_known {
            format!(
                "{mounted} of the {wanted} member(s) the DaemonSets want have mounted their segments"
            )
        } else {
            format!("{mounted} of {pod_count} member Pod(s) have mounted their segments")
        };
        if !starting.is_empty() {
            message = format!("{message}; starting: {}", sample_list(&starting));
        }
        (ConditionStatus::False, REASON_MEMBERS_STARTING, message)
    } else {
        let extra = segment_count.saturating_sub(mounted);
        let mut message = format!("all {mounted} member Pod(s) have mounted their segments");
        if extra > 0 {
            message.push_str(&format!(
                "; the leader also lists {extra} segment(s) of no running member Pod"
            ));
        }
        (ConditionStatus::True, REASON_ALL_MOUNTED, message)
    };
    MemberView {
        condition,
        degraded: (!degraded.is_empty()).then(|| degraded.join("; ")),
        none_mounted: segment_count == 0,
        members,
    }
}

fn capacity_message(backend: &KVCacheBackend, gauges: &Gauges, tier: bool) -> String {
    let mut message = format!(
        "memory: {} of {} bytes allocated ({}%)",
        gauges.allocated_bytes,
        gauges.total_capacity_bytes,
        percent(gauges.allocated_bytes, gauges.total_capacity_bytes)
    );
    if !tier {
        return message;
    }
    let declared = backend
        .spec
        .connection
        .managed
        .as_ref()
        .and_then(|m| m.members.iter().find_map(|g| g.local_disk()))
        .and_then(|t| t.capacity.as_ref())
        .and_then(|q| crate::quantity::parse(q).ok())
        .is_some_and(|a| a.is_positive());
    let ceiling = if declared {
        "the declared capacity of each member's tier".to_owned()
    } else {
        format!(
            "not declared: the tier has no capacity, so each member reports the store's default of \
             {STORE_DEFAULT_TIER_BYTES} bytes (2Ti), while the store really evicts from the tier at 90% of the disk"
        )
    };
    message.push_str(&format!(
        "; disk tier: ceiling {} bytes ({ceiling}), {} bytes written",
        gauges.total_file_capacity_bytes, gauges.allocated_file_size_bytes
    ));
    if gauges.allocated_file_size_bytes == 0 {
        message.push_str(
            "; nothing has been written to the tier yet, which is expected while memory has room: the store \
             writes a key to the tier only when it is evicted from memory (offload on evict), so the tier stays \
             empty until the segments are nearly full",
        );
    }
    message
}

fn uses_tier(backend: &KVCacheBackend, gauges: &Gauges) -> bool {
    match &backend.spec.connection.managed {
        Some(managed) => managed.members.iter().any(|g| g.local_disk().is_some()),
        None => gauges.total_file_capacity_bytes > 0,
    }
}

/// Whether the leader served before: its `LeaderAvailable` is True, or False for a reason only
/// a leader that served gets.
fn leader_was_up(conditions: &[Condition]) -> bool {
    find_condition(conditions, condition::LEADER_AVAILABLE).is_some_and(|c| {
        c.status == "True"
            || c.reason == REASON_LEADER_UNREACHABLE
            || c.reason == REASON_LEADER_NOT_SERVING
    })
}

/// The status of `backend` from one pass of observations (module documentation). `member_pods`
/// are the backend's member Pods (label `app.kubernetes.io/instance` = its name, component
/// `member-<i>`; others are ignored). The previous status supplies the conditions' transition
/// times, `usedBy` (written by consumers, kept as is), the existing `TierWasEmpty` and, when a
/// listing fails, `members`.
pub fn backend_status(
    backend: &KVCacheBackend,
    observed: &Observed<'_>,
    member_pods: &[&Pod],
    now: Timestamp,
) -> KVCacheBackendStatus {
    let previous = backend.status.clone().unwrap_or_default();
    let generation = backend.metadata.generation;
    let now_time = Time(now);
    let mut conditions = previous.conditions.clone().unwrap_or_default();
    let was_up = leader_was_up(&conditions);
    let condition =
        |type_: &'static str,
         (status, reason, message): (ConditionStatus, &'static str, String)| {
            NewCondition {
                type_,
                status,
                reason,
                message,
                observed_generation: generation,
            }
        };
    let admin = admin_address(backend, observed.namespace);
    let leader_problem = observed
        .leader_pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .find_map(|p| {
            pod_problem(p).map(|why| {
                format!(
                    "leader Pod {}: {why}",
                    p.metadata.name.as_deref().unwrap_or_default()
                )
            })
        });

    // LeaderAvailable.
    let state = leader_state(observed.health);
    let leader_condition = match &state {
        LeaderState::Serving(h) => (
            ConditionStatus::True,
            REASON_LEADER_SERVING,
            format!(
                "the leader answers on {} and reports its service ready (role {})",
                admin.as_deref().unwrap_or_default(),
                clip_foreign(h.role.as_deref().unwrap_or("unknown"))
            ),
        ),
        LeaderState::NoAdmin => (
            ConditionStatus::Unknown,
            REASON_NO_ADMIN_ENDPOINT,
            "spec.connection.external.endpoints has no Admin endpoint, so the store cannot be read"
                .to_owned(),
        ),
        LeaderState::NotServing { why, answered } => {
            let why = match &leader_problem {
                Some(problem) => format!("{why}; {problem}"),
                None => why.clone(),
            };
            if !was_up {
                (
                    ConditionStatus::False,
                    REASON_LEADER_STARTING,
                    format!("the leader is not serving yet: {why}"),
                )
            } else if *answered {
                (ConditionStatus::False, REASON_LEADER_NOT_SERVING, why)
            } else {
                (ConditionStatus::False, REASON_LEADER_UNREACHABLE, why)
            }
        }
    };
    let leader_message = leader_condition.2.clone();
    set_condition(
        &mut conditions,
        condition(condition::LEADER_AVAILABLE, leader_condition),
        &now_time,
    );
    let serving = matches!(state, LeaderState::Serving(_));

    // CapacityObserved and status.capacity.
    let gauges: Result<Gauges, String> = if serving {
        match observed.metrics {
            None => Err("the leader's /metrics was not read".to_owned()),
            Some(fetch) => store::ok_body(store::METRICS_PATH, fetch)
                .and_then(store::parse_metrics)
                .map_err(|e: StoreError| e.to_string()),
        }
    } else {
        Err(String::new())
    };
    let (capacity, capacity_condition) = match (&gauges, serving) {
        (Ok(g), _) => {
            let tier = uses_tier(backend, g);
            let (total, used) = if tier {
                (
                    g.total_capacity_bytes
                        .saturating_add(g.total_file_capacity_bytes),
                    g.allocated_bytes
                        .saturating_add(g.allocated_file_size_bytes),
                )
            } else {
                (g.total_capacity_bytes, g.allocated_bytes)
            };
            (
                Some(Capacity {
                    total: Some(bytes_quantity(total)),
                    used: Some(bytes_quantity(used)),
                }),
                (
                    ConditionStatus::True,
                    REASON_OBSERVED,
                    capacity_message(backend, g, tier),
                ),
            )
        }
        (Err(why), true) => (
            None,
            (ConditionStatus::False, REASON_SCRAPE_FAILED, why.clone()),
        ),
        (Err(_), false) => (
            None,
            (
                ConditionStatus::False,
                REASON_LEADER_NOT_READY,
                "the leader does not serve, so its gauges mean nothing yet".to_owned(),
            ),
        ),
    };

    // MembersMounted and status.members.
    let view = if serving {
        member_view(
            backend,
            observed,
            member_pods,
            gauges.as_ref().ok(),
            now,
            previous.members.clone(),
        )
    } else {
        MemberView {
            condition: (
                ConditionStatus::False,
                REASON_LEADER_UNAVAILABLE,
                "the leader does not serve, so it lists no segment".to_owned(),
            ),
            degraded: None,
            none_mounted: true,
            members: previous.members.clone(),
        }
    };
    set_condition(
        &mut conditions,
        condition(condition::MEMBERS_MOUNTED, view.condition.clone()),
        &now_time,
    );
    set_condition(
        &mut conditions,
        condition(condition::CAPACITY_OBSERVED, capacity_condition),
        &now_time,
    );

    // Deletable.
    let consumers: Vec<String> = previous
        .used_by
        .iter()
        .flatten()
        .map(|c| {
            if c.namespace.is_empty() {
                format!("{}/{}", c.kind, c.name)
            } else {
                format!("{}/{}/{}", c.kind, c.namespace, c.name)
            }
        })
        .collect();
    let deletable = if consumers.is_empty() {
        (
            ConditionStatus::True,
            REASON_NOT_IN_USE,
            "no consumer holds this backend (status.usedBy is empty)".to_owned(),
        )
    } else {
        (
            ConditionStatus::False,
            REASON_IN_USE,
            format!(
                "{} consumer(s) in status.usedBy hold this backend: {}",
                consumers.len(),
                sample_list(&consumers)
            ),
        )
    };
    set_condition(
        &mut conditions,
        condition(condition::DELETABLE, deletable),
        &now_time,
    );

    // TierWasEmpty: written once.
    if let Some(verdict) = observed.tier_verdict
        && find_condition(&conditions, condition::TIER_WAS_EMPTY).is_none()
    {
        set_condition(&mut conditions, verdict.condition.clone(), &now_time);
    }

    // Phase.
    let (phase, message) = if backend.metadata.deletion_timestamp.is_some() {
        (
            phase::DELETING,
            observed
                .teardown_message
                .map_or_else(|| "the backend is being deleted".to_owned(), str::to_owned),
        )
    } else if matches!(state, LeaderState::NoAdmin) {
        (phase::PROVISIONING, leader_message)
    } else if !serving {
        if was_up {
            (
                phase::ERROR,
                format!("the leader stopped serving: {leader_message}"),
            )
        } else {
            (phase::PROVISIONING, leader_message)
        }
    } else if let Some(degraded) = &view.degraded {
        (phase::DEGRADED, degraded.clone())
    } else if view.none_mounted {
        (
            phase::PROVISIONING,
            format!(
                "the leader serves; waiting for members to mount their segments: {}",
                view.condition.2
            ),
        )
    } else {
        (phase::READY, String::new())
    };

    KVCacheBackendStatus {
        phase: Some(phase.to_owned()),
        phase_message: Some(crate::condition::cap_message(&message)),
        conditions: Some(conditions),
        endpoints: Some(endpoints(backend, observed.namespace)),
        capacity,
        members: view.members,
        used_by: previous.used_by,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(bytes_quantity(0).0, "0");
        assert_eq!(bytes_quantity(67_108_864).0, "64Mi");
        assert_eq!(bytes_quantity(STORE_DEFAULT_TIER_BYTES).0, "2Ti");
        assert_eq!(bytes_quantity(4_000_000).0, "4000000");
        assert_eq!(bytes_quantity(1_024_000).0, "1000Ki");
        assert_eq!(bytes_quantity(1000).0, "1000");
        assert_eq!(bytes_quantity(1024).0, "1Ki");
    }

    #[test]
    fn percents() {
        assert_eq!(percent(0, 0), "0");
        assert_eq!(percent(64_000_000, 67_108_864), "95.3");
        assert_eq!(percent(1, 3), "33.3");
    }
}
