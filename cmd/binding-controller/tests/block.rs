//! The block (roxReadOnly) flow of the binding controller against a real API server (and the
//! real PV, Job, attach-detach and garbage controllers of kube-controller-manager), across two
//! reading namespaces of one sharing domain (helmModelCache on an NVMesh-like provider, whose
//! volume handles encode the namespace). The test plays the node agent exactly as the real one
//! does (`cmd/model-volume-controller/src/agent.rs`): it reads the staging pod with the agent's
//! own [`staging_state`], creates the primary claim with [`staged_primary_claim`], provisions a
//! PV pre-bound to it as a provisioner would (and a VolumeAttachment, as the holder's attach
//! leaves), records the copy on the claim with the agent's keys (a merge patch carrying the
//! claim's resourceVersion), and answers the staging pod (the hold exits 0, the Job completes).
//! The controller must then label the primary complete and Retain, release its claim, wait for
//! the detach, and create one read-only view per reading namespace, each with its own handle.
//!
//! Run twice: as the chart's ServiceAccount (the generated roles), and with every write of the
//! flow failing once (a crash between any two writes), converging to the same end with exactly
//! one of each object and nothing else deleted. Every stored version of the binding is read
//! back (a chain of watches from its creation): Ready, once reached, never goes back.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::{
    Crashing, HANDLE, Running, assert_never_backwards, assert_settled, condition, job_pod,
    label_domain, population, reader_pod, record_versions, sample, scrape,
};

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use warmcache_api_modelcache::v2beta1::{
    BindingIdentity, ModelCacheBinding, PopulationState, Transition, Workflow,
};
use warmcache_api_modelcache::{
    identity_hash, init_lease_name, reader_pvc_name, sha256_digest, writer_job_name,
    writer_pvc_name,
};
use warmcache_modelvolume::agent::{StagingState, staged_primary_claim, staging_state};
use warmcache_modelvolume::keys::MODEL_LABEL;
use warmcache_modelvolume::volume_keys::{
    BINDING_LABEL, BYTES_ANNOTATION, COMPLETE_LABEL, COPIED_BYTES_ANNOTATION,
    MANIFEST_DIGEST_ANNOTATION, SOURCE_NAMESPACE_LABEL, WRITER_NAMESPACE_ANNOTATION,
};
use warmcache_modelvolume::{LifecycleConfig, WriterOptions};
use warmcache_testkit::{ControlPlane, Fault, FaultInjector, Kubelet, TestNamespace, eventually};

const WAIT: Duration = Duration::from_secs(90);
/// The NVMesh-like CSI driver (the decision's provisioner).
const DRIVER: &str = "nvmesh-csi.warmcache.io";
/// The node the staging pod ran on (a name only: nothing is scheduled).
const NODE: &str = "block-node-0";
/// What the agent measured and copied.
const BYTES: u64 = 300_000;

/// The controller: as the chart's ServiceAccount (roles generated from src/rbac.rs) unless a
/// client of the test's own (fault injection) is given.
async fn running_controller(
    plane: &'static ControlPlane,
    control: &str,
    client: Option<Client>,
    mode: &Mode,
) -> Running {
    common::controller(plane, control, client, None, lifecycle(mode)).await
}

/// The controller's settings in these tests (a staging Job is not retried; with a held
/// primary claim, a short grace period).
fn lifecycle(mode: &Mode) -> LifecycleConfig {
    let mut config = LifecycleConfig {
        writer: WriterOptions {
            backoff_limit: 0,
            ..WriterOptions::default()
        },
        ..LifecycleConfig::default()
    };
    if matches!(mode, Mode::Held) {
        config.primary_release_grace_seconds = 3;
    }
    config
}

/// The pod of the control namespace that keeps the primary claim in [`Mode::Held`].
const HOLDER: &str = "mount-holder-left";

/// How the controller runs through the block flow.
enum Mode {
    /// As the chart's ServiceAccount, restarted once while the primary is still attached.
    Clean,
    /// Every write of the flow fails once on the way (nothing stored).
    Faults(FaultInjector),
    /// Killed right after every write it makes (stored), a fresh instance each time.
    Crashes,
    /// Killed right after its `n`th stored write; a fresh instance finishes.
    CrashAfter(usize),
    /// As the chart's ServiceAccount, with a pod of the control namespace (a mount holder the
    /// agent did not delete) still mounting the primary claim when the controller releases it.
    Held,
}

