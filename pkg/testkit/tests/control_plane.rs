//! Integration tests of the test kit against the real control plane. All tests in this binary
//! share one plane.

// Test helpers outside #[test] functions may panic too.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::Method;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerStateTerminated, ContainerStatus, Namespace, Pod, PodSpec,
    PodStatus, ServiceAccount,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionNames, CustomResourceDefinitionSpec,
    CustomResourceDefinitionVersion, CustomResourceValidation, JSONSchemaProps,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams, PropagationPolicy,
};
use kube::{Api, ResourceExt};
use warmcache_testkit::{
    ControlPlane, Fault, FaultInjector, Kubelet, TestNamespace, apply_crd, eventually,
    wait_crd_established,
};

fn config_map(name: &str, owner: Option<&ConfigMap>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            owner_references: owner.map(|o| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "ConfigMap".into(),
                    name: o.name_any(),
                    uid: o.uid().unwrap(),
                    ..OwnerReference::default()
                }]
            }),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("k".to_owned(), "v".to_owned())])),
        ..ConfigMap::default()
    }
}

static SEEN_PLANE: Mutex<Option<usize>> = Mutex::new(None);

/// Records the plane's address; every test must see the same one.
fn assert_same_plane(plane: &'static ControlPlane) {
    let addr = std::ptr::from_ref(plane) as usize;
    let mut seen = SEEN_PLANE.lock().unwrap();
    match *seen {
        None => *seen = Some(addr),
        Some(first) => assert_eq!(first, addr, "two control planes in one test binary"),
    }
}

#[tokio::test]
async fn control_plane_starts_and_serves() {
    let before = Instant::now();
    let plane = ControlPlane::shared().await.unwrap();
    assert_same_plane(plane);
    eprintln!(
        "plane startup took {:.2}s (this call waited {:.2}s); dir {}",
        plane.startup_duration().as_secs_f64(),
        before.elapsed().as_secs_f64(),
        plane.dir().display()
    );
    let client = plane.client().await.unwrap();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, "v1.36.3");
    assert!(plane.kubeconfig_path().is_file());
    assert!(plane.server_url().starts_with("https://127.0.0.1:"));
    // The admin is cluster-admin through system:masters.
    let namespaces: Api<Namespace> = Api::all(client);
    let names: Vec<String> = namespaces
        .list(&Default::default())
        .await
        .unwrap()
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert!(names.contains(&"kube-system".to_owned()), "{names:?}");
}

#[tokio::test]
async fn second_test_shares_the_plane() {
    let a = ControlPlane::shared().await.unwrap();
    let b = ControlPlane::shared().await.unwrap();
    assert!(std::ptr::eq(a, b));
    assert_same_plane(a);
}

#[tokio::test]
async fn namespace_is_created_and_deleted() {
    let ns = TestNamespace::new("Namespace_Lifecycle").await.unwrap();
    assert!(ns.name.starts_with("t-namespace-lifecycle-"), "{}", ns.name);
    let sa: Api<ServiceAccount> = ns.api();
    assert!(sa.get_opt("default").await.unwrap().is_some());
    let cms: Api<ConfigMap> = ns.api();
    cms.create(&PostParams::default(), &config_map("inside", None))
        .await
        .unwrap();

    let namespaces: Api<Namespace> = Api::all(ns.client.clone());
    let name = ns.name.clone();
    assert!(namespaces.get_opt(&name).await.unwrap().is_some());
    // Waiting until the namespace is gone proves the namespace controller emptied it.
    ns.delete_and_wait().await.unwrap();
    assert!(namespaces.get_opt(&name).await.unwrap().is_none());
}

#[tokio::test]
async fn cleanup_starts_namespace_deletion() {
    let ns = TestNamespace::new("cleanup").await.unwrap();
    let client = ns.client.clone();
    let name = ns.name.clone();
    ns.cleanup().await;
    let namespaces: Api<Namespace> = Api::all(client);
    let gone_or_terminating = match namespaces.get_opt(&name).await.unwrap() {
        None => true,
        Some(n) => n.metadata.deletion_timestamp.is_some(),
    };
    assert!(gone_or_terminating);
}

