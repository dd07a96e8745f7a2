//! Prometheus metrics of the admission server.
//!
//! The series are named by this library, not by the binary that embeds it:
//! `warmcache_admission_reviews_total` is the same family in every webhook, and Prometheus'
//! `job`/`pod` target labels tell the components apart. A binary whose component registry
//! adds a prefix (`warmcache_telemetry::Metrics`) serves
//! [`AdmissionMetrics::exposition_registry`] instead, which keeps these names unprefixed.

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

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
    /// Every verdict, in label order.
    pub const ALL: [Verdict; 4] = [Self::Allowed, Self::Denied, Self::Invalid, Self::Error];

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

/// Why the server closed (or gave up on) a connection, the `reason` label of
/// `..._admission_connections_closed_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CloseReason {
    /// The client ended the connection: closed it (with or without TLS `close_notify`),
    /// reset it, or sent `Connection: close`.
    Client,
    /// A protocol error (malformed HTTP, an HTTP/2 connection error) or an I/O error other
    /// than the client going away ended it.
    Error,
    /// The TLS handshake failed (no common protocol, bad client hello, ...).
    TlsHandshakeFailed,
    /// The TLS handshake did not finish within
    /// [`body_timeout`](crate::AdmissionServerConfig::body_timeout).
    TlsHandshakeTimeout,
    /// No complete request headers within
    /// [`body_timeout`](crate::AdmissionServerConfig::body_timeout): nothing, or only part of
    /// a request or of the HTTP/2 preface, after the TLS handshake; or an HTTP/1.1 request
    /// whose headers stopped arriving.
    HeaderTimeout,
    /// No request in flight for [`idle_timeout`](crate::AdmissionServerConfig::idle_timeout)
    /// (HTTP/1.1 keep-alive, or HTTP/2 with no open stream; HTTP/2 gets a GOAWAY first).
    Idle,
    /// Closed because the server shut down.
    Shutdown,
    /// `accept` itself failed (for example the process is out of file descriptors).
    AcceptFailed,
}

impl CloseReason {
    /// Every reason, in label order.
    pub const ALL: [CloseReason; 8] = [
        Self::Client,
        Self::Error,
        Self::TlsHandshakeFailed,
        Self::TlsHandshakeTimeout,
        Self::HeaderTimeout,
        Self::Idle,
        Self::Shutdown,
        Self::AcceptFailed,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Client => "client",
            Self::Error => "error",
            Self::TlsHandshakeFailed => "tls_handshake_failed",
            Self::TlsHandshakeTimeout => "tls_handshake_timeout",
            Self::HeaderTimeout => "header_timeout",
            Self::Idle => "idle",
            Self::Shutdown => "shutdown",
            Self::AcceptFailed => "accept_failed",
        }
    }
}

/// Latency buckets (seconds) for admission reviews: the API server's webhook timeout is at
/// most 30 s and usually 10 s, and a healthy review takes milliseconds.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Counters, gauges and histograms for the admission server.
///
/// Create once, [`register`](Self::register) into the binary's registry (or serve
/// [`exposition_registry`](Self::exposition_registry)), and hand clones to
/// [`AdmissionServer::with_metrics`](crate::AdmissionServer::with_metrics) and
/// [`spawn_reloader`](crate::spawn_reloader). Clones share the same series.
///
/// With the default namespace the series are:
/// - `warmcache_admission_reviews_total{route, verdict}`: reviews answered, by route path and
///   [`Verdict`];
/// - `warmcache_admission_review_duration_seconds{route}`: time from request to answer;
/// - `warmcache_admission_certificate_reloads_total{result}`: certificate swaps
///   (`success`) and refused new pairs or unreadable files (`failure`);
/// - `warmcache_admission_handlers_running`: synchronous handlers executing on the blocking
///   pool right now, including abandoned ones;
/// - `warmcache_admission_handlers_abandoned_total{route}`: reviews answered (by the handler
///   timeout, or not at all because the client went away) while their synchronous handler
///   kept running;
/// - `warmcache_admission_handler_slot_timeouts_total{route}`: reviews whose synchronous
///   handler never started because every handler slot stayed busy until the timeout;
/// - `warmcache_admission_connections_open`: open connections, TLS handshakes included;
/// - `warmcache_admission_connections_closed_total{reason}`: connections closed, by
///   [`CloseReason`];
/// - `warmcache_admission_connection_limit_waits_total`: times the server stopped accepting
///   because [`max_connections`](crate::AdmissionServerConfig::max_connections) were open.
///
/// All label values are bounded (configured route paths and fixed words). Every fixed label
/// value, and every route of a server built [`with_metrics`](crate::AdmissionServer::with_metrics),
/// is exported from the start with zero, so `rate()` and absence alerts work before the
/// first event.
#[derive(Clone, Debug)]
pub struct AdmissionMetrics {
    reviews: IntCounterVec,
    duration: HistogramVec,
    cert_reloads: IntCounterVec,
    handlers_running: IntGauge,
    handlers_abandoned: IntCounterVec,
    handler_slot_timeouts: IntCounterVec,
    connections_open: IntGauge,
    connections_closed: IntCounterVec,
    connection_limit_waits: IntCounter,
}

impl AdmissionMetrics {
    /// Metrics named `warmcache_admission_*`.
    pub fn new() -> Result<Self, prometheus::Error> {
        Self::with_namespace("warmcache")
    }

