//! Rotation of the chart-generated webhook TLS pair (`webhook.tls.rotation`, docs/install.md
//! "Webhook TLS") without a window of refused calls:
//!
//! 1. a real `helm install` and `helm upgrade` of `charts/warmcache` into the test kit's API
//!    server (no node: pods stay Pending, the objects are what is checked): an upgrade with a new
//!    `webhook.tls.rotation` writes a new CA and serving certificate to the Secret and renders
//!    both webhook configurations' `caBundle` as the new CA then the old one, so the serving
//!    certificate still mounted in the pods (old) and the new one both verify for the Services'
//!    names; the next upgrade without a change keeps the pair and trusts the new CA alone;
//!    deleting the Secret still generates a new pair;
//! 2. the real API server calling a webhook served with the components' certificate reload
//!    (`warmcache_admission`): with a two-CA bundle (new + old) calls succeed while the server
//!    presents the old certificate and, on fresh connections, after it reloaded the new one,
//!    while bundles holding one CA refuse the other certificate (so the check discriminates).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::Helm;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhookConfiguration,
    WebhookClientConfig,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams};
use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_util::sync::CancellationToken;
use warmcache_admission::{
    AdmissionMetrics, AdmissionRequest, AdmissionResponse, AdmissionServer, AdmissionServerConfig,
    DynamicObject, Route, TlsFiles,
};
use warmcache_testkit::{
    ControlPlane, TestNamespace, WebhookPki, WebhookRegistration, eventually, register_validating,
};

/// Release and namespace of the real install (the plane is this test binary's own).
const RELEASE: &str = "warmcache";
const RELEASE_NAMESPACE: &str = "warmcache-tls-rotation";
const SECRET: &str = "warmcache-webhook-tls";
/// The annotation on the Secret recording the generation of its pair.
const ROTATION: &str = "warmcache.nvidia.io/tls-rotation";

/// Every certificate of a PEM bundle, in order.
fn certificates(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .unwrap_or_else(|e| {
            panic!(
                "not a PEM certificate bundle ({e}):\n{}",
                String::from_utf8_lossy(pem)
            )
        })
}

