//! The real node: kubelet, containerd, runc and kube-scheduler running real pods. All tests in
//! this binary share one control plane and one node (the scheduler binds every pod to it).

#![allow(clippy::unwrap_used, clippy::panic)]

use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, HostPathVolumeSource, Node, Pod, PodSpec, Volume, VolumeMount,
};
use k8s_openapi::api::storage::v1::CSINode;
use kube::Api;
use kube::api::PostParams;
use warmcache_testkit::{
    ControlPlane, ImageBuilder, PAUSE_IMAGE, RealNode, TOOLS_IMAGE, TestCsiDriver, TestNamespace,
    eventually, termination_message, tools_container, tools_pod, wait_pod_finished,
};

const POD_TIMEOUT: Duration = Duration::from_secs(90);

async fn setup(prefix: &str) -> (&'static RealNode, TestNamespace) {
    let node = RealNode::shared().await.unwrap();
    (node, TestNamespace::new(prefix).await.unwrap())
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(read_only),
        ..VolumeMount::default()
    }
}

fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    }
}

fn host_path(name: &str, path: &str) -> Volume {
    Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource {
            path: path.into(),
            type_: Some("Directory".into()),
        }),
        ..Volume::default()
    }
}

/// Runs the pod to completion and returns it; fails the test if it did not succeed.
async fn run_to_success(ns: &TestNamespace, pod: Pod) -> Pod {
    let pods = ns.api::<Pod>();
    let name = pod.metadata.name.clone().unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let done = wait_pod_finished(&pods, &name, POD_TIMEOUT).await.unwrap();
    let phase = done.status.as_ref().and_then(|s| s.phase.clone());
    assert_eq!(phase.as_deref(), Some("Succeeded"), "{:?}", done.status);
    done
}

#[tokio::test]
async fn node_is_ready_with_its_runtime_and_csi_drivers() {
    let node = RealNode::shared().await.unwrap();
    eprintln!(
        "node startup took {:.2}s; dir {}",
        node.startup_duration().as_secs_f64(),
        node.dir().display()
    );
    let client = ControlPlane::shared()
        .await
        .unwrap()
        .client()
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let status = nodes.get(node.name()).await.unwrap().status.unwrap();
    let ready = status
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "True", "{ready:?}");
    let info = status.node_info.unwrap();
    assert_eq!(info.kubelet_version, "v1.36.3");
    assert!(
        info.container_runtime_version
            .starts_with("containerd://1.6"),
        "{}",
        info.container_runtime_version
    );
    let addresses = status.addresses.unwrap();
    assert!(
        addresses
            .iter()
            .any(|a| a.type_ == "InternalIP" && a.address == "127.0.0.1"),
        "{addresses:?}"
    );
    let csi: Api<CSINode> = Api::all(client);
    let drivers: Vec<String> = csi
        .get(node.name())
        .await
        .unwrap()
        .spec
        .drivers
        .into_iter()
        .map(|d| d.name)
        .collect();
    for d in TestCsiDriver::ALL {
        assert!(drivers.contains(&d.driver_name().to_owned()), "{drivers:?}");
    }
    let images = node.images();
    assert!(images.contains(&TOOLS_IMAGE.to_owned()), "{images:?}");
    assert!(images.contains(&PAUSE_IMAGE.to_owned()), "{images:?}");
    assert!(node.kubectl().is_file());
}

#[tokio::test]
async fn a_pod_with_empty_dir_and_host_path_runs_and_its_termination_message_is_read() {
    let (_, ns) = setup("vols").await;
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("in.txt"), "written-on-host").unwrap();
    let mut pod = tools_pod(
        "vols",
        "echo from-empty-dir > /scratch/a && cp /scratch/a /host/out.txt && \
         printf 'in=%s scratch=%s' \"$(cat /host/in.txt)\" \"$(cat /scratch/a)\" > /dev/termination-log",
    );
    let spec = pod.spec.as_mut().unwrap();
    spec.containers[0].volume_mounts = Some(vec![
        mount("scratch", "/scratch", false),
        mount("host", "/host", false),
    ]);
    spec.volumes = Some(vec![
        empty_dir("scratch"),
        host_path("host", &host.path().display().to_string()),
    ]);
    let started = Instant::now();
    let done = run_to_success(&ns, pod).await;
    eprintln!(
        "pod create -> Succeeded in {:.2}s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        termination_message(&done, "main").as_deref(),
        Some("in=written-on-host scratch=from-empty-dir")
    );
    // The pod really wrote into the host directory.
    assert_eq!(
        std::fs::read_to_string(host.path().join("out.txt")).unwrap(),
        "from-empty-dir\n"
    );
    assert_eq!(
        done.spec.unwrap().node_name.as_deref(),
        Some("127.0.0.1"),
        "bound by the real scheduler"
    );
    ns.cleanup().await;
}

