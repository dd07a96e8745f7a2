//! The binding controller against a real API server (and the real PV, Job and garbage
//! controllers of kube-controller-manager; pod status is written by the kubelet simulation):
//! a binding and a reading pod become one primary claim in the control namespace, a writer view
//! and a hardened writer Job in the writer namespace, a read-only view recorded before it is
//! created; the Job's success labels the primary PV complete with Retain before the writer claim
//! is released, and the binding reports Ready with the measured bytes; a failed Job reports the
//! download's last words and keeps the primary claim.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::{
    Crashed, Crashing, HANDLE, Running, assert_crashed_after, assert_never_backwards,
    assert_settled, binding_of_identity, condition, job_pod, label_domain, population, reader_pod,
    record_versions, sample, scrape,
};

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use warmcache_api_modelcache::v2beta1::{
    BindingIdentity, ModelCacheBinding, PopulationState, Workflow, WriterState,
};
use warmcache_api_modelcache::{identity_hash, reader_pvc_name, writer_job_name, writer_pvc_name};
use warmcache_modelvolume::keys::{BINDING_ANNOTATION, BINDING_UID_ANNOTATION, MODEL_LABEL};
use warmcache_modelvolume::volume_keys::{
    BYTES_ANNOTATION, COMPLETE_LABEL, WRITER_JOB_UID_ANNOTATION, WRITER_NAMESPACE_ANNOTATION,
    WRITER_STATE_ANNOTATION,
};
use warmcache_modelvolume::{LifecycleConfig, WriterOptions};
use warmcache_testkit::{ControlPlane, Kubelet, TestNamespace, eventually};

const WAIT: Duration = Duration::from_secs(60);

async fn running_controller(
    plane: &ControlPlane,
    control: &str,
) -> (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<Result<(), warmcache_runtime::RuntimeError>>,
) {
    let (stop, task, _) = running_controller_with(plane, control, None, None).await;
    (stop, task)
}

async fn running_controller_with(
    plane: &ControlPlane,
    control: &str,
    client: Option<Client>,
    catalog_namespace: Option<&str>,
) -> (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<Result<(), warmcache_runtime::RuntimeError>>,
    std::net::SocketAddr,
) {
    running_controller_cfg(plane, control, client, catalog_namespace, test_lifecycle()).await
}

/// The controller's settings in most tests.
fn test_lifecycle() -> LifecycleConfig {
    LifecycleConfig {
        writer: WriterOptions {
            backoff_limit: 0,
            ..WriterOptions::default()
        },
        // Short, so the retry test does not wait an hour.
        failure_record_seconds: 3,
        ..LifecycleConfig::default()
    }
}

async fn running_controller_cfg(
    plane: &ControlPlane,
    control: &str,
    client: Option<Client>,
    catalog_namespace: Option<&str>,
    lifecycle: LifecycleConfig,
) -> Running {
    common::controller(plane, control, client, catalog_namespace, lifecycle).await
}

fn binding(control: &str, app: &str) -> ModelCacheBinding {
    binding_for(control, app, Workflow::RegularModelCache, app)
}

fn binding_for(control: &str, app: &str, workflow: Workflow, domain: &str) -> ModelCacheBinding {
    binding_of_identity(control, app, BindingIdentity::new(workflow, domain, HANDLE))
}

/// The PV a provisioner would create for the primary claim (there is none on the test control
/// plane): pre-bound to it, so the real PV controller binds the pair, and annotated with the
/// provisioner as the external provisioner does.
fn primary_pv(name: &str, control: &str, claim: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {
            "name": name,
            "annotations": { "pv.kubernetes.io/provisioned-by": "fake.csi.warmcache.io" },
        },
        "spec": {
            "capacity": { "storage": "100Gi" },
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "nvcf-sc",
            "claimRef": { "namespace": control, "name": claim },
            "csi": { "driver": "fake.csi.warmcache.io", "volumeHandle": format!("{name}-handle") },
        },
    }))
    .unwrap()
}

async fn stored(api: &Api<ModelCacheBinding>, name: &str) -> ModelCacheBinding {
    api.get(name).await.unwrap()
}

struct Setup {
    client: Client,
    control: TestNamespace,
    app: TestNamespace,
    bindings: Api<ModelCacheBinding>,
    binding: ModelCacheBinding,
    pv_name: String,
    admin: std::net::SocketAddr,
}

