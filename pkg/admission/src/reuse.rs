//! Answers kept for reuse on typed mutating routes.
//!
//! The pods of one ReplicaSet reach a mutating webhook as the same object: the API server
//! sends a `CREATE` with `generateName`, before the name, the UID or the creation time is set,
//! so every replica's `request.object` is equal but for what the API server sets per request
//! (the managedFields times and, for pods, the token volume's name; below). A handler whose
//! answer depends only on the review and on inputs it can check cheaply afterwards (cached
//! objects it read, the time) may say so by attaching a [`Reusable`] to its
//! [`Reply`](crate::Reply). The route then keeps the answer, with the JSON patch as computed,
//! and answers a later review with
//!
//! - the same operation (`CREATE` only), kind, resource, subresource, namespace, name, user,
//!   dry-run flag and no `oldObject`, and
//! - an object equal to the kept one as JSON (every field, including those the typed object
//!   does not model) but for the `time` of its `metadata.managedFields` entries,
//!
//! from the kept answer while [`Reuse::holds`] is true, without decoding the object as the
//! route's type, calling the handler or computing the patch again. Only the review's `uid`
//! differs between the reviews an answer is reused for; a handler must not mark an answer
//! reusable when it depends on the `uid` or on anything [`Reuse::holds`] does not check.
//!
//! **The managedFields times.** The API server records the request's field manager in
//! `metadata.managedFields` before the webhooks see the object, with the time of the request
//! to the second, so replicas created a second apart differ only there. Those times are not
//! compared: a handler must not mark an answer reusable when it depends on them, and an answer
//! whose patch may write `managedFields` (a path into it, to `metadata` or to the whole
//! object) is not kept.
//!
//! **Pods: the service account token volume.** The API server's ServiceAccount admission
//! runs before the webhooks and gives each pod a projected volume named `kube-api-access-` and
//! five random characters, mounted in every container. Pod objects are therefore compared with
//! that one name (the single volume of `spec.volumes` with that prefix) mapped to the other
//! pod's: every other string must be equal, and each occurrence of one pod's name must stand
//! where the other pod has its own. An answer whose patch mentions the name is not kept, so a
//! reused patch never names another pod's volume.
//!
//! What differs per review (a trace context) is not part of the kept patch: the handler leaves
//! it out of the object it returns and gives it as [`Reusable::new`]'s `per_review`
//! operations, which are sent after the kept patch; for a reused answer,
//! [`Reuse::reused`] gives them.
//!
//! Kept answers are bounded in number ([`KEPT_ANSWERS`]) and in size ([`KEPT_BYTES`], the
//! kept objects and patches as estimated); the oldest go first. Equal reviews are found by a
//! hash keyed per process, then compared in full, so a colliding review is never answered
//! with another's patch.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use json_patch::PatchOperation;
use k8s_openapi::api::authentication::v1::UserInfo;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use kube::core::{DynamicObject, GroupVersionKind, GroupVersionResource};
use serde_json::Value;

use crate::route::Review;

/// How many answers a route keeps at most.
pub const KEPT_ANSWERS: usize = 512;

/// How many bytes of kept objects and patches a route keeps at most (as estimated).
pub const KEPT_BYTES: usize = 16 * 1024 * 1024;

/// The largest single answer kept (its object and patch, as estimated).
pub const KEPT_ANSWER_BYTES: usize = 256 * 1024;

/// What makes a kept answer valid for later reviews: implemented by the handler.
pub trait Reuse: Send + Sync + 'static {
    /// Whether the kept answer still holds: every input the handler read besides the review is
    /// as it was (the same cached objects, a time window not yet past). Called before each
    /// reuse; an answer that no longer holds is dropped.
    fn holds(&self) -> bool;

    /// A review is answered with the kept answer: do what the handler does for each review
    /// (count it, trace it), and return the operations this review's patch carries after the
    /// kept patch (see [`Reusable::new`]).
    fn reused(&self, review: &ReusedReview<'_>) -> Vec<PatchOperation>;
}

/// The review a kept answer is reused for.
#[derive(Clone, Copy, Debug)]
pub struct ReusedReview<'a> {
    /// The review's uid.
    pub uid: &'a str,
    /// The object's namespace.
    pub namespace: Option<&'a str>,
    /// The object's name (empty for `generateName`).
    pub name: &'a str,
    /// Whether nothing will be persisted.
    pub dry_run: bool,
    /// The object as sent.
    pub object: &'a Value,
}

