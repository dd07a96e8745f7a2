//! Black-box end-to-end scenarios (see `tests/`): the product as users install it, observed only
//! through the Kubernetes API and what the model sources served. No `cmd/*` crate is a
//! dependency.
//!
//! What the scenarios and the demo (`src/bin/demo.rs`, `hack/demo.sh`) share: the model the
//! simulated Hub serves and the workload of `examples/`, so the example a user reads is the one
//! CI runs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use warmcache_test_sources::content::Content;
use warmcache_test_sources::hub::{FileSpec, Hub, HubOptions, model_files};
use warmcache_testkit::{
    COMPONENT_BINARIES, ControlPlane, OtlpReceiver, PAUSE_IMAGE, PodNetwork, RealNode,
    TESTKIT_NAMESPACE_LABEL, TestCsiDriver, TestNamespace, built_binaries_dir, chart_dir,
    component_image, eventually, helm_binary, hf_client_image, model_clients_dir, namespace_report,
};

/// The repository `examples/llm-deployment.yaml` downloads.
pub const REPO: &str = "demo/llm";

/// The GPU resource the example requests (the test node advertises it as an extended resource).
pub const GPU: &str = "nvidia.com/gpu";

/// The label `examples/llm-deployment.yaml`'s pods carry.
pub const APP_SELECTOR: &str = "app=llm";

/// `examples/` of this workspace.
pub fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// [`REPO`]'s files, about `weight_bytes` of weights in four shards, and its `SHA256SUMS`, which
/// the example's stand-in engine checks before it is Ready.
pub fn model(weight_bytes: u64) -> Vec<FileSpec> {
    model_version("demo", weight_bytes)
}

/// [`model`] with other bytes for another `version` (another commit of [`REPO`]), its own
/// `SHA256SUMS` with it.
pub fn model_version(version: &str, weight_bytes: u64) -> Vec<FileSpec> {
    let mut files = model_files(REPO, version, weight_bytes, 4);
    // One line per file, each ending in a newline (busybox sha256sum reads an empty last line
    // as a malformed entry, so there is none).
    let sums: String = files
        .iter()
        .map(|f| format!("{}  {}\n", f.content.sha256(), f.path))
        .collect();
    files.push(FileSpec {
        path: "SHA256SUMS".to_owned(),
        content: Content::Literal(sums.into_bytes().into()),
        lfs: false,
    });
    files
}

/// `examples/llm-deployment.yaml` with its placeholders filled in: the Hub's `endpoint` and the
/// `hf_image` to run the client and the engine.
///
/// # Errors
///
/// The file cannot be read or is not one Deployment.
pub fn example_deployment(endpoint: &str, hf_image: &str) -> Result<Deployment, String> {
    let path = examples_dir().join("llm-deployment.yaml");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("reading {}: {e}", path.display()))?
        .replace("HF_ENDPOINT_URL", endpoint)
        .replace("HF_CLIENT_IMAGE", hf_image);
    let mut documents =
        warmcache_cli::yaml::documents(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if documents.len() != 1 {
        return Err(format!(
            "{} holds {} documents, not one Deployment",
            path.display(),
            documents.len()
        ));
    }
    serde_json::from_value(documents.remove(0)).map_err(|e| format!("{}: {e}", path.display()))
}

/// How [`install`] installs the product on the test node.
#[derive(Debug, Clone)]
pub struct Install<'a> {
    /// Repository and tag of the product's image, built from `bin_dir`'s component binaries.
    pub image_repository: &'a str,
    pub image_tag: &'a str,
    /// The directory holding the component binaries ([`warmcache_testkit::COMPONENT_BINARIES`]).
    pub bin_dir: &'a Path,
    /// The hf-client image's reference (the example's client and engine).
    pub hf_image: &'a str,
    /// GPUs the node advertises ([`GPU`], an extended resource, as a device plugin would).
    pub gpus: u32,
    /// The admin kubeconfig helm uses.
    pub kubeconfig: &'a Path,
    /// Where images are put together.
    pub work_dir: &'a Path,
    /// The OTLP/gRPC collector the components export traces to (`otel.endpoint`); none when
    /// `None`.
    pub otel_endpoint: Option<&'a str>,
    /// More `--set` values for `helm install` (`key=value`), after the ones the node needs.
    pub extra_sets: &'a [&'a str],
    /// The storage `nvcf-sc` is on, and the catalog qualifies.
    pub storage: Storage,
    /// Whether the chart's node agent DaemonSet runs on the node (it always does for
    /// [`Storage::NamespacedBlock`]): captures after Ready need it on either storage.
    pub node_agent: bool,
}

/// The storage [`install`] puts StorageClass `nvcf-sc` on, on the test node, and qualifies in
/// the catalog ConfigMap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Storage {
    /// The test CSI driver's shared-filesystem profile ([`TestCsiDriver::SharedFs`]), qualified
    /// for ReadWriteMany: the `rwxReadOnly` flow.
    #[default]
    SharedFs,
    /// The test CSI driver's namespaced-block profile ([`TestCsiDriver::NamespacedBlock`]:
    /// NVMesh-style handles `<volume>:<namespace>`, real VolumeAttachments, one read-write
    /// attachment at a time), qualified as provider `nvmesh` with ReadWriteOnce and ReadOnlyMany
    /// and reader mount option `ro`: the `roxReadOnly` flow. The chart's node agent DaemonSet is
    /// switched on for it (`modelVolumeController.enabled=true`, its kubelet root the node's),
    /// in a release namespace that allows Pod Security `privileged`, as docs/install.md says.
    NamespacedBlock,
}

impl Storage {
    /// The test CSI driver instance.
    pub fn driver(self) -> TestCsiDriver {
        match self {
            Storage::SharedFs => TestCsiDriver::SharedFs,
            Storage::NamespacedBlock => TestCsiDriver::NamespacedBlock,
        }
    }

    /// The driver's entry of the catalog ConfigMap (`drivers:` list item).
    fn catalog_entry(self) -> String {
        let driver = self.driver().driver_name();
        match self {
            Storage::SharedFs => format!(
                "  - name: {driver}\n    provider: testSharedFs\n    accessModes: [ReadWriteMany]\n    readerMountOptions: []\n"
            ),
            Storage::NamespacedBlock => format!(
                "  - name: {driver}\n    provider: nvmesh\n    accessModes: [ReadWriteOnce, ReadOnlyMany]\n    readerMountOptions: [ro]\n"
            ),
        }
    }
}

/// The node agent's DaemonSet (`modelVolumeController.enabled=true`).
pub const AGENT_DAEMON_SET: &str = "warmcache-model-volume-controller";

/// The control namespace the chart's components use (`controlNamespace.name`'s default).
pub const CONTROL: &str = "nvca-modelcache-init";

/// The product's image the scenarios build and import (the tag is the scenario's own).
pub const IMAGE_REPOSITORY: &str = "warmcache.test/warmcache";

