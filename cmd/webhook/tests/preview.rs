//! `webhook preview` end to end: the built binary, real files, exit codes, stdout and stderr.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

const CATALOG: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../config/catalog/nvcf-storage-capabilities-v1alpha1.yaml"
);

const WEKA_SC: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: nvcf-sc, uid: 5f0c1f3e-8a59-4c2a-9d0e-1b2c3d4e5f60}
provisioner: csi.weka.io
reclaimPolicy: Retain
"#;

const NVMESH_SC: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: nvcf-sc, uid: 7a1b2c3d-0000-4000-8000-0123456789ab}
provisioner: nvmesh-csi.excelero.com
reclaimPolicy: Retain
"#;

const VLLM: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: qwen, namespace: team-a}
spec:
  containers:
    - name: vllm
      image: vllm/vllm-openai:v0.20.0
      args: [--model, Qwen/Qwen3-8B]
      env:
        - {name: HF_HOME, value: /models/hf}
      resources:
        limits: {nvidia.com/gpu: "1"}
      volumeMounts:
        - {name: m, mountPath: /models}
  volumes:
    - {name: m, emptyDir: {}}
"#;

const CPU_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: team-a}
spec:
  containers:
    - {name: web, image: nginx:1.27}
"#;

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        let f = Files {
            dir: tempfile::tempdir().unwrap(),
        };
        f.write("sc.yaml", WEKA_SC);
        f.write("pod.yaml", VLLM);
        f
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_owned()
    }
}

fn webhook() -> Command {
    Command::new(env!("CARGO_BIN_EXE_webhook"))
}

fn preview(files: &Files, pod: &str, extra: &[&str]) -> Output {
    webhook()
        .arg("preview")
        .args([
            "-f",
            &files.path(pod),
            "--catalog",
            CATALOG,
            "--storage-class",
            &files.path("sc.yaml"),
        ])
        .args(extra)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

fn ok(o: &Output) {
    assert_eq!(
        o.status.code(),
        Some(0),
        "stdout: {}\nstderr: {}",
        stdout(o),
        stderr(o)
    );
}

fn unusable(o: &Output) -> String {
    assert_eq!(
        o.status.code(),
        Some(2),
        "stdout: {}\nstderr: {}",
        stdout(o),
        stderr(o)
    );
    stderr(o)
}

fn rewritten(o: &Output) -> Pod {
    ok(o);
    serde_saphyr::from_str(&stdout(o))
        .unwrap_or_else(|e| panic!("stdout is a Pod ({e}): {}", stdout(o)))
}

fn annotation<'p>(p: &'p Pod, key: &str) -> Option<&'p str> {
    p.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

#[test]
fn a_pod_prints_the_rewritten_pod_as_yaml() {
    let files = Files::new();
    let o = preview(&files, "pod.yaml", &[]);
    let p = rewritten(&o);
    let spec = p.spec.as_ref().unwrap();
    let v = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "nvsnap-model")
        .unwrap();
    let claim = v.persistent_volume_claim.as_ref().unwrap();
    assert_eq!(claim.read_only, Some(true));
    assert!(claim.claim_name.starts_with("ro-pvc-"));
    assert_eq!(
        spec.init_containers.as_ref().unwrap()[0].name,
        "nvsnap-model-wait"
    );
    let binding = annotation(&p, "nvca.nvcf.nvidia.io/model-cache-binding").unwrap();
    assert!(binding.starts_with("model-cache-"));
    assert_eq!(
        annotation(&p, "nvsnap.io/model-uri"),
        Some("hf://Qwen/Qwen3-8B")
    );
    assert!(annotation(&p, "nvca.nvcf.nvidia.io/model-cache-binding-uid").is_none());
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "would create ModelCacheBinding nvca-modelcache-init/{binding}"
        )),
        "{err}"
    );
    assert!(err.contains("rwxReadOnly on weka"), "{err}");
}

