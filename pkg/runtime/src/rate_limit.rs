//! Client-side rate limits: a token bucket in front of every request the runtime's client sends
//! (`--kube-api-qps`, `--kube-api-burst`, client-go's flags and semantics), so what a component
//! asks of the API server stays bounded however many cache misses, reconciles or Events arrive
//! at once.
//!
//! The bucket holds `burst` tokens and gains `qps` a second; a request takes one, or waits for
//! the next. Waiting requests are served in arrival order (they queue on a fair lock), and a
//! request given up while it waits (its future dropped) takes no token. A watch takes one token
//! when it is opened: its stream of events is not limited. `qps` 0 turns the limit off.
//!
//! The time each request waited is `api_request_wait_seconds` (with the component's prefix, no
//! labels: every request of the client shares the bucket); a wait over [`SLOW_WAIT`] is logged at
//! debug level with the request's verb and resource.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::Request;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt as _};
use warmcache_telemetry::prometheus::{Histogram, HistogramOpts, Registry};

use crate::api_requests::classify;
use crate::error::RuntimeError;

/// Waits at least this long are logged (debug level).
pub const SLOW_WAIT: Duration = Duration::from_millis(100);

/// The longest interval between two tokens: a `qps` below one a day counts as one a day.
const MAX_INTERVAL: Duration = Duration::from_secs(86_400);

/// Histogram buckets of the wait, in seconds (1 ms to 1 min).
const WAIT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// A token bucket of `burst` tokens refilled at `qps` a second, or no limit at all.
///
/// Kept as a theoretical arrival time (GCRA): the bucket is full when `next` is at or before
/// now, and each token taken moves `next` one interval on; a request may go while `next` is at
/// most `burst - 1` intervals ahead.
#[derive(Debug)]
pub struct TokenBucket {
    /// `None`: no limit.
    limit: Option<Limit>,
}

#[derive(Debug)]
struct Limit {
    /// Time between two tokens (1 / qps).
    interval: Duration,
    /// How far ahead of now `next` may be for a request to go at once: `burst - 1` intervals.
    tolerance: Duration,
    /// The theoretical arrival time of the next request. Locked for the whole wait: the lock
    /// is fair (first come, first served), so waiters go in arrival order, and one that gives
    /// up changes nothing.
    next: Mutex<Instant>,
}

impl TokenBucket {
    /// A bucket of `burst` tokens refilled at `qps` a second, full at first. `qps` 0 (or a
    /// value that is not a positive finite number) means no limit; `burst` 0 with a positive
    /// `qps` counts as 1 (the flags refuse it).
    pub fn new(qps: f32, burst: u32) -> Self {
        let qps = f64::from(qps);
        if !(qps.is_finite() && qps > 0.0) {
            return Self { limit: None };
        }
        let interval = Duration::try_from_secs_f64(1.0 / qps)
            .unwrap_or(MAX_INTERVAL)
            .min(MAX_INTERVAL);
        let tolerance = interval
            .checked_mul(burst.saturating_sub(1))
            .unwrap_or(Duration::MAX);
        Self {
            limit: Some(Limit {
                interval,
                tolerance,
                next: Mutex::new(Instant::now()),
            }),
        }
    }

    /// Whether the bucket lets everything through (`qps` 0).
    pub fn is_unlimited(&self) -> bool {
        self.limit.is_none()
    }

    /// Takes a token, waiting for one if the bucket is empty (behind every request that came
    /// first); how long it waited.
    pub async fn acquire(&self) -> Duration {
        let Some(limit) = &self.limit else {
            return Duration::ZERO;
        };
        let started = Instant::now();
        let mut next = limit.next.lock().await;
        let now = Instant::now();
        let theoretical = (*next).max(now);
        // Goes at `theoretical - tolerance`; a tolerance reaching before the clock's start
        // means at once.
        if let Some(at) = theoretical.checked_sub(limit.tolerance)
            && at > now
        {
            tokio::time::sleep_until(at).await;
        }
        // While the lock is held nobody else moved `next`, and the clock is now at most
        // `theoretical`: the token taken is the one after it.
        *next = theoretical
            .checked_add(limit.interval)
            .unwrap_or(theoretical);
        started.elapsed()
    }
}

/// The wait histogram.
#[derive(Clone, Debug)]
pub struct RateLimitMetrics {
    /// `api_request_wait_seconds`: how long each request waited for a token (0 when the bucket
    /// had one).
    pub wait: Histogram,
}