async fn setup(prefix: &str) -> (Setup, tokio_util::sync::CancellationToken) {
    let plane = ControlPlane::shared().await.unwrap();
    let client = plane.client().await.unwrap();
    let control = TestNamespace::new(&format!("{prefix}-ctl")).await.unwrap();
    let app = TestNamespace::new(&format!("{prefix}-app")).await.unwrap();
    let bindings: Api<ModelCacheBinding> = control.api();
    let created = bindings
        .create(&PostParams::default(), &binding(&control.name, &app.name))
        .await
        .unwrap();
    let (stop, _task, admin) = running_controller_with(plane, &control.name, None, None).await;
    let pv_name = format!("{}-primary", control.name);
    (
        Setup {
            client,
            control,
            app,
            bindings,
            binding: created,
            pv_name,
            admin,
        },
        stop,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_becomes_one_download_and_a_read_only_view() {
    let (s, stop) = setup("mcb-ok").await;
    let name = s.binding.name_any();
    let identity = s.binding.spec.identity.clone();
    let claim_name = writer_pvc_name(&identity);

    // Active, the primary claim in the control namespace, waiting for it to bind.
    let primary_claims: Api<PersistentVolumeClaim> = s.control.api();
    let claim = eventually("the primary claim", WAIT, || {
        let api = primary_claims.clone();
        let claim_name = claim_name.clone();
        async move { api.get_opt(&claim_name).await.ok().flatten() }
    })
    .await
    .unwrap();
    let spec = claim.spec.unwrap();
    assert_eq!(spec.storage_class_name.as_deref(), Some("nvcf-sc"));
    assert_eq!(spec.access_modes, Some(vec!["ReadWriteMany".to_owned()]));
    let b = stored(&s.bindings, &name).await;
    assert_eq!(
        b.status
            .as_ref()
            .and_then(|st| st.phase)
            .map(|p| p.as_str()),
        Some("Active")
    );
    assert_eq!(b.status.as_ref().unwrap().observed_generation, Some(1));
    assert!(
        b.status.as_ref().unwrap().unreferenced_since.is_some(),
        "no pod yet: unreferenced"
    );

    // The primary's PV (a provisioner's job), and a reading pod in the writer namespace.
    let pvs: Api<PersistentVolume> = Api::all(s.client.clone());
    pvs.create(
        &PostParams::default(),
        &primary_pv(&s.pv_name, &s.control.name, &claim_name),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = s.app.api();
    let pod = pods
        .create(&PostParams::default(), &reader_pod("reader-0", &b))
        .await
        .unwrap();

    // The writer Job, hardened, in the writer namespace, writing through the writer view.
    let jobs: Api<Job> = s.app.api();
    let job_name = writer_job_name(&identity);
    let job = eventually("the writer Job", WAIT, || {
        let jobs = jobs.clone();
        let job_name = job_name.clone();
        async move { jobs.get_opt(&job_name).await.ok().flatten() }
    })
    .await
    .unwrap();
    let template = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(template.automount_service_account_token, Some(false));
    let c = &template.containers[0];
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(
        sc.capabilities.as_ref().unwrap().drop,
        Some(vec!["ALL".to_owned()])
    );
    let model = template
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "nvsnap-model")
        .unwrap();
    assert_eq!(
        model.persistent_volume_claim.as_ref().unwrap().claim_name,
        claim_name,
        "the Job mounts the writer view claim of its namespace"
    );
    let writer_claims: Api<PersistentVolumeClaim> = s.app.api();
    let writer_claim =
        eventually("the writer view claim bound", WAIT, || {
            let api = writer_claims.clone();
            let claim_name = claim_name.clone();
            async move {
                api.get_opt(&claim_name).await.ok().flatten().filter(|c| {
                    c.status.as_ref().and_then(|st| st.phase.as_deref()) == Some("Bound")
                })
            }
        })
        .await
        .unwrap();
    let writer_pv = pvs
        .get(
            writer_claim
                .spec
                .as_ref()
                .unwrap()
                .volume_name
                .as_ref()
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        writer_pv
            .spec
            .as_ref()
            .unwrap()
            .csi
            .as_ref()
            .unwrap()
            .volume_handle,
        format!("{}-handle", s.pv_name),
        "the writer view reaches the primary's data"
    );

    // The reference, and the view recorded and created while the download runs.
    let view_claim = reader_pvc_name(&identity);
    let b = eventually("the reference and the view", WAIT, || {
        let api = s.bindings.clone();
        let name = name.clone();
        async move {
            let b = api.get(&name).await.ok()?;
            let st = b.status.as_ref()?;
            (st.request_references.len() == 1
                && st.realized.as_ref().is_some_and(|r| r.views.len() == 1))
            .then_some(b)
        }
    })
    .await
    .unwrap();
    let st = b.status.as_ref().unwrap();
    assert_eq!(st.request_references[0].kind, "Pod");
    assert_eq!(st.request_references[0].uid, pod.uid().unwrap());
    assert_eq!(st.request_reference_count, Some(1));
    assert_eq!(st.unreferenced_since, None);
    assert_eq!(st.model_uri.as_deref(), Some(HANDLE));
    assert_eq!(population(&b), Some(PopulationState::Populating));
    let view = &st.realized.as_ref().unwrap().views[0];
    assert_eq!(view.namespace, s.app.name);
    assert_eq!(view.persistent_volume_claim_name, view_claim);
    let view_claims: Api<PersistentVolumeClaim> = s.app.api();
    eventually("the read-only view bound", WAIT, || {
        let api = view_claims.clone();
        let view_claim = view_claim.clone();
        async move {
            api.get_opt(&view_claim)
                .await
                .ok()
                .flatten()
                .filter(|c| c.status.as_ref().and_then(|st| st.phase.as_deref()) == Some("Bound"))
        }
    })
    .await
    .unwrap();
    let view_pv = pvs.get(&view.persistent_volume_name).await.unwrap();
    let vspec = view_pv.spec.unwrap();
    assert_eq!(vspec.csi.as_ref().unwrap().read_only, Some(true));
    // "" and absent are the same for a PV (the API server omits the empty class).
    assert_eq!(vspec.storage_class_name.unwrap_or_default(), "");
    assert_eq!(
        vspec.persistent_volume_reclaim_policy.as_deref(),
        Some("Retain")
    );
    assert_eq!(vspec.access_modes, Some(vec!["ReadOnlyMany".to_owned()]));

    // The download succeeds: the primary is labelled complete with Retain (it was Delete),
    // the writer claim released only after that, and the binding is Ready with the bytes.
    let kubelet = Kubelet::new(s.client.clone());
    let jp = job_pod(&s.client, &s.app.name, &job_name).await;
    kubelet
        .terminate_container(&s.app.name, &jp.name_any(), "download", 0, "12345")
        .await
        .unwrap();
    kubelet
        .set_phase(&s.app.name, &jp.name_any(), "Succeeded")
        .await
        .unwrap();
    let b = eventually("Ready", WAIT, || {
        let api = s.bindings.clone();
        let name = name.clone();
        async move {
            let b = api.get(&name).await.ok()?;
            (population(&b) == Some(PopulationState::Ready)).then_some(b)
        }
    })
    .await
    .unwrap();
    let primary = pvs.get(&s.pv_name).await.unwrap();
    assert_eq!(
        primary.labels().get(COMPLETE_LABEL).map(String::as_str),
        Some("true")
    );
    assert_eq!(
        primary
            .annotations()
            .get(BYTES_ANNOTATION)
            .map(String::as_str),
        Some("12345")
    );
    assert_eq!(
        primary
            .spec
            .as_ref()
            .unwrap()
            .persistent_volume_reclaim_policy
            .as_deref(),
        Some("Retain")
    );
    let realized = b.status.as_ref().unwrap().realized.as_ref().unwrap();
    assert_eq!(realized.bytes, Some(12345));
    assert_eq!(
        realized.provider_data_identity.as_deref(),
        Some(format!("{}-handle", s.pv_name).as_str())
    );
    assert_eq!(
        realized.bound_persistent_volume_name.as_ref(),
        Some(&s.pv_name)
    );
    let (status, reason, _) = condition(&b, "Ready").unwrap();
    assert_eq!((status, reason), ("True", "Downloaded"));
    assert!(
        b.status
            .as_ref()
            .unwrap()
            .conditions
            .iter()
            .all(|c| c.observed_generation == Some(1)),
        "{:?}",
        b.status
    );
    eventually("the writer view claim released", WAIT, || {
        let api = writer_claims.clone();
        let claim_name = claim_name.clone();
        async move {
            match api.get_opt(&claim_name).await {
                Ok(None) => Some(()),
                Ok(Some(c)) if c.metadata.deletion_timestamp.is_some() => Some(()),
                _ => None,
            }
        }
    })
    .await
    .unwrap();
    // Nothing else was deleted: the primary claim and the view stay.
    assert!(primary_claims.get_opt(&claim_name).await.unwrap().is_some());
    assert!(view_claims.get_opt(&view_claim).await.unwrap().is_some());
    assert!(pvs.get_opt(&writer_pv.name_any()).await.unwrap().is_some());

    // More readers of the Ready cache: each one's reconcile reads no claim from the API server
    // (the claims it needs are in its caches, and the retired writer view's names are not
    // looked up once the copy is complete): the per-pod cost the scale benchmark measures.
    let claim_gets = |metrics: &str| {
        sample(
            metrics,
            "warmcache_binding_controller_api_requests_total{resource=\"persistentvolumeclaims\",verb=\"get\"}",
        )
        .unwrap_or(0.0)
    };
    let gets_before = claim_gets(&scrape(s.admin).await);
    for i in 1..=3 {
        pods.create(
            &PostParams::default(),
            &reader_pod(&format!("reader-{i}"), &b),
        )
        .await
        .unwrap();
    }
    eventually("four references", WAIT, || {
        let api = s.bindings.clone();
        let name = name.clone();
        async move {
            let b = api.get(&name).await.ok()?;
            (b.status?.request_references.len() == 4).then_some(())
        }
    })
    .await
    .unwrap();
    assert_eq!(
        claim_gets(&scrape(s.admin).await),
        gets_before,
        "reconciles of a Ready binding read no claims"
    );

    assert_settled(&s.bindings, &name).await;

    // The controller's metrics: one download started and succeeded, one view, Ready counted;
    // labels are fixed words only.
    let metrics = scrape(s.admin).await;
    let m = |series: &str| sample(&metrics, &format!("warmcache_binding_controller_{series}"));
    assert_eq!(m("downloads_started_total"), Some(1.0), "{metrics}");
    assert_eq!(m("downloads_succeeded_total"), Some(1.0));
    assert_eq!(m("downloads_failed_total"), Some(0.0));
    assert_eq!(m("views_created_total"), Some(1.0));
    assert_eq!(m("bindings{population=\"Ready\"}"), Some(1.0));
    assert_eq!(m("bindings_by_phase{phase=\"Active\"}"), Some(1.0));
    assert_eq!(m("bindings_by_phase{phase=\"Retiring\"}"), Some(0.0));
    // The bytes the Job measured: downloaded once, and now held by a Ready cache.
    assert_eq!(m("downloaded_bytes_total"), Some(12345.0), "{metrics}");
    assert_eq!(m("cached_bytes"), Some(12345.0), "{metrics}");
    assert_eq!(m("time_to_ready_seconds_count"), Some(1.0));
    // Asks, not creations: a reconcile that runs before the Job reaches the controller's cache
    // asks again and meets AlreadyExists (the create is atomic), so under load this can be 2;
    // exactly one Job is what downloads_started_total (creations) proves above.
    assert!(
        m("actions_total{action=\"create_job\"}") >= Some(1.0),
        "{metrics}"
    );
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("warmcache_binding_controller_"))
    {
        assert!(
            !line.contains(&name) && !line.contains(&s.app.name),
            "an object name in a metric label: {line}"
        );
    }

    // Only one Job ever: the name is the election.
    let all = jobs.list(&ListParams::default()).await.unwrap();
    assert_eq!(all.items.len(), 1);

    // The workload goes: its references are stale (NotFound) and pruned, the time recorded for
    // the reaper; the view stays (deleting is the reaper's).
    for i in 0..=3 {
        pods.delete(&format!("reader-{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    let b = eventually("the stale reference pruned", WAIT, || {
        let api = s.bindings.clone();
        let name = name.clone();
        async move {
            let b = api.get(&name).await.ok()?;
            b.status
                .as_ref()?
                .request_references
                .is_empty()
                .then_some(b)
        }
    })
    .await
    .unwrap();
    let st = b.status.as_ref().unwrap();
    assert!(st.unreferenced_since.is_some());
    assert_eq!(st.request_reference_count, Some(0));
    assert_eq!(st.realized.as_ref().unwrap().views.len(), 1);
    assert!(view_claims.get_opt(&view_claim).await.unwrap().is_some());

    stop.cancel();
    let _ = pvs.delete(&s.pv_name, &DeleteParams::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_download_reports_its_last_words_and_keeps_the_primary() {
    let (s, stop) = setup("mcb-fail").await;
    let name = s.binding.name_any();
    let identity = s.binding.spec.identity.clone();
    let claim_name = writer_pvc_name(&identity);
    let pvs: Api<PersistentVolume> = Api::all(s.client.clone());
    pvs.create(
        &PostParams::default(),
        &primary_pv(&s.pv_name, &s.control.name, &claim_name),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = s.app.api();
    pods.create(&PostParams::default(), &reader_pod("reader-0", &s.binding))
        .await
        .unwrap();
    let job_name = writer_job_name(&identity);
    let jp = job_pod(&s.client, &s.app.name, &job_name).await;
    let kubelet = Kubelet::new(s.client.clone());
    kubelet
        .terminate_container(
            &s.app.name,
            &jp.name_any(),
            "download",
            1,
            "nvsnap: download exited 1: 401 Client Error: Unauthorized for url",
        )
        .await
        .unwrap();
    kubelet
        .set_phase(&s.app.name, &jp.name_any(), "Failed")
        .await
        .unwrap();
    let b = eventually("Failed", WAIT, || {
        let api = s.bindings.clone();
        let name = name.clone();
        async move {
            let b = api.get(&name).await.ok()?;
            (population(&b) == Some(PopulationState::Failed)).then_some(b)
        }
    })
    .await
    .unwrap();
    let (status, reason, message) = condition(&b, "Degraded").unwrap();
    assert_eq!((status, reason), ("True", "DownloadFailed"));
    assert!(message.contains("401 Client Error"), "{message}");
    let (ready, _, _) = condition(&b, "Ready").unwrap();
    assert_eq!(ready, "False");
    // Counted once as a failed download, nothing as downloaded or cached. The gauge counts the
    // watch cache after a reconcile, so it follows the stored Failed on the next one.
    let metrics = eventually("the failure counted", WAIT, || {
        let admin = s.admin;
        async move {
            let metrics = scrape(admin).await;
            let m =
                |series: &str| sample(&metrics, &format!("warmcache_binding_controller_{series}"));
            (m("downloads_failed_total") == Some(1.0)
                && m("bindings{population=\"Failed\"}") == Some(1.0))
            .then_some(metrics)
        }
    })
    .await
    .unwrap();
    let m = |series: &str| sample(&metrics, &format!("warmcache_binding_controller_{series}"));
    assert_eq!(m("downloads_succeeded_total"), Some(0.0), "{metrics}");
    assert_eq!(m("downloaded_bytes_total"), Some(0.0), "{metrics}");
    assert_eq!(m("cached_bytes"), Some(0.0), "{metrics}");
    // The primary claim is kept for a retry and never labelled complete; the writer view claim
    // is retired.
    let primary_claims: Api<PersistentVolumeClaim> = s.control.api();
    assert!(primary_claims.get_opt(&claim_name).await.unwrap().is_some());
    let primary = pvs.get(&s.pv_name).await.unwrap();
    assert!(!primary.labels().contains_key(COMPLETE_LABEL));
    let writer_claims: Api<PersistentVolumeClaim> = s.app.api();
    eventually("the writer view claim retired", WAIT, || {
        let api = writer_claims.clone();
        let claim_name = claim_name.clone();
        async move {
            match api.get_opt(&claim_name).await {
                Ok(None) => Some(()),
                Ok(Some(c)) if c.metadata.deletion_timestamp.is_some() => Some(()),
                _ => None,
            }
        }
    })
    .await
    .unwrap();
    stop.cancel();
    let _ = pods.delete("reader-0", &DeleteParams::default()).await;
    let _ = pvs.delete(&s.pv_name, &DeleteParams::default()).await;
}

async fn wait_gone(api: &Api<PersistentVolumeClaim>, name: &str) {
    eventually(&format!("claim {name} released"), WAIT, || {
        let api = api.clone();
        let name = name.to_owned();
        async move {
            match api.get_opt(&name).await {
                Ok(None) => Some(()),
                Ok(Some(c)) if c.metadata.deletion_timestamp.is_some() => Some(()),
                _ => None,
            }
        }
    })
    .await
    .unwrap();
}

/// helmModelCache across two namespaces of one domain, a third namespace outside it whose pod
/// forges the binding's annotations, and a controller restarted in the middle: one primary, one
/// Job, views for exactly the two domain namespaces, references only from them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharing_domain_gets_one_download_and_a_view_per_namespace_across_a_restart() {
    let plane = ControlPlane::shared().await.unwrap();
    let client = plane.client().await.unwrap();
    let control = TestNamespace::new("mcb-dom-ctl").await.unwrap();
    let a = TestNamespace::new("mcb-dom-a").await.unwrap();
    let b_ns = TestNamespace::new("mcb-dom-b").await.unwrap();
    let outsider = TestNamespace::new("mcb-dom-x").await.unwrap();
    let domain = format!("domain-{}", control.name);
    label_domain(&client, &a.name, &domain).await;
    label_domain(&client, &b_ns.name, &domain).await;
    let bindings: Api<ModelCacheBinding> = control.api();
    let created = bindings
        .create(
            &PostParams::default(),
            &binding_for(&control.name, &a.name, Workflow::HelmModelCache, &domain),
        )
        .await
        .unwrap();
    let name = created.name_any();
    let identity = created.spec.identity.clone();
    let claim_name = writer_pvc_name(&identity);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv_name = format!("{}-primary", control.name);
    pvs.create(
        &PostParams::default(),
        &primary_pv(&pv_name, &control.name, &claim_name),
    )
    .await
    .unwrap();
    for ns in [&a, &b_ns, &outsider] {
        ns.api::<Pod>()
            .create(&PostParams::default(), &reader_pod("reader-0", &created))
            .await
            .unwrap();
    }

    // First controller: up to the Job, then stopped.
    let (stop, task) = running_controller(plane, &control.name).await;
    let jobs: Api<Job> = a.api();
    let job_name = writer_job_name(&identity);
    eventually("the writer Job", WAIT, || {
        let jobs = jobs.clone();
        let job_name = job_name.clone();
        async move { jobs.get_opt(&job_name).await.ok().flatten() }
    })
    .await
    .unwrap();
    stop.cancel();
    let _ = task.await;

    // Second controller finishes from what is stored.
    let (stop, task) = running_controller(plane, &control.name).await;
    let jp = job_pod(&client, &a.name, &job_name).await;
    let kubelet = Kubelet::new(client.clone());
    kubelet
        .terminate_container(&a.name, &jp.name_any(), "download", 0, "777")
        .await
        .unwrap();
    kubelet
        .set_phase(&a.name, &jp.name_any(), "Succeeded")
        .await
        .unwrap();
    let view_claim = reader_pvc_name(&identity);
    let done = eventually("Ready with both views bound", WAIT, || {
        let bindings = bindings.clone();
        let name = name.clone();
        let (a, b_ns) = (
            a.api::<PersistentVolumeClaim>(),
            b_ns.api::<PersistentVolumeClaim>(),
        );
        let view_claim = view_claim.clone();
        async move {
            let b = bindings.get(&name).await.ok()?;
            if population(&b) != Some(PopulationState::Ready) {
                return None;
            }
            for api in [a, b_ns] {
                let c = api.get_opt(&view_claim).await.ok()??;
                (c.status?.phase.as_deref() == Some("Bound")).then_some(())?;
            }
            Some(b)
        }
    })
    .await
    .unwrap();
    let st = done.status.as_ref().unwrap();
    let mut view_namespaces: Vec<&str> = st
        .realized
        .as_ref()
        .unwrap()
        .views
        .iter()
        .map(|v| v.namespace.as_str())
        .collect();
    view_namespaces.sort_unstable();
    let mut expected = vec![a.name.as_str(), b_ns.name.as_str()];
    expected.sort_unstable();
    assert_eq!(view_namespaces, expected, "no view outside the domain");
    let mut ref_namespaces: Vec<&str> = st
        .request_references
        .iter()
        .map(|r| r.namespace.as_str())
        .collect();
    ref_namespaces.sort_unstable();
    assert_eq!(
        ref_namespaces, expected,
        "no reference from outside the domain"
    );
    assert_eq!(realized_bytes(&done), Some(777));
    // The forged pod's namespace got nothing.
    assert!(
        outsider
            .api::<PersistentVolumeClaim>()
            .get_opt(&view_claim)
            .await
            .unwrap()
            .is_none()
    );
    // One primary claim, one Job, in all.
    assert_eq!(
        jobs.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    for ns in [&b_ns, &outsider] {
        assert!(
            ns.api::<Job>()
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
        );
    }
    assert!(
        control
            .api::<PersistentVolumeClaim>()
            .get_opt(&claim_name)
            .await
            .unwrap()
            .is_some()
    );
    // The two views reach the same data.
    for v in &st.realized.as_ref().unwrap().views {
        let pv = pvs.get(&v.persistent_volume_name).await.unwrap();
        assert_eq!(
            pv.spec.unwrap().csi.unwrap().volume_handle,
            format!("{pv_name}-handle")
        );
    }
    stop.cancel();
    let _ = task.await;
    let _ = pvs.delete(&pv_name, &DeleteParams::default()).await;
}

fn realized_bytes(b: &ModelCacheBinding) -> Option<i64> {
    b.status.as_ref()?.realized.as_ref()?.bytes
}

/// A failed download is retried once its Job is gone (its TTL): the released writer view PV is
/// rebound to a new writer claim, a new Job runs, and its success clears the failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_download_is_retried_after_its_job_is_gone_and_success_clears_it() {
    let (s, stop) = setup("mcb-retry").await;
    let name = s.binding.name_any();
    let identity = s.binding.spec.identity.clone();
    let claim_name = writer_pvc_name(&identity);
    let pvs: Api<PersistentVolume> = Api::all(s.client.clone());
    pvs.create(
        &PostParams::default(),
        &primary_pv(&s.pv_name, &s.control.name, &claim_name),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = s.app.api();
    pods.create(&PostParams::default(), &reader_pod("reader-0", &s.binding))
        .await
        .unwrap();
    let job_name = writer_job_name(&identity);
    let kubelet = Kubelet::new(s.client.clone());
    let jp = job_pod(&s.client, &s.app.name, &job_name).await;
    kubelet
        .terminate_container(
            &s.app.name,
            &jp.name_any(),
            "download",
            1,
            "nvsnap: download exited 1: disk full",
        )
        .await
        .unwrap();
    kubelet
        .set_phase(&s.app.name, &jp.name_any(), "Failed")
        .await
        .unwrap();
    eventually("Failed", WAIT, || {
        let api = s.bindings.clone();
        let name = name.clone();
        async move {
            let b = api.get(&name).await.ok()?;
            (population(&b) == Some(PopulationState::Failed)).then_some(())
        }
    })
    .await
    .unwrap();
    let writer_claims: Api<PersistentVolumeClaim> = s.app.api();
    wait_gone(&writer_claims, &claim_name).await;

    // The Job's TTL: gone (with its pods).
    let jobs: Api<Job> = s.app.api();
    let old_uid = jobs.get(&job_name).await.unwrap().uid().unwrap();
    jobs.delete(
        &job_name,
        &DeleteParams {
            propagation_policy: Some(kube::api::PropagationPolicy::Foreground),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    let _ = pods.delete(&jp.name_any(), &DeleteParams::default()).await;

    // A new Job and a new writer claim bound to the same writer view PV.
    let new_job = eventually("a new writer Job", WAIT, || {
        let jobs = jobs.clone();
        let job_name = job_name.clone();
        let old_uid = old_uid.clone();
        async move {
            jobs.get_opt(&job_name).await.ok().flatten().filter(|j| {
                j.uid().as_ref() != Some(&old_uid) && j.metadata.deletion_timestamp.is_none()
            })
        }
    })
    .await
    .unwrap();
    let rebound = eventually("the new writer claim bound", WAIT, || {
        let api = writer_claims.clone();
        let claim_name = claim_name.clone();
        async move {
            api.get_opt(&claim_name)
                .await
                .ok()
                .flatten()
                .filter(|c| c.metadata.deletion_timestamp.is_none())
                .filter(|c| c.status.as_ref().and_then(|st| st.phase.as_deref()) == Some("Bound"))
        }
    })
    .await
    .unwrap();
    assert!(
        rebound
            .spec
            .unwrap()
            .volume_name
            .unwrap()
            .starts_with(&claim_name)
    );
    let jp = job_pod(&s.client, &s.app.name, &new_job.name_any()).await;
    kubelet
        .terminate_container(&s.app.name, &jp.name_any(), "download", 0, "4096")
        .await
        .unwrap();
    kubelet
        .set_phase(&s.app.name, &jp.name_any(), "Succeeded")
        .await
        .unwrap();
    let b = eventually("Ready after the retry", WAIT, || {
        let api = s.bindings.clone();
        let name = name.clone();
        async move {
            let b = api.get(&name).await.ok()?;
            (population(&b) == Some(PopulationState::Ready)).then_some(b)
        }
    })
    .await
    .unwrap();
    let (degraded, reason, _) = condition(&b, "Degraded").unwrap();
    assert_eq!(
        (degraded, reason),
        ("False", "AsExpected"),
        "success clears the failure"
    );
    assert_eq!(realized_bytes(&b), Some(4096));
    stop.cancel();
    let _ = pods.delete("reader-0", &DeleteParams::default()).await;
    let _ = pvs.delete(&s.pv_name, &DeleteParams::default()).await;
}

/// A claim under the view's name that this binding did not create (a tenant's, naming another
/// volume) is never adopted: the binding says Degraded/ForeignObject and the claim is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_claim_under_the_view_name_is_reported_and_left_alone() {
    let (s, stop) = setup("mcb-foreign").await;
    let name = s.binding.name_any();
    let identity = s.binding.spec.identity.clone();
    let view_claim = reader_pvc_name(&identity);
    let claims: Api<PersistentVolumeClaim> = s.app.api();
    let foreign: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": { "name": view_claim },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": "somebody-elses-volume",
            "resources": { "requests": { "storage": "1Gi" } },
        },
    }))
    .unwrap();
    let foreign = claims
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let pvs: Api<PersistentVolume> = Api::all(s.client.clone());
    pvs.create(
        &PostParams::default(),
        &primary_pv(&s.pv_name, &s.control.name, &writer_pvc_name(&identity)),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = s.app.api();
    pods.create(&PostParams::default(), &reader_pod("reader-0", &s.binding))
        .await
        .unwrap();
    let b = eventually("Degraded ForeignObject", WAIT, || {
        let api = s.bindings.clone();
        let name = name.clone();
        async move {
            let b = api.get(&name).await.ok()?;
            let (status, reason, _) = condition(&b, "Degraded")?;
            (status == "True" && reason == "ForeignObject").then_some(b)
        }
    })
    .await
    .unwrap();
    let (_, _, message) = condition(&b, "Degraded").unwrap();
    assert!(message.contains(&view_claim), "{message}");
    assert_settled(&s.bindings, &name).await;
    let after = claims.get(&view_claim).await.unwrap();
    assert_eq!(after.uid(), foreign.uid());
    assert_eq!(
        after.spec.unwrap().volume_name.as_deref(),
        Some("somebody-elses-volume")
    );
    stop.cancel();
    let _ = pods.delete("reader-0", &DeleteParams::default()).await;
    let _ = pvs.delete(&s.pv_name, &DeleteParams::default()).await;
}

/// The primary claim binds to an Available PV of the class that nobody provisioned for it (a
/// static PV, no `pv.kubernetes.io/provisioned-by`): the binding reports ForeignObject naming
/// it, and the PV is never labelled, retained or viewed, and no writer starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_bound_to_a_foreign_available_pv_is_never_written() {
    let plane = ControlPlane::shared().await.unwrap();
    let client = plane.client().await.unwrap();
    let control = TestNamespace::new("mcb-fpv-ctl").await.unwrap();
    let app = TestNamespace::new("mcb-fpv-app").await.unwrap();
    // A size no other test's claim asks for, so only this test's primary claim matches it.
    let size = "7Gi";
    let pv_name = format!("{}-static", control.name);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    pvs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": { "name": pv_name },
            "spec": {
                "capacity": { "storage": size },
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": "nvcf-sc",
                "csi": { "driver": "fake.csi.warmcache.io", "volumeHandle": format!("{pv_name}-handle") },
            },
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    let bindings: Api<ModelCacheBinding> = control.api();
    let created = bindings
        .create(&PostParams::default(), &binding(&control.name, &app.name))
        .await
        .unwrap();
    let name = created.name_any();
    let (stop, task, _) = running_controller_cfg(
        plane,
        &control.name,
        None,
        None,
        LifecycleConfig {
            primary_size: k8s_openapi::apimachinery::pkg::api::resource::Quantity(size.into()),
            ..LifecycleConfig::default()
        },
    )
    .await;
    let pods: Api<Pod> = app.api();
    pods.create(&PostParams::default(), &reader_pod("reader-0", &created))
        .await
        .unwrap();
    let claims: Api<PersistentVolumeClaim> = control.api();
    let claim_name = writer_pvc_name(&created.spec.identity);
    eventually("the primary claim bound to the static PV", WAIT, || {
        let claims = claims.clone();
        let (claim_name, pv_name) = (claim_name.clone(), pv_name.clone());
        async move {
            let c = claims.get(&claim_name).await.ok()?;
            (c.spec?.volume_name? == pv_name).then_some(())
        }
    })
    .await
    .unwrap();
    let b = eventually("Degraded ForeignObject", WAIT, || {
        let api = bindings.clone();
        let name = name.clone();
        async move {
            let b = api.get(&name).await.ok()?;
            let (status, reason, _) = condition(&b, "Degraded")?;
            (status == "True" && reason == "ForeignObject").then_some(b)
        }
    })
    .await
    .unwrap();
    let (_, _, message) = condition(&b, "Degraded").unwrap();
    assert!(
        message.contains(&pv_name) && message.contains("pv.kubernetes.io/provisioned-by"),
        "{message}"
    );
    assert_settled(&bindings, &name).await;
    let b = bindings.get(&name).await.unwrap();
    let realized = b.status.unwrap().realized.unwrap_or_default();
    assert_eq!(realized.bound_persistent_volume_name, None);
    assert!(realized.views.is_empty());
    let pv = pvs.get(&pv_name).await.unwrap();
    assert!(!pv.labels().contains_key(COMPLETE_LABEL), "{pv:?}");
    assert_eq!(
        pv.spec.unwrap().persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    let jobs: Api<Job> = app.api();
    assert!(
        jobs.get_opt(&writer_job_name(&created.spec.identity))
            .await
            .unwrap()
            .is_none(),
        "no writer Job"
    );
    let app_claims: Api<PersistentVolumeClaim> = app.api();
    assert!(
        app_claims.get_opt(&claim_name).await.unwrap().is_none(),
        "no writer view"
    );
    stop.cancel();
    let _ = task.await;
    let _ = pods.delete("reader-0", &DeleteParams::default()).await;
    let _ = claims.delete(&claim_name, &DeleteParams::default()).await;
    let _ = pvs.delete(&pv_name, &DeleteParams::default()).await;
}

/// A binding of `<prefix>-ctl` read by `<prefix>-app`, and its primary PV (provisioned by
/// hand, not yet bound).
struct Seeded {
    client: Client,
    control: TestNamespace,
    app: TestNamespace,
    bindings: Api<ModelCacheBinding>,
    created: ModelCacheBinding,
    name: String,
    identity: warmcache_api_modelcache::v2beta1::BindingIdentity,
    claim_name: String,
    pv_name: String,
    pvs: Api<PersistentVolume>,
}

async fn seeded(plane: &ControlPlane, prefix: &str) -> Seeded {
    let client = plane.client().await.unwrap();
    let control = TestNamespace::new(&format!("{prefix}-ctl")).await.unwrap();
    let app = TestNamespace::new(&format!("{prefix}-app")).await.unwrap();
    let bindings: Api<ModelCacheBinding> = control.api();
    let created = bindings
        .create(&PostParams::default(), &binding(&control.name, &app.name))
        .await
        .unwrap();
    let name = created.name_any();
    let identity = created.spec.identity.clone();
    let claim_name = writer_pvc_name(&identity);
    let pv_name = format!("{}-primary", control.name);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    pvs.create(
        &PostParams::default(),
        &primary_pv(&pv_name, &control.name, &claim_name),
    )
    .await
    .unwrap();
    Seeded {
        client,
        control,
        app,
        bindings,
        created,
        name,
        identity,
        claim_name,
        pv_name,
        pvs,
    }
}

/// Completion against conflicting writes of the primary PV: two conflicts are retried on a fresh
/// read and complete; conflicts on every attempt leave the PV unlabelled and the writer claim in
/// place (reported, retried later), and once they stop the completion is stored and only then
/// is the writer claim released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_conflicts_are_retried_and_a_persistent_one_keeps_the_writer_claim() {
    let plane = ControlPlane::shared().await.unwrap();
    let Seeded {
        client,
        control,
        app,
        bindings,
        created,
        name,
        identity,
        claim_name,
        pv_name,
        pvs,
    } = seeded(plane, "mcb-conflict").await;
    let faults = warmcache_testkit::FaultInjector::new();
    // Every completion write conflicts (more than the bounded retries of one reconcile).
    faults.inject(
        http::Method::PUT,
        &format!("/persistentvolumes/{pv_name}"),
        warmcache_testkit::Fault::Conflict,
        1000,
    );
    let faulty = plane.client_with_faults(faults.clone()).await.unwrap();
    let (stop, task, _) = running_controller_with(plane, &control.name, Some(faulty), None).await;
    let pods: Api<Pod> = app.api();
    pods.create(&PostParams::default(), &reader_pod("reader-0", &created))
        .await
        .unwrap();
    let job_name = writer_job_name(&identity);
    let jp = job_pod(&client, &app.name, &job_name).await;
    let kubelet = Kubelet::new(client.clone());
    kubelet
        .terminate_container(&app.name, &jp.name_any(), "download", 0, "2048")
        .await
        .unwrap();
    kubelet
        .set_phase(&app.name, &jp.name_any(), "Succeeded")
        .await
        .unwrap();
    eventually("several conflicting completion writes", WAIT, || {
        let faults = faults.clone();
        async move { (faults.injected() >= 6).then_some(()) }
    })
    .await
    .unwrap();
    let b = eventually("CompletionNotStored reported", WAIT, || {
        let api = bindings.clone();
        let name = name.clone();
        async move {
            let b = api.get(&name).await.ok()?;
            let (status, reason, _) = condition(&b, "Degraded")?;
            (status == "True" && reason == "CompletionNotStored").then_some(b)
        }
    })
    .await
    .unwrap();
    assert_eq!(population(&b), Some(PopulationState::Populating));
    let (_, reason, _) = condition(&b, "Progressing").unwrap();
    assert_eq!(reason, "Completing");
    let primary = pvs.get(&pv_name).await.unwrap();
    assert!(!primary.labels().contains_key(COMPLETE_LABEL));
    let writer_claims: Api<PersistentVolumeClaim> = app.api();
    let kept = writer_claims.get(&claim_name).await.unwrap();
    assert!(
        kept.metadata.deletion_timestamp.is_none(),
        "the writer claim is kept while completion is not stored"
    );

    // The conflicts stop after two more: the next attempt retries them and stores completion.
    faults.clear();
    faults.inject(
        http::Method::PUT,
        &format!("/persistentvolumes/{pv_name}"),
        warmcache_testkit::Fault::Conflict,
        2,
    );
    let before = faults.injected();
    let b = eventually("Ready", Duration::from_secs(120), || {
        let api = bindings.clone();
        let name = name.clone();
        async move {
            let b = api.get(&name).await.ok()?;
            (population(&b) == Some(PopulationState::Ready)).then_some(b)
        }
    })
    .await
    .unwrap();
    assert_eq!(
        faults.injected() - before,
        2,
        "both conflicts were met and retried"
    );
    assert_eq!(realized_bytes(&b), Some(2048));
    let primary = pvs.get(&pv_name).await.unwrap();
    assert_eq!(
        primary.labels().get(COMPLETE_LABEL).map(String::as_str),
        Some("true")
    );
    wait_gone(&writer_claims, &claim_name).await;
    stop.cancel();
    let _ = task.await;
    let _ = pods.delete("reader-0", &DeleteParams::default()).await;
    let _ = pvs.delete(&pv_name, &DeleteParams::default()).await;
}

/// Warm start: after a binding is retired (what the reaper deletes: the binding, its Job, its
/// claims and views; the complete primary PV is retained and Released), a new binding of the
/// same cache adopts that PV: its primary claim binds to it, it is Ready with the recorded bytes,
/// and no Job runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_binding_adopts_the_retained_complete_primary_without_downloading() {
    let (s, stop) = setup("mcb-warm").await;
    let name = s.binding.name_any();
    let identity = s.binding.spec.identity.clone();
    let claim_name = writer_pvc_name(&identity);
    let pvs: Api<PersistentVolume> = Api::all(s.client.clone());
    pvs.create(
        &PostParams::default(),
        &primary_pv(&s.pv_name, &s.control.name, &claim_name),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = s.app.api();
    pods.create(&PostParams::default(), &reader_pod("reader-0", &s.binding))
        .await
        .unwrap();
    let job_name = writer_job_name(&identity);
    let jp = job_pod(&s.client, &s.app.name, &job_name).await;
    let kubelet = Kubelet::new(s.client.clone());
    kubelet
        .terminate_container(&s.app.name, &jp.name_any(), "download", 0, "31337")
        .await
        .unwrap();
    kubelet
        .set_phase(&s.app.name, &jp.name_any(), "Succeeded")
        .await
        .unwrap();
    let ready = eventually("Ready", WAIT, || {
        let api = s.bindings.clone();
        let name = name.clone();
        async move {
            let b = api.get(&name).await.ok()?;
            (population(&b) == Some(PopulationState::Ready)).then_some(b)
        }
    })
    .await
    .unwrap();
    let views = ready.status.unwrap().realized.unwrap().views;
    stop.cancel();

    // Retirement, as the reaper does it.
    let gone = DeleteParams::default();
    let _ = pods.delete("reader-0", &gone).await;
    let jobs: Api<Job> = s.app.api();
    jobs.delete(
        &job_name,
        &DeleteParams {
            propagation_policy: Some(kube::api::PropagationPolicy::Background),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    for v in &views {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(s.client.clone(), &v.namespace);
        let _ = claims.delete(&v.persistent_volume_claim_name, &gone).await;
        let _ = pvs.delete(&v.persistent_volume_name, &gone).await;
    }
    let primary_claims: Api<PersistentVolumeClaim> = s.control.api();
    primary_claims.delete(&claim_name, &gone).await.unwrap();
    s.bindings
        .patch(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .unwrap();
    s.bindings.delete(&name, &gone).await.unwrap();
    eventually(
        "the retained primary Released, the old Job and binding gone",
        WAIT,
        || {
            let (pvs, jobs, bindings) = (pvs.clone(), jobs.clone(), s.bindings.clone());
            let (pv, job, name) = (s.pv_name.clone(), job_name.clone(), name.clone());
            async move {
                let released =
                    pvs.get(&pv).await.ok()?.status?.phase.as_deref() == Some("Released");
                let no_job = jobs.get_opt(&job).await.ok()?.is_none();
                let no_binding = bindings.get_opt(&name).await.ok()?.is_none();
                (released && no_job && no_binding).then_some(())
            }
        },
    )
    .await
    .unwrap();

    // A new binding of the same cache, a new reader, a new controller.
    let again = s
        .bindings
        .create(
            &PostParams::default(),
            &binding(&s.control.name, &s.app.name),
        )
        .await
        .unwrap();
    assert_eq!(again.name_any(), name, "the same cache, the same name");
    pods.create(&PostParams::default(), &reader_pod("reader-1", &again))
        .await
        .unwrap();
    let plane = ControlPlane::shared().await.unwrap();
    let (stop, task) = running_controller(plane, &s.control.name).await;
    let b = eventually("Ready from the retained primary", WAIT, || {
        let api = s.bindings.clone();
        let name = name.clone();
        async move {
            let b = api.get(&name).await.ok()?;
            (population(&b) == Some(PopulationState::Ready)).then_some(b)
        }
    })
    .await
    .unwrap();
    assert_eq!(realized_bytes(&b), Some(31337));
    assert_eq!(
        b.status
            .as_ref()
            .unwrap()
            .realized
            .as_ref()
            .unwrap()
            .bound_persistent_volume_name
            .as_ref(),
        Some(&s.pv_name)
    );
    let claim = primary_claims.get(&claim_name).await.unwrap();
    assert_eq!(claim.spec.unwrap().volume_name.as_ref(), Some(&s.pv_name));
    assert!(
        jobs.get_opt(&job_name).await.unwrap().is_none(),
        "no download for an adopted primary"
    );
    assert_settled(&s.bindings, &name).await;
    assert!(jobs.get_opt(&job_name).await.unwrap().is_none());
    stop.cancel();
    let _ = task.await;
    let _ = pods.delete("reader-1", &DeleteParams::default()).await;
    let _ = pvs.delete(&s.pv_name, &DeleteParams::default()).await;
}

/// Decision drift is reported, never acted on: a binding decided from StorageClass nvcf-sc and
/// the catalog ConfigMap says NoDrift; a catalog edit changing the driver's writer identity makes
/// DecisionDrift True naming the change, while the spec and the writes stay the binding's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decision_drift_is_reported_and_changes_nothing() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::api::storage::v1::StorageClass;
    let plane = ControlPlane::shared().await.unwrap();
    let client = plane.client().await.unwrap();
    let control = TestNamespace::new("mcb-drift-ctl").await.unwrap();
    let app = TestNamespace::new("mcb-drift-app").await.unwrap();
    let classes: Api<StorageClass> = Api::all(client.clone());
    let driver = format!("{}.csi.warmcache.io", control.name);
    let sc: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": { "name": warmcache_api_modelcache::MODEL_CACHE_STORAGE_CLASS },
        "provisioner": driver,
        "reclaimPolicy": "Retain",
    }))
    .unwrap();
    let sc = classes.create(&PostParams::default(), &sc).await.unwrap();
    let catalog = |identity: &str| -> ConfigMap {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": warmcache_catalog::CONFIG_MAP_NAME },
            "data": { warmcache_catalog::CONFIG_MAP_KEY: format!(
                "apiVersion: storage.nvcf.nvidia.com/v1alpha1\nkind: StorageCapabilityCatalog\ndrivers:\n  - name: {driver}\n    provider: testFs\n    accessModes: [ReadWriteMany]\n    readerMountOptions: []\n    writerIdentity: {identity}\n"
            ) },
        }))
        .unwrap()
    };
    let config_maps: Api<ConfigMap> = control.api();
    let cm = config_maps
        .create(&PostParams::default(), &catalog("fsGroup"))
        .await
        .unwrap();
    // The binding as the webhook decides it from that storage.
    let inputs = warmcache_catalog::DecisionInputs {
        storage_class: Some(&sc),
        csi_driver: None,
        catalog: warmcache_catalog::CatalogInput::ConfigMap(&cm),
        workflow: Workflow::RegularModelCache,
        gates: warmcache_catalog::Gates {
            caching_support: true,
            helm_model_caching: true,
            model_cache_encryption: false,
        },
    };
    let Ok(warmcache_catalog::Outcome::Durable(d)) = warmcache_catalog::decide(&inputs) else {
        panic!("the test catalog gives a durable cache");
    };
    let mut wanted = binding(&control.name, &app.name);
    wanted.spec.decision = d.decision.clone();
    wanted.spec.storage_class = d.storage_class.clone();
    let bindings: Api<ModelCacheBinding> = control.api();
    let created = bindings
        .create(&PostParams::default(), &wanted)
        .await
        .unwrap();
    let name = created.name_any();
    let (stop, task, _) =
        running_controller_with(plane, &control.name, None, Some(&control.name)).await;
    let drift = |want: &'static str| {
        let bindings = bindings.clone();
        let name = name.clone();
        async move {
            eventually(&format!("DecisionDrift {want}"), WAIT, || {
                let bindings = bindings.clone();
                let name = name.clone();
                async move {
                    let b = bindings.get(&name).await.ok()?;
                    let (status, _, _) = condition(&b, "DecisionDrift")?;
                    (status == want).then_some(b)
                }
            })
            .await
            .unwrap()
        }
    };
    let b = drift("False").await;
    assert_eq!(condition(&b, "DecisionDrift").unwrap().1, "NoDrift");

    // The catalog is edited: the driver is now said to need a root writer.
    config_maps
        .replace(
            warmcache_catalog::CONFIG_MAP_NAME,
            &PostParams::default(),
            &{
                let mut next = catalog("root");
                next.metadata.resource_version = cm.metadata.resource_version.clone();
                next
            },
        )
        .await
        .unwrap();
    let b = drift("True").await;
    let (_, reason, message) = condition(&b, "DecisionDrift").unwrap();
    assert_eq!(reason, "DecisionDrift");
    assert!(
        message.contains("writer identity fsGroup -> root"),
        "{message}"
    );
    assert!(message.contains("catalog profile"), "{message}");
    assert_eq!(b.spec, created.spec, "the binding keeps its decision");
    // The primary claim the controller created follows the binding's own decision.
    let claim: PersistentVolumeClaim = control
        .api::<PersistentVolumeClaim>()
        .get(&writer_pvc_name(&created.spec.identity))
        .await
        .unwrap();
    assert_eq!(
        claim.spec.unwrap().storage_class_name.as_deref(),
        Some(warmcache_api_modelcache::MODEL_CACHE_STORAGE_CLASS)
    );
    stop.cancel();
    let _ = task.await;
    let _ = classes
        .delete(
            warmcache_api_modelcache::MODEL_CACHE_STORAGE_CLASS,
            &DeleteParams::default(),
        )
        .await;
}

