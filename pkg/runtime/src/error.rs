//! The error type of this crate.

use std::net::SocketAddr;

use warmcache_telemetry::prometheus;

/// Why the runtime could not start, or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// Tracing, metrics, signals or the admin server failed.
    #[error(transparent)]
    Telemetry(#[from] warmcache_telemetry::TelemetryError),
    /// The admission server failed (certificates, routes, serving).
    #[error(transparent)]
    Admission(#[from] warmcache_admission::AdmissionError),
    /// No Kubernetes client configuration could be loaded.
    #[error("cannot configure the Kubernetes client{}: {source}", from.as_deref().map(|f| format!(" from {f}")).unwrap_or_default())]
    ClientConfig {
        /// The kubeconfig file, when one was named.
        from: Option<String>,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The component asked for a Kubernetes client it was not built with.
    #[error("this component was built without a Kubernetes client (call Builder::with_client)")]
    NoClient,
    /// The leader election flags are inconsistent, or the identity or namespace is missing.
    #[error("leader election: {0}")]
    LeaderElection(String),
    /// A metric could not be created or registered.
    #[error("metric {name}: {source}")]
    Metric {
        /// The metric.
        name: String,
        /// The prometheus crate's error.
        #[source]
        source: prometheus::Error,
    },
    /// A listening address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The async runtime could not be started.
    #[error("cannot start the async runtime: {0}")]
    AsyncRuntime(#[source] std::io::Error),
    /// A watch was asked for something it cannot do.
    #[error("watch of {kind}: {problem}")]
    Watch {
        /// The watched kind.
        kind: &'static str,
        /// Why.
        problem: String,
    },
    /// A watch ended before its cache synced (the runtime is shutting down).
    #[error("the {kind} watch ended before its cache synced")]
    WatchEnded {
        /// The watched kind.
        kind: &'static str,
    },
    /// A task of the component failed; the runtime shut everything down.
    #[error("{task}: {message}")]
    Task {
        /// The task's name.
        task: String,
        /// Its error, in full.
        message: String,
    },
    /// A task of the component panicked.
    #[error("the {task} task panicked: {message}")]
    Panicked {
        /// The task's name.
        task: String,
        /// The panic's message.
        message: String,
    },
}

impl RuntimeError {
    pub(crate) fn metric(name: &str, source: prometheus::Error) -> Self {
        Self::Metric {
            name: name.to_owned(),
            source,
        }
    }
}
