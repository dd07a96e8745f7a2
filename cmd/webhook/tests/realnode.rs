//! The pod webhook's rewrite on the REAL node (issue 11, "Real node"): a vLLM reader pod,
//! rendered by the same pure function admission runs (`warmcache_modelvolume::admit`), joins an
//! existing ModelCacheBinding and reads its copy through the namespace's read-only view claim on
//! the TEST CSI driver's shared-filesystem profile. The real kubelet must mount that view `ro`,
//! and every write through the landing must fail with EROFS.
//!
//! The binding controller does not exist yet, so this test stands in for it, explicitly and only
//! where the controller would act (each step is marked "binding controller stand-in"): the
//! primary claim on `nvcf-sc`, the download into it (a writer pod), the completion marker, the
//! binding's status, and the read-only view (a PV derived from the primary's, `csi.readOnly:
//! true`, pre-bound to the claim the rendered pod names). Once the controller exists, this test
//! should drive the real one instead.
//!
//! Why pod-side read-only matters: on kubelet 1.36 a PV's `csi.readOnly: true` alone does not
//! reach NodePublishVolume on a driver without attach, so a reader through such a PV can write
//! (the spike, `../shared/reference/realnode-spike/README.md`; proven for a plain pod by
//! `pkg/testkit/tests/csi_driver.rs`, `shared_filesystem_profile`). The negative control at the
//! end runs the SAME rendered pod with only the pod-side `readOnly` removed, through the same
//! view, and shows its writes succeed: the EROFS assertions of this test can fail.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, Namespace, PersistentVolume, PersistentVolumeClaim, Pod, VolumeMount,
};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use warmcache_api_modelcache::v2beta1::{ModelCacheBinding, Transition, WriterIdentity};
use warmcache_api_modelcache::{MODEL_CACHE_STORAGE_CLASS, reader_pvc_name, sha256_digest};
use warmcache_catalog::{CatalogInput, CatalogSnapshot, Gates};
use warmcache_modelvolume::keys::{
    BINDING_UID_ANNOTATION, COMPLETE_MARKER, MODEL_VOLUME, PENDING_LABEL, WAIT_CONTAINER,
    WAIT_MOUNT_PATH,
};
use warmcache_modelvolume::{
    BindingAction, Options, ReaderMode, Request, Rewrite, StorageInputs, Verdict, admit,
};
use warmcache_testkit::{
    RealNode, TOOLS_IMAGE, TestCsiDriver, TestNamespace, eventually, termination_message, wait_pod,
    wait_pod_finished,
};

/// Generous: the machine is shared, and a pod's wait container polls every 5 s.
const TIMEOUT: Duration = Duration::from_secs(180);

const DRIVER: TestCsiDriver = TestCsiDriver::SharedFs;

/// A vLLM pod as a chart renders it: an `hf download --local-dir` init container fills an
/// emptyDir, the engine serves the directory on one GPU. The GPU request puts it in scope.
const VLLM_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: qwen3
  labels: {app.kubernetes.io/name: vllm, app.kubernetes.io/instance: qwen3}
spec:
  initContainers:
    - name: download-model
      image: python:3.12-slim
      command: ["sh", "-c", "pip install -q 'huggingface_hub[cli]' && hf download Qwen/Qwen3-0.6B --local-dir /models/qwen3"]
      env:
        - name: HF_TOKEN
          valueFrom:
            secretKeyRef: {name: hf-token, key: token}
        - {name: HF_HUB_ENABLE_HF_TRANSFER, value: "1"}
      volumeMounts:
        - {name: models, mountPath: /models}
  containers:
    - name: vllm
      image: vllm/vllm-openai:v0.20.0
      command: ["vllm", "serve", "/models/qwen3"]
      args: ["--port", "8000", "--max-model-len", "4096", "--gpu-memory-utilization", "0.9"]
      ports:
        - {name: http, containerPort: 8000}
      resources:
        requests: {nvidia.com/gpu: "1"}
        limits: {nvidia.com/gpu: "1"}
      volumeMounts:
        - {name: models, mountPath: /models}
        - {name: shm, mountPath: /dev/shm}
  volumes:
    - {name: models, emptyDir: {}}
    - name: shm
      emptyDir: {medium: Memory, sizeLimit: 256Mi}
