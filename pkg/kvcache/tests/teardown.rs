//! Teardown and tier cleanup (reference section 6): scenarios S7-S13 of section 10.3, a
//! teardown resumed after a crash in the middle, the cleanup Pod's shape, and the cleanup script
//! run for real on a directory.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

use k8s_openapi::api::core::v1::{Node, Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use warmcache_api_kvcache::v1alpha1::{ConsumerReference, KVCacheBackend, KVCacheBackendStatus};
use warmcache_kvcache::from_value;
use warmcache_kvcache::teardown::{
    CLEANUP_DEADLINE, CleanupAction, CleanupInput, CleanupPlan, DeleteReason,
    EVENT_TIER_NOT_CLEANED, EVENT_TIER_PARTLY_EMPTIED, EVENT_TIER_SHARED_PATH, LABEL_CLEANUP_OF,
    LABEL_CLEANUP_UID, NodeOutcome, TEARDOWN_REQUEUE, TeardownStep, Workload, cleanup_image,
    cleanup_pass, cleanup_pod, cleanup_pod_name, cleanup_script, cleanup_target, teardown_step,
};
use warmcache_kvcache::vectors::{self, tier0, with};

const NS: &str = "gpustack-system";
const IMAGE: &str = "docker.io/kvcacheai/mooncake:0.3.13";
const T0: i64 = 1_800_000_000;

fn at(offset: SignedDuration) -> Timestamp {
    Timestamp::from_second(T0).unwrap() + offset
}

fn stored(name: &str, uid: &str, value: Value) -> KVCacheBackend {
    let mut b: KVCacheBackend = from_value(value).unwrap();
    b.metadata.name = Some(name.into());
    b.metadata.uid = Some(uid.into());
    b
}

fn deleting(mut b: KVCacheBackend) -> KVCacheBackend {
    b.metadata.deletion_timestamp = Some(Time(at(SignedDuration::ZERO)));
    b
}

/// V2 with cleanAfterDelete, deleted.
fn kvc() -> KVCacheBackend {
    deleting(stored(
        "kvc",
        "uid-1",
        with(vectors::v2(), |v| {
            tier0(v)["cleanAfterDelete"] = json!(true)
        }),
    ))
}

fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

fn kv_node(name: &str) -> Node {
    node(name, &[("kvcache", "true")])
}

/// The cleanup Pod `backend` would create on `node`, as stored: created at `created`, in `phase`.
fn existing(backend: &KVCacheBackend, node: &str, created: Timestamp, phase: &str) -> Pod {
    let target = cleanup_target(backend).unwrap();
    let mut pod = cleanup_pod(backend, &target, node, IMAGE, NS).unwrap();
    pod.metadata.uid = Some(format!("pod-{node}"));
    pod.metadata.creation_timestamp = Some(Time(created));
    pod.status = Some(PodStatus {
        phase: Some(phase.into()),
        ..PodStatus::default()
    });
    pod
}

struct World {
    backend: KVCacheBackend,
    nodes: Vec<Node>,
    others: Vec<KVCacheBackend>,
    pods: Vec<Pod>,
    now: Timestamp,
    image: Result<String, String>,
}

impl World {
    fn new(backend: KVCacheBackend, nodes: Vec<Node>) -> Self {
        Self {
            backend,
            nodes,
            others: Vec::new(),
            pods: Vec::new(),
            now: at(SignedDuration::from_secs(10)),
            image: Ok(IMAGE.into()),
        }
    }

    fn pass(&self) -> CleanupPlan {
        let nodes: Vec<&Node> = self.nodes.iter().collect();
        let backends: Vec<&KVCacheBackend> =
            std::iter::once(&self.backend).chain(&self.others).collect();
        let pods: Vec<&Pod> = self.pods.iter().collect();
        cleanup_pass(&CleanupInput {
            backend: &self.backend,
            namespace: NS,
            nodes: &nodes,
            backends: &backends,
            pods: &pods,
            now: self.now,
            image: self.image.clone(),
        })
        .unwrap()
    }

    /// Applies a plan as the API server would: creations appear (Pending, created now),
    /// deletions disappear.
    fn apply(&mut self, plan: &CleanupPlan) {
        for action in &plan.actions {
            match action {
                CleanupAction::CreatePod(pod) => {
                    let mut pod = (**pod).clone();
                    if self
                        .pods
                        .iter()
                        .any(|p| p.metadata.name == pod.metadata.name)
                    {
                        continue; // AlreadyExists
                    }
                    pod.metadata.creation_timestamp = Some(Time(self.now));
                    pod.metadata.uid =
                        Some(format!("uid-of-{}", pod.metadata.name.as_deref().unwrap()));
                    pod.status = Some(PodStatus {
                        phase: Some("Pending".into()),
                        ..PodStatus::default()
                    });
                    self.pods.push(pod);
                }
                CleanupAction::DeletePod { name, .. } => {
                    self.pods
                        .retain(|p| p.metadata.name.as_deref() != Some(name));
                }
                CleanupAction::NodeEvent { .. } => {}
            }
        }
    }

    fn set_phase(&mut self, node: &str, phase: &str) {
        let name = cleanup_pod_name(self.backend.metadata.name.as_deref().unwrap(), node);
        let pod = self
            .pods
            .iter_mut()
            .find(|p| p.metadata.name.as_deref() == Some(name.as_str()))
            .unwrap();
        pod.status.as_mut().unwrap().phase = Some(phase.into());
    }
}

fn created(plan: &CleanupPlan) -> Vec<String> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            CleanupAction::CreatePod(p) => p.spec.as_ref().unwrap().node_name.clone(),
            _ => None,
        })
        .collect()
}

