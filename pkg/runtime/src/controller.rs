//! Controller glue: the reconcile-error contract, one error policy, per-object backoff,
//! reporting (a log line, an Event, metrics), one span per reconcile that continues the trace
//! carried on the object, and reconciling only while this replica leads.
//!
//! A component implements [`Reconciler`] for its kind (fetch, validate, build, apply, status)
//! with an error type implementing [`ReconcileError`], and hands it to
//! [`Runtime::controller`](crate::Runtime::controller) with the [`Cache`]s it reads. The runtime
//! then:
//! - reconciles each object at most once at a time, `concurrency` objects at once;
//! - on success forgets the object's backoff and does what the returned [`Action`] says;
//! - on a **transient** error logs a warning, requeues the object after its own exponential
//!   backoff (1 s doubling to 5 min, jittered; other objects are not delayed), and publishes a
//!   Warning Event on the first failure of a streak (a write conflict, an expected race, only
//!   when it is the [`CONFLICTS_BEFORE_EVENT`]th in a row);
//! - on a **permanent** error logs an error, calls [`Reconciler::permanent_failure`] (set a
//!   condition) and publishes a Warning Event, then waits for the object to change;
//! - counts runs, failures by category and durations (`reconcile_*{controller}`);
//! - isolates a panicking reconcile: counted as category `panic`, retried with backoff.
//!
//! Reconciles run only while the replica holds its Lease: on loss the queue and every reconcile
//! in flight are dropped within the renew deadline, and reconciling resumes (with every object
//! queued once) when the Lease is re-acquired. The caches keep watching on every replica, so a
//! standby is ready and takes over with a warm cache.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use futures::stream::{self, BoxStream};
use futures::{Stream, StreamExt};
use kube::Resource;
use kube::ResourceExt;
use kube::runtime::controller::{self as kube_controller, Action};
use kube::runtime::reflector::{self, ObjectRef, Store};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use warmcache_kube::{EventRecorder, Leadership};
use warmcache_telemetry::ReconcileMetrics;

use crate::watch::{Cache, Change};

/// Category of a reconcile that panicked.
pub const PANIC_CATEGORY: &str = "panic";

/// What the runtime needs to know about a reconcile error.
pub trait ReconcileError: std::error::Error + Send + Sync + 'static {
    /// A short, stable, snake_case label: the `category` metric label and, in UpperCamelCase,
    /// the Event reason. Return one of a fixed set (never text built from the object).
    fn category(&self) -> &'static str;

    /// The values [`category`](Self::category) can return besides the Kubernetes API
    /// categories ([`warmcache_kube::ErrorCategory::LABELS`]) and [`PANIC_CATEGORY`], which
    /// every controller has: the runtime exports `reconcile_failures_total` at 0 for all of
    /// them from the start, so dashboards and alerts find the series before the first failure.
    /// A category missing here is still counted when it happens.
    const CATEGORIES: &'static [&'static str];

    /// Whether retrying cannot help until the object (or its inputs) change: invalid spec,
    /// unsupported request. Permanent errors set a condition and wait for a change; the others
    /// are retried with backoff.
    fn is_permanent(&self) -> bool {
        false
    }
}

impl ReconcileError for warmcache_kube::Error {
    const CATEGORIES: &'static [&'static str] = &[];

    fn category(&self) -> &'static str {
        warmcache_kube::Error::category(self).as_str()
    }

    /// The API server refused the request as invalid: the same request fails again until the
    /// object changes. Everything else (conflicts, timeouts, RBAC being fixed) may pass later.
    fn is_permanent(&self) -> bool {
        warmcache_kube::Error::category(self) == warmcache_kube::ErrorCategory::Invalid
    }
}

/// The reconcile of one kind.
pub trait Reconciler<K>: Send + Sync + 'static {
    /// Its error.
    type Error: ReconcileError;

    /// Brings the world in line with `object`: fetch, validate, build, apply, status. Check
    /// [`Leadership::ensure_leader`] right before writes when a write must not come from a
    /// replica that lost its Lease a moment ago.
    fn reconcile(&self, object: Arc<K>)
    -> impl Future<Output = Result<Action, Self::Error>> + Send;

    /// Records a permanent error where the user sees it (usually a status condition with the
    /// object's generation). Called before the runtime waits for the object to change; the
    /// default does nothing.
    fn permanent_failure(
        &self,
        object: Arc<K>,
        error: &Self::Error,
    ) -> impl Future<Output = ()> + Send {
        let _ = (object, error);
        async {}
    }
}

