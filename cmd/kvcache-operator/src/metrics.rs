//! The controller's own metrics, registered in the runtime's registry (so exposed as
//! `warmcache_kvcache_operator_<name>` on the admin port, beside the runtime's
//! `reconcile_runs_total`, `reconcile_failures_total{category}` and `reconcile_duration_seconds`,
//! which count every reconcile and its failures by category).
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `reconcile_outcomes_total` | `outcome` | what a successful reconcile did ([`Outcome`]) |
//! | `backends` | `phase` | backends per `status.phase` (`Unknown`: none yet), read from the watch cache at each scrape |
//! | `tier_cleanup_nodes_total` | `outcome` | nodes whose tier cleanup ended, by how ([`NodeOutcome`]), counted once per deleted backend, when its finalizer is removed |
//! | `tier_cleanup_stopped_total` | | running cleanups stopped because another backend's tier overlaps (`KVCacheTierPartlyEmptied`) |
//! | `tier_bytes` | `measure` (`used`, `capacity`) | the disk tier as the stores report it (`master_allocated_file_size_bytes`, `master_total_file_capacity_bytes`), summed over the backends whose leader was last read successfully |
//! | `tier_reporting_backends` | | how many backends those sums cover |
//!
//! Every label value is a fixed word: no backend, node or Pod name is a label. The tier figures
//! are totals rather than per backend: backends are cluster-scoped and nothing bounds how many
//! there are, and the per-backend figures are in each backend's `status.capacity` and on its
//! leader's own `/metrics`. A backend whose last read failed is left out of the sums (never
//! counted as 0), as its status capacity is cleared.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use warmcache_api_kvcache::v1alpha1::KVCacheBackend;
use warmcache_kvcache::status::phase_counts;
use warmcache_kvcache::store::Gauges;
use warmcache_kvcache::teardown::NodeOutcome;
use warmcache_runtime::Cache;
use warmcache_telemetry::prometheus::core::{Collector, Desc};
use warmcache_telemetry::prometheus::proto::MetricFamily;
use warmcache_telemetry::prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};

/// What a successful reconcile did (the label of `reconcile_outcomes_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Added the finalizer (the next reconcile renders).
    FinalizerAdded,
    /// Applied the workloads; nothing is changing.
    Settled,
    /// Applied the workloads; a rollout or a prune is in progress.
    Changing,
    /// An external backend: status only.
    External,
    /// Deleting, held by consumers in `status.usedBy`.
    WaitingForConsumers,
    /// Deleting the workloads, or waiting for them to go.
    DeletingWorkloads,
    /// Emptying the tier on the nodes, not done yet.
    CleaningTier,
    /// Removed the finalizer: the teardown is complete.
    Released,
}

impl Outcome {
    /// Every outcome, exported with 0 from the start.
    pub const ALL: [Outcome; 8] = [
        Outcome::FinalizerAdded,
        Outcome::Settled,
        Outcome::Changing,
        Outcome::External,
        Outcome::WaitingForConsumers,
        Outcome::DeletingWorkloads,
        Outcome::CleaningTier,
        Outcome::Released,
    ];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::FinalizerAdded => "finalizer_added",
            Outcome::Settled => "settled",
            Outcome::Changing => "changing",
            Outcome::External => "external",
            Outcome::WaitingForConsumers => "waiting_for_consumers",
            Outcome::DeletingWorkloads => "deleting_workloads",
            Outcome::CleaningTier => "cleaning_tier",
            Outcome::Released => "released",
        }
    }
}

/// Why the metrics cannot be registered.
#[derive(Debug, thiserror::Error)]
#[error("cannot register the controller metric {name}: {source}")]
pub struct MetricsError {
    name: &'static str,
    source: warmcache_telemetry::prometheus::Error,
}

fn named<T>(
    name: &'static str,
    result: Result<T, warmcache_telemetry::prometheus::Error>,
) -> Result<T, MetricsError> {
    result.map_err(|source| MetricsError { name, source })
}

/// The controller's metrics (see the module documentation). Cloning shares them.
#[derive(Clone, Debug)]
pub struct ControllerMetrics {
    outcomes: IntCounterVec,
    cleanup_nodes: IntCounterVec,
    cleanup_stopped: IntCounter,
    tier_bytes: IntGaugeVec,
    tier_backends: IntGauge,
    readings: Arc<Mutex<BTreeMap<String, Gauges>>>,
    /// UIDs of the backends whose cleanup was counted, newest last (bounded): a reconcile of a
    /// stale cached copy after the finalizer came off finds the cleanup done again and must
    /// not count it twice.
    counted: Arc<Mutex<std::collections::VecDeque<String>>>,
}