/// A handler's offer to have its answer reused: see the [module](self) documentation.
#[derive(Clone)]
pub struct Reusable {
    pub(crate) reuse: Arc<dyn Reuse>,
    pub(crate) per_review: Vec<PatchOperation>,
}

impl Reusable {
    /// `reuse` decides whether the answer still holds; `per_review` are the operations this
    /// review's patch carries after the patch of the returned object (those of a reused
    /// answer come from [`Reuse::reused`]). They are applied to the object the kept patch
    /// makes, so they may address what it adds.
    pub fn new(reuse: Arc<dyn Reuse>, per_review: Vec<PatchOperation>) -> Self {
        Self { reuse, per_review }
    }
}

impl fmt::Debug for Reusable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reusable")
            .field("per_review", &self.per_review)
            .finish_non_exhaustive()
    }
}

impl PartialEq for Reusable {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.reuse, &other.reuse) && self.per_review == other.per_review
    }
}

/// What a review must match for a kept answer: everything the handler is given but the uid.
#[derive(Debug, PartialEq)]
pub(crate) struct ReviewKey {
    /// Set when the answer is looked for or kept.
    hash: Option<u64>,
    kind: GroupVersionKind,
    resource: GroupVersionResource,
    sub_resource: Option<String>,
    namespace: Option<String>,
    name: String,
    user_info: UserInfo,
    dry_run: bool,
}

impl ReviewKey {
    fn matches(&self, request: &AdmissionRequest<DynamicObject>) -> bool {
        self.kind == request.kind
            && self.resource == request.resource
            && self.sub_resource == request.sub_resource
            && self.namespace == request.namespace
            && self.name == request.name
            && self.user_info == request.user_info
            && self.dry_run == request.dry_run
    }
}

/// The prefix of the service account token volume's name (see the module documentation).
pub const TOKEN_VOLUME_PREFIX: &str = "kube-api-access-";

/// The name of `object`'s service account token volume, when it is a pod with exactly one
/// volume named so.
fn token_volume<'a>(kind: &GroupVersionKind, object: &'a Value) -> Option<&'a str> {
    if !(kind.group.is_empty() && kind.version == "v1" && kind.kind == "Pod") {
        return None;
    }
    let volumes = object.pointer("/spec/volumes")?.as_array()?;
    let mut names = volumes
        .iter()
        .filter_map(|v| v.get("name")?.as_str())
        .filter(|n| n.starts_with(TOKEN_VOLUME_PREFIX));
    let name = names.next()?;
    names.next().is_none().then_some(name)
}

/// Where a value sits in a reviewed object, for the one member compared loosely: the `time` of
/// each `metadata.managedFields` entry (see the module documentation).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Root,
    Metadata,
    ManagedFields,
    ManagedEntry,
    /// Anywhere else: compared in full.
    Other,
}

impl Place {
    /// The place of the member `name` of an object here.
    fn member(self, name: &str) -> Place {
        match (self, name) {
            (Place::Root, "metadata") => Place::Metadata,
            (Place::Metadata, "managedFields") => Place::ManagedFields,
            _ => Place::Other,
        }
    }

    /// The place of an element of an array here.
    fn element(self) -> Place {
        if self == Place::ManagedFields {
            Place::ManagedEntry
        } else {
            Place::Other
        }
    }

    /// Whether the member `name` of an object here is left out of comparisons.
    fn skips(self, name: &str) -> bool {
        self == Place::ManagedEntry && name == MANAGED_FIELDS_TIME
    }

    /// How many members of `members` are compared here.
    fn compared(self, members: &serde_json::Map<String, Value>) -> usize {
        if self == Place::ManagedEntry {
            members.keys().filter(|name| !self.skips(name)).count()
        } else {
            members.len()
        }
    }
}

/// The member of a `managedFields` entry the API server sets to the second of each request.
const MANAGED_FIELDS_TIME: &str = "time";

