//! The admission server registered with a real kube-apiserver: the API server calls it over
//! HTTPS (HTTP/2, our CA in `caBundle`), honours a denial with our message, and applies the JSON
//! patch a mutating route returns. Typed routes registered from the generated webhook
//! configurations: typed patches applied (keeping fields the Rust type does not model), typed
//! denials with field causes, dry runs and warnings as clients see them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http;
use http_body_util::BodyExt;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{ConfigMap, Container, EnvVar, Pod, PodSpec};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::core::{ApiResource, GroupVersionKind, ObjectMeta};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use warmcache_admission::patch::{PatchBuilder, allow_with_patch};
use warmcache_admission::registration::{Rule, Scope, SideEffects};
use warmcache_admission::{
    AdmissionRequest, AdmissionResponse, AdmissionServer, AdmissionServerConfig, DynamicObject,
    FieldCause, Mutation, Operation, Reply, Route, ServiceTarget, TlsFiles, TypedRequest,
    Validation, Webhook,
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
        .route(Route::validating("/validate", validate))
        .route(Route::mutating("/mutate", mutate));
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

// --- Typed routes, registered from the generated configurations -------------------------
//
// What the real API server (v1.36.3 here, k8s-openapi built for v1.37) showed about fields a
// typed handler's `K` does not model:
//
// - Built-in types cannot bring such a field to a webhook. The API server decodes a Pod into
//   its Go type before admission, so an unknown field a client sends is dropped there (the
//   client gets a `Warning: unknown field "spec.containers[0]..."` header under the default
//   `fieldValidation=Warn`, and a 400 under `Strict`); the webhook and the store never see it.
//   Nor does the server send a Pod field k8s-openapi 0.29 (v1_37) lacks: comparing the json
//   tags of k8s.io/api v0.36.3 `core/v1` and apimachinery `meta/v1` with the fields
//   k8s-openapi reads found every Pod field modelled (1.36's only unmodelled core field,
//   `NodeAllocatableResourceClaimStatus.resources`, is not in a Pod). The Pod test below
//   proves the observation (a dynamic route records what arrived) and the typed patch.
// - Custom resources can: the API server keeps every field the CRD's schema declares, and a
//   Rust type may model fewer. The Widget test registers such a CRD and shows the unmodelled
//   fields surviving a typed mutation through the real API server; the unit tests in
//   `src/patch.rs` cover hostile raw objects (unknown fields inside changed list elements,
//   reordering, defaulted required fields, nulls).

const WIDGET_GROUP: &str = "admission-test.warmcache.io";
const UNKNOWN_TO_POD: &str = "futureContainerField";

/// A custom resource whose Rust type models less than its CRD: `spec.futureSpec` and
/// `spec.containers[].futureField` exist only in the schema.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Widget {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: WidgetSpec,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct WidgetSpec {
    #[serde(default)]
    containers: Vec<WidgetContainer>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct WidgetContainer {
    name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    env: Vec<String>,
}

impl kube::Resource for Widget {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;
    fn kind(_: &()) -> Cow<'_, str> {
        "Widget".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        WIDGET_GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "widgets".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

fn widget_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{WIDGET_GROUP}")},
        "spec": {
            "group": WIDGET_GROUP,
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget",
                      "listKind": "WidgetList"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "futureSpec": {"type": "string"},
                        "containers": {"type": "array", "items": {
                            "type": "object", "required": ["name"],
                            "properties": {
                                "name": {"type": "string"},
                                "env": {"type": "array", "items": {"type": "string"}},
                                "futureField": {"type": "string"}
                            }
                        }}
                    }}
                }}}
            }]
        }
    }))
    .unwrap()
}

fn widget_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(WIDGET_GROUP, "v1", "Widget"),
        "widgets",
    )
}

/// What the handlers saw.
#[derive(Default)]
struct Observed {
    /// `(pod name, dry_run)` per review of the typed Pod route.
    typed: Vec<(String, bool)>,
    /// Whether the dynamic route saw the unknown container field, per pod name.
    unknown_field_arrived: Vec<(String, bool)>,
}

const OFFLINE: &str = "HF_HUB_OFFLINE";

/// The ConfigMap the typed Pod handler creates, as its side effect, for each pod it admits
/// for real.
fn side_effect_name(pod: &str) -> String {
    format!("seen-{pod}")
}

