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
//! without).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use warmcache_e2e::{
    APP_SELECTOR, Install, NAMESPACE, READY_TIMEOUT, REPO, example_deployment, install, model,
    ready_pods, webhook_serving,
};
use warmcache_test_sources::hub::{Hub, HubOptions};
use warmcache_testkit::{
    ControlPlane, PodNetwork, RealNode, TestNamespace, built_binaries_dir, eventually,
    namespace_report,
};

const IMAGE_REPOSITORY: &str = "warmcache.test/warmcache";
const IMAGE_TAG: &str = "e2e-ttr";
const HF_IMAGE: &str = "warmcache.test/hf-client:1";
const OPT_OUT: &str = "nvca.nvcf.nvidia.io/model-cache-opt-out";
/// The model's weights, and the link: 8 MiB at 8 MiB/s, one second per download alone.
const WEIGHTS: u64 = 8 << 20;
const LINK: u64 = 8 << 20;
const REPLICAS: [i32; 3] = [1, 4, 16];

/// A fresh namespace, opted out of warmcache from its creation when `opted_out`.
async fn fresh_namespace(prefix: &str, opted_out: bool) -> String {
    let labels: &[(&str, &str)] = if opted_out { &[(OPT_OUT, "true")] } else { &[] };
    TestNamespace::with_labels(prefix, labels)
        .await
        .unwrap()
        .name
}

/// Deploys `replicas` of the workload in `namespace` and returns the time until all are Ready
/// and the bytes the Hub served meanwhile; then deletes the Deployment and waits for its pods
/// to go (the node's GPUs are reused by the next run).
async fn run(
    client: &Client,
    hub: &Hub,
    workload: &Deployment,
    namespace: &str,
    replicas: i32,
    net: &PodNetwork,
) -> (Duration, u64) {
    let before = hub.stats().bytes_by_repo.get(REPO).copied().unwrap_or(0);
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
            net.report()
        );
    }
    let served = hub.stats().bytes_by_repo.get(REPO).copied().unwrap_or(0) - before;
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
    let plane = ControlPlane::shared().await.unwrap();
    let node = RealNode::shared().await.unwrap();
    let client = plane.client().await.unwrap();

    let hub = Hub::new(HubOptions {
        rate_limit: Some(LINK),
    });
    let files = model(WEIGHTS);
    let model_bytes: u64 = files.iter().map(|f| f.content.len()).sum();
    hub.publish(REPO, files).unwrap();
    let hub_addr = hub.serve_loopback().await.unwrap();
    let workload = example_deployment(&format!("http://{hub_addr}"), HF_IMAGE).unwrap();
    let net = PodNetwork::on_node(plane, node, &[hub_addr]).await.unwrap();

    let work = tempfile::tempdir().unwrap();
    let how = Install {
        image_repository: IMAGE_REPOSITORY,
        image_tag: IMAGE_TAG,
        bin_dir: &built_binaries_dir().unwrap(),
        hf_image: HF_IMAGE,
        gpus: 16,
        kubeconfig: plane.kubeconfig_path(),
        work_dir: work.path(),
        otel_endpoint: None,
        extra_sets: &[],
    };
    if let Err(e) = install(plane, node, &net, &how).await {
        panic!("{e}");
    }
    let probe = fresh_namespace("ttr-probe", false).await;
    if let Err(e) = webhook_serving(&client, &probe, &workload).await {
        panic!("{e}\n{}", namespace_report(&client, NAMESPACE).await);
    }

    let mut rows = Vec::new();
    for replicas in REPLICAS {
        let with = fresh_namespace(&format!("ttr-with-{replicas}"), false).await;
        let (with_time, with_bytes) = run(&client, &hub, &workload, &with, replicas, &net).await;
        let alone = fresh_namespace(&format!("ttr-alone-{replicas}"), true).await;
        let (alone_time, alone_bytes) = run(&client, &hub, &workload, &alone, replicas, &net).await;
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
}