/// Whether the text of a JSON patch may write or copy `managedFields`: a path into it, to the
/// whole `metadata`, or to the whole object. Read from the text, so a string value that looks
/// like such a path counts too (the answer is then not kept, which is safe).
fn writes_managed_fields(patch: &[u8]) -> bool {
    const PATTERNS: [&[u8]; 4] = [
        b"\"/metadata/managedFields",
        b"\"/metadata\"",
        b"\"path\":\"\"",
        b"\"from\":\"\"",
    ];
    PATTERNS
        .iter()
        .any(|pattern| patch.windows(pattern.len()).any(|w| w == *pattern))
}

/// Whether the objects `kept` and `sent` are equal with the string `a` of `kept` standing for
/// `b` of `sent` (and neither appearing elsewhere), and the times of their `managedFields`
/// entries left out.
fn equivalent(kept: &Value, sent: &Value, names: Option<(&str, &str)>) -> bool {
    equivalent_at(kept, sent, names, Place::Root)
}

fn equivalent_at(kept: &Value, sent: &Value, names: Option<(&str, &str)>, at: Place) -> bool {
    if at == Place::Other && names.is_none() {
        return kept == sent;
    }
    match (kept, sent) {
        (Value::String(x), Value::String(y)) => match names {
            Some((a, b)) if x == a || y == b => x == a && y == b,
            _ => x == y,
        },
        (Value::Array(xs), Value::Array(ys)) => {
            xs.len() == ys.len()
                && xs
                    .iter()
                    .zip(ys)
                    .all(|(x, y)| equivalent_at(x, y, names, at.element()))
        }
        (Value::Object(xs), Value::Object(ys)) => {
            at.compared(xs) == at.compared(ys)
                && xs.iter().filter(|(k, _)| !at.skips(k)).all(|(k, x)| {
                    ys.get(k)
                        .is_some_and(|y| equivalent_at(x, y, names, at.member(k)))
                })
        }
        _ => kept == sent,
    }
}

/// The token volume names to map between a kept object and another (see [`equivalent`]);
/// `None` inside when neither has one, `None` outside when only one has.
fn token_pair<'a>(
    kept: Option<&'a str>,
    sent: Option<&'a str>,
) -> Option<Option<(&'a str, &'a str)>> {
    match (kept, sent) {
        (Some(a), Some(b)) => Some(Some((a, b))),
        (None, None) => Some(None),
        _ => None,
    }
}

/// One kept answer.
struct Kept {
    key: ReviewKey,
    object: Value,
    /// `object`'s service account token volume name, if any.
    token: Option<String>,
    /// The kept patch: a JSON array of operations.
    patch: Vec<u8>,
    warnings: Vec<String>,
    reuse: Arc<dyn Reuse>,
    bytes: usize,
}

#[derive(Default)]
struct Table {
    by_hash: HashMap<u64, Vec<Arc<Kept>>>,
    /// Oldest first.
    order: VecDeque<Arc<Kept>>,
    bytes: usize,
}

impl Table {
    fn remove(&mut self, kept: &Arc<Kept>) {
        let hash = kept.key.hash.unwrap_or_default();
        if let Some(list) = self.by_hash.get_mut(&hash) {
            list.retain(|k| !Arc::ptr_eq(k, kept));
            if list.is_empty() {
                self.by_hash.remove(&hash);
            }
        }
        let before = self.order.len();
        self.order.retain(|k| !Arc::ptr_eq(k, kept));
        if self.order.len() < before {
            self.bytes = self.bytes.saturating_sub(kept.bytes);
        }
    }
}

/// A route's kept answers.
pub(crate) struct KeptAnswers {
    hasher: RandomState,
    table: Mutex<Table>,
}

fn lock(table: &Mutex<Table>) -> MutexGuard<'_, Table> {
    match table.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

impl KeptAnswers {
    pub(crate) fn new() -> Self {
        Self {
            hasher: RandomState::new(),
            table: Mutex::new(Table::default()),
        }
    }

    /// The key of `review`, when an answer to it may be kept: a `CREATE` with an object and
    /// without `oldObject`. Its hash is computed when it is kept.
    pub(crate) fn key(&self, review: &Review) -> Option<ReviewKey> {
        let request = &review.request;
        if review.raw.object.is_none()
            || request.operation != Operation::Create
            || review.raw.old_object.is_some()
        {
            return None;
        }
        Some(ReviewKey {
            hash: None,
            kind: request.kind.clone(),
            resource: request.resource.clone(),
            sub_resource: request.sub_resource.clone(),
            namespace: request.namespace.clone(),
            name: request.name.clone(),
            user_info: request.user_info.clone(),
            dry_run: request.dry_run,
        })
    }

