//! Download once at scale, on the real node (issue 17 item 7): `E2E_SCALE_PODS` pods (default
//! 200) of the unmodified example Deployment in `E2E_SCALE_NAMESPACES` namespaces (default 20)
//! of one sharing domain, against the same pods in namespaces that opted out of warmcache
//! (`nvca.nvcf.nvidia.io/model-cache-opt-out=true`: every pod runs its own `hf download`, as
//! without warmcache), measured side by side in one run: download Jobs created (target 1), bytes
//! the simulated Hub served (target 1x the model, against one model per pod), and the time until
//! every pod is Ready. The opted-out run goes first and is scaled to zero before the warmcache
//! run, so the node holds one run's pods at a time.
//!
//! ```sh
//! cargo build --bins
//! cargo bench -p warmcache-e2e --bench download_once_at_scale
//! E2E_SCALE_PODS=40 E2E_SCALE_NAMESPACES=4 cargo bench -p warmcache-e2e --bench download_once_at_scale
//! ```
//!
//! Every pod requests CPU (with warmcache at least the 10m of the wait container the webhook
//! injects), so a 2-core node holds about 170 of them beside the components; the run checks
//! the room first and says how many fit rather than leaving pods Pending.
//!
//! The node and Hub are the test kit's (as in `tests/download_once.rs`), the workload the
//! example's with a lower CPU request and a slower readiness probe (see `fit_on_one_node`);
//! the model is small
//! (`E2E_SCALE_MODEL_BYTES`, default 4 MiB of weights) so that the opted-out run's downloads
//! measure the fan-out, not the link. What is asserted is what the numbers rest on: every pod
//! Ready, one binding; the numbers go to docs/benchmarks.md. The Hub's bytes are the
//! measurement: with `E2E_KUBECONFIG` it fails at start, saying so.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use warmcache_e2e::{
    APP_SELECTOR, Scenario, Started, bindings_api, holds_resources, model, pod_request, ready_pods,
    webhook_serving,
};
use warmcache_testkit::{TestNamespace, eventually};

const OPT_OUT: &str = "nvca.nvcf.nvidia.io/model-cache-opt-out";
const DOMAIN_LABEL: &str = "nvca.nvcf.nvidia.io/model-cache-sharing-domain";
const TIMEOUT: Duration = Duration::from_secs(1800);

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|e| panic!("{name}={v}: not a number: {e}")),
        Err(_) => default,
    }
}

/// The example with two changes that only make 200 replicas fit on one 2-core node, so both
/// runs are equal: the engine's CPU request drops from 10m to 1m (200 x 10m is the node's whole
/// allocatable CPU), and its readiness probe (`cat /tmp/ready`, an exec) runs every 5 s instead
/// of every second (200 execs a second alone overload the node's runtime).
fn fit_on_one_node(mut workload: Deployment) -> Deployment {
    let spec = workload.spec.template.spec.as_mut().unwrap();
    for c in &mut spec.containers {
        if let Some(requests) = c.resources.as_mut().and_then(|r| r.requests.as_mut())
            && requests.contains_key("cpu")
        {
            requests.insert(
                "cpu".to_owned(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("1m".to_owned()),
            );
        }
        if let Some(probe) = c.readiness_probe.as_mut() {
            probe.period_seconds = Some(5);
        }
    }
    workload
}

/// One run: its namespaces (created with `labels`), the Deployment in each with its share of
/// `pods`, until every pod is Ready; the time that took.
async fn run(
    scenario: &Started,
    workload: &Deployment,
    prefix: &str,
    labels: &[(&str, &str)],
    namespaces: u64,
    pods: u64,
) -> (Vec<TestNamespace>, Duration) {
    let client = &scenario.client;
    let mut created = Vec::new();
    for _ in 0..namespaces {
        created.push(scenario.namespace(prefix, labels).await.unwrap());
    }
    let names: Vec<String> = created.iter().map(|n| n.name.clone()).collect();
    let started = Instant::now();
    for (i, ns) in created.iter().enumerate() {
        // The pods split as evenly as they go: the first `pods % namespaces` get one more.
        let share = pods / namespaces + u64::from((i as u64) < pods % namespaces);
        let mut deployment = workload.clone();
        deployment.spec.replicas = Some(i32::try_from(share).unwrap());
        ns.api::<Deployment>()
            .create(&PostParams::default(), &deployment)
            .await
            .unwrap();
    }
    let ready = eventually(&format!("{pods} pods Ready ({prefix})"), TIMEOUT, || {
        let (client, names) = (client.clone(), names.clone());
        async move { (ready_pods(&client, &names).await? as u64 == pods).then_some(()) }
    })
    .await;
    if ready.is_err() {
        panic!(
            "not every pod became Ready ({prefix})\n{}",
            scenario.report(&[&names[0]]).await
        );
    }
    (created, started.elapsed())
}

/// Download Jobs in `namespaces`.
async fn jobs(client: &Client, namespaces: &[TestNamespace]) -> usize {
    let mut count = 0;
    for ns in namespaces {
        count += Api::<Job>::namespaced(client.clone(), &ns.name)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len();
    }
    count
}

/// Scales every Deployment of `namespaces` to zero and waits for their pods to be gone.
async fn scale_to_zero(client: &Client, namespaces: &[TestNamespace]) {
    for ns in namespaces {
        ns.api::<Deployment>()
            .patch(
                "llm",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"replicas": 0}})),
            )
            .await
            .unwrap();
    }
    let names: Vec<String> = namespaces.iter().map(|n| n.name.clone()).collect();
    eventually("the opted-out pods gone", TIMEOUT, || {
        let (client, names) = (client.clone(), names.clone());
        async move {
            for ns in &names {
                let left = Api::<Pod>::namespaced(client.clone(), ns)
                    .list(&ListParams::default().labels(APP_SELECTOR))
                    .await
                    .ok()?
                    .items
                    .len();
                if left > 0 {
                    return None;
                }
            }
            Some(())
        }
    })
    .await
    .unwrap();
}

