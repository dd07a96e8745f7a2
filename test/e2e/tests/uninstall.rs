//! `helm uninstall` under a live workload, end to end, black box: the chart installed with the
//! real Helm CLI on the real test node, the example Deployment's two replicas Ready on one
//! download, reading it through their namespace's read-only view; then the real `helm
//! uninstall`. What docs/uninstall.md promises, observed from outside:
//!
//! - the pre-delete hook runs while the components still run, and its report says what it did:
//!   the binding's finalizer removed, the control namespace gone, the volumes of model data kept
//!   (listed by name) and the command that removes them; its Job, account and roles are deleted
//!   once it succeeded;
//! - the control namespace is gone (not stuck Terminating) and no ModelCacheBinding is left;
//! - the release's components and the webhook registration are gone;
//! - no model data is deleted: the primary PV is kept (Retain, complete, Released now that its
//!   claim went with the control namespace), the view stays bound, and a pod that mounts the
//!   view claim after the uninstall verifies every file;
//! - the running readers keep running (same pods, Ready, no restart);
//! - a new pod of the workload is admitted unmodified and downloads on its own.
//!
//! As in `download_once.rs`, the node advertises `nvidia.com/gpu`, the kit's `PodNetwork`
//! bridges the Hub's loopback address into the pods, images are imported, and the storage is the
//! test CSI driver's shared-filesystem profile qualified by a catalog ConfigMap. With
//! `E2E_KUBECONFIG` and `E2E_HELM_INSTALL=true` it runs on that cluster with a release of its own
//! (it uninstalls it); the download Job and the new replica's own download step stand for the
//! Hub's byte counts (docs/e2e-on-a-cluster.md).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Namespace, PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DynamicObject, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use warmcache_e2e::{
    BINDING_ANNOTATION, CONTROL, READY_TIMEOUT, RELEASE, Scenario, Started, app_pods, bindings_api,
    helm, is_ready, kept_primary, model, webhook_serving,
};
use warmcache_testkit::eventually;

const HOOK: &str = "warmcache-uninstall-hook";
const FINALIZER: &str = "nvca.nvcf.nvidia.io/model-cache-binding-finalizer";
const COMPONENTS: [&str; 3] = [
    "warmcache-webhook",
    "warmcache-binding-controller",
    "warmcache-reaper",
];

