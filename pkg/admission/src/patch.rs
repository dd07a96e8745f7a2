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
//! A handler that changes a typed object (a k8s-openapi `Pod`) should not diff typed values
//! and send the result as is: the object the API server sent may hold fields the type does not
//! model, and values the type fills in on decoding. [`raw_patch`] computes the typed diff and
//! shapes it to apply to the raw object, keeping those fields; typed routes
//! ([`Route::mutating_typed`](crate::Route::mutating_typed)) use it.
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
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

pub use json_patch::jsonptr::PointerBuf;
pub use json_patch::{
    AddOperation, MoveOperation, Patch, PatchOperation, RemoveOperation, ReplaceOperation,
    TestOperation,
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

/// Why [`raw_patch`] could not produce a patch for a typed change.
#[derive(Debug, thiserror::Error)]
pub enum RawPatchError {
    /// The raw object (or the raw object with the patch applied) is not a valid typed object.
    #[error("{what} does not decode as the typed object {}: {message}", at(path))]
    Decode {
        /// `"the object"` or `"the patched object"`.
        what: &'static str,
        /// Field path of the first value that does not fit (`spec.containers[0].name`); `.`
        /// for the object itself.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// The typed object could not be turned into JSON.
    #[error("the typed object cannot be represented as JSON: {0}")]
    Serialize(#[source] serde_json::Error),
    /// The change cannot be expressed without moving or dropping fields the typed object does
    /// not model.
    #[error("the change at {path} would lose fields the typed object does not model: {reason}")]
    WouldLoseFields {
        /// JSON pointer of the list or value concerned.
        path: String,
        /// Why the change cannot be made safely.
        reason: &'static str,
    },
    /// The computed patch does not apply to the raw object.
    #[error("the patch computed from the typed change does not apply to the raw object: {0}")]
    Apply(#[source] json_patch::PatchError),
    /// The raw object with the patch applied does not read back as the typed object the
    /// handler returned.
    #[error(
        "the patched raw object does not read back as the typed object at {path} (a field the \
         typed object serializes differently from how it reads it?)"
    )]
    Mismatch {
        /// JSON pointer of the first difference.
        path: String,
    },
}

fn at(path: &str) -> String {
    if path.is_empty() || path == "." {
        "as a whole".to_owned()
    } else {
        format!("at {path}")
    }
}

/// Decodes `value` as `K`, naming the path of the first value that does not fit.
pub(crate) fn decode_at_path<K: DeserializeOwned>(value: &Value) -> Result<K, (String, String)> {
    serde_path_to_error::deserialize(value).map_err(|err| {
        let path = err.path().to_string();
        (path, err.into_inner().to_string())
    })
}

/// The JSON patch that applies a typed change to the raw object it was read from, keeping
/// every field of the raw object that `K` does not model.
///
/// `raw` is the object as the API server sent it; `mutated` is what a handler made of
/// `raw` decoded as `K`. The operations are those of [`diff`]`(to_value(decoded),
/// to_value(mutated))`, made fine-grained and shaped to apply to `raw`:
///
/// - a changed member is patched where it changed (`add /spec/containers/0/env`), never by
///   replacing the object around it, so unknown fields beside it survive;
/// - lists whose elements all carry a unique `name` (or `uid`, `mountPath`, `devicePath`,
///   `containerPort`, `resourceName`, `ip`, `conditionType`, `type`), in the raw object as in
///   the typed views, are matched by that key: removed elements are removed, kept ones are
///   `move`d into their new position with their unknown fields and patched in place, new ones
///   are added. Other lists are matched by their unchanged head and tail; an element added or
///   removed there is added or removed alone, the others are patched in place;
/// - where the typed view holds a value the raw object lacks (a required field defaulted on
///   decoding, such as an empty `containers` list or an empty `name`), the new value is added
///   whole instead of edited.
///
/// In a keyed list the key is the element's identity, as in Kubernetes list maps: an element
/// whose key changed is a removed element and an added one, and a removed element takes its
/// unknown fields with it. Refused with [`RawPatchError::WouldLoseFields`], rather than
/// guessed: a list without such a key where elements were both changed and added or removed,
/// while the raw elements involved carry fields `K` does not model (which element they belong
/// to cannot be told). Then the patch is checked: it must apply to `raw`, and the result must
/// read back as `mutated`.
pub fn raw_patch<K>(raw: &Value, mutated: &K) -> Result<Patch, RawPatchError>
where
    K: Serialize + DeserializeOwned,
{
    let decoded: K = decode_at_path(raw).map_err(|(path, message)| RawPatchError::Decode {
        what: "the object",
        path,
        message,
    })?;
    let old = serde_json::to_value(&decoded).map_err(RawPatchError::Serialize)?;
    let new = serde_json::to_value(mutated).map_err(RawPatchError::Serialize)?;
    let mut ops = Vec::new();
    rebase(Some(raw), &old, &new, &mut PointerBuf::new(), &mut ops)?;
    let patch = Patch(ops);
    if patch.0.is_empty() {
        return Ok(patch);
    }
    let mut patched = raw.clone();
    json_patch::patch(&mut patched, &patch).map_err(RawPatchError::Apply)?;
    let reread: K = decode_at_path(&patched).map_err(|(path, message)| RawPatchError::Decode {
        what: "the patched object",
        path,
        message,
    })?;
    let reread = serde_json::to_value(&reread).map_err(RawPatchError::Serialize)?;
    if reread != new {
        let path = json_patch::diff(&new, &reread)
            .0
            .first()
            .map(|op| op.path().to_string())
            .unwrap_or_default();
        return Err(RawPatchError::Mismatch { path });
    }
    Ok(patch)
}

/// Appends the operations turning `old` into `new` at `path`, shaped to apply to `raw` (the
/// raw value `old` was read from, `None` when the raw object has nothing there).
fn rebase(
    raw: Option<&Value>,
    old: &Value,
    new: &Value,
    path: &mut PointerBuf,
    ops: &mut Vec<PatchOperation>,
) -> Result<(), RawPatchError> {
    if old == new {
        return Ok(());
    }
    match (raw, old, new) {
        // Nothing in the raw object to keep: the typed value was a default.
        (None | Some(Value::Null), _, _) => ops.push(add(path.clone(), new.clone())),
        (Some(Value::Object(raw)), Value::Object(old), Value::Object(new)) => {
            rebase_object(raw, old, new, path, ops)?;
        }
        (Some(Value::Array(raw)), Value::Array(old), Value::Array(new)) => {
            rebase_array(raw, old, new, path, ops)?;
        }
        // A changed scalar, or a value whose JSON type changed.
        (Some(_), _, _) => ops.push(replace(path.clone(), new.clone())),
    }
    Ok(())
}

fn rebase_object(
    raw: &Map<String, Value>,
    old: &Map<String, Value>,
    new: &Map<String, Value>,
    path: &mut PointerBuf,
    ops: &mut Vec<PatchOperation>,
) -> Result<(), RawPatchError> {
    for (key, new_value) in new {
        path.push_back(key);
        let result = match old.get(key) {
            Some(old_value) => rebase(raw.get(key), old_value, new_value, path, ops),
            // `add` also replaces a raw `null` there.
            None => {
                ops.push(add(path.clone(), new_value.clone()));
                Ok(())
            }
        };
        path.pop_back();
        result?;
    }
    for key in old.keys() {
        if !new.contains_key(key) && raw.contains_key(key) {
            path.push_back(key);
            ops.push(remove(path.clone()));
            path.pop_back();
        }
    }
    Ok(())
}

/// Keys that identify the elements of Kubernetes lists (their `listMapKey`s), tried in order.
const IDENTITY_KEYS: [&str; 9] = [
    "name",
    "uid",
    "mountPath",
    "devicePath",
    "containerPort",
    "resourceName",
    "ip",
    "conditionType",
    "type",
];

fn rebase_array(
    raw: &[Value],
    old: &[Value],
    new: &[Value],
    path: &mut PointerBuf,
    ops: &mut Vec<PatchOperation>,
) -> Result<(), RawPatchError> {
    if raw.len() != old.len() {
        // The typed view of this list is not element for element the raw one: replacing it
        // would drop raw elements.
        if raw.iter().any(|v| !v.is_null()) {
            return Err(RawPatchError::WouldLoseFields {
                path: path.to_string(),
                reason: "the typed list does not have the raw list's elements",
            });
        }
        ops.push(replace(path.clone(), Value::Array(new.to_vec())));
        return Ok(());
    }
    // A key identifies elements only if the raw elements carry it too (not a default filled
    // in on decoding).
    let keyed = IDENTITY_KEYS.iter().find_map(|key| {
        let old_ids = identities(old, key)?;
        (identities(raw, key)? == old_ids).then_some(())?;
        Some((old_ids, identities(new, key)?))
    });
    match keyed {
        Some((old_ids, new_ids)) => rebase_keyed(raw, old, new, &old_ids, &new_ids, path, ops),
        None => rebase_positional(raw, old, new, path, ops),
    }
}

/// The identity of each element (the string or number at `key`), if every element has one and
/// no two share it.
fn identities(list: &[Value], key: &str) -> Option<Vec<String>> {
    let mut seen = std::collections::HashSet::new();
    let mut ids = Vec::with_capacity(list.len());
    for element in list {
        let id = match element.get(key)? {
            Value::String(s) => format!("s:{s}"),
            Value::Number(n) => format!("n:{n}"),
            _ => return None,
        };
        if !seen.insert(id.clone()) {
            return None;
        }
        ids.push(id);
    }
    Some(ids)
}

fn rebase_keyed(
    raw: &[Value],
    old: &[Value],
    new: &[Value],
    old_ids: &[String],
    new_ids: &[String],
    path: &mut PointerBuf,
    ops: &mut Vec<PatchOperation>,
) -> Result<(), RawPatchError> {
    let gone = |i: &usize| !new_ids.contains(&old_ids[*i]);
    // `working[p]` is what sits at index `p` after the operations so far: `Some(i)` for the
    // raw element `i`, `None` for an added one.
    let mut working: Vec<Option<usize>> = (0..old.len()).map(Some).collect();
    for i in (0..old.len()).rev() {
        if gone(&i) {
            path.push_back(i);
            ops.push(remove(path.clone()));
            path.pop_back();
            working.remove(i);
        }
    }
    for (j, (new_value, id)) in new.iter().zip(new_ids).enumerate() {
        match old_ids.iter().position(|old_id| old_id == id) {
            Some(i) => {
                let Some(p) = working.iter().position(|w| *w == Some(i)) else {
                    // Unreachable: every kept element is in `working` until placed.
                    return Err(RawPatchError::WouldLoseFields {
                        path: path.to_string(),
                        reason: "an element could not be followed through the list change",
                    });
                };
                if p != j {
                    let mut from = path.clone();
                    from.push_back(p);
                    let mut to = path.clone();
                    to.push_back(j);
                    ops.push(PatchOperation::Move(MoveOperation { from, path: to }));
                    let moved = working.remove(p);
                    working.insert(j, moved);
                }
                path.push_back(j);
                let result = rebase(raw.get(i), &old[i], new_value, path, ops);
                path.pop_back();
                result?;
            }
            None => {
                path.push_back(j);
                ops.push(add(path.clone(), new_value.clone()));
                path.pop_back();
                working.insert(j, None);
            }
        }
    }
    Ok(())
}

fn rebase_positional(
    raw: &[Value],
    old: &[Value],
    new: &[Value],
    path: &mut PointerBuf,
    ops: &mut Vec<PatchOperation>,
) -> Result<(), RawPatchError> {
    let prefix = old.iter().zip(new).take_while(|(o, n)| o == n).count();
    let suffix = old[prefix..]
        .iter()
        .rev()
        .zip(new[prefix..].iter().rev())
        .take_while(|(o, n)| o == n)
        .count();
    let old_middle = prefix..old.len() - suffix;
    let new_middle = prefix..new.len() - suffix;
    let common = old_middle.len().min(new_middle.len());
    if old_middle.len() != new_middle.len()
        && common > 0
        && raw[old_middle.clone()]
            .iter()
            .zip(&old[old_middle.clone()])
            .any(|(r, o)| has_residue(r, o))
    {
        return Err(RawPatchError::WouldLoseFields {
            path: path.to_string(),
            reason: "elements of a list without identifying keys were both changed and added or \
                     removed, so which element the unmodelled fields belong to cannot be told",
        });
    }
    for offset in 0..common {
        let index = prefix + offset;
        path.push_back(index);
        let result = rebase(raw.get(index), &old[index], &new[index], path, ops);
        path.pop_back();
        result?;
    }
    for (index, value) in new
        .iter()
        .enumerate()
        .take(new_middle.end)
        .skip(prefix + common)
    {
        path.push_back(index);
        ops.push(add(path.clone(), value.clone()));
        path.pop_back();
    }
    for _ in prefix + common..old_middle.end {
        path.push_back(prefix + common);
        ops.push(remove(path.clone()));
        path.pop_back();
    }
    Ok(())
}

/// Whether `raw` holds anything its typed reading `typed` does not: a non-null member the
/// typed value lacks, at any depth.
fn has_residue(raw: &Value, typed: &Value) -> bool {
    match (raw, typed) {
        (Value::Object(raw), Value::Object(typed)) => raw.iter().any(|(key, value)| {
            typed.get(key).map_or(!value.is_null(), |typed_value| {
                has_residue(value, typed_value)
            })
        }),
        (Value::Array(raw), Value::Array(typed)) => has_residue_list(raw, typed),
        (Value::Object(_) | Value::Array(_), _) => raw != typed,
        _ => false,
    }
}

fn has_residue_list(raw: &[Value], typed: &[Value]) -> bool {
    raw.len() != typed.len() || raw.iter().zip(typed).any(|(r, t)| has_residue(r, t))
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

    mod raw {
        use super::super::*;
        use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, Toleration};
        use serde_json::json;

        fn pod(containers: Value) -> Value {
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "creationTimestamp": null},
                "spec": {"containers": containers}
            })
        }

        fn decode(raw: &Value) -> Pod {
            serde_json::from_value(raw.clone()).unwrap()
        }

        fn env(name: &str, value: &str) -> EnvVar {
            EnvVar {
                name: name.into(),
                value: Some(value.into()),
                ..EnvVar::default()
            }
        }

        fn containers(pod: &mut Pod) -> &mut Vec<Container> {
            &mut pod.spec.as_mut().unwrap().containers
        }

        fn ops(patch: &Patch) -> Value {
            serde_json::to_value(patch).unwrap()
        }

        /// Patches `raw` with the patch for `mutated` and checks the result reads as `mutated`.
        fn patched(raw: &Value, mutated: &Pod) -> (Patch, Value) {
            let patch = raw_patch(raw, mutated).unwrap();
            let result = apply(raw, &patch).unwrap();
            assert_eq!(
                serde_json::to_value(decode(&result)).unwrap(),
                serde_json::to_value(mutated).unwrap()
            );
            (patch, result)
        }

        #[test]
        fn an_unknown_field_inside_a_changed_container_survives() {
            let raw = pod(json!([{"name": "engine", "image": "vllm",
                                   "futureField": {"nested": [1, 2]}}]));
            let mut mutated = decode(&raw);
            containers(&mut mutated)[0]
                .env
                .get_or_insert_default()
                .push(env("HF_HUB_OFFLINE", "1"));
            let (patch, result) = patched(&raw, &mutated);
            // The add is inside the container, not a replacement of the container or the list.
            assert_eq!(
                ops(&patch),
                json!([{"op": "add", "path": "/spec/containers/0/env",
                        "value": [{"name": "HF_HUB_OFFLINE", "value": "1"}]}])
            );
            assert_eq!(
                result["spec"]["containers"][0]["futureField"],
                json!({"nested": [1, 2]})
            );
            // A change of an existing value is a replace of that value alone.
            let raw = result;
            let mut mutated = decode(&raw);
            containers(&mut mutated)[0].image = Some("vllm:v2".into());
            containers(&mut mutated)[0].env.as_mut().unwrap()[0].value = Some("0".into());
            let (patch, result) = patched(&raw, &mutated);
            assert_eq!(
                ops(&patch),
                json!([
                    {"op": "replace", "path": "/spec/containers/0/env/0/value", "value": "0"},
                    {"op": "replace", "path": "/spec/containers/0/image", "value": "vllm:v2"},
                ])
            );
            assert_eq!(
                result["spec"]["containers"][0]["futureField"],
                json!({"nested": [1, 2]})
            );
        }

        #[test]
        fn nothing_changed_gives_no_operations_despite_normalisation() {
            // Nulls, empty maps and unknown fields: the typed reading differs from the raw
            // object, but no change means no operation.
            let raw = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "annotations": null, "labels": {},
                             "creationTimestamp": null, "futureMeta": 1},
                "spec": {"containers": [{"name": "c", "resources": {}, "env": null}],
                         "nodeName": null, "futureSpec": "x"},
                "status": {}
            });
            let patch = raw_patch(&raw, &decode(&raw)).unwrap();
            assert!(patch.0.is_empty(), "{}", ops(&patch));
        }

        #[test]
        fn values_the_raw_object_lacks_or_holds_as_null_are_added_whole() {
            // `containers` and `name` are required: decoding fills in [] and "", which the raw
            // object does not have, so editing them in place would not apply.
            let raw = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                             "spec": {"futureSpec": true}});
            let mut mutated = decode(&raw);
            containers(&mut mutated).push(Container {
                name: "c".into(),
                ..Container::default()
            });
            let (patch, result) = patched(&raw, &mutated);
            assert_eq!(
                ops(&patch),
                json!([{"op": "add", "path": "/spec/containers", "value": [{"name": "c"}]}])
            );
            assert_eq!(result["spec"]["futureSpec"], true);

            let raw = pod(json!([{"image": "x", "futureField": 1}]));
            let mut mutated = decode(&raw);
            containers(&mut mutated)[0].name = "named".into();
            let (patch, result) = patched(&raw, &mutated);
            assert_eq!(
                ops(&patch),
                json!([{"op": "add", "path": "/spec/containers/0/name", "value": "named"}])
            );
            assert_eq!(result["spec"]["containers"][0]["futureField"], 1);

            // A null map: `add` replaces the null; the key is escaped.
            let mut raw = pod(json!([{"name": "c"}]));
            raw["metadata"]["annotations"] = Value::Null;
            let mut mutated = decode(&raw);
            mutated
                .metadata
                .annotations
                .get_or_insert_default()
                .insert("nvca.nvcf.nvidia.io/x~y".into(), "1".into());
            let (patch, _) = patched(&raw, &mutated);
            assert_eq!(
                ops(&patch),
                json!([{"op": "add", "path": "/metadata/annotations",
                        "value": {"nvca.nvcf.nvidia.io/x~y": "1"}}])
            );

            // The whole spec missing.
            let raw = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
            let mut mutated = decode(&raw);
            mutated.spec = Some(Default::default());
            let (patch, _) = patched(&raw, &mutated);
            assert_eq!(
                ops(&patch),
                json!([{"op": "add", "path": "/spec", "value": {"containers": []}}])
            );
        }

        #[test]
        fn removed_fields_are_removed_only_where_the_raw_object_has_them() {
            let raw = pod(json!([{"name": "c", "image": "x", "futureField": 1}]));
            let mut mutated = decode(&raw);
            containers(&mut mutated)[0].image = None;
            let (patch, result) = patched(&raw, &mutated);
            assert_eq!(
                ops(&patch),
                json!([{"op": "remove", "path": "/spec/containers/0/image"}])
            );
            assert_eq!(result["spec"]["containers"][0]["futureField"], 1);
        }

        /// Every reordering, insertion and removal of named containers keeps each raw
        /// container's unknown field on the container of the same name.
        #[test]
        fn named_list_elements_keep_their_unknown_fields_through_any_reordering() {
            let names = ["a", "b", "c"];
            let raw = pod(Value::Array(
                names
                    .iter()
                    .map(|n| {
                        json!({"name": n, "image": format!("img-{n}"),
                                    "futureField": format!("of {n}")})
                    })
                    .collect(),
            ));
            let original = containers(&mut decode(&raw)).clone();
            let new_container = Container {
                name: "new".into(),
                image: Some("img-new".into()),
                ..Container::default()
            };
            // All orders of every subset, with the new container at every position, and the
            // kept containers' images changed.
            let mut cases = 0;
            for mask in 0..8u32 {
                let subset: Vec<&Container> = original
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << i) != 0)
                    .map(|(_, c)| c)
                    .collect();
                for order in permutations(subset.len()) {
                    for insert_at in 0..=subset.len() + 1 {
                        let mut list: Vec<Container> = order
                            .iter()
                            .map(|&i| {
                                let mut c = subset[i].clone();
                                c.image = Some(format!("{}-v2", c.image.clone().unwrap()));
                                c
                            })
                            .collect();
                        if insert_at <= list.len() {
                            list.insert(insert_at, new_container.clone());
                        }
                        let mut mutated = decode(&raw);
                        *containers(&mut mutated) = list.clone();
                        let (_, result) = patched(&raw, &mutated);
                        for (index, container) in list.iter().enumerate() {
                            let got = &result["spec"]["containers"][index];
                            assert_eq!(got["name"], container.name.as_str());
                            if container.name == "new" {
                                assert!(got.get("futureField").is_none(), "{got}");
                            } else {
                                assert_eq!(
                                    got["futureField"],
                                    format!("of {}", container.name),
                                    "{result}"
                                );
                            }
                        }
                        cases += 1;
                    }
                }
            }
            assert!(cases > 50, "{cases}");
        }

        fn permutations(n: usize) -> Vec<Vec<usize>> {
            if n == 0 {
                return vec![vec![]];
            }
            let mut all = Vec::new();
            for rest in permutations(n - 1) {
                for at in 0..=rest.len() {
                    let mut p = rest.clone();
                    p.insert(at, n - 1);
                    all.push(p);
                }
            }
            all
        }

        #[test]
        fn a_moved_container_is_moved_not_rewritten() {
            let raw = pod(json!([{"name": "a", "futureField": "of a"},
                                 {"name": "b", "futureField": "of b"}]));
            let mut mutated = decode(&raw);
            containers(&mut mutated).swap(0, 1);
            let (patch, _) = patched(&raw, &mutated);
            assert_eq!(
                ops(&patch),
                json!([{"op": "move", "from": "/spec/containers/1", "path": "/spec/containers/0"}])
            );
        }

        fn toleration(key: &str) -> Toleration {
            Toleration {
                key: Some(key.into()),
                operator: Some("Exists".into()),
                ..Toleration::default()
            }
        }

        #[test]
        fn unnamed_lists_are_matched_by_their_unchanged_ends() {
            // Tolerations have no identifying key. Inserting one keeps the unknown fields of the
            // others where they are.
            let mut raw = pod(json!([{"name": "c"}]));
            raw["spec"]["tolerations"] = json!([
                {"key": "a", "operator": "Exists", "futureField": "of a"},
                {"key": "b", "operator": "Exists", "futureField": "of b"},
            ]);
            let mut mutated = decode(&raw);
            let tolerations = mutated.spec.as_mut().unwrap().tolerations.as_mut().unwrap();
            tolerations.insert(1, toleration("new"));
            let (patch, result) = patched(&raw, &mutated);
            assert_eq!(
                ops(&patch),
                json!([{"op": "add", "path": "/spec/tolerations/1",
                        "value": {"key": "new", "operator": "Exists"}}])
            );
            assert_eq!(result["spec"]["tolerations"][0]["futureField"], "of a");
            assert_eq!(result["spec"]["tolerations"][2]["futureField"], "of b");

            // Removing the first one.
            let mut mutated = decode(&raw);
            let tolerations = mutated.spec.as_mut().unwrap().tolerations.as_mut().unwrap();
            tolerations.remove(0);
            let (patch, result) = patched(&raw, &mutated);
            assert_eq!(
                ops(&patch),
                json!([{"op": "remove", "path": "/spec/tolerations/0"}])
            );
            assert_eq!(result["spec"]["tolerations"][0]["futureField"], "of b");
        }

        #[test]
        fn an_ambiguous_change_of_an_unnamed_list_with_unknown_fields_is_refused() {
            let mut raw = pod(json!([{"name": "c"}]));
            raw["spec"]["tolerations"] = json!([
                {"key": "a", "operator": "Exists", "futureField": "of a"},
                {"key": "b", "operator": "Exists"},
            ]);
            // Both elements changed and one added: which raw element is which cannot be told.
            let mut mutated = decode(&raw);
            *mutated.spec.as_mut().unwrap().tolerations.as_mut().unwrap() =
                vec![toleration("x"), toleration("y"), toleration("z")];
            let err = raw_patch(&raw, &mutated).unwrap_err();
            assert!(
                matches!(&err, RawPatchError::WouldLoseFields { path, .. } if path == "/spec/tolerations"),
                "{err}"
            );
            // Without unknown fields the same change is made position by position.
            raw["spec"]["tolerations"][0]
                .as_object_mut()
                .unwrap()
                .remove("futureField");
            let (patch, _) = patched(&raw, &mutated);
            assert_eq!(
                ops(&patch),
                json!([
                    {"op": "replace", "path": "/spec/tolerations/0/key", "value": "x"},
                    {"op": "replace", "path": "/spec/tolerations/1/key", "value": "y"},
                    {"op": "add", "path": "/spec/tolerations/2",
                     "value": {"key": "z", "operator": "Exists"}},
                ])
            );
        }

        #[test]
        fn a_raw_object_that_is_not_the_type_names_the_field() {
            let raw = pod(json!([{"name": "c", "ports": [{"containerPort": "http"}]}]));
            let err = raw_patch(&raw, &Pod::default()).unwrap_err();
            match &err {
                RawPatchError::Decode { what, path, .. } => {
                    assert_eq!(*what, "the object");
                    assert_eq!(path, "spec.containers[0].ports[0].containerPort");
                }
                other => panic!("{other:?}"),
            }
            assert!(
                err.to_string()
                    .contains("at spec.containers[0].ports[0].containerPort: invalid type"),
                "{err}"
            );
        }

        #[test]
        fn a_renamed_element_is_another_element() {
            let raw = pod(json!([{"name": "a", "futureField": "of a"}, {"name": "b"}]));
            // As for a Kubernetes list map: "z" is a new container, "a" is removed with its
            // unknown field; nothing of "a" is carried over to "z".
            let mut mutated = decode(&raw);
            containers(&mut mutated)[0].name = "z".into();
            let (patch, result) = patched(&raw, &mutated);
            assert_eq!(
                ops(&patch),
                json!([
                    {"op": "remove", "path": "/spec/containers/0"},
                    {"op": "add", "path": "/spec/containers/0", "value": {"name": "z"}},
                ])
            );
            assert!(result["spec"]["containers"][0].get("futureField").is_none());
            let mut mutated = decode(&raw);
            containers(&mut mutated)[1].name = "z".into();
            let (patch, result) = patched(&raw, &mutated);
            assert_eq!(
                ops(&patch),
                json!([
                    {"op": "remove", "path": "/spec/containers/1"},
                    {"op": "add", "path": "/spec/containers/1", "value": {"name": "z"}},
                ])
            );
            assert_eq!(result["spec"]["containers"][0]["futureField"], "of a");
            // Removing the element with unknown fields removes them with it.
            let mut mutated = decode(&raw);
            containers(&mut mutated).remove(0);
            let (patch, _) = patched(&raw, &mutated);
            assert_eq!(
                ops(&patch),
                json!([{"op": "remove", "path": "/spec/containers/0"}])
            );
        }

        /// A type that writes a field it never reads: the patch applies, but the result does
        /// not read back as the handler's object, so it is refused rather than sent.
        #[derive(serde::Serialize, serde::Deserialize)]
        struct WriteOnly {
            #[serde(default, skip_deserializing)]
            stamp: Option<String>,
            #[serde(default)]
            kept: Option<String>,
        }

        #[test]
        fn a_patch_that_does_not_read_back_is_refused() {
            let raw = json!({"kept": "x"});
            let mutated = WriteOnly {
                stamp: Some("now".into()),
                kept: Some("x".into()),
            };
            let err = raw_patch(&raw, &mutated).unwrap_err();
            assert!(
                matches!(&err, RawPatchError::Mismatch { path } if path == "/stamp"),
                "{err}"
            );
        }

        #[test]
        fn a_typed_list_that_is_not_the_raw_list_is_refused() {
            /// Reads a list but drops its null elements.
            #[derive(serde::Serialize, serde::Deserialize)]
            struct Sparse {
                #[serde(deserialize_with = "skip_nulls")]
                items: Vec<String>,
            }
            fn skip_nulls<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
                let items: Vec<Option<String>> = serde::Deserialize::deserialize(d)?;
                Ok(items.into_iter().flatten().collect())
            }
            let raw = json!({"items": ["a", null, "b"]});
            let mutated = Sparse {
                items: vec!["a".into()],
            };
            let err = raw_patch(&raw, &mutated).unwrap_err();
            assert!(
                matches!(&err, RawPatchError::WouldLoseFields { path, .. } if path == "/items"),
                "{err}"
            );
        }
    }
}