/// Whether `leaf` verifies for `host` with `bundle` as the trust anchors (as the API server
/// verifies a webhook's certificate against `caBundle`).
fn verify(
    bundle: &[CertificateDer<'static>],
    leaf: &CertificateDer<'static>,
    host: &str,
) -> Result<(), rustls::Error> {
    let mut roots = RootCertStore::empty();
    for ca in bundle {
        roots.add(ca.clone()).unwrap();
    }
    let verifier = WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .unwrap();
    let name = ServerName::try_from(host.to_owned()).unwrap();
    verifier
        .verify_server_cert(leaf, &[], &name, &[], UnixTime::now())
        .map(drop)
}

/// One webhook of a configuration: its name, the Service host the API server dials, its bundle.
#[derive(Debug)]
struct Registered {
    webhook: String,
    host: String,
    bundle: Vec<CertificateDer<'static>>,
}

/// What the install left on the API server: the Secret's pair and both configurations.
#[derive(Debug)]
struct Installed {
    ca: CertificateDer<'static>,
    leaf: CertificateDer<'static>,
    key: Vec<u8>,
    generation: Option<String>,
    webhooks: Vec<Registered>,
}

fn registered(name: &str, config: &WebhookClientConfig) -> Registered {
    let service = config
        .service
        .as_ref()
        .unwrap_or_else(|| panic!("{name}: no Service in clientConfig"));
    let namespace = service.namespace.as_str();
    assert_eq!(namespace, RELEASE_NAMESPACE, "{name}: Service namespace");
    let bundle = config
        .ca_bundle
        .as_ref()
        .unwrap_or_else(|| panic!("{name}: no caBundle"));
    Registered {
        webhook: name.to_owned(),
        host: format!("{}.{namespace}.svc", service.name),
        bundle: certificates(&bundle.0),
    }
}

async fn installed(client: &kube::Client) -> Installed {
    let secret = Api::<Secret>::namespaced(client.clone(), RELEASE_NAMESPACE)
        .get(SECRET)
        .await
        .unwrap();
    let data = secret.data.unwrap_or_default();
    let field = |key: &str| {
        data.get(key)
            .unwrap_or_else(|| panic!("Secret {SECRET} has no {key}"))
            .0
            .clone()
    };
    let mut cas = certificates(&field("ca.crt"));
    assert_eq!(cas.len(), 1, "ca.crt of the Secret is the current CA alone");
    let mut leaves = certificates(&field("tls.crt"));
    assert_eq!(leaves.len(), 1, "tls.crt is the serving certificate alone");
    let generation = secret
        .metadata
        .annotations
        .unwrap_or_default()
        .get(ROTATION)
        .cloned();

    let mut webhooks = Vec::new();
    let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get("warmcache-webhook")
        .await
        .unwrap();
    for hook in mutating.webhooks.unwrap_or_default() {
        webhooks.push(registered(&hook.name, &hook.client_config));
    }
    let validating = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get("kvcache-operator")
        .await
        .unwrap();
    for hook in validating.webhooks.unwrap_or_default() {
        webhooks.push(registered(&hook.name, &hook.client_config));
    }
    assert!(
        webhooks.len() >= 2,
        "the pod webhook and the KVCacheBackend webhook: {webhooks:?}"
    );
    Installed {
        ca: cas.remove(0),
        leaf: leaves.remove(0),
        key: field("tls.key"),
        generation,
        webhooks,
    }
}

/// Each webhook's bundle is exactly `want` (in order), and the Secret's serving certificate
/// verifies with it for the webhook's Service.
fn assert_bundles(state: &Installed, want: &[&CertificateDer<'static>], step: &str) {
    for hook in &state.webhooks {
        let got: Vec<&CertificateDer<'static>> = hook.bundle.iter().collect();
        assert!(
            got == want,
            "{step}: {} has {} certificate(s) in caBundle, want {} in the order given",
            hook.webhook,
            got.len(),
            want.len()
        );
        if let Err(e) = verify(&hook.bundle, &state.leaf, &hook.host) {
            panic!(
                "{step}: the Secret's certificate does not verify for {} with the caBundle of {}: {e}",
                hook.host, hook.webhook
            );
        }
    }
}

struct Release<'a> {
    helm: &'a Helm,
    kubeconfig: String,
}

impl Release<'_> {
    fn helm(&self, args: &[&str]) -> String {
        let chart = self.helm.chart().display().to_string();
        let mut all = args.to_vec();
        all.extend([
            RELEASE,
            &chart,
            "--namespace",
            RELEASE_NAMESPACE,
            "--kubeconfig",
            &self.kubeconfig,
        ]);
        self.helm
            .command(&all)
            .unwrap_or_else(|e| panic!("helm {}: {e}", args.join(" ")))
    }
}

