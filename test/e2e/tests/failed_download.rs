//! A failed download, then the retry, end to end, black box: the chart installed with the real
//! Helm CLI on the real test node (failure records kept 20 s), and the
//! example Deployment whose init container runs the real `hf download` against the simulated
//! Hugging Face Hub, before the repository exists there. The one download fails: the binding
//! records the failure with the client's last words, the waiting reader is deleted and comes back
//! on its own download (`download-failed`), which succeeds once the repository is published. When
//! the record has expired and the failed Job is gone (its TTL, at least 5 minutes in the chart,
//! or an operator: here the test deletes it, as `kubectl delete job` would), the next replica
//! joins the binding again, the binding controller retries with a new Job, and the replica reads
//! the copy; the record is cleared.
//!
//! As in `download_once.rs`, the node advertises `nvidia.com/gpu`, the kit's `PodNetwork`
//! bridges the Hub's loopback address into the pods, images are imported, and the storage is the
//! test CSI driver's shared-filesystem profile qualified by a catalog ConfigMap. It needs the
//! simulated Hub: with `E2E_KUBECONFIG` it fails at start, saying so.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use warmcache_e2e::{
    BINDING_ANNOTATION, READY_TIMEOUT, REPO, Scenario, app_pods, bindings_api, is_ready, model,
    webhook_serving,
};
use warmcache_test_sources::hub::HubOptions;
use warmcache_testkit::eventually;

const SKIP_REASON_ANNOTATION: &str = "nvca.nvcf.nvidia.io/model-cache-skip-reason";

async fn status(client: &Client) -> Option<Value> {
    let list = bindings_api(client)
        .list(&ListParams::default())
        .await
        .ok()?;
    let [b] = list.items.as_slice() else {
        return None;
    };
    b.data.get("status").cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_download_is_recorded_then_retried_once_the_record_expires() {
    // The Hub, without the repository yet.
    let run = Scenario::new("failed_download")
        .simulated_hub(
            HubOptions::default(),
            "the repository appears on the Hub only after the first download failed",
        )
        .extra_sets(&["bindingController.failureRecordSeconds=20"])
        .gpus(4)
        .start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = run.client.clone();
    let hub = run.hub().unwrap();

    let mut workload = run.workload().unwrap();
    workload.spec.replicas = Some(1);
    let ns = run.namespace("e2e-fail", &[]).await.unwrap();
    if let Err(e) = webhook_serving(&client, &ns.name, &workload).await {
        panic!("{e}\n{}", run.report(&[]).await);
    }
    let deployments: Api<Deployment> = ns.api();
    deployments
        .create(&PostParams::default(), &workload)
        .await
        .unwrap();

    // 1. The download fails: the record holds the client's last words.
    let failed = eventually("the failure recorded", READY_TIMEOUT, || {
        let client = client.clone();
        async move {
            let s = status(&client).await?;
            s.get("failureRecord").filter(|r| r.is_object()).cloned()
        }
    })
    .await;
    let Ok(record) = failed else {
        panic!(
            "the download's failure was never recorded\n{}",
            run.report(&[&ns.name]).await
        );
    };
    let words = record["message"].as_str().unwrap_or_default().to_owned();
    assert!(
        words.contains("exited") && words.contains(REPO),
        "the record carries the download's last words: {words}"
    );
    let s = status(&client).await.unwrap();
    assert_eq!(s["realized"]["populationState"], "Failed", "{s}");

    // The repository appears; the waiting reader, deleted by the controller, is back on its own
    // download, which now succeeds.
    let files = model(4 << 20);
    let model_bytes: u64 = files.iter().map(|f| f.content.len()).sum();
    hub.publish(REPO, files).unwrap();
    let pods: Api<Pod> = ns.api();
    let own = eventually(
        "the replica Ready on its own download",
        READY_TIMEOUT,
        || {
            let pods = pods.clone();
            async move {
                let list = app_pods(&pods).await?;
                let [p] = list.as_slice() else {
                    return None;
                };
                (is_ready(p)
                    && p.annotations()
                        .get(SKIP_REASON_ANNOTATION)
                        .map(String::as_str)
                        == Some("download-failed"))
                .then(|| p.clone())
            }
        },
    )
    .await;
    let Ok(own) = own else {
        panic!(
            "the replica never became Ready on its own download\n{}",
            run.report(&[&ns.name]).await
        );
    };
    assert!(!own.annotations().contains_key(BINDING_ANNOTATION));
    let served = || run.served().unwrap();
    assert_eq!(served(), model_bytes, "the replica's own download");

    // 2. The record expires (20 s, and admission's 30 s clock margin): a new replica joins the
    // binding again, the controller retries with a new Job, and the replica reads the copy.
    let retry_at = record["retryAfter"].as_str().unwrap().to_owned();
    let retry_at: k8s_openapi::jiff::Timestamp = retry_at.parse().unwrap();
    let wait = retry_at
        .duration_since(k8s_openapi::jiff::Timestamp::now())
        .as_secs_f64()
        .max(0.0)
        + 32.0;
    tokio::time::sleep(std::time::Duration::from_secs_f64(wait)).await;
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = ns.api();
    let failed_jobs = jobs.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(failed_jobs.len(), 1, "one download Job, failed");
    let background = kube::api::DeleteParams::background();
    jobs.delete(&failed_jobs[0].name_any(), &background)
        .await
        .unwrap();
    deployments
        .patch(
            "llm",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    let joined = eventually(
        "the new replica Ready on the retried copy",
        READY_TIMEOUT,
        || {
            let (pods, own) = (pods.clone(), own.name_any());
            async move {
                let list = app_pods(&pods).await?;
                list.into_iter()
                    .find(|p| p.name_any() != own && is_ready(p))
                    .filter(|p| p.annotations().contains_key(BINDING_ANNOTATION))
            }
        },
    )
    .await;
    if joined.is_err() {
        panic!(
            "no replica read the retried copy\n{}",
            run.report(&[&ns.name]).await
        );
    }
    let s = eventually(
        "the binding Ready, its record cleared",
        READY_TIMEOUT,
        || {
            let client = client.clone();
            async move {
                let s = status(&client).await?;
                (s["realized"]["populationState"] == "Ready" && s.get("failureRecord").is_none())
                    .then_some(s)
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        served(),
        2 * model_bytes,
        "one own download and one retried download: {s}"
    );

    ns.cleanup().await;
    run.finish().await;
}
