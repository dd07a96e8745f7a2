//! JSON-patch (RFC 6902) helpers for mutating webhooks.
//!
//! Types are json-patch 4's, the version `kube::core::admission::AdmissionResponse::with_patch`
//! takes. Paths are JSON pointers (RFC 6901), in which `~` and `/` inside a key must be written
//! `~0` and `~1`: the annotation `nvca.nvcf.nvidia.io/x` is addressed as
//! `/metadata/annotations/nvca.nvcf.nvidia.io~1x`. [`pointer()`] and [`PatchBuilder`] take
//! *unescaped* keys and do the escaping.
//!
//! An `add` into a map fails when the map itself is absent (a pod without annotations has no
//! `/metadata/annotations`). [`PatchBuilder`] applies each operation to a working copy as it
//! goes, so [`PatchBuilder::set`] knows whether it must first add the parent as `{}`, and a
//! second annotation never re-creates (and wipes) the map the first one created.
//!
//! ```
//! use serde_json::json;
//! use warmcache_admission::patch::{self, PatchBuilder};
//!
//! let pod = json!({"metadata": {"name": "p"}});
//! let mut builder = PatchBuilder::new(&pod);
//! builder.set_annotation("nvca.nvcf.nvidia.io/x", "1")?;
//! builder.set_label("app", "demo")?;
//! let patch = builder.build();
//! assert_eq!(
//!     patch::apply(&pod, &patch)?,
//!     json!({"metadata": {"name": "p", "annotations": {"nvca.nvcf.nvidia.io/x": "1"},
//!                         "labels": {"app": "demo"}}})
//! );
//! # Ok::<(), warmcache_admission::patch::PatchBuildError>(())
//! ```

use kube::core::Resource;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, SerializePatchError};
use serde::Serialize;
use serde_json::{Map, Value};

pub use json_patch::jsonptr::PointerBuf;
pub use json_patch::{
    AddOperation, Patch, PatchOperation, RemoveOperation, ReplaceOperation, TestOperation,
};

/// Why a patch could not be built.
#[derive(Debug, thiserror::Error)]
pub enum PatchBuildError {
    /// A parent that has to be a map is something else (a string, a list, ...).
    #[error("cannot create {path}: the value there is a JSON {found}, not an object")]
    NotAnObject {
        /// JSON pointer of the offending value.
        path: String,
        /// Its JSON type.
        found: &'static str,
    },
    /// An operation does not apply to the document (missing path, failed test, ...).
    #[error("the patch does not apply: {0}")]
    Apply(#[from] json_patch::PatchError),
    /// The object could not be turned into JSON.
    #[error("the object cannot be represented as JSON: {0}")]
    Serialize(#[from] serde_json::Error),
}

/// Escapes one JSON-pointer reference token: `~` becomes `~0`, then `/` becomes `~1`.
pub fn escape_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// A JSON pointer from unescaped tokens: `pointer(["metadata", "annotations", "a/b"])` is
/// `/metadata/annotations/a~1b`. No tokens gives the root pointer `""`.
pub fn pointer<'a>(tokens: impl IntoIterator<Item = &'a str>) -> PointerBuf {
    PointerBuf::from_tokens(tokens)
}

/// An `add` operation (creates a member or array element, or replaces an existing member).
pub fn add(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path, value })
}

/// A `replace` operation (the target must exist).
pub fn replace(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Replace(ReplaceOperation { path, value })
}

/// A `remove` operation (the target must exist).
pub fn remove(path: PointerBuf) -> PatchOperation {
    PatchOperation::Remove(RemoveOperation { path })
}

/// A `test` operation: the whole patch fails unless the target equals `value`.
pub fn test(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Test(TestOperation { path, value })
}

/// The operations turning `old` into `new`.
pub fn diff(old: &Value, new: &Value) -> Patch {
    json_patch::diff(old, new)
}

/// [`diff`] of two serializable objects (for example a pod before and after mutation).
pub fn diff_objects<T: Serialize>(old: &T, new: &T) -> Result<Patch, PatchBuildError> {
    Ok(diff(
        &serde_json::to_value(old)?,
        &serde_json::to_value(new)?,
    ))
}

/// `doc` with `patch` applied, as the API server would apply it.
pub fn apply(doc: &Value, patch: &Patch) -> Result<Value, PatchBuildError> {
    let mut result = doc.clone();
    json_patch::patch(&mut result, patch)?;
    Ok(result)
}

/// An allowing response for `request`, carrying `patch` unless it is empty.
pub fn allow_with_patch<K: Resource>(
    request: &AdmissionRequest<K>,
    patch: Patch,
) -> Result<AdmissionResponse, SerializePatchError> {
    let response = AdmissionResponse::from(request);
    if patch.0.is_empty() {
        Ok(response)
    } else {
        response.with_patch(patch)
    }
}

/// The JSON type name of `value` (`null`, `boolean`, `number`, `string`, `array`, `object`),
/// for error messages.
pub(crate) fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Builds a patch against a known document, keeping a working copy with every operation
/// applied so later operations see earlier ones.
#[derive(Clone, Debug)]
pub struct PatchBuilder {
    doc: Value,
    ops: Vec<PatchOperation>,
}

