//! What one pod admission costs, with its floors measured in the same run:
//!
//! 1. In process: the review of a realistic vLLM pod (a Helm chart's Deployment pod: the engine
//!    downloads its model, a token from a Secret, probes, shared memory, owner reference) through
//!    the admission framework's HTTP router and the pure rewrite joining an existing binding
//!    (decode, typed decode, rewrite, JSON patch, encode: answered on the async worker, as
//!    `webhook serve` answers a review of this size; the synchronous typed route beside it
//!    runs the same as one step on the blocking pool),
//!    against the same review through plain `serde_json` decode + encode. Printed as a ratio
//!    (target: at most 3x), with a later pod of the same ReplicaSet answered from the kept
//!    answer (the route with answer reuse), the framework's share (the same route with a
//!    handler that allows, and with one that returns a rewritten pod made beforehand), and the
//!    parts: the rewrite, and the patch by the general path and written directly.
//! 2. Over HTTPS on loopback, against the real `webhook serve` process with its caches (the test
//!    kit's kube-apiserver behind it; the binding exists and is cached, as for every pod after a
//!    model's first): reviews posted directly at 500 per second for 10 s (open loop, latency from
//!    each review's scheduled time) with p50/p99/max (target: p99 under 5 ms), and the most
//!    reviews per second 4 connections get, against a pod the webhook leaves alone at its first
//!    check (no GPU) as the HTTPS floor.
//!
//! `cargo bench -p warmcache-webhook --bench admission`; the numbers are recorded in
//! `docs/benchmarks.md`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../../../hack/bench/per_call.rs"]
mod per_call;

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tower::ServiceExt;
use warmcache_admission::{
    AdmissionServer, Mutation, Reply, Reusable, Reuse, ReusedReview, Route, TypedRequest,
};
use warmcache_api_modelcache::v2beta1::ModelCacheBinding;
use warmcache_catalog::CatalogInput;
use warmcache_modelvolume::keys::BINDING_UID_ANNOTATION;
use warmcache_modelvolume::{BindingAction, Options, Request, StorageInputs, Verdict, admit};
use warmcache_testkit::HttpsClient;
use warmcache_webhook::DEFAULT_GATES;
use warmcache_webhook::serve::WEBHOOK_PATH;

use common::{Served, client, dry_run};
use per_call::per_call;

/// The allocator of the `webhook` binary, so the in-process part measures what the binary runs
/// (its floor too: both sides of the ratio allocate through it).
#[global_allocator]
static GLOBAL: warmcache_webhook::Allocator = warmcache_webhook::ALLOCATOR;

const NAMESPACE: &str = "team-a";

/// The pod a vLLM chart's Deployment creates (no name yet: `generateName`).
fn vllm_pod(gpu: bool) -> Value {
    let mut limits = json!({"cpu": "8", "memory": "64Gi"});
    if gpu {
        limits["nvidia.com/gpu"] = json!("1");
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "llama-3-1-8b-instruct-6c9d8f7b5-",
            "labels": {
                "app.kubernetes.io/name": "vllm",
                "app.kubernetes.io/instance": "llama-3-1-8b-instruct",
                "app.kubernetes.io/managed-by": "Helm",
                "helm.sh/chart": "vllm-stack-0.1.7",
                "pod-template-hash": "6c9d8f7b5"
            },
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "8000"},
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "llama-3-1-8b-instruct-6c9d8f7b5",
                "uid": "4b1e0d6a-2f7c-4a51-9d0e-3c2b1a0f9e8d", "controller": true, "blockOwnerDeletion": true
            }]
        },
        "spec": {
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000},
            "containers": [{
                "name": "vllm",
                "image": "vllm/vllm-openai:v0.20.0",
                "imagePullPolicy": "IfNotPresent",
                "command": ["vllm", "serve"],
                "args": [
                    "meta-llama/Llama-3.1-8B-Instruct", "--host", "0.0.0.0", "--port", "8000",
                    "--tensor-parallel-size", "1", "--max-model-len", "16384",
                    "--gpu-memory-utilization", "0.90", "--enable-prefix-caching", "--disable-log-requests"
                ],
                "env": [
                    {"name": "HF_HOME", "value": "/data/hf"},
                    {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}},
                    {"name": "VLLM_LOGGING_LEVEL", "value": "INFO"},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
                ],
                "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "4", "memory": "32Gi"}, "limits": limits},
                "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "initialDelaySeconds": 30, "periodSeconds": 10},
                "livenessProbe": {"httpGet": {"path": "/health", "port": 8000}, "initialDelaySeconds": 120, "periodSeconds": 30},
                "startupProbe": {"httpGet": {"path": "/health", "port": 8000}, "failureThreshold": 120, "periodSeconds": 10},
                "volumeMounts": [
                    {"name": "data", "mountPath": "/data"},
                    {"name": "shm", "mountPath": "/dev/shm"}
                ]
            }],
            "volumes": [
                {"name": "data", "emptyDir": {}},
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}
            ],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "nodeSelector": {"nvidia.com/gpu.present": "true"}
        }
    })
}

