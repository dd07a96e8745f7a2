//! Prometheus registry and the reconcile metrics every controller exposes.
//!
//! # Labels must stay bounded
//!
//! Every distinct label value is a separate time series that Prometheus keeps for hours. Label
//! values must come from a small fixed set known at compile time: controller names, error
//! categories, phases, flows. **Never** use an object's name, namespace, UID, a pod name, a node
//! name, a model URI, a trace id or an error message as a label. Put those in logs, Events and
//! traces instead. The helpers here take `&'static str` label values to make that the easy path.

use prometheus::{
    Encoder as _, HistogramOpts, HistogramTimer, HistogramVec, IntCounterVec, Opts, Registry,
    TextEncoder,
};

use crate::error::TelemetryError;

/// A component's metric that could not be created or registered (a bad name or labels, or a
/// name registered twice).
#[derive(Debug, thiserror::Error)]
#[error("metric {name}: {source}")]
pub struct MetricError {
    /// The metric.
    pub name: &'static str,
    /// Why.
    #[source]
    pub source: prometheus::Error,
}

/// Registers the just-created `metric` (named `name`) in `registry` and returns it: how each
/// component builds its own metrics in the runtime's registry.
///
/// # Errors
///
/// [`MetricError`] when the metric could not be created or is already registered.
pub fn register_metric<M>(
    registry: &Registry,
    name: &'static str,
    metric: Result<M, prometheus::Error>,
) -> Result<M, MetricError>
where
    M: prometheus::core::Collector + Clone + 'static,
{
    let metric = metric.map_err(|source| MetricError { name, source })?;
    registry
        .register(Box::new(metric.clone()))
        .map_err(|source| MetricError { name, source })?;
    Ok(metric)
}

/// Content type of the Prometheus text exposition format served on `/metrics`.
pub const METRICS_CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// Histogram buckets for reconcile durations, in seconds (5 ms to 5 min).
pub const RECONCILE_DURATION_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Whether `name` is a valid Prometheus metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`).
#[must_use]
pub fn is_valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// A component's Prometheus registry: every metric registered in it is exposed with the
/// component prefix (`<prefix>_<name>`).
///
/// Cloning is cheap and clones share the same metrics.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Registry,
    prefix: String,
}

impl Metrics {
    /// A new, empty registry whose metric names get `prefix` and an underscore in front, for
    /// example `warmcache_binding_controller`.
    ///
    /// # Errors
    /// [`TelemetryError::InvalidMetricPrefix`] if `prefix` is not a valid metric name (for
    /// example contains a dash).
    pub fn new(prefix: &str) -> Result<Self, TelemetryError> {
        if !is_valid_metric_name(prefix) {
            return Err(TelemetryError::InvalidMetricPrefix {
                prefix: prefix.to_owned(),
            });
        }
        let registry = Registry::new_custom(Some(prefix.to_owned()), None).map_err(|source| {
            TelemetryError::Metrics {
                what: format!("registry with prefix {prefix:?}"),
                source,
            }
        })?;
        Ok(Metrics {
            registry,
            prefix: prefix.to_owned(),
        })
    }

    /// The prefix given to [`Metrics::new`].
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The underlying registry, to register metrics in and to hand to the admin server.
    #[must_use]
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Registers a collector (a metric or a vector of metrics).
    ///
    /// # Errors
    /// The name is taken already, or the descriptor is invalid.
    pub fn register<C>(&self, collector: C) -> Result<(), TelemetryError>
    where
        C: prometheus::core::Collector + 'static,
    {
        register(&self.registry, collector, "registration")
    }

    /// The registry's current state in the text exposition format.
    ///
    /// # Errors
    /// Encoding failed (an inconsistent collector).
    pub fn encode_text(&self) -> Result<String, TelemetryError> {
        encode_text(&self.registry)
    }
}

/// Encodes everything registered in `registry` in the Prometheus text exposition format.
///
/// # Errors
/// Encoding failed (an inconsistent collector).
pub fn encode_text(registry: &Registry) -> Result<String, TelemetryError> {
    let families = registry.gather();
    let mut buf = Vec::new();
    TextEncoder::new()
        .encode(&families, &mut buf)
        .map_err(|source| TelemetryError::Metrics {
            what: "text encoding".to_owned(),
            source,
        })?;
    String::from_utf8(buf).map_err(|e| TelemetryError::Metrics {
        what: "text encoding".to_owned(),
        source: prometheus::Error::Msg(e.to_string()),
    })
}

fn register<C>(registry: &Registry, collector: C, what: &str) -> Result<(), TelemetryError>
where
    C: prometheus::core::Collector + 'static,
{
    registry
        .register(Box::new(collector))
        .map_err(|source| TelemetryError::Metrics {
            what: what.to_owned(),
            source,
        })
}

/// The three metrics of a reconcile loop, shared by all controllers of one binary:
///
/// - `reconcile_runs_total{controller}`: reconciles started;
/// - `reconcile_failures_total{controller, category}`: reconciles that returned an error, by
///   the error's stable category (the same `&'static str` used as the Event reason);
/// - `reconcile_duration_seconds{controller}`: how long each reconcile took.
///
/// With a [`Metrics`] prefix of `warmcache_binding_controller` the exposed names are
/// `warmcache_binding_controller_reconcile_runs_total` and so on. Labels are bounded by construction: only
/// `&'static str` values are accepted. Do not build them from object names (see the module
/// documentation).
#[derive(Clone, Debug)]
pub struct ReconcileMetrics {
    /// `reconcile_runs_total{controller}`.
    pub runs: IntCounterVec,
    /// `reconcile_failures_total{controller, category}`.
    pub failures: IntCounterVec,
    /// `reconcile_duration_seconds{controller}`.
    pub duration: HistogramVec,
}