/// Every ModelCacheBinding of the cluster (any namespace).
fn all_bindings(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("nvca.nvcf.nvidia.io", "v2beta1", "ModelCacheBinding");
    Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

/// What the hook pod showed while `helm uninstall` ran: whether the binding controller still
/// ran when the hook pod first appeared, and the hook's whole output.
#[derive(Debug, Default)]
struct HookSeen {
    components_running_at_start: Option<bool>,
    output: Option<String>,
}

/// Watches the hook's pod and reads its output, following it from the moment its container
/// started until it ended (the pod is deleted only after the Job succeeded), or until
/// `deadline`.
async fn watch_hook(client: Client, namespace: String, deadline: Instant) -> HookSeen {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let deployments: Api<Deployment> = Api::namespaced(client, &namespace);
    let selector = format!("job-name={HOOK}");
    let mut seen = HookSeen::default();
    while Instant::now() < deadline {
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        if let Some(pod) = list.first() {
            if seen.components_running_at_start.is_none() {
                let d = deployments.get_opt("warmcache-binding-controller").await;
                seen.components_running_at_start = Some(matches!(
                    d,
                    Ok(Some(d)) if d.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0) >= 1
                ));
            }
            let started = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| cs.first())
                .and_then(|c| c.state.as_ref())
                .is_some_and(|s| s.running.is_some() || s.terminated.is_some());
            let follow = LogParams {
                follow: true,
                ..LogParams::default()
            };
            if started && let Ok(out) = pods.logs(&pod.name_any(), &follow).await {
                seen.output = Some(out);
                return seen;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_uninstall_releases_every_binding_and_keeps_the_data_and_the_readers() {
    let started = Instant::now();
    let run = Scenario::new("uninstall")
        .model(model(4 << 20))
        .needs_own_release("runs helm uninstall")
        // Two readers and the replica admitted after the uninstall.
        .gpus(3)
        .start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = run.client.clone();
    let release_namespace = run.release_namespace.clone();
    // The Hub's count on the test node; on a cluster (no Hub to count) the download Jobs and
    // the new replica's own download step stand for it.
    let served = || run.served();
    let model_bytes = run.model_bytes();
    eprintln!("components Ready after {:.1?}", started.elapsed());

    // The live workload: two replicas reading one download through their read-only view.
    let mut workload = run.workload().unwrap();
    workload.spec.replicas = Some(2);
    let ns = run.namespace("e2e-uninstall", &[]).await.unwrap();
    if let Err(e) = webhook_serving(&client, &ns.name, &workload).await {
        panic!("{e}\n{}", run.report(&[]).await);
    }
    let deployments: Api<Deployment> = ns.api();
    deployments
        .create(&PostParams::default(), &workload)
        .await
        .unwrap();
    let pods: Api<Pod> = ns.api();
    let Ok(readers) = eventually("two replicas Ready", READY_TIMEOUT, || {
        let pods = pods.clone();
        async move {
            app_pods(&pods)
                .await
                .filter(|p| p.len() == 2 && p.iter().all(is_ready))
        }
    })
    .await
    else {
        panic!(
            "the replicas never became Ready\n{}",
            run.report(&[&ns.name]).await
        );
    };
    let name = readers[0].annotations()[BINDING_ANNOTATION].clone();
    assert_eq!(readers[1].annotations()[BINDING_ANNOTATION], name);
    let Ok(binding) = eventually("the binding Ready", READY_TIMEOUT, || {
        let (client, name) = (client.clone(), name.clone());
        async move {
            let b = bindings_api(&client).get_opt(&name).await.ok()??;
            let s = b.data.get("status")?;
            (s["realized"]["populationState"] == "Ready"
                && s["realized"]["boundPersistentVolumeName"].is_string()
                && s["realized"]["views"]
                    .as_array()
                    .is_some_and(|v| v.len() == 1))
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
    assert!(
        binding.finalizers().iter().any(|f| f == FINALIZER),
        "the binding holds its finalizer: {:?}",
        binding.finalizers()
    );
    let status: Value = binding.data["status"].clone();
    let primary = status["realized"]["boundPersistentVolumeName"]
        .as_str()
        .unwrap()
        .to_owned();
    let view = &status["realized"]["views"][0];
    assert_eq!(view["namespace"], ns.name.as_str(), "{status}");
    let view_claim = view["persistentVolumeClaimName"]
        .as_str()
        .unwrap()
        .to_owned();
    let view_pv = view["persistentVolumeName"].as_str().unwrap().to_owned();
    assert_eq!(served(), model_bytes, "one download for two replicas");
    let download_jobs = Api::<Job>::namespaced(client.clone(), &ns.name)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    assert_eq!(download_jobs, 1, "one download Job for two replicas");
    let before: BTreeMap<String, i32> = readers
        .iter()
        .map(|p| (p.uid().unwrap(), restarts(p)))
        .collect();
    eprintln!(
        "two readers Ready on one download after {:.1?}",
        started.elapsed()
    );

    // helm uninstall, watching the hook's pod meanwhile.
    let uninstall_started = Instant::now();
    let watcher = tokio::spawn(watch_hook(
        client.clone(),
        release_namespace.clone(),
        Instant::now() + Duration::from_secs(330),
    ));
    let kubeconfig = run.kubeconfig.clone();
    let uninstall_namespace = release_namespace.clone();
    let uninstalled = tokio::task::spawn_blocking(move || {
        helm(
            &kubeconfig,
            &[
                "uninstall",
                RELEASE,
                "--namespace",
                &uninstall_namespace,
                "--timeout",
                "5m",
            ],
        )
    })
    .await
    .unwrap();
    let uninstall_time = uninstall_started.elapsed();
    let helm_output = match uninstalled {
        Ok(output) => output,
        Err(e) => panic!("{e}\n{}", run.report(&[&ns.name]).await),
    };
    let hook = watcher.await.unwrap();
    eprintln!(
        "helm uninstall took {uninstall_time:.1?}: {}",
        helm_output.trim()
    );

    // The hook ran while the components ran, and reported what it did.
    assert_eq!(
        hook.components_running_at_start,
        Some(true),
        "the hook pod ran while the binding controller was Ready: {hook:?}"
    );
    let Some(output) = hook.output.clone() else {
        panic!(
            "the hook's output was not read before its pod went: {hook:?}\n{}",
            run.report(&[&ns.name]).await
        );
    };
    // The report (standard output) without the hook's JSON logs (standard error), which the
    // pod's log interleaves.
    let output: String = output
        .lines()
        .filter(|l| !l.starts_with('{'))
        .map(|l| format!("{l}\n"))
        .collect();
    eprintln!("the uninstall hook's report:\n{output}");
    let summary = output.lines().last().unwrap_or_default();
    assert!(
        summary.starts_with("uninstall-hook: done:")
            && summary.contains("finalizer removed from 1 ModelCacheBinding(s)")
            && summary.contains(&format!("namespace {CONTROL} gone")),
        "the hook's summary: {summary}"
    );
    assert!(
        output.contains(&format!(
            "removed finalizer {FINALIZER} from ModelCacheBinding {CONTROL}/{name}"
        )),
        "{output}"
    );
    let listed: Vec<String> = output
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("PersistentVolume "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    assert!(
        listed.contains(&primary) && output.contains("uninstall never deletes data"),
        "the report lists the primary {primary} as kept: {output}"
    );
    let remove = output
        .lines()
        .find(|l| l.starts_with("to remove them: kubectl delete pv "))
        .unwrap_or_else(|| panic!("no removal command: {output}"));
    assert!(remove.contains(&primary), "{remove}");

    // The hook's Job, account and roles are deleted once it succeeded.
    let hook_gone = eventually(
        "the hook's objects deleted",
        Duration::from_secs(60),
        || {
            let (client, release_namespace) = (client.clone(), release_namespace.clone());
            async move {
                let job = Api::<Job>::namespaced(client.clone(), &release_namespace)
                    .get_opt(HOOK)
                    .await
                    .ok()?;
                let account = Api::<ServiceAccount>::namespaced(client.clone(), &release_namespace)
                    .get_opt(HOOK)
                    .await
                    .ok()?;
                let role = Api::<ClusterRole>::all(client.clone())
                    .get_opt(HOOK)
                    .await
                    .ok()?;
                let binding = Api::<ClusterRoleBinding>::all(client.clone())
                    .get_opt(HOOK)
                    .await
                    .ok()?;
                (job.is_none() && account.is_none() && role.is_none() && binding.is_none())
                    .then_some(())
            }
        },
    )
    .await;
    assert!(hook_gone.is_ok(), "the hook's Job, account or roles remain");

    // The control namespace is gone (the hook waited for it), and no binding is left anywhere.
    let control = Api::<Namespace>::all(client.clone())
        .get_opt(CONTROL)
        .await
        .unwrap();
    assert!(
        control.is_none(),
        "the control namespace is gone, not stuck: {:?}",
        control.map(|n| n.status)
    );
    let left = all_bindings(&client)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert!(
        left.is_empty(),
        "no ModelCacheBinding is left: {:?}",
        left.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
    );

    // The release's components and the webhook registration are gone.
    let release_gone = eventually("the components gone", Duration::from_secs(120), || {
        let (client, release_namespace) = (client.clone(), release_namespace.clone());
        async move {
            let deployments = Api::<Deployment>::namespaced(client.clone(), &release_namespace);
            for d in COMPONENTS {
                if deployments.get_opt(d).await.ok()?.is_some() {
                    return None;
                }
            }
            let pods = Api::<Pod>::namespaced(client.clone(), &release_namespace)
                .list(&ListParams::default())
                .await
                .ok()?;
            let webhook = Api::<MutatingWebhookConfiguration>::all(client.clone())
                .get_opt("warmcache-webhook")
                .await
                .ok()?;
            (pods.items.is_empty() && webhook.is_none()).then_some(())
        }
    })
    .await;
    if release_gone.is_err() {
        panic!(
            "the release's components or webhook registration remain\n{}",
            run.report(&[]).await
        );
    }

    // No data is deleted: the primary is kept, Released now that its claim went with the
    // control namespace; the view stays bound to its claim.
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    kept_primary(&run, &primary, &ns.name)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for pv in &listed {
        assert!(
            volumes.get_opt(pv).await.unwrap().is_some(),
            "{pv}, listed as kept, exists"
        );
    }
    let view_volume = volumes.get_opt(&view_pv).await.unwrap().unwrap();
    assert_eq!(
        view_volume.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Bound"),
        "the view {view_pv} stays bound: {view_volume:?}"
    );
    let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name)
        .get(&view_claim)
        .await
        .unwrap();
    assert_eq!(
        claim.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Bound"),
        "{claim:?}"
    );

    // The running readers keep running: the same pods, Ready, not restarted.
    let now = app_pods(&pods).await.unwrap();
    let after: BTreeMap<String, i32> = now
        .iter()
        .filter(|p| is_ready(p))
        .map(|p| (p.uid().unwrap(), restarts(p)))
        .collect();
    assert_eq!(
        after,
        before,
        "the readers keep running, unrestarted\n{}",
        run.report(&[&ns.name]).await
    );

    // Their data stays readable: a pod mounting the view claim after the uninstall verifies
    // every file (nothing rewrites it now).
    let engine_mount = readers[0]
        .spec
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .find(|c| c.name == "engine")
        .and_then(|c| c.volume_mounts.as_ref())
        .and_then(|m| m.iter().find(|m| m.mount_path == "/models/llm"))
        .cloned()
        .unwrap();
    let verify = verifier(&run, &view_claim, engine_mount.sub_path.as_deref());
    pods.create(&PostParams::default(), &verify).await.unwrap();
    let verified = eventually("the verifier done", READY_TIMEOUT, || {
        let pods = pods.clone();
        async move {
            let p = pods.get("verify").await.ok()?;
            let phase = p.status.as_ref()?.phase.clone()?;
            (phase == "Succeeded" || phase == "Failed").then_some(phase)
        }
    })
    .await;
    if verified.as_ref().ok().map(String::as_str) != Some("Succeeded") {
        panic!(
            "the view could not be read after the uninstall: {verified:?}\n{}",
            run.report(&[&ns.name]).await
        );
    }

    // A new replica is admitted unmodified and downloads on its own.
    let old: Vec<String> = before.keys().cloned().collect();
    deployments
        .patch(
            "llm",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    let Ok(new) = eventually("the new replica Ready", READY_TIMEOUT, || {
        let (pods, old) = (pods.clone(), old.clone());
        async move {
            app_pods(&pods)
                .await?
                .into_iter()
                .find(|p| !old.contains(&p.uid().unwrap_or_default()) && is_ready(p))
        }
    })
    .await
    else {
        panic!(
            "the replica created after the uninstall never became Ready\n{}",
            run.report(&[&ns.name]).await
        );
    };
    let touched: Vec<&String> = new
        .annotations()
        .keys()
        .filter(|k| k.contains("nvca.nvcf.nvidia.io") || k.contains("nvsnap.io"))
        .collect();
    assert!(touched.is_empty(), "admitted unmodified: {touched:?}");
    let volumes_of_new: Vec<String> = new
        .spec
        .as_ref()
        .unwrap()
        .volumes
        .iter()
        .flatten()
        .filter(|v| !v.name.starts_with("kube-api-access"))
        .map(|v| v.name.clone())
        .collect();
    assert_eq!(volumes_of_new, ["models"], "the template's own volumes");
    assert_eq!(
        served(),
        model_bytes.map(|b| 2 * b),
        "the new replica downloaded on its own"
    );
    // Its own download step ran to success (what the Hub's count shows on the test node), and
    // no download Job was added.
    let own_download = new
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref())
        .and_then(|s| s.iter().find(|c| c.name == "download-model"))
        .and_then(|c| c.state.as_ref()?.terminated.as_ref())
        .map(|t| t.exit_code);
    assert_eq!(
        own_download,
        Some(0),
        "the new replica downloaded on its own: {:?}",
        new.status
    );
    let jobs_after = Api::<Job>::namespaced(client.clone(), &ns.name)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    assert!(
        jobs_after <= download_jobs,
        "no download Job added after the uninstall: {jobs_after}"
    );
    assert!(
        Api::<Namespace>::all(client.clone())
            .get_opt(CONTROL)
            .await
            .unwrap()
            .is_none(),
        "nothing recreated the control namespace"
    );

    let claims_left: Vec<String> =
        Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|c| {
                format!(
                    "{} ({}{})",
                    c.name_any(),
                    c.status
                        .as_ref()
                        .and_then(|s| s.phase.as_deref())
                        .unwrap_or("no phase"),
                    if c.metadata.deletion_timestamp.is_some() {
                        ", terminating"
                    } else {
                        ""
                    }
                )
            })
            .collect();
    eprintln!("claims left in the workload's namespace: {claims_left:?}");
    let in_all = match (served(), model_bytes) {
        (Some(served), Some(model_bytes)) => {
            format!(
                "{:.1}x the model in all",
                served as f64 / model_bytes as f64
            )
        }
        _ => "1 download Job and 1 own download in all".to_owned(),
    };
    eprintln!(
        "uninstall: helm uninstall took {uninstall_time:.1?} under 2 live readers; the hook \
         released 1 binding, the control namespace is gone, {} PV(s) of model data kept; the \
         readers kept running, the view still verifies, and a new replica downloaded on its \
         own ({in_all})",
        listed.len(),
    );
    eprintln!("done after {:.1?}", started.elapsed());
    ns.cleanup().await;
    run.finish().await;
}

/// The restarts of `pod`'s containers.
fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| cs.iter().map(|c| c.restart_count).sum())
        .unwrap_or(0)
}

/// A pod that mounts `claim` read-only (at `sub_path`, as the readers do) and verifies every
/// file of the model, then exits.
fn verifier(run: &Started, claim: &str, sub_path: Option<&str>) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "verify"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532},
            "containers": [{
                "name": "verify",
                "image": run.hf_image,
                "imagePullPolicy": run.pull_policy,
                "command": ["sh", "-c", "cd /models/llm && sha256sum -c SHA256SUMS"],
                "volumeMounts": [{
                    "name": "model", "mountPath": "/models/llm", "readOnly": true,
                    "subPath": sub_path.unwrap_or_default(),
                }],
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
            }],
            "volumes": [{"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": true}}],
        },
    }))
    .unwrap()
}
