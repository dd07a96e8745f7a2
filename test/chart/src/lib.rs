//! Tests of `charts/warmcache` with the real Helm CLI (`tests/`): the render matrix, lint and
//! schema refusals (`tests/render.rs`), and strict validation of every rendered object by the
//! real API server (`tests/apiserver.rs`). This library holds the pure helpers the tests share
//! for reading rendered objects; running Helm is in `tests/common`.

use serde_json::Value;

/// The release namespace of the renders.
pub const NAMESPACE: &str = "warmcache-system";

/// `kind/namespace/name` of a rendered object.
pub fn key(object: &Value) -> String {
    let s = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_owned();
    format!(
        "{}/{}/{}",
        s(object.get("kind")),
        s(object.pointer("/metadata/namespace")),
        s(object.pointer("/metadata/name"))
    )
}

/// The objects of `kind`.
pub fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects
        .iter()
        .filter(|o| o.get("kind").and_then(Value::as_str) == Some(kind))
        .collect()
}

/// The object of `kind` named `name`.
pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    of_kind(objects, kind)
        .into_iter()
        .find(|o| o.pointer("/metadata/name").and_then(Value::as_str) == Some(name))
}

/// The pod templates of the workloads (Deployments, DaemonSets, Jobs), with their keys.
pub fn pod_templates(objects: &[Value]) -> Vec<(String, &Value)> {
    objects
        .iter()
        .filter_map(|o| {
            let template = match o.get("kind").and_then(Value::as_str)? {
                "Deployment" | "DaemonSet" | "StatefulSet" | "Job" => {
                    o.pointer("/spec/template")?
                }
                _ => return None,
            };
            Some((key(o), template))
        })
        .collect()
}
