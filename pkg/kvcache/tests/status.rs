//! `backend_status` and the admin-endpoint parsers on the replies a real `mooncake_master`
//! 0.3.13.post1 served (`tests/fixtures/mooncake/`, recorded by `tests/mooncake.rs`), and on
//! the failures around them: phase (5.3), the conditions (5.2 and `LeaderAvailable`,
//! `CapacityObserved`, `Deletable`), capacity never zero-filled, endpoints, members.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateWaiting, ContainerStatus, Pod,
    PodCondition, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use warmcache_api_kvcache::v1alpha1::{
    ConsumerReference, EndpointName, KVCacheBackend, KVCacheBackendStatus,
};
use warmcache_kvcache::condition::{ConditionStatus, NewCondition, find_condition};
use warmcache_kvcache::names::{labels, member_component};
use warmcache_kvcache::status::{Observed, admin_address, backend_status};
use warmcache_kvcache::store::{
    self, Fetch, HttpReply, STORE_DEFAULT_TIER_BYTES, StoreError, parse_all_segments, parse_health,
    parse_metrics, parse_segments_detail,
};
use warmcache_kvcache::survey::TierVerdict;
use warmcache_kvcache::vectors::{self, tier0, with};
use warmcache_kvcache::{RenderContext, from_value, render};

const T0: i64 = 1_800_000_000;

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(T0 + secs).unwrap()
}

fn fixture(scenario: &str, file: &str) -> Vec<u8> {
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/mooncake/0.3.13.post1")
        .join(scenario)
        .join(file);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn ok(body: Vec<u8>) -> Fetch {
    Ok(HttpReply { status: 200, body })
}

fn status_code(code: u16, body: &str) -> Fetch {
    Ok(HttpReply {
        status: code,
        body: body.as_bytes().to_vec(),
    })
}

/// The three replies of a fixture scenario.
struct Replies {
    health: Fetch,
    metrics: Fetch,
    segments: Fetch,
}

fn recorded(scenario: &str) -> Replies {
    Replies {
        health: ok(fixture(scenario, "health.json")),
        metrics: ok(fixture(scenario, "metrics.txt")),
        segments: ok(fixture(scenario, "get_segments_detail.json")),
    }
}

fn unreachable() -> Replies {
    let refused = || Err("connection refused".to_owned());
    Replies {
        health: refused(),
        metrics: refused(),
        segments: refused(),
    }
}

/// V2 with a 1Gi tier (as the recorded member had), stored.
fn tier_backend() -> KVCacheBackend {
    let mut b: KVCacheBackend =
        from_value(with(vectors::v2(), |v| tier0(v)["capacity"] = json!("1Gi"))).unwrap();
    b.metadata.uid = Some("uid-1".into());
    b.metadata.generation = Some(4);
    b.metadata.creation_timestamp = Some(Time(at(0)));
    b
}

fn daemonset(backend: &KVCacheBackend, desired: i32) -> DaemonSet {
    let mut ds = render(backend, &RenderContext::default()).unwrap().members[0].clone();
    ds.status = Some(DaemonSetStatus {
        desired_number_scheduled: desired,
        ..DaemonSetStatus::default()
    });
    ds
}

/// A member Pod of group 0 named `name` on `node` with IP `ip`, running (ready or not) since
/// `started` seconds after T0.
fn member(name: &str, node: &str, ip: &str, started: i64, is_ready: bool) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels("kvc", &member_component(0))),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some(ip.into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if is_ready { "True" } else { "False" }.into(),
                ..PodCondition::default()
            }]),
            container_statuses: Some(vec![ContainerStatus {
                name: "member".into(),
                ready: is_ready,
                state: Some(ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: Some(Time(at(started))),
                    }),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            }]),
            ..PodStatus::default()
        }),
    }
}

fn pulling(name: &str, reason: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels("kvc", &member_component(0))),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some("node-z".into()),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Pending".into()),
            container_statuses: Some(vec![ContainerStatus {
                name: "member".into(),
                state: Some(ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some(reason.into()),
                        message: Some(format!("{reason} for the image")),
                    }),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            }]),
            ..PodStatus::default()
        }),
    }
}

struct Pass<'a> {
    backend: &'a KVCacheBackend,
    replies: &'a Replies,
    pods: Vec<&'a Pod>,
    daemonsets: Vec<&'a DaemonSet>,
    now: Timestamp,
    verdict: Option<&'a TierVerdict>,
}