"#;

/// A catalog entry for the test driver's shared-filesystem profile, qualified for exactly what
/// `pkg/testkit/tests/csi_driver.rs` proves on it (ReadWriteMany, readers through static PVs),
/// like the `csi.weka.io` entry of the built-in catalog: no reader mount options, so the only
/// thing that makes the reader read-only is the pod side of the rewrite.
const TEST_CATALOG: &str = r#"
apiVersion: storage.nvcf.nvidia.com/v1alpha1
kind: StorageCapabilityCatalog
drivers:
  - name: shared-fs.csi-test.warmcache.io
    provider: testSharedFs
    accessModes: [ReadWriteMany]
    readerMountOptions: []
"#;

/// The model files the writer puts into the primary volume (flat `--local-dir` layout: the
/// volume root is the model directory).
const MODEL_FILES: [(&str, &str); 4] = [
    (
        "config.json",
        r#"{"architectures":["Qwen3ForCausalLM"],"model_type":"qwen3"}"#,
    ),
    ("generation_config.json", r#"{"max_new_tokens":2048}"#),
    ("tokenizer.json", r#"{"version":"1.0"}"#),
    ("tokenizer_config.json", r#"{"model_max_length":4096}"#),
];

/// Stands in for `vllm serve`: reads what the engine reads, reports how the landing is mounted
/// and whether the rest of the emptyDir is writable, then tries every kind of write through the
/// landing ("<op> rc=<code> <error>", each on its own file so each can succeed on its own). All
/// of it goes to the termination message. `$1` is the landing.
const ENGINE_SCRIPT: &str = r#"
L="$1"
try() { op=$1; shift; err=$("$@" 2>&1 >/dev/null); echo "$op rc=$? $err"; }
{
  echo "read=$(cat "$L/config.json")"
  echo "mount=$(awk -v p="$L" '$2 == p { o = $4 } END { print o }' /proc/mounts)"
  if echo ok > /models/engine-scratch 2>/dev/null; then echo "emptyDir=writable"; else echo "emptyDir=refused"; fi
  try create touch "$L/written-by-reader"
  try append sh -c 'echo more >> "$0/config.json"' "$L"
  try rename mv "$L/tokenizer.json" "$L/tokenizer.json.moved"
  try chmod chmod 600 "$L/model.safetensors"
  try truncate truncate -s 0 "$L/generation_config.json"
  try delete rm "$L/tokenizer_config.json"
} > /dev/termination-log 2>&1
"#;

fn state<'p>(pod: &'p Pod, container: &str) -> Option<&'p ContainerState> {
    let status = pod.status.as_ref()?;
    status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .find(|c| c.name == container)?
        .state
        .as_ref()
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

fn all_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    let spec = pod.spec.as_ref().unwrap();
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
}

fn all_containers_mut(pod: &mut Pod) -> impl Iterator<Item = &mut Container> {
    let spec = pod.spec.as_mut().unwrap();
    spec.init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut())
}

/// Every mount of the model volume: (container, mount).
fn model_mounts(pod: &Pod) -> Vec<(String, VolumeMount)> {
    all_containers(pod)
        .flat_map(|c| {
            c.volume_mounts
                .iter()
                .flatten()
                .filter(|m| m.name == MODEL_VOLUME)
                .map(|m| (c.name.clone(), m.clone()))
        })
        .collect()
}

/// The model volume's claim: (claimName, readOnly).
fn model_claim(pod: &Pod) -> (String, Option<bool>) {
    let volume = pod
        .spec
        .as_ref()
        .unwrap()
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == MODEL_VOLUME)
        .unwrap_or_else(|| panic!("the pod has no volume {MODEL_VOLUME}"));
    let claim = volume.persistent_volume_claim.as_ref().unwrap_or_else(|| {
        panic!("volume {MODEL_VOLUME} is not a persistentVolumeClaim: {volume:?}")
    });
    (claim.claim_name.clone(), claim.read_only)
}

