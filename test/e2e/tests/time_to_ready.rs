//! Time to all-Ready, with and without warmcache, measured side by side in one run on the real
//! node (a benchmark printed for docs/benchmarks.md; the times are never asserted).
//!
//! The chart installed as in `download_once.rs`; the simulated Hub rate-limited to play a WAN
//! link (one link shared by every download, as a cluster's egress is). For 1, 4 and 16 replicas
//! of the unmodified example Deployment: once in a fresh namespace the webhook serves (a cache
//! miss: one download, the other replicas wait for it and read the copy), once in a namespace
//! that opted out (`nvca.nvcf.nvidia.io/model-cache-opt-out=true`: every replica downloads on
//! its own, as without warmcache). What is asserted is what the numbers rest on: every replica
//! Ready, and the bytes the Hub served for each run (one model with warmcache, one per replica
//! without). It needs the simulated Hub (the link, the counts): with `E2E_KUBECONFIG` it fails at
//! start, saying so.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use warmcache_e2e::{
    APP_SELECTOR, READY_TIMEOUT, Scenario, Started, model, ready_pods, webhook_serving,
};
use warmcache_test_sources::hub::HubOptions;
use warmcache_testkit::{eventually, namespace_report};

const OPT_OUT: &str = "nvca.nvcf.nvidia.io/model-cache-opt-out";
/// The model's weights, and the link: 8 MiB at 8 MiB/s, one second per download alone.
const WEIGHTS: u64 = 8 << 20;
const LINK: u64 = 8 << 20;
const REPLICAS: [i32; 3] = [1, 4, 16];

/// A fresh namespace, opted out of warmcache from its creation when `opted_out`.
async fn fresh_namespace(run: &Started, prefix: &str, opted_out: bool) -> String {
    let labels: &[(&str, &str)] = if opted_out { &[(OPT_OUT, "true")] } else { &[] };
    run.namespace(prefix, labels).await.unwrap().name
}

/// Deploys `replicas` of the workload in `namespace` and returns the time until all are Ready
/// and the bytes the Hub served meanwhile; then deletes the Deployment and waits for its pods
/// to go (the node's GPUs are reused by the next run).
async fn run(
    scenario: &Started,
    workload: &Deployment,
    namespace: &str,
    replicas: i32,
) -> (Duration, u64) {
    let client = &scenario.client;
    let before = scenario.served().unwrap();
    let mut deployment = workload.clone();
    deployment.spec.replicas = Some(replicas);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let started = Instant::now();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let names = [namespace.to_owned()];
    let ready = eventually("every replica Ready", READY_TIMEOUT, || {
        let (client, names) = (client.clone(), names.clone());
        async move { (ready_pods(&client, &names).await? == replicas as usize).then_some(()) }
    })
    .await;
    let elapsed = started.elapsed();
    if ready.is_err() {
        panic!(
            "{replicas} replicas in {namespace} never all became Ready\n{}{}",
            namespace_report(client, namespace).await,
            scenario.net().map(|n| n.report()).unwrap_or_default()
        );
    }
    let served = scenario.served().unwrap() - before;
    // Scaled to zero (the ReplicaSet deletes its pods), then deleted.
    deployments
        .patch(
            &deployment.name_any(),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();
    // The replicas only: the writer Job's pod stays, Succeeded.
    eventually("the replicas gone", READY_TIMEOUT, || {
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), namespace);
        async move {
            pods.list(&ListParams::default().labels(APP_SELECTOR))
                .await
                .ok()?
                .items
                .is_empty()
                .then_some(())
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the replicas in {namespace} never went"));
    deployments
        .delete(&deployment.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    (elapsed, served)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_to_all_ready_with_and_without_warmcache_on_a_rate_limited_link() {
    let scenario = Scenario::new("time_to_ready")
        .simulated_hub(
            HubOptions {
                rate_limit: Some(LINK),
            },
            "the Hub plays a rate-limited WAN link, and its byte counts are the measurement",
        )
        .model(model(WEIGHTS))
        .image_tag("e2e-ttr")
        .gpus(16)
        .start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = scenario.client.clone();
    let model_bytes = scenario.model_bytes().unwrap();
    let workload = scenario.workload().unwrap();
    let probe = fresh_namespace(&scenario, "ttr-probe", false).await;
    if let Err(e) = webhook_serving(&client, &probe, &workload).await {
        panic!(
            "{e}\n{}",
            namespace_report(&client, &scenario.release_namespace).await
        );
    }

    let mut rows = Vec::new();
    for replicas in REPLICAS {
        let with = fresh_namespace(&scenario, &format!("ttr-with-{replicas}"), false).await;
        let (with_time, with_bytes) = run(&scenario, &workload, &with, replicas).await;
        let alone = fresh_namespace(&scenario, &format!("ttr-alone-{replicas}"), true).await;
        let (alone_time, alone_bytes) = run(&scenario, &workload, &alone, replicas).await;
        assert_eq!(
            with_bytes, model_bytes,
            "{replicas} replicas with warmcache: one download"
        );
        assert_eq!(
            alone_bytes,
            replicas as u64 * model_bytes,
            "{replicas} replicas without: one download each"
        );
        rows.push((replicas, with_time, alone_time, with_bytes, alone_bytes));
    }
    println!(
        "time to all-Ready, a {:.1} MiB model over a {:.0} MiB/s link shared by every download:",
        model_bytes as f64 / f64::from(1 << 20),
        LINK as f64 / f64::from(1 << 20)
    );
    println!(
        "| replicas | with warmcache | without | ratio (without / with) | Hub bytes with | without |"
    );
    println!("|---|---|---|---|---|---|");
    for (replicas, with_time, alone_time, with_bytes, alone_bytes) in rows {
        println!(
            "| {replicas} | {:.1} s | {:.1} s | {:.2}x | {with_bytes} | {alone_bytes} |",
            with_time.as_secs_f64(),
            alone_time.as_secs_f64(),
            alone_time.as_secs_f64() / with_time.as_secs_f64()
        );
    }
    scenario.finish().await;
}
