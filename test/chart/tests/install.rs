//! A real `helm install` of `charts/warmcache` on the real test node, with the image
//! `hack/build-image.sh` packs (built here from the component binaries, as `image.rs` does):
//!
//! 1. every Deployment the chart renders (pod webhook, binding controller, KVCacheBackend
//!    controller and webhook, reaper) becomes Ready: probes answered, caches synced over
//!    in-cluster API access, as the chart ships them (no hostNetwork, no test-only value but the
//!    image); the reaper holds its Lease and its first sweep made every call it needed (its
//!    metrics say `ok`, not `failed`: its generated roles suffice); the node agent's DaemonSet,
//!    switched on with `modelVolumeController.enabled=true` and `kubeletRoot` pointed at this
//!    node's kubelet root (`<node dir>/kubelet`; the bind root is the chart's default), has its
//!    pod Ready in a release namespace labelled to enforce Pod Security "privileged", as
//!    docs/install.md asks; a mount made on the node under the kubelet root after the agent
//!    started appears in the agent's mount namespace (HostToContainer), and a mount the agent's
//!    namespace makes under the bind root appears on the node (as Bidirectional must; on this
//!    node the same happened with HostToContainer, so that half does not discriminate, see
//!    `assert_agent_propagation`);
//! 2. the API server calls both webhooks through their Service registrations: a GPU pod in an
//!    ordinary namespace comes back with the pod webhook's skip annotations (no `nvcf-sc` on this
//!    cluster), an invalid KVCacheBackend is refused with the operator webhook's message, and the
//!    bridge counted connections to the webhook pods;
//! 3. `helm upgrade` to a chart whose CRD changed, with changed values: the stored CRDs are the
//!    new chart's, the webhook rewrites pods requesting the newly listed GPU resource, and the
//!    reaper restarts Ready with `reaper.retention=0` (keep complete caches forever, given as
//!    the number Helm's `--set` makes of it) and `reaper.idlePeriod=7d`;
//! 4. `helm uninstall` runs the pre-delete hook: a ModelCacheBinding holding warmcache's
//!    finalizer is released, the control namespace is gone (nothing Terminating), a retained PV
//!    of model data is still there, the CRDs are kept.
//!
//! The test node has no pod network (see the kit's `PodNetwork`): this test bridges pod IPs and the
//! `kubernetes` Service into the pods, and the kit's API server runs with
//! `--enable-aggregator-routing` so Service-registered webhooks are called at pod IPs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Helm, RELEASE};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, LogParams, Patch, PatchParams,
    PostParams,
};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use warmcache_api_modelcache::v2beta1::{
    BindingDecision, BindingIdentity, BindingResources, BindingStorageClass, ModelCacheBinding,
    ModelCacheBindingSpec, ReclaimPolicy, Transition, Workflow, WriterIdentity,
};
use warmcache_api_modelcache::{
    FINALIZER, binding_name, init_lease_name, sha256_digest, writer_job_name, writer_pvc_name,
};
use warmcache_chart_tests::NAMESPACE;
use warmcache_kvcache::vectors;
use warmcache_testkit::{
    COMPONENT_BINARIES, ControlPlane, PAUSE_IMAGE, PodNetwork, RealNode, TOOLS_IMAGE,
    built_binaries_dir, component_image, namespace_report, pod_dirs,
};

const CONTROL: &str = "nvca-modelcache-init";
const IMAGE_REPOSITORY: &str = "warmcache.test/warmcache";
const IMAGE_TAG: &str = "install";
/// Every Deployment of the chart with everything on.
const DEPLOYMENTS: [&str; 5] = [
    "warmcache-webhook",
    "warmcache-binding-controller",
    "warmcache-kvcache-operator",
    "warmcache-kvcache-operator-webhook",
    "warmcache-reaper",
];
/// The node agent's DaemonSet (`modelVolumeController.enabled=true`).
const AGENT: &str = "warmcache-model-volume-controller";
/// The chart's default bind root of the node agent (in the node's mount namespace it is on
/// the node's own tmpfs over `/var/lib`).
const BIND_ROOT: &str = "/var/lib/containerd/nvsnap-models";
const MODELCACHE_CRD: &str = "modelcachebindings.nvca.nvcf.nvidia.io";
const KVCACHE_CRD: &str = "kvcachebackends.worker.gpustack.ai";
const SKIP_REASON: &str = "nvca.nvcf.nvidia.io/model-cache-skip-reason";
const SKIP_MESSAGE: &str = "nvca.nvcf.nvidia.io/model-cache-skip-message";
/// The column the "next chart version" adds to the ModelCacheBinding CRD.
const NEW_COLUMN: &str = "Generation";
/// The GPU resource the upgrade adds to `webhook.gpuResources`.
const NEW_GPU: &str = "example.com/gpu";

const READY_TIMEOUT: Duration = Duration::from_secs(360);
const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(300);
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(90);

struct Cluster {
    client: Client,
    helm: Helm,
    kubeconfig: String,
    net: PodNetwork,
}

impl Cluster {
    fn helm(&self, args: &[&str]) -> Result<String, common::HelmError> {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--kubeconfig", &self.kubeconfig]);
        self.helm.command(&all)
    }

    /// Everything a failure needs: pods, their containers' logs, events, the bridge.
    async fn report(&self, namespace: &str) -> String {
        let mut out = namespace_report(&self.client, namespace).await;
        out.push_str(&self.net.report());
        out
    }
}