    /// The answer to `review` (whose key is `key`) from a kept one that still holds, if there
    /// is one.
    pub(crate) fn answer(&self, review: &Review, key: &mut ReviewKey) -> Option<AdmissionResponse> {
        if lock(&self.table).order.is_empty() {
            return None;
        }
        let object = review.raw.object.as_ref()?;
        let token = token_volume(&key.kind, object);
        let hash = self.hash(key, object, token);
        key.hash = Some(hash);
        let candidates = lock(&self.table).by_hash.get(&hash).cloned()?;
        // The newest first.
        for kept in candidates.iter().rev() {
            let Some(names) = token_pair(kept.token.as_deref(), token) else {
                continue;
            };
            if !kept.key.matches(&review.request) || !equivalent(&kept.object, object, names) {
                continue;
            }
            if !kept.reuse.holds() {
                lock(&self.table).remove(kept);
                continue;
            }
            let request = &review.request;
            let per_review = kept.reuse.reused(&ReusedReview {
                uid: &request.uid,
                namespace: request.namespace.as_deref(),
                name: &request.name,
                dry_run: request.dry_run,
                object,
            });
            let base = AdmissionResponse::from(request);
            let patch = joined_patch(&kept.patch, &per_review)?;
            // An empty patch is sent as none, as the handler's answer was.
            let mut response = if patch == b"[]" {
                base
            } else {
                patched(base, patch)?
            };
            if !kept.warnings.is_empty() {
                response.warnings = Some(kept.warnings.clone());
            }
            return Some(response);
        }
        None
    }

    /// Keeps the answer to the review of `key` and `object`: `patch` (the JSON of the
    /// operations for the returned object) and `warnings`, valid while `reuse` holds.
    pub(crate) fn keep(
        &self,
        mut key: ReviewKey,
        object: Value,
        patch: Vec<u8>,
        warnings: Vec<String>,
        reuse: Arc<dyn Reuse>,
    ) {
        let bytes = estimated_bytes(&object)
            .saturating_add(patch.len())
            .saturating_add(warnings.iter().map(String::len).sum());
        if bytes > KEPT_ANSWER_BYTES {
            return;
        }
        let token = token_volume(&key.kind, &object).map(str::to_owned);
        if let Some(name) = &token
            && patch.windows(name.len()).any(|w| w == name.as_bytes())
        {
            // The patch names this pod's own token volume: not another pod's answer.
            return;
        }
        if writes_managed_fields(&patch) {
            // The patch may write managedFields, whose times are not compared.
            return;
        }
        let hash = match key.hash {
            Some(hash) => hash,
            None => self.hash(&key, &object, token.as_deref()),
        };
        key.hash = Some(hash);
        let kept = Arc::new(Kept {
            key,
            object,
            token,
            patch,
            warnings,
            reuse,
            bytes,
        });
        let mut table = lock(&self.table);
        // An answer to an equal review (a concurrent one that was not found kept) is replaced.
        let equal: Vec<Arc<Kept>> = table
            .by_hash
            .get(&hash)
            .into_iter()
            .flatten()
            .filter(|k| {
                k.key == kept.key
                    && token_pair(k.token.as_deref(), kept.token.as_deref())
                        .is_some_and(|names| equivalent(&k.object, &kept.object, names))
            })
            .cloned()
            .collect();
        for old in &equal {
            table.remove(old);
        }
        table.bytes = table.bytes.saturating_add(bytes);
        table.order.push_back(Arc::clone(&kept));
        table.by_hash.entry(hash).or_default().push(kept);
        while table.order.len() > KEPT_ANSWERS || table.bytes > KEPT_BYTES {
            let Some(oldest) = table.order.front().cloned() else {
                break;
            };
            table.remove(&oldest);
        }
    }

    /// The hash of a review of `object`, its token volume's name (`token`) hashed as if
    /// empty.
    fn hash(&self, key: &ReviewKey, object: &Value, token: Option<&str>) -> u64 {
        let mut hasher = self.hasher.build_hasher();
        key.namespace.hash(&mut hasher);
        key.name.hash(&mut hasher);
        hash_value(object, token, Place::Root, &mut hasher);
        hasher.finish()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.table).order.len()
    }
}