/// The hf-client image the example's client and engine run.
pub const HF_IMAGE: &str = "warmcache.test/hf-client:1";

/// The ModelCacheBindings of [`CONTROL`], as the black box sees them (no product crate).
pub fn bindings_api(client: &kube::Client) -> Api<kube::api::DynamicObject> {
    let gvk =
        kube::core::GroupVersionKind::gvk("nvca.nvcf.nvidia.io", "v2beta1", "ModelCacheBinding");
    Api::namespaced_with(
        client.clone(),
        CONTROL,
        &kube::core::ApiResource::from_gvk(&gvk),
    )
}

/// The release and its namespace.
pub const RELEASE: &str = "warmcache";
pub const NAMESPACE: &str = "warmcache-system";

/// Installs the product on the test node as a user with their own qualified driver does: the
/// product's and the hf client's images imported (no registry), the node's GPUs advertised, the
/// release namespace with a catalog ConfigMap qualifying the test driver's profile of
/// [`Install::storage`] (the shared file system for ReadWriteMany, or namespaced block storage
/// for roxReadOnly with the node agent), `helm install` with StorageClass `nvcf-sc` on that
/// driver, and waits until the webhook and the binding controller (and the node agent) are Ready
/// (the pod network `net` bridges their Services).
///
/// # Errors
///
/// What failed, in words; for components that never became Ready, with the release namespace's
/// report.
pub async fn install(
    plane: &ControlPlane,
    node: &RealNode,
    net: &PodNetwork,
    how: &Install<'_>,
) -> Result<(), String> {
    let client = plane.client().await.map_err(|e| e.to_string())?;
    let image = component_image(
        &format!("{}:{}", how.image_repository, how.image_tag),
        how.bin_dir,
        &COMPONENT_BINARIES,
    )
    .map_err(|e| format!("{e} (build the component binaries first: cargo build --bins)"))?
    .build(how.work_dir)
    .map_err(|e| e.to_string())?;
    node.import_image(&image).await.map_err(|e| e.to_string())?;
    let clients = model_clients_dir().map_err(|e| e.to_string())?;
    let hf = hf_client_image(how.hf_image, &clients, how.work_dir)
        .and_then(|i| i.build(how.work_dir))
        .map_err(|e| e.to_string())?;
    node.import_image(&hf).await.map_err(|e| e.to_string())?;

    let gpus = how.gpus.to_string();
    Api::<Node>::all(client.clone())
        .patch_status(
            node.name(),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"capacity": {GPU: gpus}, "allocatable": {GPU: gpus}}})),
        )
        .await
        .map_err(|e| format!("advertising the node's GPUs: {e}"))?;

    // The node agent is privileged: with it, the release namespace allows Pod Security
    // "privileged" from its creation, as docs/install.md asks.
    let block = how.storage == Storage::NamespacedBlock;
    let agent = block || how.node_agent;
    let labels = if agent {
        json!({"pod-security.kubernetes.io/enforce": "privileged"})
    } else {
        json!({})
    };
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": NAMESPACE, "labels": labels}}))
            .map_err(|e| e.to_string())?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .map_err(|e| format!("creating namespace {NAMESPACE}: {e}"))?;
    let driver = how.storage.driver().driver_name();
    let catalog = format!(
        "apiVersion: storage.nvcf.nvidia.com/v1alpha1\nkind: StorageCapabilityCatalog\n\
         drivers:\n{}",
        how.storage.catalog_entry()
    );
    let config_map: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "nvcf-storage-capabilities"},
        "data": {"storage-provider-capabilities.yaml": catalog},
    }))
    .map_err(|e| e.to_string())?;
    Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &config_map)
        .await
        .map_err(|e| format!("creating the catalog ConfigMap: {e}"))?;

    // The install, as docs/install.md gives it, with what this node needs.
    let sets = [
        format!("image.repository={}", how.image_repository),
        format!("image.tag={}", how.image_tag),
        "image.pullPolicy=Never".to_owned(),
        // The kit installed the CRDs from config/crd (the same files).
        "crds.enabled=false".to_owned(),
        "catalog.enabled=false".to_owned(),
        "storageClass.create=true".to_owned(),
        format!("storageClass.provisioner={driver}"),
        "kvcacheOperator.enabled=false".to_owned(),
        "webhook.replicas=1".to_owned(),
    ];
    // Block storage: the kubelet applies fsGroup to a ReadWriteOnce volume only with an fsType
    // (the kit's own class of the profile says xfs too), and the node agent on this node: its
    // kubelet root, and the holder image the node has (every pod here says Never).
    let fs_type =
        block.then(|| "storageClass.parameters.csi\\.storage\\.k8s\\.io/fstype=xfs".to_owned());
    let agent_sets = if agent {
        vec![
            "modelVolumeController.enabled=true".to_owned(),
            format!(
                "modelVolumeController.kubeletRoot={}",
                node.dir().join("kubelet").display()
            ),
            format!("modelVolumeController.holderImage={PAUSE_IMAGE}"),
            "modelVolumeController.holderImagePullPolicy=Never".to_owned(),
        ]
    } else {
        Vec::new()
    };
    let sets: Vec<String> = sets
        .into_iter()
        .chain(fs_type)
        .chain(agent_sets)
        .chain(how.otel_endpoint.map(|e| format!("otel.endpoint={e}")))
        .chain(how.extra_sets.iter().map(|s| (*s).to_owned()))
        .collect();
    let mut args = vec![
        "install".to_owned(),
        RELEASE.to_owned(),
        chart_dir().display().to_string(),
        "--namespace".to_owned(),
        NAMESPACE.to_owned(),
    ];
    for s in sets {
        args.extend(["--set".to_owned(), s]);
    }
    if how.otel_endpoint.is_some() {
        // Exported within half a second, so a test sees the spans soon after the work.
        args.extend([
            "--set-string".to_owned(),
            "otel.env.OTEL_BSP_SCHEDULE_DELAY=500".to_owned(),
        ]);
    }
    helm(how.kubeconfig, &args)?;
    components_ready(&client, NAMESPACE)
        .await
        .map_err(|e| format!("{e}{}", net.report()))?;
    if agent {
        agent_ready(&client, NAMESPACE)
            .await
            .map_err(|e| format!("{e}{}", net.report()))?;
    }
    Ok(())
}