impl<'a> Pass<'a> {
    fn new(backend: &'a KVCacheBackend, replies: &'a Replies) -> Self {
        Self {
            backend,
            replies,
            pods: Vec::new(),
            daemonsets: Vec::new(),
            now: at(600),
            verdict: None,
        }
    }

    fn run(&self) -> KVCacheBackendStatus {
        backend_status(
            self.backend,
            &Observed {
                namespace: "gpustack-system",
                health: Some(&self.replies.health),
                metrics: Some(&self.replies.metrics),
                segments: Some(&self.replies.segments),
                member_daemonsets: &self.daemonsets,
                tier_verdict: self.verdict,
                teardown_message: Some("deleting the workloads"),
                ..Observed::default()
            },
            &self.pods,
            self.now,
        )
    }
}

fn cond<'a>(status: &'a KVCacheBackendStatus, type_: &str) -> (&'a str, &'a str, &'a str) {
    let c = find_condition(status.conditions.as_deref().unwrap(), type_)
        .unwrap_or_else(|| panic!("no {type_}"));
    (c.status.as_str(), c.reason.as_str(), c.message.as_str())
}

fn after(backend: &KVCacheBackend, status: KVCacheBackendStatus) -> KVCacheBackend {
    let mut next = backend.clone();
    next.status = Some(status);
    next
}

#[test]
fn the_recorded_replies_parse() {
    let health = parse_health(&fixture("leader-only", "health.json")).unwrap();
    assert!(health.serving());
    assert_eq!(health.ha_state.as_deref(), Some("serving"));
    let g = parse_metrics(&fixture("filled", "metrics.txt")).unwrap();
    assert_eq!(g.total_capacity_bytes, 67_108_864);
    assert_eq!(g.allocated_bytes, 64_000_000);
    assert_eq!(g.total_file_capacity_bytes, 1_073_741_824);
    assert_eq!(g.allocated_file_size_bytes, 48_000_000);
    assert_eq!(
        parse_metrics(&fixture("default-capacity", "metrics.txt"))
            .unwrap()
            .total_file_capacity_bytes,
        STORE_DEFAULT_TIER_BYTES
    );
    let detail = parse_segments_detail(&fixture("filled", "get_segments_detail.json")).unwrap();
    assert_eq!(detail.total_segments, 1);
    let segment = &detail.segments[0];
    assert_eq!(segment.host(), "127.0.0.1");
    assert_eq!(segment.allocator_used_bytes, Some(64_000_000));
    assert_eq!(segment.status.as_deref(), Some("OK"));
    assert_eq!(
        parse_all_segments(&fixture("filled", "get_all_segments.txt")).unwrap(),
        vec![segment.segment_name.clone()]
    );
    assert!(
        parse_all_segments(&fixture("leader-only", "get_all_segments.txt"))
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        parse_segments_detail(&fixture("leader-only", "get_segments_detail.json"))
            .unwrap()
            .segments,
        vec![]
    );
}

#[test]
fn metrics_lacking_or_repeating_a_gauge_are_refused() {
    let text = String::from_utf8(fixture("mounted", "metrics.txt")).unwrap();
    let without: String = text
        .lines()
        .filter(|l| !l.starts_with("master_allocated_file_size_bytes "))
        .map(|l| format!("{l}\n"))
        .collect();
    let err = parse_metrics(without.as_bytes()).unwrap_err();
    assert!(
        err.to_string()
            .contains("has no master_allocated_file_size_bytes"),
        "{err}"
    );
    let twice = format!("{text}\nmaster_allocated_bytes 1\n");
    assert!(
        parse_metrics(twice.as_bytes())
            .unwrap_err()
            .to_string()
            .contains("more than once")
    );
    let bad = text.replace(
        "master_total_capacity_bytes 67108864",
        "master_total_capacity_bytes -1",
    );
    assert!(matches!(
        parse_metrics(bad.as_bytes()),
        Err(StoreError::Malformed { .. })
    ));
    // Labelled samples of the same family are not the gauge.
    let labelled = "master_total_capacity_bytes{x=\"1\"} 5\nmaster_total_capacity_bytes 7\n\
                    master_allocated_bytes 0\nmaster_total_file_capacity_bytes 0\nmaster_allocated_file_size_bytes 0\n";
    assert_eq!(
        parse_metrics(labelled.as_bytes())
            .unwrap()
            .total_capacity_bytes,
        7
    );
}

