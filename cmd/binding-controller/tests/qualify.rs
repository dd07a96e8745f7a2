//! `binding-controller qualify` on the REAL node, the binary run as a user runs it, against
//! every profile of the test CSI driver: each report must say what the profile really does.
//!
//! - `shared-fs` (Weka/FSS-like): qualifies with ReadWriteMany; views reuse the handle.
//! - `namespaced-block` (NVMesh-like): ReadWriteMany refused by the provisioner, qualifies with
//!   ReadWriteOnce + ReadOnlyMany; the views' handles are rewritten per namespace by the
//!   controller's derivation, and the read-only attachments wait for the writer's detach.
//! - `tenant-fs` (a multi-tenant file service): must FAIL, naming `reader-identical-bytes`: the
//!   reader in another namespace binds and mounts the writer's very handle but sees its own,
//!   empty tenant.
//! - `root-owned-fs` (seed 002's root-owned fresh export, no fsGroup on ReadWriteMany): must
//!   FAIL, naming `writer-populates` with the writer's `Permission denied`.
//!
//! The namespaces enforce Pod Security "restricted". After every run nothing labelled with the
//! run remains (pods, Jobs, claims, PVs), and the provisioned volumes are gone from the driver.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use warmcache_binding_controller::qualify::RUN_LABEL;
use warmcache_testkit::{ControlPlane, RealNode, TOOLS_IMAGE, TestCsiDriver, TestNamespace};

/// One run at a time: they share the node (and two cores).
static ONE_RUN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const BIN: &str = env!("CARGO_BIN_EXE_binding-controller");

struct Run {
    output: Output,
    report: Value,
    a: TestNamespace,
    b: TestNamespace,
}

async fn restricted(prefix: &str) -> TestNamespace {
    let ns = TestNamespace::new(prefix).await.unwrap();
    Api::<Namespace>::all(ns.client.clone())
        .patch(
            &ns.name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
            } } })),
        )
        .await
        .unwrap();
    ns
}

fn command(
    class: &str,
    a: &str,
    b: &str,
    report: &Path,
    extra: &[&str],
) -> tokio::process::Command {
    let kubeconfig = KUBECONFIG
        .get()
        .expect("start() runs before a command is built");
    // Defaults of the tests; a flag in `extra` replaces its default (clap refuses a flag twice).
    let defaults = [
        ("--image", TOOLS_IMAGE),
        ("--image-pull-policy", "Never"),
        ("--step-timeout", "90s"),
        ("--cleanup-timeout", "90s"),
        ("--output", "text"),
    ];
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args([
        "qualify",
        "--storage-class",
        class,
        "--namespace-a",
        a,
        "--namespace-b",
        b,
    ]);
    for (flag, value) in defaults {
        if !extra.contains(&flag) {
            cmd.args([flag, value]);
        }
    }
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--report")
        .arg(report)
        .args(extra)
        .kill_on_drop(true);
    cmd
}

static KUBECONFIG: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

async fn start() -> &'static RealNode {
    let node = RealNode::shared().await.unwrap();
    let plane = ControlPlane::shared().await.unwrap();
    let _ = KUBECONFIG.set(plane.kubeconfig_path().to_path_buf());
    node
}

async fn qualify(driver: TestCsiDriver, extra: &[&str]) -> Run {
    start().await;
    let a = restricted("qualify-a").await;
    let b = restricted("qualify-b").await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.json");
    let output = command(driver.storage_class(), &a.name, &b.name, &path, extra)
        .output()
        .await
        .unwrap();
    eprintln!(
        "qualify {} exit {:?}\n--- stdout ---\n{}\n--- stderr (tail) ---\n{}",
        driver.short_name(),
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        tail(&String::from_utf8_lossy(&output.stderr), 30)
    );
    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("no report: {e}")),
    )
    .unwrap();
    Run {
        output,
        report,
        a,
        b,
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name}"))
}

