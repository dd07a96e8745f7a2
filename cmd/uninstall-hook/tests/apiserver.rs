//! The uninstall hook against the real control plane, run as the built binary under the
//! ServiceAccount and generated ClusterRole the chart gives it (a TokenRequest token), so a
//! permission missing from `src/rbac.rs` fails these tests.
//!
//! One test at a time: the hook deletes every (cluster-scoped) KVCacheBackend.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolume};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use warmcache_api_kvcache::v1alpha1::KVCacheBackend;
use warmcache_api_modelcache::FINALIZER;
use warmcache_api_modelcache::v2beta1::{BindingIdentity, ModelCacheBinding, Workflow};
use warmcache_kvcache::vectors;
use warmcache_runtime::{LogFormat, Runtime, RuntimeArgs};
use warmcache_testkit::{ComponentAccount, ControlPlane, TestNamespace, eventually};

const WAIT: Duration = Duration::from_secs(60);
const COMPONENT: &str = "uninstall-hook";

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Hooked {
    code: i32,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for Hooked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

async fn hook(kubeconfig: &Path, control: &str, extra: &[&str]) -> Hooked {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_uninstall-hook"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--control-namespace", control, "--poll-interval", "200ms"])
        .args(extra)
        .env_remove("KUBECONFIG")
        .env_remove("WARMCACHE_UNINSTALL_FORCE")
        .output()
        .await
        .unwrap();
    Hooked {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

struct Setup {
    client: Client,
    own: TestNamespace,
    control: String,
    account: ComponentAccount,
}

async fn setup(prefix: &str) -> Setup {
    let plane = ControlPlane::shared().await.unwrap();
    let own = TestNamespace::new(prefix).await.unwrap();
    let client = own.client.clone();
    let control = format!("{}-ctl", own.name);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(control.clone()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let account = ComponentAccount::create(plane, &client, COMPONENT, &own.name, &control)
        .await
        .unwrap();
    Setup {
        client,
        own,
        control,
        account,
    }
}

fn binding(control: &str, model: &str) -> ModelCacheBinding {
    let identity = BindingIdentity::new(Workflow::HelmModelCache, "nca-123", model);
    warmcache_api_modelcache::fixtures::binding(control, "team-a", identity)
}

async fn create_bindings(client: &Client, control: &str, models: &[&str]) -> Vec<String> {
    let api: Api<ModelCacheBinding> = Api::namespaced(client.clone(), control);
    let mut names = Vec::new();
    for model in models {
        let created = api
            .create(&PostParams::default(), &binding(control, model))
            .await
            .unwrap();
        names.push(created.name_any());
    }
    names
}

/// A retained volume of model data: labelled by warmcache, or only bound in the control
/// namespace (a primary whose download never completed).
async fn retained_pv(client: &Client, name: &str, control: &str, labelled: bool) {
    let mut pv = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": format!("/tmp/{name}")},
            "claimRef": {"namespace": control, "name": format!("rw-pvc-{name}")},
        },
    });
    if labelled {
        pv["metadata"]["labels"] = json!({"app.kubernetes.io/managed-by": "warmcache"});
    }
    let pv: PersistentVolume = serde_json::from_value(pv).unwrap();
    let api: Api<PersistentVolume> = Api::all(client.clone());
    api.create(&PostParams::default(), &pv).await.unwrap();
}

async fn namespace_gone(client: &Client, name: &str) -> bool {
    let api: Api<Namespace> = Api::all(client.clone());
    api.get_opt(name).await.unwrap().is_none()
}

fn backend(name: &str, finalizer: bool) -> KVCacheBackend {
    let mut value: Value = vectors::v1();
    value["metadata"]["name"] = json!(name);
    if finalizer {
        value["metadata"]["finalizers"] = json!([warmcache_api_kvcache::FINALIZER]);
    }
    serde_json::from_value(value).unwrap()
}