/// Polls `probe` every second until it returns `Some`, at most `timeout`.
async fn wait_for<T, F, Fut>(timeout: Duration, mut probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = probe().await {
            return Some(v);
        }
        if start.elapsed() > timeout {
            return None;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Every Deployment's replicas are all updated, ready and available, and it has no other pods.
async fn deployments_ready(client: &Client, names: &[&str]) -> Result<(), String> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let mut waiting = Vec::new();
    for name in names {
        let Ok(Some(d)) = deployments.get_opt(name).await else {
            waiting.push(format!("{name}: missing"));
            continue;
        };
        let want = d.spec.replicas.unwrap_or(1);
        let s = d.status.clone().unwrap_or_default();
        let current = s.observed_generation >= d.metadata.generation;
        let selector = d
            .spec
            .selector
            .match_labels
            .clone()
            .unwrap_or_default()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let pod_count = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map(|l| l.items.len() as i32)
            .unwrap_or(-1);
        if !(current
            && s.updated_replicas == Some(want)
            && s.ready_replicas == Some(want)
            && s.available_replicas == Some(want)
            && pod_count == want)
        {
            waiting.push(format!(
                "{name}: want {want}, updated {:?}, ready {:?}, available {:?}, pods {pod_count}, observed {:?}/{:?}",
                s.updated_replicas, s.ready_replicas, s.available_replicas, s.observed_generation, d.metadata.generation
            ));
        }
    }
    if waiting.is_empty() {
        Ok(())
    } else {
        Err(waiting.join("; "))
    }
}

async fn wait_deployments(cluster: &Cluster, names: &[&str], timeout: Duration, what: &str) {
    let start = Instant::now();
    loop {
        match deployments_ready(&cluster.client, names).await {
            Ok(()) => break,
            Err(why) if start.elapsed() > timeout => panic!(
                "{what}: not ready after {:?}: {why}\n{}",
                start.elapsed(),
                cluster.report(NAMESPACE).await
            ),
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
    eprintln!("{what}: ready after {:.1?}", start.elapsed());
}

/// The DaemonSet has one pod per node it wants, every one updated, ready and available.
async fn daemon_set_ready(client: &Client, name: &str) -> Result<(), String> {
    let daemon_sets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
    let Ok(Some(d)) = daemon_sets.get_opt(name).await else {
        return Err(format!("{name}: missing"));
    };
    let s = d.status.clone().unwrap_or_default();
    let want = s.desired_number_scheduled;
    if want >= 1
        && s.observed_generation >= d.metadata.generation
        && s.number_ready == want
        && s.updated_number_scheduled == Some(want)
        && s.number_available == Some(want)
        && s.number_misscheduled == 0
    {
        Ok(())
    } else {
        Err(format!("{name}: {s:?}"))
    }
}

async fn wait_daemon_set(cluster: &Cluster, name: &str, timeout: Duration, what: &str) {
    let start = Instant::now();
    loop {
        match daemon_set_ready(&cluster.client, name).await {
            Ok(()) => break,
            Err(why) if start.elapsed() > timeout => panic!(
                "{what}: DaemonSet not ready after {:?}: {why}\n{}",
                start.elapsed(),
                cluster.report(NAMESPACE).await
            ),
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
    eprintln!(
        "{what}: DaemonSet {name} ready after {:.1?}",
        start.elapsed()
    );
}

/// The one Ready pod of a component (`app.kubernetes.io/component`) in the release namespace.
async fn component_pod(client: &Client, component: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let list = pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/component={component}")))
        .await
        .unwrap()
        .items;
    let live: Vec<Pod> = list
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    assert_eq!(
        live.len(),
        1,
        "{component}: pods {:?}",
        live.iter().map(|p| p.name_any()).collect::<Vec<_>>()
    );
    live.into_iter().next().unwrap()
}

/// `GET path` on a pod's admin port (8080), through the bridge's listener at the pod's IP.
async fn admin_get(pod: &Pod, path: &str) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .ok_or("no pod IP")?;
    let mut stream = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect((ip.as_str(), 8080)),
    )
    .await
    .map_err(|_| format!("{ip}:8080: connect timed out"))?
    .map_err(|e| format!("{ip}:8080: {e}"))?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {ip}\r\n\r\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut body))
        .await
        .map_err(|_| format!("{ip}:8080{path}: read timed out"))?
        .map_err(|e| e.to_string())?;
    if !body.starts_with("HTTP/1.") || body.split_whitespace().nth(1) != Some("200") {
        return Err(format!("{path}: {}", body.lines().next().unwrap_or("")));
    }
    Ok(body)
}

/// The value of the sample `series` (name and labels as exposed) in a Prometheus exposition.
fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

/// The reaper leads (its Lease names its pod) and its first sweep made every read and write
/// it needed: `sweeps_total{result="ok"}` counts it, `failed` stays 0. With a role missing, a
/// list would be Forbidden and the sweep `failed`.
async fn assert_reaper_swept(cluster: &Cluster, what: &str) {
    let pod = component_pod(&cluster.client, "reaper").await;
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let start = Instant::now();
    let last = loop {
        let holder = leases
            .get_opt("reaper")
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec.and_then(|s| s.holder_identity));
        let metrics = admin_get(&pod, "/metrics").await;
        let ok = metrics
            .as_ref()
            .ok()
            .and_then(|m| sample(m, r#"warmcache_reaper_sweeps_total{result="ok"}"#));
        let failed = metrics
            .as_ref()
            .ok()
            .and_then(|m| sample(m, r#"warmcache_reaper_sweeps_total{result="failed"}"#));
        if holder.as_deref() == Some(pod.name_any().as_str()) && ok.is_some_and(|n| n >= 1.0) {
            assert_eq!(
                failed,
                Some(0.0),
                "{what}: a reaper sweep failed (a call its roles do not allow?)\n{}",
                cluster.report(NAMESPACE).await
            );
            break (ok, holder);
        }
        if start.elapsed() > Duration::from_secs(90) {
            panic!(
                "{what}: the reaper did not lead and sweep: Lease holder {holder:?}, sweeps ok {ok:?} failed {failed:?} ({:?})\n{}",
                metrics.err(),
                cluster.report(NAMESPACE).await
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    eprintln!(
        "{what}: reaper {} leads and swept: {last:?}",
        pod.name_any()
    );
}

/// The pid of the agent's container process on the node (from its container's cgroup, under
/// the kubelet's `pod<uid>` cgroup).
fn container_pid(node: &RealNode, pod: &Pod) -> u32 {
    let uid = pod.metadata.uid.clone().unwrap();
    let id = pod
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0]
        .container_id
        .clone()
        .unwrap();
    let id = id.rsplit("://").next().unwrap().to_owned();
    let mut dirs = BTreeMap::new();
    pod_dirs(&node.cgroups()[0], 4, &mut dirs);
    let dir = dirs
        .get(&uid)
        .unwrap_or_else(|| panic!("no cgroup of pod {uid} under {:?}", node.cgroups()[0]));
    let procs = std::fs::read_to_string(dir.join(&id).join("cgroup.procs"))
        .unwrap_or_else(|e| panic!("{}/{id}/cgroup.procs: {e}", dir.display()));
    procs
        .lines()
        .find_map(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("container {id} has no process"))
}

/// The mount points (field 5) of `/proc/<pid>/mountinfo`, with their optional fields
/// (`shared:N`, `master:N`).
fn mounts(pid: u32) -> Vec<(String, String)> {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap()
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let end = fields.iter().position(|f| *f == "-")?;
            Some((fields.get(4)?.to_string(), fields[6..end].join(" ")))
        })
        .collect()
}

/// Runs `args` (this machine's programs) in the mount namespace of `pid`, with this machine's
/// root as its root directory (opened before entering, so the agent's image, which has no
/// `mount`, need not have them). A path in `pid`'s namespace is reached as
/// `/proc/<pid>/root/...`, which resolves to `pid`'s mounts, so a mount made there is made in
/// `pid`'s namespace.
fn nsenter_mount(pid: u32, args: &[&str]) {
    let out = std::process::Command::new("nsenter")
        .arg(format!("--mount=/proc/{pid}/ns/mnt"))
        .arg("--root=/")
        .arg("--")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nsenter {pid} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The propagation the agent needs, on the real runtime: a mount the node makes under the
/// kubelet root after the agent started (a holder's CSI mount) reaches the agent, and a mount
/// the agent's namespace makes under the bind root (a reader's bind) reaches the node.
async fn assert_agent_propagation(cluster: &Cluster, node: &RealNode, kubelet_root: &Path) {
    let pod = component_pod(&cluster.client, "model-volume-controller").await;
    let agent = container_pid(node, &pod);
    let holder: u32 = std::fs::read_to_string(node.dir().join("holder.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let (kubelet_mount, kubelet_flags) = mounts(agent)
        .into_iter()
        .find(|(point, _)| Path::new(point) == kubelet_root)
        .unwrap_or_else(|| {
            panic!(
                "the kubelet root is not mounted in the agent: {:?}",
                mounts(agent)
            )
        });
    assert!(
        kubelet_flags.contains("master:"),
        "{kubelet_mount}: not a slave mount (HostToContainer): {kubelet_flags:?}"
    );
    let bind = mounts(agent)
        .into_iter()
        .find(|(point, _)| point == BIND_ROOT)
        .unwrap_or_else(|| {
            panic!(
                "the bind root is not mounted in the agent: {:?}",
                mounts(agent)
            )
        });
    assert!(
        bind.1.contains("shared:"),
        "{BIND_ROOT}: not shared (Bidirectional): {bind:?}"
    );

    eprintln!(
        "agent {agent} mounts: kubelet root {kubelet_flags:?}, bind root {:?}; node: {:?}",
        bind.1,
        mounts(holder)
            .into_iter()
            .filter(|(p, _)| p == "/var/lib" || p == "/" || Path::new(p) == kubelet_root)
            .collect::<Vec<_>>()
    );
    // Node -> agent: a tmpfs mounted in the node's namespace under the kubelet root, after the
    // agent started (as a holder's CSI mount is).
    let probe = kubelet_root.join("warmcache-install-propagation");
    let probe_s = probe.display().to_string();
    let in_node = format!("/proc/{holder}/root{probe_s}");
    std::fs::create_dir_all(&in_node).unwrap();
    nsenter_mount(
        holder,
        &[
            "mount",
            "-n",
            "--no-canonicalize",
            "-t",
            "tmpfs",
            "install-probe",
            &in_node,
        ],
    );
    let seen = wait_for(Duration::from_secs(10), || async {
        mounts(agent)
            .iter()
            .any(|(p, _)| *p == probe_s)
            .then_some(())
    })
    .await;
    nsenter_mount(holder, &["umount", "-n", "--no-canonicalize", &in_node]);
    let _ = std::fs::remove_dir(&in_node);
    assert!(
        seen.is_some(),
        "a node mount under the kubelet root did not reach the agent: {:?}",
        mounts(agent)
    );

    // Agent -> node: a tmpfs mounted in the agent's namespace under the bind root (where its
    // read-only binds for hostPath readers will go). On this node this does NOT tell
    // Bidirectional from HostToContainer: with the bind root mounted HostToContainer (tried), the
    // agent's bind root still showed the node's peer group (`shared:N`, no `master:`) and the
    // mount still reached the node; why the runtime leaves it shared here is not established.
    // That the chart asks for Bidirectional is proven by the render test, that it needs
    // `privileged` by the API server test; this checks that the mount works as rendered.
    let bound = format!("{BIND_ROOT}/install-probe");
    let in_agent = format!("/proc/{agent}/root{bound}");
    std::fs::create_dir_all(&in_agent).unwrap();
    nsenter_mount(
        agent,
        &[
            "mount",
            "-n",
            "--no-canonicalize",
            "-t",
            "tmpfs",
            "install-bind",
            &in_agent,
        ],
    );
    let seen = wait_for(Duration::from_secs(10), || async {
        mounts(holder)
            .iter()
            .any(|(p, _)| *p == bound)
            .then_some(())
    })
    .await;
    nsenter_mount(agent, &["umount", "-n", "--no-canonicalize", &in_agent]);
    let _ = std::fs::remove_dir(&in_agent);
    assert!(
        seen.is_some(),
        "a mount under the agent's bind root did not reach the node: {:?}",
        mounts(holder)
    );
    eprintln!(
        "node agent {}: HostToContainer and Bidirectional propagation work",
        pod.name_any()
    );
}

/// A vLLM pod downloading `Qwen/Qwen3-8B` into an emptyDir, requesting one `gpu`.
fn vllm_pod(name: &str, gpu: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{
                "name": "vllm",
                "image": TOOLS_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["vllm", "serve", "Qwen/Qwen3-8B"],
                "env": [{"name": "HF_HOME", "value": "/models/hf"}],
                "resources": {"limits": {gpu: "1"}},
                "volumeMounts": [{"name": "m", "mountPath": "/models"}],
            }],
            "volumes": [{"name": "m", "emptyDir": {}}],
        },
    }))
    .unwrap()
}

/// The annotations the API server returns for a dry-run create of `pod` (after every
/// mutating webhook).
async fn admitted_annotations(pods: &Api<Pod>, pod: &Pod) -> BTreeMap<String, String> {
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match pods.create(&dry, pod).await {
        Ok(admitted) => admitted.metadata.annotations.unwrap_or_default(),
        Err(e) => panic!("dry-run create of pod {}: {e}", pod.name_any()),
    }
}

/// The pod webhook's skip annotations on a dry-run create of a GPU pod, once it answers
/// (its failurePolicy is Ignore: until it is called, pods come back unchanged).
async fn wait_skip(cluster: &Cluster, pods: &Api<Pod>, gpu: &str, what: &str) -> (String, String) {
    let pod = vllm_pod("qwen", gpu);
    let start = Instant::now();
    loop {
        let annotations = admitted_annotations(pods, &pod).await;
        if let Some(reason) = annotations.get(SKIP_REASON) {
            return (
                reason.clone(),
                annotations.get(SKIP_MESSAGE).cloned().unwrap_or_default(),
            );
        }
        if start.elapsed() > WEBHOOK_TIMEOUT {
            panic!(
                "{what}: no {SKIP_REASON} on a {gpu} pod after {WEBHOOK_TIMEOUT:?} (annotations {annotations:?}); the API server did not call the pod webhook\n{}",
                cluster.report(NAMESPACE).await
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn kvcache_api(client: &Client) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "worker.gpustack.ai".into(),
        version: "v1alpha1".into(),
        api_version: "worker.gpustack.ai/v1alpha1".into(),
        kind: "KVCacheBackend".into(),
        plural: "kvcachebackends".into(),
    };
    Api::all_with(client.clone(), &resource)
}

/// `spec` holds every field of `expected` with the same value (the API server may add
/// defaults: extra object keys are allowed, arrays must match element by element).
fn contains(actual: &Value, expected: &Value, path: &str, diffs: &mut Vec<String>) {
    match (actual, expected) {
        (Value::Object(a), Value::Object(e)) => {
            for (k, ev) in e {
                match a.get(k) {
                    Some(av) => contains(av, ev, &format!("{path}.{k}"), diffs),
                    None => diffs.push(format!("{path}.{k}: missing")),
                }
            }
        }
        (Value::Array(a), Value::Array(e)) => {
            if a.len() != e.len() {
                diffs.push(format!(
                    "{path}: {} items, the chart has {}",
                    a.len(),
                    e.len()
                ));
                return;
            }
            for (i, (av, ev)) in a.iter().zip(e).enumerate() {
                contains(av, ev, &format!("{path}[{i}]"), diffs);
            }
        }
        (a, e) if a == e => {}
        // The API server stores a minimum of 0 as 0.0.
        (Value::Number(a), Value::Number(e)) if a.as_f64() == e.as_f64() => {}
        (a, e) => diffs.push(format!("{path}: stored {a}, the chart has {e}")),
    }
}

/// The CRD `name` as `chart` renders it (`helm template`).
fn rendered_crd(helm: &Helm, chart: &Path, name: &str) -> Value {
    let text = helm
        .command(&[
            "template",
            RELEASE,
            &chart.display().to_string(),
            "--namespace",
            NAMESPACE,
            "--show-only",
            "templates/crds.yaml",
        ])
        .unwrap();
    warmcache_cli::yaml::documents(&text)
        .unwrap()
        .into_iter()
        .find(|o| o.pointer("/metadata/name").and_then(Value::as_str) == Some(name))
        .unwrap_or_else(|| panic!("{name} not rendered by {}", chart.display()))
}

async fn assert_crd_current(client: &Client, helm: &Helm, chart: &Path, name: &str) -> Value {
    let expected = rendered_crd(helm, chart, name);
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let stored = serde_json::to_value(crds.get(name).await.unwrap()).unwrap();
    let mut diffs = Vec::new();
    contains(&stored["spec"], &expected["spec"], "spec", &mut diffs);
    for (k, v) in expected["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
    {
        if stored["metadata"]["annotations"].get(k) != Some(v) {
            diffs.push(format!(
                "metadata.annotations.{k}: stored {}",
                stored["metadata"]["annotations"][k]
            ));
        }
    }
    for (k, v) in expected["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
    {
        if stored["metadata"]["labels"].get(k) != Some(v) {
            diffs.push(format!(
                "metadata.labels.{k}: stored {}",
                stored["metadata"]["labels"][k]
            ));
        }
    }
    assert!(
        diffs.is_empty(),
        "stored CRD {name} is not the chart's:\n{}",
        diffs.join("\n")
    );
    stored
}

fn printer_columns(crd: &Value) -> Vec<String> {
    crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|v| {
            v["additionalPrinterColumns"]
                .as_array()
                .into_iter()
                .flatten()
        })
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The "next version" of the chart: the same chart whose ModelCacheBinding CRD gained a
/// printer column (written as JSON, which is YAML).
fn next_chart(dir: &Path) -> PathBuf {
    let chart = dir.join("warmcache");
    copy_dir(&warmcache_testkit::chart_dir(), &chart);
    let file = chart.join("files/crds/nvca.nvcf.nvidia.io_modelcachebindings.yaml");
    let mut crd = warmcache_cli::yaml::documents(&std::fs::read_to_string(&file).unwrap())
        .unwrap()
        .remove(0);
    for version in crd["spec"]["versions"].as_array_mut().unwrap() {
        let columns = version
            .as_object_mut()
            .unwrap()
            .entry("additionalPrinterColumns")
            .or_insert_with(|| json!([]));
        columns.as_array_mut().unwrap().push(json!({
            "name": NEW_COLUMN,
            "type": "integer",
            "jsonPath": ".metadata.generation",
            "priority": 1,
        }));
    }
    std::fs::write(&file, serde_json::to_string_pretty(&crd).unwrap()).unwrap();
    chart
}

/// A binding in the control namespace holding warmcache's finalizer, as the webhook creates
/// them.
fn binding() -> ModelCacheBinding {
    let identity = BindingIdentity::new(
        Workflow::HelmModelCache,
        "install-test",
        "hf://Qwen/Qwen3-8B",
    );
    let spec = ModelCacheBindingSpec {
        identity: identity.clone(),
        decision: BindingDecision {
            provider: "weka".into(),
            provisioner: "fake.csi.warmcache.io".into(),
            transition: Transition::RwxReadOnly,
            required_access_modes: Transition::RwxReadOnly.required_access_modes().to_vec(),
            required_mount_options: Vec::new(),
            catalog_digest: sha256_digest("profile"),
            encryption_required: false,
            writer_identity: Some(WriterIdentity::FsGroup),
        },
        storage_class: BindingStorageClass {
            name: "nvcf-sc".into(),
            uid: "sc-uid".into(),
            reclaim_policy: ReclaimPolicy::Retain,
            configuration_digest: format!("v1:{}", sha256_digest("sc")),
        },
        resources: BindingResources {
            writer_namespace: "team-a".into(),
            persistent_volume_claim_names: vec![writer_pvc_name(&identity)],
            job_names: vec![writer_job_name(&identity)],
            lease_name: init_lease_name(&identity),
            ..BindingResources::default()
        },
    };
    let mut b = ModelCacheBinding::new(&binding_name(&identity), spec);
    b.metadata.namespace = Some(CONTROL.into());
    b.metadata.finalizers = Some(vec![FINALIZER.into()]);
    b
}

/// Follows the uninstall hook's pod and keeps the last log it read (the Job and its pod are
/// deleted when the hook succeeds).
fn follow_hook(client: Client) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let pods: Api<Pod> = Api::namespaced(client, NAMESPACE);
        let selector = "app.kubernetes.io/component=uninstall-hook";
        loop {
            if let Ok(list) = pods.list(&ListParams::default().labels(selector)).await {
                for pod in list.items {
                    if let Ok(log) = pods.logs(&pod.name_any(), &LogParams::default()).await
                        && !log.is_empty()
                    {
                        HOOK_LOG.lock().unwrap().insert(pod.name_any(), log);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

static HOOK_LOG: std::sync::Mutex<BTreeMap<String, String>> =
    std::sync::Mutex::new(BTreeMap::new());

fn hook_log() -> String {
    HOOK_LOG
        .lock()
        .unwrap()
        .iter()
        .map(|(pod, log)| format!("--- uninstall hook pod {pod}:\n{log}"))
        .collect()
}

/// Every component pod of the release (each Deployment's and the agent's) serves `/metrics` on its
/// admin port; each exposition passes `promtool check metrics` (Debian's promtool, from
/// `hack/promtool.sh` through `WARMCACHE_PROMTOOL`), and every `warmcache_*` metric a panel of the
/// chart's Grafana dashboard queries is a family (or a histogram's series) one of them exposes.
async fn assert_metrics_lint_and_cover_the_dashboard(client: &Client) {
    let promtool = std::env::var_os("WARMCACHE_PROMTOOL")
        .map(PathBuf::from)
        .expect("WARMCACHE_PROMTOOL names promtool (hack/test.sh sets it from hack/promtool.sh)");
    let mut families = std::collections::BTreeSet::new();
    let components = [
        "webhook",
        "binding-controller",
        "kvcache-operator",
        "kvcache-operator-webhook",
        "reaper",
        "model-volume-controller",
    ];
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    for component in components {
        let list = pods
            .list(
                &ListParams::default().labels(&format!("app.kubernetes.io/component={component}")),
            )
            .await
            .unwrap()
            .items;
        let pod = list
            .into_iter()
            .find(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })
            .unwrap_or_else(|| panic!("{component}: no running pod"));
        let response = admin_get(&pod, "/metrics")
            .await
            .unwrap_or_else(|e| panic!("{component}: /metrics: {e}"));
        let body = response
            .split_once("\r\n\r\n")
            .map_or(response.as_str(), |(_, body)| body)
            .to_owned();
        let mut child = std::process::Command::new(&promtool)
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("running {}: {e}", promtool.display()));
        {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(body.as_bytes())
                .unwrap();
        }
        let out = child.wait_with_output().unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && said.trim().is_empty(),
            "promtool check metrics on {component}'s /metrics: {said}"
        );
        let mut own = 0;
        for line in body.lines() {
            if let Some(name) = line
                .strip_prefix("# TYPE ")
                .and_then(|rest| rest.split_whitespace().next())
            {
                own += usize::from(name.starts_with("warmcache_"));
                families.insert(name.to_owned());
            }
        }
        assert!(own > 0, "{component} exposes no warmcache_ family:\n{body}");
    }
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(
            warmcache_testkit::chart_dir().join("files/dashboards/warmcache.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut queried = std::collections::BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or_default();
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.starts_with("warmcache_") {
                    queried.insert((
                        panel["title"].as_str().unwrap_or_default().to_owned(),
                        word.to_owned(),
                    ));
                }
            }
        }
    }
    assert!(queried.len() >= 10, "{queried:?}");
    let missing: Vec<String> = queried
        .iter()
        .filter(|(_, metric)| {
            let family = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|suffix| {
                    metric
                        .strip_suffix(suffix)
                        .filter(|f| families.contains(*f))
                })
                .unwrap_or(metric);
            !families.contains(family)
        })
        .map(|(title, metric)| format!("panel {title:?} queries {metric}"))
        .collect();
    assert!(
        missing.is_empty(),
        "dashboard queries no component exposes:\n{}\n(families: {families:?})",
        missing.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_upgrade_and_uninstall_on_the_real_node() {
    let started = Instant::now();
    let plane = ControlPlane::shared().await.unwrap();
    let node = RealNode::shared().await.unwrap();
    let client = plane.client().await.unwrap();

    // The image, as hack/build-image.sh packs it, on the node.
    let dir = tempfile::tempdir().unwrap();
    let image = component_image(
        &format!("{IMAGE_REPOSITORY}:{IMAGE_TAG}"),
        &built_binaries_dir().unwrap(),
        &COMPONENT_BINARIES,
    )
    .unwrap_or_else(|e| panic!("{e} (run `cargo build --bins` for the component crates)"))
    .build(dir.path())
    .unwrap();
    node.import_image(&image).await.unwrap();
    eprintln!("image imported after {:.1?}", started.elapsed());

    let net = PodNetwork::on_node(plane, node, &[]).await.unwrap();
    let cluster = Cluster {
        client: client.clone(),
        helm: Helm::new().unwrap(),
        kubeconfig: plane.kubeconfig_path().display().to_string(),
        net,
    };

    // The kit installs our CRDs on every plane, as on a cluster where they were applied from
    // config/crd/ (or `hack/local-up.sh`'s). Helm refuses to take over objects it did not create,
    // so both ways docs/install.md gives are taken: the ModelCacheBinding CRD is deleted (the
    // chart creates it, as on a fresh cluster), the KVCacheBackend CRD is handed to the release
    // with Helm's ownership label and annotations (the chart adopts and updates it).
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let _ = crds.delete(MODELCACHE_CRD, &DeleteParams::default()).await;
    wait_for(Duration::from_secs(60), || {
        let crds = crds.clone();
        async move {
            crds.get_opt(MODELCACHE_CRD)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        }
    })
    .await
    .expect("the kit's ModelCacheBinding CRD deleted");
    crds.patch(
        KVCACHE_CRD,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {
                "meta.helm.sh/release-name": RELEASE,
                "meta.helm.sh/release-namespace": NAMESPACE,
            },
        }})),
    )
    .await
    .unwrap();

    // --- 1. install: every component Ready.
    // The node agent is privileged: its namespace must allow Pod Security "privileged", as
    // docs/install.md says; the namespace is created and labelled so before the install.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .patch(
            NAMESPACE,
            &PatchParams::apply("chart-install-test").force(),
            &Patch::Apply(json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": NAMESPACE,
                    "labels": {"pod-security.kubernetes.io/enforce": "privileged"},
                },
            })),
        )
        .await
        .unwrap();
    let chart = warmcache_testkit::chart_dir().display().to_string();
    let repository = format!("image.repository={IMAGE_REPOSITORY}");
    let tag = format!("image.tag={IMAGE_TAG}");
    // The agent on this node: its kubelet's root, and the holder image the node has (every
    // pod of this node must say imagePullPolicy Never). The bind root is the chart's default.
    let kubelet_root = node.dir().join("kubelet");
    let agent_kubelet_root = format!(
        "modelVolumeController.kubeletRoot={}",
        kubelet_root.display()
    );
    let holder_image = format!("modelVolumeController.holderImage={PAUSE_IMAGE}");
    let out = cluster
        .helm(&[
            "install",
            RELEASE,
            &chart,
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            "--set",
            &repository,
            "--set",
            &tag,
            "--set",
            "image.pullPolicy=Never",
            "--set",
            "modelVolumeController.enabled=true",
            "--set",
            &agent_kubelet_root,
            "--set",
            &holder_image,
            "--set",
            "modelVolumeController.holderImagePullPolicy=Never",
        ])
        .unwrap_or_else(|e| panic!("helm install: {e}"));
    eprintln!("helm install after {:.1?}:\n{out}", started.elapsed());
    wait_deployments(&cluster, &DEPLOYMENTS, READY_TIMEOUT, "install").await;
    wait_daemon_set(&cluster, AGENT, READY_TIMEOUT, "install").await;
    assert_reaper_swept(&cluster, "install").await;
    assert_agent_propagation(&cluster, node, &kubelet_root).await;
    let agent = component_pod(&client, "model-volume-controller").await;
    let metrics = admin_get(&agent, "/metrics").await.unwrap();
    assert!(
        metrics.contains("warmcache_model_volume_controller_"),
        "the agent's metrics: {metrics}"
    );
    assert!(
        cluster
            .net
            .inbound(NAMESPACE, "warmcache-model-volume-controller-", 8080)
            > 0,
        "the kubelet's probes never reached the agent\n{}",
        cluster.net.report()
    );

    // --- 2. both webhooks called by the API server.
    let workloads: Api<Namespace> = Api::all(client.clone());
    workloads
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "install-workloads"}})).unwrap(),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "install-workloads");
    let (reason, message) = wait_skip(&cluster, &pods, "nvidia.com/gpu", "install").await;
    assert_eq!(
        reason, "no-durable-storage",
        "a GPU pod on a cluster without nvcf-sc: {message}"
    );
    assert!(message.contains("StorageClassNotFound"), "{message}");
    let before = admitted_annotations(&pods, &vllm_pod("other-gpu", NEW_GPU)).await;
    assert!(
        !before.contains_key(SKIP_REASON),
        "{NEW_GPU} is not a GPU resource before the upgrade: {before:?}"
    );
    assert!(
        cluster.net.inbound(NAMESPACE, "warmcache-webhook-", 9443) > 0,
        "the API server never connected to a pod webhook pod\n{}",
        cluster.net.report()
    );

    let backends = kvcache_api(&client);
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let valid: DynamicObject = serde_json::from_value(vectors::with(vectors::v2(), |o| {
        o["metadata"]["name"] = json!("install-probe")
    }))
    .unwrap();
    if let Err(e) = backends.create(&dry, &valid).await {
        panic!(
            "a valid KVCacheBackend (dry run) was refused, so the operator webhook was not reachable: {e}\n{}",
            cluster.report(NAMESPACE).await
        );
    }
    let too_small: DynamicObject = serde_json::from_value(vectors::with(vectors::v2(), |o| {
        o["metadata"]["name"] = json!("install-too-small");
        vectors::members(o)[0]["capacityPerMember"] = json!("8Mi");
    }))
    .unwrap();
    match backends.create(&dry, &too_small).await {
        Err(kube::Error::Api(s)) => assert!(
            s.message.contains("kvcachebackends.worker.gpustack.ai")
                && s.message.contains("must be at least 16Mi"),
            "the refusal is not the operator webhook's: {s:?}"
        ),
        other => panic!("an 8Mi member capacity was not refused by the webhook: {other:?}"),
    }
    assert!(
        cluster
            .net
            .inbound(NAMESPACE, "warmcache-kvcache-operator-webhook-", 9443)
            > 0,
        "the API server never connected to a KVCacheBackend webhook pod\n{}",
        cluster.net.report()
    );

    // --- 2b. every component's real /metrics: promtool clean, and every metric the Grafana
    // dashboard queries is exposed by one of them.
    assert_metrics_lint_and_cover_the_dashboard(&client).await;
    eprintln!("webhooks called after {:.1?}", started.elapsed());

    // --- 3. upgrade to a chart whose CRD changed, with a changed value.
    let installed = assert_crd_current(
        &client,
        &cluster.helm,
        &warmcache_testkit::chart_dir(),
        MODELCACHE_CRD,
    )
    .await;
    assert!(!printer_columns(&installed).contains(&NEW_COLUMN.to_owned()));
    // The adopted CRD is the chart's too (its labels and the keep policy included).
    assert_crd_current(
        &client,
        &cluster.helm,
        &warmcache_testkit::chart_dir(),
        KVCACHE_CRD,
    )
    .await;
    let next = next_chart(dir.path());
    let gpus = format!("webhook.gpuResources={{nvidia.com/gpu,{NEW_GPU}}}");
    let out = cluster
        .helm(&[
            "upgrade",
            RELEASE,
            &next.display().to_string(),
            "--namespace",
            NAMESPACE,
            "--reuse-values",
            "--set",
            &gpus,
            // Keep complete caches forever: `--set` makes the number 0 of it.
            "--set",
            "reaper.retention=0",
            "--set",
            "reaper.idlePeriod=7d",
        ])
        .unwrap_or_else(|e| panic!("helm upgrade: {e}"));
    eprintln!("helm upgrade after {:.1?}:\n{out}", started.elapsed());
    let upgraded = assert_crd_current(&client, &cluster.helm, &next, MODELCACHE_CRD).await;
    assert!(
        printer_columns(&upgraded).contains(&NEW_COLUMN.to_owned()),
        "{:?}",
        printer_columns(&upgraded)
    );
    assert_crd_current(&client, &cluster.helm, &next, KVCACHE_CRD).await;
    wait_deployments(&cluster, &DEPLOYMENTS, ROLLOUT_TIMEOUT, "upgrade").await;
    let webhook_pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    for pod in webhook_pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=webhook"))
        .await
        .unwrap()
        .items
    {
        let args = pod.spec.clone().unwrap().containers[0]
            .args
            .clone()
            .unwrap_or_default();
        assert!(
            args.contains(&format!("--gpu-resource={NEW_GPU}")),
            "{}: {args:?}",
            pod.name_any()
        );
    }
    let (reason, message) = wait_skip(&cluster, &pods, NEW_GPU, "upgrade").await;
    assert_eq!(reason, "no-durable-storage", "{message}");
    // The reaper runs with the new rules (its flags accept what the schema let through).
    let reaper = component_pod(&client, "reaper").await;
    let args = reaper.spec.clone().unwrap().containers[0]
        .args
        .clone()
        .unwrap_or_default();
    for expected in ["--retention=0", "--idle-period=7d"] {
        assert!(args.contains(&expected.to_owned()), "{args:?}");
    }
    assert_reaper_swept(&cluster, "upgrade").await;
    wait_daemon_set(&cluster, AGENT, ROLLOUT_TIMEOUT, "upgrade").await;
    eprintln!("upgrade took effect after {:.1?}", started.elapsed());

    // --- 4. uninstall: the hook releases bindings, the control namespace goes, data stays.
    let bindings: Api<ModelCacheBinding> = Api::namespaced(client.clone(), CONTROL);
    let created = bindings
        .create(&PostParams::default(), &binding())
        .await
        .unwrap();
    let pv_name = "install-test-primary";
    let claim_name = "rw-pvc-install-test";
    let pv: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name, "labels": {"app.kubernetes.io/managed-by": "warmcache"}},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "hostPath": {"path": format!("/tmp/{pv_name}")},
            "claimRef": {"namespace": CONTROL, "name": claim_name},
        },
    }))
    .unwrap();
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    volumes.create(&PostParams::default(), &pv).await.unwrap();
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim_name},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }))
    .unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), CONTROL);
    claims.create(&PostParams::default(), &claim).await.unwrap();
    wait_for(Duration::from_secs(60), || {
        let claims = claims.clone();
        async move {
            let c = claims.get(claim_name).await.ok()?;
            (c.status?.phase.as_deref() == Some("Bound")).then_some(())
        }
    })
    .await
    .unwrap_or_else(|| panic!("claim {CONTROL}/{claim_name} not Bound to {pv_name}"));

    let follower = follow_hook(client.clone());
    let uninstall_started = Instant::now();
    let result = cluster.helm(&[
        "uninstall",
        RELEASE,
        "--namespace",
        NAMESPACE,
        "--timeout",
        "5m",
    ]);
    // The pod's last log lines may arrive after helm returned.
    tokio::time::sleep(Duration::from_millis(500)).await;
    follower.abort();
    let log = hook_log();
    match result {
        Ok(out) => eprintln!(
            "helm uninstall took {:.1?}:\n{out}\n{log}",
            uninstall_started.elapsed()
        ),
        Err(e) => panic!(
            "helm uninstall: {e}\n{log}\n{}",
            cluster.report(NAMESPACE).await
        ),
    }
    // The hook's first calls found the API. A failed list of KVCacheBackends is retried until
    // one succeeds, and reported as not listed if none does, never as "0 found"
    // (cmd/uninstall-hook/src/steps.rs), so "0 found" below is an answer the API gave.
    assert!(
        !log.contains("client error (Connect)"),
        "the uninstall hook could not reach the API server at first:\n{log}\n{}",
        cluster.net.report()
    );
    assert!(log.contains("KVCacheBackends: 0 found"), "{log}");
    assert!(
        log.contains("uninstall-hook: done"),
        "the hook's report does not end done:\n{log}"
    );
    assert!(
        log.contains(&format!(
            "removed finalizer {FINALIZER} from ModelCacheBinding {CONTROL}/{}",
            created.name_any()
        )),
        "{log}"
    );
    assert!(
        log.contains(pv_name),
        "the kept volume is not listed:\n{log}"
    );

    let namespaces: Api<Namespace> = Api::all(client.clone());
    let all = namespaces.list(&ListParams::default()).await.unwrap().items;
    let terminating: Vec<String> = all
        .iter()
        .filter(|n| n.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating"))
        .map(|n| n.name_any())
        .collect();
    assert!(
        terminating.is_empty(),
        "Terminating namespaces: {terminating:?}\n{log}"
    );
    assert!(
        !all.iter().any(|n| n.name_any() == CONTROL),
        "{CONTROL} is still there\n{log}"
    );
    let left: Vec<String> = Api::<ModelCacheBinding>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|b| !b.finalizers().is_empty())
        .map(|b| {
            format!(
                "{}/{}: {:?}",
                b.namespace().unwrap_or_default(),
                b.name_any(),
                b.finalizers()
            )
        })
        .collect();
    assert!(left.is_empty(), "bindings with finalizers: {left:?}");
    let kept = volumes
        .get(pv_name)
        .await
        .unwrap_or_else(|e| panic!("{pv_name}: {e}\n{log}"));
    let spec = kept.spec.clone().unwrap();
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Retain")
    );
    assert!(kept.metadata.deletion_timestamp.is_none(), "{kept:?}");
    eprintln!(
        "kept volume {pv_name}: phase {:?}",
        kept.status.and_then(|s| s.phase)
    );
    for name in [MODELCACHE_CRD, KVCACHE_CRD] {
        assert!(
            crds.get_opt(name).await.unwrap().is_some(),
            "crds.keep: {name} deleted"
        );
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let remaining: Vec<String> = deployments
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|d| d.name_any())
        .collect();
    assert!(remaining.is_empty(), "Deployments left: {remaining:?}");
    let daemon_sets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
    assert!(
        daemon_sets
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "the node agent's DaemonSet is left"
    );
    volumes
        .delete(pv_name, &DeleteParams::default())
        .await
        .unwrap();
    eprintln!(
        "install, upgrade and uninstall took {:.1?}",
        started.elapsed()
    );
}
