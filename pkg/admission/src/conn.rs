//! Connections: a bounded accept loop, the TLS handshake with a deadline, HTTP/1.1 or HTTP/2
//! by ALPN, and a watchdog per connection that closes it when it does not deliver a request in
//! time or sits idle.
//!
//! The rules (all from [`AdmissionServerConfig`](crate::AdmissionServerConfig)):
//!
//! - at most `max_connections` connections are open (TLS handshakes included); while that many
//!   are open the server stops accepting, so further clients wait in the listen backlog until
//!   one closes (counted in `..._connection_limit_waits_total`);
//! - the TLS handshake must finish within `body_timeout`;
//! - the first request's headers (HTTP/2: the preface, `SETTINGS` and the first `HEADERS`) must
//!   arrive within `body_timeout` of the handshake;
//! - HTTP/1.1: a request's headers must arrive within `body_timeout` of its first byte;
//! - a connection with no request in flight (HTTP/1.1 keep-alive between requests, HTTP/2 with
//!   no open stream; pings and other control frames do not count) is closed after
//!   `idle_timeout`; HTTP/2 gets a `GOAWAY` first, and either protocol is dropped if it has not
//!   closed `body_timeout` later;
//! - on shutdown every connection is asked to finish (HTTP/1.1: close after the current
//!   response; HTTP/2: `GOAWAY`) and dropped after `shutdown_grace`.
//!
//! "In flight" lasts from the complete request headers until hyper is done with the response
//! body, so a slow reader of a response is not idle.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::metrics::{AdmissionMetrics, CloseReason};

/// Pause after a failed `accept` (out of file descriptors, ...), so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// Most concurrent HTTP/2 streams a client may open on one connection (hyper's default is
/// 200). The API server opens more connections when it needs more; request memory is bounded
/// over all streams by the server's body budget.
pub(crate) const MAX_STREAMS_PER_CONNECTION: u32 = 64;

/// Limits and timeouts of the connection layer.
#[derive(Clone, Debug)]
pub(crate) struct ConnSettings {
    /// TLS handshake, first request, HTTP/1.1 headers, and the hard close after a `GOAWAY`.
    pub(crate) header_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) shutdown_grace: Duration,
    pub(crate) max_connections: usize,
    pub(crate) metrics: Option<AdmissionMetrics>,
}

/// Accepts connections from `listener` and serves `router` on them until `shutdown` is
/// cancelled; then stops accepting and waits (at most `shutdown_grace` and a little) for the
/// open connections to finish.
pub(crate) async fn serve_connections(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    settings: ConnSettings,
    shutdown: CancellationToken,
) {
    let max = settings
        .max_connections
        .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
    let slots = Arc::new(Semaphore::new(max));
    let acceptor = TlsAcceptor::from(tls);
    let settings = Arc::new(settings);
    loop {
        let permit = match Arc::clone(&slots).try_acquire_owned() {
            Ok(permit) => permit,
            Err(TryAcquireError::NoPermits) => {
                if let Some(metrics) = &settings.metrics {
                    metrics.connection_limit_waits().inc();
                }
                tracing::warn!(
                    max_connections = max,
                    "connection limit reached; new connections wait until one closes"
                );
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    permit = Arc::clone(&slots).acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_closed) => break,
                    },
                }
            }
            Err(TryAcquireError::Closed) => break,
        };
        let (tcp, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::warn!(error = %err, "accepting a connection failed");
                    if let Some(metrics) = &settings.metrics {
                        metrics.observe_connection_closed(CloseReason::AcceptFailed);
                    }
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(ACCEPT_ERROR_BACKOFF) => continue,
                    }
                }
            },
        };
        let span =
            tracing::debug_span!("admission_connection", %peer, protocol = tracing::field::Empty);
        tokio::spawn(
            connection(
                tcp,
                permit,
                acceptor.clone(),
                router.clone(),
                Arc::clone(&settings),
                shutdown.clone(),
            )
            .instrument(span),
        );
    }
    drop(listener);
    // Every connection holds a slot until it ends, and ends at most `shutdown_grace` (plus a
    // handshake or header timeout) after the shutdown.
    let wait = settings
        .shutdown_grace
        .saturating_add(settings.header_timeout)
        .saturating_add(Duration::from_secs(1));
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    if tokio::time::timeout(wait, slots.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!(
            open = max.saturating_sub(slots.available_permits()),
            "admission connections still open after the shutdown grace period; leaving them"
        );
    }
}

/// Counts an open connection while alive.
struct OpenConnection {
    metrics: Option<AdmissionMetrics>,
    _slot: OwnedSemaphorePermit,
}

