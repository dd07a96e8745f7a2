//! `webhook serve`: the mutating pod webhook on the component runtime.
//!
//! Every decision is the pure rewrite of `warmcache_modelvolume` (the one `webhook preview`
//! runs); this shell reads its inputs from caches (bindings in the control namespace, namespace
//! labels, StorageClass `nvcf-sc`, CSIDrivers, the catalog ConfigMap), creates a binding when
//! the pod's cache has none yet, and records every skip (annotation, metric, Event).
//!
//! What it never does: wait for a volume, a Job or a controller; write anything on a dry run;
//! block pod creation. Its registration is `failurePolicy: Ignore`, and a failure of the handler
//! itself admits the pod unchanged with a warning (`OnHandlerError::Allow`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use futures::FutureExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ObjectReference, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::core::admission::Operation;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, field};
use warmcache_admission::patch::{self, PatchOperation};
use warmcache_admission::registration::{
    FailurePolicy, ReinvocationPolicy, Rule, SideEffects, Webhook,
};
use warmcache_admission::{
    AdmissionError, AdmissionServer, AdmissionServerConfig, Mutation, OnHandlerError, Reply,
    Reusable, Reuse, ReusedReview, Route, ServiceTarget, TlsFiles, TypedRequest,
    WebhookConfigurations,
};
use warmcache_api_modelcache::MODEL_CACHE_STORAGE_CLASS;
use warmcache_api_modelcache::v2beta1::ModelCacheBinding;
use warmcache_catalog::{CONFIG_MAP_NAME, CatalogInput, CatalogSnapshot, Gates};
use warmcache_cli::text::{bounded, shown};
use warmcache_kube::EventType;
use warmcache_modelid::{LWS_API_VERSION, LeaderWorkerSet, lws_from_object};
use warmcache_modelvolume::cacheset;
use warmcache_modelvolume::keys::{
    MANAGED_BY_LABEL, MANAGED_BY_VALUE, OPT_OUT, TRACE_PARENT_ANNOTATION as POD_TRACE_PARENT,
};
use warmcache_modelvolume::{
    BindingAction, Options, OptionsError, Request, Skip, SkipReason, StorageInputs, Verdict,
    complete_cache_set, decide, gpu_container, leader_worker_set_name, plan,
    well_formed_traceparent,
};
use warmcache_runtime::{AdmissionArgs, Cache, Runtime, RuntimeArgs, RuntimeError};
use warmcache_telemetry::TelemetryError;

use crate::options::RewriteArgs;

/// The component name: service name of its traces, prefix of its metrics
/// (`warmcache_webhook_*`).
pub const COMPONENT: &str = "webhook";

/// Path the pod webhook is served on.
pub const WEBHOOK_PATH: &str = "/mutate-pods";

/// Name of the webhook in its `MutatingWebhookConfiguration`.
pub const WEBHOOK_NAME: &str = "model-cache.pods.nvca.nvcf.nvidia.io";

/// Name of the generated `MutatingWebhookConfiguration`.
pub const CONFIGURATION_NAME: &str = "warmcache-webhook";

/// The namespace the webhook runs in unless `--namespace` or `$POD_NAMESPACE` says otherwise.
pub const DEFAULT_NAMESPACE: &str = "warmcache-system";

/// The Service in front of the webhook (port 443, which the chart maps to `--listen`).
pub const SERVICE_NAME: &str = "warmcache-webhook";

/// `timeoutSeconds` of the registration: the API server gives up on the webhook after this and
/// (with `failurePolicy: Ignore`) admits the pod unchanged.
pub const TIMEOUT_SECONDS: i32 = 5;

/// How long one admission may run before the server answers for it (unchanged, with a
/// warning); below [`TIMEOUT_SECONDS`] so the answer arrives before the API server gives up.
pub const HANDLER_TIMEOUT: Duration = Duration::from_secs(4);

/// Largest review the pod route answers on the async worker that read it, without the hand-off
/// to the blocking pool and back (see `AdmissionServerConfig::inline_body_bytes`). A realistic
/// pod's review is 3-5 KB and costs about 100 µs; at this size the work a sender can make one
/// worker do stays under a millisecond, and bigger pods (a large annotation, many containers)
/// are answered on the blocking pool, in a handler slot.
pub const INLINE_BODY_BYTES: usize = 16 * 1024;

/// What one admission may spend in all, API calls included: it answers (with
/// `binding-unavailable` when the binding call ran out of time) half a second before the server
/// would answer for it.
pub const ADMISSION_BUDGET: Duration = Duration::from_millis(3500);

/// How long, by default, an admission's answer is reused for equal pods (see `Reused`):
/// decisions that depend on the time (the window of a floating revision's copy, a failure
/// record's expiry) are then taken up to this much earlier than the review, about what the
/// caches lag behind the API server anyway.
pub const DEFAULT_ANSWER_REUSE_MS: u64 = 1000;

/// Longest wait for one API call an admission makes (reading a namespace or a
/// LeaderWorkerSet missing from the caches, creating a binding). The first ModelCacheBinding
/// written through a freshly started kube-apiserver takes about 2 s (measured on the test
/// plane: 2.03 s, then 7 ms), so this leaves room for it.
pub const API_CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// Longest a binding create may take. It runs beside the admissions that wait for it (each
/// waits at most until its own deadline) and is not cancelled when they give up, so a burst of
/// a new model on a loaded API server still ends with its binding created.
pub const BINDING_CREATE_TIMEOUT: Duration = Duration::from_secs(30);

/// Events waiting to be recorded; past this, Events are dropped (and counted), never waited
/// for.
const EVENT_QUEUE: usize = 512;

/// Longest wait for recording one Event.
const EVENT_TIMEOUT: Duration = Duration::from_secs(5);

/// What a call that ran out of the admission's time reports.
const NO_ANSWER: &str = "no answer within the admission's time";

/// The label every namespace carries with its own name.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// `webhook serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Logging, admin server, kubeconfig, shutdown.
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// The HTTPS server.
    #[command(flatten)]
    pub admission: AdmissionArgs,
    /// What the rewrite does.
    #[command(flatten)]
    pub rewrite: RewriteArgs,
    /// The namespace the webhook runs in: never rewritten, and where the catalog ConfigMap
    /// nvcf-storage-capabilities is read.
    #[arg(long, env = "POD_NAMESPACE", value_name = "NS", default_value = DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Milliseconds a rewritten pod's answer is reused for equal pods (the replicas of one
    /// ReplicaSet) while every cached object the admission read is unchanged; 0 decides every
    /// pod anew. At most 60000.
    #[arg(
        long = "answer-reuse-ms",
        value_name = "MS",
        default_value_t = DEFAULT_ANSWER_REUSE_MS,
        value_parser = clap::value_parser!(u64).range(0..=60_000)
    )]
    pub answer_reuse_ms: u64,
}

