//! Client-side process crashes: a tower layer in front of a `kube::Client`'s HTTP stack that
//! lets a chosen number of writes be stored by the API server and then plays a dead process.
//!
//! [`FaultInjector`](crate::FaultInjector) makes a write fail (nothing is stored); a
//! [`CrashSwitch`] is the other half of a crash matrix: the write **is** stored and the process
//! that made it never learns so, nor makes another request. A test runs a controller on a client
//! built with [`ControlPlane::client_with_crash`](crate::ControlPlane::client_with_crash), waits
//! for [`CrashSwitch::crashed`], stops that instance (its in-memory state is lost) and starts a
//! fresh one on a new client.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::{Method, Request, Response};
use kube::client::{Body, DynBody};
use tokio::sync::watch;
use tower::{BoxError, Layer, Service};

#[derive(Debug)]
struct State {
    /// The stored write after which the process is dead (1 = the first); `None` never crashes.
    budget: Option<usize>,
    /// Paths containing any of these do not count as writes (they still pass before the crash).
    ignored: Vec<String>,
    /// Every counted write answered so far: `METHOD path?query -> status`, and whether it was
    /// stored (a 2xx answer).
    writes: Vec<(String, bool)>,
    /// Set when the last allowed write is answered: every later request fails at once.
    dead: bool,
}

/// Lets the writes (POST, PUT, PATCH, DELETE) of a client reach the API server until the
/// `n`th of them is **stored** (answered 2xx), and then fails every request of that client, as
/// if its process had died right after that write: its caller gets an error instead of the
/// answer, and every later request (reads and watches included) fails at once.
///
/// A write the server refuses (409 AlreadyExists from an idempotent create, a conflict) stores
/// nothing and does not count. Requests in flight when the `n`th write is answered are treated
/// alike (their callers get errors). Cheap to clone; clones share their state.
#[derive(Clone, Debug)]
pub struct CrashSwitch {
    state: Arc<Mutex<State>>,
    /// `Some(write)` once the last write was stored.
    answered: watch::Sender<Option<String>>,
}

impl CrashSwitch {
    /// A switch that crashes the client right after its `n`th stored write (`n` = 1: the
    /// first).
    pub fn after_writes(n: usize) -> Self {
        Self::with_budget(Some(n.max(1)))
    }

    /// A switch that never crashes: it only records the writes (to assert that a controller
    /// had nothing left to write).
    pub fn never() -> Self {
        Self::with_budget(None)
    }

