//! Revision pinning, end to end, black box: the chart installed with the real Helm CLI on the
//! real test node, and the example Deployment downloading a *tag* (`hf download demo/llm
//! --revision v1`) with the real client from the simulated Hugging Face Hub. The download
//! records the commit the tag named; the tag is then re-pointed at another commit on the Hub, and
//! a new replica still reads the pinned copy (no download, the old commit's bytes, its commit on
//! the pod). A refresh (a new `nvsnap.io/cache-salt` in the pod template) downloads the new
//! commit into a new binding, and every new pod verifies the new bytes.
//!
//! As in `download_once.rs`, the node advertises `nvidia.com/gpu`, the kit's `PodNetwork`
//! bridges the Hub's loopback address into the pods, images are imported, and the storage is the
//! test CSI driver's shared-filesystem profile qualified by a catalog ConfigMap. It needs the
//! simulated Hub: with `E2E_KUBECONFIG` it fails at start, saying so.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use warmcache_e2e::{
    APP_SELECTOR, BINDING_ANNOTATION, READY_TIMEOUT, REPO, Scenario, Started, bindings_api,
    is_ready, model_version, webhook_serving,
};
use warmcache_test_sources::hub::HubOptions;
use warmcache_testkit::eventually;

const REVISION_ANNOTATION: &str = "nvsnap.io/model-revision";
const SALT_ANNOTATION: &str = "nvsnap.io/cache-salt";

/// The Ready pods of the example in `ns`, by name.
async fn ready(pods: &Api<Pod>) -> Option<Vec<Pod>> {
    let list = pods
        .list(&ListParams::default().labels(APP_SELECTOR))
        .await
        .ok()?;
    Some(
        list.items
            .into_iter()
            .filter(|p| is_ready(p) && p.metadata.deletion_timestamp.is_none())
            .collect(),
    )
}

async fn report(run: &Started, ns: &str) -> String {
    run.report(&[ns]).await
}