#[test]
fn the_preview_is_the_admission_function() {
    let files = Files::new();
    let p = rewritten(&preview(
        &files,
        "pod.yaml",
        &[
            "--traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ],
    ));
    let pod: Pod = serde_saphyr::from_str(VLLM).unwrap();
    let sc = serde_saphyr::from_str(WEKA_SC).unwrap();
    let catalog =
        warmcache_catalog::CatalogFile::parse(&std::fs::read_to_string(CATALOG).unwrap()).unwrap();
    let options = warmcache_modelvolume::Options::default();
    let labels = BTreeMap::new();
    let req = warmcache_modelvolume::Request {
        pod: &pod,
        namespace: "team-a",
        namespace_labels: &labels,
        leader_worker_set: None,
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        options: &options,
    };
    let storage = warmcache_modelvolume::StorageInputs {
        storage_class: Some(&sc),
        csi_driver: None,
        catalog: warmcache_catalog::CatalogInput::Loaded(&catalog.snapshot),
        gates: warmcache_catalog::Gates {
            caching_support: true,
            helm_model_caching: true,
            model_cache_encryption: false,
        },
    };
    let v = warmcache_modelvolume::admit(&req, |_, _| None, &storage);
    assert_eq!(v.admitted(&pod), p);
    assert_eq!(
        annotation(&p, warmcache_modelvolume::keys::TRACE_PARENT_ANNOTATION),
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    );
}

#[test]
fn a_skipped_pod_prints_the_reason_as_json() {
    let files = Files::new();
    files.write("cpu.yaml", CPU_POD);
    let o = preview(&files, "cpu.yaml", &[]);
    ok(&o);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["reason"], "not-a-gpu-pod");
    assert_eq!(v["event"], false);
    assert!(v["message"].as_str().unwrap().contains("nvidia.com/gpu"));
    assert!(v["uri"].is_null());

    let o = preview(
        &files,
        "pod.yaml",
        &["--feature-gates", "CachingSupport=false"],
    );
    ok(&o);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["reason"], "caching-disabled");
    assert_eq!(v["uri"], "hf://Qwen/Qwen3-8B");

    files.write(
        "lustre.yaml",
        &WEKA_SC.replace("csi.weka.io", "lustre.csi.oraclecloud.com"),
    );
    let o = webhook()
        .args([
            "preview",
            "-f",
            &files.path("pod.yaml"),
            "--catalog",
            CATALOG,
            "--storage-class",
            &files.path("lustre.yaml"),
        ])
        .output()
        .unwrap();
    ok(&o);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["reason"], "no-durable-storage");
    assert_eq!(v["event"], true);
}

#[test]
fn namespace_labels_choose_the_sharing_domain() {
    let files = Files::new();
    let alone = rewritten(&preview(&files, "pod.yaml", &[]));
    let shared = rewritten(&preview(
        &files,
        "pod.yaml",
        &[
            "--namespace-labels",
            "nvca.nvcf.nvidia.io/model-cache-sharing-domain=research,team=a",
        ],
    ));
    let other_ns = rewritten(&preview(
        &files,
        "pod.yaml",
        &[
            "-n",
            "team-b",
            "--namespace-labels",
            "nvca.nvcf.nvidia.io/model-cache-sharing-domain=research",
        ],
    ));
    let b = |p: &Pod| {
        annotation(p, "nvca.nvcf.nvidia.io/model-cache-binding")
            .unwrap()
            .to_owned()
    };
    assert_ne!(b(&alone), b(&shared));
    assert_eq!(b(&shared), b(&other_ns));
    let opted = preview(
        &files,
        "pod.yaml",
        &[
            "--namespace-labels",
            "nvca.nvcf.nvidia.io/model-cache-opt-out=true",
        ],
    );
    ok(&opted);
    assert_eq!(
        serde_json::from_str::<Value>(&stdout(&opted)).unwrap()["reason"],
        "namespace-opted-out"
    );
}

