//! The webhook registered with a real kube-apiserver (failurePolicy Fail, CREATE and UPDATE of
//! kvcachebackends, scoped by an object selector on a per-test label): for every vector, what
//! the CRD schema and CEL refuse plus what the webhook refuses equals the expected verdict. Also:
//! the operator's finalizer removal of a deleting object that fails today's rules is admitted,
//! and the rendered objects pass the API server's strict validation and, where the store
//! allows, Pod Security "restricted"; the rendered HA accounts get exactly the Lease access the
//! election needs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::RuleWithOperations;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use warmcache_admission::{AdmissionServerConfig, TlsFiles};
use warmcache_kvcache::vectors::{self, Layer, Vector, Verdict};
use warmcache_kvcache::{RenderContext, ValidationContext, from_value, render};
use warmcache_kvcache_operator::WEBHOOK_PATH;
use warmcache_kvcache_operator::webhook::admission_server;
use warmcache_testkit::{
    ControlPlane, TestNamespace, WebhookPki, WebhookRegistration, delete_validating_webhook,
    register_validating, wait_for_webhook,
};

const SELECTOR_LABEL: &str = "warmcache.test/kvcache-webhook";

fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("worker.gpustack.ai", "v1alpha1", "KVCacheBackend"),
        "kvcachebackends",
    )
}

fn rule() -> RuleWithOperations {
    RuleWithOperations {
        api_groups: Some(vec!["worker.gpustack.ai".into()]),
        api_versions: Some(vec!["v1alpha1".into()]),
        operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
        resources: Some(vec!["kvcachebackends".into()]),
        scope: Some("Cluster".into()),
    }
}

/// The webhook served in-process over HTTPS and registered; dropped with `stop`.
struct Served {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), warmcache_admission::AdmissionError>>,
    config_name: String,
    label: String,
    _dir: tempfile::TempDir,
}

impl Served {
    async fn start(client: &kube::Client, run: &str) -> Served {
        let pki = WebhookPki::generate().unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tls.crt"), &pki.cert_pem).unwrap();
        std::fs::write(dir.path().join("tls.key"), &pki.key_pem).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let shutdown = CancellationToken::new();
        let server = admission_server(
            AdmissionServerConfig::new(TlsFiles::in_dir(dir.path())),
            ValidationContext::default(),
        );
        let task = tokio::spawn(server.serve(listener, shutdown.clone()));
        let config_name = format!("kvcache-{run}.webhook.warmcache.io");
        let label = format!("{run}-{}", std::process::id());
        register_validating(
            client,
            &WebhookRegistration::new(
                &config_name,
                &format!("https://127.0.0.1:{port}{WEBHOOK_PATH}"),
                &pki.ca_pem,
                vec![rule()],
            )
            .failure_policy_fail(true)
            .object_selector(LabelSelector {
                match_labels: Some(BTreeMap::from([(SELECTOR_LABEL.to_owned(), label.clone())])),
                match_expressions: None,
            }),
        )
        .await
        .unwrap();

        // Wait until the API server calls us: a labelled X1 (webhook-only refusal) is refused.
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource());
        let probe = object(
            &vectors::with(vectors::v2(), |o| {
                vectors::members(o)[0]["capacityPerMember"] = json!("8Mi")
            }),
            &format!("probe-{run}"),
            Some(&label),
        );
        let dry = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        wait_for_webhook(Duration::from_secs(30), || {
            let api = api.clone();
            let dry = dry.clone();
            let probe = probe.clone();
            async move {
                match api.create(&dry, &probe).await {
                    Err(kube::Error::Api(s)) => s.message.contains("must be at least 16Mi"),
                    _ => false,
                }
            }
        })
        .await
        .expect("the webhook becomes active");
        Served {
            shutdown,
            task,
            config_name,
            label,
            _dir: dir,
        }
    }

    async fn stop(self, client: &kube::Client) {
        delete_validating_webhook(client, &self.config_name)
            .await
            .unwrap();
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(15), self.task)
            .await
            .expect("the webhook stops")
            .unwrap()
            .expect("the webhook ends cleanly");
    }
}

