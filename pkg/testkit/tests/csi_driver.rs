//! The TEST CSI driver on the real node (a simulation of the storage behaviours the seeds
//! measured): dynamic provisioning with Retain, readers in other namespaces through static PVs,
//! what `csi.readOnly: true` alone does against `persistentVolumeClaim.readOnly: true`, the
//! namespaced block profile's handle rule and one read-write attachment at a time, the
//! root-owned export, and class-only claims getting empty volumes. All tests in this binary
//! share one control plane and one node.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;
use warmcache_testkit::{
    ControlPlane, RealNode, TOOLS_IMAGE, TestCsiDriver, TestNamespace, eventually,
    termination_message, wait_pod_finished, wait_pod_running,
};

const TIMEOUT: Duration = Duration::from_secs(120);

/// Prints one line per write attempt through /data: "<op> rc=<code> <error>".
const WRITE_ATTEMPTS: &str = r#"
try() { op=$1; shift; err=$("$@" 2>&1 >/dev/null); echo "$op rc=$? $err"; }
try create touch /data/new
try append sh -c "echo more >> /data/file"
try rename mv /data/file /data/renamed
try chmod chmod 600 /data/file
try truncate truncate -s 0 /data/file
try delete rm /data/file
"#;

fn claim(name: &str, class: &str, mode: &str, volume: Option<&str>) -> PersistentVolumeClaim {
    let mut spec = json!({
        "accessModes": [mode],
        "storageClassName": class,
        "resources": { "requests": { "storage": "16Mi" } },
    });
    if let Some(volume) = volume {
        spec["volumeName"] = json!(volume);
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": { "name": name }, "spec": spec,
    }))
    .unwrap()
}

/// A pod mounting `claim` at /data (pod-side `readOnly` as given) running `script`; its
/// termination message is what the script writes to /dev/termination-log.
fn claim_pod(name: &str, claim: &str, pod_read_only: bool, script: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main", "image": TOOLS_IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "volumeMounts": [{ "name": "d", "mountPath": "/data" }],
            }],
            "volumes": [{ "name": "d", "persistentVolumeClaim": {
                "claimName": claim, "readOnly": pod_read_only,
            }}],
        },
    }))
    .unwrap()
}

/// A reader PV derived from the writer's PV, as the product derives one: same driver, the
/// reader's volume handle, ReadOnlyMany, Retain, `csi.readOnly: true`, pre-bound to
/// `<namespace>/<claim>`.
fn reader_pv(
    name: &str,
    writer: &PersistentVolume,
    handle: &str,
    namespace: &str,
    claim: &str,
    mount_options: &[&str],
) -> PersistentVolume {
    let csi = writer.spec.as_ref().unwrap().csi.as_ref().unwrap();
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": { "name": name },
        "spec": {
            "capacity": { "storage": "16Mi" },
            "accessModes": ["ReadOnlyMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "mountOptions": mount_options,
            "claimRef": { "namespace": namespace, "name": claim },
            "csi": {
                "driver": csi.driver,
                "volumeHandle": handle,
                "readOnly": true,
                "fsType": csi.fs_type,
                "volumeAttributes": csi.volume_attributes,
            },
        },
    }))
    .unwrap()
}

async fn bound_volume(ns: &TestNamespace, claim: &str) -> PersistentVolume {
    let claims = ns.api::<PersistentVolumeClaim>();
    let volume = eventually(&format!("claim {claim} to be Bound"), TIMEOUT, || {
        let claims = claims.clone();
        async move {
            let c = claims.get(claim).await.ok()?;
            let bound = c.status?.phase.as_deref() == Some("Bound");
            bound.then_some(c.spec?.volume_name?)
        }
    })
    .await
    .unwrap();
    let pvs: Api<PersistentVolume> = Api::all(ns.client.clone());
    pvs.get(&volume).await.unwrap()
}

async fn run_pod(ns: &TestNamespace, pod: Pod) -> Pod {
    let pods = ns.api::<Pod>();
    let name = pod.metadata.name.clone().unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let done = wait_pod_finished(&pods, &name, TIMEOUT).await.unwrap();
    assert_eq!(
        done.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded"),
        "{:?}",
        done.status
    );
    done
}

fn handle_of(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .unwrap()
        .csi
        .as_ref()
        .unwrap()
        .volume_handle
        .clone()
}

fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap()
}

/// Asserts every write attempt of [`WRITE_ATTEMPTS`] failed with EROFS.
fn assert_all_erofs(report: &str) {
    let lines: Vec<&str> = report.lines().filter(|l| l.contains(" rc=")).collect();
    assert_eq!(lines.len(), 6, "{report}");
    for line in lines {
        assert!(
            !line.contains(" rc=0 ") && line.contains("Read-only file system"),
            "write not refused with EROFS: {line}\n{report}"
        );
    }
}

