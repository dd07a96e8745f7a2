//! Reused answers on typed mutating routes: an answer offered for reuse is sent again for a
//! review of an equal object (with that review's uid and per-review operations) while the
//! handler's check holds, and never for a review that differs in anything the handler is
//! given but the uid.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::{patch_bytes, pod_review};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{EnvVar, Pod};
use serde_json::{Value, json};
use tower::ServiceExt;
use warmcache_admission::patch::{self, Patch, PatchOperation};
use warmcache_admission::reuse::KEPT_ANSWERS;
use warmcache_admission::{
    AdmissionServer, AdmissionServerConfig, Mutation, Reply, Reusable, Reuse, ReusedReview, Route,
    TypedRequest,
};

const TRACE: &str = "example.com/trace";

/// The handler's check, switched by the test; counts the reuses.
#[derive(Default)]
struct Switch {
    broken: AtomicBool,
    reused: AtomicUsize,
}

/// The per-review operation: the review's uid in an annotation the kept patch creates.
fn per_review(uid: &str) -> Vec<PatchOperation> {
    vec![patch::add(
        patch::pointer(["metadata", "annotations", TRACE]),
        json!(uid),
    )]
}

impl Reuse for Switch {
    fn holds(&self) -> bool {
        !self.broken.load(Ordering::SeqCst)
    }

    fn reused(&self, review: &ReusedReview<'_>) -> Vec<PatchOperation> {
        self.reused.fetch_add(1, Ordering::SeqCst);
        assert_eq!(review.object["kind"], "Pod");
        per_review(review.uid)
    }
}

struct Fixture {
    router: axum::Router,
    calls: Arc<AtomicUsize>,
    switch: Arc<Switch>,
}

/// The change: an env var in every container and an annotation; offered for reuse unless the
/// pod is labelled `reuse: "no"`, with a warning when it is labelled `warn`.
fn change(request: TypedRequest<Pod>, switch: &Arc<Switch>) -> Reply<Mutation<Pod>> {
    let Some(mut pod) = request.object else {
        return Reply::new(Mutation::Allow);
    };
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    for container in &mut pod.spec.get_or_insert_default().containers {
        container.env.get_or_insert_default().push(EnvVar {
            name: "HF_HUB_OFFLINE".into(),
            value: Some("1".into()),
            ..EnvVar::default()
        });
    }
    pod.metadata
        .annotations
        .get_or_insert_default()
        .insert("example.com/changed".into(), "true".into());
    if labels.contains_key("mention") {
        // An answer naming the pod's own token volume.
        let token = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .and_then(|v| v.first());
        let name = token.map(|v| v.name.clone()).unwrap_or_default();
        pod.metadata
            .annotations
            .get_or_insert_default()
            .insert("example.com/token".into(), name);
    }
    if labels.contains_key("forget-managers") {
        // An answer that writes managedFields.
        pod.metadata.managed_fields = None;
    }
    let mut reply = Reply::new(Mutation::Mutated(pod));
    if labels.contains_key("warn") {
        reply = reply.warning("changed");
    }
    if labels.get("reuse").map(String::as_str) != Some("no") {
        let reuse: Arc<dyn Reuse> = Arc::clone(switch) as Arc<dyn Reuse>;
        reply = reply.reusable(Reusable::new(reuse, per_review(&request.uid)));
    }
    reply
}

fn fixture(asynchronous: bool) -> Fixture {
    let calls = Arc::new(AtomicUsize::new(0));
    let switch = Arc::new(Switch::default());
    let (c, s) = (Arc::clone(&calls), Arc::clone(&switch));
    let route = if asynchronous {
        Route::mutating_typed_async("/mutate", move |request: TypedRequest<Pod>| {
            let (c, s) = (Arc::clone(&c), Arc::clone(&s));
            async move {
                tokio::task::yield_now().await;
                c.fetch_add(1, Ordering::SeqCst);
                change(request, &s)
            }
        })
    } else {
        Route::mutating_typed("/mutate", move |request: TypedRequest<Pod>| {
            c.fetch_add(1, Ordering::SeqCst);
            change(request, &s)
        })
    };
    let config = AdmissionServerConfig::new(common::files_in(std::path::Path::new("/unused")));
    Fixture {
        router: AdmissionServer::new(config).route(route).router().unwrap(),
        calls,
        switch,
    }
}