/// The typed Pod handler's side effect: a ConfigMap named after the pod, created through the
/// API server unless the request is a dry run (as `sideEffects: NoneOnDryRun` promises).
async fn record_pod(
    config_maps: &Api<ConfigMap>,
    req: &TypedRequest<Pod>,
    name: &str,
) -> Result<(), kube::Error> {
    if req.dry_run {
        return Ok(());
    }
    let marker = config_map(&side_effect_name(name), &[("dryRun", "false")]);
    match config_maps.create(&PostParams::default(), &marker).await {
        // The API server may call the webhook again for the same pod (a retried request).
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        other => other.map(drop),
    }
}

async fn mutate_pod(
    observed: &Mutex<Observed>,
    config_maps: &Api<ConfigMap>,
    req: TypedRequest<Pod>,
) -> Result<Reply<Mutation<Pod>>, kube::Error> {
    let Some(mut pod) = req.object.clone() else {
        return Ok(Mutation::Allow.into());
    };
    let name = pod.metadata.name.clone().unwrap_or_default();
    // Test bookkeeping (what reached the handler), not a side effect.
    observed
        .lock()
        .unwrap()
        .typed
        .push((name.clone(), req.dry_run));
    record_pod(config_maps, &req, &name).await?;
    let mut added = 0;
    for container in pod.spec.iter_mut().flat_map(|s| s.containers.iter_mut()) {
        let env = container.env.get_or_insert_default();
        if !env.iter().any(|e| e.name == OFFLINE) {
            env.push(EnvVar {
                name: OFFLINE.into(),
                value: Some("1".into()),
                ..EnvVar::default()
            });
            added += 1;
        }
    }
    Ok(Reply::new(Mutation::Mutated(pod))
        .warning(format!("warmcache set {OFFLINE}=1 in {added} container(s)")))
}

fn validate_pod(req: TypedRequest<Pod>) -> Validation {
    let Some(spec) = req.object.and_then(|p| p.spec) else {
        return Validation::Allow;
    };
    let causes: Vec<FieldCause> = spec
        .containers
        .iter()
        .enumerate()
        .filter(|(_, c)| c.image.as_deref().is_none_or(|image| !image.contains(':')))
        .map(|(i, _)| {
            FieldCause::invalid(
                format!("spec.containers[{i}].image"),
                "must be pinned to a tag",
            )
        })
        .collect();
    if causes.is_empty() {
        Validation::Allow
    } else {
        Validation::Deny {
            message: "every image must be pinned to a tag".into(),
            causes,
        }
    }
}

fn mutate_widget(req: TypedRequest<Widget>) -> Mutation<Widget> {
    let Some(mut widget) = req.object else {
        return Mutation::Allow;
    };
    for container in &mut widget.spec.containers {
        container.env.push(format!("{OFFLINE}=1"));
    }
    Mutation::Mutated(widget)
}