fn publish_for(node: &RealNode, driver: TestCsiDriver, pod: &Pod) -> warmcache_testkit::CsiPublish {
    let uid = uid_of(pod);
    node.csi_publishes(driver)
        .unwrap()
        .into_iter()
        .rfind(|p| p.pod_uid == uid && p.error.is_none())
        .unwrap_or_else(|| panic!("no successful NodePublishVolume for pod uid {uid}"))
}

async fn pod_event_containing(ns: &TestNamespace, pod: &str, text: &str) -> String {
    let events = ns.api::<Event>();
    let params = ListParams::default().fields(&format!("involvedObject.name={pod}"));
    eventually(
        &format!("an event of pod {pod} saying {text:?}"),
        TIMEOUT,
        || {
            let (events, params) = (events.clone(), params.clone());
            async move {
                events
                    .list(&params)
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .filter_map(|e| e.message)
                    .find(|m| m.contains(text))
            }
        },
    )
    .await
    .unwrap()
}

/// Retain keeps the volume and its data after the writer's claim is deleted; a claim naming only
/// the StorageClass gets a new, empty volume (the seeds' negative control).
async fn retain_and_class_only_claim(
    node: &RealNode,
    driver: TestCsiDriver,
    writer_ns: &TestNamespace,
    writer_pv: &PersistentVolume,
    other_ns: &TestNamespace,
) {
    let pv_name = writer_pv.metadata.name.clone().unwrap();
    let handle = handle_of(writer_pv);
    assert_eq!(
        writer_pv
            .spec
            .as_ref()
            .unwrap()
            .persistent_volume_reclaim_policy
            .as_deref(),
        Some("Retain")
    );
    // A scheduled pod naming the claim holds it (kubernetes.io/pvc-protection), even after the
    // pod Succeeded: the finished writer must be deleted before its claim can go.
    let writer_pods = writer_ns.api::<Pod>();
    let _ = writer_pods.delete("writer", &DeleteParams::default()).await;
    eventually("the writer pod to be gone", TIMEOUT, || {
        let writer_pods = writer_pods.clone();
        async move { matches!(writer_pods.get_opt("writer").await, Ok(None)).then_some(()) }
    })
    .await
    .unwrap();
    writer_ns
        .api::<PersistentVolumeClaim>()
        .delete("data", &DeleteParams::background())
        .await
        .unwrap();
    let pvs: Api<PersistentVolume> = Api::all(writer_ns.client.clone());
    eventually(&format!("PV {pv_name} to be Released"), TIMEOUT, || {
        let pvs = pvs.clone();
        let pv_name = pv_name.clone();
        async move {
            let pv = pvs.get(&pv_name).await.ok()?;
            (pv.status?.phase.as_deref() == Some("Released")).then_some(())
        }
    })
    .await
    .unwrap();
    let dir = node.csi_volume_dir(driver, &handle);
    assert!(
        std::fs::read_to_string(dir.join("file")).is_ok(),
        "the retained volume lost its data: {}",
        dir.display()
    );

    other_ns
        .api::<PersistentVolumeClaim>()
        .create(
            &PostParams::default(),
            &claim(
                "fresh",
                driver.storage_class(),
                driver.writer_access_mode(),
                None,
            ),
        )
        .await
        .unwrap();
    let fresh = bound_volume(other_ns, "fresh").await;
    let fresh_handle = handle_of(&fresh);
    assert_ne!(
        driver.reader_volume_handle(&fresh_handle, "x"),
        driver.reader_volume_handle(&handle, "x"),
        "a class-only claim reused the volume"
    );
    let done = run_pod(
        other_ns,
        claim_pod(
            "fresh",
            "fresh",
            false,
            "ls -A /data | wc -l | tr -d ' ' > /dev/termination-log",
        ),
    )
    .await;
    assert_eq!(termination_message(&done, "main").as_deref(), Some("0\n"));
}

