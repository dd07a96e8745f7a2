//! Typed routes end to end over TLS: the typed request, the patch computed from a typed change
//! and applied to the object as sent, denials with field causes, warnings, and what fails
//! before or after the handler (undecodable objects, wrong kinds, changes that cannot be made).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, EnvVar, Pod};
use serde_json::{Value, json};
use warmcache_admission::patch::{self, Patch};
use warmcache_admission::{
    AdmissionServer, AdmissionServerConfig, FieldCause, Mutation, OnHandlerError, Operation, Reply,
    Route, TypedRequest, Validation,
};

/// What the last typed handler saw, for assertions.
#[derive(Clone, Debug, Default)]
struct Seen {
    operation: Option<Operation>,
    dry_run: Option<bool>,
    name: String,
    namespace: Option<String>,
    username: Option<String>,
    had_old: bool,
}

fn add_env(mut pod: Pod) -> Pod {
    if let Some(spec) = pod.spec.as_mut() {
        for container in &mut spec.containers {
            container.env.get_or_insert_default().push(EnvVar {
                name: "HF_HUB_OFFLINE".into(),
                value: Some("1".into()),
                ..EnvVar::default()
            });
        }
    }
    pod
}

fn review(uid: &str, operation: &str, object: Value, old: Value, dry_run: bool) -> Value {
    let kind = object
        .get("kind")
        .or_else(|| old.get("kind"))
        .cloned()
        .unwrap_or(json!("Pod"));
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "p",
            "namespace": "team-a",
            "operation": operation,
            "userInfo": {"username": "alice"},
            "object": object,
            "oldObject": old,
            "dryRun": dry_run
        }
    })
}

/// A pod as the API server would send it, with fields k8s-openapi does not model: beside the
/// container the handler changes, inside it, and in the pod spec.
fn hostile_pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a", "creationTimestamp": null,
                     "annotations": null},
        "spec": {
            "futurePodField": {"mode": "x"},
            "containers": [
                {"name": "engine", "image": "vllm/vllm-openai", "resources": {},
                 "futureContainerField": ["kept"]},
                {"name": "sidecar", "image": "busybox", "futureContainerField": "also kept"}
            ]
        },
        "status": {}
    })
}

fn patch_of(response: &Value) -> Patch {
    assert_eq!(response["patchType"], "JSONPatch", "{response}");
    let bytes = patch_bytes(response);
    serde_json::from_slice(&bytes).unwrap()
}

struct Fixture {
    _dir: tempfile::TempDir,
    ca: Ca,
    running: Running,
    seen: Arc<Mutex<Seen>>,
}

fn record(seen: &Mutex<Seen>, req: &TypedRequest<Pod>) {
    *seen.lock().unwrap() = Seen {
        operation: Some(req.operation.clone()),
        dry_run: Some(req.dry_run),
        name: req.name.clone(),
        namespace: req.namespace.clone(),
        username: req.user_info.username.clone(),
        had_old: req.old_object.is_some(),
    };
}

fn start() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("typed CA");
    ca.leaf(1).write_to(dir.path());
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s1 = Arc::clone(&seen);
    let s2 = Arc::clone(&seen);
    let server = AdmissionServer::new(AdmissionServerConfig::new(files_in(dir.path())))
        .route(Route::mutating_typed(
            "/mutate",
            move |req: TypedRequest<Pod>| {
                record(&s1, &req);
                match req.object {
                    Some(pod) if pod.metadata.labels.is_some() => {
                        Reply::new(Mutation::Mutated(add_env(pod))).warning("env added")
                    }
                    Some(pod) => Mutation::Mutated(add_env(pod)).into(),
                    None => Mutation::Allow.into(),
                }
            },
        ))
        .route(Route::mutating_typed_async(
            "/mutate-async",
            move |req: TypedRequest<Pod>| {
                let seen = Arc::clone(&s2);
                async move {
                    tokio::task::yield_now().await;
                    record(&seen, &req);
                    Ok::<_, String>(match req.object {
                        Some(pod) => Mutation::Mutated(add_env(pod)),
                        None => Mutation::Allow,
                    })
                }
            },
        ))
        .route(Route::mutating_typed(
            "/unchanged",
            |req: TypedRequest<Pod>| req.object.map_or(Mutation::Allow, Mutation::Mutated),
        ))
        .route(Route::mutating_typed(
            "/mutate-deny",
            |_req: TypedRequest<Pod>| {
                Reply::new(Mutation::<Pod>::Deny {
                    message: String::new(),
                    causes: vec![
                        FieldCause::forbidden("spec.hostNetwork", "host networking is not allowed"),
                        FieldCause::required("metadata.labels[app]", "every pod names its app"),
                    ],
                })
                .warning("see the policy")
            },
        ))
        .route(Route::mutating_typed(
            "/mutate-always",
            |req: TypedRequest<Pod>| match req.object {
                Some(pod) => Mutation::Mutated(add_env(pod)),
                None => Mutation::Mutated(Pod::default()),
            },
        ))
        .route(
            Route::mutating_typed("/mutate-lenient", |req: TypedRequest<Pod>| {
                req.object
                    .map_or(Mutation::Allow, |pod| Mutation::Mutated(add_env(pod)))
            })
            .on_error(OnHandlerError::Allow),
        )
        .route(Route::validating_typed(
            "/validate",
            |req: TypedRequest<Pod>| -> Result<Reply<Validation>, String> {
                let pod = req.object.ok_or("no object")?;
                let spec = pod.spec.unwrap_or_default();
                let causes: Vec<FieldCause> = spec
                    .containers
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.image.as_deref().is_none_or(|i| !i.contains(':')))
                    .map(|(i, _)| {
                        FieldCause::invalid(
                            format!("spec.containers[{i}].image"),
                            "must name a tag",
                        )
                    })
                    .collect();
                let outcome = if causes.is_empty() {
                    Validation::Allow
                } else {
                    Validation::Deny {
                        message: "images must be pinned".into(),
                        causes,
                    }
                };
                Ok(Reply::new(outcome).warning("validated by the typed route"))
            },
        ))
        .route(Route::validating_typed_async(
            "/validate-async-fails",
            |_req: TypedRequest<ConfigMap>| async { Err::<Validation, _>("the catalog is down") },
        ));
    Fixture {
        _dir: dir,
        ca,
        running: spawn_serve(server),
        seen,
    }
}

