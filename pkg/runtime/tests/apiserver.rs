//! The runtime against a real kube-apiserver (warmcache-testkit): readiness waits for every
//! cache, a malformed object does not stall its watch, reconciles follow the Lease, a transient
//! error backs off per object while others proceed, a permanent one waits for a change, and the
//! reconcile span continues the trace carried on the object.
//!
//! One test binary on purpose: the control plane starts once per binary. (SIGTERM is tested in
//! its own binary, `tests/sigterm.rs`, since a signal reaches every runtime of a process.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::{Running, http_get, runtime_args};
use http::Method;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use warmcache_runtime::{
    Action, BackoffPolicy, Cache, LeaderElectionArgs, ReconcileError, Reconciler, Runtime,
    RuntimeArgs, WatcherConfig,
};
use warmcache_telemetry::LogFormat;
use warmcache_testkit::{
    ControlPlane, Fault, FaultInjector, TestNamespace, apply_crd, eventually, wait_crd_established,
};

const WAIT: Duration = Duration::from_secs(30);

/// A widget whose stored spec may not fit this type: its CRD preserves unknown fields and
/// checks nothing, so `size: "big"` is stored and cannot be decoded here.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "runtime.testkit.warmcache.io",
    version = "v1",
    kind = "Widget",
    namespaced
)]
struct WidgetSpec {
    size: i64,
}

/// A kind whose CRD is installed only midway through a test.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "runtime.testkit.warmcache.io",
    version = "v1",
    kind = "Gadget",
    namespaced
)]
struct GadgetSpec {
    color: String,
}

fn loose(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        version.schema = Some(
            serde_json::from_value(json!({
                "openAPIV3Schema": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": true
                }
            }))
            .unwrap(),
        );
    }
    crd
}

fn init_telemetry() {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        let config = warmcache_telemetry::TelemetryConfig::from_lookup(
            "runtime-test",
            Some("warn,warmcache_runtime=info"),
            LogFormat::Plain,
            |_| None,
        );
        let guard = warmcache_telemetry::init(&config).unwrap();
        std::mem::forget(guard);
    });
}

async fn plane() -> &'static ControlPlane {
    ControlPlane::shared().await.unwrap()
}

fn args(plane: &ControlPlane) -> RuntimeArgs {
    runtime_args(plane, Duration::from_secs(5))
}

fn leader_args(namespace: &str, lease: &str, identity: &str) -> LeaderElectionArgs {
    LeaderElectionArgs {
        leader_elect: true,
        leader_election_namespace: Some(namespace.to_owned()),
        leader_election_lease: Some(lease.to_owned()),
        leader_election_identity: Some(identity.to_owned()),
        leader_election_lease_duration: Duration::from_secs(3),
        leader_election_renew_deadline: Duration::from_secs(2),
        leader_election_retry_period: Duration::from_millis(500),
    }
}

/// A runtime with a client and a cache of the ConfigMaps of `namespace`.
async fn with_configmaps(plane: &ControlPlane, namespace: &str) -> (Runtime, Cache<ConfigMap>) {
    let mut rt = Runtime::builder("runtime-test", args(plane))
        .without_global_telemetry()
        .with_client()
        .build()
        .await
        .unwrap();
    let cache = rt
        .watch::<ConfigMap>(Some(namespace), WatcherConfig::default())
        .unwrap();
    (rt, cache)
}

async fn create_cm(api: &Api<ConfigMap>, name: &str, annotations: BTreeMap<String, String>) {
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    api.create(&PostParams::default(), &cm).await.unwrap();
}

/// A test error with a chosen category and permanence.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
struct TestError {
    category: &'static str,
    permanent: bool,
    message: String,
}

impl ReconcileError for TestError {
    const CATEGORIES: &'static [&'static str] = &["test_transient", "test_permanent", "test_never"];

    fn category(&self) -> &'static str {
        self.category
    }
    fn is_permanent(&self) -> bool {
        self.permanent
    }
}

/// What every reconcile saw.
#[derive(Clone, Debug)]
struct Seen {
    replica: &'static str,
    name: String,
    at: Instant,
    trace_id: Option<String>,
}

