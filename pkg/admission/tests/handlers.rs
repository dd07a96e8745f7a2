//! Synchronous handlers run on the blocking pool: a slow one neither delays other reviews nor
//! its own answer at the timeout, and the number running at once is bounded.

// Test code: helpers outside #[test] fns may unwrap/panic too (clippy.toml only covers #[test]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::*;
use tokio::sync::mpsc;
use warmcache_admission::{
    AdmissionMetrics, AdmissionRequest, AdmissionResponse, AdmissionServer, AdmissionServerConfig,
    DynamicObject, OnHandlerError, Route,
};

/// Blocks synchronous handlers until opened (or for at most 20 s, so that the old,
/// runtime-blocking server eventually answers and the test fails instead of hanging).
#[derive(Clone)]
struct Gate {
    open: Arc<(Mutex<bool>, Condvar)>,
    running: Arc<AtomicUsize>,
    started: mpsc::UnboundedSender<()>,
}

impl Gate {
    fn new() -> (Self, mpsc::UnboundedReceiver<()>) {
        let (started, receiver) = mpsc::unbounded_channel();
        let gate = Self {
            open: Arc::new((Mutex::new(false), Condvar::new())),
            running: Arc::new(AtomicUsize::new(0)),
            started,
        };
        (gate, receiver)
    }

    /// The synchronous handler body: announce, block (a thread stuck in CPU work or a
    /// blocking call looks the same to the server), finish.
    fn block(&self, req: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
        self.running.fetch_add(1, Ordering::SeqCst);
        self.started.send(()).unwrap();
        let (lock, condvar) = &*self.open;
        let guard = lock.lock().unwrap();
        let _guard = condvar
            .wait_timeout_while(guard, Duration::from_secs(20), |open| !*open)
            .unwrap();
        self.running.fetch_sub(1, Ordering::SeqCst);
        AdmissionResponse::from(req)
    }

    fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    fn release(&self) {
        let (lock, condvar) = &*self.open;
        *lock.lock().unwrap() = true;
        condvar.notify_all();
    }
}

fn ok(req: AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    AdmissionResponse::from(&req)
}

struct Fixture {
    _dir: tempfile::TempDir,
    ca: Ca,
    running: Running,
}

fn start(
    config: impl FnOnce(&mut AdmissionServerConfig),
    gate: &Gate,
    metrics: &AdmissionMetrics,
) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    ca.leaf(1).write_to(dir.path());
    let mut server_config = AdmissionServerConfig::new(files_in(dir.path()));
    config(&mut server_config);
    let (deny_gate, allow_gate) = (gate.clone(), gate.clone());
    let server = AdmissionServer::new(server_config)
        .route(Route::validating("/slow", move |req| deny_gate.block(&req)))
        .route(
            Route::mutating("/allow/slow", move |req| allow_gate.block(&req))
                .on_error(OnHandlerError::Allow),
        )
        .route(Route::validating("/fast", ok))
        .route(Route::validating_async("/fast-async", |req| async move {
            ok(req)
        }))
        .with_metrics(metrics.clone());
    Fixture {
        _dir: dir,
        ca,
        running: spawn_serve(server),
    }
}