fn review(pod: &Value, namespace: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0d3f6a43-5e1c-4bd7-9f3a-2a6a7e1c0001",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller", "groups": ["system:serviceaccounts"]},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    }))
    .unwrap()
}

/// The binding a first admission of `pod` creates, as the API server would store it.
fn joined_binding(pod: &Pod, sc: &StorageClass, options: &Options) -> ModelCacheBinding {
    let labels = BTreeMap::new();
    let req = Request {
        pod,
        namespace: NAMESPACE,
        namespace_labels: &labels,
        leader_worker_set: None,
        traceparent: None,
        options,
    };
    let storage = StorageInputs {
        storage_class: Some(sc),
        csi_driver: None,
        catalog: CatalogInput::Absent,
        gates: DEFAULT_GATES,
    };
    let Verdict::Rewrite(rewrite) = admit(&req, |_, _| None, &storage) else {
        panic!("the benchmark pod is rewritten");
    };
    let BindingAction::Create(mut binding) = rewrite.binding else {
        panic!("a first admission creates the binding");
    };
    binding.metadata.uid = Some("7a0f3c52-1d2e-4b6a-8c9d-0e1f2a3b4c5d".into());
    *binding
}

/// What the served route does for a pod of `namespace` whose binding exists: the pure rewrite
/// joining `binding`, with the caches' answers fixed.
fn join(
    pod: &Pod,
    namespace: &str,
    options: &Options,
    sc: &StorageClass,
    binding: &ModelCacheBinding,
) -> Pod {
    let labels = BTreeMap::new();
    let req = Request {
        pod,
        namespace,
        namespace_labels: &labels,
        leader_worker_set: None,
        traceparent: None,
        options,
    };
    let storage = StorageInputs {
        storage_class: Some(sc),
        csi_driver: None,
        catalog: CatalogInput::Absent,
        gates: DEFAULT_GATES,
    };
    match admit(&req, |_, _| Some(binding), &storage) {
        Verdict::Rewrite(r) => r.pod,
        other => panic!("expected a join, got {other:?}"),
    }
}

/// The reuse check of the benchmark's route, doing what `webhook serve`'s does: six cached
/// objects looked up again in a reflector store and compared, and the window; per reuse, the
/// admission's span with its fields, its trace context, and its metrics.
struct Check {
    store: kube::runtime::reflector::Store<ModelCacheBinding>,
    key: kube::runtime::reflector::ObjectRef<ModelCacheBinding>,
    read: Option<std::sync::Arc<ModelCacheBinding>>,
    decided_at: Instant,
    admissions: prometheus::IntCounterVec,
    duration: prometheus::HistogramVec,
}

