//! The controller's own metrics, in the runtime's registry (exposed as
//! `warmcache_binding_controller_<name>` on the admin port, beside the runtime's
//! `reconcile_runs_total`, `reconcile_failures_total{category}` and
//! `reconcile_duration_seconds`).
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `bindings` | `population` (`Unknown`, `Pending`, `Populating`, `Ready`, `Failed`) | bindings of the control namespace per `status.realized.populationState`, counted from the watch cache at each scrape |
//! | `bindings_by_phase` | `phase` (`Unknown`, `Active`, `Retiring`) | the same bindings per `status.phase` (`Unknown`: no status written yet) |
//! | `cached_bytes` | | the model bytes (`status.realized.bytes`) of the bindings whose population is Ready |
//! | `downloads_started_total` | | writer Jobs this controller created |
//! | `downloads_succeeded_total` | | primaries labelled complete and Retain (re-read) |
//! | `downloaded_bytes_total` | | the bytes those primaries record (the download's measured size) |
//! | `downloads_failed_total` | | bindings that went to population Failed |
//! | `views_created_total` | | read-only view claims created |
//! | `actions_total` | `action` (the fixed [`warmcache_modelvolume::Action`] kinds) | writes the lifecycle asked for |
//! | `time_to_ready_seconds` | | from a binding's creation to its primary stored complete (buckets up to 12 h) |
//! | `waiting_readers_deleted_total` | | reading pods still waiting for a failed download, deleted so their controllers recreate them |
//! | `primary_claims_held_total` | | roxReadOnly: bindings whose released primary claim was still kept (a pod mounting it) past the grace period (`Degraded` / `PrimaryClaimHeld`) |
//! | `writer_lease_writes_total` | `result` (`created`, `updated`, `taken_over`, `lost`) | writes of the writer Lease: the first writer recorded, bookkeeping (Job UID, gone), a takeover by another namespace, a write another controller won |
//! | `pod_step_reads_total` | `purpose` (`election`, `job`), `result` (`step`, `no_step`, `gone`) | reads of a reading pod from the API server for its download step (the pod cache does not keep it): whether a namespace has a step for the writer election (each pod read once, then remembered), and the step of the writer Job about to be created; `gone` when the pod was deleted or replaced since the cache saw it |
//!
//! Every label value is a fixed word; no binding, namespace or model is a label.

use k8s_openapi::jiff::Timestamp;
use warmcache_api_modelcache::v2beta1::{BindingPhase, ModelCacheBinding, PopulationState};
use warmcache_runtime::Cache;
use warmcache_telemetry::prometheus::core::{Collector, Desc};
use warmcache_telemetry::prometheus::proto::MetricFamily;
use warmcache_telemetry::prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};
use warmcache_telemetry::register_metric;

/// Label values of `bindings`.
pub const POPULATIONS: [&str; 5] = ["Unknown", "Pending", "Populating", "Ready", "Failed"];

/// Label values of `actions_total`.
pub const ACTIONS: [&str; 12] = [
    "create_primary_claim",
    "adopt_primary",
    "create_writer_view",
    "rebind_writer_view",
    "create_job",
    "mark_complete",
    "release_writer_claim",
    "release_stale_writer_claim",
    "release_primary_claim",
    "create_view",
    "write_lease",
    "delete_waiting_readers",
];

/// Label values of `bindings_by_phase`.
pub const PHASES: [&str; 3] = ["Unknown", "Active", "Retiring"];

/// Label values of `writer_lease_writes_total`.
pub const LEASE_WRITES: [&str; 4] = ["created", "updated", "taken_over", "lost"];

/// Label values of `pod_step_reads_total`: `purpose`.
pub const STEP_READ_PURPOSES: [&str; 2] = ["election", "job"];

/// Label values of `pod_step_reads_total`: `result`.
pub const STEP_READ_RESULTS: [&str; 3] = ["step", "no_step", "gone"];

/// A metric that could not be created or registered.
pub use warmcache_telemetry::MetricError as MetricsError;

/// The controller's metrics.
#[derive(Clone)]
pub struct Metrics {
    started: IntCounter,
    succeeded: IntCounter,
    downloaded_bytes: IntCounter,
    failed: IntCounter,
    views: IntCounter,
    actions: IntCounterVec,
    time_to_ready: Histogram,
    lease_writes: IntCounterVec,
    waiting_readers_deleted: IntCounter,
    primary_claims_held: IntCounter,
    step_reads: IntCounterVec,
}