#[test]
fn a_fresh_backend_is_provisioning_with_every_observed_axis_false() {
    let backend = tier_backend();
    let replies = unreachable();
    let status = Pass::new(&backend, &replies).run();
    assert_eq!(status.phase.as_deref(), Some("Provisioning"));
    assert!(
        status
            .phase_message
            .as_deref()
            .unwrap()
            .contains("connection refused")
    );
    assert_eq!(cond(&status, "LeaderAvailable").0, "False");
    assert_eq!(cond(&status, "LeaderAvailable").1, "LeaderStarting");
    assert_eq!(cond(&status, "MembersMounted").0, "False");
    assert_eq!(cond(&status, "CapacityObserved").0, "False");
    assert_eq!(cond(&status, "CapacityObserved").1, "LeaderNotReady");
    assert_eq!(
        cond(&status, "Deletable"),
        (
            "True",
            "NotInUse",
            "no consumer holds this backend (status.usedBy is empty)"
        )
    );
    assert_eq!(status.capacity, None, "absent until a scrape succeeds");
    assert!(find_condition(status.conditions.as_deref().unwrap(), "TierWasEmpty").is_none());
    for c in status.conditions.as_deref().unwrap() {
        assert_eq!(c.observed_generation, Some(4), "{}", c.type_);
        assert_eq!(c.last_transition_time, Time(at(600)));
    }
    let endpoints = status.endpoints.unwrap();
    assert_eq!(endpoints[0].name, EndpointName::Client);
    assert_eq!(endpoints[0].address, "kvc-leader.gpustack-system.svc:50051");
    assert_eq!(endpoints[1].name, EndpointName::Admin);
    assert_eq!(endpoints[1].address, "kvc-leader.gpustack-system.svc:9003");
    assert_eq!(
        admin_address(&backend, "gpustack-system").as_deref(),
        Some("kvc-leader.gpustack-system.svc:9003")
    );
}

#[test]
fn the_leader_alone_serves_but_no_segment_is_mounted() {
    let backend = tier_backend();
    let replies = recorded("leader-only");
    let ds = daemonset(&backend, 1);
    let mut pass = Pass::new(&backend, &replies);
    pass.daemonsets = vec![&ds];
    let status = pass.run();
    assert_eq!(status.phase.as_deref(), Some("Provisioning"));
    assert_eq!(cond(&status, "LeaderAvailable").0, "True");
    assert_eq!(cond(&status, "MembersMounted").1, "NoSegments");
    assert_eq!(cond(&status, "CapacityObserved").0, "True");
    assert_eq!(
        status.capacity.as_ref().unwrap().total.as_ref().unwrap().0,
        "0"
    );
    assert_eq!(status.members, Some(vec![]));
}

#[test]
fn a_mounted_member_makes_the_backend_ready_with_the_declared_tier_ceiling() {
    let backend = tier_backend();
    let replies = recorded("mounted");
    let pod = member("kvc-member-0-a", "node-a", "127.0.0.1", 0, true);
    let ds = daemonset(&backend, 1);
    let mut pass = Pass::new(&backend, &replies);
    pass.pods = vec![&pod];
    pass.daemonsets = vec![&ds];
    let status = pass.run();
    assert_eq!(status.phase.as_deref(), Some("Ready"));
    assert_eq!(status.phase_message.as_deref(), Some(""));
    assert_eq!(
        cond(&status, "MembersMounted"),
        (
            "True",
            "AllMounted",
            "all 1 member Pod(s) have mounted their segments"
        )
    );
    let capacity = status.capacity.as_ref().unwrap();
    assert_eq!(capacity.total.as_ref().unwrap().0, "1088Mi");
    assert_eq!(capacity.used.as_ref().unwrap().0, "0");
    let (_, reason, message) = cond(&status, "CapacityObserved");
    assert_eq!(reason, "Observed");
    assert!(
        message.contains("the declared capacity of each member's tier"),
        "{message}"
    );
    assert!(
        message.contains("nothing has been written to the tier yet"),
        "{message}"
    );
    let members = status.members.as_ref().unwrap();
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].segment_name, "127.0.0.1:14037");
    assert_eq!(members[0].node_name.as_deref(), Some("node-a"));
    assert_eq!(members[0].protocol.as_deref(), Some("tcp"));
    assert_eq!(members[0].state.as_deref(), Some("OK"));
}

