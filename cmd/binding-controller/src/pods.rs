//! What the controller's pod cache keeps of a reading pod: [`ReadingPod`].
//!
//! The cache holds every pod that reads a cache (100,000 on a large cluster), so its size per
//! pod is most of the controller's memory. A pod's metadata as the API types hold it is about
//! 2.2 kB with only the annotations read kept: the maps of labels and annotations alone take a
//! B-tree node each (room for 11 entries, however few there are) and a heap string per key,
//! and an `ObjectMeta` is 360 bytes before any field is set. A `ReadingPod` is not a
//! `Resource` and carries no `ObjectMeta`: it keeps what is read (name, namespace, UID, whether
//! it is terminating, its controller reference for the owner walk) in fields of their own, and
//! the few labels and annotations read as values in fixed slots, keyed by position in
//! [`POD_LABELS_READ`] and [`POD_ANNOTATIONS_READ`]. The reflector store needs only a `Lookup`
//! (kind, name, namespace, UID). The values kept are shared between pods where they are the same
//! (the namespace, a binding's name and UID, its handle, the model URI, the controller
//! reference of a workload's pods: one heap copy a binding or workload rather than a pod), all
//! but the traceparent.
//!
//! Its `labels()` and `annotations()` answer only for the keys kept. A `ReadingPod` is never
//! written back.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::Lookup;
use warmcache_kube::owner::{Node, TopLevelOwner, controller_reference};
use warmcache_modelvolume::keys::{
    BINDING_ANNOTATION, BINDING_UID_ANNOTATION, CACHE_BINDING_ANNOTATION,
    CACHE_BINDING_UID_ANNOTATION, CACHE_CAPTURE_LABEL, CACHE_HANDLE_ANNOTATION, CAPTURE_LABEL,
    HANDLE_ANNOTATION, MANAGED_BY_LABEL, URI_ANNOTATION,
};
use warmcache_modelvolume::reading::Entries;

/// The annotations of a reading pod the controller reads from its pod cache; the cache keeps
/// only these (the rewrite records more, and at 100,000 pods every byte a pod holds is 100 kB
/// of cache). Not the download step (0.7 kB a pod): it is read from the API server where
/// needed (`Bindings::step_source`, `Bindings::step_namespaces`). Pods are only ever written
/// from fresh reads, never from this cache.
pub const POD_ANNOTATIONS_READ: [&str; 8] = [
    BINDING_ANNOTATION,
    BINDING_UID_ANNOTATION,
    CACHE_BINDING_ANNOTATION,
    CACHE_BINDING_UID_ANNOTATION,
    CACHE_HANDLE_ANNOTATION,
    HANDLE_ANNOTATION,
    URI_ANNOTATION,
    warmcache_telemetry::TRACE_PARENT_ANNOTATION,
];

/// The labels of a reading pod the controller reads from its pod cache (warmcache's own pods
/// are left out by the first; the other two mark capture sources).
pub const POD_LABELS_READ: [&str; 3] = [MANAGED_BY_LABEL, CAPTURE_LABEL, CACHE_CAPTURE_LABEL];

/// The one annotation kept whose value differs from pod to pod; every other value kept is the
/// same for every pod of a binding (its name and UID, its cache handle, the model URI) or of a
/// workload (the labels), and is held once however many pods carry it ([`Shared`]).
const UNSHARED_ANNOTATION: &str = warmcache_telemetry::TRACE_PARENT_ANNOTATION;

/// One heap copy of each label or annotation value many cached pods carry: at 100,000 pods of
/// 10,000 bindings, four values of about 50 bytes each a pod (some 24 MB) become one copy a
/// binding. Values no pod holds any more are dropped when the set has doubled since the last
/// sweep, so it stays within twice the values in use (plus a small floor).
#[derive(Debug, Default)]
struct Shared {
    values: HashSet<Arc<str>>,
    sweep_at: usize,
}

/// The entries [`Shared`] may hold before its first sweep.
const SHARED_FLOOR: usize = 4096;

impl Shared {
    fn get(&mut self, value: &str) -> Arc<str> {
        if let Some(found) = self.values.get(value) {
            return Arc::clone(found);
        }
        if self.values.len() >= self.sweep_at.max(SHARED_FLOOR) {
            // Held by the set alone: no cached pod carries it any more.
            self.values.retain(|v| Arc::strong_count(v) > 1);
            self.sweep_at = self.values.len().saturating_mul(2);
        }
        let value: Arc<str> = Arc::from(value);
        self.values.insert(Arc::clone(&value));
        value
    }
}

