//! The `TierWasEmpty` survey (reference section 5.1): scenarios S1-S6 of section 10.3, plus the
//! edges the algorithm names (missing DaemonSet, no tier, external, per-node counting).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus, Pod, PodSpec,
    PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::json;
use warmcache_api_kvcache::v1alpha1::{KVCacheBackend, KVCacheBackendStatus};
use warmcache_kvcache::condition::{ConditionStatus, EventType};
use warmcache_kvcache::names::{labels, member_component, member_name};
use warmcache_kvcache::survey::{
    EVENT_TIER_NOT_EMPTY, REASON_EMPTY, REASON_PREEXISTING_CONTENT, SurveyRejection,
    survey_reading, tier_was_empty,
};
use warmcache_kvcache::vectors::{self, members, with};
use warmcache_kvcache::{from_value, render};

const CREATED: i64 = 1_800_000_000;

fn at(offset: SignedDuration) -> Time {
    Time(Timestamp::from_second(CREATED).unwrap() + offset)
}

fn backend_from(value: serde_json::Value) -> KVCacheBackend {
    let mut backend: KVCacheBackend = from_value(value).unwrap();
    backend.metadata.uid = Some("uid-1".into());
    backend.metadata.generation = Some(3);
    backend.metadata.creation_timestamp = Some(at(SignedDuration::ZERO));
    backend
}

/// V2: one group with a tier at index 0.
fn backend() -> KVCacheBackend {
    backend_from(vectors::v2())
}

fn daemonset(backend: &KVCacheBackend, index: usize, desired: i32) -> DaemonSet {
    let rendered = render::render(backend, &render::RenderContext::default()).unwrap();
    let mut ds = rendered.members[index].clone();
    assert_eq!(
        ds.metadata.name.as_deref(),
        Some(member_name("kvc", index).as_str())
    );
    ds.status = Some(DaemonSetStatus {
        desired_number_scheduled: desired,
        ..DaemonSetStatus::default()
    });
    ds
}

/// A member Pod of group `index` on `node`, created `age` after the backend, whose survey is
/// terminated with `message` (`None`: still running).
fn pod(index: usize, node: &str, age: SignedDuration, message: Option<&str>) -> Pod {
    let state = match message {
        Some(m) => ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 0,
                message: Some(m.to_owned()),
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        },
        None => ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..ContainerState::default()
        },
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("kvc-member-{index}-{node}")),
            labels: Some(labels("kvc", &member_component(index))),
            creation_timestamp: Some(at(age)),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.to_owned()),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            init_container_statuses: Some(vec![ContainerStatus {
                name: "local-disk-survey".into(),
                state: Some(state),
                ..ContainerStatus::default()
            }]),
            ..PodStatus::default()
        }),
    }
}

const MINUTE: SignedDuration = SignedDuration::from_mins(1);

#[test]
fn s1_every_node_empty_is_true_without_an_event() {
    let b = backend();
    let ds = daemonset(&b, 0, 3);
    let pods: Vec<Pod> = ["a", "b", "c"]
        .iter()
        .map(|n| pod(0, n, MINUTE, Some("entries=0 control=20")))
        .collect();
    let verdict = tier_was_empty(&b, &[(Some(&ds), pods.iter().collect())]).unwrap();
    assert_eq!(verdict.condition.type_, "TierWasEmpty");
    assert_eq!(verdict.condition.status, ConditionStatus::True);
    assert_eq!(verdict.condition.reason, REASON_EMPTY);
    assert_eq!(
        verdict.condition.message,
        "the disk tier was empty on all 3 node(s) carrying it when this backend started"
    );
    assert_eq!(verdict.condition.observed_generation, Some(3));
    assert_eq!(verdict.event, None);
}

#[test]
fn s2_one_node_with_entries_is_false_at_once_with_one_warning() {
    let b = backend();
    let ds = daemonset(&b, 0, 3);
    let pods = [
        pod(0, "node-b", MINUTE, Some("entries=5 control=20")),
        pod(0, "node-a", MINUTE, None),
        pod(0, "node-c", MINUTE, None),
    ];
    let verdict = tier_was_empty(&b, &[(Some(&ds), pods.iter().collect())]).unwrap();
    assert_eq!(verdict.condition.status, ConditionStatus::False);
    assert_eq!(verdict.condition.reason, REASON_PREEXISTING_CONTENT);
    let message = "the disk tier already held entries when this backend started (node-b: 5); nothing was \
                   removed, and a key written here can read back as content the previous backend left";
    assert_eq!(verdict.condition.message, message);
    let event = verdict.event.unwrap();
    assert_eq!(event.type_, EventType::Warning);
    assert_eq!(event.reason, EVENT_TIER_NOT_EMPTY);
    assert_eq!(event.message, message);
}

