//! The HTTPS server: routes, the decoding layer around handlers, limits and timeouts.

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::BodyExt;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse};
use prometheus::IntGauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::conn::{self, ConnSettings};
use crate::error::AdmissionError;
use crate::metrics::{AdmissionMetrics, Verdict};
use crate::registration::{self, Registered, ServiceTarget, WebhookConfigurations};
use crate::review::{DecodeRejection, decode_review_parts, encode_review, invalid_response};
use crate::route::{
    AfterHandler, AsyncFn, DynHandler, OnHandlerError, Review, Route, RouteKind, StagedFuture,
};
use crate::tls::{ReloadingCertResolver, TlsFiles, spawn_reloader, tls_server_config};

/// Default [`AdmissionServerConfig::max_body_bytes`]: 3 MiB, the API server's own limit for
/// admission requests.
pub const DEFAULT_MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// Default [`AdmissionServerConfig::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// Default [`AdmissionServerConfig::max_concurrent_handlers`].
pub const DEFAULT_MAX_CONCURRENT_HANDLERS: usize = 8;

/// Default [`AdmissionServerConfig::max_buffered_body_bytes`]: 32 MiB, ten largest requests.
pub const DEFAULT_MAX_BUFFERED_BODY_BYTES: usize = 32 * 1024 * 1024;

/// Unit in which the body budget is counted (a semaphore permit).
const BODY_BUDGET_UNIT: usize = 1024;

/// Settings of an [`AdmissionServer`]. Build with [`AdmissionServerConfig::new`] and adjust
/// the public fields.
#[derive(Clone, Debug)]
pub struct AdmissionServerConfig {
    /// Certificate and key served, reloaded when they change.
    pub tls: TlsFiles,
    /// How often [`serve`](AdmissionServer::serve) re-reads the certificate files.
    /// Default 10 s.
    pub reload_interval: Duration,
    /// Largest request body accepted; bigger bodies get `413`. Default
    /// [`DEFAULT_MAX_BODY_BYTES`].
    pub max_body_bytes: usize,
    /// The header and body timeout. A connection must finish its TLS handshake within it, and
    /// then deliver its first request's headers (HTTP/2: the preface and the first `HEADERS`)
    /// within it, or it is closed; an HTTP/1.1 request's headers must arrive within it of its
    /// first byte. A request body not received within it gets `408` and the connection is
    /// closed. Default 5 s.
    pub body_timeout: Duration,
    /// A connection with no request in flight for this long is closed: HTTP/1.1 keep-alive
    /// between requests, or HTTP/2 with no open stream (with a `GOAWAY`; pings do not count as
    /// activity). Longer than the API server's own idle timeout for webhook connections
    /// (90 s), so the client normally closes first. Default 120 s.
    pub idle_timeout: Duration,
    /// Most connections open at once, TLS handshakes included. While this many are open the
    /// server accepts no more, so new clients wait in the listen backlog until one closes.
    /// `0` counts as 1. Default [`DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: usize,
    /// Most synchronous handlers running at once, on tokio's blocking pool (they never run
    /// on the async workers, so a slow one cannot delay other reviews or the timeouts). A
    /// review that finds every slot busy waits for one until
    /// [`handler_timeout`](Self::handler_timeout). A handler still running at its timeout
    /// keeps its slot until it returns. A review of a synchronous or typed route is decoded in
    /// its slot (the whole review is one step on the blocking pool), so a review that finds
    /// every slot busy is decoded only to answer with its uid. Async handlers are not counted,
    /// but the step of a typed async route is (its future's first poll included; a future that
    /// waits goes on without a slot, and its patch takes a slot again), unless its body is
    /// small enough to be answered on the async worker
    /// ([`inline_body_bytes`](Self::inline_body_bytes)). `0` counts as 1.
    /// Default [`DEFAULT_MAX_CONCURRENT_HANDLERS`].
    pub max_concurrent_handlers: usize,
    /// Time a handler gets to answer, waiting for a handler slot included; after that the
    /// handler has failed and the route's [`OnHandlerError`] decides the answer, sent at once
    /// even if a synchronous handler is still running. It must be below every registered
    /// webhook's `timeoutSeconds` (10 s by default), so the API server sees our answer rather
    /// than a timeout: a registration whose `timeoutSeconds` is not longer is refused when the
    /// router or the configurations are built. Default 8 s.
    pub handler_timeout: Duration,
    /// Most request-body bytes held in memory at once, over all connections and streams
    /// (HTTP/2 multiplexes many requests on one connection, so the connection bound alone does
    /// not bound memory). A request reserves its `Content-Length` (or
    /// [`max_body_bytes`](Self::max_body_bytes) without one) before its body is read; a request
    /// that finds no room within [`body_timeout`](Self::body_timeout) gets `503`. Default
    /// [`DEFAULT_MAX_BUFFERED_BODY_BYTES`].
    pub max_buffered_body_bytes: usize,
    /// How long in-flight requests may finish after shutdown is requested. Default 10 s.
    pub shutdown_grace: Duration,
    /// Typed async routes ([`Route::mutating_typed_async`](crate::Route::mutating_typed_async),
    /// [`Route::validating_typed_async`](crate::Route::validating_typed_async)) answer a review
    /// whose body is at most this many bytes on the async worker that read it, without a
    /// handler slot or a hand-off to the blocking pool and back: decoding, the first poll of
    /// the handler's future, the patch and encoding the answer. A review that waits for I/O
    /// goes on in a task as usual, and its patch is computed on the worker too. A panic is
    /// caught and answered by the route's [`OnHandlerError`] as on the blocking pool.
    ///
    /// The trade: the blocking pool isolates work proportional to the object, which the
    /// request's sender controls, and bounds it by [`handler_timeout`](Self::handler_timeout).
    /// Inline, that work is bounded by this size instead (a 3 KB pod costs about 100 µs) and
    /// cannot be abandoned at the timeout, and it delays the other connections of its worker
    /// while it runs; bigger bodies stay on the blocking pool. So is every review of a
    /// synchronous route, whose handler may block. A handler's future must not block either
    /// way (it is polled on the async workers), but inline a first poll that blocks is not
    /// answered at the timeout. `0` (the default) keeps every review on the blocking pool.
    pub inline_body_bytes: usize,
}

