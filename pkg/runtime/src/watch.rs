//! Watches that feed a cache and survive objects that do not decode.
//!
//! kube's typed watcher decodes every object of a list or a watch event as `K`; one object the
//! type cannot read (a custom resource stored under an older schema, a field a newer API server
//! writes in a shape k8s-openapi does not expect) fails the whole list, and the watcher retries
//! the same list forever: the cache never syncs and nothing else of that kind is reconciled.
//! [`guarded`] watches the kind as untyped objects and decodes each one on its own: an object
//! that does not decode is left out of the cache with a warning naming it and the first field
//! that failed, and counted in `watch_objects_malformed_total{kind}`; every other object goes on.
//! An object whose *new* version does not decode is removed from the cache (readers see it
//! deleted, not its old spec), and so is one deleted while malformed; it comes back with its
//! next version that decodes.
//!
//! A [`Cache`] is a reflector store plus a broadcast of its changes, so controllers (while they
//! lead) and any other reader share one watch per kind. Its readiness gate is released when
//! the first list completes.

use std::fmt::Debug;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use warmcache_telemetry::prometheus::{IntCounterVec, Opts, Registry};

use crate::error::RuntimeError;
use crate::readiness::Gate;

/// How many changes a slow subscriber may fall behind before it is told to resync.
const CHANGE_BUFFER: usize = 1024;

/// Metrics of the watches of one process.
#[derive(Clone, Debug)]
pub struct WatchMetrics {
    /// `watch_objects_malformed_total{kind}`.
    pub malformed: IntCounterVec,
    /// `watch_errors_total{kind}`.
    pub errors: IntCounterVec,
    /// `watch_resyncs_total{kind}`: completed lists (the first one releases readiness).
    pub resyncs: IntCounterVec,
}

impl WatchMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> Result<Self, RuntimeError> {
        let counter = |name: &str, help: &str| -> Result<IntCounterVec, RuntimeError> {
            let counter = IntCounterVec::new(Opts::new(name, help), &["kind"])
                .map_err(|source| RuntimeError::metric(name, source))?;
            registry
                .register(Box::new(counter.clone()))
                .map_err(|source| RuntimeError::metric(name, source))?;
            Ok(counter)
        };
        Ok(Self {
            malformed: counter(
                "watch_objects_malformed_total",
                "Watched objects left out of the cache because they do not decode, per kind.",
            )?,
            errors: counter(
                "watch_errors_total",
                "Failed list or watch requests (the watch retries with backoff), per kind.",
            )?,
            resyncs: counter(
                "watch_resyncs_total",
                "Completed lists of a watched kind (the first one releases readiness), per kind.",
            )?,
        })
    }
}

/// One change seen by a [`Cache`], broadcast after the store has applied it.
#[derive(Debug)]
pub enum Change<K> {
    /// An object was created or changed.
    Applied(Arc<K>),
    /// An object was deleted.
    Deleted(Arc<K>),
    /// A list completed (the first sync, a relist after a watch expired, or a subscriber that
    /// fell behind): the store holds the whole current state; treat every object as changed.
    Resynced,
}

impl<K> Clone for Change<K> {
    fn clone(&self) -> Self {
        match self {
            Self::Applied(object) => Self::Applied(Arc::clone(object)),
            Self::Deleted(object) => Self::Deleted(Arc::clone(object)),
            Self::Resynced => Self::Resynced,
        }
    }
}

/// A watched kind: the store every reader reads and a broadcast of its changes.
#[derive(Debug)]
pub struct Cache<K>
where
    K: reflector::Lookup<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    changes: broadcast::Sender<Change<K>>,
    kind: &'static str,
}

impl<K> Clone for Cache<K>
where
    K: reflector::Lookup<DynamicType = ()> + Clone + 'static,
{
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            changes: self.changes.clone(),
            kind: self.kind,
        }
    }
}

impl<K> Cache<K>
where
    K: reflector::Lookup<DynamicType = ()> + Clone + 'static,
{
    /// The store (empty until the first list completes).
    pub fn store(&self) -> &Store<K> {
        &self.store
    }

    /// The kind, as used in metric labels and logs.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// Changes from now on. A receiver that falls more than 1024 changes behind gets
    /// `RecvError::Lagged`; treat it as [`Change::Resynced`].
    pub fn subscribe(&self) -> broadcast::Receiver<Change<K>> {
        self.changes.subscribe()
    }

    /// Waits until the first list completed.
    pub async fn wait_until_ready(&self) -> Result<(), RuntimeError> {
        self.store
            .wait_until_ready()
            .await
            .map_err(|_| RuntimeError::WatchEnded { kind: self.kind })
    }
}