/// A helmModelCache binding of `domain` on block storage, as the first admission (in `writer`)
/// creates it: roxReadOnly on the NVMesh-like provider, with its writer Lease.
fn block_binding(control: &str, writer: &str, domain: &str) -> ModelCacheBinding {
    let identity = BindingIdentity::new(Workflow::HelmModelCache, domain, HANDLE);
    let mut b = warmcache_api_modelcache::fixtures::binding_with(
        control,
        writer,
        identity,
        Transition::RoxReadOnly,
    );
    b.spec.decision.provider = "nvmesh".into();
    b.spec.decision.provisioner = DRIVER.into();
    b.spec.decision.required_mount_options = vec!["ro".into()];
    b
}

/// What the provisioner makes for the agent's claim: a PV of the class, bound to the claim
/// (its UID in `claimRef`, as the external provisioner writes it), its size, ReadWriteOnce,
/// the class's Delete, an NVMesh-style handle `<volume>:<namespace of the claim>`.
fn provisioned_pv(name: &str, claim: &PersistentVolumeClaim, volume_id: &str) -> PersistentVolume {
    let size = claim
        .spec
        .as_ref()
        .unwrap()
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()["storage"]
        .clone();
    let ns = claim.namespace().unwrap();
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {
            "name": name,
            "annotations": { "pv.kubernetes.io/provisioned-by": DRIVER },
        },
        "spec": {
            "capacity": { "storage": size },
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "nvcf-sc",
            "claimRef": {
                "kind": "PersistentVolumeClaim", "apiVersion": "v1",
                "namespace": ns, "name": claim.name_any(), "uid": claim.uid().unwrap(),
            },
            "csi": { "driver": DRIVER, "volumeHandle": format!("{volume_id}:{ns}") },
        },
    }))
    .unwrap()
}

/// The attachment the mount holder's attach leaves until the volume detaches.
fn attachment(name: &str, pv: &str) -> VolumeAttachment {
    serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": { "name": name },
        "spec": { "attacher": DRIVER, "nodeName": NODE, "source": { "persistentVolumeName": pv } },
    }))
    .unwrap()
}

async fn binding_where(
    api: &Api<ModelCacheBinding>,
    name: &str,
    what: &str,
    wanted: impl Fn(&ModelCacheBinding) -> bool,
) -> ModelCacheBinding {
    let wanted = &wanted;
    eventually(what, WAIT, || {
        let api = api.clone();
        let name = name.to_owned();
        async move { api.get(&name).await.ok().filter(|b| wanted(b)) }
    })
    .await
    .unwrap_or_else(|e| {
        panic!("{e}");
    })
}