#[test]
fn a_filled_tier_reports_what_it_holds() {
    let backend = tier_backend();
    let replies = recorded("filled");
    let pod = member("kvc-member-0-a", "node-a", "127.0.0.1", 0, true);
    let mut pass = Pass::new(&backend, &replies);
    pass.pods = vec![&pod];
    let status = pass.run();
    let capacity = status.capacity.as_ref().unwrap();
    assert_eq!(
        capacity.used.as_ref().unwrap().0,
        "109375Ki",
        "64000000 + 48000000 bytes"
    );
    let message = cond(&status, "CapacityObserved").2;
    assert!(message.contains("48000000 bytes written"), "{message}");
    assert!(
        message.contains("memory: 64000000 of 67108864 bytes allocated (95.3%)"),
        "{message}"
    );
    assert!(!message.contains("nothing has been written"), "{message}");
}

#[test]
fn a_tier_without_capacity_is_said_to_report_the_stores_default() {
    let mut spec: serde_json::Value = serde_json::to_value(tier_backend()).unwrap();
    spec["spec"]["connection"]["managed"]["members"][0]["localDisks"][0]
        .as_object_mut()
        .unwrap()
        .remove("capacity");
    let backend: KVCacheBackend = serde_json::from_value(spec).unwrap();
    let replies = recorded("default-capacity");
    let status = Pass::new(&backend, &replies).run();
    let message = cond(&status, "CapacityObserved").2;
    assert!(message.contains("not declared"), "{message}");
    assert!(
        message.contains("the store's default of 2199023255552 bytes (2Ti)"),
        "{message}"
    );
    assert!(message.contains("90% of the disk"), "{message}");
}

#[test]
fn a_leader_that_stops_answering_after_it_served_is_an_error_and_its_capacity_is_cleared() {
    let backend = tier_backend();
    let up = recorded("mounted");
    let pod = member("kvc-member-0-a", "node-a", "127.0.0.1", 0, true);
    let mut pass = Pass::new(&backend, &up);
    pass.pods = vec![&pod];
    pass.now = at(100);
    let ready = pass.run();
    assert!(ready.capacity.is_some());
    let backend = after(&backend, ready.clone());

    let down = unreachable();
    let mut pass = Pass::new(&backend, &down);
    pass.now = at(200);
    let status = pass.run();
    assert_eq!(status.phase.as_deref(), Some("Error"));
    assert_eq!(cond(&status, "LeaderAvailable").1, "LeaderUnreachable");
    assert_eq!(status.capacity, None, "cleared, never zero-filled");
    assert_eq!(status.members, ready.members, "the last listing is kept");
    let leader = find_condition(status.conditions.as_deref().unwrap(), "LeaderAvailable").unwrap();
    assert_eq!(leader.last_transition_time, Time(at(200)));
    // The Deletable condition did not change: its transition time stays.
    let deletable = find_condition(status.conditions.as_deref().unwrap(), "Deletable").unwrap();
    assert_eq!(deletable.last_transition_time, Time(at(100)));

    // Still down on the next pass: still Error (it served before).
    let backend = after(&backend, status);
    let again = Pass::new(&backend, &down).run();
    assert_eq!(again.phase.as_deref(), Some("Error"));

    // Answering but not ready after it served: LeaderNotServing.
    let not_ready = Replies {
        health: ok(
            br#"{"status":"ok","role":"leader","ha_state":"recovering","service_ready":false}"#
                .to_vec(),
        ),
        metrics: ok(fixture("leader-only", "metrics.txt")),
        segments: ok(fixture("leader-only", "get_segments_detail.json")),
    };
    let status = Pass::new(&backend, &not_ready).run();
    assert_eq!(cond(&status, "LeaderAvailable").1, "LeaderNotServing");
    assert!(
        cond(&status, "LeaderAvailable")
            .2
            .contains("service_ready false")
    );
    assert_eq!(
        status.capacity, None,
        "the zeroed gauges of a leader that is not ready are not a capacity"
    );
    assert_eq!(status.phase.as_deref(), Some("Error"));
}

