//! The JSON patch the pod route sends (computed for pods without JSON trees of the whole pod)
//! makes of the object as sent exactly what the general `raw_patch` makes of it, for every pod
//! the rewrite admits changed: every fixture of `pkg/modelvolume/tests/fixtures` (first
//! admission, and joining the binding it created), the benchmark's vLLM pod, skips recorded as
//! annotations; each as sent, and with fields the types do not model beside what the rewrite
//! changes (an API server newer than our types), where both must keep them or both refuse.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../../pkg/modelvolume/tests/common/mod.rs"]
mod modelvolume_common;

use std::collections::BTreeMap;
use std::path::Path;

use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use tower::ServiceExt;
use warmcache_admission::patch::{self, Patch};
use warmcache_admission::{
    AdmissionServer, AdmissionServerConfig, Mutation, Route, TlsFiles, TypedRequest,
};
use warmcache_modelid::{lws_from_object, pod_from_object};
use warmcache_modelvolume::{BindingAction, Verdict};

use modelvolume_common as common;

fn review(object: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0d3f6a43-5e1c-4bd7-9f3a-2a6a7e1c0001",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": common::NAMESPACE,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": object,
            "dryRun": false
        }
    }))
    .unwrap()
}

/// What the typed route answers for `raw` when its handler returns `admitted`: the patched
/// object, or `Err` with the route's message when it refused to patch.
fn through_route(
    runtime: &tokio::runtime::Runtime,
    raw: &Value,
    admitted: &Pod,
) -> Result<Value, String> {
    let admitted = admitted.clone();
    let router = AdmissionServer::new(AdmissionServerConfig::new(TlsFiles::in_dir("/unused")))
        .route(Route::mutating_typed::<Pod, _, _>(
            "/mutate-pods",
            move |_: TypedRequest<Pod>| Mutation::Mutated(admitted.clone()),
        ))
        .router()
        .unwrap();
    let request = http::Request::post("/mutate-pods")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(review(raw)))
        .unwrap();
    let body = runtime.block_on(async {
        let response = router.oneshot(request).await.unwrap();
        response.into_body().collect().await.unwrap().to_bytes()
    });
    let answer: Value = serde_json::from_slice(&body).unwrap();
    let response = &answer["response"];
    if response["allowed"] != true {
        return Err(response["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned());
    }
    // The server writes the patch as base64 text (kube alone would write a list of bytes).
    let bytes = match &response["patch"] {
        Value::Null => return Ok(raw.clone()),
        Value::String(_) => {
            serde_json::from_value::<k8s_openapi::ByteString>(response["patch"].clone())
                .unwrap()
                .0
        }
        bytes => serde_json::from_value::<Vec<u8>>(bytes.clone()).unwrap(),
    };
    let ops: Patch = serde_json::from_slice(&bytes).unwrap();
    Ok(patch::apply(raw, &ops).unwrap())
}

/// The general path: `raw_patch` applied to `raw`.
fn general(raw: &Value, admitted: &Pod) -> Result<Value, String> {
    let ops = patch::raw_patch(raw, admitted).map_err(|e| e.to_string())?;
    Ok(patch::apply(raw, &ops).unwrap())
}

/// `raw` with fields no type models beside everything the rewrite touches.
fn with_unmodelled_fields(raw: &Value) -> Vec<(&'static str, Value)> {
    let mut variants = Vec::new();
    let mut v = raw.clone();
    v["metadata"]["futureMetaField"] = json!({"kept": true});
    variants.push(("metadata", v));
    let mut v = raw.clone();
    v["spec"]["futureSpecField"] = json!("kept");
    variants.push(("spec", v));
    let mut v = raw.clone();
    if let Some(containers) = v["spec"]["containers"].as_array_mut() {
        for c in containers {
            c["futureContainerField"] = json!("kept");
            if let Some(env) = c["env"].as_array_mut() {
                for e in env {
                    e["futureEnvField"] = json!(1);
                }
            }
            if let Some(mounts) = c["volumeMounts"].as_array_mut() {
                for m in mounts {
                    m["futureMountField"] = json!("kept");
                }
            }
        }
    }
    variants.push(("containers", v));
    let mut v = raw.clone();
    if let Some(inits) = v["spec"]["initContainers"].as_array_mut() {
        for c in inits {
            c["futureContainerField"] = json!("kept");
        }
    }
    if let Some(volumes) = v["spec"]["volumes"].as_array_mut() {
        for volume in volumes {
            volume["futureVolumeField"] = json!("kept");
        }
    }
    variants.push(("initContainers and volumes", v));
    variants
}

fn check(
    runtime: &tokio::runtime::Runtime,
    name: &str,
    pod: &Pod,
    admitted: &Pod,
    failures: &mut Vec<String>,
    checked: &mut usize,
) {
    let raw = serde_json::to_value(pod).unwrap();
    let mut cases = vec![("as sent", raw.clone())];
    cases.extend(with_unmodelled_fields(&raw));
    // As sent, the rewrite's change is patched directly (not by the general path).
    let decoded: Pod = serde_json::from_value(raw.clone()).unwrap();
    match patch::pod_patch(&raw, &decoded, admitted) {
        Some(direct) if Ok(patch::apply(&raw, &direct).unwrap()) == general(&raw, admitted) => {}
        Some(_) => failures.push(format!(
            "{name}: the direct patch differs from the general one"
        )),
        None => failures.push(format!("{name}: the change is not patched directly")),
    }
    for (what, raw) in cases {
        *checked += 1;
        let route = through_route(runtime, &raw, admitted);
        let general = general(&raw, admitted);
        match (&route, &general) {
            (Ok(a), Ok(b)) if a == b => {
                let reread: Pod = serde_json::from_value(a.clone()).unwrap();
                if reread != *admitted {
                    failures.push(format!(
                        "{name} ({what}): the patched pod is not the admitted one"
                    ));
                }
            }
            (Err(_), Err(_)) => {}
            _ => failures.push(format!(
                "{name} ({what}): the route gives {route:?}\n  the general path {general:?}"
            )),
        }
    }
}

#[test]
fn the_pod_patch_equals_the_general_one_for_every_fixture() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../pkg/modelvolume/tests/fixtures");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 20, "found {} fixtures", files.len());
    let (mut failures, mut checked, mut changed) = (Vec::new(), 0, 0);
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let doc = std::fs::read_to_string(f).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&doc).expect("fixture is YAML");
        let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
        let pod = pod_from_object(&docs[0]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let lws = docs.get(1).map(|d| lws_from_object(d).unwrap());
        let case: Value = doc
            .lines()
            .filter_map(|l| l.strip_prefix("# case:"))
            .collect::<Vec<_>>()
            .join(" ")
            .parse::<Value>()
            .ok()
            .filter(|v| !v.is_null())
            .unwrap_or(Value::Null);
        let storage = case["storage"].as_str().unwrap_or("weka");
        let options = common::options(case["readerMode"].as_str());
        let labels: BTreeMap<String, String> = case["namespaceLabels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        let verdict = common::run(&pod, &labels, lws.as_ref(), &options, storage, None);
        let admitted = verdict.admitted(&pod);
        if admitted != pod {
            changed += 1;
            check(
                &runtime,
                &name,
                &pod,
                &admitted,
                &mut failures,
                &mut checked,
            );
        }
        // Joining the binding the first admission created (the steady state).
        if let Verdict::Rewrite(r) = &verdict
            && let BindingAction::Create(b) = &r.binding
        {
            let binding = common::stored(b, None, None);
            let joined = common::run(
                &pod,
                &labels,
                lws.as_ref(),
                &options,
                storage,
                Some(&binding),
            );
            let admitted = joined.admitted(&pod);
            if admitted != pod {
                changed += 1;
                check(
                    &runtime,
                    &format!("{name}, joined"),
                    &pod,
                    &admitted,
                    &mut failures,
                    &mut checked,
                );
            }
        }
    }
    assert!(changed >= 20, "only {changed} fixtures were changed");
    assert!(
        failures.is_empty(),
        "{} of {checked} patches differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