/// The whole block flow in two namespaces of one domain, the controller run as `mode` says;
/// with crashes, how they went.
async fn block_flow(prefix: &str, mode: Mode) -> Option<common::Crashed> {
    let faults = match &mode {
        Mode::Faults(f) => Some(f.clone()),
        Mode::Clean | Mode::Crashes | Mode::CrashAfter(_) | Mode::Held => None,
    };
    let plane = ControlPlane::shared().await.unwrap();
    let client = plane.client().await.unwrap();
    let control = TestNamespace::new(&format!("{prefix}-ctl")).await.unwrap();
    let a = TestNamespace::new(&format!("{prefix}-a")).await.unwrap();
    let b_ns = TestNamespace::new(&format!("{prefix}-b")).await.unwrap();
    let domain = format!("domain-{}", control.name);
    label_domain(&client, &a.name, &domain).await;
    label_domain(&client, &b_ns.name, &domain).await;
    let bindings: Api<ModelCacheBinding> = control.api();
    let created = bindings
        .create(
            &PostParams::default(),
            &block_binding(&control.name, &a.name, &domain),
        )
        .await
        .unwrap();
    let name = created.name_any();
    let identity = created.spec.identity.clone();
    let hash = identity_hash(&identity);
    let claim_name = writer_pvc_name(&identity);
    let job_name = writer_job_name(&identity);
    let lease_name = init_lease_name(&identity);
    let pv_name = format!("{}-primary", control.name);
    let volume_id = format!("nvmesh-{}", &hash[..12]);
    let va_name = format!("csi-{}", &sha256_digest(&pv_name)["sha256:".len()..][..40]);

    let done = tokio_util::sync::CancellationToken::new();
    let (versions, recorder) = record_versions(
        client.clone(),
        &bindings,
        &name,
        created.resource_version().unwrap(),
        done.clone(),
    );

    // Every write of the block flow fails once: the first status, the writer Lease's create
    // and update, the staging Job, the completion update of the primary PV, the release of the
    // primary claim, both view PVs and both view claims (more status writes fail at each stage
    // below).
    let ctl_claims = format!("/namespaces/{}/persistentvolumeclaims", control.name);
    let status_path = format!("/modelcachebindings/{name}/status");
    if let Some(f) = &faults {
        let error = Fault::ServerError;
        let leases = format!("/namespaces/{}/leases", control.name);
        f.inject(http::Method::PUT, &status_path, error, 1);
        f.inject(http::Method::POST, &leases, error, 1);
        f.inject(
            http::Method::PUT,
            &format!("{leases}/{lease_name}"),
            error,
            1,
        );
        f.inject(
            http::Method::POST,
            &format!("/namespaces/{}/jobs", a.name),
            error,
            1,
        );
        f.inject(
            http::Method::PUT,
            &format!("/persistentvolumes/{pv_name}"),
            error,
            1,
        );
        f.inject(
            http::Method::DELETE,
            &format!("{ctl_claims}/{claim_name}"),
            error,
            1,
        );
        f.inject(http::Method::POST, "/api/v1/persistentvolumes", error, 2);
        for ns in [&a, &b_ns] {
            f.inject(
                http::Method::POST,
                &format!("/namespaces/{}/persistentvolumeclaims", ns.name),
                error,
                1,
            );
        }
    }
    let faulty = match &faults {
        Some(f) => Some(plane.client_with_faults(f.clone()).await.unwrap()),
        None => None,
    };
    let mut crashing = None;
    let mut running = None;
    if let Mode::Crashes | Mode::CrashAfter(_) = mode {
        let n = match mode {
            Mode::CrashAfter(n) => Some(n),
            _ => None,
        };
        crashing = Some(Crashing::start(
            plane,
            &control.name,
            lifecycle(&mode),
            move |i| match n {
                Some(n) => (i == 0).then_some(n),
                None => Some(1),
            },
        ));
    } else {
        running = Some(running_controller(plane, &control.name, faulty, &mode).await);
    }
    let fail_next_status = || {
        if let Some(f) = &faults {
            f.inject(http::Method::PUT, &status_path, Fault::ServerError, 1);
        }
    };

    for ns in [&a, &b_ns] {
        ns.api::<Pod>()
            .create(&PostParams::default(), &reader_pod("reader-0", &created))
            .await
            .unwrap();
    }

    // 1. The staging Job in the writer namespace, no claim yet (the agent sizes it).
    let jobs: Api<Job> = a.api();
    let job = eventually("the staging Job", WAIT, || {
        let jobs = jobs.clone();
        let job_name = job_name.clone();
        async move { jobs.get_opt(&job_name).await.ok().flatten() }
    })
    .await
    .unwrap();
    let job_uid = job.uid().unwrap();
    assert!(
        job.spec.as_ref().unwrap().pod_failure_policy.is_some(),
        "the agent's give-up fails the staging Job at once"
    );
    let ctl_pvcs: Api<PersistentVolumeClaim> = control.api();
    assert!(ctl_pvcs.get_opt(&claim_name).await.unwrap().is_none());
    let staging = binding_where(&bindings, &name, "Staging", |b| {
        condition(b, "Ready").is_some_and(|(_, r, _)| r == "Staging")
    })
    .await;
    assert_eq!(population(&staging), Some(PopulationState::Populating));
    let lease: Lease = control.api::<Lease>().get(&lease_name).await.unwrap();
    assert_eq!(
        lease.annotations().get(WRITER_NAMESPACE_ANNOTATION),
        Some(&a.name),
        "the Lease records the writer namespace"
    );

    // 2. The download ran: the pod is staged as the agent reads it (its own function).
    let kubelet = Kubelet::new(client.clone());
    let jp = job_pod(&client, &a.name, &job_name).await;
    kubelet.set_running(&a.name, &jp.name_any()).await.unwrap();
    let jp = a.api::<Pod>().get(&jp.name_any()).await.unwrap();
    let StagingState::Staged(staged) = staging_state(&jp) else {
        panic!("the staging pod is not staged: {:?}", staging_state(&jp));
    };
    assert_eq!(staged.binding, name);
    assert_eq!(staged.job, Some((job_name.clone(), job_uid.clone())));

    // 3. The agent: the primary claim sized from the bytes, provisioned and bound.
    let current = bindings.get(&name).await.unwrap();
    let wanted = staged_primary_claim(&current, &staged, NODE, BYTES, 0);
    fail_next_status();
    let claim = ctl_pvcs
        .create(&PostParams::default(), &wanted)
        .await
        .unwrap();
    assert_eq!(
        claim.spec.as_ref().unwrap().access_modes,
        Some(vec!["ReadWriteOnce".to_owned()])
    );
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    pvs.create(
        &PostParams::default(),
        &provisioned_pv(&pv_name, &claim, &volume_id),
    )
    .await
    .unwrap();
    let claim = eventually("the primary claim bound", WAIT, || {
        let api = ctl_pvcs.clone();
        let claim_name = claim_name.clone();
        async move {
            api.get_opt(&claim_name)
                .await
                .ok()
                .flatten()
                .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
        }
    })
    .await
    .unwrap();
    if matches!(mode, Mode::Held) {
        // A mount holder of the agent's left behind: a pod bound to a node (pvc-protection
        // counts only scheduled pods) mounting the primary claim.
        let node = format!("{}-node", control.name);
        Api::<Node>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Node", "metadata": { "name": node },
                }))
                .unwrap(),
            )
            .await
            .unwrap();
        let holder: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": HOLDER },
            "spec": {
                "nodeName": node,
                "containers": [{ "name": "hold", "image": "tools:1",
                    "volumeMounts": [{ "name": "primary", "mountPath": "/primary" }] }],
                "volumes": [{ "name": "primary",
                    "persistentVolumeClaim": { "claimName": claim_name } }],
            },
        }))
        .unwrap();
        control
            .api::<Pod>()
            .create(&PostParams::default(), &holder)
            .await
            .unwrap();
    }
    // The holder's attach (kept by the driver until the volume detaches).
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    vas.create(&PostParams::default(), &attachment(&va_name, &pv_name))
        .await
        .unwrap();
    binding_where(&bindings, &name, "Copying", |b| {
        condition(b, "Ready").is_some_and(|(_, r, _)| r == "Copying")
    })
    .await;
    assert!(
        !pvs.get(&pv_name)
            .await
            .unwrap()
            .labels()
            .contains_key(COMPLETE_LABEL),
        "nothing is complete before the agent records its copy"
    );

    // 4. The agent records its copy (merge patch with the claim's resourceVersion) and answers
    // the staging pod: the hold exits 0, the Job completes.
    let digest = "ab".repeat(32);
    fail_next_status();
    ctl_pvcs
        .patch(
            &claim_name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": {
                "resourceVersion": claim.resource_version(),
                "annotations": {
                    COPIED_BYTES_ANNOTATION: BYTES.to_string(),
                    MANIFEST_DIGEST_ANNOTATION: digest,
                },
            } })),
        )
        .await
        .unwrap();
    kubelet
        .terminate_container(&a.name, &jp.name_any(), "hold", 0, "")
        .await
        .unwrap();
    kubelet
        .set_phase(&a.name, &jp.name_any(), "Succeeded")
        .await
        .unwrap();

    if let (Mode::Held, Some((_, _, admin))) = (&mode, &running) {
        // The claim is released but the holder keeps it (pvc-protection): the binding names
        // the pod, and past the grace period says so in Degraded, an Event and a metric;
        // nothing is deleted, no view is made.
        let held = binding_where(&bindings, &name, "PrimaryClaimHeld", |b| {
            condition(b, "Degraded").is_some_and(|(s, r, _)| (s, r) == ("True", "PrimaryClaimHeld"))
        })
        .await;
        let holder = format!("{}/{HOLDER}", control.name);
        let (_, _, degraded) = condition(&held, "Degraded").unwrap();
        assert!(degraded.contains(&holder), "{degraded}");
        let (_, reason, progressing) = condition(&held, "Progressing").unwrap();
        assert_eq!(reason, "ReleasingPrimary");
        assert!(
            progressing.contains(&holder) && progressing.contains("kubernetes.io/pvc-protection"),
            "{progressing}"
        );
        assert_eq!(
            condition(&held, "Ready").map(|(s, r, _)| (s, r)),
            Some(("True", "Downloaded"))
        );
        let claim = ctl_pvcs.get(&claim_name).await.unwrap();
        assert!(claim.metadata.deletion_timestamp.is_some(), "released");
        let pod = control.api::<Pod>().get(HOLDER).await.unwrap();
        assert!(pod.metadata.deletion_timestamp.is_none(), "the holder kept");
        let ours = ListParams::default().labels(&format!("{BINDING_LABEL}={name}"));
        assert!(pvs.list(&ours).await.unwrap().items.is_empty(), "no view");
        let events: Api<k8s_openapi::api::events::v1::Event> = control.api();
        let note = eventually("the PrimaryClaimHeld Event", WAIT, || {
            let events = events.clone();
            async move {
                events
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .find(|e| e.reason.as_deref() == Some("PrimaryClaimHeld"))?
                    .note
            }
        })
        .await
        .unwrap();
        assert!(note.contains(&holder), "{note}");
        let metrics = scrape(*admin).await;
        assert_eq!(
            sample(
                &metrics,
                "warmcache_binding_controller_primary_claims_held_total"
            ),
            Some(1.0),
            "{metrics}"
        );
        // The operator deletes the holder (force: no kubelet confirms): the claim goes, the
        // flow goes on.
        control
            .api::<Pod>()
            .delete(
                HOLDER,
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                },
            )
            .await
            .unwrap();
    }

    // 5. Complete and Retain, the claim released, the PV Released; the attachment holds the
    // views back.
    let waiting = binding_where(&bindings, &name, "WaitingForDetach", |b| {
        condition(b, "Progressing").is_some_and(|(_, r, _)| r == "WaitingForDetach")
    })
    .await;
    let (ready, reason, _) = condition(&waiting, "Ready").unwrap();
    assert_eq!((ready, reason), ("True", "Downloaded"));
    assert!(
        condition(&waiting, "Progressing")
            .unwrap()
            .2
            .contains(&va_name)
    );
    let released = eventually("the primary claim gone", WAIT, || {
        let api = ctl_pvcs.clone();
        let claim_name = claim_name.clone();
        async move { matches!(api.get_opt(&claim_name).await, Ok(None)).then_some(()) }
    })
    .await;
    released.unwrap();
    fail_next_status();
    if let (Mode::Clean, Some((stop, task, admin))) = (&mode, running.take()) {
        // The first controller started one download and stored one completion; a new one
        // (fresh caches) takes over from what is stored, the attachment still there.
        let metrics = scrape(admin).await;
        let m = |series: &str| sample(&metrics, &format!("warmcache_binding_controller_{series}"));
        assert_eq!(m("downloads_started_total"), Some(1.0), "{metrics}");
        assert_eq!(m("downloads_succeeded_total"), Some(1.0));
        assert_eq!(m("views_created_total"), Some(0.0));
        stop.cancel();
        let _ = task.await;
        running = Some(running_controller(plane, &control.name, None, &mode).await);
    }
    let held = Duration::from_secs(3);
    tokio::time::sleep(held).await;
    let ours = ListParams::default().labels(&format!("{BINDING_LABEL}={name}"));
    assert!(
        pvs.list(&ours).await.unwrap().items.is_empty(),
        "no view while the primary is attached"
    );
    for ns in [&a, &b_ns] {
        assert!(
            ns.api::<PersistentVolumeClaim>()
                .get_opt(&reader_pvc_name(&identity))
                .await
                .unwrap()
                .is_none()
        );
    }

    // 6. Detached: one read-only view per namespace, bound.
    vas.delete(&va_name, &DeleteParams::default())
        .await
        .unwrap();
    let view_claim = reader_pvc_name(&identity);
    let done_binding = eventually("Ready with both views bound", WAIT, || {
        let bindings = bindings.clone();
        let name = name.clone();
        let apis = [
            a.api::<PersistentVolumeClaim>(),
            b_ns.api::<PersistentVolumeClaim>(),
        ];
        let view_claim = view_claim.clone();
        async move {
            let b = bindings.get(&name).await.ok()?;
            if population(&b) != Some(PopulationState::Ready)
                || condition(&b, "Progressing")?.1 != "Reconciled"
            {
                return None;
            }
            for api in apis {
                let c = api.get_opt(&view_claim).await.ok()??;
                (c.status?.phase.as_deref() == Some("Bound")).then_some(())?;
            }
            Some(b)
        }
    })
    .await
    .unwrap();
    assert_settled(&bindings, &name).await;

    // The primary: complete with the agent's bytes and digest, Retain, Released, kept.
    let primary = pvs.get(&pv_name).await.unwrap();
    let labels = primary.labels();
    assert_eq!(labels.get(COMPLETE_LABEL).map(String::as_str), Some("true"));
    assert_eq!(labels.get(SOURCE_NAMESPACE_LABEL), Some(&a.name));
    let annotations = primary.annotations();
    assert_eq!(annotations.get(BYTES_ANNOTATION), Some(&BYTES.to_string()));
    assert_eq!(
        annotations.get(MANIFEST_DIGEST_ANNOTATION),
        Some(&"ab".repeat(32))
    );
    let spec = primary.spec.as_ref().unwrap();
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Retain")
    );
    assert_eq!(
        primary.status.as_ref().unwrap().phase.as_deref(),
        Some("Released")
    );
    // No primary claim left (and no other claim in the control namespace).
    assert!(
        ctl_pvcs
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // One view per reading namespace: read-only, ReadOnlyMany, Retain, class "", sized from the
    // bytes, each with its namespace's handle.
    let st = done_binding.status.as_ref().unwrap();
    let realized = st.realized.as_ref().unwrap();
    assert_eq!(realized.bytes, Some(i64::try_from(BYTES).unwrap()));
    assert_eq!(
        realized.bound_persistent_volume_name.as_deref(),
        Some(pv_name.as_str())
    );
    let mut namespaces: Vec<&str> = realized
        .views
        .iter()
        .map(|v| v.namespace.as_str())
        .collect();
    namespaces.sort_unstable();
    let mut expected = vec![a.name.as_str(), b_ns.name.as_str()];
    expected.sort_unstable();
    assert_eq!(namespaces, expected);
    let mut handles = Vec::new();
    for v in &realized.views {
        let pv = pvs.get(&v.persistent_volume_name).await.unwrap();
        assert_eq!(pv.labels().get(BINDING_LABEL), Some(&name));
        let spec = pv.spec.unwrap();
        let csi = spec.csi.unwrap();
        assert_eq!(csi.read_only, Some(true));
        assert_eq!(csi.driver, DRIVER);
        assert_eq!(
            csi.volume_handle,
            format!("{volume_id}:{}", v.namespace),
            "the view's handle names its namespace"
        );
        handles.push(csi.volume_handle);
        assert_eq!(spec.access_modes, Some(vec!["ReadOnlyMany".to_owned()]));
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Retain")
        );
        assert_eq!(spec.storage_class_name.unwrap_or_default(), "");
        assert_eq!(spec.mount_options, Some(vec!["ro".to_owned()]));
        assert_eq!(spec.capacity.unwrap()["storage"].0, "1Gi");
        let claim_ref = spec.claim_ref.unwrap();
        assert_eq!(claim_ref.namespace.as_deref(), Some(v.namespace.as_str()));
        assert_eq!(claim_ref.name.as_deref(), Some(view_claim.as_str()));
    }
    handles.sort_unstable();
    handles.dedup();
    assert_eq!(handles.len(), 2, "each namespace its own handle");

    // Exactly one of each, nothing else deleted: one Job (the first), none in the other
    // namespace; the primary and two views of this cache; the Lease; the readers.
    let all_jobs = jobs.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(all_jobs.len(), 1);
    assert_eq!(all_jobs[0].uid(), Some(job_uid));
    assert!(
        b_ns.api::<Job>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let cache = ListParams::default().labels(&format!("{MODEL_LABEL}={hash}"));
    let mut cache_pvs: Vec<String> = pvs
        .list(&cache)
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    cache_pvs.sort_unstable();
    let mut wanted_pvs: Vec<String> = realized
        .views
        .iter()
        .map(|v| v.persistent_volume_name.clone())
        .chain([pv_name.clone()])
        .collect();
    wanted_pvs.sort_unstable();
    assert_eq!(
        cache_pvs, wanted_pvs,
        "the primary and one view per namespace"
    );
    assert_eq!(pvs.list(&ours).await.unwrap().items.len(), 2);
    assert!(
        control
            .api::<Lease>()
            .get_opt(&lease_name)
            .await
            .unwrap()
            .is_some()
    );
    for ns in [&a, &b_ns] {
        let pod = ns.api::<Pod>().get("reader-0").await.unwrap();
        assert!(pod.metadata.deletion_timestamp.is_none());
    }

    // Every stored version: Ready, once reached, never goes back; the views came only after
    // the detach (WaitingForDetach before Reconciled).
    done.cancel();
    recorder.await.unwrap();
    let versions = versions.lock().unwrap().clone();
    assert_never_backwards(&versions);
    let waited = versions
        .iter()
        .position(|(_, _, _, pr)| pr == "WaitingForDetach")
        .unwrap();
    let reconciled = versions
        .iter()
        .position(|(_, _, _, pr)| pr == "Reconciled")
        .unwrap();
    assert!(waited < reconciled, "{versions:?}");

    let mut crashed = None;
    match &mode {
        Mode::CrashAfter(_) => crashed = Some(crashing.take().unwrap().finish().await),
        Mode::Faults(f) => {
            assert_eq!(f.pending(), 0, "every injected failure was met");
            assert!(f.injected() >= 13, "{}", f.injected());
        }
        Mode::Crashes => {
            // Every write was the last of its instance, and a fresh one found nothing to write.
            let chain = crashing.take().unwrap().finish().await;
            let leases = format!("/namespaces/{}/leases", control.name);
            common::assert_crashed_after(
                &chain,
                &[
                    ("PUT", status_path.as_str(), 4),
                    ("POST", leases.as_str(), 1),
                    ("PUT", &format!("{leases}/{lease_name}"), 1),
                    ("POST", &format!("/namespaces/{}/jobs", a.name), 1),
                    ("PUT", &format!("/persistentvolumes/{pv_name}"), 1),
                    ("POST", "/api/v1/persistentvolumes", 2),
                    (
                        "POST",
                        &format!("/namespaces/{}/persistentvolumeclaims", a.name),
                        1,
                    ),
                    (
                        "POST",
                        &format!("/namespaces/{}/persistentvolumeclaims", b_ns.name),
                        1,
                    ),
                ],
                &[&format!("{ctl_claims}/{claim_name}")],
            );
        }
        Mode::Held => {
            let (degraded, reason, _) = condition(&done_binding, "Degraded").unwrap();
            assert_eq!((degraded, reason), ("False", "AsExpected"), "cleared");
        }
        Mode::Clean => {
            // The restarted controller: no download, no completion, the two views.
            let (_, _, admin) = running.as_ref().unwrap();
            let metrics = scrape(*admin).await;
            let m =
                |series: &str| sample(&metrics, &format!("warmcache_binding_controller_{series}"));
            assert_eq!(m("downloads_started_total"), Some(0.0), "{metrics}");
            assert_eq!(m("downloads_succeeded_total"), Some(0.0));
            assert_eq!(m("views_created_total"), Some(2.0));
            assert_eq!(m("bindings{population=\"Ready\"}"), Some(1.0));
        }
    }

    if let Some((stop, task, _)) = running {
        stop.cancel();
        let _ = task.await;
    }
    for ns in [&a, &b_ns] {
        let _ = ns
            .api::<Pod>()
            .delete("reader-0", &DeleteParams::default())
            .await;
    }
    for pv in wanted_pvs {
        let _ = pvs.delete(&pv, &DeleteParams::default()).await;
    }
    if matches!(mode, Mode::Held) {
        let _ = Api::<Node>::all(client.clone())
            .delete(&format!("{}-node", control.name), &DeleteParams::default())
            .await;
    }
    crashed
}