/// Crash matrix, as failures between writes: every write of the flow fails once (the primary
/// claim, the writer view PV and claim, the Job, the completion update, the claim release, the
/// view PV and claim, the status), so each reconcile stops right after the writes before it;
/// the controller converges from what is stored to Ready with exactly one of each object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_after_any_write_converges_without_duplicates() {
    let plane = ControlPlane::shared().await.unwrap();
    let Seeded {
        client,
        control,
        app,
        bindings,
        created,
        name,
        identity,
        claim_name,
        pv_name,
        pvs,
    } = seeded(plane, "mcb-crash").await;
    let faults = warmcache_testkit::FaultInjector::new();
    let error = warmcache_testkit::Fault::ServerError;
    let ctl_claims = format!("/namespaces/{}/persistentvolumeclaims", control.name);
    let app_claims = format!("/namespaces/{}/persistentvolumeclaims", app.name);
    let status = format!("/modelcachebindings/{name}/status");
    faults.inject(http::Method::PUT, &status, error, 1);
    faults.inject(http::Method::POST, &ctl_claims, error, 1);
    faults.inject(http::Method::POST, "/api/v1/persistentvolumes", error, 2);
    faults.inject(http::Method::POST, &app_claims, error, 2);
    faults.inject(
        http::Method::POST,
        &format!("/namespaces/{}/jobs", app.name),
        error,
        1,
    );
    faults.inject(
        http::Method::PUT,
        &format!("/persistentvolumes/{pv_name}"),
        error,
        1,
    );
    faults.inject(
        http::Method::DELETE,
        &format!("{app_claims}/{claim_name}"),
        error,
        1,
    );
    let injected_rules = 9;
    let faulty = plane.client_with_faults(faults.clone()).await.unwrap();
    let (stop, task, _) = running_controller_with(plane, &control.name, Some(faulty), None).await;
    let pods: Api<Pod> = app.api();
    pods.create(&PostParams::default(), &reader_pod("reader-0", &created))
        .await
        .unwrap();
    let job_name = writer_job_name(&identity);
    let jp = job_pod(&client, &app.name, &job_name).await;
    let kubelet = Kubelet::new(client.clone());
    kubelet
        .terminate_container(&app.name, &jp.name_any(), "download", 0, "999")
        .await
        .unwrap();
    kubelet
        .set_phase(&app.name, &jp.name_any(), "Succeeded")
        .await
        .unwrap();
    let b = ready_with_the_view(&bindings, &name, &app, &identity).await;
    assert_eq!(faults.pending(), 0, "every injected failure was met");
    assert!(faults.injected() >= injected_rules);
    assert_eq!(realized_bytes(&b), Some(999));
    // Exactly one of each.
    let jobs: Api<Job> = app.api();
    assert_eq!(
        jobs.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    let ours = ListParams::default().labels(&format!(
        "{}={name}",
        warmcache_modelvolume::volume_keys::BINDING_LABEL
    ));
    let ctl = control
        .api::<PersistentVolumeClaim>()
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(ctl.items.len(), 1, "one primary claim");
    let views = pvs.list(&ours).await.unwrap();
    let names: Vec<String> = views.items.iter().map(|p| p.name_any()).collect();
    assert_eq!(
        names.len(),
        2,
        "the writer view and one read-only view: {names:?}"
    );
    assert_settled(&bindings, &name).await;
    stop.cancel();
    let _ = task.await;
    let _ = pods.delete("reader-0", &DeleteParams::default()).await;
    let _ = pvs.delete(&pv_name, &DeleteParams::default()).await;
}

