//! The agent's metrics, in the runtime's registry (`warmcache_model_volume_controller_<name>` on
//! the admin port, beside the runtime's reconcile metrics).
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `staged_steps_total` | `step` (the fixed [`AgentStep`] kinds) | decisions taken for staged downloads |
//! | `copies_total` | `outcome` (`succeeded`, `failed`, `gave_up`) | copies of staged downloads into primaries |
//! | `copied_bytes_total` | | bytes copied and verified (staged downloads and captures) |
//! | `copy_seconds` | | duration of a successful copy (with its manifest verification; staged downloads and captures) |
//! | `capture_steps_total` | `kind` ([`CAPTURE_KINDS`]), `step` ([`CAPTURE_STEPS`]) | decisions taken for capture sources |
//! | `captures_total` | `kind` ([`CAPTURE_KINDS`]), `outcome` ([`CAPTURE_OUTCOMES`]) | captures of a Ready pod's download (`model`) or compile caches (`cache_set`) into primaries |
//! | `host_steps_total` | `step` (the fixed [`HostBindStep`] kinds) | decisions taken for hostPath readers' binds |
//! | `binds_total` | `outcome` ([`BIND_OUTCOMES`]) | what a bind or unbind found and did, as the mount table shows it |
//! | `unpends_total` | | hostPath readers un-pended after their bind was verified |
//! | `roots_opened_total` | `outcome` ([`OPEN_OUTCOMES`]) | fresh ReadWriteMany roots opened for non-root writers, by what the agent found |
//!
//! Every label value is a fixed word; no pod, binding or model is a label.

use warmcache_modelvolume::agent::{AgentStep, HostBindStep};
use warmcache_modelvolume::capture::{CaptureKind, CaptureStep};
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

/// Label values of `host_steps_total`.
pub const HOST_STEPS: [&str; 6] = [
    "wait",
    "foreign",
    "create_holder",
    "delete_holders",
    "bind",
    "unbind",
];

/// Label values of `binds_total`: the verified bind was there (`verified`), was made
/// (`created`), a stale or writable one was redone (`redone`), the view was not mounted
/// (`not_mounted`), the directory held data a pod wrote (`occupied`), the bind failed
/// (`failed`), a bind was removed with no reader left (`unbound`).
pub const BIND_OUTCOMES: [&str; 7] = [
    "verified",
    "created",
    "redone",
    "not_mounted",
    "occupied",
    "failed",
    "unbound",
];

/// The label of a hostPath readers' step.
pub const fn host_step_label(step: &HostBindStep) -> &'static str {
    match step {
        HostBindStep::Wait(_) => "wait",
        HostBindStep::Foreign(_) => "foreign",
        HostBindStep::CreateHolder(_) => "create_holder",
        HostBindStep::DeleteHolders(_) => "delete_holders",
        HostBindStep::Bind { .. } => "bind",
        HostBindStep::Unbind { .. } => "unbind",
    }
}

/// Label values of `roots_opened_total`: the root was given to the writer (`opened`), was the
/// writer's already (`already_open`), the volume was not mounted yet (`not_mounted`), the pod or
/// its volume is not one the agent opens, or the root is someone else's (`refused`), a system
/// call failed (`failed`).
pub const OPEN_OUTCOMES: [&str; 5] = ["opened", "already_open", "not_mounted", "refused", "failed"];

/// Label values of `kind` on `capture_steps_total` and `captures_total`: a model's capture, a
/// compile-cache set's ([`CaptureKind::label`]).
pub const CAPTURE_KINDS: [&str; 2] = [CaptureKind::Model.label(), CaptureKind::CacheSet.label()];

/// Label values of `step` on `capture_steps_total`.
pub const CAPTURE_STEPS: [&str; 11] = [
    "skip",
    "wait",
    "refused",
    "create_claim",
    "elect",
    "reelect",
    "create_holder",
    "delete_holder",
    "copy",
    "done",
    "give_up",
];

/// The label of a capture step.
pub const fn capture_step_label(step: &CaptureStep) -> &'static str {
    match step {
        CaptureStep::Skip(_) => "skip",
        CaptureStep::Wait(_) => "wait",
        CaptureStep::Refused(_) => "refused",
        CaptureStep::CreateClaim => "create_claim",
        CaptureStep::Elect { .. } => "elect",
        CaptureStep::Reelect { .. } => "reelect",
        CaptureStep::CreateHolder(_) => "create_holder",
        CaptureStep::DeleteHolder(_) => "delete_holder",
        CaptureStep::Copy { .. } => "copy",
        CaptureStep::Done { .. } => "done",
        CaptureStep::GiveUp { .. } => "give_up",
    }
}

