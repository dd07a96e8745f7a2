//! The binding controller on the REAL node (kubelet, containerd, the test CSI driver's
//! shared-filesystem profile): a vLLM reader pod rendered by the webhook's pure function
//! (`warmcache_modelvolume::admit`) joins a binding; the REAL controller creates the primary
//! claim (provisioned by the test driver), the writer view and the writer Job, which really runs
//! and writes the model through the wrapper; the controller labels the primary complete with
//! Retain, releases the writer claim and creates the namespace's read-only view; the reader's
//! wait container sees the marker, and the engine reads the bytes the Job wrote and cannot write
//! them (EROFS on every kind of write).
//!
//! What the node needs and the rendered objects cannot give it, and nothing else: images become
//! the tools image with `imagePullPolicy: Never` (no registry is reachable), the download step
//! recorded on the pod runs a script writing the model files instead of `pip install && hf
//! download` (no network), the GPU request is removed from the rendered pod, and the engine's
//! `vllm serve` becomes a script reporting what it can read and write.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Namespace, PersistentVolume, PersistentVolumeClaim, Pod, ResourceRequirements,
};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Api;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use warmcache_api_modelcache::MODEL_CACHE_STORAGE_CLASS;
use warmcache_api_modelcache::v2beta1::{
    ModelCacheBinding, PopulationState, Transition, Workflow, WriterIdentity,
};
use warmcache_binding_controller::controller::{Settings, start};
use warmcache_catalog::{CatalogInput, CatalogSnapshot, Gates};
use warmcache_modelvolume::keys::{
    COMPLETE_MARKER, DOWNLOAD_STEP_ANNOTATION, MODEL_VOLUME, WAIT_CONTAINER,
};
use warmcache_modelvolume::volume_keys::COMPLETE_LABEL;
use warmcache_modelvolume::{
    BindingAction, DownloadStep, LifecycleConfig, Options, Request, StorageInputs, Verdict,
    WriterOptions, admit,
};
use warmcache_runtime::{LogFormat, Runtime, RuntimeArgs};
use warmcache_testkit::{
    ControlPlane, RealNode, TOOLS_IMAGE, TestCsiDriver, TestNamespace, eventually,
    termination_message, wait_pod_finished,
};

const TIMEOUT: Duration = Duration::from_secs(240);

/// One test at a time: both use the cluster-wide StorageClass nvcf-sc, on different drivers.
static ONE_CLASS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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

/// A catalog qualifying `driver` for ReadWriteMany (what `pkg/testkit/tests/csi_driver.rs`
/// proves on both shared-filesystem profiles), with no reader mount options and no writer
/// identity: the decision takes it from the CSIDriver's fsGroupPolicy.
fn catalog(driver: TestCsiDriver, writer_identity: Option<&str>) -> String {
    let mut text = format!(
        "apiVersion: storage.nvcf.nvidia.com/v1alpha1\nkind: StorageCapabilityCatalog\ndrivers:\n  - name: {}\n    provider: testSharedFs\n    accessModes: [ReadWriteMany]\n    readerMountOptions: []\n",
        driver.driver_name()
    );
    if let Some(identity) = writer_identity {
        text.push_str(&format!("    writerIdentity: {identity}\n"));
    }
    text
}

/// What the download writes (in place of `hf download --local-dir /models/qwen3`).
const DOWNLOAD_SCRIPT: &str = r#"set -eu
d=/models/qwen3
printf '%s\n' '{"architectures":["Qwen3ForCausalLM"],"model_type":"qwen3"}' > "$d/config.json"
printf '%s\n' '{"version":"1.0"}' > "$d/tokenizer.json"
printf '%s\n' '{"model_max_length":4096}' > "$d/tokenizer_config.json"
head -c 65536 /dev/zero > "$d/model.safetensors"
echo "downloaded as $(id -u):$(id -g)"
"#;

const CONFIG_JSON: &str = r#"{"architectures":["Qwen3ForCausalLM"],"model_type":"qwen3"}"#;