#[test]
fn a_leader_not_ready_before_it_ever_served_is_starting() {
    let backend = tier_backend();
    let replies = Replies {
        health: ok(br#"{"status":"ok","role":"leader","service_ready":false}"#.to_vec()),
        metrics: ok(fixture("leader-only", "metrics.txt")),
        segments: ok(fixture("leader-only", "get_segments_detail.json")),
    };
    let status = Pass::new(&backend, &replies).run();
    assert_eq!(cond(&status, "LeaderAvailable").1, "LeaderStarting");
    assert_eq!(status.phase.as_deref(), Some("Provisioning"));
    assert_eq!(status.capacity, None);
    // A 503 while starting, the same.
    let replies = Replies {
        health: status_code(503, "service not ready"),
        ..unreachable()
    };
    let status = Pass::new(&backend, &replies).run();
    assert_eq!(cond(&status, "LeaderAvailable").1, "LeaderStarting");
    assert!(
        cond(&status, "LeaderAvailable")
            .2
            .contains("HTTP 503: service not ready")
    );
}

#[test]
fn a_failed_metrics_read_clears_the_capacity() {
    let backend = tier_backend();
    let good = recorded("mounted");
    let first = Pass::new(&backend, &good).run();
    assert!(first.capacity.is_some());
    let backend = after(&backend, first);
    let failing = Replies {
        metrics: status_code(500, "boom"),
        ..recorded("mounted")
    };
    let status = Pass::new(&backend, &failing).run();
    assert_eq!(status.capacity, None);
    let (s, reason, message) = cond(&status, "CapacityObserved");
    assert_eq!((s, reason), ("False", "ScrapeFailed"));
    assert!(message.contains("HTTP 500: boom"), "{message}");
    let truncated = Replies {
        metrics: ok(b"# nothing here\n".to_vec()),
        ..recorded("mounted")
    };
    let status = Pass::new(&backend, &truncated).run();
    assert_eq!(status.capacity, None);
    assert!(
        cond(&status, "CapacityObserved")
            .2
            .contains("has no master_total_capacity_bytes")
    );
}

#[test]
fn listing_failures_keep_or_clear_the_members_as_5_2_says() {
    let backend = tier_backend();
    let pod = member("kvc-member-0-a", "node-a", "127.0.0.1", 0, true);
    let good = recorded("mounted");
    let mut pass = Pass::new(&backend, &good);
    pass.pods = vec![&pod];
    let first = pass.run();
    let listed = first.members.clone();
    assert_eq!(listed.as_ref().unwrap().len(), 1);
    let backend = after(&backend, first);

    // 5xx or a timeout: ListingFailed, the previous members kept, Degraded.
    for failure in [status_code(502, "bad gateway"), Err("timed out".to_owned())] {
        let replies = Replies {
            segments: failure,
            ..recorded("mounted")
        };
        let mut pass = Pass::new(&backend, &replies);
        pass.pods = vec![&pod];
        let status = pass.run();
        assert_eq!(cond(&status, "MembersMounted").1, "ListingFailed");
        assert_eq!(status.members, listed);
        assert_eq!(status.phase.as_deref(), Some("Degraded"));
    }

    // 404 from an older master: Unknown, members empty; the capacity says segments exist.
    let replies = Replies {
        segments: status_code(404, ""),
        ..recorded("mounted")
    };
    let status = Pass::new(&backend, &replies).run();
    assert_eq!(cond(&status, "MembersMounted").0, "Unknown");
    assert_eq!(cond(&status, "MembersMounted").1, "SegmentListingNotServed");
    assert_eq!(status.members, None);
    assert_eq!(status.phase.as_deref(), Some("Ready"));

    // Too large: ListingTooLarge, the previous members kept, Degraded.
    let segments: Vec<serde_json::Value> = (0..5001)
        .map(|i| json!({"segment_name": format!("10.0.0.1:{i}"), "segment_id": format!("s{i}"), "client_id": "c"}))
        .collect();
    let huge = json!({"total_segments": 5001, "segments": segments}).to_string();
    let replies = Replies {
        segments: ok(huge.into_bytes()),
        ..recorded("mounted")
    };
    let status = Pass::new(&backend, &replies).run();
    assert_eq!(cond(&status, "MembersMounted").1, "ListingTooLarge");
    assert_eq!(status.members, listed);
    assert_eq!(status.phase.as_deref(), Some("Degraded"));
}

#[test]
fn members_short_stuck_starting_and_ambiguous() {
    let backend = tier_backend();
    let replies = recorded("mounted");
    let mounted = member("kvc-member-0-a", "node-a", "127.0.0.1", 0, true);
    let ds = daemonset(&backend, 2);

    // A second member started 10 s ago and not yet listed: starting, the backend Ready.
    let young = member("kvc-member-0-b", "node-b", "10.0.0.2", 590, false);
    let mut pass = Pass::new(&backend, &replies);
    pass.pods = vec![&mounted, &young];
    pass.daemonsets = vec![&ds];
    let status = pass.run();
    let (s, reason, message) = cond(&status, "MembersMounted");
    assert_eq!((s, reason), ("False", "MembersStarting"));
    assert!(
        message.contains("1 of the 2 member(s) the DaemonSets want"),
        "{message}"
    );
    assert!(message.contains("kvc-member-0-b on node-b"), "{message}");
    assert_eq!(status.phase.as_deref(), Some("Ready"));

    // Running past the mount grace (a tier it cannot write never opens the port): short.
    let old = member("kvc-member-0-b", "node-b", "10.0.0.2", 100, false);
    pass.pods = vec![&mounted, &old];
    let status = pass.run();
    assert_eq!(cond(&status, "MembersMounted").1, "MembersShort");
    assert_eq!(status.phase.as_deref(), Some("Degraded"));
    assert!(
        status
            .phase_message
            .as_deref()
            .unwrap()
            .contains("running member Pod(s) the leader does not list: kvc-member-0-b on node-b"),
        "{:?}",
        status.phase_message
    );
    // Ready but not listed is short at once.
    let ready_unlisted = member("kvc-member-0-b", "node-b", "10.0.0.2", 599, true);
    pass.pods = vec![&mounted, &ready_unlisted];
    assert_eq!(cond(&pass.run(), "MembersMounted").1, "MembersShort");

    // Stuck pulling: Degraded, the reason in the phase message; merely pulling is not counted.
    let stuck = pulling("kvc-member-0-c", "ImagePullBackOff");
    pass.pods = vec![&mounted, &stuck];
    let status = pass.run();
    assert_eq!(status.phase.as_deref(), Some("Degraded"));
    assert!(
        status.phase_message.as_deref().unwrap().contains("kvc-member-0-c on node-z: container member is ImagePullBackOff: ImagePullBackOff for the image"),
        "{:?}",
        status.phase_message
    );
    let creating = pulling("kvc-member-0-c", "ContainerCreating");
    pass.pods = vec![&mounted, &creating];
    let status = pass.run();
    assert_eq!(cond(&status, "MembersMounted").1, "MembersStarting");
    assert_eq!(status.phase.as_deref(), Some("Ready"));

    // Two running host-network members on one address: ambiguous.
    let twin = member("kvc-member-0-t", "node-a", "127.0.0.1", 0, true);
    pass.pods = vec![&mounted, &twin];
    let status = pass.run();
    assert_eq!(cond(&status, "MembersMounted").1, "AmbiguousMemberIdentity");
    assert_eq!(status.phase.as_deref(), Some("Degraded"));
    // Both on node-a: the node is still known, the group is not told apart.
    assert_eq!(
        status.members.as_ref().unwrap()[0].node_name.as_deref(),
        Some("node-a")
    );

    // A terminating Pod is not counted.
    let mut leaving = old.clone();
    leaving.metadata.deletion_timestamp = Some(Time(at(590)));
    pass.pods = vec![&mounted, &leaving];
    pass.daemonsets = vec![];
    assert_eq!(cond(&pass.run(), "MembersMounted").1, "AllMounted");
}

#[test]
fn a_member_refused_by_run_as_non_root_says_what_to_do() {
    let backend = tier_backend();
    let replies = recorded("mounted");
    let mut pass = Pass::new(&backend, &replies);
    let mounted = member("kvc-member-0-a", "node-a", "127.0.0.1", 0, true);
    let mut refused = pulling("kvc-member-0-r", "CreateContainerConfigError");
    if let Some(spec) = refused.spec.as_mut() {
        spec.containers = vec![Container {
            name: "member".into(),
            image: Some("registry.example.com/mooncake:dev".into()),
            ..Container::default()
        }];
    }
    if let Some(waiting) = refused
        .status
        .as_mut()
        .and_then(|s| s.container_statuses.as_mut())
        .and_then(|c| c[0].state.as_mut())
        .and_then(|s| s.waiting.as_mut())
    {
        // The kubelet's words for an image whose USER is a name.
        waiting.message = Some(
            "container has runAsNonRoot and image has non-numeric user (mooncake), cannot verify user is non-root (pod: \"kvc-member-0-r_gpustack-system(1)\", container: member)".into(),
        );
    }
    pass.pods = vec![&mounted, &refused];
    let status = pass.run();
    assert_eq!(status.phase.as_deref(), Some("Degraded"));
    let message = status.phase_message.unwrap();
    assert!(
        message.contains("--store-image-user 'registry.example.com/mooncake:dev=<uid>'"),
        "{message}"
    );
    assert!(
        message.contains("'registry.example.com/mooncake:dev=image'"),
        "{message}"
    );
    // Another stuck reason carries no such hint.
    let pulling = pulling("kvc-member-0-c", "ImagePullBackOff");
    pass.pods = vec![&mounted, &pulling];
    assert!(
        !pass
            .run()
            .phase_message
            .unwrap()
            .contains("--store-image-user")
    );
}

#[test]
fn many_stuck_members_are_sampled() {
    let backend = tier_backend();
    let replies = recorded("mounted");
    let mounted = member("kvc-member-0-a", "node-a", "127.0.0.1", 0, true);
    let stuck: Vec<Pod> = (0..25)
        .map(|i| pulling(&format!("kvc-member-0-s{i:02}"), "CrashLoopBackOff"))
        .collect();
    let mut pass = Pass::new(&backend, &replies);
    pass.pods = std::iter::once(&mounted).chain(stuck.iter()).collect();
    let status = pass.run();
    assert!(
        status
            .phase_message
            .as_deref()
            .unwrap()
            .contains(" and 5 more"),
        "{:?}",
        status.phase_message
    );
}

#[test]
fn a_group_whose_daemonset_selects_no_node_is_degraded() {
    let backend = tier_backend();
    let replies = recorded("leader-only");
    let ds = daemonset(&backend, 0);
    let mut pass = Pass::new(&backend, &replies);
    pass.daemonsets = vec![&ds];
    let status = pass.run();
    assert_eq!(status.phase.as_deref(), Some("Degraded"));
    assert!(
        status
            .phase_message
            .as_deref()
            .unwrap()
            .contains("no node matches the nodeSelector of kvc-member-0")
    );
}

#[test]
fn deleting_and_deletable() {
    let mut backend = tier_backend();
    backend.metadata.deletion_timestamp = Some(Time(at(500)));
    backend.status = Some(KVCacheBackendStatus {
        used_by: Some(vec![ConsumerReference {
            kind: "KVCachePool".into(),
            namespace: String::new(),
            name: "pool-a".into(),
        }]),
        ..KVCacheBackendStatus::default()
    });
    let replies = recorded("mounted");
    let status = Pass::new(&backend, &replies).run();
    assert_eq!(status.phase.as_deref(), Some("Deleting"));
    assert_eq!(
        status.phase_message.as_deref(),
        Some("deleting the workloads")
    );
    assert_eq!(
        cond(&status, "Deletable"),
        (
            "False",
            "InUse",
            "1 consumer(s) in status.usedBy hold this backend: KVCachePool/pool-a"
        )
    );
    assert_eq!(
        status.used_by,
        backend.status.as_ref().unwrap().used_by,
        "usedBy is the consumers' to write"
    );
    // Released: Deletable True, still Deleting.
    backend.status.as_mut().unwrap().used_by = Some(vec![]);
    let status = Pass::new(&backend, &replies).run();
    assert_eq!(cond(&status, "Deletable").0, "True");
    assert_eq!(status.phase.as_deref(), Some("Deleting"));
}

#[test]
fn the_survey_verdict_is_written_once() {
    let backend = tier_backend();
    let replies = recorded("mounted");
    let verdict = |status: ConditionStatus, reason: &'static str| TierVerdict {
        condition: NewCondition {
            type_: "TierWasEmpty",
            status,
            reason,
            message: "m".into(),
            observed_generation: Some(4),
        },
        event: None,
    };
    let empty = verdict(ConditionStatus::True, "Empty");
    let mut pass = Pass::new(&backend, &replies);
    pass.verdict = Some(&empty);
    let status = pass.run();
    assert_eq!(cond(&status, "TierWasEmpty").0, "True");
    let backend = after(&backend, status);
    let content = verdict(ConditionStatus::False, "PreexistingContent");
    let mut pass = Pass::new(&backend, &replies);
    pass.verdict = Some(&content);
    let status = pass.run();
    assert_eq!(cond(&status, "TierWasEmpty").0, "True", "never recomputed");
    // And kept on passes without a verdict.
    let backend = after(&backend, status);
    let status = Pass::new(&backend, &replies).run();
    assert_eq!(cond(&status, "TierWasEmpty").1, "Empty");
}

