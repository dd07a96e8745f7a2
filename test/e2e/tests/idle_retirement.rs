//! Idle retirement, then a warm start, end to end, black box: the chart installed with the real
//! Helm CLI on the real test node with a short reaper schedule (a sweep every 5 s, idle after
//! 15 s, 5 s between Retiring and the deletions), and the example Deployment downloading once
//! with the real `hf download` from the simulated Hugging Face Hub.
//!
//! 1. Scaled to zero, the workload still exists, so it keeps its binding (a request reference is
//!    dropped only when its object is gone): for longer than the idle period and two sweeps the
//!    binding stays Active, referenced, with no `unreferencedSince`. Scaled back up, the replica
//!    reads the same copy (no Job, no byte).
//! 2. Deleted, the workload no longer references the binding: the reaper retires it (Event
//!    `Retiring`) and deletes what it names: the read-only view claim and its PV, the writer Job,
//!    the primary claim, the writer Lease, then the binding. The primary PV is kept: Released,
//!    `Retain`, labelled complete, stamped with its last use.
//! 3. Created again, the workload gets a new binding (same name, another UID) that adopts the
//!    retained primary (Event `AdoptedRetained`): no download Job is ever created, the Hub serves
//!    no byte, and the replica becomes Ready verifying every file through its read-only view.
//!
//! As in `download_once.rs`, the node advertises `nvidia.com/gpu`, the kit's `PodNetwork`
//! bridges the Hub's loopback address into the pods, images are imported, and the storage is the
//! test CSI driver's shared-filesystem profile qualified by a catalog ConfigMap. With
//! `E2E_KUBECONFIG` and `E2E_HELM_INSTALL=true` it runs on that cluster with a release of its own
//! (the reaper's schedule), the Job counts standing for the Hub's byte counts
//! (docs/e2e-on-a-cluster.md).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use warmcache_e2e::{
    APP_SELECTOR, BINDING_ANNOTATION, CONTROL, READY_TIMEOUT, Scenario, bindings_api, is_ready,
    kept_primary, model, read_only_landing, webhook_serving,
};
use warmcache_testkit::eventually;

/// The reaper's schedule for this scenario (chart values `reaper.*`).
const SWEEP: Duration = Duration::from_secs(5);
const IDLE: Duration = Duration::from_secs(15);
const REAPER_SETS: [&str; 3] = [
    "reaper.interval=5s",
    "reaper.idlePeriod=15s",
    "reaper.retiringGrace=5s",
];
/// The label naming the binding a storage object belongs to.
const BINDING_LABEL: &str = "nvca.nvcf.nvidia.io/model-cache-binding";
const LAST_USED_ANNOTATION: &str = "warmcache.nvidia.io/last-used";
/// How long the reaper gets to retire an idle binding and delete what it names.
const RETIRE_TIMEOUT: Duration = Duration::from_secs(300);

/// The example's pods in `pods`' namespace, also those being deleted.
async fn app_pods(pods: &Api<Pod>) -> Option<Vec<Pod>> {
    Some(
        pods.list(&ListParams::default().labels(APP_SELECTOR))
            .await
            .ok()?
            .items,
    )
}

/// The one Ready, not terminating, pod of the example, when there is exactly one pod.
async fn one_ready(pods: &Api<Pod>) -> Option<Pod> {
    let list = app_pods(pods).await?;
    let [p] = list.as_slice() else {
        return None;
    };
    (is_ready(p) && p.metadata.deletion_timestamp.is_none()).then(|| p.clone())
}

/// The binding `name`, `None` when it is not found or the read fails.
async fn binding(client: &Client, name: &str) -> Option<DynamicObject> {
    bindings_api(client).get_opt(name).await.ok().flatten()
}

/// Whether the binding `name` is gone (a read that fails is not proof).
async fn binding_gone(client: &Client, name: &str) -> bool {
    matches!(bindings_api(client).get_opt(name).await, Ok(None))
}

fn status(b: &DynamicObject) -> Value {
    b.data.get("status").cloned().unwrap_or(Value::Null)
}