/// Waits until the node agent's DaemonSet ([`AGENT_DAEMON_SET`]) of the release in `namespace`
/// has a Ready pod on every node it wants.
///
/// # Errors
///
/// It did not within [`READY_TIMEOUT`]; with the namespace's report.
pub async fn agent_ready(client: &kube::Client, namespace: &str) -> Result<(), String> {
    use k8s_openapi::api::apps::v1::DaemonSet;
    let daemon_sets: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let up = eventually("the node agent Ready", READY_TIMEOUT, || {
        let daemon_sets = daemon_sets.clone();
        async move {
            let d = daemon_sets.get(AGENT_DAEMON_SET).await.ok()?;
            let s = d.status?;
            let want = s.desired_number_scheduled;
            (want >= 1 && s.number_ready == want && s.number_available == Some(want)).then_some(())
        }
    })
    .await;
    if up.is_err() {
        return Err(format!(
            "the node agent's DaemonSet {AGENT_DAEMON_SET} in {namespace} did not become Ready\n{}",
            namespace_report(client, namespace).await
        ));
    }
    Ok(())
}

/// Waits until the webhook and the binding controller of the release in `namespace` are Ready.
///
/// # Errors
///
/// They did not become Ready within [`READY_TIMEOUT`]; with the namespace's report.
pub async fn components_ready(client: &kube::Client, namespace: &str) -> Result<(), String> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let up = eventually("the components Ready", READY_TIMEOUT, || {
        let deployments = deployments.clone();
        async move {
            let mut all = true;
            for name in ["warmcache-webhook", "warmcache-binding-controller"] {
                let d = deployments.get(name).await.ok()?;
                all &= d.status.and_then(|s| s.ready_replicas).unwrap_or(0) >= 1;
            }
            all.then_some(())
        }
    })
    .await;
    if up.is_err() {
        return Err(format!(
            "the components (warmcache-webhook, warmcache-binding-controller) in {namespace} did \
             not become Ready\n{}",
            namespace_report(client, namespace).await
        ));
    }
    Ok(())
}

/// How long components and pods get to become Ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(420);

/// The annotation the webhook records the binding's name in, on every pod it rewrites.
pub const BINDING_ANNOTATION: &str = "nvca.nvcf.nvidia.io/model-cache-binding";

/// Whether `pod` is Ready.
pub fn is_ready(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until the webhook serves `workload`'s pods in `namespace`: the API server reaches it
/// through its Service and its caches see the catalog, so a dry run of the pod comes back
/// rewritten (nothing is stored).
///
/// # Errors
///
/// No dry run came back rewritten within two minutes.
pub async fn webhook_serving(
    client: &kube::Client,
    namespace: &str,
    workload: &Deployment,
) -> Result<(), String> {
    use k8s_openapi::api::core::v1::Pod;
    let probe = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some("probe".to_owned()),
            ..Default::default()
        },
        spec: workload.spec.template.spec.clone(),
        ..Pod::default()
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    // The last answer, for the message when none came back rewritten (a refusal names its
    // reason: an admission policy of the cluster, a quota).
    let last = std::sync::Mutex::new(String::from("no answer"));
    let rewritten = eventually("a dry-run pod rewritten", Duration::from_secs(120), || {
        let (pods, probe, dry_run, last) = (pods.clone(), probe.clone(), dry_run.clone(), &last);
        async move {
            let admitted = match pods.create(&dry_run, &probe).await {
                Ok(admitted) => admitted,
                Err(e) => {
                    if let Ok(mut last) = last.lock() {
                        *last = format!("refused: {e}");
                    }
                    return None;
                }
            };
            let rewritten =
                kube::ResourceExt::annotations(&admitted).contains_key(BINDING_ANNOTATION);
            if !rewritten && let Ok(mut last) = last.lock() {
                *last = format!(
                    "admitted unmodified, annotations {:?}",
                    kube::ResourceExt::annotations(&admitted)
                );
            }
            rewritten.then_some(())
        }
    })
    .await;
    rewritten.map_err(|_| {
        format!(
            "the webhook never rewrote a dry-run pod in {namespace}; the last answer: {}",
            last.lock().map(|l| l.clone()).unwrap_or_default()
        )
    })
}

/// How many of the example's pods ([`APP_SELECTOR`]) in `namespaces` are Ready; `None` when a
/// list fails.
pub async fn ready_pods(client: &kube::Client, namespaces: &[String]) -> Option<usize> {
    use k8s_openapi::api::core::v1::Pod;
    let mut count = 0;
    for ns in namespaces {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let list = pods
            .list(&kube::api::ListParams::default().labels(APP_SELECTOR))
            .await
            .ok()?;
        count += list.items.iter().filter(|p| is_ready(p)).count();
    }
    Some(count)
}

/// The label the binding controller puts on a complete primary PV.
pub const COMPLETE_LABEL: &str = "nvsnap.io/model-complete";

/// The example's pods ([`APP_SELECTOR`]) of `pods`' namespace that are not being deleted;
/// `None` when the list fails.
pub async fn app_pods(
    pods: &Api<k8s_openapi::api::core::v1::Pod>,
) -> Option<Vec<k8s_openapi::api::core::v1::Pod>> {
    Some(
        pods.list(&kube::api::ListParams::default().labels(APP_SELECTOR))
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect(),
    )
}

/// The primary PV `primary` once it is Released (its claim gone), checked to be kept as the
/// data's owner keeps it: reclaim policy `Retain`, labelled complete ([`COMPLETE_LABEL`]).
///
/// # Errors
///
/// What is not so, with `namespace`'s [`Started::report`].
pub async fn kept_primary(
    started: &Started,
    primary: &str,
    namespace: &str,
) -> Result<k8s_openapi::api::core::v1::PersistentVolume, String> {
    use k8s_openapi::api::core::v1::PersistentVolume;
    let client = &started.client;
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let released = eventually("the primary Released", Duration::from_secs(60), || {
        let volumes = volumes.clone();
        async move {
            let pv = volumes.get_opt(primary).await.ok()??;
            (pv.status.as_ref()?.phase.as_deref() == Some("Released")).then_some(pv)
        }
    })
    .await;
    let Ok(kept) = released else {
        return Err(format!(
            "the primary PV {primary} is not kept Released: {:?}\n{}",
            volumes.get_opt(primary).await,
            started.report(&[namespace]).await
        ));
    };
    let policy = kept
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref());
    let complete = kube::ResourceExt::labels(&kept)
        .get(COMPLETE_LABEL)
        .map(String::as_str);
    if policy != Some("Retain") || complete != Some("true") {
        return Err(format!(
            "the primary PV {primary} is Released but not kept (reclaim policy {policy:?}, {COMPLETE_LABEL}={complete:?}): {kept:?}"
        ));
    }
    Ok(kept)
}

// ---------------------------------------------------------------------------------------------
// The scenarios' setup: on the test kit's real node (default) or on a cluster (`E2E_KUBECONFIG`).
// ---------------------------------------------------------------------------------------------

