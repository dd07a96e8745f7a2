//! The top-level controller of an object (usually a pod): the "request" of a model-cache binding.
//!
//! The walk follows *controller* ownerReferences (`controller: true`) only: Pod -> ReplicaSet ->
//! Deployment, Pod -> StatefulSet, a LeaderWorkerSet worker pod -> worker StatefulSet -> leader
//! pod -> leader StatefulSet -> LeaderWorkerSet, Pod -> Job -> CronJob, and any other kind
//! generally: owners are read with dynamic metadata-only GETs whose plural and scope come from
//! API discovery.
//!
//! # Rules
//!
//! - An object without a controller reference is its own top level (a bare pod is the request).
//! - A reference is stale when the object it names is NotFound, has another UID, or is of a kind
//!   the API server does not serve (the seeds' rule). The walk then stops at the last object that
//!   exists, which becomes the top level; [`Resolution::stop`] says why. Such an answer is
//!   definitive ([`Resolution::is_definitive`]).
//! - A GET (or discovery) answered 401/403 also stops the walk at the last object read, reported
//!   as [`Stop::Forbidden`] in an `Ok` resolution: missing RBAC must not block the caller (for
//!   example an admission webhook), but the answer may be lower than the true top, so it is not
//!   definitive. The caller decides whether to use it, log it or refuse.
//! - At most [`MAX_DEPTH`] owner GETs per resolution (configurable): the deepest real chain
//!   (LeaderWorkerSet worker pod) needs 4. A longer chain stops at the last object read with
//!   [`Stop::DepthLimit`]; a chain that comes back to an object already seen stops with
//!   [`Stop::Cycle`].
//! - Any other failure (5xx, timeout, connection, undecodable answer) is an [`OwnerError`]: the
//!   answer would be a guess, so the caller retries.
//!
//! # Cache
//!
//! Owners read are cached by UID for a TTL (default 60 s) in a bounded map (default 4096
//! entries; when full, expired entries are dropped, then the oldest). A UID never names another
//! object, so the only staleness, bounded by the TTL, is a changed controller reference
//! (adoption, orphaning) or an owner deleted since it was read (a caller that must prove a
//! reference stale, like the reaper, should use a resolver with a zero TTL or GET it itself). Sibling pods share their owners' entries: resolving the second pod of a
//! ReplicaSet costs no GET. Missing owners are not cached. Discovery answers (kind -> plural and
//! scope) are cached per apiVersion+kind the same way (default TTL 10 min, 256 entries).
//!
//! RBAC: `get` on every kind that can control a pod in the cluster (replicasets, deployments,
//! statefulsets, jobs, cronjobs, leaderworkersets, ...); discovery is open to authenticated users.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::discovery::Scope;
use kube::{Client, Resource};
use serde::{Deserialize, Serialize};
use tracing::{debug, instrument};

use crate::error::{ErrorCategory, category};

/// Default maximum number of owner GETs in one resolution.
pub const MAX_DEPTH: usize = 8;
/// Default time an owner read stays cached.
pub const DEFAULT_TTL: Duration = Duration::from_secs(60);
/// Default maximum number of cached owners.
pub const DEFAULT_CAPACITY: usize = 4096;
/// How long a discovery answer stays cached.
const KIND_TTL: Duration = Duration::from_secs(600);
/// Maximum number of cached discovery answers.
const KIND_CAPACITY: usize = 256;

/// One object in an ownership chain, and the result of a resolution.
///
/// Serializes as `{apiVersion, kind, namespace, name, uid}`; `namespace` is omitted for a
/// cluster-scoped object. For a start object not stored yet (a pod in a CREATE admission
/// request), `uid` and even `name` may be empty.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub struct TopLevelOwner {
    /// API version, for example `apps/v1`.
    pub api_version: String,
    /// Kind, for example `Deployment`.
    pub kind: String,
    /// Namespace; `None` for a cluster-scoped object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