/// How many counted backends are remembered.
const COUNTED_REMEMBERED: usize = 1024;

impl ControllerMetrics {
    /// Creates the metrics, registers them in `registry` with the phase gauge read from
    /// `backends`, and exports every label value with 0.
    pub fn register(
        registry: &warmcache_telemetry::prometheus::Registry,
        backends: Cache<KVCacheBackend>,
    ) -> Result<Self, MetricsError> {
        let metrics = Self::register_counters(registry)?;
        let phases = PhaseGauge::new(backends).map_err(|source| MetricsError {
            name: "backends",
            source,
        })?;
        named("backends", registry.register(Box::new(phases)))?;
        Ok(metrics)
    }

    /// Everything but the phase gauge (which needs the watch cache).
    fn register_counters(
        registry: &warmcache_telemetry::prometheus::Registry,
    ) -> Result<Self, MetricsError> {
        let outcomes = named(
            "reconcile_outcomes_total",
            IntCounterVec::new(
                Opts::new(
                    "reconcile_outcomes_total",
                    "KVCacheBackend reconciles that succeeded, by what they did.",
                ),
                &["outcome"],
            ),
        )?;
        let cleanup_nodes = named(
            "tier_cleanup_nodes_total",
            IntCounterVec::new(
                Opts::new(
                    "tier_cleanup_nodes_total",
                    "Nodes whose tier cleanup ended, by outcome, counted when the deleted backend's finalizer is removed.",
                ),
                &["outcome"],
            ),
        )?;
        let cleanup_stopped = named(
            "tier_cleanup_stopped_total",
            IntCounter::new(
                "tier_cleanup_stopped_total",
                "Running tier cleanups stopped because another backend's tier overlaps on the node.",
            ),
        )?;
        let tier_bytes = named(
            "tier_bytes",
            IntGaugeVec::new(
                Opts::new(
                    "tier_bytes",
                    "Disk tier bytes as the stores report them (used: written, capacity: declared ceiling), summed over the backends read successfully.",
                ),
                &["measure"],
            ),
        )?;
        let tier_backends = named(
            "tier_reporting_backends",
            IntGauge::new(
                "tier_reporting_backends",
                "Backends whose leader was last read successfully, which tier_bytes sums.",
            ),
        )?;
        for outcome in Outcome::ALL {
            outcomes.with_label_values(&[outcome.label()]);
        }
        for outcome in NodeOutcome::ALL {
            cleanup_nodes.with_label_values(&[outcome.label()]);
        }
        for measure in ["used", "capacity"] {
            tier_bytes.with_label_values(&[measure]);
        }
        named(
            "reconcile_outcomes_total",
            registry.register(Box::new(outcomes.clone())),
        )?;
        named(
            "tier_cleanup_nodes_total",
            registry.register(Box::new(cleanup_nodes.clone())),
        )?;
        named(
            "tier_cleanup_stopped_total",
            registry.register(Box::new(cleanup_stopped.clone())),
        )?;
        named(
            "tier_bytes",
            registry.register(Box::new(tier_bytes.clone())),
        )?;
        named(
            "tier_reporting_backends",
            registry.register(Box::new(tier_backends.clone())),
        )?;
        Ok(Self {
            outcomes,
            cleanup_nodes,
            cleanup_stopped,
            tier_bytes,
            tier_backends,
            readings: Arc::new(Mutex::new(BTreeMap::new())),
            counted: Arc::new(Mutex::new(std::collections::VecDeque::new())),
        })
    }

    /// Counts a successful reconcile.
    pub fn outcome(&self, outcome: Outcome) {
        self.outcomes.with_label_values(&[outcome.label()]).inc();
    }