/// Stands in for `vllm serve` (as in the webhook's real-node test): reads the copy, reports the
/// mount, tries every kind of write through the landing.
const ENGINE_SCRIPT: &str = r#"
L="$1"
try() { op=$1; shift; err=$("$@" 2>&1 >/dev/null); echo "$op rc=$? $err"; }
{
  echo "read=$(cat "$L/config.json")"
  echo "mount=$(awk -v p="$L" '$2 == p { o = $4 } END { print o }' /proc/mounts)"
  try create touch "$L/written-by-reader"
  try append sh -c 'echo more >> "$0/config.json"' "$L"
  try rename mv "$L/tokenizer.json" "$L/tokenizer.json.moved"
  try chmod chmod 600 "$L/model.safetensors"
  try truncate truncate -s 0 "$L/config.json"
  try delete rm "$L/tokenizer_config.json"
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

/// The rendered pod adapted to the node (see the module documentation); the recorded download
/// step runs [`DOWNLOAD_SCRIPT`] on the tools image.
fn for_the_test_node(rendered: &Pod, engine: &str, landing: &str) -> Pod {
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
    step.container.command = Some(vec!["sh".into(), "-c".into(), DOWNLOAD_SCRIPT.into()]);
    annotations.insert(
        DOWNLOAD_STEP_ANNOTATION.to_owned(),
        step.to_annotation().unwrap(),
    );
    pod
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

/// fsGroupPolicy File: the kubelet hands the fresh export to the writer's fsGroup; the writer
/// stays non-root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_reads_what_the_controllers_writer_job_wrote_and_cannot_write_it() {
    end_to_end(
        TestCsiDriver::SharedFs,
        None,
        WriterIdentity::FsGroup,
        Some("65532"),
        1,
    )
    .await;
}

/// helmModelCache on the shared filesystem: two namespaces of one sharing domain (the label
/// `nvca.nvcf.nvidia.io/model-cache-sharing-domain`) each admit a reader; one writer Job runs
/// (in the first namespace, none in the second), and each namespace's reader reads the bytes
/// that Job wrote through its own read-only view (its own claim and PV) and gets EROFS on every
/// write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_in_two_namespaces_of_a_domain_read_one_download_through_their_own_views() {
    end_to_end(
        TestCsiDriver::SharedFs,
        None,
        WriterIdentity::FsGroup,
        Some("65532"),
        2,
    )
    .await;
}

/// Seed 002's failure: a ReadWriteMany driver that applies no fsGroup leaves a fresh export
/// owned by root (0755), where a non-root writer gets EACCES; the decision's writer identity
/// `root` runs the writer as uid 0 (capabilities still dropped: it owns the export) and the
/// download lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_writer_fills_a_root_owned_export() {
    end_to_end(
        TestCsiDriver::RootOwnedFs,
        None,
        WriterIdentity::Root,
        Some("0"),
        1,
    )
    .await;
}

/// The negative control of the one above: a catalog that (wrongly) says fsGroup for the
/// root-owned export makes the non-root writer fail with EACCES, and the binding reports the
/// download's own words (the writer cannot even leave a failure marker there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_root_writer_on_a_root_owned_export_fails_with_its_last_words() {
    end_to_end(
        TestCsiDriver::RootOwnedFs,
        Some("fsGroup"),
        WriterIdentity::FsGroup,
        None,
        1,
    )
    .await;
}