/// The block flow as the chart's ServiceAccount: staged, copied by the (played) agent,
/// completed, the primary claim released; the controller restarted while the primary is still
/// attached; views only after the detach, one per namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_block_flow_gives_each_namespace_a_view_after_the_detach() {
    block_flow("blk-ok", Mode::Clean).await;
}

/// Crash matrix of the block flow: every write fails once (the status at each stage, the
/// Lease, the staging Job, the completion update, the claim release, each view PV and claim):
/// the controller converges to the same end, one of each object, nothing else deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_after_any_write_of_the_block_flow_converges_without_duplicates() {
    block_flow("blk-crash", Mode::Faults(FaultInjector::new())).await;
}

/// Crash matrix of the block flow, as real crashes: the controller is killed right after every
/// write it makes (the write stored, its caches and queues lost) and a fresh instance started:
/// the status at each stage, the Lease's create and update, the staging Job, the completion
/// update, the primary claim's release, each view PV and claim. It converges to the same end,
/// one of each object, nothing else deleted, no stored version going back, and the last fresh
/// instance finds nothing left to write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_any_write_of_the_block_flow_converges_without_duplicates() {
    block_flow("blk-kill", Mode::Crashes).await;
}

/// Crash matrix of the block flow, one crash per run: for every N, a controller makes the first
/// N writes (its caches warm from the writes before) and dies right after the Nth is stored; a
/// fresh one finishes. Each run ends as the others (one of each object, nothing else deleted,
/// no stored version going back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_nth_write_of_the_block_flow_converges_for_every_n() {
    common::crash_after_every_n(15, |n| async move {
        block_flow(&format!("blk-kill{n}"), Mode::CrashAfter(n))
            .await
            .unwrap()
    })
    .await;
}

