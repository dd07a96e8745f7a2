//! The block (roxReadOnly) flow on the REAL node (kubelet, containerd, the test CSI driver's
//! namespaced-block profile: attach required, one read-write attachment at a time, NVMesh-style
//! handles rewritten per namespace): a vLLM reader pod rendered by the webhook's pure function
//! joins a binding; the REAL binding controller (in process) starts the staging Job, whose
//! download really runs into its pod's emptyDir; the REAL node agent (`model-volume-controller
//! run`, as a process of the node, in its mount namespace, as the ServiceAccount the chart gives
//! it) measures the staged tree, creates the primary claim sized from it, attaches it through a
//! mount holder, copies and verifies the tree and answers the staging pod; the controller labels
//! the primary complete and Retain, releases its claim, waits for the detach and creates the
//! namespace's read-only view; the reader reads the bytes and cannot write them. A second
//! namespace of the sharing domain then joins the binding, gets its own view (the driver
//! refuses a handle whose namespace segment is not the pod's) and reads the same bytes, with
//! no second download.
//!
//! Adapted to the node as in the binding controller's real-node test: images become the tools
//! image with `imagePullPolicy: Never`, the download writes the model files with a script, the
//! GPU request is removed, the engine reports what it reads and what its writes return.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::result_large_err
)]

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Namespace, PersistentVolume, PersistentVolumeClaim, Pod, ResourceRequirements,
};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use warmcache_api_modelcache::MODEL_CACHE_STORAGE_CLASS;
use warmcache_api_modelcache::v2beta1::{
    ModelCacheBinding, PopulationState, Transition, WriterIdentity,
};
use warmcache_binding_controller::controller::{Settings, start};
use warmcache_catalog::{CatalogInput, CatalogSnapshot, Gates};
use warmcache_modelvolume::agent::{Staged, staged_primary_claim, view_holder_name};
use warmcache_modelvolume::keys::{DOWNLOAD_STEP_ANNOTATION, PENDING_LABEL, WAIT_CONTAINER};
use warmcache_modelvolume::open_root::OPEN_ROOT_LABEL;
use warmcache_modelvolume::volume_keys::{
    BYTES_ANNOTATION, COMPLETE_LABEL, MANIFEST_DIGEST_ANNOTATION,
};
use warmcache_modelvolume::{
    BindingAction, DownloadStep, LifecycleConfig, Options, ReaderMode, Request, StorageInputs,
    Verdict, WriterOptions, admit,
};
use warmcache_nodefs::{MountInfo, parse_mountinfo, top_mount};
use warmcache_runtime::{LogFormat, Runtime, RuntimeArgs};
use warmcache_testkit::{
    ComponentAccount, ControlPlane, PAUSE_IMAGE, RealNode, TOOLS_IMAGE, TestCsiDriver,
    TestNamespace, eventually, termination_message, wait_pod_finished, wait_pod_running,
};

const TIMEOUT: Duration = Duration::from_secs(300);

const VLLM_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: qwen3
spec:
  initContainers:
    - name: download-model
      image: python:3.12-slim
      command: ["sh", "-c", "pip install -q 'huggingface_hub[cli]' && hf download Qwen/Qwen3-0.6B --local-dir /models/qwen3"]
      volumeMounts:
        - {name: models, mountPath: /models}
  containers:
    - name: vllm
      image: vllm/vllm-openai:v0.20.0
      command: ["vllm", "serve", "/models/qwen3"]
      resources:
        requests: {nvidia.com/gpu: "1"}
        limits: {nvidia.com/gpu: "1"}
      volumeMounts:
        - {name: models, mountPath: /models}
  volumes:
    - {name: models, emptyDir: {}}
"#;

/// What the download writes (in place of `hf download --local-dir /models/qwen3`): an HF-like
/// tree with a nested directory and a relative symlink.
const DOWNLOAD_SCRIPT: &str = r#"set -eu
d=/models/qwen3
printf '%s\n' '{"architectures":["Qwen3ForCausalLM"],"model_type":"qwen3"}' > "$d/config.json"
printf '%s\n' '{"version":"1.0"}' > "$d/tokenizer.json"
mkdir -p "$d/blobs"
head -c 300000 /dev/urandom > "$d/blobs/shard-1"
ln -s blobs/shard-1 "$d/model.safetensors"
"#;

const CONFIG_JSON: &str = r#"{"architectures":["Qwen3ForCausalLM"],"model_type":"qwen3"}"#;

const ENGINE_SCRIPT: &str = r#"
L="$1"
try() { op=$1; shift; err=$("$@" 2>&1 >/dev/null); echo "$op rc=$? $err"; }
{
  echo "read=$(cat "$L/config.json")"
  echo "shard=$(wc -c < "$L/model.safetensors" | tr -d ' ')"
  echo "owner=$(stat -c %u:%g "$L/config.json")"
  echo "mount=$(awk -v p="$L" '$2 == p { o = $4 } END { print o }' /proc/mounts)"
  try create touch "$L/written-by-reader"
  try append sh -c 'echo more >> "$0/config.json"' "$L"
  try delete rm "$L/tokenizer.json"
} > /dev/termination-log 2>&1
"#;

fn small() -> ResourceRequirements {
    let q = |cpu: &str, mem: &str| {
        BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpu.to_owned())),
            ("memory".to_owned(), Quantity(mem.to_owned())),
        ])
    };
    ResourceRequirements {
        requests: Some(q("10m", "16Mi")),
        limits: Some(q("500m", "128Mi")),
        ..ResourceRequirements::default()
    }
}

fn for_the_test_node(rendered: &Pod, engine: &str, landing: &str, download: &str) -> Pod {
    let mut pod = warmcache_testkit::on_test_node(
        rendered,
        "nvidia.com/gpu",
        engine,
        ENGINE_SCRIPT,
        &["vllm", landing],
    );
    let annotations = pod.metadata.annotations.as_mut().unwrap();
    let mut step = DownloadStep::from_annotation(&annotations[DOWNLOAD_STEP_ANNOTATION]).unwrap();
    step.container.image = Some(TOOLS_IMAGE.to_owned());
    step.container.image_pull_policy = Some("Never".to_owned());
    step.container.command = Some(vec!["sh".into(), "-c".into(), download.into()]);
    annotations.insert(
        DOWNLOAD_STEP_ANNOTATION.to_owned(),
        step.to_annotation().unwrap(),
    );
    pod
}

/// The engine's report: it read the copied config and the whole shard (the symlink into
/// `blobs/` copied as a link and resolving), and every write was refused with EROFS.
fn assert_reads_read_only(report: &str) {
    assert_eq!(
        report.lines().find_map(|l| l.strip_prefix("read=")),
        Some(CONFIG_JSON),
        "{report}"
    );
    assert_eq!(
        report.lines().find_map(|l| l.strip_prefix("shard=")),
        Some("300000"),
        "the symlink into blobs/ was copied as a link and resolves: {report}"
    );
    for line in report.lines().filter(|l| l.contains(" rc=")) {
        assert!(
            !line.contains(" rc=0 ") && line.contains("Read-only file system"),
            "a write was not refused with EROFS: {line}\n{report}"
        );
    }
}

/// Puts namespace `ns` in sharing domain `domain`.
async fn label_domain(client: &kube::Client, ns: &str, domain: &str) {
    Api::<Namespace>::all(client.clone())
        .patch(
            ns,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": {
                warmcache_api_modelcache::SHARING_DOMAIN_LABEL: domain,
            } } })),
        )
        .await
        .unwrap();
}

fn state_exit(pod: &Pod, container: &str) -> Option<i32> {
    let status = pod.status.as_ref()?;
    status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .find(|c| c.name == container)?
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}

/// The agent as a process of the node (its mount namespace: the kubelet's and the CSI
/// driver's mounts are visible there, not here).
struct AgentProcess(Child);

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_agent(
    node: &RealNode,
    kubeconfig: &std::path::Path,
    control: &str,
    bind_root: &str,
) -> AgentProcess {
    let log = std::fs::File::create(node.dir().join("model-volume-controller.log")).unwrap();
    let child = Command::new("/bin/sh")
        .arg(node.dir().join("node-enter.sh"))
        .arg(env!("CARGO_BIN_EXE_model-volume-controller"))
        .arg("run")
        .args(["--node-name", node.name()])
        .arg("--kubelet-root")
        .arg(node.dir().join("kubelet"))
        .args(["--control-namespace", control])
        .args(["--holder-image", PAUSE_IMAGE])
        .args(["--holder-image-pull-policy", "Never"])
        .args(["--bind-root", bind_root])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--admin-listen", "127.0.0.1:0"])
        .args(["--log-level", "info,warmcache=debug"])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    AgentProcess(child)
}

/// Everything a test of the block flow runs against: nvcf-sc on the block profile, the binding
/// controller in process, the agent on the node, the binding and its reader pod (whose recorded
/// download step runs `download`).
struct World {
    node: &'static RealNode,
    client: kube::Client,
    app: TestNamespace,
    control: TestNamespace,
    classes: Api<StorageClass>,
    bindings: Api<ModelCacheBinding>,
    binding_name: String,
    stored: ModelCacheBinding,
    pods: Api<Pod>,
    engine: String,
    landing: String,
    /// The bind root of hostPath readers (in the node's mount namespace), this test's own.
    bind_root: String,
    /// The catalog the admissions decided from, and the gates.
    catalog: CatalogSnapshot,
    gates: Gates,
    agent: AgentProcess,
    _account: ComponentAccount,
    stop: tokio_util::sync::CancellationToken,
    task: Option<tokio::task::JoinHandle<Result<(), warmcache_runtime::RuntimeError>>>,
    _one: tokio::sync::MutexGuard<'static, ()>,
}