/// `writer_uid`: the uid the writer must run as and succeed; `None`: the download must fail.
/// `namespaces`: how many namespaces read the model; more than one share a sharing domain
/// (helmModelCache), the first admits first.
async fn end_to_end(
    driver: TestCsiDriver,
    catalog_identity: Option<&str>,
    identity: WriterIdentity,
    writer_uid: Option<&str>,
    namespaces: usize,
) {
    let _one = ONE_CLASS.lock().await;
    let node = RealNode::shared().await.unwrap();
    let plane = ControlPlane::shared().await.unwrap();
    let control = TestNamespace::new("mcb-node-ctl").await.unwrap();
    let mut apps = Vec::new();
    for _ in 0..namespaces {
        apps.push(TestNamespace::new("mcb-node-app").await.unwrap());
    }
    let app = &apps[0];
    let client = app.client.clone();
    if namespaces > 1 {
        let domain = format!("domain-{}", control.name);
        for ns in &apps {
            Api::<Namespace>::all(client.clone())
                .patch(
                    &ns.name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "metadata": { "labels": {
                        warmcache_api_modelcache::SHARING_DOMAIN_LABEL: domain,
                    } } })),
                )
                .await
                .unwrap();
        }
    }

    // nvcf-sc on the test driver (created here unless another test left one of the same
    // provisioner), its CSIDriver and a catalog entry: the decision is rwxReadOnly, fsGroup.
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
    let (nvcf_sc, created_class) = match classes.create(&PostParams::default(), &wanted_class).await
    {
        Ok(sc) => (sc, true),
        Err(_) => {
            let sc = classes.get(MODEL_CACHE_STORAGE_CLASS).await.unwrap();
            assert_eq!(
                sc.provisioner, test_class.provisioner,
                "a foreign nvcf-sc exists"
            );
            (sc, false)
        }
    };
    let csi_driver = Api::<CSIDriver>::all(client.clone())
        .get(driver.driver_name())
        .await
        .unwrap();
    let catalog = CatalogSnapshot::from_payload(&catalog(driver, catalog_identity)).unwrap();
    let storage = StorageInputs {
        storage_class: Some(&nvcf_sc),
        csi_driver: Some(&csi_driver),
        catalog: CatalogInput::Loaded(&catalog),
        gates: Gates {
            caching_support: true,
            helm_model_caching: true,
            model_cache_encryption: false,
        },
    };

    // The real controller, in process, on this test's control namespace.
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
                    ..WriterOptions::default()
                },
                ..LifecycleConfig::default()
            },
        },
    )
    .unwrap();
    let stop = runtime.shutdown_token();
    let task = tokio::spawn(runtime.run());

    // The first admission creates the binding (what the webhook stores); each reader is the
    // rewrite of a later admission in its namespace, which joins it.
    let source: Pod = serde_saphyr::from_str(VLLM_POD).unwrap();
    let options = Options {
        control_namespace: control.name.clone(),
        ..Options::default()
    };
    let mut stored = None;
    let mut readers = Vec::new();
    for ns in &apps {
        let namespace_labels: BTreeMap<String, String> = Api::<Namespace>::all(client.clone())
            .get(&ns.name)
            .await
            .unwrap()
            .metadata
            .labels
            .unwrap_or_default();
        let req = Request {
            pod: &source,
            namespace: &ns.name,
            namespace_labels: &namespace_labels,
            leader_worker_set: None,
            traceparent: None,
            options: &options,
        };
        let binding = match stored.take() {
            Some(b) => b,
            None => {
                let Verdict::Rewrite(first) = admit(&req, |_, _| None, &storage) else {
                    panic!("the vLLM pod was not rewritten");
                };
                assert_eq!(first.transition, Transition::RwxReadOnly);
                let BindingAction::Create(wanted) = first.binding.clone() else {
                    panic!("no binding exists yet");
                };
                assert_eq!(wanted.spec.decision.writer_identity, Some(identity));
                let workflow = if namespaces > 1 {
                    Workflow::HelmModelCache
                } else {
                    Workflow::RegularModelCache
                };
                assert_eq!(wanted.spec.identity.workflow, workflow);
                control
                    .api::<ModelCacheBinding>()
                    .create(&PostParams::default(), &wanted)
                    .await
                    .unwrap()
            }
        };
        let Verdict::Rewrite(reader) = admit(&req, |_, _| Some(&binding), &storage) else {
            panic!("the reader in {} was not rewritten", ns.name);
        };
        assert!(
            matches!(&reader.binding, BindingAction::Join { name, .. } if *name == binding.name_any()),
            "the reader in {} joins the binding: {:?}",
            ns.name,
            reader.binding
        );
        let engine = reader.pod.spec.as_ref().unwrap().containers[reader.plan.main_container()]
            .name
            .clone();
        let mut pod = for_the_test_node(&reader.pod, &engine, reader.plan.landing());
        pod.metadata.name = Some("qwen3-reader".into());
        ns.api::<Pod>()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
        readers.push((reader.pod, engine));
        stored = Some(binding);
    }
    let bindings: Api<ModelCacheBinding> = control.api();
    let binding_name = stored.unwrap().name_any();

    // The controller does the rest: Ready, with the bytes the writer measured.
    let ready = eventually("the binding Ready", TIMEOUT, || {
        let bindings = bindings.clone();
        let name = binding_name.clone();
        async move {
            let b = bindings.get(&name).await.ok()?;
            let r = b.status.as_ref()?.realized.as_ref()?;
            match r.population_state {
                Some(PopulationState::Ready) => Some(Ok(b)),
                Some(PopulationState::Failed) => Some(Err(b)),
                _ => None,
            }
        }
    })
    .await
    .unwrap();
    let Some(writer_uid) = writer_uid else {
        let failed = ready.expect_err("the download must fail");
        let degraded = failed
            .status
            .as_ref()
            .unwrap()
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded")
            .unwrap();
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "DownloadFailed")
        );
        assert!(
            degraded.message.contains("Permission denied"),
            "the last words of the download: {}",
            degraded.message
        );
        let pv = failed
            .status
            .as_ref()
            .unwrap()
            .realized
            .as_ref()
            .unwrap()
            .bound_persistent_volume_name
            .clone()
            .unwrap();
        let primary = Api::<PersistentVolume>::all(client.clone())
            .get(&pv)
            .await
            .unwrap();
        assert!(!primary.labels().contains_key(COMPLETE_LABEL));
        finish(
            stop,
            task,
            &bindings,
            &binding_name,
            &classes,
            created_class,
            apps,
            control,
        )
        .await;
        return;
    };
    let ready = ready.unwrap_or_else(|b| panic!("the download failed: {:?}", b.status));
    let realized = ready.status.as_ref().unwrap().realized.clone().unwrap();
    let bytes = realized.bytes.unwrap();
    assert!(bytes >= 65536, "{realized:?}");
    let pv_name = realized.bound_persistent_volume_name.clone().unwrap();
    let primary = Api::<PersistentVolume>::all(client.clone())
        .get(&pv_name)
        .await
        .unwrap();
    assert_eq!(
        primary.labels().get(COMPLETE_LABEL).map(String::as_str),
        Some("true")
    );
    let handle = primary
        .spec
        .as_ref()
        .unwrap()
        .csi
        .as_ref()
        .unwrap()
        .volume_handle
        .clone();
    let volume_dir = node.csi_volume_dir(driver, &handle);
    assert_eq!(
        std::fs::read_to_string(volume_dir.join(COMPLETE_MARKER)).unwrap(),
        bytes.to_string(),
        "the wrapper wrote the byte count into the marker"
    );

    // The writer ran as the decision's identity.
    let jobs_pods = Api::<Pod>::namespaced(client.clone(), &app.name)
        .list(&kube::api::ListParams::default().labels("nvsnap.io/role=writer"))
        .await
        .unwrap();
    let writer = jobs_pods.items.first().expect("the writer Job's pod");
    let log = Api::<Pod>::namespaced(client.clone(), &app.name)
        .logs(&writer.name_any(), &kube::api::LogParams::default())
        .await
        .unwrap();
    assert!(
        log.contains(&format!("downloaded as {writer_uid}:")),
        "the writer runs as uid {writer_uid}:\n{log}"
    );

    // One download: one writer Job, in the first namespace; none in the others.
    for (i, ns) in apps.iter().enumerate() {
        let jobs = ns
            .api::<Job>()
            .list(&kube::api::ListParams::default())
            .await
            .unwrap();
        assert_eq!(jobs.items.len(), usize::from(i == 0), "Jobs in {}", ns.name);
    }

    // Each reader: the wait exits 0 on the marker, the engine reads the Job's bytes through its
    // namespace's own view, and every write through the landing fails with EROFS.
    let mut view_pvs = Vec::new();
    for (ns, (rendered, engine)) in apps.iter().zip(&readers) {
        let done = wait_pod_finished(&ns.api::<Pod>(), "qwen3-reader", TIMEOUT)
            .await
            .unwrap();
        assert_eq!(
            state_exit(&done, WAIT_CONTAINER),
            Some(0),
            "{:?}",
            done.status
        );
        let report = termination_message(&done, engine).unwrap();
        eprintln!("reader report in {}:\n{report}", ns.name);
        let read = report
            .lines()
            .find_map(|l| l.strip_prefix("read="))
            .unwrap();
        assert_eq!(
            read, CONFIG_JSON,
            "the engine in {} reads what the writer Job wrote",
            ns.name
        );
        let mount = report
            .lines()
            .find_map(|l| l.strip_prefix("mount="))
            .unwrap();
        assert!(mount.split(',').any(|o| o == "ro"), "{mount}");
        let attempts: Vec<&str> = report.lines().filter(|l| l.contains(" rc=")).collect();
        assert_eq!(attempts.len(), 6, "{report}");
        for line in attempts {
            assert!(
                !line.contains(" rc=0 ") && line.contains("Read-only file system"),
                "a write through the landing was not refused with EROFS: {line}\n{report}"
            );
        }
        let claim = rendered
            .spec
            .as_ref()
            .unwrap()
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == MODEL_VOLUME)
            .and_then(|v| v.persistent_volume_claim.clone())
            .unwrap();
        let view = realized
            .views
            .iter()
            .find(|v| v.namespace == ns.name)
            .unwrap_or_else(|| panic!("no view of {} in {:?}", ns.name, realized.views));
        assert_eq!(
            claim.claim_name, view.persistent_volume_claim_name,
            "the pod reads the view the controller recorded for its namespace"
        );
        let bound = ns
            .api::<PersistentVolumeClaim>()
            .get(&claim.claim_name)
            .await
            .unwrap();
        assert_eq!(
            bound.spec.unwrap().volume_name.as_deref(),
            Some(view.persistent_volume_name.as_str()),
            "the claim in {} is bound to its own view",
            ns.name
        );
        view_pvs.push(view.persistent_volume_name.clone());
    }
    view_pvs.sort_unstable();
    view_pvs.dedup();
    assert_eq!(view_pvs.len(), namespaces, "one view PV per namespace");
    assert_eq!(realized.views.len(), namespaces, "{:?}", realized.views);
    assert!(!volume_dir.join("written-by-reader").exists());
    assert_eq!(
        std::fs::read_to_string(volume_dir.join("config.json"))
            .unwrap()
            .trim_end(),
        CONFIG_JSON
    );

    finish(
        stop,
        task,
        &bindings,
        &binding_name,
        &classes,
        created_class,
        apps,
        control,
    )
    .await;
}

#[allow(clippy::too_many_arguments)]
async fn finish(
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Result<(), warmcache_runtime::RuntimeError>>,
    bindings: &Api<ModelCacheBinding>,
    binding_name: &str,
    classes: &Api<StorageClass>,
    created_class: bool,
    apps: Vec<TestNamespace>,
    control: TestNamespace,
) {
    stop.cancel();
    let _ = task.await;
    bindings
        .patch(
            binding_name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .unwrap();
    if created_class {
        let _ = classes
            .delete(MODEL_CACHE_STORAGE_CLASS, &DeleteParams::default())
            .await;
    }
    for app in apps {
        app.cleanup().await;
    }
    control.cleanup().await;
}