#[tokio::test]
async fn binding_finalizers_are_removed_the_namespace_goes_and_retained_volumes_stay() {
    let _one = ONE_AT_A_TIME.lock().await;
    let s = setup("uh-bindings").await;
    let names = create_bindings(&s.client, &s.control, &["hf://a/one@v1", "hf://a/two@v1"]).await;
    let labelled = format!("{}-pv-done", s.own.name);
    let unlabelled = format!("{}-pv-partial", s.own.name);
    retained_pv(&s.client, &labelled, &s.control, true).await;
    retained_pv(&s.client, &unlabelled, &s.control, false).await;

    let run = hook(s.account.kubeconfig_path(), &s.control, &[]).await;
    assert_eq!(run.code, 0, "{run}");
    for name in &names {
        assert!(
            run.stdout.contains(&format!(
                "removed finalizer {FINALIZER} from ModelCacheBinding {}/{name}",
                s.control
            )),
            "{run}"
        );
    }
    assert!(
        run.stdout
            .contains(&format!("namespace {}: gone", s.control)),
        "{run}"
    );
    for pv in [&labelled, &unlabelled] {
        assert!(
            run.stdout
                .contains(&format!("  PersistentVolume {pv} (reclaimPolicy Retain")),
            "{run}"
        );
    }
    let remove = run
        .stdout
        .lines()
        .find(|l| l.starts_with("to remove them: kubectl delete pv "))
        .unwrap_or_else(|| panic!("{run}"));
    assert!(
        remove.contains(&labelled) && remove.contains(&unlabelled),
        "{run}"
    );
    let summary = run.stdout.lines().last().unwrap();
    assert!(
        summary.starts_with("uninstall-hook: done: ")
            && summary.contains("finalizer removed from 2 ModelCacheBinding(s)"),
        "{run}"
    );
    assert!(namespace_gone(&s.client, &s.control).await);
    let pvs: Api<PersistentVolume> = Api::all(s.client.clone());
    for pv in [&labelled, &unlabelled] {
        assert!(pvs.get_opt(pv).await.unwrap().is_some(), "{pv} deleted");
    }

    // Idempotent: a second run finds everything done.
    let again = hook(s.account.kubeconfig_path(), &s.control, &[]).await;
    assert_eq!(again.code, 0, "{again}");
    assert!(
        again
            .stdout
            .contains(&format!("namespace {}: gone (already)", s.control)),
        "{again}"
    );
    for pv in [&labelled, &unlabelled] {
        pvs.delete(pv, &DeleteParams::default()).await.unwrap();
    }
    s.own.cleanup().await;
}