/// A mount holder the agent did not delete keeps the released primary claim
/// (`kubernetes.io/pvc-protection`): the binding stays Ready, `ReleasingPrimary` names the pod,
/// and past the grace period `Degraded` / `PrimaryClaimHeld` (an Event, a metric) says so too;
/// the controller deletes nothing and makes no view. Once the pod is deleted the flow goes on to
/// one view per namespace and Degraded clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_claim_held_by_a_pod_is_reported_and_nothing_is_deleted() {
    block_flow("blk-held", Mode::Held).await;
}

/// An encrypted block cache, the controller run as the chart's ServiceAccount (the generated
/// roles): before the staging Job it generates the key into the binding's Secret and derives the
/// encrypted StorageClass from the class the decision recorded; the key is in the Secret only
/// (not in the binding, not in an Event). The agent's claim would ask for the encrypted class.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_block_cache_gets_its_key_and_class_before_the_staging_job() {
    use k8s_openapi::api::core::v1::{Event, Secret};
    use k8s_openapi::api::storage::v1::StorageClass;
    use warmcache_modelvolume::encryption::{self, KEY_ENTRY};

    let plane = ControlPlane::shared().await.unwrap();
    let client = plane.client().await.unwrap();
    let control = TestNamespace::new("blk-enc-ctl").await.unwrap();
    let a = TestNamespace::new("blk-enc-a").await.unwrap();
    let domain = format!("domain-{}", control.name);
    label_domain(&client, &a.name, &domain).await;

    // The class the decision was taken on (its own name here: nvcf-sc is cluster-wide and
    // other tests of this plane use it), recorded by UID and configuration digest.
    let classes: Api<StorageClass> = Api::all(client.clone());
    let base_name = format!("{}-base", control.name);
    let base: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": { "name": base_name },
        "provisioner": DRIVER,
        "parameters": { "csi.storage.k8s.io/fstype": "xfs" },
        "reclaimPolicy": "Retain",
        "volumeBindingMode": "Immediate",
    }))
    .unwrap();
    let base = classes.create(&PostParams::default(), &base).await.unwrap();
    let mut wanted = block_binding(&control.name, &a.name, &domain);
    wanted.spec.decision.encryption_required = true;
    wanted.spec.storage_class.name = base_name.clone();
    wanted.spec.storage_class.uid = base.uid().unwrap();
    wanted.spec.storage_class.configuration_digest = warmcache_catalog::storage_class_digest(&base);
    let hash = identity_hash(&wanted.spec.identity);
    wanted.spec.resources.secret_names = vec![hash.clone()];
    wanted.spec.resources.storage_class_names = vec![format!("{hash}-sc")];
    let bindings: Api<ModelCacheBinding> = control.api();
    let created = bindings
        .create(&PostParams::default(), &wanted)
        .await
        .unwrap();
    let name = created.name_any();
    let names = encryption::encryption_names(&created).unwrap().unwrap();

    let (stop, task, _) = running_controller(plane, &control.name, None, &Mode::Clean).await;
    a.api::<Pod>()
        .create(&PostParams::default(), &reader_pod("reader-0", &created))
        .await
        .unwrap();

    // The staging Job starts, and the Secret and class exist by then (created first).
    let jobs: Api<Job> = a.api();
    let job_name = writer_job_name(&created.spec.identity);
    eventually("the staging Job", WAIT, || {
        let jobs = jobs.clone();
        let job_name = job_name.clone();
        async move { jobs.get_opt(&job_name).await.ok().flatten() }
    })
    .await
    .unwrap();
    let secret = control.api::<Secret>().get(&names.secret).await.unwrap();
    encryption::check_ours(&secret.metadata, &created).unwrap();
    assert_eq!(secret.immutable, Some(true));
    let data = secret.data.as_ref().unwrap();
    assert_eq!(data.keys().collect::<Vec<_>>(), vec![KEY_ENTRY]);
    let key = String::from_utf8(data[KEY_ENTRY].0.clone()).unwrap();
    assert_eq!(key.len(), 64);
    assert!(
        key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
        "lowercase hex"
    );
    let class = classes.get(&names.class).await.unwrap();
    encryption::check_class(&class, &created, &names).unwrap();
    assert_eq!(
        class.parameters.as_ref().unwrap()["csi.storage.k8s.io/fstype"],
        "xfs",
        "the base class's own parameters are kept"
    );
    assert_eq!(class.volume_binding_mode.as_deref(), Some("Immediate"));

    // The agent's claim asks for the encrypted class.
    let current = bindings.get(&name).await.unwrap();
    let jp = job_pod(&client, &a.name, &job_name).await;
    let staged = warmcache_modelvolume::agent::Staged {
        namespace: a.name.clone(),
        name: jp.name_any(),
        uid: jp.uid().unwrap(),
        binding: name.clone(),
        binding_uid: current.uid().unwrap(),
        staging_volume: "nvsnap-staging".into(),
        job: None,
    };
    let claim = staged_primary_claim(&current, &staged, NODE, BYTES, 0);
    assert_eq!(
        claim.spec.as_ref().unwrap().storage_class_name.as_deref(),
        Some(names.class.as_str())
    );

    // The key is in the Secret only: not in the binding, not in any Event of the cache.
    let events = eventually("the KeyCreated Event", WAIT, || {
        let api: Api<Event> = control.api();
        async move {
            let list = api.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| e.reason.as_deref() == Some("KeyCreated"))
                .then_some(list.items)
        }
    })
    .await
    .unwrap();
    for e in &events {
        assert!(!serde_json::to_string(e).unwrap().contains(&key), "{e:?}");
    }
    let stored = serde_json::to_string(&bindings.get(&name).await.unwrap()).unwrap();
    assert!(!stored.contains(&key));
    let job = serde_json::to_string(&jobs.get(&job_name).await.unwrap()).unwrap();
    assert!(!job.contains(&key));

    stop.cancel();
    let _ = task.await;
    bindings
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .unwrap();
    for class in [&names.class, &base_name] {
        let _ = classes.delete(class, &DeleteParams::default()).await;
    }
    a.cleanup().await;
    control.cleanup().await;
}
