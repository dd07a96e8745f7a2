//! The `kvcache-operator` binary end to end: `validate` and `render` exit codes and output, and
//! `webhook` serving a real API server until SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use warmcache_kvcache::vectors::{self, managed, members, tier0, with};
use warmcache_testkit::{ControlPlane, WebhookPki, wait_for_webhook};

const BIN: &str = env!("CARGO_BIN_EXE_kvcache-operator");

fn write(dir: &Path, name: &str, value: &Value) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, serde_saphyr::to_string(value).unwrap()).unwrap();
    path
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("KV_CACHE_BACKEND_IMAGE")
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

#[test]
fn validate_admits_with_ok_and_exit_0() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "v2.yaml", &vectors::v2());
    let output = run(&["validate", "-f", file.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "ok\n");
}

#[test]
fn validate_refuses_with_one_line_per_refusal_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let bad = with(vectors::v2(), |o| {
        members(o)[0]["capacityPerMember"] = json!("8Mi");
        tier0(o)["keyLimit"] = json!(63);
        managed(o)["leader"]["extraArgs"] = json!(["-enable_offload=false"]);
    });
    let file = write(dir.path(), "bad.yaml", &bad);
    let output = run(&["validate", "-f", file.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    let text = stdout(&output);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    let paths: Vec<&str> = lines
        .iter()
        .map(|l| l.split_once(": ").unwrap().0)
        .collect();
    assert!(paths.contains(&"spec.connection.managed.members[0].capacityPerMember"));
    assert!(paths.contains(&"spec.connection.managed.members[0].localDisks[0].keyLimit"));
    assert!(paths.contains(&"spec.connection.managed.leader.extraArgs[0]"));
}

#[test]
fn validate_reports_schema_problems_with_their_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "x15.yaml",
        &with(vectors::v2(), |o| {
            tier0(o)["eviction"]["policy"] = json!("MRU")
        }),
    );
    let output = run(&["validate", "-f", file.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stdout(&output)
            .starts_with("spec.connection.managed.members[0].localDisks[0].eviction.policy: "),
        "{}",
        stdout(&output)
    );
}

#[test]
fn validate_exits_2_for_unusable_input() {
    let dir = tempfile::tempdir().unwrap();
    let not_yaml = dir.path().join("broken.yaml");
    std::fs::write(&not_yaml, "spec: [unclosed\n").unwrap();
    let config_map = dir.path().join("cm.yaml");
    std::fs::write(
        &config_map,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
    )
    .unwrap();
    for (file, expected) in [
        (not_yaml.to_str().unwrap(), "not YAML"),
        (
            config_map.to_str().unwrap(),
            "not a worker.gpustack.ai/v1alpha1 KVCacheBackend",
        ),
        ("/nonexistent/new.yaml", "cannot read /nonexistent/new.yaml"),
        ("/dev/zero", "larger than 4194304 bytes"),
    ] {
        let output = run(&["validate", "-f", file]);
        assert_eq!(output.status.code(), Some(2), "{file}");
        assert_eq!(stdout(&output), "", "{file}");
        assert!(
            stderr(&output).contains(expected),
            "{file}: {}",
            stderr(&output)
        );
    }
    // A missing -f is a usage error (clap), also exit 2.
    assert_eq!(run(&["validate"]).status.code(), Some(2));
}

