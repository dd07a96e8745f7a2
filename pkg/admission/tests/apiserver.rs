//! The admission server registered with a real kube-apiserver: the API server calls it over
//! HTTPS (HTTP/2, our CA in `caBundle`), honours a denial with our message, and applies the JSON
//! patch a mutating route returns.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::RuleWithOperations;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::core::ObjectMeta;
use tokio_util::sync::CancellationToken;
use warmcache_admission::patch::{PatchBuilder, allow_with_patch};
use warmcache_admission::{
    AdmissionRequest, AdmissionResponse, AdmissionServer, AdmissionServerConfig, DynamicObject,
    TlsFiles,
};
use warmcache_testkit::{
    ControlPlane, TestNamespace, WebhookPki, WebhookRegistration, register_mutating,
    register_validating, wait_for_webhook,
};

const MUTATED: &str = "admission.warmcache.io/mutated";

fn validate(req: AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    let forbidden = req
        .object
        .as_ref()
        .and_then(|o| o.data.get("data"))
        .and_then(|d| d.get("forbidden"))
        .is_some();
    let response = AdmissionResponse::from(&req);
    if forbidden {
        response.deny("data.forbidden: this key is refused by the test webhook")
    } else {
        response
    }
}

fn mutate(req: AdmissionRequest<DynamicObject>) -> Result<AdmissionResponse, String> {
    let object = req.object.as_ref().ok_or("no object")?;
    let mut builder = PatchBuilder::for_object(object).map_err(|e| e.to_string())?;
    builder
        .set_annotation(MUTATED, "yes")
        .map_err(|e| e.to_string())?;
    allow_with_patch(&req, builder.build()).map_err(|e| e.to_string())
}

fn rule(operations: &[&str]) -> RuleWithOperations {
    RuleWithOperations {
        api_groups: Some(vec![String::new()]),
        api_versions: Some(vec!["v1".into()]),
        operations: Some(operations.iter().map(|s| s.to_string()).collect()),
        resources: Some(vec!["configmaps".into()]),
        scope: Some("Namespaced".into()),
    }
}

fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..ConfigMap::default()
    }
}

#[tokio::test]
async fn real_api_server_calls_our_webhooks_and_applies_their_verdicts() {
    let plane = ControlPlane::shared().await.expect("control plane");
    let ns = TestNamespace::new("admission").await.expect("namespace");
    let client = plane.client().await.expect("client");

    let pki = WebhookPki::generate().expect("pki");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tls.crt"), &pki.cert_pem).unwrap();
    std::fs::write(dir.path().join("tls.key"), &pki.key_pem).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let shutdown = CancellationToken::new();
    let server = AdmissionServer::new(AdmissionServerConfig::new(TlsFiles::in_dir(dir.path())))
        .validate("/validate", validate)
        .mutate("/mutate", mutate);
    let serving = tokio::spawn(server.serve(listener, shutdown.clone()));

    let base = format!("https://127.0.0.1:{port}");
    let name = format!("{}.admission.warmcache.io", ns.name);
    register_validating(
        &client,
        &WebhookRegistration::new(
            &format!("v-{name}"),
            &format!("{base}/validate"),
            &pki.ca_pem,
            vec![rule(&["CREATE", "UPDATE"])],
        )
        .namespace_selector(ns.selector()),
    )
    .await
    .expect("register validating webhook");
    register_mutating(
        &client,
        &WebhookRegistration::new(
            &format!("m-{name}"),
            &format!("{base}/mutate"),
            &pki.ca_pem,
            vec![rule(&["CREATE"])],
        )
        .namespace_selector(ns.selector()),
    )
    .await
    .expect("register mutating webhook");

    let api: Api<ConfigMap> = ns.api();
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    wait_for_webhook(Duration::from_secs(30), || {
        let api = api.clone();
        let dry = dry.clone();
        async move {
            match api
                .create(&dry, &config_map("probe", &[("forbidden", "x")]))
                .await
            {
                Err(kube::Error::Api(s)) => s.message.contains("refused by the test webhook"),
                _ => false,
            }
        }
    })
    .await
    .expect("webhooks become active");

    // Denied: the API server returns our message, and nothing is stored.
    let err = api
        .create(
            &PostParams::default(),
            &config_map("denied", &[("forbidden", "x")]),
        )
        .await
        .expect_err("the validating webhook must refuse");
    match err {
        kube::Error::Api(status) => {
            // kube's `AdmissionResponse::deny` answers 400; the API server passes it through.
            assert_eq!(status.code, 400, "{status:?}");
            assert!(
                status
                    .message
                    .contains("data.forbidden: this key is refused"),
                "{status:?}"
            );
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert!(api.get_opt("denied").await.unwrap().is_none());

    // Mutated: the patch (with an escaped "/" in the annotation key) is applied by the server.
    let created = api
        .create(
            &PostParams::default(),
            &config_map("allowed", &[("ok", "1")]),
        )
        .await
        .expect("allowed create");
    assert_eq!(
        created
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MUTATED))
            .map(String::as_str),
        Some("yes")
    );

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(15), serving)
        .await
        .expect("server stops after cancel")
        .unwrap()
        .expect("server ends cleanly");
    warmcache_testkit::delete_validating_webhook(&client, &format!("v-{name}"))
        .await
        .unwrap();
    warmcache_testkit::delete_mutating_webhook(&client, &format!("m-{name}"))
        .await
        .unwrap();
    ns.cleanup().await;
}