    /// Metrics named `<namespace>_admission_*`; an empty namespace gives `admission_*` (use it
    /// when the registry already adds a prefix).
    pub fn with_namespace(namespace: &str) -> Result<Self, prometheus::Error> {
        let opts = |name: &str, help: &str| {
            Opts::new(name, help)
                .namespace(namespace)
                .subsystem("admission")
        };
        let reviews = IntCounterVec::new(
            opts(
                "reviews_total",
                "Admission reviews answered, by route and verdict.",
            ),
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
            opts(
                "certificate_reloads_total",
                "Webhook certificate reload attempts that changed something, by result.",
            ),
            &["result"],
        )?;
        let handlers_running = IntGauge::with_opts(opts(
            "handlers_running",
            "Synchronous admission handlers executing on the blocking pool, abandoned ones included.",
        ))?;
        let handlers_abandoned = IntCounterVec::new(
            opts(
                "handlers_abandoned_total",
                "Reviews answered without waiting for their synchronous handler, which kept running.",
            ),
            &["route"],
        )?;
        let handler_slot_timeouts = IntCounterVec::new(
            opts(
                "handler_slot_timeouts_total",
                "Reviews whose synchronous handler never started: every handler slot stayed busy until the timeout.",
            ),
            &["route"],
        )?;
        let connections_open = IntGauge::with_opts(opts(
            "connections_open",
            "Open connections to the admission server, TLS handshakes included.",
        ))?;
        let connections_closed = IntCounterVec::new(
            opts(
                "connections_closed_total",
                "Connections to the admission server that ended, by reason.",
            ),
            &["reason"],
        )?;
        let connection_limit_waits = IntCounter::with_opts(opts(
            "connection_limit_waits_total",
            "Times the admission server stopped accepting because the connection limit was reached.",
        ))?;
        for result in ["success", "failure"] {
            cert_reloads.with_label_values(&[result]);
        }
        for reason in CloseReason::ALL {
            connections_closed.with_label_values(&[reason.as_str()]);
        }
        Ok(Self {
            reviews,
            duration,
            cert_reloads,
            handlers_running,
            handlers_abandoned,
            handler_slot_timeouts,
            connections_open,
            connections_closed,
            connection_limit_waits,
        })
    }

    /// Registers all series into `registry`.
    pub fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        for collector in self.collectors() {
            registry.register(collector)?;
        }
        Ok(())
    }

    /// A registry to serve on `/metrics` that holds these series under their own names and,
    /// next to them, everything registered in `component` under that registry's names.
    ///
    /// A component registry with a prefix (as `warmcache_telemetry::Metrics` builds them)
    /// renames every family registered in it; registering the admission metrics there would
    /// turn `warmcache_admission_reviews_total` into
    /// `warmcache_<component>_admission_reviews_total`. Serve this registry instead.
    pub fn exposition_registry(&self, component: &Registry) -> Result<Registry, prometheus::Error> {
        let exposed = Registry::new();
        self.register(&exposed)?;
        exposed.register(Box::new(Forward(component.clone())))?;
        Ok(exposed)
    }

    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.reviews.clone()),
            Box::new(self.duration.clone()),
            Box::new(self.cert_reloads.clone()),
            Box::new(self.handlers_running.clone()),
            Box::new(self.handlers_abandoned.clone()),
            Box::new(self.handler_slot_timeouts.clone()),
            Box::new(self.connections_open.clone()),
            Box::new(self.connections_closed.clone()),
            Box::new(self.connection_limit_waits.clone()),
        ]
    }

    /// Exports every per-route series of `route` with zero.
    pub(crate) fn init_route(&self, route: &str) {
        for verdict in Verdict::ALL {
            self.reviews.with_label_values(&[route, verdict.as_str()]);
        }
        self.duration.with_label_values(&[route]);
        self.handlers_abandoned.with_label_values(&[route]);
        self.handler_slot_timeouts.with_label_values(&[route]);
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

    /// `..._admission_handlers_running`.
    pub fn handlers_running(&self) -> &IntGauge {
        &self.handlers_running
    }

    /// `..._admission_handlers_abandoned_total{route}`.
    pub fn handlers_abandoned(&self) -> &IntCounterVec {
        &self.handlers_abandoned
    }

    /// `..._admission_handler_slot_timeouts_total{route}`.
    pub fn handler_slot_timeouts(&self) -> &IntCounterVec {
        &self.handler_slot_timeouts
    }

    /// `..._admission_connections_open`.
    pub fn connections_open(&self) -> &IntGauge {
        &self.connections_open
    }

    /// `..._admission_connections_closed_total{reason}`.
    pub fn connections_closed(&self) -> &IntCounterVec {
        &self.connections_closed
    }

    /// `..._admission_connection_limit_waits_total`.
    pub fn connection_limit_waits(&self) -> &IntCounter {
        &self.connection_limit_waits
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

    /// Records one closed connection.
    pub fn observe_connection_closed(&self, reason: CloseReason) {
        self.connections_closed
            .with_label_values(&[reason.as_str()])
            .inc();
    }
}

/// Exposes another registry's families (with that registry's prefix) through a collector.
struct Forward(Registry);

impl Collector for Forward {
    fn desc(&self) -> Vec<&Desc> {
        // The forwarded registry checks its own descriptors; no names are reserved here.
        Vec::new()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.0.gather()
    }
}