impl PatchBuilder {
    /// A builder for patches against `original` (typically the request's `object`).
    pub fn new(original: &Value) -> Self {
        Self {
            doc: original.clone(),
            ops: Vec::new(),
        }
    }

    /// A builder for patches against a typed object.
    pub fn for_object<T: Serialize>(original: &T) -> Result<Self, PatchBuildError> {
        Ok(Self {
            doc: serde_json::to_value(original)?,
            ops: Vec::new(),
        })
    }

    /// Applies `op` to the working copy and records it; an operation that does not apply is
    /// refused and leaves the builder unchanged.
    pub fn push(&mut self, op: PatchOperation) -> Result<&mut Self, PatchBuildError> {
        json_patch::patch(&mut self.doc, std::slice::from_ref(&op))?;
        self.ops.push(op);
        Ok(self)
    }

    /// Records an `add` at the unescaped `path`.
    pub fn add(&mut self, path: &[&str], value: Value) -> Result<&mut Self, PatchBuildError> {
        self.push(add(pointer(path.iter().copied()), value))
    }

    /// Records a `replace` at the unescaped `path` (which must exist).
    pub fn replace(&mut self, path: &[&str], value: Value) -> Result<&mut Self, PatchBuildError> {
        self.push(replace(pointer(path.iter().copied()), value))
    }

    /// Records a `remove` of the unescaped `path` if it exists; does nothing otherwise.
    pub fn remove(&mut self, path: &[&str]) -> Result<&mut Self, PatchBuildError> {
        let target = pointer(path.iter().copied());
        if self.doc.pointer(target.as_str()).is_some() {
            self.push(remove(target))?;
        }
        Ok(self)
    }

    /// Makes sure every prefix of `path` is a map, adding `{}` for each one that is missing
    /// or `null`. Fails when one of them is another kind of value.
    pub fn ensure_object(&mut self, path: &[&str]) -> Result<&mut Self, PatchBuildError> {
        for depth in 1..=path.len() {
            let prefix = pointer(path[..depth].iter().copied());
            match self.doc.pointer(prefix.as_str()) {
                Some(Value::Object(_)) => {}
                None | Some(Value::Null) => {
                    self.push(add(prefix, Value::Object(Map::new())))?;
                }
                Some(other) => {
                    return Err(PatchBuildError::NotAnObject {
                        path: prefix.to_string(),
                        found: json_type(other),
                    });
                }
            }
        }
        Ok(self)
    }

    /// Sets the unescaped `path` to `value`, creating missing parent maps first. Records
    /// nothing when the value is already there, so re-running a mutation is a no-op.
    pub fn set(&mut self, path: &[&str], value: Value) -> Result<&mut Self, PatchBuildError> {
        let target = pointer(path.iter().copied());
        if self.doc.pointer(target.as_str()) == Some(&value) {
            return Ok(self);
        }
        if let Some((_, parents)) = path.split_last() {
            self.ensure_object(parents)?;
        }
        self.push(add(target, value))
    }

    /// Sets `metadata.annotations[key]`, creating `metadata` and `annotations` when absent.
    pub fn set_annotation(&mut self, key: &str, value: &str) -> Result<&mut Self, PatchBuildError> {
        self.set(
            &["metadata", "annotations", key],
            Value::String(value.to_owned()),
        )
    }

    /// Sets `metadata.labels[key]`, creating `metadata` and `labels` when absent.
    pub fn set_label(&mut self, key: &str, value: &str) -> Result<&mut Self, PatchBuildError> {
        self.set(
            &["metadata", "labels", key],
            Value::String(value.to_owned()),
        )
    }

    /// Removes `metadata.annotations[key]` if present.
    pub fn remove_annotation(&mut self, key: &str) -> Result<&mut Self, PatchBuildError> {
        self.remove(&["metadata", "annotations", key])
    }

    /// Removes `metadata.labels[key]` if present.
    pub fn remove_label(&mut self, key: &str) -> Result<&mut Self, PatchBuildError> {
        self.remove(&["metadata", "labels", key])
    }

    /// The document with every recorded operation applied.
    pub fn current(&self) -> &Value {
        &self.doc
    }

