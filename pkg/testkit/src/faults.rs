//! Client-side fault injection: a tower layer in front of a `kube::Client`'s HTTP stack that
//! answers chosen requests itself with a conflict, a server error or a timeout.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use kube::client::{Body, DynBody};
use tower::{BoxError, Layer, Service};

/// The answer a matching request gets instead of reaching the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// HTTP 409 with a `Status` body, reason `Conflict` (what a stale resourceVersion gets).
    Conflict,
    /// HTTP 500 with a `Status` body, reason `InternalError`.
    ServerError,
    /// No answer: after the injector's timeout delay (1 s by default, see
    /// [`FaultInjector::with_timeout_delay`]) the request fails with an I/O `TimedOut` error,
    /// which kube surfaces as `kube::Error::Service`, like a read timeout.
    Timeout,
}

#[derive(Debug)]
struct Rule {
    method: Method,
    path_contains: String,
    fault: Fault,
    remaining: usize,
}

#[derive(Debug)]
struct State {
    rules: Vec<Rule>,
    injected: usize,
    timeout_delay: Duration,
}

/// Injects [`Fault`]s into requests made by a client built with
/// [`ControlPlane::client_with_faults`](crate::ControlPlane::client_with_faults).
///
/// Cheap to clone; clones share their rules and counter, so a test keeps one clone to add rules
/// and read [`injected`](Self::injected) while the client uses the other. Requests that match no
/// rule pass through unchanged.
#[derive(Clone, Debug)]
pub struct FaultInjector {
    state: Arc<Mutex<State>>,
}

impl Default for FaultInjector {
    fn default() -> Self {
        Self::new()
    }
}

impl FaultInjector {
    /// An injector with no rules (every request passes through).
    pub fn new() -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                rules: Vec::new(),
                injected: 0,
                timeout_delay: Duration::from_secs(1),
            })),
        }
    }

    /// Sets how long a [`Fault::Timeout`] request hangs before it fails.
    pub fn with_timeout_delay(self, delay: Duration) -> Self {
        if let Ok(mut state) = self.state.lock() {
            state.timeout_delay = delay;
        }
        self
    }

    /// Injects `fault` into the next `times` requests whose method equals `method` and whose
    /// path and query (for example `/api/v1/namespaces/t-x/configmaps/a?fieldManager=m`) contain
    /// `path_contains`. Rules are tried in the order they were added; the first matching rule with
    /// budget left answers.
    pub fn inject(&self, method: Method, path_contains: &str, fault: Fault, times: usize) {
        if let Ok(mut state) = self.state.lock() {
            state.rules.push(Rule {
                method,
                path_contains: path_contains.to_owned(),
                fault,
                remaining: times,
            });
        }
    }

    /// How many faults were served so far.
    pub fn injected(&self) -> usize {
        self.state.lock().map(|s| s.injected).unwrap_or(0)
    }

    /// How many faults are still armed (sum of the remaining budgets of all rules).
    pub fn pending(&self) -> usize {
        self.state
            .lock()
            .map(|s| s.rules.iter().map(|r| r.remaining).sum())
            .unwrap_or(0)
    }

    /// Removes every rule (the served counter is kept).
    pub fn clear(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.rules.clear();
        }
    }

    /// The tower layer to put in front of a client's service stack.
    pub fn layer(&self) -> FaultLayer {
        FaultLayer {
            injector: self.clone(),
        }
    }

    /// Consumes one unit of the first matching rule, returning its fault and the timeout delay.
    fn take(&self, method: &Method, path: &str) -> Option<(Fault, Duration)> {
        let mut state = self.state.lock().ok()?;
        let delay = state.timeout_delay;
        let rule = state
            .rules
            .iter_mut()
            .find(|r| r.remaining > 0 && r.method == method && path.contains(&r.path_contains))?;
        rule.remaining -= 1;
        let fault = rule.fault;
        state.injected += 1;
        Some((fault, delay))
    }
}

/// [`tower::Layer`] produced by [`FaultInjector::layer`].
#[derive(Clone, Debug)]
pub struct FaultLayer {
    injector: FaultInjector,
}

impl<S> Layer<S> for FaultLayer {
    type Service = FaultService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FaultService {
            inner,
            injector: self.injector.clone(),
        }
    }
}

/// [`tower::Service`] produced by [`FaultLayer`].
#[derive(Clone, Debug)]
pub struct FaultService<S> {
    inner: S,
    injector: FaultInjector,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S> Service<Request<Body>> for FaultService<S>
where
    S: Service<Request<Body>, Response = Response<Box<DynBody>>> + Send,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = Response<Box<DynBody>>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let path = path_and_query(&request);
        match self.injector.take(request.method(), &path) {
            None => {
                let future = self.inner.call(request);
                Box::pin(async move { future.await.map_err(Into::into) })
            }
            Some((Fault::Conflict, _)) => Box::pin(std::future::ready(status_response(
                StatusCode::CONFLICT,
                "Conflict",
                "warmcache-testkit injected a conflict: the stored object is newer than the request",
            ))),
            Some((Fault::ServerError, _)) => Box::pin(std::future::ready(status_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "warmcache-testkit injected an internal server error",
            ))),
            Some((Fault::Timeout, delay)) => Box::pin(async move {
                tokio::time::sleep(delay).await;
                Err(BoxError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("request timed out after {delay:?} (injected by warmcache-testkit)"),
                )))
            }),
        }
    }
}

/// The request's path and query, as the rules match them (`/api/v1/namespaces/n/pods?x=y`).
pub(crate) fn path_and_query(request: &Request<Body>) -> String {
    request
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default()
}

fn status_response(
    code: StatusCode,
    reason: &str,
    message: &str,
) -> Result<Response<Box<DynBody>>, BoxError> {
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    let bytes = Bytes::from(serde_json::to_vec(&body)?);
    let body: Box<DynBody> = Box::new(Full::new(bytes).map_err(|never| match never {}));
    Ok(Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_in_order_and_run_out() {
        let faults = FaultInjector::new();
        faults.inject(Method::PUT, "/configmaps/a", Fault::Conflict, 1);
        faults.inject(Method::PUT, "/configmaps/", Fault::ServerError, 2);
        assert_eq!(faults.pending(), 3);
        let take = |m: Method, p: &str| faults.take(&m, p).map(|(f, _)| f);
        assert_eq!(take(Method::GET, "/api/v1/namespaces/n/configmaps/a"), None);
        assert_eq!(
            take(Method::PUT, "/api/v1/namespaces/n/configmaps/a"),
            Some(Fault::Conflict)
        );
        assert_eq!(
            take(Method::PUT, "/api/v1/namespaces/n/configmaps/a"),
            Some(Fault::ServerError)
        );
        assert_eq!(
            take(Method::PUT, "/api/v1/namespaces/n/configmaps/b"),
            Some(Fault::ServerError)
        );
        assert_eq!(take(Method::PUT, "/api/v1/namespaces/n/configmaps/b"), None);
        assert_eq!(faults.injected(), 3);
        assert_eq!(faults.pending(), 0);
    }
}