/// Watches `K` as untyped objects and decodes each on its own (see the module documentation).
/// `store` is the store these events feed: an object whose new version (or whose deletion)
/// does not decode is turned into a Delete of the version the store holds, so the store never
/// keeps a version the API server no longer has.
pub fn guarded<K>(
    api: Api<DynamicObject>,
    config: watcher::Config,
    kind: &'static str,
    metrics: WatchMetrics,
    store: Store<K>,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Debug + Send + Sync + 'static,
{
    watcher::watcher(api, config).filter_map(move |event| {
        let metrics = metrics.clone();
        let store = store.clone();
        async move {
            let event = match event {
                Ok(event) => event,
                Err(err) => return Some(Err(err)),
            };
            let decode = |object: &DynamicObject| -> Option<K> {
                match decode::<K>(object) {
                    Ok(typed) => Some(typed),
                    Err(problem) => {
                        metrics.malformed.with_label_values(&[kind]).inc();
                        tracing::warn!(
                            kind,
                            namespace = object.namespace().unwrap_or_default(),
                            name = object.name_any(),
                            problem = %problem,
                            "left a watched object out of the cache: it does not decode"
                        );
                        None
                    }
                }
            };
            // The version the store holds of `object`, as a Delete, when `object` cannot be
            // decoded: readers must not go on seeing a spec the object no longer has.
            let forget = |object: &DynamicObject| -> Option<Event<K>> {
                let mut key = ObjectRef::<K>::new(&object.name_any());
                if let Some(namespace) = object.namespace() {
                    key = key.within(&namespace);
                }
                store
                    .get(&key)
                    .map(|stored| Event::Delete(stored.as_ref().clone()))
            };
            let typed = match event {
                Event::Apply(object) => match decode(&object) {
                    Some(typed) => Event::Apply(typed),
                    None => forget(&object)?,
                },
                // A relist replaces the whole store at InitDone: leaving it out is enough.
                Event::InitApply(object) => Event::InitApply(decode(&object)?),
                Event::Delete(object) => match decode(&object) {
                    Some(typed) => Event::Delete(typed),
                    None => forget(&object)?,
                },
                Event::Init => Event::Init,
                Event::InitDone => Event::InitDone,
            };
            Some(Ok(typed))
        }
    })
}

/// Decodes an untyped object as `K`, naming the first field that does not fit.
pub fn decode<K: DeserializeOwned>(object: &DynamicObject) -> Result<K, String> {
    let value = serde_json::to_value(object).map_err(|err| err.to_string())?;
    serde_path_to_error::deserialize::<_, K>(&value).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        if path == "." || path.is_empty() {
            inner.to_string()
        } else {
            format!("{path}: {inner}")
        }
    })
}

/// The untyped API of `K`, in `namespace` or cluster-wide.
pub fn dynamic_api<K>(client: Client, namespace: Option<&str>) -> Api<DynamicObject>
where
    K: Resource<DynamicType = ()>,
{
    let resource = ApiResource::erase::<K>(&());
    match namespace {
        Some(namespace) => Api::namespaced_with(client, namespace, &resource),
        None => Api::all_with(client, &resource),
    }
}

/// Feeds `events` into `writer`'s store, broadcasting each change after it is applied, until
/// `stop` is cancelled. `gate` is released when the first list completes.
pub(crate) fn spawn_cache<K, S>(
    kind: &'static str,
    writer: reflector::store::Writer<K>,
    events: S,
    metrics: WatchMetrics,
    gate: Gate,
    stop: CancellationToken,
) -> (Cache<K>, tokio::task::JoinHandle<()>)
where
    K: reflector::Lookup<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
{
    let (changes, _) = broadcast::channel(CHANGE_BUFFER);
    let store = writer.as_reader();
    let cache = Cache {
        store,
        changes: changes.clone(),
        kind,
    };
    let task = tokio::spawn(run_cache(
        kind, events, writer, changes, metrics, gate, stop,
    ));
    (cache, task)
}

async fn run_cache<K, S>(
    kind: &'static str,
    events: S,
    mut writer: reflector::store::Writer<K>,
    changes: broadcast::Sender<Change<K>>,
    metrics: WatchMetrics,
    gate: Gate,
    stop: CancellationToken,
) where
    K: reflector::Lookup<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
{
    let events = events.default_backoff();
    let mut events = std::pin::pin!(events);
    loop {
        let next = tokio::select! {
            () = stop.cancelled() => return,
            next = events.next() => next,
        };
        let event = match next {
            None => return,
            Some(Err(err)) => {
                metrics.errors.with_label_values(&[kind]).inc();
                tracing::warn!(kind, error = %err, "watch failed; retrying with backoff");
                continue;
            }
            Some(Ok(event)) => event,
        };
        writer.apply_watcher_event(&event);
        // No receiver is fine: nobody leads yet, or nobody subscribes to this kind.
        let _ = match event {
            Event::Apply(object) => changes.send(Change::Applied(Arc::new(object))),
            Event::Delete(object) => changes.send(Change::Deleted(Arc::new(object))),
            Event::InitDone => {
                metrics.resyncs.with_label_values(&[kind]).inc();
                gate.release();
                tracing::debug!(kind, "cache synced");
                changes.send(Change::Resynced)
            }
            Event::Init | Event::InitApply(_) => continue,
        };
    }
}

