//! HTTPS `AdmissionReview` (`admission.k8s.io/v1`) server shared by warmcache's webhooks, with
//! certificate reload and JSON-patch helpers.
//!
//! - [`AdmissionServer`]: [`Route`]s added with [`AdmissionServer::route`] (validating or
//!   mutating; sync or async handlers; dynamic ones reading `AdmissionRequest<DynamicObject>`
//!   or typed ones reading a [`TypedRequest<K>`]; each with an [`OnHandlerError`] policy:
//!   deny, or allow unchanged with a warning) behind a decoding layer with size limit,
//!   content-type check, timeouts and panic isolation, served over rustls (ring provider only)
//!   with ALPN `h2` and `http/1.1`, as kube-apiserver expects. Synchronous handlers run on the
//!   blocking pool within a bounded number of slots (typed async routes may answer small
//!   reviews on the async worker: [`AdmissionServerConfig::inline_body_bytes`]); the connection
//!   layer bounds open connections and closes silent, half-open and idle ones (see
//!   [`AdmissionServerConfig`]).
//! - [`typed`]: handlers answer a [`Validation`] (allow or deny, by type nothing else) or a
//!   [`Mutation<K>`] (allow, allow changed, deny), with warnings ([`Reply`]). Denials carry
//!   [`FieldCause`]s and go out as `422 Invalid` with `details.causes`; a changed object becomes
//!   a JSON patch computed from the typed diff and applied to the object as sent, keeping the
//!   fields `K` does not model ([`patch::raw_patch`]). Handlers see `dry_run` and must not
//!   perform side effects for it.
//! - [`reuse`]: a typed mutating handler may offer its answer for reuse ([`Reusable`]); the
//!   route then answers later reviews of an equal object (the replicas of one ReplicaSet)
//!   from the kept patch while the handler's [`Reuse::holds`] says its inputs are unchanged.
//! - [`registration`]: each route carries its webhook registration ([`Webhook`]: name, rules,
//!   policies, selectors); [`AdmissionServer::configurations`] builds the
//!   `ValidatingWebhookConfiguration` and `MutatingWebhookConfiguration` calling the routes'
//!   paths through a Service ([`WebhookConfigurations::with_url`] retargets them for tests).
//! - [`ReloadingCertResolver`] + [`spawn_reloader`]: the certificate and key are read from
//!   files and swapped in without a restart when the mounted Secret rotates.
//! - [`patch`]: JSON-pointer escaping, `add`/`replace`/`remove`, a [`patch::PatchBuilder`]
//!   that creates missing annotation/label maps, `diff`, and [`patch::raw_patch`].
//! - [`AdmissionMetrics`]: Prometheus series for reviews (per route and verdict), latency,
//!   certificate reloads, handlers and connections, named `warmcache_admission_*` in every
//!   binary.
//!
//! Crypto: every TLS object here is built with `rustls::crypto::ring::default_provider()`
//! passed explicitly, so the crate works whether or not a process-wide provider is installed.
//! Binaries should still call [`install_default_crypto_provider`] at startup for their other
//! rustls users.

mod conn;
pub mod error;
pub mod metrics;
pub mod patch;
mod pod_patch;
pub mod registration;
pub mod reuse;
pub mod review;
pub mod route;
pub mod server;
pub mod tls;
pub mod typed;

pub use error::AdmissionError;
pub use metrics::{AdmissionMetrics, CloseReason, Verdict};
pub use registration::{ServiceTarget, Webhook, WebhookConfigurations};
pub use reuse::{Reusable, Reuse, ReusedReview};
pub use review::{DecodeRejection, decode_review, into_v1_review, invalid_response};
pub use route::{HandlerOutput, OnHandlerError, Route, RouteKind};
pub use server::{
    AdmissionServer, AdmissionServerConfig, DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_BUFFERED_BODY_BYTES, DEFAULT_MAX_CONCURRENT_HANDLERS, DEFAULT_MAX_CONNECTIONS,
    Listen,
};
pub use tls::{
    ALPN_PROTOCOLS, ReloadingCertResolver, TlsFiles, install_default_crypto_provider,
    spawn_reloader, tls_server_config,
};
pub use typed::{
    FieldCause, Mutation, Reply, TypedOutcome, TypedOutput, TypedRequest, TypedResource, Validation,
};

/// The kube admission types handlers work with, re-exported for convenience.
pub use kube::core::DynamicObject;
pub use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