/// Why the webhook stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The component runtime failed: telemetry, the admin server, a cache, the certificate,
    /// binding, serving.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// An option cannot work.
    #[error("invalid option {0}")]
    Options(#[from] OptionsError),
    /// The webhook's metrics could not be registered.
    #[error(transparent)]
    Metrics(#[from] TelemetryError),
}

/// The Service the generated configuration calls: [`SERVICE_NAME`] in `namespace`, port 443.
pub fn service(namespace: &str) -> ServiceTarget {
    ServiceTarget::new(namespace, SERVICE_NAME, 443)
}

fn not_in(key: &str, values: &[&str]) -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: key.to_owned(),
        operator: "NotIn".to_owned(),
        values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
    }
}

/// The pod webhook's registration: `CREATE` of pods only (a pod's containers and volumes cannot
/// change afterwards), `failurePolicy: Ignore` (a webhook that is down never blocks a pod),
/// [`TIMEOUT_SECONDS`], `sideEffects: NoneOnDryRun` (a dry run creates no binding and records
/// no Event), `reinvocationPolicy: IfNeeded` (a pod changed by a later webhook is seen again;
/// a pod that already reads the cache is admitted unchanged). The selectors keep the API server
/// from calling at all for `kube-system`, the webhook's and the control namespace, namespaces
/// and pods carrying the opt-out label, and warmcache's own pods; the handler checks the same
/// again (and the opt-out annotation, which no selector can see).
pub fn registration(webhook_namespace: &str, control_namespace: &str) -> Webhook {
    let mut excluded = vec!["kube-system", webhook_namespace, control_namespace];
    excluded.sort_unstable();
    excluded.dedup();
    Webhook::new(WEBHOOK_NAME)
        .rule(Rule::for_resource::<Pod>(vec![Operation::Create]))
        .failure_policy(FailurePolicy::Ignore)
        .timeout_seconds(TIMEOUT_SECONDS)
        .side_effects(SideEffects::NoneOnDryRun)
        .reinvocation_policy(ReinvocationPolicy::IfNeeded)
        .namespace_selector(LabelSelector {
            match_expressions: Some(vec![
                not_in(NAMESPACE_NAME_LABEL, &excluded),
                not_in(OPT_OUT, &["true"]),
            ]),
            match_labels: None,
        })
        .object_selector(LabelSelector {
            match_expressions: Some(vec![
                not_in(OPT_OUT, &["true"]),
                not_in(MANAGED_BY_LABEL, &[MANAGED_BY_VALUE]),
            ]),
            match_labels: None,
        })
}

/// The server configuration the webhook runs with (certificate in `tls_dir`, handler timeout
/// [`HANDLER_TIMEOUT`], reviews of at most [`INLINE_BODY_BYTES`] answered on the async worker).
pub fn server_config(tls_dir: &std::path::Path) -> AdmissionServerConfig {
    let mut config = AdmissionServerConfig::new(TlsFiles::in_dir(tls_dir));
    config.handler_timeout = HANDLER_TIMEOUT;
    config.inline_body_bytes = INLINE_BODY_BYTES;
    config
}

/// The pod route with `handler`: typed as `Pod`, admitting the pod unchanged when the handler
/// fails, registered with [`registration`].
fn pod_route<F, Fut>(handler: F, webhook: Webhook) -> Route
where
    F: Fn(TypedRequest<Pod>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Reply<Mutation<Pod>>, AdmitError>> + Send + 'static,
{
    Route::mutating_typed_async::<Pod, _, _, _>(WEBHOOK_PATH, handler)
        .on_error(OnHandlerError::Allow)
        .webhook(webhook)
}

/// The webhook configuration generated from the route (`cargo xtask gen` writes it to
/// `config/webhook/` and the chart's files), for the default namespaces. Only the route's path,
/// type and registration are read: the handler given here answers no review (the served route
/// is built by [`serve`] with the same [`pod_route`] and [`registration`]).
pub fn webhook_configurations() -> Result<WebhookConfigurations, AdmissionError> {
    let webhook = registration(
        DEFAULT_NAMESPACE,
        warmcache_api_modelcache::DEFAULT_CONTROL_NAMESPACE,
    );
    AdmissionServer::new(server_config(std::path::Path::new("/unused")))
        .route(pod_route(
            |_request: TypedRequest<Pod>| async { Ok(Reply::new(Mutation::Allow)) },
            webhook,
        ))
        .configurations(CONFIGURATION_NAME, &service(DEFAULT_NAMESPACE))
}

/// `webhook serve`: serves on the component runtime until SIGTERM or SIGINT.
pub fn run(args: ServeArgs) -> Result<(), ServeError> {
    warmcache_runtime::block_on(serve(args))
}

async fn serve(args: ServeArgs) -> Result<(), ServeError> {
    let options = args.rewrite.options(Some(args.namespace.clone()))?;
    let mut runtime = Runtime::builder(COMPONENT, args.runtime)
        .version(env!("CARGO_PKG_VERSION"))
        .with_client()
        .paced_by_admissions()
        .build()
        .await?;
    let metrics = PodMetrics::register(runtime.metrics())?;
    let by_name = |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
    let caches = Caches {
        bindings: runtime.watch(Some(&options.control_namespace), watcher::Config::default())?,
        namespaces: runtime.watch_cluster_metadata::<Namespace>(watcher::Config::default())?,
        storage_classes: runtime.watch(None, by_name(MODEL_CACHE_STORAGE_CLASS))?,
        csi_drivers: runtime.watch(None, watcher::Config::default())?,
        catalogs: runtime.watch(Some(&args.namespace), by_name(CONFIG_MAP_NAME))?,
    };
    let synced = Arc::new(AtomicBool::new(false));
    {
        let synced = Arc::clone(&synced);
        let caches = caches.clone();
        let stop = runtime.shutdown_token();
        runtime.spawn("cache sync", async move {
            tokio::select! {
                // Stopped before the caches synced: nothing to report.
                () = stop.cancelled() => return Ok(()),
                ready = caches.wait_until_ready() => ready?,
            }
            synced.store(true, Ordering::Release);
            tracing::info!("caches synced: admitting pods");
            Ok::<(), RuntimeError>(())
        });
    }
    let (events, queue) = mpsc::channel(EVENT_QUEUE);
    if let Some(recorder) = runtime.recorder().cloned() {
        let stop = runtime.shutdown_token();
        runtime.spawn("pod events", record_events(recorder, queue, stop));
    }
    let admitter = Arc::new(Admitter {
        client: runtime.client()?,
        gates: args.rewrite.feature_gates.0,
        webhook_namespace: args.namespace.clone(),
        caches,
        synced,
        catalog: CatalogMemo::default(),
        creating: Arc::new(Mutex::new(HashMap::new())),
        metrics,
        events,
        registration: registration(&args.namespace, &options.control_namespace),
        options,
        reuse_window: Duration::from_millis(args.answer_reuse_ms),
    });
    tracing::info!(
        namespace = %admitter.webhook_namespace,
        control_namespace = %admitter.options.control_namespace,
        gpu_resources = %admitter.options.gpu_resources.join(","),
        "pod webhook configured"
    );
    let webhook = admitter.registration.clone();
    let handler = {
        let admitter = Arc::clone(&admitter);
        move |request: TypedRequest<Pod>| {
            let admitter = Arc::clone(&admitter);
            async move { admitter.admit(request).await }
        }
    };
    let server = AdmissionServer::new(server_config(&args.admission.tls_dir))
        .route(pod_route(handler, webhook));
    runtime.serve_admission(&args.admission, server).await?;
    runtime.run().await?;
    Ok(())
}

/// A Warning Event about a pod that was left alone.
#[derive(Debug)]
struct PodEvent {
    regarding: ObjectReference,
    reason: String,
    note: String,
}

async fn record_events(
    recorder: warmcache_kube::EventRecorder,
    mut queue: mpsc::Receiver<PodEvent>,
    stop: CancellationToken,
) -> Result<(), std::convert::Infallible> {
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            event = queue.recv() => event,
        };
        let Some(event) = event else { return Ok(()) };
        let publish = recorder.publish(
            &event.regarding,
            EventType::Warning,
            &event.reason,
            "Admit",
            Some(&event.note),
        );
        if tokio::time::timeout(EVENT_TIMEOUT, publish).await.is_err() {
            tracing::warn!(reason = %event.reason, "an Event was not recorded in time; dropped");
        }
    }
}

