//! Tracing, OTLP export, W3C trace context on objects, Prometheus registry and the admin HTTP server.
//!
//! Every warmcache binary uses this crate the same way:
//!
//! ```no_run
//! # async fn run() -> Result<(), warmcache_telemetry::TelemetryError> {
//! use warmcache_telemetry as telemetry;
//!
//! let config = telemetry::TelemetryConfig::from_env(
//!     "modelcache-controller",
//!     None, // the --log-level flag, if given
//!     telemetry::LogFormat::Json,
//! )
//! .with_version(env!("CARGO_PKG_VERSION"));
//! let _telemetry = telemetry::init(&config)?;
//!
//! let shutdown = telemetry::shutdown_signal()?;
//! let metrics = telemetry::Metrics::new("warmcache_binding_controller")?;
//! let reconcile = telemetry::ReconcileMetrics::register(metrics.registry())?;
//! let readiness = telemetry::Readiness::new();
//! let admin = tokio::spawn(telemetry::serve_admin(
//!     "0.0.0.0:8080".parse().expect("static address"),
//!     metrics.registry().clone(),
//!     readiness.clone(),
//!     shutdown.clone(),
//! ));
//! // ... start the controller, then:
//! readiness.set_ready(true);
//! # let _ = (reconcile, admin);
//! # Ok(())
//! # }
//! ```
//!
//! Tracing: logs go to standard error, filtered by the log-level flag or `RUST_LOG` (default
//! `info`). Spans become OpenTelemetry spans; they are exported over OTLP/gRPC only when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and
//! `OTEL_SDK_DISABLED` is not `true`). Trace ids exist either way, appear in log lines, and are
//! carried from object to object in the [`TRACE_PARENT_ANNOTATION`] annotation.

#![warn(missing_docs)]

mod admin;
mod config;
mod error;
mod metrics;
mod propagation;
mod subscriber;

pub use admin::{
    ADMIN_SHUTDOWN_GRACE, Readiness, admin_router, serve_admin, serve_admin_on, shutdown_signal,
};
pub use config::{
    DEFAULT_LOG_FILTER, LogFormat, OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    OTEL_RESOURCE_ATTRIBUTES, OTEL_SDK_DISABLED, OTEL_SERVICE_NAME, OtelSettings,
    ParseLogFormatError, RUST_LOG_ENV, TelemetryConfig, resolve_log_filter,
};
pub use error::TelemetryError;
pub use metrics::{
    METRICS_CONTENT_TYPE, MetricError, Metrics, RECONCILE_DURATION_BUCKETS, ReconcileMetrics,
    encode_text, is_valid_metric_name, register_metric,
};
pub use propagation::{
    TRACE_PARENT_ANNOTATION, TRACE_STATE_ANNOTATION, current_trace_id, extract,
    extract_span_context, inject_context, inject_current, set_parent_from_annotations,
};
pub use subscriber::{SHUTDOWN_TIMEOUT, TelemetryGuard, init};

/// Re-exported so callers name the same versions this crate was built with.
pub use opentelemetry;
/// Re-exported so callers name the same version this crate was built with.
pub use prometheus;
/// Re-exported for `CancellationToken`.
pub use tokio_util;