/// `response` carrying the JSON patch `patch` (an array of operations), as
/// [`AdmissionResponse::with_patch`] makes it.
pub(crate) fn patched(response: AdmissionResponse, patch: Vec<u8>) -> Option<AdmissionResponse> {
    // `with_patch` is the only way to set the patch type; the empty patch's text is replaced.
    let mut response = response.with_patch(json_patch::Patch(Vec::new())).ok()?;
    response.patch = Some(patch);
    Some(response)
}

/// The JSON array of `patch`'s operations (as serde_json writes an array: `[...]`) followed by
/// `more`; `None` when `patch` is not such an array or `more` cannot be written.
pub(crate) fn joined_patch(patch: &[u8], more: &[PatchOperation]) -> Option<Vec<u8>> {
    if more.is_empty() {
        return Some(patch.to_vec());
    }
    let more = serde_json::to_vec(more).ok()?;
    let head = patch.strip_suffix(b"]")?;
    let tail = more.strip_prefix(b"[")?;
    let mut joined = Vec::with_capacity(patch.len() + more.len());
    joined.extend_from_slice(head);
    if head != b"[" {
        joined.push(b',');
    }
    joined.extend_from_slice(tail);
    Some(joined)
}

/// Hashes `value` so that equal values hash equally (object members in their order: values
/// equal with members in another order only miss).
fn hash_value(value: &Value, token: Option<&str>, at: Place, hasher: &mut impl Hasher) {
    match value {
        Value::Null => hasher.write_u8(0),
        Value::Bool(b) => {
            hasher.write_u8(1);
            b.hash(hasher);
        }
        Value::Number(n) => {
            hasher.write_u8(2);
            if let Some(u) = n.as_u64() {
                hasher.write_u64(u);
            } else if let Some(i) = n.as_i64() {
                hasher.write_i64(i);
            } else if let Some(f) = n.as_f64() {
                hasher.write_u64(f.to_bits());
            }
        }
        Value::String(s) if token == Some(s.as_str()) => hasher.write_u8(6),
        Value::String(s) => {
            hasher.write_u8(3);
            s.hash(hasher);
        }
        Value::Array(items) => {
            hasher.write_u8(4);
            hasher.write_usize(items.len());
            for item in items {
                hash_value(item, token, at.element(), hasher);
            }
        }
        Value::Object(members) => {
            hasher.write_u8(5);
            hasher.write_usize(at.compared(members));
            for (name, member) in members.iter().filter(|(name, _)| !at.skips(name)) {
                name.hash(hasher);
                hash_value(member, token, at.member(name), hasher);
            }
        }
    }
}