#[test]
fn validate_from_standard_input() {
    let mut child = Command::new(BIN)
        .args(["validate", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(&vectors::v1()).unwrap().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(stdout(&output), "ok\n");
}

#[test]
fn standard_input_is_read_at_most_once() {
    let output = run(&["validate", "-f", "-", "--old", "-"]);
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(stdout(&output), "");
    assert!(
        stderr(&output).contains("-f and --old both read standard input"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn validate_with_old_applies_the_transition_rules_and_ratchets() {
    let dir = tempfile::tempdir().unwrap();
    // X26: the tier path is frozen.
    let old = write(dir.path(), "old.yaml", &vectors::v2());
    let moved = write(
        dir.path(),
        "moved.yaml",
        &with(vectors::v2(), |o| tier0(o)["path"] = json!("/var/lib/kv2")),
    );
    let output = run(&[
        "validate",
        "-f",
        moved.to_str().unwrap(),
        "--old",
        old.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stdout(&output).starts_with("spec.connection.managed.members[0].localDisks[0].path: "));
    // Without --old the same object is a valid create.
    assert_eq!(
        run(&["validate", "-f", moved.to_str().unwrap()])
            .status
            .code(),
        Some(0)
    );

    // Ratchet: a 1Mi tier stored under older rules stays editable elsewhere.
    let small = with(vectors::v2(), |o| tier0(o)["capacity"] = json!("1Mi"));
    let old = write(dir.path(), "small.yaml", &small);
    let keys = write(
        dir.path(),
        "keys.yaml",
        &with(small.clone(), |o| tier0(o)["keyLimit"] = json!(20_000_000)),
    );
    let output = run(&[
        "validate",
        "-f",
        keys.to_str().unwrap(),
        "--old",
        old.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stdout(&output));
    let finalizer = write(
        dir.path(),
        "finalizer.yaml",
        &with(small, |o| {
            o["metadata"]["finalizers"] = json!(["worker.gpustack.ai/x"])
        }),
    );
    let output = run(&[
        "validate",
        "-f",
        finalizer.to_str().unwrap(),
        "--old",
        old.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stdout(&output));
}

#[test]
fn validate_with_old_admits_a_metadata_only_update_of_an_object_that_no_longer_decodes() {
    let dir = tempfile::tempdir().unwrap();
    // Stored by a newer operator: a medium this one does not know.
    let stored = with(vectors::v2(), |o| members(o)[0]["medium"] = json!("HBM"));
    let old = write(dir.path(), "old.yaml", &stored);
    let released = write(
        dir.path(),
        "released.yaml",
        &with(stored, |o| o["metadata"]["finalizers"] = json!([])),
    );
    let output = run(&[
        "validate",
        "-f",
        released.to_str().unwrap(),
        "--old",
        old.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "ok\n");

    // A spec change of that stored object cannot be judged: exit 2, naming the problem.
    let edited = write(dir.path(), "edited.yaml", &vectors::v2());
    let output = run(&[
        "validate",
        "-f",
        edited.to_str().unwrap(),
        "--old",
        old.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(2), "{}", stdout(&output));
    assert!(
        stderr(&output).contains("spec.connection.managed.members[0].medium: "),
        "{}",
        stderr(&output)
    );
}

#[test]
fn the_default_image_setting_comes_from_the_flag_or_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "noimage.yaml",
        &with(vectors::v1(), |o| {
            o["spec"].as_object_mut().unwrap().remove("image");
        }),
    );
    let path = file.to_str().unwrap();
    let output = run(&["validate", "-f", path]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stdout(&output).starts_with("spec.image: an image is required"));
    let output = run(&["validate", "-f", path, "--default-image", "repo/store:1"]);
    assert_eq!(output.status.code(), Some(0));
    let output = Command::new(BIN)
        .args(["render", "-f", path])
        .env("KV_CACHE_BACKEND_IMAGE", "repo/store:2")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stdout(&output).contains("image: repo/store:2"));
}

#[test]
fn a_bad_default_image_stops_every_command_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "v1.yaml", &vectors::v1());
    let path = file.to_str().unwrap();
    let huge = format!("repo/{}", "a".repeat(120_000));
    for image in [
        "repo/store 1",
        "repo/store:1\nx",
        huge.as_str(),
        "  ",
        "Repo/Store",
    ] {
        for args in [
            vec!["validate", "-f", path, "--default-image", image],
            vec!["render", "-f", path, "--default-image", image],
        ] {
            let output = run(&args);
            assert_eq!(output.status.code(), Some(2), "{image:?}");
            assert_eq!(stdout(&output), "", "nothing rendered for {image:?}");
            let err = stderr(&output);
            assert!(
                err.contains("--default-image / KV_CACHE_BACKEND_IMAGE: the default image "),
                "{err}"
            );
            assert!(
                err.len() < 600,
                "the value is shown bounded: {} bytes",
                err.len()
            );
            assert_eq!(err.lines().count(), 1, "{err}");
        }
        let output = Command::new(BIN)
            .args(["render", "-f", path])
            .env("KV_CACHE_BACKEND_IMAGE", image)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "env {image:?}");
        assert_eq!(stdout(&output), "");
    }
    // The webhook refuses it before it binds anything.
    let output = run(&[
        "webhook",
        "--tls-dir",
        dir.path().to_str().unwrap(),
        "--default-image",
        "repo/store 1",
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("--default-image"),
        "{}",
        stderr(&output)
    );
    // Padding is trimmed, as for spec.image.
    let output = run(&["validate", "-f", path, "--default-image", " repo/store:1 "]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[test]
fn render_prints_the_objects_as_a_yaml_stream() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "v9.yaml",
        &with(vectors::v9(), |o| {
            o["metadata"]["uid"] = json!("6a3f9f4e-0b1c-4d2e-9f00-123456789abc")
        }),
    );
    let output = run(&["render", "-f", file.to_str().unwrap(), "--namespace", "kv"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        stderr(&output),
        "",
        "a backend with a uid renders without notes"
    );
    let docs: Vec<Value> = serde_saphyr::from_multiple::<Value>(&stdout(&output))
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect();
    let kinds: Vec<(&str, &str)> = docs
        .iter()
        .map(|d| {
            (
                d["kind"].as_str().unwrap(),
                d["metadata"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("Deployment", "kvc-leader"),
            ("Service", "kvc-leader"),
            ("DaemonSet", "kvc-member-0"),
            ("DaemonSet", "kvc-member-1"),
        ]
    );
    assert!(docs.iter().all(|d| d["metadata"]["namespace"] == "kv"));
    assert_eq!(
        docs[3]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
        90
    );
    assert_eq!(
        docs[0]["metadata"]["ownerReferences"][0]["kind"],
        "KVCacheBackend"
    );
    // Deterministic: a second run prints the same bytes.
    let again = run(&["render", "-f", file.to_str().unwrap(), "--namespace", "kv"]);
    assert_eq!(again.stdout, output.stdout);
}

#[test]
fn render_applies_the_store_image_user_rules_and_refuses_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "v1.yaml", &vectors::v1());
    let file = file.to_str().unwrap();
    let pod_contexts = |output: &Output| -> Vec<Value> {
        serde_saphyr::from_multiple::<Value>(&stdout(output))
            .unwrap()
            .into_iter()
            .filter(|d| d["kind"] == "Deployment" || d["kind"] == "DaemonSet")
            .map(|d| d["spec"]["template"]["spec"]["securityContext"].clone())
            .collect()
    };
    let restricted = run(&["render", "-f", file]);
    assert_eq!(restricted.status.code(), Some(0), "{}", stderr(&restricted));
    for c in pod_contexts(&restricted) {
        assert_eq!(c["runAsNonRoot"], true);
    }
    let output = run(&[
        "render",
        "-f",
        file,
        "--store-image-user",
        "other.example.com/x=7,docker.io/kvcacheai/mooncake=1000",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    for c in pod_contexts(&output) {
        assert_eq!(
            (c["runAsNonRoot"].clone(), c["runAsUser"].clone()),
            (json!(true), json!(1000))
        );
    }
    let output = run(&["render", "-f", file, "--store-image-user", "*=image"]);
    for c in pod_contexts(&output) {
        assert_eq!(c.get("runAsNonRoot"), None, "{c}");
    }
    let bad = run(&[
        "render",
        "-f",
        file,
        "--store-image-user",
        "docker.io/kvcacheai/mooncake=0",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("the user must be a numeric uid above 0"),
        "{}",
        stderr(&bad)
    );
}

#[test]
fn render_of_an_ha_backend_includes_the_accounts_its_pods_name() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "ha.yaml",
        &with(vectors::v1(), |o| {
            managed(o)["leader"] =
                json!({"replicas": 3, "highAvailability": {"memberAddressing": "Lease"}});
        }),
    );
    let output = run(&["render", "-f", file.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let docs: Vec<Value> = serde_saphyr::from_multiple::<Value>(&stdout(&output))
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect();
    let kinds: Vec<String> = docs
        .iter()
        .map(|d| {
            format!(
                "{}/{}",
                d["kind"].as_str().unwrap(),
                d["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "ServiceAccount/kvc-leader",
            "ServiceAccount/kvc-member",
            "Role/kvc-leader",
            "Role/kvc-member",
            "RoleBinding/kvc-leader",
            "RoleBinding/kvc-member",
            "Deployment/kvc-leader",
            "Service/kvc-leader",
            "DaemonSet/kvc-member-0",
        ]
    );
    // Every account a Pod names is in the same stream.
    let accounts: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "ServiceAccount")
        .map(|d| &d["metadata"]["name"])
        .collect();
    for workload in docs
        .iter()
        .filter(|d| d["kind"] == "Deployment" || d["kind"] == "DaemonSet")
    {
        let named = &workload["spec"]["template"]["spec"]["serviceAccountName"];
        assert!(accounts.contains(&named), "{named}");
    }
}

#[test]
fn render_refuses_what_validate_refuses_and_bad_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let bad = write(
        dir.path(),
        "x3.yaml",
        &with(vectors::v2(), |o| tier0(o)["capacity"] = json!("1Mi")),
    );
    let output = run(&["render", "-f", bad.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stdout(&output).starts_with("spec.connection.managed.members[0].localDisks[0].capacity: ")
    );
    assert!(!stdout(&output).contains("kind:"));

    let good = write(dir.path(), "v1.yaml", &vectors::v1());
    let output = run(&[
        "render",
        "-f",
        good.to_str().unwrap(),
        "--namespace",
        "Bad_NS",
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("--namespace"),
        "{}",
        stderr(&output)
    );

    let output = run(&["render", "-f", good.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0));
    assert!(
        stderr(&output).contains("no metadata.uid"),
        "{}",
        stderr(&output)
    );

    let external = write(dir.path(), "external.yaml", &vectors::external());
    let output = run(&["render", "-f", external.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(stdout(&output), "");
    assert!(stderr(&output).contains("external backend"));
}

/// A plain HTTP/1.1 GET; returns (status, body).
fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.lines().next()?.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn webhook_fails_fast_without_a_usable_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(BIN)
        .args([
            "webhook",
            "--tls-dir",
            dir.path().to_str().unwrap(),
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--admin-listen",
            &format!("127.0.0.1:{}", free_port()),
        ])
        .output()
        .unwrap();
    // An unusable certificate is unusable input: exit 2, as for every command.
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("tls.crt"), "{}", stderr(&output));
}

#[tokio::test]
async fn webhook_serves_the_api_server_and_stops_on_sigterm() {
    let plane = ControlPlane::shared().await.expect("control plane");
    let client = plane.client().await.unwrap();
    let pki = WebhookPki::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tls.crt"), &pki.cert_pem).unwrap();
    std::fs::write(dir.path().join("tls.key"), &pki.key_pem).unwrap();
    let port = free_port();
    let admin = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new(BIN)
        .args([
            "webhook",
            "--tls-dir",
            dir.path().to_str().unwrap(),
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--admin-listen",
            &admin,
            "--log-format",
            "plain",
        ])
        .env("KV_CACHE_BACKEND_IMAGE", vectors::IMAGE)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    let start = Instant::now();
    loop {
        if let Some((200, body)) = http_get(&admin, "/readyz") {
            assert_eq!(body, "ok\n");
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the webhook exited early"
        );
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the webhook never became ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(http_get(&admin, "/livez").map(|r| r.0), Some(200));

    let label = format!("binary-{}", std::process::id());
    // Registered from the configuration `cargo xtask gen` writes to config/webhook/, pointed at
    // this process and restricted to this test's objects.
    let config_name = "kvcache-binary.webhook.warmcache.io";
    let mut config = warmcache_kvcache_operator::webhook::webhook_configurations()
        .unwrap()
        .with_url(&format!("https://127.0.0.1:{port}"), pki.ca_pem.as_bytes())
        .validating
        .unwrap();
    config.metadata.name = Some(config_name.to_owned());
    for webhook in config.webhooks.iter_mut().flatten() {
        webhook.object_selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "warmcache.test/kvcache-binary".to_owned(),
                label.clone(),
            )])),
            match_expressions: None,
        });
    }
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
    let api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("worker.gpustack.ai", "v1alpha1", "KVCacheBackend"),
            "kvcachebackends",
        ),
    );
    let labelled = |value: Value, name: &str| -> DynamicObject {
        let mut value = value;
        value["metadata"]["name"] = json!(name);
        value["metadata"]["labels"] = json!({"warmcache.test/kvcache-binary": label});
        serde_json::from_value(value).unwrap()
    };
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let x19 = labelled(
        with(vectors::v2(), |o| {
            managed(o)["leader"]["extraArgs"] = json!(["-enable_offload=false"])
        }),
        "kvc-binary-x19",
    );
    wait_for_webhook(Duration::from_secs(30), || {
        let api = api.clone();
        let dry = dry.clone();
        let x19 = x19.clone();
        async move {
            matches!(api.create(&dry, &x19).await,
                Err(kube::Error::Api(s)) if s.message.contains("spec.connection.managed.leader.extraArgs[0]: "))
        }
    })
    .await
    .expect("the binary's webhook refuses X19");
    // The default image setting reached the binary: a backend without an image is admitted.
    let no_image = labelled(
        with(vectors::v1(), |o| {
            o["spec"].as_object_mut().unwrap().remove("image");
        }),
        "kvc-binary-noimage",
    );
    api.create(&dry, &no_image)
        .await
        .expect("admitted with the default image");

    let (status, metrics) = http_get(&admin, "/metrics").unwrap();
    assert_eq!(status, 200);
    assert!(
        metrics.contains("warmcache_admission_reviews_total{route=\"/validate-kvcachebackends\",verdict=\"denied\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("verdict=\"allowed\""), "{metrics}");

    warmcache_testkit::delete_validating_webhook(&client, config_name)
        .await
        .unwrap();
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let start = Instant::now();
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the webhook did not stop on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut logs = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut logs)
        .unwrap();
    assert_eq!(exit.code(), Some(0), "{logs}");
    assert!(logs.contains("shutdown requested"), "{logs}");
}