    /// Whether no operation has been recorded.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The recorded operations, in order.
    pub fn build(self) -> Patch {
        Patch(self.ops)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn escapes_tilde_before_slash() {
        assert_eq!(
            escape_token("nvca.nvcf.nvidia.io/x"),
            "nvca.nvcf.nvidia.io~1x"
        );
        assert_eq!(escape_token("a~b"), "a~0b");
        // "~1" in a key is literal text, so the tilde must become "~0" first.
        assert_eq!(escape_token("~1"), "~01");
        assert_eq!(escape_token("/~/"), "~1~0~1");
        assert_eq!(escape_token("plain"), "plain");
        assert_eq!(escape_token(""), "");
    }

    #[test]
    fn pointer_escapes_each_token() {
        let p = pointer(["metadata", "annotations", "nvca.nvcf.nvidia.io/x~y"]);
        assert_eq!(
            p.as_str(),
            "/metadata/annotations/nvca.nvcf.nvidia.io~1x~0y"
        );
        assert_eq!(pointer([]).as_str(), "");
        // Serializes to the wire format the API server expects.
        let op = add(p, json!("v"));
        assert_eq!(
            serde_json::to_value(&op).unwrap(),
            json!({"op": "add", "path": "/metadata/annotations/nvca.nvcf.nvidia.io~1x~0y", "value": "v"})
        );
    }

    #[test]
    fn annotations_created_once_then_filled() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
        let mut builder = PatchBuilder::new(&pod);
        builder
            .set_annotation("nvca.nvcf.nvidia.io/x", "1")
            .unwrap()
            .set_annotation("a~b/c", "2")
            .unwrap();
        let patch = builder.build();
        let ops = serde_json::to_value(&patch).unwrap();
        assert_eq!(
            ops,
            json!([
                {"op": "add", "path": "/metadata/annotations", "value": {}},
                {"op": "add", "path": "/metadata/annotations/nvca.nvcf.nvidia.io~1x", "value": "1"},
                {"op": "add", "path": "/metadata/annotations/a~0b~1c", "value": "2"},
            ])
        );
        let patched = apply(&pod, &patch).unwrap();
        assert_eq!(
            patched,
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p",
                "annotations": {"nvca.nvcf.nvidia.io/x": "1", "a~b/c": "2"}}})
        );
    }

    #[test]
    fn existing_maps_are_kept_and_values_overwritten() {
        let pod =
            json!({"metadata": {"labels": {"keep": "me", "app": "old"}, "annotations": null}});
        let mut builder = PatchBuilder::new(&pod);
        builder.set_label("app", "new").unwrap();
        builder.set_label("keep", "me").unwrap(); // already there: no op
        builder.set_annotation("k", "v").unwrap(); // null map replaced by {}
        let patch = builder.build();
        assert_eq!(patch.0.len(), 3);
        assert_eq!(
            apply(&pod, &patch).unwrap(),
            json!({"metadata": {"labels": {"keep": "me", "app": "new"}, "annotations": {"k": "v"}}})
        );
    }

    #[test]
    fn missing_metadata_is_created() {
        let doc = json!({});
        let mut builder = PatchBuilder::new(&doc);
        builder.set_label("a/b", "c").unwrap();
        let patch = builder.build();
        assert_eq!(
            apply(&doc, &patch).unwrap(),
            json!({"metadata": {"labels": {"a/b": "c"}}})
        );
    }

    #[test]
    fn non_object_parent_is_an_error() {
        let doc = json!({"metadata": {"annotations": "oops"}});
        let mut builder = PatchBuilder::new(&doc);
        let err = builder.set_annotation("k", "v").unwrap_err();
        assert!(
            matches!(&err, PatchBuildError::NotAnObject { path, found: "string" } if path == "/metadata/annotations"),
            "{err}"
        );
        assert!(builder.is_empty());
    }

    #[test]
    fn remove_only_when_present_and_replace_requires_target() {
        let doc = json!({"metadata": {"annotations": {"x/y": "1"}}});
        let mut builder = PatchBuilder::new(&doc);
        builder.remove_annotation("x/y").unwrap();
        builder.remove_annotation("absent").unwrap();
        assert!(builder.replace(&["spec"], json!({})).is_err());
        let patch = builder.build();
        assert_eq!(patch.0.len(), 1);
        assert_eq!(
            apply(&doc, &patch).unwrap(),
            json!({"metadata": {"annotations": {}}})
        );
    }

    #[test]
    fn diff_round_trips() {
        let old = json!({"metadata": {"annotations": {"a/b": "1"}}, "spec": {"containers": [{"name": "c"}]}});
        let new = json!({"metadata": {"annotations": {"a/b": "2", "c~d": "3"}},
            "spec": {"containers": [{"name": "c", "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}]}]}});
        let patch = diff(&old, &new);
        assert!(!patch.0.is_empty());
        assert_eq!(apply(&old, &patch).unwrap(), new);
        let text = serde_json::to_string(&patch).unwrap();
        assert!(text.contains("a~1b") && text.contains("c~0d"), "{text}");
        assert!(diff(&old, &old).0.is_empty());
    }

    #[test]
    fn allow_with_patch_sets_json_patch_type() {
        let review: kube::core::admission::AdmissionReview<kube::core::DynamicObject> =
            serde_json::from_value(json!({
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {
                    "uid": "u1",
                    "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "operation": "CREATE", "userInfo": {},
                    "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
                }
            }))
            .unwrap();
        let request: AdmissionRequest<kube::core::DynamicObject> = review.try_into().unwrap();
        let empty = allow_with_patch(&request, Patch(vec![])).unwrap();
        assert!(empty.patch.is_none());
        let with = allow_with_patch(&request, Patch(vec![add(pointer(["x"]), json!(1))])).unwrap();
        let value = serde_json::to_value(&with).unwrap();
        assert_eq!(value["patchType"], "JSONPatch");
        assert_eq!(value["uid"], "u1");
    }
}
