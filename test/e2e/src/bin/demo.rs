//! The demo `hack/demo.sh` runs (README command one): warmcache doing its main job on this
//! machine, then left running for you to look at.
//!
//! 1. starts the test kit's control plane (etcd, kube-apiserver, kube-controller-manager) and
//!    its real node (kubelet, containerd, runc, kube-scheduler, the TEST CSI driver) on loopback;
//! 2. serves a model from a **simulated** Hugging Face Hub on loopback (the HTTP API the real
//!    `hf download` uses; it counts the bytes it serves) and bridges pods to it;
//! 3. builds the product's image from the component binaries next to this program and an image
//!    with the real `hf` CLI, and imports both into the node (no registry is reachable);
//! 4. installs the chart with the real Helm CLI (StorageClass `nvcf-sc` on the test driver's
//!    shared file system, qualified by a catalog ConfigMap, as a user with their own qualified
//!    driver does);
//! 5. applies `examples/`: three namespaces (two in one sharing domain) and an unmodified
//!    vLLM-style Deployment in each, and a KVCacheBackend (`examples/kvcache-backend.yaml`: a
//!    Mooncake store whose member spills to a local-disk tier), run by the chart's kvcache
//!    operator with an image of the REAL store built here (`hack/mooncake.sh`'s, named by
//!    `WARMCACHE_MOONCAKE_MASTER`) as the `kv-cache-backend-image` setting;
//! 6. prints what happened: one download per sharing domain, every pod Ready reading a
//!    read-only view, the bytes the Hub served against what the pods would have fetched alone,
//!    and the backend's phase and endpoints.
//!
//! Then it prints `demo: ready` and waits for SIGTERM or Ctrl-C (`hack/demo.sh --down`), when it
//! stops the node and the control plane and removes their directories.
//!
//! What the node cannot give is supplied, and said so: it has no GPU, so it advertises the
//! extended resource `nvidia.com/gpu` as a device plugin would; it has no pod network, so the
//! kit's `PodNetwork` bridges pods to Services, the API server and the Hub; it has no cluster
//! DNS, so the kit's `ClusterDns` answers Service names and relays the KV-cache leader's Service
//! inside the release namespace's pods.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde_json::Value;
use warmcache_e2e::{
    APP_SELECTOR, Install, NAMESPACE, READY_TIMEOUT, REPO, Storage, example_deployment,
    examples_dir, install, is_ready, model, ready_pods, webhook_serving,
};
use warmcache_test_sources::hub::{Hub, HubOptions};
use warmcache_testkit::{
    ClusterDns, ControlPlane, MOONCAKE_UID, PodNetwork, RealNode, mooncake_image, mooncake_master,
    namespace_report,
};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const CONTROL: &str = "nvca-modelcache-init";
const IMAGE_REPOSITORY: &str = "warmcache.local/warmcache";
const IMAGE_TAG: &str = "demo";
const HF_IMAGE: &str = "warmcache.local/hf-client:demo";
const STORE_IMAGE: &str = "warmcache.local/mooncake:demo";
/// The Services `ClusterDns` relays inside pods: the KV-cache leaders'.
const LEADER_SERVICES: &str =
    "app.kubernetes.io/name=kv-cache-backend,app.kubernetes.io/component=leader";
const USAGE: &str = "usage: demo --state-dir DIR [--model-mib N]\n\n  --state-dir DIR  where the kubeconfig and the summary are written\n  --model-mib N    size of the model's weights in MiB (default 96)";

struct Args {
    state_dir: PathBuf,
    model_mib: u64,
}