fn object(value: &Value, name: &str, label: Option<&str>) -> DynamicObject {
    let mut value = value.clone();
    value["metadata"]["name"] = json!(name);
    if let Some(label) = label {
        value["metadata"]["labels"] = json!({SELECTOR_LABEL: label});
    }
    serde_json::from_value(value).unwrap()
}

/// Removes the finalizers of `name` (if any) and deletes it.
async fn remove(api: &Api<DynamicObject>, name: &str) {
    if let Some(stored) = api.get_opt(name).await.unwrap() {
        if stored
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| !f.is_empty())
        {
            api.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await
            .unwrap();
        }
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
}

/// Runs one vector; `Ok(())` when admitted, the server's message otherwise.
async fn attempt(
    api: &Api<DynamicObject>,
    label: &str,
    name: &str,
    vector: &Vector,
) -> Result<(), (u16, String)> {
    let pp = PostParams::default();
    let new = object(&vector.new, name, Some(label));
    let result = match &vector.old {
        None => api.create(&pp, &new).await.map(drop),
        Some(old) => {
            // Stored without the label, so the webhook does not see the create: ratchet vectors
            // hold objects that only older rules admitted. The CRD's own rules still apply.
            let stored = api
                .create(&pp, &object(old, name, None))
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "{} {}: the old object must be stored: {e}",
                        vector.id, vector.what
                    )
                });
            let mut update = new.clone();
            update.metadata.resource_version = stored.metadata.resource_version;
            api.replace(name, &pp, &update).await.map(drop)
        }
    };
    remove(api, name).await;
    result.map_err(|e| match e {
        kube::Error::Api(status) => (status.code, status.message),
        other => (0, other.to_string()),
    })
}

fn judge(vector: &Vector, result: Result<(), (u16, String)>) -> Option<String> {
    let label = format!("{} {}", vector.id, vector.what);
    match (&vector.verdict, result) {
        (Verdict::Admitted, Ok(())) => None,
        (Verdict::Admitted, Err((_, message))) => {
            Some(format!("{label}: refused ({message}), expected admission"))
        }
        (Verdict::Refused { .. }, Ok(())) => Some(format!("{label}: admitted, expected a refusal")),
        (
            Verdict::Refused {
                path,
                reason,
                layer,
            },
            Err((code, message)),
        ) => {
            let by_webhook = message.contains("admission webhook");
            match layer {
                Layer::Schema(want) | Layer::Cel(want) => {
                    if by_webhook {
                        Some(format!(
                            "{label}: refused by the webhook ({message}), expected the CRD to refuse first"
                        ))
                    } else if !message.contains(want) {
                        Some(format!("{label}: refused, but {message:?} lacks {want:?}"))
                    } else {
                        None
                    }
                }
                Layer::Webhook => {
                    let expected = format!("{path}: ");
                    if !by_webhook {
                        Some(format!("{label}: refused before the webhook ({message})"))
                    } else if !message.contains(&expected) || !message.contains(reason) {
                        Some(format!(
                            "{label}: webhook refusal {message:?} lacks {expected:?} ... {reason:?}"
                        ))
                    } else if code != 422 {
                        Some(format!(
                            "{label}: webhook refusal with code {code}, expected 422"
                        ))
                    } else {
                        None
                    }
                }
            }
        }
    }
}

#[tokio::test]
async fn schema_cel_and_webhook_together_give_every_expected_verdict() {
    let plane = ControlPlane::shared().await.expect("control plane");
    let client = plane.client().await.unwrap();
    let served = Served::start(&client, "verdicts").await;
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource());

    let all = vectors::all();
    // Every vector id of the reference is exercised here.
    for n in 1..=14 {
        assert!(all.iter().any(|v| v.id == format!("V{n}")), "V{n}");
    }
    for n in 1..=33 {
        assert!(all.iter().any(|v| v.id == format!("X{n}")), "X{n}");
    }
    let mut failures = Vec::new();
    for (i, vector) in all.iter().enumerate() {
        let original = vector.new["metadata"]["name"].as_str().unwrap_or("kvc");
        let name = if original == "kvc" {
            format!("kvc-w{i}")
        } else {
            original.to_owned()
        };
        let result = attempt(&api, &served.label, &name, vector).await;
        if let Some(failure) = judge(vector, result) {
            failures.push(failure);
        }
    }
    served.stop(&client).await;
    assert!(
        failures.is_empty(),
        "verdicts differ:\n{}",
        failures.join("\n")
    );
}