/// The binding once Ready and `Reconciled`, the view claim in `app` Bound and the writer view
/// claim released.
async fn ready_with_the_view(
    bindings: &Api<ModelCacheBinding>,
    name: &str,
    app: &TestNamespace,
    identity: &BindingIdentity,
) -> ModelCacheBinding {
    let view_claim = reader_pvc_name(identity);
    let claim_name = writer_pvc_name(identity);
    let app_pvcs: Api<PersistentVolumeClaim> = app.api();
    eventually(
        "Ready and Reconciled, the view bound, the writer claim released",
        Duration::from_secs(180),
        || {
            let api = bindings.clone();
            let app_pvcs = app_pvcs.clone();
            let (view_claim, claim_name) = (view_claim.clone(), claim_name.clone());
            async move {
                let b = api.get(name).await.ok()?;
                if population(&b) != Some(PopulationState::Ready)
                    || condition(&b, "Progressing")?.1 != "Reconciled"
                {
                    return None;
                }
                let view = app_pvcs.get_opt(&view_claim).await.ok()??;
                (view.status?.phase.as_deref() == Some("Bound")).then_some(())?;
                let writer = app_pvcs.get_opt(&claim_name).await.ok()?;
                writer
                    .is_none_or(|c| c.metadata.deletion_timestamp.is_some())
                    .then_some(b)
            }
        },
    )
    .await
    .unwrap()
}