#[tokio::test]
async fn shared_filesystem_profile() {
    let driver = TestCsiDriver::SharedFs;
    let node = RealNode::shared().await.unwrap();
    let writer_ns = TestNamespace::new("fs-writer").await.unwrap();
    let reader_ns = TestNamespace::new("fs-reader").await.unwrap();

    // Dynamic provisioning of a ReadWriteMany claim; the writer pod fills it.
    writer_ns
        .api::<PersistentVolumeClaim>()
        .create(
            &PostParams::default(),
            &claim("data", driver.storage_class(), "ReadWriteMany", None),
        )
        .await
        .unwrap();
    let writer_pv = bound_volume(&writer_ns, "data").await;
    let handle = handle_of(&writer_pv);
    assert!(
        !handle.contains(':'),
        "a shared-fs handle carries no namespace: {handle}"
    );
    let writer = run_pod(
        &writer_ns,
        claim_pod("writer", "data", false, "echo payload > /data/file && sync"),
    )
    .await;
    let publish = publish_for(node, driver, &writer);
    assert!(
        !publish.readonly && !publish.mounted_read_only,
        "{publish:?}"
    );

    // A reader in another namespace through a static PV reusing the handle.
    let reader_pv_name = format!("reader-{}", reader_ns.name);
    let reader_handle = driver.reader_volume_handle(&handle, &reader_ns.name);
    assert_eq!(reader_handle, handle);
    Api::<PersistentVolume>::all(reader_ns.client.clone())
        .create(
            &PostParams::default(),
            &reader_pv(
                &reader_pv_name,
                &writer_pv,
                &reader_handle,
                &reader_ns.name,
                "data",
                &[],
            ),
        )
        .await
        .unwrap();
    reader_ns
        .api::<PersistentVolumeClaim>()
        .create(
            &PostParams::default(),
            &claim("data", "", "ReadOnlyMany", Some(&reader_pv_name)),
        )
        .await
        .unwrap();
    bound_volume(&reader_ns, "data").await;

    // persistentVolumeClaim.readOnly: true -> the driver is asked for a read-only publish, the
    // mount is ro, every write fails with EROFS.
    let script = format!(
        "echo \"read=$(cat /data/file)\" > /dev/termination-log\n{{ {WRITE_ATTEMPTS} }} >> /dev/termination-log"
    );
    let protected = run_pod(&reader_ns, claim_pod("reader-ro", "data", true, &script)).await;
    let report = termination_message(&protected, "main").unwrap();
    assert!(report.starts_with("read=payload\n"), "{report}");
    assert_all_erofs(&report);
    let publish = publish_for(node, driver, &protected);
    assert!(publish.readonly && publish.mounted_read_only, "{publish:?}");

    // Only csi.readOnly: true on the PV (no pod-side readOnly): the kubelet asks for a
    // read-write publish and the reader OVERWRITES the writer's data. This is the fact the
    // product must design around: every reader view sets the pod-side readOnly too.
    let exposed = run_pod(
        &reader_ns,
        claim_pod(
            "reader-csi-ro-only",
            "data",
            false,
            "cat /data/file > /dev/termination-log && echo overwritten-by-reader > /data/file",
        ),
    )
    .await;
    assert_eq!(
        termination_message(&exposed, "main").as_deref(),
        Some("payload\n")
    );
    let publish = publish_for(node, driver, &exposed);
    assert!(
        !publish.readonly && !publish.mounted_read_only,
        "{publish:?}"
    );
    assert_eq!(
        std::fs::read_to_string(node.csi_volume_dir(driver, &handle).join("file")).unwrap(),
        "overwritten-by-reader\n",
        "csi.readOnly: true alone was expected NOT to protect the data on a driver without attach"
    );

    retain_and_class_only_claim(node, driver, &writer_ns, &writer_pv, &reader_ns).await;
    writer_ns.cleanup().await;
    reader_ns.cleanup().await;
}