fn parse_args() -> std::result::Result<Args, String> {
    let mut state_dir = None;
    let mut model_mib = 96;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--state-dir" => state_dir = args.next().map(PathBuf::from),
            "--model-mib" => {
                model_mib = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|n| (1..=4096).contains(n))
                    .ok_or("--model-mib takes a number of MiB from 1 to 4096")?;
            }
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let state_dir = state_dir.ok_or_else(|| format!("--state-dir is required\n{USAGE}"))?;
    Ok(Args {
        state_dir,
        model_mib,
    })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo: failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<()> {
    std::fs::create_dir_all(&args.state_dir)?;
    let started = Instant::now();
    say("starting the control plane (etcd, kube-apiserver, kube-controller-manager)");
    let plane = ControlPlane::start()?;
    say("starting the real node (kube-scheduler, containerd, kubelet, the test CSI driver)");
    let node = match RealNode::start(&plane) {
        Ok(node) => node,
        Err(e) => {
            plane.shutdown();
            return Err(e.into());
        }
    };
    let kubeconfig = args.state_dir.join("kubeconfig");
    std::fs::copy(plane.kubeconfig_path(), &kubeconfig)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        let shown = demo(&plane, &node, args, &kubeconfig, started).await?;
        println!("demo: ready");
        // Stays up until asked to stop: the pods, the Hub and the bridge live in this process.
        wait_for_stop().await?;
        drop(shown);
        Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    });
    say("stopping the node and the control plane");
    node.shutdown();
    plane.shutdown();
    result
}

fn say(what: &str) {
    println!("demo: {what}");
}

async fn wait_for_stop() -> Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result?,
        _ = terminate.recv() => {}
    }
    Ok(())
}

/// What must stay alive while the demo runs.
struct Running {
    _hub: Hub,
    _net: PodNetwork,
    _dns: ClusterDns,
    _work: tempfile::TempDir,
}

async fn demo(
    plane: &ControlPlane,
    node: &RealNode,
    args: &Args,
    kubeconfig: &Path,
    started: Instant,
) -> Result<Running> {
    let client = plane.client().await?;

    // The model source: a simulated Hub on loopback, reachable from pods at the same address.
    let hub = Hub::new(HubOptions::default());
    let files = model(args.model_mib << 20);
    let model_bytes: u64 = files.iter().map(|f| f.content.len()).sum();
    hub.publish(REPO, files)?;
    let hub_addr = hub.serve_loopback().await?;
    let endpoint = format!("http://{hub_addr}");
    say(&format!(
        "simulated Hugging Face Hub at {endpoint}: {REPO}, {model_bytes} bytes"
    ));
    let net = PodNetwork::on_node(plane, node, &[hub_addr]).await?;
    let cgroup = node
        .cgroups()
        .first()
        .cloned()
        .ok_or("the real node has no cgroup directory")?;
    let dns = ClusterDns::start(client.clone(), cgroup, &[NAMESPACE], LEADER_SERVICES);

    // The product on the node, as a user installs it (images imported, the node's GPUs, a
    // catalog qualifying the test driver, helm install).
    let work = tempfile::tempdir()?;
    let bin_dir = std::env::current_exe()?
        .parent()
        .map(Path::to_path_buf)
        .ok_or("this program's directory is unknown")?;
    say("building and importing the images, helm install warmcache charts/warmcache");
    let master = mooncake_master()?;
    let store = mooncake_image(STORE_IMAGE, &master, work.path())?.build(work.path())?;
    node.import_image(&store).await?;
    let default_image = format!("kvcacheOperator.defaultImage={STORE_IMAGE}");
    let how = Install {
        image_repository: IMAGE_REPOSITORY,
        image_tag: IMAGE_TAG,
        bin_dir: &bin_dir,
        hf_image: HF_IMAGE,
        gpus: 8,
        kubeconfig,
        work_dir: work.path(),
        otel_endpoint: None,
        extra_sets: &[
            "kvcacheOperator.enabled=true",
            &default_image,
            "kvcacheOperator.webhook.replicas=1",
        ],
        storage: Storage::SharedFs,
        node_agent: false,
    };
    install(plane, node, &net, &how).await?;
    say(&format!("components Ready after {:.0?}", started.elapsed()));

    // examples/: the namespaces, then the Deployment in each.
    let namespaces = apply_namespaces(&client, &examples_dir().join("namespaces.yaml")).await?;
    let deployment = example_deployment(&endpoint, HF_IMAGE)?;
    webhook_serving(&client, &namespaces[0], &deployment).await?;
    for ns in &namespaces {
        Api::<Deployment>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &deployment)
            .await?;
        say(&format!(
            "kubectl apply -n {ns} -f examples/llm-deployment.yaml"
        ));
    }
    let replicas = deployment.spec.replicas.unwrap_or(1);
    let expected = usize::try_from(replicas).unwrap_or(1) * namespaces.len();
    let ready = wait("every pod Ready", READY_TIMEOUT, || async {
        (ready_pods(&client, &namespaces).await? == expected).then_some(())
    })
    .await;
    if ready.is_err() {
        let mut report = String::new();
        for ns in namespaces
            .iter()
            .map(String::as_str)
            .chain([CONTROL, NAMESPACE])
        {
            report.push_str(&namespace_report(&client, ns).await);
        }
        return Err(format!("not every pod became Ready\n{report}{}", net.report()).into());
    }
    say(&format!(
        "all {expected} pods Ready after {:.0?}",
        started.elapsed()
    ));

    let backend = kvcache_backend(&client, node, &args.state_dir, started).await?;

    let mut summary = summary(
        &client,
        &namespaces,
        expected,
        model_bytes,
        &hub,
        kubeconfig,
        &node.kubectl(),
    )
    .await?;
    let look = summary.find("\nLook around").unwrap_or(summary.len());
    summary.insert_str(look, &backend_summary(&client, &backend).await?);
    summary.push_str(&format!(
        "  kubectl get kvcachebackends; kubectl describe kvcachebackend {backend}\n  kubectl -n {NAMESPACE} logs deploy/warmcache-kvcache-operator\n"
    ));
    print!("{summary}");
    std::fs::write(args.state_dir.join("summary.txt"), &summary)?;
    Ok(Running {
        _hub: hub,
        _net: net,
        _dns: dns,
        _work: work,
    })
}

