//! HTTPS `AdmissionReview` (`admission.k8s.io/v1`) server shared by warmcache's webhooks, with
//! certificate reload and JSON-patch helpers.
//!
//! - [`AdmissionServer`]: routes (`validate`/`mutate`, sync or async handlers, each with an
//!   [`OnHandlerError`] policy: deny, or allow unchanged with a warning) behind a
//!   decoding layer with size limit, content-type check, timeouts and panic isolation, served
//!   over rustls (ring provider only) with ALPN `h2` and `http/1.1`, as kube-apiserver expects.
//!   Synchronous handlers run on the blocking pool within a bounded number of slots; the
//!   connection layer bounds open connections and closes silent, half-open and idle ones
//!   (see [`AdmissionServerConfig`]).
//! - [`ReloadingCertResolver`] + [`spawn_reloader`]: the certificate and key are read from
//!   files and swapped in without a restart when the mounted Secret rotates.
//! - [`patch`]: JSON-pointer escaping, `add`/`replace`/`remove`, a [`patch::PatchBuilder`]
//!   that creates missing annotation/label maps, and `diff`.
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
pub mod review;
pub mod server;
pub mod tls;

pub use error::AdmissionError;
pub use metrics::{AdmissionMetrics, CloseReason, Verdict};
pub use review::{DecodeRejection, decode_review, into_v1_review, invalid_response};
pub use server::{
    AdmissionServer, AdmissionServerConfig, DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_BUFFERED_BODY_BYTES, DEFAULT_MAX_CONCURRENT_HANDLERS, DEFAULT_MAX_CONNECTIONS,
    HandlerOutput, Listen, OnHandlerError, RouteKind,
};
pub use tls::{
    ALPN_PROTOCOLS, ReloadingCertResolver, TlsFiles, install_default_crypto_provider,
    spawn_reloader, tls_server_config,
};

/// The kube admission types handlers work with, re-exported for convenience.
pub use kube::core::DynamicObject;
pub use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