impl Metrics {
    /// Creates and registers the metrics, every label value exported with 0; the binding
    /// gauges are counted from `bindings` (the controller's watch cache) at each scrape.
    pub fn register(
        registry: &Registry,
        bindings: Cache<ModelCacheBinding>,
    ) -> Result<Self, MetricsError> {
        let gauges = BindingGauges::new(bindings)?;
        registry
            .register(Box::new(gauges))
            .map_err(|source| MetricsError {
                name: "bindings",
                source,
            })?;
        let started = register_metric(
            registry,
            "downloads_started_total",
            IntCounter::new("downloads_started_total", "Writer Jobs created."),
        )?;
        let succeeded = register_metric(
            registry,
            "downloads_succeeded_total",
            IntCounter::new(
                "downloads_succeeded_total",
                "Primary volumes stored complete and retained.",
            ),
        )?;
        let downloaded_bytes = register_metric(
            registry,
            "downloaded_bytes_total",
            IntCounter::new(
                "downloaded_bytes_total",
                "Bytes of the primary volumes stored complete.",
            ),
        )?;
        let failed = register_metric(
            registry,
            "downloads_failed_total",
            IntCounter::new("downloads_failed_total", "Downloads that failed."),
        )?;
        let views = register_metric(
            registry,
            "views_created_total",
            IntCounter::new("views_created_total", "Read-only view claims created."),
        )?;
        let actions = register_metric(
            registry,
            "actions_total",
            IntCounterVec::new(
                Opts::new("actions_total", "Writes the binding lifecycle asked for."),
                &["action"],
            ),
        )?;
        let time_to_ready = register_metric(
            registry,
            "time_to_ready_seconds",
            Histogram::with_opts(
                HistogramOpts::new(
                    "time_to_ready_seconds",
                    "Seconds from a binding's creation to its primary stored complete.",
                )
                .buckets(vec![
                    10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 14400.0,
                    28800.0, 43200.0,
                ]),
            ),
        )?;
        let lease_writes = register_metric(
            registry,
            "writer_lease_writes_total",
            IntCounterVec::new(
                Opts::new(
                    "writer_lease_writes_total",
                    "Writes of writer Leases, by result.",
                ),
                &["result"],
            ),
        )?;
        let waiting_readers_deleted = register_metric(
            registry,
            "waiting_readers_deleted_total",
            IntCounter::new(
                "waiting_readers_deleted_total",
                "Reading pods still waiting for a failed download, deleted.",
            ),
        )?;
        let primary_claims_held = register_metric(
            registry,
            "primary_claims_held_total",
            IntCounter::new(
                "primary_claims_held_total",
                "Released primary claims still kept by a pod past the grace period.",
            ),
        )?;
        let step_reads = register_metric(
            registry,
            "pod_step_reads_total",
            IntCounterVec::new(
                Opts::new(
                    "pod_step_reads_total",
                    "Reading pods read from the API server for their download step, by purpose and result.",
                ),
                &["purpose", "result"],
            ),
        )?;
        for p in STEP_READ_PURPOSES {
            for r in STEP_READ_RESULTS {
                step_reads.with_label_values(&[p, r]);
            }
        }
        for r in LEASE_WRITES {
            lease_writes.with_label_values(&[r]);
        }
        for a in ACTIONS {
            actions.with_label_values(&[a]);
        }
        Ok(Self {
            started,
            succeeded,
            downloaded_bytes,
            failed,
            views,
            actions,
            time_to_ready,
            lease_writes,
            waiting_readers_deleted,
            primary_claims_held,
            step_reads,
        })
    }

    /// A writer Job was created.
    pub fn download_started(&self) {
        self.started.inc();
    }

    /// A primary recording `bytes` was stored complete; `binding` gives the creation time.
    pub fn download_succeeded(&self, binding: &ModelCacheBinding, bytes: Option<u64>) {
        self.succeeded.inc();
        if let Some(bytes) = bytes {
            self.downloaded_bytes.inc_by(bytes);
        }
        if let Some(created) = &binding.metadata.creation_timestamp {
            let seconds = Timestamp::now().duration_since(created.0).as_secs_f64();
            if seconds >= 0.0 {
                self.time_to_ready.observe(seconds);
            }
        }
    }

    /// A download failed.
    pub fn download_failed(&self) {
        self.failed.inc();
    }