/// Asserts the pod is read-only on the pod side: the claim volume says `readOnly: true`, and so
/// does every mount of it, in the wait container and in the engine at least.
fn assert_read_only_on_the_pod_side(pod: &Pod, engine: &str, landing: &str, what: &str) {
    let (claim, read_only) = model_claim(pod);
    assert_eq!(
        read_only,
        Some(true),
        "{what}: volume {MODEL_VOLUME} (claim {claim}) lacks persistentVolumeClaim.readOnly: true"
    );
    let mounts = model_mounts(pod);
    for (container, m) in &mounts {
        assert_eq!(
            m.read_only,
            Some(true),
            "{what}: container {container} mounts {MODEL_VOLUME} at {} without readOnly: true",
            m.mount_path
        );
    }
    let at = |c: &str, path: &str| {
        mounts
            .iter()
            .any(|(name, m)| name == c && m.mount_path == path)
    };
    assert!(
        at(WAIT_CONTAINER, WAIT_MOUNT_PATH) && at(engine, landing),
        "{what}: expected {WAIT_CONTAINER} at {WAIT_MOUNT_PATH} and {engine} at {landing}: {mounts:?}"
    );
}

/// The write attempts of [`ENGINE_SCRIPT`]'s report: (op, refused with EROFS, line).
fn write_attempts(report: &str) -> Vec<(String, bool, String)> {
    let lines: Vec<&str> = report.lines().filter(|l| l.contains(" rc=")).collect();
    let ops: Vec<&str> = lines.iter().filter_map(|l| l.split(' ').next()).collect();
    assert_eq!(
        ops,
        ["create", "append", "rename", "chmod", "truncate", "delete"],
        "the engine did not report every write attempt:\n{report}"
    );
    lines
        .iter()
        .map(|l| {
            let erofs = !l.contains(" rc=0 ") && l.contains("Read-only file system");
            (
                l.split(' ').next().unwrap().to_owned(),
                erofs,
                (*l).to_owned(),
            )
        })
        .collect()
}

fn report_field<'r>(report: &'r str, key: &str) -> &'r str {
    report
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("the engine report has no {key}= line:\n{report}"))
}

/// A tools pod in the control namespace mounting the primary claim read-write at
/// [`WAIT_MOUNT_PATH`] as the writer Job would (binding controller stand-in: the writer runs
/// with the decision's writer identity, fsGroup, non-root).
fn writer_pod(name: &str, claim: &str, script: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "securityContext": { "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000 },
            "containers": [{
                "name": "main", "image": TOOLS_IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "volumeMounts": [{ "name": "primary", "mountPath": WAIT_MOUNT_PATH }],
            }],
            "volumes": [{ "name": "primary", "persistentVolumeClaim": { "claimName": claim } }],
        },
    }))
    .unwrap()
}

async fn run_to_success(ns: &TestNamespace, pod: Pod) -> Pod {
    let pods = ns.api::<Pod>();
    let name = pod.metadata.name.clone().unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let done = wait_pod_finished(&pods, &name, TIMEOUT).await.unwrap();
    assert_eq!(
        phase(&done),
        "Succeeded",
        "pod {}/{name}: {:?}",
        ns.name,
        done.status
    );
    done
}

async fn bound_volume(ns: &TestNamespace, claim: &str) -> PersistentVolume {
    let claims = ns.api::<PersistentVolumeClaim>();
    let volume = eventually(&format!("claim {claim} to be Bound"), TIMEOUT, || {
        let claims = claims.clone();
        async move {
            let c = claims.get(claim).await.ok()?;
            let bound = c.status?.phase.as_deref() == Some("Bound");
            bound.then_some(c.spec?.volume_name?)
        }
    })
    .await
    .unwrap();
    Api::<PersistentVolume>::all(ns.client.clone())
        .get(&volume)
        .await
        .unwrap()
}

fn publish_for(node: &RealNode, pod: &Pod) -> warmcache_testkit::CsiPublish {
    let uid = pod.metadata.uid.clone().unwrap();
    node.csi_publishes(DRIVER)
        .unwrap()
        .into_iter()
        .rfind(|p| p.pod_uid == uid && p.error.is_none())
        .unwrap_or_else(|| panic!("no successful NodePublishVolume for pod uid {uid}"))
}