/// Per-object exponential backoff of failed reconciles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffPolicy {
    /// Delay after the first failure.
    pub min: Duration,
    /// Longest delay.
    pub max: Duration,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self {
            min: Duration::from_secs(1),
            max: Duration::from_secs(300),
        }
    }
}

/// The backoff state of every failing object of one controller.
#[derive(Debug)]
pub struct Backoffs<Key> {
    policy: BackoffPolicy,
    streaks: HashMap<Key, Streak>,
}

/// One object's run of failures of one kind.
#[derive(Debug)]
struct Streak {
    /// What failed (category and permanence): another kind of failure starts a new streak.
    signature: (&'static str, bool),
    count: u32,
    delays: ExponentialBackoff,
}

impl<Key: std::hash::Hash + Eq> Backoffs<Key> {
    /// No object failing yet. A `min` above `max` is taken as `max`.
    pub fn new(policy: BackoffPolicy) -> Self {
        Self {
            policy: BackoffPolicy {
                min: policy.min.min(policy.max),
                max: policy.max,
            },
            streaks: HashMap::new(),
        }
    }

    /// Records a failure of `key` with `category` (`permanent` or not): the delay before its
    /// next attempt and how many failures of that kind in a row it has had (1 for the first; a
    /// failure of another category or permanence starts a new streak).
    pub fn failed(&mut self, key: Key, category: &'static str, permanent: bool) -> (Duration, u32) {
        let policy = self.policy;
        let signature = (category, permanent);
        let fresh = || Streak {
            signature,
            count: 0,
            delays: ExponentialBuilder::default()
                .with_min_delay(policy.min)
                .with_max_delay(policy.max)
                .with_factor(2.0)
                .with_jitter()
                .without_max_times()
                .build(),
        };
        let streak = self.streaks.entry(key).or_insert_with(fresh);
        if streak.signature != signature {
            *streak = fresh();
        }
        streak.count = streak.count.saturating_add(1);
        let delay = streak.delays.next().unwrap_or(policy.max).min(policy.max);
        (delay, streak.count)
    }

    /// Forgets `key`'s streak (it succeeded, or is gone).
    pub fn succeeded(&mut self, key: &Key) {
        self.streaks.remove(key);
    }

    /// Keeps only the streaks `keep` accepts (objects still in the cache).
    pub fn retain(&mut self, mut keep: impl FnMut(&Key) -> bool) {
        self.streaks.retain(|key, _| keep(key));
    }

    /// How many objects are in a failure streak.
    pub fn len(&self) -> usize {
        self.streaks.len()
    }

    /// Whether no object is failing.
    pub fn is_empty(&self) -> bool {
        self.streaks.is_empty()
    }
}

/// The error policy, pure: what to do after a failed reconcile.
pub fn error_policy(permanent: bool, delay: Duration) -> Action {
    if permanent {
        Action::await_change()
    } else {
        Action::requeue(delay)
    }
}

/// Failures of category `conflict` in a row before one is published as a Warning Event. A
/// conflict is an optimistic-concurrency race (the write was based on a cached object another
/// write had already replaced), expected whenever the cache trails the API server and resolved
/// by the retry that re-reads it: an Event for each would tell users nothing and cost an API
/// request while the API server is busiest. A conflict that keeps coming back is worth one.
pub const CONFLICTS_BEFORE_EVENT: u32 = 3;

/// Whether the failure that made a streak `streak` long is published as a Warning Event: every
/// permanent one, the first of a transient streak, and the [`CONFLICTS_BEFORE_EVENT`]th conflict
/// in a row.
pub fn publishes_event(category: &str, permanent: bool, streak: u32) -> bool {
    if permanent {
        return true;
    }
    if category == warmcache_kube::ErrorCategory::Conflict.as_str() {
        return streak == CONFLICTS_BEFORE_EVENT;
    }
    streak == 1
}

/// The UpperCamelCase form of a snake_case category, for Event reasons (`not_found` ->
/// `NotFound`).
pub fn event_reason(category: &str) -> String {
    category
        .split('_')
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect()
}

type Source<K> = Box<dyn FnOnce() -> BoxStream<'static, ObjectRef<K>> + Send>;
type SourceFactory<K> = Arc<dyn Fn() -> Source<K> + Send + Sync>;
type Synced = Arc<dyn Fn() -> futures::future::BoxFuture<'static, bool> + Send + Sync>;

fn synced<C>(cache: &Cache<C>) -> Synced
where
    C: reflector::Lookup<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let cache = cache.clone();
    Arc::new(move || {
        let cache = cache.clone();
        Box::pin(async move { cache.wait_until_ready().await.is_ok() })
    })
}