impl ReconcileMetrics {
    /// Creates the three metrics and registers them in `registry`.
    ///
    /// # Errors
    /// They are registered in this registry already.
    pub fn register(registry: &Registry) -> Result<Self, TelemetryError> {
        let runs = IntCounterVec::new(
            Opts::new(
                "reconcile_runs_total",
                "Reconciles started, per controller.",
            ),
            &["controller"],
        )
        .map_err(|source| TelemetryError::Metrics {
            what: "reconcile_runs_total".to_owned(),
            source,
        })?;
        let failures = IntCounterVec::new(
            Opts::new(
                "reconcile_failures_total",
                "Reconciles that ended in an error, per controller and error category.",
            ),
            &["controller", "category"],
        )
        .map_err(|source| TelemetryError::Metrics {
            what: "reconcile_failures_total".to_owned(),
            source,
        })?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "reconcile_duration_seconds",
                "Time taken by one reconcile, per controller.",
            )
            .buckets(RECONCILE_DURATION_BUCKETS.to_vec()),
            &["controller"],
        )
        .map_err(|source| TelemetryError::Metrics {
            what: "reconcile_duration_seconds".to_owned(),
            source,
        })?;
        register(registry, runs.clone(), "reconcile_runs_total")?;
        register(registry, failures.clone(), "reconcile_failures_total")?;
        register(registry, duration.clone(), "reconcile_duration_seconds")?;
        Ok(ReconcileMetrics {
            runs,
            failures,
            duration,
        })
    }

    /// Counts a reconcile of `controller` and starts its timer; the duration is recorded when
    /// the returned timer is dropped (or `observe_duration` is called on it).
    #[must_use = "the duration is recorded when the timer is dropped"]
    pub fn start(&self, controller: &'static str) -> HistogramTimer {
        self.runs.with_label_values(&[controller]).inc();
        self.duration.with_label_values(&[controller]).start_timer()
    }

    /// Counts a failed reconcile of `controller` with the error's `category`.
    pub fn failure(&self, controller: &'static str, category: &'static str) {
        self.failures
            .with_label_values(&[controller, category])
            .inc();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A basic check of the text exposition format: every sample belongs to a family announced
    /// by `# HELP` and `# TYPE` lines, names are valid, values parse.
    pub(crate) fn check_exposition(text: &str) -> Result<Vec<String>, String> {
        let mut families = Vec::new();
        let mut helped = std::collections::HashSet::new();
        let mut typed = std::collections::HashMap::new();
        for line in text.lines() {
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap_or_default();
                if !is_valid_metric_name(name) {
                    return Err(format!("bad name in {line:?}"));
                }
                helped.insert(name.to_owned());
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split(' ');
                let name = parts.next().unwrap_or_default();
                let ty = parts.next().unwrap_or_default();
                if !is_valid_metric_name(name) {
                    return Err(format!("bad name in {line:?}"));
                }
                if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&ty) {
                    return Err(format!("bad type in {line:?}"));
                }
                if !helped.contains(name) {
                    return Err(format!("TYPE before HELP for {name}"));
                }
                typed.insert(name.to_owned(), ty.to_owned());
                families.push(name.to_owned());
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let name_end = line
                .find(['{', ' '])
                .ok_or(format!("no value in {line:?}"))?;
            let name = &line[..name_end];
            if !is_valid_metric_name(name) {
                return Err(format!("bad sample name in {line:?}"));
            }
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| {
                    name.strip_suffix(s)
                        .filter(|base| typed.get(*base).is_some_and(|t| t == "histogram"))
                })
                .unwrap_or(name);
            if !typed.contains_key(family) {
                return Err(format!("sample {name} without # TYPE"));
            }
            let value = line.rsplit(' ').next().unwrap_or_default();
            if value.parse::<f64>().is_err() && !["+Inf", "-Inf", "NaN"].contains(&value) {
                return Err(format!("bad value in {line:?}"));
            }
        }
        Ok(families)
    }

    #[test]
    fn metric_name_validation() {
        for ok in ["a", "_a", ":a", "warmcache_reaper", "a:b_c9"] {
            assert!(is_valid_metric_name(ok), "{ok}");
        }
        for bad in ["", "9a", "warmcache-reaper", "a b", "a.b", "é"] {
            assert!(!is_valid_metric_name(bad), "{bad}");
        }
        assert!(matches!(
            Metrics::new("modelcache-controller"),
            Err(TelemetryError::InvalidMetricPrefix { .. })
        ));
    }

    #[test]
    fn exposition_contains_prefixed_reconcile_families() {
        let metrics = Metrics::new("warmcache_test").unwrap();
        let rm = ReconcileMetrics::register(metrics.registry()).unwrap();
        {
            let _t = rm.start("binding");
        }
        rm.start("binding").observe_duration();
        rm.failure("binding", "kube_api");

        let text = metrics.encode_text().unwrap();
        let families = check_exposition(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        for f in [
            "warmcache_test_reconcile_runs_total",
            "warmcache_test_reconcile_failures_total",
            "warmcache_test_reconcile_duration_seconds",
        ] {
            assert!(families.iter().any(|n| n == f), "{f} missing:\n{text}");
        }
        assert!(text.contains("warmcache_test_reconcile_runs_total{controller=\"binding\"} 2"));
        assert!(text.contains(
            "warmcache_test_reconcile_failures_total{category=\"kube_api\",controller=\"binding\"} 1"
        ));
        assert!(
            text.contains(
                "warmcache_test_reconcile_duration_seconds_count{controller=\"binding\"} 2"
            )
        );
        assert!(text.contains("le=\"300\""), "{text}");

        // Registering the same names twice in one registry is refused.
        assert!(ReconcileMetrics::register(metrics.registry()).is_err());
    }

    #[test]
    fn own_metrics_can_be_registered() {
        let metrics = Metrics::new("warmcache_x").unwrap();
        let g = prometheus::IntGauge::new("bindings", "Bindings known.").unwrap();
        metrics.register(g.clone()).unwrap();
        g.set(3);
        let text = metrics.encode_text().unwrap();
        assert!(text.contains("# TYPE warmcache_x_bindings gauge"), "{text}");
        assert!(text.contains("warmcache_x_bindings 3"), "{text}");
        check_exposition(&text).unwrap();
        assert!(metrics.register(g).is_err());
        assert_eq!(metrics.prefix(), "warmcache_x");
    }

    #[test]
    fn the_checker_catches_broken_text() {
        assert!(check_exposition("foo 1\n").is_err());
        assert!(check_exposition("# HELP foo x\n# TYPE foo counter\nfoo abc\n").is_err());
        assert!(check_exposition("# TYPE foo counter\nfoo 1\n").is_err());
        assert!(check_exposition("# HELP foo x\n# TYPE foo counter\nfoo 1\n").is_ok());
    }
}