/// `events` with `metadata.managedFields` dropped from each object (see
/// [`without_managed_fields`]); every watch of an API kind into a cache goes through it.
pub(crate) fn trimmed<K, S>(
    events: S,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource + Send + 'static,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
{
    events.map(|event| event.map(without_managed_fields))
}

/// `event` with `metadata.managedFields` dropped from its object before it is cached: nothing
/// reads them, and on a cluster they are often most of an object's metadata (an entry per
/// field manager listing every field it set, as client-go controllers commonly trim them). A
/// cached object written back with an update leaves the field out, which the API server reads
/// as unchanged (only an explicit empty list would reset it).
fn without_managed_fields<K: Resource>(mut event: Event<K>) -> Event<K> {
    match &mut event {
        Event::Apply(object) | Event::InitApply(object) | Event::Delete(object) => {
            object.meta_mut().managed_fields = None;
        }
        Event::Init | Event::InitDone => {}
    }
    event
}

/// `events` with each object turned into `R` by `into` (deleted objects too, so the store
/// finds them by the same key).
pub fn mapped<K, R, S>(
    events: S,
    into: fn(K) -> R,
) -> impl Stream<Item = Result<Event<R>, watcher::Error>> + Send + 'static
where
    K: Send + 'static,
    R: Send + 'static,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
{
    events.map(move |event| event.map(|event| map_event(event, into)))
}

fn map_event<K, R>(event: Event<K>, into: fn(K) -> R) -> Event<R> {
    match event {
        Event::Apply(object) => Event::Apply(into(object)),
        Event::InitApply(object) => Event::InitApply(into(object)),
        Event::Delete(object) => Event::Delete(into(object)),
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
    }
}

/// A metadata-only watch of `K` (labels, annotations, owners; no spec or status): nothing in
/// it can fail to decode, and the cache holds a fraction of the bytes. kube sends
/// metadata-only requests for `Api<PartialObjectMeta<K>>`.
pub fn metadata<K>(
    api: Api<PartialObjectMeta<K>>,
    config: watcher::Config,
) -> impl Stream<Item = Result<Event<PartialObjectMeta<K>>, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    watcher::watcher(api, config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};

    fn managed() -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("cm".into()),
                managed_fields: Some(vec![ManagedFieldsEntry {
                    manager: Some("kubectl".into()),
                    operation: Some("Update".into()),
                    ..ManagedFieldsEntry::default()
                }]),
                labels: Some([("kept".to_owned(), "yes".to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    #[test]
    fn cached_objects_carry_no_managed_fields_and_keep_the_rest() {
        for event in [
            Event::Apply(managed()),
            Event::InitApply(managed()),
            Event::Delete(managed()),
        ] {
            let (Event::Apply(o) | Event::InitApply(o) | Event::Delete(o)) =
                without_managed_fields(event)
            else {
                panic!("the event kind changed");
            };
            assert_eq!(o.metadata.managed_fields, None);
            assert_eq!(o.metadata.name.as_deref(), Some("cm"));
            assert_eq!(o.metadata.labels, managed().metadata.labels);
            // Written back, the field is absent (unchanged for the API server), not `[]`.
            let json = serde_json::to_value(&o).unwrap_or_default();
            assert!(json["metadata"].get("managedFields").is_none(), "{json}");
        }
        assert!(matches!(
            without_managed_fields::<ConfigMap>(Event::Init),
            Event::Init
        ));
    }

    fn annotated(annotations: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("cm".into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                labels: Some([("kept".to_owned(), "yes".to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    #[tokio::test]
    async fn a_mapped_watch_turns_every_object_and_keeps_every_event() {
        fn name_and_read(cm: ConfigMap) -> (Option<String>, Option<String>) {
            let read = cm.metadata.annotations.and_then(|mut a| a.remove("read"));
            (cm.metadata.name, read)
        }
        let events = futures::stream::iter(vec![
            Ok(Event::Init),
            Ok(Event::InitApply(annotated(&[
                ("read", "1"),
                ("other", "x"),
            ]))),
            Ok(Event::InitDone),
            Ok(Event::Apply(annotated(&[("other", "2")]))),
            Ok(Event::Delete(annotated(&[("read", "3")]))),
        ]);
        let out: Vec<_> = mapped(events, name_and_read).collect().await;
        let cm = Some("cm".to_owned());
        let shown: Vec<String> = out
            .into_iter()
            .map(|e| match e {
                Ok(Event::Init) => "init".to_owned(),
                Ok(Event::InitApply(o)) => format!("init-apply {o:?}"),
                Ok(Event::InitDone) => "init-done".to_owned(),
                Ok(Event::Apply(o)) => format!("apply {o:?}"),
                Ok(Event::Delete(o)) => format!("delete {o:?}"),
                Err(e) => panic!("{e}"),
            })
            .collect();
        assert_eq!(
            shown,
            vec![
                "init".to_owned(),
                format!("init-apply {:?}", (cm.clone(), Some("1".to_owned()))),
                "init-done".to_owned(),
                format!("apply {:?}", (cm.clone(), None::<String>)),
                format!("delete {:?}", (cm, Some("3".to_owned()))),
            ]
        );
    }
}
