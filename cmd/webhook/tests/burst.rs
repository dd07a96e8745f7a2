//! A cache-miss burst (issue: bounded work under bursts), on the real API server: 500 pods of
//! one uncached model created at once across ten namespaces of one sharing domain, with the
//! `webhook serve` process and the binding controller (in process, as its ServiceAccount)
//! running. Both count what they ask of the API server on the client side
//! (`api_requests_total{verb, resource}`); the test asserts the burst gives one binding (created
//! even when every admission waiting for its create gave up) and one primary claim, that every
//! pod either reads that binding or keeps its own download (`binding-unavailable`), that the
//! webhook's binding creates are collapsed, that the binding controller's status writes are
//! batched (fewer writes than pods), and prints requests per admitted pod and the admission
//! latencies against the same burst in namespaces the webhook is not called for (warmcache
//! disabled). Figures in docs/benchmarks.md; the numbers are printed, never asserted as times.
//!
//! Its own test binary: the burst loads the API server, nothing else should share it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use warmcache_api_modelcache::SHARING_DOMAIN_LABEL;
use warmcache_binding_controller::controller::{Settings, start};
use warmcache_runtime::{LogFormat, Runtime, RuntimeArgs};
use warmcache_testkit::{ComponentAccount, ControlPlane, eventually};

const PODS: usize = 500;
const NAMESPACES: usize = 10;

/// `api_requests_total` of a scrape, summed by verb and resource.
fn requests(metrics: &str, prefix: &str) -> BTreeMap<(String, String), f64> {
    let name = format!("{prefix}_api_requests_total{{");
    let mut out = BTreeMap::new();
    for line in metrics.lines().filter(|l| l.starts_with(&name)) {
        let (labels, value) = line[name.len()..].split_once("} ").unwrap();
        let label = |key: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{key}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        *out.entry((label("verb"), label("resource"))).or_default() +=
            value.parse::<f64>().unwrap();
    }
    out
}

fn delta(
    after: &BTreeMap<(String, String), f64>,
    before: &BTreeMap<(String, String), f64>,
) -> BTreeMap<(String, String), f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