#[tokio::test]
async fn crd_created_at_runtime_becomes_established() {
    let plane = ControlPlane::shared().await.unwrap();
    let client = plane.client().await.unwrap();
    let group = format!(
        "{}.testkit.example.com",
        TestNamespace::new("crd").await.unwrap().name
    );
    let crd = CustomResourceDefinition {
        metadata: ObjectMeta {
            name: Some(format!("gadgets.{group}")),
            ..ObjectMeta::default()
        },
        spec: CustomResourceDefinitionSpec {
            group: group.clone(),
            names: CustomResourceDefinitionNames {
                kind: "Gadget".into(),
                plural: "gadgets".into(),
                singular: Some("gadget".into()),
                list_kind: Some("GadgetList".into()),
                ..CustomResourceDefinitionNames::default()
            },
            scope: "Namespaced".into(),
            versions: vec![CustomResourceDefinitionVersion {
                name: "v1".into(),
                served: true,
                storage: true,
                schema: Some(CustomResourceValidation {
                    open_api_v3_schema: Some(JSONSchemaProps {
                        type_: Some("object".into()),
                        x_kubernetes_preserve_unknown_fields: Some(true),
                        ..JSONSchemaProps::default()
                    }),
                }),
                ..CustomResourceDefinitionVersion::default()
            }],
            ..CustomResourceDefinitionSpec::default()
        },
        status: None,
    };
    apply_crd(&client, &crd).await.unwrap();
    let name = crd.metadata.name.clone().unwrap();
    wait_crd_established(&client, &name, Duration::from_secs(30))
        .await
        .unwrap();

    // The new resource is served: create and read back an object.
    let ns = TestNamespace::new("crd-objects").await.unwrap();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&group, "v1", "Gadget"),
        "gadgets",
    );
    let gadgets: Api<DynamicObject> = Api::namespaced_with(ns.client.clone(), &ns.name, &resource);
    let object = DynamicObject::new("g1", &resource).data(serde_json::json!({"spec": {"size": 3}}));
    gadgets
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
    let read = gadgets.get("g1").await.unwrap();
    assert_eq!(read.data["spec"]["size"], 3);

    ns.cleanup().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    crds.delete(&name, &DeleteParams::default()).await.unwrap();
}