static SHARED: LazyLock<Mutex<Shared>> = LazyLock::new(Mutex::default);

/// `value`, shared with every other cached pod carrying the same (and with the controller's
/// index of each binding's pods, for its namespaces and binding names).
pub(crate) fn shared(value: &str) -> Arc<str> {
    SHARED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(value)
}

/// A reading pod as the controller's pod cache keeps it (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReadingPod {
    name: Box<str>,
    /// Shared: a cluster has few namespaces.
    namespace: Arc<str>,
    uid: Option<Box<str>>,
    /// Its controller reference, the one owner the owner walk follows; shared with the other
    /// pods of its workload.
    controller: Option<Box<ControllerRef>>,
    /// Whether it has a deletion timestamp.
    terminating: bool,
    /// The values of [`POD_LABELS_READ`], by position.
    labels: [Option<Arc<str>>; POD_LABELS_READ.len()],
    /// The values of [`POD_ANNOTATIONS_READ`], by position.
    annotations: [Option<Arc<str>>; POD_ANNOTATIONS_READ.len()],
}

/// A pod's controller reference (`controller: true`), its strings shared: every pod of a
/// ReplicaSet names the same one.
#[derive(Debug, Clone, PartialEq)]
struct ControllerRef {
    api_version: Arc<str>,
    kind: Arc<str>,
    name: Arc<str>,
    uid: Arc<str>,
    block_owner_deletion: Option<bool>,
}

impl ReadingPod {
    /// The record of `pod`.
    #[must_use]
    pub fn from_meta(pod: PartialObjectMeta<Pod>) -> Self {
        let m = pod.metadata;
        let controller = controller_reference(&m).map(|r| {
            Box::new(ControllerRef {
                api_version: shared(&r.api_version),
                kind: shared(&r.kind),
                name: shared(&r.name),
                uid: shared(&r.uid),
                block_owner_deletion: r.block_owner_deletion,
            })
        });
        let labels = m.labels.unwrap_or_default();
        let annotations = m.annotations.unwrap_or_default();
        Self {
            name: m.name.unwrap_or_default().into_boxed_str(),
            namespace: shared(m.namespace.as_deref().unwrap_or_default()),
            uid: m.uid.map(String::into_boxed_str),
            controller,
            terminating: m.deletion_timestamp.is_some(),
            labels: POD_LABELS_READ.map(|k| labels.get(k).map(|v| shared(v))),
            annotations: POD_ANNOTATIONS_READ.map(|k| {
                annotations.get(k).map(|v| {
                    if k == UNSHARED_ANNOTATION {
                        Arc::from(v.as_str())
                    } else {
                        shared(v)
                    }
                })
            }),
        }
    }

    /// Its name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its namespace.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Its namespace, shared with the other records that name it.
    #[must_use]
    pub fn shared_namespace(&self) -> &Arc<str> {
        &self.namespace
    }

    /// Its UID.
    #[must_use]
    pub fn uid(&self) -> Option<&str> {
        self.uid.as_deref()
    }

    /// Whether it is being deleted (has a deletion timestamp).
    #[must_use]
    pub fn terminating(&self) -> bool {
        self.terminating
    }

    /// The pod as the owner walk's first step: its identity and its controller reference.
    #[must_use]
    pub fn owner_node(&self) -> Node {
        Node {
            identity: TopLevelOwner {
                api_version: "v1".to_owned(),
                kind: "Pod".to_owned(),
                namespace: Some(self.namespace.to_string()),
                name: self.name.to_string(),
                uid: self.uid.as_deref().unwrap_or_default().to_owned(),
            },
            controller: self.controller.as_deref().map(|c| OwnerReference {
                api_version: c.api_version.to_string(),
                kind: c.kind.to_string(),
                name: c.name.to_string(),
                uid: c.uid.to_string(),
                controller: Some(true),
                block_owner_deletion: c.block_owner_deletion,
            }),
        }
    }

    /// The labels kept ([`POD_LABELS_READ`]).
    #[must_use]
    pub fn labels(&self) -> Kept<'_> {
        Kept {
            keys: &POD_LABELS_READ,
            values: &self.labels,
        }
    }

    /// The annotations kept ([`POD_ANNOTATIONS_READ`]).
    #[must_use]
    pub fn annotations(&self) -> Kept<'_> {
        Kept {
            keys: &POD_ANNOTATIONS_READ,
            values: &self.annotations,
        }
    }
}