#[tokio::test]
async fn typed_mutation_becomes_a_fine_grained_patch_that_keeps_unknown_fields() {
    let f = start();
    for path in ["/mutate", "/mutate-async"] {
        let raw = hostile_pod();
        let reply = post_json(
            f.running.addr,
            &f.ca,
            path,
            &review("uid-m", "CREATE", raw.clone(), Value::Null, false),
        )
        .await;
        let response = reply.response();
        assert_eq!(response["uid"], "uid-m", "{path}");
        assert_eq!(response["allowed"], true, "{path}: {response}");
        let patch = patch_of(&response);
        // One add per container, inside it: nothing around the unknown fields is replaced.
        assert_eq!(
            serde_json::to_value(&patch).unwrap(),
            json!([
                {"op": "add", "path": "/spec/containers/0/env",
                 "value": [{"name": "HF_HUB_OFFLINE", "value": "1"}]},
                {"op": "add", "path": "/spec/containers/1/env",
                 "value": [{"name": "HF_HUB_OFFLINE", "value": "1"}]},
            ]),
            "{path}"
        );
        let patched = patch::apply(&raw, &patch).unwrap();
        assert_eq!(patched["spec"]["futurePodField"], json!({"mode": "x"}));
        assert_eq!(
            patched["spec"]["containers"][0]["futureContainerField"],
            json!(["kept"])
        );
        assert_eq!(
            patched["spec"]["containers"][1]["futureContainerField"],
            "also kept"
        );
        assert_eq!(patched["metadata"]["creationTimestamp"], Value::Null);
        assert!(response.get("warnings").is_none(), "{path}: {response}");
        let seen = f.seen.lock().unwrap().clone();
        assert_eq!(seen.operation, Some(Operation::Create), "{path}");
        assert_eq!(seen.dry_run, Some(false));
        assert_eq!(seen.name, "p");
        assert_eq!(seen.namespace.as_deref(), Some("team-a"));
        assert_eq!(seen.username.as_deref(), Some("alice"));
        assert!(!seen.had_old);
    }
    f.running.stop().await;
}

#[tokio::test]
async fn dry_run_and_old_object_reach_the_handler() {
    let f = start();
    let pod = hostile_pod();
    let reply = post_json(
        f.running.addr,
        &f.ca,
        "/mutate",
        &review("uid-dry", "UPDATE", pod.clone(), pod, true),
    )
    .await;
    assert_eq!(reply.response()["allowed"], true);
    let seen = f.seen.lock().unwrap().clone();
    assert_eq!(seen.operation, Some(Operation::Update));
    assert_eq!(seen.dry_run, Some(true));
    assert!(seen.had_old);
    f.running.stop().await;
}

#[tokio::test]
async fn warnings_travel_with_every_outcome() {
    let f = start();
    // Mutated with a warning.
    let mut labelled = hostile_pod();
    labelled["metadata"]["labels"] = json!({"app": "x"});
    let response = post_json(
        f.running.addr,
        &f.ca,
        "/mutate",
        &review("uid-w", "CREATE", labelled, Value::Null, false),
    )
    .await
    .response();
    assert_eq!(response["warnings"], json!(["env added"]), "{response}");
    assert!(response.get("patch").is_some());
    // Allowed with a warning.
    let mut pinned = hostile_pod();
    pinned["spec"]["containers"][0]["image"] = json!("vllm/vllm-openai:v1");
    pinned["spec"]["containers"][1]["image"] = json!("busybox:1");
    let response = post_json(
        f.running.addr,
        &f.ca,
        "/validate",
        &review("uid-v", "CREATE", pinned, Value::Null, false),
    )
    .await
    .response();
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(
        response["warnings"],
        json!(["validated by the typed route"]),
        "{response}"
    );
    f.running.stop().await;
}