#[test]
fn s2_nodes_with_entries_are_listed_sorted_by_node() {
    let b = backend();
    let ds = daemonset(&b, 0, 3);
    let pods = [
        pod(0, "zeta", MINUTE, Some("entries=2 control=20")),
        pod(0, "alpha", MINUTE, Some("entries=7 control=20")),
        pod(0, "mid", MINUTE, Some("entries=0 control=20")),
    ];
    let verdict = tier_was_empty(&b, &[(Some(&ds), pods.iter().collect())]).unwrap();
    assert!(
        verdict
            .condition
            .message
            .contains("(alpha: 7, zeta: 2); nothing was removed"),
        "{}",
        verdict.condition.message
    );
}

#[test]
fn s3_two_of_three_readings_leave_the_condition_absent() {
    let b = backend();
    let ds = daemonset(&b, 0, 3);
    let pods = [
        pod(0, "a", MINUTE, Some("entries=0 control=20")),
        pod(0, "b", MINUTE, Some("entries=0 control=20")),
        pod(0, "c", MINUTE, None),
    ];
    assert_eq!(
        tier_was_empty(&b, &[(Some(&ds), pods.iter().collect())]),
        None
    );
    // The same two readings with the DaemonSet wanting two nodes: True.
    let ds2 = daemonset(&b, 0, 2);
    let verdict = tier_was_empty(&b, &[(Some(&ds2), pods.iter().collect())]).unwrap();
    assert_eq!(verdict.condition.status, ConditionStatus::True);
}

#[test]
fn s4_rejected_readings_are_ignored() {
    let b = backend();
    for bad in [
        "entries=-1 control=20",
        "entries=0 control=0",
        "",
        "garbage",
    ] {
        let ds = daemonset(&b, 0, 2);
        let pods = [
            pod(0, "a", MINUTE, Some("entries=0 control=20")),
            pod(0, "b", MINUTE, Some(bad)),
        ];
        assert_eq!(
            tier_was_empty(&b, &[(Some(&ds), pods.iter().collect())]),
            None,
            "{bad:?} must not count as a reading"
        );
        assert!(survey_reading(&pods[1]).is_err());
    }
    // Each rule by name.
    assert_eq!(
        survey_reading(&pod(0, "a", MINUTE, Some("entries=-1 control=20"))),
        Err(SurveyRejection::Unreadable(-1))
    );
    assert_eq!(
        survey_reading(&pod(0, "a", MINUTE, Some("entries=0 control=0"))),
        Err(SurveyRejection::NoControl)
    );
    assert_eq!(
        survey_reading(&pod(0, "a", MINUTE, Some(""))),
        Err(SurveyRejection::EmptyMessage)
    );
    assert_eq!(
        survey_reading(&pod(0, "a", MINUTE, None)),
        Err(SurveyRejection::NotTerminated)
    );
    // An ignored -1 does not make content either.
    let ds = daemonset(&b, 0, 1);
    let unreadable = [pod(0, "a", MINUTE, Some("entries=-1 control=20"))];
    assert_eq!(
        tier_was_empty(&b, &[(Some(&ds), unreadable.iter().collect())]),
        None
    );
}

#[test]
fn s5_pods_created_after_the_window_are_not_first_generation() {
    let b = backend();
    let ds = daemonset(&b, 0, 1);
    let late = [pod(0, "a", 31 * MINUTE, Some("entries=9 control=20"))];
    assert_eq!(
        tier_was_empty(&b, &[(Some(&ds), late.iter().collect())]),
        None
    );
    // At exactly 30 minutes it still is.
    let edge = [pod(0, "a", 30 * MINUTE, Some("entries=9 control=20"))];
    let verdict = tier_was_empty(&b, &[(Some(&ds), edge.iter().collect())]).unwrap();
    assert_eq!(verdict.condition.status, ConditionStatus::False);
    // A Pod without a creationTimestamp, or a backend without one, is skipped.
    let mut stamped = edge[0].clone();
    stamped.metadata.creation_timestamp = None;
    assert_eq!(tier_was_empty(&b, &[(Some(&ds), vec![&stamped])]), None);
    let mut unstamped = b.clone();
    unstamped.metadata.creation_timestamp = None;
    assert_eq!(
        tier_was_empty(&unstamped, &[(Some(&ds), edge.iter().collect())]),
        None
    );
}