    fn with_budget(budget: Option<usize>) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                budget,
                ignored: Vec::new(),
                writes: Vec::new(),
                dead: false,
            })),
            answered: watch::Sender::new(None),
        }
    }

    /// Writes whose path contains `path_contains` (for example `/events`) do not count: they
    /// pass through before the crash and fail after it like every other request.
    pub fn ignoring(self, path_contains: &str) -> Self {
        if let Ok(mut state) = self.state.lock() {
            state.ignored.push(path_contains.to_owned());
        }
        self
    }

    /// Every counted write answered so far, as `METHOD path?query -> status`.
    pub fn writes(&self) -> Vec<String> {
        self.state
            .lock()
            .map(|s| s.writes.iter().map(|(w, _)| w.clone()).collect())
            .unwrap_or_default()
    }

    /// The counted writes the server stored (answered 2xx), as `METHOD path?query -> status`.
    pub fn stored(&self) -> Vec<String> {
        self.state
            .lock()
            .map(|s| {
                s.writes
                    .iter()
                    .filter(|(_, stored)| *stored)
                    .map(|(w, _)| w.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether the process is dead (its last write was stored).
    pub fn is_dead(&self) -> bool {
        self.state.lock().map(|s| s.dead).unwrap_or(true)
    }

    /// Waits until the last allowed write was stored, that is, until the crash is complete,
    /// and returns that write (`METHOD path?query -> status`). Never returns for a switch made
    /// with [`never`](Self::never).
    pub async fn crashed(&self) -> String {
        let mut answers = self.answered.subscribe();
        loop {
            if let Some(write) = answers.borrow_and_update().clone() {
                return write;
            }
            if answers.changed().await.is_err() {
                // The sender lives in `self`: unreachable; wait forever rather than lie.
                std::future::pending::<()>().await;
            }
        }
    }

    /// The tower layer to put in front of a client's service stack.
    pub fn layer(&self) -> CrashLayer {
        CrashLayer {
            switch: self.clone(),
        }
    }

    /// Whether a request may leave the process: `None` when it is dead, else whether it is a
    /// counted write.
    fn admit(&self, method: &Method, path: &str) -> Option<bool> {
        let state = self.state.lock().ok()?;
        if state.dead {
            return None;
        }
        let write = matches!(
            *method,
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE
        );
        Some(write && !state.ignored.iter().any(|i| path.contains(i.as_str())))
    }

    /// Records the answer to a counted write; `false` when the process is dead by now (this
    /// write was its last, or it died while the write was in flight): the caller must not see
    /// the answer.
    fn answered(&self, write: String, stored: bool) -> bool {
        let Ok(mut state) = self.state.lock() else {
            return false;
        };
        if state.dead {
            return false;
        }
        state.writes.push((write.clone(), stored));
        let count = state.writes.iter().filter(|(_, s)| *s).count();
        if stored && state.budget == Some(count) {
            state.dead = true;
            self.answered.send_replace(Some(write));
            return false;
        }
        true
    }

    fn alive(&self) -> bool {
        !self.is_dead()
    }
}

/// [`tower::Layer`] produced by [`CrashSwitch::layer`].
#[derive(Clone, Debug)]
pub struct CrashLayer {
    switch: CrashSwitch,
}

impl<S> Layer<S> for CrashLayer {
    type Service = CrashService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CrashService {
            inner,
            switch: self.switch.clone(),
        }
    }
}

/// [`tower::Service`] produced by [`CrashLayer`].
#[derive(Clone, Debug)]
pub struct CrashService<S> {
    inner: S,
    switch: CrashSwitch,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

fn dead() -> BoxError {
    BoxError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "the process crashed (warmcache-testkit CrashSwitch): no request leaves it any more",
    ))
}

impl<S> Service<Request<Body>> for CrashService<S>
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
        let path = crate::faults::path_and_query(&request);
        let method = request.method().clone();
        let switch = self.switch.clone();
        match switch.admit(&method, &path) {
            None => Box::pin(std::future::ready(Err(dead()))),
            Some(false) => {
                let future = self.inner.call(request);
                Box::pin(async move {
                    let response = future.await.map_err(Into::into)?;
                    // A read answered after the crash never reaches the dead process either.
                    if switch.alive() {
                        Ok(response)
                    } else {
                        Err(dead())
                    }
                })
            }
            Some(true) => {
                let future = self.inner.call(request);
                Box::pin(async move {
                    let response = future.await.map_err(Into::into)?;
                    let status = response.status();
                    if switch.answered(format!("{method} {path} -> {status}"), status.is_success())
                    {
                        Ok(response)
                    } else {
                        Err(dead())
                    }
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nth_stored_write_is_the_last_request() {
        let switch = CrashSwitch::after_writes(2).ignoring("/events");
        assert_eq!(switch.admit(&Method::GET, "/api/v1/pods"), Some(false));
        assert_eq!(switch.admit(&Method::POST, "/api/v1/pods"), Some(true));
        assert!(switch.answered("POST /api/v1/pods -> 201".into(), true));
        assert_eq!(
            switch.admit(&Method::POST, "/api/v1/namespaces/a/events"),
            Some(false)
        );
        // Refused: nothing stored, not counted.
        assert!(switch.answered("POST /api/v1/pods -> 409".into(), false));
        assert!(!switch.is_dead());
        assert_eq!(switch.admit(&Method::DELETE, "/api/v1/pods/p"), Some(true));
        assert!(!switch.answered("DELETE /api/v1/pods/p -> 200".into(), true));
        assert!(switch.is_dead());
        assert_eq!(switch.admit(&Method::GET, "/api/v1/pods"), None);
        assert_eq!(
            switch.admit(&Method::POST, "/api/v1/namespaces/a/events"),
            None
        );
        assert!(!switch.answered("PUT /x -> 200".into(), true), "in flight");
        assert_eq!(switch.writes().len(), 3);
        assert_eq!(
            switch.stored(),
            vec![
                "POST /api/v1/pods -> 201".to_owned(),
                "DELETE /api/v1/pods/p -> 200".to_owned()
            ]
        );
        assert_eq!(
            *switch.answered.borrow(),
            Some("DELETE /api/v1/pods/p -> 200".to_owned())
        );
    }

    #[test]
    fn never_only_records() {
        let switch = CrashSwitch::never();
        for _ in 0..5 {
            assert!(switch.answered("PUT /x -> 200".into(), true));
        }
        assert!(!switch.is_dead());
        assert_eq!(switch.stored().len(), 5);
    }
}