impl OpenConnection {
    fn new(metrics: Option<AdmissionMetrics>, slot: OwnedSemaphorePermit) -> Self {
        if let Some(metrics) = &metrics {
            metrics.connections_open().inc();
        }
        Self {
            metrics,
            _slot: slot,
        }
    }

    fn closed(&self, reason: CloseReason) {
        match reason {
            CloseReason::Client | CloseReason::Shutdown => {
                tracing::trace!(reason = reason.as_str(), "connection closed");
            }
            _ => tracing::debug!(reason = reason.as_str(), "connection closed"),
        }
        if let Some(metrics) = &self.metrics {
            metrics.observe_connection_closed(reason);
        }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        if let Some(metrics) = &self.metrics {
            metrics.connections_open().dec();
        }
    }
}

async fn connection(
    tcp: TcpStream,
    slot: OwnedSemaphorePermit,
    acceptor: TlsAcceptor,
    router: Router,
    settings: Arc<ConnSettings>,
    shutdown: CancellationToken,
) {
    let open = OpenConnection::new(settings.metrics.clone(), slot);
    if let Err(err) = tcp.set_nodelay(true) {
        tracing::debug!(error = %err, "cannot set TCP_NODELAY");
    }
    let handshake = tokio::select! {
        () = shutdown.cancelled() => return open.closed(CloseReason::Shutdown),
        handshake = tokio::time::timeout(settings.header_timeout, acceptor.accept(tcp)) => handshake,
    };
    let tls = match handshake {
        Ok(Ok(tls)) => tls,
        Ok(Err(err)) => {
            tracing::debug!(error = %err, "TLS handshake failed");
            return open.closed(CloseReason::TlsHandshakeFailed);
        }
        Err(_elapsed) => return open.closed(CloseReason::TlsHandshakeTimeout),
    };
    let established = Instant::now();
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
    tracing::Span::current().record("protocol", if h2 { "h2" } else { "http/1.1" });

    let activity = Arc::new(Activity::new(established));
    let io = TokioIo::new(Watched {
        inner: tls,
        // Bytes only start a header deadline on HTTP/1.1; on HTTP/2 they may be pings.
        activity: (!h2).then(|| Arc::clone(&activity)),
    });
    let service = tracked_service(router, Arc::clone(&activity));
    let watch = Watch {
        activity: &activity,
        settings: &settings,
        shutdown: &shutdown,
    };
    let reason = if h2 {
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION);
        let conn = builder.serve_connection(io, service);
        watch.drive(conn, |conn| conn.graceful_shutdown()).await
    } else {
        let mut builder = hyper::server::conn::http1::Builder::new();
        // Our watchdog keeps the header deadline: hyper's own header timer starts as soon as
        // a kept-alive connection waits for its next request, which would make the idle
        // timeout as short as the header timeout.
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(None)
            .keep_alive(true);
        let conn = builder.serve_connection(io, service);
        watch.drive(conn, |conn| conn.graceful_shutdown()).await
    };
    open.closed(reason);
}

/// The router as a hyper service that marks each request in flight until hyper drops its
/// response body.
fn tracked_service(
    router: Router,
    activity: Arc<Activity>,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = axum::response::Response,
    Error = Infallible,
    Future = impl Future<Output = Result<axum::response::Response, Infallible>> + Send,
> {
    let router = TowerToHyperService::new(router);
    hyper::service::service_fn(move |request: Request<Incoming>| {
        let in_flight = activity.request_started();
        let response = hyper::service::Service::call(&router, request);
        async move {
            let response = response.await?;
            Ok(response.map(move |body| {
                Body::new(body.map_frame(move |frame| {
                    let _in_flight = &in_flight;
                    frame
                }))
            }))
        }
    })
}

struct Watch<'a> {
    activity: &'a Activity,
    settings: &'a ConnSettings,
    shutdown: &'a CancellationToken,
}

impl Watch<'_> {
    /// Polls `conn` to completion, closing it when a deadline passes or the server shuts
    /// down. `graceful` asks hyper to finish (no more requests, `GOAWAY`).
    async fn drive<C, G>(&self, conn: C, graceful: G) -> CloseReason
    where
        C: Future<Output = Result<(), hyper::Error>>,
        G: Fn(Pin<&mut C>),
    {
        let mut conn = pin!(conn);
        let expired = loop {
            let deadline = self.activity.deadline(self.settings);
            let changed = self.activity.changed.notified();
            tokio::select! {
                result = conn.as_mut() => return ended(result),
                () = changed => {}
                () = sleep_until(deadline) => {
                    // Re-read: a request may have started just now.
                    if let Some((at, reason)) = self.activity.deadline(self.settings)
                        && at <= Instant::now()
                    {
                        break reason;
                    }
                }
                () = self.shutdown.cancelled() => break CloseReason::Shutdown,
            }
        };
        let grace = match expired {
            // Nothing is in flight and no request can be completed in time: just drop it. A
            // half-sent HTTP/2 preface cannot be answered with a GOAWAY anyway.
            CloseReason::HeaderTimeout => return expired,
            CloseReason::Shutdown => self.settings.shutdown_grace,
            _ => self.settings.header_timeout,
        };
        graceful(conn.as_mut());
        match tokio::time::timeout(grace, conn).await {
            Ok(Err(err)) => {
                tracing::debug!(error = %err, "connection ended with an error while closing")
            }
            Ok(Ok(())) => {}
            Err(_elapsed) => tracing::debug!(
                reason = expired.as_str(),
                "connection did not finish within {grace:?} of being asked to close; dropped"
            ),
        }
        expired
    }
}