/// The RWX flow of one binding read from one namespace, the controller run as a chain of
/// instances killed right after their writes (`budget`, see [`Crashing`]); the Job's pod
/// succeeds once it exists. Asserts the end state: Ready with the Job's bytes and Reconciled,
/// the view bound, the writer claim released; exactly one Job (the first one's UID), one
/// primary claim, the primary PV complete and retained, the writer view and the read-only view
/// as the only PVs of the binding, the reader kept; no stored version of the binding going
/// back; settled. Returns the crashes.
async fn rwx_flow_with_crashes(
    prefix: &str,
    budget: impl Fn(usize) -> Option<usize> + Send + 'static,
) -> (Crashed, Seeded) {
    let plane = ControlPlane::shared().await.unwrap();
    let s = seeded(plane, prefix).await;
    let done = tokio_util::sync::CancellationToken::new();
    let (versions, recorder) = record_versions(
        s.client.clone(),
        &s.bindings,
        &s.name,
        s.created.resource_version().unwrap(),
        done.clone(),
    );
    let crashing = Crashing::start(plane, &s.control.name, test_lifecycle(), budget);
    let pods: Api<Pod> = s.app.api();
    pods.create(&PostParams::default(), &reader_pod("reader-0", &s.created))
        .await
        .unwrap();
    let job_name = writer_job_name(&s.identity);
    succeed_job(&s.client, &s.app.name, &job_name, "999").await;
    let jobs: Api<Job> = s.app.api();
    let job_uid = jobs.get(&job_name).await.unwrap().uid();
    let b = ready_with_the_view(&s.bindings, &s.name, &s.app, &s.identity).await;
    let crashed = crashing.finish().await;
    assert_settled(&s.bindings, &s.name).await;
    done.cancel();
    recorder.await.unwrap();
    assert_never_backwards(&versions.lock().unwrap());
    assert_eq!(realized_bytes(&b), Some(999));

    // Exactly one of each; nothing deleted but the writer claim.
    let all_jobs = jobs.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(all_jobs.len(), 1, "one Job");
    assert_eq!(all_jobs[0].uid(), job_uid, "the first Job");
    let ctl = s
        .control
        .api::<PersistentVolumeClaim>()
        .list(&ListParams::default())
        .await
        .unwrap();
    let ctl: Vec<String> = ctl.items.iter().map(ResourceExt::name_any).collect();
    assert_eq!(ctl, vec![s.claim_name.clone()], "one primary claim");
    let primary = s.pvs.get(&s.pv_name).await.unwrap();
    assert_eq!(
        primary.labels().get(COMPLETE_LABEL).map(String::as_str),
        Some("true")
    );
    assert_eq!(
        primary
            .spec
            .as_ref()
            .unwrap()
            .persistent_volume_reclaim_policy
            .as_deref(),
        Some("Retain")
    );
    let ours = ListParams::default().labels(&format!(
        "{}={}",
        warmcache_modelvolume::volume_keys::BINDING_LABEL,
        s.name
    ));
    let mut names: Vec<String> = s
        .pvs
        .list(&ours)
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    names.sort_unstable();
    let realized = b.status.as_ref().unwrap().realized.as_ref().unwrap();
    let mut wanted: Vec<String> = realized
        .views
        .iter()
        .map(|v| v.persistent_volume_name.clone())
        .collect();
    assert_eq!(wanted.len(), 1, "one read-only view: {:?}", realized.views);
    let writer_view = names
        .iter()
        .find(|n| n.starts_with(&format!("{}-", s.claim_name)))
        .cloned()
        .unwrap_or_else(|| panic!("no writer view among {names:?}"));
    wanted.push(writer_view);
    wanted.sort_unstable();
    assert_eq!(names, wanted, "the writer view and one read-only view");
    let reader = pods.get("reader-0").await.unwrap();
    assert!(
        reader.metadata.deletion_timestamp.is_none(),
        "the reader kept"
    );
    let _ = pods.delete("reader-0", &DeleteParams::default()).await;
    let _ = s.pvs.delete(&s.pv_name, &DeleteParams::default()).await;
    for pv in &names {
        let _ = s.pvs.delete(pv, &DeleteParams::default()).await;
    }
    (crashed, s)
}

/// Crash matrix, as real crashes: the controller is killed right after every write it makes
/// (the write reaches the server and is stored, the instance's caches, queues and memory are
/// lost) and a fresh one started on a new client, until a fresh instance has nothing left to
/// write. Every write of the flow is followed by a crash: the status at each stage, the primary
/// claim, the writer view PV and claim, the Job, the completion update, the writer claim's
/// release, the read-only view's PV and claim. The flow converges with one of each object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_every_write_converges_without_duplicates() {
    let (crashed, s) = rwx_flow_with_crashes("mcb-kill", |_| Some(1)).await;
    let app_claims = format!("/namespaces/{}/persistentvolumeclaims", s.app.name);
    assert_crashed_after(
        &crashed,
        &[
            ("PUT", &format!("/modelcachebindings/{}/status", s.name), 3),
            (
                "POST",
                &format!("/namespaces/{}/persistentvolumeclaims", s.control.name),
                1,
            ),
            ("POST", "/api/v1/persistentvolumes", 2),
            ("POST", &app_claims, 2),
            ("POST", &format!("/namespaces/{}/jobs", s.app.name), 1),
            ("PUT", &format!("/persistentvolumes/{}", s.pv_name), 1),
            ("DELETE", &format!("{app_claims}/{}", s.claim_name), 1),
        ],
        &[&format!("{app_claims}/{}", s.claim_name)],
    );
}

/// Crash matrix, one crash per run: for every N, a controller makes the first N writes of the
/// flow (its caches and memory warm from the writes before) and is killed right after the Nth
/// is stored; a fresh controller finishes the flow. N runs from 1 until a controller makes all
/// its writes without reaching N (the flow had fewer). Each run converges with one of each
/// object (see [`rwx_flow_with_crashes`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_nth_write_converges_for_every_n() {
    common::crash_after_every_n(10, |n| async move {
        rwx_flow_with_crashes(&format!("mcb-kill{n}"), move |i| (i == 0).then_some(n))
            .await
            .0
    })
    .await;
}

fn quick_takeover() -> LifecycleConfig {
    LifecycleConfig {
        writer: WriterOptions {
            backoff_limit: 0,
            ..WriterOptions::default()
        },
        takeover_grace_seconds: 3,
        ..LifecycleConfig::default()
    }
}