fn binding_yaml(files: &Files, phase: &str) -> String {
    let p = rewritten(&preview(files, "pod.yaml", &[]));
    let name = annotation(&p, "nvca.nvcf.nvidia.io/model-cache-binding")
        .unwrap()
        .to_owned();
    // The binding admission would create, as the API server would store it.
    let pod: Pod = serde_saphyr::from_str(VLLM).unwrap();
    let sc = serde_saphyr::from_str(WEKA_SC).unwrap();
    let catalog =
        warmcache_catalog::CatalogFile::parse(&std::fs::read_to_string(CATALOG).unwrap()).unwrap();
    let options = warmcache_modelvolume::Options::default();
    let labels = BTreeMap::new();
    let req = warmcache_modelvolume::Request {
        pod: &pod,
        namespace: "team-a",
        namespace_labels: &labels,
        leader_worker_set: None,
        traceparent: None,
        options: &options,
    };
    let storage = warmcache_modelvolume::StorageInputs {
        storage_class: Some(&sc),
        csi_driver: None,
        catalog: warmcache_catalog::CatalogInput::Loaded(&catalog.snapshot),
        gates: warmcache_catalog::Gates {
            caching_support: true,
            helm_model_caching: true,
            model_cache_encryption: false,
        },
    };
    let warmcache_modelvolume::Verdict::Rewrite(r) =
        warmcache_modelvolume::admit(&req, |_, _| None, &storage)
    else {
        panic!("a rewrite");
    };
    let warmcache_modelvolume::BindingAction::Create(mut b) = r.binding else {
        panic!("a binding to create");
    };
    assert_eq!(b.metadata.name.as_deref(), Some(name.as_str()));
    b.metadata.uid = Some("0d9c6c62-1111-4a2b-8c3d-000000000001".into());
    let mut v = serde_json::to_value(&b).unwrap();
    v["status"] = serde_json::json!({"phase": phase, "requestReferences": [], "conditions": []});
    serde_saphyr::to_string(&v).unwrap()
}

#[test]
fn a_binding_from_the_cache_is_joined_or_refused() {
    let files = Files::new();
    files.write("active.yaml", &binding_yaml(&files, "Active"));
    let o = preview(
        &files,
        "pod.yaml",
        &["--binding", &files.path("active.yaml")],
    );
    let p = rewritten(&o);
    assert_eq!(
        annotation(&p, "nvca.nvcf.nvidia.io/model-cache-binding-uid"),
        Some("0d9c6c62-1111-4a2b-8c3d-000000000001")
    );
    assert!(
        stderr(&o).contains("joins ModelCacheBinding"),
        "{}",
        stderr(&o)
    );

    files.write("retiring.yaml", &binding_yaml(&files, "Retiring"));
    let o = preview(
        &files,
        "pod.yaml",
        &["--binding", &files.path("retiring.yaml")],
    );
    ok(&o);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["reason"], "binding-retiring");
    assert_eq!(v["event"], true);

    // A binding of another name is not this pod's: the pod creates its own.
    let other = binding_yaml(&files, "Active").replace("name: model-cache-", "name: model-cache-0");
    files.write("other.yaml", &other);
    let o = preview(
        &files,
        "pod.yaml",
        &["--binding", &files.path("other.yaml")],
    );
    rewritten(&o);
    assert!(stderr(&o).contains("would create"), "{}", stderr(&o));

    // A binding whose download recorded its commit: the joining pod shows it.
    let sha = "0123456789abcdef0123456789abcdef01234567";
    let mut pinned: Value = serde_saphyr::from_str(&binding_yaml(&files, "Active")).unwrap();
    pinned["status"]["resolvedRevision"] = Value::from(sha);
    files.write("pinned.yaml", &serde_json::to_string(&pinned).unwrap());
    let o = preview(
        &files,
        "pod.yaml",
        &["--binding", &files.path("pinned.yaml")],
    );
    let p = rewritten(&o);
    assert_eq!(annotation(&p, "nvsnap.io/model-revision"), Some(sha));
}