#[tokio::test]
async fn finalizer_removal_of_a_deleting_backend_that_fails_todays_rules_is_admitted() {
    let plane = ControlPlane::shared().await.expect("control plane");
    let client = plane.client().await.unwrap();
    let served = Served::start(&client, "finalizer").await;
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource());
    let name = "kvc-finalizer";

    // Admitted under older rules: a 1Mi tier and a derived leader flag (the CRD allows both).
    let old_rules = vectors::with(vectors::v2(), |o| {
        vectors::tier0(o)["capacity"] = json!("1Mi");
        vectors::managed(o)["leader"]["extraArgs"] = json!(["-enable_offload=true"]);
        o["metadata"]["finalizers"] = json!(["worker.gpustack.ai/kvcache-test"]);
    });
    api.create(&PostParams::default(), &object(&old_rules, name, None))
        .await
        .unwrap();
    let refused_today = api
        .create(
            &PostParams {
                dry_run: true,
                ..PostParams::default()
            },
            &object(&old_rules, "kvc-finalizer-today", Some(&served.label)),
        )
        .await
        .expect_err("today's rules refuse this backend");
    assert!(
        refused_today.to_string().contains("must be at least 16Mi"),
        "{refused_today}"
    );

    // Bring it under the webhook with a metadata-only update (admitted: spec unchanged).
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {SELECTOR_LABEL: served.label}}})),
    )
    .await
    .expect("a label-only update is admitted");

    // Delete: the finalizer holds it, Terminating.
    api.delete(name, &DeleteParams::default()).await.unwrap();
    let deleting = api.get(name).await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());

    // The webhook still runs on updates of a deleting object: a moved floor is refused ...
    let err = api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"connection": {"managed": {"members": [
                vectors::with(vectors::v2_group(), |g| g["localDisks"][0]["capacity"] = json!("2Mi"))
            ]}}}})),
        )
        .await
        .expect_err("the tier stays guarded while the backend is deleting");
    assert!(err.to_string().contains("admission webhook"), "{err}");
    assert!(err.to_string().contains("must be at least 16Mi"), "{err}");

    // ... and the operator's finalizer removal is admitted, so the object goes away.
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("the finalizer removal is admitted");
    warmcache_testkit::eventually("the backend to be gone", Duration::from_secs(30), || {
        let api = api.clone();
        async move { api.get_opt(name).await.unwrap().is_none().then_some(()) }
    })
    .await
    .unwrap();
    served.stop(&client).await;
}