/// Label values of `captures_total`: copied and verified (`copied`), a copy failed (`failed`),
/// given up after three (`gave_up`), a capture pod refused: its records do not match its
/// binding or the binding's sharing domain, or its landing is not reached without a link
/// (`refused`).
pub const CAPTURE_OUTCOMES: [&str; 4] = ["copied", "failed", "gave_up", "refused"];

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
    host_steps: IntCounterVec,
    binds: IntCounterVec,
    unpends: IntCounter,
    roots: IntCounterVec,
    capture_steps: IntCounterVec,
    captures: IntCounterVec,
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
        let host_steps = register_metric(
            registry,
            "host_steps_total",
            IntCounterVec::new(
                Opts::new(
                    "host_steps_total",
                    "Decisions taken for hostPath readers' binds.",
                ),
                &["step"],
            ),
        )?;
        let binds = register_metric(
            registry,
            "binds_total",
            IntCounterVec::new(
                Opts::new(
                    "binds_total",
                    "Binds and unbinds for hostPath readers, by what the mount table showed.",
                ),
                &["outcome"],
            ),
        )?;
        let unpends = register_metric(
            registry,
            "unpends_total",
            IntCounter::new(
                "unpends_total",
                "hostPath readers un-pended after their bind was verified.",
            ),
        )?;
        let roots = register_metric(
            registry,
            "roots_opened_total",
            IntCounterVec::new(
                Opts::new(
                    "roots_opened_total",
                    "Fresh ReadWriteMany roots opened for non-root writers, by what the agent found.",
                ),
                &["outcome"],
            ),
        )?;
        let capture_steps = register_metric(
            registry,
            "capture_steps_total",
            IntCounterVec::new(
                Opts::new(
                    "capture_steps_total",
                    "Decisions taken for capture sources, by kind (model, cache_set).",
                ),
                &["kind", "step"],
            ),
        )?;
        let captures = register_metric(
            registry,
            "captures_total",
            IntCounterVec::new(
                Opts::new(
                    "captures_total",
                    "Captures of a Ready pod's own download (model) or compile caches (cache_set) into primaries, by outcome.",
                ),
                &["kind", "outcome"],
            ),
        )?;
        for k in CAPTURE_KINDS {
            for s in CAPTURE_STEPS {
                capture_steps.with_label_values(&[k, s]);
            }
            for o in CAPTURE_OUTCOMES {
                captures.with_label_values(&[k, o]);
            }
        }
        for o in OPEN_OUTCOMES {
            roots.with_label_values(&[o]);
        }
        for s in STEPS {
            steps.with_label_values(&[s]);
        }
        for s in HOST_STEPS {
            host_steps.with_label_values(&[s]);
        }
        for o in BIND_OUTCOMES {
            binds.with_label_values(&[o]);
        }
        for o in OUTCOMES {
            copies.with_label_values(&[o]);
        }
        Ok(Self {
            steps,
            copies,
            bytes,
            seconds,
            host_steps,
            binds,
            unpends,
            roots,
            capture_steps,
            captures,
        })
    }

    /// A decision.
    pub fn step(&self, step: &AgentStep) {
        self.steps.with_label_values(&[step_label(step)]).inc();
    }

    /// A decision for hostPath readers.
    pub fn host_step(&self, step: &HostBindStep) {
        self.host_steps
            .with_label_values(&[host_step_label(step)])
            .inc();
    }

    /// A bind's outcome (one of [`BIND_OUTCOMES`]).
    pub fn bind(&self, outcome: &'static str) {
        if BIND_OUTCOMES.contains(&outcome) {
            self.binds.with_label_values(&[outcome]).inc();
        }
    }

    /// What opening a writer's root found (one of [`OPEN_OUTCOMES`]).
    pub fn root(&self, outcome: &'static str) {
        if OPEN_OUTCOMES.contains(&outcome) {
            self.roots.with_label_values(&[outcome]).inc();
        }
    }

    /// A reader un-pended.
    pub fn unpended(&self) {
        self.unpends.inc();
    }

    /// A successful copy of `bytes` in `seconds`.
    pub fn copied(&self, bytes: u64, seconds: f64) {
        self.copies.with_label_values(&["succeeded"]).inc();
        self.bytes.inc_by(bytes);
        self.seconds.observe(seconds);
    }

    /// A decision for a capture source of `kind`.
    pub fn capture_step(&self, kind: CaptureKind, step: &CaptureStep) {
        self.capture_steps
            .with_label_values(&[kind.label(), capture_step_label(step)])
            .inc();
    }

    /// A capture of `kind`, `bytes` copied and verified in `seconds`.
    pub fn captured(&self, kind: CaptureKind, bytes: u64, seconds: f64) {
        self.captures
            .with_label_values(&[kind.label(), "copied"])
            .inc();
        self.bytes.inc_by(bytes);
        self.seconds.observe(seconds);
    }

    /// A capture's copy failed.
    pub fn capture_failed(&self, kind: CaptureKind) {
        self.captures
            .with_label_values(&[kind.label(), "failed"])
            .inc();
    }

    /// A capture given up after three failed copies.
    pub fn capture_gave_up(&self, kind: CaptureKind) {
        self.captures
            .with_label_values(&[kind.label(), "gave_up"])
            .inc();
    }

    /// A capture pod refused.
    pub fn capture_refused(&self, kind: CaptureKind) {
        self.captures
            .with_label_values(&[kind.label(), "refused"])
            .inc();
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
        m.bind("created");
        m.bind("not a fixed word");
        m.unpended();
        for s in HOST_STEPS {
            assert!(
                text.contains(&format!("host_steps_total{{step=\"{s}\"}}")),
                "{text}"
            );
        }
        for o in BIND_OUTCOMES {
            assert!(
                text.contains(&format!("binds_total{{outcome=\"{o}\"}}")),
                "{text}"
            );
        }
        assert!(text.contains("unpends_total 0"), "{text}");
        for o in OPEN_OUTCOMES {
            assert!(
                text.contains(&format!("roots_opened_total{{outcome=\"{o}\"}} 0")),
                "{text}"
            );
        }
        for k in CAPTURE_KINDS {
            for s in CAPTURE_STEPS {
                assert!(
                    text.contains(&format!(
                        "capture_steps_total{{kind=\"{k}\",step=\"{s}\"}} 0"
                    )),
                    "{text}"
                );
            }
            for o in CAPTURE_OUTCOMES {
                assert!(
                    text.contains(&format!("captures_total{{kind=\"{k}\",outcome=\"{o}\"}} 0")),
                    "{text}"
                );
            }
        }
        assert!(text.contains("copied_bytes_total 1048576"), "{text}");
        assert!(text.contains("copy_seconds_count 1"), "{text}");
        assert!(Metrics::register(&registry).is_err(), "registered twice");
        if let Some(path) = std::env::var_os("WARMCACHE_AGENT_METRICS_DUMP") {
            std::fs::write(path, &text).unwrap();
        }
    }

    /// A capture shares the copy's bytes and duration, counted by its own kind and outcome, not
    /// as a staged copy.
    #[test]
    fn a_capture_counts_its_outcome_and_the_shared_bytes() {
        let registry = Registry::new();
        let m = Metrics::register(&registry).unwrap();
        m.captured(CaptureKind::Model, 4096, 1.5);
        m.capture_failed(CaptureKind::Model);
        m.capture_refused(CaptureKind::Model);
        m.capture_step(CaptureKind::Model, &CaptureStep::CreateClaim);
        m.captured(CaptureKind::CacheSet, 100, 0.5);
        m.capture_gave_up(CaptureKind::CacheSet);
        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut text)
            .unwrap();
        let text = String::from_utf8(text).unwrap();
        for line in [
            "captures_total{kind=\"model\",outcome=\"copied\"} 1",
            "captures_total{kind=\"model\",outcome=\"failed\"} 1",
            "captures_total{kind=\"model\",outcome=\"refused\"} 1",
            "captures_total{kind=\"model\",outcome=\"gave_up\"} 0",
            "captures_total{kind=\"cache_set\",outcome=\"copied\"} 1",
            "captures_total{kind=\"cache_set\",outcome=\"gave_up\"} 1",
            "captures_total{kind=\"cache_set\",outcome=\"refused\"} 0",
            "capture_steps_total{kind=\"model\",step=\"create_claim\"} 1",
            "capture_steps_total{kind=\"cache_set\",step=\"create_claim\"} 0",
            "copies_total{outcome=\"succeeded\"} 0",
            "copied_bytes_total 4196",
            "copy_seconds_count 2",
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
    }
}