/// A controller for `K`, built by [`Runtime::controller`](crate::Runtime::controller) and
/// started with [`Runtime::start_controller`](crate::Runtime::start_controller).
pub struct Controller<K, R>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    pub(crate) name: &'static str,
    pub(crate) cache: Cache<K>,
    pub(crate) reconciler: Arc<R>,
    pub(crate) sources: Vec<SourceFactory<K>>,
    /// One per cache the controller reads: reconciling starts once all have listed once.
    pub(crate) synced: Vec<Synced>,
    pub(crate) concurrency: u16,
    pub(crate) backoff: BackoffPolicy,
}

impl<K, R> Debug for Controller<K, R>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("name", &self.name)
            .field("kind", &self.cache.kind())
            .field("sources", &self.sources.len())
            .field("concurrency", &self.concurrency)
            .field("backoff", &self.backoff)
            .finish()
    }
}

impl<K, R> Controller<K, R>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
    R: Reconciler<K>,
{
    pub(crate) fn new(name: &'static str, cache: &Cache<K>, reconciler: R) -> Self {
        let primary = cache.clone();
        let factory: SourceFactory<K> = Arc::new(move || {
            let cache = primary.clone();
            let rx = cache.subscribe();
            Box::new(move || {
                changes(rx, cache.store().clone())
                    .flat_map(|(change, store)| {
                        let refs: Vec<ObjectRef<K>> = match change {
                            Change::Applied(object) => vec![ObjectRef::from_obj(object.as_ref())],
                            // A deleted object has nothing left to reconcile; objects that need
                            // cleanup carry a finalizer and are seen as changed instead.
                            Change::Deleted(_) => Vec::new(),
                            Change::Resynced => store
                                .state()
                                .iter()
                                .map(|o| ObjectRef::from_obj(o.as_ref()))
                                .collect(),
                        };
                        stream::iter(refs)
                    })
                    .boxed()
            })
        });
        Self {
            name,
            cache: cache.clone(),
            reconciler: Arc::new(reconciler),
            sources: vec![factory],
            synced: vec![synced(cache)],
            concurrency: 4,
            backoff: BackoffPolicy::default(),
        }
    }

    /// Also reconciles the controller owner (of kind `K`) of every object of `children` that
    /// changes or is deleted.
    #[must_use]
    pub fn owns<C>(self, children: &Cache<C>) -> Self
    where
        C: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
    {
        self.watches(children, |child: &C| {
            let namespace = child.namespace();
            child
                .owner_references()
                .iter()
                .filter(|owner| owner.controller == Some(true))
                .filter_map(|owner| ObjectRef::from_owner_ref(namespace.as_deref(), owner, ()))
                .collect()
        })
    }

    /// Also reconciles the objects `map` names for every object of `other` that changes or is
    /// deleted (for example the binding a labelled pod belongs to).
    #[must_use]
    pub fn watches<C, F>(mut self, other: &Cache<C>, map: F) -> Self
    where
        C: reflector::Lookup<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
        F: Fn(&C) -> Vec<ObjectRef<K>> + Send + Sync + 'static,
    {
        let other_for_sync = other.clone();
        let other = other.clone();
        let map = Arc::new(map);
        let factory: SourceFactory<K> = Arc::new(move || {
            let cache = other.clone();
            let map = Arc::clone(&map);
            let rx = cache.subscribe();
            Box::new(move || {
                changes(rx, cache.store().clone())
                    .flat_map(move |(change, store)| {
                        let refs: Vec<ObjectRef<K>> = match change {
                            Change::Applied(object) | Change::Deleted(object) => map(&object),
                            Change::Resynced => {
                                store.state().iter().flat_map(|o| map(o.as_ref())).collect()
                            }
                        };
                        stream::iter(refs)
                    })
                    .boxed()
            })
        });
        self.sources.push(factory);
        self.synced.push(synced(&other_for_sync));
        self
    }

    /// How many objects are reconciled at once (default 4; 0 means no limit).
    #[must_use]
    pub fn concurrency(mut self, concurrency: u16) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// The per-object backoff of failed reconciles (default 1 s to 5 min).
    #[must_use]
    pub fn backoff(mut self, policy: BackoffPolicy) -> Self {
        self.backoff = policy;
        self
    }
}

