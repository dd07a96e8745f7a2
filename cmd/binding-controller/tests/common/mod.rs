//! What the binding controller's API-server tests share (`controller.rs`, `block.rs`): the
//! controller started in-process (as the chart's ServiceAccount unless the test brings a client,
//! for fault injection), its metrics, the reading pod the webhook leaves, and the waits.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use warmcache_api_modelcache::v2beta1::{BindingIdentity, ModelCacheBinding, PopulationState};
use warmcache_api_modelcache::{SHARING_DOMAIN_LABEL, identity_hash};
use warmcache_binding_controller::controller::{Settings, start};
use warmcache_modelvolume::LifecycleConfig;
use warmcache_modelvolume::keys::{
    BINDING_ANNOTATION, BINDING_UID_ANNOTATION, DOWNLOAD_STEP_ANNOTATION, HANDLE_ANNOTATION,
    MODEL_LABEL, URI_ANNOTATION,
};
use warmcache_runtime::{LogFormat, Runtime, RuntimeArgs};
use warmcache_testkit::{ComponentAccount, ControlPlane, eventually};

/// The model every test caches.
pub const HANDLE: &str = "hf://Qwen/Qwen3-0.6B@v1";

/// How long a wait may take (2 cores, several test binaries' control planes).
pub const WAIT: Duration = Duration::from_secs(90);

/// A running controller: its stop token, its task, its admin address.
pub type Running = (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<Result<(), warmcache_runtime::RuntimeError>>,
    std::net::SocketAddr,
);

/// The controller on `control`. Without a client of the test's own (fault injection) it runs
/// as the ServiceAccount the chart gives it, with the roles generated from src/rbac.rs: a call
/// the list forgot fails the tests.
pub async fn controller(
    plane: &ControlPlane,
    control: &str,
    client: Option<Client>,
    catalog_namespace: Option<&str>,
    lifecycle: LifecycleConfig,
) -> Running {
    let account = match client {
        Some(_) => None,
        None => {
            let admin = plane.client().await.unwrap();
            let own = catalog_namespace.unwrap_or(control);
            Some(
                ComponentAccount::create(plane, &admin, "binding-controller", own, control)
                    .await
                    .unwrap(),
            )
        }
    };
    let kubeconfig = account
        .as_ref()
        .map_or(plane.kubeconfig_path(), |a| a.kubeconfig_path());
    let args = RuntimeArgs {
        kubeconfig: Some(kubeconfig.to_path_buf()),
        kube_context: None,
        log_level: None,
        log_format: LogFormat::Plain,
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        shutdown_grace: Duration::from_secs(5),
        shutdown_delay: Duration::ZERO,
    };
    let builder = Runtime::builder("binding-controller", args).without_global_telemetry();
    let builder = match client {
        Some(client) => builder.client(client),
        None => builder.with_client(),
    };
    let mut runtime = builder.build().await.unwrap();
    start(
        &mut runtime,
        &Settings {
            control_namespace: control.to_owned(),
            concurrency: 2,
            catalog_namespace: catalog_namespace.map(str::to_owned),
            lifecycle,
        },
    )
    .unwrap();
    let stop = runtime.shutdown_token();
    let admin = runtime.admin_addr();
    let run = async move {
        let _account = account;
        runtime.run().await
    };
    (stop, tokio::spawn(run), admin)
}

/// The controller's `/metrics` (HTTP/1.0, so the body is not chunked).
pub async fn scrape(admin: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(admin).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: admin\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    assert!(head.contains(" 200"), "{head}");
    body.to_owned()
}

/// The value of `series` in a scrape.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The binding of `identity` the webhook creates, written from `writer`, without a writer
/// Lease (the tests of the Lease name it themselves).
pub fn binding_of_identity(
    control: &str,
    writer: &str,
    identity: BindingIdentity,
) -> ModelCacheBinding {
    let mut b = warmcache_api_modelcache::fixtures::binding(control, writer, identity);
    b.spec.resources.lease_name.clear();
    b
}

/// The download step the webhook records on a reading pod.
pub fn step_json() -> String {
    json!({
        "version": "v1alpha1",
        "origin": "init",
        "sourceContainer": "fetch",
        "container": {
            "name": "fetch",
            "image": "tools:1",
            "command": ["sh", "-c", "echo downloading > /models/qwen3/config.json"],
            "volumeMounts": [{ "name": "models", "mountPath": "/models" }],
        },
        "dest": "/models/qwen3",
        "landingVolume": "models",
        "volumes": [{ "name": "models", "emptyDir": {} }],
    })
    .to_string()
}

/// A reading pod as the webhook leaves it (metadata only matters here).
pub fn reader_pod(name: &str, b: &ModelCacheBinding) -> Pod {
    let hash = identity_hash(&b.spec.identity);
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": { MODEL_LABEL: hash },
            "annotations": {
                BINDING_ANNOTATION: b.name_any(),
                BINDING_UID_ANNOTATION: b.uid().unwrap(),
                HANDLE_ANNOTATION: HANDLE,
                URI_ANNOTATION: HANDLE,
                DOWNLOAD_STEP_ANNOTATION: step_json(),
            },
        },
        "spec": { "containers": [{ "name": "vllm", "image": "vllm:1" }] },
    }))
    .unwrap()
}

/// Puts namespace `ns` in sharing domain `domain`.
pub async fn label_domain(client: &Client, ns: &str, domain: &str) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .patch(
            ns,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { SHARING_DOMAIN_LABEL: domain } } })),
        )
        .await
        .unwrap();
}

/// The binding's population state.
pub fn population(b: &ModelCacheBinding) -> Option<PopulationState> {
    b.status.as_ref()?.realized.as_ref()?.population_state
}

/// A condition of the binding as (status, reason, message).
pub fn condition<'b>(b: &'b ModelCacheBinding, type_: &str) -> Option<(&'b str, &'b str, &'b str)> {
    b.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.as_str(), c.reason.as_str(), c.message.as_str()))
}

/// The first pod of Job `job` in `ns`, once it exists.
pub async fn job_pod(client: &Client, ns: &str, job: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    eventually(&format!("the pod of Job {ns}/{job}"), WAIT, || {
        let pods = pods.clone();
        async move {
            pods.list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}")))
                .await
                .ok()?
                .items
                .into_iter()
                .next()
        }
    })
    .await
    .unwrap()
}

/// The binding stops changing: no status churn (a reconcile that rewrites what it just wrote
/// would loop on its own watch events).
pub async fn assert_settled(api: &Api<ModelCacheBinding>, name: &str) {
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = api.get(name).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = api.get(name).await.unwrap();
    assert_eq!(
        before.metadata.resource_version, after.metadata.resource_version,
        "the binding keeps changing: {:?}\n{:?}",
        before.status, after.status
    );
}