#[tokio::test]
async fn backends_nobody_tears_down_time_out_then_force_removes_the_finalizer() {
    let _one = ONE_AT_A_TIME.lock().await;
    let s = setup("uh-stuck").await;
    let backends: Api<KVCacheBackend> = Api::all(s.client.clone());
    let names = [format!("{}-a", s.own.name), format!("{}-b", s.own.name)];
    for name in &names {
        backends
            .create(&PostParams::default(), &backend(name, true))
            .await
            .unwrap();
    }
    create_bindings(&s.client, &s.control, &["hf://b/one@v1"]).await;

    let run = hook(
        s.account.kubeconfig_path(),
        &s.control,
        &["--backend-timeout", "2s"],
    )
    .await;
    assert_eq!(run.code, 1, "{run}");
    for name in &names {
        assert!(
            run.stdout.contains(&format!(
                "LEFT: KVCacheBackend {name}: finalizers [{}]",
                warmcache_api_kvcache::FINALIZER
            )),
            "{run}"
        );
    }
    assert!(run.stdout.contains("--backend-timeout 2s"), "{run}");
    assert!(
        run.stdout
            .contains(&format!("NOT STARTED: delete namespace {}", s.control)),
        "{run}"
    );
    assert!(
        run.stdout
            .lines()
            .last()
            .unwrap()
            .starts_with("uninstall-hook: NOT DONE: 2 left"),
        "{run}"
    );
    // Nothing after the step that did not finish: the bindings keep their finalizer and the
    // namespace is there.
    let bindings: Api<ModelCacheBinding> = Api::namespaced(s.client.clone(), &s.control);
    let kept = bindings.list(&Default::default()).await.unwrap();
    assert!(kept.items[0].finalizers().iter().any(|f| f == FINALIZER));
    assert!(!namespace_gone(&s.client, &s.control).await);
    for name in &names {
        let b = backends.get(name).await.unwrap();
        assert!(b.metadata.deletion_timestamp.is_some());
    }

    let forced = hook(s.account.kubeconfig_path(), &s.control, &["--force"]).await;
    assert_eq!(forced.code, 0, "{forced}");
    for name in &names {
        assert!(
            forced.stdout.contains(&format!(
                "removed finalizer {} from KVCacheBackend {name}",
                warmcache_api_kvcache::FINALIZER
            )),
            "{forced}"
        );
        assert!(backends.get_opt(name).await.unwrap().is_none());
    }
    assert!(forced.stdout.contains("(2 by --force)"), "{forced}");
    assert!(namespace_gone(&s.client, &s.control).await);
    s.own.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_the_operator_tears_down_are_waited_for() {
    let _one = ONE_AT_A_TIME.lock().await;
    let s = setup("uh-operator").await;
    let plane = ControlPlane::shared().await.unwrap();
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
    let mut runtime = Runtime::builder("kvcache-operator", args)
        .without_global_telemetry()
        .with_client()
        .build()
        .await
        .unwrap();
    warmcache_kvcache_operator::controller::start(
        &mut runtime,
        &warmcache_kvcache_operator::controller::Settings {
            namespace: s.own.name.clone(),
            default_image: None,
            concurrency: 2,
            admin_address: "127.0.0.1:1".to_owned(),
            image_users: Vec::new(),
        },
    )
    .unwrap();
    let stop = runtime.shutdown_token();
    let running = tokio::spawn(runtime.run());

    let backends: Api<KVCacheBackend> = Api::all(s.client.clone());
    let name = format!("{}-kvc", s.own.name);
    backends
        .create(&PostParams::default(), &backend(&name, false))
        .await
        .unwrap();
    eventually("the operator's finalizer", WAIT, || {
        let (backends, name) = (backends.clone(), name.clone());
        async move {
            let b = backends.get(&name).await.ok()?;
            b.finalizers()
                .iter()
                .any(|f| f == warmcache_api_kvcache::FINALIZER)
                .then_some(())
        }
    })
    .await
    .unwrap();

    let run = hook(
        s.account.kubeconfig_path(),
        &s.control,
        &["--backend-timeout", "60s"],
    )
    .await;
    stop.cancel();
    running.await.unwrap().unwrap();
    assert_eq!(run.code, 0, "{run}");
    assert!(
        run.stdout
            .contains(&format!("deleting KVCacheBackend {name}")),
        "{run}"
    );
    assert!(
        run.stdout.contains("KVCacheBackends: all gone (1 removed)"),
        "{run}"
    );
    assert!(!run.stdout.contains("removed finalizer"), "{run}");
    assert!(backends.get_opt(&name).await.unwrap().is_none());
    s.own.cleanup().await;
}

#[tokio::test]
async fn a_namespace_that_cannot_go_in_time_is_named_and_a_second_run_finishes() {
    let _one = ONE_AT_A_TIME.lock().await;
    let s = setup("uh-blocked").await;
    create_bindings(&s.client, &s.control, &["hf://c/one@v1"]).await;
    let blocker = "blocker";
    let configmaps: Api<ConfigMap> = Api::namespaced(s.client.clone(), &s.control);
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": blocker, "finalizers": ["example.com/block"]},
    }))
    .unwrap();
    configmaps
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();

    let run = hook(
        s.account.kubeconfig_path(),
        &s.control,
        &["--namespace-timeout", "20s"],
    )
    .await;
    assert_eq!(run.code, 1, "{run}");
    let left = run
        .stdout
        .lines()
        .find(|l| l.starts_with(&format!("LEFT: Namespace {}: ", s.control)))
        .unwrap_or_else(|| panic!("{run}"));
    assert!(
        left.contains("still Terminating after --namespace-timeout 20s"),
        "{run}"
    );
    assert!(left.contains("example.com/block"), "{run}");
    assert!(
        run.stdout.lines().last().unwrap().starts_with(&format!(
            "uninstall-hook: NOT DONE: 1 left: Namespace {}",
            s.control
        )),
        "{run}"
    );

    configmaps
        .patch(
            blocker,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    let again = hook(s.account.kubeconfig_path(), &s.control, &[]).await;
    assert_eq!(again.code, 0, "{again}");
    assert!(
        again
            .stdout
            .contains(&format!("namespace {}: gone", s.control)),
        "{again}"
    );
    assert!(namespace_gone(&s.client, &s.control).await);
    s.own.cleanup().await;
}