#[test]
fn an_external_backend_echoes_its_endpoints_and_reads_its_admin_endpoint() {
    let backend: KVCacheBackend = from_value(vectors::external()).unwrap();
    assert_eq!(
        admin_address(&backend, "gpustack-system").as_deref(),
        Some("store.example.internal:9003")
    );
    let replies = recorded("mounted");
    let status = Pass::new(&backend, &replies).run();
    assert_eq!(
        status.endpoints,
        Some(
            backend
                .spec
                .connection
                .external
                .as_ref()
                .unwrap()
                .endpoints
                .clone()
        )
    );
    assert_eq!(status.phase.as_deref(), Some("Ready"));
    assert_eq!(
        cond(&status, "MembersMounted"),
        ("True", "AllMounted", "the leader lists 1 segment(s)")
    );
    // The file gauges count when the store reports a tier.
    assert_eq!(status.capacity.unwrap().total.unwrap().0, "1088Mi");

    let mut client_only: KVCacheBackend = from_value(vectors::external()).unwrap();
    client_only
        .spec
        .connection
        .external
        .as_mut()
        .unwrap()
        .endpoints
        .retain(|e| e.name == EndpointName::Client);
    assert_eq!(admin_address(&client_only, "gpustack-system"), None);
    let status = backend_status(
        &client_only,
        &Observed {
            namespace: "gpustack-system",
            ..Observed::default()
        },
        &[],
        at(0),
    );
    assert_eq!(
        cond(&status, "LeaderAvailable"),
        (
            "Unknown",
            "NoAdminEndpoint",
            "spec.connection.external.endpoints has no Admin endpoint, so the store cannot be read"
        )
    );
}