fn ended(result: Result<(), hyper::Error>) -> CloseReason {
    match result {
        Ok(()) => CloseReason::Client,
        Err(err) if err.is_timeout() => CloseReason::HeaderTimeout,
        Err(err) if client_went_away(&err) => {
            tracing::trace!(error = %err, "client went away");
            CloseReason::Client
        }
        Err(err) => {
            tracing::debug!(error = %err, "connection ended with an error");
            CloseReason::Error
        }
    }
}

/// Whether `err` is the client closing its end without ceremony (no TLS `close_notify`, a
/// reset): that ends connections all the time and is not a server-side problem.
fn client_went_away(err: &hyper::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(current) = source {
        if let Some(io) = current.downcast_ref::<io::Error>() {
            return matches!(
                io.kind(),
                io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::BrokenPipe
            );
        }
        source = current.source();
    }
    false
}

async fn sleep_until(deadline: Option<(Instant, CloseReason)>) {
    match deadline {
        Some((at, _)) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What a connection is doing, for its watchdog.
struct Activity {
    state: Mutex<ActivityState>,
    /// Woken whenever the state changes in a way that moves the deadline.
    changed: Notify,
}

struct ActivityState {
    established: Instant,
    in_flight: usize,
    requests: u64,
    idle_since: Instant,
    /// When the first byte arrived while no request was in flight (HTTP/1.1 only).
    partial_since: Option<Instant>,
}

impl Activity {
    fn new(established: Instant) -> Self {
        Self {
            state: Mutex::new(ActivityState {
                established,
                in_flight: 0,
                requests: 0,
                idle_since: established,
                partial_since: None,
            }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ActivityState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn request_started(self: &Arc<Self>) -> InFlight {
        {
            let mut state = self.lock();
            state.in_flight += 1;
            state.requests += 1;
            state.partial_since = None;
        }
        self.changed.notify_one();
        InFlight(Arc::clone(self))
    }

    fn bytes_read(&self) {
        let mut state = self.lock();
        if state.in_flight == 0 && state.requests > 0 && state.partial_since.is_none() {
            state.partial_since = Some(Instant::now());
            drop(state);
            self.changed.notify_one();
        }
    }

    /// When the connection is due to be closed, and why; `None` while a request is in flight.
    fn deadline(&self, settings: &ConnSettings) -> Option<(Instant, CloseReason)> {
        let state = self.lock();
        if state.in_flight > 0 {
            return None;
        }
        if state.requests == 0 {
            return Some((
                state.established + settings.header_timeout,
                CloseReason::HeaderTimeout,
            ));
        }
        let idle = (state.idle_since + settings.idle_timeout, CloseReason::Idle);
        Some(match state.partial_since {
            Some(since) if since + settings.header_timeout < idle.0 => {
                (since + settings.header_timeout, CloseReason::HeaderTimeout)
            }
            _ => idle,
        })
    }
}

/// A request in flight; dropped when hyper is done with its response (or gives up on it).
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        {
            let mut state = self.0.lock();
            state.in_flight = state.in_flight.saturating_sub(1);
            if state.in_flight == 0 {
                state.idle_since = Instant::now();
            }
        }
        self.0.changed.notify_one();
    }
}

/// The TLS stream, reporting received bytes to the watchdog (HTTP/1.1 only).
struct Watched<T> {
    inner: T,
    activity: Option<Arc<Activity>>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let (Poll::Ready(Ok(())), Some(activity)) = (&polled, &self.activity)
            && buf.filled().len() > before
        {
            activity.bytes_read();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Binds or adopts the listening socket.
pub(crate) async fn listen(
    listen: crate::server::Listen,
) -> Result<(TcpListener, SocketAddr), io::Error> {
    let listener = match listen {
        crate::server::Listen::Addr(addr) => TcpListener::bind(addr).await?,
        crate::server::Listen::Listener(listener) => {
            listener.set_nonblocking(true)?;
            TcpListener::from_std(listener)?
        }
    };
    let addr = listener.local_addr()?;
    Ok((listener, addr))
}