impl Fixture {
    async fn post(&self, review: &Value) -> Value {
        let request = http::Request::post("/mutate")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(serde_json::to_vec(review).unwrap()))
            .unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), 200);
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let answer: Value = serde_json::from_slice(&bytes).unwrap();
        answer["response"].clone()
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn reused(&self) -> usize {
        self.switch.reused.load(Ordering::SeqCst)
    }
}

/// A replica's review: the object of a ReplicaSet's pod (no name yet), an unknown field kept.
fn replica(uid: &str) -> Value {
    let mut review = pod_review(uid, "");
    review["request"]["object"]["metadata"] = json!({
        "generateName": "engine-6c9d8f7b5-",
        "namespace": "team-a",
        "labels": {"app": "engine"}
    });
    review["request"]["object"]["spec"]["futurePodField"] = json!({"mode": "x"});
    review
}

fn applied(review: &Value, response: &Value) -> Value {
    let patch: Patch = serde_json::from_slice(&patch_bytes(response)).unwrap();
    patch::apply(&review["request"]["object"], &patch).unwrap()
}

#[tokio::test]
async fn an_equal_object_is_answered_from_the_kept_answer_with_its_own_uid_and_operations() {
    for asynchronous in [false, true] {
        let f = fixture(asynchronous);
        let first = replica("uid-1");
        let answer = f.post(&first).await;
        assert_eq!((f.calls(), f.reused()), (1, 0), "async {asynchronous}");
        assert_eq!(answer["uid"], "uid-1");
        let made = applied(&first, &answer);
        assert_eq!(made["metadata"]["annotations"][TRACE], "uid-1");
        assert_eq!(made["spec"]["futurePodField"], json!({"mode": "x"}));

        for n in 2..=4 {
            let uid = format!("uid-{n}");
            let review = replica(&uid);
            let again = f.post(&review).await;
            assert_eq!((f.calls(), f.reused()), (1, n - 1), "async {asynchronous}");
            assert_eq!(again["uid"], uid.as_str());
            assert_eq!(again["allowed"], true);
            assert_eq!(again["patchType"], "JSONPatch");
            // The same change as the handler's, with this review's own per-review operation.
            let mut expected = made.clone();
            expected["metadata"]["annotations"][TRACE] = json!(uid);
            assert_eq!(applied(&review, &again), expected, "async {asynchronous}");
        }
    }
}

/// A change to a review.
type Change = Box<dyn Fn(&mut Value)>;

#[tokio::test]
async fn a_review_differing_in_anything_but_its_uid_calls_the_handler() {
    let f = fixture(true);
    f.post(&replica("uid-0")).await;
    assert_eq!(f.calls(), 1);
    let variants: Vec<(&str, Change)> = vec![
        (
            "an unknown field",
            Box::new(|r| r["request"]["object"]["spec"]["futurePodField"]["mode"] = json!("y")),
        ),
        (
            "a label",
            Box::new(|r| r["request"]["object"]["metadata"]["labels"]["tier"] = json!("gpu")),
        ),
        (
            "a container's image",
            Box::new(|r| r["request"]["object"]["spec"]["containers"][0]["image"] = json!("other")),
        ),
        (
            "the namespace",
            Box::new(|r| r["request"]["namespace"] = json!("team-b")),
        ),
        ("the name", Box::new(|r| r["request"]["name"] = json!("p"))),
        (
            "the user",
            Box::new(|r| r["request"]["userInfo"]["username"] = json!("bob")),
        ),
        (
            "the user's groups",
            Box::new(|r| r["request"]["userInfo"]["groups"] = json!([])),
        ),
        (
            "dry run",
            Box::new(|r| r["request"]["dryRun"] = json!(true)),
        ),
        (
            "the subresource",
            Box::new(|r| r["request"]["subResource"] = json!("status")),
        ),
        (
            "the operation",
            Box::new(|r| {
                r["request"]["operation"] = json!("UPDATE");
                r["request"]["oldObject"] = r["request"]["object"].clone();
            }),
        ),
    ];
    let mut calls = 1;
    for (what, change) in &variants {
        let mut review = replica("uid-x");
        change(&mut review);
        let answer = f.post(&review).await;
        calls += 1;
        assert_eq!(f.calls(), calls, "{what}: the handler is called");
        assert_eq!(f.reused(), 0, "{what}");
        assert_eq!(answer["uid"], "uid-x");
    }
    // The original object is still answered from its kept answer.
    f.post(&replica("uid-y")).await;
    assert_eq!((f.calls(), f.reused()), (calls, 1));
}