impl TopLevelOwner {
    /// The identity of an object of type `K` from its metadata.
    pub fn of<K: Resource<DynamicType = ()>>(obj: &K) -> Self {
        Self::from_meta(&K::api_version(&()), &K::kind(&()), obj.meta())
    }

    /// The identity of an object of the given apiVersion and kind from its metadata.
    pub fn from_meta(api_version: &str, kind: &str, meta: &ObjectMeta) -> Self {
        Self {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            namespace: meta.namespace.clone(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
        }
    }
}

/// An object as the walk sees it: who it is and who controls it.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The object.
    pub identity: TopLevelOwner,
    /// Its controller reference, if any (see [`controller_reference`]).
    pub controller: Option<OwnerReference>,
}

impl Node {
    /// A node from an object's apiVersion, kind and metadata.
    pub fn from_meta(api_version: &str, kind: &str, meta: &ObjectMeta) -> Self {
        Self {
            identity: TopLevelOwner::from_meta(api_version, kind, meta),
            controller: controller_reference(meta).cloned(),
        }
    }
}

/// The controller reference of an object: its first ownerReference with `controller: true`
/// (the API server allows at most one).
pub fn controller_reference(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// What looking up an owner reference found.
#[derive(Clone, Debug, PartialEq)]
#[allow(
    clippy::large_enum_variant,
    reason = "short-lived, moved once per step; boxing would only add an allocation"
)]
pub enum Lookup {
    /// The object named by the reference's apiVersion, kind, namespace and name.
    Found(Node),
    /// 404: no object of that name.
    NotFound,
    /// The API server does not serve that apiVersion and kind.
    UnknownKind,
    /// 401/403 on the GET or on discovery.
    Forbidden,
}

/// Why a walk ended before reaching an object without a controller reference.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Stop {
    /// The controller named by `reference` does not exist (stale reference; definitive).
    OwnerNotFound {
        /// The reference that was not followed.
        reference: OwnerReference,
    },
    /// The API server does not serve the reference's kind, so the owner cannot exist
    /// (definitive).
    UnknownKind {
        /// The reference that was not followed.
        reference: OwnerReference,
    },
    /// An object of that name exists but has another UID: the owner was recreated (stale
    /// reference; definitive).
    UidMismatch {
        /// The reference that was not followed.
        reference: OwnerReference,
        /// The UID of the object found under that name.
        found_uid: String,
    },
    /// Reading the owner was refused (RBAC). The true top level may be higher.
    Forbidden {
        /// The reference that could not be followed.
        reference: OwnerReference,
    },
    /// The maximum number of GETs was reached with a controller reference still to follow.
    DepthLimit {
        /// The reference that was not followed.
        reference: OwnerReference,
        /// The bound that was hit.
        max_depth: usize,
    },
    /// The reference points back at an object already in the chain.
    Cycle {
        /// The reference that was not followed.
        reference: OwnerReference,
    },
    /// The reference cannot be looked up: empty name, kind or UID, a malformed apiVersion, or
    /// a namespaced owner of a cluster-scoped object.
    InvalidReference {
        /// The reference that was not followed.
        reference: OwnerReference,
    },
}

impl Stop {
    /// The reference that was not followed.
    pub fn reference(&self) -> &OwnerReference {
        match self {
            Self::OwnerNotFound { reference }
            | Self::UnknownKind { reference }
            | Self::UidMismatch { reference, .. }
            | Self::Forbidden { reference }
            | Self::DepthLimit { reference, .. }
            | Self::Cycle { reference }
            | Self::InvalidReference { reference } => reference,
        }
    }

    /// True when the stop follows the stale-reference rule, so the top level found is the right
    /// answer (NotFound, other UID, unknown kind, invalid reference).
    pub fn is_definitive(&self) -> bool {
        matches!(
            self,
            Self::OwnerNotFound { .. }
                | Self::UnknownKind { .. }
                | Self::UidMismatch { .. }
                | Self::InvalidReference { .. }
        )
    }
}