impl Check {
    fn new(binding: &ModelCacheBinding) -> Self {
        let (store, mut writer) = kube::runtime::reflector::store();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(binding.clone()));
        let key = kube::runtime::reflector::ObjectRef::from_obj(binding);
        let read = store.get(&key);
        Self {
            store,
            key,
            read,
            decided_at: Instant::now(),
            admissions: prometheus::IntCounterVec::new(
                prometheus::Opts::new("admissions", "bench"),
                &["outcome", "reason"],
            )
            .unwrap(),
            duration: prometheus::HistogramVec::new(
                prometheus::HistogramOpts::new("duration", "bench"),
                &["outcome"],
            )
            .unwrap(),
        }
    }
}

impl Reuse for Check {
    fn holds(&self) -> bool {
        self.decided_at.elapsed() < Duration::from_secs(3600)
            && (0..6).all(|_| match (self.store.get(&self.key), &self.read) {
                (Some(found), Some(read)) => std::sync::Arc::ptr_eq(&found, read),
                _ => false,
            })
    }

    fn reused(&self, review: &ReusedReview<'_>) -> Vec<warmcache_admission::patch::PatchOperation> {
        let started = Instant::now();
        let span = tracing::info_span!(
            "pod_admission",
            namespace = review.namespace.unwrap_or_default(),
            pod = "llama-3-1-8b-instruct-6c9d8f7b5-*",
            dry_run = review.dry_run,
            model.uri = "hf://meta-llama/Llama-3.1-8B-Instruct",
            binding = "model-cache-0123",
            decision = "rewritten",
            reason = "none",
            reused = true,
        );
        let mut carrier = BTreeMap::new();
        span.in_scope(|| warmcache_telemetry::inject_current(&mut carrier));
        black_box(carrier);
        self.admissions
            .with_label_values(&["rewritten", "none"])
            .inc();
        self.duration
            .with_label_values(&["rewritten"])
            .observe(started.elapsed().as_secs_f64());
        Vec::new()
    }
}

