//! `webhook identify` end to end: the built binary, real files, exit codes and stdout.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

fn webhook() -> Command {
    Command::new(env!("CARGO_BIN_EXE_webhook"))
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn identify(args: &[&str]) -> Output {
    webhook().arg("identify").args(args).output().unwrap()
}

/// `webhook identify -f -` with `input` on standard input.
fn identify_stdin(input: &str) -> Output {
    let mut child = webhook()
        .args(["identify", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn stdout_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is one JSON object ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

const VLLM_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: qwen}
spec:
  containers:
    - name: vllm
      image: vllm/vllm-openai:v0.20.0
      command: ["vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct", "--revision", "abc123"]
      env:
        - {name: HF_HOME, value: /models/hf}
      volumeMounts:
        - {name: hf, mountPath: /models}
  volumes:
    - name: hf
      emptyDir: {}
"#;

#[test]
fn pod_prints_exactly_the_specified_object() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "pod.yaml", VLLM_POD);
    let out = identify(&["-f", f.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout_json(&out),
        json!({
            "uri": "hf://meta-llama/Llama-3.1-70B-Instruct@abc123",
            "source": "vllm serve <model>",
            "downloader": "engine",
            "initContainer": null,
            "landing": {"path": "/models/hf", "volume": "hf", "kind": "emptyDir", "substitutable": true}
        })
    );
}

#[test]
fn init_download_names_the_init_container() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "pod.json",
        r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "k"},
            "spec": {"initContainers": [{"name": "storage-initializer", "image": "kserve/storage-initializer:v0.15.0",
                                         "args": ["hf://Qwen/Qwen3-0.6B", "/mnt/models"],
                                         "volumeMounts": [{"name": "kserve-provision-location", "mountPath": "/mnt/models"}]}],
                     "containers": [{"name": "kserve-container", "image": "kserve/huggingfaceserver:v0.15.0",
                                     "volumeMounts": [{"name": "kserve-provision-location", "mountPath": "/mnt/models"}]}],
                     "volumes": [{"name": "kserve-provision-location", "emptyDir": {}}]}}"#,
    );
    let out = identify(&["-f", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let v = stdout_json(&out);
    assert_eq!(v["uri"], "hf://Qwen/Qwen3-0.6B");
    assert_eq!(v["downloader"], "init");
    assert_eq!(v["initContainer"], "storage-initializer");
    assert_eq!(v["source"], "kserve storage-initializer");
}

#[test]
fn unresolved_pod_prints_null_uri_and_reason_with_exit_0() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "etcd.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: etcd}\nspec:\n  containers:\n    - {name: etcd, image: quay.io/coreos/etcd:v3.6.5, command: [etcd]}\n",
    );
    let out = identify(&["-f", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let v = stdout_json(&out);
    assert_eq!(v.as_object().unwrap().len(), 2, "only uri and reason: {v}");
    assert!(v["uri"].is_null());
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .contains("no init container downloads")
    );
}

#[test]
fn deployment_uses_its_pod_template() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "deploy.yaml",
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: sglang}
spec:
  selector: {matchLabels: {app: sglang}}
  template:
    metadata: {labels: {app: sglang}}
    spec:
      containers:
        - name: sglang
          image: lmsysorg/sglang:latest
          command: ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B"]
          volumeMounts: [{name: cache, mountPath: /root/.cache/huggingface}]
      volumes: [{name: cache, hostPath: {path: /mnt/hf}}]
"#,
    );
    let out = identify(&["-f", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let v = stdout_json(&out);
    assert_eq!(v["uri"], "hf://Qwen/Qwen3-8B");
    assert_eq!(v["landing"]["kind"], "hostPath");
    assert_eq!(v["landing"]["substitutable"], false);
}

const STS: &str = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: vllm}
spec:
  serviceName: vllm
  selector: {matchLabels: {app: vllm}}
  template:
    metadata: {labels: {app: vllm}}
    spec:
      containers:
        - name: vllm
          image: vllm/vllm-openai:v0.20.0
          command: ["vllm", "serve", "Qwen/Qwen3-14B"]
          volumeMounts: [{name: cache, mountPath: /root/.cache/huggingface}]
  volumeClaimTemplates:
    - metadata: {name: cache}
      spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 100Gi}}}
"#;