#[tokio::test]
async fn denials_carry_field_causes_as_invalid() {
    let f = start();
    let response = post_json(
        f.running.addr,
        &f.ca,
        "/validate",
        &review("uid-deny", "CREATE", hostile_pod(), Value::Null, false),
    )
    .await
    .response();
    assert_eq!(response["uid"], "uid-deny");
    assert_eq!(response["allowed"], false);
    let status = &response["status"];
    assert_eq!(status["code"], 422, "{response}");
    assert_eq!(status["reason"], "Invalid");
    assert_eq!(status["message"], "images must be pinned");
    assert_eq!(status["details"]["kind"], "Pod");
    assert_eq!(status["details"]["name"], "p");
    assert_eq!(
        status["details"]["causes"],
        json!([
            {"reason": "FieldValueInvalid", "message": "must name a tag",
             "field": "spec.containers[0].image"},
            {"reason": "FieldValueInvalid", "message": "must name a tag",
             "field": "spec.containers[1].image"},
        ])
    );
    assert_eq!(
        response["warnings"],
        json!(["validated by the typed route"])
    );

    // A denial without a message is described by its causes.
    let response = post_json(
        f.running.addr,
        &f.ca,
        "/mutate-deny",
        &review("uid-md", "CREATE", hostile_pod(), Value::Null, false),
    )
    .await
    .response();
    assert_eq!(response["allowed"], false);
    assert!(response.get("patch").is_none());
    assert_eq!(
        response["status"]["message"],
        "spec.hostNetwork: host networking is not allowed; metadata.labels[app]: every pod \
         names its app"
    );
    assert_eq!(
        response["status"]["details"]["causes"][1]["reason"],
        "FieldValueRequired"
    );
    assert_eq!(response["warnings"], json!(["see the policy"]));
    f.running.stop().await;
}

#[tokio::test]
async fn an_unchanged_object_is_admitted_without_a_patch() {
    let f = start();
    let response = post_json(
        f.running.addr,
        &f.ca,
        "/unchanged",
        &review("uid-u", "CREATE", hostile_pod(), Value::Null, false),
    )
    .await
    .response();
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none(), "{response}");
    assert!(response.get("patchType").is_none(), "{response}");
    f.running.stop().await;
}

#[tokio::test]
async fn failures_before_and_after_the_handler_follow_the_policy() {
    let f = start();
    let mut bad = hostile_pod();
    bad["spec"]["containers"][1]["ports"] = json!([{"containerPort": "http"}]);

    // Deny policy: an internal error naming the field.
    let response = post_json(
        f.running.addr,
        &f.ca,
        "/mutate",
        &review("uid-bad", "CREATE", bad.clone(), Value::Null, false),
    )
    .await
    .response();
    assert_eq!(response["uid"], "uid-bad");
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 500);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains(
            "the object does not decode as v1/Pod at spec.containers[1].ports[0].containerPort"
        ),
        "{message}"
    );
    // The stored object is decoded too.
    let response = post_json(
        f.running.addr,
        &f.ca,
        "/mutate",
        &review("uid-bad-old", "UPDATE", hostile_pod(), bad.clone(), false),
    )
    .await
    .response();
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains(
            "the stored object (oldObject) does not decode as v1/Pod at spec.containers[1]"
        ),
        "{message}"
    );

    // Allow policy: admitted unchanged, with a warning naming the field.
    let response = post_json(
        f.running.addr,
        &f.ca,
        "/mutate-lenient",
        &review("uid-lenient", "CREATE", bad, Value::Null, false),
    )
    .await
    .response();
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none());
    let warning = response["warnings"][0].as_str().unwrap();
    assert!(
        warning.contains("/mutate-lenient failed")
            && warning.contains("spec.containers[1].ports[0].containerPort"),
        "{warning}"
    );

    // A route typed for ConfigMaps sent a Pod: the registration is wrong.
    let response = post_json(
        f.running.addr,
        &f.ca,
        "/validate-async-fails",
        &review("uid-kind", "CREATE", hostile_pod(), Value::Null, false),
    )
    .await
    .response();
    assert_eq!(response["allowed"], false);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("reads v1/ConfigMap objects and was sent a v1/Pod"),
        "{message}"
    );
    // Sent a ConfigMap, the async handler's error is the failure.
    let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "p"}});
    let response = post_json(
        f.running.addr,
        &f.ca,
        "/validate-async-fails",
        &review("uid-cm", "CREATE", config_map, Value::Null, false),
    )
    .await
    .response();
    assert_eq!(response["status"]["code"], 500);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .ends_with("the catalog is down"),
        "{response}"
    );

    // A change of a DELETE request (no object to change) is a handler failure.
    let response = post_json(
        f.running.addr,
        &f.ca,
        "/mutate-always",
        &review("uid-del", "DELETE", Value::Null, hostile_pod(), false),
    )
    .await
    .response();
    assert_eq!(response["allowed"], false);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("carries no object to change"),
        "{response}"
    );
    f.running.stop().await;
}