#[tokio::test]
async fn a_job_completes_through_the_real_job_controller() {
    let (_, ns) = setup("job").await;
    let jobs = ns.api::<Job>();
    let job: Job = serde_json::from_value(serde_json::json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": { "name": "twice" },
        "spec": {
            "completions": 2,
            "parallelism": 1,
            "backoffLimit": 0,
            "template": { "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "c", "image": TOOLS_IMAGE, "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "echo done > /dev/termination-log"],
                }],
            }},
        },
    }))
    .unwrap();
    jobs.create(&PostParams::default(), &job).await.unwrap();
    let done = eventually("job twice to complete", POD_TIMEOUT, || {
        let jobs = jobs.clone();
        async move {
            let job = jobs.get("twice").await.ok()?;
            let status = job.status?;
            let complete = status
                .conditions?
                .iter()
                .any(|c| c.type_ == "Complete" && c.status == "True");
            complete.then_some(status.succeeded)
        }
    })
    .await
    .unwrap();
    assert_eq!(done, Some(2));
    ns.cleanup().await;
}

#[tokio::test]
async fn init_containers_run_in_order() {
    let (_, ns) = setup("init").await;
    let step = |name: &str, extra: &str| Container {
        volume_mounts: Some(vec![mount("w", "/w", false)]),
        ..tools_container(name, &format!("{extra}echo {name} >> /w/order"))
    };
    let mut main = step("main", "");
    main.command = Some(vec![
        "sh".into(),
        "-c".into(),
        "echo main >> /w/order && cat /w/order > /dev/termination-log".into(),
    ]);
    let pod = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some("order".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            init_containers: Some(vec![step("init-1", "sleep 1; "), step("init-2", "")]),
            containers: vec![main],
            volumes: Some(vec![empty_dir("w")]),
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    let done = run_to_success(&ns, pod).await;
    assert_eq!(
        termination_message(&done, "main").as_deref(),
        Some("init-1\ninit-2\nmain\n")
    );
    let statuses = done.status.unwrap().init_container_statuses.unwrap();
    let finished = |name: &str| {
        statuses
            .iter()
            .find(|s| s.name == name)
            .and_then(|s| s.state.clone()?.terminated)
            .unwrap()
    };
    let (one, two) = (finished("init-1"), finished("init-2"));
    assert_eq!((one.exit_code, two.exit_code), (0, 0));
    assert!(
        one.finished_at.unwrap().0 <= two.started_at.unwrap().0,
        "init-2 started before init-1 finished"
    );
    ns.cleanup().await;
}

/// Every kind of write through a read-only mount fails with EROFS; the data is untouched (read
/// back through a writable mount of the same volume).
#[tokio::test]
async fn a_read_only_volume_mount_refuses_every_write_with_erofs() {
    let (_, ns) = setup("erofs").await;
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("f"), "original\n").unwrap();
    std::fs::create_dir(host.path().join("d")).unwrap();
    // `try OP CMD`: prints "OP rc=<code> <stderr>" for one write attempt.
    let script = r#"
set -u
echo original > /rw-empty/f; mkdir /rw-empty/d
try() { op=$1; shift; err=$("$@" 2>&1 >/dev/null); echo "$op rc=$? $err"; }
for dir in /ro-empty /ro-host; do
  try "$dir create" touch $dir/new
  try "$dir mkdir" mkdir $dir/newdir
  try "$dir append" sh -c "echo more >> $dir/f"
  try "$dir rename" mv $dir/f $dir/g
  try "$dir chmod" chmod 600 $dir/f
  try "$dir truncate" truncate -s 0 $dir/f
  try "$dir overwrite" sh -c ": > $dir/f"
  try "$dir delete" rm $dir/f
  try "$dir rmdir" rmdir $dir/d
done > /dev/termination-log
echo "empty=$(cat /rw-empty/f)" >> /dev/termination-log
"#;
    let mut pod = tools_pod("erofs", script);
    let spec = pod.spec.as_mut().unwrap();
    spec.containers[0].volume_mounts = Some(vec![
        mount("e", "/rw-empty", false),
        mount("e", "/ro-empty", true),
        mount("h", "/ro-host", true),
    ]);
    spec.volumes = Some(vec![
        empty_dir("e"),
        host_path("h", &host.path().display().to_string()),
    ]);
    let done = run_to_success(&ns, pod).await;
    let report = termination_message(&done, "main").unwrap();
    let lines: Vec<&str> = report.lines().collect();
    assert_eq!(lines.len(), 19, "{report}");
    for line in &lines[..18] {
        assert!(
            !line.contains(" rc=0 ") && line.contains("Read-only file system"),
            "not refused with EROFS: {line}\n{report}"
        );
    }
    assert_eq!(lines[18], "empty=original", "{report}");
    assert_eq!(
        std::fs::read_to_string(host.path().join("f")).unwrap(),
        "original\n"
    );
    assert!(host.path().join("d").is_dir());
    let mut left: Vec<_> = std::fs::read_dir(host.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["d", "f"]);
    ns.cleanup().await;
}