    /// Counts the final outcome of every node of the finished cleanup of the backend with
    /// `uid`, once per backend.
    pub fn cleanup_finished(&self, uid: &str, finished: &[(String, NodeOutcome)]) {
        {
            let mut counted = match self.counted.lock() {
                Ok(guard) => guard,
                Err(poisoned) => poisoned.into_inner(),
            };
            if counted.iter().any(|u| u == uid) {
                return;
            }
            if counted.len() >= COUNTED_REMEMBERED {
                counted.pop_front();
            }
            counted.push_back(uid.to_owned());
        }
        for (_, outcome) in finished {
            self.cleanup_nodes
                .with_label_values(&[outcome.label()])
                .inc();
        }
    }

    /// Counts a running cleanup stopped for a shared path.
    pub fn cleanup_stopped(&self) {
        self.cleanup_stopped.inc();
    }

    /// Records backend `name`'s latest reading of its store (`None`: the read failed, or the
    /// backend is gone) and updates the sums.
    pub fn tier_reading(&self, name: &str, gauges: Option<Gauges>) {
        let Ok(mut readings) = self.readings.lock() else {
            // A panic while holding the lock: the sums stay as they were.
            return;
        };
        match gauges {
            Some(gauges) => {
                readings.insert(name.to_owned(), gauges);
            }
            None => {
                readings.remove(name);
            }
        }
        self.publish(&readings);
    }

    /// Keeps only the readings of the backends `keep` accepts (those still in the cluster).
    pub fn retain_readings(&self, mut keep: impl FnMut(&str) -> bool) {
        let Ok(mut readings) = self.readings.lock() else {
            return;
        };
        readings.retain(|name, _| keep(name));
        self.publish(&readings);
    }

    fn publish(&self, readings: &BTreeMap<String, Gauges>) {
        let sum = |f: fn(&Gauges) -> u64| -> i64 {
            let total: u128 = readings.values().map(|g| u128::from(f(g))).sum();
            i64::try_from(total).unwrap_or(i64::MAX)
        };
        self.tier_bytes
            .with_label_values(&["used"])
            .set(sum(|g| g.allocated_file_size_bytes));
        self.tier_bytes
            .with_label_values(&["capacity"])
            .set(sum(|g| g.total_file_capacity_bytes));
        self.tier_backends
            .set(i64::try_from(readings.len()).unwrap_or(i64::MAX));
    }
}

/// `backends{phase}`: counted from the watch cache when scraped, so a deleted backend leaves the
/// count at once and nothing needs a reconcile to be right.
struct PhaseGauge {
    gauge: IntGaugeVec,
    backends: Cache<KVCacheBackend>,
}

impl PhaseGauge {
    fn new(
        backends: Cache<KVCacheBackend>,
    ) -> Result<Self, warmcache_telemetry::prometheus::Error> {
        let gauge = IntGaugeVec::new(
            Opts::new(
                "backends",
                "KVCacheBackends per status.phase (Unknown: no phase yet).",
            ),
            &["phase"],
        )?;
        Ok(Self { gauge, backends })
    }
}

