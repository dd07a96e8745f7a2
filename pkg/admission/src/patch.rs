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

use std::collections::{HashMap, HashSet};

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
    /// The raw object with the patch applied reads back as the typed object, but does not keep
    /// a field the typed object does not model on the element or object it belonged to (it is
    /// lost, or moved to another element), or holds one where there was none.
    #[error(
        "the patched raw object does not keep the fields the typed object does not model where \
         they were, at {path}"
    )]
    FieldsNotKept {
        /// JSON pointer (in the patched object) of the first place concerned.
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
    // Decoding is deterministic: a value that decodes does so without tracking the path, and
    // one that does not is decoded again with it, for the message. The fast path saves the
    // tracking on every object that decodes (nearly all of them).
    if let Ok(decoded) = K::deserialize(value) {
        return Ok(decoded);
    }
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
///   `move`d into their new position with their unknown fields (the fewest moves) and patched
///   in place, new ones are added;
/// - other lists are matched by their unchanged head and tail; elements added or removed
///   between them are added or removed alone, the others patched in place position by
///   position, unless raw elements there carry fields `K` does not model (see below);
/// - a list change needing more than 64 removals, moves or insertions (each of which shifts
///   the list where it is applied) is one `replace` of the list, built from the raw elements
///   with their own changes applied, so their unknown fields are still kept;
/// - where the typed view holds a value the raw object lacks (a required field defaulted on
///   decoding, such as an empty `containers` list or an empty `name`), the new value is added
///   whole instead of edited.
///
/// In a keyed list the key is the element's identity, as in Kubernetes list maps: an element
/// whose key changed is a removed element and an added one, and a removed element takes its
/// unknown fields with it.
///
/// A list without such a key has no identity, so where raw elements in its changed part carry
/// fields `K` does not model, its elements are followed instead: an old element to the new one
/// equal to it, or else to the new one holding the scalar members (strings, numbers, booleans)
/// its raw value holds, with the same values (it may add scalar members, such as a required
/// name the raw element lacked, and differ inside its nested objects and lists), when no other
/// new element holds them and that one matches no other old element. The change is made if no
/// followed element carrying unmodelled fields moved past another, and, when such an element
/// is not followed (it is removed), no new element is left unfollowed (it could be that
/// element, changed): those followed elements are patched in place, the others between them
/// (carrying nothing unmodelled) edited position by position, and the rest added or removed. Otherwise it is refused with [`RawPatchError::WouldLoseFields`]
/// rather than guessed: such an element moved or swapped, one of its scalar members changed,
/// replaced by another element, or removed while another is added; or typed-identical
/// elements carrying different unknown fields whose number changed.
///
/// Then the patch is checked: it must apply to `raw`, the result must read back as `mutated`
/// ([`RawPatchError::Mismatch`]), and every field of `raw` that `K` does not model must still
/// be on the same object or list element in the result (following keyed elements by key and
/// others by their typed value or identifying scalar members), unless the handler removed
/// what held it; and the result must hold no such field anywhere else
/// ([`RawPatchError::FieldsNotKept`]).
///
/// Time is linear in the size of the objects (times the nesting depth of their lists), but
/// for `O(n log n)` in the length of a reordered keyed list.
pub fn raw_patch<K>(raw: &Value, mutated: &K) -> Result<Patch, RawPatchError>
where
    K: Serialize + DeserializeOwned,
{
    let decoded: K = decode_at_path(raw).map_err(|(path, message)| RawPatchError::Decode {
        what: "the object",
        path,
        message,
    })?;
    raw_patch_decoded(raw, &decoded, mutated)
}

/// [`raw_patch`] with `raw` already decoded as `K` (`decoded`, as a typed route decodes it for
/// its handler), so it is not decoded again.
pub(crate) fn raw_patch_decoded<K>(
    raw: &Value,
    decoded: &K,
    mutated: &K,
) -> Result<Patch, RawPatchError>
where
    K: Serialize + DeserializeOwned,
{
    let old = serde_json::to_value(decoded).map_err(RawPatchError::Serialize)?;
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
    if let Some(path) = reread_differs(&reread, mutated, &new)? {
        return Err(RawPatchError::Mismatch { path });
    }
    keeps_residue(
        Some(raw),
        &old,
        Some(&patched),
        &new,
        &mut PointerBuf::new(),
    )
    .map_err(|path| RawPatchError::FieldsNotKept { path })?;
    Ok(patch)
}

/// The patch [`raw_patch`] makes from `old` (the pod `raw` was read as) to `new`, written
/// directly for the changes a pod rewrite makes (labels, annotations, volumes, init
/// containers, a container's env and mounts), without JSON trees of the whole pod; `None` for
/// any other change, which [`raw_patch`] handles. Typed routes of `Pod` try it first.
pub fn pod_patch(
    raw: &Value,
    old: &k8s_openapi::api::core::v1::Pod,
    new: &k8s_openapi::api::core::v1::Pod,
) -> Option<Patch> {
    crate::pod_patch::patch(raw, old, new)
}

/// [`raw_patch_decoded`], for a `Pod` first without JSON trees of the whole pod
/// ([`crate::pod_patch`]: the same operations, found by comparing the typed pods member by
/// member and diffing only the members that changed).
pub(crate) fn raw_patch_typed<K>(
    raw: &Value,
    decoded: &K,
    mutated: &K,
) -> Result<Patch, RawPatchError>
where
    K: Serialize + DeserializeOwned + 'static,
{
    let pods = (
        (decoded as &dyn std::any::Any).downcast_ref::<k8s_openapi::api::core::v1::Pod>(),
        (mutated as &dyn std::any::Any).downcast_ref::<k8s_openapi::api::core::v1::Pod>(),
    );
    if let (Some(old), Some(new)) = pods
        && let Some(patch) = crate::pod_patch::patch(raw, old, new)
    {
        return Ok(patch);
    }
    raw_patch_decoded(raw, decoded, mutated)
}

/// Whether `reread` (the patched raw object read as `K`) does not serialize as `new`, the
/// handler's object `mutated` as a JSON value: the JSON pointer of the first difference.
///
/// The same JSON text is the same JSON value, so when `reread` and `mutated` serialize to the
/// same text they are the same value, found without building a third tree (the common case:
/// the patch is right). Otherwise their values are compared, and where those are equal too
/// (the same value written differently, such as a map in another order) nothing differs.
fn reread_differs<K: Serialize>(
    reread: &K,
    mutated: &K,
    new: &Value,
) -> Result<Option<String>, RawPatchError> {
    let text = |object: &K| serde_json::to_vec(object).map_err(RawPatchError::Serialize);
    if text(reread)? == text(mutated)? {
        return Ok(None);
    }
    let reread = serde_json::to_value(reread).map_err(RawPatchError::Serialize)?;
    if reread == *new {
        return Ok(None);
    }
    Ok(Some(
        json_patch::diff(new, &reread)
            .0
            .first()
            .map(|op| op.path().to_string())
            .unwrap_or_default(),
    ))
}

/// Appends the operations turning `old` into `new` at `path`, shaped to apply to `raw` (the
/// raw value `old` was read from, `None` when the raw object has nothing there).
pub(crate) fn rebase(
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

/// Most structural operations (removals, moves, insertions) one list change is made of. Each
/// shifts the rest of the list where the API server (and the read-back check here) applies it,
/// so thousands of them on a long list would cost time quadratic in its length; a change
/// needing more replaces the list as a whole instead, built from the raw elements (so their
/// unmodelled fields are kept) with each kept element's own change applied.
const MAX_LIST_OPS: usize = 64;

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
    match list_key(raw, old, new) {
        Some((old_ids, new_ids)) => rebase_keyed(raw, old, new, &old_ids, &new_ids, path, ops),
        None => rebase_positional(raw, old, new, path, ops),
    }
}

/// The identities of the elements of `old` and `new` by the first of [`IDENTITY_KEYS`] that
/// identifies them: every element of both carries it, no two elements of one list share it, and
/// the raw elements carry it too (not a default filled in on decoding).
fn list_key(raw: &[Value], old: &[Value], new: &[Value]) -> Option<(Vec<String>, Vec<String>)> {
    IDENTITY_KEYS.iter().find_map(|key| {
        let old_ids = identities(old, key)?;
        (identities(raw, key)? == old_ids).then_some(())?;
        Some((old_ids, identities(new, key)?))
    })
}

/// The identity of each element (the string or number at `key`), if every element has one and
/// no two share it.
fn identities(list: &[Value], key: &str) -> Option<Vec<String>> {
    let mut seen = HashSet::with_capacity(list.len());
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

/// A keyed list: removed elements are removed, kept ones moved into place (the fewest moves:
/// those outside a longest run already in order) and patched in place, new ones added. Linear
/// but for the `O(n log n)` run; at most [`MAX_LIST_OPS`] structural operations, else the list
/// is replaced whole.
fn rebase_keyed(
    raw: &[Value],
    old: &[Value],
    new: &[Value],
    old_ids: &[String],
    new_ids: &[String],
    path: &mut PointerBuf,
    ops: &mut Vec<PatchOperation>,
) -> Result<(), RawPatchError> {
    let old_index: HashMap<&str, usize> = old_ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    // `source[j]`: the old element `new[j]` is, `None` for an added one.
    let source: Vec<Option<usize>> = new_ids
        .iter()
        .map(|id| old_index.get(id.as_str()).copied())
        .collect();
    let mut kept = vec![false; old.len()];
    for &i in source.iter().flatten() {
        kept[i] = true;
    }
    // The kept elements in their new order, by old index; those in the longest increasing run
    // stay where they are, the others are moved.
    let order: Vec<usize> = source.iter().flatten().copied().collect();
    let stays = longest_increasing_run(&order);
    let removed = kept.iter().filter(|k| !**k).count();
    let added = source.iter().filter(|s| s.is_none()).count();
    let moved = stays.iter().filter(|s| !**s).count();
    if removed + added + moved > MAX_LIST_OPS {
        return replace_list(raw, old, new, &source, path, ops);
    }
    for i in (0..old.len()).rev() {
        if !kept[i] {
            path.push_back(i);
            ops.push(remove(path.clone()));
            path.pop_back();
        }
    }
    // `working`: the old index of the element at each position after the operations so far.
    // Each moved element goes right after the element preceding it in the new order, so the
    // elements placed so far (the staying ones and those moved) are always in the new order.
    let mut working: Vec<usize> = (0..old.len()).filter(|&i| kept[i]).collect();
    let lost = || RawPatchError::WouldLoseFields {
        path: path.to_string(),
        reason: "an element could not be followed through the list change",
    };
    let mut previous: Option<usize> = None;
    for (&i, &stays) in order.iter().zip(&stays) {
        if !stays {
            let from = working.iter().position(|&w| w == i).ok_or_else(lost)?;
            let to = match previous {
                None => 0,
                Some(before) => {
                    let at = working.iter().position(|&w| w == before).ok_or_else(lost)?;
                    if from < at { at } else { at + 1 }
                }
            };
            if from != to {
                let mut from_path = path.clone();
                from_path.push_back(from);
                let mut to_path = path.clone();
                to_path.push_back(to);
                ops.push(PatchOperation::Move(MoveOperation {
                    from: from_path,
                    path: to_path,
                }));
                working.remove(from);
                working.insert(to, i);
            }
        }
        previous = Some(i);
    }
    // The kept elements are in the new order; each added one goes to its final index.
    for (j, source) in source.iter().enumerate() {
        if source.is_none() {
            path.push_back(j);
            ops.push(add(path.clone(), new[j].clone()));
            path.pop_back();
        }
    }
    for (j, source) in source.iter().enumerate() {
        if let Some(i) = *source {
            path.push_back(j);
            let result = rebase(raw.get(i), &old[i], &new[j], path, ops);
            path.pop_back();
            result?;
        }
    }
    Ok(())
}

/// Which positions of `seq` (distinct numbers) form a longest increasing subsequence.
fn longest_increasing_run(seq: &[usize]) -> Vec<bool> {
    // `tails[l]`: the position in `seq` of the smallest last value of an increasing run of
    // length `l + 1`; `previous[k]`: the position before `k` in the run ending at `k`.
    let mut tails: Vec<usize> = Vec::new();
    let mut previous: Vec<Option<usize>> = vec![None; seq.len()];
    for (k, &value) in seq.iter().enumerate() {
        let length = tails.partition_point(|&t| seq[t] < value);
        if length > 0 {
            previous[k] = Some(tails[length - 1]);
        }
        if length == tails.len() {
            tails.push(k);
        } else {
            tails[length] = k;
        }
    }
    let mut in_run = vec![false; seq.len()];
    let mut at = tails.last().copied();
    while let Some(k) = at {
        in_run[k] = true;
        at = previous[k];
    }
    in_run
}

/// One `replace` of the whole list: `new[j]` made from the raw element `source[j]` with its own
/// change applied (keeping its unmodelled fields), or `new[j]` itself for an added element.
fn replace_list(
    raw: &[Value],
    old: &[Value],
    new: &[Value],
    source: &[Option<usize>],
    path: &mut PointerBuf,
    ops: &mut Vec<PatchOperation>,
) -> Result<(), RawPatchError> {
    let mut list = Vec::with_capacity(new.len());
    for (new_value, source) in new.iter().zip(source) {
        match source.and_then(|i| Some((raw.get(i)?, old.get(i)?))) {
            Some((raw_value, old_value)) => {
                let mut element_ops = Vec::new();
                rebase(
                    Some(raw_value),
                    old_value,
                    new_value,
                    &mut PointerBuf::new(),
                    &mut element_ops,
                )?;
                let mut element = raw_value.clone();
                json_patch::patch(&mut element, &element_ops).map_err(RawPatchError::Apply)?;
                list.push(element);
            }
            None => list.push(new_value.clone()),
        }
    }
    ops.push(replace(path.clone(), Value::Array(list)));
    Ok(())
}

/// A list without identifying keys. Matched by its unchanged ends, and the changed part between
/// them patched position by position, unless raw elements there carry unmodelled fields: then
/// see [`rebase_identified`].
fn rebase_positional(
    raw: &[Value],
    old: &[Value],
    new: &[Value],
    path: &mut PointerBuf,
    ops: &mut Vec<PatchOperation>,
) -> Result<(), RawPatchError> {
    let (old_len, new_len) = (old.len(), new.len());
    // Unchanged ends: `old[..prefix]` is `new[..prefix]`, and the last `suffix` elements of
    // both are the same.
    let prefix = old.iter().zip(new).take_while(|(o, n)| o == n).count();
    let suffix = old[prefix..]
        .iter()
        .rev()
        .zip(new[prefix..].iter().rev())
        .take_while(|(o, n)| o == n)
        .count();
    let old_middle = prefix..old_len - suffix;
    let new_middle = prefix..new_len - suffix;
    if raw[old_middle.clone()]
        .iter()
        .zip(&old[old_middle.clone()])
        .any(|(r, o)| has_residue(r, o))
    {
        return rebase_identified(raw, old, new, path, ops);
    }
    let common = old_middle.len().min(new_middle.len());
    let in_place = prefix + common;
    if old_middle.len().abs_diff(new_middle.len()) > MAX_LIST_OPS {
        let source: Vec<Option<usize>> = (0..new_len)
            .map(|j| {
                if j < in_place {
                    Some(j)
                } else if j >= new_len - suffix {
                    Some(j + old_len - new_len)
                } else {
                    None
                }
            })
            .collect();
        return replace_list(raw, old, new, &source, path, ops);
    }
    for index in prefix..in_place {
        path.push_back(index);
        let result = rebase(raw.get(index), &old[index], &new[index], path, ops);
        path.pop_back();
        result?;
    }
    for (index, value) in new.iter().enumerate().take(new_middle.end).skip(in_place) {
        path.push_back(index);
        ops.push(add(path.clone(), value.clone()));
        path.pop_back();
    }
    for _ in in_place..old_middle.end {
        path.push_back(in_place);
        ops.push(remove(path.clone()));
        path.pop_back();
    }
    Ok(())
}

/// A list without identifying keys whose changed part holds raw elements carrying unmodelled
/// fields. Its elements are followed as [`pair_elements`] tells (equal typed values, or
/// identifying scalar members); the change is made only if that is unambiguous, keeps the
/// order of the followed elements carrying unmodelled fields (none moved), and, if such an
/// element is not followed (so removed), leaves no new element unfollowed (which could be it,
/// changed). Then those followed elements are patched in place, the others between them
/// (carrying nothing unmodelled) edited position by position, added or removed.
fn rebase_identified(
    raw: &[Value],
    old: &[Value],
    new: &[Value],
    path: &mut PointerBuf,
    ops: &mut Vec<PatchOperation>,
) -> Result<(), RawPatchError> {
    let refuse = |reason| {
        Err(RawPatchError::WouldLoseFields {
            path: path.to_string(),
            reason,
        })
    };
    let Some(pairing) = pair_elements(raw, old, new) else {
        return refuse(
            "elements that read as the same typed value, or have the same scalar members, carry \
             different unmodelled fields, so which of them is kept cannot be told",
        );
    };
    let carries: Vec<bool> = raw
        .iter()
        .zip(old)
        .map(|(r, o)| has_residue(r, o))
        .collect();
    // The followed elements carrying unmodelled fields, in the new order: (old, new).
    let anchors: Vec<(usize, usize)> = pairing
        .iter()
        .enumerate()
        .filter_map(|(j, i)| Some(((*i)?, j)))
        .filter(|&(i, _)| carries[i])
        .collect();
    if anchors.windows(2).any(|w| w[0].0 > w[1].0) {
        return refuse(
            "elements of a list without identifying keys that carry unmodelled fields were \
             moved, so which element those fields belong to cannot be told",
        );
    }
    // An element carrying unmodelled fields that is not followed may be removed, or changed
    // (a scalar member) into one of the new elements not followed: refused unless there is
    // none.
    let mut anchored = vec![false; old.len()];
    for &(i, _) in &anchors {
        anchored[i] = true;
    }
    let unfollowed_carrier = (0..old.len()).any(|i| carries[i] && !anchored[i]);
    if unfollowed_carrier && pairing.iter().any(Option::is_none) {
        return refuse(
            "elements of a list without identifying keys that carry unmodelled fields were \
             changed (a scalar member) or replaced, or removed while others were added, so \
             which element those fields belong to cannot be told",
        );
    }
    // The anchors are patched in place. Between consecutive anchors, the old elements carrying
    // nothing unmodelled are edited into the new ones there, position by position (whatever
    // they are, nothing unmodelled is moved); the rest are added or removed.
    let mut source: Vec<Option<usize>> = vec![None; new.len()];
    for &(i, j) in &anchors {
        source[j] = Some(i);
    }
    let gaps = std::iter::once((0, 0))
        .chain(anchors.iter().map(|&(i, j)| (i + 1, j + 1)))
        .zip(
            anchors
                .iter()
                .copied()
                .chain(std::iter::once((old.len(), new.len()))),
        );
    for ((old_start, new_start), (old_end, new_end)) in gaps {
        let plain = (old_start..old_end).filter(|&i| !carries[i]);
        for (i, j) in plain.zip(new_start..new_end) {
            source[j] = Some(i);
        }
    }
    let mut kept = vec![false; old.len()];
    for &i in source.iter().flatten() {
        kept[i] = true;
    }
    let removed = kept.iter().filter(|k| !**k).count();
    let added = source.iter().filter(|s| s.is_none()).count();
    if removed + added > MAX_LIST_OPS {
        return replace_list(raw, old, new, &source, path, ops);
    }
    for i in (0..old.len()).rev() {
        if !kept[i] {
            path.push_back(i);
            ops.push(remove(path.clone()));
            path.pop_back();
        }
    }
    // The kept elements are in order; each added one goes to its final index.
    for (j, source) in source.iter().enumerate() {
        if source.is_none() {
            path.push_back(j);
            ops.push(add(path.clone(), new[j].clone()));
            path.pop_back();
        }
    }
    for (j, source) in source.iter().enumerate() {
        if let Some(i) = *source {
            path.push_back(j);
            let result = rebase(raw.get(i), &old[i], &new[j], path, ops);
            path.pop_back();
            result?;
        }
    }
    Ok(())
}

/// Most distinct sets of scalar member names among the elements of one list for which
/// [`ScalarIdentities`] identifies elements (each set costs a pass over the new list); a list
/// with more (not made of one type's values) has its elements identified by equality only.
const MAX_IDENTITY_SHAPES: usize = 16;

/// What identifies the elements of a list without identifying keys: the scalar members
/// (strings, numbers, booleans) an element's raw value holds, with their typed values. A new
/// element is the same as an old one when it holds these members with the same values (it may
/// add scalar members, such as a required name the raw element lacked, and differ in nested
/// objects and lists), no other new element does, and it matches no other old element. An
/// element whose scalar member changed could as well be another element, and is not the same.
struct ScalarIdentities<'a> {
    new: &'a [Value],
    /// Per old element: the index of its member names in `key_sets`, and its values' text.
    old: Vec<Option<(usize, String)>>,
    /// The distinct sets of identifying member names, sorted.
    key_sets: Vec<Vec<&'a str>>,
    /// Per key set: how many old elements have each values' text.
    old_counts: Vec<HashMap<String, usize>>,
    /// Per key set: the new elements holding these members, by their values' text.
    new_by: Vec<HashMap<String, Vec<usize>>>,
}

impl<'a> ScalarIdentities<'a> {
    fn new(raw: &'a [Value], old: &'a [Value], new: &'a [Value]) -> Self {
        let mut key_set_index: HashMap<Vec<&'a str>, usize> = HashMap::new();
        let mut key_sets: Vec<Vec<&'a str>> = Vec::new();
        let mut identities = Vec::with_capacity(old.len());
        for (raw_value, old_value) in raw.iter().zip(old) {
            let (Value::Object(raw_map), Value::Object(old_map)) = (raw_value, old_value) else {
                identities.push(None);
                continue;
            };
            let mut keys: Vec<&'a str> = old_map
                .iter()
                .filter(|(key, value)| is_scalar(value) && present(raw_map, key.as_str()).is_some())
                .map(|(key, _)| key.as_str())
                .collect();
            keys.sort_unstable();
            let Some(values) = scalar_values(old_value, &keys) else {
                identities.push(None);
                continue;
            };
            let next = key_sets.len();
            let index = *key_set_index.entry(keys.clone()).or_insert(next);
            if index == next {
                key_sets.push(keys);
            }
            identities.push(Some((index, values)));
        }
        if key_sets.len() > MAX_IDENTITY_SHAPES {
            return Self {
                new,
                old: vec![None; old.len()],
                key_sets: Vec::new(),
                old_counts: Vec::new(),
                new_by: Vec::new(),
            };
        }
        let mut old_counts = vec![HashMap::new(); key_sets.len()];
        for (index, values) in identities.iter().flatten() {
            *old_counts[*index].entry(values.clone()).or_insert(0) += 1;
        }
        let new_by = key_sets
            .iter()
            .map(|keys| {
                let mut by: HashMap<String, Vec<usize>> = HashMap::new();
                for (j, value) in new.iter().enumerate() {
                    if let Some(values) = scalar_values(value, keys) {
                        by.entry(values).or_default().push(j);
                    }
                }
                by
            })
            .collect();
        Self {
            new,
            old: identities,
            key_sets,
            old_counts,
            new_by,
        }
    }

    /// The new elements holding `old[i]`'s identifying members with its values.
    fn candidates(&self, i: usize) -> &[usize] {
        self.old
            .get(i)
            .and_then(Option::as_ref)
            .and_then(|(index, values)| self.new_by.get(*index)?.get(values))
            .map_or(&[], Vec::as_slice)
    }

    /// How many old elements `new[j]` matches.
    fn matches_of_new(&self, j: usize) -> usize {
        let Some(value) = self.new.get(j) else {
            return 0;
        };
        self.key_sets
            .iter()
            .zip(&self.old_counts)
            .filter_map(|(keys, counts)| counts.get(&scalar_values(value, keys)?))
            .sum()
    }
}

fn is_scalar(value: &Value) -> bool {
    matches!(value, Value::String(_) | Value::Number(_) | Value::Bool(_))
}

/// The scalar values of the object `value` at `keys`, in a canonical text; `None` unless it is
/// an object holding a scalar at each of them.
fn scalar_values(value: &Value, keys: &[&str]) -> Option<String> {
    let Value::Object(map) = value else {
        return None;
    };
    let values = keys
        .iter()
        .map(|key| map.get(*key).filter(|v| is_scalar(v)))
        .collect::<Option<Vec<&Value>>>()?;
    serde_json::to_string(&values).ok()
}

/// Which old element each element of `new` is, for the read-back check of unmodelled fields
/// (`None` for an element that is no old one); `None` when that cannot be told for an old
/// element carrying unmodelled fields.
///
/// Keyed lists are matched by key. Otherwise elements are matched by their typed value (equal
/// elements in order; when their number changed, only if their raw elements are all alike or
/// carry nothing unmodelled), then the remaining ones by their scalar members where these
/// identify one old and one new element (see [`ScalarIdentities`]).
fn pair_elements(raw: &[Value], old: &[Value], new: &[Value]) -> Option<Vec<Option<usize>>> {
    if let Some((old_ids, new_ids)) = list_key(raw, old, new) {
        let old_index: HashMap<&str, usize> = old_ids
            .iter()
            .enumerate()
            .map(|(i, id)| (id.as_str(), i))
            .collect();
        return Some(
            new_ids
                .iter()
                .map(|id| old_index.get(id.as_str()).copied())
                .collect(),
        );
    }
    let carries = |i: usize| {
        raw.get(i)
            .zip(old.get(i))
            .is_some_and(|(r, o)| has_residue(r, o))
    };
    let mut source: Vec<Option<usize>> = vec![None; new.len()];
    let mut paired = vec![false; old.len()];
    let new_by_value = group_by(new, whole_text);
    for (value, olds) in group_by(old, whole_text) {
        let Some(news) = new_by_value.get(&value) else {
            continue;
        };
        if olds.len() != news.len()
            && olds.iter().any(|&i| carries(i))
            && olds.iter().any(|&i| raw.get(i) != raw.get(olds[0]))
        {
            return None;
        }
        for (&i, &j) in olds.iter().zip(news) {
            source[j] = Some(i);
            paired[i] = true;
        }
    }
    // Then by identifying scalar members.
    let identities = ScalarIdentities::new(raw, old, new);
    for i in (0..old.len()).filter(|&i| !paired[i]) {
        let candidates = identities.candidates(i);
        match candidates {
            [j] if source[*j].is_none() && identities.matches_of_new(*j) == 1 => {
                source[*j] = Some(i);
            }
            _ if carries(i) && candidates.iter().any(|&j| source[j].is_none()) => return None,
            _ => {}
        }
    }
    Some(source)
}

/// The indices of the elements of `list` by `text(element)` (those without a text left out).
fn group_by(list: &[Value], text: fn(&Value) -> Option<String>) -> HashMap<String, Vec<usize>> {
    let mut groups: HashMap<String, Vec<usize>> = HashMap::new();
    for (index, value) in list.iter().enumerate() {
        if let Some(key) = text(value) {
            groups.entry(key).or_default().push(index);
        }
    }
    groups
}

/// A value in a canonical text (object members sorted).
fn whole_text(value: &Value) -> Option<String> {
    serde_json::to_string(value).ok()
}

/// Whether `patched` (`raw` with the patch applied) keeps every field of `raw` that the typed
/// reading `old` does not model, on the same logical element, and holds no unmodelled field
/// elsewhere; `new` is the handler's typed object. An unmodelled field may only go with the
/// object or element holding it (removed by the handler, or replaced by a value of another
/// type). List elements are followed as [`pair_elements`] tells. `Err` names the first place
/// where this does not hold.
fn keeps_residue(
    raw: Option<&Value>,
    old: &Value,
    patched: Option<&Value>,
    new: &Value,
    path: &mut PointerBuf,
) -> Result<(), String> {
    let Some(raw) = raw.filter(|v| !v.is_null()) else {
        // Nothing unmodelled here before; nothing may be now.
        return if residue_at(patched, Some(new)) {
            Err(path.to_string())
        } else {
            Ok(())
        };
    };
    match (raw, old, patched, new) {
        (Value::Object(r), Value::Object(o), Some(Value::Object(p)), Value::Object(n)) => {
            keeps_residue_object(r, o, p, n, path)
        }
        (Value::Array(r), Value::Array(o), Some(Value::Array(p)), Value::Array(n)) => {
            keeps_residue_list(r, o, p, n, path)
        }
        _ if has_residue(raw, old) && old == new => {
            // An unchanged value holding something unmodelled stays as it was.
            if patched == Some(raw) {
                Ok(())
            } else {
                Err(path.to_string())
            }
        }
        _ => {
            if residue_at(patched, Some(new)) {
                Err(path.to_string())
            } else {
                Ok(())
            }
        }
    }
}

/// Whether `patched` holds something its typed reading `typed` lacks (`typed` being `None`:
/// any non-null value).
fn residue_at(patched: Option<&Value>, typed: Option<&Value>) -> bool {
    match (patched, typed) {
        (None | Some(Value::Null), _) => false,
        (Some(_), None) => true,
        (Some(patched), Some(typed)) => has_residue(patched, typed),
    }
}

fn keeps_residue_object(
    raw: &Map<String, Value>,
    old: &Map<String, Value>,
    patched: &Map<String, Value>,
    new: &Map<String, Value>,
    path: &mut PointerBuf,
) -> Result<(), String> {
    let keys = raw
        .keys()
        .chain(patched.keys().filter(|key| !raw.contains_key(*key)));
    for key in keys {
        path.push_back(key);
        let held = |kept: bool| if kept { Ok(()) } else { Err(path.to_string()) };
        let result = match (old.get(key), new.get(key)) {
            // Unmodelled: kept as it was.
            (None, None) => held(present(raw, key) == present(patched, key)),
            // Added by the handler (a raw value there was read as absent, such as an empty
            // list the type skips): nothing unmodelled in it.
            (None, Some(new_value)) => held(!residue_at(patched.get(key), Some(new_value))),
            // Removed by the handler, with whatever it held.
            (Some(_), None) => held(present(patched, key).is_none()),
            (Some(old_value), Some(new_value)) => {
                keeps_residue(raw.get(key), old_value, patched.get(key), new_value, path)
            }
        };
        path.pop_back();
        result?;
    }
    Ok(())
}

/// The non-null value at `key`.
fn present<'m>(map: &'m Map<String, Value>, key: &str) -> Option<&'m Value> {
    map.get(key).filter(|v| !v.is_null())
}

