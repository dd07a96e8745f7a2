//! The admin HTTP server (`/metrics`, `/livez`, `/readyz`) and shutdown signals.
//!
//! The admin server is plain HTTP on its own port, apart from any TLS webhook port, so the
//! kubelet probes and Prometheus scrapes need no certificates.

use std::borrow::Cow;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::error::TelemetryError;
use crate::metrics::{METRICS_CONTENT_TYPE, encode_text};

/// After the shutdown token is cancelled, how long in-flight admin requests may take to finish
/// before [`serve_admin`] returns anyway.
pub const ADMIN_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Reason reported by `/readyz` before anything called [`Readiness::set_ready`].
const STARTING: &str = "starting";
/// Reason reported by `/readyz` after `set_ready(false)`.
const NOT_READY: &str = "not ready";

#[derive(Debug)]
struct ReadyState {
    ready: bool,
    reason: Cow<'static, str>,
}

/// The readiness the binary reports on `/readyz`; starts not ready (`starting`).
///
/// Clones share one flag: hand one to the admin server and flip it from the component once
/// it can do its job (caches synced, webhook certificate loaded, ...).
#[derive(Clone, Debug)]
pub struct Readiness {
    state: Arc<Mutex<ReadyState>>,
}

impl Default for Readiness {
    fn default() -> Self {
        Self::new()
    }
}

impl Readiness {
    /// A new flag, not ready, with the reason `starting`.
    #[must_use]
    pub fn new() -> Self {
        Readiness {
            state: Arc::new(Mutex::new(ReadyState {
                ready: false,
                reason: Cow::Borrowed(STARTING),
            })),
        }
    }

    fn with_state<R>(&self, f: impl FnOnce(&mut ReadyState) -> R) -> R {
        // The state is two plain fields; a panic elsewhere cannot leave it inconsistent.
        let mut guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut guard)
    }

    /// Marks the component ready (`true`) or not ready (`false`, reason `not ready`).
    pub fn set_ready(&self, ready: bool) {
        self.with_state(|s| {
            s.ready = ready;
            s.reason = Cow::Borrowed(if ready { "" } else { NOT_READY });
        });
    }

    /// Marks the component not ready, with a short reason shown in the `/readyz` body (for
    /// example `waiting for the informer caches`).
    pub fn set_not_ready(&self, reason: impl Into<Cow<'static, str>>) {
        let reason = reason.into();
        self.with_state(|s| {
            s.ready = false;
            s.reason = reason;
        });
    }

    /// Whether the component is ready.
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.with_state(|s| s.ready)
    }

    /// `Ok(())` when ready, otherwise the reason.
    pub fn check(&self) -> Result<(), String> {
        self.with_state(|s| {
            if s.ready {
                Ok(())
            } else {
                Err(s.reason.to_string())
            }
        })
    }
}

#[derive(Clone)]
struct AdminState {
    registry: Registry,
    readiness: Readiness,
}

/// The admin routes, for embedding or for in-process tests:
/// - `GET /metrics`: the registry in the Prometheus text format;
/// - `GET /livez`: 200 `ok` while the process serves requests;
/// - `GET /readyz`: 200 `ok` when `readiness` is set, else 503 with the reason.
pub fn admin_router(registry: Registry, readiness: Readiness) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/livez", get(livez_handler))
        .route("/readyz", get(readyz_handler))
        .with_state(AdminState {
            registry,
            readiness,
        })
}

async fn metrics_handler(State(state): State<AdminState>) -> Response {
    match encode_text(&state.registry) {
        Ok(body) => ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], body).into_response(),
        Err(err) => {
            tracing::warn!(error = %err, "cannot encode metrics");
            (StatusCode::INTERNAL_SERVER_ERROR, format!("{err}\n")).into_response()
        }
    }
}

async fn livez_handler() -> &'static str {
    "ok\n"
}

async fn readyz_handler(State(state): State<AdminState>) -> Response {
    match state.readiness.check() {
        Ok(()) => "ok\n".into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        )
            .into_response(),
    }
}

/// Binds `addr` and serves the admin routes (see [`admin_router`]) until `shutdown` is
/// cancelled.
///
/// # Errors
/// [`TelemetryError::AdminBind`] (with the address) if the port cannot be bound, or
/// [`TelemetryError::AdminServe`] if the server fails.
pub async fn serve_admin(
    addr: SocketAddr,
    registry: Registry,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> Result<(), TelemetryError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| TelemetryError::AdminBind { addr, source })?;
    serve_admin_on(listener, registry, readiness, shutdown).await
}

/// As [`serve_admin`], on a listener the caller bound (for example on port 0 in tests, to learn
/// the port from `listener.local_addr()` first).
///
/// After `shutdown` is cancelled the server stops accepting connections, lets requests in
/// flight finish for up to [`ADMIN_SHUTDOWN_GRACE`], and returns `Ok(())`.
///
/// # Errors
/// [`TelemetryError::AdminServe`] if the server fails.
pub async fn serve_admin_on(
    listener: TcpListener,
    registry: Registry,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> Result<(), TelemetryError> {
    let addr = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)));
    tracing::info!(%addr, "admin server listening (/metrics /livez /readyz)");

    let signal = shutdown.clone();
    let server = axum::serve(listener, admin_router(registry, readiness))
        .with_graceful_shutdown(async move { signal.cancelled().await });

    let result = tokio::select! {
        result = server => result,
        () = async {
            shutdown.cancelled().await;
            tokio::time::sleep(ADMIN_SHUTDOWN_GRACE).await;
        } => {
            tracing::warn!(%addr, "admin server: requests still open after the grace period");
            Ok(())
        }
    };
    result.map_err(|source| TelemetryError::AdminServe { addr, source })?;
    tracing::info!(%addr, "admin server stopped");
    Ok(())
}