/// POSTs `object` to `collection` with `dryRun=All&fieldValidation=Strict`.
async fn dry_run_strict(
    client: &kube::Client,
    collection: &str,
    object: &Value,
) -> Result<Value, String> {
    let request = http::Request::post(format!("{collection}?dryRun=All&fieldValidation=Strict"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(object).unwrap())
        .unwrap();
    client
        .request::<Value>(request)
        .await
        .map_err(|e| e.to_string())
}

fn rendered_documents(value: &Value, namespace: &str) -> Vec<Value> {
    let value = vectors::with(value.clone(), |o| {
        o["metadata"]["uid"] = json!("0b9e8f4a-1111-2222-3333-444455556666");
    });
    let backend = from_value(value).unwrap();
    assert_eq!(validate_ok(&backend), Vec::<String>::new());
    let ctx = RenderContext {
        namespace: namespace.to_owned(),
        ..RenderContext::default()
    };
    let text = render(&backend, &ctx).unwrap().to_yaml_stream().unwrap();
    // What the render command prints is what is sent.
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn validate_ok(backend: &warmcache_api_kvcache::v1alpha1::KVCacheBackend) -> Vec<String> {
    warmcache_kvcache::validate(backend, None, &ValidationContext::default())
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn collection(namespace: &str, kind: &str) -> String {
    match kind {
        "Deployment" => format!("/apis/apps/v1/namespaces/{namespace}/deployments"),
        "DaemonSet" => format!("/apis/apps/v1/namespaces/{namespace}/daemonsets"),
        "Service" => format!("/api/v1/namespaces/{namespace}/services"),
        "ServiceAccount" => format!("/api/v1/namespaces/{namespace}/serviceaccounts"),
        "Role" => format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles"),
        "RoleBinding" => {
            format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings")
        }
        other => panic!("unexpected kind {other}"),
    }
}

fn render_cases() -> Vec<(&'static str, Value)> {
    use vectors::{managed, members, with};
    vec![
        ("V1", vectors::v1()),
        ("V2", vectors::v2()),
        ("V4", vectors::v4()),
        ("V9", vectors::v9()),
        (
            "V14",
            with(vectors::v2(), |o| {
                managed(o)["leader"]["extraArgs"] =
                    json!(["-default_kv_lease_ttl=10m", "-client_ttl=30"]);
            }),
        ),
        (
            "HA with Lease addressing, pull secrets, extraEnv",
            with(vectors::v2(), |o| {
                managed(o)["leader"] = json!({"replicas": 3, "highAvailability": {"memberAddressing": "Lease"},
                    "extraEnv": [{"name": "GLOG_v", "value": "1"}]});
                o["spec"]["imagePullSecrets"] = json!([{"name": "registry"}]);
            }),
        ),
        (
            "RDMA VRAM group with hostPaths, runtime class and a security context",
            with(vectors::v2(), |o| {
                members(o)[0]["transport"] = json!({"protocol": "RDMA"});
                members(o)[0]["medium"] = json!("VRAM");
                members(o)[0]["localBufferSize"] = json!("1Gi");
                members(o)[0]["runtimeClassName"] = json!("nvidia");
                members(o)[0]["hostPaths"] = json!([{"path": "/opt/models", "mountPath": "/models", "type": "Directory", "readOnly": true}]);
                members(o)[0]["securityContext"] =
                    json!({"runAsUser": 65532, "capabilities": {"add": ["NET_RAW"]}});
                members(o)[0]["extraArgs"] = json!(["-device_name=mlx5_0"]);
                members(o)[0]["extraEnv"] =
                    json!([{"name": "MOONCAKE_USE_URING", "value": "true"}]);
            }),
        ),
        (
            "EFA group",
            with(vectors::v1(), |o| {
                members(o)[0]["transport"] = json!({"protocol": "EFA"});
                members(o)[0]["fabricInterfaceCount"] = json!(4);
            }),
        ),
    ]
}

#[tokio::test]
async fn rendered_objects_pass_strict_server_side_validation() {
    let ns = TestNamespace::new("kvcache-render")
        .await
        .expect("namespace");
    let mut failures = Vec::new();
    let mut sent = 0;
    for (case, value) in render_cases() {
        for document in rendered_documents(&value, &ns.name) {
            let kind = document["kind"].as_str().unwrap().to_owned();
            match dry_run_strict(&ns.client, &collection(&ns.name, &kind), &document).await {
                Ok(created) => {
                    sent += 1;
                    // The server kept every field we sent (nothing pruned or renamed).
                    assert_eq!(created["metadata"]["name"], document["metadata"]["name"]);
                    assert_eq!(
                        created["metadata"]["ownerReferences"],
                        document["metadata"]["ownerReferences"],
                        "{case} {kind}"
                    );
                }
                Err(message) => failures.push(format!("{case} {kind}: {message}")),
            }
        }
    }
    ns.cleanup().await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(sent >= 20, "only {sent} objects were checked");
}

/// Whether the API server's RBAC lets `account` (in `namespace`) do `verb` on the Lease `name`
/// (any Lease when `None`).
async fn may(
    client: &kube::Client,
    namespace: &str,
    account: &str,
    verb: &str,
    name: Option<&str>,
) -> bool {
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{namespace}:{account}")),
            groups: Some(vec!["system:serviceaccounts".into()]),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_owned()),
                verb: Some(verb.to_owned()),
                group: Some("coordination.k8s.io".into()),
                resource: Some("leases".into()),
                name: name.map(str::to_owned),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let answer = reviews
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    answer.status.is_some_and(|s| s.allowed)
}

#[tokio::test]
async fn ha_access_lets_the_leaders_hold_their_lease_and_the_members_only_read_it() {
    let ns = TestNamespace::new("kvcache-ha").await.expect("namespace");
    let value = vectors::with(vectors::v2(), |o| {
        vectors::managed(o)["leader"] =
            json!({"replicas": 2, "highAvailability": {"memberAddressing": "Lease"}});
    });
    let backend = from_value(value).unwrap();
    assert_eq!(validate_ok(&backend), Vec::<String>::new());
    // No uid: the objects carry no owner reference, so the garbage collector leaves them be.
    let ctx = RenderContext {
        namespace: ns.name.clone(),
        ..RenderContext::default()
    };
    let r = render(&backend, &ctx).unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(ns.client.clone(), &ns.name);
    let roles: Api<Role> = Api::namespaced(ns.client.clone(), &ns.name);
    let bindings: Api<RoleBinding> = Api::namespaced(ns.client.clone(), &ns.name);
    for account in &r.service_accounts {
        accounts
            .create(&PostParams::default(), account)
            .await
            .unwrap();
    }
    for role in &r.roles {
        roles.create(&PostParams::default(), role).await.unwrap();
    }
    for binding in &r.role_bindings {
        bindings
            .create(&PostParams::default(), binding)
            .await
            .unwrap();
    }
    // The Pods name exactly these accounts.
    let leader_pod = r.leader.spec.template.spec.as_ref().unwrap();
    assert_eq!(
        leader_pod.service_account_name.as_deref(),
        Some("kvc-leader")
    );
    let member_pod = r.members[0].spec.template.spec.as_ref().unwrap();
    assert_eq!(
        member_pod.service_account_name.as_deref(),
        Some("kvc-member")
    );

    let client = ns.client.clone();
    let namespace = ns.name.clone();
    // The authorizer sees new bindings after a moment.
    warmcache_testkit::eventually(
        "the leader binding to apply",
        Duration::from_secs(30),
        || {
            let client = client.clone();
            let namespace = namespace.clone();
            async move {
                may(
                    &client,
                    &namespace,
                    "kvc-leader",
                    "update",
                    Some("kvc-leader"),
                )
                .await
                .then_some(())
            }
        },
    )
    .await
    .unwrap();
    warmcache_testkit::eventually(
        "the member binding to apply",
        Duration::from_secs(30),
        || {
            let client = client.clone();
            let namespace = namespace.clone();
            async move {
                may(&client, &namespace, "kvc-member", "get", Some("kvc-leader"))
                    .await
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();
    let lease = Some("kvc-leader");
    for (account, verb, name, allowed) in [
        ("kvc-leader", "create", None, true),
        ("kvc-leader", "get", lease, true),
        ("kvc-leader", "watch", lease, true),
        ("kvc-leader", "patch", lease, true),
        ("kvc-leader", "update", Some("another-lease"), false),
        ("kvc-leader", "delete", lease, false),
        ("kvc-member", "watch", lease, true),
        ("kvc-member", "update", lease, false),
        ("kvc-member", "create", None, false),
        ("kvc-member", "get", Some("another-lease"), false),
    ] {
        assert_eq!(
            may(&client, &namespace, account, verb, name).await,
            allowed,
            "{account} {verb} {name:?}"
        );
    }
    ns.cleanup().await;
}

#[tokio::test]
async fn leader_and_plain_members_pass_pod_security_restricted_and_tier_members_do_not() {
    let ns = TestNamespace::new("kvcache-pss").await.expect("namespace");
    let namespaces: Api<Namespace> = Api::all(ns.client.clone());
    namespaces
        .patch(
            &ns.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            }}})),
        )
        .await
        .unwrap();
    let pod_from = |document: &Value, name: &str| {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": document["spec"]["template"]["metadata"]["labels"]},
            "spec": document["spec"]["template"]["spec"],
        })
    };
    let pods = format!("/api/v1/namespaces/{}/pods", ns.name);

    let v1 = rendered_documents(&vectors::v1(), &ns.name);
    for (i, document) in v1
        .iter()
        .enumerate()
        .filter(|(_, d)| d["kind"] != "Service")
    {
        let result =
            dry_run_strict(&ns.client, &pods, &pod_from(document, &format!("v1-{i}"))).await;
        assert!(result.is_ok(), "{}: {result:?}", document["kind"]);
    }

    // A tier member needs a hostPath volume, which Pod Security refuses below "privileged".
    let v2 = rendered_documents(&vectors::v2(), &ns.name);
    let member = v2.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let err = dry_run_strict(&ns.client, &pods, &pod_from(member, "v2-member"))
        .await
        .expect_err("restricted refuses the tier member");
    assert!(err.contains("hostPath"), "{err}");
    ns.cleanup().await;
}