#[tokio::test]
async fn namespaced_block_profile() {
    let driver = TestCsiDriver::NamespacedBlock;
    let node = RealNode::shared().await.unwrap();
    let client = ControlPlane::shared()
        .await
        .unwrap()
        .client()
        .await
        .unwrap();
    let writer_ns = TestNamespace::new("blk-writer").await.unwrap();
    let reader_ns = TestNamespace::new("blk-reader").await.unwrap();
    let stale_ns = TestNamespace::new("blk-stale").await.unwrap();
    let options_ns = TestNamespace::new("blk-options").await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());

    // Dynamic provisioning of a ReadWriteOnce claim: the handle ends with the claim's namespace.
    writer_ns
        .api::<PersistentVolumeClaim>()
        .create(
            &PostParams::default(),
            &claim("data", driver.storage_class(), "ReadWriteOnce", None),
        )
        .await
        .unwrap();
    let writer_pv = bound_volume(&writer_ns, "data").await;
    let handle = handle_of(&writer_pv);
    assert!(
        handle.ends_with(&format!(":{}", writer_ns.name)),
        "the handle names the claim's namespace: {handle}"
    );
    // The writer stays running, so its read-write attachment stays.
    let writer_pods = writer_ns.api::<Pod>();
    writer_pods
        .create(
            &PostParams::default(),
            &claim_pod(
                "writer",
                "data",
                false,
                "echo payload > /data/file && sync && exec sleep 3600",
            ),
        )
        .await
        .unwrap();
    wait_pod_running(&writer_pods, "writer", TIMEOUT)
        .await
        .unwrap();
    let writer_pv_name = writer_pv.metadata.name.clone().unwrap();
    let writer_attachment = attachments
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|a| a.spec.source.persistent_volume_name.as_deref() == Some(&writer_pv_name))
        .expect("a VolumeAttachment for the writer's PV");
    assert_eq!(writer_attachment.status.map(|s| s.attached), Some(true));

    // A reader PV with the handle rewritten to the reader's namespace.
    let reader_handle = driver.reader_volume_handle(&handle, &reader_ns.name);
    let reader_pv_name = format!("reader-{}", reader_ns.name);
    pvs.create(
        &PostParams::default(),
        &reader_pv(
            &reader_pv_name,
            &writer_pv,
            &reader_handle,
            &reader_ns.name,
            "data",
            &[],
        ),
    )
    .await
    .unwrap();
    reader_ns
        .api::<PersistentVolumeClaim>()
        .create(
            &PostParams::default(),
            &claim("data", "", "ReadOnlyMany", Some(&reader_pv_name)),
        )
        .await
        .unwrap();
    bound_volume(&reader_ns, "data").await;

    // While the writer is attached read-write, the reader's read-only attach is refused.
    let reader_pods = reader_ns.api::<Pod>();
    let script = format!(
        "echo \"read=$(cat /data/file)\" > /dev/termination-log\n{{ {WRITE_ATTEMPTS} }} >> /dev/termination-log"
    );
    reader_pods
        .create(
            &PostParams::default(),
            &claim_pod("reader-ro", "data", true, &script),
        )
        .await
        .unwrap();
    let refusal = eventually("the reader's attach to be refused", TIMEOUT, || {
        let attachments = attachments.clone();
        let reader_pv_name = reader_pv_name.clone();
        async move {
            attachments
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|a| a.spec.source.persistent_volume_name.as_deref() == Some(&reader_pv_name))?
                .status?
                .attach_error?
                .message
        }
    })
    .await
    .unwrap();
    assert!(
        refusal.contains("one read-write attachment at a time"),
        "{refusal}"
    );
    let pod = reader_pods.get("reader-ro").await.unwrap();
    assert_ne!(
        pod.status.and_then(|s| s.phase).as_deref(),
        Some("Succeeded"),
        "the reader ran while the writer was attached read-write"
    );

    // Once the writer is gone and detached, the same read-only attach is accepted.
    writer_pods
        .delete("writer", &DeleteParams::default())
        .await
        .unwrap();
    let protected = wait_pod_finished(&reader_pods, "reader-ro", TIMEOUT)
        .await
        .unwrap();
    let report = termination_message(&protected, "main").unwrap();
    assert!(report.starts_with("read=payload\n"), "{report}");
    assert_all_erofs(&report);
    let publish = publish_for(node, driver, &protected);
    assert!(publish.readonly && publish.mounted_read_only, "{publish:?}");
    assert_eq!(publish.attached_read_only, Some(true), "{publish:?}");
    assert_eq!(publish.pod_namespace, reader_ns.name);

    // Only csi.readOnly: true: the attachment is read-only (csi.readOnly reaches
    // ControllerPublishVolume on a driver with attach), but the kubelet still asks for a
    // read-write publish and this test driver, like a driver that trusts the kubelet, mounts
    // read-write: the reader overwrites the data.
    let exposed = run_pod(
        &reader_ns,
        claim_pod(
            "reader-csi-ro-only",
            "data",
            false,
            "cat /data/file > /dev/termination-log && echo overwritten-by-reader > /data/file",
        ),
    )
    .await;
    assert_eq!(
        termination_message(&exposed, "main").as_deref(),
        Some("payload\n")
    );
    let publish = publish_for(node, driver, &exposed);
    assert!(
        !publish.readonly && !publish.mounted_read_only,
        "{publish:?}"
    );
    assert_eq!(publish.attached_read_only, Some(true), "{publish:?}");
    assert_eq!(
        std::fs::read_to_string(node.csi_volume_dir(driver, &handle).join("file")).unwrap(),
        "overwritten-by-reader\n"
    );

    // A reader PV that keeps the writer's namespace in the handle: the publish fails.
    let stale_pv_name = format!("reader-{}", stale_ns.name);
    pvs.create(
        &PostParams::default(),
        &reader_pv(
            &stale_pv_name,
            &writer_pv,
            &handle,
            &stale_ns.name,
            "data",
            &[],
        ),
    )
    .await
    .unwrap();
    stale_ns
        .api::<PersistentVolumeClaim>()
        .create(
            &PostParams::default(),
            &claim("data", "", "ReadOnlyMany", Some(&stale_pv_name)),
        )
        .await
        .unwrap();
    bound_volume(&stale_ns, "data").await;
    stale_ns
        .api::<Pod>()
        .create(
            &PostParams::default(),
            &claim_pod("stale", "data", true, "cat /data/file"),
        )
        .await
        .unwrap();
    let message = pod_event_containing(&stale_ns, "stale", "handle's last segment").await;
    assert!(message.contains(&writer_ns.name), "{message}");

    // The reader mount options the catalog gives NVMesh (ro, norecovery, nouuid) are accepted,
    // and `ro` alone makes the mount read-only even without the pod-side flag.
    let options_pv_name = format!("reader-{}", options_ns.name);
    pvs.create(
        &PostParams::default(),
        &reader_pv(
            &options_pv_name,
            &writer_pv,
            &driver.reader_volume_handle(&handle, &options_ns.name),
            &options_ns.name,
            "data",
            &["ro", "norecovery", "nouuid"],
        ),
    )
    .await
    .unwrap();
    options_ns
        .api::<PersistentVolumeClaim>()
        .create(
            &PostParams::default(),
            &claim("data", "", "ReadOnlyMany", Some(&options_pv_name)),
        )
        .await
        .unwrap();
    bound_volume(&options_ns, "data").await;
    let with_options = run_pod(&options_ns, claim_pod("options", "data", false, &script)).await;
    assert_all_erofs(&termination_message(&with_options, "main").unwrap());
    let publish = publish_for(node, driver, &with_options);
    assert_eq!(
        publish.mount_flags,
        ["ro", "norecovery", "nouuid"],
        "{publish:?}"
    );
    assert!(
        !publish.readonly && publish.mounted_read_only,
        "{publish:?}"
    );

    stale_ns
        .api::<Pod>()
        .delete("stale", &DeleteParams::default())
        .await
        .unwrap();
    retain_and_class_only_claim(node, driver, &writer_ns, &writer_pv, &reader_ns).await;
    for ns in [writer_ns, reader_ns, stale_ns, options_ns] {
        ns.cleanup().await;
    }
}