    /// A view claim was created.
    pub fn view_created(&self) {
        self.views.inc();
    }

    /// A writer Lease write ended with `result` (one of [`LEASE_WRITES`]).
    pub fn lease_write(&self, result: &'static str) {
        self.lease_writes.with_label_values(&[result]).inc();
    }

    /// A reader waiting for a failed download was deleted.
    pub fn waiting_reader_deleted(&self) {
        self.waiting_readers_deleted.inc();
    }

    /// A binding started reporting its released primary claim held (`PrimaryClaimHeld`).
    pub fn primary_claim_held(&self) {
        self.primary_claims_held.inc();
    }

    /// A reading pod was read for its download step: `purpose` one of [`STEP_READ_PURPOSES`],
    /// `result` one of [`STEP_READ_RESULTS`].
    pub fn step_read(&self, purpose: &'static str, result: &'static str) {
        self.step_reads.with_label_values(&[purpose, result]).inc();
    }

    /// The lifecycle asked for `action`.
    pub fn action(&self, action: &'static str) {
        self.actions.with_label_values(&[action]).inc();
    }
}

/// `bindings{population}`, `bindings_by_phase{phase}` and `cached_bytes`: counted from the
/// binding watch cache when scraped. Counting after every reconcile cost a pass over every
/// binding per reconcile (at 10,000 bindings, most of a core); at a scrape it is one pass per
/// scrape, and a deleted binding leaves the counts at once.
struct BindingGauges {
    bindings: IntGaugeVec,
    phases: IntGaugeVec,
    cached_bytes: IntGauge,
    cache: Cache<ModelCacheBinding>,
}

impl BindingGauges {
    fn new(cache: Cache<ModelCacheBinding>) -> Result<Self, MetricsError> {
        let named = |name: &'static str| move |source| MetricsError { name, source };
        let bindings = IntGaugeVec::new(
            Opts::new("bindings", "ModelCacheBindings by population state."),
            &["population"],
        )
        .map_err(named("bindings"))?;
        let phases = IntGaugeVec::new(
            Opts::new(
                "bindings_by_phase",
                "ModelCacheBindings by lifecycle phase.",
            ),
            &["phase"],
        )
        .map_err(named("bindings_by_phase"))?;
        let cached_bytes = IntGauge::new(
            "cached_bytes",
            "Model bytes of the bindings whose population is Ready.",
        )
        .map_err(named("cached_bytes"))?;
        for p in POPULATIONS {
            bindings.with_label_values(&[p]);
        }
        for p in PHASES {
            phases.with_label_values(&[p]);
        }
        Ok(Self {
            bindings,
            phases,
            cached_bytes,
            cache,
        })
    }

    /// Counts the bindings of the cache by population state and by phase, and sums the bytes
    /// of the Ready ones.
    fn observe(&self) {
        let mut counts = [0_i64; 5];
        let mut phases = [0_i64; 3];
        let mut cached: i64 = 0;
        for b in self.cache.store().state() {
            let realized = b.status.as_ref().and_then(|s| s.realized.as_ref());
            let index = match realized.and_then(|r| r.population_state) {
                None => 0,
                Some(PopulationState::Pending) => 1,
                Some(PopulationState::Populating) => 2,
                Some(PopulationState::Ready) => 3,
                Some(PopulationState::Failed) => 4,
            };
            counts[index] += 1;
            if index == 3 {
                let bytes = realized.and_then(|r| r.bytes).unwrap_or(0).max(0);
                cached = cached.saturating_add(bytes);
            }
            let phase = match b.phase() {
                None => 0,
                Some(BindingPhase::Active) => 1,
                Some(BindingPhase::Retiring) => 2,
            };
            phases[phase] += 1;
        }
        for (p, n) in POPULATIONS.iter().zip(counts) {
            self.bindings.with_label_values(&[p]).set(n);
        }
        for (p, n) in PHASES.iter().zip(phases) {
            self.phases.with_label_values(&[p]).set(n);
        }
        self.cached_bytes.set(cached);
    }
}

impl Collector for BindingGauges {
    fn desc(&self) -> Vec<&Desc> {
        let mut desc = self.bindings.desc();
        desc.extend(self.phases.desc());
        desc.extend(self.cached_bytes.desc());
        desc
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.observe();
        let mut families = self.bindings.collect();
        families.extend(self.phases.collect());
        families.extend(self.cached_bytes.collect());
        families
    }
}
