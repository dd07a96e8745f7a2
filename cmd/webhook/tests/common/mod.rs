//! What the webhook's API server tests and its benchmark share: the `webhook serve` process
//! registered with the test kit's kube-apiserver, namespaces, pods, metrics.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ServiceAccount};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, ObjectMeta};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warmcache_api_modelcache::v2beta1::ModelCacheBinding;
use warmcache_modelvolume::keys::{
    BINDING_ANNOTATION, BINDING_UID_ANNOTATION, MODEL_VOLUME, SKIP_REASON_ANNOTATION,
    WAIT_CONTAINER,
};
use warmcache_testkit::{ComponentAccount, ControlPlane, WebhookPki, eventually};
use warmcache_webhook::serve::webhook_configurations;

/// Tests that load the API server with hundreds of pods run one at a time.
pub static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub const TEST_LABEL: &str = "warmcache.test/pod-webhook";
pub const TIMEOUT: Duration = Duration::from_secs(60);

pub async fn client() -> Client {
    ControlPlane::shared()
        .await
        .unwrap()
        .client()
        .await
        .unwrap()
}

pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// StorageClass nvcf-sc, once per API server.
pub async fn ensure_storage_class(client: &Client) {
    let classes: Api<StorageClass> = Api::all(client.clone());
    let class: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": "nvcf-sc"},
        "provisioner": "csi.weka.io",
        "reclaimPolicy": "Retain",
        "volumeBindingMode": "Immediate"
    }))
    .unwrap();
    match classes.create(&PostParams::default(), &class).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating nvcf-sc: {e}"),
    }
}

/// A namespace created with its labels (so no cache ever sees it without them), once its
/// `default` ServiceAccount exists.
pub async fn namespace(client: &Client, prefix: &str, labels: &[(&str, &str)]) -> String {
    let name = unique(prefix);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
    eventually(&format!("ServiceAccount {name}/default"), TIMEOUT, || {
        let accounts = accounts.clone();
        async move { accounts.get_opt("default").await.ok().flatten() }
    })
    .await
    .unwrap();
    name
}

/// The first ModelCacheBinding written through a fresh kube-apiserver takes about 2 s (the
/// webhook allows for it, see `API_CALL_TIMEOUT`); a dry-run create pays that once per
/// process, so the tests measure the webhook rather than the API server's first write.
async fn warm_binding_writes(client: &Client, control: &str) {
    let binding = first_admission(client, "default", control).await.1;
    let api: Api<ModelCacheBinding> = Api::namespaced(client.clone(), control);
    api.create(&dry_run(), &binding).await.unwrap();
}

/// The first admission of `engine_pod("warm")` in `namespace` (no sharing label) as the
/// webhook's pure decision makes it, and the binding it creates in `control`.
pub async fn first_admission(
    client: &Client,
    namespace: &str,
    control: &str,
) -> (warmcache_modelvolume::Rewrite, ModelCacheBinding) {
    use std::collections::BTreeMap;
    use warmcache_catalog::CatalogInput;
    use warmcache_modelvolume::{BindingAction, Options, Request, StorageInputs, Verdict, admit};
    let class: StorageClass = Api::all(client.clone()).get("nvcf-sc").await.unwrap();
    let options = Options {
        control_namespace: control.to_owned(),
        ..Options::default()
    };
    let labels = BTreeMap::new();
    let pod = engine_pod("warm");
    let req = Request {
        pod: &pod,
        namespace,
        namespace_labels: &labels,
        leader_worker_set: None,
        traceparent: None,
        options: &options,
    };
    let storage = StorageInputs {
        storage_class: Some(&class),
        csi_driver: None,
        catalog: CatalogInput::Absent,
        gates: warmcache_webhook::DEFAULT_GATES,
    };
    let Verdict::Rewrite(rewrite) = admit(&req, |_, _| None, &storage) else {
        panic!("the warm-up pod is rewritten");
    };
    let BindingAction::Create(binding) = &rewrite.binding else {
        panic!("the warm-up pod creates a binding");
    };
    let binding = binding.as_ref().clone();
    (*rewrite, binding)
}

/// A plain HTTP GET on loopback (the admin server).
pub async fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await.ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}