impl AdmissionServerConfig {
    /// Defaults for everything but the TLS files.
    pub fn new(tls: TlsFiles) -> Self {
        Self {
            tls,
            reload_interval: Duration::from_secs(10),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            body_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(120),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_concurrent_handlers: DEFAULT_MAX_CONCURRENT_HANDLERS,
            handler_timeout: Duration::from_secs(8),
            max_buffered_body_bytes: DEFAULT_MAX_BUFFERED_BODY_BYTES,
            shutdown_grace: Duration::from_secs(10),
            inline_body_bytes: 0,
        }
    }
}

/// Where the server listens.
#[derive(Debug)]
pub enum Listen {
    /// Bind this address when serving starts.
    Addr(SocketAddr),
    /// Use an already bound listener (tests bind `127.0.0.1:0` and read the port first).
    Listener(std::net::TcpListener),
}

impl From<SocketAddr> for Listen {
    fn from(addr: SocketAddr) -> Self {
        Self::Addr(addr)
    }
}

impl From<std::net::TcpListener> for Listen {
    fn from(listener: std::net::TcpListener) -> Self {
        Self::Listener(listener)
    }
}

/// The admission webhook server: a set of routes, each answering `AdmissionReview`s with a
/// handler, served over HTTPS (HTTP/1.1 and HTTP/2 via ALPN).
///
/// ```no_run
/// # use warmcache_admission::*;
/// # async fn run() -> Result<(), AdmissionError> {
/// let config = AdmissionServerConfig::new(TlsFiles::in_dir("/etc/webhook/certs"));
/// let shutdown = tokio_util::sync::CancellationToken::new();
/// AdmissionServer::new(config)
///     .route(Route::validating(
///         "/validate-kvcachebackend",
///         |req: AdmissionRequest<DynamicObject>| AdmissionResponse::from(&req),
///     ))
///     .serve(std::net::SocketAddr::from(([0, 0, 0, 0], 8443)), shutdown)
///     .await
/// # }
/// ```
///
/// Routes are added with [`route`](Self::route) (see [`Route`] for the kinds of handlers). Each
/// route only accepts `POST` with `Content-Type: application/json`. The decoding layer in front
/// of the handlers:
/// - refuses a missing or other content type with `415`;
/// - refuses a body over [`max_body_bytes`](AdmissionServerConfig::max_body_bytes) with `413`
///   (from `Content-Length` up front, or while reading);
/// - cuts off a client that does not deliver its body within
///   [`body_timeout`](AdmissionServerConfig::body_timeout) with `408`;
/// - decodes the review as described in [`crate::review`] (`400` for non-JSON, `200` with an
///   invalid response for review-shaped but unacceptable bodies);
/// - runs the handler in its own task, so a panic, an error or a timeout is answered (with a
///   denial carrying an internal-error status, or an unchanged admission with a warning,
///   according to the route's [`OnHandlerError`]) rather than a dropped connection; the
///   reply's `uid` is always the request's.
///
/// Every review is traced in an `admission_review` span (route, uid, kind, operation,
/// namespace, name, dry_run, verdict) and, with [`with_metrics`](Self::with_metrics), counted.
///
/// The routes' webhook registrations become `ValidatingWebhookConfiguration` and
/// `MutatingWebhookConfiguration` objects with [`configurations`](Self::configurations).
pub struct AdmissionServer {
    config: AdmissionServerConfig,
    routes: Vec<Route>,
    metrics: Option<AdmissionMetrics>,
}

impl fmt::Debug for AdmissionServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionServer")
            .field("config", &self.config)
            .field(
                "routes",
                &self
                    .routes
                    .iter()
                    .map(|r| (r.path.as_str(), r.kind, r.on_error))
                    .collect::<Vec<_>>(),
            )
            .field("metrics", &self.metrics.is_some())
            .finish()
    }
}