fn backends_api(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("worker.gpustack.ai", "v1alpha1", "KVCacheBackend");
    Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

/// Applies `examples/kvcache-backend.yaml` with its tier at `<state_dir>/kvcache-tier` (made
/// empty, owned by the store image's uid) on the node, labelled for it, and waits until it is
/// Ready (a backend that is not Ready in time is reported, not fatal). Returns its name.
async fn kvcache_backend(
    client: &Client,
    node: &RealNode,
    state_dir: &Path,
    started: Instant,
) -> Result<String> {
    use std::os::unix::fs::PermissionsExt;
    let tier = state_dir.join("kvcache-tier");
    if tier.exists() {
        std::fs::remove_dir_all(&tier)
            .map_err(|e| format!("emptying the previous demo's tier {}: {e}", tier.display()))?;
    }
    std::fs::create_dir_all(&tier).map_err(|e| format!("creating {}: {e}", tier.display()))?;
    std::os::unix::fs::chown(&tier, Some(MOONCAKE_UID), Some(0))
        .map_err(|e| format!("chown {}: {e}", tier.display()))?;
    std::fs::set_permissions(&tier, std::fs::Permissions::from_mode(0o750))
        .map_err(|e| format!("chmod {}: {e}", tier.display()))?;
    Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .patch(
            node.name(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({"metadata": {"labels": {"kvcache": "true"}}}),
            ),
        )
        .await
        .map_err(|e| format!("labelling the node kvcache=true: {e}"))?;
    let path = examples_dir().join("kvcache-backend.yaml");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("reading {}: {e}", path.display()))?
        .replace("TIER_PATH", &tier.display().to_string());
    let mut documents =
        warmcache_cli::yaml::documents(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if documents.len() != 1 {
        return Err(format!(
            "{} holds {} documents, not one backend",
            path.display(),
            documents.len()
        )
        .into());
    }
    let object: DynamicObject = serde_json::from_value(documents.remove(0))?;
    let name = object.name_any();
    let backends = backends_api(client);
    // The kvcache webhook (failurePolicy Fail) admits it once the bridge routes its Service.
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let _ = wait("the kvcache webhook", Duration::from_secs(120), || async {
        backends.create(&dry_run, &object).await.ok().map(|_| ())
    })
    .await;
    backends
        .create(&PostParams::default(), &object)
        .await
        .map_err(|e| format!("kubectl apply -f examples/kvcache-backend.yaml: {e}"))?;
    say(&format!(
        "kubectl apply -f examples/kvcache-backend.yaml (tier {})",
        tier.display()
    ));
    let ready = wait("the KVCacheBackend Ready", READY_TIMEOUT, || async {
        let b = backends.get(&name).await.ok()?;
        (b.data["status"]["phase"] == "Ready").then_some(())
    })
    .await;
    if ready.is_ok() {
        say(&format!(
            "KVCacheBackend {name} Ready after {:.0?}",
            started.elapsed()
        ));
    } else {
        say(&format!(
            "KVCacheBackend {name} not Ready; kubectl describe kvcachebackend {name} says why"
        ));
    }
    Ok(name)
}

/// The backend's phase, endpoints, capacity and conditions, in the summary's words.
async fn backend_summary(client: &Client, name: &str) -> Result<String> {
    let b = backends_api(client).get(name).await?;
    let status = b.data.get("status").cloned().unwrap_or(Value::Null);
    let endpoints = status["endpoints"]
        .as_array()
        .map(|e| {
            e.iter()
                .map(|e| {
                    format!(
                        "{} {}",
                        e["name"].as_str().unwrap_or("?"),
                        e["address"].as_str().unwrap_or("?")
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    let conditions = status["conditions"]
        .as_array()
        .map(|c| {
            c.iter()
                .map(|c| {
                    format!(
                        "{}={}",
                        c["type"].as_str().unwrap_or("?"),
                        c["status"].as_str().unwrap_or("?")
                    )
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    let mut out = format!(
        "KVCacheBackend {name}: phase {}, endpoints: {}; capacity {} (used {}); {} member segment(s)\n  conditions: {conditions}\n",
        status["phase"].as_str().unwrap_or("(none yet)"),
        if endpoints.is_empty() {
            "(none yet)"
        } else {
            &endpoints
        },
        status["capacity"]["total"].as_str().unwrap_or("?"),
        status["capacity"]["used"].as_str().unwrap_or("?"),
        status["members"].as_array().map_or(0, Vec::len),
    );
    if let Some(message) = status["phaseMessage"].as_str().filter(|m| !m.is_empty()) {
        out.push_str(&format!("  phaseMessage: {message}\n"));
    }
    Ok(out)
}

/// Creates the namespaces of `path` and returns their names, in order.
async fn apply_namespaces(client: &Client, path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path)?;
    let api: Api<Namespace> = Api::all(client.clone());
    let mut names = Vec::new();
    for doc in warmcache_cli::yaml::documents(&text)? {
        let ns = create(&api, doc).await?;
        names.push(ns.name_any());
    }
    say(&format!(
        "kubectl apply -f examples/namespaces.yaml: {}",
        names.join(", ")
    ));
    Ok(names)
}

async fn create<K>(api: &Api<K>, value: Value) -> Result<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value)?;
    Ok(api.create(&PostParams::default(), &object).await?)
}

async fn wait<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> std::result::Result<T, ()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    let mut said = Instant::now();
    loop {
        if let Some(v) = probe().await {
            return Ok(v);
        }
        if start.elapsed() > timeout {
            say(&format!("gave up waiting for {what} after {timeout:?}"));
            return Err(());
        }
        if said.elapsed() > Duration::from_secs(30) {
            say(&format!(
                "still waiting for {what} ({:.0?})",
                start.elapsed()
            ));
            said = Instant::now();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// What happened, in words a platform engineer checks: Jobs per namespace, the bindings, the
/// pods' landings, the Hub's bytes.
async fn summary(
    client: &Client,
    namespaces: &[String],
    pods: usize,
    model_bytes: u64,
    hub: &Hub,
    kubeconfig: &Path,
    kubectl: &Path,
) -> Result<String> {
    let mut out = String::from("\n=== what happened ===\n");
    let ns_api: Api<Namespace> = Api::all(client.clone());
    let mut jobs = BTreeMap::new();
    for ns in namespaces {
        let domain = ns_api
            .get(ns)
            .await?
            .labels()
            .get("nvca.nvcf.nvidia.io/model-cache-sharing-domain")
            .cloned();
        let list = Api::<Job>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await?;
        jobs.insert(ns.clone(), list.items.len());
        let pods = Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default().labels(APP_SELECTOR))
            .await?;
        let mut read_only = 0;
        for pod in &pods.items {
            if reads_a_read_only_claim(pod) {
                read_only += 1;
            }
        }
        out.push_str(&format!(
            "namespace {ns} ({}): {} pods Ready, {read_only} reading a read-only view claim; download Jobs here: {}\n",
            domain.map_or("no sharing domain: shares only with itself".to_owned(), |d| format!("sharing domain {d}")),
            pods.items.iter().filter(|p| is_ready(p)).count(),
            list.items.len()
        ));
    }
    let gvk = GroupVersionKind::gvk("nvca.nvcf.nvidia.io", "v2beta1", "ModelCacheBinding");
    let bindings: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), CONTROL, &ApiResource::from_gvk(&gvk));
    let bindings = bindings.list(&ListParams::default()).await?.items;
    out.push_str(&format!(
        "ModelCacheBindings in {CONTROL}: {} (one per sharing domain)\n",
        bindings.len()
    ));
    for b in &bindings {
        let status = b.data.get("status").cloned().unwrap_or(Value::Null);
        out.push_str(&format!(
            "  {}: {}, {}, population {}, {} bytes, views in {}\n",
            b.name_any(),
            status["modelUri"].as_str().unwrap_or("?"),
            b.data["spec"]["identity"]["workflow"]
                .as_str()
                .unwrap_or("?"),
            status["realized"]["populationState"]
                .as_str()
                .unwrap_or("?"),
            status["realized"]["bytes"],
            status["realized"]["views"]
                .as_array()
                .map(|v| v
                    .iter()
                    .filter_map(|v| v["namespace"].as_str())
                    .collect::<Vec<_>>()
                    .join(", "))
                .unwrap_or_default()
        ));
    }
    let served = hub.stats().bytes_by_repo.get(REPO).copied().unwrap_or(0);
    let downloads: usize = jobs.values().sum();
    out.push_str(&format!(
        "the Hub served {served} bytes = {:.1}x the model ({model_bytes} bytes) for {pods} pods in {} namespaces: {downloads} downloads; without warmcache every pod downloads: {pods}.0x\n",
        served as f64 / model_bytes.max(1) as f64,
        namespaces.len(),
    ));
    out.push_str(&format!(
        "\nLook around (the cluster stays up until hack/demo.sh --down; kubectl: {}):\n  export KUBECONFIG={}\n  kubectl get mcb -A\n  kubectl -n {} get pods,jobs,pvc\n  kubectl -n {} exec deploy/llm -c engine -- touch /models/llm/x   # Read-only file system\n  kubectl -n {NAMESPACE} logs deploy/warmcache-binding-controller\n  metrics: every component pod's admin port, curl http://POD_IP:8080/metrics (kubectl -n {NAMESPACE} get pods -o wide; the demo's bridge listens at each pod's IP)\n  traces: set otel.endpoint to an OTLP/gRPC collector (helm upgrade --reuse-values --set otel.endpoint=...)\n",
        kubectl.display(),
        kubeconfig.display(),
        namespaces.first().map_or("default", String::as_str),
        namespaces.last().map_or("default", String::as_str)
    ));
    Ok(out)
}

/// Whether the engine reads the model through a claim mounted read-only on the pod side.
fn reads_a_read_only_claim(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let Some(engine) = spec.containers.iter().find(|c| c.name == "engine") else {
        return false;
    };
    engine.volume_mounts.iter().flatten().any(|m| {
        m.mount_path.starts_with("/models")
            && m.read_only == Some(true)
            && spec.volumes.iter().flatten().any(|v| {
                v.name == m.name
                    && v.persistent_volume_claim
                        .as_ref()
                        .is_some_and(|c| c.read_only == Some(true))
            })
    })
}