#[test]
fn statefulset_claim_template_is_a_substitutable_pod_claim() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "sts.yaml", STS);
    let out = identify(&["-f", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let v = stdout_json(&out);
    assert_eq!(
        v["landing"],
        json!({"path": "/root/.cache/huggingface", "volume": "cache", "kind": "podClaim", "substitutable": true})
    );
}

const LWS: &str = r#"
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata: {name: vllm}
spec:
  leaderWorkerTemplate:
    size: 2
    leaderTemplate:
      spec:
        containers:
          - name: leader
            image: vllm/vllm-openai:v0.20.0
            command: ["sh", "-c", "bash multi-node-serving.sh leader; vllm serve --model meta-llama/Meta-Llama-3.1-405B-Instruct --tensor-parallel-size 8"]
    workerTemplate:
      spec:
        containers:
          - name: worker
            image: vllm/vllm-openai:v0.20.0
            command: ["sh", "-c", "bash multi-node-serving.sh worker"]
"#;

const WORKER: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: vllm-0-1
  labels:
    leaderworkerset.sigs.k8s.io/name: vllm
    leaderworkerset.sigs.k8s.io/worker-index: "1"
spec:
  containers:
    - name: worker
      image: vllm/vllm-openai:v0.20.0
      command: ["sh", "-c", "bash multi-node-serving.sh worker"]
      volumeMounts: [{name: hf, mountPath: /root/.cache/huggingface}]
  volumes: [{name: hf, emptyDir: {}}]
"#;

#[test]
fn leaderworkerset_object_uses_its_leader_template() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "lws.yaml", LWS);
    let out = identify(&["-f", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let v = stdout_json(&out);
    assert_eq!(v["uri"], "hf://meta-llama/Meta-Llama-3.1-405B-Instruct");
    assert_eq!(v["source"], "--model");
}

#[test]
fn worker_takes_the_leader_identity_from_lws_flag() {
    let dir = tempfile::tempdir().unwrap();
    let pod = write(dir.path(), "worker.yaml", WORKER);
    let lws = write(dir.path(), "lws.yaml", LWS);
    let out = identify(&["-f", pod.to_str().unwrap(), "--lws", lws.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout_json(&out),
        json!({
            "uri": "hf://meta-llama/Meta-Llama-3.1-405B-Instruct",
            "source": "lws leader template: --model",
            "downloader": "engine",
            "initContainer": null,
            "landing": {"path": "/root/.cache/huggingface", "volume": "hf", "kind": "emptyDir", "substitutable": true}
        })
    );
}

#[test]
fn worker_without_lws_is_unresolved_and_says_how_to_fix_it() {
    let dir = tempfile::tempdir().unwrap();
    let pod = write(dir.path(), "worker.yaml", WORKER);
    let out = identify(&["-f", pod.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let v = stdout_json(&out);
    assert!(v["uri"].is_null());
    assert!(v["reason"].as_str().unwrap().contains("--lws"), "{v}");
}

#[test]
fn lws_of_another_group_is_an_input_error() {
    let dir = tempfile::tempdir().unwrap();
    let pod = write(dir.path(), "worker.yaml", WORKER);
    let lws = write(
        dir.path(),
        "lws.yaml",
        &LWS.replace("metadata: {name: vllm}", "metadata: {name: other}"),
    );
    let out = identify(&["-f", pod.to_str().unwrap(), "--lws", lws.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"other\""));
}

#[test]
fn stdin_is_read_with_dash() {
    let out = identify_stdin(VLLM_POD);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        stdout_json(&out)["uri"],
        "hf://meta-llama/Llama-3.1-70B-Instruct@abc123"
    );
}

#[test]
fn unreadable_or_unusable_input_exits_2_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(PathBuf, &str)> = vec![
        (dir.path().join("missing.yaml"), "cannot read"),
        (
            write(dir.path(), "bad.yaml", "kind: Pod\nspec: [unclosed\n"),
            "not YAML or JSON",
        ),
        (
            write(dir.path(), "scalar.yaml", "just a string\n"),
            "not a Kubernetes object",
        ),
        (write(dir.path(), "empty.yaml", ""), "no object"),
        (PathBuf::from("/dev/zero"), "larger than 4194304 bytes"),
        (
            write(dir.path(), "binary.yaml", "kind: Pod\n\u{0}"),
            "not YAML or JSON",
        ),
        (
            write(
                dir.path(),
                "stream-without-pods.yaml",
                "apiVersion: v1\nkind: Service\n---\napiVersion: v1\nkind: ConfigMap\n",
            ),
            "none of the 2 documents has a pod template",
        ),
        (
            write(dir.path(), "nokind.yaml", "spec: {containers: []}\n"),
            "kind: missing",
        ),
        (
            write(
                dir.path(),
                "svc.yaml",
                "apiVersion: v1\nkind: Service\nspec: {}\n",
            ),
            "\"Service\"",
        ),
        (
            write(
                dir.path(),
                "typed.yaml",
                "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n    - name: a\n      env: 3\n",
            ),
            "spec.containers[0].env",
        ),
        (
            write(
                dir.path(),
                "deploy.yaml",
                "apiVersion: apps/v1\nkind: Deployment\nspec: {}\n",
            ),
            "spec.template: missing",
        ),
    ];
    for (path, fragment) in cases {
        let out = identify(&["-f", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{}: stderr {stderr}",
            path.display()
        );
        assert!(
            out.stdout.is_empty(),
            "{}: nothing on stdout",
            path.display()
        );
        assert!(
            stderr.contains(fragment),
            "{}: {stderr:?} should contain {fragment:?}",
            path.display()
        );
        assert!(
            stderr.contains(&path.display().to_string()),
            "the message names the file: {stderr}"
        );
    }
}

#[test]
fn usage_errors_exit_2() {
    let out = webhook().arg("identify").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = webhook().arg("serve").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "no other subcommand exists yet");
}

#[test]
fn serve_refuses_an_answer_reuse_window_out_of_range_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    for value in ["60001", "-1", "1.5", "1s"] {
        let out = webhook()
            .args(["serve", "--tls-dir"])
            .arg(dir.path())
            .arg(format!("--answer-reuse-ms={value}"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{value}: {stderr}");
        assert!(stderr.contains("--answer-reuse-ms"), "{value}: {stderr}");
        assert!(stderr.contains(value), "{value}: {stderr}");
    }
}

#[test]
fn customer_claim_below_an_empty_dir_landing_is_not_substitutable() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "pod.yaml",
        r#"
apiVersion: v1
kind: Pod
metadata: {name: qwen}
spec:
  containers:
    - name: vllm
      image: vllm/vllm-openai:v0.20.0
      args: [--model, Qwen/Qwen3-0.6B]
      env:
        - {name: HF_HOME, value: /models}
      volumeMounts:
        - {name: scratch, mountPath: /models}
        - {name: team, mountPath: /models/hub}
  volumes:
    - name: scratch
      emptyDir: {}
    - name: team
      persistentVolumeClaim: {claimName: team-hf-cache}
"#,
    );
    let out = identify(&["-f", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let v = stdout_json(&out);
    assert_eq!(v["landing"]["kind"], "pvc");
    assert_eq!(v["landing"]["volume"], "team");
    assert_eq!(v["landing"]["substitutable"], false);
    let nested = v["landing"]["nested"].as_str().unwrap();
    assert!(
        nested.starts_with("spec.containers[0].volumeMounts[1]: "),
        "{nested}"
    );
}

#[test]
fn custom_hf_endpoint_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "pod.yaml",
        r#"
apiVersion: v1
kind: Pod
metadata: {name: qwen}
spec:
  containers:
    - name: vllm
      image: vllm/vllm-openai:v0.20.0
      args: [--model, Qwen/Qwen3-0.6B]
      env:
        - {name: HF_ENDPOINT, value: "https://hf-mirror.internal"}
"#,
    );
    let out = identify(&["-f", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let v = stdout_json(&out);
    assert!(v["uri"].is_null(), "{v}");
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("spec.containers[0].env[HF_ENDPOINT]: ")
            && reason.contains("https://hf-mirror.internal"),
        "{reason}"
    );
}

/// What `helm template` prints: comments, empty documents, objects without pod templates, YAML
/// 1.1 octal file modes (read as octal, as kubectl reads them) and workloads.
const HELM_STREAM: &str = r#"---
# Source: llm/templates/service.yaml
apiVersion: v1
kind: Service
metadata:
  name: llm
spec:
  ports: [{port: 8000}]
---
# Source: llm/templates/configmap.yaml
apiVersion: v1
kind: ConfigMap
metadata:
  name: llm-scripts
data:
  start.sh: "exec vllm serve"
---
# Source: llm/templates/deployment.yaml
apiVersion: apps/v1
kind: Deployment
metadata:
  name: llm
  namespace: inference
spec:
  selector: {matchLabels: {app: llm}}
  template:
    metadata: {labels: {app: llm}}
    spec:
      containers:
        - name: vllm
          image: vllm/vllm-openai:v0.20.0
          command: ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--revision", "abc123"]
          volumeMounts:
            - {name: scripts, mountPath: /scripts}
            - {name: token, mountPath: /secrets/hf, readOnly: true}
      volumes:
        - name: scripts
          configMap: {name: llm-scripts, defaultMode: 0555}
        - name: token
          secret:
            secretName: hf-token
            items: [{key: token, path: token, mode: 0400}]
---
---
# Source: llm/templates/job.yaml
apiVersion: batch/v1
kind: Job
metadata:
  name: warmup
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: curl
          image: curlimages/curl:8.11.0
          command: ["curl", "http://llm:8000/health"]
"#;

/// The concatenated pretty JSON values on stdout.
fn stdout_values(out: &Output) -> Vec<Value> {
    serde_json::Deserializer::from_slice(&out.stdout)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
fn a_helm_template_stream_reports_each_pod_template() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "rendered.yaml", HELM_STREAM);
    let out = identify(&["-f", f.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let entries = stdout_values(&out);
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert_eq!(
        entries[0]["object"],
        json!({"document": 2, "apiVersion": "apps/v1", "kind": "Deployment", "namespace": "inference", "name": "llm"})
    );
    assert_eq!(
        entries[0]["report"]["uri"],
        "hf://meta-llama/Llama-3.1-8B-Instruct@abc123"
    );
    assert_eq!(
        entries[1]["object"],
        json!({"document": 3, "apiVersion": "batch/v1", "kind": "Job", "name": "warmup"})
    );
    assert_eq!(entries[1]["report"]["uri"], Value::Null);
}

#[test]
fn the_stream_is_read_from_standard_input() {
    let out = identify_stdin(HELM_STREAM);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(stdout_values(&out).len(), 2);
}

#[test]
fn yaml_1_1_octal_modes_read_as_kubectl_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let pod = VLLM_POD.replace(
        "      emptyDir: {}\n",
        "      emptyDir: {}\n    - name: cfg\n      configMap: {name: c, defaultMode: 0555, items: [{key: a, path: a, mode: 0400}]}\n",
    );
    assert!(pod.contains("0555"));
    let f = write(dir.path(), "pod.yaml", &pod);
    let out = identify(&["-f", f.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout_json(&out)["uri"],
        "hf://meta-llama/Llama-3.1-70B-Instruct@abc123"
    );
}

#[test]
fn a_broken_document_in_a_stream_is_an_entry_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let stream = format!(
        "{HELM_STREAM}---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: broken}}\nspec: {{}}\n"
    );
    let f = write(dir.path(), "rendered.yaml", &stream);
    let out = identify(&["-f", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let entries = stdout_values(&out);
    assert_eq!(entries.len(), 3, "the good ones are still reported");
    assert_eq!(entries[2]["object"]["name"], "broken");
    assert_eq!(entries[2]["error"], "spec.template: missing");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("1 document(s) could not be read"),
        "{stderr}"
    );
}

#[test]
fn standard_input_is_read_at_most_once() {
    let out = identify(&["-f", "-", "--lws", "-"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("-f and --lws both read standard input"),
        "{stderr}"
    );
}

#[test]
fn a_worker_finds_its_leader_worker_set_in_the_same_stream() {
    let dir = tempfile::tempdir().unwrap();
    let stream = format!("{LWS}---\n{WORKER}");
    let f = write(dir.path(), "rendered.yaml", &stream);
    let out = identify(&["-f", f.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let entries = stdout_values(&out);
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0]["report"]["uri"], entries[1]["report"]["uri"]);
    assert!(entries[1]["report"]["uri"].is_string(), "{entries:?}");
}

#[test]
fn an_expansion_bomb_is_left_alone_with_a_bounded_report() {
    // A few hundred bytes whose script doubles a variable 64 times: 2^64 bytes if expanded.
    let script = format!("A=x; {} exec vllm serve \"$A\"", "A=$A$A; ".repeat(64));
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bomb"},
        "spec": {"containers": [{
            "name": "vllm",
            "image": "vllm/vllm-openai:v0.20.0",
            "command": ["sh", "-c", script],
        }]},
    });
    let dir = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "bomb.json", &pod.to_string());
    let out = identify(&["-f", f.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.len() < 4096, "{} bytes", out.stdout.len());
    let v = stdout_json(&out);
    assert_eq!(v["uri"], Value::Null);
    assert!(
        v["reason"].as_str().unwrap().contains("MAX_"),
        "the reason names the bound: {v}"
    );
}

#[test]
fn stream_entries_escape_invisible_characters() {
    let stream = format!(
        "{HELM_STREAM}---\napiVersion: apps/v1\nkind: Job\nmetadata: {{name: \"job\\u202e\\u200b\"}}\nspec: {{template: {{spec: {{containers: [{{name: a, image: busybox}}]}}}}}}\n"
    );
    let out = identify_stdin(&stream);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let entries = stdout_values(&out);
    assert_eq!(entries[2]["object"]["name"], "job\\u{202e}\\u{200b}");
}