/// A fresh export is owned by root with mode 0755. With fsGroupPolicy File the kubelet hands it
/// to the pod's fsGroup and a non-root writer succeeds; with ReadWriteOnceWithFSType (a
/// ReadWriteMany volume) it does not, and the same writer gets EACCES, as on OCI File Storage.
#[tokio::test]
async fn a_root_owned_export_refuses_a_non_root_writer() {
    let node = RealNode::shared().await.unwrap();
    let ns = TestNamespace::new("root-owned").await.unwrap();
    let script = "id -u > /dev/termination-log; \
                  if sh -c 'echo x > /data/probe' 2>/tmp/err; then echo written >> /dev/termination-log; \
                  else cat /tmp/err >> /dev/termination-log; fi";
    for (driver, claim_name) in [
        (TestCsiDriver::RootOwnedFs, "root-owned"),
        (TestCsiDriver::SharedFs, "fs-group"),
    ] {
        ns.api::<PersistentVolumeClaim>()
            .create(
                &PostParams::default(),
                &claim(claim_name, driver.storage_class(), "ReadWriteMany", None),
            )
            .await
            .unwrap();
        let pv = bound_volume(&ns, claim_name).await;
        let dir = node.csi_volume_dir(driver, &handle_of(&pv));
        let meta = std::fs::metadata(&dir).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o7777),
            (0, 0, 0o755)
        );

        let mut pod = claim_pod(claim_name, claim_name, false, script);
        pod.spec.as_mut().unwrap().security_context = Some(
            serde_json::from_value(json!({
                "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
            }))
            .unwrap(),
        );
        let done = run_pod(&ns, pod).await;
        let report = termination_message(&done, "main").unwrap();
        let meta = std::fs::metadata(&dir).unwrap();
        match driver {
            TestCsiDriver::RootOwnedFs => {
                assert!(report.starts_with("1000\n"), "{report}");
                assert!(report.contains("Permission denied"), "{report}");
                assert_eq!((meta.uid(), meta.gid()), (0, 0), "ownership changed");
            }
            _ => {
                assert_eq!(report, "1000\nwritten\n");
                assert_eq!(meta.gid(), 1000, "the kubelet did not apply the fsGroup");
            }
        }
    }
    ns.cleanup().await;
}