impl AdmissionServer {
    /// A server with no routes yet.
    pub fn new(config: AdmissionServerConfig) -> Self {
        Self {
            config,
            routes: Vec::new(),
            metrics: None,
        }
    }

    /// The settings this server was built with.
    pub fn config(&self) -> &AdmissionServerConfig {
        &self.config
    }

    /// Counts reviews and certificate reloads into `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: AdmissionMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Adds a route (see [`Route`]). Paths and registrations are checked when the router is
    /// built ([`router`](Self::router), [`serve`](Self::serve)) or the configurations are
    /// generated ([`configurations`](Self::configurations)).
    #[must_use]
    pub fn route(mut self, route: Route) -> Self {
        self.routes.push(route);
        self
    }

    /// The routes added so far, in order.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// The webhook configurations registering every route that carries a
    /// [`Webhook`](crate::Webhook) registration, both named `name`: validating routes in the
    /// `ValidatingWebhookConfiguration`, mutating ones in the `MutatingWebhookConfiguration`
    /// (`None` when the server has no registered route of that kind), in route order.
    ///
    /// Each webhook calls `service` at its route's path (`clientConfig.service` with
    /// namespace, name, path and port) and carries no `caBundle`: the chart or cert-manager's
    /// CA injector adds it. For tests that serve on loopback, retarget with
    /// [`WebhookConfigurations::with_url`]. Defaults are written out
    /// (`reinvocationPolicy: Never` on mutating webhooks), and `admissionReviewVersions` is
    /// `["v1"]`.
    ///
    /// Pure: the same routes give the same objects. Fails like [`router`](Self::router) on an
    /// invalid path, and with [`AdmissionError::InvalidWebhook`] on an invalid registration.
    pub fn configurations(
        &self,
        name: &str,
        service: &ServiceTarget,
    ) -> Result<WebhookConfigurations, AdmissionError> {
        self.check_routes()?;
        registration::check_configuration(name, service)?;
        Ok(registration::build(name, service, self.registered()))
    }

    fn registered(&self) -> impl Iterator<Item = Registered<'_>> {
        self.routes.iter().filter_map(|route| {
            route.webhook.as_ref().map(|webhook| Registered {
                path: &route.path,
                kind: route.kind,
                target: route.target.as_ref(),
                webhook,
            })
        })
    }

    /// The plain-HTTP axum router with all routes and the decoding layer, without TLS.
    ///
    /// Useful to drive the handlers in-process (`tower::ServiceExt::oneshot`). Fails when a
    /// path does not start with `/`, contains characters other than `A-Z a-z 0-9 - . _ ~ /`,
    /// or is registered twice, and when a webhook registration is invalid (see
    /// [`crate::registration`]).
    ///
    /// All routes of one router share its
    /// [`max_concurrent_handlers`](AdmissionServerConfig::max_concurrent_handlers) slots.
    pub fn router(&self) -> Result<Router, AdmissionError> {
        self.check_routes()?;
        let max_handlers = self.config.max_concurrent_handlers.max(1);
        let handler_slots = Arc::new(Semaphore::new(max_handlers));
        let body_budget_units = self
            .config
            .max_buffered_body_bytes
            .div_ceil(BODY_BUDGET_UNIT)
            .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
        let body_budget = Arc::new(Semaphore::new(body_budget_units));
        let mut router = Router::new();
        for spec in &self.routes {
            if let Some(metrics) = &self.metrics {
                metrics.init_route(&spec.path);
            }
            let state = Arc::new(RouteState {
                path: spec.path.clone(),
                kind: spec.kind,
                on_error: spec.on_error,
                handler: spec.handler.clone(),
                raw_objects: spec.target.is_some(),
                handler_slots: Arc::clone(&handler_slots),
                max_handlers,
                body_budget: Arc::clone(&body_budget),
                body_budget_units,
                max_body_bytes: self.config.max_body_bytes,
                body_timeout: self.config.body_timeout,
                handler_timeout: self.config.handler_timeout,
                inline_body_bytes: self.config.inline_body_bytes,
                metrics: self.metrics.clone(),
            });
            let method_router = post(move |request: Request| {
                let state = Arc::clone(&state);
                async move { state.answer(request).await }
            })
            .fallback(|| async {
                (
                    StatusCode::METHOD_NOT_ALLOWED,
                    "admission reviews must be sent with POST\n",
                )
            });
            router = router.route(&spec.path, method_router);
        }
        Ok(router.fallback(|uri: Uri| async move {
            (
                StatusCode::NOT_FOUND,
                format!("no admission webhook is served at {}\n", uri.path()),
            )
        }))
    }

    fn check_routes(&self) -> Result<(), AdmissionError> {
        let mut seen = HashSet::new();
        for spec in &self.routes {
            check_path(&spec.path)?;
            if !seen.insert(spec.path.as_str()) {
                return Err(AdmissionError::InvalidRoute {
                    path: spec.path.clone(),
                    reason: "registered more than once",
                });
            }
        }
        registration::check_all(self.registered(), self.config.handler_timeout)
    }

    /// Loads the certificate, starts the certificate reloader and serves until `shutdown` is
    /// cancelled; then stops accepting, lets in-flight requests finish for up to
    /// [`shutdown_grace`](AdmissionServerConfig::shutdown_grace) and returns.
    ///
    /// Fails before listening when the TLS files are unusable (the error names the file) or a
    /// route is invalid, and with [`AdmissionError::Serve`] when the address cannot be bound.
    pub async fn serve(
        self,
        listen: impl Into<Listen>,
        shutdown: CancellationToken,
    ) -> Result<(), AdmissionError> {
        // Refuse bad routes and unusable certificates before starting anything.
        self.check_routes()?;
        let files = self.config.tls.clone();
        let resolver = tokio::task::spawn_blocking(move || ReloadingCertResolver::load(&files))
            .await
            .map_err(AdmissionError::Task)??;
        let stop_reloader = shutdown.child_token();
        let reloader = spawn_reloader(
            Arc::clone(&resolver),
            self.config.reload_interval,
            stop_reloader.clone(),
            self.metrics.clone(),
        );
        let result = self.serve_with_resolver(listen, resolver, shutdown).await;
        stop_reloader.cancel();
        if let Err(err) = reloader.await {
            tracing::warn!(error = %err, "the certificate reloader task ended abnormally");
        }
        result
    }

    /// Like [`serve`](Self::serve), but with a resolver the caller built and keeps up to date
    /// (no reloader is started). [`AdmissionServerConfig::tls`] is not read.
    pub async fn serve_with_resolver(
        self,
        listen: impl Into<Listen>,
        resolver: Arc<ReloadingCertResolver>,
        shutdown: CancellationToken,
    ) -> Result<(), AdmissionError> {
        let router = self.router()?;
        let tls = tls_server_config(resolver)?;
        let (listener, addr) = conn::listen(listen.into())
            .await
            .map_err(AdmissionError::Serve)?;
        let settings = ConnSettings {
            header_timeout: self.config.body_timeout,
            idle_timeout: self.config.idle_timeout,
            shutdown_grace: self.config.shutdown_grace,
            max_connections: self.config.max_connections,
            metrics: self.metrics.clone(),
        };
        tracing::debug!(%addr, ?settings, "admission server listening");
        conn::serve_connections(listener, tls, router, settings, shutdown).await;
        Ok(())
    }
}