/// CPU millicores of `q` ("2", "1500m", "0.5").
fn millicores(q: &str) -> u64 {
    match q.strip_suffix('m') {
        Some(m) => m.parse().unwrap_or(0),
        None => (q.parse::<f64>().unwrap_or(0.0) * 1000.0) as u64,
    }
}

/// The CPU a pod requests, as the scheduler counts it, in millicores.
fn pod_cpu(spec: &k8s_openapi::api::core::v1::PodSpec) -> u64 {
    pod_request(spec, "cpu", |q| millicores(&q.0))
}

/// Fails at once, saying why, when `pods` pods of `per_pod` millicores cannot all be scheduled
/// on the node beside what already runs there (the scheduler would leave the rest Pending).
async fn check_room(client: &Client, node: &str, pods: u64, per_pod: u64) {
    let allocatable = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get(node)
        .await
        .unwrap()
        .status
        .and_then(|s| s.allocatable)
        .and_then(|a| a.get("cpu").map(|q| millicores(&q.0)))
        .unwrap_or(0);
    let used: u64 = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| holds_resources(p))
        .filter_map(|p| p.spec.as_ref().map(pod_cpu))
        .sum();
    let free = allocatable.saturating_sub(used);
    assert!(
        pods * per_pod <= free,
        "{pods} pods of {per_pod}m CPU each (with warmcache a pod requests its injected wait \
         container's 10m) need {}m, and the node has {free}m of {allocatable}m allocatable free: \
         set E2E_SCALE_PODS to at most {}",
        pods * per_pod,
        free / per_pod.max(1)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let pods = env_u64("E2E_SCALE_PODS", 200).max(1);
    let namespaces = env_u64("E2E_SCALE_NAMESPACES", 20).clamp(1, pods);
    let weights = env_u64("E2E_SCALE_MODEL_BYTES", 4 << 20);
    let scenario = Scenario::new("download_once_at_scale")
        .model(model(weights))
        .needs_simulated_hub("the bytes the Hub served are the measurement")
        .image_tag("e2e-scale")
        .gpus(u32::try_from(pods).unwrap())
        .start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = scenario.client.clone();
    let node = scenario.node().unwrap();
    let model_bytes = scenario.model_bytes().unwrap();
    let workload = fit_on_one_node(scenario.workload().unwrap());
    // With warmcache each pod requests at least its wait container's 10m.
    check_room(
        &client,
        node.name(),
        pods,
        pod_cpu(workload.spec.template.spec.as_ref().unwrap()).max(10),
    )
    .await;
    println!(
        "download once at scale: {pods} pods in {namespaces} namespaces, a model of {model_bytes} bytes"
    );

    // Without warmcache: every pod downloads.
    let before = scenario.served().unwrap();
    let (plain, plain_took) = run(
        &scenario,
        &workload,
        "e2e-scale-off",
        &[(OPT_OUT, "true")],
        namespaces,
        pods,
    )
    .await;
    let plain_bytes = scenario.served().unwrap() - before;
    let plain_jobs = jobs(&client, &plain).await;
    println!(
        "without warmcache: {pods} pods Ready in {:.1} s, the Hub served {plain_bytes} bytes",
        plain_took.as_secs_f64()
    );
    scale_to_zero(&client, &plain).await;

    // With warmcache: one sharing domain over every namespace.
    let domain = format!("scale-{}", std::process::id());
    let first = scenario
        .namespace("e2e-scale-probe", &[(DOMAIN_LABEL, &domain)])
        .await
        .unwrap();
    if let Err(e) = webhook_serving(&client, &first.name, &workload).await {
        panic!("{e}\n{}", scenario.report(&[]).await);
    }
    let before = scenario.served().unwrap();
    let (cached, cached_took) = run(
        &scenario,
        &workload,
        "e2e-scale-on",
        &[(DOMAIN_LABEL, &domain)],
        namespaces,
        pods,
    )
    .await;
    let cached_bytes = scenario.served().unwrap() - before;
    let cached_jobs = jobs(&client, &cached).await;
    let bindings = bindings_api(&client)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    println!(
        "with warmcache: {pods} pods Ready in {:.1} s, the Hub served {cached_bytes} bytes",
        cached_took.as_secs_f64()
    );
    assert_eq!(bindings, 1, "one binding for the sharing domain");

    println!();
    println!("| {pods} pods, {namespaces} namespaces | with warmcache | without | target |");
    println!("|---|---|---|---|");
    println!(
        "| download Jobs | {cached_jobs} | {plain_jobs} (each pod downloads in its init container) | 1 |"
    );
    println!(
        "| bytes the Hub served | {cached_bytes} = {:.2}x the model | {plain_bytes} = {:.2}x | 1x |",
        cached_bytes as f64 / model_bytes as f64,
        plain_bytes as f64 / model_bytes as f64
    );
    println!(
        "| time to all Ready | {:.1} s | {:.1} s | |",
        cached_took.as_secs_f64(),
        plain_took.as_secs_f64()
    );
    scenario.finish().await;
}