#[test]
fn block_storage_with_host_path_readers() {
    let files = Files::new();
    files.write("nvmesh.yaml", NVMESH_SC);
    let o = webhook()
        .args([
            "preview",
            "-f",
            &files.path("pod.yaml"),
            "--catalog",
            CATALOG,
            "--storage-class",
            &files.path("nvmesh.yaml"),
            "--reader-mode",
            "hostPath",
        ])
        .output()
        .unwrap();
    let p = rewritten(&o);
    let v = p
        .spec
        .as_ref()
        .unwrap()
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "nvsnap-model")
        .unwrap();
    let hp = v.host_path.as_ref().unwrap();
    assert!(
        hp.path.starts_with("/var/lib/containerd/nvsnap-models/"),
        "{}",
        hp.path
    );
    assert_eq!(
        p.metadata.labels.as_ref().unwrap()["nvsnap.io/model-pending"],
        "true"
    );
    assert!(
        stderr(&o).contains("roxReadOnly on nvmesh, hostPath readers"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_stream_prints_one_document_per_pod_template() {
    let files = Files::new();
    let deployment = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: qwen, namespace: team-a}
spec:
  selector: {matchLabels: {app: qwen}}
  template:
    metadata: {labels: {app: qwen}}
    spec:
      containers:
        - name: vllm
          image: vllm/vllm-openai:v0.20.0
          args: [--model, Qwen/Qwen3-8B]
          resources: {limits: {nvidia.com/gpu: "1"}}
"#;
    let service =
        "apiVersion: v1\nkind: Service\nmetadata: {name: qwen}\nspec: {ports: [{port: 80}]}\n";
    files.write(
        "stream.yaml",
        &format!("{deployment}---\n{service}---\n{CPU_POD}"),
    );
    let o = preview(&files, "stream.yaml", &[]);
    ok(&o);
    let out = stdout(&o);
    let docs: Vec<Value> = serde_saphyr::from_multiple(&out).unwrap();
    assert_eq!(docs.len(), 2, "{out}");
    assert_eq!(docs[0]["kind"], "Pod");
    assert_eq!(
        docs[0]["spec"]["initContainers"][0]["name"],
        "nvsnap-model-wait"
    );
    assert_eq!(docs[1]["object"]["document"], 2);
    assert_eq!(docs[1]["object"]["name"], "web");
    assert_eq!(docs[1]["skip"]["reason"], "not-a-gpu-pod");

    // A document that cannot be used is reported in place; the command exits 2 at the end.
    files.write(
        "bad.yaml",
        &format!(
            "{VLLM}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: x}}\nspec: {{containers: 3}}\n"
        ),
    );
    let o = preview(&files, "bad.yaml", &[]);
    let err = unusable(&o);
    assert!(err.contains("1 document(s) could not be read"), "{err}");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&stdout(&o)).unwrap();
    assert_eq!(docs[0]["kind"], "Pod");
    assert!(
        docs[1]["error"]
            .as_str()
            .unwrap()
            .contains("spec.containers"),
        "{}",
        docs[1]
    );

    files.write("none.yaml", &format!("{service}---\n{service}"));
    let err = unusable(&preview(&files, "none.yaml", &[]));
    assert!(
        err.contains("none of the 2 documents has a pod template"),
        "{err}"
    );
}