fn in_process() {
    let pod_value = vllm_pod(true);
    let pod: Pod = serde_json::from_value(pod_value.clone()).unwrap();
    let sc: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": "nvcf-sc", "uid": "5f0c1f3e-8a59-4c2a-9d0e-1b2c3d4e5f60"},
        "provisioner": "csi.weka.io", "reclaimPolicy": "Retain"
    }))
    .unwrap();
    let options = Options::default();
    let binding = joined_binding(&pod, &sc, &options);
    let (options_for_parts, sc_for_parts, binding_for_parts) =
        (options.clone(), sc.clone(), binding.clone());
    let body = review(&pod_value, NAMESPACE);

    // The route the webhook serves (`Route::mutating_typed_async`, as `webhook serve` builds
    // it), with its inputs fixed: the same framework path (typed decode, the handler's future,
    // patch, encode) and the same pure rewrite, without the caches; and the synchronous typed
    // route (`Route::mutating_typed`) with the same handler, for comparison.
    let inputs_for_reuse = std::sync::Arc::new((
        options.clone(),
        sc.clone(),
        binding.clone(),
        std::sync::Arc::new(Check::new(&binding)),
    ));
    let inputs = std::sync::Arc::new((options, sc, binding));
    let sync_inputs = std::sync::Arc::clone(&inputs);
    let sync_handler = move |request: TypedRequest<Pod>| {
        let Some(pod) = request.object.as_ref() else {
            return Mutation::Allow;
        };
        let (options, sc, binding) = &*sync_inputs;
        let namespace = request.namespace.clone().unwrap_or_default();
        Mutation::Mutated(join(pod, &namespace, options, sc, binding))
    };
    let async_handler = move |request: TypedRequest<Pod>| {
        let inputs = std::sync::Arc::clone(&inputs);
        async move {
            let Some(pod) = request.object.as_ref() else {
                return Mutation::Allow;
            };
            let (options, sc, binding) = &*inputs;
            let namespace = request.namespace.clone().unwrap_or_default();
            Mutation::Mutated(join(pod, &namespace, options, sc, binding))
        }
    };
    // The server configuration `webhook serve` runs with (a review of this size is answered
    // on the async worker); the synchronous route runs on the blocking pool whatever it is.
    let config = || warmcache_webhook::serve::server_config(std::path::Path::new("/unused"));
    let served_router = AdmissionServer::new(config())
        .route(Route::mutating_typed_async::<Pod, _, _, _>(
            WEBHOOK_PATH,
            async_handler,
        ))
        .router()
        .unwrap();
    let sync_router = AdmissionServer::new(config())
        .route(Route::mutating_typed::<Pod, _, _>(
            WEBHOOK_PATH,
            sync_handler,
        ))
        .router()
        .unwrap();
    // The served route answering a ReplicaSet's later pods: the handler offers its answer for
    // reuse as `webhook serve` does (the check: the cached objects the admission read looked
    // up again and compared, and the window; per reuse: the admission's span, its trace
    // context and its metrics), so every review after the first is answered from it.
    let reuse_inputs = std::sync::Arc::clone(&inputs_for_reuse);
    let reusing_handler = move |request: TypedRequest<Pod>| {
        let inputs = std::sync::Arc::clone(&reuse_inputs);
        async move {
            let Some(pod) = request.object.as_ref() else {
                return Reply::new(Mutation::Allow);
            };
            let (options, sc, binding, check) = &*inputs;
            let namespace = request.namespace.clone().unwrap_or_default();
            Reply::new(Mutation::Mutated(join(
                pod, &namespace, options, sc, binding,
            )))
            .reusable(Reusable::new(std::sync::Arc::clone(check) as _, Vec::new()))
        }
    };
    let reusing_router = AdmissionServer::new(config())
        .route(Route::mutating_typed_async::<Pod, _, _, _>(
            WEBHOOK_PATH,
            reusing_handler,
        ))
        .router()
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let admit_with = |router: &axum::Router| {
        let request = http::Request::post(WEBHOOK_PATH)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body.clone()))
            .unwrap();
        runtime.block_on(async {
            let response = router.clone().oneshot(request).await.unwrap();
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            black_box(bytes)
        })
    };
    let admit_once = || admit_with(&served_router);

    let sync_answer: Value = serde_json::from_slice(&admit_with(&sync_router)).unwrap();
    let answer: Value = serde_json::from_slice(&admit_once()).unwrap();
    assert!(!answer["response"]["patch"].is_null(), "{answer}");
    assert_eq!(answer, sync_answer);

    // `WEBHOOK_BENCH_PROFILE=<seconds>`: only the served route, for that long (for `perf`).
    if let Some(seconds) = std::env::var("WEBHOOK_BENCH_PROFILE")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        let until = Instant::now() + Duration::from_secs(seconds);
        let mut n = 0u64;
        while Instant::now() < until {
            admit_once();
            n += 1;
        }
        println!("profiled {n} admissions of the served route");
        return;
    }
    let budget = Duration::from_secs(2);
    let floor = per_call(budget, || {
        let v: Value = serde_json::from_slice(black_box(&body)).unwrap();
        black_box(serde_json::to_vec(&v).unwrap());
    });
    let typed_floor = per_call(budget, || {
        let v: kube::core::admission::AdmissionReview<Pod> =
            serde_json::from_slice(black_box(&body)).unwrap();
        black_box(serde_json::to_vec(&v).unwrap());
    });
    // The parts, for reading the whole: the pure rewrite of the decoded pod, and the JSON
    // patch from the object as sent to the rewritten pod.
    let rewrite = |pod: &Pod| {
        join(
            pod,
            NAMESPACE,
            &options_for_parts,
            &sc_for_parts,
            &binding_for_parts,
        )
    };
    let pure = per_call(budget, || {
        black_box(rewrite(black_box(&pod)));
    });
    let rewritten = rewrite(&pod);
    let patch = per_call(budget, || {
        black_box(
            warmcache_admission::patch::raw_patch(black_box(&pod_value), &rewritten).unwrap(),
        );
    });
    // The patch typed Pod routes send: written directly for the rewrite's change.
    assert!(warmcache_admission::patch::pod_patch(&pod_value, &pod, &rewritten).is_some());
    let direct_patch = per_call(budget, || {
        black_box(
            warmcache_admission::patch::pod_patch(black_box(&pod_value), &pod, &rewritten).unwrap(),
        );
    });
    let whole = per_call(budget, || {
        admit_once();
    });
    let whole_sync = per_call(budget, || {
        admit_with(&sync_router);
    });
    let reused = per_call(budget, || {
        admit_with(&reusing_router);
    });
    // The framework's share of the whole: the same served route with a handler that does no
    // rewrite, answering `Allow`, or returning a copy of the rewritten pod made beforehand (the
    // typed decode, the patch and the answer of a rewrite, without the rewrite itself).
    let fixed_answer = std::sync::Arc::new(rewritten.clone());
    let framework_router = |rewritten: bool| {
        let fixed_answer = std::sync::Arc::clone(&fixed_answer);
        AdmissionServer::new(config())
            .route(Route::mutating_typed_async::<Pod, _, _, _>(
                WEBHOOK_PATH,
                move |_: TypedRequest<Pod>| {
                    let answer = rewritten.then(|| (*fixed_answer).clone());
                    async move { answer.map_or(Mutation::Allow, Mutation::Mutated) }
                },
            ))
            .router()
            .unwrap()
    };
    let (allowing_router, fixed_router) = (framework_router(false), framework_router(true));
    let fixed_patch: Value = serde_json::from_slice(&admit_with(&fixed_router)).unwrap();
    assert_eq!(
        fixed_patch["response"]["patch"],
        answer["response"]["patch"]
    );
    let allowing = per_call(budget, || {
        admit_with(&allowing_router);
    });
    let fixed = per_call(budget, || {
        admit_with(&fixed_router);
    });

    let reused_answer: Value = serde_json::from_slice(&admit_with(&reusing_router)).unwrap();
    assert_eq!(
        reused_answer["response"]["patch"],
        answer["response"]["patch"]
    );
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "in process, review of {} bytes: serde_json decode+encode {:.1} us (as AdmissionReview<Pod>: {:.1} us); whole admission (the served async route) {:.1} us; ratio {:.2}x to the plain floor, {:.2}x to the typed one (target <= 3x)",
        body.len(),
        us(floor),
        us(typed_floor),
        us(whole),
        whole.as_secs_f64() / floor.as_secs_f64(),
        whole.as_secs_f64() / typed_floor.as_secs_f64(),
    );
    println!(
        "  the synchronous typed route: whole admission {:.1} us; ratio {:.2}x to the plain floor",
        us(whole_sync),
        whole_sync.as_secs_f64() / floor.as_secs_f64(),
    );
    println!(
        "  a later pod of the same ReplicaSet, answered from the kept answer: {:.1} us; ratio {:.2}x to the plain floor (target <= 3x)",
        us(reused),
        reused.as_secs_f64() / floor.as_secs_f64(),
    );
    println!(
        "  the framework's share: a handler that allows {:.1} us ({:.2}x); one that returns a rewritten pod made beforehand (typed decode, patch and answer, no rewrite) {:.1} us ({:.2}x)",
        us(allowing),
        allowing.as_secs_f64() / floor.as_secs_f64(),
        us(fixed),
        fixed.as_secs_f64() / floor.as_secs_f64(),
    );
    println!(
        "  parts: the pure rewrite {:.1} us; the JSON patch from the object as sent {:.1} us by the general path (raw_patch, decoding the object again), {:.1} us written directly (pod_patch, as the route does)",
        us(pure),
        us(patch),
        us(direct_patch)
    );
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