#[tokio::test]
async fn rotation_trusts_the_new_and_the_old_ca_until_the_next_upgrade() {
    let plane = ControlPlane::shared().await.unwrap();
    let client = plane.client().await.unwrap();
    let helm = Helm::new().unwrap();

    // The schema refuses a negative generation.
    let refused = helm
        .template(&["webhook.tls.rotation=-1"])
        .expect_err("a negative rotation must be refused");
    assert!(
        refused.output().contains("rotation"),
        "{}",
        refused.output()
    );

    let release = Release {
        helm: &helm,
        kubeconfig: plane.kubeconfig_path().display().to_string(),
    };
    // The plane has the CRDs already (not Helm's to own here).
    release.helm(&[
        "install",
        "--create-namespace",
        "--set",
        "crds.enabled=false",
    ]);
    let first = installed(&client).await;
    assert_eq!(
        first.generation.as_deref(),
        Some("0"),
        "install records generation 0"
    );
    assert_bundles(&first, &[&first.ca], "install");

    // An upgrade without a change keeps the pair.
    release.helm(&["upgrade", "--reuse-values"]);
    let kept = installed(&client).await;
    assert!(
        kept.ca == first.ca && kept.leaf == first.leaf && kept.key == first.key,
        "an upgrade without a new rotation replaced the pair"
    );
    assert_bundles(&kept, &[&first.ca], "upgrade without change");

    // Rotation: a new pair, the configurations trusting the new CA first and the old one.
    release.helm(&[
        "upgrade",
        "--reuse-values",
        "--set",
        "webhook.tls.rotation=1",
    ]);
    let rotated = installed(&client).await;
    assert_eq!(rotated.generation.as_deref(), Some("1"));
    assert!(rotated.ca != first.ca, "rotation kept the CA");
    assert!(
        rotated.leaf != first.leaf,
        "rotation kept the serving certificate"
    );
    assert!(rotated.key != first.key, "rotation kept the key");
    assert_bundles(&rotated, &[&rotated.ca, &first.ca], "rotation");
    for hook in &rotated.webhooks {
        // The pods serve the old certificate until the kubelet updates the mounted Secret:
        // the API server must still accept it for the Service.
        if let Err(e) = verify(&hook.bundle, &first.leaf, &hook.host) {
            panic!(
                "rotation: the previous certificate (still served) is refused for {} by the caBundle of {}: {e}",
                hook.host, hook.webhook
            );
        }
        // The old CA alone, what the configurations held before, refuses the new certificate:
        // the window a single-CA bundle would have had.
        assert!(
            verify(std::slice::from_ref(&first.ca), &rotated.leaf, &hook.host).is_err(),
            "the old CA verifies the new certificate"
        );
    }

    // The next upgrade without a change keeps the new pair and trusts the new CA alone.
    release.helm(&["upgrade", "--reuse-values"]);
    let settled = installed(&client).await;
    assert_eq!(settled.generation.as_deref(), Some("1"));
    assert!(
        settled.ca == rotated.ca && settled.leaf == rotated.leaf && settled.key == rotated.key,
        "the upgrade after the rotation replaced the pair again"
    );
    assert_bundles(&settled, &[&rotated.ca], "upgrade after the rotation");
    for hook in &settled.webhooks {
        assert!(
            verify(&hook.bundle, &first.leaf, &hook.host).is_err(),
            "{}: the old certificate is still trusted after the rotation settled",
            hook.webhook
        );
    }

    // Deleting the Secret still generates a new pair (the new CA alone).
    Api::<Secret>::namespaced(client.clone(), RELEASE_NAMESPACE)
        .delete(SECRET, &DeleteParams::default())
        .await
        .unwrap();
    release.helm(&["upgrade", "--reuse-values"]);
    let regenerated = installed(&client).await;
    assert_eq!(regenerated.generation.as_deref(), Some("1"));
    assert!(
        regenerated.ca != rotated.ca,
        "a deleted Secret came back with its old CA"
    );
    assert_bundles(
        &regenerated,
        &[&regenerated.ca],
        "after deleting the Secret",
    );
}

// --- the API server with a two-CA bundle across a certificate swap ---

const DENIAL: &str = "refused by the rotation test webhook";
/// Which configuration a probe object is meant for.
const BUNDLE_LABEL: &str = "tls-rotation.warmcache.io/bundle";
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

fn deny(req: AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    AdmissionResponse::from(&req).deny(DENIAL)
}