fn pod(name: &str, image: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "engine".into(),
                image: Some(image.into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

fn has_offline_env(pod: &Pod) -> bool {
    pod.spec.iter().flat_map(|s| &s.containers).all(|c| {
        c.env
            .iter()
            .flatten()
            .any(|e| e.name == OFFLINE && e.value.as_deref() == Some("1"))
    })
}

#[tokio::test]
async fn typed_routes_registered_from_generated_configurations() {
    let plane = ControlPlane::shared().await.expect("control plane");
    let ns = TestNamespace::new("typed").await.expect("namespace");
    let client = plane.client().await.expect("client");
    warmcache_testkit::apply_crd(&client, &widget_crd())
        .await
        .unwrap();
    warmcache_testkit::wait_crd_established(
        &client,
        &format!("widgets.{WIDGET_GROUP}"),
        Duration::from_secs(30),
    )
    .await
    .unwrap();

    let pki = WebhookPki::generate().expect("pki");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tls.crt"), &pki.cert_pem).unwrap();
    std::fs::write(dir.path().join("tls.key"), &pki.key_pem).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();

    let observed = Arc::new(Mutex::new(Observed::default()));
    let scoped = |name: &str| {
        Webhook::new(format!("{name}.{}.admission.warmcache.io", ns.name))
            .namespace_selector(ns.selector())
    };
    let pods =
        |operations: Vec<Operation>| Rule::for_resource::<Pod>(operations).scope(Scope::Namespaced);
    let typed_seen = Arc::clone(&observed);
    let raw_seen = Arc::clone(&observed);
    let config_maps: Api<ConfigMap> = ns.api();
    let handler_config_maps = config_maps.clone();
    let server = AdmissionServer::new(AdmissionServerConfig::new(TlsFiles::in_dir(dir.path())))
        .route(
            Route::mutating_typed_async("/mutate-pods", move |req: TypedRequest<Pod>| {
                let (seen, config_maps) = (Arc::clone(&typed_seen), handler_config_maps.clone());
                async move { mutate_pod(&seen, &config_maps, req).await }
            })
            // It creates a ConfigMap per pod admitted, but not for dry runs.
            .webhook(
                scoped("pods")
                    .rule(pods(vec![Operation::Create]))
                    .side_effects(SideEffects::NoneOnDryRun),
            ),
        )
        .route(
            Route::validating_typed("/validate-pods", validate_pod)
                .webhook(scoped("v-pods").rule(pods(vec![Operation::Create]))),
        )
        .route(
            Route::validating(
                "/observe-pods",
                move |req: AdmissionRequest<DynamicObject>| {
                    if let Some(object) = &req.object {
                        let arrived = object.data["spec"]["containers"][0]
                            .get(UNKNOWN_TO_POD)
                            .is_some();
                        let name = object.metadata.name.clone().unwrap_or_default();
                        raw_seen
                            .lock()
                            .unwrap()
                            .unknown_field_arrived
                            .push((name, arrived));
                    }
                    AdmissionResponse::from(&req)
                },
            )
            .webhook(scoped("observe-pods").rule(pods(vec![Operation::Create]))),
        )
        .route(
            Route::mutating_typed("/mutate-widgets", mutate_widget).webhook(
                scoped("widgets").rule(
                    Rule::for_resource::<Widget>([Operation::Create]).scope(Scope::Namespaced),
                ),
            ),
        );
    let config_name = format!("typed-{}", ns.name);
    let generated = server
        .configurations(&config_name, &ServiceTarget::new("unused", "unused", 443))
        .expect("registrations are valid")
        .with_url(&format!("https://127.0.0.1:{port}"), pki.ca_pem.as_bytes());
    let shutdown = CancellationToken::new();
    let serving = tokio::spawn(server.serve(listener, shutdown.clone()));

    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    validating
        .create(&PostParams::default(), &generated.validating.unwrap())
        .await
        .expect("the generated ValidatingWebhookConfiguration is accepted");
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    mutating
        .create(&PostParams::default(), &generated.mutating.unwrap())
        .await
        .expect("the generated MutatingWebhookConfiguration is accepted");

    let api: Api<Pod> = ns.api();
    let widgets: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &widget_resource());
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let probe_widget: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{WIDGET_GROUP}/v1"), "kind": "Widget",
        "metadata": {"name": "probe"}, "spec": {"containers": [{"name": "c"}]}
    }))
    .unwrap();
    wait_for_webhook(Duration::from_secs(30), || {
        let (api, widgets, dry, probe_widget) = (
            api.clone(),
            widgets.clone(),
            dry.clone(),
            probe_widget.clone(),
        );
        async move {
            let denied = matches!(
                api.create(&dry, &pod("probe", "busybox")).await,
                Err(kube::Error::Api(s)) if s.message.contains("must be pinned")
            );
            let mutated = api
                .create(&dry, &pod("probe", "busybox:1"))
                .await
                .is_ok_and(|p| has_offline_env(&p));
            let widget = widgets.create(&dry, &probe_widget).await.is_ok_and(|w| {
                w.data["spec"]["containers"][0]["env"] == json!([format!("{OFFLINE}=1")])
            });
            denied && mutated && widget
        }
    })
    .await
    .expect("the three webhooks become active");

    // (c) A dry run reaches the typed handler with dry_run set, and the handler performs no
    // side effect for it (the probes above were dry runs too).
    observed.lock().unwrap().typed.clear();
    let answered = api
        .create(&dry, &pod("dry", "busybox:1"))
        .await
        .expect("dry-run create");
    assert!(
        has_offline_env(&answered),
        "the dry-run answer shows the mutation: {answered:?}"
    );
    assert!(
        observed
            .lock()
            .unwrap()
            .typed
            .contains(&("dry".to_owned(), true))
    );
    assert!(
        config_maps
            .get_opt(&side_effect_name("dry"))
            .await
            .unwrap()
            .is_none(),
        "the handler performed its side effect for a dry run"
    );
    assert!(
        config_maps
            .get_opt(&side_effect_name("probe"))
            .await
            .unwrap()
            .is_none()
    );
    assert!(api.get_opt("dry").await.unwrap().is_none());

    // (b) A typed denial reaches the client with its message and field causes.
    let err = api
        .create(&PostParams::default(), &pod("unpinned", "busybox"))
        .await
        .expect_err("the typed validating route refuses");
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert_eq!(status.reason, "Invalid", "{status:?}");
            assert!(
                status.message.contains(&format!(
                    "admission webhook \"v-pods.{}.admission.warmcache.io\" denied the request: every image must be pinned to a tag",
                    ns.name
                )),
                "{status:?}"
            );
            let details = status.details.expect("details");
            assert_eq!(details.kind, "Pod");
            assert_eq!(details.name, "unpinned");
            assert_eq!(details.causes.len(), 1, "{details:?}");
            assert_eq!(details.causes[0].field, "spec.containers[0].image");
            assert_eq!(details.causes[0].reason, "FieldValueInvalid");
            assert_eq!(details.causes[0].message, "must be pinned to a tag");
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert!(api.get_opt("unpinned").await.unwrap().is_none());

    // (a) + (d) A pod sent with a field Pod does not have: the API server warns and drops it
    // before admission; the typed patch is applied; our warning reaches the client.
    let mut body = serde_json::to_value(pod("unknown", "busybox:1")).unwrap();
    body["spec"]["containers"][0][UNKNOWN_TO_POD] = json!("x");
    let request = http::Request::post(format!("/api/v1/namespaces/{}/pods", ns.name))
        .header("content-type", "application/json")
        .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap();
    let response = client.send(request).await.expect("raw create");
    let status = response.status();
    let warnings: Vec<String> = response
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(status.as_u16(), 201, "{}", String::from_utf8_lossy(&bytes));
    assert!(
        // `299 - "unknown field \"spec.containers[0].futureContainerField\""`
        warnings.iter().any(|w| w.contains("unknown field")
            && w.contains(&format!("spec.containers[0].{UNKNOWN_TO_POD}"))),
        "{warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains(&format!("warmcache set {OFFLINE}=1 in 1 container(s)"))),
        "{warnings:?}"
    );
    let created: Value = serde_json::from_slice(&bytes).unwrap();
    assert!(
        created["spec"]["containers"][0]
            .get(UNKNOWN_TO_POD)
            .is_none(),
        "{created}"
    );
    assert!(
        observed
            .lock()
            .unwrap()
            .unknown_field_arrived
            .contains(&("unknown".to_owned(), false)),
        "the webhook was not sent the unknown field"
    );
    let stored = api.get("unknown").await.unwrap();
    assert!(has_offline_env(&stored), "{stored:?}");
    assert!(
        observed
            .lock()
            .unwrap()
            .typed
            .contains(&("unknown".to_owned(), false))
    );
    // (c) A real create does produce the side effect.
    let marker = config_maps
        .get_opt(&side_effect_name("unknown"))
        .await
        .unwrap();
    assert!(
        marker.is_some(),
        "the handler's side effect for a real create is missing"
    );
    // The typed patch also met what the API server's own admission added before us (the
    // ServiceAccount token volume and its mount), and kept it.
    let container = &stored.spec.as_ref().unwrap().containers[0];
    assert!(
        container
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path.contains("serviceaccount")),
        "{container:?}"
    );

    // (a) A custom resource field the typed handler's type does not model survives its typed
    // mutation through the real API server.
    let widget: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{WIDGET_GROUP}/v1"), "kind": "Widget",
        "metadata": {"name": "w"},
        "spec": {"futureSpec": "kept", "containers": [
            {"name": "a", "futureField": "of a"},
            {"name": "b", "env": ["X=1"], "futureField": "of b"}
        ]}
    }))
    .unwrap();
    widgets
        .create(&PostParams::default(), &widget)
        .await
        .expect("widget created");
    let stored = widgets.get("w").await.unwrap();
    assert_eq!(
        stored.data["spec"],
        json!({"futureSpec": "kept", "containers": [
            {"name": "a", "env": [format!("{OFFLINE}=1")], "futureField": "of a"},
            {"name": "b", "env": ["X=1", format!("{OFFLINE}=1")], "futureField": "of b"}
        ]}),
        "{stored:?}"
    );

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(15), serving)
        .await
        .expect("server stops after cancel")
        .unwrap()
        .expect("server ends cleanly");
    warmcache_testkit::delete_validating_webhook(&client, &config_name)
        .await
        .unwrap();
    warmcache_testkit::delete_mutating_webhook(&client, &config_name)
        .await
        .unwrap();
    ns.cleanup().await;
}
