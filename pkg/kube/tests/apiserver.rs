//! Integration tests of warmcache-kube against a real kube-apiserver (warmcache-testkit).
//!
//! One test binary on purpose: the control plane starts once per binary.

// Shared helpers outside #[test] fns are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use http::Method;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, PodCondition, PodSpec};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use warmcache_kube::{
    Decision, Error, ErrorCategory, EventRecorder, EventType, LeaderElector, LeaseConfig, Updated,
    add_finalizer, has_finalizer, remove_finalizer, update_status_with_retry, update_with_retry,
};
use warmcache_testkit::{ControlPlane, Fault, FaultInjector, TestNamespace, eventually};

#[path = "apiserver/apply.rs"]
mod apply;
#[path = "apiserver/owner.rs"]
mod owner;
#[path = "apiserver/roles.rs"]
mod roles;

const WAIT: Duration = Duration::from_secs(20);

async fn client() -> Client {
    ControlPlane::shared()
        .await
        .unwrap()
        .client()
        .await
        .unwrap()
}

async fn faulty_client(faults: &FaultInjector) -> Client {
    ControlPlane::shared()
        .await
        .unwrap()
        .client_with_faults(faults.clone())
        .await
        .unwrap()
}

async fn create_cm(api: &Api<ConfigMap>, name: &str) -> ConfigMap {
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("base".into(), "0".into())])),
        ..ConfigMap::default()
    };
    api.create(&PostParams::default(), &cm).await.unwrap()
}

fn with_entry(cm: &ConfigMap, key: &str, value: &str) -> ConfigMap {
    let mut cm = cm.clone();
    cm.data
        .get_or_insert_with(BTreeMap::new)
        .insert(key.into(), value.into());
    cm
}

// ---------------------------------------------------------------------------------------------
// (a) a real 409 from a concurrent writer

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflict_with_a_real_second_writer_keeps_both_changes() {
    let ns = TestNamespace::new("kube-conflict").await.unwrap();
    let mine: Api<ConfigMap> = ns.api();
    let theirs: Api<ConfigMap> = Api::namespaced(client().await, &ns.name);
    create_cm(&mine, "shared").await;

    let handle = tokio::runtime::Handle::current();
    let mut calls = 0;
    let mut seen_rvs = Vec::new();
    let result = update_with_retry(&mine, "shared", |current: &ConfigMap| {
        calls += 1;
        seen_rvs.push(current.resource_version());
        if calls == 1 {
            // Another writer changes the object between our GET and our PUT.
            tokio::task::block_in_place(|| {
                handle.block_on(async {
                    let fresh = theirs.get("shared").await.unwrap();
                    theirs
                        .replace(
                            "shared",
                            &PostParams::default(),
                            &with_entry(&fresh, "theirs", "2"),
                        )
                        .await
                        .unwrap();
                })
            });
        }
        Decision::Update(with_entry(current, "mine", "1"))
    })
    .await
    .unwrap();

    assert!(result.was_written());
    assert_eq!(
        calls, 2,
        "a real conflict must make the helper re-read and re-decide"
    );
    assert_ne!(
        seen_rvs[0], seen_rvs[1],
        "the second decision saw the fresh object"
    );
    let stored = mine.get("shared").await.unwrap();
    let data = stored.data.unwrap();
    assert_eq!(data.get("mine").map(String::as_str), Some("1"));
    assert_eq!(
        data.get("theirs").map(String::as_str),
        Some("2"),
        "the other write survived"
    );
    assert_eq!(data.get("base").map(String::as_str), Some("0"));
    ns.cleanup().await;
}