/// The Events of the control namespace with `reason` about the object with `uid`.
async fn events(client: &Client, reason: &str, uid: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), CONTROL)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason) && e.involved_object.uid.as_deref() == Some(uid)
        })
        .collect()
}

/// The engine's mount at the landing, and the claim it reads: both read-only, the claim
/// `view_claim`.
fn assert_reads_read_only(pod: &Pod, view_claim: &str) {
    let claim = read_only_landing(pod).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        claim.claim_name,
        view_claim,
        "{}: {claim:?}",
        pod.name_any()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_binding_is_retired_and_its_retained_copy_adopted_without_a_download() {
    let started = Instant::now();
    let run = Scenario::new("idle_retirement")
        .model(model(4 << 20))
        .extra_sets(&REAPER_SETS)
        .gpus(2)
        .start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = run.client.clone();
    // The Hub's count on the test node; on a cluster (no Hub to count) the Job counts next to
    // each of these checks stand for it.
    let served = || run.served();
    let model_bytes = run.model_bytes();
    eprintln!("components Ready after {:.1?}", started.elapsed());

    let mut workload = run.workload().unwrap();
    workload.spec.replicas = Some(1);
    let ns = run.namespace("e2e-idle", &[]).await.unwrap();
    if let Err(e) = webhook_serving(&client, &ns.name, &workload).await {
        panic!("{e}\n{}", run.report(&[]).await);
    }
    let deployments: Api<Deployment> = ns.api();
    let pods: Api<Pod> = ns.api();
    let jobs: Api<Job> = ns.api();
    let scale = |replicas: i32| {
        let deployments = deployments.clone();
        async move {
            deployments
                .patch(
                    "llm",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicas": replicas}})),
                )
                .await
                .unwrap();
        }
    };

    // The download, once.
    deployments
        .create(&PostParams::default(), &workload)
        .await
        .unwrap();
    let Ok(first) = eventually("the first replica Ready", READY_TIMEOUT, || {
        let pods = pods.clone();
        async move { one_ready(&pods).await }
    })
    .await
    else {
        panic!(
            "the first replica never became Ready\n{}",
            run.report(&[&ns.name]).await
        );
    };
    let name = first.annotations()[BINDING_ANNOTATION].clone();
    let Ok(old) = eventually("the binding Ready", READY_TIMEOUT, || {
        let (client, name) = (client.clone(), name.clone());
        async move {
            let b = binding(&client, &name).await?;
            let s = status(&b);
            (s["realized"]["populationState"] == "Ready"
                && s["realized"]["boundPersistentVolumeName"].is_string())
            .then_some(b)
        }
    })
    .await
    else {
        panic!(
            "the binding never became Ready\n{}",
            run.report(&[&ns.name]).await
        );
    };
    let old_uid = old.uid().unwrap();
    let old_status = status(&old);
    let primary = old_status["realized"]["boundPersistentVolumeName"]
        .as_str()
        .unwrap()
        .to_owned();
    let views: Vec<(String, String, String)> = old_status["realized"]["views"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["namespace"].as_str().unwrap().to_owned(),
                v["persistentVolumeClaimName"].as_str().unwrap().to_owned(),
                v["persistentVolumeName"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        views.iter().map(|v| v.0.as_str()).collect::<Vec<_>>(),
        [ns.name.as_str()],
        "one view, in the workload's namespace: {old_status}"
    );
    let view_claim = views[0].1.clone();
    assert_reads_read_only(&first, &view_claim);
    let writer_jobs = jobs.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(writer_jobs.len(), 1, "one download Job");
    let writer_job = writer_jobs[0].name_any();
    assert_eq!(served(), model_bytes, "one download");
    let hash = name.strip_prefix("model-cache-").unwrap().to_owned();
    let primary_claim = format!("rw-pvc-{hash}");
    let lease = format!("init-lease-{hash}");
    eprintln!(
        "downloaded once after {:.1?}: binding {name}, primary {primary}",
        started.elapsed()
    );

    // 1. Scaled to zero: the Deployment still references the binding, which stays Active for
    // longer than the idle period and two sweeps.
    scale(0).await;
    if eventually("the replica gone", READY_TIMEOUT, || {
        let pods = pods.clone();
        async move { app_pods(&pods).await.filter(Vec::is_empty) }
    })
    .await
    .is_err()
    {
        panic!(
            "the replica never went away\n{}",
            run.report(&[&ns.name]).await
        );
    }
    let window = IDLE + 2 * SWEEP + Duration::from_secs(5);
    let until = Instant::now() + window;
    while Instant::now() < until {
        let b = binding(&client, &name).await;
        let kept = b.as_ref().is_some_and(|b| {
            let s = status(b);
            b.uid().as_deref() == Some(old_uid.as_str())
                && s["phase"] == "Active"
                && s.get("unreferencedSince").is_none()
                && s["requestReferences"].as_array().is_some_and(|r| {
                    r.iter()
                        .any(|r| r["kind"] == "Deployment" && r["name"] == "llm")
                })
        });
        if !kept {
            panic!(
                "a Deployment scaled to zero did not keep its binding Active and referenced: {:?}\n{}",
                b.map(|b| status(&b)),
                run.report(&[&ns.name]).await
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "scaled to zero for {window:?}: the binding stays Active, referenced by the Deployment"
    );

    scale(1).await;
    let Ok(back) = eventually("the replica back, Ready", READY_TIMEOUT, || {
        let pods = pods.clone();
        async move { one_ready(&pods).await }
    })
    .await
    else {
        panic!(
            "the replica scaled back up never became Ready\n{}",
            run.report(&[&ns.name]).await
        );
    };
    assert_eq!(back.annotations()[BINDING_ANNOTATION], name);
    assert_reads_read_only(&back, &view_claim);
    assert_eq!(served(), model_bytes, "scaling back up downloaded nothing");
    assert_eq!(
        jobs.list(&ListParams::default()).await.unwrap().items.len(),
        1,
        "scaling back up started no Job"
    );

    // 2. Deleted: nothing references the binding. The reaper retires it and deletes what it
    // names; the complete primary is kept.
    deployments
        .delete("llm", &DeleteParams::background())
        .await
        .unwrap();
    let retire_started = Instant::now();
    let retired = eventually("the binding retired and gone", RETIRE_TIMEOUT, || {
        let (client, name) = (client.clone(), name.clone());
        async move { binding_gone(&client, &name).await.then_some(()) }
    })
    .await;
    if retired.is_err() {
        panic!(
            "the idle binding was not retired\n{}",
            run.report(&[&ns.name]).await
        );
    }
    eprintln!(
        "the binding retired and gone {:.1?} after the Deployment's deletion",
        retire_started.elapsed()
    );
    assert!(
        !events(&client, "Retiring", &old_uid).await.is_empty(),
        "the reaper recorded the Event Retiring on the binding\n{}",
        run.report(&[&ns.name]).await
    );
    // Everything the binding named is gone, once the binding is: the stages come first.
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    for (_, claim, pv) in &views {
        assert!(
            claims.get_opt(claim).await.unwrap().is_none(),
            "view claim {claim} deleted"
        );
        assert!(
            volumes.get_opt(pv).await.unwrap().is_none(),
            "view PV {pv} deleted"
        );
    }
    // The writer view (claim and PV) went too: no claim is left in the namespace, and of the
    // PVs labelled for the binding only the primary.
    let left_claims = claims.list(&ListParams::default()).await.unwrap().items;
    assert!(
        left_claims.is_empty(),
        "no claim left in the workload's namespace: {:?}",
        left_claims
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>()
    );
    let labelled = volumes
        .list(&ListParams::default().labels(&format!("{BINDING_LABEL}={name}")))
        .await
        .unwrap()
        .items;
    let left_volumes: Vec<String> = labelled
        .iter()
        .map(ResourceExt::name_any)
        .filter(|n| *n != primary)
        .collect();
    assert!(
        left_volumes.is_empty(),
        "of the binding's PVs only the primary is left: {left_volumes:?}"
    );
    assert!(
        jobs.get_opt(&writer_job).await.unwrap().is_none(),
        "writer Job {writer_job} deleted"
    );
    assert!(
        Api::<PersistentVolumeClaim>::namespaced(client.clone(), CONTROL)
            .get_opt(&primary_claim)
            .await
            .unwrap()
            .is_none(),
        "primary claim {primary_claim} deleted"
    );
    assert!(
        Api::<Lease>::namespaced(client.clone(), CONTROL)
            .get_opt(&lease)
            .await
            .unwrap()
            .is_none(),
        "writer Lease {lease} deleted"
    );
    // The data is kept: the primary PV Released, Retain, complete, stamped with its last use.
    let kept = kept_primary(&run, &primary, &ns.name)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        kept.annotations().contains_key(LAST_USED_ANNOTATION),
        "{kept:?}"
    );

    // 3. Created again: a new binding adopts the retained primary. The webhook first sees the
    // binding gone (a dry run comes back rewritten, not skipped as `binding-retiring`).
    if let Err(e) = webhook_serving(&client, &ns.name, &workload).await {
        panic!("{e}\n{}", run.report(&[&ns.name]).await);
    }
    deployments
        .create(&PostParams::default(), &workload)
        .await
        .unwrap();
    let warm_started = Instant::now();
    let warm = eventually(
        "the replica Ready on the adopted copy",
        READY_TIMEOUT,
        || {
            let (pods, jobs) = (pods.clone(), jobs.clone());
            async move {
                // A Job at any point fails the scenario below.
                let jobs = jobs.list(&ListParams::default()).await.ok()?.items;
                if !jobs.is_empty() {
                    return Some(Err(jobs));
                }
                one_ready(&pods).await.map(Ok)
            }
        },
    )
    .await;
    let warm = match warm {
        Ok(Ok(pod)) => pod,
        Ok(Err(jobs)) => panic!(
            "a download Job was created after the retained primary could be adopted: {:?}\n{}",
            jobs.iter().map(ResourceExt::name_any).collect::<Vec<_>>(),
            run.report(&[&ns.name]).await
        ),
        Err(_) => panic!(
            "the replica never became Ready on the adopted copy\n{}",
            run.report(&[&ns.name]).await
        ),
    };
    let warm_time = warm_started.elapsed();
    assert_eq!(warm.annotations()[BINDING_ANNOTATION], name);
    let new = binding(&client, &name).await.unwrap();
    let new_uid = new.uid().unwrap();
    assert_ne!(new_uid, old_uid, "a new binding");
    let new_status = status(&new);
    assert_eq!(
        new_status["realized"]["boundPersistentVolumeName"].as_str(),
        Some(primary.as_str()),
        "the new binding reads the retained primary: {new_status}"
    );
    assert_eq!(
        new_status["realized"]["populationState"], "Ready",
        "{new_status}"
    );
    let new_view = new_status["realized"]["views"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["namespace"] == ns.name.as_str())
        .unwrap()["persistentVolumeClaimName"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_reads_read_only(&warm, &new_view);
    let adopted = eventually("the Event AdoptedRetained", Duration::from_secs(30), || {
        let (client, uid) = (client.clone(), new_uid.clone());
        async move {
            let e = events(&client, "AdoptedRetained", &uid).await;
            (!e.is_empty()).then_some(e)
        }
    })
    .await;
    assert!(
        adopted.is_ok(),
        "the new binding recorded no AdoptedRetained Event\n{}",
        run.report(&[&ns.name]).await
    );
    let after = jobs.list(&ListParams::default()).await.unwrap().items;
    assert!(
        after.is_empty(),
        "no download Job: {:?}",
        after.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
    );
    assert_eq!(served(), model_bytes, "the warm start downloaded nothing");

    let in_all = match (served(), model_bytes) {
        (Some(served), Some(model_bytes)) => format!(
            "the Hub served {:.1}x the model in all",
            served as f64 / model_bytes as f64
        ),
        _ => "1 download Job in all".to_owned(),
    };
    eprintln!(
        "idle retirement: 1 download; scaled to zero the binding stays; \
         deleted, the binding was retired and its views, Job, claim and Lease deleted, primary \
         {primary} kept; recreated, a new binding adopted it: Ready in {warm_time:.1?}, 0 Jobs, \
         {in_all}"
    );
    eprintln!("done after {:.1?}", started.elapsed());
    ns.cleanup().await;
    run.finish().await;
}
