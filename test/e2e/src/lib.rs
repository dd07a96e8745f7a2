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
use warmcache_test_sources::hub::{FileSpec, model_files};
use warmcache_testkit::{
    COMPONENT_BINARIES, ControlPlane, PodNetwork, RealNode, TestCsiDriver, chart_dir,
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
}

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

/// What a failed scenario prints: `namespace`'s and the control namespace's reports, each
/// binding's status, and the pod network's.
pub async fn scenario_report(client: &kube::Client, namespace: &str, net: &PodNetwork) -> String {
    let mut out = namespace_report(client, namespace).await;
    out.push_str(&namespace_report(client, CONTROL).await);
    let bindings = bindings_api(client)
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
    out.push_str(&net.report());
    out
}

/// The release and its namespace.
pub const RELEASE: &str = "warmcache";
pub const NAMESPACE: &str = "warmcache-system";

/// Installs the product on the test node as a user with their own qualified driver does: the
/// product's and the hf client's images imported (no registry), the node's GPUs advertised, the
/// release namespace with a catalog ConfigMap qualifying the test driver's shared file system for
/// ReadWriteMany, `helm install` with StorageClass `nvcf-sc` on that driver, and waits until the
/// webhook and the binding controller are Ready (the pod network `net` bridges their Services).
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

    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))
        .map_err(|e| e.to_string())?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .map_err(|e| format!("creating namespace {NAMESPACE}: {e}"))?;
    let driver = TestCsiDriver::SharedFs.driver_name();
    let catalog = format!(
        "apiVersion: storage.nvcf.nvidia.com/v1alpha1\nkind: StorageCapabilityCatalog\n\
         drivers:\n  - name: {driver}\n    provider: testSharedFs\n    accessModes: [ReadWriteMany]\n    readerMountOptions: []\n"
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
    let sets: Vec<String> = sets
        .into_iter()
        .chain(how.otel_endpoint.map(|e| format!("otel.endpoint={e}")))
        .chain(how.extra_sets.iter().map(|s| (*s).to_owned()))
        .collect();
    let helm = helm_binary().map_err(|e| e.to_string())?;
    let mut command = std::process::Command::new(helm);
    command
        .arg("install")
        .arg(RELEASE)
        .arg(chart_dir())
        .args(["--namespace", NAMESPACE, "--kubeconfig"])
        .arg(how.kubeconfig);
    for s in &sets {
        command.args(["--set", s]);
    }
    if how.otel_endpoint.is_some() {
        // Exported within half a second, so a test sees the spans soon after the work.
        command.args(["--set-string", "otel.env.OTEL_BSP_SCHEDULE_DELAY=500"]);
    }
    let out = command.output().map_err(|e| format!("running helm: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "helm install failed: {}{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
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
            "the components did not become Ready\n{}{}",
            namespace_report(&client, NAMESPACE).await,
            net.report()
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
    eventually("a dry-run pod rewritten", Duration::from_secs(120), || {
        let (pods, probe, dry_run) = (pods.clone(), probe.clone(), dry_run.clone());
        async move {
            let admitted = pods.create(&dry_run, &probe).await.ok()?;
            kube::ResourceExt::annotations(&admitted)
                .contains_key(BINDING_ANNOTATION)
                .then_some(())
        }
    })
    .await
    .map_err(|_| "the webhook never rewrote a dry-run pod".to_owned())
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
/// What is not so, with `namespace`'s [`scenario_report`].
pub async fn kept_primary(
    client: &kube::Client,
    primary: &str,
    namespace: &str,
    net: &PodNetwork,
) -> Result<k8s_openapi::api::core::v1::PersistentVolume, String> {
    use k8s_openapi::api::core::v1::PersistentVolume;
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
            scenario_report(client, namespace, net).await
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