#[tokio::test]
async fn unchanged_abort_and_not_found() {
    let ns = TestNamespace::new("kube-decide").await.unwrap();
    let api: Api<ConfigMap> = ns.api();
    let created = create_cm(&api, "cm").await;

    let out = update_with_retry(&api, "cm", |_| Decision::Unchanged)
        .await
        .unwrap();
    assert!(matches!(&out, Updated::Unchanged(_)));
    assert_eq!(out.object().resource_version(), created.resource_version());

    let err = update_with_retry(&api, "cm", |_| Decision::Abort("not today".into()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Aborted { reason, .. } if reason == "not today"),
        "{err}"
    );

    let err = update_with_retry(&api, "missing", |c: &ConfigMap| Decision::Update(c.clone()))
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
    assert!(matches!(err, Error::NotFound { .. }));

    // A decision derived from some other (stale) version is refused, not written.
    let mut stale = created.clone();
    stale.metadata.resource_version = Some("1".into());
    let err = update_with_retry(&api, "cm", |_| Decision::Update(stale.clone()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::ResourceVersionMismatch { .. }),
        "{err:?}"
    );
    ns.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// (b) injected faults

#[tokio::test]
async fn injected_conflict_is_retried_and_server_error_is_not() {
    let faults = FaultInjector::new();
    let ns = TestNamespace::create_with(faulty_client(&faults).await, "kube-faults")
        .await
        .unwrap();
    let api: Api<ConfigMap> = ns.api();
    create_cm(&api, "cm").await;
    let path = format!("/namespaces/{}/configmaps/cm", ns.name);

    // One 409 on the PUT: decided twice, written once.
    faults.inject(Method::PUT, &path, Fault::Conflict, 1);
    let mut calls = 0;
    let out = update_with_retry(&api, "cm", |c: &ConfigMap| {
        calls += 1;
        Decision::Update(with_entry(c, "k", "v1"))
    })
    .await
    .unwrap();
    assert!(out.was_written());
    assert_eq!(calls, 2);
    assert_eq!(faults.injected(), 1);
    assert_eq!(api.get("cm").await.unwrap().data.unwrap()["k"], "v1");

    // A 500 is returned at once, classified transient, and is not a conflict.
    faults.inject(Method::PUT, &path, Fault::ServerError, 1);
    let mut calls = 0;
    let err = update_with_retry(&api, "cm", |c: &ConfigMap| {
        calls += 1;
        Decision::Update(with_entry(c, "k", "v2"))
    })
    .await
    .unwrap_err();
    assert_eq!(calls, 1, "a server error must not be retried as a conflict");
    assert_eq!(err.category(), ErrorCategory::Transient, "{err:?}");
    assert!(err.is_transient());
    assert!(!err.is_conflict());
    assert!(
        matches!(
            err,
            Error::Api {
                verb: "replace",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(faults.injected(), 2);
    assert_eq!(api.get("cm").await.unwrap().data.unwrap()["k"], "v1");

    // Conflicts forever: bounded attempts, then a typed error.
    faults.inject(Method::PUT, &path, Fault::Conflict, 100);
    let mut calls = 0;
    let err = update_with_retry(&api, "cm", |c: &ConfigMap| {
        calls += 1;
        Decision::Update(with_entry(c, "k", "v3"))
    })
    .await
    .unwrap_err();
    assert!(
        matches!(err, Error::ConflictRetriesExhausted { attempts: 5, .. }),
        "{err:?}"
    );
    assert!(err.is_conflict());
    assert_eq!(calls, 5);
    faults.clear();
    ns.cleanup().await;
}

#[tokio::test]
async fn status_update_goes_to_the_status_subresource_and_retries() {
    let faults = FaultInjector::new();
    let ns = TestNamespace::create_with(faulty_client(&faults).await, "kube-status")
        .await
        .unwrap();
    let pods: Api<Pod> = ns.api();
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("p".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                image: Some("example.invalid/none:1".into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    pods.create(&PostParams::default(), &pod).await.unwrap();

    faults.inject(
        Method::PUT,
        &format!("/namespaces/{}/pods/p/status", ns.name),
        Fault::Conflict,
        1,
    );
    let mut calls = 0;
    let out = update_status_with_retry(&pods, "p", |current: &Pod| {
        calls += 1;
        let mut new = current.clone();
        let status = new.status.get_or_insert_with(Default::default);
        status
            .conditions
            .get_or_insert_with(Vec::new)
            .push(PodCondition {
                type_: "warmcache.io/Checked".into(),
                status: "True".into(),
                reason: Some("Tested".into()),
                ..PodCondition::default()
            });
        // A spec change through /status is ignored by the API server.
        if let Some(spec) = new.spec.as_mut() {
            spec.active_deadline_seconds = Some(42);
        }
        Decision::Update(new)
    })
    .await
    .unwrap();
    assert!(out.was_written());
    assert_eq!(calls, 2);
    assert_eq!(faults.injected(), 1);

    let stored = pods.get("p").await.unwrap();
    let conditions = stored.status.unwrap().conditions.unwrap_or_default();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "warmcache.io/Checked" && c.status == "True")
    );
    assert_eq!(stored.spec.unwrap().active_deadline_seconds, None);
    ns.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// (c) finalizers

const FIN_A: &str = "warmcache.io/test-a";
const FIN_B: &str = "warmcache.io/test-b";
const FIN_C: &str = "warmcache.io/test-c";

#[tokio::test]
async fn finalizer_holds_deletion_until_removed() {
    let ns = TestNamespace::new("kube-finalizer").await.unwrap();
    let api: Api<ConfigMap> = ns.api();
    let created = create_cm(&api, "held").await;

    let with_a = add_finalizer(&api, &created, FIN_A).await.unwrap();
    assert!(has_finalizer(&with_a, FIN_A));
    assert_ne!(with_a.resource_version(), created.resource_version());

    // Idempotent: no write when already present.
    let again = add_finalizer(&api, &with_a, FIN_A).await.unwrap();
    assert_eq!(again.resource_version(), with_a.resource_version());
    assert_eq!(
        api.get("held").await.unwrap().resource_version(),
        with_a.resource_version()
    );

    // Append to an existing list.
    let with_ab = add_finalizer(&api, &with_a, FIN_B).await.unwrap();
    assert_eq!(with_ab.finalizers(), [FIN_A.to_owned(), FIN_B.to_owned()]);

    // A stale copy (without FIN_B): the guarded patch fails on the server, the helper re-reads
    // and adds FIN_C without dropping FIN_B.
    let with_abc = add_finalizer(&api, &with_a, FIN_C).await.unwrap();
    assert_eq!(
        with_abc.finalizers(),
        [FIN_A.to_owned(), FIN_B.to_owned(), FIN_C.to_owned()]
    );
    // Removing through a stale copy (it does not know FIN_C) keeps FIN_C.
    let with_ac = remove_finalizer(&api, &with_ab, FIN_B).await.unwrap();
    assert_eq!(with_ac.finalizers(), [FIN_A.to_owned(), FIN_C.to_owned()]);
    let only_a = remove_finalizer(&api, &with_ac, FIN_C).await.unwrap();
    let with_ab = add_finalizer(&api, &only_a, FIN_B).await.unwrap();
    assert_eq!(with_ab.finalizers(), [FIN_A.to_owned(), FIN_B.to_owned()]);

    // Delete: the object stays, marked for deletion.
    api.delete("held", &DeleteParams::default()).await.unwrap();
    let deleting = api.get("held").await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());

    // No new finalizers on an object being deleted: a genuine rejection, returned as such.
    let err = add_finalizer(&api, &deleting, FIN_C).await.unwrap_err();
    assert_eq!(err.category(), ErrorCategory::Invalid, "{err:?}");

    let only_b = remove_finalizer(&api, &deleting, FIN_A).await.unwrap();
    assert_eq!(only_b.finalizers(), [FIN_B.to_owned()]);
    // Idempotent: no write when absent.
    let same = remove_finalizer(&api, &only_b, FIN_A).await.unwrap();
    assert_eq!(same.resource_version(), only_b.resource_version());
    assert!(
        api.get_opt("held").await.unwrap().is_some(),
        "still held by FIN_B"
    );

    remove_finalizer(&api, &only_b, FIN_B).await.unwrap();
    eventually("the ConfigMap is gone", WAIT, || {
        let api = api.clone();
        async move { api.get_opt("held").await.unwrap().is_none().then_some(()) }
    })
    .await
    .unwrap();

    // Gone: NotFound, distinguishable from other failures.
    let err = remove_finalizer(&api, &with_abc, FIN_A).await.unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
    ns.cleanup().await;
}

#[tokio::test]
async fn finalizer_guards_do_not_lose_concurrent_edits() {
    let ns = TestNamespace::new("kube-finalizer-race").await.unwrap();
    let api: Api<ConfigMap> = ns.api();

    // Our copy has no finalizers; meanwhile someone else adds FIN_B. Without the
    // resourceVersion guard, "add /metadata/finalizers [A]" would overwrite FIN_B.
    let created = create_cm(&api, "rv").await;
    let mut theirs = created.clone();
    theirs.metadata.finalizers = Some(vec![FIN_B.to_owned()]);
    api.replace("rv", &PostParams::default(), &theirs)
        .await
        .unwrap();
    let updated = add_finalizer(&api, &created, FIN_A).await.unwrap();
    assert_eq!(updated.finalizers(), [FIN_B.to_owned(), FIN_A.to_owned()]);

    // Our copy says [A, B]; meanwhile someone else swaps A for C. Without the array guard,
    // "remove /metadata/finalizers/0" would remove C; with it, the helper re-reads, sees A
    // is gone and writes nothing.
    let created = create_cm(&api, "arr").await;
    let ours = add_finalizer(&api, &created, FIN_A).await.unwrap();
    let ours = add_finalizer(&api, &ours, FIN_B).await.unwrap();
    let mut theirs = ours.clone();
    theirs.metadata.finalizers = Some(vec![FIN_C.to_owned(), FIN_B.to_owned()]);
    let theirs = api
        .replace("arr", &PostParams::default(), &theirs)
        .await
        .unwrap();
    let result = remove_finalizer(&api, &ours, FIN_A).await.unwrap();
    assert_eq!(result.finalizers(), [FIN_C.to_owned(), FIN_B.to_owned()]);
    assert_eq!(result.resource_version(), theirs.resource_version());

    for name in ["rv", "arr"] {
        let mut cm = api.get(name).await.unwrap();
        cm.metadata.finalizers = None;
        api.replace(name, &PostParams::default(), &cm)
            .await
            .unwrap();
    }
    ns.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// (d) leader election

fn fast_lease() -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(300),
    }
}

async fn lease_holder(api: &Api<Lease>, name: &str) -> Option<String> {
    api.get_opt(name)
        .await
        .unwrap()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

#[tokio::test]
async fn only_one_leader_and_release_hands_over_quickly() {
    let ns = TestNamespace::new("kube-leader").await.unwrap();
    let leases: Api<Lease> = ns.api();
    let a = LeaderElector::new(client().await, &ns.name, "ctl", "replica-a", fast_lease()).unwrap();
    let b = LeaderElector::new(client().await, &ns.name, "ctl", "replica-b", fast_lease()).unwrap();
    let cancel_a = CancellationToken::new();
    let cancel_b = CancellationToken::new();
    let a = a.spawn(cancel_a.clone());
    let b = b.spawn(cancel_b.clone());

    eventually("one elector leads", WAIT, || {
        let led = a.is_leader() || b.is_leader();
        async move { led.then_some(()) }
    })
    .await
    .unwrap();
    // For a while, exactly one leads, and the Lease names it.
    let watch_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < watch_until {
        assert!(!(a.is_leader() && b.is_leader()), "two leaders at once");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(a.is_leader() ^ b.is_leader());
    let (leader, follower, leader_cancel, follower_cancel, leader_id, follower_id) =
        if a.is_leader() {
            (a, b, cancel_a, cancel_b, "replica-a", "replica-b")
        } else {
            (b, a, cancel_b, cancel_a, "replica-b", "replica-a")
        };
    assert_eq!(
        lease_holder(&leases, "ctl").await.as_deref(),
        Some(leader_id)
    );
    let before = leases.get("ctl").await.unwrap().spec.unwrap();
    let mut leader_rx = leader.subscribe();
    assert!(*leader_rx.borrow_and_update());

    // Graceful stop: the leader steps down and releases; the follower takes over well before
    // the lease would have expired (3 s).
    let stopped_at = Instant::now();
    leader_cancel.cancel();
    leader.stopped().await;
    assert!(
        !*leader_rx.borrow(),
        "the stopped elector reports no leadership"
    );
    eventually("the follower takes over", WAIT, || {
        let led = follower.is_leader();
        async move { led.then_some(()) }
    })
    .await
    .unwrap();
    let handover = stopped_at.elapsed();
    assert!(
        handover < Duration::from_millis(2500),
        "handover took {handover:?}"
    );
    let after = leases.get("ctl").await.unwrap().spec.unwrap();
    assert_eq!(after.holder_identity.as_deref(), Some(follower_id));
    assert_eq!(
        after.lease_transitions.unwrap_or(0),
        before.lease_transitions.unwrap_or(0) + 1
    );

    follower_cancel.cancel();
    follower.stopped().await;
    assert_eq!(lease_holder(&leases, "ctl").await, None, "released on stop");
    ns.cleanup().await;
}

#[tokio::test]
async fn failing_renewals_drop_leadership_before_the_lease_expires() {
    let ns = TestNamespace::new("kube-leader-fail").await.unwrap();
    let leases: Api<Lease> = ns.api();
    let faults = FaultInjector::new();
    let config = fast_lease();
    let elector = LeaderElector::new(
        faulty_client(&faults).await,
        &ns.name,
        "flaky",
        "replica-f",
        config.clone(),
    )
    .unwrap();
    let cancel = CancellationToken::new();
    let handle = elector.spawn(cancel.clone());
    let leadership = handle.leadership();
    tokio::time::timeout(WAIT, leadership.wait_until_leader())
        .await
        .unwrap();
    assert!(leadership.ensure_leader().is_ok());
    let mut rx = handle.subscribe();
    assert!(*rx.borrow_and_update());

    // Every renewal from now on fails with a 500.
    faults.inject(
        Method::PUT,
        &format!("/namespaces/{}/leases/flaky", ns.name),
        Fault::ServerError,
        10_000,
    );
    let broken_at = Instant::now();
    let last_renew = leases
        .get("flaky")
        .await
        .unwrap()
        .spec
        .unwrap()
        .renew_time
        .unwrap()
        .0;
    tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|leading| !*leading))
        .await
        .unwrap()
        .unwrap();
    let dropped_after = broken_at.elapsed();
    assert!(!leadership.is_leader());
    assert!(leadership.ensure_leader().is_err());
    // It stepped down within the renew deadline (plus scheduling slack), and before the lease
    // it last renewed could expire and be taken by someone else.
    assert!(
        dropped_after <= config.renew_deadline + Duration::from_millis(500),
        "stepped down after {dropped_after:?}"
    );
    let expiry = last_renew.checked_add(config.lease_duration).unwrap();
    assert!(
        k8s_openapi::jiff::Timestamp::now() < expiry,
        "leadership must be dropped before the lease expires"
    );
    assert!(faults.injected() >= 1);

    // Another replica takes over once the lease has expired.
    let other = LeaderElector::new(client().await, &ns.name, "flaky", "replica-g", config)
        .unwrap()
        .spawn(cancel.clone());
    eventually("the healthy replica takes over", WAIT, || {
        let led = other.is_leader();
        async move { led.then_some(()) }
    })
    .await
    .unwrap();
    assert!(!leadership.is_leader());
    assert_eq!(
        lease_holder(&leases, "flaky").await.as_deref(),
        Some("replica-g")
    );

    faults.clear();
    cancel.cancel();
    handle.stopped().await;
    other.stopped().await;
    ns.cleanup().await;
}

#[tokio::test]
async fn skewed_but_live_holder_is_never_taken_over() {
    let ns = TestNamespace::new("kube-leader-skew").await.unwrap();
    let leases: Api<Lease> = ns.api();
    let config = fast_lease();
    // A holder whose wall clock is an hour behind ours: by our clock its renewTime is always an
    // hour old, yet it renews every retry period.
    let skewed_now = || {
        MicroTime(
            Timestamp::now()
                .checked_sub(Duration::from_secs(3600))
                .unwrap(),
        )
    };
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("skew".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("replica-old-clock".into()),
            lease_duration_seconds: Some(config.lease_duration_seconds()),
            acquire_time: Some(skewed_now()),
            renew_time: Some(skewed_now()),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
    };
    leases.create(&PostParams::default(), &lease).await.unwrap();
    let stop_renewing = CancellationToken::new();
    let renewer = tokio::spawn({
        let leases = leases.clone();
        let stop = stop_renewing.clone();
        let period = config.retry_period;
        async move {
            let mut renewals = 0u32;
            // When the last successful renewal was sent: it was committed after this instant.
            let mut last_sent = None;
            while !stop.is_cancelled() {
                let mut lease = leases.get("skew").await.unwrap();
                let spec = lease.spec.as_mut().unwrap();
                // Renew only while still the holder: a takeover must stay visible.
                if spec.holder_identity.as_deref() == Some("replica-old-clock") {
                    spec.renew_time = Some(skewed_now());
                    let sent = Instant::now();
                    match leases.replace("skew", &PostParams::default(), &lease).await {
                        Ok(_) => {
                            renewals += 1;
                            last_sent = Some(sent);
                        }
                        Err(e) if warmcache_kube::is_conflict(&e) => {}
                        Err(e) => panic!("renewing the skewed lease: {e}"),
                    }
                }
                tokio::time::sleep(period).await;
            }
            (renewals, last_sent)
        }
    });

    let cancel = CancellationToken::new();
    let elector = LeaderElector::new(
        client().await,
        &ns.name,
        "skew",
        "replica-new",
        config.clone(),
    )
    .unwrap()
    .spawn(cancel.clone());
    // Well past two lease durations: the contender must keep waiting.
    let watch_until = Instant::now() + config.lease_duration * 3;
    while Instant::now() < watch_until {
        assert!(!elector.is_leader(), "took over from a live holder");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        lease_holder(&leases, "skew").await.as_deref(),
        Some("replica-old-clock")
    );

    // Once the holder stops renewing, the contender takes over, but only after a full lease
    // duration of an unchanged record on its own clock.
    stop_renewing.cancel();
    let (renewals, last_renewal) = renewer.await.unwrap();
    assert!(renewals >= 10, "the helper renewed only {renewals} times");
    let last_renewal = last_renewal.unwrap();
    eventually("the contender takes over the stalled lease", WAIT, || {
        let led = elector.is_leader();
        async move { led.then_some(()) }
    })
    .await
    .unwrap();
    // The contender saw the last renewal no earlier than it was sent, and waits a full lease
    // duration from then.
    let waited = last_renewal.elapsed();
    assert!(
        waited >= config.lease_duration,
        "took over {waited:?} after the last renewal"
    );
    let spec = leases.get("skew").await.unwrap().spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("replica-new"));
    assert_eq!(spec.lease_transitions, Some(1));

    cancel.cancel();
    elector.stopped().await;
    ns.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// events

#[tokio::test]
async fn events_are_recorded_and_failures_are_swallowed() {
    let ns = TestNamespace::new("kube-events").await.unwrap();
    let api: Api<ConfigMap> = ns.api();
    let cm = create_cm(&api, "evented").await;
    let recorder = EventRecorder::new(ns.client.clone(), "warmcache-test", Some("replica-0"));
    recorder
        .normal(&cm, "TestPassed", "RunTest", Some("all good"))
        .await;
    recorder
        .warning(&cm, "TestWarned", "RunTest", Some(&"x".repeat(5000)))
        .await;

    let events: Api<K8sEvent> = ns.api();
    let list = eventually("both Events are stored", WAIT, || {
        let events = events.clone();
        async move {
            let list = events.list(&Default::default()).await.ok()?.items;
            (list.len() >= 2).then_some(list)
        }
    })
    .await
    .unwrap();
    let normal = list
        .iter()
        .find(|e| e.reason.as_deref() == Some("TestPassed"))
        .unwrap();
    assert_eq!(normal.type_.as_deref(), Some("Normal"));
    assert_eq!(normal.note.as_deref(), Some("all good"));
    assert_eq!(
        normal.reporting_controller.as_deref(),
        Some("warmcache-test")
    );
    assert_eq!(normal.reporting_instance.as_deref(), Some("replica-0"));
    assert_eq!(
        normal.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("evented")
    );
    let warning = list
        .iter()
        .find(|e| e.reason.as_deref() == Some("TestWarned"))
        .unwrap();
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert!(warning.note.as_ref().unwrap().len() <= 1024);

    // An Event the server refuses (its namespace does not exist) does not fail the caller.
    let mut elsewhere = cm.clone();
    elsewhere.metadata.namespace = Some("no-such-namespace-for-events".into());
    recorder
        .publish_for(&elsewhere, EventType::Normal, "Ignored", "RunTest", None)
        .await;
    ns.cleanup().await;
}