fn check_path(path: &str) -> Result<(), AdmissionError> {
    let refuse = |reason| AdmissionError::InvalidRoute {
        path: path.to_owned(),
        reason,
    };
    if !path.starts_with('/') {
        return Err(refuse("must start with '/'"));
    }
    if !path
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~' | '/'))
    {
        return Err(refuse(
            "may only contain ASCII letters, digits and - . _ ~ /",
        ));
    }
    Ok(())
}

struct RouteState {
    path: String,
    kind: RouteKind,
    on_error: OnHandlerError,
    handler: DynHandler,
    /// Whether the handler reads `object` and `oldObject` as sent (typed routes).
    raw_objects: bool,
    /// Slots for synchronous handlers, shared by all routes of the router.
    handler_slots: Arc<Semaphore>,
    max_handlers: usize,
    /// Request-body bytes that may be buffered at once, in [`BODY_BUDGET_UNIT`]s, shared by
    /// all routes of the router.
    body_budget: Arc<Semaphore>,
    body_budget_units: usize,
    max_body_bytes: usize,
    body_timeout: Duration,
    handler_timeout: Duration,
    /// Largest body a typed async route answers on the async worker (see
    /// [`AdmissionServerConfig::inline_body_bytes`]).
    inline_body_bytes: usize,
    metrics: Option<AdmissionMetrics>,
}

enum BodyError {
    TooLarge,
    Read(axum::Error),
}

/// What the blocking step of a review records once the review is decoded, for answering it
/// if the step panics or does not finish in time.
struct Started {
    /// The plain allowing response built from the request (its uid).
    base: AdmissionResponse,
    /// The review's span.
    span: tracing::Span,
}

/// What the blocking step of a review ends with.
enum OneThread {
    /// The review is answered: its verdict and the encoded answer.
    Answered(Verdict, Response),
    /// A typed async handler's future did not finish on its first poll: it goes on in a task.
    Pending {
        future: StagedFuture,
        started: Box<Started>,
    },
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

impl RouteState {
    async fn answer(self: &Arc<Self>, request: Request) -> Response {
        let started = Instant::now();
        let (verdict, response) = self.review(request).await;
        if let Some(metrics) = &self.metrics {
            metrics.observe_review(&self.path, verdict, started.elapsed().as_secs_f64());
        }
        response
    }

    fn refuse(&self, status: StatusCode, message: String) -> (Verdict, Response) {
        tracing::debug!(route = %self.path, status = status.as_u16(), %message, "admission request refused");
        (Verdict::Invalid, text_response(status, message))
    }