/// When set, the scenarios run against the cluster of this kubeconfig and simulate nothing
/// (docs/e2e-on-a-cluster.md).
pub const ENV_KUBECONFIG: &str = "E2E_KUBECONFIG";
/// Cluster mode: the Hugging Face endpoint the pods download from (`HF_ENDPOINT`). Required.
pub const ENV_MODEL_ENDPOINT: &str = "E2E_MODEL_ENDPOINT";
/// Cluster mode: the repository to download (default [`REPO`]); it must hold a `SHA256SUMS`
/// of its files, which the example's engine checks.
pub const ENV_MODEL_REPO: &str = "E2E_MODEL_REPO";
/// Cluster mode: the revision to download (`hf download --revision`); the default branch when
/// unset.
pub const ENV_MODEL_REVISION: &str = "E2E_MODEL_REVISION";
/// Cluster mode: an image with the `hf` CLI and busybox's `sh`/`sha256sum` (the example's
/// client and engine). Required.
pub const ENV_HF_IMAGE: &str = "E2E_HF_IMAGE";
/// Cluster mode: the pods' `imagePullPolicy` (default `IfNotPresent`).
pub const ENV_IMAGE_PULL_POLICY: &str = "E2E_IMAGE_PULL_POLICY";
/// Cluster mode: the release's namespace (default [`NAMESPACE`]).
pub const ENV_RELEASE_NAMESPACE: &str = "E2E_RELEASE_NAMESPACE";
/// Cluster mode: `true` to `helm install` release [`RELEASE`] for the scenario (and uninstall
/// it when the scenario passes); otherwise (default) the release must be installed and Ready.
pub const ENV_HELM_INSTALL: &str = "E2E_HELM_INSTALL";
/// Cluster mode with [`ENV_HELM_INSTALL`]: the product image's repository and tag.
pub const ENV_IMAGE_REPOSITORY: &str = "E2E_IMAGE_REPOSITORY";
pub const ENV_IMAGE_TAG: &str = "E2E_IMAGE_TAG";
/// Cluster mode with [`ENV_HELM_INSTALL`]: more values, one `helm --set` argument
/// (`a=b,c=d`), and a values file (`helm -f`), for what the cluster needs (storage, catalog).
pub const ENV_HELM_SETS: &str = "E2E_HELM_SETS";
pub const ENV_HELM_VALUES: &str = "E2E_HELM_VALUES";

/// One scenario's setup, in either mode:
///
/// - default: the test kit's control plane and real node, the simulated Hub on loopback
///   ([`Scenario::model`]), the kit's `PodNetwork`, the images built and imported, the node's
///   GPUs advertised, and the chart installed by [`install`];
/// - `E2E_KUBECONFIG` set: that cluster, nothing simulated; what the scenario needs comes from
///   the `E2E_*` variables above, and a scenario that needs the simulation fails at
///   [`Scenario::start`] saying so.
#[derive(Debug, Clone)]
pub struct Scenario {
    name: String,
    gpus: u32,
    hub_options: HubOptions,
    model: Option<Vec<FileSpec>>,
    otlp: bool,
    extra_sets: Vec<String>,
    image_tag: String,
    storage: Storage,
    node_agent: bool,
    needs_simulated_hub: Option<String>,
    needs_test_node: Option<String>,
    needs_own_release: Option<String>,
}

impl Scenario {
    /// A scenario called `name` (in its messages), with no GPU, no Hub and the chart's defaults.
    pub fn new(name: &str) -> Self {
        Scenario {
            name: name.to_owned(),
            gpus: 0,
            hub_options: HubOptions::default(),
            model: None,
            otlp: false,
            extra_sets: Vec::new(),
            image_tag: "e2e".to_owned(),
            storage: Storage::SharedFs,
            node_agent: false,
            needs_simulated_hub: None,
            needs_test_node: None,
            needs_own_release: None,
        }
    }

    /// The [`GPU`]s the scenario's pods hold at once: advertised by the test node; on a cluster,
    /// checked free before the scenario starts.
    pub fn gpus(mut self, gpus: u32) -> Self {
        self.gpus = gpus;
        self
    }

    /// The model source: the simulated Hub serving [`REPO`] with `files`; on a cluster, the
    /// model of `E2E_MODEL_ENDPOINT`/`E2E_MODEL_REPO`/`E2E_MODEL_REVISION`.
    pub fn model(mut self, files: Vec<FileSpec>) -> Self {
        self.model = Some(files);
        self
    }

    /// A simulated Hub with `options` and nothing published (the scenario publishes through
    /// [`Started::hub`]); implies [`needs_simulated_hub`](Self::needs_simulated_hub).
    pub fn simulated_hub(mut self, options: HubOptions, why: &str) -> Self {
        self.hub_options = options;
        self.needs_simulated_hub(why)
    }

    /// The scenario reads or steers the simulated Hub (byte counts as the measurement, injected
    /// failures, moved tags, a rate limit): on a cluster it fails at start, saying `why`.
    pub fn needs_simulated_hub(mut self, why: &str) -> Self {
        self.needs_simulated_hub = Some(why.to_owned());
        self
    }

    /// The scenario needs the test kit's node itself (its file system, images imported, the
    /// kit's DNS stand-in): on a cluster it fails at start, saying `why`.
    pub fn needs_test_node(mut self, why: &str) -> Self {
        self.needs_test_node = Some(why.to_owned());
        self
    }

    /// The scenario changes the release itself (`helm uninstall`): on a cluster it runs only
    /// with `E2E_HELM_INSTALL=true` (its own release), and fails at start otherwise.
    pub fn needs_own_release(mut self, why: &str) -> Self {
        self.needs_own_release = Some(why.to_owned());
        self
    }

    /// Traces: a real OTLP/gRPC receiver on loopback, bridged into the pods, as the chart's
    /// `otel.endpoint`. On a cluster there is none ([`Started::otlp`] is `None`): its pods
    /// cannot reach this machine's loopback.
    pub fn otlp(mut self) -> Self {
        self.otlp = true;
        self
    }

    /// More `helm --set` values (`key=value`) the scenario needs. On a cluster they are applied
    /// only to a release the scenario installs (`E2E_HELM_INSTALL=true`).
    pub fn extra_sets<S: AsRef<str>>(mut self, sets: &[S]) -> Self {
        self.extra_sets
            .extend(sets.iter().map(|s| s.as_ref().to_owned()));
        self
    }

    /// Block storage: StorageClass `nvcf-sc` on the test CSI driver's namespaced-block profile,
    /// qualified for the `roxReadOnly` flow, and the chart's node agent DaemonSet on the test
    /// node ([`Storage::NamespacedBlock`]). On a cluster it fails at start: that profile and the
    /// agent's kubelet root are the test node's (a cluster's block storage is its own, and its
    /// release already says whether the agent runs).
    pub fn block_storage(mut self) -> Self {
        self.storage = Storage::NamespacedBlock;
        self
    }

    /// The chart's node agent DaemonSet on the node, whatever the storage (captures after Ready
    /// need it on shared filesystems too). On a cluster the release must run it already (or
    /// [`ENV_HELM_INSTALL`] installs it with [`ENV_HELM_SETS`] saying so): the scenario checks
    /// at start that its DaemonSet is Ready and fails naming it otherwise.
    pub fn node_agent(mut self) -> Self {
        self.node_agent = true;
        self
    }

