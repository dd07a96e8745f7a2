//! The warmcache image (`warmcache_testkit::component_image`, what `hack/build-image.sh` packs)
//! runs on the real node: every component binary starts from it as the chart runs it (uid 65532
//! from the image, Pod Security "restricted", read-only root file system), so the image carries
//! every library the binaries link.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{LogParams, PostParams};
use serde_json::json;
use warmcache_testkit::{
    COMPONENT_BINARIES, RealNode, TestNamespace, built_binaries_dir, component_image,
    wait_pod_finished,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_component_binary_runs_from_the_image_as_the_chart_runs_it() {
    let node = RealNode::shared().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let image = component_image(
        "warmcache.test/warmcache:test",
        &built_binaries_dir().unwrap(),
        &COMPONENT_BINARIES,
    )
    .unwrap_or_else(|e| panic!("{e} (run `cargo build --bins` or the workspace tests)"))
    .build(dir.path())
    .unwrap();
    node.import_image(&image).await.unwrap();

    let ns = TestNamespace::new("chart-image").await.unwrap();
    let containers: Vec<serde_json::Value> = COMPONENT_BINARIES
        .iter()
        .map(|name| {
            json!({
                "name": name,
                "image": image.reference,
                "imagePullPolicy": "Never",
                "command": [format!("/usr/local/bin/{name}"), "--version"],
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"]},
                },
            })
        })
        .collect();
    // Init containers run one by one, so each one's log is its own; no runAsUser: the image's
    // user must be the non-root one.
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "versions"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "automountServiceAccountToken": false,
            "initContainers": containers,
            "containers": [{
                "name": "done",
                "image": image.reference,
                "imagePullPolicy": "Never",
                "command": ["/usr/local/bin/webhook", "help"],
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"]},
                },
            }],
        },
    }))
    .unwrap();
    let pods = ns.api::<Pod>();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let done = wait_pod_finished(&pods, "versions", Duration::from_secs(120))
        .await
        .unwrap();
    let phase = done.status.as_ref().and_then(|s| s.phase.clone());
    for name in COMPONENT_BINARIES {
        let log = pods
            .logs(
                "versions",
                &LogParams {
                    container: Some(name.to_owned()),
                    ..LogParams::default()
                },
            )
            .await
            .unwrap_or_default();
        assert!(
            log.starts_with(&format!("{name} ")) || log.contains(env!("CARGO_PKG_VERSION")),
            "{name}: {log:?} (pod {phase:?}: {:?})",
            done.status
        );
    }
    assert_eq!(phase.as_deref(), Some("Succeeded"), "{:?}", done.status);
    ns.cleanup().await;
}