/// Open loop: `rate` reviews per second for `length` over `connections` connections, each
/// review's latency counted from its scheduled time.
async fn open_loop(
    served: &Served,
    body: &[u8],
    rate: u32,
    length: Duration,
    connections: u32,
) -> Vec<Duration> {
    let total = (rate as f64 * length.as_secs_f64()) as u32;
    let interval = Duration::from_secs(1) / rate;
    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..connections {
        let mut https = HttpsClient::connect(served.listen, &served.ca_pem)
            .await
            .unwrap();
        let body = body.to_vec();
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            let mut k = c;
            while k < total {
                let scheduled = start + interval * k;
                tokio::time::sleep_until(scheduled).await;
                let reply = https.post_json(WEBHOOK_PATH, body.clone()).await.unwrap();
                assert_eq!(reply.status, 200);
                latencies.push(scheduled.elapsed());
                k += connections;
            }
            latencies
        });
    }
    let mut all = Vec::new();
    while let Some(done) = tasks.join_next().await {
        all.extend(done.unwrap());
    }
    all.sort();
    all
}

/// Closed loop: the most reviews per second `connections` connections get in `length`.
async fn closed_loop(served: &Served, body: &[u8], length: Duration, connections: u32) -> f64 {
    let deadline = Instant::now() + length;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let mut https = HttpsClient::connect(served.listen, &served.ca_pem)
            .await
            .unwrap();
        let body = body.to_vec();
        tasks.spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                let reply = https.post_json(WEBHOOK_PATH, body.clone()).await.unwrap();
                assert_eq!(reply.status, 200);
                n += 1;
            }
            n
        });
    }
    let mut n = 0;
    while let Some(done) = tasks.join_next().await {
        n += done.unwrap();
    }
    n as f64 / length.as_secs_f64()
}