#[test]
fn a_body_over_the_limit_is_not_parsed() {
    let big = Ok(HttpReply {
        status: 200,
        body: vec![b' '; store::MAX_BODY_BYTES + 1],
    });
    assert!(matches!(
        store::ok_body(store::METRICS_PATH, &big),
        Err(StoreError::Malformed { .. })
    ));
    let foreign = Err("x".repeat(5000));
    let err = store::ok_body(store::HEALTH_PATH, &foreign)
        .unwrap_err()
        .to_string();
    assert!(err.ends_with("… (truncated)"), "{err}");
}

#[test]
fn phases_are_counted_with_a_fixed_label_set() {
    use warmcache_kvcache::status::{PHASE_UNKNOWN, phase_counts};
    let mut ready = tier_backend();
    ready.status = Some(KVCacheBackendStatus {
        phase: Some("Ready".into()),
        ..KVCacheBackendStatus::default()
    });
    let mut odd = tier_backend();
    odd.status = Some(KVCacheBackendStatus {
        phase: Some("Exploded".into()),
        ..KVCacheBackendStatus::default()
    });
    let fresh = tier_backend();
    let counts = phase_counts([&ready, &ready, &odd, &fresh]);
    assert_eq!(
        counts,
        [
            ("Provisioning", 0),
            ("Ready", 2),
            ("Degraded", 0),
            ("Error", 0),
            ("Deleting", 0),
            (PHASE_UNKNOWN, 2)
        ]
    );
    assert_eq!(phase_counts([]).len(), 6, "zeros are kept");
}

#[test]
fn store_gauges_are_read_only_from_a_serving_leader() {
    use warmcache_kvcache::status::store_gauges;
    let filled = recorded("filled");
    let gauges = store_gauges(Some(&filled.health), Some(&filled.metrics)).unwrap();
    assert!(gauges.allocated_file_size_bytes > 0, "{gauges:?}");
    // No /health, an unreachable leader, or metrics that do not parse: nothing (not zeros).
    assert_eq!(store_gauges(None, Some(&filled.metrics)), None);
    let down = unreachable();
    assert_eq!(store_gauges(Some(&down.health), Some(&down.metrics)), None);
    assert_eq!(
        store_gauges(Some(&filled.health), Some(&status_code(200, "garbage"))),
        None
    );
    assert_eq!(store_gauges(Some(&filled.health), None), None);
}