impl RateLimitMetrics {
    /// Creates the histogram and registers it in `registry`.
    ///
    /// # Errors
    ///
    /// It is registered there already.
    pub fn register(registry: &Registry) -> Result<Self, RuntimeError> {
        let name = "api_request_wait_seconds";
        let wait = Histogram::with_opts(
            HistogramOpts::new(
                name,
                "Time requests to the Kubernetes API server waited for the client-side rate limit (--kube-api-qps, --kube-api-burst).",
            )
            .buckets(WAIT_BUCKETS.to_vec()),
        )
        .map_err(|source| RuntimeError::metric(name, source))?;
        registry
            .register(Box::new(wait.clone()))
            .map_err(|source| RuntimeError::metric(name, source))?;
        Ok(Self { wait })
    }
}

/// The layer that makes every request of the client it wraps take a token of `bucket` first.
#[derive(Clone, Debug)]
pub struct RateLimit {
    bucket: Arc<TokenBucket>,
    metrics: RateLimitMetrics,
}

impl RateLimit {
    /// Requests take their tokens from `bucket`; waits go to `metrics`.
    pub fn new(bucket: Arc<TokenBucket>, metrics: RateLimitMetrics) -> Self {
        Self { bucket, metrics }
    }
}

impl<S> Layer<S> for RateLimit {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner: Arc::new(Mutex::new(inner)),
            bucket: Arc::clone(&self.bucket),
            metrics: self.metrics.clone(),
        }
    }
}

/// A client service whose requests wait for a token.
///
/// Always ready: the wait is part of each request's own future (so it runs in the caller's
/// task and span, and a caller that gives up leaves the queue), and the inner service is
/// called once the token is there.
#[derive(Debug)]
pub struct RateLimited<S> {
    inner: Arc<Mutex<S>>,
    bucket: Arc<TokenBucket>,
    metrics: RateLimitMetrics,
}

impl<S> Clone for RateLimited<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            bucket: Arc::clone(&self.bucket),
            metrics: self.metrics.clone(),
        }
    }
}