fn over_https() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = client().await;
        let served = Served::start(&client).await;
        let ns = served.namespace(&client, "bench", &[]).await;
        // The model's first pod creates the binding; then wait until the webhook's cache has it
        // (a dry-run pod comes back with its UID).
        let gpu: Pod = serde_json::from_value(vllm_pod(true)).unwrap();
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let first = pods.create(&PostParams::default(), &gpu).await.unwrap();
        assert!(first.annotations().contains_key(BINDING_UID_ANNOTATION));
        warmcache_testkit::eventually("the binding in the webhook's cache", Duration::from_secs(30), || {
            let pods = pods.clone();
            let gpu = gpu.clone();
            async move {
                let pod = pods.create(&dry_run(), &gpu).await.ok()?;
                pod.annotations().contains_key(BINDING_UID_ANNOTATION).then_some(())
            }
        })
        .await
        .unwrap();
        let rewritten = review(&vllm_pod(true), &ns);
        let left_alone = review(&vllm_pod(false), &ns);
        let mut https = HttpsClient::connect(served.listen, &served.ca_pem)
            .await
            .unwrap();
        let answer = https
            .post_json(WEBHOOK_PATH, rewritten.clone())
            .await
            .unwrap()
            .json()
            .unwrap();
        assert!(!answer["response"]["patch"].is_null(), "{answer}");

        let length = Duration::from_secs(5);
        let floor = closed_loop(&served, &left_alone, length, 4).await;
        let whole = closed_loop(&served, &rewritten, length, 4).await;
        println!(
            "over HTTPS, 4 connections: a pod left alone {floor:.0} reviews/s; a pod rewritten {whole:.0} reviews/s; ratio {:.2}x",
            floor / whole
        );
        let latencies = open_loop(&served, &rewritten, 500, Duration::from_secs(10), 8).await;
        println!(
            "over HTTPS at 500 reviews/s for 10 s ({} reviews, 8 connections): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (target p99 < 5 ms)",
            latencies.len(),
            percentile(&latencies, 0.50).as_secs_f64() * 1e3,
            percentile(&latencies, 0.99).as_secs_f64() * 1e3,
            latencies.last().unwrap().as_secs_f64() * 1e3,
        );
        served.stop(&client).await;
    });
}

/// `WEBHOOK_BENCH=in-process` or `=https` runs one part (for profiling); both by default.
fn main() {
    let part = std::env::var("WEBHOOK_BENCH").unwrap_or_default();
    if part != "https" {
        in_process();
    }
    if part != "in-process" {
        over_https();
    }
}