#[tokio::test]
async fn garbage_collection_is_real() {
    let ns = TestNamespace::new("gc").await.unwrap();
    let cms: Api<ConfigMap> = ns.api();
    let owner = cms
        .create(&PostParams::default(), &config_map("owner", None))
        .await
        .unwrap();
    cms.create(
        &PostParams::default(),
        &config_map("dependent", Some(&owner)),
    )
    .await
    .unwrap();

    let background = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    cms.delete("owner", &background).await.unwrap();
    let started = Instant::now();
    eventually(
        "the dependent ConfigMap to be collected",
        Duration::from_secs(90),
        || {
            let cms = cms.clone();
            async move {
                cms.get_opt("dependent")
                    .await
                    .unwrap()
                    .is_none()
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();
    eprintln!(
        "garbage collected after {:.2}s",
        started.elapsed().as_secs_f64()
    );
    ns.cleanup().await;
}

fn condition(status: &PodStatus, type_: &str) -> String {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
        .unwrap_or_else(|| panic!("the pod has no {type_} condition: {status:?}"))
}

fn init_terminated(statuses: &[ContainerStatus], name: &str) -> ContainerStateTerminated {
    statuses
        .iter()
        .find(|s| s.name == name)
        .and_then(|s| s.state.as_ref()?.terminated.clone())
        .unwrap_or_else(|| panic!("init container {name} is not terminated: {statuses:?}"))
}

#[tokio::test]
async fn kubelet_simulation_sets_phase_and_termination_message() {
    let ns = TestNamespace::new("kubelet").await.unwrap();
    let pods: Api<Pod> = ns.api();
    let container = |name: &str| Container {
        name: name.into(),
        image: Some("registry.example/app:1".into()),
        ..Container::default()
    };
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("p".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            init_containers: Some(vec![container("fetch"), container("prepare")]),
            containers: vec![container("main"), container("sidecar")],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let kubelet = Kubelet::new(ns.client.clone());

    kubelet.set_phase(&ns.name, "p", "Pending").await.unwrap();
    kubelet
        .terminate_container(&ns.name, "p", "fetch", 0, "fetched 3 files")
        .await
        .unwrap();
    kubelet.set_running(&ns.name, "p").await.unwrap();
    let running = pods.get_status("p").await.unwrap().status.unwrap();
    assert_eq!(running.phase.as_deref(), Some("Running"));
    assert!(running.container_statuses.iter().flatten().all(|c| c.ready));
    for type_ in ["Initialized", "ContainersReady", "Ready"] {
        assert_eq!(condition(&running, type_), "True", "{type_}");
    }
    // `set_running` keeps what `terminate_container` recorded for an init container and only
    // fills in the init containers that have not terminated yet.
    let inits = running.init_container_statuses.unwrap();
    let fetch = init_terminated(&inits, "fetch");
    assert_eq!(fetch.exit_code, 0);
    assert_eq!(fetch.reason.as_deref(), Some("Completed"));
    assert_eq!(fetch.message.as_deref(), Some("fetched 3 files"));
    let prepare = init_terminated(&inits, "prepare");
    assert_eq!(prepare.exit_code, 0);
    assert_eq!(prepare.reason.as_deref(), Some("Completed"));
    assert_eq!(prepare.message, None);

    kubelet
        .terminate_container(&ns.name, "p", "main", 3, "model download failed: disk full")
        .await
        .unwrap();
    kubelet.set_phase(&ns.name, "p", "Failed").await.unwrap();

    let status = pods.get("p").await.unwrap().status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    // A terminated app container makes the pod not ready; initialization stays done.
    assert_eq!(condition(&status, "ContainersReady"), "False");
    assert_eq!(condition(&status, "Ready"), "False");
    assert_eq!(condition(&status, "Initialized"), "True");
    let main = status
        .container_statuses
        .unwrap()
        .into_iter()
        .find(|c| c.name == "main")
        .unwrap();
    let terminated = main.state.unwrap().terminated.unwrap();
    assert_eq!(terminated.exit_code, 3);
    assert_eq!(terminated.reason.as_deref(), Some("Error"));
    assert_eq!(
        terminated.message.as_deref(),
        Some("model download failed: disk full")
    );
    let inits = status.init_container_statuses.unwrap();
    assert_eq!(inits[0].name, "fetch");
    assert_eq!(
        init_terminated(&inits, "fetch").message.as_deref(),
        Some("fetched 3 files")
    );

    let err = kubelet
        .terminate_container(&ns.name, "p", "nope", 1, "")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no container"), "{err}");
    ns.cleanup().await;
}

#[tokio::test]
async fn fault_injector_answers_matching_requests_only() {
    let plane = ControlPlane::shared().await.unwrap();
    let ns = TestNamespace::new("faults").await.unwrap();
    let faults = FaultInjector::new().with_timeout_delay(Duration::from_millis(300));
    let client = plane.client_with_faults(faults.clone()).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client, &ns.name);
    let created = cms
        .create(&PostParams::default(), &config_map("target", None))
        .await
        .unwrap();

    faults.inject(Method::PUT, "/configmaps/target", Fault::Conflict, 1);
    faults.inject(Method::GET, "/configmaps/target", Fault::ServerError, 1);

    // A PUT to another object passes.
    cms.create(&PostParams::default(), &config_map("other", None))
        .await
        .unwrap();
    let other = cms.get("other").await.unwrap();
    cms.replace("other", &PostParams::default(), &other)
        .await
        .unwrap();

    match cms
        .replace("target", &PostParams::default(), &created)
        .await
    {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 409);
            assert_eq!(s.reason, "Conflict");
        }
        other => panic!("expected an injected 409, got {other:?}"),
    }
    match cms.get("target").await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 500);
            assert_eq!(s.reason, "InternalError");
        }
        other => panic!("expected an injected 500, got {other:?}"),
    }
    // Budgets are used up: the real API server answers again.
    cms.replace("target", &PostParams::default(), &created)
        .await
        .unwrap();
    cms.get("target").await.unwrap();

    faults.inject(Method::GET, "/configmaps/target", Fault::Timeout, 1);
    let started = Instant::now();
    let err = cms.get("target").await.unwrap_err();
    assert!(matches!(err, kube::Error::Service(_)), "{err:?}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(faults.injected(), 3);
    assert_eq!(faults.pending(), 0);
    ns.cleanup().await;
}