/// The `webhook serve` process, registered with the API server for namespaces labelled
/// `TEST_LABEL=<run>`.
pub struct Served {
    child: Child,
    pub run: String,
    pub control: String,
    config_name: String,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub ca_pem: String,
    dir: tempfile::TempDir,
    _account: ComponentAccount,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How a test's webhook runs beyond the defaults.
#[derive(Default)]
pub struct Setup<'a> {
    /// Extra `webhook serve` arguments (`--feature-gates ...`).
    pub args: &'a [&'a str],
    /// A catalog (the YAML of `storage-provider-capabilities.yaml`) put in the webhook's
    /// namespace as ConfigMap `nvcf-storage-capabilities` before it starts; the built-in
    /// catalog when `None`.
    pub catalog: Option<&'a str>,
    /// An OTLP/gRPC collector's endpoint the webhook exports its spans to; none when `None`.
    pub otlp: Option<&'a str>,
}

impl Served {
    pub async fn start(client: &Client) -> Served {
        Self::start_with(client, Setup::default()).await
    }

    pub async fn start_with(client: &Client, setup: Setup<'_>) -> Served {
        let plane = ControlPlane::shared().await.unwrap();
        ensure_storage_class(client).await;
        let run = unique("run");
        let control = namespace(client, "pw-control", &[]).await;
        warm_binding_writes(client, &control).await;
        let home = namespace(client, "pw-home", &[]).await;
        if let Some(catalog) = setup.catalog {
            let map: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": warmcache_catalog::CONFIG_MAP_NAME},
                "data": {(warmcache_catalog::CONFIG_MAP_KEY): catalog},
            }))
            .unwrap();
            Api::<ConfigMap>::namespaced(client.clone(), &home)
                .create(&PostParams::default(), &map)
                .await
                .unwrap();
        }
        // The server runs as the ServiceAccount the chart gives it, with the roles generated
        // from src/rbac.rs: a call the list forgot fails these tests.
        let account = ComponentAccount::create(plane, client, "webhook", &home, &control)
            .await
            .unwrap();
        let pki = WebhookPki::generate().unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tls.crt"), &pki.cert_pem).unwrap();
        std::fs::write(dir.path().join("tls.key"), &pki.key_pem).unwrap();
        let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let log = std::fs::File::create(dir.path().join("webhook.log")).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_webhook"));
        command
            .args(["serve", "--kubeconfig"])
            .arg(account.kubeconfig_path())
            .arg("--tls-dir")
            .arg(dir.path())
            .args(["--listen", &listen.to_string()])
            .args(["--admin-listen", &admin.to_string()])
            .args(["--namespace", &home, "--control-namespace", &control])
            .args(setup.args);
        match setup.otlp {
            None => command.env("OTEL_SDK_DISABLED", "true"),
            Some(endpoint) => command
                .env_remove("OTEL_SDK_DISABLED")
                .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
                .env("OTEL_BSP_SCHEDULE_DELAY", "200"),
        };
        let child = command
            .env_remove("POD_NAMESPACE")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let mut served = Served {
            child,
            run,
            control,
            config_name: String::new(),
            listen,
            admin,
            ca_pem: pki.ca_pem.clone(),
            dir,
            _account: account,
        };
        let ready = eventually("the webhook's /readyz", TIMEOUT, || {
            let admin = served.admin;
            async move { matches!(http_get(admin, "/readyz").await, Some((200, _))).then_some(()) }
        })
        .await;
        if ready.is_err() {
            panic!("the webhook never became ready:\n{}", served.log());
        }
        served.config_name = served.register(client, listen).await;
        // Active once the API server calls us: a dry-run GPU pod comes back rewritten (or,
        // where caching is off or has no storage, saying why not).
        let probe = served.namespace(client, "pw-probe", &[]).await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &probe);
        let active = eventually("the API server calling the webhook", TIMEOUT, || {
            let pods = pods.clone();
            async move {
                let pod = pods.create(&dry_run(), &engine_pod("probe")).await.ok()?;
                let a = pod.annotations();
                (a.contains_key(BINDING_ANNOTATION) || a.contains_key(SKIP_REASON_ANNOTATION))
                    .then_some(())
            }
        })
        .await;
        if active.is_err() {
            panic!("the webhook never answered:\n{}", served.log());
        }
        served
    }

    /// The generated configuration, called at `listen` and scoped to this run's namespaces.
    pub async fn register(&self, client: &Client, listen: SocketAddr) -> String {
        let configs = webhook_configurations()
            .unwrap()
            .with_url(&format!("https://{listen}"), self.ca_pem.as_bytes());
        let mut config: MutatingWebhookConfiguration = configs.mutating.unwrap();
        let name = format!("pw-{}", self.run);
        config.metadata.name = Some(name.clone());
        for webhook in config.webhooks.iter_mut().flatten() {
            let selector = webhook
                .namespace_selector
                .get_or_insert_with(Default::default);
            selector
                .match_expressions
                .get_or_insert_with(Vec::new)
                .push(LabelSelectorRequirement {
                    key: TEST_LABEL.to_owned(),
                    operator: "In".to_owned(),
                    values: Some(vec![self.run.clone()]),
                });
        }
        let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
        api.create(&PostParams::default(), &config).await.unwrap();
        name
    }

    /// A namespace this webhook is called for.
    pub async fn namespace(
        &self,
        client: &Client,
        prefix: &str,
        labels: &[(&str, &str)],
    ) -> String {
        let mut all = vec![(TEST_LABEL, self.run.as_str())];
        all.extend_from_slice(labels);
        namespace(client, prefix, &all).await
    }

    /// The `webhook serve` process's PID (its memory, for the scale benchmark).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn bindings(&self, client: &Client) -> Api<ModelCacheBinding> {
        Api::namespaced(client.clone(), &self.control)
    }

    pub async fn metrics(&self) -> String {
        http_get(self.admin, "/metrics").await.unwrap().1
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("webhook.log")).unwrap_or_default()
    }

    pub async fn stop(mut self, client: &Client) {
        let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
        let _ = api
            .delete(&self.config_name, &DeleteParams::default())
            .await;
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "the webhook exited during the test:\n{}",
            self.log()
        );
    }
}