/// The answer of a resolution.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolution {
    /// The top-level controller (or the start object itself).
    pub top: TopLevelOwner,
    /// Every object of the chain, from the start object to `top`.
    pub chain: Vec<TopLevelOwner>,
    /// Why the walk ended early; `None` when `top` has no controller reference.
    pub stop: Option<Stop>,
    /// Owner GETs this resolution made (cache hits and discovery requests excluded).
    pub gets: usize,
}

impl Resolution {
    /// True when `top` is the answer the stale-reference rule gives: the walk reached an object
    /// without controller, or stopped at a stale reference. False after [`Stop::Forbidden`],
    /// [`Stop::DepthLimit`] or [`Stop::Cycle`].
    pub fn is_definitive(&self) -> bool {
        self.stop.as_ref().is_none_or(Stop::is_definitive)
    }
}

/// The pure core of a resolution: which reference to look up next, and what a lookup means.
///
/// Drive it with [`Walk::next_reference`] and [`Walk::observe`] until `next_reference` is
/// `None`, then take [`Walk::finish`]. It makes no API calls.
#[derive(Clone, Debug)]
pub struct Walk {
    /// The objects read before `current`, from the start object up.
    below: Vec<TopLevelOwner>,
    current: TopLevelOwner,
    pending: Option<OwnerReference>,
    stop: Option<Stop>,
    lookups: usize,
    max_depth: usize,
}

impl Walk {
    /// A walk from `start`, following at most `max_depth` references.
    pub fn new(start: Node, max_depth: usize) -> Self {
        let mut walk = Self {
            below: Vec::new(),
            current: start.identity,
            pending: None,
            stop: None,
            lookups: 0,
            max_depth,
        };
        walk.follow(start.controller);
        walk
    }

    /// The reference to look up next, or `None` when the walk is over.
    pub fn next_reference(&self) -> Option<&OwnerReference> {
        self.pending.as_ref()
    }

    /// The object whose controller is looked up next (the last object of the chain).
    pub fn current(&self) -> &TopLevelOwner {
        &self.current
    }

    /// Records what looking up [`next_reference`](Self::next_reference) found. Ignored when the
    /// walk is over.
    pub fn observe(&mut self, lookup: Lookup) {
        let Some(reference) = self.pending.take() else {
            return;
        };
        self.lookups += 1;
        match lookup {
            Lookup::NotFound => self.stop = Some(Stop::OwnerNotFound { reference }),
            Lookup::UnknownKind => self.stop = Some(Stop::UnknownKind { reference }),
            Lookup::Forbidden => self.stop = Some(Stop::Forbidden { reference }),
            Lookup::Found(node) if node.identity.uid != reference.uid => {
                self.stop = Some(Stop::UidMismatch {
                    reference,
                    found_uid: node.identity.uid,
                });
            }
            Lookup::Found(node) => {
                let previous = std::mem::replace(&mut self.current, node.identity);
                self.below.push(previous);
                self.follow(node.controller);
            }
        }
    }

    /// Records that the next reference cannot be looked up (see [`Stop::InvalidReference`]).
    pub fn reject(&mut self) {
        if let Some(reference) = self.pending.take() {
            self.stop = Some(Stop::InvalidReference { reference });
        }
    }

    fn follow(&mut self, controller: Option<OwnerReference>) {
        let Some(reference) = controller else {
            return;
        };
        if reference.uid.is_empty()
            || reference.name.is_empty()
            || reference.kind.is_empty()
            || parse_api_version(&reference.api_version).is_none()
        {
            self.stop = Some(Stop::InvalidReference { reference });
        } else if self.current.uid == reference.uid
            || self.below.iter().any(|o| o.uid == reference.uid)
        {
            self.stop = Some(Stop::Cycle { reference });
        } else if self.lookups >= self.max_depth {
            self.stop = Some(Stop::DepthLimit {
                reference,
                max_depth: self.max_depth,
            });
        } else {
            self.pending = Some(reference);
        }
    }