    /// The tag of the product image built on the test node (default `e2e`).
    pub fn image_tag(mut self, tag: &str) -> Self {
        tag.clone_into(&mut self.image_tag);
        self
    }

    /// Whether the pods download a model: [`model`](Self::model) gave one, or the scenario
    /// steers the simulated Hub.
    fn has_model_source(&self) -> bool {
        self.model.is_some() || self.needs_simulated_hub.is_some()
    }

    /// Sets everything up, in the mode `E2E_KUBECONFIG` chooses.
    ///
    /// # Errors
    ///
    /// What failed, in words; on a cluster, also what the scenario cannot do there and which
    /// variable is missing.
    pub async fn start(self) -> Result<Started, String> {
        match std::env::var_os(ENV_KUBECONFIG) {
            Some(path) if !path.is_empty() => self.start_on_cluster(PathBuf::from(path)).await,
            _ => self.start_simulated().await,
        }
    }

    async fn start_simulated(self) -> Result<Started, String> {
        let e = |e: warmcache_testkit::TestkitError| format!("scenario {}: {e}", self.name);
        let plane = ControlPlane::shared().await.map_err(e)?;
        let node = RealNode::shared().await.map_err(e)?;
        let client = plane.client().await.map_err(e)?;

        // The model source, reachable from pods at the address it has here.
        let mut egress = Vec::new();
        let mut model_bytes = None;
        let (hub, endpoint) = if self.has_model_source() {
            let hub = Hub::new(self.hub_options.clone());
            if let Some(files) = self.model.clone() {
                model_bytes = Some(files.iter().map(|f| f.content.len()).sum());
                hub.publish(REPO, files)
                    .map_err(|e| format!("publishing {REPO}: {e}"))?;
            }
            let addr = hub
                .serve_loopback()
                .await
                .map_err(|e| format!("serving the Hub: {e}"))?;
            egress.push(addr);
            (Some(hub), format!("http://{addr}"))
        } else {
            (None, String::new())
        };
        // The traces' collector: real OTLP/gRPC, reached from the pods like the Hub.
        let otlp = if self.otlp {
            let otlp = OtlpReceiver::start().await.map_err(e)?;
            let addr = otlp
                .endpoint()
                .trim_start_matches("http://")
                .parse()
                .map_err(|e| format!("the OTLP receiver's address: {e}"))?;
            egress.push(addr);
            Some(otlp)
        } else {
            None
        };
        let net = PodNetwork::on_node(plane, node, &egress)
            .await
            .map_err(|e| format!("scenario {}: the pod network: {e}", self.name))?;

        // The product on the node, as a user installs it (images imported, the node's GPUs, a
        // catalog qualifying the test driver, helm install).
        let work = tempfile::tempdir().map_err(|e| format!("a work directory: {e}"))?;
        let bin_dir = built_binaries_dir().map_err(e)?;
        let otel_endpoint = otlp.as_ref().map(OtlpReceiver::endpoint);
        let sets: Vec<&str> = self.extra_sets.iter().map(String::as_str).collect();
        let how = Install {
            image_repository: IMAGE_REPOSITORY,
            image_tag: &self.image_tag,
            bin_dir: &bin_dir,
            hf_image: HF_IMAGE,
            gpus: self.gpus,
            kubeconfig: plane.kubeconfig_path(),
            work_dir: work.path(),
            otel_endpoint: otel_endpoint.as_deref(),
            extra_sets: &sets,
            storage: self.storage,
            node_agent: self.node_agent,
        };
        install(plane, node, &net, &how)
            .await
            .map_err(|e| format!("scenario {}: {e}", self.name))?;
        Ok(Started {
            name: self.name,
            client,
            kubeconfig: plane.kubeconfig_path().to_owned(),
            endpoint,
            hf_image: HF_IMAGE.to_owned(),
            pull_policy: "Never".to_owned(),
            release_namespace: NAMESPACE.to_owned(),
            model_repo: REPO.to_owned(),
            model_revision: None,
            otlp,
            hub,
            model_bytes,
            sim: Some(Simulation { node, net }),
            own_release: false,
            created: std::sync::Mutex::new(Vec::new()),
            work,
        })
    }

    /// Why this scenario cannot run in the mode the environment chooses (it needs the
    /// simulation, or a release of its own on a cluster); `None` when it can. [`start`](Self::start)
    /// fails with it; a scenario may ask first, before its own preparations.
    pub fn refusal(&self) -> Option<String> {
        let kubeconfig = env_opt(ENV_KUBECONFIG)?;
        let name = &self.name;
        let not_here = |why: String| {
            format!(
                "scenario {name}: {why}; it does not apply to {ENV_KUBECONFIG}={kubeconfig} \
                 (nothing is simulated there). Unset {ENV_KUBECONFIG} to run it on the test \
                 kit's real node; see docs/e2e-on-a-cluster.md for the scenarios that run on a \
                 cluster"
            )
        };
        if self.storage == Storage::NamespacedBlock {
            return Some(not_here(
                "it needs the test kit's node (its storage is the test CSI driver's \
                 namespaced-block profile, with the chart's node agent pointed at the node's \
                 kubelet root)"
                    .to_owned(),
            ));
        }
        if let Some(why) = &self.needs_test_node {
            return Some(not_here(format!("it needs the test kit's node ({why})")));
        }
        if let Some(why) = &self.needs_simulated_hub {
            return Some(not_here(format!("it needs the simulated Hub ({why})")));
        }
        let own_release = match own_release() {
            Ok(own) => own,
            Err(e) => return Some(e),
        };
        if !own_release {
            if let Some(why) = &self.needs_own_release {
                return Some(format!(
                    "scenario {name} {why}, so on a cluster it needs a release of its own: set \
                     {ENV_HELM_INSTALL}=true (with {ENV_IMAGE_REPOSITORY}, {ENV_IMAGE_TAG} and \
                     what the cluster needs in {ENV_HELM_SETS}/{ENV_HELM_VALUES})"
                ));
            }
            if !self.extra_sets.is_empty() {
                return Some(format!(
                    "scenario {name} needs the chart values {:?}, which an existing release need \
                     not have: set {ENV_HELM_INSTALL}=true so that it installs its own release \
                     with them (with {ENV_IMAGE_REPOSITORY}, {ENV_IMAGE_TAG} and what the \
                     cluster needs in {ENV_HELM_SETS}/{ENV_HELM_VALUES})",
                    self.extra_sets
                ));
            }
        }
        None
    }