/// Records reconciles; fails `flaky` (transient) and `broken` (permanent) ConfigMaps.
#[derive(Clone)]
struct Recorder {
    replica: &'static str,
    seen: Arc<Mutex<Vec<Seen>>>,
    permanent_reports: Arc<Mutex<Vec<String>>>,
    /// `slow*` reconciles that ran to their end: (replica, name).
    finished: Arc<Mutex<Vec<(&'static str, String)>>>,
}

/// How long a `slow*` reconcile takes.
const SLOW_RECONCILE: Duration = Duration::from_secs(6);

impl Recorder {
    fn new(replica: &'static str, seen: &Arc<Mutex<Vec<Seen>>>) -> Self {
        Self {
            replica,
            seen: Arc::clone(seen),
            permanent_reports: Arc::default(),
            finished: Arc::default(),
        }
    }
}

impl Reconciler<ConfigMap> for Recorder {
    type Error = TestError;

    async fn reconcile(&self, cm: Arc<ConfigMap>) -> Result<Action, TestError> {
        let name = cm.name_any();
        self.seen.lock().unwrap().push(Seen {
            replica: self.replica,
            name: name.clone(),
            at: Instant::now(),
            trace_id: warmcache_telemetry::current_trace_id().map(|id| id.to_string()),
        });
        if name.starts_with("slow") {
            tokio::time::sleep(SLOW_RECONCILE).await;
            self.finished
                .lock()
                .unwrap()
                .push((self.replica, name.clone()));
            return Ok(Action::await_change());
        }
        if name.starts_with("flaky") {
            return Err(TestError {
                category: "test_transient",
                permanent: false,
                message: "the flaky one fails".into(),
            });
        }
        if name.starts_with("broken") {
            return Err(TestError {
                category: "test_permanent",
                permanent: true,
                message: "the broken one cannot work".into(),
            });
        }
        Ok(Action::await_change())
    }