/// What the Event about a pod refers to: the pod when it has a name; a pod created from
/// `generateName` has none yet at admission, so its controller (ReplicaSet, Job, StatefulSet,
/// LeaderWorkerSet) instead; `None` when it has neither.
pub fn event_target(pod: &Pod, namespace: &str) -> Option<ObjectReference> {
    if let Some(name) = pod.metadata.name.as_deref().filter(|n| !n.is_empty()) {
        return Some(ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            namespace: Some(namespace.to_owned()),
            name: Some(name.to_owned()),
            ..ObjectReference::default()
        });
    }
    let owner = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))?;
    Some(ObjectReference {
        api_version: Some(owner.api_version.clone()),
        kind: Some(owner.kind.clone()),
        namespace: Some(namespace.to_owned()),
        name: Some(owner.name.clone()),
        uid: Some(owner.uid.clone()).filter(|u| !u.is_empty()),
        ..ObjectReference::default()
    })
}

/// The note of the Event about `pod`: the skip message, prefixed with the pod when the Event
/// goes on its controller.
pub fn event_note(pod: &Pod, skip: &Skip) -> String {
    let named = pod.metadata.name.as_deref().is_some_and(|n| !n.is_empty());
    let note = if named {
        skip.message.clone()
    } else {
        format!(
            "pod {}*: {}",
            shown(pod.metadata.generate_name.as_deref().unwrap_or_default()),
            skip.message
        )
    };
    bounded(&note, warmcache_modelvolume::MAX_MESSAGE_BYTES)
}

/// The webhook's own metrics (beside the runtime's `warmcache_admission_*`).
#[derive(Clone, Debug)]
struct PodMetrics {
    /// Admissions by outcome and skip reason (`none` unless skipped).
    admissions: IntCounterVec,
    /// Seconds from the review to the answer, by outcome.
    duration: HistogramVec,
    /// Binding create calls by result.
    bindings: IntCounterVec,
    /// Events by result.
    events: IntCounterVec,
    /// Rewritten pods with a compile-cache set, by role.
    cache_sets: IntCounterVec,
    /// Admissions answered with an earlier equal pod's answer.
    reused: IntCounter,
}

/// Roles of a rewritten pod in its compile-cache set (metric label `role`).
const SET_ROLES: [&str; 5] = ["capture", "seed", "local", "unjoinable", "unavailable"];

/// Outcomes of an admission (metric label `outcome`).
const OUTCOMES: [&str; 7] = [
    "rewritten",
    "capture_source",
    "unchanged",
    "skipped",
    "out_of_scope",
    "error",
    "cancelled",
];

impl PodMetrics {
    fn register(metrics: &warmcache_telemetry::Metrics) -> Result<Self, TelemetryError> {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).map_err(|source| {
                TelemetryError::Metrics {
                    what: name.to_owned(),
                    source,
                }
            })
        };
        let admissions = counter(
            "pod_admissions_total",
            "Pod admissions by outcome (rewritten, capture_source: keeps its own download, captured once Ready, unchanged, skipped, out_of_scope, error: admitted unchanged with a warning, cancelled: the server answered for it at its timeout) and skip reason (none unless skipped or out of scope).",
            &["outcome", "reason"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "pod_admission_duration_seconds",
                "Seconds from receiving a pod review to answering it, by outcome.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
            &["outcome"],
        )
        .map_err(|source| TelemetryError::Metrics {
            what: "pod_admission_duration_seconds".to_owned(),
            source,
        })?;
        let bindings = counter(
            "bindings_total",
            "ModelCacheBinding create calls by result: created, existing (another admission created it first), failed.",
            &["result"],
        )?;
        let events = counter(
            "pod_events_total",
            "Warning Events about pods left alone, by result: queued, dropped (queue full).",
            &["result"],
        )?;
        let cache_sets = counter(
            "compile_cache_set_admissions_total",
            "Rewritten pods that have a compile-cache set, by role: capture (its compile caches may be collected once Ready), seed (it starts from the complete set), local (the set is complete but the namespace has no view yet), unjoinable (the set's binding may not be joined now: deleting, Retiring, failed, or read through hostPath), unavailable (the set's binding could not be created).",
            &["role"],
        )?;
        let reused = IntCounter::new(
            "pod_admissions_reused_total",
            "Pod admissions answered with the answer to an earlier equal pod of the same namespace (a replica of the same ReplicaSet) whose cached inputs are unchanged; also counted in pod_admissions_total.",
        )
        .map_err(|source| TelemetryError::Metrics {
            what: "pod_admissions_reused_total".to_owned(),
            source,
        })?;
        // Every series exported with 0 from the start.
        for role in SET_ROLES {
            cache_sets.with_label_values(&[role]);
        }
        for reason in SkipReason::ALL {
            let outcome = if reason.in_scope() {
                "skipped"
            } else {
                "out_of_scope"
            };
            admissions.with_label_values(&[outcome, reason.code()]);
        }
        for outcome in [
            "rewritten",
            "capture_source",
            "unchanged",
            "error",
            "cancelled",
        ] {
            admissions.with_label_values(&[outcome, "none"]);
        }
        for outcome in OUTCOMES {
            duration.with_label_values(&[outcome]);
        }
        for result in ["created", "existing", "failed"] {
            bindings.with_label_values(&[result]);
        }
        for result in ["queued", "dropped"] {
            events.with_label_values(&[result]);
        }
        metrics.register(admissions.clone())?;
        metrics.register(duration.clone())?;
        metrics.register(bindings.clone())?;
        metrics.register(events.clone())?;
        metrics.register(cache_sets.clone())?;
        metrics.register(reused.clone())?;
        Ok(Self {
            admissions,
            duration,
            bindings,
            events,
            cache_sets,
            reused,
        })
    }
}

