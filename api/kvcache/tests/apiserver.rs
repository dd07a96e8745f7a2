//! The cases of `tests/cases`, replayed against a real kube-apiserver with the generated CRD
//! installed. `cases()` must get the same verdicts kube-cel gives in `tests/cel.rs` (a CEL rule
//! the real server rejects or evaluates differently fails here); `schema_cases()` must be
//! refused by the plain OpenAPI schema.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cases;

use cases::Case;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use warmcache_testkit::ControlPlane;

fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("worker.gpustack.ai", "v1alpha1", "KVCacheBackend"),
        "kvcachebackends",
    )
}

fn object(value: &serde_json::Value, name: &str) -> DynamicObject {
    let mut value = value.clone();
    value["metadata"]["name"] = name.into();
    serde_json::from_value(value).expect("case object is a Kubernetes object")
}

/// Runs one case under a unique name; `Ok(())` when admitted, the server's message otherwise.
/// The object is deleted afterwards (the backend is cluster-scoped).
async fn apply(api: &Api<DynamicObject>, name: &str, case: &Case) -> Result<(), String> {
    let pp = PostParams::default();
    let new = object(&case.new, name);
    let result = match &case.old {
        None => api.create(&pp, &new).await.map(drop),
        Some(old) => {
            let stored = api
                .create(&pp, &object(old, name))
                .await
                .unwrap_or_else(|e| panic!("{}: old object must be admitted: {e}", case.name));
            let mut update = new.clone();
            update.metadata.resource_version = stored.metadata.resource_version;
            api.replace(name, &pp, &update).await.map(drop)
        }
    };
    if api.get_opt(name).await.expect("get").is_some() {
        api.delete(name, &DeleteParams::default())
            .await
            .expect("delete");
    }
    result.map_err(|e| e.to_string())
}

async fn run(prefix: &str, cases: Vec<Case>) -> Vec<String> {
    let plane = ControlPlane::shared().await.expect("control plane");
    let client = plane.client().await.expect("client");
    let api: Api<DynamicObject> = Api::all_with(client, &api_resource());
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let verdict = apply(&api, &format!("{prefix}-{i}"), case).await;
        failures.extend(warmcache_testkit::verdict_mismatch(
            case.name,
            &verdict,
            case.allowed,
            case.schema_message.or(case.message),
        ));
    }
    failures
}

#[tokio::test]
async fn real_api_server_gives_the_same_cel_verdicts_as_kube_cel() {
    let failures = run("cel", cases::cases()).await;
    assert!(
        failures.is_empty(),
        "verdicts differ from kube-cel:\n{}",
        failures.join("\n")
    );
}

#[tokio::test]
async fn real_api_server_refuses_what_the_schema_refuses() {
    let failures = run("schema", cases::schema_cases()).await;
    assert!(
        failures.is_empty(),
        "schema verdicts differ:\n{}",
        failures.join("\n")
    );
}