#[tokio::test]
async fn an_answer_that_no_longer_holds_is_computed_again_and_kept_anew() {
    let f = fixture(false);
    f.post(&replica("uid-1")).await;
    f.post(&replica("uid-2")).await;
    assert_eq!((f.calls(), f.reused()), (1, 1));
    f.switch.broken.store(true, Ordering::SeqCst);
    let answer = f.post(&replica("uid-3")).await;
    assert_eq!((f.calls(), f.reused()), (2, 1));
    assert_eq!(
        applied(&replica("uid-3"), &answer)["metadata"]["annotations"][TRACE],
        "uid-3"
    );
    // Kept again by that call; reused once it holds.
    f.switch.broken.store(false, Ordering::SeqCst);
    f.post(&replica("uid-4")).await;
    assert_eq!((f.calls(), f.reused()), (2, 2));
}

#[tokio::test]
async fn answers_not_offered_are_never_reused_and_warnings_are_kept() {
    let f = fixture(true);
    let mut not_offered = replica("uid-1");
    not_offered["request"]["object"]["metadata"]["labels"]["reuse"] = json!("no");
    f.post(&not_offered).await;
    f.post(&not_offered).await;
    assert_eq!((f.calls(), f.reused()), (2, 0));

    let mut warned = replica("uid-2");
    warned["request"]["object"]["metadata"]["labels"]["warn"] = json!("yes");
    let first = f.post(&warned).await;
    let again = f.post(&warned).await;
    assert_eq!((f.calls(), f.reused()), (3, 1));
    assert_eq!(first["warnings"], json!(["changed"]));
    assert_eq!(again["warnings"], json!(["changed"]));
}

#[tokio::test]
async fn the_oldest_answers_go_beyond_the_bound() {
    let f = fixture(false);
    let distinct = |n: usize| {
        let mut review = replica(&format!("uid-{n}"));
        review["request"]["object"]["metadata"]["labels"]["n"] = json!(n.to_string());
        review
    };
    for n in 0..=KEPT_ANSWERS {
        f.post(&distinct(n)).await;
    }
    assert_eq!(f.calls(), KEPT_ANSWERS + 1);
    // The newest is kept; the first went when the bound was passed.
    f.post(&distinct(KEPT_ANSWERS)).await;
    assert_eq!((f.calls(), f.reused()), (KEPT_ANSWERS + 1, 1));
    f.post(&distinct(0)).await;
    assert_eq!((f.calls(), f.reused()), (KEPT_ANSWERS + 2, 1));
}

/// `review` with the service account token volume the API server gives each pod, named
/// `kube-api-access-<suffix>`, mounted in the container.
fn with_token(mut review: Value, suffix: &str) -> Value {
    let name = format!("kube-api-access-{suffix}");
    let object = &mut review["request"]["object"];
    object["spec"]["volumes"] = json!([{"name": name, "projected": {"sources": []}}]);
    object["spec"]["containers"][0]["volumeMounts"] = json!([{
        "name": name,
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
        "readOnly": true
    }]);
    review
}