/// The changes of a cache as a stream, starting with a [`Change::Resynced`] (so everything in
/// the store is queued once when a controller starts), and turning a lag into a resync.
fn changes<C>(
    rx: tokio::sync::broadcast::Receiver<Change<C>>,
    store: Store<C>,
) -> impl Stream<Item = (Change<C>, Store<C>)> + Send + 'static
where
    C: reflector::Lookup<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let first = stream::iter([(Change::Resynced, store.clone())]);
    let rest = stream::unfold((rx, store), |(mut rx, store)| async move {
        let change = match rx.recv().await {
            Ok(change) => change,
            Err(RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "a controller fell behind its cache; resyncing");
                Change::Resynced
            }
            Err(RecvError::Closed) => return None,
        };
        Some(((change, store.clone()), (rx, store)))
    });
    first.chain(rest)
}

/// What a controller run shares with its reconciles.
pub(crate) struct Shared<K, R>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    pub(crate) name: &'static str,
    pub(crate) reconciler: Arc<R>,
    pub(crate) metrics: ReconcileMetrics,
    pub(crate) recorder: Option<EventRecorder>,
    pub(crate) backoffs: Mutex<Backoffs<ObjectRef<K>>>,
    pub(crate) store: Store<K>,
    pub(crate) leadership: Leadership,
}

/// Failure of one reconcile, as reported.
#[derive(Debug)]
struct Failure {
    category: &'static str,
    permanent: bool,
    message: String,
}

/// Runs `controller` whenever `leadership` is held, until `stop` is cancelled; then lets the
/// reconciles in flight finish (the caller bounds how long).
pub(crate) async fn run_while_leader<K, R>(
    controller: Controller<K, R>,
    leadership: Leadership,
    metrics: ReconcileMetrics,
    recorder: Option<EventRecorder>,
    stop: CancellationToken,
) where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
    R: Reconciler<K>,
{
    let name = controller.name;
    for category in R::Error::CATEGORIES
        .iter()
        .chain(&warmcache_kube::ErrorCategory::LABELS)
        .chain([&PANIC_CATEGORY])
    {
        metrics.failures.with_label_values(&[name, category]);
    }
    let shared = Arc::new(Shared {
        name,
        reconciler: Arc::clone(&controller.reconciler),
        metrics,
        recorder,
        backoffs: Mutex::new(Backoffs::new(controller.backoff)),
        store: controller.cache.store().clone(),
        leadership: leadership.clone(),
    });
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = leadership.wait_until_leader() => {}
        }
        // Wait for the first list of every cache the controller reads: a reconcile that
        // sees half a world (a binding without its pods) would decide wrongly.
        let all_synced = futures::future::join_all(controller.synced.iter().map(|synced| synced()));
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            synced = all_synced => {
                if !synced.iter().all(|ok| *ok) {
                    return;
                }
            }
        }
        // The Lease may have gone while the caches synced.
        if !leadership.is_leader() {
            continue;
        }
        tracing::info!(controller = name, "leading: reconciling");
        let mut leading = leadership.subscribe();
        let sources: Vec<BoxStream<'static, ObjectRef<K>>> = controller
            .sources
            .iter()
            .map(|factory| factory()())
            .collect();
        let queue = stream::select_all(sources)
            .map(Ok::<_, Infallible>)
            .take_until(stop.clone().cancelled_owned());
        let applier = kube_controller::applier(
            |object, shared: Arc<Shared<K, R>>| -> ReconcileFuture {
                Box::pin(reconcile_one(object, shared))
            },
            |_, never: &Infallible, _| match *never {},
            Arc::clone(&shared),
            controller.cache.store().clone(),
            queue,
            kube_controller::Config::default().concurrency(controller.concurrency),
        )
        .for_each(move |result| async move {
            if let Err(err) = result {
                // The queue cannot fail and reconciles report their own errors; what is left
                // is an object deleted between being queued and being reconciled.
                tracing::debug!(controller = name, error = %err, "reconcile skipped");
            }
        });
        tokio::select! {
            // Leadership first: once it is lost, nothing more may be polled into starting.
            biased;
            _ = leading.wait_for(|leading| !*leading) => {
                tracing::warn!(controller = name, "lost the Lease: stopped reconciling");
            }
            () = applier => {
                if stop.is_cancelled() {
                    tracing::info!(controller = name, "stopped reconciling: shutting down");
                    return;
                }
                tracing::warn!(controller = name, "reconcile queue ended; restarting it");
            }
        }
    }
}