/// What the real node needs that the rendered pod cannot give it, and nothing else: every image
/// becomes [`TOOLS_IMAGE`] with `imagePullPolicy: Never` (no registry is reachable); the GPU
/// requests and limits are removed from the RENDERED pod (the node has no GPU, the scheduler
/// would leave the pod Pending; the GPU request was what put the pod in scope of the rewrite);
/// the engine's `vllm serve` becomes [`ENGINE_SCRIPT`]; the pod runs once (`restartPolicy:
/// Never`) so the engine's report can be read. Volumes, mounts, security contexts, the wait
/// container's command and everything else the rewrite produced stay as rendered (checked).
fn for_the_test_node(rendered: &Pod, name: &str, engine: &str, landing: &str) -> Pod {
    let mut pod = warmcache_testkit::on_test_node(
        rendered,
        "nvidia.com/gpu",
        engine,
        ENGINE_SCRIPT,
        &["vllm", landing],
    );
    pod.metadata.name = Some(name.to_owned());
    let kept = |p: &Pod| {
        let spec = p.spec.as_ref().unwrap();
        let wait = spec
            .init_containers
            .iter()
            .flatten()
            .find(|c| c.name == WAIT_CONTAINER)
            .map(|c| (c.command.clone(), c.args.clone()));
        let per_container: Vec<_> = all_containers(p)
            .map(|c| {
                (
                    c.name.clone(),
                    c.volume_mounts.clone(),
                    c.security_context.clone(),
                    c.env.clone(),
                )
            })
            .collect();
        (
            spec.volumes.clone(),
            spec.security_context.clone(),
            wait,
            per_container,
            p.metadata.labels.clone(),
            p.metadata.annotations.clone(),
        )
    };
    assert_eq!(
        kept(&pod),
        kept(rendered),
        "adapting the pod to the test node changed what the rewrite produced"
    );
    pod
}