    /// The resolution: the last object of the chain is the top level. `gets` is left at 0 for
    /// the caller to fill in.
    pub fn finish(self) -> Resolution {
        let mut chain = self.below;
        chain.push(self.current.clone());
        Resolution {
            top: self.current,
            chain,
            stop: self.stop,
            gets: 0,
        }
    }
}

/// `(group, version)` of an apiVersion (`v1`, `apps/v1`), or `None` when malformed.
fn parse_api_version(api_version: &str) -> Option<(&str, &str)> {
    let (group, version) = match api_version.split_once('/') {
        Some((group, version)) if !group.is_empty() => (group, version),
        Some(_) => return None,
        None => ("", api_version),
    };
    (!version.is_empty() && !version.contains('/')).then_some((group, version))
}

/// A failure that makes the resolution unknown (not RBAC, not a stale reference): retry later.
#[derive(Debug, thiserror::Error)]
#[error("{verb} of {kind} {name:?} (controller of {dependent}) failed ({category})")]
pub struct OwnerError {
    /// `discover` or `get`.
    pub verb: &'static str,
    /// apiVersion/kind of the owner reference.
    pub kind: String,
    /// Name in the owner reference.
    pub name: String,
    /// `Kind namespace/name` of the object whose controller was looked up.
    pub dependent: String,
    /// Classification of `source`.
    pub category: ErrorCategory,
    /// The API error.
    #[source]
    pub source: Box<kube::Error>,
}

impl OwnerError {
    /// The stable class of this error.
    pub fn category(&self) -> ErrorCategory {
        self.category
    }
}

/// A bounded map whose entries expire: when full, expired entries go first, then the oldest.
#[derive(Debug)]
struct TtlCache<K, V> {
    entries: HashMap<K, (Instant, V)>,
    ttl: Duration,
    capacity: usize,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    fn new(ttl: Duration, capacity: usize) -> Self {
        Self {
            entries: HashMap::new(),
            ttl,
            capacity: capacity.max(1),
        }
    }

    fn get(&mut self, key: &K, now: Instant) -> Option<V> {
        match self.entries.get(key) {
            Some((at, v)) if now.saturating_duration_since(*at) < self.ttl => Some(v.clone()),
            Some(_) => {
                self.entries.remove(key);
                None
            }
            None => None,
        }
    }

    fn insert(&mut self, key: K, value: V, now: Instant) {
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            let ttl = self.ttl;
            self.entries
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < ttl);
            if self.entries.len() >= self.capacity {
                let oldest = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (at, _))| *at)
                    .map(|(k, _)| k.clone());
                if let Some(oldest) = oldest {
                    self.entries.remove(&oldest);
                }
            }
        }
        self.entries.insert(key, (now, value));
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Resolves top-level controllers with dynamic GETs, a bounded owner cache and a bounded
/// discovery cache. Share one per component (behind an `Arc`); the caches are internally locked.
pub struct OwnerResolver {
    client: Client,
    max_depth: usize,
    owners: Mutex<TtlCache<String, Node>>,
    kinds: Mutex<TtlCache<(String, String), (ApiResource, Scope)>>,
}

impl std::fmt::Debug for OwnerResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnerResolver")
            .field("max_depth", &self.max_depth)
            .finish_non_exhaustive()
    }
}

/// Outcome of reading one owner: what the walk needs, and whether a GET was made.
#[allow(
    clippy::large_enum_variant,
    reason = "short-lived, moved once per step; boxing would only add an allocation"
)]
enum Read {
    Lookup(Lookup, bool),
    Invalid,
}

impl OwnerResolver {
    /// A resolver with [`MAX_DEPTH`], [`DEFAULT_TTL`] and [`DEFAULT_CAPACITY`].
    pub fn new(client: Client) -> Self {
        Self::with_limits(client, MAX_DEPTH, DEFAULT_TTL, DEFAULT_CAPACITY)
    }