type ReconcileFuture = Pin<Box<dyn Future<Output = Result<Action, Infallible>> + Send>>;

/// A spawned task aborted when dropped, so reconciles in flight stop with their controller.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> Future for AbortOnDrop<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

async fn reconcile_one<K, R>(
    object: Arc<K>,
    shared: Arc<Shared<K, R>>,
) -> Result<Action, Infallible>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
    R: Reconciler<K>,
{
    let span = tracing::info_span!(
        "reconcile",
        controller = shared.name,
        kind = %K::kind(&()),
        namespace = object.namespace().unwrap_or_default(),
        name = object.name_any(),
        generation = object.meta().generation.unwrap_or_default(),
        error.category = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    if let Err(err) = warmcache_telemetry::set_parent_from_annotations(&span, object.annotations())
    {
        tracing::debug!(error = %err, "reconcile span keeps its own trace");
    }
    let key = ObjectRef::from_obj(object.as_ref());
    // Checked against the clock: the flag that stops the queue may lag behind the deadline.
    if !shared.leadership.is_leader() {
        tracing::debug!(parent: &span, "not leading: reconcile skipped");
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let timer = shared.metrics.start(shared.name);
    let reconciler = Arc::clone(&shared.reconciler);
    let input = Arc::clone(&object);
    let task = AbortOnDrop(tokio::spawn(
        async move { reconciler.reconcile(input).await }.instrument(span.clone()),
    ));
    let joined = task.await;
    drop(timer);
    let failure = match joined {
        Ok(Ok(action)) => {
            tracing::debug!(parent: &span, ?action, "reconciled");
            shared
                .backoffs
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .succeeded(&key);
            return Ok(action);
        }
        Ok(Err(err)) => {
            let failure = Failure {
                category: err.category(),
                permanent: err.is_permanent(),
                message: error_chain(&err),
            };
            if failure.permanent {
                shared
                    .reconciler
                    .permanent_failure(Arc::clone(&object), &err)
                    .instrument(span.clone())
                    .await;
            }
            failure
        }
        Err(join) => Failure {
            category: PANIC_CATEGORY,
            permanent: false,
            message: if join.is_panic() {
                format!(
                    "the reconcile panicked: {}",
                    crate::runtime::panic_message(join.into_panic())
                )
            } else {
                "the reconcile was cancelled".to_owned()
            },
        },
    };
    Ok(report(&shared, &object, key, failure)
        .instrument(span)
        .await)
}

async fn report<K, R>(
    shared: &Shared<K, R>,
    object: &K,
    key: ObjectRef<K>,
    failure: Failure,
) -> Action
where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
{
    let span = tracing::Span::current();
    span.record("error.category", failure.category);
    span.record("otel.status_code", "ERROR");
    shared.metrics.failure(shared.name, failure.category);
    let (delay, streak) = {
        let mut backoffs = shared
            .backoffs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Objects deleted while failing would otherwise keep their streak forever.
        if backoffs.len() > shared.store.len().saturating_mul(2) + 64 {
            backoffs.retain(|key| shared.store.get(key).is_some());
        }
        backoffs.failed(key, failure.category, failure.permanent)
    };
    let action = error_policy(failure.permanent, delay);
    if failure.permanent {
        tracing::error!(
            category = failure.category,
            error = %failure.message,
            "reconcile failed permanently; waiting for the object to change"
        );
    } else {
        tracing::warn!(
            category = failure.category,
            error = %failure.message,
            retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            streak,
            "reconcile failed; retrying"
        );
    }
    if let Some(recorder) = &shared.recorder
        && publishes_event(failure.category, failure.permanent, streak)
    {
        let note = if failure.permanent {
            format!("{} (waiting for a change)", failure.message)
        } else {
            format!("{} (retrying with backoff)", failure.message)
        };
        recorder
            .warning(
                object,
                &event_reason(failure.category),
                "Reconcile",
                Some(&note),
            )
            .await;
    }
    action
}

/// An error and its sources, joined by ": ".
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let next = cause.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conflict_streak_is_published_once_it_persists() {
        // A permanent failure always; a transient streak once, at its first failure.
        assert!(publishes_event("transient", true, 7));
        assert!(publishes_event("transient", false, 1));
        assert!(!publishes_event("transient", false, 2));
        // A conflict is a race the retry resolves: only a streak of them is worth an Event,
        // and only once.
        let conflict = warmcache_kube::ErrorCategory::Conflict.as_str();
        let published: Vec<u32> = (1..=10)
            .filter(|streak| publishes_event(conflict, false, *streak))
            .collect();
        assert_eq!(published, [CONFLICTS_BEFORE_EVENT]);
        const { assert!(CONFLICTS_BEFORE_EVENT > 1) };
        // A streak of conflicts and the same category made permanent.
        assert!(publishes_event(conflict, true, 1));
    }

    #[test]
    fn backoff_is_per_object_grows_and_resets() {
        let mut backoffs = Backoffs::new(BackoffPolicy {
            min: Duration::from_millis(100),
            max: Duration::from_secs(2),
        });
        let (first, streak) = backoffs.failed("a", "x", false);
        assert_eq!(streak, 1);
        assert!(
            first >= Duration::from_millis(100) && first <= Duration::from_millis(200),
            "{first:?}"
        );
        let mut last = first;
        for expected_streak in 2..=8 {
            let (delay, streak) = backoffs.failed("a", "x", false);
            assert_eq!(streak, expected_streak);
            assert!(delay <= Duration::from_secs(2), "{delay:?}");
            last = delay;
        }
        assert!(
            last >= Duration::from_secs(1),
            "capped near the max: {last:?}"
        );
        // Another object starts from the minimum.
        let (other, streak) = backoffs.failed("b", "x", false);
        assert_eq!(streak, 1);
        assert!(other <= Duration::from_millis(200), "{other:?}");
        backoffs.succeeded(&"a");
        let (again, streak) = backoffs.failed("a", "x", false);
        assert_eq!(streak, 1);
        assert!(again <= Duration::from_millis(200), "{again:?}");
        // Another kind of failure starts a new streak.
        let (_, streak) = backoffs.failed("a", "x", false);
        assert_eq!(streak, 2);
        let (_, streak) = backoffs.failed("a", "x", true);
        assert_eq!(streak, 1);
        let (_, streak) = backoffs.failed("a", "y", true);
        assert_eq!(streak, 1);
        // min above max is max.
        let mut inverted = Backoffs::new(BackoffPolicy {
            min: Duration::from_secs(10),
            max: Duration::from_secs(1),
        });
        assert!(inverted.failed("z", "x", false).0 <= Duration::from_secs(1));
        backoffs.retain(|key| *key == "b");
        assert_eq!(backoffs.len(), 1);
    }

    #[test]
    fn policy_and_reasons() {
        assert_eq!(
            error_policy(true, Duration::from_secs(3)),
            Action::await_change()
        );
        assert_eq!(
            error_policy(false, Duration::from_secs(3)),
            Action::requeue(Duration::from_secs(3))
        );
        assert_eq!(event_reason("not_found"), "NotFound");
        assert_eq!(event_reason("panic"), "Panic");
        assert_eq!(event_reason("catalog__invalid_"), "CatalogInvalid");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn error_chains_are_joined_once() {
        let err = Outer(std::io::Error::other("inner"));
        assert_eq!(error_chain(&err), "outer: inner");
    }
}