    async fn review(self: &Arc<Self>, request: Request) -> (Verdict, Response) {
        let (parts, body) = request.into_parts();
        if let Err(message) = check_content_type(&parts.headers) {
            return self.refuse(StatusCode::UNSUPPORTED_MEDIA_TYPE, message);
        }
        let declared = content_length(&parts.headers);
        if let Some(length) = declared
            && length > self.max_body_bytes as u64
        {
            return self.refuse(StatusCode::PAYLOAD_TOO_LARGE, self.too_large_message());
        }
        // Reserve the body's room in the shared budget before reading it, so many multiplexed
        // streams cannot hold more than the budget in memory.
        let reserve = declared
            .map_or(self.max_body_bytes, |l| {
                usize::try_from(l).unwrap_or(self.max_body_bytes)
            })
            .div_ceil(BODY_BUDGET_UNIT)
            .clamp(1, self.body_budget_units);
        let reserve = u32::try_from(reserve).unwrap_or(u32::MAX);
        let _body_room = match tokio::time::timeout(
            self.body_timeout,
            Arc::clone(&self.body_budget).acquire_many_owned(reserve),
        )
        .await
        {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) | Err(_) => {
                return self.refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "too many request bodies are being received at once (the server buffers at most {} bytes); retry\n",
                        self.body_budget_units * BODY_BUDGET_UNIT
                    ),
                );
            }
        };
        // A declared length (within the limit, checked above) is the buffer's size at once.
        let expected = declared.map_or(0, |l| usize::try_from(l).unwrap_or(0));
        let bytes = match tokio::time::timeout(
            self.body_timeout,
            read_limited(body, self.max_body_bytes, expected),
        )
        .await
        {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(BodyError::TooLarge)) => {
                return self.refuse(StatusCode::PAYLOAD_TOO_LARGE, self.too_large_message());
            }
            Ok(Err(BodyError::Read(err))) => {
                return self.refuse(
                    StatusCode::BAD_REQUEST,
                    format!("the request body could not be read: {err}\n"),
                );
            }
            Err(_elapsed) => {
                return self.refuse(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the request body was not received within {:?}\n",
                        self.body_timeout
                    ),
                );
            }
        };

        if let DynHandler::Async(handler) = &self.handler {
            return self.review_decoded(handler, &bytes).await;
        }
        if matches!(self.handler, DynHandler::Staged(_)) && bytes.len() <= self.inline_body_bytes {
            return self.review_inline(&bytes).await;
        }
        self.review_on_one_thread(bytes).await
    }

    /// Decodes `bytes` as a review: the review, or the answer to a body that is none.
    fn decode(&self, bytes: &[u8]) -> Result<Review, Box<(Verdict, Response)>> {
        match decode_review_parts(bytes, self.raw_objects) {
            Ok(review) => Ok(review),
            Err(DecodeRejection::NotAReview(message)) => Err(Box::new(
                self.refuse(StatusCode::BAD_REQUEST, format!("{message}\n")),
            )),
            Err(DecodeRejection::Invalid { uid, reason }) => {
                tracing::info!(route = %self.path, %uid, %reason, "invalid AdmissionReview refused");
                Err(Box::new((
                    Verdict::Invalid,
                    review_response(invalid_response(&uid, reason)),
                )))
            }
        }
    }

    /// The span of one review (its `verdict` is recorded by [`Self::concluded`]).
    fn review_span(&self, request: &AdmissionRequest<DynamicObject>) -> tracing::Span {
        tracing::info_span!(
            "admission_review",
            route = %self.path,
            uid = %request.uid,
            kind = %format_kind(request),
            operation = ?request.operation,
            namespace = request.namespace.as_deref().unwrap_or(""),
            name = %request.name,
            dry_run = request.dry_run,
            verdict = tracing::field::Empty,
        )
    }

    /// Records the verdict in the review's span, logs the answer and encodes it.
    fn concluded(
        &self,
        span: &tracing::Span,
        verdict: Verdict,
        response: AdmissionResponse,
    ) -> (Verdict, Response) {
        span.record("verdict", verdict.as_str());
        match verdict {
            Verdict::Error => span.in_scope(|| {
                tracing::warn!(
                    allowed = response.allowed,
                    message = %response.result.message,
                    warnings = ?response.warnings,
                    "admission handler failed"
                );
            }),
            _ => span.in_scope(|| {
                tracing::debug!(allowed = response.allowed, "admission review answered");
            }),
        }
        (verdict, review_response(response))
    }

    /// The answer to a review given the handler's `outcome`: `base` is the plain allowing
    /// response built from the request, `uid` the request's.
    fn settle(
        &self,
        base: AdmissionResponse,
        uid: String,
        outcome: Result<AdmissionResponse, String>,
    ) -> (Verdict, AdmissionResponse) {
        match outcome {
            Ok(response) if self.kind == RouteKind::Validate && response.patch.is_some() => (
                Verdict::Error,
                self.handler_error(base, "a validating handler returned a patch"),
            ),
            Ok(mut response) => {
                response.uid = uid;
                let verdict = if response.allowed {
                    Verdict::Allowed
                } else {
                    Verdict::Denied
                };
                (verdict, response)
            }
            Err(message) => (Verdict::Error, self.handler_error(base, &message)),
        }
    }

    /// An async (dynamic) route: the review is decoded here and its handler runs in a task.
    async fn review_decoded(&self, handler: &AsyncFn, bytes: &[u8]) -> (Verdict, Response) {
        let review = match self.decode(bytes) {
            Ok(review) => review,
            Err(answer) => return *answer,
        };
        let span = self.review_span(&review.request);
        let base = AdmissionResponse::from(&review.request);
        let uid = review.request.uid.clone();
        let outcome = self
            .run_async(handler, review)
            .instrument(span.clone())
            .await;
        let (verdict, response) = self.settle(base, uid, outcome);
        self.concluded(&span, verdict, response)
    }

    /// A synchronous or typed async route: once a handler slot is free, the whole review runs
    /// as one step on the blocking pool (decoding the body, the typed decode, the handler or the
    /// first poll of its future, the patch, encoding the answer), so nothing decoded crosses
    /// threads. Only a typed async handler whose future does not finish on its first poll
    /// goes on in a task (without a slot), and its patch in a second blocking step.
    ///
    /// A review that finds no slot before the timeout is decoded here, only to answer with its
    /// uid; its handler is not called.
    async fn review_on_one_thread(self: &Arc<Self>, bytes: Vec<u8>) -> (Verdict, Response) {
        let deadline = tokio::time::Instant::now() + self.handler_timeout;
        let slot = match self.acquire_slot(deadline).await {
            Ok(slot) => slot,
            Err(message) => {
                let review = match self.decode(&bytes) {
                    Ok(review) => review,
                    Err(answer) => return *answer,
                };
                let span = self.review_span(&review.request);
                let base = AdmissionResponse::from(&review.request);
                let uid = review.request.uid.clone();
                let (verdict, response) = self.settle(base, uid, Err(message));
                return self.concluded(&span, verdict, response);
            }
        };
        let bytes = Arc::new(bytes);
        let started: Arc<Mutex<Option<Started>>> = Arc::default();
        let job = {
            let state = Arc::clone(self);
            let bytes = Arc::clone(&bytes);
            let started = Arc::clone(&started);
            move || Ok(state.one_thread(&bytes, &started))
        };
        let step = self.run_in_slot(slot, deadline, job).await;
        self.after_step(step, &bytes, &started, deadline, false)
            .await
    }

    /// A typed async route's review of a body of at most
    /// [`inline_body_bytes`](AdmissionServerConfig::inline_body_bytes): the step of
    /// [`Self::review_on_one_thread`] run here, on the async worker, without a handler slot (a
    /// panic is caught and answered as on the blocking pool); a future that waits goes on in a
    /// task, and its patch is computed here too.
    async fn review_inline(self: &Arc<Self>, bytes: &[u8]) -> (Verdict, Response) {
        let deadline = tokio::time::Instant::now() + self.handler_timeout;
        let started: Mutex<Option<Started>> = Mutex::default();
        let step = catch_panic(|| self.one_thread(bytes, &started));
        self.after_step(step, bytes, &started, deadline, true).await
    }

    /// The answer to a review once its step (`step`) ended: answered in the step, or the rest
    /// of a typed async handler's future, or (the step panicked or did not finish in time) the
    /// failure answered as the review recorded once decoded (decoded again here in the rare
    /// case it was not yet).
    async fn after_step(
        &self,
        step: Result<OneThread, String>,
        bytes: &[u8],
        started: &Mutex<Option<Started>>,
        deadline: tokio::time::Instant,
        inline: bool,
    ) -> (Verdict, Response) {
        match step {
            Ok(OneThread::Answered(verdict, response)) => (verdict, response),
            Ok(OneThread::Pending { future, started }) => {
                let Started { base, span } = *started;
                let uid = base.uid.clone();
                let outcome = self
                    .finish_staged(future, deadline, inline)
                    .instrument(span.clone())
                    .await;
                let (verdict, response) = self.settle(base, uid, outcome);
                self.concluded(&span, verdict, response)
            }
            Err(message) => {
                let recorded = lock(started).take();
                let Started { base, span } = match recorded {
                    Some(started) => started,
                    None => match self.decode(bytes) {
                        Ok(review) => Started {
                            base: AdmissionResponse::from(&review.request),
                            span: self.review_span(&review.request),
                        },
                        Err(answer) => return *answer,
                    },
                };
                let uid = base.uid.clone();
                let (verdict, response) = self.settle(base, uid, Err(message));
                self.concluded(&span, verdict, response)
            }
        }
    }

    /// The blocking step of [`Self::review_on_one_thread`].
    fn one_thread(&self, bytes: &[u8], started: &Mutex<Option<Started>>) -> OneThread {
        let review = match self.decode(bytes) {
            Ok(review) => review,
            Err(answer) => {
                let (verdict, response) = *answer;
                return OneThread::Answered(verdict, response);
            }
        };
        let span = self.review_span(&review.request);
        let base = AdmissionResponse::from(&review.request);
        let uid = review.request.uid.clone();
        *lock(started) = Some(Started {
            base: base.clone(),
            span: span.clone(),
        });
        let outcome = span.in_scope(|| match &self.handler {
            DynHandler::Sync(handler) => Ok(handler(review)),
            DynHandler::Staged(handler) => match handler(review) {
                Err(message) => Ok(Err(message)),
                Ok(mut future) => {
                    let mut context = Context::from_waker(Waker::noop());
                    match future.as_mut().poll(&mut context) {
                        Poll::Ready(Ok(AfterHandler::Done(response))) => Ok(Ok(*response)),
                        Poll::Ready(Ok(AfterHandler::Blocking(step))) => Ok(step()),
                        Poll::Ready(Err(message)) => Ok(Err(message)),
                        Poll::Pending => Err(future),
                    }
                }
            },
            DynHandler::Async(_) => {
                Ok(Err("an async handler was run as a blocking step".to_owned()))
            }
        });
        match outcome {
            Ok(outcome) => {
                let (verdict, response) = self.settle(base, uid, outcome);
                let (verdict, response) = self.concluded(&span, verdict, response);
                OneThread::Answered(verdict, response)
            }
            Err(future) => OneThread::Pending {
                future,
                started: Box::new(Started { base, span }),
            },
        }
    }

    /// Runs an async handler in its own task (a panic stays there), aborted at the timeout.
    async fn run_async(
        &self,
        handler: &AsyncFn,
        review: Review,
    ) -> Result<AdmissionResponse, String> {
        let mut task = tokio::spawn(handler(review).in_current_span());
        match tokio::time::timeout(self.handler_timeout, &mut task).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(join_error)) => Err(join_message(&join_error)),
            Err(_elapsed) => {
                task.abort();
                Err(self.timeout_message())
            }
        }
    }

    /// The rest of a typed async handler whose future did not finish on its first poll: the
    /// future in its own task (a panic stays there; aborted at the deadline), and what it leaves
    /// (the patch) on the blocking pool again, before the same deadline, or here for a review
    /// answered `inline` (a body of at most
    /// [`inline_body_bytes`](AdmissionServerConfig::inline_body_bytes)). Otherwise the async
    /// workers only poll the handler's future, so a large or hostile object cannot stall them.
    async fn finish_staged(
        &self,
        future: StagedFuture,
        deadline: tokio::time::Instant,
        inline: bool,
    ) -> Result<AdmissionResponse, String> {
        let mut task = tokio::spawn(future.in_current_span());
        let after = match tokio::time::timeout_at(deadline, &mut task).await {
            Ok(Ok(outcome)) => outcome?,
            Ok(Err(join_error)) => return Err(join_message(&join_error)),
            Err(_elapsed) => {
                task.abort();
                return Err(self.timeout_message());
            }
        };
        match after {
            AfterHandler::Done(response) => Ok(*response),
            AfterHandler::Blocking(step) if inline => catch_panic(step)?,
            AfterHandler::Blocking(step) => self.on_blocking_pool(deadline, step).await,
        }
    }

    /// Runs `job` on the blocking pool once a handler slot is free, answering by `deadline`.
    /// The slot is held by the job itself, so one that outlives the deadline keeps it until it
    /// returns; the review is answered at the deadline regardless.
    async fn on_blocking_pool<T: Send + 'static>(
        &self,
        deadline: tokio::time::Instant,
        job: impl FnOnce() -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        let slot = self.acquire_slot(deadline).await?;
        self.run_in_slot(slot, deadline, job).await
    }

    /// A handler slot, waited for until `deadline` (the timeout's message otherwise).
    async fn acquire_slot(
        &self,
        deadline: tokio::time::Instant,
    ) -> Result<OwnedSemaphorePermit, String> {
        match tokio::time::timeout_at(deadline, Arc::clone(&self.handler_slots).acquire_owned())
            .await
        {
            Ok(Ok(slot)) => Ok(slot),
            Ok(Err(_closed)) => Err("the admission handler could not be started".to_owned()),
            Err(_elapsed) => {
                if let Some(metrics) = &self.metrics {
                    metrics
                        .handler_slot_timeouts()
                        .with_label_values(&[self.path.as_str()])
                        .inc();
                }
                tracing::warn!(
                    max_concurrent_handlers = self.max_handlers,
                    "no admission handler slot became free before the timeout"
                );
                Err(format!(
                    "{} (all {} handler slots stayed busy)",
                    self.timeout_message(),
                    self.max_handlers
                ))
            }
        }
    }

    /// Runs `job` on the blocking pool holding `slot`, answering by `deadline`.
    async fn run_in_slot<T: Send + 'static>(
        &self,
        slot: OwnedSemaphorePermit,
        deadline: tokio::time::Instant,
        job: impl FnOnce() -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        let running = self.metrics.as_ref().map(RunningHandler::new);
        let span = tracing::Span::current();
        let task = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            let _running = running;
            span.in_scope(job)
        });
        let mut waiting = AbandonGuard {
            metrics: self.metrics.as_ref(),
            route: &self.path,
            armed: true,
        };
        let outcome = tokio::time::timeout_at(deadline, task).await;
        match outcome {
            Ok(Ok(outcome)) => {
                waiting.armed = false;
                outcome
            }
            Ok(Err(join_error)) => {
                waiting.armed = false;
                Err(join_message(&join_error))
            }
            // Dropping the JoinHandle detaches the thread; `waiting` counts it as abandoned.
            Err(_elapsed) => Err(self.timeout_message()),
        }
    }

    fn timeout_message(&self) -> String {
        format!(
            "the admission handler did not answer within {:?}",
            self.handler_timeout
        )
    }

    /// The answer to a failed handler, per the route's [`OnHandlerError`]. `base` is the
    /// plain allowing response built from the request (uid copied, no patch).
    fn handler_error(&self, base: AdmissionResponse, message: &str) -> AdmissionResponse {
        match self.on_error {
            OnHandlerError::Deny => {
                let mut response = base.deny(format!(
                    "internal error in the admission webhook: {message}"
                ));
                response.result.code = 500;
                response.result.reason = "InternalError".to_owned();
                response
            }
            OnHandlerError::Allow => {
                let mut response = base;
                response.warnings = Some(vec![format!(
                    "admission webhook {} failed and let the request through unchanged: \
                     {message}",
                    self.path
                )]);
                response
            }
        }
    }

    fn too_large_message(&self) -> String {
        format!(
            "the request body is larger than the limit of {} bytes\n",
            self.max_body_bytes
        )
    }
}