    /// A resolver making at most `max_depth` owner GETs per resolution and caching up to
    /// `capacity` owners for `ttl` (a zero TTL disables the cache).
    pub fn with_limits(client: Client, max_depth: usize, ttl: Duration, capacity: usize) -> Self {
        Self {
            client,
            max_depth,
            owners: Mutex::new(TtlCache::new(ttl, capacity)),
            kinds: Mutex::new(TtlCache::new(KIND_TTL, KIND_CAPACITY)),
        }
    }

    /// Number of owners currently cached.
    pub fn cached_owners(&self) -> usize {
        self.owners.lock().map(|c| c.len()).unwrap_or(0)
    }

    /// The top-level controller of `obj` (see the module docs for the rules).
    pub async fn resolve<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
    ) -> Result<Resolution, OwnerError> {
        self.resolve_node(Node::from_meta(
            &K::api_version(&()),
            &K::kind(&()),
            obj.meta(),
        ))
        .await
    }

    /// The top-level controller of the object `start` describes.
    #[instrument(skip_all, fields(kind = %start.identity.kind, namespace = ?start.identity.namespace, name = %start.identity.name))]
    pub async fn resolve_node(&self, start: Node) -> Result<Resolution, OwnerError> {
        let mut walk = Walk::new(start, self.max_depth);
        let mut gets = 0;
        while let Some(reference) = walk.next_reference().cloned() {
            let namespace = walk.current().namespace.clone();
            match self
                .read(&reference, namespace.as_deref(), walk.current())
                .await?
            {
                Read::Invalid => walk.reject(),
                Read::Lookup(lookup, did_get) => {
                    gets += usize::from(did_get);
                    walk.observe(lookup);
                }
            }
        }
        let mut resolution = walk.finish();
        resolution.gets = gets;
        if let Some(stop) = &resolution.stop {
            debug!(?stop, top = ?resolution.top, "owner walk stopped early");
        }
        Ok(resolution)
    }

    async fn read(
        &self,
        reference: &OwnerReference,
        namespace: Option<&str>,
        dependent: &TopLevelOwner,
    ) -> Result<Read, OwnerError> {
        let now = Instant::now();
        // A cached owner answers only the lookup that would have found it: same name, kind and
        // apiVersion, and (for a namespaced owner) the dependent's namespace. A uid copied into
        // a reference in another namespace must not borrow an owner it could not read.
        if let Ok(mut owners) = self.owners.lock()
            && let Some(node) = owners.get(&reference.uid, now)
            && node.identity.name == reference.name
            && node.identity.kind == reference.kind
            && node.identity.api_version == reference.api_version
            && node
                .identity
                .namespace
                .as_deref()
                .is_none_or(|ns| Some(ns) == namespace)
        {
            return Ok(Read::Lookup(Lookup::Found(node), false));
        }
        let fail = |verb, source: kube::Error| OwnerError {
            verb,
            kind: format!("{}/{}", reference.api_version, reference.kind),
            name: reference.name.clone(),
            dependent: format!(
                "{} {}/{}",
                dependent.kind,
                dependent.namespace.as_deref().unwrap_or(""),
                dependent.name
            ),
            category: category(&source),
            source: Box::new(source),
        };

        let (resource, scope) = match self.discover(reference).await {
            Ok(Some(found)) => found,
            Ok(None) => return Ok(Read::Lookup(Lookup::UnknownKind, false)),
            Err(e) => match category(&e) {
                ErrorCategory::Forbidden => return Ok(Read::Lookup(Lookup::Forbidden, false)),
                _ => return Err(fail("discover", e)),
            },
        };
        let api = match (scope, namespace) {
            (Scope::Cluster, _) => {
                kube::Api::<DynamicObject>::all_with(self.client.clone(), &resource)
            }
            (Scope::Namespaced, Some(ns)) => {
                kube::Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &resource)
            }
            (Scope::Namespaced, None) => return Ok(Read::Invalid),
        };
        match api.get_metadata(&reference.name).await {
            Ok(found) => {
                let node =
                    Node::from_meta(&reference.api_version, &reference.kind, &found.metadata);
                if let Ok(mut owners) = self.owners.lock()
                    && !node.identity.uid.is_empty()
                {
                    owners.insert(node.identity.uid.clone(), node.clone(), Instant::now());
                }
                Ok(Read::Lookup(Lookup::Found(node), true))
            }
            Err(e) => match category(&e) {
                ErrorCategory::NotFound => Ok(Read::Lookup(Lookup::NotFound, true)),
                ErrorCategory::Forbidden => Ok(Read::Lookup(Lookup::Forbidden, true)),
                _ => Err(fail("get", e)),
            },
        }
    }

    /// Plural and scope of the reference's kind; `None` when the API server does not serve it.
    async fn discover(
        &self,
        reference: &OwnerReference,
    ) -> Result<Option<(ApiResource, Scope)>, kube::Error> {
        let key = (reference.api_version.clone(), reference.kind.clone());
        if let Ok(mut kinds) = self.kinds.lock()
            && let Some(found) = kinds.get(&key, Instant::now())
        {
            return Ok(Some(found));
        }
        let Some((group, version)) = parse_api_version(&reference.api_version) else {
            return Ok(None);
        };
        let gvk = GroupVersionKind::gvk(group, version, &reference.kind);
        match kube::discovery::pinned_kind(&self.client, &gvk).await {
            Ok((resource, caps)) => {
                let found = (resource, caps.scope);
                if let Ok(mut kinds) = self.kinds.lock() {
                    kinds.insert(key, found.clone(), Instant::now());
                }
                Ok(Some(found))
            }
            Err(kube::Error::Discovery(_)) => Ok(None),
            Err(e) if category(&e) == ErrorCategory::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(api_version: &str, kind: &str, name: &str, uid: &str) -> TopLevelOwner {
        TopLevelOwner {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: Some("ns".into()),
            name: name.into(),
            uid: uid.into(),
        }
    }

    fn reference(o: &TopLevelOwner) -> OwnerReference {
        OwnerReference {
            api_version: o.api_version.clone(),
            kind: o.kind.clone(),
            name: o.name.clone(),
            uid: o.uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    fn node(o: &TopLevelOwner, controller: Option<&TopLevelOwner>) -> Node {
        Node {
            identity: o.clone(),
            controller: controller.map(reference),
        }
    }

    #[allow(dead_code, reason = "compile-time check only")]
    fn resolution_futures_are_send(
        resolver: &OwnerResolver,
        pod: &k8s_openapi::api::core::v1::Pod,
    ) {
        fn is_send<T: Send>(_: T) {}
        is_send(resolver.resolve(pod));
    }

    #[test]
    fn bare_object_is_its_own_top() {
        let pod = obj("v1", "Pod", "p", "u-p");
        let walk = Walk::new(node(&pod, None), MAX_DEPTH);
        assert!(walk.next_reference().is_none());
        let r = walk.finish();
        assert_eq!(r.top, pod);
        assert_eq!(r.chain, [pod]);
        assert!(r.stop.is_none());
        assert!(r.is_definitive());
    }

    #[test]
    fn follows_controller_references_to_the_top() {
        let pod = obj("v1", "Pod", "p", "u-p");
        let rs = obj("apps/v1", "ReplicaSet", "rs", "u-rs");
        let deploy = obj("apps/v1", "Deployment", "d", "u-d");
        let mut walk = Walk::new(node(&pod, Some(&rs)), MAX_DEPTH);
        assert_eq!(walk.next_reference(), Some(&reference(&rs)));
        walk.observe(Lookup::Found(node(&rs, Some(&deploy))));
        assert_eq!(walk.current(), &rs);
        walk.observe(Lookup::Found(node(&deploy, None)));
        assert!(walk.next_reference().is_none());
        let r = walk.finish();
        assert_eq!(r.top, deploy);
        assert_eq!(r.chain, [pod, rs, deploy]);
        assert!(r.is_definitive());
    }

    #[test]
    fn non_controller_references_are_not_followed() {
        let mut meta = ObjectMeta {
            owner_references: Some(vec![OwnerReference {
                controller: None,
                ..reference(&obj("v1", "ConfigMap", "c", "u-c"))
            }]),
            ..ObjectMeta::default()
        };
        assert!(controller_reference(&meta).is_none());
        let ctl = reference(&obj("apps/v1", "StatefulSet", "s", "u-s"));
        meta.owner_references
            .get_or_insert_with(Vec::new)
            .push(ctl.clone());
        assert_eq!(controller_reference(&meta), Some(&ctl));
        let n = Node::from_meta("v1", "Pod", &meta);
        assert_eq!(n.controller, Some(ctl));
    }

    #[test]
    fn stale_references_stop_at_the_last_object_that_exists() {
        let pod = obj("v1", "Pod", "p", "u-p");
        let rs = obj("apps/v1", "ReplicaSet", "rs", "u-rs");
        let deploy = obj("apps/v1", "Deployment", "d", "u-d");

        let mut walk = Walk::new(node(&pod, Some(&rs)), MAX_DEPTH);
        walk.observe(Lookup::Found(node(&rs, Some(&deploy))));
        walk.observe(Lookup::NotFound);
        let r = walk.finish();
        assert_eq!(r.top, rs);
        assert!(matches!(&r.stop, Some(Stop::OwnerNotFound { reference: x }) if x.uid == "u-d"));
        assert!(r.is_definitive());

        // Same name, another UID: the owner was recreated; the old reference is stale.
        let mut walk = Walk::new(node(&pod, Some(&rs)), MAX_DEPTH);
        let recreated = obj("apps/v1", "ReplicaSet", "rs", "u-other");
        walk.observe(Lookup::Found(node(&recreated, None)));
        let r = walk.finish();
        assert_eq!(r.top, pod);
        assert_eq!(r.chain, std::slice::from_ref(&pod));
        assert!(
            matches!(&r.stop, Some(Stop::UidMismatch { found_uid, .. }) if found_uid == "u-other")
        );
        assert!(r.is_definitive());

        let mut walk = Walk::new(node(&pod, Some(&rs)), MAX_DEPTH);
        walk.observe(Lookup::UnknownKind);
        let r = walk.finish();
        assert_eq!(r.top, pod);
        assert!(matches!(r.stop, Some(Stop::UnknownKind { .. })));
        assert!(r.is_definitive());
    }

    #[test]
    fn forbidden_stops_and_is_not_definitive() {
        let pod = obj("v1", "Pod", "p", "u-p");
        let rs = obj("apps/v1", "ReplicaSet", "rs", "u-rs");
        let mut walk = Walk::new(node(&pod, Some(&rs)), MAX_DEPTH);
        walk.observe(Lookup::Forbidden);
        assert!(walk.next_reference().is_none());
        let r = walk.finish();
        assert_eq!(r.top, pod);
        assert_eq!(r.stop.as_ref().map(Stop::reference), Some(&reference(&rs)));
        assert!(!r.is_definitive());
    }

    #[test]
    fn depth_is_bounded_and_cycles_stop() {
        let objs: Vec<_> = (0..12)
            .map(|i| obj("v1", "ConfigMap", &format!("c{i}"), &format!("u-{i}")))
            .collect();
        let mut walk = Walk::new(node(&objs[0], Some(&objs[1])), 3);
        let mut lookups = 0;
        while let Some(next) = walk.next_reference().cloned() {
            let i: usize = next.name[1..].parse().unwrap();
            lookups += 1;
            walk.observe(Lookup::Found(node(&objs[i], Some(&objs[i + 1]))));
        }
        assert_eq!(lookups, 3);
        let r = walk.finish();
        assert_eq!(r.top, objs[3]);
        assert!(
            matches!(&r.stop, Some(Stop::DepthLimit { reference, max_depth: 3 }) if reference.name == "c4")
        );
        assert!(!r.is_definitive());

        // c0 -> c1 -> c0
        let mut walk = Walk::new(node(&objs[0], Some(&objs[1])), MAX_DEPTH);
        walk.observe(Lookup::Found(node(&objs[1], Some(&objs[0]))));
        assert!(walk.next_reference().is_none());
        let r = walk.finish();
        assert_eq!(r.top, objs[1]);
        assert!(matches!(r.stop, Some(Stop::Cycle { .. })));

        // A depth of 0 never looks anything up.
        let walk = Walk::new(node(&objs[0], Some(&objs[1])), 0);
        assert!(walk.next_reference().is_none());
        assert!(matches!(walk.finish().stop, Some(Stop::DepthLimit { .. })));
    }

    #[test]
    fn malformed_references_are_invalid() {
        let pod = obj("v1", "Pod", "p", "u-p");
        for bad in [
            obj("", "ReplicaSet", "rs", "u"),
            obj("/v1", "ReplicaSet", "rs", "u"),
            obj("apps/", "ReplicaSet", "rs", "u"),
            obj("a/b/c", "ReplicaSet", "rs", "u"),
            obj("apps/v1", "", "rs", "u"),
            obj("apps/v1", "ReplicaSet", "", "u"),
            obj("apps/v1", "ReplicaSet", "rs", ""),
        ] {
            let walk = Walk::new(node(&pod, Some(&bad)), MAX_DEPTH);
            assert!(walk.next_reference().is_none(), "{bad:?}");
            let r = walk.finish();
            assert!(
                matches!(r.stop, Some(Stop::InvalidReference { .. })),
                "{bad:?}"
            );
            assert_eq!(r.top, pod);
        }
        let rs = obj("apps/v1", "ReplicaSet", "rs", "u-rs");
        let mut walk = Walk::new(node(&pod, Some(&rs)), MAX_DEPTH);
        walk.reject();
        assert!(matches!(
            walk.finish().stop,
            Some(Stop::InvalidReference { .. })
        ));
        assert_eq!(parse_api_version("v1"), Some(("", "v1")));
        assert_eq!(parse_api_version("apps/v1"), Some(("apps", "v1")));
    }

    #[test]
    fn serializes_with_camel_case_keys() {
        let json = serde_json::to_value(obj("apps/v1", "Deployment", "d", "u-d")).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "apiVersion": "apps/v1", "kind": "Deployment", "namespace": "ns",
                "name": "d", "uid": "u-d"
            })
        );
        let cluster = TopLevelOwner {
            namespace: None,
            ..obj("v1", "Node", "n", "u-n")
        };
        let json = serde_json::to_value(&cluster).unwrap();
        assert!(json.get("namespace").is_none());
        let back: TopLevelOwner = serde_json::from_value(json).unwrap();
        assert_eq!(back, cluster);
    }

    #[test]
    fn ttl_cache_expires_and_stays_bounded() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut c = TtlCache::new(Duration::from_secs(10), 2);
        c.insert("a", 1, t0);
        c.insert("b", 2, t0 + s);
        assert_eq!(c.get(&"a", t0 + 5 * s), Some(1));
        assert_eq!(c.get(&"a", t0 + 10 * s), None, "expired");
        assert_eq!(c.len(), 1);
        c.insert("a", 1, t0 + 2 * s);
        // Full: the oldest (b) goes.
        c.insert("c", 3, t0 + 3 * s);
        assert_eq!(c.len(), 2);
        assert_eq!(c.get(&"b", t0 + 3 * s), None);
        assert_eq!(c.get(&"a", t0 + 3 * s), Some(1));
        assert_eq!(c.get(&"c", t0 + 3 * s), Some(3));
        // Full again, but expired entries go first.
        c.insert("d", 4, t0 + 12 * s + Duration::from_millis(500));
        assert_eq!(c.len(), 2, "a expired and was dropped; c stays");
        assert_eq!(c.get(&"c", t0 + 12 * s), Some(3));
        // Zero TTL caches nothing useful.
        let mut z = TtlCache::new(Duration::ZERO, 4);
        z.insert("a", 1, t0);
        assert_eq!(z.get(&"a", t0), None);
    }
}