// Two runtime workers, as on the 2-CPU nodes the webhook runs on: two handlers blocking them
// used to stall every other review (and the timeout meant to answer them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_synchronous_handlers_neither_delay_others_nor_their_own_timeout() {
    let (gate, mut started) = Gate::new();
    let metrics = AdmissionMetrics::new().unwrap();
    let f = start(
        |c| c.handler_timeout = Duration::from_secs(2),
        &gate,
        &metrics,
    );
    let (addr, ca) = (f.running.addr, Arc::new(f.ca));

    let sent = Instant::now();
    let slow_deny = {
        let ca = Arc::clone(&ca);
        tokio::spawn(
            async move { post_json(addr, &ca, "/slow", &pod_review("uid-slow", "p")).await },
        )
    };
    let slow_allow = {
        let ca = Arc::clone(&ca);
        tokio::spawn(async move {
            post(
                addr,
                &ca,
                b"h2",
                "/allow/slow",
                Some("application/json"),
                serde_json::to_vec(&pod_review("uid-slow-allow", "p")).unwrap(),
            )
            .await
        })
    };
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(30), started.recv())
            .await
            .expect("both slow handlers start")
            .unwrap();
    }

    // A fast review, synchronous too, is answered while both slow handlers still run.
    let fast = tokio::time::timeout(
        Duration::from_secs(30),
        post_json(addr, &ca, "/fast", &pod_review("uid-fast", "good")),
    )
    .await
    .expect("the fast review is answered");
    assert_eq!(fast.response()["allowed"], true);
    assert_eq!(
        gate.running(),
        2,
        "the fast review was answered only after the slow handlers returned"
    );
    let fast = post_json(
        addr,
        &ca,
        "/fast-async",
        &pod_review("uid-fast-async", "good"),
    )
    .await;
    assert_eq!(fast.response()["allowed"], true);
    assert_eq!(gate.running(), 2);

    // The slow reviews are answered at the timeout, by their routes' policies, while their
    // handlers are still blocked.
    let denied = slow_deny.await.unwrap().response();
    assert_eq!(gate.running(), 2, "answered only when the handler returned");
    assert!(
        sent.elapsed() >= Duration::from_secs(2),
        "{:?}",
        sent.elapsed()
    );
    assert_eq!(denied["uid"], "uid-slow");
    assert_eq!(denied["allowed"], false);
    assert_eq!(denied["status"]["code"], 500);
    let message = denied["status"]["message"].as_str().unwrap();
    assert!(message.contains("did not answer within 2s"), "{message}");

    let allowed = slow_allow.await.unwrap().response();
    assert_eq!(gate.running(), 2, "answered only when the handler returned");
    assert_eq!(allowed["uid"], "uid-slow-allow");
    assert_eq!(allowed["allowed"], true);
    assert!(allowed.get("patch").is_none(), "{allowed}");
    let warning = allowed["warnings"][0].as_str().unwrap();
    assert!(
        warning.contains("/allow/slow") && warning.contains("did not answer within"),
        "{warning}"
    );

    let abandoned = |route: &str| {
        metrics
            .handlers_abandoned()
            .with_label_values(&[route])
            .get()
    };
    assert_eq!(abandoned("/slow"), 1);
    assert_eq!(abandoned("/allow/slow"), 1);
    assert_eq!(abandoned("/fast"), 0);
    assert_eq!(metrics.handlers_running().get(), 2);

    gate.release();
    eventually(
        Duration::from_secs(10),
        "the abandoned handlers to return",
        || metrics.handlers_running().get() == 0,
    )
    .await;
    assert_eq!(gate.running(), 0);
    f.running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_handler_slots_make_synchronous_reviews_wait_until_the_timeout() {
    let (gate, mut started) = Gate::new();
    let metrics = AdmissionMetrics::new().unwrap();
    let f = start(
        |c| {
            c.handler_timeout = Duration::from_secs(1);
            c.max_concurrent_handlers = 1;
        },
        &gate,
        &metrics,
    );
    let (addr, ca) = (f.running.addr, Arc::new(f.ca));

    let slow = {
        let ca = Arc::clone(&ca);
        tokio::spawn(
            async move { post_json(addr, &ca, "/slow", &pod_review("uid-slow", "p")).await },
        )
    };
    started.recv().await.unwrap();

    // The only slot is taken: a synchronous review waits for it, then gets the timeout answer.
    let waited = Instant::now();
    let reply = post_json(addr, &ca, "/fast", &pod_review("uid-queued", "good")).await;
    let response = reply.response();
    assert!(
        waited.elapsed() >= Duration::from_secs(1),
        "{:?}",
        waited.elapsed()
    );
    assert_eq!(response["uid"], "uid-queued");
    assert_eq!(response["allowed"], false);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("did not answer within") && message.contains("handler slots"),
        "{message}"
    );
    assert_eq!(
        metrics
            .handler_slot_timeouts()
            .with_label_values(&["/fast"])
            .get(),
        1
    );
    // Async handlers do not use the slots.
    let reply = post_json(addr, &ca, "/fast-async", &pod_review("uid-async", "good")).await;
    assert_eq!(reply.response()["allowed"], true);

    // The abandoned handler still holds the slot after its own review was answered...
    assert_eq!(slow.await.unwrap().response()["allowed"], false);
    assert_eq!(gate.running(), 1);
    // ...until it returns; then synchronous reviews run again.
    gate.release();
    eventually(
        Duration::from_secs(10),
        "the slow handler to return",
        || metrics.handlers_running().get() == 0,
    )
    .await;
    let reply = post_json(addr, &ca, "/fast", &pod_review("uid-after", "good")).await;
    assert_eq!(reply.response()["allowed"], true);
    f.running.stop().await;
}