/// The caches admission reads.
#[derive(Clone)]
struct Caches {
    bindings: Cache<ModelCacheBinding>,
    namespaces: Cache<PartialObjectMeta<Namespace>>,
    storage_classes: Cache<StorageClass>,
    csi_drivers: Cache<CSIDriver>,
    catalogs: Cache<ConfigMap>,
}

impl Caches {
    async fn wait_until_ready(&self) -> Result<(), RuntimeError> {
        self.bindings.wait_until_ready().await?;
        self.namespaces.wait_until_ready().await?;
        self.storage_classes.wait_until_ready().await?;
        self.csi_drivers.wait_until_ready().await?;
        self.catalogs.wait_until_ready().await
    }
}

/// The catalog loaded from the cached ConfigMap, kept while the ConfigMap (by UID and
/// resourceVersion) stays the same, so admissions do not parse and validate it each time.
#[derive(Default)]
struct CatalogMemo {
    last: Mutex<Option<Memo>>,
}

type ConfigMapVersion = Option<(String, String)>;

struct Memo {
    version: ConfigMapVersion,
    /// `None`: the ConfigMap does not load (the decision reports why).
    snapshot: Option<Arc<CatalogSnapshot>>,
}

impl CatalogMemo {
    fn snapshot(&self, config_map: Option<&ConfigMap>) -> Option<Arc<CatalogSnapshot>> {
        let version = config_map.map(|c| {
            (
                c.metadata.uid.clone().unwrap_or_default(),
                c.metadata.resource_version.clone().unwrap_or_default(),
            )
        });
        if let Some(memo) = lock(&self.last).as_ref()
            && memo.version == version
        {
            return memo.snapshot.clone();
        }
        // Parsed without the lock: admissions of other pods go on meanwhile (two admissions
        // seeing a new version at once both parse it; the result is the same).
        let snapshot = match CatalogSnapshot::from_config_map(config_map) {
            Ok(s) => {
                tracing::info!(
                    revision = %s.revision(),
                    builtin = s.is_builtin(),
                    "storage capability catalog loaded"
                );
                Some(Arc::new(s))
            }
            Err(error) => {
                tracing::warn!(%error, "the catalog ConfigMap does not load; bindings are not created until it is fixed");
                None
            }
        };
        *lock(&self.last) = Some(Memo {
            version,
            snapshot: snapshot.clone(),
        });
        snapshot
    }
}

/// Why an admission could not be decided (the pod is admitted unchanged, with a warning).
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    /// The caches have not completed their first list: a decision now could be wrong (no
    /// StorageClass, no binding yet seen).
    #[error("the webhook's caches are not synced yet")]
    NotSynced,
    /// The pod's namespace is neither cached nor readable.
    #[error("reading namespace {namespace}: {why}")]
    Namespace {
        /// The namespace.
        namespace: String,
        /// The API error or the timeout.
        why: String,
    },
    /// The pod's LeaderWorkerSet could not be read.
    #[error("reading LeaderWorkerSet {namespace}/{name}: {why}")]
    LeaderWorkerSet {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The API error or the timeout.
        why: String,
    },
}

type Created = Result<Arc<ModelCacheBinding>, String>;

/// A binding create in flight, which every admission of the binding waits for.
type PendingCreate = futures::future::Shared<futures::future::BoxFuture<'static, Created>>;

/// Records one admission's outcome and duration exactly once, as `cancelled` when dropped
/// before it finished.
struct Pending<'a> {
    metrics: &'a PodMetrics,
    started: Instant,
    done: bool,
}

impl Pending<'_> {
    fn finish(&mut self, ending: &Ending) {
        self.record(ending.outcome, ending.reason);
        self.done = true;
    }

    fn record(&self, outcome: &str, reason: &str) {
        self.metrics
            .admissions
            .with_label_values(&[outcome, reason])
            .inc();
        self.metrics
            .duration
            .with_label_values(&[outcome])
            .observe(self.started.elapsed().as_secs_f64());
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.record("cancelled", "none");
        }
    }
}

/// One admission's span, its decision recorded as it is taken (`reused`: answered with an
/// earlier equal pod's answer).
fn admission_span(namespace: &str, pod: &str, dry_run: bool) -> tracing::Span {
    tracing::info_span!(
        "pod_admission",
        namespace,
        pod,
        dry_run,
        model.uri = field::Empty,
        binding = field::Empty,
        cache_set = field::Empty,
        decision = field::Empty,
        reason = field::Empty,
        reused = field::Empty,
    )
}

/// How a pod is named in the admission's span: its name, or its `generateName` and `*`.
fn span_name(pod: &Pod) -> String {
    pod.metadata
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| pod.metadata.generate_name.clone().map(|g| format!("{g}*")))
        .unwrap_or_default()
}

type NamespaceMeta = PartialObjectMeta<Namespace>;

/// What an admission read from the caches: each object as found (`None`: absent), to check
/// that a reused answer's inputs are unchanged.
#[derive(Default)]
struct Read {
    /// The pod's namespace; `None` when it was read from the API server (not reusable).
    namespace: Option<(ObjectRef<NamespaceMeta>, Arc<NamespaceMeta>)>,
    bindings: Vec<(ObjectRef<ModelCacheBinding>, Option<Arc<ModelCacheBinding>>)>,
    class: Option<(ObjectRef<StorageClass>, Option<Arc<StorageClass>>)>,
    driver: Option<(ObjectRef<CSIDriver>, Option<Arc<CSIDriver>>)>,
    config_map: Option<(ObjectRef<ConfigMap>, Option<Arc<ConfigMap>>)>,
}

/// The same object, or both absent.
fn same<K>(found: Option<Arc<K>>, read: Option<&Arc<K>>) -> bool {
    match (found, read) {
        (Some(found), Some(read)) => Arc::ptr_eq(&found, read),
        (None, None) => true,
        _ => false,
    }
}

impl Read {
    /// Whether every object read is still the cached one (a watch event replaces it).
    fn unchanged(&self, caches: &Caches) -> bool {
        let Some((key, namespace)) = &self.namespace else {
            return false;
        };
        same(caches.namespaces.store().get(key), Some(namespace))
            && self
                .bindings
                .iter()
                .all(|(key, read)| same(caches.bindings.store().get(key), read.as_ref()))
            && self.class.as_ref().is_none_or(|(key, read)| {
                same(caches.storage_classes.store().get(key), read.as_ref())
            })
            && self
                .driver
                .as_ref()
                .is_none_or(|(key, read)| same(caches.csi_drivers.store().get(key), read.as_ref()))
            && self
                .config_map
                .as_ref()
                .is_none_or(|(key, read)| same(caches.catalogs.store().get(key), read.as_ref()))
    }
}