/// Creates `value` (dry run) through the API server and returns the `Warning` headers of the
/// answer and its HTTP status.
async fn create_with_warnings(client: &kube::Client, value: &Value) -> (u16, Vec<String>) {
    let body = serde_json::to_vec(value).unwrap();
    let request = http::Request::post(
        "/apis/worker.gpustack.ai/v1alpha1/kvcachebackends?dryRun=All&fieldValidation=Strict",
    )
    .header("content-type", "application/json")
    .body(kube::client::Body::from(body))
    .unwrap();
    let response = client.send(request).await.unwrap();
    let warnings = response
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    (response.status().as_u16(), warnings)
}

#[tokio::test]
async fn measured_misconfigurations_reach_the_client_as_warnings_and_are_admitted() {
    let plane = ControlPlane::shared().await.expect("control plane");
    let client = plane.client().await.unwrap();
    let served = Served::start(&client, "warnings").await;

    // A 16Mi tier (admitted upstream, every write fails on the real store) with a key limit
    // that eviction makes inert.
    let small = object(
        &vectors::with(vectors::v2(), |o| {
            vectors::members(o)[0]["capacityPerMember"] = json!("1Gi");
            vectors::tier0(o)["capacity"] = json!("16Mi");
            vectors::tier0(o)["eviction"] = json!({"enabled": true});
        }),
        "kvc-warned",
        Some(&served.label),
    );
    let (status, warnings) =
        create_with_warnings(&client, &serde_json::to_value(&small).unwrap()).await;
    assert_eq!(status, 201, "{warnings:?}");
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    // The API server's form: 299 - "<text>".
    assert!(
        warnings[0].starts_with(
            "299 - \"spec.connection.managed.members[0].localDisks[0].capacity: 16777216 bytes hold no complete 16Mi bucket"
        ),
        "{warnings:?}"
    );
    assert!(warnings[0].contains("use at least 20Mi"), "{warnings:?}");
    assert!(
        warnings[1].contains("localDisks[0].keyLimit: has no effect while eviction is enabled"),
        "{warnings:?}"
    );

    // No capacity: the 2Ti warning.
    let unbounded = object(
        &vectors::with(vectors::v2(), |o| {
            vectors::tier0(o)["capacity"] = json!(null);
            vectors::tier0(o)["keyLimit"] = json!(null);
            vectors::tier0(o)["eviction"] = json!(null);
        }),
        "kvc-unbounded",
        Some(&served.label),
    );
    let (status, warnings) =
        create_with_warnings(&client, &serde_json::to_value(&unbounded).unwrap()).await;
    assert_eq!(status, 201);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("capacity: unset: the store then reports 2Ti"),
        "{warnings:?}"
    );

    // A working tier draws none.
    let fine = object(
        &vectors::with(vectors::v2(), |o| {
            vectors::tier0(o)["keyLimit"] = json!(null);
        }),
        "kvc-fine",
        Some(&served.label),
    );
    let (status, warnings) =
        create_with_warnings(&client, &serde_json::to_value(&fine).unwrap()).await;
    assert_eq!(status, 201);
    assert_eq!(warnings, Vec::<String>::new());
    served.stop(&client).await;
}