fn deleted(plan: &CleanupPlan) -> Vec<(String, DeleteReason)> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            CleanupAction::DeletePod { name, why, .. } => Some((name.clone(), *why)),
            _ => None,
        })
        .collect()
}

fn events(plan: &CleanupPlan) -> Vec<(String, &'static str, String)> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            CleanupAction::NodeEvent {
                node,
                reason,
                message,
            } => Some((node.clone(), *reason, message.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn s7_both_nodes_succeeded_then_every_pod_is_deleted_and_the_finalizer_goes() {
    let mut world = World::new(kvc(), vec![kv_node("a"), kv_node("b"), node("other", &[])]);
    assert_eq!(
        teardown_step(&world.backend, &[]),
        TeardownStep::CleanTier(cleanup_target(&world.backend).unwrap())
    );

    let first = world.pass();
    assert_eq!(
        created(&first),
        ["a", "b"],
        "one Pod per selected node only"
    );
    assert!(!first.done);
    assert_eq!(first.pending, ["a", "b"]);
    world.apply(&first);

    // Still running: nothing new.
    world.set_phase("a", "Running");
    let second = world.pass();
    assert!(second.actions.is_empty(), "{:?}", second.actions);
    assert!(!second.done);

    world.set_phase("a", "Succeeded");
    world.set_phase("b", "Succeeded");
    let last = world.pass();
    assert!(last.done);
    assert!(events(&last).is_empty());
    let mut gone = deleted(&last);
    gone.sort();
    let mut expected = vec![
        (cleanup_pod_name("kvc", "a"), DeleteReason::Finished),
        (cleanup_pod_name("kvc", "b"), DeleteReason::Finished),
    ];
    expected.sort();
    assert_eq!(gone, expected);
    // The deletions carry the Pods' UIDs as preconditions.
    assert!(last.actions.iter().all(|a| matches!(
        a,
        CleanupAction::DeletePod { uid: Some(uid), .. } if uid.starts_with("uid-of-kvc-tier-clean-")
    )));
    assert_eq!(
        last.finished,
        [
            ("a".to_owned(), NodeOutcome::Emptied),
            ("b".to_owned(), NodeOutcome::Emptied)
        ]
    );
    assert!(
        first.finished.is_empty() && second.finished.is_empty(),
        "nothing is finished while Pods run"
    );
    world.apply(&last);
    assert!(world.pods.is_empty());
}

#[test]
fn s8_a_pod_pending_past_the_deadline_is_given_up_with_a_node_warning() {
    let mut world = World::new(kvc(), vec![kv_node("a"), kv_node("b")]);
    let start = world.now;
    world.apply(&world.pass());
    world.set_phase("a", "Succeeded");

    // Exactly at the deadline the node is still pending.
    world.now = start + CLEANUP_DEADLINE;
    let plan = world.pass();
    assert!(!plan.done);
    assert_eq!(plan.pending, ["b"]);

    world.now = start + CLEANUP_DEADLINE + SignedDuration::from_secs(1);
    let plan = world.pass();
    assert!(plan.done);
    assert_eq!(
        events(&plan),
        [(
            "b".to_owned(),
            EVENT_TIER_NOT_CLEANED,
            "/var/lib/kvcache was not confirmed empty for deleted KVCacheBackend \"kvc\": its cleanup was still \
             pending after 5m0s and the deletion was not held open for it; a Pod that never left pending usually \
             means the directory does not exist on this node"
                .to_owned()
        )]
    );
    // The given-up Pod is deleted with the rest.
    assert_eq!(deleted(&plan).len(), 2);
    assert_eq!(
        plan.finished,
        [
            ("a".to_owned(), NodeOutcome::Emptied),
            ("b".to_owned(), NodeOutcome::GivenUpDeadline)
        ]
    );

    // A later pass over the same state says the same thing (the Event folds), without time in it.
    world.now += SignedDuration::from_mins(7);
    let again = world.pass();
    assert_eq!(events(&again), events(&plan));

    // A running one says "running".
    world.set_phase("b", "Running");
    assert!(
        events(&world.pass())[0]
            .2
            .contains("still running after 5m0s")
    );
}

fn sharing(name: &str, uid: &str, path: &str, selector: Value) -> KVCacheBackend {
    stored(
        name,
        uid,
        with(vectors::v2(), |v| {
            tier0(v)["path"] = json!(path);
            vectors::members(v)[0]["nodeSelector"] = selector;
        }),
    )
}

#[test]
fn s9_a_node_where_another_live_backend_overlaps_is_skipped() {
    let mut world = World::new(
        kvc(),
        vec![
            kv_node("a"),
            node("b", &[("kvcache", "true"), ("zone", "z1")]),
        ],
    );
    world.others.push(sharing(
        "inner",
        "uid-9",
        "/var/lib/kvcache/inner",
        json!({"zone": "z1"}),
    ));
    let plan = world.pass();
    assert_eq!(created(&plan), ["a"], "node b is skipped");
    assert_eq!(plan.finished, [("b".to_owned(), NodeOutcome::SharedPath)]);
    assert_eq!(
        events(&plan),
        [(
            "b".to_owned(),
            EVENT_TIER_SHARED_PATH,
            "/var/lib/kvcache was not emptied for deleted KVCacheBackend \"kvc\": KVCacheBackend \"inner\" \
             declares an overlapping path on this node and emptying it would remove that backend's data"
                .to_owned()
        )]
    );
    assert_eq!(plan.pending, ["a"]);
}

#[test]
fn s9_a_running_cleanup_on_a_node_found_shared_is_stopped() {
    let mut world = World::new(kvc(), vec![kv_node("a"), kv_node("b")]);
    world.apply(&world.pass());
    world.set_phase("b", "Running");
    // The other backend appears (created, or its selector widened) while the cleanup runs.
    world
        .others
        .push(sharing("outer", "uid-8", "/var/lib", json!({})));
    let plan = world.pass();
    assert_eq!(
        deleted(&plan),
        [
            (cleanup_pod_name("kvc", "a"), DeleteReason::SharedPath),
            (cleanup_pod_name("kvc", "b"), DeleteReason::SharedPath)
        ]
    );
    let evs = events(&plan);
    assert_eq!(evs.len(), 4);
    assert_eq!(evs[1].0, "a");
    assert_eq!(evs[1].1, EVENT_TIER_PARTLY_EMPTIED);
    assert_eq!(
        evs[3].2,
        "/var/lib/kvcache may hold a partial result: emptying it for deleted KVCacheBackend \"kvc\" was already \
         running when KVCacheBackend \"outer\" was found to declare an overlapping path, and was stopped; check \
         that backend's data on this node"
    );
    assert!(plan.done, "shared nodes are finished");
    world.apply(&plan);
    // Next pass: nothing left to stop, only the shared-path warnings (the same ones: they fold).
    let next = world.pass();
    assert!(deleted(&next).is_empty());
    assert_eq!(
        events(&next).iter().map(|e| e.1).collect::<Vec<_>>(),
        [EVENT_TIER_SHARED_PATH, EVENT_TIER_SHARED_PATH]
    );
    assert!(next.done);
}

#[test]
fn overlap_is_component_wise_cleaned_and_selector_bound() {
    let mut world = World::new(kvc(), vec![kv_node("a")]);
    // A sibling path, a backend of the same name (this one), an external one, and an
    // overlapping tier whose group selects other nodes share nothing.
    world
        .others
        .push(sharing("sibling", "u2", "/var/lib/kvcache-2", json!({})));
    world.others.push(sharing(
        "elsewhere",
        "u3",
        "/var/lib/kvcache",
        json!({"zone": "z9"}),
    ));
    world.others.push(stored("ext", "u4", vectors::external()));
    assert!(events(&world.pass()).is_empty());
    // Equal after cleaning: shared.
    world
        .others
        .push(sharing("equal", "u5", "/var//lib/./kvcache/", json!({})));
    assert_eq!(events(&world.pass())[0].1, EVENT_TIER_SHARED_PATH);
}

#[test]
fn s10_another_backend_deleting_with_clean_after_delete_is_not_sharing() {
    let mut world = World::new(kvc(), vec![kv_node("a")]);
    let other = sharing("twin", "uid-7", "/var/lib/kvcache", json!({}));
    let other_cleaning = deleting(stored(
        "twin",
        "uid-7",
        with(vectors::v2(), |v| {
            tier0(v)["cleanAfterDelete"] = json!(true);
            vectors::members(v)[0]["nodeSelector"] = json!({});
        }),
    ));
    world.others.push(other_cleaning);
    let plan = world.pass();
    assert_eq!(created(&plan), ["a"]);
    assert!(events(&plan).is_empty());
    // Deleting without cleanAfterDelete, or cleaning but alive: still sharing.
    world.others = vec![deleting(other.clone())];
    assert_eq!(events(&world.pass())[0].1, EVENT_TIER_SHARED_PATH);
    world.others = vec![stored(
        "twin",
        "uid-7",
        with(vectors::v2(), |v| {
            tier0(v)["cleanAfterDelete"] = json!(true)
        }),
    )];
    assert_eq!(events(&world.pass())[0].1, EVENT_TIER_SHARED_PATH);
}

#[test]
fn s11_a_stale_incarnations_pod_is_deleted_then_recreated() {
    let mut world = World::new(kvc(), vec![kv_node("a")]);
    let earlier = deleting(stored(
        "kvc",
        "uid-0",
        with(vectors::v2(), |v| {
            tier0(v)["cleanAfterDelete"] = json!(true)
        }),
    ));
    let stale = existing(
        &earlier,
        "a",
        at(SignedDuration::ZERO) - SignedDuration::from_hours(2),
        "Running",
    );
    assert_eq!(
        stale.metadata.name.as_deref(),
        Some(cleanup_pod_name("kvc", "a").as_str())
    );
    world.pods.push(stale);
    let plan = world.pass();
    assert_eq!(
        deleted(&plan),
        [(cleanup_pod_name("kvc", "a"), DeleteReason::StaleIncarnation)]
    );
    assert!(created(&plan).is_empty(), "recreated only once it is gone");
    assert!(
        !plan.done,
        "pending, and its age is not this incarnation's clock"
    );
    assert!(
        events(&plan).is_empty(),
        "two hours old, but no deadline applies to it"
    );

    // Still terminating: not deleted again, still pending.
    world.pods[0].metadata.deletion_timestamp = Some(Time(world.now));
    let waiting = world.pass();
    assert!(waiting.actions.is_empty());
    assert!(!waiting.done);

    world.pods.clear();
    let next = world.pass();
    assert_eq!(created(&next), ["a"]);
    let CleanupAction::CreatePod(pod) = &next.actions[0] else {
        panic!("expected a creation");
    };
    assert_eq!(
        pod.metadata.labels.as_ref().unwrap()[LABEL_CLEANUP_UID],
        "uid-1"
    );

    // A stale Pod on a node no longer selected goes too, without holding the cleanup.
    let mut world = World::new(kvc(), vec![]);
    world.pods.push(existing(
        &earlier,
        "gone",
        at(SignedDuration::ZERO),
        "Running",
    ));
    let plan = world.pass();
    assert!(plan.done);
    assert_eq!(
        deleted(&plan),
        [(
            cleanup_pod_name("kvc", "gone"),
            DeleteReason::StaleIncarnation
        )]
    );
}

#[test]
fn s12_no_image_gives_the_node_up_at_once() {
    let mut world = World::new(kvc(), vec![kv_node("a")]);
    let mut unimaged = world.backend.clone();
    unimaged.spec.image = None;
    let target = cleanup_target(&unimaged).unwrap();
    let why = cleanup_image(&unimaged, target.group, None).unwrap_err();
    world.image = Err(why.clone());
    let plan = world.pass();
    assert!(plan.done);
    assert!(created(&plan).is_empty());
    assert_eq!(
        plan.finished,
        [("a".to_owned(), NodeOutcome::GivenUpNoImage)]
    );
    assert_eq!(
        events(&plan),
        [(
            "a".to_owned(),
            EVENT_TIER_NOT_CLEANED,
            format!(
                "/var/lib/kvcache still holds data from deleted KVCacheBackend \"kvc\": no image could be resolved \
                 to empty it, and the deletion was not held open for it ({why})"
            )
        )]
    );
}

#[test]
fn s13_without_clean_after_delete_nothing_is_created_and_the_finalizer_goes() {
    let backend = deleting(stored("kvc", "uid-1", vectors::v2()));
    assert_eq!(cleanup_target(&backend), None);
    let workloads = [Workload {
        kind: "DaemonSet".into(),
        name: "kvc-member-0".into(),
        terminating: false,
    }];
    assert!(matches!(
        teardown_step(&backend, &workloads),
        TeardownStep::DeleteWorkloads { .. }
    ));
    assert_eq!(teardown_step(&backend, &[]), TeardownStep::RemoveFinalizer);
    let world = World::new(backend, vec![kv_node("a")]);
    let plan = world.pass();
    assert!(plan.done);
    assert!(plan.actions.is_empty());
    // A blank path cleans nothing either.
    let blank = deleting(stored(
        "kvc",
        "uid-1",
        with(vectors::v2(), |v| {
            tier0(v)["cleanAfterDelete"] = json!(true);
            tier0(v)["path"] = json!("  ");
        }),
    ));
    assert_eq!(teardown_step(&blank, &[]), TeardownStep::RemoveFinalizer);
}

#[test]
fn no_selected_node_is_done_at_once() {
    let world = World::new(kvc(), vec![node("x", &[("kvcache", "false")])]);
    let plan = world.pass();
    assert!(plan.done);
    assert!(plan.actions.is_empty());
}

#[test]
fn the_order_waits_for_consumers_then_workloads_then_cleans() {
    let mut backend = kvc();
    backend.status = Some(KVCacheBackendStatus {
        used_by: Some(vec![ConsumerReference {
            kind: "KVCachePool".into(),
            namespace: String::new(),
            name: "pool-a".into(),
        }]),
        ..KVCacheBackendStatus::default()
    });
    let workloads = [
        Workload {
            kind: "Deployment".into(),
            name: "kvc-leader".into(),
            terminating: true,
        },
        Workload {
            kind: "DaemonSet".into(),
            name: "kvc-member-3".into(),
            terminating: false,
        },
    ];
    let step = teardown_step(&backend, &workloads);
    assert_eq!(
        step,
        TeardownStep::WaitForConsumers {
            message: "deletion waits for the 1 consumer(s) in status.usedBy to release this backend: KVCachePool/pool-a"
                .into()
        }
    );
    assert_eq!(step.requeue(), None, "a consumer's write wakes it");

    backend.status = None;
    let step = teardown_step(&backend, &workloads);
    let TeardownStep::DeleteWorkloads { delete, message } = &step else {
        panic!("expected DeleteWorkloads, got {step:?}");
    };
    assert_eq!(
        delete,
        &workloads[1..],
        "the terminating one is only waited for"
    );
    assert!(
        message.contains("Deployment/kvc-leader, DaemonSet/kvc-member-3"),
        "{message}"
    );
    assert_eq!(step.requeue(), Some(TEARDOWN_REQUEUE));

    let step = teardown_step(&backend, &[]);
    assert!(
        matches!(step, TeardownStep::CleanTier(ref t) if t.path == "/var/lib/kvcache" && t.index == 0)
    );
    assert_eq!(step.requeue(), Some(TEARDOWN_REQUEUE));
}

#[test]
fn a_teardown_resumed_after_a_crash_finishes_from_what_is_stored() {
    let nodes = vec![kv_node("a"), kv_node("b"), kv_node("c")];
    let mut world = World::new(kvc(), nodes);
    let start = world.now;

    // Pass 1 asks for three Pods; the controller crashes after creating only the first.
    let first = world.pass();
    assert_eq!(created(&first), ["a", "b", "c"]);
    let partial = CleanupPlan {
        actions: first.actions[..1].to_vec(),
        ..CleanupPlan::default()
    };
    world.apply(&partial);

    // The restarted controller's pass creates exactly the two missing ones.
    world.now = start + SignedDuration::from_mins(2);
    let resumed = world.pass();
    assert_eq!(created(&resumed), ["b", "c"]);
    assert!(deleted(&resumed).is_empty());
    world.apply(&resumed);
    // A pass that repeats creations (a retry after a lost answer) changes nothing.
    world.apply(&resumed);
    assert_eq!(world.pods.len(), 3);

    // a's clock started at its own creation: it is given up first, b and c later.
    world.set_phase("b", "Succeeded");
    world.now = start + CLEANUP_DEADLINE + SignedDuration::from_secs(1);
    let plan = world.pass();
    assert_eq!(events(&plan).len(), 1);
    assert_eq!(events(&plan)[0].0, "a");
    assert_eq!(plan.pending, ["c"]);

    // c succeeds; the final deletions are cut short by a second crash after one of them.
    world.set_phase("c", "Succeeded");
    let finish = world.pass();
    assert!(finish.done);
    assert_eq!(deleted(&finish).len(), 3);
    let cut = CleanupPlan {
        actions: finish
            .actions
            .iter()
            .filter(|a| matches!(a, CleanupAction::DeletePod { name, .. } if *name == cleanup_pod_name("kvc", "c")))
            .cloned()
            .collect(),
        ..CleanupPlan::default()
    };
    world.apply(&cut);

    // The finalizer is still there, so the next pass runs again: c's Pod is created anew (its
    // directory is already empty, so it succeeds at once); a is still given up; b is finished.
    let again = world.pass();
    assert_eq!(created(&again), ["c"]);
    assert!(!again.done);
    world.apply(&again);
    world.set_phase("c", "Succeeded");
    let last = world.pass();
    assert!(last.done);
    world.apply(&last);
    assert!(world.pods.is_empty());
}

#[test]
fn the_cleanup_pod_is_shaped_as_section_6_says() {
    let mut backend = kvc();
    backend.spec.image_pull_secrets =
        Some(vec![k8s_openapi::api::core::v1::LocalObjectReference {
            name: "regcred".into(),
        }]);
    let target = cleanup_target(&backend).unwrap();
    let pod = cleanup_pod(&backend, &target, "node-a", IMAGE, NS).unwrap();
    let value = serde_json::to_value(&pod).unwrap();
    assert_eq!(
        value["metadata"]["name"],
        json!(cleanup_pod_name("kvc", "node-a"))
    );
    assert_eq!(value["metadata"]["namespace"], json!(NS));
    assert_eq!(value["metadata"]["labels"][LABEL_CLEANUP_OF], json!("kvc"));
    assert_eq!(
        value["metadata"]["labels"][LABEL_CLEANUP_UID],
        json!("uid-1")
    );
    assert_eq!(
        value["metadata"]["ownerReferences"],
        json!([{"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "KVCacheBackend", "name": "kvc",
                "uid": "uid-1", "controller": true}])
    );
    assert!(value["metadata"].get("finalizers").is_none());
    let spec = &value["spec"];
    assert_eq!(spec["nodeName"], json!("node-a"));
    assert_eq!(spec["restartPolicy"], json!("OnFailure"));
    assert!(spec.get("tolerations").is_none());
    assert_eq!(spec["imagePullSecrets"], json!([{"name": "regcred"}]));
    assert_eq!(spec["automountServiceAccountToken"], json!(false));
    assert_eq!(
        spec["volumes"],
        json!([{"name": "tier", "hostPath": {"path": "/var/lib/kvcache", "type": "Directory"}}])
    );
    let containers = spec["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let clean = &containers[0];
    assert_eq!(clean["name"], json!("clean"));
    assert_eq!(clean["image"], json!(IMAGE));
    assert_eq!(clean["imagePullPolicy"], json!("IfNotPresent"));
    assert_eq!(clean["command"][0], json!("sh"));
    assert_eq!(clean["command"][1], json!("-c"));
    assert_eq!(clean["command"][2], json!(cleanup_script("/tier")));
    assert_eq!(
        clean["volumeMounts"],
        json!([{"name": "tier", "mountPath": "/tier"}])
    );
    let security = &clean["securityContext"];
    assert_eq!(
        security["capabilities"],
        json!({"add": ["DAC_OVERRIDE"], "drop": ["ALL"]})
    );
    assert_eq!(security["allowPrivilegeEscalation"], json!(false));
    assert_eq!(security["privileged"], json!(false));
    assert_eq!(security["readOnlyRootFilesystem"], json!(true));
    assert_eq!(
        spec["securityContext"]["seccompProfile"]["type"],
        json!("RuntimeDefault")
    );
    assert!(clean["resources"]["limits"]["memory"].is_string());

    // The cleaned path is mounted: a tier written /var//lib/kvcache/ empties /var/lib/kvcache.
    let odd = deleting(stored(
        "kvc",
        "uid-1",
        with(vectors::v2(), |v| {
            tier0(v)["cleanAfterDelete"] = json!(true);
            tier0(v)["path"] = json!("/var//lib/./kvcache/");
        }),
    ));
    assert_eq!(cleanup_target(&odd).unwrap().path, "/var/lib/kvcache");
    // No UID, no Pod.
    let mut unstored = backend.clone();
    unstored.metadata.uid = None;
    assert!(cleanup_pod(&unstored, &target, "node-a", IMAGE, NS).is_err());
}

#[test]
fn the_cleanup_image_follows_group_backend_setting() {
    let mut backend = kvc();
    let group_image = "registry.example/mooncake:group";
    let plain = cleanup_target(&backend).unwrap().group.clone();
    assert_eq!(
        cleanup_image(&backend, &plain, Some("d:1")),
        Ok(IMAGE.into())
    );
    let mut group = plain.clone();
    group.image = Some(group_image.into());
    assert_eq!(
        cleanup_image(&backend, &group, Some("d:1")),
        Ok(group_image.into())
    );
    backend.spec.image = Some("  ".into());
    assert_eq!(
        cleanup_image(&backend, &plain, Some("d:1")),
        Ok("d:1".into())
    );
    assert!(cleanup_image(&backend, &plain, None).is_err());
}

/// A fresh directory under the system's temporary directory.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("warmcache-teardown-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run_cleanup(dir: &std::path::Path) -> std::process::Output {
    Command::new("sh")
        .arg("-c")
        .arg(cleanup_script(dir.to_str().unwrap()))
        .output()
        .unwrap()
}

#[test]
fn the_cleanup_script_empties_the_directory_dotfiles_included_and_keeps_it() {
    let dir = scratch("empty");
    let tier = dir.join("it's the tier");
    std::fs::create_dir(&tier).unwrap();
    let outside = dir.join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("keep"), b"x").unwrap();
    for name in [
        "1-1.bucket",
        "1-1.meta",
        ".hidden",
        "..dots",
        "-dash",
        "with space",
        "new\nline",
    ] {
        std::fs::write(tier.join(name), b"x").unwrap();
    }
    std::fs::create_dir_all(tier.join("sub/deeper/.d")).unwrap();
    std::fs::write(tier.join("sub/deeper/.d/f"), b"x").unwrap();
    std::os::unix::fs::symlink(&outside, tier.join("link-to-outside")).unwrap();
    // Many entries: more names than one argument list holds in the glob approach.
    for i in 0..3000 {
        std::fs::write(tier.join(format!("{i:05}-{}.bucket", "x".repeat(60))), b"").unwrap();
    }
    let out = run_cleanup(&tier);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(tier.is_dir(), "the directory itself stays");
    assert_eq!(std::fs::read_dir(&tier).unwrap().count(), 0);
    assert!(
        outside.join("keep").exists(),
        "a link's target is never followed"
    );
    // Idempotent: an empty tier succeeds again.
    assert!(run_cleanup(&tier).status.success());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_cleanup_script_fails_when_the_tier_is_missing() {
    let dir = scratch("missing");
    let out = run_cleanup(&dir.join("absent"));
    assert!(!out.status.success());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_cleanup_script_fails_when_something_cannot_be_removed() {
    // Root (CI) bypasses permissions, as the cleanup Pod does with DAC_OVERRIDE; a read-only
    // bind mount or an immutable file is what defeats it there. Without root, a read-only
    // subdirectory shows the same failure path.
    let dir = scratch("stuck");
    let tier = dir.join("tier");
    std::fs::create_dir_all(tier.join("locked")).unwrap();
    std::fs::write(tier.join("locked/f"), b"x").unwrap();
    let is_root = Command::new("id").arg("-u").output().unwrap().stdout == b"0\n";
    if is_root {
        // Simulate "cannot be removed" with a script whose rm is a no-op: the count assertion
        // is what must fail.
        let script = cleanup_script(tier.to_str().unwrap()).replace("rm -rf --", "true");
        let out = Command::new("sh").arg("-c").arg(&script).output().unwrap();
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("still holds 1 entries"));
    } else {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(tier.join("locked"), std::fs::Permissions::from_mode(0o500))
            .unwrap();
        let out = run_cleanup(&tier);
        assert!(!out.status.success());
        std::fs::set_permissions(tier.join("locked"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn cleanup_pods_of_other_backends_are_not_touched() {
    let mut world = World::new(kvc(), vec![kv_node("a")]);
    let other = deleting(stored(
        "other",
        "uid-5",
        with(vectors::v2(), |v| {
            tier0(v)["cleanAfterDelete"] = json!(true)
        }),
    ));
    world.pods.push(existing(&other, "a", world.now, "Running"));
    let plan = world.pass();
    assert_eq!(created(&plan), ["a"]);
    assert!(deleted(&plan).is_empty());
}
