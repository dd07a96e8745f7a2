//! The reaper on the REAL node (kubelet, containerd, the test CSI driver's namespaced-block
//! profile with a real external-attacher, so pods get real VolumeAttachments): a view claim a
//! running pod reads is kept however old; its volume is kept while a VolumeAttachment names it;
//! once the pod is gone the claim goes, and the view PV object goes only after the volume has
//! detached.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use warmcache_modelvolume::keys::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, ROLE_LABEL};
use warmcache_modelvolume::reaper::{Config, Keep, Rule};
use warmcache_modelvolume::volume_keys::VOLUME_ROLE_LABEL;
use warmcache_reaper::{Report, Settings, Sweeper};
use warmcache_testkit::{
    ComponentAccount, ControlPlane, RealNode, TestCsiDriver, TestNamespace, eventually, tools_pod,
    wait_pod_running,
};

const TIMEOUT: Duration = Duration::from_secs(240);

/// The UIDs of the VolumeAttachments that attach `pv`.
async fn attachments_of(client: &kube::Client, pv: &str) -> BTreeSet<String> {
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|va| va.spec.source.persistent_volume_name.as_deref() == Some(pv))
        .filter_map(|va| va.metadata.uid)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_a_running_pod_reads_and_an_attached_volume_are_kept_until_released() {
    let node = RealNode::shared().await.unwrap();
    let plane = ControlPlane::shared().await.unwrap();
    let admin = plane.client().await.unwrap();
    let control = TestNamespace::new("reap-node-ctl").await.unwrap();
    let reader = TestNamespace::new("reap-node-rd").await.unwrap();
    let account = ComponentAccount::create(plane, &admin, "reaper", &control.name, &control.name)
        .await
        .unwrap();
    let driver = TestCsiDriver::NamespacedBlock;

    // A view claim as warmcache labels it, on real attachable storage, read by a running pod.
    let claim_name = format!("ro-pvc-{}", "a".repeat(48));
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": claim_name,
            "labels": {
                MANAGED_BY_LABEL: MANAGED_BY_VALUE,
                VOLUME_ROLE_LABEL: "reader",
                ROLE_LABEL: "reader",
            },
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": driver.storage_class(),
            "resources": { "requests": { "storage": "1Gi" } },
        },
    }))
    .unwrap();
    let claims: Api<PersistentVolumeClaim> = reader.api();
    claims.create(&PostParams::default(), &claim).await.unwrap();
    let mut pod = tools_pod("reader-0", "sleep 3600");
    let spec = pod.spec.as_mut().unwrap();
    spec.node_name = Some(node.name().to_owned());
    spec.volumes = Some(vec![
        serde_json::from_value(json!({
            "name": "model", "persistentVolumeClaim": { "claimName": claim_name },
        }))
        .unwrap(),
    ]);
    spec.containers[0].volume_mounts = Some(vec![
        serde_json::from_value(json!({
            "name": "model", "mountPath": "/model",
        }))
        .unwrap(),
    ]);
    let pods: Api<Pod> = reader.api();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    wait_pod_running(&pods, "reader-0", TIMEOUT).await.unwrap();
    let pv = claims
        .get(&claim_name)
        .await
        .unwrap()
        .spec
        .unwrap()
        .volume_name
        .unwrap();
    // Its PV made a read-only view of warmcache's (as the binding controller labels one).
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    let labels = json!({ "metadata": { "labels": {
        MANAGED_BY_LABEL: MANAGED_BY_VALUE, VOLUME_ROLE_LABEL: "reader-shared",
    }}});
    pvs.patch(&pv, &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .unwrap();
    assert_eq!(
        attachments_of(&admin, &pv).await.len(),
        1,
        "a real attachment"
    );

    let settings = Settings {
        config: Config {
            orphan_claim_after_seconds: 1,
            ..Config::new(control.name.clone())
        },
        dry_run: false,
        page_size: 100,
        stage_wait: Duration::from_secs(5),
    };
    let sweeper = Sweeper::new(account.client().await.unwrap(), settings, None, None, None);
    let sweep = || async {
        let report: Report = sweeper.sweep(Timestamp::now()).await;
        println!("{}\n{}", report.lines.join("\n"), report.summary());
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        report
    };

    // Read by a running pod: the claim and its volume stay.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = sweep().await;
    assert_eq!(
        report.kept.get(&(Rule::OrphanClaim, Keep::InUse)),
        Some(&1),
        "{report:?}"
    );
    assert!(
        report
            .kept
            .contains_key(&(Rule::OrphanView, Keep::Attached)),
        "{report:?}"
    );
    assert!(claims.get_opt(&claim_name).await.unwrap().is_some());

    // The pod gone, the claim goes; the volume object stays while it is still attached.
    pods.delete("reader-0", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the reader gone", TIMEOUT, || {
        let pods = pods.clone();
        async move {
            pods.get_opt("reader-0")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        }
    })
    .await
    .unwrap();
    sweep().await;
    eventually("the orphan claim gone", TIMEOUT, || {
        let claims = claims.clone();
        let name = claim_name.clone();
        async move { claims.get_opt(&name).await.unwrap().is_none().then_some(()) }
    })
    .await
    .unwrap();
    let checked_attached = std::sync::atomic::AtomicBool::new(false);
    eventually("the view PV deleted once detached", TIMEOUT, || {
        let pvs = pvs.clone();
        let pv = pv.clone();
        let admin = admin.clone();
        let sweep = &sweep;
        let checked = &checked_attached;
        async move {
            // The detach runs while we look. An attachment seen both before and after the sweep
            // (the same object: nothing can attach the volume again once its claim is gone)
            // attached the volume for the whole sweep, so the sweep must have left the PV be.
            // The external-attacher's finalizer would keep a deleted PV visible, so check the
            // sweep's own actions and the deletion timestamp, not only presence.
            let before = attachments_of(&admin, &pv).await;
            let report = sweep().await;
            let after = attachments_of(&admin, &pv).await;
            let present = pvs.get_opt(&pv).await.unwrap();
            if before.intersection(&after).next().is_some() {
                checked.store(true, std::sync::atomic::Ordering::Relaxed);
                let deleting = present
                    .as_ref()
                    .is_none_or(|p| p.metadata.deletion_timestamp.is_some());
                let acted = report.lines.iter().any(|l| l.contains(pv.as_str()));
                assert!(!deleting && !acted, "deleted while attached: {report:?}");
            }
            present.is_none().then_some(())
        }
    })
    .await
    .unwrap();
    println!(
        "a sweep saw the volume still attached: {}",
        checked_attached.load(std::sync::atomic::Ordering::Relaxed)
    );
    assert!(attachments_of(&admin, &pv).await.is_empty());
}