/// The decision a reusable answer records in the span.
struct Decided {
    uri: String,
    binding: String,
    cache_set: Option<String>,
}

/// A rewritten pod's answer, reused for the equal pods of its ReplicaSet (see
/// [`warmcache_admission::reuse`]) for at most `--answer-reuse-ms` while every cached object the
/// admission read is unchanged. Each reuse is an admission of its own: its span, its metrics,
/// its trace context on the pod.
struct Reused {
    read: Read,
    decided_at: Instant,
    window: Duration,
    caches: Caches,
    synced: Arc<AtomicBool>,
    metrics: PodMetrics,
    namespace: String,
    pod: String,
    decided: Decided,
    ending: Ending,
    set_role: Option<&'static str>,
    /// Whether the admission's trace context is sent per review.
    traced: bool,
}

/// The patch operation setting the pod's trace context annotation.
fn trace_operation(traceparent: &str) -> PatchOperation {
    patch::add(
        patch::pointer(["metadata", "annotations", POD_TRACE_PARENT]),
        serde_json::Value::String(traceparent.to_owned()),
    )
}

impl Reuse for Reused {
    fn holds(&self) -> bool {
        self.decided_at.elapsed() < self.window
            && self.synced.load(Ordering::Acquire)
            && self.read.unchanged(&self.caches)
    }

    fn reused(&self, review: &ReusedReview<'_>) -> Vec<PatchOperation> {
        let started = Instant::now();
        let span = admission_span(&self.namespace, &self.pod, review.dry_run);
        span.record("model.uri", self.decided.uri.as_str());
        span.record("binding", self.decided.binding.as_str());
        if let Some(set) = &self.decided.cache_set {
            span.record("cache_set", set.as_str());
        }
        span.record("decision", self.ending.outcome);
        span.record("reason", self.ending.reason);
        span.record("reused", true);
        let operations = span.in_scope(|| {
            let mut carrier = BTreeMap::new();
            warmcache_telemetry::inject_current(&mut carrier);
            carrier
                .get(warmcache_telemetry::TRACE_PARENT_ANNOTATION)
                .filter(|tp| self.traced && well_formed_traceparent(tp))
                .map(|tp| vec![trace_operation(tp)])
                .unwrap_or_default()
        });
        if let Some(role) = self.set_role {
            self.metrics.cache_sets.with_label_values(&[role]).inc();
        }
        let mut pending = Pending {
            metrics: &self.metrics,
            started,
            done: false,
        };
        pending.finish(&self.ending);
        self.metrics.reused.inc();
        operations
    }
}

/// When an API call must end: [`API_CALL_TIMEOUT`] from now, or `deadline` if sooner.
fn call_deadline(deadline: tokio::time::Instant) -> tokio::time::Instant {
    deadline.min(tokio::time::Instant::now() + API_CALL_TIMEOUT)
}

struct Admitter {
    client: Client,
    options: Options,
    gates: Gates,
    webhook_namespace: String,
    caches: Caches,
    /// Whether every cache completed its first list.
    synced: Arc<AtomicBool>,
    catalog: CatalogMemo,
    /// Creates in flight by binding name: concurrent admissions of one model share one call.
    creating: Arc<Mutex<HashMap<String, PendingCreate>>>,
    metrics: PodMetrics,
    events: mpsc::Sender<PodEvent>,
    registration: Webhook,
    /// How long a rewritten pod's answer is reused for equal pods; zero: never.
    reuse_window: Duration,
}

/// What one admission ended as, for the span and the metrics.
#[derive(Clone, Copy, Debug)]
struct Ending {
    outcome: &'static str,
    reason: &'static str,
}

impl Ending {
    const fn new(outcome: &'static str) -> Self {
        Self {
            outcome,
            reason: "none",
        }
    }

    fn skip(skip: &Skip) -> Self {
        Self {
            outcome: if skip.reason.in_scope() {
                "skipped"
            } else {
                "out_of_scope"
            },
            reason: skip.reason.code(),
        }
    }
}