impl<S, B> Service<Request<B>> for RateLimited<S>
where
    S: Service<Request<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let inner = Arc::clone(&self.inner);
        let bucket = Arc::clone(&self.bucket);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let waited = bucket.acquire().await;
            metrics.wait.observe(waited.as_secs_f64());
            if waited >= SLOW_WAIT {
                let uri = request.uri();
                let (verb, resource) = classify(request.method(), uri.path(), uri.query());
                tracing::debug!(
                    verb,
                    resource,
                    waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
                    "waited for the client-side rate limit (--kube-api-qps)"
                );
            }
            // Only readiness and the call itself under the lock; the response is awaited
            // outside it.
            let response = {
                let mut inner = inner.lock().await;
                inner.ready().await?.call(request)
            };
            response.await
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Mutex as StdMutex;

    use super::*;
    use crate::api_requests::{ApiRequestMetrics, CountRequests};

    #[tokio::test(start_paused = true)]
    async fn a_burst_passes_at_once_and_the_next_request_waits_one_interval() {
        let bucket = TokenBucket::new(10.0, 5);
        let start = Instant::now();
        for _ in 0..5 {
            assert_eq!(bucket.acquire().await, Duration::ZERO);
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        let waited = bucket.acquire().await;
        assert_eq!(waited, Duration::from_millis(100));
        assert_eq!(start.elapsed(), Duration::from_millis(100));
        // Then one every 1/qps.
        assert_eq!(bucket.acquire().await, Duration::from_millis(100));
        assert_eq!(start.elapsed(), Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_bucket_refills_up_to_its_burst_only() {
        let bucket = TokenBucket::new(10.0, 3);
        for _ in 0..3 {
            bucket.acquire().await;
        }
        // 250 ms: two tokens back (and a half).
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(bucket.acquire().await, Duration::ZERO);
        assert_eq!(bucket.acquire().await, Duration::ZERO);
        assert_eq!(bucket.acquire().await, Duration::from_millis(50));
        // A minute idle: three tokens, not 600.
        tokio::time::sleep(Duration::from_secs(60)).await;
        for _ in 0..3 {
            assert_eq!(bucket.acquire().await, Duration::ZERO);
        }
        assert_eq!(bucket.acquire().await, Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_requests_go_in_arrival_order() {
        let bucket = Arc::new(TokenBucket::new(4.0, 1));
        bucket.acquire().await;
        let start = Instant::now();
        let order = Arc::new(StdMutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..6 {
            let bucket = Arc::clone(&bucket);
            let order = Arc::clone(&order);
            tasks.push(tokio::spawn(async move {
                bucket.acquire().await;
                order.lock().unwrap().push((i, start.elapsed()));
            }));
            // Let it queue before the next one arrives.
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
        }
        for task in tasks {
            task.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        let expected: Vec<(i32, Duration)> = (0..6)
            .map(|i| (i, Duration::from_millis(250) * (i as u32 + 1)))
            .collect();
        assert_eq!(order, expected);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_given_up_while_waiting_takes_no_token() {
        let bucket = Arc::new(TokenBucket::new(1.0, 1));
        bucket.acquire().await;
        let start = Instant::now();
        // Gives up after 500 ms of its 1 s wait.
        let gave_up = tokio::time::timeout(Duration::from_millis(500), bucket.acquire()).await;
        assert!(gave_up.is_err());
        // The next one goes when the token comes, 1 s after the first.
        bucket.acquire().await;
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn qps_zero_is_no_limit() {
        for bucket in [TokenBucket::new(0.0, 0), TokenBucket::new(0.0, 40)] {
            assert!(bucket.is_unlimited());
            let start = Instant::now();
            for _ in 0..10_000 {
                assert_eq!(bucket.acquire().await, Duration::ZERO);
            }
            assert_eq!(start.elapsed(), Duration::ZERO);
        }
        assert!(!TokenBucket::new(20.0, 40).is_unlimited());
    }

    #[tokio::test(start_paused = true)]
    async fn extreme_settings_do_not_overflow() {
        // A token a day at most; a burst this large is as good as none.
        let slow = TokenBucket::new(f32::MIN_POSITIVE, 1);
        slow.acquire().await;
        let start = Instant::now();
        assert!(
            tokio::time::timeout(Duration::from_secs(3600), slow.acquire())
                .await
                .is_err()
        );
        let wide = TokenBucket::new(f32::MIN_POSITIVE, u32::MAX);
        for _ in 0..100 {
            assert_eq!(wide.acquire().await, Duration::ZERO);
        }
        let fast = TokenBucket::new(f32::MAX, 1);
        for _ in 0..100 {
            assert_eq!(fast.acquire().await, Duration::ZERO);
        }
        assert_eq!(start.elapsed(), Duration::from_secs(3600));
    }

    #[tokio::test(start_paused = true)]
    async fn the_layer_holds_requests_until_their_token_and_counts_what_is_sent() {
        let registry = Registry::new();
        let waits = RateLimitMetrics::register(&registry).unwrap();
        let counted = ApiRequestMetrics::register(&registry).unwrap();
        let start = Instant::now();
        // A fake API server: when each request reached it.
        let seen = Arc::new(StdMutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        let server = tower::service_fn(move |request: Request<()>| {
            record
                .lock()
                .unwrap()
                .push((request.uri().path().to_owned(), start.elapsed()));
            async { Ok::<_, std::convert::Infallible>(()) }
        });
        // As in the runtime: counting inside, the limit outside.
        let service = RateLimit::new(Arc::new(TokenBucket::new(2.0, 2)), waits.clone())
            .layer(CountRequests(counted.clone()).layer(server));
        let mut calls = Vec::new();
        for i in 0..4 {
            let request = Request::get(format!("/api/v1/namespaces/a/pods/p{i}"))
                .body(())
                .unwrap();
            calls.push(tokio::spawn(service.clone().oneshot(request)));
            tokio::task::yield_now().await;
        }
        // One more, given up while it waits: never sent, never counted.
        let request = Request::get("/api/v1/namespaces/a/pods/gone")
            .body(())
            .unwrap();
        let gone =
            tokio::time::timeout(Duration::from_millis(100), service.clone().oneshot(request))
                .await;
        assert!(gone.is_err());
        for call in calls {
            call.await.unwrap().unwrap();
        }
        let seen = seen.lock().unwrap().clone();
        let expected: Vec<(String, Duration)> = [0, 0, 500, 1000]
            .into_iter()
            .enumerate()
            .map(|(i, ms)| {
                (
                    format!("/api/v1/namespaces/a/pods/p{i}"),
                    Duration::from_millis(ms),
                )
            })
            .collect();
        assert_eq!(seen, expected);
        assert_eq!(waits.wait.get_sample_count(), 4);
        assert!((waits.wait.get_sample_sum() - 1.5).abs() < 1e-6);
        assert_eq!(
            counted.requests.with_label_values(&["get", "pods"]).get(),
            4
        );
        assert!(RateLimitMetrics::register(&registry).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn an_inner_error_is_the_request_s_error() {
        let registry = Registry::new();
        let waits = RateLimitMetrics::register(&registry).unwrap();
        let service = RateLimit::new(Arc::new(TokenBucket::new(1.0, 1)), waits).layer(
            tower::service_fn(|_: Request<()>| async { Err::<(), _>("refused") }),
        );
        let request = Request::get("/api").body(()).unwrap();
        assert_eq!(service.oneshot(request).await, Err("refused"));
    }
}