#[tokio::test]
async fn a_rewritten_reader_on_the_shared_filesystem_driver_cannot_write_its_landing() {
    let node = RealNode::shared().await.unwrap();
    let app = TestNamespace::new("webhook-reader").await.unwrap();
    let control = TestNamespace::new("webhook-control").await.unwrap();
    let client = app.client.clone();

    // The storage the decision reads: nvcf-sc on the test driver (a Retain class copied from the
    // node's test-shared-fs), the driver's CSIDriver as registered, and a catalog entry for it.
    let classes: Api<StorageClass> = Api::all(client.clone());
    let test_class = classes.get(DRIVER.storage_class()).await.unwrap();
    let nvcf_sc: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": { "name": MODEL_CACHE_STORAGE_CLASS },
        "provisioner": test_class.provisioner,
        "parameters": test_class.parameters,
        "reclaimPolicy": "Retain",
        "volumeBindingMode": test_class.volume_binding_mode,
    }))
    .unwrap();
    let nvcf_sc = classes
        .create(&PostParams::default(), &nvcf_sc)
        .await
        .unwrap();
    let csi_driver = Api::<CSIDriver>::all(client.clone())
        .get(DRIVER.driver_name())
        .await
        .unwrap();
    let catalog = CatalogSnapshot::from_payload(TEST_CATALOG).unwrap();
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

    // The request as the webhook sees it: the pod, its namespace's real labels (no
    // sharing-domain label: regularModelCache), the webhook's default options but for the
    // control namespace, which is this test's.
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

    // The first admission of this model creates the binding (what the webhook's create_or_get
    // stores); the decision on the shared-filesystem profile is rwxReadOnly.
    let first = match admit(&req, |_, _| None, &storage) {
        Verdict::Rewrite(r) => r,
        other => panic!("the vLLM pod was not rewritten: {other:?}"),
    };
    let BindingAction::Create(wanted) = first.binding else {
        panic!("no binding exists yet, the admission must create one");
    };
    assert_eq!(first.transition, Transition::RwxReadOnly);
    assert_eq!(
        wanted.spec.decision.writer_identity,
        Some(WriterIdentity::FsGroup),
        "fsGroupPolicy File gives an fsGroup writer"
    );
    let bindings: Api<ModelCacheBinding> = Api::namespaced(client.clone(), &control.name);
    let stored = bindings
        .create(&PostParams::default(), &wanted)
        .await
        .unwrap();
    let binding_name = stored.metadata.name.clone().unwrap();
    let hash = binding_name.trim_start_matches("model-cache-").to_owned();
    let view_claim = reader_pvc_name(first.plan.identity());
    let view_pv = format!("{view_claim}-{}", &sha256_digest(&app.name)[7..15]);

    // Binding controller stand-in: the primary claim (writer claim name, on nvcf-sc, RWX) in
    // the control namespace, and the download into it, without the completion marker yet. (The
    // real writer Job runs in the pod's namespace through a read-write view; a writer pod on the
    // primary claim writes the same bytes to the same volume, which is all the reader sees.)
    let primary_claim = wanted.spec.resources.persistent_volume_claim_names[0].clone();
    assert_eq!(primary_claim, format!("rw-pvc-{hash}"));
    control
        .api::<PersistentVolumeClaim>()
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": { "name": primary_claim },
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": MODEL_CACHE_STORAGE_CLASS,
                    "resources": { "requests": { "storage": "16Mi" } },
                },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let primary = bound_volume(&control, &primary_claim).await;
    let primary_csi = primary.spec.as_ref().unwrap().csi.clone().unwrap();
    let handle = primary_csi.volume_handle.clone();
    let mut populate = String::from("set -eu\ncd /nvsnap-model\n");
    for (file, content) in MODEL_FILES {
        populate.push_str(&format!("printf '%s\\n' '{content}' > {file}\n"));
    }
    populate.push_str("head -c 65536 /dev/zero > model.safetensors\nsync\n");
    run_to_success(&control, writer_pod("download", &primary_claim, &populate)).await;
    let volume_dir = node.csi_volume_dir(DRIVER, &handle);
    assert!(
        !volume_dir.join(COMPLETE_MARKER).exists(),
        "the marker must not exist before the download completes"
    );

    // Binding controller stand-in: the status it would write while the download runs, with the
    // view recorded BEFORE its objects are created (the order the CRD documents for
    // status.realized.views). The view PV is named like nvsnap's: the claim name and 4 bytes of
    // the namespace's digest.
    let status = json!({ "status": {
        "phase": "Active",
        "requestReferences": [],
        "conditions": [],
        "realized": {
            "boundPersistentVolumeName": primary.metadata.name,
            "populationState": "Populating",
            "views": [{
                "namespace": app.name,
                "persistentVolumeName": view_pv,
                "persistentVolumeClaimName": view_claim,
            }],
        },
    }});
    bindings
        .patch_status(
            &binding_name,
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .unwrap();

    // The admission of the reader: the binding, as the webhook's cache would hold it, is joined.
    let cached = bindings.get(&binding_name).await.unwrap();
    let reader: Box<Rewrite> = match admit(
        &req,
        |ns, name| (ns == control.name && name == binding_name).then_some(&cached),
        &storage,
    ) {
        Verdict::Rewrite(r) => r,
        other => panic!("the reader was not rewritten: {other:?}"),
    };
    let uid = cached.metadata.uid.clone().unwrap();
    assert_eq!(
        reader.binding,
        BindingAction::Join {
            name: binding_name.clone(),
            uid: uid.clone()
        }
    );
    assert_eq!(reader.transition, Transition::RwxReadOnly);
    assert_eq!(reader.reader_mode, ReaderMode::Pvc);
    let rendered = reader.pod.clone();
    let engine = rendered.spec.as_ref().unwrap().containers[reader.plan.main_container()]
        .name
        .clone();
    let landing = reader.plan.landing().to_owned();
    assert_eq!(
        (engine.as_str(), landing.as_str()),
        ("vllm", "/models/qwen3")
    );
    let annotations = rendered.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get(BINDING_UID_ANNOTATION),
        Some(&uid),
        "{annotations:?}"
    );
    assert!(
        !rendered
            .metadata
            .labels
            .iter()
            .flatten()
            .any(|(k, _)| k == PENDING_LABEL),
        "the view is recorded on the binding: the reader is not pending"
    );
    assert_eq!(
        all_containers(&rendered)
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>(),
        [WAIT_CONTAINER, "vllm"],
        "the download init container is replaced by the wait"
    );
    // The pod-side read-only flags, on the rendered pod.
    assert_read_only_on_the_pod_side(&rendered, &engine, &landing, "rendered pod");
    let (claim_name, _) = model_claim(&rendered);
    assert_eq!(
        claim_name, view_claim,
        "the rendered pod reads the view claim the binding records"
    );
    assert!(
        wanted
            .spec
            .resources
            .persistent_volume_claim_names
            .contains(&claim_name),
        "the binding owns the reader claim {claim_name}: {:?}",
        wanted.spec.resources
    );

    // Binding controller stand-in: the read-only view under the exact claim name the rendered pod
    // references: a PV derived from the primary's (same driver and handle, ReadOnlyMany, Retain,
    // csi.readOnly: true, the decision's reader mount options: none here), pre-bound to it.
    Api::<PersistentVolume>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": { "name": view_pv },
                "spec": {
                    "capacity": { "storage": "16Mi" },
                    "accessModes": ["ReadOnlyMany"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    "mountOptions": wanted.spec.decision.required_mount_options,
                    "claimRef": { "namespace": app.name, "name": claim_name },
                    "csi": {
                        "driver": primary_csi.driver,
                        "volumeHandle": DRIVER.reader_volume_handle(&handle, &app.name),
                        "readOnly": true,
                        "fsType": primary_csi.fs_type,
                        "volumeAttributes": primary_csi.volume_attributes,
                    },
                },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    app.api::<PersistentVolumeClaim>()
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": { "name": claim_name },
                "spec": {
                    "accessModes": ["ReadOnlyMany"],
                    "storageClassName": "",
                    "volumeName": view_pv,
                    "resources": { "requests": { "storage": "16Mi" } },
                },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    bound_volume(&app, &claim_name).await;

    // The rendered reader on the real node. Without the marker its wait container waits and the
    // engine does not start.
    let pods = app.api::<Pod>();
    let protected = for_the_test_node(&rendered, "qwen3-reader", &engine, &landing);
    pods.create(&PostParams::default(), &protected)
        .await
        .unwrap();
    let waiting = wait_pod(
        &pods,
        "qwen3-reader",
        TIMEOUT,
        "in its wait container",
        |p| state(p, WAIT_CONTAINER).is_some_and(|s| s.running.is_some() || s.terminated.is_some()),
    )
    .await
    .unwrap();
    assert!(
        state(&waiting, WAIT_CONTAINER).is_some_and(|s| s.running.is_some()),
        "without the marker the wait container must keep waiting: {:?}",
        waiting.status
    );
    assert!(
        state(&waiting, &engine).is_none_or(|s| s.running.is_none() && s.terminated.is_none()),
        "the engine started before the copy was complete: {:?}",
        waiting.status
    );

    // Binding controller stand-in: the writer completes (the byte count into the marker, as the
    // writer script does) and the status says Ready.
    let complete = format!(
        "set -eu\nn=$(cat /nvsnap-model/* | wc -c | tr -d ' ')\nprintf '%s' \"$n\" > /nvsnap-model/{COMPLETE_MARKER}\nsync\nprintf '%s' \"$n\" > /dev/termination-log"
    );
    let completed =
        run_to_success(&control, writer_pod("complete", &primary_claim, &complete)).await;
    let bytes = termination_message(&completed, "main").unwrap();
    let ready = json!({ "status": { "realized": {
        "populationState": "Ready",
        "providerDataIdentity": handle,
    }}});
    bindings
        .patch_status(
            &binding_name,
            &PatchParams::default(),
            &Patch::Merge(&ready),
        )
        .await
        .unwrap();

    // The wait exits 0 on the marker; the engine reads the copy and cannot write it.
    let done = wait_pod_finished(&pods, "qwen3-reader", TIMEOUT)
        .await
        .unwrap();
    let wait_exit = state(&done, WAIT_CONTAINER)
        .and_then(|s| s.terminated.as_ref())
        .map(|t| t.exit_code);
    assert_eq!(
        wait_exit,
        Some(0),
        "the wait container exits 0 once the marker exists: {:?}",
        done.status
    );
    assert_eq!(phase(&done), "Succeeded", "{:?}", done.status);
    let report = termination_message(&done, &engine).unwrap();
    eprintln!("reader {engine} report:\n{report}");
    assert_eq!(
        report_field(&report, "read"),
        MODEL_FILES[0].1,
        "the engine reads the copy:\n{report}"
    );
    let mount = report_field(&report, "mount");
    assert!(
        mount.split(',').any(|o| o == "ro"),
        "the kubelet mounts the landing {landing} read-only in the engine (/proc/mounts options {mount:?}):\n{report}"
    );
    assert_eq!(
        report_field(&report, "emptyDir"),
        "writable",
        "only the landing is read-only, the rest of the pod's /models emptyDir stays writable:\n{report}"
    );
    for (op, erofs, line) in write_attempts(&report) {
        assert!(
            erofs,
            "{op} through the landing was not refused with EROFS (Read-only file system): {line}\n{report}"
        );
    }
    let publish = publish_for(node, &done);
    assert!(
        publish.readonly && publish.mounted_read_only,
        "the driver was asked for, and made, a read-only publish: {publish:?}"
    );
    assert_eq!(publish.volume_handle, handle, "{publish:?}");
    // The pod as the API server stored it still carries the pod-side flags.
    assert_read_only_on_the_pod_side(&done, &engine, &landing, "stored reader pod");
    // And the copy on the storage is what the writer wrote.
    for (file, content) in MODEL_FILES {
        assert_eq!(
            std::fs::read_to_string(volume_dir.join(file)).unwrap(),
            format!("{content}\n"),
            "{file} changed on the storage"
        );
    }
    assert!(!volume_dir.join("written-by-reader").exists());
    assert_eq!(
        std::fs::read_to_string(volume_dir.join(COMPLETE_MARKER)).unwrap(),
        bytes
    );

    // Negative control: the same rendered pod with only the pod-side readOnly removed (the
    // claim's and every mount's), through the same view whose PV says csi.readOnly: true. The
    // kubelet publishes it read-write and the reader writes into the shared copy: the assertions
    // above can fail, and the rewrite's pod-side flags are what protect the copy.
    let mut exposed = for_the_test_node(&rendered, "qwen3-exposed", &engine, &landing);
    for v in exposed.spec.as_mut().unwrap().volumes.iter_mut().flatten() {
        if let Some(c) = v
            .persistent_volume_claim
            .as_mut()
            .filter(|_| v.name == MODEL_VOLUME)
        {
            c.read_only = Some(false);
        }
    }
    for c in all_containers_mut(&mut exposed) {
        for m in c.volume_mounts.iter_mut().flatten() {
            if m.name == MODEL_VOLUME {
                m.read_only = Some(false);
            }
        }
    }
    let exposed = run_to_success(&app, exposed).await;
    let report = termination_message(&exposed, &engine).unwrap();
    eprintln!("negative control {engine} report:\n{report}");
    let mount = report_field(&report, "mount");
    assert!(
        mount.split(',').any(|o| o == "rw"),
        "without the pod-side flags the landing is mounted read-write ({mount:?}):\n{report}"
    );
    for (op, erofs, line) in write_attempts(&report) {
        assert!(
            !erofs && line.contains(" rc=0 "),
            "negative control: {op} was expected to succeed through a view with only csi.readOnly: {line}\n{report}"
        );
    }
    let publish = publish_for(node, &exposed);
    assert!(
        !publish.readonly && !publish.mounted_read_only,
        "csi.readOnly alone gives a read-write publish: {publish:?}"
    );
    assert!(
        volume_dir.join("written-by-reader").exists(),
        "the exposed reader's file is on the shared storage"
    );

    // Cleanup: without a reaper nothing removes the binding's finalizer; do it so the control
    // namespace can go.
    bindings
        .patch(
            &binding_name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .unwrap();
    let _ = classes
        .delete(MODEL_CACHE_STORAGE_CLASS, &DeleteParams::default())
        .await;
    app.cleanup().await;
    control.cleanup().await;
}