/// What the API server answered to a dry-run create of a probe object.
#[derive(Debug)]
enum Outcome {
    /// Our webhook was called and its denial came back.
    Answered,
    /// The API server could not call the webhook (the message says why).
    CallFailed(String),
    /// The configuration is not in effect yet.
    NotIntercepted,
    /// Anything else; shown in the panic message.
    Other(#[allow(dead_code)] String),
}

async fn probe(api: &Api<ConfigMap>, bundle: &str) -> Outcome {
    let object = ConfigMap {
        metadata: ObjectMeta {
            generate_name: Some("probe-".into()),
            labels: Some(BTreeMap::from([(BUNDLE_LABEL.into(), bundle.into())])),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match api.create(&params, &object).await {
        Ok(_) => Outcome::NotIntercepted,
        Err(kube::Error::Api(status)) if status.message.contains(DENIAL) => Outcome::Answered,
        Err(kube::Error::Api(status)) if status.message.contains("failed calling webhook") => {
            Outcome::CallFailed(status.message)
        }
        Err(e) => Outcome::Other(e.to_string()),
    }
}

/// Waits until the configuration `bundle` calls our webhook (`answered`) or until the API server
/// refuses the certificate our server presents (`!answered`); panics with the last outcome.
async fn expect(api: &Api<ConfigMap>, bundle: &str, answered: bool, step: &str) {
    let last = std::sync::Mutex::new(None);
    let last = &last;
    let settled = eventually(step, PROBE_TIMEOUT, || async move {
        let outcome = probe(api, bundle).await;
        let done = match &outcome {
            Outcome::Answered => answered,
            Outcome::CallFailed(message) => {
                !answered && message.contains("x509: certificate signed by unknown authority")
            }
            Outcome::NotIntercepted | Outcome::Other(_) => false,
        };
        *last.lock().unwrap() = Some(outcome);
        done.then_some(())
    })
    .await;
    if settled.is_err() {
        let want = if answered {
            "the webhook answering"
        } else {
            "the certificate refused"
        };
        panic!(
            "{step}: bundle {bundle}: want {want}, last outcome {:?}",
            last.lock().unwrap()
        );
    }
}

/// Writes a pair as the kubelet would swap it in: each file replaced whole.
fn write_pair(dir: &std::path::Path, pki: &WebhookPki) {
    for (name, pem) in [("tls.crt", &pki.cert_pem), ("tls.key", &pki.key_pem)] {
        let staged = dir.join(format!(".{name}.new"));
        std::fs::write(&staged, pem).unwrap();
        std::fs::rename(&staged, dir.join(name)).unwrap();
    }
}

/// `new` then `old`, as the chart renders a rotation's bundle.
fn bundle(new: &WebhookPki, old: &WebhookPki) -> String {
    format!("{}\n{}\n", new.ca_pem.trim_end(), old.ca_pem.trim_end())
}

#[tokio::test]
async fn the_api_server_accepts_either_certificate_with_the_two_ca_bundle() {
    let plane = ControlPlane::shared().await.unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::new("tls-rotation").await.unwrap();
    let api: Api<ConfigMap> = ns.api();

    let old = WebhookPki::generate().unwrap();
    let new = WebhookPki::generate().unwrap();
    assert_ne!(old.ca_pem, new.ca_pem);

    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), &old);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "https://127.0.0.1:{}/validate",
        listener.local_addr().unwrap().port()
    );
    let mut config = AdmissionServerConfig::new(TlsFiles::in_dir(dir.path()));
    config.reload_interval = Duration::from_millis(200);
    // Idle connections closed soon, so the API server has to handshake again after the swap.
    config.idle_timeout = Duration::from_secs(1);
    config.shutdown_grace = Duration::from_secs(2);
    let metrics = AdmissionMetrics::new().unwrap();
    let shutdown = CancellationToken::new();
    let server = AdmissionServer::new(config)
        .with_metrics(metrics.clone())
        .route(Route::validating("/validate", deny));
    let serving = tokio::spawn(server.serve(listener, shutdown.clone()));

    let rule = RuleWithOperations {
        api_groups: Some(vec![String::new()]),
        api_versions: Some(vec!["v1".into()]),
        operations: Some(vec!["CREATE".into()]),
        resources: Some(vec!["configmaps".into()]),
        scope: Some("Namespaced".into()),
    };
    let bundles = [
        ("both", bundle(&new, &old)),
        ("old", old.ca_pem.clone()),
        ("new", new.ca_pem.clone()),
    ];
    for (name, ca_pem) in &bundles {
        let registration = WebhookRegistration::new(
            &format!("{}-{name}.tls-rotation.warmcache.io", ns.name),
            &url,
            ca_pem,
            vec![rule.clone()],
        )
        .namespace_selector(ns.selector())
        .object_selector(LabelSelector {
            match_labels: Some(BTreeMap::from([(BUNDLE_LABEL.into(), (*name).into())])),
            ..LabelSelector::default()
        });
        register_validating(&client, &registration).await.unwrap();
    }

    // Serving the old certificate (the pods before the kubelet updates the Secret).
    expect(&api, "both", true, "old certificate").await;
    expect(&api, "old", true, "old certificate").await;
    expect(&api, "new", false, "old certificate").await;

    // The Secret's files change; the server reloads them.
    write_pair(dir.path(), &new);
    let reloads = metrics.cert_reloads().with_label_values(&["success"]);
    eventually(
        "the server to reload the new certificate",
        Duration::from_secs(10),
        || async { (reloads.get() >= 1).then_some(()) },
    )
    .await
    .unwrap();
    // Established connections keep the certificate they negotiated: wait until the server
    // closed them all, so every call below is a new handshake with the new certificate.
    let open = metrics.connections_open().clone();
    eventually(
        "the old connections to close",
        Duration::from_secs(30),
        || async { (open.get() == 0).then_some(()) },
    )
    .await
    .unwrap();
    expect(&api, "both", true, "new certificate").await;
    expect(&api, "new", true, "new certificate").await;
    expect(&api, "old", false, "new certificate").await;

    for (name, _) in &bundles {
        warmcache_testkit::delete_validating_webhook(
            &client,
            &format!("{}-{name}.tls-rotation.warmcache.io", ns.name),
        )
        .await
        .unwrap();
    }
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(15), serving)
        .await
        .expect("the server stops")
        .unwrap()
        .unwrap();
    ns.cleanup().await;
}