#[test]
fn stdin_is_read_once() {
    let files = Files::new();
    let mut child = webhook()
        .args([
            "preview",
            "-f",
            "-",
            "--catalog",
            CATALOG,
            "--storage-class",
            &files.path("sc.yaml"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(VLLM.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    rewritten(&o);
    let o = webhook()
        .args([
            "preview",
            "-f",
            "-",
            "--catalog",
            "-",
            "--storage-class",
            &files.path("sc.yaml"),
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = unusable(&o);
    assert!(err.contains("standard input"), "{err}");
}

#[test]
fn unusable_inputs_exit_2_with_the_file_and_field() {
    let files = Files::new();
    let base = |extra: &[&str]| {
        let mut args: Vec<String> = vec!["preview".into(), "-f".into(), files.path("pod.yaml")];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        webhook().args(args).output().unwrap()
    };
    let sc = files.path("sc.yaml");
    // Missing files.
    let err = unusable(&base(&[
        "--catalog",
        "/nonexistent/catalog.yaml",
        "--storage-class",
        &sc,
    ]));
    assert!(err.contains("/nonexistent/catalog.yaml"), "{err}");
    // An invalid catalog names the field.
    let bad_catalog = files.write("catalog.yaml", "apiVersion: storage.nvcf.nvidia.com/v1alpha1\nkind: StorageCapabilityCatalog\ndrivers: []\n");
    let err = unusable(&base(&[
        "--catalog",
        bad_catalog.to_str().unwrap(),
        "--storage-class",
        &sc,
    ]));
    assert!(
        err.contains("catalog.yaml") && err.contains("drivers"),
        "{err}"
    );
    // Not the model cache StorageClass, or not a StorageClass.
    let other = files.write(
        "other-sc.yaml",
        &WEKA_SC.replace("name: nvcf-sc", "name: standard"),
    );
    let err = unusable(&base(&[
        "--catalog",
        CATALOG,
        "--storage-class",
        other.to_str().unwrap(),
    ]));
    assert!(
        err.contains("metadata.name") && err.contains("nvcf-sc"),
        "{err}"
    );
    let err = unusable(&base(&[
        "--catalog",
        CATALOG,
        "--storage-class",
        &files.path("pod.yaml"),
    ]));
    assert!(
        err.contains("expected storage.k8s.io/v1 StorageClass"),
        "{err}"
    );
    // A CSIDriver of another name.
    let csi = files.write(
        "csi.yaml",
        "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: other.csi}\nspec: {}\n",
    );
    let err = unusable(&base(&[
        "--catalog",
        CATALOG,
        "--storage-class",
        &sc,
        "--csidriver",
        csi.to_str().unwrap(),
    ]));
    assert!(
        err.contains("csi.yaml") && err.contains("csi.weka.io"),
        "{err}"
    );
    // A binding file that is not a binding.
    let err = unusable(&base(&[
        "--catalog",
        CATALOG,
        "--storage-class",
        &sc,
        "--binding",
        &sc,
    ]));
    assert!(err.contains("ModelCacheBinding"), "{err}");
    // Command-line errors (clap) and invalid options.
    unusable(&base(&[
        "--catalog",
        CATALOG,
        "--storage-class",
        &sc,
        "--namespace-labels",
        "novalue",
    ]));
    let err = unusable(&base(&[
        "--catalog",
        CATALOG,
        "--storage-class",
        &sc,
        "--feature-gates",
        "Nope=true",
    ]));
    assert!(err.contains("unknown feature gate"), "{err}");
    let err = unusable(&base(&[
        "--catalog",
        CATALOG,
        "--storage-class",
        &sc,
        "--gpu-resource",
        "gpu",
    ]));
    assert!(err.contains("gpuResources[0]"), "{err}");
    unusable(&base(&["--storage-class", &sc]));
    // A pod that does not decode.
    files.write(
        "broken.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: 3}\n",
    );
    let o = webhook()
        .args([
            "preview",
            "-f",
            &files.path("broken.yaml"),
            "--catalog",
            CATALOG,
            "--storage-class",
            &sc,
        ])
        .output()
        .unwrap();
    let err = unusable(&o);
    assert!(err.contains("broken.yaml: spec.containers"), "{err}");
}

#[test]
fn a_storage_class_without_uid_is_previewed_with_a_note() {
    let files = Files::new();
    files.write(
        "sc.yaml",
        &WEKA_SC.replace(", uid: 5f0c1f3e-8a59-4c2a-9d0e-1b2c3d4e5f60", ""),
    );
    let o = preview(&files, "pod.yaml", &[]);
    rewritten(&o);
    assert!(stderr(&o).contains("has no metadata.uid"), "{}", stderr(&o));
}

#[test]
fn the_trace_annotation_is_the_one_the_controllers_read() {
    assert_eq!(
        warmcache_modelvolume::keys::TRACE_PARENT_ANNOTATION,
        warmcache_telemetry::TRACE_PARENT_ANNOTATION
    );
}

#[test]
fn every_model_volume_fixture_previews() {
    // The fixtures of pkg/modelvolume, through the binary: each prints a pod or a skip.
    let files = Files::new();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../pkg/modelvolume/tests/fixtures");
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let o = webhook()
            .args([
                "preview",
                "-f",
                p.to_str().unwrap(),
                "--catalog",
                CATALOG,
                "--storage-class",
                &files.path("sc.yaml"),
                "-n",
                "team-a",
            ])
            .output()
            .unwrap();
        ok(&o);
        let out = stdout(&o);
        let first: Value = serde_saphyr::from_multiple::<Value>(&out)
            .unwrap()
            .into_iter()
            .next()
            .unwrap();
        assert!(
            first.get("kind").is_some()
                || first.get("reason").is_some()
                || first.get("skip").is_some(),
            "{}: {out}",
            p.display()
        );
        n += 1;
    }
    assert!(n >= 20);
}