pub fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..PostParams::default()
    }
}

pub fn pod(value: Value) -> Pod {
    serde_json::from_value(value).unwrap()
}

/// vLLM downloading its model itself into `HF_HOME` on an emptyDir.
pub fn engine_pod(name: &str) -> Pod {
    pod(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "qwen"}},
        "spec": {
            "containers": [{
                "name": "vllm",
                "image": "vllm/vllm-openai:v0.20.0",
                "args": ["--model", "Qwen/Qwen3-8B"],
                "env": [
                    {"name": "HF_HOME", "value": "/models/hf"},
                    {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
                ],
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                "volumeMounts": [{"name": "m", "mountPath": "/models"}]
            }],
            "volumes": [{"name": "m", "emptyDir": {}}]
        }
    }))
}

/// An init container downloading with a literal token: left alone (secret-in-download-step).
pub fn literal_secret_pod(name: &str) -> Pod {
    pod(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "initContainers": [{
                "name": "fetch",
                "image": "python:3.12",
                "command": ["hf", "download", "meta-llama/Llama-3.1-8B-Instruct", "--local-dir", "/models/llama"],
                "env": [{"name": "HF_TOKEN", "value": "hf_0123456789abcdefghijklmnop"}],
                "volumeMounts": [{"name": "m", "mountPath": "/models"}]
            }],
            "containers": [{
                "name": "vllm",
                "image": "vllm/vllm-openai:v0.20.0",
                "args": ["--model", "/models/llama"],
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                "volumeMounts": [{"name": "m", "mountPath": "/models"}]
            }],
            "volumes": [{"name": "m", "emptyDir": {}}]
        }
    }))
}

/// The binding name and UID a pod records; panics with the pod when it was not rewritten.
pub fn read_binding(pod: &Pod) -> (String, String) {
    let a = pod.annotations();
    let (Some(name), Some(uid)) = (a.get(BINDING_ANNOTATION), a.get(BINDING_UID_ANNOTATION)) else {
        panic!(
            "pod {} was not rewritten: {}",
            pod.name_any(),
            serde_json::to_string(&pod.metadata).unwrap()
        );
    };
    let spec = pod.spec.as_ref().unwrap();
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == MODEL_VOLUME)
        .expect("the model volume");
    let claim = volume.persistent_volume_claim.as_ref().expect("a claim");
    assert_eq!(claim.read_only, Some(true), "read-only on the pod side");
    assert!(
        spec.init_containers
            .iter()
            .flatten()
            .any(|c| c.name == WAIT_CONTAINER),
        "the wait container"
    );
    (name.clone(), uid.clone())
}

pub async fn create_pods(client: &Client, pods: Vec<(String, Pod)>) -> Vec<Pod> {
    let mut tasks = tokio::task::JoinSet::new();
    for (namespace, pod) in pods {
        let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        tasks.spawn(async move { api.create(&PostParams::default(), &pod).await });
    }
    let mut created = Vec::new();
    while let Some(result) = tasks.join_next().await {
        created.push(result.unwrap().expect("pod creation is never blocked"));
    }
    created
}

pub fn counter(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no series {series} in:\n{metrics}"))
}
