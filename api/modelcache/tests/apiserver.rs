//! The CEL cases of `tests/cases`, replayed against a real kube-apiserver with the generated CRD
//! installed: every verdict must match the one `kube-cel` gives in `tests/cel.rs`. A rule the
//! real server rejects, or evaluates differently, fails here.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cases;

use cases::{Case, Target};
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use warmcache_testkit::{ControlPlane, TestNamespace};

fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("nvca.nvcf.nvidia.io", "v2beta1", "ModelCacheBinding"),
        "modelcachebindings",
    )
}

fn object(value: &serde_json::Value, namespace: &str, name: &str) -> DynamicObject {
    let mut value = value.clone();
    value["metadata"]["namespace"] = namespace.into();
    value["metadata"]["name"] = name.into();
    serde_json::from_value(value).expect("case object is a Kubernetes object")
}

/// Runs one case; returns `Ok(())` when admitted and the server's message when refused.
async fn apply(api: &Api<DynamicObject>, ns: &str, name: &str, case: &Case) -> Result<(), String> {
    let pp = PostParams::default();
    let new = object(&case.new, ns, name);
    let Some(old) = &case.old else {
        let created = api.create(&pp, &new).await.map_err(|e| e.to_string())?;
        if case.target == Target::Status {
            let mut with_status = new.clone();
            with_status.metadata.resource_version = created.metadata.resource_version;
            api.replace_status(name, &pp, &with_status)
                .await
                .map_err(|e| e.to_string())?;
        }
        return Ok(());
    };
    let old = object(old, ns, name);
    let mut current = api
        .create(&pp, &old)
        .await
        .expect("old object of a case must be admitted");
    if old.data.get("status").is_some() {
        let mut with_status = old.clone();
        with_status.metadata.resource_version = current.metadata.resource_version.clone();
        current = api
            .replace_status(name, &pp, &with_status)
            .await
            .expect("old status of a case must be admitted");
    }
    let mut update = new.clone();
    update.metadata.resource_version = current.metadata.resource_version;
    match case.target {
        Target::Main => api.replace(name, &pp, &update).await.map(drop),
        Target::Status => api.replace_status(name, &pp, &update).await.map(drop),
    }
    .map_err(|e| e.to_string())
}

#[tokio::test]
async fn real_api_server_gives_the_same_verdicts_as_kube_cel() {
    ControlPlane::shared().await.expect("control plane");
    let ns = TestNamespace::new("mcb-cel").await.expect("namespace");
    let api: Api<DynamicObject> =
        Api::namespaced_with(ns.client.clone(), &ns.name, &api_resource());
    let mut failures = Vec::new();
    for (i, case) in cases::cases().iter().enumerate() {
        let name = format!("case-{i}");
        let verdict = apply(&api, &ns.name, &name, case).await;
        failures.extend(warmcache_testkit::verdict_mismatch(
            case.name,
            &verdict,
            case.allowed,
            case.message,
        ));
    }
    ns.cleanup().await;
    assert!(
        failures.is_empty(),
        "verdicts differ from kube-cel:\n{}",
        failures.join("\n")
    );
}

#[tokio::test]
async fn both_crds_are_installed_and_established() {
    let plane = ControlPlane::shared().await.expect("control plane");
    let installed = plane.installed_crds();
    for name in [
        "modelcachebindings.nvca.nvcf.nvidia.io",
        "kvcachebackends.worker.gpustack.ai",
    ] {
        assert!(
            installed.iter().any(|c| c == name),
            "{name} not installed: {installed:?}"
        );
    }
}

#[tokio::test]
async fn deletion_waits_for_the_finalizer() {
    use kube::api::{DeleteParams, Patch, PatchParams};
    use std::time::Duration;

    ControlPlane::shared().await.expect("control plane");
    let ns = TestNamespace::new("mcb-fin").await.expect("namespace");
    let api: Api<DynamicObject> =
        Api::namespaced_with(ns.client.clone(), &ns.name, &api_resource());
    let allowed_create = cases::cases()
        .into_iter()
        .find(|c| c.old.is_none() && c.allowed && c.target == Target::Main)
        .expect("an admitted create case");
    let mut obj = object(&allowed_create.new, &ns.name, "with-finalizer");
    obj.metadata.finalizers = Some(vec![warmcache_api_modelcache::FINALIZER.to_owned()]);
    api.create(&PostParams::default(), &obj)
        .await
        .expect("create");

    api.delete("with-finalizer", &DeleteParams::default())
        .await
        .expect("delete accepted");
    let held = api
        .get("with-finalizer")
        .await
        .expect("still present while the finalizer is set");
    assert!(
        held.metadata.deletion_timestamp.is_some(),
        "deletionTimestamp must be set"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(api.get_opt("with-finalizer").await.expect("get").is_some());

    let patch = serde_json::json!({"metadata": {"finalizers": null}});
    api.patch(
        "with-finalizer",
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .expect("finalizer removed");
    warmcache_testkit::eventually("the binding to be gone", Duration::from_secs(10), || {
        let api = api.clone();
        async move {
            api.get_opt("with-finalizer")
                .await
                .ok()
                .flatten()
                .is_none()
                .then_some(())
        }
    })
    .await
    .expect("the binding goes once the finalizer is removed");
    ns.cleanup().await;
}
