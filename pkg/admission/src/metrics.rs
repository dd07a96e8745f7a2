//! Prometheus metrics of the admission server.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

/// Outcome of one admission review, the `verdict` label of
/// `..._admission_reviews_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The handler allowed the request (possibly with a patch).
    Allowed,
    /// The handler denied the request.
    Denied,
    /// The request was refused before reaching the handler: wrong content type, too large,
    /// too slow, not an `admission.k8s.io/v1` AdmissionReview, ...
    Invalid,
    /// The handler failed, panicked or did not answer in time; the request was denied or, on
    /// a route with [`OnHandlerError::Allow`](crate::OnHandlerError::Allow), allowed
    /// unchanged with a warning.
    Error,
}

impl Verdict {
    /// The label value: `allowed`, `denied`, `invalid` or `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::Invalid => "invalid",
            Self::Error => "error",
        }
    }
}

/// Latency buckets (seconds) for admission reviews: the API server's webhook timeout is at
/// most 30 s and usually 10 s, and a healthy review takes milliseconds.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Counters and histograms for the admission server.
///
/// Create once, [`register`](Self::register) into the binary's registry, and hand clones to
/// [`AdmissionServer::with_metrics`](crate::AdmissionServer::with_metrics) and
/// [`spawn_reloader`](crate::spawn_reloader). Clones share the same series.
///
/// With the default namespace the series are:
/// - `warmcache_admission_reviews_total{route, verdict}`: reviews answered, by route path and
///   [`Verdict`];
/// - `warmcache_admission_review_duration_seconds{route}`: time from request to answer;
/// - `warmcache_admission_certificate_reloads_total{result}`: certificate swaps
///   (`success`) and refused new pairs or unreadable files (`failure`).
///
/// All label values are bounded (configured route paths and fixed words).
#[derive(Clone, Debug)]
pub struct AdmissionMetrics {
    reviews: IntCounterVec,
    duration: HistogramVec,
    cert_reloads: IntCounterVec,
}

impl AdmissionMetrics {
    /// Metrics named `warmcache_admission_*`.
    pub fn new() -> Result<Self, prometheus::Error> {
        Self::with_namespace("warmcache")
    }

    /// Metrics named `<namespace>_admission_*`; an empty namespace gives `admission_*` (use it
    /// when the registry already adds a prefix).
    pub fn with_namespace(namespace: &str) -> Result<Self, prometheus::Error> {
        let reviews = IntCounterVec::new(
            Opts::new(
                "reviews_total",
                "Admission reviews answered, by route and verdict.",
            )
            .namespace(namespace)
            .subsystem("admission"),
            &["route", "verdict"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "review_duration_seconds",
                "Time from receiving an admission request to sending the answer.",
            )
            .namespace(namespace)
            .subsystem("admission")
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["route"],
        )?;
        let cert_reloads = IntCounterVec::new(
            Opts::new(
                "certificate_reloads_total",
                "Webhook certificate reload attempts that changed something, by result.",
            )
            .namespace(namespace)
            .subsystem("admission"),
            &["result"],
        )?;
        Ok(Self {
            reviews,
            duration,
            cert_reloads,
        })
    }

    /// Registers all series into `registry`.
    pub fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.reviews.clone()))?;
        registry.register(Box::new(self.duration.clone()))?;
        registry.register(Box::new(self.cert_reloads.clone()))?;
        Ok(())
    }

    /// `..._admission_reviews_total{route, verdict}`.
    pub fn reviews(&self) -> &IntCounterVec {
        &self.reviews
    }

    /// `..._admission_review_duration_seconds{route}`.
    pub fn duration(&self) -> &HistogramVec {
        &self.duration
    }

    /// `..._admission_certificate_reloads_total{result}`.
    pub fn cert_reloads(&self) -> &IntCounterVec {
        &self.cert_reloads
    }

    /// Records one answered review.
    pub fn observe_review(&self, route: &str, verdict: Verdict, seconds: f64) {
        self.reviews
            .with_label_values(&[route, verdict.as_str()])
            .inc();
        self.duration.with_label_values(&[route]).observe(seconds);
    }

    /// Records one certificate reload attempt that found changed files.
    pub fn observe_cert_reload(&self, success: bool) {
        let result = if success { "success" } else { "failure" };
        self.cert_reloads.with_label_values(&[result]).inc();
    }
}