/// Whether the account may patch ModelCacheBindings, as the authorizer says now.
async fn may_patch_bindings(account: &Client, control: &str) -> bool {
    let reviews: Api<SelfSubjectAccessReview> = Api::all(account.clone());
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(control.to_owned()),
                verb: Some("patch".into()),
                group: Some("nvca.nvcf.nvidia.io".into()),
                resource: Some("modelcachebindings".into()),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let answer = reviews
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    answer.status.is_some_and(|s| s.allowed)
}

#[tokio::test]
async fn a_denied_call_fails_naming_the_error_and_a_second_run_finishes() {
    let _one = ONE_AT_A_TIME.lock().await;
    let s = setup("uh-denied").await;
    let names = create_bindings(&s.client, &s.control, &["hf://d/one@v1"]).await;
    let account = s.account.client().await.unwrap();
    assert!(may_patch_bindings(&account, &s.control).await);

    // The ClusterRole without patch on bindings.
    let roles: Api<ClusterRole> = Api::all(s.client.clone());
    let role_name = "warmcache-uninstall-hook";
    let mut role = roles.get(role_name).await.unwrap();
    for rule in role.rules.iter_mut().flatten() {
        if rule
            .resources
            .as_ref()
            .is_some_and(|r| r.iter().any(|r| r == "modelcachebindings"))
        {
            rule.verbs.retain(|v| v != "patch");
        }
    }
    roles
        .replace(role_name, &PostParams::default(), &role)
        .await
        .unwrap();
    eventually("the denial to apply", WAIT, || {
        let (account, control) = (account.clone(), s.control.clone());
        async move { (!may_patch_bindings(&account, &control).await).then_some(()) }
    })
    .await
    .unwrap();

    let run = hook(s.account.kubeconfig_path(), &s.control, &[]).await;
    assert_eq!(run.code, 1, "{run}");
    let left = run
        .stdout
        .lines()
        .find(|l| {
            l.starts_with(&format!(
                "LEFT: ModelCacheBinding {}/{}: ",
                s.control, names[0]
            ))
        })
        .unwrap_or_else(|| panic!("{run}"));
    assert!(
        left.contains(FINALIZER) && left.contains("forbidden"),
        "{run}"
    );
    assert!(
        run.stdout
            .contains(&format!("NOT STARTED: delete namespace {}", s.control)),
        "{run}"
    );
    assert!(!namespace_gone(&s.client, &s.control).await);

    // The chart's role again: the next run finishes.
    let plane = ControlPlane::shared().await.unwrap();
    let restored = ComponentAccount::create(plane, &s.client, COMPONENT, &s.own.name, &s.control)
        .await
        .unwrap();
    eventually("the permission to apply", WAIT, || {
        let (account, control) = (account.clone(), s.control.clone());
        async move { may_patch_bindings(&account, &control).await.then_some(()) }
    })
    .await
    .unwrap();
    let again = hook(restored.kubeconfig_path(), &s.control, &[]).await;
    assert_eq!(again.code, 0, "{again}");
    assert!(namespace_gone(&s.client, &s.control).await);
    s.own.cleanup().await;
}