fn failed(report: &Value) -> Vec<String> {
    report["failedChecks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

/// Nothing of the run is left: no pod, Job or claim in either namespace, no PV with its label,
/// and the driver deleted the provisioned volumes.
async fn assert_clean(run: &Run, node: &RealNode, driver: TestCsiDriver) {
    let id = run.report["run"].as_str().unwrap();
    let lp = ListParams::default().labels(&format!("{RUN_LABEL}={id}"));
    let client = run.a.client.clone();
    for ns in [&run.a.name, &run.b.name] {
        assert!(
            Api::<Pod>::namespaced(client.clone(), ns)
                .list(&lp)
                .await
                .unwrap()
                .items
                .is_empty(),
            "pods left in {ns}"
        );
        assert!(
            Api::<Job>::namespaced(client.clone(), ns)
                .list(&lp)
                .await
                .unwrap()
                .items
                .is_empty(),
            "Jobs left in {ns}"
        );
        let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap();
        assert!(claims.items.is_empty(), "claims left in {ns}");
    }
    let pvs = Api::<PersistentVolume>::all(client.clone())
        .list(&lp)
        .await
        .unwrap();
    assert!(
        pvs.items.is_empty(),
        "PVs left: {:?}",
        pvs.items
            .iter()
            .map(|p| p.metadata.name.clone())
            .collect::<Vec<_>>()
    );
    let classes = Api::<StorageClass>::all(client.clone())
        .list(&lp)
        .await
        .unwrap();
    assert!(
        classes.items.is_empty(),
        "the run's StorageClass is left: {:?}",
        classes
            .items
            .iter()
            .map(|c| c.metadata.name.clone())
            .collect::<Vec<_>>()
    );
    assert!(
        run.report["cleanup"]["leftovers"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert!(
        run.report["cleanup"]["removed"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == &json!(format!("StorageClass wq-{id}"))),
        "{:#}",
        run.report["cleanup"]
    );
    if let Some(handle) = run.report["writer"]["volumeHandle"].as_str() {
        assert!(
            !node.csi_volume_dir(driver, handle).exists(),
            "the provisioner did not free the writer's volume {handle}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_fs_qualifies_for_read_write_many() {
    let _one = ONE_RUN.lock().await;
    let node = start().await;
    let driver = TestCsiDriver::SharedFs;
    let run = qualify(driver, &[]).await;
    let r = &run.report;
    assert_eq!(run.output.status.code(), Some(0), "{r:#}");
    assert_eq!(r["qualified"], true);
    assert!(failed(r).is_empty(), "{:?}", failed(r));
    for c in r["checks"].as_array().unwrap() {
        assert_eq!(c["status"], "passed", "{c}");
    }
    assert_eq!(r["writer"]["accessMode"], "ReadWriteMany");
    assert_eq!(r["storageClass"]["fsGroupPolicy"], "File");
    let handle = r["writer"]["volumeHandle"].as_str().unwrap();
    for v in r["views"].as_array().unwrap() {
        assert_eq!(v["volumeHandle"], handle, "handles are reused: {v}");
        let mounted: Vec<&str> = v["seen"]["mountOptions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o.as_str().unwrap())
            .collect();
        assert!(mounted.contains(&"ro"), "{mounted:?}");
    }
    assert_eq!(
        r["catalogEntry"]["accessModes"],
        json!(["ReadWriteMany", "ReadOnlyMany"])
    );
    assert_eq!(r["catalogEntry"]["name"], driver.driver_name());
    // The kubelet published every view read-only because the pod said so.
    let views: Vec<&str> = r["views"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["namespace"].as_str().unwrap())
        .collect();
    let publishes = node.csi_publishes(driver).unwrap();
    for ns in views {
        let p = publishes
            .iter()
            .find(|p| p.pod_namespace == ns && p.pod_name.contains("-reader-"))
            .unwrap_or_else(|| panic!("no publish for the reader in {ns}"));
        assert!(p.readonly && p.mounted_read_only, "{p:?}");
    }
    let text = String::from_utf8_lossy(&run.output.stdout);
    assert!(text.contains("QUALIFIED"), "{text}");
    assert!(
        text.contains("accessModes: [ReadWriteMany, ReadOnlyMany]"),
        "{text}"
    );
    assert_clean(&run, node, driver).await;
    run.a.cleanup().await;
    run.b.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaced_block_qualifies_for_read_write_once_with_rewritten_handles() {
    let _one = ONE_RUN.lock().await;
    let node = start().await;
    let driver = TestCsiDriver::NamespacedBlock;
    let run = qualify(
        driver,
        &[
            "--provider",
            "nvmesh",
            "--reader-mount-option",
            "ro,norecovery,nouuid",
        ],
    )
    .await;
    let r = &run.report;
    assert_eq!(run.output.status.code(), Some(0), "{r:#}");
    assert!(failed(r).is_empty(), "{:?}", failed(r));
    // auto: ReadWriteMany refused by the provisioner, then ReadWriteOnce.
    assert_eq!(r["writer"]["accessMode"], "ReadWriteOnce");
    let attempts = r["writer"]["attempts"].as_array().unwrap();
    assert!(
        attempts[0]
            .as_str()
            .unwrap()
            .starts_with("ReadWriteMany: refused by the provisioner"),
        "{attempts:?}"
    );
    assert_eq!(r["storageClass"]["attachRequired"], true);
    let handle = r["writer"]["volumeHandle"].as_str().unwrap();
    let (id, ns) = handle.rsplit_once(':').unwrap();
    assert_eq!(ns, run.a.name);
    for v in r["views"].as_array().unwrap() {
        assert_eq!(
            v["volumeHandle"],
            format!("{id}:{}", v["namespace"].as_str().unwrap()),
            "the controller's derivation rewrites the namespace segment: {v}"
        );
        assert_eq!(v["mountOptions"], json!(["ro", "norecovery", "nouuid"]));
    }
    assert!(
        r["writer"]["detach"]
            .as_str()
            .unwrap()
            .contains("no VolumeAttachment"),
        "{r:#}"
    );
    assert_eq!(
        r["catalogEntry"],
        json!({
            "name": driver.driver_name(),
            "provider": "nvmesh",
            "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
            "readerMountOptions": ["ro", "norecovery", "nouuid"],
        })
    );
    assert_clean(&run, node, driver).await;
    run.a.cleanup().await;
    run.b.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_fs_fails_qualification_naming_the_cross_namespace_read() {
    let _one = ONE_RUN.lock().await;
    let node = start().await;
    let driver = TestCsiDriver::TenantFs;
    let run = qualify(driver, &[]).await;
    let r = &run.report;
    assert_eq!(run.output.status.code(), Some(1), "{r:#}");
    assert_eq!(r["qualified"], false);
    assert_eq!(r["catalogEntry"], Value::Null);
    let failed = failed(r);
    assert!(
        failed.contains(&"reader-identical-bytes".to_owned()),
        "{failed:?}"
    );
    let identical = check(r, "reader-identical-bytes");
    assert!(
        identical["detail"]
            .as_str()
            .unwrap()
            .contains("the payload is missing"),
        "{identical}"
    );
    // What the profile does right is reported as such: the writer, Retain, the same-namespace
    // reader, the negative control.
    for ok in [
        "writer-populates",
        "reclaim-retain",
        "data-survives-writer",
        "negative-control-empty",
    ] {
        assert_eq!(check(r, ok)["status"], "passed", "{ok}: {r:#}");
    }
    let text = String::from_utf8_lossy(&run.output.stdout);
    assert!(text.contains("NOT QUALIFIED"), "{text}");
    assert!(text.contains("FAIL    reader-identical-bytes"), "{text}");
    assert_clean(&run, node, driver).await;
    run.a.cleanup().await;
    run.b.cleanup().await;
}

/// `root-owned-fs` (seed 002's storage: every fresh export is root-owned 0755 and the CSIDriver's
/// `fsGroupPolicy` hands nothing to the pod's group on ReadWriteMany): the non-root writer cannot
/// write, so the class does not qualify for a non-root writer. The claim bound, so `auto` does not
/// go on to ReadWriteOnce (only a mode the provisioner refuses does): the writer's own words are
/// the verdict, and nothing of the run is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_owned_fs_fails_qualification_for_a_non_root_writer() {
    let _one = ONE_RUN.lock().await;
    let node = start().await;
    let driver = TestCsiDriver::RootOwnedFs;
    let run = qualify(driver, &[]).await;
    let r = &run.report;
    assert_eq!(run.output.status.code(), Some(1), "{r:#}");
    assert_eq!(r["qualified"], false);
    assert_eq!(r["catalogEntry"], Value::Null);
    assert_eq!(failed(r)[0], "writer-populates", "{r:#}");
    // Nothing after the writer ran: no check passes on a claim that holds no payload.
    for c in r["checks"].as_array().unwrap() {
        if c["name"] != "writer-populates" {
            assert_eq!(c["status"], "notRun", "{c}");
        }
    }
    let writer = check(r, "writer-populates");
    assert_eq!(writer["status"], "failed", "{writer}");
    assert!(
        writer["detail"]
            .as_str()
            .unwrap()
            .contains("Permission denied"),
        "{writer}"
    );
    assert_eq!(r["writer"]["accessMode"], "ReadWriteMany", "{r:#}");
    let text = String::from_utf8_lossy(&run.output.stdout);
    assert!(text.contains("NOT QUALIFIED"), "{text}");
    assert!(text.contains("FAIL    writer-populates"), "{text}");
    assert_clean(&run, node, driver).await;
    run.a.cleanup().await;
    run.b.cleanup().await;
}

/// Without `--provider nvmesh` (the test driver is in no built-in catalog entry) the views reuse
/// the writer's handle `<id>:<A>`: B's reader never mounts (the driver refuses a handle naming
/// another namespace), and the report names the check with the driver's own words. (A's reader
/// may fail too here: on one node both views' PVs then have the same driver and handle, which
/// the kubelet treats as one volume.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaced_block_views_without_the_handle_rewrite_fail_in_the_other_namespace() {
    let _one = ONE_RUN.lock().await;
    let node = start().await;
    let driver = TestCsiDriver::NamespacedBlock;
    let run = qualify(
        driver,
        &[
            "--writer-access-mode",
            "ReadWriteOnce",
            "--step-timeout",
            "30s",
        ],
    )
    .await;
    let r = &run.report;
    assert_eq!(run.output.status.code(), Some(1), "{r:#}");
    assert_eq!(r["provider"], Value::Null);
    let identical = check(r, "reader-identical-bytes");
    assert_eq!(identical["status"], "failed");
    let detail = identical["detail"].as_str().unwrap();
    assert!(
        detail.contains("timed out") && detail.contains("a reader in another namespace needs a PV whose handle's last segment is its own namespace"),
        "{detail}"
    );
    assert_eq!(check(r, "reader-create-erofs")["status"], "notRun");
    assert_clean(&run, node, driver).await;
    run.a.cleanup().await;
    run.b.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_run_removes_what_it_created_and_gives_no_verdict() {
    let _one = ONE_RUN.lock().await;
    let node = start().await;
    let driver = TestCsiDriver::SharedFs;
    let a = restricted("qualify-int-a").await;
    let b = restricted("qualify-int-b").await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.json");
    let child = command(driver.storage_class(), &a.name, &b.name, &path, &[])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Interrupt once the writer Job exists.
    let jobs: Api<Job> = Api::namespaced(a.client.clone(), &a.name);
    warmcache_testkit::eventually("the writer Job", Duration::from_secs(60), || {
        let jobs = jobs.clone();
        async move {
            let list = jobs
                .list(&ListParams::default().labels(RUN_LABEL))
                .await
                .ok()?;
            (!list.items.is_empty()).then_some(())
        }
    })
    .await
    .unwrap();
    let pid = child.id().unwrap().to_string();
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert!(status.success());
    let output = tokio::time::timeout(Duration::from_secs(150), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    eprintln!(
        "interrupted qualify: exit {:?}\n{}\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        tail(&String::from_utf8_lossy(&output.stderr), 20)
    );
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("interrupted"),
        "the reason is on stderr"
    );
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(report["qualified"], false);
    assert_eq!(
        check(&report, "writer-populates")["status"],
        "notRun",
        "{report:#}"
    );
    assert!(report["interrupted"].is_string(), "{report:#}");
    let run = Run {
        output,
        report,
        a,
        b,
    };
    assert_clean(&run, node, driver).await;
    run.a.cleanup().await;
    run.b.cleanup().await;
}

/// The reviewer's case: someone's retained model-cache PV of the class, Available (its claimRef
/// cleared), provisioned by the class's provisioner, 1Gi ReadWriteMany: a claim naming the
/// class would bind it. The run's claims name the run's own copy of the class, so the PV is
/// never bound, written, labelled, patched or deleted, and the profile still qualifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_available_pv_of_the_class_is_left_untouched() {
    let _one = ONE_RUN.lock().await;
    let node = start().await;
    let driver = TestCsiDriver::SharedFs;
    let plane = ControlPlane::shared().await.unwrap();
    let client = plane.client().await.unwrap();
    let suffix = format!("{:x}", std::process::id());
    let handle = format!("foreign-cache-{suffix}");
    let pv_name = format!("foreign-model-cache-{suffix}");
    // Its data, on the driver's storage, as a real cache holds it.
    let dir = node.csi_volume_dir(driver, &handle);
    std::fs::create_dir_all(dir.join("models")).unwrap();
    let data = b"someone else's model weights\n".repeat(1000);
    std::fs::write(dir.join("models/weights.bin"), &data).unwrap();
    let pvs = Api::<PersistentVolume>::all(client.clone());
    let _ = pvs.delete(&pv_name, &Default::default()).await;
    let foreign: PersistentVolume = serde_json::from_value(json!({
        "metadata": {
            "name": pv_name,
            "labels": { "warmcache.io/testkit": "true" },
            "annotations": { "pv.kubernetes.io/provisioned-by": driver.driver_name() },
        },
        "spec": {
            "capacity": { "storage": "1Gi" },
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": driver.storage_class(),
            "volumeMode": "Filesystem",
            "csi": { "driver": driver.driver_name(), "volumeHandle": handle },
        },
    }))
    .unwrap();
    let created = pvs.create(&Default::default(), &foreign).await.unwrap();
    let uid = created.metadata.uid.clone().unwrap();
    let phase = |pv: &PersistentVolume| {
        pv.status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default()
    };
    warmcache_testkit::eventually("the foreign PV Available", Duration::from_secs(60), || {
        let pvs = pvs.clone();
        let name = pv_name.clone();
        async move {
            let pv = pvs.get(&name).await.ok()?;
            (phase(&pv) == "Available").then_some(())
        }
    })
    .await
    .unwrap();
    let before = pvs.get(&pv_name).await.unwrap();

    let run = qualify(driver, &[]).await;
    let r = &run.report;
    assert_eq!(run.output.status.code(), Some(0), "{r:#}");
    assert!(failed(r).is_empty(), "{:?}", failed(r));
    assert_ne!(r["writer"]["persistentVolume"], json!(pv_name), "{r:#}");
    assert_ne!(r["writer"]["volumeHandle"], json!(handle), "{r:#}");
    assert_eq!(r["storageClass"]["name"], driver.storage_class());
    assert_eq!(check(r, "reclaim-retain")["status"], "passed");

    let after = pvs.get(&pv_name).await.unwrap();
    assert_eq!(
        after.metadata.uid.as_deref(),
        Some(uid.as_str()),
        "recreated"
    );
    assert!(
        after
            .metadata
            .labels
            .as_ref()
            .is_none_or(|l| !l.contains_key(RUN_LABEL)),
        "labelled by the run: {:?}",
        after.metadata.labels
    );
    let spec = after.spec.as_ref().unwrap();
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Retain")
    );
    assert_eq!(spec.claim_ref, None, "bound by the run");
    assert_eq!(phase(&after), "Available");
    assert_eq!(
        after.metadata.resource_version, before.metadata.resource_version,
        "the run changed the PV"
    );
    assert_eq!(std::fs::read(dir.join("models/weights.bin")).unwrap(), data);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "written to");
    assert!(
        !node
            .csi_publishes(driver)
            .unwrap()
            .iter()
            .any(|p| p.volume_handle == handle),
        "the foreign volume was mounted"
    );
    assert_clean(&run, node, driver).await;
    pvs.delete(&pv_name, &Default::default()).await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    run.a.cleanup().await;
    run.b.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_flags_and_missing_objects_exit_2_and_create_nothing() {
    start().await;
    let a = TestNamespace::new("qualify-flags").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.json");
    for (args, needle) in [
        (
            vec!["--namespace-b", "qualify-none-such"],
            "--namespace-b qualify-none-such: no such namespace",
        ),
        (
            vec![
                "--storage-class",
                "no-such-class",
                "--namespace-b",
                "default",
            ],
            "--storage-class no-such-class: no such StorageClass",
        ),
        (vec!["--namespace-b", a.name.as_str()], "--namespace-b"),
    ] {
        let mut cmd = command(
            TestCsiDriver::SharedFs.storage_class(),
            &a.name,
            "default",
            &path,
            &[],
        );
        // Rebuild the arguments with the overrides (clap refuses a flag given twice).
        let mut argv: Vec<String> = cmd
            .as_std()
            .get_args()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        for pair in args.chunks(2) {
            let i = argv.iter().position(|x| x == pair[0]).unwrap();
            argv[i + 1] = pair[1].to_owned();
        }
        cmd = tokio::process::Command::new(BIN);
        cmd.args(&argv);
        let out = cmd.output().await.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(!path.exists(), "no report for a run that did not start");
    }
    // A usage error is clap's, exit 2 too.
    let out = tokio::process::Command::new(BIN)
        .args(["qualify", "--storage-class", "x"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--namespace-a"));
    a.cleanup().await;
}