/// The binding `name`'s `status.resolvedRevision`, once its population is Ready.
async fn pinned_commit(client: &Client, name: &str) -> Option<String> {
    let b = bindings_api(client).get(name).await.ok()?;
    let status = b.data.get("status")?;
    (status["realized"]["populationState"] == "Ready")
        .then(|| status["resolvedRevision"].as_str().map(str::to_owned))
        .flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_tag_keeps_serving_the_pinned_commit_until_a_refresh() {
    let run = Scenario::new("revision_pinning")
        .simulated_hub(
            HubOptions::default(),
            "tag v1 is moved to another commit on the Hub mid-scenario",
        )
        .gpus(4)
        .start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = run.client.clone();
    let hub = run.hub().unwrap();

    // Two commits of the repository; tag v1 names the first.
    let first = model_version("pin-a", 6 << 20);
    let first_bytes: u64 = first.iter().map(|f| f.content.len()).sum();
    let commit_a = hub.publish(REPO, first).unwrap();
    let second = model_version("pin-b", 6 << 20);
    let second_bytes: u64 = second.iter().map(|f| f.content.len()).sum();
    let commit_b = hub.publish(REPO, second).unwrap();
    assert_ne!(commit_a, commit_b);
    hub.set_ref(REPO, "v1", &commit_a).unwrap();

    // The example, downloading tag v1.
    let mut workload = run.workload().unwrap();
    let init = &mut workload
        .spec
        .template
        .spec
        .as_mut()
        .unwrap()
        .init_containers
        .as_mut()
        .unwrap()[0];
    let script = init.command.as_mut().unwrap().last_mut().unwrap();
    assert!(script.contains("hf download demo/llm "), "{script}");
    *script = script.replace(
        "hf download demo/llm ",
        "hf download demo/llm --revision v1 ",
    );
    workload.spec.replicas = Some(1);

    let ns = run.namespace("e2e-pin", &[]).await.unwrap();
    if let Err(e) = webhook_serving(&client, &ns.name, &workload).await {
        panic!("{e}\n{}", run.report(&[]).await);
    }
    let deployments: Api<Deployment> = ns.api();
    deployments
        .create(&PostParams::default(), &workload)
        .await
        .unwrap();
    let pods: Api<Pod> = ns.api();
    let one = eventually("the first replica Ready", READY_TIMEOUT, || {
        let pods = pods.clone();
        async move { ready(&pods).await.filter(|p| p.len() == 1) }
    })
    .await;
    let Ok(one) = one else {
        panic!(
            "the first replica never became Ready\n{}",
            report(&run, &ns.name).await
        );
    };
    let first_binding = one[0].annotations()[BINDING_ANNOTATION].clone();
    let pinned = eventually("the binding records the commit", READY_TIMEOUT, || {
        let (client, name) = (client.clone(), first_binding.clone());
        async move { pinned_commit(&client, &name).await }
    })
    .await;
    let Ok(pinned) = pinned else {
        panic!(
            "the binding never recorded a commit\n{}",
            report(&run, &ns.name).await
        );
    };
    assert_eq!(
        pinned, commit_a,
        "the download recorded the commit tag v1 named"
    );
    let served = || run.served().unwrap();
    assert_eq!(served(), first_bytes, "one download of commit A");

    // The tag moves; a new replica still reads the pinned copy, carrying its commit.
    hub.set_ref(REPO, "v1", &commit_b).unwrap();
    deployments
        .patch(
            "llm",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    let two = eventually(
        "two replicas Ready on the pinned copy",
        READY_TIMEOUT,
        || {
            let pods = pods.clone();
            async move { ready(&pods).await.filter(|p| p.len() == 2) }
        },
    )
    .await;
    let Ok(two) = two else {
        panic!(
            "the second replica never became Ready\n{}",
            report(&run, &ns.name).await
        );
    };
    let second_pod = two
        .iter()
        .find(|p| p.name_any() != one[0].name_any())
        .unwrap();
    assert_eq!(second_pod.annotations()[BINDING_ANNOTATION], first_binding);
    assert_eq!(
        second_pod.annotations().get(REVISION_ANNOTATION),
        Some(&commit_a),
        "the new replica carries the pinned commit"
    );
    assert_eq!(served(), first_bytes, "the moved tag downloaded nothing");

    // A refresh: another salt in the pod template. The rollout's pods download commit B into a
    // new binding and verify its bytes.
    deployments
        .patch(
            "llm",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"metadata": {"annotations": {
                SALT_ANNOTATION: "tag-v1-moved"
            }}}}})),
        )
        .await
        .unwrap();
    let refreshed = eventually("the refreshed replicas Ready", READY_TIMEOUT, || {
        let (pods, first_binding) = (pods.clone(), first_binding.clone());
        async move {
            let ready = ready(&pods).await?;
            let all = pods
                .list(&ListParams::default().labels(APP_SELECTOR))
                .await
                .ok()?;
            (ready.len() == 2
                && all.items.len() == 2
                && ready
                    .iter()
                    .all(|p| p.annotations().get(BINDING_ANNOTATION) != Some(&first_binding)))
            .then_some(ready)
        }
    })
    .await;
    let Ok(refreshed) = refreshed else {
        panic!(
            "the refreshed replicas never became Ready\n{}",
            report(&run, &ns.name).await
        );
    };
    let new_bindings: BTreeSet<String> = refreshed
        .iter()
        .map(|p| p.annotations()[BINDING_ANNOTATION].clone())
        .collect();
    assert_eq!(new_bindings.len(), 1, "{new_bindings:?}");
    let new_binding = new_bindings.into_iter().next().unwrap();
    let repinned = eventually(
        "the new binding records the new commit",
        READY_TIMEOUT,
        || {
            let (client, name) = (client.clone(), new_binding.clone());
            async move { pinned_commit(&client, &name).await }
        },
    )
    .await
    .unwrap();
    assert_eq!(repinned, commit_b);
    assert_eq!(
        served(),
        first_bytes + second_bytes,
        "the refresh downloaded commit B once"
    );
    // The old binding keeps its commit (immutable), for the reaper's idle rule to retire.
    assert_eq!(
        pinned_commit(&client, &first_binding).await.as_deref(),
        Some(commit_a.as_str())
    );

    ns.cleanup().await;
    run.finish().await;
}