#[tokio::test]
async fn bad_flags_exit_2_before_any_call() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-kubeconfig");
    let run = hook(&missing, "Not_A_Namespace", &[]).await;
    assert_eq!(run.code, 2, "{run}");
    assert!(run.stderr.contains("--control-namespace"), "{run}");
    let run = hook(&missing, "ctl", &["--backend-timeout", "forever"]).await;
    assert_eq!(run.code, 2, "{run}");
    let run = hook(&missing, "ctl", &[]).await;
    assert_eq!(run.code, 2, "{run}");
    assert!(run.stderr.contains("no-kubeconfig"), "{run}");
}

/// A failing first list of the backends is never read as "none left": the hook retries it,
/// and when it never succeeds it names the failure, does nothing after that step and exits 1;
/// when it succeeds after two failures the uninstall goes on as usual.
#[tokio::test]
async fn a_failing_backend_list_is_retried_never_taken_for_none() {
    let _one = ONE_AT_A_TIME.lock().await;
    let s = setup("uh-list").await;
    create_bindings(&s.client, &s.control, &["hf://b/list@v1"]).await;
    let plane = ControlPlane::shared().await.unwrap();
    let settings = |timeout: u64| warmcache_uninstall_hook::Settings {
        control_namespace: s.control.clone(),
        kvcache_backends: true,
        delete_namespace: true,
        force: false,
        backend_timeout: Duration::from_secs(timeout),
        namespace_timeout: Duration::from_secs(60),
        poll_interval: Duration::from_millis(200),
    };

    let faults = warmcache_testkit::FaultInjector::new();
    faults.inject(
        http::Method::GET,
        "/kvcachebackends",
        warmcache_testkit::Fault::ServerError,
        usize::MAX,
    );
    let faulty = plane.client_with_faults(faults.clone()).await.unwrap();
    let mut out = Vec::new();
    let report = warmcache_uninstall_hook::uninstall(
        faulty,
        &settings(2),
        tokio_util::sync::CancellationToken::new(),
        &mut out,
    )
    .await
    .unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(report.code(), 1, "{text}");
    assert!(faults.injected() >= 2, "retried: {}", faults.injected());
    assert!(!text.contains("all gone"), "{text}");
    assert!(!text.contains("0 found"), "{text}");
    assert!(text.contains("LEFT: KVCacheBackends"), "{text}");
    let bindings: Api<ModelCacheBinding> = Api::namespaced(s.client.clone(), &s.control);
    let kept = bindings.list(&Default::default()).await.unwrap();
    assert!(
        kept.items[0].finalizers().iter().any(|f| f == FINALIZER),
        "nothing after the step: {text}"
    );

    let flaky = warmcache_testkit::FaultInjector::new();
    flaky.inject(
        http::Method::GET,
        "/kvcachebackends",
        warmcache_testkit::Fault::ServerError,
        2,
    );
    let client = plane.client_with_faults(flaky.clone()).await.unwrap();
    let mut out = Vec::new();
    let report = warmcache_uninstall_hook::uninstall(
        client,
        &settings(30),
        tokio_util::sync::CancellationToken::new(),
        &mut out,
    )
    .await
    .unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(flaky.injected(), 2);
    assert_eq!(report.code(), 0, "{text}");
    assert!(text.contains("KVCacheBackends: 0 found"), "{text}");
    assert!(namespace_gone(&s.client, &s.control).await, "{text}");
    s.own.cleanup().await;
}