/// A token that is cancelled when the process receives SIGTERM or SIGINT.
///
/// Hand clones (or `child_token()`s) to every task that must stop on shutdown. The signal
/// received is logged.
///
/// # Errors
/// No Tokio runtime, or a signal handler could not be installed.
pub fn shutdown_signal() -> Result<CancellationToken, TelemetryError> {
    use tokio::signal::unix::{SignalKind, signal};

    if tokio::runtime::Handle::try_current().is_err() {
        return Err(TelemetryError::NoTokioRuntime {
            what: "shutdown_signal",
        });
    }
    let mut sigterm = signal(SignalKind::terminate()).map_err(|source| TelemetryError::Signal {
        signal: "SIGTERM",
        source,
    })?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|source| TelemetryError::Signal {
        signal: "SIGINT",
        source,
    })?;

    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = sigterm.recv() => "SIGTERM",
            _ = sigint.recv() => "SIGINT",
            () = cancel.cancelled() => return,
        };
        tracing::info!(signal = name, "shutdown requested");
        cancel.cancel();
    });
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Metrics, ReconcileMetrics};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpStream;

    /// A minimal HTTP/1.1 GET; returns (status, body).
    async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(req.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
            .await
            .expect("response within 10 s")
            .unwrap();
        let text = String::from_utf8(raw).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let status = head
            .lines()
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap();
        (status, head.to_owned(), body.to_owned())
    }

    #[test]
    fn readiness_flag() {
        let r = Readiness::default();
        assert!(!r.is_ready());
        assert_eq!(r.check(), Err("starting".to_owned()));
        let other = r.clone();
        other.set_ready(true);
        assert!(r.is_ready());
        assert_eq!(r.check(), Ok(()));
        r.set_not_ready("waiting for the informer caches");
        assert_eq!(
            other.check(),
            Err("waiting for the informer caches".to_owned())
        );
        r.set_ready(false);
        assert_eq!(other.check(), Err("not ready".to_owned()));
    }

    #[tokio::test]
    async fn admin_server_serves_probes_and_metrics_and_stops() {
        let metrics = Metrics::new("warmcache_admin_test").unwrap();
        let rm = ReconcileMetrics::register(metrics.registry()).unwrap();
        rm.start("binding").observe_duration();
        let readiness = Readiness::new();
        let shutdown = CancellationToken::new();

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve_admin_on(
            listener,
            metrics.registry().clone(),
            readiness.clone(),
            shutdown.clone(),
        ));

        let (status, _, body) = get(addr, "/livez").await;
        assert_eq!((status, body.as_str()), (200, "ok\n"));

        let (status, _, body) = get(addr, "/readyz").await;
        assert_eq!(status, 503);
        assert_eq!(body, "not ready: starting\n");

        readiness.set_ready(true);
        let (status, _, body) = get(addr, "/readyz").await;
        assert_eq!((status, body.as_str()), (200, "ok\n"));

        let (status, head, body) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: text/plain; version=0.0.4"),
            "{head}"
        );
        let families = crate::metrics::tests::check_exposition(&body).unwrap();
        assert!(
            families
                .iter()
                .any(|f| f == "warmcache_admin_test_reconcile_runs_total"),
            "{body}"
        );

        let (status, _, _) = get(addr, "/nope").await;
        assert_eq!(status, 404);

        shutdown.cancel();
        let ended = tokio::time::timeout(Duration::from_secs(3), server)
            .await
            .expect("server stops within 3 s");
        ended.unwrap().unwrap();
        assert!(TcpStream::connect(addr).await.is_err(), "listener closed");
    }

    #[tokio::test]
    async fn shutdown_waits_at_most_the_grace_period_for_idle_connections() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve_admin_on(
            listener,
            Registry::new(),
            Readiness::new(),
            shutdown.clone(),
        ));
        // A client that connects and never sends a request.
        let _idle = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        shutdown.cancel();
        tokio::time::timeout(ADMIN_SHUTDOWN_GRACE + Duration::from_secs(3), server)
            .await
            .expect("server stops after the grace period")
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn bind_failure_names_the_address() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let err = serve_admin(
            addr,
            Registry::new(),
            Readiness::new(),
            CancellationToken::new(),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, TelemetryError::AdminBind { .. }), "{err}");
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
    }

    #[tokio::test]
    async fn shutdown_signal_installs_inside_a_runtime() {
        let token = shutdown_signal().unwrap();
        assert!(!token.is_cancelled());
    }

    #[test]
    fn shutdown_signal_outside_a_runtime_is_an_error() {
        assert!(matches!(
            shutdown_signal(),
            Err(TelemetryError::NoTokioRuntime { .. })
        ));
    }
}
