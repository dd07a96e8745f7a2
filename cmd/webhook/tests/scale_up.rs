//! A cache-miss scale-up as it reaches the webhook in a cluster (issue: bounded work under
//! bursts), on the real API server: ten Deployments of one uncached model, in ten namespaces of
//! one sharing domain, created at once with 50 replicas each, so kube-controller-manager's
//! ReplicaSet controller creates the 500 pods (in its slow-start batches, at its own client rate)
//! while the `webhook serve` process admits them. The first admission of the model creates the
//! binding; every other pod joins it: 500 pods, one binding, not one pod left on its own download.
//! The all-at-once burst of `burst.rs` (500 pod creates issued by one client in the same instant)
//! is the harsher case; what it gives is in docs/benchmarks.md.
//!
//! Its own test binary: the scale-up loads the API server, nothing else should share it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use warmcache_api_modelcache::SHARING_DOMAIN_LABEL;
use warmcache_testkit::eventually;

const REPLICAS: usize = 50;
const NAMESPACES: usize = 10;

/// A Deployment of `REPLICAS` engine pods (vLLM downloading its model by itself).
fn deployment() -> Deployment {
    let template = engine_pod("ignored");
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "qwen"},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": {"app": "qwen"}},
            "template": {
                "metadata": {"labels": {"app": "qwen"}},
                "spec": template.spec,
            },
        },
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_up_of_500_replicas_reads_one_binding() {
    let client = client().await;
    let served = Served::start(&client).await;
    let domain = unique("scaleup");
    let mut namespaces = Vec::new();
    for _ in 0..NAMESPACES {
        namespaces.push(
            served
                .namespace(&client, "pw-up", &[(SHARING_DOMAIN_LABEL, domain.as_str())])
                .await,
        );
    }
    let started = Instant::now();
    let mut creates = tokio::task::JoinSet::new();
    for ns in &namespaces {
        let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
        creates.spawn(async move { api.create(&PostParams::default(), &deployment()).await });
    }
    while let Some(done) = creates.join_next().await {
        done.unwrap().unwrap();
    }

    let total = NAMESPACES * REPLICAS;
    let all = eventually("every replica created", Duration::from_secs(300), || {
        let (client, namespaces) = (client.clone(), namespaces.clone());
        async move {
            let mut pods = Vec::new();
            for ns in &namespaces {
                pods.extend(
                    Api::<Pod>::namespaced(client.clone(), ns)
                        .list(&ListParams::default())
                        .await
                        .ok()?
                        .items,
                );
            }
            (pods.len() == total).then_some(pods)
        }
    })
    .await
    .unwrap();
    let created_after = started.elapsed();

    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    let mut names = BTreeMap::<String, usize>::new();
    for pod in &all {
        let a = pod.metadata.annotations.clone().unwrap_or_default();
        match (
            a.get(warmcache_modelvolume::keys::BINDING_ANNOTATION),
            a.get(warmcache_modelvolume::keys::SKIP_REASON_ANNOTATION),
        ) {
            (Some(name), _) => {
                *names.entry(name.clone()).or_default() += 1;
                *outcomes.entry("rewritten".into()).or_default() += 1;
            }
            (None, Some(reason)) => *outcomes.entry(reason.clone()).or_default() += 1,
            (None, None) => *outcomes.entry("untouched".into()).or_default() += 1,
        }
    }
    println!(
        "scale-up of {NAMESPACES} Deployments x {REPLICAS} replicas of one uncached model: {total} pods created by the ReplicaSet controller in {:.1} s: {outcomes:?}",
        created_after.as_secs_f64()
    );
    // Every replica reads the shared copy. On an overloaded machine the API server may stop
    // waiting for the webhook (its timeoutSeconds) and admit a pod unchanged (failurePolicy
    // Ignore): tolerated for a few, never a pod the webhook left on its own download.
    let rewritten = outcomes.get("rewritten").copied().unwrap_or(0);
    let untouched = outcomes.get("untouched").copied().unwrap_or(0);
    assert!(
        rewritten + untouched == total && untouched <= total / 20,
        "every replica reads the shared copy: {outcomes:?}\n{}",
        served
            .log()
            .lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(names.len(), 1, "one binding for the domain: {names:?}");
    let bindings = served
        .bindings(&client)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(bindings.items.len(), 1);
    let creates: f64 = served
        .metrics()
        .await
        .lines()
        .filter(|l| {
            l.starts_with("warmcache_webhook_api_requests_total{")
                && l.contains("verb=\"create\"")
                && l.contains("resource=\"modelcachebindings\"")
        })
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum();
    assert!(
        (1.0..=2.0).contains(&creates),
        "{creates} binding creates for {total} pods"
    );
}