    async fn start_on_cluster(self, kubeconfig: PathBuf) -> Result<Started, String> {
        let name = self.name.clone();
        if let Some(refusal) = self.refusal() {
            return Err(refusal);
        }
        let own_release = own_release()?;
        let release_namespace =
            env_opt(ENV_RELEASE_NAMESPACE).unwrap_or_else(|| NAMESPACE.to_owned());
        let (endpoint, hf_image) = if self.has_model_source() {
            (
                required(ENV_MODEL_ENDPOINT, &name)?,
                required(ENV_HF_IMAGE, &name)?,
            )
        } else {
            (String::new(), String::new())
        };
        let model_repo = env_opt(ENV_MODEL_REPO).unwrap_or_else(|| REPO.to_owned());
        let model_revision = env_opt(ENV_MODEL_REVISION);
        let pull_policy =
            env_opt(ENV_IMAGE_PULL_POLICY).unwrap_or_else(|| "IfNotPresent".to_owned());

        let parsed = kube::config::Kubeconfig::read_from(&kubeconfig)
            .map_err(|e| format!("{ENV_KUBECONFIG}={}: {e}", kubeconfig.display()))?;
        let config = kube::Config::from_custom_kubeconfig(
            parsed,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| format!("{ENV_KUBECONFIG}={}: {e}", kubeconfig.display()))?;
        let client = kube::Client::try_from(config)
            .map_err(|e| format!("a client for {}: {e}", kubeconfig.display()))?;

        let work = tempfile::tempdir().map_err(|e| format!("a work directory: {e}"))?;
        if own_release {
            helm_install_on_cluster(&kubeconfig, &release_namespace, &self.extra_sets)?;
        }
        components_ready(&client, &release_namespace)
            .await
            .map_err(|e| {
                format!(
                    "scenario {name}: release {RELEASE} in {release_namespace} (set \
                     {ENV_RELEASE_NAMESPACE}, or {ENV_HELM_INSTALL}=true to install it): {e}"
                )
            })?;
        if self.node_agent {
            // A release without the agent has no DaemonSet to wait for: say so at once.
            let agent = Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(
                client.clone(),
                &release_namespace,
            )
            .get_opt(AGENT_DAEMON_SET)
            .await
            .map_err(|e| {
                format!("reading DaemonSet {release_namespace}/{AGENT_DAEMON_SET}: {e}")
            })?;
            if agent.is_none() {
                return Err(format!(
                    "scenario {name} needs the node agent: release {RELEASE} in \
                     {release_namespace} has no DaemonSet {AGENT_DAEMON_SET} (install it with \
                     modelVolumeController.enabled=true, or {ENV_HELM_INSTALL}=true with \
                     {ENV_HELM_SETS} saying so)"
                ));
            }
            agent_ready(&client, &release_namespace)
                .await
                .map_err(|e| {
                    format!(
                        "scenario {name} needs the node agent (DaemonSet {AGENT_DAEMON_SET}, \
                     modelVolumeController.enabled=true) on the nodes its pods run on: {e}"
                    )
                })?;
        }
        if self.gpus > 0 {
            let free = free_gpus(&client).await?;
            if free < u64::from(self.gpus) {
                return Err(format!(
                    "scenario {name} runs {} pods that each request one {GPU}; the cluster has \
                     {free} free (allocatable less what running pods request)",
                    self.gpus
                ));
            }
        }
        if self.otlp {
            eprintln!(
                "scenario {name}: traces are not checked on a cluster: its pods cannot reach an \
                 OTLP receiver on this machine's loopback"
            );
        }
        Ok(Started {
            name,
            client,
            kubeconfig,
            endpoint,
            hf_image,
            pull_policy,
            release_namespace,
            model_repo,
            model_revision,
            otlp: None,
            hub: None,
            model_bytes: None,
            sim: None,
            own_release,
            created: std::sync::Mutex::new(Vec::new()),
            work,
        })
    }
}

/// Whether `E2E_HELM_INSTALL` asks for a release of the scenario's own.
fn own_release() -> Result<bool, String> {
    match env_opt(ENV_HELM_INSTALL).as_deref() {
        None | Some("false" | "0") => Ok(false),
        Some("true" | "1") => Ok(true),
        Some(other) => Err(format!(
            "{ENV_HELM_INSTALL}={other}: expected true or false"
        )),
    }
}

fn env_opt(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn required(name: &str, scenario: &str) -> Result<String, String> {
    env_opt(name).ok_or_else(|| {
        format!(
            "scenario {scenario}: {name} is not set; with {ENV_KUBECONFIG} it is required (see \
             docs/e2e-on-a-cluster.md)"
        )
    })
}

/// `helm install` of [`RELEASE`] in `namespace` on a cluster: the image of `E2E_IMAGE_*`, the
/// values of `E2E_HELM_VALUES`/`E2E_HELM_SETS`, then the scenario's `extra_sets`.
fn helm_install_on_cluster(
    kubeconfig: &Path,
    namespace: &str,
    extra_sets: &[String],
) -> Result<(), String> {
    let repository = required(ENV_IMAGE_REPOSITORY, "install")?;
    let tag = required(ENV_IMAGE_TAG, "install")?;
    let mut args = vec![
        "install".to_owned(),
        RELEASE.to_owned(),
        chart_dir().display().to_string(),
        "--namespace".to_owned(),
        namespace.to_owned(),
        "--create-namespace".to_owned(),
        "--set".to_owned(),
        format!("image.repository={repository}"),
        "--set".to_owned(),
        format!("image.tag={tag}"),
    ];
    if let Some(values) = env_opt(ENV_HELM_VALUES) {
        args.extend(["-f".to_owned(), values]);
    }
    if let Some(sets) = env_opt(ENV_HELM_SETS) {
        args.extend(["--set".to_owned(), sets]);
    }
    for s in extra_sets {
        args.extend(["--set".to_owned(), s.clone()]);
    }
    helm(kubeconfig, &args).map(drop)
}

/// Runs the real Helm CLI (`helm_binary`) with `args` against the cluster of `kubeconfig`: its
/// output when it succeeds.
///
/// # Errors
///
/// Helm could not be found or run, or it failed: the command and its output.
pub fn helm<S: AsRef<std::ffi::OsStr>>(kubeconfig: &Path, args: &[S]) -> Result<String, String> {
    let binary = helm_binary().map_err(|e| e.to_string())?;
    let out = std::process::Command::new(binary)
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .map_err(|e| format!("running helm: {e}"))?;
    let words: Vec<String> = args
        .iter()
        .take(2)
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("helm {} failed: {text}", words.join(" ")))
    }
}