fn keeps_residue_list(
    raw: &[Value],
    old: &[Value],
    patched: &[Value],
    new: &[Value],
    path: &mut PointerBuf,
) -> Result<(), String> {
    let fail = |path: &PointerBuf| Err(path.to_string());
    if raw.len() != old.len() {
        // Only a list of nulls may be read as another list (and is then replaced whole).
        let untouched = raw == patched && old == new;
        let all_null = raw.iter().all(Value::is_null) && !has_residue_list(patched, new);
        return if untouched || all_null {
            Ok(())
        } else {
            fail(path)
        };
    }
    if patched.len() != new.len() {
        return fail(path);
    }
    if !has_residue_list(raw, old) {
        return if has_residue_list(patched, new) {
            fail(path)
        } else {
            Ok(())
        };
    }
    let Some(source) = pair_elements(raw, old, new) else {
        return fail(path);
    };
    for (j, source) in source.iter().enumerate() {
        path.push_back(j);
        let result = match *source {
            Some(i) => keeps_residue(raw.get(i), &old[i], patched.get(j), &new[j], path),
            None if has_residue(&patched[j], &new[j]) => Err(path.to_string()),
            None => Ok(()),
        };
        path.pop_back();
        result?;
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

        fn with_tolerations(tolerations: Value) -> Value {
            let mut raw = pod(json!([{"name": "c"}]));
            raw["spec"]["tolerations"] = tolerations;
            raw
        }

        fn tolerations(pod: &mut Pod) -> &mut Vec<Toleration> {
            pod.spec.as_mut().unwrap().tolerations.as_mut().unwrap()
        }

        fn refused_at(raw: &Value, mutated: &Pod, at: &str) {
            match raw_patch(raw, mutated) {
                Err(RawPatchError::WouldLoseFields { path, .. }) if path == at => {}
                other => panic!("expected a refusal at {at}, got {other:?}"),
            }
        }

        /// Equal-length changes of an unkeyed list used to be patched position by position,
        /// moving the unmodelled fields of one element onto another.
        #[test]
        fn a_removal_and_an_append_or_a_swap_in_an_unkeyed_list_are_refused() {
            let raw = with_tolerations(json!([
                {"key": "a", "operator": "Exists", "futureField": "of a"},
                {"key": "b", "operator": "Exists", "futureField": "of b"},
            ]));
            // Remove `a`, append `new`: the old code answered
            // [{key: b, futureField: "of a"}, {key: new, futureField: "of b"}].
            let mut mutated = decode(&raw);
            tolerations(&mut mutated).remove(0);
            tolerations(&mut mutated).push(toleration("new"));
            refused_at(&raw, &mutated, "/spec/tolerations");
            // Swap.
            let mut mutated = decode(&raw);
            tolerations(&mut mutated).swap(0, 1);
            refused_at(&raw, &mutated, "/spec/tolerations");
            // Replace one by another element.
            let mut mutated = decode(&raw);
            tolerations(&mut mutated)[0] = toleration("z");
            refused_at(&raw, &mutated, "/spec/tolerations");
            // A changed scalar member: the same element edited, or another one? Refused.
            let mut mutated = decode(&raw);
            tolerations(&mut mutated)[1].operator = Some("Equal".into());
            refused_at(&raw, &mutated, "/spec/tolerations");

            // The same changes where only the untouched element carries unknown fields are
            // made, and keep them on it.
            let raw = with_tolerations(json!([
                {"key": "a", "operator": "Exists"},
                {"key": "b", "operator": "Exists"},
                {"key": "c", "operator": "Exists", "futureField": "of c"},
            ]));
            let mut mutated = decode(&raw);
            tolerations(&mut mutated).swap(0, 1);
            let (_, result) = patched(&raw, &mutated);
            assert_eq!(result["spec"]["tolerations"][2]["futureField"], "of c");
            assert!(
                result["spec"]["tolerations"][0]
                    .get("futureField")
                    .is_none()
            );
        }

        #[test]
        fn elements_with_unknown_fields_edited_in_place_keep_them() {
            let raw = with_tolerations(json!([
                {"key": "a", "operator": "Exists", "futureField": "of a"},
                {"key": "b", "operator": "Exists", "futureField": "of b"},
            ]));
            // A scalar member added (not changed) to `a`, and an element appended and one
            // inserted between them.
            let mut mutated = decode(&raw);
            tolerations(&mut mutated)[0].toleration_seconds = Some(30);
            tolerations(&mut mutated).insert(1, toleration("between"));
            tolerations(&mut mutated).push(toleration("last"));
            let (patch, result) = patched(&raw, &mutated);
            assert_eq!(
                ops(&patch),
                json!([
                    {"op": "add", "path": "/spec/tolerations/1",
                     "value": {"key": "between", "operator": "Exists"}},
                    {"op": "add", "path": "/spec/tolerations/3",
                     "value": {"key": "last", "operator": "Exists"}},
                    {"op": "add", "path": "/spec/tolerations/0/tolerationSeconds", "value": 30},
                ])
            );
            let kept: Vec<&Value> = result["spec"]["tolerations"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| &t["futureField"])
                .collect();
            assert_eq!(
                kept,
                [&json!("of a"), &Value::Null, &json!("of b"), &Value::Null]
            );

            // Removing one of them while the other gains a member.
            let mut mutated = decode(&raw);
            tolerations(&mut mutated).remove(0);
            tolerations(&mut mutated)[0].effect = Some("NoSchedule".into());
            let (patch, result) = patched(&raw, &mutated);
            assert_eq!(
                ops(&patch),
                json!([
                    {"op": "remove", "path": "/spec/tolerations/0"},
                    {"op": "add", "path": "/spec/tolerations/0/effect", "value": "NoSchedule"},
                ])
            );
            assert_eq!(result["spec"]["tolerations"][0]["futureField"], "of b");

            // Elements carrying nothing unknown may move around one that does.
            let raw = with_tolerations(json!([
                {"key": "a", "operator": "Exists"},
                {"key": "b", "operator": "Exists"},
                {"key": "c", "operator": "Exists", "futureField": "of c"},
            ]));
            let mut mutated = decode(&raw);
            tolerations(&mut mutated).swap(0, 1);
            tolerations(&mut mutated)[2].effect = Some("NoExecute".into());
            let (_, result) = patched(&raw, &mutated);
            assert_eq!(result["spec"]["tolerations"][2]["futureField"], "of c");
            assert_eq!(result["spec"]["tolerations"][0]["key"], "b");
        }

        /// The read-back check catches unmodelled fields moved to another element even when the
        /// patch applies and reads back as the typed object: the old code's answer to the
        /// removal and append above.
        #[test]
        fn the_read_back_check_follows_unknown_fields_to_their_elements() {
            let raw = with_tolerations(json!([
                {"key": "a", "operator": "Exists", "futureField": "of a"},
                {"key": "b", "operator": "Exists", "futureField": "of b"},
            ]));
            let old = serde_json::to_value(decode(&raw)).unwrap();
            let mut mutated = decode(&raw);
            tolerations(&mut mutated).remove(0);
            tolerations(&mut mutated).push(toleration("new"));
            let new = serde_json::to_value(&mutated).unwrap();
            let check = |patched: &Value| {
                keeps_residue(
                    Some(&raw),
                    &old,
                    Some(patched),
                    &new,
                    &mut PointerBuf::new(),
                )
            };
            let mut moved = raw.clone();
            moved["spec"]["tolerations"] = json!([
                {"key": "b", "operator": "Exists", "futureField": "of a"},
                {"key": "new", "operator": "Exists", "futureField": "of b"},
            ]);
            assert_eq!(
                serde_json::to_value(decode(&moved)).unwrap(),
                new,
                "reads back as the typed object"
            );
            assert_eq!(
                check(&moved),
                Err("/spec/tolerations/0/futureField".to_owned())
            );
            // Right: `a` removed with its field, `b` keeps its own, `new` has none.
            let mut right = moved.clone();
            right["spec"]["tolerations"] = json!([
                {"key": "b", "operator": "Exists", "futureField": "of b"},
                {"key": "new", "operator": "Exists"},
            ]);
            assert_eq!(check(&right), Ok(()));
            // A field lost from a kept element, or one appearing on a new element.
            let mut lost = right.clone();
            lost["spec"]["tolerations"][0]
                .as_object_mut()
                .unwrap()
                .remove("futureField");
            assert_eq!(
                check(&lost),
                Err("/spec/tolerations/0/futureField".to_owned())
            );
            let mut appeared = right.clone();
            appeared["spec"]["tolerations"][1]["futureField"] = json!("of a");
            assert_eq!(check(&appeared), Err("/spec/tolerations/1".to_owned()));
            // Beside the list too: the pod's own unknown field must stay.
            let mut raw_with_spec_field = raw.clone();
            raw_with_spec_field["spec"]["futureSpec"] = json!(1);
            assert_eq!(
                keeps_residue(
                    Some(&raw_with_spec_field),
                    &old,
                    Some(&right),
                    &new,
                    &mut PointerBuf::new()
                ),
                Err("/spec/futureSpec".to_owned())
            );
        }

        /// A type with a nested list, for lists without identifying keys.
        #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        struct Doc {
            #[serde(default)]
            items: Vec<Item>,
        }

        #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        struct Item {
            label: String,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            count: Option<i64>,
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            tags: Vec<String>,
        }

        /// A small deterministic generator (xorshift64*), so failures reproduce.
        struct Rng(u64);

        impl Rng {
            fn below(&mut self, n: usize) -> usize {
                self.0 ^= self.0 >> 12;
                self.0 ^= self.0 << 25;
                self.0 ^= self.0 >> 27;
                let x = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
                (x >> 33) as usize % n.max(1)
            }
        }

        /// Random changes of an unkeyed list whose elements may carry an unknown field: each
        /// change is either refused as ambiguous, or keeps each unknown field on the element it
        /// came from (followed by the test through the change) and puts none anywhere else.
        #[test]
        fn unkeyed_list_changes_keep_unknown_fields_on_their_elements_or_are_refused() {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
            let (mut made, mut made_with_fields, mut refused) = (0, 0, 0);
            for case in 0..4000 {
                let len = rng.below(6);
                let any_fields = rng.below(4) != 0;
                let raw_items: Vec<Value> = (0..len)
                    .map(|i| {
                        let mut item = json!({"label": format!("l{i}")});
                        if rng.below(2) == 0 {
                            item["count"] = json!(rng.below(3));
                        }
                        if rng.below(2) == 0 {
                            item["tags"] = json!(["t"]);
                        }
                        if any_fields && rng.below(2) == 0 {
                            item["future"] = json!(format!("of l{i}"));
                        }
                        item
                    })
                    .collect();
                let raw = json!({"items": raw_items, "futureTop": case});
                let decoded: Doc = serde_json::from_value(raw.clone()).unwrap();
                // Each element with the index of the raw element it came from.
                let mut items: Vec<(Item, Option<usize>)> = decoded
                    .items
                    .iter()
                    .cloned()
                    .enumerate()
                    .map(|(i, item)| (item, Some(i)))
                    .collect();
                let mut fresh = 0;
                let mut fresh_item = || {
                    fresh += 1;
                    (
                        Item {
                            label: format!("fresh{fresh}"),
                            count: None,
                            tags: vec![],
                        },
                        None,
                    )
                };
                let mut changes = Vec::new();
                for _ in 0..1 + rng.below(3) {
                    let n = items.len();
                    let change = rng.below(7);
                    changes.push(change);
                    match change {
                        0 if n > 0 => {
                            items.remove(rng.below(n));
                        }
                        1 => items.insert(rng.below(n + 1), fresh_item()),
                        2 if n > 1 => items.swap(rng.below(n), rng.below(n)),
                        3 if n > 0 => {
                            let moved = items.remove(rng.below(n));
                            items.push(moved);
                        }
                        4 if n > 0 => items[rng.below(n)].0.tags.push("added".into()),
                        5 if n > 0 => {
                            let count = &mut items[rng.below(n)].0.count;
                            *count = Some(count.map_or(7, |c| c + 1));
                        }
                        _ => items.push(fresh_item()),
                    }
                }
                let mutated = Doc {
                    items: items.iter().map(|(item, _)| item.clone()).collect(),
                };
                let context = format!("case {case}: {raw} changed by {changes:?} into {mutated:?}");
                match raw_patch(&raw, &mutated) {
                    Ok(patch) => {
                        let result = apply(&raw, &patch).unwrap();
                        let reread: Doc = serde_json::from_value(result.clone()).unwrap();
                        assert_eq!(reread, mutated, "{context}");
                        assert_eq!(result["futureTop"], case, "{context}");
                        for (j, (_, source)) in items.iter().enumerate() {
                            let expected =
                                source.and_then(|i| raw["items"][i].get("future")).cloned();
                            assert_eq!(
                                result["items"][j].get("future").cloned(),
                                expected,
                                "{context}: element {j} of {result}"
                            );
                        }
                        made += 1;
                        if raw["items"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .any(|item| item.get("future").is_some())
                        {
                            made_with_fields += 1;
                        }
                    }
                    Err(RawPatchError::WouldLoseFields { path, .. }) => {
                        assert_eq!(path, "/items", "{context}");
                        assert!(
                            raw["items"]
                                .as_array()
                                .unwrap()
                                .iter()
                                .any(|item| item.get("future").is_some()),
                            "refused without unknown fields: {context}"
                        );
                        refused += 1;
                    }
                    Err(other) => panic!("{context}: {other}"),
                }
            }
            // Not vacuous: many changes are made despite unknown fields, many are refused.
            assert!(made_with_fields > 500, "{made_with_fields} of {made}");
            assert!(refused > 300, "{refused}");
        }

        fn env_list(len: usize) -> Value {
            Value::Array(
                (0..len)
                    .map(|i| json!({"name": format!("V{i}"), "value": "x", "futureField": i}))
                    .collect(),
            )
        }

        /// Moving one element is one `move`, not one per element it passes (the old code moved
        /// every element in between).
        #[test]
        fn a_reordered_keyed_list_gets_the_fewest_moves() {
            let raw = pod(json!([{"name": "c", "env": env_list(6)}]));
            let mut mutated = decode(&raw);
            let env = containers(&mut mutated)[0].env.as_mut().unwrap();
            let first = env.remove(0);
            env.push(first);
            let (patch, result) = patched(&raw, &mutated);
            assert_eq!(
                ops(&patch),
                json!([{"op": "move", "from": "/spec/containers/0/env/0",
                        "path": "/spec/containers/0/env/5"}])
            );
            for (index, expected) in [1, 2, 3, 4, 5, 0].into_iter().enumerate() {
                assert_eq!(
                    result["spec"]["containers"][0]["env"][index]["futureField"],
                    expected
                );
            }
        }

        /// Long lists. Measured on a loaded 2-core machine, release build, with 30 000 variables
        /// carrying an unknown field: `raw_patch` for appending one took 3.9 s before (a
        /// linear search per element) and 0.57 s now, most of it decoding, encoding and
        /// re-reading the object; reversing them 0.59 s, as one `replace` instead of 30 000
        /// `move`s (each shifting the list where the API server applies it). Asserted by the
        /// shape of the patch, not by time.
        #[test]
        fn long_lists_are_patched_in_few_operations() {
            let len = 30_000;
            let raw = pod(json!([{"name": "c", "env": env_list(len)}]));
            let mut mutated = decode(&raw);
            containers(&mut mutated)[0]
                .env
                .as_mut()
                .unwrap()
                .push(env("HF_HUB_OFFLINE", "1"));
            let patch = raw_patch(&raw, &mutated).unwrap();
            assert_eq!(
                ops(&patch),
                json!([{"op": "add", "path": format!("/spec/containers/0/env/{len}"),
                        "value": {"name": "HF_HUB_OFFLINE", "value": "1"}}])
            );

            // Reversed, with one element changed: one replace built from the raw elements.
            let mut mutated = decode(&raw);
            let list = containers(&mut mutated)[0].env.as_mut().unwrap();
            list.reverse();
            list[0].value = Some("changed".into());
            let patch = raw_patch(&raw, &mutated).unwrap();
            assert_eq!(patch.0.len(), 1);
            assert!(
                matches!(&patch.0[0], PatchOperation::Replace(op) if op.path.as_str() == "/spec/containers/0/env")
            );
            let result = apply(&raw, &patch).unwrap();
            let env = result["spec"]["containers"][0]["env"].as_array().unwrap();
            assert_eq!(
                env[0],
                json!({"name": format!("V{}", len - 1), "value": "changed",
                                      "futureField": len - 1})
            );
            assert_eq!(env[len - 1]["futureField"], 0);

            // Unkeyed: many insertions in the middle are one replace too.
            let tolerations_raw: Vec<Value> = (0..200)
                .map(|i| json!({"key": format!("k{i}"), "operator": "Exists", "futureField": i}))
                .collect();
            let raw = with_tolerations(Value::Array(tolerations_raw));
            let mut mutated = decode(&raw);
            for i in 0..100 {
                tolerations(&mut mutated).insert(100, toleration(&format!("new{i}")));
            }
            let (patch, result) = patched(&raw, &mutated);
            assert_eq!(patch.0.len(), 1, "{}", ops(&patch));
            let list = result["spec"]["tolerations"].as_array().unwrap();
            assert_eq!(list[99]["futureField"], 99);
            assert!(list[100].get("futureField").is_none());
            assert_eq!(list[200]["futureField"], 100);
            assert_eq!(list[299]["futureField"], 199);
        }
    }
}