    async fn permanent_failure(&self, cm: Arc<ConfigMap>, _error: &TestError) {
        self.permanent_reports.lock().unwrap().push(cm.name_any());
    }
}

fn seen_for(seen: &Arc<Mutex<Vec<Seen>>>, name: &str) -> Vec<Seen> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|s| s.name == name)
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readiness_waits_for_every_cache_and_a_malformed_object_does_not_stall_its_watch() {
    init_telemetry();
    let plane = plane().await;
    let ns = TestNamespace::new("rt-ready").await.unwrap();
    let client = ns.client.clone();
    apply_crd(&client, &loose(Widget::crd())).await.unwrap();
    wait_crd_established(&client, Widget::crd_name(), WAIT)
        .await
        .unwrap();
    let widgets: Api<DynamicWidget> = Api::namespaced(client.clone(), &ns.name);
    for (name, size) in [
        ("good-1", json!(1)),
        ("bad", json!("big")),
        ("good-2", json!(2)),
    ] {
        widgets
            .create(
                &PostParams::default(),
                &DynamicWidget(json!({
                    "apiVersion": "runtime.testkit.warmcache.io/v1",
                    "kind": "Widget",
                    "metadata": {"name": name},
                    "spec": {"size": size},
                })),
            )
            .await
            .unwrap();
    }

    let mut rt = Runtime::builder("runtime-test", args(plane))
        .without_global_telemetry()
        .with_client()
        .build()
        .await
        .unwrap();
    let admin = rt.admin_addr();
    let cache = rt
        .watch::<Widget>(Some(&ns.name), WatcherConfig::default())
        .unwrap();
    let gadgets = rt
        .watch::<Gadget>(Some(&ns.name), WatcherConfig::default())
        .unwrap();
    let (status, body) = http_get(admin, "/readyz").await;
    assert_eq!(status, 503);
    assert!(body.contains("startup"), "{body}");

    let running = Running::start(rt);
    // The widgets list completes (the malformed one left out); the gadgets kind does not
    // exist yet, so the process stays unready, naming what it waits for.
    eventually("the widget cache to sync", WAIT, || {
        let store = cache.store().clone();
        async move { (store.len() == 2).then_some(()) }
    })
    .await
    .unwrap();
    let mut names: Vec<String> = cache.store().state().iter().map(|w| w.name_any()).collect();
    names.sort();
    assert_eq!(names, ["good-1", "good-2"]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, body) = http_get(admin, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("Gadget cache"), "{body}");
    assert!(!body.contains("Widget cache"), "{body}");

    // Watch events keep flowing past the malformed object.
    widgets
        .create(
            &PostParams::default(),
            &DynamicWidget(json!({
                "apiVersion": "runtime.testkit.warmcache.io/v1",
                "kind": "Widget",
                "metadata": {"name": "bad-2"},
                "spec": {"size": [1]},
            })),
        )
        .await
        .unwrap();
    widgets
        .create(
            &PostParams::default(),
            &DynamicWidget(json!({
                "apiVersion": "runtime.testkit.warmcache.io/v1",
                "kind": "Widget",
                "metadata": {"name": "good-3"},
                "spec": {"size": 3},
            })),
        )
        .await
        .unwrap();
    eventually("good-3 to reach the cache", WAIT, || {
        let store = cache.store().clone();
        async move { (store.len() == 3).then_some(()) }
    })
    .await
    .unwrap();

    // A good object whose new version does not decode leaves the cache (readers must not go on
    // seeing its old spec); fixed, it comes back; deleted while malformed, it stays out.
    let patch = |size: serde_json::Value| Patch::Merge(json!({"spec": {"size": size}}));
    widgets
        .patch("good-1", &PatchParams::default(), &patch(json!("huge")))
        .await
        .unwrap();
    let in_cache = |name: &'static str| {
        let store = cache.store().clone();
        move || {
            let found = store.state().iter().any(|w| w.name_any() == name);
            async move { found }
        }
    };
    eventually(
        "good-1 to leave the cache when it stops decoding",
        WAIT,
        || {
            let probe = in_cache("good-1");
            async move { (!probe().await).then_some(()) }
        },
    )
    .await
    .unwrap();
    widgets
        .patch("good-1", &PatchParams::default(), &patch(json!(7)))
        .await
        .unwrap();
    let back = eventually("good-1 to come back once it decodes again", WAIT, || {
        let store = cache.store().clone();
        async move {
            store
                .state()
                .into_iter()
                .find(|w| w.name_any() == "good-1" && w.spec.size == 7)
        }
    })
    .await
    .unwrap();
    assert_eq!(back.spec.size, 7);
    widgets
        .patch("good-2", &PatchParams::default(), &patch(json!({"no": 1})))
        .await
        .unwrap();
    widgets.delete("good-2", &Default::default()).await.unwrap();
    eventually("good-2 to leave the cache", WAIT, || {
        let probe = in_cache("good-2");
        async move { (!probe().await).then_some(()) }
    })
    .await
    .unwrap();
    assert!(
        cache
            .store()
            .state()
            .iter()
            .all(|w| w.name_any() != "good-2")
    );

    // Once the kind exists, its cache syncs and the process is ready.
    apply_crd(&client, &Gadget::crd()).await.unwrap();
    wait_crd_established(&client, Gadget::crd_name(), WAIT)
        .await
        .unwrap();
    eventually("/readyz to pass", WAIT, || async move {
        (http_get(admin, "/readyz").await.0 == 200).then_some(())
    })
    .await
    .unwrap();
    assert!(gadgets.store().is_empty());

    let (_, metrics) = http_get(admin, "/metrics").await;
    let malformed = metrics
        .lines()
        .find(|l| {
            l.starts_with("warmcache_runtime_test_watch_objects_malformed_total{kind=\"Widget\"}")
        })
        .unwrap_or_else(|| panic!("no malformed counter:\n{metrics}"));
    let count: f64 = malformed.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(count >= 2.0, "{malformed}");

    running.stop().await;
    ns.cleanup().await;
}

/// An untyped widget body, so the test can store what the typed struct cannot express.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(transparent)]
struct DynamicWidget(serde_json::Value);