mod webhook {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::extract::State;
    use axum::routing::post;
    use axum::{Json, Router};
    use axum_server::tls_rustls::RustlsConfig;
    use serde_json::{Value, json};
    use warmcache_testkit::{
        RuleWithOperations, WebhookPki, WebhookRegistration, delete_mutating_webhook,
        delete_validating_webhook, register_mutating, register_validating, wait_for_webhook,
    };

    use super::*;

    #[derive(Clone, Default)]
    struct Hits {
        validate: Arc<AtomicUsize>,
        mutate: Arc<AtomicUsize>,
    }

    fn answer(review: &Value, allowed: bool) -> Json<Value> {
        Json(json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {
                "uid": review["request"]["uid"].clone(),
                "allowed": allowed,
                "status": {"code": 403, "message": "denied by the testkit test webhook"},
            },
        }))
    }

    async fn validate(State(hits): State<Hits>, Json(review): Json<Value>) -> Json<Value> {
        hits.validate.fetch_add(1, Ordering::SeqCst);
        let deny = review["request"]["object"]["metadata"]["labels"]["deny"] == "true";
        answer(&review, !deny)
    }

    async fn mutate(State(hits): State<Hits>, Json(review): Json<Value>) -> Json<Value> {
        hits.mutate.fetch_add(1, Ordering::SeqCst);
        answer(&review, true)
    }

    #[tokio::test]
    async fn webhooks_are_called_by_the_api_server() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let pki = WebhookPki::generate().unwrap();
        let hits = Hits::default();
        let app = Router::new()
            .route("/validate", post(validate))
            .route("/mutate", post(mutate))
            .with_state(hits.clone());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let tls = RustlsConfig::from_pem(
            pki.cert_pem.clone().into_bytes(),
            pki.key_pem.clone().into_bytes(),
        )
        .await
        .unwrap();
        let server = axum_server::from_tcp_rustls(listener, tls).unwrap();
        tokio::spawn(server.serve(app.into_make_service()));

        let ns = TestNamespace::new("webhook").await.unwrap();
        let rules = vec![RuleWithOperations {
            operations: Some(vec!["CREATE".into()]),
            api_groups: Some(vec![String::new()]),
            api_versions: Some(vec!["v1".into()]),
            resources: Some(vec!["configmaps".into()]),
            scope: Some("Namespaced".into()),
        }];
        let validating = format!("{}-validate", ns.name);
        let mutating = format!("{}-mutate", ns.name);
        register_validating(
            &ns.client,
            &WebhookRegistration::new(
                &validating,
                &format!("https://127.0.0.1:{port}/validate"),
                &pki.ca_pem,
                rules.clone(),
            )
            .namespace_selector(ns.selector()),
        )
        .await
        .unwrap();
        register_mutating(
            &ns.client,
            &WebhookRegistration::new(
                &mutating,
                &format!("https://127.0.0.1:{port}/mutate"),
                &pki.ca_pem,
                rules,
            )
            .failure_policy_fail(false)
            .namespace_selector(ns.selector()),
        )
        .await
        .unwrap();

        let cms: Api<ConfigMap> = ns.api();
        let mut denied = config_map("denied", None);
        denied.metadata.labels = Some(BTreeMap::from([("deny".to_owned(), "true".to_owned())]));
        let started = Instant::now();
        wait_for_webhook(Duration::from_secs(30), || {
            let cms = cms.clone();
            let denied = denied.clone();
            async move {
                let dry_run = PostParams {
                    dry_run: true,
                    ..PostParams::default()
                };
                match cms.create(&dry_run, &denied).await {
                    Err(kube::Error::Api(s)) => {
                        s.message.contains("denied by the testkit test webhook")
                    }
                    _ => false,
                }
            }
        })
        .await
        .unwrap();
        eprintln!(
            "webhook active after {:.2}s",
            started.elapsed().as_secs_f64()
        );

        let err = cms
            .create(&PostParams::default(), &denied)
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("denied by the testkit test webhook"),
            "{err}"
        );
        cms.create(&PostParams::default(), &config_map("allowed", None))
            .await
            .unwrap();
        assert!(hits.validate.load(Ordering::SeqCst) >= 2);
        assert!(hits.mutate.load(Ordering::SeqCst) >= 1);

        delete_validating_webhook(&ns.client, &validating)
            .await
            .unwrap();
        delete_mutating_webhook(&ns.client, &mutating)
            .await
            .unwrap();
        ns.cleanup().await;
    }
}