/// A helmModelCache binding of `domain` with its writer Lease, first written from `first`, and
/// its primary PV.
async fn leased_binding(
    client: &Client,
    control: &TestNamespace,
    first: &str,
    domain: &str,
) -> (ModelCacheBinding, String) {
    let mut wanted = binding_for(&control.name, first, Workflow::HelmModelCache, domain);
    wanted.spec.resources.lease_name =
        warmcache_api_modelcache::init_lease_name(&wanted.spec.identity);
    let created = control
        .api::<ModelCacheBinding>()
        .create(&PostParams::default(), &wanted)
        .await
        .unwrap();
    let pv_name = format!("{}-primary", control.name);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    pvs.create(
        &PostParams::default(),
        &primary_pv(
            &pv_name,
            &control.name,
            &writer_pvc_name(&created.spec.identity),
        ),
    )
    .await
    .unwrap();
    (created, pv_name)
}

fn lease_writer(l: &Lease) -> (String, String, Option<String>, i32) {
    let a = l.annotations();
    (
        a.get(WRITER_NAMESPACE_ANNOTATION)
            .cloned()
            .unwrap_or_default(),
        a.get(WRITER_STATE_ANNOTATION).cloned().unwrap_or_default(),
        a.get(WRITER_JOB_UID_ANNOTATION).cloned(),
        l.spec
            .as_ref()
            .and_then(|s| s.lease_transitions)
            .unwrap_or_default(),
    )
}

async fn succeed_job(client: &Client, ns: &str, job: &str, bytes: &str) {
    let jp = job_pod(client, ns, job).await;
    let kubelet = Kubelet::new(client.clone());
    kubelet
        .terminate_container(ns, &jp.name_any(), "download", 0, bytes)
        .await
        .unwrap();
    kubelet
        .set_phase(ns, &jp.name_any(), "Succeeded")
        .await
        .unwrap();
}

/// helmModelCache in two namespaces: the writer namespace records the Lease and its Job; then
/// it loses its pods and its Job: the Lease is marked gone, and only after the grace period the
/// other namespace takes the download over (Lease replaced with its resourceVersion, the old
/// writer claim released, a Job there); the binding becomes Ready written from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_namespace_without_pods_is_taken_over_after_the_grace_period() {
    let plane = ControlPlane::shared().await.unwrap();
    let client = plane.client().await.unwrap();
    let control = TestNamespace::new("mcb-take-ctl").await.unwrap();
    let a = TestNamespace::new("mcb-take-a").await.unwrap();
    let b_ns = TestNamespace::new("mcb-take-b").await.unwrap();
    let domain = format!("domain-{}", control.name);
    label_domain(&client, &a.name, &domain).await;
    label_domain(&client, &b_ns.name, &domain).await;
    let (created, pv_name) = leased_binding(&client, &control, &a.name, &domain).await;
    let name = created.name_any();
    let identity = created.spec.identity.clone();
    let lease_name = created.spec.resources.lease_name.clone();
    let job_name = writer_job_name(&identity);
    let (stop, task, _) =
        running_controller_cfg(plane, &control.name, None, None, quick_takeover()).await;
    for ns in [&a, &b_ns] {
        ns.api::<Pod>()
            .create(&PostParams::default(), &reader_pod("reader-0", &created))
            .await
            .unwrap();
    }
    // The first admission's namespace writes, and the Lease records its Job.
    let leases: Api<Lease> = control.api();
    let jobs_a: Api<Job> = a.api();
    let job_a = eventually("the Job in the first namespace", WAIT, || {
        let jobs = jobs_a.clone();
        let job_name = job_name.clone();
        async move { jobs.get_opt(&job_name).await.ok().flatten() }
    })
    .await
    .unwrap();
    eventually("the Lease records the Job", WAIT, || {
        let leases = leases.clone();
        let lease_name = lease_name.clone();
        let uid = job_a.uid();
        let a = a.name.clone();
        async move {
            let l = leases.get_opt(&lease_name).await.ok()??;
            let (ns, state, job_uid, _) = lease_writer(&l);
            (ns == a && state == "Running" && job_uid == uid).then_some(())
        }
    })
    .await
    .unwrap();

    // The first namespace loses its pods and its Job, in that order as the controller sees
    // it: a reconcile that still caches the pod when the Job is gone rightly restarts the
    // holder's own Job (its pod can still run the step), and no takeover would follow. The
    // pod's reference leaving the status shows the controller's cache has dropped it.
    a.api::<Pod>()
        .delete("reader-0", &DeleteParams::default())
        .await
        .unwrap();
    let bindings: Api<ModelCacheBinding> = control.api();
    eventually(
        "the status drops the first namespace's reference",
        WAIT,
        || {
            let bindings = bindings.clone();
            let name = name.clone();
            let a = a.name.clone();
            async move {
                let b = bindings.get(&name).await.ok()?;
                let refs = &b.status?.request_references;
                (!refs.is_empty() && refs.iter().all(|r| r.namespace != a)).then_some(())
            }
        },
    )
    .await
    .unwrap();
    let gone_at = k8s_openapi::jiff::Timestamp::now();
    jobs_a
        .delete(
            &job_name,
            &DeleteParams {
                propagation_policy: Some(kube::api::PropagationPolicy::Background),
                ..DeleteParams::default()
            },
        )
        .await
        .unwrap();
    let jobs_b: Api<Job> = b_ns.api();
    // Generous: the takeover waits for the grace, and under the full suite's load the
    // controller's retries of conflicting writes back off (a fresh-clone CI run once took more
    // than 60 s here; alone it takes about 5 s).
    let job_b = eventually("the Job in the other namespace", 3 * WAIT, || {
        let jobs = jobs_b.clone();
        let job_name = job_name.clone();
        async move { jobs.get_opt(&job_name).await.ok().flatten() }
    })
    .await
    .unwrap();
    let lease = leases.get(&lease_name).await.unwrap();
    let (ns, _, _, transitions) = lease_writer(&lease);
    assert_eq!(ns, b_ns.name);
    assert_eq!(transitions, 1);
    let acquired = lease
        .spec
        .as_ref()
        .unwrap()
        .acquire_time
        .as_ref()
        .unwrap()
        .0;
    assert!(
        acquired.duration_since(gone_at).as_secs_f64() >= 2.5,
        "taken over {acquired} only after the grace period from {gone_at}"
    );
    // The old writer claim is released; the new one is in the taking-over namespace.
    let claim_name = writer_pvc_name(&identity);
    wait_gone(&a.api::<PersistentVolumeClaim>(), &claim_name).await;
    assert!(
        b_ns.api::<PersistentVolumeClaim>()
            .get_opt(&claim_name)
            .await
            .unwrap()
            .is_some()
    );
    // A crash between the takeover's Lease write and that release leaves the old claim: the
    // next reconcile releases it (the current writer's is kept).
    let left: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": claim_name,
            "labels": {
                warmcache_modelvolume::volume_keys::BINDING_LABEL: name,
                warmcache_modelvolume::volume_keys::VOLUME_ROLE_LABEL: "writer",
                warmcache_modelvolume::keys::MANAGED_BY_LABEL: "warmcache",
            },
        },
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": format!("{}-left-behind", a.name),
            "resources": { "requests": { "storage": "1Gi" } },
        },
    }))
    .unwrap();
    a.api::<PersistentVolumeClaim>()
        .create(&PostParams::default(), &left)
        .await
        .unwrap();
    wait_gone(&a.api::<PersistentVolumeClaim>(), &claim_name).await;
    assert!(
        b_ns.api::<PersistentVolumeClaim>()
            .get_opt(&claim_name)
            .await
            .unwrap()
            .is_some_and(|c| c.metadata.deletion_timestamp.is_none()),
        "the current writer's claim is kept"
    );
    succeed_job(&client, &b_ns.name, &job_name, "321").await;
    let bindings: Api<ModelCacheBinding> = control.api();
    let done = eventually("Ready, written from the other namespace", WAIT, || {
        let bindings = bindings.clone();
        let name = name.clone();
        async move {
            let b = bindings.get(&name).await.ok()?;
            (population(&b) == Some(PopulationState::Ready)).then_some(b)
        }
    })
    .await
    .unwrap();
    let st = done.status.as_ref().unwrap();
    assert_eq!(
        st.realized.as_ref().unwrap().source_namespace.as_deref(),
        Some(b_ns.name.as_str())
    );
    let w = st.writer.as_ref().unwrap();
    assert_eq!(w.namespace, b_ns.name);
    assert_eq!(w.takeovers, Some(1));
    assert_eq!(w.job_uid, job_b.uid());
    assert_eq!(
        done.spec.resources.writer_namespace, a.name,
        "the spec keeps the first admission's namespace"
    );
    assert!(
        jobs_a
            .get_opt(&job_name)
            .await
            .unwrap()
            .is_none_or(|j| j.metadata.deletion_timestamp.is_some())
    );
    stop.cancel();
    let _ = task.await;
    let _ = b_ns
        .api::<Pod>()
        .delete("reader-0", &DeleteParams::default())
        .await;
    let _ = Api::<PersistentVolume>::all(client.clone())
        .delete(&pv_name, &DeleteParams::default())
        .await;
}

/// Two controllers (no leader election between them) find the same gone writer past its grace
/// period: the Lease update carries its resourceVersion and UID, so exactly one takeover is
/// stored, one Job exists, and the loser decides again from the winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_racing_takeover_by_two_controllers_yields_one_writer() {
    let plane = ControlPlane::shared().await.unwrap();
    let client = plane.client().await.unwrap();
    let control = TestNamespace::new("mcb-race-ctl").await.unwrap();
    let a = TestNamespace::new("mcb-race-a").await.unwrap();
    let b_ns = TestNamespace::new("mcb-race-b").await.unwrap();
    let c_ns = TestNamespace::new("mcb-race-c").await.unwrap();
    let domain = format!("domain-{}", control.name);
    for ns in [&a, &b_ns, &c_ns] {
        label_domain(&client, &ns.name, &domain).await;
    }
    let (created, pv_name) = leased_binding(&client, &control, &a.name, &domain).await;
    let identity = created.spec.identity.clone();
    let lease_name = created.spec.resources.lease_name.clone();
    let job_name = writer_job_name(&identity);
    // The Lease of a writer in the first namespace whose Job was seen gone an hour ago.
    let long_ago = k8s_openapi::jiff::Timestamp::now()
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(3600))
        .unwrap();
    let seeded = warmcache_modelvolume::lease::writer_lease(
        &created,
        None,
        &a.name,
        Some("gone-job-uid"),
        WriterState::Gone,
        0,
        long_ago,
        3,
    );
    let leases: Api<Lease> = control.api();
    leases
        .create(&PostParams::default(), &seeded)
        .await
        .unwrap();
    for ns in [&b_ns, &c_ns] {
        ns.api::<Pod>()
            .create(&PostParams::default(), &reader_pod("reader-0", &created))
            .await
            .unwrap();
    }
    let (stop1, task1, admin1) =
        running_controller_cfg(plane, &control.name, None, None, quick_takeover()).await;
    let (stop2, task2, admin2) =
        running_controller_cfg(plane, &control.name, None, None, quick_takeover()).await;
    let taken = eventually("taken over", WAIT, || {
        let leases = leases.clone();
        let lease_name = lease_name.clone();
        async move {
            let l = leases.get_opt(&lease_name).await.ok()??;
            let (ns, state, uid, transitions) = lease_writer(&l);
            (state == "Running" && uid.is_some()).then_some((ns, transitions))
        }
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut jobs = 0;
    for ns in [&a, &b_ns, &c_ns] {
        jobs += ns
            .api::<Job>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|j| j.name_any() == job_name)
            .count();
    }
    assert_eq!(jobs, 1, "one writer Job in all");
    let l = leases.get(&lease_name).await.unwrap();
    let (ns, _, _, transitions) = lease_writer(&l);
    assert_eq!(
        (ns.clone(), transitions),
        (taken.0.clone(), 1),
        "one takeover stored"
    );
    assert!(ns == b_ns.name || ns == c_ns.name);
    let taken_over: f64 = [scrape(admin1).await, scrape(admin2).await]
        .iter()
        .map(|m| {
            sample(
                m,
                "warmcache_binding_controller_writer_lease_writes_total{result=\"taken_over\"}",
            )
            .unwrap_or_default()
        })
        .sum();
    assert_eq!(
        taken_over, 1.0,
        "exactly one controller's takeover was stored"
    );
    stop1.cancel();
    stop2.cancel();
    let _ = task1.await;
    let _ = task2.await;
    for ns in [&b_ns, &c_ns] {
        let _ = ns
            .api::<Pod>()
            .delete("reader-0", &DeleteParams::default())
            .await;
    }
    let _ = Api::<PersistentVolume>::all(client.clone())
        .delete(&pv_name, &DeleteParams::default())
        .await;
}