#[tokio::test]
async fn a_pod_that_would_pull_is_refused() {
    let (_, ns) = setup("pull").await;
    let pods = ns.api::<Pod>();
    let mut pulls = tools_pod("pulls", "true");
    pulls.spec.as_mut().unwrap().containers[0].image_pull_policy = Some("IfNotPresent".into());
    let err = pods
        .create(&PostParams::default(), &pulls)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("never pulls"), "{err}");
    assert!(err.to_string().contains("main"), "{err}");

    // Defaulting gives an image without a tag `Always`: refused too.
    let mut latest = tools_pod("latest", "true");
    let c = &mut latest.spec.as_mut().unwrap().containers[0];
    c.image = Some("busybox".into());
    c.image_pull_policy = None;
    let err = pods
        .create(&PostParams::default(), &latest)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("never pulls"), "{err}");

    let mut missing = tools_pod("missing", "true");
    missing.spec.as_mut().unwrap().containers[0].image = Some("warmcache.test/absent:1".into());
    let err = pods
        .create(&PostParams::default(), &missing)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("warmcache.test/absent:1 is not on the real test node"),
        "{err}"
    );
    ns.cleanup().await;
}

#[tokio::test]
async fn an_image_packed_from_a_directory_and_a_binary_runs() {
    let (node, ns) = setup("image").await;
    let work = tempfile::tempdir().unwrap();
    let payload = work.path().join("payload");
    std::fs::create_dir_all(payload.join("sub")).unwrap();
    std::fs::write(payload.join("sub/data.txt"), "packed payload").unwrap();
    // A static binary of ours: the pause process.
    let image = ImageBuilder::new("warmcache.test/packed:1")
        .unwrap()
        .tools()
        .directory(&payload, "/payload")
        .file(node.bin_dir().join("pause"), "/bin/hold", 0o755)
        .entrypoint(["/bin/sh", "-c"])
        .cmd(["test -x /bin/hold && cat /payload/sub/data.txt > /dev/termination-log"])
        .build(work.path())
        .unwrap();
    node.import_image(&image).await.unwrap();
    assert!(
        node.images()
            .contains(&"warmcache.test/packed:1".to_owned())
    );
    let mut pod = tools_pod("packed", "unused");
    let c = &mut pod.spec.as_mut().unwrap().containers[0];
    c.image = Some(image.reference.clone());
    c.command = None; // the image's entrypoint and cmd
    let done = run_to_success(&ns, pod).await;
    assert_eq!(
        termination_message(&done, "main").as_deref(),
        Some("packed payload")
    );
    ns.cleanup().await;
}

/// A pod with hostNetwork reaches a server of the test process on 127.0.0.1; a pod without it
/// cannot (its loopback is its own and its eth0 leads nowhere).
#[tokio::test]
async fn only_a_host_network_pod_reaches_a_server_on_the_host() {
    let (_, ns) = setup("hostnet").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            stream.write_all(b"hello-from-host").await.unwrap();
        }
    });
    let script = format!(
        "if out=$(nc -w 5 127.0.0.1 {port} </dev/null 2>&1); then echo \"reached: $out\"; \
         else echo \"unreachable: $out\"; fi > /dev/termination-log"
    );
    let mut host = tools_pod("on-host-network", &script);
    host.spec.as_mut().unwrap().host_network = Some(true);
    let done = run_to_success(&ns, host).await;
    assert_eq!(
        termination_message(&done, "main").as_deref(),
        Some("reached: hello-from-host\n")
    );
    let done = run_to_success(&ns, tools_pod("isolated", &script)).await;
    let message = termination_message(&done, "main").unwrap();
    assert!(message.starts_with("unreachable"), "{message}");
    server.abort();
    ns.cleanup().await;
}