/// Typed async routes decode the object and compute the patch on the blocking pool, in a
/// handler slot (CPU work proportional to an object the request's sender controls, which an
/// abort at the timeout could not preempt on an async worker); their future runs without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_async_routes_decode_and_patch_in_handler_slots() {
    use k8s_openapi::api::core::v1::Pod;
    use warmcache_admission::{Mutation, TypedRequest};

    let (gate, mut started) = Gate::new();
    let (later_gate, mut later_started) = Gate::new();
    let metrics = AdmissionMetrics::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    ca.leaf(1).write_to(dir.path());
    let mut config = AdmissionServerConfig::new(files_in(dir.path()));
    config.handler_timeout = Duration::from_secs(4);
    config.max_concurrent_handlers = 1;
    let label = |pod: Option<Pod>| {
        let mut pod = pod.unwrap_or_default();
        pod.metadata
            .labels
            .get_or_insert_default()
            .insert("seen".into(), "yes".into());
        Mutation::Mutated(pod)
    };
    let quick_calls = Arc::new(AtomicUsize::new(0));
    let calls = Arc::clone(&quick_calls);
    let (entered_tx, mut entered) = mpsc::unbounded_channel::<()>();
    let proceed = Arc::new(tokio::sync::Notify::new());
    let go = Arc::clone(&proceed);
    let (slow_gate, later_slow_gate) = (gate.clone(), later_gate.clone());
    let server = AdmissionServer::new(config)
        .route(Route::validating("/slow", move |req| slow_gate.block(&req)))
        .route(Route::validating("/slow-later", move |req| {
            later_slow_gate.block(&req)
        }))
        .route(Route::validating("/fast", ok))
        .route(Route::mutating_typed_async(
            "/typed-quick",
            move |req: TypedRequest<Pod>| {
                calls.fetch_add(1, Ordering::SeqCst);
                async move { label(req.object) }
            },
        ))
        .route(Route::mutating_typed_async(
            "/typed-waits",
            move |req: TypedRequest<Pod>| {
                let (entered_tx, go) = (entered_tx.clone(), Arc::clone(&go));
                async move {
                    entered_tx.send(()).unwrap();
                    go.notified().await;
                    label(req.object)
                }
            },
        ))
        .with_metrics(metrics.clone());
    let running = spawn_serve(server);
    let (addr, ca) = (running.addr, Arc::new(ca));
    let released = |gate: &Gate| {
        gate.release();
        let metrics = metrics.clone();
        async move {
            eventually(
                Duration::from_secs(20),
                "the blocked handler to return",
                || metrics.handlers_running().get() == 0,
            )
            .await;
        }
    };

    // 1. The only slot is taken: the typed async review is not even decoded (its handler is not
    // called) and gets the timeout answer of a review that found no free slot.
    let slow = {
        let ca = Arc::clone(&ca);
        tokio::spawn(
            async move { post_json(addr, &ca, "/slow", &pod_review("uid-slow", "p")).await },
        )
    };
    started.recv().await.unwrap();
    let reply = post_json(addr, &ca, "/typed-quick", &pod_review("uid-quick", "p")).await;
    let response = reply.response();
    assert_eq!(response["allowed"], false, "{response}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.contains("handler slots"), "{message}");
    assert_eq!(quick_calls.load(Ordering::SeqCst), 0);
    assert_eq!(
        metrics
            .handler_slot_timeouts()
            .with_label_values(&["/typed-quick"])
            .get(),
        1
    );
    assert_eq!(slow.await.unwrap().response()["allowed"], false);
    released(&gate).await;
    // With the slot free it runs as usual.
    let reply = post_json(addr, &ca, "/typed-quick", &pod_review("uid-quick-2", "p")).await;
    assert_eq!(
        reply.response()["patchType"],
        "JSONPatch",
        "{}",
        reply.response()
    );
    assert_eq!(quick_calls.load(Ordering::SeqCst), 1);

    // 2. While the async part runs, it holds no slot: a synchronous review is answered.
    let waits = {
        let ca = Arc::clone(&ca);
        tokio::spawn(async move {
            post_json(addr, &ca, "/typed-waits", &pod_review("uid-waits", "p")).await
        })
    };
    entered.recv().await.unwrap();
    let reply = post_json(addr, &ca, "/fast", &pod_review("uid-fast", "p")).await;
    assert_eq!(reply.response()["allowed"], true);
    // Then the slot is taken before the handler returns its changed pod: the patch waits for
    // the slot, and the review gets the timeout answer instead of the patch.
    let later = {
        let ca = Arc::clone(&ca);
        tokio::spawn(async move {
            post_json(addr, &ca, "/slow-later", &pod_review("uid-later", "p")).await
        })
    };
    later_started.recv().await.unwrap();
    proceed.notify_one();
    let response = waits.await.unwrap().response();
    assert_eq!(response["uid"], "uid-waits");
    assert_eq!(response["allowed"], false, "{response}");
    assert!(response.get("patch").is_none(), "{response}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.contains("handler slots"), "{message}");
    assert_eq!(later.await.unwrap().response()["allowed"], false);
    released(&later_gate).await;
    running.stop().await;
}

/// A synchronous or typed route decodes the review in its handler slot (the whole review is one
/// step on the blocking pool): with every slot busy, a body that is no review or an invalid one
/// is answered as such once the wait for a slot ends, and a review waiting for a slot is
/// answered with its uid, its handler not called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_and_typed_reviews_are_decoded_in_their_handler_slot() {
    use k8s_openapi::api::core::v1::Pod;
    use warmcache_admission::{Mutation, TypedRequest};

    let (gate, mut started) = Gate::new();
    let metrics = AdmissionMetrics::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    ca.leaf(1).write_to(dir.path());
    let mut config = AdmissionServerConfig::new(files_in(dir.path()));
    config.handler_timeout = Duration::from_secs(1);
    config.max_concurrent_handlers = 1;
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&calls);
    let slow_gate = gate.clone();
    let server = AdmissionServer::new(config)
        .route(Route::validating("/slow", move |req| slow_gate.block(&req)))
        .route(Route::validating("/fast", ok))
        .route(Route::mutating_typed_async(
            "/typed",
            move |req: TypedRequest<Pod>| {
                seen.fetch_add(1, Ordering::SeqCst);
                async move {
                    let mut pod = req.object.unwrap_or_default();
                    pod.metadata
                        .labels
                        .get_or_insert_default()
                        .insert("seen".into(), "yes".into());
                    Mutation::Mutated(pod)
                }
            },
        ))
        .with_metrics(metrics.clone());
    let running = spawn_serve(server);
    let (addr, ca) = (running.addr, Arc::new(ca));

    let slow = {
        let ca = Arc::clone(&ca);
        tokio::spawn(
            async move { post_json(addr, &ca, "/slow", &pod_review("uid-slow", "p")).await },
        )
    };
    started.recv().await.unwrap();
    // The only slot is taken. Not JSON: 400 with the reason, once the wait for a slot ended.
    let waited = Instant::now();
    let reply = post(
        addr,
        &ca,
        b"http/1.1",
        "/fast",
        Some("application/json"),
        b"{not json".to_vec(),
    )
    .await;
    assert!(waited.elapsed() >= Duration::from_secs(1));
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(reply.text().contains("not JSON"), "{}", reply.text());
    // An invalid review: the invalid answer, with its uid.
    let mut invalid = pod_review("uid-invalid", "p");
    invalid["apiVersion"] = serde_json::json!("admission.k8s.io/v1beta1");
    let response = post_json(addr, &ca, "/typed", &invalid).await.response();
    assert_eq!(response["uid"], "uid-invalid");
    assert_eq!(response["status"]["reason"], "InvalidRequest", "{response}");
    // A review: the timeout answer of a review that found no slot, with its uid; the typed
    // handler was not called.
    let response = post_json(addr, &ca, "/typed", &pod_review("uid-queued", "p"))
        .await
        .response();
    assert_eq!(response["uid"], "uid-queued");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.contains("handler slots"), "{message}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(slow.await.unwrap().response()["allowed"], false);
    gate.release();
    eventually(
        Duration::from_secs(20),
        "the blocked handler to return",
        || metrics.handlers_running().get() == 0,
    )
    .await;

    // With the slot free, the typed review is answered with its patch.
    let response = post_json(addr, &ca, "/typed", &pod_review("uid-typed", "p"))
        .await
        .response();
    assert_eq!(response["uid"], "uid-typed");
    assert_eq!(response["patchType"], "JSONPatch", "{response}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    running.stop().await;
}