/// One test at a time: both use the cluster-wide StorageClass nvcf-sc.
static ONE_CLASS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `stale_claim`: before the reader exists, the primary claim an agent would have created for a
/// staging pod that is gone since (evicted, its node lost).
/// `shared`: the app namespace carries a sharing-domain label (its own name), so another
/// namespace labelled alike reads the same cache (helmModelCache).
/// `reader_mode`: how the reader pods read the copy (the webhook's option).
async fn setup(download: &str, stale_claim: bool, shared: bool, reader_mode: ReaderMode) -> World {
    setup_on(Flow::Block, download, stale_claim, shared, reader_mode).await
}

/// The storage a test runs on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flow {
    /// The namespaced-block profile: roxReadOnly, the agent's staging copy.
    Block,
    /// The same with `ModelCacheEncryption` on and the catalog listing `encryptionSupported`:
    /// an encrypted cache (the profile's volumes created with a key refuse a publish without it).
    EncryptedBlock,
    /// The root-owned shared-filesystem profile (fresh exports root-owned 0755, no fsGroup on
    /// ReadWriteMany): rwxReadOnly with writer identity root, the binding controller relying on
    /// the agent to open fresh roots for a non-root writer.
    RootOwnedRwx,
}

/// nvcf-sc on the test driver's profile of `flow`, and what an admission decides from.
struct ModelCacheClass {
    classes: Api<StorageClass>,
    nvcf_sc: StorageClass,
    csi_driver: CSIDriver,
    catalog: CatalogSnapshot,
    gates: Gates,
}

/// Creates nvcf-sc on the profile of `flow` (the caller holds [`ONE_CLASS`]) and a catalog
/// qualifying it: provider nvmesh (roxReadOnly) for block storage, a ReadWriteMany provider
/// without writer identity for the root-owned profile.
async fn model_cache_class(client: &kube::Client, flow: Flow) -> ModelCacheClass {
    let driver = match flow {
        Flow::Block | Flow::EncryptedBlock => TestCsiDriver::NamespacedBlock,
        Flow::RootOwnedRwx => TestCsiDriver::RootOwnedFs,
    };
    let classes: Api<StorageClass> = Api::all(client.clone());
    let test_class = classes.get(driver.storage_class()).await.unwrap();
    let wanted_class: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": { "name": MODEL_CACHE_STORAGE_CLASS },
        "provisioner": test_class.provisioner,
        "parameters": test_class.parameters,
        "reclaimPolicy": "Retain",
        "volumeBindingMode": "Immediate",
    }))
    .unwrap();
    let nvcf_sc = classes
        .create(&PostParams::default(), &wanted_class)
        .await
        .expect("nvcf-sc must not exist before this test (this binary's only test using it)");
    let csi_driver = Api::<CSIDriver>::all(client.clone())
        .get(driver.driver_name())
        .await
        .unwrap();
    // Block: provider nvmesh (roxReadOnly). Root-owned: ReadWriteMany with no writer identity,
    // so the decision takes `root` from the CSIDriver's fsGroupPolicy.
    let entry = match flow {
        Flow::Block => {
            "provider: nvmesh\n    accessModes: [ReadWriteOnce, ReadOnlyMany]\n    readerMountOptions: [ro]"
        }
        Flow::EncryptedBlock => {
            "provider: nvmesh\n    accessModes: [ReadWriteOnce, ReadOnlyMany]\n    readerMountOptions: [ro]\n    encryptionSupported: true"
        }
        Flow::RootOwnedRwx => {
            "provider: testSharedFs\n    accessModes: [ReadWriteMany]\n    readerMountOptions: []"
        }
    };
    let catalog = CatalogSnapshot::from_payload(&format!(
        "apiVersion: storage.nvcf.nvidia.com/v1alpha1\nkind: StorageCapabilityCatalog\ndrivers:\n  - name: {}\n    {entry}\n",
        driver.driver_name()
    ))
    .unwrap();
    let gates = Gates {
        caching_support: true,
        helm_model_caching: true,
        model_cache_encryption: flow == Flow::EncryptedBlock,
    };
    ModelCacheClass {
        classes,
        nvcf_sc,
        csi_driver,
        catalog,
        gates,
    }
}

async fn setup_on(
    flow: Flow,
    download: &str,
    stale_claim: bool,
    shared: bool,
    reader_mode: ReaderMode,
) -> World {
    let one = ONE_CLASS.lock().await;
    let node = RealNode::shared().await.unwrap();
    let plane = ControlPlane::shared().await.unwrap();
    let app = TestNamespace::new("mvc-node-app").await.unwrap();
    let control = TestNamespace::new("mvc-node-ctl").await.unwrap();
    let client = app.client.clone();
    if shared {
        label_domain(&client, &app.name, &app.name).await;
    }

    let ModelCacheClass {
        classes,
        nvcf_sc,
        csi_driver,
        catalog,
        gates,
    } = model_cache_class(&client, flow).await;
    let storage = StorageInputs {
        storage_class: Some(&nvcf_sc),
        csi_driver: Some(&csi_driver),
        catalog: CatalogInput::Loaded(&catalog),
        gates,
    };

    // The binding controller, in process.
    let args = RuntimeArgs {
        kubeconfig: Some(plane.kubeconfig_path().to_path_buf()),
        kube_context: None,
        log_level: None,
        log_format: LogFormat::Plain,
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        shutdown_grace: Duration::from_secs(5),
        shutdown_delay: Duration::ZERO,
        kube_api_qps: warmcache_runtime::DEFAULT_KUBE_API_QPS,
        kube_api_burst: warmcache_runtime::DEFAULT_KUBE_API_BURST,
    };
    let mut runtime = Runtime::builder("binding-controller", args)
        .without_global_telemetry()
        .with_client()
        .build()
        .await
        .unwrap();
    start(
        &mut runtime,
        &Settings {
            control_namespace: control.name.clone(),
            concurrency: 2,
            catalog_namespace: None,
            gates: warmcache_catalog::Gates::DEFAULT,
            lifecycle: LifecycleConfig {
                primary_size: Quantity("64Mi".into()),
                writer: WriterOptions {
                    resources: small(),
                    backoff_limit: 0,
                    // What the chart sets with the agent deployed.
                    open_root_wait_seconds: Some(120),
                    ..WriterOptions::default()
                },
                ..LifecycleConfig::default()
            },
        },
    )
    .unwrap();
    let stop = runtime.shutdown_token();
    let task = tokio::spawn(runtime.run());

    // The agent, as the chart's ServiceAccount with the generated roles.
    let admin = plane.client().await.unwrap();
    let account = ComponentAccount::create(
        plane,
        &admin,
        "model-volume-controller",
        &control.name,
        &control.name,
    )
    .await
    .unwrap();
    let bind_root = format!("/var/lib/warmcache-test-binds/{}", app.name);
    let agent = start_agent(node, account.kubeconfig_path(), &control.name, &bind_root);

    // The binding the first admission creates, and the reader of the next.
    let source: Pod = serde_saphyr::from_str(VLLM_POD).unwrap();
    let namespace_labels: BTreeMap<String, String> = Api::<Namespace>::all(client.clone())
        .get(&app.name)
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap_or_default();
    let options = Options {
        control_namespace: control.name.clone(),
        reader_mode,
        host_root: bind_root.clone(),
        ..Options::default()
    };
    let req = Request {
        pod: &source,
        namespace: &app.name,
        namespace_labels: &namespace_labels,
        leader_worker_set: None,
        traceparent: None,
        options: &options,
    };
    let Verdict::Rewrite(first) = admit(&req, |_, _| None, &storage) else {
        panic!("the vLLM pod was not rewritten");
    };
    assert_eq!(
        first.transition,
        match flow {
            Flow::Block | Flow::EncryptedBlock => Transition::RoxReadOnly,
            Flow::RootOwnedRwx => Transition::RwxReadOnly,
        }
    );
    let BindingAction::Create(wanted) = first.binding.clone() else {
        panic!("no binding exists yet");
    };
    let bindings: Api<ModelCacheBinding> = control.api();
    let stored = bindings
        .create(&PostParams::default(), &wanted)
        .await
        .unwrap();
    let binding_name = stored.name_any();
    let Verdict::Rewrite(reader) = admit(&req, |_, _| Some(&stored), &storage) else {
        panic!("the reader was not rewritten");
    };
    let rendered = reader.pod.clone();
    let engine = rendered.spec.as_ref().unwrap().containers[reader.plan.main_container()]
        .name
        .clone();
    let landing = reader.plan.landing().to_owned();
    if stale_claim {
        let gone = Staged {
            namespace: app.name.clone(),
            name: "writer-job-of-an-evicted-pod".into(),
            uid: "0b0e7a1e-0000-4000-8000-000000000000".into(),
            binding: binding_name.clone(),
            binding_uid: stored.metadata.uid.clone().unwrap(),
            staging_volume: "nvsnap-staging".into(),
            job: None,
        };
        let claim = staged_primary_claim(&stored, &gone, "gpu-node-that-is-gone", 1, 1 << 30);
        control
            .api::<PersistentVolumeClaim>()
            .create(&PostParams::default(), &claim)
            .await
            .unwrap();
    }
    let pods = app.api::<Pod>();
    let mut pod = for_the_test_node(&rendered, &engine, &landing, download);
    pod.metadata.name = Some("qwen3-reader".into());
    pods.create(&PostParams::default(), &pod).await.unwrap();
    World {
        node,
        client,
        app,
        control,
        classes,
        bindings,
        binding_name,
        stored,
        pods,
        engine,
        landing,
        bind_root,
        gates,
        catalog,
        agent,
        _account: account,
        stop,
        task: Some(task),
        _one: one,
    }
}