/// The [`GPU`]s the cluster's nodes can still give: allocatable less what the pods that are not
/// done request.
async fn free_gpus(client: &kube::Client) -> Result<u64, String> {
    use k8s_openapi::api::core::v1::Pod;
    let count = |q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        q.and_then(|q| q.0.parse::<u64>().ok()).unwrap_or(0)
    };
    let nodes = Api::<Node>::all(client.clone())
        .list(&kube::api::ListParams::default())
        .await
        .map_err(|e| format!("listing the nodes: {e}"))?;
    let allocatable: u64 = nodes
        .items
        .iter()
        .map(|n| {
            count(
                n.status
                    .as_ref()
                    .and_then(|s| s.allocatable.as_ref()?.get(GPU)),
            )
        })
        .sum();
    let pods = Api::<Pod>::all(client.clone())
        .list(&kube::api::ListParams::default())
        .await
        .map_err(|e| format!("listing the pods: {e}"))?;
    let used: u64 = pods
        .items
        .iter()
        .filter(|p| holds_resources(p))
        .filter_map(|p| p.spec.as_ref())
        .map(|s| pod_request(s, GPU, |q| count(Some(q))))
        .sum();
    Ok(allocatable.saturating_sub(used))
}

/// What only the test kit's node has.
struct Simulation {
    node: &'static RealNode,
    net: PodNetwork,
}

/// A started scenario: the client, the model source, and (on the test node) the simulation.
pub struct Started {
    name: String,
    /// An admin client of the cluster.
    pub client: kube::Client,
    /// The admin kubeconfig (the test plane's, or `E2E_KUBECONFIG`).
    pub kubeconfig: PathBuf,
    /// The Hugging Face endpoint the pods download from (empty without a model source).
    pub endpoint: String,
    /// The image of the example's client and engine.
    pub hf_image: String,
    /// The pods' `imagePullPolicy` (`Never` on the test node: its images are imported).
    pub pull_policy: String,
    /// The release's namespace.
    pub release_namespace: String,
    model_repo: String,
    model_revision: Option<String>,
    /// The OTLP receiver the components export to (only on the test node).
    pub otlp: Option<OtlpReceiver>,
    hub: Option<Hub>,
    model_bytes: Option<u64>,
    sim: Option<Simulation>,
    own_release: bool,
    created: std::sync::Mutex<Vec<String>>,
    work: tempfile::TempDir,
}

impl Started {
    /// Whether this runs on the test kit's node with the simulation (`E2E_KUBECONFIG` unset).
    pub fn simulated(&self) -> bool {
        self.sim.is_some()
    }

    /// The simulated Hub (to publish, move tags, read byte counts); `None` on a cluster.
    pub fn hub(&self) -> Option<&Hub> {
        self.hub.as_ref()
    }

    /// The bytes of [`REPO`] the simulated Hub served so far; `None` on a cluster (no Hub to
    /// count: the scenarios count download Jobs there).
    pub fn served(&self) -> Option<u64> {
        self.hub
            .as_ref()
            .map(|h| h.stats().bytes_by_repo.get(REPO).copied().unwrap_or(0))
    }

    /// The bytes of the model of [`Scenario::model`] (on the test node).
    pub fn model_bytes(&self) -> Option<u64> {
        self.model_bytes
    }

    /// The test kit's node; `None` on a cluster.
    pub fn node(&self) -> Option<&'static RealNode> {
        self.sim.as_ref().map(|s| s.node)
    }

    /// The kit's pod network; `None` on a cluster.
    pub fn net(&self) -> Option<&PodNetwork> {
        self.sim.as_ref().map(|s| &s.net)
    }

    /// A directory for the scenario's files, removed with it.
    pub fn work_dir(&self) -> &Path {
        self.work.path()
    }

    /// `examples/llm-deployment.yaml` for this run: the model source's endpoint, the hf-client
    /// image and the pull policy; on a cluster, the repository and revision of `E2E_MODEL_*`.
    ///
    /// # Errors
    ///
    /// The example cannot be read, or its download command is not the one expected.
    pub fn workload(&self) -> Result<Deployment, String> {
        let mut workload = example_deployment(&self.endpoint, &self.hf_image)?;
        let Some(spec) = workload.spec.template.spec.as_mut() else {
            return Err("the example has no pod spec".to_owned());
        };
        for c in spec
            .init_containers
            .iter_mut()
            .flatten()
            .chain(spec.containers.iter_mut())
        {
            c.image_pull_policy = Some(self.pull_policy.clone());
        }
        if self.model_repo != REPO || self.model_revision.is_some() {
            let download = format!("hf download {REPO} ");
            let revision = self
                .model_revision
                .as_ref()
                .map(|r| format!("--revision {r} "))
                .unwrap_or_default();
            let script = spec
                .init_containers
                .iter_mut()
                .flatten()
                .find(|c| c.name == "download-model")
                .and_then(|c| c.command.as_mut()?.last_mut())
                .filter(|s| s.contains(&download))
                .ok_or("the example's init container download-model does not run `hf download demo/llm`")?;
            *script = script.replace(
                &download,
                &format!("hf download {} {revision}", self.model_repo),
            );
        }
        Ok(workload)
    }

    /// A fresh namespace `t-<prefix>-<random>` with `labels` from its creation, once its
    /// `default` ServiceAccount exists. On a cluster, [`Started::finish`] deletes it.
    ///
    /// # Errors
    ///
    /// The namespace could not be created.
    pub async fn namespace(
        &self,
        prefix: &str,
        labels: &[(&str, &str)],
    ) -> Result<TestNamespace, String> {
        let ns = if self.simulated() {
            TestNamespace::with_labels(prefix, labels)
                .await
                .map_err(|e| e.to_string())?
        } else {
            create_namespace(&self.client, prefix, labels).await?
        };
        if let Ok(mut created) = self.created.lock() {
            created.push(ns.name.clone());
        }
        Ok(ns)
    }

    /// Creates `workload` in `ns` with one replica and returns its pod once Ready.
    ///
    /// # Errors
    ///
    /// The create's error, or no pod Ready within [`READY_TIMEOUT`] with `ns`'s report.
    pub async fn one_ready_replica(
        &self,
        ns: &TestNamespace,
        workload: &Deployment,
    ) -> Result<k8s_openapi::api::core::v1::Pod, String> {
        let mut first = workload.clone();
        first.spec.replicas = Some(1);
        ns.api::<Deployment>()
            .create(&PostParams::default(), &first)
            .await
            .map_err(|e| format!("creating the workload: {e}"))?;
        let pods = ns.api::<k8s_openapi::api::core::v1::Pod>();
        let ready = eventually("the first replica Ready", READY_TIMEOUT, || {
            let pods = pods.clone();
            async move { app_pods(&pods).await?.into_iter().find(is_ready) }
        })
        .await;
        match ready {
            Ok(pod) => Ok(pod),
            Err(e) => Err(format!(
                "the first replica never became Ready: {e}\n{}",
                self.report(&[ns.name.as_str()]).await
            )),
        }
    }

    /// What a failed scenario prints: the reports of `namespaces`, the release's and the control
    /// namespace, each binding's status, and (on the test node) the pod network's.
    pub async fn report(&self, namespaces: &[&str]) -> String {
        let mut out = String::new();
        let mut seen = Vec::new();
        for ns in namespaces
            .iter()
            .copied()
            .chain([CONTROL, self.release_namespace.as_str()])
        {
            if !seen.contains(&ns) {
                seen.push(ns);
                out.push_str(&namespace_report(&self.client, ns).await);
            }
        }
        let bindings = bindings_api(&self.client)
            .list(&kube::api::ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        for b in bindings {
            out.push_str(&format!(
                "binding {}: {}\n",
                kube::ResourceExt::name_any(&b),
                serde_json::to_string(&b.data.get("status")).unwrap_or_default()
            ));
        }
        if let Some(net) = self.net() {
            out.push_str(&net.report());
        }
        out
    }

    /// Ends a scenario that passed. On the test node nothing is left to do (the plane goes with
    /// the test process); on a cluster, the namespaces it created are deleted, and a release it
    /// installed is uninstalled. A scenario that fails leaves them for a look (see
    /// docs/e2e-on-a-cluster.md).
    pub async fn finish(self) {
        if self.simulated() {
            return;
        }
        let created = self.created.lock().map(|c| c.clone()).unwrap_or_default();
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        for ns in created {
            if let Err(e) = namespaces
                .delete(&ns, &kube::api::DeleteParams::background())
                .await
                && !matches!(&e, kube::Error::Api(s) if s.code == 404 || s.code == 409)
            {
                eprintln!("scenario {}: deleting namespace {ns}: {e}", self.name);
            }
        }
        if self.own_release {
            let args = [
                "uninstall",
                RELEASE,
                "--namespace",
                &self.release_namespace,
                "--timeout",
                "5m",
                "--ignore-not-found",
            ];
            if let Err(e) = helm(&self.kubeconfig, &args) {
                eprintln!("scenario {}: {e}", self.name);
            }
        }
    }
}