fn lws_resource() -> ApiResource {
    let (group, version) = LWS_API_VERSION
        .split_once('/')
        .unwrap_or(("leaderworkerset.x-k8s.io", "v1"));
    ApiResource {
        group: group.to_owned(),
        version: version.to_owned(),
        api_version: LWS_API_VERSION.to_owned(),
        kind: "LeaderWorkerSet".to_owned(),
        plural: "leaderworkersets".to_owned(),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

impl Admitter {
    /// One review: the span, the metrics, the answer.
    async fn admit(&self, request: TypedRequest<Pod>) -> Result<Reply<Mutation<Pod>>, AdmitError> {
        let started = Instant::now();
        let pod_name = request.object.as_ref().map(span_name).unwrap_or_default();
        let span = admission_span(
            request.namespace.as_deref().unwrap_or_default(),
            &pod_name,
            request.dry_run,
        );
        // Counted as cancelled unless it ends here: the server answered for it at its timeout.
        let mut pending = Pending {
            metrics: &self.metrics,
            started,
            done: false,
        };
        let deadline = tokio::time::Instant::from_std(started) + ADMISSION_BUDGET;
        let result = self
            .review(request, deadline)
            .instrument(span.clone())
            .await;
        let ending = match &result {
            Ok((ending, _)) => ending,
            Err(_) => &Ending::new("error"),
        };
        span.record("decision", ending.outcome);
        span.record("reason", ending.reason);
        pending.finish(ending);
        if let Err(error) = &result {
            span.in_scope(
                || tracing::warn!(%error, "pod admitted unchanged: admission could not be decided"),
            );
        }
        result.map(|(_, reply)| reply)
    }

    async fn review(
        &self,
        request: TypedRequest<Pod>,
        deadline: tokio::time::Instant,
    ) -> Result<(Ending, Reply<Mutation<Pod>>), AdmitError> {
        let allow = |ending| Ok((ending, Reply::new(Mutation::Allow)));
        let Some(pod) = request.object.as_ref() else {
            return allow(Ending::new("unchanged"));
        };
        if request.operation != Operation::Create || request.sub_resource.is_some() {
            return allow(Ending::new("unchanged"));
        }
        // The cheapest check first: most pods request no GPU, and need no lookup at all.
        if gpu_container(pod, &self.options.gpu_resources).is_none() {
            return allow(Ending {
                outcome: "out_of_scope",
                reason: SkipReason::NotGpuPod.code(),
            });
        }
        let namespace = request
            .namespace
            .clone()
            .or_else(|| pod.metadata.namespace.clone())
            .unwrap_or_default();
        if !self.synced.load(Ordering::Acquire) {
            return Err(AdmitError::NotSynced);
        }
        let (labels, namespace_read) = self.namespace_labels(&namespace, deadline).await?;
        let mut read = Read {
            namespace: namespace_read.map(|meta| (ObjectRef::new(&namespace), meta)),
            ..Read::default()
        };
        let group = self.leader_worker_set(pod, &namespace, deadline).await?;
        let mut carrier = BTreeMap::new();
        warmcache_telemetry::inject_current(&mut carrier);
        let traceparent = carrier.get(warmcache_telemetry::TRACE_PARENT_ANNOTATION);
        let req = Request {
            pod,
            namespace: &namespace,
            namespace_labels: &labels,
            leader_worker_set: group.as_ref(),
            traceparent: traceparent.map(String::as_str),
            options: &self.options,
        };
        let now = k8s_openapi::jiff::Timestamp::now();
        let verdict = match plan(&req) {
            Err(verdict) => verdict,
            Ok(plan) => {
                let plan = plan.at(now);
                let span = tracing::Span::current();
                span.record("model.uri", plan.uri());
                span.record("binding", plan.binding_name());
                let mut lookup = |name: &str| {
                    let key = ObjectRef::new(name).within(plan.binding_namespace());
                    let found = self.caches.bindings.store().get(&key);
                    read.bindings.push((key, found.clone()));
                    found
                };
                let binding = lookup(plan.binding_name());
                if let Some(set) = plan.cache_set() {
                    span.record("cache_set", set.binding_name());
                }
                let set_binding = plan.cache_set().and_then(|s| lookup(s.binding_name()));
                let class_key = ObjectRef::new(MODEL_CACHE_STORAGE_CLASS);
                let class = self.caches.storage_classes.store().get(&class_key);
                read.class = Some((class_key, class.clone()));
                let driver = class.as_ref().and_then(|c| {
                    let key = ObjectRef::new(&c.provisioner);
                    let found = self.caches.csi_drivers.store().get(&key);
                    read.driver = Some((key, found.clone()));
                    found
                });
                let config_map_key =
                    ObjectRef::new(CONFIG_MAP_NAME).within(&self.webhook_namespace);
                let config_map = self.caches.catalogs.store().get(&config_map_key);
                read.config_map = Some((config_map_key, config_map.clone()));
                let snapshot = self.catalog.snapshot(config_map.as_deref());
                let catalog = match (&snapshot, config_map.as_deref()) {
                    (Some(s), _) => CatalogInput::Loaded(s),
                    (None, Some(cm)) => CatalogInput::ConfigMap(cm),
                    (None, None) => CatalogInput::Absent,
                };
                let storage = StorageInputs {
                    storage_class: class.as_deref(),
                    csi_driver: driver.as_deref(),
                    catalog,
                    gates: self.gates,
                };
                decide(
                    &req,
                    plan,
                    binding.as_deref(),
                    set_binding.as_deref(),
                    &storage,
                    now,
                )
            }
        };
        let (ending, reply) = match verdict {
            Verdict::Unchanged(_) => (Ending::new("unchanged"), Reply::new(Mutation::Allow)),
            Verdict::Skip(skip) => self.skipped(pod, &namespace, &skip, request.dry_run),
            Verdict::Rewrite(rewrite) => {
                let rewritten = if rewrite.plan.capture().is_some() {
                    "capture_source"
                } else {
                    "rewritten"
                };
                let wanted = match &rewrite.binding {
                    BindingAction::Join { .. } => None,
                    BindingAction::Create(wanted) => Some(wanted.as_ref().clone()),
                };
                let set_action = rewrite.cache_set.clone();
                let has_set = rewrite.plan.cache_set().is_some();
                // Joining bindings that exist, with nothing created and every input cached: the
                // answer holds for the ReplicaSet's other pods while those inputs stay the same.
                let reusable = wanted.is_none()
                    && !matches!(set_action, Some(BindingAction::Create(_)))
                    && leader_worker_set_name(pod).is_none()
                    && read.namespace.is_some();
                let decided = reusable.then(|| Decided {
                    uri: rewrite.plan.uri().to_owned(),
                    binding: rewrite.plan.binding_name().to_owned(),
                    cache_set: rewrite
                        .plan
                        .cache_set()
                        .map(|set| set.binding_name().to_owned()),
                });
                let mut notes = Vec::new();
                let admitted = match wanted {
                    None => Ok(rewrite.pod),
                    Some(wanted) if request.dry_run => {
                        notes.push(would_create(&wanted));
                        Ok(rewrite.pod)
                    }
                    Some(wanted) => match self.create_binding(&wanted, deadline).await {
                        Err(why) => Err(rewrite.unavailable(why)),
                        Ok(stored) => rewrite.complete(&stored),
                    },
                };
                match admitted {
                    Err(skip) => self.skipped(pod, &namespace, &skip, false),
                    Ok(admitted) => {
                        // The compile-cache set's binding: a pod whose set binding could not be
                        // created keeps its caches local; the model copy is unaffected.
                        let admitted = match &set_action {
                            Some(BindingAction::Create(wanted)) if request.dry_run => {
                                notes.push(would_create(wanted));
                                admitted
                            }
                            Some(BindingAction::Create(wanted)) => {
                                let stored = match self.create_binding(wanted, deadline).await {
                                    Ok(stored) => Some(stored),
                                    Err(why) => {
                                        tracing::warn!(
                                            binding = wanted.metadata.name.as_deref().unwrap_or_default(),
                                            %why,
                                            "the compile-cache set's binding could not be created; the pod keeps its compile caches local"
                                        );
                                        None
                                    }
                                };
                                complete_cache_set(set_action.as_ref(), admitted, stored.as_deref())
                            }
                            _ => admitted,
                        };
                        let set_role = has_set.then(|| {
                            cacheset::role_of(&admitted).unwrap_or(match set_action {
                                Some(_) => "unavailable",
                                None => "unjoinable",
                            })
                        });
                        if let Some(role) = set_role {
                            self.metrics.cache_sets.with_label_values(&[role]).inc();
                        }
                        let ending = Ending::new(rewritten);
                        let mut admitted = admitted;
                        let reuse = match decided {
                            Some(decided) if notes.is_empty() => self.reusable(
                                pod,
                                &namespace,
                                &mut admitted,
                                read,
                                decided,
                                ending,
                                set_role,
                            ),
                            _ => None,
                        };
                        let mut reply = Reply::new(Mutation::Mutated(admitted));
                        for note in notes {
                            reply = reply.warning(note);
                        }
                        if let Some(reuse) = reuse {
                            reply = reply.reusable(reuse);
                        }
                        (ending, reply)
                    }
                }
            }
        };
        Ok((ending, reply))
    }

    /// A skip: the annotation (in-scope reasons), the Event and a warning (reasons that warrant
    /// one; no Event on a dry run).
    fn skipped(
        &self,
        pod: &Pod,
        namespace: &str,
        skip: &Skip,
        dry_run: bool,
    ) -> (Ending, Reply<Mutation<Pod>>) {
        let ending = Ending::skip(skip);
        if !skip.reason.in_scope() {
            return (ending, Reply::new(Mutation::Allow));
        }
        let Some(annotated) = skip.annotate(pod) else {
            // The pod records this skip already: a reinvocation (another webhook changed the
            // pod after us). It was counted, warned about and sent as an Event the first time.
            return (Ending::new("unchanged"), Reply::new(Mutation::Allow));
        };
        let mut reply = Reply::new(Mutation::Mutated(annotated));
        if skip.reason.warrants_event() {
            reply = reply.warning(bounded(
                &format!(
                    "model cache not used ({}): {}",
                    skip.reason.code(),
                    skip.message
                ),
                480,
            ));
            if !dry_run && let Some(regarding) = event_target(pod, namespace) {
                let event = PodEvent {
                    regarding,
                    reason: skip.reason.event_reason(),
                    note: event_note(pod, skip),
                };
                let result = match self.events.try_send(event) {
                    Ok(()) => "queued",
                    Err(_) => "dropped",
                };
                self.metrics.events.with_label_values(&[result]).inc();
            }
        }
        (ending, reply)
    }

    /// The offer to reuse the answer `admitted` to `pod` (see [`Reused`]). The admission's
    /// trace context is taken out of `admitted` and sent per review, so the kept patch holds
    /// nothing of this admission's own.
    #[allow(clippy::too_many_arguments)]
    fn reusable(
        &self,
        pod: &Pod,
        namespace: &str,
        admitted: &mut Pod,
        read: Read,
        decided: Decided,
        ending: Ending,
        set_role: Option<&'static str>,
    ) -> Option<Reusable> {
        if self.reuse_window.is_zero() {
            return None;
        }
        let sent = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(POD_TRACE_PARENT))
            .cloned();
        // A rewritten pod always carries annotations (its binding's name and UID).
        let annotations = admitted.metadata.annotations.as_mut()?;
        let own = annotations.get(POD_TRACE_PARENT).cloned();
        let mut per_review = Vec::new();
        if own != sent {
            // The admission's own trace context: sent after the kept patch, which leaves the
            // annotation as the pod was sent.
            let own = own?;
            match &sent {
                Some(value) => annotations.insert(POD_TRACE_PARENT.to_owned(), value.clone()),
                None => annotations.remove(POD_TRACE_PARENT),
            };
            per_review.push(trace_operation(&own));
        }
        // The per-review operation adds to the annotations the kept patch leaves.
        if annotations.is_empty() {
            return None;
        }
        let reused = Reused {
            read,
            decided_at: Instant::now(),
            window: self.reuse_window,
            caches: self.caches.clone(),
            synced: Arc::clone(&self.synced),
            metrics: self.metrics.clone(),
            namespace: namespace.to_owned(),
            pod: span_name(pod),
            decided,
            ending,
            set_role,
            traced: !per_review.is_empty(),
        };
        Some(Reusable::new(Arc::new(reused), per_review))
    }

    /// The labels of `namespace`: from the cache (with the cached object), or read once when
    /// the cache has not seen the namespace yet (created just before the pod).
    async fn namespace_labels(
        &self,
        namespace: &str,
        deadline: tokio::time::Instant,
    ) -> Result<(BTreeMap<String, String>, Option<Arc<NamespaceMeta>>), AdmitError> {
        if let Some(meta) = self
            .caches
            .namespaces
            .store()
            .get(&ObjectRef::new(namespace))
        {
            return Ok((meta.metadata.labels.clone().unwrap_or_default(), Some(meta)));
        }
        let api: Api<Namespace> = Api::all(self.client.clone());
        let error = |why: String| AdmitError::Namespace {
            namespace: namespace.to_owned(),
            why,
        };
        let call = api.get_metadata(namespace);
        match tokio::time::timeout_at(call_deadline(deadline), call).await {
            Ok(Ok(meta)) => Ok((meta.metadata.labels.unwrap_or_default(), None)),
            Ok(Err(e)) => Err(error(e.to_string())),
            Err(_) => Err(error(NO_ANSWER.to_owned())),
        }
    }

    /// The LeaderWorkerSet a pod belongs to (by its name label): `None` for other pods and when
    /// it (or its CRD) does not exist.
    async fn leader_worker_set(
        &self,
        pod: &Pod,
        namespace: &str,
        deadline: tokio::time::Instant,
    ) -> Result<Option<LeaderWorkerSet>, AdmitError> {
        let Some(name) = leader_worker_set_name(pod) else {
            return Ok(None);
        };
        let error = |why: String| AdmitError::LeaderWorkerSet {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            why,
        };
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &lws_resource());
        let found = match tokio::time::timeout_at(call_deadline(deadline), api.get_opt(name)).await
        {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => return Err(error(e.to_string())),
            Err(_) => return Err(error(NO_ANSWER.to_owned())),
        };
        let Some(object) = found else {
            return Ok(None);
        };
        let value = serde_json::to_value(&object).map_err(|e| error(e.to_string()))?;
        lws_from_object(&value)
            .map(Some)
            .map_err(|e| error(format!("it does not decode: {e}")))
    }

    /// Creates `wanted` or reads the binding that won (`create_or_get`), at most
    /// [`BINDING_CREATE_TIMEOUT`]; concurrent admissions of one binding share one call, each
    /// waiting at most until its own `deadline` (the call goes on when they give up).
    async fn create_binding(
        &self,
        wanted: &ModelCacheBinding,
        deadline: tokio::time::Instant,
    ) -> Created {
        let namespace = wanted.metadata.namespace.clone().unwrap_or_default();
        let key = format!(
            "{namespace}/{}",
            wanted.metadata.name.as_deref().unwrap_or_default()
        );
        // One call per binding at a time, in a task of its own: it is not cancelled when the
        // admissions waiting for it give up (a burst on a loaded API server), so the binding
        // is created all the same and the next admissions join it from the cache.
        let pending = {
            let mut creating = lock(&self.creating);
            match creating.get(&key) {
                Some(pending) => pending.clone(),
                None => {
                    let api: Api<ModelCacheBinding> =
                        Api::namespaced(self.client.clone(), &namespace);
                    let task = tokio::spawn(create_in_background(
                        api,
                        wanted.clone(),
                        key.clone(),
                        Arc::clone(&self.creating),
                        self.metrics.clone(),
                    ));
                    let pending = async move {
                        task.await
                            .unwrap_or_else(|e| Err(format!("the create task failed: {e}")))
                    }
                    .boxed()
                    .shared();
                    creating.insert(key.clone(), pending.clone());
                    pending
                }
            }
        };
        match tokio::time::timeout_at(deadline, pending).await {
            Ok(result) => result,
            Err(_) => Err(format!(
                "{NO_ANSWER} (the create goes on; the next pod of the model joins the binding)"
            )),
        }
    }
}