/// The writer Lease is written, then the Job create fails, then the Lease bookkeeping fails:
/// the controller converges from what is stored to one Job, recorded in the Lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_after_the_lease_write_converges() {
    let plane = ControlPlane::shared().await.unwrap();
    let client = plane.client().await.unwrap();
    let control = TestNamespace::new("mcb-lcrash-ctl").await.unwrap();
    let a = TestNamespace::new("mcb-lcrash-a").await.unwrap();
    let domain = format!("domain-{}", control.name);
    label_domain(&client, &a.name, &domain).await;
    let (created, pv_name) = leased_binding(&client, &control, &a.name, &domain).await;
    let lease_name = created.spec.resources.lease_name.clone();
    let job_name = writer_job_name(&created.spec.identity);
    let faults = warmcache_testkit::FaultInjector::new();
    let error = warmcache_testkit::Fault::ServerError;
    faults.inject(
        http::Method::POST,
        &format!("/namespaces/{}/jobs", a.name),
        error,
        1,
    );
    faults.inject(
        http::Method::PUT,
        &format!("/namespaces/{}/leases/{lease_name}", control.name),
        error,
        1,
    );
    let faulty = plane.client_with_faults(faults.clone()).await.unwrap();
    let (stop, task, _) =
        running_controller_cfg(plane, &control.name, Some(faulty), None, quick_takeover()).await;
    a.api::<Pod>()
        .create(&PostParams::default(), &reader_pod("reader-0", &created))
        .await
        .unwrap();
    let leases: Api<Lease> = control.api();
    let jobs: Api<Job> = a.api();
    let job = eventually("the Job, recorded in the Lease", WAIT, || {
        let (leases, jobs) = (leases.clone(), jobs.clone());
        let (lease_name, job_name) = (lease_name.clone(), job_name.clone());
        async move {
            let job = jobs.get_opt(&job_name).await.ok()??;
            let l = leases.get_opt(&lease_name).await.ok()??;
            let (_, state, uid, _) = lease_writer(&l);
            (state == "Running" && uid == job.uid()).then_some(job)
        }
    })
    .await
    .unwrap();
    assert_eq!(faults.pending(), 0, "both injected failures were met");
    assert_eq!(
        jobs.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    let (ns, _, _, transitions) = lease_writer(&leases.get(&lease_name).await.unwrap());
    assert_eq!((ns, transitions), (a.name.clone(), 0));
    assert!(job.uid().is_some());
    stop.cancel();
    let _ = task.await;
    let _ = a
        .api::<Pod>()
        .delete("reader-0", &DeleteParams::default())
        .await;
    let _ = Api::<PersistentVolume>::all(client.clone())
        .delete(&pv_name, &DeleteParams::default())
        .await;
}

/// A reader as the webhook renders it (role reader, the wait init container), metadata and
/// spec only: `binding` names the binding it reads.
fn waiting_reader_pod(name: &str, hash: &str, binding: &str, uid: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                MODEL_LABEL: hash,
                warmcache_modelvolume::keys::ROLE_LABEL: warmcache_modelvolume::keys::ROLE_READER,
            },
            "annotations": { BINDING_ANNOTATION: binding, BINDING_UID_ANNOTATION: uid },
        },
        "spec": {
            "initContainers": [{
                "name": warmcache_modelvolume::keys::WAIT_CONTAINER,
                "image": "vllm:1",
                "command": ["sh", "-c", "sleep 1"],
            }],
            "containers": [{ "name": "vllm", "image": "vllm:1" }],
        },
    }))
    .unwrap()
}

/// A failed download writes the failure record (valid `failure_record_seconds`) and deletes
/// the readers still waiting and not Ready whose controller recreates them (a ReplicaSet's),
/// keeping Ready ones, pods of other bindings, and waiting readers nothing would recreate (a
/// bare pod, a Job's pod: reported in an Event);
/// admission refuses the model while the record holds and joins again once it expired; the
/// retried download's success clears the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_download_records_the_failure_and_deletes_only_waiting_readers() {
    use warmcache_modelvolume::{BindingAction, Options, Request, SkipReason, Verdict};
    let plane = ControlPlane::shared().await.unwrap();
    let client = plane.client().await.unwrap();
    let control = TestNamespace::new("mcb-frec-ctl").await.unwrap();
    let app = TestNamespace::new("mcb-frec-app").await.unwrap();
    // The binding an admission of this engine pod in `app` joins.
    let engine: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "qwen" },
        "spec": { "containers": [{
            "name": "vllm", "image": "vllm/vllm-openai:v0.20.0",
            "args": ["--model", "Qwen/Qwen3-8B"],
            "env": [{ "name": "HF_HOME", "value": "/models/hf" }],
            "resources": { "limits": { "nvidia.com/gpu": "1" } },
            "volumeMounts": [{ "name": "m", "mountPath": "/models" }],
        }], "volumes": [{ "name": "m", "emptyDir": {} }] },
    }))
    .unwrap();
    let labels = std::collections::BTreeMap::new();
    let options = Options {
        control_namespace: control.name.clone(),
        ..Options::default()
    };
    let req = Request {
        pod: &engine,
        namespace: &app.name,
        namespace_labels: &labels,
        leader_worker_set: None,
        traceparent: None,
        options: &options,
    };
    let storage = warmcache_modelvolume::StorageInputs {
        storage_class: None,
        csi_driver: None,
        catalog: warmcache_catalog::CatalogInput::Absent,
        gates: warmcache_catalog::Gates {
            caching_support: true,
            helm_model_caching: true,
            model_cache_encryption: false,
        },
    };
    let plan = warmcache_modelvolume::plan(&req).unwrap();
    let identity = plan.identity().clone();
    let bindings: Api<ModelCacheBinding> = control.api();
    let created = bindings
        .create(
            &PostParams::default(),
            &binding_of_identity(&control.name, &app.name, identity.clone()),
        )
        .await
        .unwrap();
    assert_eq!(created.name_any(), plan.binding_name());
    let name = created.name_any();
    let uid = created.uid().unwrap();
    let hash = identity_hash(&identity);
    let claim_name = writer_pvc_name(&identity);
    let pv_name = format!("{}-primary", control.name);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    pvs.create(
        &PostParams::default(),
        &primary_pv(&pv_name, &control.name, &claim_name),
    )
    .await
    .unwrap();
    let (stop, task, admin) = running_controller_cfg(
        plane,
        &control.name,
        None,
        None,
        LifecycleConfig {
            writer: WriterOptions {
                backoff_limit: 0,
                ..WriterOptions::default()
            },
            failure_record_seconds: 10,
            ..LifecycleConfig::default()
        },
    )
    .await;
    let pods: Api<Pod> = app.api();
    let mut source = reader_pod("reader-0", &created);
    source
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(MODEL_LABEL.into(), hash.clone());
    pods.create(&PostParams::default(), &source).await.unwrap();
    // waiting-1 is adopted by a ReplicaSet (which recreates it from a template that is not a
    // reader); bare-1 has no controller and the reader Job's pod is a Job's: both are kept.
    let mut adopted = waiting_reader_pod("waiting-1", &hash, &name, &uid);
    adopted
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("app".into(), "frec-rs".into());
    for pod in [
        adopted,
        waiting_reader_pod("bare-1", &hash, &name, &uid),
        waiting_reader_pod("ready-1", &hash, &name, &uid),
        waiting_reader_pod("other-1", &hash, "model-cache-another", "another-uid"),
    ] {
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let replica_sets: Api<k8s_openapi::api::apps::v1::ReplicaSet> = app.api();
    replica_sets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": { "name": "frec-rs" },
                "spec": {
                    "replicas": 1,
                    "selector": { "matchLabels": { "app": "frec-rs" } },
                    "template": {
                        "metadata": { "labels": { "app": "frec-rs" } },
                        "spec": { "containers": [{ "name": "vllm", "image": "vllm:1" }] },
                    },
                },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let waiting_uid = eventually("waiting-1 adopted by its ReplicaSet", WAIT, || {
        let pods = pods.clone();
        async move {
            let p = pods.get("waiting-1").await.ok()?;
            p.owner_references()
                .iter()
                .any(|o| o.kind == "ReplicaSet" && o.controller == Some(true))
                .then(|| p.uid())
                .flatten()
        }
    })
    .await
    .unwrap();
    let reader_job_pod = waiting_reader_pod("unused", &hash, &name, &uid);
    let mut template = serde_json::to_value(&reader_job_pod).unwrap();
    template["metadata"].as_object_mut().unwrap().remove("name");
    template["spec"]["restartPolicy"] = json!("Never");
    let reader_jobs: Api<Job> = app.api();
    reader_jobs
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": { "name": "reader-job" },
                "spec": { "backoffLimit": 0, "template": {
                    "metadata": template["metadata"], "spec": template["spec"],
                } },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let job_reader = job_pod(&client, &app.name, "reader-job").await.name_any();
    let kubelet = Kubelet::new(client.clone());
    kubelet.set_running(&app.name, "ready-1").await.unwrap();

    // The download fails.
    let job_name = writer_job_name(&identity);
    let jp = job_pod(&client, &app.name, &job_name).await;
    kubelet
        .terminate_container(&app.name, &jp.name_any(), "download", 1, "403 Forbidden")
        .await
        .unwrap();
    kubelet
        .set_phase(&app.name, &jp.name_any(), "Failed")
        .await
        .unwrap();
    let failed = eventually("Failed with a failure record", WAIT, || {
        let api = bindings.clone();
        let name = name.clone();
        async move {
            let b = api.get(&name).await.ok()?;
            (population(&b) == Some(PopulationState::Failed)
                && b.status.as_ref()?.failure_record.is_some())
            .then_some(b)
        }
    })
    .await
    .unwrap();
    let record = failed
        .status
        .as_ref()
        .unwrap()
        .failure_record
        .clone()
        .unwrap();
    assert!(record.message.contains("403 Forbidden"), "{record:?}");
    assert_eq!(
        record.retry_after.0.as_second() - record.failed_at.0.as_second(),
        10
    );
    // The waiting reader is deleted; the Ready one, the step's pod and the other binding's
    // pod are kept.
    eventually("the waiting reader deleted", WAIT, || {
        let pods = pods.clone();
        let waiting_uid = waiting_uid.clone();
        async move {
            match pods.get_opt("waiting-1").await {
                Ok(None) => Some(()),
                Ok(Some(p)) if p.metadata.deletion_timestamp.is_some() => Some(()),
                Ok(Some(p)) if p.uid().as_deref() != Some(waiting_uid.as_str()) => Some(()),
                _ => None,
            }
        }
    })
    .await
    .unwrap();
    // The waiting readers nothing would recreate are reported, and kept.
    let events: Api<k8s_openapi::api::events::v1::Event> = control.api();
    let note = eventually("the WaitingReadersKept Event", WAIT, || {
        let events = events.clone();
        async move {
            events
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("WaitingReadersKept"))?
                .note
        }
    })
    .await
    .unwrap();
    assert!(
        note.contains("bare-1") && note.contains(&job_reader),
        "{note}"
    );
    for kept in [
        "ready-1",
        "other-1",
        "reader-0",
        "bare-1",
        job_reader.as_str(),
    ] {
        let p = pods.get(kept).await.unwrap();
        assert!(p.metadata.deletion_timestamp.is_none(), "{kept} kept");
    }
    // Admission refuses the model while the record holds...
    let now = k8s_openapi::jiff::Timestamp::now();
    assert!(now < record.retry_after.0);
    let stored_failed = bindings.get(&name).await.unwrap();
    match warmcache_modelvolume::decide(
        &req,
        warmcache_modelvolume::plan(&req).unwrap(),
        Some(&stored_failed),
        None,
        &storage,
        now,
    ) {
        Verdict::Skip(s) => assert_eq!(s.reason, SkipReason::DownloadFailed),
        other => panic!("{other:?}"),
    }
    // ...and joins again once it expired, with admission's clock-skew margin past retryAfter
    // (the webhook's clock is taken to be that far ahead).
    let wait = record
        .retry_after
        .0
        .duration_since(now)
        .as_secs_f64()
        .max(0.0)
        + 0.5;
    tokio::time::sleep(Duration::from_secs_f64(wait)).await;
    let stored_expired = bindings.get(&name).await.unwrap();
    match warmcache_modelvolume::decide(
        &req,
        warmcache_modelvolume::plan(&req).unwrap(),
        Some(&stored_expired),
        None,
        &storage,
        k8s_openapi::jiff::Timestamp::now()
            + k8s_openapi::jiff::SignedDuration::from_secs(
                warmcache_modelvolume::lifecycle::FAILURE_RECORD_CLOCK_MARGIN_SECONDS,
            ),
    ) {
        Verdict::Rewrite(r) => assert!(matches!(r.binding, BindingAction::Join { .. })),
        other => panic!("{other:?}"),
    }
    // Within the margin it still holds.
    match warmcache_modelvolume::decide(
        &req,
        warmcache_modelvolume::plan(&req).unwrap(),
        Some(&stored_expired),
        None,
        &storage,
        k8s_openapi::jiff::Timestamp::now(),
    ) {
        Verdict::Skip(s) => assert_eq!(s.reason, SkipReason::DownloadFailed),
        other => panic!("{other:?}"),
    }
    // The failed Job's TTL: gone. The step's pod retries; success clears the record.
    let jobs: Api<Job> = app.api();
    let old_uid = jobs.get(&job_name).await.unwrap().uid();
    jobs.delete(
        &job_name,
        &DeleteParams {
            propagation_policy: Some(kube::api::PropagationPolicy::Foreground),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    let _ = pods.delete(&jp.name_any(), &DeleteParams::default()).await;
    let retry = eventually("the retry Job", WAIT, || {
        let jobs = jobs.clone();
        let job_name = job_name.clone();
        let old_uid = old_uid.clone();
        async move {
            jobs.get_opt(&job_name)
                .await
                .ok()
                .flatten()
                .filter(|j| j.uid() != old_uid && j.metadata.deletion_timestamp.is_none())
        }
    })
    .await
    .unwrap();
    succeed_job(&client, &app.name, &retry.name_any(), "2048").await;
    let done = eventually("Ready, the record cleared", WAIT, || {
        let api = bindings.clone();
        let name = name.clone();
        async move {
            let b = api.get(&name).await.ok()?;
            (population(&b) == Some(PopulationState::Ready)).then_some(b)
        }
    })
    .await
    .unwrap();
    assert_eq!(done.status.as_ref().unwrap().failure_record, None);
    let metrics = scrape(admin).await;
    assert_eq!(
        sample(
            &metrics,
            "warmcache_binding_controller_waiting_readers_deleted_total"
        ),
        Some(1.0),
        "{metrics}"
    );
    stop.cancel();
    let _ = task.await;
    for p in ["reader-0", "ready-1", "other-1", "bare-1"] {
        let _ = pods.delete(p, &DeleteParams::default()).await;
    }
    let _ = replica_sets
        .delete("frec-rs", &DeleteParams::default())
        .await;
    let _ = reader_jobs
        .delete("reader-job", &DeleteParams::background())
        .await;
    let _ = pvs.delete(&pv_name, &DeleteParams::default()).await;
}

fn init_telemetry() {
    static INIT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    INIT.get_or_init(|| {
        let config = warmcache_telemetry::TelemetryConfig::from_lookup(
            "binding-controller-test",
            Some("warn,warmcache_runtime=info,warmcache_binding_controller=info"),
            warmcache_telemetry::LogFormat::Plain,
            |_| None,
        );
        let guard = warmcache_telemetry::init(&config).unwrap();
        std::mem::forget(guard);
    });
}

fn trace_id(annotations: Option<&std::collections::BTreeMap<String, String>>) -> Option<String> {
    let tp = annotations?.get(warmcache_telemetry::TRACE_PARENT_ANNOTATION)?;
    tp.split('-').nth(1).map(str::to_owned)
}

/// The admission's trace on the reading pod is continued by the controller: the writer Job
/// carries a traceparent of that trace (its creation span's), the completion written on the
/// primary PV continues the Job's, and the view of the pod's namespace continues the pod's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_completion_and_view_continue_the_readers_trace() {
    init_telemetry();
    let (s, stop) = setup("mcb-trace").await;
    let name = s.binding.name_any();
    let identity = s.binding.spec.identity.clone();
    let claim_name = writer_pvc_name(&identity);
    let pvs: Api<PersistentVolume> = Api::all(s.client.clone());
    pvs.create(
        &PostParams::default(),
        &primary_pv(&s.pv_name, &s.control.name, &claim_name),
    )
    .await
    .unwrap();
    let tid = "4bf92f3577b34da6a3ce929d0e0e4736";
    let admission_span = "00f067aa0ba902b7";
    let mut pod = reader_pod("reader-0", &s.binding);
    pod.metadata.annotations.as_mut().unwrap().insert(
        warmcache_telemetry::TRACE_PARENT_ANNOTATION.into(),
        format!("00-{tid}-{admission_span}-01"),
    );
    let pods: Api<Pod> = s.app.api();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let job_name = writer_job_name(&identity);
    let jobs: Api<Job> = s.app.api();
    let job = eventually("the writer Job", WAIT, || {
        let jobs = jobs.clone();
        let job_name = job_name.clone();
        async move { jobs.get_opt(&job_name).await.ok().flatten() }
    })
    .await
    .unwrap();
    assert_eq!(
        trace_id(job.metadata.annotations.as_ref()).as_deref(),
        Some(tid),
        "{:?}",
        job.metadata.annotations
    );
    let job_tp = job.annotations()[warmcache_telemetry::TRACE_PARENT_ANNOTATION].clone();
    assert!(
        !job_tp.contains(admission_span),
        "the Job carries its creation span's context: {job_tp}"
    );
    succeed_job(&s.client, &s.app.name, &job_name, "77").await;
    let view_claim = reader_pvc_name(&identity);
    let claims: Api<PersistentVolumeClaim> = s.app.api();
    let view = eventually("the view claim", WAIT, || {
        let claims = claims.clone();
        let view_claim = view_claim.clone();
        async move { claims.get_opt(&view_claim).await.ok().flatten() }
    })
    .await
    .unwrap();
    assert_eq!(
        trace_id(view.metadata.annotations.as_ref()).as_deref(),
        Some(tid)
    );
    eventually("Ready", WAIT, || {
        let api = s.bindings.clone();
        let name = name.clone();
        async move {
            let b = api.get(&name).await.ok()?;
            (population(&b) == Some(PopulationState::Ready)).then_some(())
        }
    })
    .await
    .unwrap();
    let primary = pvs.get(&s.pv_name).await.unwrap();
    assert_eq!(
        trace_id(primary.metadata.annotations.as_ref()).as_deref(),
        Some(tid)
    );
    let pv_tp = primary.annotations()[warmcache_telemetry::TRACE_PARENT_ANNOTATION].clone();
    assert_ne!(pv_tp, job_tp, "the completion has a span of its own");
    let b = stored(&s.bindings, &name).await;
    assert_eq!(population(&b), Some(PopulationState::Ready));
    stop.cancel();
    let _ = pods.delete("reader-0", &DeleteParams::default()).await;
    let _ = pvs.delete(&s.pv_name, &DeleteParams::default()).await;
}