impl World {
    /// The first reader's pod admitted in a new namespace of the app namespace's sharing domain
    /// (joining the stored binding) and run to its end.
    async fn second_reader(&self) -> Pod {
        let ns = TestNamespace::new("mvc-node-app2").await.unwrap();
        label_domain(&self.client, &ns.name, &self.app.name).await;
        let labels = Api::<Namespace>::all(self.client.clone())
            .get(&ns.name)
            .await
            .unwrap()
            .metadata
            .labels
            .unwrap_or_default();
        let nvcf_sc = self.classes.get(MODEL_CACHE_STORAGE_CLASS).await.unwrap();
        let csi_driver = Api::<CSIDriver>::all(self.client.clone())
            .get(TestCsiDriver::NamespacedBlock.driver_name())
            .await
            .unwrap();
        let storage = StorageInputs {
            storage_class: Some(&nvcf_sc),
            csi_driver: Some(&csi_driver),
            catalog: CatalogInput::Loaded(&self.catalog),
            gates: self.gates,
        };
        let options = Options {
            control_namespace: self.control.name.clone(),
            ..Options::default()
        };
        let source: Pod = serde_saphyr::from_str(VLLM_POD).unwrap();
        let stored = self.bindings.get(&self.binding_name).await.unwrap();
        let req = Request {
            pod: &source,
            namespace: &ns.name,
            namespace_labels: &labels,
            leader_worker_set: None,
            traceparent: None,
            options: &options,
        };
        let Verdict::Rewrite(reader) = admit(&req, |_, _| Some(&stored), &storage) else {
            panic!("the second namespace's pod was not rewritten");
        };
        assert!(
            matches!(reader.binding, BindingAction::Join { .. }),
            "it joins the binding: {:?}",
            reader.binding
        );
        let mut pod = for_the_test_node(&reader.pod, &self.engine, &self.landing, "true");
        pod.metadata.name = Some("qwen3-reader".into());
        let pods = ns.api::<Pod>();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        let done = wait_pod_finished(&pods, "qwen3-reader", TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", self.agent_log()));
        assert_eq!(
            state_exit(&done, WAIT_CONTAINER),
            Some(0),
            "{:?}",
            done.status
        );
        let jobs = ns.api::<Job>().list(&ListParams::default()).await.unwrap();
        assert!(jobs.items.is_empty(), "no download in the second namespace");
        ns.cleanup().await;
        done
    }

    /// Stops the binding controller (it would create the views its status records again).
    async fn stop_controller(&mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    fn agent_log(&self) -> String {
        std::fs::read_to_string(self.node.dir().join("model-volume-controller.log"))
            .unwrap_or_default()
    }

    /// The binding once its population is Ready with a view (`Ok`) or Failed (`Err`).
    async fn settled(&self) -> Result<ModelCacheBinding, ModelCacheBinding> {
        let (bindings, name) = (self.bindings.clone(), self.binding_name.clone());
        eventually(
            "the binding Ready with its view, or Failed",
            TIMEOUT,
            || {
                let (bindings, name) = (bindings.clone(), name.clone());
                async move {
                    let b = bindings.get(&name).await.ok()?;
                    let r = b.status.as_ref()?.realized.as_ref()?;
                    match r.population_state {
                        Some(PopulationState::Ready) if !r.views.is_empty() => Some(Ok(b)),
                        Some(PopulationState::Failed) => Some(Err(b)),
                        _ => None,
                    }
                }
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", self.agent_log()))
    }

    async fn staging_job_condition(&self, type_: &'static str) {
        let jobs = self.app.api::<Job>();
        eventually(&format!("the staging Job {type_}"), TIMEOUT, || {
            let jobs = jobs.clone();
            async move {
                let list = jobs
                    .list(&ListParams::default().labels("nvsnap.io/model-staging=true"))
                    .await
                    .ok()?;
                let job = list.items.first()?;
                job.status
                    .as_ref()?
                    .conditions
                    .as_ref()?
                    .iter()
                    .any(|c| c.type_ == type_ && c.status == "True")
                    .then_some(())
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", self.agent_log()));
    }

    async fn finish(self) {
        drop(self.agent);
        self.stop.cancel();
        if let Some(task) = self.task {
            let _ = task.await;
        }
        if self
            .bindings
            .get_opt(&self.binding_name)
            .await
            .unwrap()
            .is_some()
        {
            self.bindings
                .patch(
                    &self.binding_name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
                )
                .await
                .unwrap();
        }
        let _ = self
            .classes
            .delete(MODEL_CACHE_STORAGE_CLASS, &DeleteParams::default())
            .await;
        self.app.cleanup().await;
        self.control.cleanup().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_download_is_staged_copied_sized_released_and_read_read_only() {
    let w = setup(DOWNLOAD_SCRIPT, false, true, ReaderMode::Pvc).await;
    let (client, control, stored) = (w.client.clone(), &w.control, &w.stored);
    // Ready with a view: staged, copied, completed, released, detached.
    let ready = w.settled().await.unwrap_or_else(|b| {
        panic!(
            "the block download failed: {:?}\n{}",
            b.status,
            w.agent_log()
        )
    });
    let realized = ready.status.as_ref().unwrap().realized.clone().unwrap();
    let bytes = u64::try_from(realized.bytes.unwrap()).unwrap();
    assert!(bytes >= 300_000, "{realized:?}");

    // The primary: complete with the agent's bytes and manifest digest, Retain, its claim
    // released, sized from the bytes (1 GiB floor), no mount holder left.
    let pv_name = realized.bound_persistent_volume_name.clone().unwrap();
    let primary = Api::<PersistentVolume>::all(client.clone())
        .get(&pv_name)
        .await
        .unwrap();
    assert_eq!(
        primary.labels().get(COMPLETE_LABEL).map(String::as_str),
        Some("true")
    );
    assert_eq!(
        primary.annotations().get(BYTES_ANNOTATION),
        Some(&bytes.to_string())
    );
    assert_eq!(
        primary
            .annotations()
            .get(MANIFEST_DIGEST_ANNOTATION)
            .map(String::len),
        Some(64)
    );
    let spec = primary.spec.as_ref().unwrap();
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Retain")
    );
    assert_eq!(spec.capacity.as_ref().unwrap()["storage"].0, "1Gi");
    assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
    let claims: Api<PersistentVolumeClaim> = control.api();
    assert!(
        claims
            .get_opt(&warmcache_api_modelcache::writer_pvc_name(
                &stored.spec.identity
            ))
            .await
            .unwrap()
            .is_none(),
        "the primary claim is released"
    );
    let holders = control
        .api::<Pod>()
        .list(&ListParams::default().labels("app.kubernetes.io/component=mount-holder"))
        .await
        .unwrap();
    assert!(
        holders.items.is_empty(),
        "mount holders left: {:?}",
        holders.items
    );
    // The staging Job completes once the agent answered its hold.
    w.staging_job_condition("Complete").await;

    // The reader: waits, then reads the copy through its read-only view and cannot write.
    let done = wait_pod_finished(&w.pods, "qwen3-reader", TIMEOUT)
        .await
        .unwrap();
    assert_eq!(
        state_exit(&done, WAIT_CONTAINER),
        Some(0),
        "{:?}",
        done.status
    );
    let report = termination_message(&done, &w.engine).unwrap();
    eprintln!("reader report:\n{report}");
    assert_reads_read_only(&report);
    let mount = report
        .lines()
        .find_map(|l| l.strip_prefix("mount="))
        .unwrap();
    assert!(mount.split(',').any(|o| o == "ro"), "{mount}");

    // A second namespace of the sharing domain: the same pod joins the binding, gets its own
    // view (the block driver refuses a handle whose namespace segment is not the pod's), and
    // reads the same bytes read-only, with no second download.
    let second = w.second_reader().await;
    let report = termination_message(&second, &w.engine).unwrap();
    eprintln!("second namespace's reader report:\n{report}");
    assert_reads_read_only(&report);
    let b = w.bindings.get(&w.binding_name).await.unwrap();
    let views = &b.status.as_ref().unwrap().realized.as_ref().unwrap().views;
    assert_eq!(views.len(), 2, "{views:?}");
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let mut handles = Vec::new();
    for v in views {
        let pv = pvs.get(&v.persistent_volume_name).await.unwrap();
        let handle = pv.spec.unwrap().csi.unwrap().volume_handle;
        assert!(handle.ends_with(&format!(":{}", v.namespace)), "{handle}");
        handles.push(handle);
    }
    assert_ne!(handles[0], handles[1]);
    let staging = w
        .app
        .api::<Job>()
        .list(&ListParams::default().labels("nvsnap.io/model-staging=true"))
        .await
        .unwrap();
    assert_eq!(staging.items.len(), 1, "one download for the domain");

    w.finish().await;
}

/// An encrypted cache on the block profile (`ModelCacheEncryption` on, the catalog entry lists
/// `encryptionSupported`): the binding controller generates the key into the binding's Secret
/// and derives the encrypted StorageClass before the staging Job; the agent's primary claim is
/// provisioned on it (the driver records the key's digest: the volume is encrypted), every view
/// carries the key's reference, and readers in both namespaces of the sharing domain read the
/// bytes read-only. A reader of the same volume through a PV without the reference is refused
/// by the driver. The key appears in no Event, object, or log of the agent and the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_block_cache_is_read_with_its_key_and_refused_without_it() {
    use k8s_openapi::api::core::v1::{Event, Secret, SecretReference};
    use sha2::Digest;
    use warmcache_modelvolume::encryption::{KEY_ENTRY, check_class, encryption_names};

    let mut w = setup_on(
        Flow::EncryptedBlock,
        DOWNLOAD_SCRIPT,
        false,
        true,
        ReaderMode::Pvc,
    )
    .await;
    assert!(w.stored.spec.decision.encryption_required);
    let client = w.client.clone();
    let ready = w.settled().await.unwrap_or_else(|b| {
        panic!(
            "the encrypted download failed: {:?}\n{}",
            b.status,
            w.agent_log()
        )
    });
    let names = encryption_names(&ready).unwrap().unwrap();
    assert_eq!(names.namespace, w.control.name);

    // The key Secret: a generated 64-hex key, immutable; the class derived from nvcf-sc.
    let secret = w.control.api::<Secret>().get(&names.secret).await.unwrap();
    assert_eq!(secret.immutable, Some(true));
    let key = String::from_utf8(secret.data.as_ref().unwrap()[KEY_ENTRY].0.clone()).unwrap();
    assert_eq!(key.len(), 64);
    assert!(key.bytes().all(|b| b.is_ascii_hexdigit()), "not hex");
    let class = w.classes.get(&names.class).await.unwrap();
    check_class(&class, &ready, &names).unwrap();

    // The primary: provisioned on the encrypted class with the key (the driver's digest).
    let realized = ready.status.as_ref().unwrap().realized.clone().unwrap();
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let primary = pvs
        .get(realized.bound_persistent_volume_name.as_ref().unwrap())
        .await
        .unwrap();
    let spec = primary.spec.as_ref().unwrap();
    assert_eq!(
        spec.storage_class_name.as_deref(),
        Some(names.class.as_str())
    );
    let reference = SecretReference {
        name: Some(names.secret.clone()),
        namespace: Some(names.namespace.clone()),
    };
    let csi = spec.csi.as_ref().unwrap();
    assert_eq!(csi.node_publish_secret_ref.as_ref(), Some(&reference));
    let digest = hex::encode(sha2::Sha256::digest(key.as_bytes()));
    assert_eq!(
        w.node
            .csi_volume_key_digest(TestCsiDriver::NamespacedBlock, &csi.volume_handle),
        Some(digest),
        "the primary volume is encrypted with the Secret's key"
    );

    // Readers in both namespaces read the bytes read-only through views carrying the key.
    let done = wait_pod_finished(&w.pods, "qwen3-reader", TIMEOUT)
        .await
        .unwrap();
    assert_eq!(
        state_exit(&done, WAIT_CONTAINER),
        Some(0),
        "{:?}",
        done.status
    );
    assert_reads_read_only(&termination_message(&done, &w.engine).unwrap());
    let second = w.second_reader().await;
    assert_reads_read_only(&termination_message(&second, &w.engine).unwrap());
    let b = w.bindings.get(&w.binding_name).await.unwrap();
    let views = b
        .status
        .as_ref()
        .unwrap()
        .realized
        .as_ref()
        .unwrap()
        .views
        .clone();
    assert_eq!(views.len(), 2, "{views:?}");
    for v in &views {
        let pv = pvs.get(&v.persistent_volume_name).await.unwrap();
        let csi = pv.spec.as_ref().unwrap().csi.as_ref().unwrap();
        assert_eq!(
            csi.node_publish_secret_ref.as_ref(),
            Some(&reference),
            "{}",
            v.namespace
        );
    }
    let publishes = w
        .node
        .csi_publishes(TestCsiDriver::NamespacedBlock)
        .unwrap();
    let read = publishes
        .iter()
        .find(|p| p.pod_namespace == w.app.name && p.pod_name == "qwen3-reader")
        .unwrap();
    assert!(read.encrypted && read.error.is_none(), "{read:?}");

    // A reader of the same volume through a PV without the key's reference: refused.
    let own_view = views.iter().find(|v| v.namespace == w.app.name).unwrap();
    let mut bare = pvs.get(&own_view.persistent_volume_name).await.unwrap();
    let bare_name = format!("nokey-{}", w.app.name);
    bare.metadata = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        name: Some(bare_name.clone()),
        ..k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta::default()
    };
    let spec = bare.spec.as_mut().unwrap();
    spec.csi.as_mut().unwrap().node_publish_secret_ref = None;
    spec.csi.as_mut().unwrap().node_stage_secret_ref = None;
    spec.claim_ref = Some(k8s_openapi::api::core::v1::ObjectReference {
        namespace: Some(w.app.name.clone()),
        name: Some("nokey".into()),
        ..Default::default()
    });
    bare.status = None;
    pvs.create(&PostParams::default(), &bare).await.unwrap();
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": { "name": "nokey" },
        "spec": {
            "accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": bare_name,
            "resources": { "requests": { "storage": "1Gi" } },
        },
    }))
    .unwrap();
    w.app
        .api::<PersistentVolumeClaim>()
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    let reader: Pod = serde_json::from_value(json!({
        "metadata": { "name": "nokey-reader" },
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "reader", "image": TOOLS_IMAGE, "imagePullPolicy": "Never",
                "command": ["cat", "/m/qwen3/config.json"],
                "volumeMounts": [{ "name": "m", "mountPath": "/m", "readOnly": true }],
            }],
            "volumes": [{ "name": "m", "persistentVolumeClaim": { "claimName": "nokey", "readOnly": true } }],
        },
    }))
    .unwrap();
    w.pods
        .create(&PostParams::default(), &reader)
        .await
        .unwrap();
    let node = w.node;
    let app = w.app.name.clone();
    let refused = eventually("the driver refusing the keyless publish", TIMEOUT, || {
        let app = app.clone();
        async move {
            node.csi_publishes(TestCsiDriver::NamespacedBlock)
                .ok()?
                .into_iter()
                .find(|p| p.pod_namespace == app && p.pod_name == "nokey-reader")
        }
    })
    .await
    .unwrap();
    assert!(refused.encrypted, "{refused:?}");
    let error = refused.error.clone().unwrap_or_default();
    assert!(error.contains("carries no key"), "{refused:?}");
    let pod = w.pods.get("nokey-reader").await.unwrap();
    assert_ne!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded"),
        "the keyless reader must not have read the model"
    );
    w.pods
        .delete("nokey-reader", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();

    // The key is in no Event, no object warmcache wrote, no log of the agent or the node.
    let events = Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    for e in &events.items {
        let text = serde_json::to_string(e).unwrap();
        assert!(!text.contains(&key), "the key is in an Event: {text}");
    }
    let mut texts = vec![
        serde_json::to_string(&b).unwrap(),
        serde_json::to_string(&class).unwrap(),
    ];
    for pv in pvs.list(&ListParams::default()).await.unwrap().items {
        texts.push(serde_json::to_string(&pv).unwrap());
    }
    for pod in w
        .control
        .api::<Pod>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        texts.push(serde_json::to_string(&pod).unwrap());
    }
    for job in w
        .app
        .api::<Job>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        texts.push(serde_json::to_string(&job).unwrap());
    }
    texts.push(w.agent_log());
    for component in [
        "kubelet",
        "csi-namespaced-block",
        "provisioner-namespaced-block",
        "attacher-namespaced-block",
    ] {
        texts.push(w.node.log_tail(component, 100_000));
    }
    for t in &texts {
        assert!(
            !t.contains(&key),
            "the key leaked: {}",
            &t[..t.len().min(400)]
        );
    }

    // Deleting the storage needs the key too: with the readers, their views and the keyless PV
    // gone, the primary's reclaim policy set to Delete makes the external-provisioner call
    // DeleteVolume with the Secret the PV's deletion-secret annotations name, and the driver
    // deletes the encrypted volume only with its key.
    let annotations = primary.annotations();
    assert_eq!(
        annotations
            .get("volume.kubernetes.io/provisioner-deletion-secret-name")
            .map(String::as_str),
        Some(names.secret.as_str())
    );
    // Torn down by hand, without the reaper's retirement: the controller would create the views
    // its status records again, so it stops first.
    w.stop_controller().await;
    for pod in ["qwen3-reader", "nokey-reader"] {
        let _ = w
            .pods
            .delete(pod, &DeleteParams::default().grace_period(0))
            .await;
    }
    let claims = w.app.api::<PersistentVolumeClaim>();
    for claim in [own_view.persistent_volume_claim_name.as_str(), "nokey"] {
        let _ = claims.delete(claim, &DeleteParams::default()).await;
    }
    for pv in views
        .iter()
        .map(|v| v.persistent_volume_name.clone())
        .chain([bare_name.clone()])
    {
        let _ = pvs.delete(&pv, &DeleteParams::default()).await;
    }
    let primary_name = primary.name_any();
    pvs.patch(
        &primary_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"persistentVolumeReclaimPolicy": "Delete"}})),
    )
    .await
    .unwrap();
    let volume_dir = w
        .node
        .csi_volume_dir(TestCsiDriver::NamespacedBlock, &csi.volume_handle);
    let deleted = eventually(
        "the encrypted primary deleted with its key",
        TIMEOUT,
        || {
            let (pvs, name, dir) = (pvs.clone(), primary_name.clone(), volume_dir.clone());
            async move { (pvs.get_opt(&name).await.ok()?.is_none() && !dir.exists()).then_some(()) }
        },
    )
    .await;
    if deleted.is_err() {
        panic!(
            "the encrypted primary was not deleted\nprovisioner:\n{}\ndriver:\n{}",
            w.node.log_tail("provisioner-namespaced-block", 40),
            w.node.log_tail("csi-namespaced-block", 40)
        );
    }

    // The binding gone, nothing needs the class or the key any more: the reaper deletes the
    // class in one sweep and the Secret in the next (the class first, so no new volume can be
    // provisioned with a key that is about to go).
    w.bindings
        .patch(
            &w.binding_name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .unwrap();
    let _ = w
        .bindings
        .delete(&w.binding_name, &DeleteParams::default())
        .await;
    let (bindings, binding) = (w.bindings.clone(), w.binding_name.clone());
    eventually("the binding gone", TIMEOUT, || {
        let (bindings, binding) = (bindings.clone(), binding.clone());
        async move {
            bindings
                .get_opt(&binding)
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await
    .unwrap();
    let sweeper = warmcache_reaper::Sweeper::new(
        client.clone(),
        warmcache_reaper::Settings {
            config: warmcache_modelvolume::reaper::Config::new(w.control.name.clone()),
            dry_run: false,
            page_size: 100,
            stage_wait: Duration::from_secs(30),
        },
        None,
        None,
        None,
    );
    let secrets = w.control.api::<Secret>();
    let now = k8s_openapi::jiff::Timestamp::now;
    let report = sweeper.sweep(now()).await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(
        w.classes.get_opt(&names.class).await.unwrap().is_none(),
        "{report:?}"
    );
    assert!(
        secrets.get_opt(&names.secret).await.unwrap().is_some(),
        "the key outlives its class by one sweep"
    );
    // The views deleted above may still be terminating (their claims wait for the readers to
    // go): while one names the Secret, the key stays.
    let secret = names.secret.clone();
    let naming = |list: &[PersistentVolume], secret: &str| -> Vec<String> {
        list.iter()
            .filter(|pv| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.csi.as_ref())
                    .and_then(|c| c.node_publish_secret_ref.as_ref())
                    .is_some_and(|r| r.name.as_deref() == Some(secret))
            })
            .map(|pv| {
                format!(
                    "{} phase {:?} finalizers {:?} deleting {} claim {:?}",
                    pv.name_any(),
                    pv.status.as_ref().and_then(|s| s.phase.clone()),
                    pv.metadata.finalizers,
                    pv.metadata.deletion_timestamp.is_some(),
                    pv.spec
                        .as_ref()
                        .and_then(|s| s.claim_ref.as_ref())
                        .map(|r| (r.namespace.clone(), r.name.clone()))
                )
            })
            .collect()
    };
    let gone = eventually("no PersistentVolume naming the key", TIMEOUT, || {
        let (pvs, secret) = (pvs.clone(), secret.clone());
        async move {
            let list = pvs.list(&ListParams::default()).await.ok()?;
            naming(&list.items, &secret).is_empty().then_some(())
        }
    })
    .await;
    if gone.is_err() {
        let list = pvs.list(&ListParams::default()).await.unwrap();
        let attachments =
            Api::<k8s_openapi::api::storage::v1::VolumeAttachment>::all(client.clone())
                .list(&ListParams::default())
                .await
                .unwrap();
        panic!(
            "PersistentVolumes still name the key: {:?}\nattachments: {:?}",
            naming(&list.items, &secret),
            attachments
                .items
                .iter()
                .map(|a| (
                    a.name_any(),
                    a.spec.source.persistent_volume_name.clone(),
                    a.metadata.deletion_timestamp.is_some()
                ))
                .collect::<Vec<_>>()
        );
    }
    let report = sweeper.sweep(now()).await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(
        secrets.get_opt(&names.secret).await.unwrap().is_none(),
        "{report:?}"
    );

    w.finish().await;
}

/// Hostile staged content: a FIFO in the tree. Every copy refuses it, the agent gives up after
/// three, drops the claim and answers `failed`; the Job fails at once (pod failure policy) and
/// the binding records the failure with the agent's words; nothing is labelled complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_failed_copies_drop_the_claim_and_fail_the_download_with_the_agents_words() {
    let w = setup(
        &format!("{DOWNLOAD_SCRIPT}mkfifo \"$d/not-a-model\"\n"),
        false,
        false,
        ReaderMode::Pvc,
    )
    .await;
    let failed = w
        .settled()
        .await
        .expect_err("a tree with a FIFO must not become a cache");
    w.staging_job_condition("Failed").await;
    let status = failed.status.clone().unwrap();
    let record = status.failure_record.clone().expect("a failure record");
    assert!(
        record.message.contains("could not copy") && record.message.contains("3 times"),
        "{record:?}\n{}",
        w.agent_log()
    );
    let claims: Api<PersistentVolumeClaim> = w.control.api();
    let claim = claims
        .get_opt(&warmcache_api_modelcache::writer_pvc_name(
            &w.stored.spec.identity,
        ))
        .await
        .unwrap();
    assert!(
        claim.is_none_or(|c| c.metadata.deletion_timestamp.is_some()),
        "the claim is dropped"
    );
    let log = w.agent_log();
    assert_eq!(log.matches("the copy failed").count(), 3, "{log}");
    assert!(
        log.contains("not-a-model"),
        "the refusal names the entry: {log}"
    );
    let pvs = Api::<PersistentVolume>::all(w.client.clone())
        .list(&ListParams::default().labels(COMPLETE_LABEL))
        .await
        .unwrap();
    assert!(
        pvs.items.iter().all(
            |pv| pv.labels().get(warmcache_modelvolume::keys::MODEL_LABEL)
                != Some(&warmcache_api_modelcache::identity_hash(
                    &w.stored.spec.identity
                ))
        ),
        "nothing of this cache is labelled complete"
    );
    w.finish().await;
}