/// The labels or annotations a [`ReadingPod`] keeps; a key not kept reads as absent.
#[derive(Debug, Clone, Copy)]
pub struct Kept<'a> {
    keys: &'static [&'static str],
    values: &'a [Option<Arc<str>>],
}

impl Kept<'_> {
    /// The value of `key`.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&str> {
        let i = self.keys.iter().position(|k| *k == key)?;
        self.values.get(i)?.as_deref()
    }

    /// Whether `key` is kept and set.
    #[must_use]
    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }
}

impl Entries for Kept<'_> {
    fn entry(&self, key: &str) -> Option<&str> {
        self.get(key)
    }
}

/// The reflector store's view of a record: kind, name, namespace and UID (no resource version:
/// the record does not keep it, and nothing reads it from the cache).
impl Lookup for ReadingPod {
    type DynamicType = ();

    fn kind((): &()) -> Cow<'_, str> {
        Cow::Borrowed("Pod")
    }

    fn group((): &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }

    fn version((): &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }

    fn plural((): &()) -> Cow<'_, str> {
        Cow::Borrowed("pods")
    }

    fn name(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.name))
    }

    fn namespace(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.namespace))
    }

    fn resource_version(&self) -> Option<Cow<'_, str>> {
        None
    }

    fn uid(&self) -> Option<Cow<'_, str>> {
        self.uid.as_deref().map(Cow::Borrowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::ObjectMeta;
    use kube::runtime::reflector::ObjectRef;
    use std::collections::BTreeMap;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_reading_pod_keeps_identity_its_controller_and_the_keys_read_only() {
        let owner = |name: &str, controller: Option<bool>| OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: name.into(),
            uid: format!("{name}-uid"),
            controller,
            block_owner_deletion: Some(true),
        };
        let deleted = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let pod = PartialObjectMeta::<Pod> {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u".into()),
                resource_version: Some("7".into()),
                generate_name: Some("rs-".into()),
                owner_references: Some(vec![owner("other", None), owner("rs", Some(true))]),
                deletion_timestamp: Some(deleted.clone()),
                labels: Some(map(&[
                    (MANAGED_BY_LABEL, "someone"),
                    (CAPTURE_LABEL, "true"),
                    ("app", "x"),
                ])),
                annotations: Some(map(&[
                    (BINDING_ANNOTATION, "model-cache-m"),
                    (URI_ANNOTATION, "hf://o/m"),
                    (warmcache_modelvolume::keys::DOWNLOAD_STEP_ANNOTATION, "{}"),
                    ("other", "y"),
                ])),
                ..ObjectMeta::default()
            },
            ..PartialObjectMeta::default()
        };
        // The owner walk starts from the same node as it would from the pod's metadata.
        let from_pod = Node::from_meta("v1", "Pod", &pod.metadata);
        let r = ReadingPod::from_meta(pod);
        assert_eq!(r.name(), "p");
        assert_eq!(r.namespace(), "ns");
        assert_eq!(r.uid(), Some("u"));
        assert!(r.terminating());
        assert_eq!(r.owner_node(), from_pod);
        assert_eq!(
            r.owner_node().controller.map(|c| c.name),
            Some("rs".to_owned())
        );
        // The store's key: name and namespace; no resource version is kept.
        let key = r.to_object_ref(());
        assert_eq!(key, ObjectRef::<ReadingPod>::new("p").within("ns"));
        assert_eq!(Lookup::resource_version(&r), None);
        assert_eq!(Lookup::uid(&r).as_deref(), Some("u"));

        assert_eq!(r.labels().get(MANAGED_BY_LABEL), Some("someone"));
        assert_eq!(r.labels().entry(CAPTURE_LABEL), Some("true"));
        assert_eq!(r.labels().get(CACHE_CAPTURE_LABEL), None);
        assert_eq!(r.labels().get("app"), None, "not kept");
        assert_eq!(
            r.annotations().get(BINDING_ANNOTATION),
            Some("model-cache-m")
        );
        assert!(r.annotations().contains_key(URI_ANNOTATION));
        assert!(
            !r.annotations()
                .contains_key(warmcache_modelvolume::keys::DOWNLOAD_STEP_ANNOTATION)
        );
        assert_eq!(r.annotations().get("other"), None);
        assert_eq!(r.annotations().get(BINDING_UID_ANNOTATION), None);
        // The pure reading rules answer the same from the record as from the pod's maps.
        assert_eq!(
            warmcache_modelvolume::reading::bindings_named(&r.annotations()),
            ["model-cache-m"]
        );
    }

    /// Every key the pure reading rules read from a pod is kept: a key added there and not
    /// here would read as absent from the cache (a capture source never seen as one).
    #[test]
    fn the_record_keeps_every_key_the_reading_rules_read() {
        use warmcache_modelvolume::reading::Reads;
        for how in Reads::ALL {
            let keys = how.keys();
            for annotation in [keys.binding, keys.uid, keys.handle] {
                assert!(POD_ANNOTATIONS_READ.contains(&annotation), "{annotation}");
            }
            assert!(POD_LABELS_READ.contains(&keys.capture), "{}", keys.capture);
        }
        assert!(POD_ANNOTATIONS_READ.contains(&URI_ANNOTATION));
    }

    /// Values many pods carry are held once; the traceparent, different for each pod, is not
    /// shared; values no pod holds any more are swept once the set has doubled.
    #[test]
    fn values_pods_share_are_held_once() {
        let record = |name: &str, traceparent: &str| {
            let mut pod = PartialObjectMeta::<Pod>::default();
            pod.metadata.name = Some(name.into());
            pod.metadata.annotations = Some(map(&[
                (BINDING_ANNOTATION, "model-cache-shared-by-two"),
                (URI_ANNOTATION, "hf://o/shared-by-two"),
                (UNSHARED_ANNOTATION, traceparent),
            ]));
            ReadingPod::from_meta(pod)
        };
        let (a, b) = (record("a", "00-tp-01"), record("b", "00-tp-01"));
        let slot = |r: &ReadingPod, key: &str| {
            let i = POD_ANNOTATIONS_READ.iter().position(|k| *k == key).unwrap();
            Arc::clone(r.annotations[i].as_ref().unwrap())
        };
        assert!(Arc::ptr_eq(
            &slot(&a, BINDING_ANNOTATION),
            &slot(&b, BINDING_ANNOTATION)
        ));
        assert!(Arc::ptr_eq(
            &slot(&a, URI_ANNOTATION),
            &slot(&b, URI_ANNOTATION)
        ));
        assert!(!Arc::ptr_eq(
            &slot(&a, UNSHARED_ANNOTATION),
            &slot(&b, UNSHARED_ANNOTATION)
        ));
        assert_eq!(a.annotations().get(UNSHARED_ANNOTATION), Some("00-tp-01"));
        assert_eq!(
            b.annotations().get(BINDING_ANNOTATION),
            Some("model-cache-shared-by-two")
        );

        // A set of its own: dropped values are swept when it doubles, kept ones stay shared.
        let mut set = Shared::default();
        let kept = set.get("kept");
        for i in 0..SHARED_FLOOR - 1 {
            drop(set.get(&format!("gone-{i}")));
        }
        assert_eq!(set.values.len(), SHARED_FLOOR);
        let fresh = set.get("fresh");
        assert_eq!(
            set.values.len(),
            2,
            "swept to what pods hold, plus the new value"
        );
        assert!(Arc::ptr_eq(&set.get("kept"), &kept));
        assert!(Arc::ptr_eq(&set.get("fresh"), &fresh));
        assert_eq!(set.sweep_at, 2);
    }

    #[test]
    fn a_pod_without_labels_annotations_or_owners_keeps_none() {
        let mut pod = PartialObjectMeta::<Pod>::default();
        pod.metadata.name = Some("p".into());
        let from_pod = Node::from_meta("v1", "Pod", &pod.metadata);
        let r = ReadingPod::from_meta(pod);
        assert!(!r.terminating());
        assert_eq!(r.owner_node().controller, None);
        // Name and an absent UID reach the walk as the pod's metadata would give them (an
        // absent namespace, which a pod from the API server never has, reads as "").
        let node = r.owner_node();
        assert_eq!(
            (&node.identity.name, &node.identity.uid),
            (&from_pod.identity.name, &from_pod.identity.uid),
            "{from_pod:?}"
        );
        assert!(POD_LABELS_READ.iter().all(|k| r.labels().get(k).is_none()));
        assert!(
            POD_ANNOTATIONS_READ
                .iter()
                .all(|k| r.annotations().get(k).is_none())
        );
    }
}