/// A controller reference to `owner`, as a workload controller writes it.
fn controlled_by(api_version: &str, kind: &str, owner_name: &str, uid: &str) -> serde_json::Value {
    json!([{
        "apiVersion": api_version, "kind": kind, "name": owner_name, "uid": uid,
        "controller": true, "blockOwnerDeletion": true,
    }])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_reading_pod_is_referenced_by_its_top_level_workload() {
    use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    let (s, stop) = setup("mcb-owners").await;
    let ns = s.app.name.clone();
    warmcache_testkit::install_leaderworkerset_crd(&s.client)
        .await
        .unwrap();

    // The reading pod the webhook leaves, as a template every workload below carries.
    let reader = serde_json::to_value(common::reader_pod("unused", &s.binding)).unwrap();
    let template = |app: &str| {
        let mut metadata = reader["metadata"].clone();
        metadata.as_object_mut().unwrap().remove("name");
        metadata["labels"]["app"] = json!(app);
        json!({ "metadata": metadata, "spec": reader["spec"] })
    };
    let selector = |app: &str| json!({ "matchLabels": { "app": app } });
    let create = |api_version: &str, kind: &str, plural: &str, body: serde_json::Value| {
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let resource =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
        let api: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), &ns, &resource);
        let mut object: DynamicObject = serde_json::from_value(body).unwrap();
        object.types = Some(kube::core::TypeMeta {
            api_version: api_version.into(),
            kind: kind.into(),
        });
        async move { api.create(&PostParams::default(), &object).await.unwrap() }
    };

    // Pod <- ReplicaSet <- Deployment, and Pod <- StatefulSet, made by the real controllers.
    let web = create(
        "apps/v1",
        "Deployment",
        "deployments",
        json!({ "metadata": { "name": "web" }, "spec": {
            "replicas": 1, "selector": selector("web"), "template": template("web"),
        } }),
    )
    .await;
    let db = create(
        "apps/v1",
        "StatefulSet",
        "statefulsets",
        json!({ "metadata": { "name": "db" }, "spec": {
            "replicas": 1, "selector": selector("db"), "template": template("db"),
        } }),
    )
    .await;
    // Pod <- Job <- CronJob: the CronJob is suspended, so the Job is made by hand and its pod by
    // the Job controller.
    let mut job_template = template("nightly");
    job_template["spec"]["restartPolicy"] = json!("Never");
    let cron = create(
        "batch/v1",
        "CronJob",
        "cronjobs",
        json!({ "metadata": { "name": "nightly" }, "spec": {
            "schedule": "0 0 1 1 *", "suspend": true,
            "jobTemplate": { "spec": { "template": job_template } },
        } }),
    )
    .await;
    create(
        "batch/v1",
        "Job",
        "jobs",
        json!({
            "metadata": {
                "name": "nightly-manual",
                "ownerReferences": controlled_by("batch/v1", "CronJob", "nightly", &cron.uid().unwrap()),
            },
            "spec": { "template": job_template },
        }),
    )
    .await;
    // Pod <- DaemonSet: this plane has no nodes, so the pod is made by hand; without a node name
    // the DaemonSet controller leaves it alone.
    let agent = create(
        "apps/v1",
        "DaemonSet",
        "daemonsets",
        json!({ "metadata": { "name": "agent" }, "spec": {
            "selector": selector("agent"), "template": template("agent"),
        } }),
    )
    .await;
    let mut agent_pod = template("agent");
    agent_pod["metadata"]["name"] = json!("agent-by-hand");
    agent_pod["metadata"]["ownerReferences"] =
        controlled_by("apps/v1", "DaemonSet", "agent", &agent.uid().unwrap());
    create("v1", "Pod", "pods", agent_pod).await;
    // Pod <- StatefulSet <- LeaderWorkerSet (the LWS controller's leader set, made by hand).
    let lws = create(
        "leaderworkerset.x-k8s.io/v1",
        "LeaderWorkerSet",
        "leaderworkersets",
        json!({ "metadata": { "name": "serve" }, "spec": { "replicas": 1 } }),
    )
    .await;
    create(
        "apps/v1",
        "StatefulSet",
        "statefulsets",
        json!({
            "metadata": {
                "name": "serve",
                "ownerReferences": controlled_by(
                    "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "serve", &lws.uid().unwrap(),
                ),
            },
            "spec": { "replicas": 1, "selector": selector("serve"), "template": template("serve") },
        }),
    )
    .await;

    let mut expected: Vec<(String, String, String)> = [
        ("Deployment", &web),
        ("StatefulSet", &db),
        ("CronJob", &cron),
        ("DaemonSet", &agent),
        ("LeaderWorkerSet", &lws),
    ]
    .iter()
    .map(|(kind, o)| ((*kind).to_owned(), o.name_any(), o.uid().unwrap()))
    .collect();
    expected.sort();
    let name = s.binding.name_any();
    let want = expected.len();
    let b = eventually("a reference to each top-level workload", WAIT, || {
        let api = s.bindings.clone();
        let name = name.clone();
        async move {
            let b = api.get(&name).await.ok()?;
            (b.status.as_ref()?.request_references.len() == want).then_some(b)
        }
    })
    .await
    .unwrap();
    let st = b.status.as_ref().unwrap();
    let mut got: Vec<(String, String, String)> = st
        .request_references
        .iter()
        .map(|r| (r.kind.clone(), r.name.clone(), r.uid.clone()))
        .collect();
    got.sort();
    assert_eq!(got, expected, "{:?}", st.request_references);
    assert!(
        st.request_references.iter().all(|r| r.namespace == ns),
        "{:?}",
        st.request_references
    );
    assert_eq!(st.request_reference_count, Some(5));

    stop.cancel();
    let pvs: Api<PersistentVolume> = Api::all(s.client.clone());
    let _ = pvs.delete(&s.pv_name, &DeleteParams::default()).await;
}
