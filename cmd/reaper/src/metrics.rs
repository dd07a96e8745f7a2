//! The reaper's metrics, in the runtime's registry (`warmcache_reaper_<name>` on the admin port).
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `actions_total` | `rule`, `action` (`retire`, `delete`, `reclaim`, `finalize`) | what each rule did (a `--dry-run` sweep counts nothing) |
//! | `kept_total` | `rule`, `reason` ([`Keep::as_str`]) | objects a rule looked at and kept, by reason |
//! | `sweeps_total` | `result` (`ok`, `failed`) | sweeps; `failed` when a list or a write failed (the sweep goes on with the rest) |
//! | `sweep_seconds` | | duration of a sweep |
//! | `last_sweep_timestamp_seconds` | | when the last sweep ended (Unix time) |
//!
//! Every label value is a fixed word; no binding, volume or namespace is a label.

use warmcache_modelvolume::reaper::{Keep, Rule};
use warmcache_telemetry::prometheus::{
    Gauge, Histogram, HistogramOpts, IntCounterVec, Opts, Registry,
};
use warmcache_telemetry::register_metric;

pub use warmcache_telemetry::MetricError;

/// Label values of `action` in `actions_total`.
pub const ACTIONS: [&str; 4] = ["retire", "delete", "reclaim", "finalize"];

/// The reaper's metrics.
#[derive(Clone)]
pub struct Metrics {
    actions: IntCounterVec,
    kept: IntCounterVec,
    sweeps: IntCounterVec,
    seconds: Histogram,
    last: Gauge,
}

impl Metrics {
    /// Creates and registers the metrics; `actions_total`, `kept_total` and `sweeps_total`
    /// export every label value with 0, so a dashboard's queries find their series before the
    /// first sweep has done or kept anything.
    ///
    /// # Errors
    ///
    /// A metric that cannot be registered (a name taken twice).
    pub fn register(registry: &Registry) -> Result<Self, MetricError> {
        let actions = register_metric(
            registry,
            "actions_total",
            IntCounterVec::new(
                Opts::new("actions_total", "What each reaper rule did."),
                &["rule", "action"],
            ),
        )?;
        let kept = register_metric(
            registry,
            "kept_total",
            IntCounterVec::new(
                Opts::new(
                    "kept_total",
                    "Objects a reaper rule looked at and kept, by reason.",
                ),
                &["rule", "reason"],
            ),
        )?;
        let sweeps = register_metric(
            registry,
            "sweeps_total",
            IntCounterVec::new(Opts::new("sweeps_total", "Reaper sweeps."), &["result"]),
        )?;
        let seconds = register_metric(
            registry,
            "sweep_seconds",
            Histogram::with_opts(
                HistogramOpts::new("sweep_seconds", "Duration of a reaper sweep.")
                    .buckets(vec![0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0]),
            ),
        )?;
        let last = register_metric(
            registry,
            "last_sweep_timestamp_seconds",
            Gauge::with_opts(Opts::new(
                "last_sweep_timestamp_seconds",
                "When the last reaper sweep ended (Unix time).",
            )),
        )?;
        for rule in Rule::ALL {
            for action in ACTIONS {
                actions.with_label_values(&[rule.as_str(), action]);
            }
        }
        for rule in Rule::ALL {
            for reason in Keep::ALL {
                kept.with_label_values(&[rule.as_str(), reason.as_str()]);
            }
        }
        for result in ["ok", "failed"] {
            sweeps.with_label_values(&[result]);
        }
        Ok(Self {
            actions,
            kept,
            sweeps,
            seconds,
            last,
        })
    }

    /// A rule did `action` (one of [`ACTIONS`]).
    pub fn action(&self, rule: Rule, action: &'static str) {
        self.actions
            .with_label_values(&[rule.as_str(), action])
            .inc();
    }

    /// A rule kept an object.
    pub fn kept(&self, rule: Rule, reason: Keep) {
        self.kept
            .with_label_values(&[rule.as_str(), reason.as_str()])
            .inc();
    }

    /// A sweep ended after `seconds`, at Unix time `now`.
    pub fn swept(&self, ok: bool, seconds: f64, now: f64) {
        self.sweeps
            .with_label_values(&[if ok { "ok" } else { "failed" }])
            .inc();
        self.seconds.observe(seconds);
        self.last.set(now);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_series_is_registered_with_fixed_labels() {
        let registry = Registry::new();
        let m = Metrics::register(&registry).unwrap();
        m.action(Rule::OrphanView, "delete");
        m.kept(Rule::ExpiredPrimary, Keep::InsideRetention);
        m.swept(true, 0.2, 1.0);
        let text = warmcache_telemetry::encode_text(&registry).unwrap();
        assert!(
            text.contains(r#"actions_total{action="delete",rule="orphan-view"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"kept_total{reason="inside_retention",rule="expired-primary"} 1"#));
        assert!(text.contains(r#"sweeps_total{result="failed"} 0"#));
        assert!(text.contains(r#"kept_total{reason="settling",rule="orphan-claim"} 0"#));
        assert!(text.contains(r#"kept_total{reason="class_exists",rule="orphan-encryption"} 0"#));
        assert!(text.contains(r#"actions_total{action="delete",rule="orphan-encryption"} 0"#));
        assert!(Metrics::register(&registry).is_err(), "registered twice");
    }
}
