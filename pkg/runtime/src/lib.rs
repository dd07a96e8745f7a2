//! The component runtime: every warmcache binary starts, serves, leads, reconciles and stops
//! the same way.
//!
//! A [`Builder`] sets up, once per process: the shared flags ([`RuntimeArgs`],
//! [`LeaderElectionArgs`], [`AdmissionArgs`]), logging and tracing (OTLP export through the
//! standard `OTEL_*` variables), the Prometheus registry (`warmcache_<component>_*` plus the
//! shared `warmcache_admission_*` series), the admin server (`/metrics`, `/livez`, `/readyz`,
//! bound before [`Builder::build`] returns), the Kubernetes client (every request counted and
//! paced by a client-side rate limit, [`rate_limit`]) and the Lease election. The
//! [`Runtime`] it builds then runs:
//! - [`Cache`]s from [`Runtime::watch`] / [`Runtime::watch_metadata`]: one watch per kind,
//!   shared by every reader, surviving objects that do not decode ([`watch`]);
//! - controllers from [`Runtime::controller`]: [`Reconciler`]s with one error policy, per-object
//!   backoff, Events, metrics and a span per reconcile continuing the object's trace, that
//!   reconcile only while the replica holds its Lease ([`controller`]);
//! - the admission server from [`Runtime::serve_admission`], on every replica, bound before it
//!   reports ready;
//! - any other task from [`Runtime::spawn`].
//!
//! `/readyz` answers 200 only once every cache has listed once, the webhook port is bound and
//! [`Runtime::run`] was called. On SIGTERM or SIGINT, `/readyz` fails, everything stops taking
//! new work and finishes what is in flight within `--shutdown-grace`, the Lease is released and
//! traces are flushed. A failing task stops the whole component with its error.
//!
//! ```no_run
//! use std::sync::Arc;
//! use clap::Parser;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::runtime::{controller::Action, watcher};
//! use warmcache_runtime::{LeaderElectionArgs, Reconciler, Runtime, RuntimeArgs, RuntimeError};
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     runtime: RuntimeArgs,
//!     #[command(flatten)]
//!     leader: LeaderElectionArgs,
//! }
//!
//! struct Labeller;
//!
//! impl Reconciler<ConfigMap> for Labeller {
//!     type Error = warmcache_kube::Error;
//!     async fn reconcile(&self, _cm: Arc<ConfigMap>) -> Result<Action, Self::Error> {
//!         Ok(Action::await_change())
//!     }
//! }
//!
//! fn main() -> Result<(), RuntimeError> {
//!     let cli = Cli::parse();
//!     warmcache_runtime::block_on(async {
//!         let mut rt = Runtime::builder("example-controller", cli.runtime)
//!             .version(env!("CARGO_PKG_VERSION"))
//!             .with_leader_election(cli.leader)
//!             .build()
//!             .await?;
//!         let configmaps = rt.watch::<ConfigMap>(None, watcher::Config::default())?;
//!         let controller = rt.controller("labeller", &configmaps, Labeller);
//!         rt.start_controller(controller);
//!         rt.run().await
//!     })
//! }
//! ```

#![warn(missing_docs)]

pub mod api_requests;
pub mod args;
pub mod controller;
mod error;
pub mod rate_limit;
pub mod readiness;
mod runtime;
pub mod watch;

pub use args::{
    AdmissionArgs, DEFAULT_KUBE_API_BURST, DEFAULT_KUBE_API_QPS, LeaderElectionArgs, OneShotArgs,
    RuntimeArgs, parse_duration,
};
pub use controller::{
    BackoffPolicy, Backoffs, CONFLICTS_BEFORE_EVENT, Controller, PANIC_CATEGORY, ReconcileError,
    Reconciler, error_policy, event_reason, publishes_event,
};
pub use error::RuntimeError;
pub use readiness::{Gate, Gates};
pub use runtime::{BLOCKING_SHUTDOWN_WAIT, Builder, Runtime, block_on};
pub use watch::{Cache, Change, WatchMetrics};

/// Re-exported so components name the same kube-runtime types this crate uses.
pub use kube::runtime::controller::Action;
pub use kube::runtime::reflector::{ObjectRef, Store};
pub use kube::runtime::watcher::Config as WatcherConfig;
/// Re-exported for building [`RuntimeArgs`] in code.
pub use warmcache_telemetry::LogFormat;