/// Runs `job` here, a panic caught and turned into the message a panic on the blocking pool
/// gets.
fn catch_panic<T>(job: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(job))
        .map_err(|_panic| "the admission handler panicked".to_owned())
}

fn join_message(join_error: &tokio::task::JoinError) -> String {
    if join_error.is_panic() {
        "the admission handler panicked".to_owned()
    } else {
        "the admission handler was cancelled".to_owned()
    }
}

/// Counts a synchronous handler in `..._handlers_running` while it executes.
struct RunningHandler(IntGauge);

impl RunningHandler {
    fn new(metrics: &AdmissionMetrics) -> Self {
        let gauge = metrics.handlers_running().clone();
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for RunningHandler {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Counts a review that stops waiting for its synchronous handler (timeout, or the client went
/// away and the request was dropped) while the handler is still running.
struct AbandonGuard<'a> {
    metrics: Option<&'a AdmissionMetrics>,
    route: &'a str,
    armed: bool,
}

impl Drop for AbandonGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        tracing::warn!(
            route = %self.route,
            "abandoned a synchronous admission handler that is still running; it keeps its \
             thread and handler slot until it returns"
        );
        if let Some(metrics) = self.metrics {
            metrics
                .handlers_abandoned()
                .with_label_values(&[self.route])
                .inc();
        }
    }
}

fn format_kind(request: &AdmissionRequest<DynamicObject>) -> String {
    let kind = &request.kind;
    if kind.group.is_empty() {
        format!("{}/{}", kind.version, kind.kind)
    } else {
        format!("{}/{}/{}", kind.group, kind.version, kind.kind)
    }
}

fn check_content_type(headers: &HeaderMap) -> Result<(), String> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Err("the request has no Content-Type; send application/json\n".to_owned());
    };
    let essence = value
        .to_str()
        .ok()
        .and_then(|v| v.split(';').next())
        .map(str::trim)
        .unwrap_or_default();
    if essence.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(format!(
            "the request Content-Type is {value:?}; send application/json\n"
        ))
    }
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// How much of a declared `Content-Length` is reserved before any of the body arrives: enough
/// for any realistic pod at once, while a client that declares a large body and sends nothing
/// holds no more than this (the buffer grows as bytes arrive).
const BODY_RESERVE_MAX: usize = 64 * 1024;

async fn read_limited(mut body: Body, limit: usize, expected: usize) -> Result<Vec<u8>, BodyError> {
    let mut buffer = Vec::with_capacity(expected.min(limit).min(BODY_RESERVE_MAX));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(BodyError::Read)?;
        if let Ok(data) = frame.into_data() {
            if buffer.len().saturating_add(data.len()) > limit {
                return Err(BodyError::TooLarge);
            }
            buffer.extend_from_slice(&data);
        }
    }
    Ok(buffer)
}

fn text_response(status: StatusCode, message: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message,
    )
        .into_response()
}

fn review_response(response: AdmissionResponse) -> Response {
    match encode_review(response) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(err) => text_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the admission response could not be encoded: {err}\n"),
        ),
    }
}