fn total(m: &BTreeMap<(String, String), f64>) -> f64 {
    m.values().sum()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// Creates every pod at once; each create's latency, sorted.
async fn burst(client: &Client, pods: Vec<(String, Pod)>) -> Vec<Duration> {
    let mut tasks = tokio::task::JoinSet::new();
    for (namespace, pod) in pods {
        let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        tasks.spawn(async move {
            let started = Instant::now();
            api.create(&PostParams::default(), &pod)
                .await
                .expect("pod creation is never blocked");
            started.elapsed()
        });
    }
    let mut latencies = Vec::new();
    while let Some(done) = tasks.join_next().await {
        latencies.push(done.unwrap());
    }
    latencies.sort();
    latencies
}

fn pods_in(namespaces: &[String]) -> Vec<(String, Pod)> {
    namespaces
        .iter()
        .flat_map(|ns| {
            (0..PODS / namespaces.len())
                .map(move |i| (ns.clone(), engine_pod(&format!("qwen-{i}"))))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_miss_burst_of_500_pods_makes_one_binding_and_batched_status_writes() {
    let plane = ControlPlane::shared().await.unwrap();
    let client = client().await;
    let served = Served::start(&client).await;

    // The binding controller on the webhook's control namespace, as the chart's
    // ServiceAccount, counting its requests like the webhook.
    let home = namespace(&client, "pw-bc", &[]).await;
    let account =
        ComponentAccount::create(plane, &client, "binding-controller", &home, &served.control)
            .await
            .unwrap();
    let args = RuntimeArgs {
        kubeconfig: Some(account.kubeconfig_path().to_path_buf()),
        kube_context: None,
        log_level: None,
        log_format: LogFormat::Plain,
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        shutdown_grace: Duration::from_secs(5),
        shutdown_delay: Duration::ZERO,
        kube_api_qps: warmcache_runtime::DEFAULT_KUBE_API_QPS,
        kube_api_burst: warmcache_runtime::DEFAULT_KUBE_API_BURST,
    };
    let mut runtime = Runtime::builder("binding-controller", args)
        .without_global_telemetry()
        .with_client()
        .build()
        .await
        .unwrap();
    start(
        &mut runtime,
        &Settings {
            control_namespace: served.control.clone(),
            concurrency: 2,
            catalog_namespace: None,
            gates: warmcache_catalog::Gates::DEFAULT,
            lifecycle: warmcache_modelvolume::LifecycleConfig::default(),
        },
    )
    .unwrap();
    let controller_admin = runtime.admin_addr();
    let stop = runtime.shutdown_token();
    let running = tokio::spawn(async move { runtime.run().await });
    let controller_metrics =
        || async move { http_get(controller_admin, "/metrics").await.unwrap().1 };
    eventually("the binding controller ready", TIMEOUT, || async move {
        matches!(http_get(controller_admin, "/readyz").await, Some((200, _))).then_some(())
    })
    .await
    .unwrap();

    // Baseline: the same burst where the webhook is not called (warmcache disabled for them).
    let mut plain = Vec::new();
    for _ in 0..NAMESPACES {
        plain.push(namespace(&client, "pw-base", &[]).await);
    }
    let baseline = burst(&client, pods_in(&plain)).await;

    // The burst: one uncached model, ten namespaces of one sharing domain.
    let domain = unique("burst");
    let mut namespaces = Vec::new();
    for _ in 0..NAMESPACES {
        namespaces.push(
            served
                .namespace(
                    &client,
                    "pw-burst",
                    &[(SHARING_DOMAIN_LABEL, domain.as_str())],
                )
                .await,
        );
    }
    let webhook_before = requests(&served.metrics().await, "warmcache_webhook");
    let controller_before = requests(&controller_metrics().await, "warmcache_binding_controller");
    let started = Instant::now();
    let latencies = burst(&client, pods_in(&namespaces)).await;
    let admitted = started.elapsed();

    // What each pod was admitted as: reading the binding, or on its own download (the
    // admissions that gave up waiting for the binding's create).
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for ns in &namespaces {
        for pod in Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap()
        {
            let a = pod.metadata.annotations.unwrap_or_default();
            let outcome = a
                .get(warmcache_modelvolume::keys::SKIP_REASON_ANNOTATION)
                .cloned()
                .or_else(|| {
                    a.contains_key(warmcache_modelvolume::keys::BINDING_ANNOTATION)
                        .then(|| "rewritten".to_owned())
                })
                .unwrap_or_else(|| "untouched".to_owned());
            *outcomes.entry(outcome).or_default() += 1;
        }
    }
    let rewritten = outcomes.get("rewritten").copied().unwrap_or(0);
    assert_eq!(outcomes.values().sum::<usize>(), PODS, "{outcomes:?}");
    // `untouched`: the API server stopped waiting for the webhook (its timeoutSeconds) and,
    // with failurePolicy Ignore, admitted the pod as it was: loaded, the admission never
    // blocks pod creation.
    assert!(
        outcomes
            .keys()
            .all(|k| k == "rewritten" || k == "binding-unavailable" || k == "untouched"),
        "{outcomes:?}"
    );

    // One binding, whatever the burst did to its create, every rewritten pod referenced by it.
    let bindings = served.bindings(&client);
    let settled = eventually(
        "every rewritten pod referenced by the binding",
        TIMEOUT * 3,
        || {
            let bindings = bindings.clone();
            async move {
                let list = bindings.list(&ListParams::default()).await.ok()?;
                let [b] = list.items.as_slice() else {
                    return None;
                };
                let count = b
                    .status
                    .as_ref()
                    .and_then(|s| s.request_reference_count)
                    .unwrap_or(0);
                (count == rewritten as i64).then(|| b.clone())
            }
        },
    )
    .await;
    let binding = match settled {
        Ok(b) => b,
        Err(_) => {
            let statuses: Vec<_> = bindings
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .map(|b| b.status)
                .collect();
            panic!(
                "the binding never counted the {rewritten} rewritten pods: {statuses:?}; pods: {outcomes:?}\n{}",
                served
                    .log()
                    .lines()
                    .rev()
                    .take(30)
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        }
    };
    let settled_after = started.elapsed();
    // One download's storage: the primary claim. (No provisioner binds it on this plane, so
    // the writer Job that follows is not reached here; the real-node e2e test counts one Job
    // per sharing domain.) And no Job yet in any namespace, so none twice.
    let claims = eventually("the primary claim", TIMEOUT, || {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &served.control);
        async move {
            let list = claims.list(&ListParams::default()).await.ok()?;
            (!list.items.is_empty()).then_some(list.items)
        }
    })
    .await
    .unwrap();
    assert_eq!(claims.len(), 1, "one primary claim for {PODS} pods");
    let mut jobs = 0;
    for ns in &namespaces {
        jobs += Api::<Job>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len();
    }
    assert!(jobs <= 1, "{jobs} writer Jobs");
    assert!(namespaces.contains(&binding.spec.resources.writer_namespace));

    // What it cost the API server, on the client side.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let webhook = delta(
        &requests(&served.metrics().await, "warmcache_webhook"),
        &webhook_before,
    );
    let controller = delta(
        &requests(&controller_metrics().await, "warmcache_binding_controller"),
        &controller_before,
    );
    let get = |m: &BTreeMap<(String, String), f64>, verb: &str, resource: &str| {
        m.get(&(verb.to_owned(), resource.to_owned()))
            .copied()
            .unwrap_or(0.0)
    };
    // The webhook reads from its caches and writes only on the miss: its binding creates are
    // the concurrent misses of one replica collapsed into one call (and those between that
    // call's end and the watch delivering the binding).
    let creates = get(&webhook, "create", "modelcachebindings");
    assert!(creates >= 1.0, "{webhook:?}");
    assert!(
        creates < (PODS / 5) as f64,
        "{creates} binding creates for {PODS} pods: {webhook:?}"
    );
    let status_writes = get(&controller, "patch", "modelcachebindings/status")
        + get(&controller, "update", "modelcachebindings/status");
    assert!(status_writes >= 1.0, "{controller:?}");
    assert!(
        status_writes < PODS as f64,
        "reference updates are batched: {status_writes} status writes for {PODS} pods: {controller:?}"
    );

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "burst of {PODS} pods of one uncached model in {NAMESPACES} namespaces of one domain: admitted in {:.1} s ({outcomes:?}), every rewritten pod referenced after {:.1} s",
        admitted.as_secs_f64(),
        settled_after.as_secs_f64()
    );
    println!(
        "  API requests per admitted pod (of {PODS}): webhook {:.3} ({} in all: {:?}), binding controller {:.3} ({} in all, {} status writes: {:?})",
        total(&webhook) / PODS as f64,
        total(&webhook),
        webhook,
        total(&controller) / PODS as f64,
        total(&controller),
        status_writes,
        controller
    );
    println!(
        "  pod create latency with warmcache: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; without (same burst, webhook not called): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; p99 ratio {:.2}x",
        ms(percentile(&latencies, 0.50)),
        ms(percentile(&latencies, 0.99)),
        ms(percentile(&latencies, 1.0)),
        ms(percentile(&baseline, 0.50)),
        ms(percentile(&baseline, 0.99)),
        ms(percentile(&baseline, 1.0)),
        percentile(&latencies, 0.99).as_secs_f64() / percentile(&baseline, 0.99).as_secs_f64()
    );

    stop.cancel();
    running.await.unwrap().unwrap();
    drop(account);
    served.stop(&client).await;
}