impl Collector for PhaseGauge {
    fn desc(&self) -> Vec<&Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let state = self.backends.store().state();
        for (phase, count) in phase_counts(state.iter().map(AsRef::as_ref)) {
            self.gauge
                .with_label_values(&[phase])
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        self.gauge.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warmcache_telemetry::prometheus::Registry;

    fn text(registry: &Registry) -> String {
        warmcache_telemetry::encode_text(registry).unwrap()
    }

    fn value(text: &str, series: &str) -> Option<i64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    fn gauges(used: u64, capacity: u64) -> Gauges {
        Gauges {
            total_capacity_bytes: 1 << 30,
            allocated_bytes: 1 << 20,
            total_file_capacity_bytes: capacity,
            allocated_file_size_bytes: used,
        }
    }

    #[test]
    fn every_label_value_is_exported_with_zero() {
        let registry = Registry::new();
        let _m = ControllerMetrics::register_counters(&registry).unwrap();
        let t = text(&registry);
        for outcome in Outcome::ALL {
            let series = format!(
                "reconcile_outcomes_total{{outcome=\"{}\"}}",
                outcome.label()
            );
            assert_eq!(value(&t, &series), Some(0), "{t}");
        }
        for outcome in NodeOutcome::ALL {
            let series = format!(
                "tier_cleanup_nodes_total{{outcome=\"{}\"}}",
                outcome.label()
            );
            assert_eq!(value(&t, &series), Some(0), "{t}");
        }
        assert_eq!(value(&t, "tier_bytes{measure=\"used\"}"), Some(0));
        assert_eq!(value(&t, "tier_reporting_backends"), Some(0));
        // A second registration in the same registry is refused, with the name.
        let err = ControllerMetrics::register_counters(&registry).unwrap_err();
        assert!(
            err.to_string().contains("reconcile_outcomes_total"),
            "{err}"
        );
    }

    #[test]
    fn tier_bytes_sum_the_last_successful_reading_of_each_backend() {
        let registry = Registry::new();
        let m = ControllerMetrics::register_counters(&registry).unwrap();
        m.tier_reading("a", Some(gauges(100, 1000)));
        m.tier_reading("b", Some(gauges(5, 50)));
        let t = text(&registry);
        assert_eq!(value(&t, "tier_bytes{measure=\"used\"}"), Some(105));
        assert_eq!(value(&t, "tier_bytes{measure=\"capacity\"}"), Some(1050));
        assert_eq!(value(&t, "tier_reporting_backends"), Some(2));
        // A backend that left the cluster without a teardown drops out.
        m.tier_reading("c", Some(gauges(1, 1)));
        m.retain_readings(|name| name != "c");
        assert_eq!(
            value(&text(&registry), "tier_bytes{measure=\"used\"}"),
            Some(105)
        );
        // A newer reading replaces; a failed one drops the backend rather than adding 0.
        m.tier_reading("a", Some(gauges(300, 1000)));
        m.tier_reading("b", None);
        let t = text(&registry);
        assert_eq!(value(&t, "tier_bytes{measure=\"used\"}"), Some(300));
        assert_eq!(value(&t, "tier_reporting_backends"), Some(1));
        // Sums beyond i64 saturate (written as a float, as gauges are exposed).
        m.tier_reading("b", Some(gauges(u64::MAX, u64::MAX)));
        let t = text(&registry);
        let used: Option<f64> = t.lines().find_map(|l| {
            l.strip_prefix("tier_bytes{measure=\"used\"} ")?
                .parse()
                .ok()
        });
        assert_eq!(used, Some(i64::MAX as f64), "{t}");
    }

    #[test]
    fn outcomes_and_cleanups_count() {
        let registry = Registry::new();
        let m = ControllerMetrics::register_counters(&registry).unwrap();
        m.outcome(Outcome::Settled);
        m.outcome(Outcome::Settled);
        let finished = [
            ("a".into(), NodeOutcome::Emptied),
            ("b".into(), NodeOutcome::SharedPath),
            ("c".into(), NodeOutcome::Emptied),
        ];
        m.cleanup_finished("uid-1", &finished);
        // A stale copy of the same backend reconciled after its finalizer came off.
        m.cleanup_finished("uid-1", &finished);
        m.cleanup_stopped();
        let t = text(&registry);
        assert_eq!(
            value(&t, "reconcile_outcomes_total{outcome=\"settled\"}"),
            Some(2)
        );
        assert_eq!(
            value(&t, "tier_cleanup_nodes_total{outcome=\"emptied\"}"),
            Some(2)
        );
        assert_eq!(
            value(&t, "tier_cleanup_nodes_total{outcome=\"shared_path\"}"),
            Some(1)
        );
        assert_eq!(value(&t, "tier_cleanup_stopped_total"), Some(1));
    }

    #[test]
    fn the_real_stores_filled_reading_reaches_the_gauge() {
        // The replies recorded from mooncake_master 0.3.13.post1 with a tier past its memory.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../pkg/kvcache/tests/fixtures/mooncake/0.3.13.post1/filled");
        let reply = |file: &str| -> warmcache_kvcache::store::Fetch {
            Ok(warmcache_kvcache::store::HttpReply {
                status: 200,
                body: std::fs::read(dir.join(file)).unwrap(),
            })
        };
        let (health, metrics) = (reply("health.json"), reply("metrics.txt"));
        let gauges =
            warmcache_kvcache::status::store_gauges(Some(&health), Some(&metrics)).unwrap();
        assert!(gauges.allocated_file_size_bytes > 0);
        let registry = Registry::new();
        let m = ControllerMetrics::register_counters(&registry).unwrap();
        m.tier_reading("kvc", Some(gauges));
        assert_eq!(
            value(&text(&registry), "tier_bytes{measure=\"used\"}"),
            i64::try_from(gauges.allocated_file_size_bytes).ok()
        );
    }
}