impl kube::Resource for DynamicWidget {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;
    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "Widget".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "runtime.testkit.warmcache.io".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "widgets".into()
    }
    fn meta(&self) -> &ObjectMeta {
        unreachable!("only used to build request URLs")
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        unreachable!("only used to build request URLs")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reconciles_follow_the_lease() {
    init_telemetry();
    let plane = plane().await;
    let ns = TestNamespace::new("rt-lease").await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(ns.client.clone(), &ns.name);
    let seen = Arc::new(Mutex::new(Vec::new()));

    let finished = Arc::new(Mutex::new(Vec::new()));
    let a_faults = FaultInjector::new();
    let start = |identity: &'static str, client: Client| {
        let seen = Arc::clone(&seen);
        let finished = Arc::clone(&finished);
        let ns = ns.name.clone();
        async move {
            let mut rt = Runtime::builder("runtime-test", args(plane))
                .without_global_telemetry()
                .client(client)
                .with_leader_election(leader_args(&ns, "lease-test", identity))
                .build()
                .await
                .unwrap();
            let cache = rt
                .watch::<ConfigMap>(Some(&ns), WatcherConfig::default())
                .unwrap();
            let mut recorder = Recorder::new(identity, &seen);
            recorder.finished = finished;
            let controller = rt.controller("recorder", &cache, recorder);
            rt.start_controller(controller);
            let leadership = rt.leadership();
            let stop = rt.shutdown_token();
            (leadership, stop, tokio::spawn(rt.run()))
        }
    };
    create_cm(&cms, "cm-1", BTreeMap::new()).await;
    let (a_leads, a_stop, a_run) = start(
        "a",
        plane.client_with_faults(a_faults.clone()).await.unwrap(),
    )
    .await;
    eventually("a to reconcile cm-1", WAIT, || {
        let found = seen_for(&seen, "cm-1").iter().any(|s| s.replica == "a");
        async move { found.then_some(()) }
    })
    .await
    .unwrap();
    let (b_leads, b_stop, b_run) = start("b", plane.client().await.unwrap()).await;
    create_cm(&cms, "cm-2", BTreeMap::new()).await;
    eventually("a to reconcile cm-2", WAIT, || {
        let found = seen_for(&seen, "cm-2").iter().any(|s| s.replica == "a");
        async move { found.then_some(()) }
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(a_leads.is_leader());
    assert!(!b_leads.is_leader());
    assert!(
        seen.lock().unwrap().iter().all(|s| s.replica == "a"),
        "the standby reconciled: {:?}",
        seen.lock().unwrap()
    );

    // A reconcile in flight when the Lease goes must be cancelled, not finished.
    create_cm(&cms, "slow-1", BTreeMap::new()).await;
    eventually("a to start the slow reconcile", WAIT, || {
        let found = seen_for(&seen, "slow-1").iter().any(|s| s.replica == "a");
        async move { found.then_some(()) }
    })
    .await
    .unwrap();
    let slow_started = Instant::now();

    // a's renewals fail: it must stop leading within one lease duration (3 s), and b takes over.
    a_faults.inject(Method::PUT, "/leases/", Fault::ServerError, 10_000);
    let lost_at = Instant::now();
    eventually("a to step down", WAIT, || {
        let leading = a_leads.is_leader();
        async move { (!leading).then_some(()) }
    })
    .await
    .unwrap();
    assert!(
        lost_at.elapsed() <= Duration::from_secs(3),
        "a stepped down after {:?}",
        lost_at.elapsed()
    );
    eventually("b to lead", WAIT, || {
        let leading = b_leads.is_leader();
        async move { leading.then_some(()) }
    })
    .await
    .unwrap();
    create_cm(&cms, "cm-3", BTreeMap::new()).await;
    eventually("b to reconcile cm-3", WAIT, || {
        let found = seen_for(&seen, "cm-3").iter().any(|s| s.replica == "b");
        async move { found.then_some(()) }
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        seen_for(&seen, "cm-3").iter().all(|s| s.replica == "b"),
        "a reconciled without the Lease: {:?}",
        seen_for(&seen, "cm-3")
    );

    // b stops (releasing the Lease); a, healthy again, re-acquires and resumes.
    a_faults.clear();
    b_stop.cancel();
    b_run.await.unwrap().unwrap();
    eventually("a to lead again", WAIT, || {
        let leading = a_leads.is_leader();
        async move { leading.then_some(()) }
    })
    .await
    .unwrap();
    create_cm(&cms, "cm-4", BTreeMap::new()).await;
    eventually("a to reconcile cm-4", WAIT, || {
        let found = seen_for(&seen, "cm-4").iter().any(|s| s.replica == "a");
        async move { found.then_some(()) }
    })
    .await
    .unwrap();

    let wait = (slow_started + SLOW_RECONCILE + Duration::from_secs(1))
        .saturating_duration_since(Instant::now());
    tokio::time::sleep(wait).await;
    assert!(
        !finished
            .lock()
            .unwrap()
            .contains(&("a", "slow-1".to_owned())),
        "a finished a reconcile after it lost the Lease: {:?}",
        finished.lock().unwrap()
    );

    a_stop.cancel();
    a_run.await.unwrap().unwrap();
    ns.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transient_errors_back_off_per_object_and_permanent_ones_wait_for_a_change() {
    init_telemetry();
    let plane = plane().await;
    let ns = TestNamespace::new("rt-errors").await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(ns.client.clone(), &ns.name);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorder = Recorder::new("solo", &seen);
    let permanent_reports = Arc::clone(&recorder.permanent_reports);

    let (mut rt, cache) = with_configmaps(plane, &ns.name).await;
    let admin = rt.admin_addr();
    let controller = rt
        .controller("recorder", &cache, recorder)
        .backoff(BackoffPolicy {
            min: Duration::from_millis(200),
            max: Duration::from_millis(1600),
        })
        .concurrency(2);
    rt.start_controller(controller);
    let running = Running::start(rt);

    create_cm(&cms, "flaky", BTreeMap::new()).await;
    create_cm(&cms, "broken", BTreeMap::new()).await;
    // While both fail, others are reconciled at once.
    for i in 0..3 {
        let name = format!("ok-{i}");
        let created = Instant::now();
        create_cm(&cms, &name, BTreeMap::new()).await;
        let at = eventually("the healthy one to be reconciled", WAIT, || {
            let first = seen_for(&seen, &name).first().map(|s| s.at);
            async move { first }
        })
        .await
        .unwrap();
        assert!(
            at.duration_since(created) < Duration::from_secs(2),
            "{name} waited {:?} behind the failing ones",
            at.duration_since(created)
        );
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let flaky = seen_for(&seen, "flaky");
    assert!(
        (3..=9).contains(&flaky.len()),
        "with 200 ms doubling to 1.6 s, flaky was tried {} times in ~3 s",
        flaky.len()
    );
    let gaps: Vec<Duration> = flaky.windows(2).map(|w| w[1].at - w[0].at).collect();
    assert!(
        gaps.last().unwrap() > gaps.first().unwrap(),
        "the backoff did not grow: {gaps:?}"
    );
    // The permanent one was tried once, reported once, and waits.
    assert_eq!(seen_for(&seen, "broken").len(), 1);
    assert_eq!(*permanent_reports.lock().unwrap(), ["broken"]);
    // A change to it is another try.
    cms.patch(
        "broken",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"fixed": "maybe"}})),
    )
    .await
    .unwrap();
    eventually("broken to be tried again after the change", WAIT, || {
        let tries = seen_for(&seen, "broken").len();
        async move { (tries == 2).then_some(()) }
    })
    .await
    .unwrap();

    // Failures are counted by category, and each streak published one Warning Event.
    let (_, metrics) = http_get(admin, "/metrics").await;
    for category in ["test_transient", "test_permanent"] {
        let line = format!(
            "warmcache_runtime_test_reconcile_failures_total{{category=\"{category}\",controller=\"recorder\"}}"
        );
        assert!(metrics.contains(&line), "{line} missing:\n{metrics}");
    }
    // Every category the error declares, the API categories and panic are exported from the
    // start, at 0 where nothing failed so.
    for category in ["test_never", "conflict", "panic"] {
        let line = format!(
            "warmcache_runtime_test_reconcile_failures_total{{category=\"{category}\",controller=\"recorder\"}} 0"
        );
        assert!(metrics.contains(&line), "{line} missing:\n{metrics}");
    }
    let events: Api<K8sEvent> = Api::namespaced(ns.client.clone(), &ns.name);
    let found = eventually("the Warning Events", WAIT, || {
        let events = events.clone();
        async move {
            let list = events.list(&Default::default()).await.ok()?;
            let reasons: Vec<(String, String)> = list
                .items
                .iter()
                .filter(|e| e.type_.as_deref() == Some("Warning"))
                .filter_map(|e| Some((e.regarding.as_ref()?.name.clone()?, e.reason.clone()?)))
                .collect();
            (reasons.contains(&("flaky".into(), "TestTransient".into()))
                && reasons.contains(&("broken".into(), "TestPermanent".into())))
            .then_some(list.items)
        }
    })
    .await
    .unwrap();
    let flaky_events = found
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("flaky"))
        .count();
    assert_eq!(flaky_events, 1, "one Event per failure streak");

    running.stop().await;
    ns.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_reconcile_span_continues_the_trace_on_the_object() {
    init_telemetry();
    let plane = plane().await;
    let ns = TestNamespace::new("rt-trace").await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(ns.client.clone(), &ns.name);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (mut rt, cache) = with_configmaps(plane, &ns.name).await;
    let controller = rt.controller("recorder", &cache, Recorder::new("solo", &seen));
    rt.start_controller(controller);
    let running = Running::start(rt);

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    create_cm(
        &cms,
        "traced",
        BTreeMap::from([(
            warmcache_telemetry::TRACE_PARENT_ANNOTATION.to_owned(),
            format!("00-{trace_id}-00f067aa0ba902b7-01"),
        )]),
    )
    .await;
    create_cm(&cms, "untraced", BTreeMap::new()).await;
    let traced = eventually("traced to be reconciled", WAIT, || {
        let first = seen_for(&seen, "traced").first().cloned();
        async move { first }
    })
    .await
    .unwrap();
    assert_eq!(traced.trace_id.as_deref(), Some(trace_id));
    let untraced = eventually("untraced to be reconciled", WAIT, || {
        let first = seen_for(&seen, "untraced").first().cloned();
        async move { first }
    })
    .await
    .unwrap();
    let own = untraced.trace_id.expect("a trace of its own");
    assert_ne!(own, trace_id);

    running.stop().await;
    ns.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_change_to_an_owned_object_reconciles_its_owner() {
    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    init_telemetry();
    let plane = plane().await;
    let ns = TestNamespace::new("rt-owns").await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(ns.client.clone(), &ns.name);
    let secrets: Api<Secret> = Api::namespaced(ns.client.clone(), &ns.name);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut rt = Runtime::builder("runtime-test", args(plane))
        .without_global_telemetry()
        .with_client()
        .build()
        .await
        .unwrap();
    let parents = rt
        .watch::<ConfigMap>(Some(&ns.name), WatcherConfig::default())
        .unwrap();
    let children = rt
        .watch_metadata::<Secret>(Some(&ns.name), WatcherConfig::default())
        .unwrap();
    let controller = rt
        .controller("recorder", &parents, Recorder::new("solo", &seen))
        .owns(&children);
    rt.start_controller(controller);
    let running = Running::start(rt);

    create_cm(&cms, "parent", BTreeMap::new()).await;
    create_cm(&cms, "bystander", BTreeMap::new()).await;
    eventually("both to be reconciled once", WAIT, || {
        let done =
            !seen_for(&seen, "parent").is_empty() && !seen_for(&seen, "bystander").is_empty();
        async move { done.then_some(()) }
    })
    .await
    .unwrap();
    let parent = cms.get("parent").await.unwrap();
    let owned = |name: &str, controller: bool| Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: "parent".into(),
                uid: parent.uid().unwrap(),
                controller: Some(controller),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        ..Secret::default()
    };
    secrets
        .create(&PostParams::default(), &owned("child", true))
        .await
        .unwrap();
    eventually("the owner to be reconciled for its child", WAIT, || {
        let tries = seen_for(&seen, "parent").len();
        async move { (tries >= 2).then_some(()) }
    })
    .await
    .unwrap();
    // A non-controller owner reference does not trigger, and bystanders are left alone.
    let before = seen_for(&seen, "parent").len();
    secrets
        .create(&PostParams::default(), &owned("weak-child", false))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(seen_for(&seen, "parent").len(), before);
    assert_eq!(seen_for(&seen, "bystander").len(), 1);
    assert!(children.store().len() >= 2);

    running.stop().await;
    ns.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_server_that_cannot_serve_fails_startup_instead_of_reporting_ready() {
    use warmcache_admission::{
        AdmissionRequest, AdmissionResponse, AdmissionServer, AdmissionServerConfig, DynamicObject,
        Route, TlsFiles,
    };
    use warmcache_runtime::AdmissionArgs;

    init_telemetry();
    let plane = plane().await;
    let pki = warmcache_testkit::WebhookPki::generate().unwrap();
    let certs = tempfile::tempdir().unwrap();
    std::fs::write(certs.path().join("tls.crt"), &pki.cert_pem).unwrap();
    std::fs::write(certs.path().join("tls.key"), &pki.key_pem).unwrap();
    let listen = AdmissionArgs {
        tls_dir: certs.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
    };
    let server = |path: &str| {
        AdmissionServer::new(AdmissionServerConfig::new(TlsFiles::in_dir(certs.path()))).route(
            Route::validating(path, |request: AdmissionRequest<DynamicObject>| {
                AdmissionResponse::from(&request)
            }),
        )
    };
    let mut rt = Runtime::builder("runtime-test", args(plane))
        .without_global_telemetry()
        .build()
        .await
        .unwrap();
    let admin = rt.admin_addr();
    let err = rt
        .serve_admission(&listen, server("no-leading-slash"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no-leading-slash"), "{err}");
    // A server that can serve is taken, and the process is ready with it.
    rt.serve_admission(&listen, server("/validate"))
        .await
        .unwrap();
    let running = Running::start(rt);
    eventually("/readyz to pass", WAIT, || async move {
        (http_get(admin, "/readyz").await.0 == 200).then_some(())
    })
    .await
    .unwrap();
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_is_paced_by_its_rate_limit_and_counts_what_it_sends() {
    init_telemetry();
    let plane = plane().await;
    let ns = TestNamespace::new("rt-qps").await.unwrap();
    let mut args = args(plane);
    args.kube_api_qps = 4.0;
    args.kube_api_burst = 2;
    let rt = Runtime::builder("runtime-test", args)
        .without_global_telemetry()
        .with_client()
        .build()
        .await
        .unwrap();
    let admin = rt.admin_addr();
    let configmaps: Api<ConfigMap> = Api::namespaced(rt.client().unwrap(), &ns.name);
    let running = Running::start(rt);
    let (_, before) = http_get(admin, "/metrics").await;
    assert!(
        before.contains("warmcache_runtime_test_api_request_wait_seconds_count 0"),
        "exported from the start:\n{before}"
    );

    // Two at once (the burst), then one every 250 ms: the sixth goes 1 s after the first.
    let started = Instant::now();
    let gets = (0..6).map(|i| {
        let configmaps = configmaps.clone();
        async move { configmaps.get_opt(&format!("absent-{i}")).await.unwrap() }
    });
    let found = futures::future::join_all(gets).await;
    let elapsed = started.elapsed();
    assert!(found.iter().all(Option::is_none));
    assert!(elapsed >= Duration::from_millis(990), "{elapsed:?}");

    let (_, metrics) = http_get(admin, "/metrics").await;
    let value = |prefix: &str, labels: &[&str]| -> f64 {
        metrics
            .lines()
            .find(|line| line.starts_with(prefix) && labels.iter().all(|l| line.contains(l)))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {prefix} {labels:?} in:\n{metrics}"))
    };
    assert_eq!(
        value("warmcache_runtime_test_api_request_wait_seconds_count", &[]),
        6.0
    );
    // 0 + 0 + 0.25 + 0.5 + 0.75 + 1 s, give or take the requests' own time.
    let waited = value("warmcache_runtime_test_api_request_wait_seconds_sum", &[]);
    assert!((2.0..3.0).contains(&waited), "{waited}");
    assert_eq!(
        value(
            "warmcache_runtime_test_api_requests_total{",
            &["verb=\"get\"", "resource=\"configmaps\""]
        ),
        6.0
    );
    running.stop().await;
}
