//! The error type of this crate.

use std::io;
use std::net::SocketAddr;

/// Everything that can go wrong while setting up or running telemetry.
///
/// Each variant carries the value that was being used (filter text, endpoint, address) so
/// that the message a binary prints on startup failure says what to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// The log filter (from the flag or `RUST_LOG`) is not a valid `tracing` filter directive.
    #[error("invalid log filter {filter:?}: {source}")]
    InvalidLogFilter {
        /// The filter text as given.
        filter: String,
        /// What the parser rejected.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },

    /// A global `tracing` subscriber (or `log` logger) was already installed; [`crate::init`]
    /// must be called once per process.
    #[error("telemetry is already initialised in this process: {0}")]
    AlreadyInitialized(#[source] tracing_subscriber::util::TryInitError),

    /// Something that must run inside a Tokio runtime was called outside one.
    #[error("{what} must be called from within a Tokio runtime")]
    NoTokioRuntime {
        /// The operation that needed the runtime.
        what: &'static str,
    },

    /// The OTLP span exporter could not be built from the configured endpoint and the
    /// `OTEL_EXPORTER_OTLP_*` variables.
    #[error("cannot configure the OTLP trace exporter for {endpoint:?}: {source}")]
    OtlpExporter {
        /// The collector endpoint that was configured.
        endpoint: String,
        /// The exporter's own error.
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },

    /// Flushing or shutting down the tracer provider failed (spans may have been lost).
    #[error("shutting down the OpenTelemetry tracer provider failed: {0}")]
    TracerShutdown(#[source] opentelemetry_sdk::error::OTelSdkError),

    /// A `tracing` span could not take a parent context from an object's annotations.
    #[error("cannot set the parent of the span from the trace annotations: {0}")]
    SetParent(#[source] tracing_opentelemetry::SetParentError),

    /// The metric name prefix is not a valid Prometheus metric name.
    #[error(
        "invalid metric prefix {prefix:?}: it must match [a-zA-Z_:][a-zA-Z0-9_:]* \
         (use underscores, not dashes)"
    )]
    InvalidMetricPrefix {
        /// The prefix as given.
        prefix: String,
    },

    /// Creating, registering or encoding a Prometheus metric failed.
    #[error("prometheus metric {what}: {source}")]
    Metrics {
        /// Which metric or operation failed.
        what: String,
        /// The prometheus crate's error.
        #[source]
        source: prometheus::Error,
    },

    /// The admin HTTP server could not bind its listening address.
    #[error("cannot bind the admin HTTP server to {addr}: {source}")]
    AdminBind {
        /// The address that could not be bound.
        addr: SocketAddr,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },

    /// The admin HTTP server failed while running.
    #[error("admin HTTP server on {addr} failed: {source}")]
    AdminServe {
        /// The address the server was listening on (`0.0.0.0:0` if it could not be read).
        addr: SocketAddr,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },

    /// A SIGTERM/SIGINT handler could not be installed.
    #[error("cannot install the {signal} handler: {source}")]
    Signal {
        /// The signal name.
        signal: &'static str,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
}