/// With `inline_body_bytes` set, a typed async route answers a review of at most that size on
/// the async worker, without a handler slot: with the only slot busy, a small review is
/// answered with its patch (its future's first poll and, when the future waits, its patch done
/// inline), a panic is answered by the route's policy and a body that is no review gets its
/// `400` at once; a bigger review still waits for a slot and gets the timeout answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_async_routes_answer_small_reviews_on_the_async_worker() {
    use k8s_openapi::api::core::v1::Pod;
    use warmcache_admission::{Mutation, TypedRequest};

    let (gate, mut started) = Gate::new();
    let metrics = AdmissionMetrics::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    ca.leaf(1).write_to(dir.path());
    let mut config = AdmissionServerConfig::new(files_in(dir.path()));
    config.handler_timeout = Duration::from_secs(2);
    config.max_concurrent_handlers = 1;
    config.inline_body_bytes = 4 * 1024;
    let label = |pod: Option<Pod>| {
        let mut pod = pod.unwrap_or_default();
        pod.metadata
            .labels
            .get_or_insert_default()
            .insert("seen".into(), "yes".into());
        Mutation::Mutated(pod)
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&calls);
    let slow_gate = gate.clone();
    let server = AdmissionServer::new(config)
        .route(Route::validating("/slow", move |req| slow_gate.block(&req)))
        .route(Route::mutating_typed_async(
            "/typed",
            move |req: TypedRequest<Pod>| {
                seen.fetch_add(1, Ordering::SeqCst);
                async move { label(req.object) }
            },
        ))
        .route(Route::mutating_typed_async(
            "/typed-waits",
            move |req: TypedRequest<Pod>| async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                label(req.object)
            },
        ))
        .route(Route::mutating_typed_async(
            "/typed-panics",
            |req: TypedRequest<Pod>| async move {
                if req.uid.starts_with("uid") {
                    panic!("the handler panics");
                }
                Mutation::<Pod>::Allow
            },
        ))
        .with_metrics(metrics.clone());
    let running = spawn_serve(server);
    let (addr, ca) = (running.addr, Arc::new(ca));

    let slow = {
        let ca = Arc::clone(&ca);
        tokio::spawn(
            async move { post_json(addr, &ca, "/slow", &pod_review("uid-slow", "p")).await },
        )
    };
    started.recv().await.unwrap();
    // The only slot is taken. A small review is answered with its patch, at once.
    let answered = Instant::now();
    let response = post_json(addr, &ca, "/typed", &pod_review("uid-small", "p"))
        .await
        .response();
    assert_eq!(response["uid"], "uid-small");
    assert_eq!(response["patchType"], "JSONPatch", "{response}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // A future that waits: its patch is computed inline too.
    let response = post_json(addr, &ca, "/typed-waits", &pod_review("uid-waits", "p"))
        .await
        .response();
    assert_eq!(response["uid"], "uid-waits");
    assert_eq!(response["patchType"], "JSONPatch", "{response}");
    // A panic: the route's policy (deny, an internal error naming it).
    let response = post_json(addr, &ca, "/typed-panics", &pod_review("uid-panics", "p"))
        .await
        .response();
    assert_eq!(response["uid"], "uid-panics");
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(response["status"]["code"], 500, "{response}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.contains("panicked"), "{message}");
    // Not JSON: 400 with the reason.
    let reply = post(
        addr,
        &ca,
        b"http/1.1",
        "/typed",
        Some("application/json"),
        b"{not json".to_vec(),
    )
    .await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(reply.text().contains("not JSON"), "{}", reply.text());
    assert!(
        answered.elapsed() < Duration::from_secs(2),
        "answered without waiting for the slot: {:?}",
        answered.elapsed()
    );
    assert_eq!(
        metrics
            .handler_slot_timeouts()
            .with_label_values(&["/typed"])
            .get(),
        0
    );
    // A review over the size waits for the slot, and gets the answer of a review that found
    // none; its handler is not called.
    let mut big = pod_review("uid-big", "p");
    big["request"]["object"]["metadata"]["annotations"] =
        serde_json::json!({"filler": "x".repeat(8 * 1024)});
    let response = post_json(addr, &ca, "/typed", &big).await.response();
    assert_eq!(response["uid"], "uid-big");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.contains("handler slots"), "{message}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(slow.await.unwrap().response()["allowed"], false);
    gate.release();
    eventually(
        Duration::from_secs(20),
        "the blocked handler to return",
        || metrics.handlers_running().get() == 0,
    )
    .await;
    // With the slot free, the big review is answered with its patch on the blocking pool.
    let response = post_json(addr, &ca, "/typed", &big).await.response();
    assert_eq!(response["patchType"], "JSONPatch", "{response}");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    running.stop().await;
}