/// A primary claim left by an agent for a staging pod that is gone before its copy (evicted, its
/// node lost): the agent of the live staging pod finds that pod gone, drops the claim and is
/// elected in its place; the download completes as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_staging_pod_is_gone_is_dropped_and_elected_again() {
    let w = setup(DOWNLOAD_SCRIPT, true, false, ReaderMode::Pvc).await;
    let ready = w.settled().await.unwrap_or_else(|b| {
        panic!(
            "the block download failed: {:?}\n{}",
            b.status,
            w.agent_log()
        )
    });
    let log = w.agent_log();
    assert!(
        log.contains("dropped a primary claim whose staging pod is gone"),
        "{log}"
    );
    let realized = ready.status.as_ref().unwrap().realized.clone().unwrap();
    assert!(realized.bytes.unwrap() >= 300_000, "{realized:?}");
    let done = wait_pod_finished(&w.pods, "qwen3-reader", TIMEOUT)
        .await
        .unwrap();
    let report = termination_message(&done, &w.engine).unwrap();
    assert_eq!(
        report.lines().find_map(|l| l.strip_prefix("read=")),
        Some(CONFIG_JSON),
        "{report}"
    );
    w.finish().await;
}

/// Runs `script` with `sh -c` as a process of the node (its mount namespace) and returns its
/// standard output; fails the test when it fails.
fn node_sh(node: &RealNode, script: &str) -> String {
    let out = Command::new("/bin/sh")
        .arg(node.dir().join("node-enter.sh"))
        .args(["sh", "-c", script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The node's mount table (its mount namespace, where the agent binds and the kubelet mounts).
fn node_mounts(node: &RealNode) -> Vec<MountInfo> {
    parse_mountinfo(&node_sh(node, "cat /proc/self/mountinfo")).unwrap()
}

/// The node's mount table shows at `target` a read-only bind of the view holder's kubelet mount
/// of the view PV `pv` (the same device and root).
async fn check_bind(w: &World, holder_name: &str, pv: &str, target: &str, why: &str) {
    let holder = w.app.api::<Pod>().get(holder_name).await.unwrap();
    let source = w
        .node
        .dir()
        .join("kubelet/pods")
        .join(holder.metadata.uid.clone().unwrap())
        .join("volumes/kubernetes.io~csi")
        .join(pv)
        .join("mount");
    let table = node_mounts(w.node);
    let bound = top_mount(&table, std::path::Path::new(target))
        .unwrap_or_else(|| panic!("{why}: nothing mounted at {target}"));
    let view = top_mount(&table, &source).unwrap_or_else(|| {
        panic!(
            "{why}: the holder's view is not mounted at {}",
            source.display()
        )
    });
    assert!(bound.read_only(), "{why}: {bound:?}");
    assert_eq!(
        (bound.major, bound.minor, &bound.root),
        (view.major, view.minor, &view.root),
        "{why}: the bind is the holder's mount of the view"
    );
}

/// `pod` made also a cache capture source of the compile-cache set `set` (handle `handle`), as
/// the webhook leaves a pod whose set was not complete at admission: the labels, the set's
/// records, the scratch emptyDir mounted where the compile-cache variables point.
fn with_cache_capture(mut pod: Pod, set: &ModelCacheBinding, handle: &str) -> Pod {
    use warmcache_modelvolume::keys::{
        CACHE_BINDING_ANNOTATION, CACHE_BINDING_UID_ANNOTATION, CACHE_CAPTURE_LABEL,
        CACHE_HANDLE_ANNOTATION, CACHE_KEY_LABEL, SCRATCH_PATH, SCRATCH_VOLUME,
    };
    let labels = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(CACHE_CAPTURE_LABEL.into(), "true".into());
    labels.insert(
        CACHE_KEY_LABEL.into(),
        warmcache_api_modelcache::identity_hash(&set.spec.identity),
    );
    let a = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    a.insert(CACHE_BINDING_ANNOTATION.into(), set.name_any());
    a.insert(
        CACHE_BINDING_UID_ANNOTATION.into(),
        set.metadata.uid.clone().unwrap(),
    );
    a.insert(CACHE_HANDLE_ANNOTATION.into(), handle.into());
    let spec = pod.spec.as_mut().unwrap();
    spec.volumes
        .get_or_insert_with(Vec::new)
        .push(serde_json::from_value(json!({ "name": SCRATCH_VOLUME, "emptyDir": {} })).unwrap());
    spec.containers[0]
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(
            serde_json::from_value(json!({ "name": SCRATCH_VOLUME, "mountPath": SCRATCH_PATH }))
                .unwrap(),
        );
    pod
}

/// Waits for an Event with `reason` about pod `name` of the app namespace.
async fn event_on(w: &World, name: &str, reason: &str) {
    let events = w.app.api::<k8s_openapi::api::events::v1::Event>();
    eventually(&format!("Event {reason} on {name}"), TIMEOUT, || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                })
                .then_some(())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", w.agent_log()));
}

fn pending(pod: &Pod) -> bool {
    pod.labels().get(PENDING_LABEL).map(String::as_str) == Some("true")
}

/// A hostPath reader (reader mode `hostPath` on the namespaced-block profile) is served by the
/// agent through a view holder in its namespace: never bound over data a pod wrote into its
/// directory (it stays pending, the data intact), bound once the directory is empty, un-pended
/// only with the node's mount table showing the read-only bind of the holder's mount of the
/// view (same device and root); it then reads the bytes and gets EROFS on every write. A bind
/// removed by hand is redone; with no reader left the directory is unbound and the holder
/// deleted, the directory kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_path_reader_is_served_and_unpended_only_with_a_verified_bind() {
    let w = setup(DOWNLOAD_SCRIPT, false, false, ReaderMode::HostPath).await;
    let node = w.node;
    let hash = warmcache_api_modelcache::identity_hash(&w.stored.spec.identity);
    let target = format!("{}/{hash}", w.bind_root);
    let reader = w.pods.get("qwen3-reader").await.unwrap();
    assert!(pending(&reader), "hostPath readers are admitted pending");
    assert_eq!(
        reader
            .spec
            .as_ref()
            .unwrap()
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == warmcache_modelvolume::keys::MODEL_VOLUME)
            .and_then(|v| v.host_path.as_ref())
            .map(|h| h.path.clone()),
        Some(target.clone())
    );
    // What a reader's own (fallback) download would have left in the directory.
    node_sh(
        node,
        &format!("mkdir -p '{target}' && echo mine > '{target}/own-download.bin'"),
    );

    let ready = w.settled().await.unwrap_or_else(|b| {
        panic!(
            "the block download failed: {:?}\n{}",
            b.status,
            w.agent_log()
        )
    });
    let views = ready.status.unwrap().realized.unwrap().views;
    let view = views
        .iter()
        .find(|v| v.namespace == w.app.name)
        .expect("the binding controller records a view for the hostPath reader's namespace")
        .clone();

    // Occupied: not bound over, the data intact, the reader still pending.
    eventually(
        "the agent refusing to bind over the pod's data",
        TIMEOUT,
        || {
            let log = w.agent_log();
            async move {
                log.contains("not binding over data a pod wrote")
                    .then_some(())
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", w.agent_log()));
    assert!(top_mount(&node_mounts(node), std::path::Path::new(&target)).is_none());
    assert_eq!(
        node_sh(node, &format!("cat '{target}/own-download.bin'")),
        "mine\n"
    );
    assert!(pending(&w.pods.get("qwen3-reader").await.unwrap()));
    event_on(&w, "qwen3-reader", "ModelDirectoryOccupied").await;

    // Emptied: bound, and un-pended only with the bind in the node's mount table.
    node_sh(node, &format!("rm '{target}/own-download.bin'"));
    let pods = w.pods.clone();
    eventually("the reader un-pended", TIMEOUT, || {
        let pods = pods.clone();
        async move {
            let p = pods.get("qwen3-reader").await.ok()?;
            (!pending(&p)).then_some(())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", w.agent_log()));
    let holder_name = view_holder_name(&hash, node.name());
    let pv = view.persistent_volume_name.clone();
    check_bind(&w, &holder_name, &pv, &target, "after the un-pend").await;
    event_on(&w, "qwen3-reader", "ModelViewBound").await;

    // The reader reads the copy through the bind and cannot write it.
    let done = wait_pod_finished(&w.pods, "qwen3-reader", TIMEOUT)
        .await
        .unwrap();
    assert_eq!(
        state_exit(&done, WAIT_CONTAINER),
        Some(0),
        "{:?}",
        done.status
    );
    let report = termination_message(&done, &w.engine).unwrap();
    eprintln!("hostPath reader report:\n{report}");
    assert_reads_read_only(&report);

    // A long-running reader of the same model: served again; a bind removed by hand is redone.
    let mut long = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some("qwen3-long".into()),
            labels: done.metadata.labels.clone(),
            annotations: done.metadata.annotations.clone(),
            ..k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta::default()
        },
        spec: done.spec.clone(),
        status: None,
    };
    long.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(PENDING_LABEL.into(), "true".into());
    let spec = long.spec.as_mut().unwrap();
    spec.node_name = None;
    let main = spec
        .containers
        .iter_mut()
        .find(|c| c.name == w.engine)
        .unwrap();
    main.command = Some(vec!["sleep".into(), "600".into()]);
    main.args = None;
    w.pods.create(&PostParams::default(), &long).await.unwrap();
    eventually("the long reader un-pended", TIMEOUT, || {
        let pods = pods.clone();
        async move {
            let p = pods.get("qwen3-long").await.ok()?;
            (!pending(&p)).then_some(())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", w.agent_log()));
    check_bind(&w, &holder_name, &pv, &target, "the long reader").await;
    let binds = |log: &str| log.matches("bound the read-only view").count();
    let before = binds(&w.agent_log());
    node_sh(node, &format!("umount '{target}'"));
    eventually("the bind redone", Duration::from_secs(120), || {
        let log = w.agent_log();
        async move { (binds(&log) > before).then_some(()) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", w.agent_log()));
    check_bind(&w, &holder_name, &pv, &target, "redone").await;

    // No reader left: unbound, the holder deleted, the directory kept.
    w.pods
        .delete(
            "qwen3-long",
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await
        .unwrap();
    let holders = w.app.api::<Pod>();
    eventually(
        "the holder deleted and the directory unbound",
        TIMEOUT,
        || {
            let (holders, holder_name) = (holders.clone(), holder_name.clone());
            let mounted = top_mount(&node_mounts(node), std::path::Path::new(&target)).is_some();
            async move {
                let h = holders.get_opt(&holder_name).await.ok()?;
                (h.is_none() && !mounted).then_some(())
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", w.agent_log()));
    node_sh(node, &format!("test -d '{target}'"));
    let log = w.agent_log();
    assert!(
        log.contains("no reader of the model is left on the node"),
        "{log}"
    );
    w.finish().await;
}

/// Seed 002's shared-filesystem failure, served: every fresh export of the root-owned profile is
/// owned by root (0755) and the driver applies no fsGroup to ReadWriteMany, so the decision says
/// writer identity `root`; with the agent deployed the binding controller runs the writer as the
/// function's non-root user instead, labelled for the agent, and its wrapper waits. The agent of
/// the node (as its ServiceAccount) checks the pod, the writer view claim and PV and the primary,
/// gives the root of the kubelet's mount of the view to the writer's user once the mount table
/// shows it, and the download lands as that user; the reader reads it read-only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_root_writer_gets_its_fresh_root_opened_by_the_agent() {
    let w = setup_on(
        Flow::RootOwnedRwx,
        DOWNLOAD_SCRIPT,
        false,
        false,
        ReaderMode::Pvc,
    )
    .await;
    assert_eq!(
        w.stored.spec.decision.writer_identity,
        Some(WriterIdentity::Root)
    );
    let b = w.settled().await.unwrap_or_else(|b| {
        panic!(
            "the download failed: {:?}\nagent log:\n{}",
            b.status,
            w.agent_log()
        )
    });
    assert_eq!(
        b.status
            .as_ref()
            .unwrap()
            .realized
            .as_ref()
            .unwrap()
            .population_state,
        Some(PopulationState::Ready)
    );

    // The writer ran non-root, labelled for the agent, and the agent opened its root.
    let writers = w
        .pods
        .list(&ListParams::default().labels(&format!("{OPEN_ROOT_LABEL}=true")))
        .await
        .unwrap();
    let [writer] = writers.items.as_slice() else {
        panic!("one writer pod: {:?}", writers.items);
    };
    let security = writer.spec.as_ref().unwrap().containers[0]
        .security_context
        .clone()
        .unwrap();
    assert_eq!(
        (security.run_as_user, security.run_as_group),
        (Some(65532), Some(65532))
    );
    assert_eq!(
        writer.status.as_ref().unwrap().phase.as_deref(),
        Some("Succeeded")
    );
    event_on(&w, &writer.name_any(), "ModelRootOpened").await;

    // The reader reads what the non-root writer wrote, and cannot write it.
    let done = wait_pod_finished(&w.pods, "qwen3-reader", TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", w.agent_log()));
    assert_eq!(
        state_exit(&done, WAIT_CONTAINER),
        Some(0),
        "{:?}",
        done.status
    );
    let report = termination_message(&done, &w.engine).unwrap_or_default();
    assert_reads_read_only(&report);
    assert_eq!(
        report.lines().find_map(|l| l.strip_prefix("owner=")),
        Some("65532:65532"),
        "the files belong to the writer's user: {report}"
    );
    w.finish().await;
}

/// What a capture source's engine downloads by itself into its emptyDir (in place of
/// `ngc registry model download-version`): files, a nested directory and a relative link, then
/// it reports Ready (its readiness probe) and serves. `$1` is a word written into the tree.
const CAPTURE_ENGINE: &str = r#"set -eu
d=/ngc-cache/ngc/models/llama_v1
mkdir -p "$d/blobs"
printf '%s\n' '{"model_type":"llama"}' > "$d/config.json"
yes captured-shard | head -c 300000 > "$d/blobs/shard-1"
ln -s blobs/shard-1 "$d/model.safetensors"
echo "$1" > "$d/written-by"
c=/opt/nvsnap/cache
if [ -d "$c" ]; then
  # What an engine compiles at start (torch.compile, Triton), and what must never travel: the
  # NGC CLI's config, a Hugging Face token, a key in a cache directory, a link out of the tree.
  mkdir -p "$c/torchinductor/fxgraph/ab" "$c/.triton/cache/k1" "$c/.ngc" "$c/.cache/huggingface"
  echo "graph-$1" > "$c/torchinductor/fxgraph/ab/entry"
  yes kernel | head -c 20000 > "$c/.triton/cache/k1/kernel.cubin"
  echo "apikey = nvapi-secret" > "$c/.ngc/config"
  echo "hf_secret" > "$c/.cache/huggingface/token"
  echo "-----BEGIN PRIVATE KEY-----" > "$c/torchinductor/x.pem"
  ln -s /etc/passwd "$c/torchinductor/out"
fi
touch /tmp/ready
exec sleep 3600
"#;

/// A capture source's engine that plants a link to the node's `/etc` as its landing.
const ESCAPING_ENGINE: &str = r#"set -eu
ln -s /etc /ngc-cache/ngc
touch /tmp/ready
exec sleep 3600
"#;

/// A pod as the webhook leaves a capture source: labelled, naming `binding` (its UID) and the
/// capture `handle`, its landing `path` inside its emptyDir `ngc-cache`; the engine runs `script`
/// and is Ready once its download is there.
fn capture_pod(
    name: &str,
    binding: &ModelCacheBinding,
    handle: &str,
    path: &str,
    script: &str,
) -> Pod {
    use warmcache_modelvolume::keys::{
        BINDING_ANNOTATION, BINDING_UID_ANNOTATION, CAPTURE_LABEL, CAPTURE_PATH_ANNOTATION,
        CAPTURE_VOLUME_ANNOTATION, HANDLE_ANNOTATION, MODEL_LABEL,
    };
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                CAPTURE_LABEL: "true",
                MODEL_LABEL: warmcache_api_modelcache::identity_hash(&binding.spec.identity),
            },
            "annotations": {
                BINDING_ANNOTATION: binding.name_any(),
                BINDING_UID_ANNOTATION: binding.metadata.uid.clone().unwrap(),
                HANDLE_ANNOTATION: handle,
                CAPTURE_VOLUME_ANNOTATION: "ngc-cache",
                CAPTURE_PATH_ANNOTATION: path,
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "engine",
                "image": TOOLS_IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", script, "engine", name],
                "readinessProbe": {
                    "exec": { "command": ["cat", "/tmp/ready"] },
                    "periodSeconds": 1,
                },
                "volumeMounts": [{ "name": "ngc-cache", "mountPath": "/ngc-cache" }],
                "resources": small(),
            }],
            "volumes": [{ "name": "ngc-cache", "emptyDir": {} }],
        },
    }))
    .unwrap()
}

/// Waits for an Event with `reason` about pod `name` in `events`' namespace.
async fn event_about(
    events: &Api<k8s_openapi::api::events::v1::Event>,
    name: &str,
    reason: &str,
    log: impl Fn() -> String,
) {
    eventually(&format!("Event {reason} on {name}"), TIMEOUT, || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                })
                .then_some(())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", log()));
}

/// Runs `script` in pod `name` (in `pods`' namespace) with claim `claim` mounted read-only at
/// `mount`, and returns what it wrote to its termination message and a lookup of its `key=value`
/// lines (panicking, with the agent's `log`, when the pod does not finish or a key is missing).
async fn read_claim(
    pods: &Api<Pod>,
    name: &str,
    claim: &str,
    mount: &str,
    script: &str,
    log: &dyn Fn() -> String,
) -> (String, impl Fn(&str) -> String) {
    let mut check = warmcache_testkit::tools_pod(name, script);
    let spec = check.spec.as_mut().unwrap();
    spec.containers[0].volume_mounts = Some(vec![
        serde_json::from_value(json!({
            "name": "checked", "mountPath": mount, "readOnly": true,
        }))
        .unwrap(),
    ]);
    spec.containers[0].resources = Some(small());
    spec.volumes = Some(vec![
        serde_json::from_value(json!({
            "name": "checked",
            "persistentVolumeClaim": { "claimName": claim, "readOnly": true },
        }))
        .unwrap(),
    ]);
    pods.create(&PostParams::default(), &check).await.unwrap();
    let checked = wait_pod_finished(pods, name, TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", log()));
    let report = termination_message(&checked, "main").unwrap();
    let lines = report.clone();
    let field = move |k: &str| {
        lines
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("{k} missing in {lines}"))
            .to_owned()
    };
    (report, field)
}

/// Capture after Ready on the real node (the test CSI driver's namespaced-block profile, the
/// agent as a process of the node under its generated roles; the binding made as the webhook
/// makes it for a capture source, without the binding controller): a capture source's landing
/// in its emptyDir is copied, once the pod is Ready, into a primary claim the agent creates sized
/// from its bytes, and recorded on it (bytes, manifest digest, the pod elected); the volume holds
/// the tree, its manifest (checked with `sha256sum -c`) and the marker. Before it, a pod carrying
/// the same records in a namespace outside the binding's sharing domain, and a pod of the domain
/// whose landing is a link to the node's `/etc`, are refused: no claim is created for them and
/// nothing of theirs reaches the volume. The capture source is also the cache capture source of
/// its compile-cache set (a second binding): once Ready, its scratch emptyDir's compile caches,
/// and only them (no NGC config, token, key or link out of the tree), are copied into the set
/// binding's own claim, sized from what travels and recorded alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_capture_source_is_copied_into_a_primary_sized_from_its_bytes() {
    use warmcache_api_modelcache::v2beta1::{BindingIdentity, Workflow};
    use warmcache_api_modelcache::{
        binding_name, init_lease_name, writer_job_name, writer_pvc_name,
    };
    use warmcache_modelvolume::agent::{COPY_POD_ANNOTATION, COPY_POD_NAME_ANNOTATION};
    use warmcache_modelvolume::volume_keys::{
        COPIED_BYTES_ANNOTATION, COPY_SOURCE_ANNOTATION, COPY_SOURCE_CAPTURE,
        SOURCE_NAMESPACE_LABEL,
    };

    let one = ONE_CLASS.lock().await;
    let node = RealNode::shared().await.unwrap();
    let plane = ControlPlane::shared().await.unwrap();
    let app = TestNamespace::new("mvc-capture-app").await.unwrap();
    let outsider = TestNamespace::new("mvc-capture-out").await.unwrap();
    let control = TestNamespace::new("mvc-capture-ctl").await.unwrap();
    let client = app.client.clone();
    // The app namespace's sharing domain is its own name; the outsider is in another one.
    label_domain(&client, &app.name, &app.name).await;
    label_domain(&client, &outsider.name, &outsider.name).await;
    let ModelCacheClass {
        classes,
        nvcf_sc,
        csi_driver,
        catalog,
        gates,
    } = model_cache_class(&client, Flow::Block).await;

    // The binding the webhook creates for a capture source of the app namespace: the storage
    // decision an admission takes, the identity of a capture handle (helmModelCache, the app
    // namespace's domain).
    let source: Pod = serde_saphyr::from_str(VLLM_POD).unwrap();
    let labels = Api::<Namespace>::all(client.clone())
        .get(&app.name)
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap_or_default();
    let options = Options {
        control_namespace: control.name.clone(),
        ..Options::default()
    };
    let req = Request {
        pod: &source,
        namespace: &app.name,
        namespace_labels: &labels,
        leader_worker_set: None,
        traceparent: None,
        options: &options,
    };
    let storage = StorageInputs {
        storage_class: Some(&nvcf_sc),
        csi_driver: Some(&csi_driver),
        catalog: CatalogInput::Loaded(&catalog),
        gates,
    };
    let Verdict::Rewrite(first) = admit(&req, |_, _| None, &storage) else {
        panic!("the pod was not rewritten");
    };
    assert_eq!(first.transition, Transition::RoxReadOnly);
    let BindingAction::Create(mut wanted) = first.binding.clone() else {
        panic!("no binding exists yet");
    };
    let handle = "ngc://nvidia/llama-3.1-8b-instruct@1.0?layout=ngc&fill=capture";
    let identity = BindingIdentity::new(Workflow::HelmModelCache, &app.name, handle);
    wanted.metadata.name = Some(binding_name(&identity));
    wanted.spec.resources.persistent_volume_claim_names = vec![writer_pvc_name(&identity)];
    wanted.spec.resources.job_names = vec![writer_job_name(&identity)];
    wanted.spec.resources.lease_name = init_lease_name(&identity);
    wanted.spec.identity = identity;
    // The binding of the pod's compile-cache set: the same decision, a cache-set handle.
    let cache_handle = format!("cache://{}?rank=0", "5e".repeat(32));
    let set_identity = BindingIdentity::new(Workflow::HelmModelCache, &app.name, &cache_handle);
    let mut set = wanted.clone();
    set.metadata.name = Some(binding_name(&set_identity));
    set.spec.resources.persistent_volume_claim_names = vec![writer_pvc_name(&set_identity)];
    set.spec.resources.job_names = vec![writer_job_name(&set_identity)];
    set.spec.resources.lease_name = init_lease_name(&set_identity);
    set.spec.identity = set_identity;
    let bindings: Api<ModelCacheBinding> = control.api();
    let stored = bindings
        .create(&PostParams::default(), &wanted)
        .await
        .unwrap();
    let set = bindings.create(&PostParams::default(), &set).await.unwrap();
    let claim_name = writer_pvc_name(&stored.spec.identity);
    let set_claim_name = writer_pvc_name(&set.spec.identity);

    // The agent, as the chart's ServiceAccount with the generated roles.
    let admin = plane.client().await.unwrap();
    let account = ComponentAccount::create(
        plane,
        &admin,
        "model-volume-controller",
        &control.name,
        &control.name,
    )
    .await
    .unwrap();
    let bind_root = format!("/var/lib/warmcache-test-binds/{}", app.name);
    let agent = start_agent(node, account.kubeconfig_path(), &control.name, &bind_root);
    let log = || {
        std::fs::read_to_string(node.dir().join("model-volume-controller.log")).unwrap_or_default()
    };

    // Refused: the same records forged on a pod of another sharing domain, and a pod of the
    // domain whose landing is a link to the node's /etc. Both run Ready; neither is copied.
    let outsider_pods = outsider.api::<Pod>();
    outsider_pods
        .create(
            &PostParams::default(),
            &capture_pod("forged", &stored, handle, "ngc/models", CAPTURE_ENGINE),
        )
        .await
        .unwrap();
    let app_pods = app.api::<Pod>();
    app_pods
        .create(
            &PostParams::default(),
            &capture_pod("escaping", &stored, handle, "ngc", ESCAPING_ENGINE),
        )
        .await
        .unwrap();
    wait_pod_running(&outsider_pods, "forged", TIMEOUT)
        .await
        .unwrap();
    wait_pod_running(&app_pods, "escaping", TIMEOUT)
        .await
        .unwrap();
    event_about(&outsider.api(), "forged", "ModelCaptureRefused", &log).await;
    event_about(&app.api(), "escaping", "ModelCaptureRefused", &log).await;
    let claims: Api<PersistentVolumeClaim> = control.api();
    assert!(
        claims.get_opt(&claim_name).await.unwrap().is_none(),
        "no claim for a refused pod\n{}",
        log()
    );
    let l = log();
    assert!(l.contains("not in binding"), "{l}");
    assert!(l.contains("symbolic link"), "{l}");

    // The capture source of the domain, also the cache capture source of its compile-cache
    // set: both copied once Ready, each into its own binding's primary.
    app_pods
        .create(
            &PostParams::default(),
            &with_cache_capture(
                capture_pod("nim-0", &stored, handle, "ngc/models", CAPTURE_ENGINE),
                &set,
                &cache_handle,
            ),
        )
        .await
        .unwrap();
    let ready = wait_pod_running(&app_pods, "nim-0", TIMEOUT).await.unwrap();
    let claim = eventually("the capture recorded on the primary claim", TIMEOUT, || {
        let (claims, name) = (claims.clone(), claim_name.clone());
        async move {
            let c = claims.get_opt(&name).await.ok()??;
            c.annotations()
                .contains_key(COPIED_BYTES_ANNOTATION)
                .then_some(c)
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", log()));
    let a = claim.annotations();
    let bytes: u64 = a[COPIED_BYTES_ANNOTATION].parse().unwrap();
    assert!(bytes >= 300_000, "{a:?}");
    assert_eq!(a[MANIFEST_DIGEST_ANNOTATION].len(), 64, "{a:?}");
    assert_eq!(a.get(COPY_POD_ANNOTATION), ready.metadata.uid.as_ref());
    assert_eq!(a[COPY_POD_NAME_ANNOTATION], "nim-0");
    assert_eq!(a[SOURCE_NAMESPACE_LABEL], app.name);
    assert_eq!(a[COPY_SOURCE_ANNOTATION], COPY_SOURCE_CAPTURE);
    let spec = claim.spec.as_ref().unwrap();
    assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
    assert_eq!(
        spec.resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"],
        warmcache_modelvolume::view::sized(bytes, 1 << 30),
        "sized from the bytes (the 1 GiB floor)"
    );
    // The compile-cache set: its own claim, recorded alike, sized from what travels.
    let set_claim = eventually("the set recorded on its primary claim", TIMEOUT, || {
        let (claims, name) = (claims.clone(), set_claim_name.clone());
        async move {
            let c = claims.get_opt(&name).await.ok()??;
            c.annotations()
                .contains_key(COPIED_BYTES_ANNOTATION)
                .then_some(c)
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", log()));
    let a = set_claim.annotations();
    let set_bytes: u64 = a[COPIED_BYTES_ANNOTATION].parse().unwrap();
    assert!((20_000..300_000).contains(&set_bytes), "{a:?}");
    assert_eq!(a.get(COPY_POD_ANNOTATION), ready.metadata.uid.as_ref());
    assert_eq!(a[COPY_SOURCE_ANNOTATION], COPY_SOURCE_CAPTURE);
    assert_eq!(
        set_claim
            .spec
            .as_ref()
            .unwrap()
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap()["storage"],
        warmcache_modelvolume::view::sized(set_bytes, 1 << 30),
    );
    // The mount holders go once the copies are recorded (the volumes can detach).
    let holders = control.api::<Pod>();
    eventually("the mount holder deleted", TIMEOUT, || {
        let holders = holders.clone();
        async move {
            let list = holders
                .list(&ListParams::default().labels("app.kubernetes.io/component=mount-holder"))
                .await
                .ok()?;
            list.items.is_empty().then_some(())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", log()));
    event_about(&app.api(), "nim-0", "ModelCaptured", &log).await;
    event_about(&app.api(), "nim-0", "CacheSetCaptured", &log).await;

    // What the volume holds: the landing's tree (the link copied as a link), the manifest an
    // operator checks with sha256sum, the marker with the bytes; nothing of the refused pods.
    let (report, field) = read_claim(
        &holders,
        "check-primary",
        &claim_name,
        "/primary",
        r#"cd /primary
{
  echo "marker=$(cat .nvsnap-complete)"
  sha256sum -c .nvsnap-manifest >/dev/null && echo "manifest=ok"
  echo "shard=$(sha256sum llama_v1/model.safetensors | cut -d' ' -f1)"
  echo "expected=$(yes captured-shard | head -c 300000 | sha256sum | cut -d' ' -f1)"
  echo "link=$(readlink llama_v1/model.safetensors)"
  echo "writer=$(cat llama_v1/written-by)"
  echo "passwd=$(find . -name passwd | wc -l)"
  echo "top=$(ls -A | tr '\n' ' ')"
} > /dev/termination-log 2>&1
"#,
        &log,
    )
    .await;
    eprintln!("the primary holds:\n{report}");
    assert_eq!(field("marker"), bytes.to_string(), "{report}");
    assert_eq!(field("manifest"), "ok", "{report}");
    assert_eq!(field("shard"), field("expected"), "{report}");
    assert_eq!(field("link"), "blobs/shard-1", "{report}");
    assert_eq!(
        field("writer"),
        "nim-0",
        "the domain's pod, not the forged one: {report}"
    );
    assert_eq!(field("passwd"), "0", "nothing of the node's /etc: {report}");
    assert_eq!(
        field("top").trim(),
        ".nvsnap-complete .nvsnap-manifest llama_v1",
        "{report}"
    );

    // What the set's volume holds: the compile caches and nothing else (no credential, no
    // link), verified as any copy.
    let (report, field) = read_claim(
        &holders,
        "check-set",
        &set_claim_name,
        "/set",
        r#"cd /set
{
  echo "marker=$(cat .nvsnap-complete)"
  sha256sum -c .nvsnap-manifest >/dev/null && echo "manifest=ok"
  echo "entry=$(cat torchinductor/fxgraph/ab/entry)"
  echo "kernel=$(wc -c < .triton/cache/k1/kernel.cubin | tr -d ' ')"
  echo "all=$(find . -mindepth 1 | LC_ALL=C sort | tr '\n' ' ')"
} > /dev/termination-log 2>&1
"#,
        &log,
    )
    .await;
    eprintln!("the set holds:\n{report}");
    assert_eq!(field("marker"), set_bytes.to_string(), "{report}");
    assert_eq!(field("manifest"), "ok", "{report}");
    assert_eq!(field("entry"), "graph-nim-0", "{report}");
    assert_eq!(field("kernel"), "20000", "{report}");
    assert_eq!(
        field("all").trim(),
        "./.cache ./.nvsnap-complete ./.nvsnap-manifest ./.triton ./.triton/cache \
         ./.triton/cache/k1 ./.triton/cache/k1/kernel.cubin ./torchinductor \
         ./torchinductor/fxgraph ./torchinductor/fxgraph/ab ./torchinductor/fxgraph/ab/entry",
        "only the compile caches (.cache, on the way to vLLM's, left empty): no .ngc, no \
         token, no key, no link: {report}"
    );

    // One election per binding: the domain's Ready pod's, for its model and for its set.
    let l = log();
    assert_eq!(
        l.matches("created the primary claim sized from the captured bytes")
            .count(),
        2,
        "{l}"
    );

    drop(agent);
    drop(account);
    for b in [&stored, &set] {
        bindings
            .patch(
                &b.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
            )
            .await
            .unwrap();
    }
    let _ = classes
        .delete(MODEL_CACHE_STORAGE_CLASS, &DeleteParams::default())
        .await;
    app.cleanup().await;
    outsider.cleanup().await;
    control.cleanup().await;
    drop(one);
}
