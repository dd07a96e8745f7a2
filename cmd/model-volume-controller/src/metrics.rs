//! The agent's metrics, in the runtime's registry (`warmcache_model_volume_controller_<name>` on
//! the admin port, beside the runtime's reconcile metrics).
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `staged_steps_total` | `step` (the fixed [`AgentStep`] kinds) | decisions taken for staged downloads |
//! | `copies_total` | `outcome` (`succeeded`, `failed`, `gave_up`) | copies of staged downloads into primaries |
//! | `copied_bytes_total` | | bytes copied and verified |
//! | `copy_seconds` | | duration of a successful copy (with its manifest verification) |
//!
//! Every label value is a fixed word; no pod, binding or model is a label.

use warmcache_modelvolume::agent::AgentStep;
use warmcache_telemetry::prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry,
};
use warmcache_telemetry::register_metric;

/// Label values of `staged_steps_total`.
pub const STEPS: [&str; 9] = [
    "wait",
    "create_claim",
    "create_holder",
    "delete_holder",
    "copy",
    "answer_copied",
    "give_up",
    "drop_claim",
    "foreign",
];

/// Label values of `copies_total`.
pub const OUTCOMES: [&str; 3] = ["succeeded", "failed", "gave_up"];

/// The label of a step.
pub const fn step_label(step: &AgentStep) -> &'static str {
    match step {
        AgentStep::Wait(_) => "wait",
        AgentStep::CreateClaim => "create_claim",
        AgentStep::CreateHolder(_) => "create_holder",
        AgentStep::DeleteHolder(_) => "delete_holder",
        AgentStep::Copy { .. } => "copy",
        AgentStep::AnswerCopied { .. } => "answer_copied",
        AgentStep::GiveUp { .. } => "give_up",
        AgentStep::DropClaim { .. } => "drop_claim",
        AgentStep::Foreign(_) => "foreign",
    }
}

/// A metric that could not be created or registered.
pub use warmcache_telemetry::MetricError as MetricsError;

/// The agent's metrics.
#[derive(Clone)]
pub struct Metrics {
    steps: IntCounterVec,
    copies: IntCounterVec,
    bytes: IntCounter,
    seconds: Histogram,
}

impl Metrics {
    /// Creates and registers the metrics, every label value exported with 0.
    ///
    /// # Errors
    ///
    /// A metric that cannot be registered (a name taken twice).
    pub fn register(registry: &Registry) -> Result<Self, MetricsError> {
        let steps = register_metric(
            registry,
            "staged_steps_total",
            IntCounterVec::new(
                Opts::new(
                    "staged_steps_total",
                    "Decisions taken for staged downloads.",
                ),
                &["step"],
            ),
        )?;
        let copies = register_metric(
            registry,
            "copies_total",
            IntCounterVec::new(
                Opts::new("copies_total", "Copies of staged downloads into primaries."),
                &["outcome"],
            ),
        )?;
        let bytes = register_metric(
            registry,
            "copied_bytes_total",
            IntCounter::new(
                "copied_bytes_total",
                "Bytes copied into primaries and verified.",
            ),
        )?;
        let seconds = register_metric(
            registry,
            "copy_seconds",
            Histogram::with_opts(
                HistogramOpts::new(
                    "copy_seconds",
                    "Duration of a successful copy with its verification.",
                )
                .buckets(vec![
                    1.0, 5.0, 15.0, 60.0, 180.0, 600.0, 1800.0, 3600.0, 10800.0,
                ]),
            ),
        )?;
        for s in STEPS {
            steps.with_label_values(&[s]);
        }
        for o in OUTCOMES {
            copies.with_label_values(&[o]);
        }
        Ok(Self {
            steps,
            copies,
            bytes,
            seconds,
        })
    }

    /// A decision.
    pub fn step(&self, step: &AgentStep) {
        self.steps.with_label_values(&[step_label(step)]).inc();
    }

    /// A successful copy of `bytes` in `seconds`.
    pub fn copied(&self, bytes: u64, seconds: f64) {
        self.copies.with_label_values(&["succeeded"]).inc();
        self.bytes.inc_by(bytes);
        self.seconds.observe(seconds);
    }

    /// A failed copy.
    pub fn copy_failed(&self) {
        self.copies.with_label_values(&["failed"]).inc();
    }

    /// Three failed copies: given up.
    pub fn gave_up(&self) {
        self.copies.with_label_values(&["gave_up"]).inc();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use warmcache_telemetry::prometheus::{Encoder, TextEncoder};

    /// Every series exists from the start (0), with fixed label values only. With
    /// `WARMCACHE_AGENT_METRICS_DUMP=<file>` the exposition is kept for `promtool check metrics`.
    #[test]
    fn every_series_is_exported_with_fixed_labels() {
        let registry = Registry::new();
        let m = Metrics::register(&registry).unwrap();
        m.step(&AgentStep::CreateClaim);
        m.copied(1 << 20, 2.5);
        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut text)
            .unwrap();
        let text = String::from_utf8(text).unwrap();
        for s in STEPS {
            assert!(
                text.contains(&format!("staged_steps_total{{step=\"{s}\"}}")),
                "{text}"
            );
        }
        for o in OUTCOMES {
            assert!(
                text.contains(&format!("copies_total{{outcome=\"{o}\"}}")),
                "{text}"
            );
        }
        assert!(text.contains("copied_bytes_total 1048576"), "{text}");
        assert!(text.contains("copy_seconds_count 1"), "{text}");
        assert!(Metrics::register(&registry).is_err(), "registered twice");
        if let Some(path) = std::env::var_os("WARMCACHE_AGENT_METRICS_DUMP") {
            std::fs::write(path, &text).unwrap();
        }
    }
}