/// A value unique to this test process, for names a cluster may already hold from another run
/// (a sharing domain).
pub fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}-{:x}", std::process::id(), nanos % 0x10000)
}

/// [`TestNamespace::with_labels`] on a cluster's client: `t-<prefix>-<random>`, labelled as the
/// kit labels its namespaces.
async fn create_namespace(
    client: &kube::Client,
    prefix: &str,
    labels: &[(&str, &str)],
) -> Result<TestNamespace, String> {
    use k8s_openapi::api::core::v1::ServiceAccount;
    let clean: String = prefix
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    // This process's id and a count: unique among the namespaces of every run.
    static COUNT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!(
        "t-{}-{}{n}",
        clean.trim_matches('-'),
        run_id().replace('-', "")
    );
    let mut all = serde_json::Map::new();
    all.insert(TESTKIT_NAMESPACE_LABEL.to_owned(), json!("true"));
    for (k, v) in labels {
        all.insert((*k).to_owned(), json!(v));
    }
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": all}}))
            .map_err(|e| e.to_string())?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .map_err(|e| format!("creating namespace {name}: {e}"))?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
    eventually(
        &format!("ServiceAccount {name}/default"),
        Duration::from_secs(60),
        || {
            let accounts = accounts.clone();
            async move { accounts.get_opt("default").await.ok().flatten() }
        },
    )
    .await
    .map_err(|e| format!("namespace {name}: {e}"))?;
    Ok(TestNamespace {
        name,
        client: client.clone(),
    })
}

/// A bare pod `tamper` of `workload`'s template whose engine, once the model verifies, tries to
/// create a file in the landing and to append to one of the model's files, and says which
/// happened in its termination message (`read-only`, `writable` or `unverified`); it runs once.
pub fn tamper_pod(workload: &Deployment) -> Result<k8s_openapi::api::core::v1::Pod, String> {
    let mut spec = workload
        .spec
        .template
        .spec
        .clone()
        .ok_or("the workload has no pod spec")?;
    spec.restart_policy = Some("Never".to_owned());
    let engine = spec
        .containers
        .iter_mut()
        .find(|c| c.name == "engine")
        .ok_or("the workload has no engine container")?;
    engine.readiness_probe = None;
    engine.command = Some(vec![
        "sh".to_owned(),
        "-c".to_owned(),
        "cd /models/llm && sha256sum -c SHA256SUMS >/dev/null || { echo unverified > /dev/termination-log; exit 2; }; \
         if touch /models/llm/tampered 2>/dev/null || echo x 2>/dev/null >> /models/llm/config.json; \
         then echo writable > /dev/termination-log; exit 1; \
         else echo read-only > /dev/termination-log; fi"
            .to_owned(),
    ]);
    Ok(k8s_openapi::api::core::v1::Pod {
        metadata: kube::api::ObjectMeta {
            name: Some("tamper".to_owned()),
            ..Default::default()
        },
        spec: Some(spec),
        ..Default::default()
    })
}

/// The claim the example's engine reads the model from, checked to be read-only on both sides:
/// the engine's mount at the landing (`/models/llm`) is read-only, and so is the pod's claim
/// (the webhook's rewrite, as the API returns it).
///
/// # Errors
///
/// What is not so, naming the pod.
pub fn read_only_landing(
    pod: &k8s_openapi::api::core::v1::Pod,
) -> Result<k8s_openapi::api::core::v1::PersistentVolumeClaimVolumeSource, String> {
    let name = kube::ResourceExt::name_any(pod);
    let spec = pod.spec.as_ref().ok_or(format!("{name}: no spec"))?;
    let engine = spec
        .containers
        .iter()
        .find(|c| c.name == "engine")
        .ok_or(format!("{name}: no engine container"))?;
    let mount = engine
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == "/models/llm")
        .ok_or_else(|| format!("{name}: no mount at the landing: {engine:?}"))?;
    if mount.read_only != Some(true) {
        return Err(format!(
            "{name}: the landing's mount is not read-only: {mount:?}"
        ));
    }
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .ok_or_else(|| format!("{name}: no volume {}", mount.name))?;
    let claim = volume
        .persistent_volume_claim
        .clone()
        .ok_or_else(|| format!("{name}: the landing is not a claim: {volume:?}"))?;
    if claim.read_only != Some(true) {
        return Err(format!(
            "{name}: the claim is not mounted read-only: {claim:?}"
        ));
    }
    Ok(claim)
}

/// What a pod of `spec` requests of `resource`, as the scheduler counts it: the larger of its
/// largest init container's request and the sum of its containers', each request counted by
/// `count`.
pub fn pod_request(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    resource: &str,
    count: impl Fn(&k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> u64,
) -> u64 {
    let requested = |c: &k8s_openapi::api::core::v1::Container| {
        c.resources
            .as_ref()
            .and_then(|r| r.requests.as_ref()?.get(resource))
            .map_or(0, &count)
    };
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(requested)
        .max()
        .unwrap_or(0);
    init.max(spec.containers.iter().map(requested).sum())
}

/// Whether `pod` still holds what it requests: it is not done (phase neither `Succeeded` nor
/// `Failed`), as the scheduler counts it.
pub fn holds_resources(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    !matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}