#[test]
fn s6_an_existing_condition_is_never_recomputed() {
    let mut b = backend();
    b.status = Some(KVCacheBackendStatus {
        conditions: Some(vec![Condition {
            type_: "TierWasEmpty".into(),
            status: "True".into(),
            reason: REASON_EMPTY.into(),
            message:
                "the disk tier was empty on all 1 node(s) carrying it when this backend started"
                    .into(),
            observed_generation: Some(1),
            last_transition_time: at(MINUTE),
        }]),
        ..KVCacheBackendStatus::default()
    });
    let ds = daemonset(&b, 0, 1);
    let pods = [pod(0, "a", MINUTE, Some("entries=9 control=20"))];
    assert_eq!(
        tier_was_empty(&b, &[(Some(&ds), pods.iter().collect())]),
        None
    );
}

#[test]
fn no_daemonset_no_verdict_and_no_tier_no_survey() {
    let b = backend();
    let pods = [pod(0, "a", MINUTE, Some("entries=9 control=20"))];
    // DaemonSet not found (or the entry missing): stop for this pass.
    assert_eq!(tier_was_empty(&b, &[(None, pods.iter().collect())]), None);
    assert_eq!(tier_was_empty(&b, &[]), None);
    // A backend without a tier, and an external one, are never surveyed.
    let plain = backend_from(vectors::v1());
    let ds = daemonset(&plain, 0, 1);
    assert_eq!(
        tier_was_empty(&plain, &[(Some(&ds), pods.iter().collect())]),
        None
    );
    let external = backend_from(vectors::external());
    assert_eq!(tier_was_empty(&external, &[]), None);
    // A DaemonSet the controller has not seen a status of yet wants nothing: no True.
    let mut fresh = daemonset(&b, 0, 1);
    fresh.status = None;
    let empty = [pod(0, "a", MINUTE, Some("entries=0 control=20"))];
    assert_eq!(
        tier_was_empty(&b, &[(Some(&fresh), empty.iter().collect())]),
        None
    );
}

#[test]
fn the_tier_group_is_found_by_position_and_other_pods_are_ignored() {
    // V9: the tier is on the second group.
    let b = backend_from(vectors::v9());
    let ds1 = daemonset(&b, 1, 2);
    let pods = [
        pod(1, "a", MINUTE, Some("entries=0 control=20")),
        pod(1, "b", MINUTE, Some("entries=0 control=20")),
    ];
    // Group 0 has no tier: its entry is ignored whatever it holds.
    let noise = [pod(0, "a", MINUTE, Some("entries=9 control=20"))];
    let verdict = tier_was_empty(
        &b,
        &[
            (None, noise.iter().collect()),
            (Some(&ds1), pods.iter().collect()),
        ],
    )
    .unwrap();
    assert_eq!(verdict.condition.status, ConditionStatus::True);
    // A Pod of another group in the tier group's list is not read.
    let mixed: Vec<&Pod> = pods.iter().chain(noise.iter()).collect();
    let verdict = tier_was_empty(&b, &[(None, vec![]), (Some(&ds1), mixed)]).unwrap();
    assert_eq!(verdict.condition.status, ConditionStatus::True);
}

#[test]
fn readings_count_per_node() {
    // A node whose first Pod was replaced early reports twice: it is one node.
    let b = backend();
    let ds = daemonset(&b, 0, 2);
    let mut replaced = pod(0, "a", 2 * MINUTE, Some("entries=0 control=20"));
    replaced.metadata.name = Some("kvc-member-0-a-2".into());
    let pods = [
        pod(0, "a", MINUTE, Some("entries=0 control=20")),
        replaced,
        pod(0, "b", MINUTE, None),
    ];
    assert_eq!(
        tier_was_empty(&b, &[(Some(&ds), pods.iter().collect())]),
        None
    );
}

#[test]
fn many_nodes_with_entries_are_sampled() {
    let b = backend_from(with(vectors::v2(), |v| {
        members(v)[0]["nodeSelector"] = json!({"kvcache": "true"});
    }));
    let ds = daemonset(&b, 0, 25);
    let pods: Vec<Pod> = (0..25)
        .map(|i| pod(0, &format!("n{i:02}"), MINUTE, Some("entries=1 control=20")))
        .collect();
    let verdict = tier_was_empty(&b, &[(Some(&ds), pods.iter().collect())]).unwrap();
    assert!(
        verdict
            .condition
            .message
            .contains("n19: 1 and 5 more); nothing was removed"),
        "{}",
        verdict.condition.message
    );
}