/// Creates `wanted` or reads the winner back (`create_or_get`) within [`BINDING_CREATE_TIMEOUT`],
/// counts and logs the result, then forgets the call (`key` in `creating`) so the next miss
/// makes a new one.
async fn create_in_background(
    api: Api<ModelCacheBinding>,
    wanted: ModelCacheBinding,
    key: String,
    creating: Arc<Mutex<HashMap<String, PendingCreate>>>,
    metrics: PodMetrics,
) -> Created {
    let call = warmcache_kube::create_or_get(&api, &wanted);
    let (result, created) = match tokio::time::timeout(BINDING_CREATE_TIMEOUT, call).await {
        Ok(Ok(created)) => {
            let was_created = created.was_created();
            (Ok(Arc::new(created.into_inner())), Some(was_created))
        }
        Ok(Err(e)) => (Err(e.to_string()), None),
        Err(_) => (Err(NO_ANSWER.to_owned()), None),
    };
    let label = match created {
        Some(true) => "created",
        Some(false) => "existing",
        None => "failed",
    };
    metrics.bindings.with_label_values(&[label]).inc();
    match &result {
        Ok(_) if created == Some(true) => {
            tracing::info!(binding = %key, "ModelCacheBinding created");
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(binding = %key, %error, "ModelCacheBinding not created"),
    }
    lock(&creating).remove(&key);
    result
}

/// The warning of a dry run that would have created `wanted`.
fn would_create(wanted: &ModelCacheBinding) -> String {
    format!(
        "dry run: admission would create ModelCacheBinding {}/{}",
        wanted.metadata.namespace.as_deref().unwrap_or_default(),
        wanted.metadata.name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    #[test]
    fn the_registration_ignores_failures_and_skips_excluded_namespaces() {
        let configs = webhook_configurations().unwrap();
        assert!(configs.validating.is_none());
        let config = configs.mutating.unwrap();
        let value = serde_json::to_value(&config).unwrap();
        let webhook = &value["webhooks"][0];
        assert_eq!(webhook["name"], WEBHOOK_NAME);
        assert_eq!(webhook["failurePolicy"], "Ignore");
        assert_eq!(webhook["timeoutSeconds"], TIMEOUT_SECONDS);
        assert_eq!(webhook["sideEffects"], "NoneOnDryRun");
        assert_eq!(webhook["reinvocationPolicy"], "IfNeeded");
        assert_eq!(
            webhook["rules"][0]["operations"],
            serde_json::json!(["CREATE"])
        );
        assert_eq!(
            webhook["rules"][0]["resources"],
            serde_json::json!(["pods"])
        );
        assert_eq!(webhook["clientConfig"]["service"]["path"], WEBHOOK_PATH);
        let ns = &webhook["namespaceSelector"]["matchExpressions"];
        assert_eq!(ns[0]["key"], NAMESPACE_NAME_LABEL);
        assert_eq!(
            ns[0]["values"],
            serde_json::json!(["kube-system", "nvca-modelcache-init", "warmcache-system"])
        );
        assert_eq!(ns[1]["key"], OPT_OUT);
        let objects = &webhook["objectSelector"]["matchExpressions"];
        assert_eq!(objects[1]["key"], MANAGED_BY_LABEL);
        // Each layer answers before the one above gives up.
        assert!(API_CALL_TIMEOUT < ADMISSION_BUDGET);
        assert!(ADMISSION_BUDGET < HANDLER_TIMEOUT);
        assert!((HANDLER_TIMEOUT + Duration::from_secs(1)).as_secs() <= TIMEOUT_SECONDS as u64);
    }

    fn skip() -> Skip {
        Skip::new(
            SkipReason::NoDurableStorage,
            "StorageClassNotFound: no nvcf-sc",
        )
    }

    #[test]
    fn events_go_on_the_pod_or_on_its_controller() {
        let mut pod = Pod {
            metadata: ObjectMeta {
                name: Some("vllm-0".into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        };
        let target = event_target(&pod, "team-a").unwrap();
        assert_eq!(target.kind.as_deref(), Some("Pod"));
        assert_eq!(target.name.as_deref(), Some("vllm-0"));
        assert_eq!(target.namespace.as_deref(), Some("team-a"));
        assert_eq!(event_note(&pod, &skip()), skip().message);

        pod.metadata.name = None;
        pod.metadata.generate_name = Some("vllm-7d9c-".into());
        assert!(
            event_target(&pod, "team-a").is_none(),
            "no name, no controller"
        );
        pod.metadata.owner_references = Some(vec![
            OwnerReference {
                api_version: "v1".into(),
                kind: "Other".into(),
                name: "not-the-controller".into(),
                uid: "u0".into(),
                ..OwnerReference::default()
            },
            OwnerReference {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
                name: "vllm-7d9c".into(),
                uid: "u1".into(),
                controller: Some(true),
                ..OwnerReference::default()
            },
        ]);
        let target = event_target(&pod, "team-a").unwrap();
        assert_eq!(target.kind.as_deref(), Some("ReplicaSet"));
        assert_eq!(target.name.as_deref(), Some("vllm-7d9c"));
        assert_eq!(target.uid.as_deref(), Some("u1"));
        let note = event_note(&pod, &skip());
        assert!(note.starts_with("pod \"vllm-7d9c-\"*: "), "{note}");
    }

    #[test]
    fn metrics_export_every_reason_with_zero() {
        let metrics = warmcache_telemetry::Metrics::new("warmcache_webhook").unwrap();
        PodMetrics::register(&metrics).unwrap();
        let text = metrics.encode_text().unwrap();
        for reason in SkipReason::ALL {
            assert!(
                text.contains(&format!("reason=\"{}\"", reason.code())),
                "{}",
                reason.code()
            );
        }
        assert!(text.contains("warmcache_webhook_bindings_total{result=\"created\"} 0"));
        assert!(text.contains("warmcache_webhook_pod_admission_duration_seconds_bucket"));
    }

    #[test]
    fn the_catalog_is_loaded_once_per_config_map_version() {
        let memo = CatalogMemo::default();
        let builtin = memo.snapshot(None).unwrap();
        assert!(builtin.is_builtin());
        assert!(Arc::ptr_eq(&builtin, &memo.snapshot(None).unwrap()));
        let broken: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": CONFIG_MAP_NAME, "uid": "u", "resourceVersion": "1"},
            "data": {"other": "x"}
        }))
        .unwrap();
        assert!(memo.snapshot(Some(&broken)).is_none());
        let mut fixed = broken.clone();
        fixed.metadata.resource_version = Some("2".into());
        fixed.data = Some(BTreeMap::from([(
            warmcache_catalog::CONFIG_MAP_KEY.to_owned(),
            warmcache_catalog::BUILTIN_CATALOG.to_owned(),
        )]));
        let loaded = memo.snapshot(Some(&fixed)).unwrap();
        assert!(!loaded.is_builtin());
        assert!(Arc::ptr_eq(&loaded, &memo.snapshot(Some(&fixed)).unwrap()));
    }
}