/// About how many bytes `value` takes in memory.
fn estimated_bytes(value: &Value) -> usize {
    const NODE: usize = 32;
    match value {
        Value::Null | Value::Bool(_) | Value::Number(_) => NODE,
        Value::String(s) => NODE + s.len(),
        Value::Array(items) => NODE + items.iter().map(estimated_bytes).sum::<usize>(),
        Value::Object(members) => {
            NODE + members
                .iter()
                .map(|(name, member)| NODE + name.len() + estimated_bytes(member))
                .sum::<usize>()
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use serde_json::json;

    struct Always;

    impl Reuse for Always {
        fn holds(&self) -> bool {
            true
        }

        fn reused(&self, _review: &ReusedReview<'_>) -> Vec<PatchOperation> {
            Vec::new()
        }
    }

    fn key() -> ReviewKey {
        ReviewKey {
            hash: None,
            kind: GroupVersionKind::gvk("", "v1", "Pod"),
            resource: GroupVersionResource::gvr("", "v1", "pods"),
            sub_resource: None,
            namespace: Some("team-a".into()),
            name: String::new(),
            user_info: UserInfo::default(),
            dry_run: false,
        }
    }

    #[test]
    fn per_review_operations_follow_the_kept_ones() {
        let more = vec![crate::patch::add(
            crate::patch::pointer(["metadata", "annotations", "t"]),
            json!("1"),
        )];
        let joined = joined_patch(br#"[{"op":"remove","path":"/a"}]"#, &more).unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&joined).unwrap(),
            json!([{"op": "remove", "path": "/a"},
                   {"op": "add", "path": "/metadata/annotations/t", "value": "1"}])
        );
        let alone = joined_patch(b"[]", &more).unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&alone).unwrap(),
            json!([{"op": "add", "path": "/metadata/annotations/t", "value": "1"}])
        );
        assert_eq!(joined_patch(b"[]", &[]).unwrap(), b"[]");
        assert!(joined_patch(b"{}", &more).is_none());
    }

    #[test]
    fn patches_that_may_write_managed_fields() {
        for patch in [
            r#"[{"op":"remove","path":"/metadata/managedFields"}]"#,
            r#"[{"op":"replace","path":"/metadata/managedFields/0/time","value":"t"}]"#,
            r#"[{"op":"add","path":"/metadata","value":{}}]"#,
            r#"[{"op":"replace","path":"","value":{}}]"#,
            r#"[{"op":"copy","from":"","path":"/spec/x"}]"#,
            r#"[{"op":"move","from":"/metadata/managedFields/0","path":"/spec/x"}]"#,
        ] {
            assert!(writes_managed_fields(patch.as_bytes()), "{patch}");
        }
        for patch in [
            "[]",
            r#"[{"op":"add","path":"/metadata/annotations/a","value":""}]"#,
            r#"[{"op":"add","path":"/metadata/labels","value":{"m":"/metadata/x"}}]"#,
        ] {
            assert!(!writes_managed_fields(patch.as_bytes()), "{patch}");
        }
    }

    #[test]
    fn an_answer_larger_than_the_bound_is_not_kept() {
        let answers = KeptAnswers::new();
        let keep = |object: Value| {
            answers.keep(key(), object, b"[]".to_vec(), Vec::new(), Arc::new(Always));
            answers.len()
        };
        assert_eq!(keep(json!({"data": "x".repeat(KEPT_ANSWER_BYTES)})), 0);
        assert_eq!(keep(json!({"data": "x"})), 1);
        // An equal review's answer replaces the kept one.
        assert_eq!(keep(json!({"data": "x"})), 1);
        let bytes = lock(&answers.table).bytes;
        assert!(bytes > 0 && bytes < 1024, "{bytes}");
    }

    #[test]
    fn equal_values_hash_equally_and_others_differ() {
        let answers = KeptAnswers::new();
        let a = json!({"spec": {"containers": [{"name": "e", "args": ["1", 2, 3.5, null, true]}]}});
        let b = serde_json::from_str::<Value>(&a.to_string()).unwrap();
        assert_eq!(
            answers.hash(&key(), &a, None),
            answers.hash(&key(), &b, None)
        );
        let c =
            json!({"spec": {"containers": [{"name": "e", "args": ["1", 2, 3.5, null, false]}]}});
        assert_ne!(
            answers.hash(&key(), &a, None),
            answers.hash(&key(), &c, None)
        );
        // The times of managedFields entries are left out, and nothing else.
        let at = |time: &str, manager: &str| {
            json!({"metadata": {"managedFields": [{"manager": manager, "time": time}]},
                   "spec": {"time": time}})
        };
        let (t0, t1) = ("2026-12-07T08:00:00Z", "2026-12-07T08:00:01Z");
        let mut spec_t0 = at(t1, "m");
        spec_t0["spec"]["time"] = json!(t0);
        assert_eq!(
            answers.hash(&key(), &at(t0, "m"), None),
            answers.hash(&key(), &spec_t0, None)
        );
        assert!(equivalent(&at(t0, "m"), &spec_t0, None));
        assert!(!equivalent(&at(t0, "m"), &at(t1, "m"), None), "spec.time");
        assert!(!equivalent(&at(t0, "m"), &at(t0, "n"), None), "the manager");
        let mut untimed = at(t0, "m");
        untimed["metadata"]["managedFields"][0]
            .as_object_mut()
            .unwrap()
            .remove("time");
        assert!(equivalent(&at(t0, "m"), &untimed, None), "no time at all");
        assert_eq!(
            answers.hash(&key(), &at(t0, "m"), None),
            answers.hash(&key(), &untimed, None)
        );
        // Strings are delimited: ["ab", "c"] is not ["a", "bc"].
        assert_ne!(
            answers.hash(&key(), &json!(["ab", "c"]), None),
            answers.hash(&key(), &json!(["a", "bc"]), None)
        );
    }
}
