//! The real `hf` CLI in a pod on the real node downloads a model from the simulated Hub on the
//! host, as a chart's download step does: the pod reaches `HF_ENDPOINT=http://127.0.0.1:PORT`
//! through the kit's pod network egress (the node has no pod network of its own), every shard
//! arrives with the bytes the Hub generated (the pod's own `sha256sum`), and the Hub served each
//! byte once.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, Pod, PodSecurityContext, PodSpec, Volume, VolumeMount,
};
use kube::api::{ObjectMeta, PostParams};
use warmcache_test_sources::hub::{Hub, HubOptions, model_files};
use warmcache_testkit::{
    ControlPlane, PodNetwork, RealNode, TestNamespace, hf_client_image, model_clients_dir,
    termination_message, wait_pod_finished,
};

const IMAGE: &str = "warmcache.test/hf-client:1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hf_download_in_a_pod_fetches_the_model_from_the_simulated_hub() {
    let plane = ControlPlane::shared().await.unwrap();
    let node = RealNode::shared().await.unwrap();

    let hub = Hub::new(HubOptions::default());
    let files = model_files("org/llm", "1", 8 << 20, 2);
    let commit = hub.publish("org/llm", files.clone()).unwrap();
    let hub_addr = hub.serve_loopback().await.unwrap();
    let net = PodNetwork::on_node(plane, node, &[hub_addr]).await.unwrap();

    let work = tempfile::tempdir().unwrap();
    let image = hf_client_image(IMAGE, &model_clients_dir().unwrap(), work.path())
        .unwrap()
        .build(work.path())
        .unwrap();
    node.import_image(&image).await.unwrap();

    let ns = TestNamespace::new("hf-pod").await.unwrap();
    let script = "set -e; hf download org/llm --local-dir /models/llm >/tmp/out 2>&1 \
                  || { tail -c 2000 /tmp/out >/dev/termination-log; exit 1; }; \
                  cd /models/llm && sha256sum *.safetensors config.json >/dev/termination-log";
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("download".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            termination_grace_period_seconds: Some(1),
            security_context: Some(PodSecurityContext {
                run_as_user: Some(65532),
                run_as_group: Some(65532),
                run_as_non_root: Some(true),
                fs_group: Some(65532),
                ..PodSecurityContext::default()
            }),
            containers: vec![Container {
                name: "download".into(),
                image: Some(IMAGE.into()),
                image_pull_policy: Some("Never".into()),
                command: Some(vec!["sh".into(), "-c".into(), script.into()]),
                env: Some(vec![
                    EnvVar {
                        name: "HF_ENDPOINT".into(),
                        value: Some(format!("http://{hub_addr}")),
                        ..EnvVar::default()
                    },
                    EnvVar {
                        name: "HOME".into(),
                        value: Some("/tmp".into()),
                        ..EnvVar::default()
                    },
                ]),
                volume_mounts: Some(vec![VolumeMount {
                    name: "models".into(),
                    mount_path: "/models".into(),
                    ..VolumeMount::default()
                }]),
                ..Container::default()
            }],
            volumes: Some(vec![Volume {
                name: "models".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            }]),
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    let pods = ns.api::<Pod>();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let done = wait_pod_finished(&pods, "download", Duration::from_secs(180))
        .await
        .unwrap();
    let message = termination_message(&done, "download").unwrap_or_default();
    let phase = done.status.as_ref().and_then(|s| s.phase.clone());
    assert_eq!(
        phase.as_deref(),
        Some("Succeeded"),
        "the download pod failed: {message}\n{}",
        net.report()
    );
    for f in files
        .iter()
        .filter(|f| f.path.ends_with(".safetensors") || f.path == "config.json")
    {
        let line = format!("{}  {}", f.content.sha256(), f.path);
        assert!(message.contains(&line), "{line} not in:\n{message}");
    }
    let total: u64 = files.iter().map(|f| f.content.len()).sum();
    assert_eq!(hub.stats().bytes_served, total, "each byte served once");
    assert!(
        net.outbound_to(hub_addr) > 0,
        "the pod reached the Hub through the egress relay"
    );
    assert_eq!(
        hub.resolve("org/llm", "main").as_deref(),
        Some(commit.as_str())
    );
    ns.cleanup().await;
}