#[tokio::test]
async fn pods_differing_only_in_their_token_volume_name_share_an_answer() {
    let f = fixture(true);
    let first = with_token(replica("uid-1"), "a1b2c");
    let made = applied(&first, &f.post(&first).await);
    let second = with_token(replica("uid-2"), "x9y8z");
    let again = f.post(&second).await;
    assert_eq!((f.calls(), f.reused()), (1, 1));
    let mut expected = made.clone();
    expected["metadata"]["annotations"][TRACE] = json!("uid-2");
    expected["spec"]["volumes"][0]["name"] = json!("kube-api-access-x9y8z");
    expected["spec"]["containers"][0]["volumeMounts"][0]["name"] = json!("kube-api-access-x9y8z");
    assert_eq!(applied(&second, &again), expected);

    // Not when the names do not correspond: the second pod mounts its volume elsewhere too, or
    // has none.
    let mut crossed = with_token(replica("uid-3"), "k3l4m");
    crossed["request"]["object"]["spec"]["containers"][0]["env"] =
        json!([{"name": "V", "value": "kube-api-access-a1b2c"}]);
    let mut first_too = first.clone();
    first_too["request"]["object"]["spec"]["containers"][0]["env"] =
        json!([{"name": "V", "value": "kube-api-access-a1b2c"}]);
    f.post(&first_too).await;
    assert_eq!(f.calls(), 2);
    f.post(&crossed).await;
    assert_eq!((f.calls(), f.reused()), (3, 1), "a name standing for two");
    f.post(&replica("uid-4")).await;
    assert_eq!((f.calls(), f.reused()), (4, 1), "no token volume");

    // An answer whose patch names the pod's own token volume is not kept.
    let mut mention = with_token(replica("uid-5"), "p5q6r");
    mention["request"]["object"]["metadata"]["labels"]["mention"] = json!("yes");
    f.post(&mention).await;
    f.post(&mention).await;
    assert_eq!((f.calls(), f.reused()), (6, 1));
}

/// `review` with the managedFields entry the API server records for the request's field
/// manager, at `time`.
fn managed_by(mut review: Value, manager: &str, time: &str) -> Value {
    review["request"]["object"]["metadata"]["managedFields"] = json!([{
        "manager": manager,
        "operation": "Update",
        "apiVersion": "v1",
        "time": time,
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}}}}
    }]);
    review
}

#[tokio::test]
async fn replicas_created_seconds_apart_share_an_answer() {
    const MANAGER: &str = "kube-controller-manager";
    let f = fixture(true);
    let first = managed_by(replica("uid-1"), MANAGER, "2026-12-07T08:00:00Z");
    let made = applied(&first, &f.post(&first).await);
    // The API server stamps each request's managedFields entry to the second: a replica
    // created a second later differs only there.
    let later = managed_by(replica("uid-2"), MANAGER, "2026-12-07T08:00:01Z");
    let again = f.post(&later).await;
    assert_eq!((f.calls(), f.reused()), (1, 1));
    let mut expected = made.clone();
    expected["metadata"]["annotations"][TRACE] = json!("uid-2");
    expected["metadata"]["managedFields"][0]["time"] = json!("2026-12-07T08:00:01Z");
    assert_eq!(
        applied(&later, &again),
        expected,
        "the later pod keeps its own time"
    );

    // Anything else in managedFields is compared, and a `time` anywhere else.
    let other_manager = managed_by(replica("uid-3"), "kubectl", "2026-12-07T08:00:02Z");
    f.post(&other_manager).await;
    assert_eq!((f.calls(), f.reused()), (2, 1), "another manager");
    let mut other_time = managed_by(replica("uid-4"), MANAGER, "2026-12-07T08:00:03Z");
    other_time["request"]["object"]["metadata"]["labels"]["time"] = json!("08:00:03");
    let mut first_time = first.clone();
    first_time["request"]["object"]["metadata"]["labels"]["time"] = json!("08:00:00");
    f.post(&first_time).await;
    f.post(&other_time).await;
    assert_eq!((f.calls(), f.reused()), (4, 1), "a label named time");

    // An answer that writes managedFields is not kept: its patch would carry the first
    // replica's times.
    let mut forgets = managed_by(replica("uid-5"), MANAGER, "2026-12-07T08:00:04Z");
    forgets["request"]["object"]["metadata"]["labels"]["forget-managers"] = json!("yes");
    let answer = f.post(&forgets).await;
    assert!(
        applied(&forgets, &answer)["metadata"]
            .get("managedFields")
            .is_none()
    );
    f.post(&forgets).await;
    assert_eq!((f.calls(), f.reused()), (6, 1));
}
