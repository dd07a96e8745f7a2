//! What a component asks of the API server, counted on the client side:
//! `api_requests_total{verb, resource}` (with the component's prefix), one per request the
//! runtime's client sends, whatever its answer.
//!
//! `verb` is the Kubernetes verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
//! `deletecollection`), `resource` the resource's plural with its subresource (`pods`,
//! `modelcachebindings/status`), `discovery` for the API group listings and `other` for any
//! other path. Both come from the request line of our own client, whose paths name only the
//! resources its roles grant: the set is bounded by the RBAC rules, never by object names.

use std::task::{Context, Poll};

use http::{Method, Request};
use tower::{Layer, Service};
use warmcache_telemetry::prometheus::{IntCounterVec, Opts, Registry};

use crate::error::RuntimeError;

/// The counter.
#[derive(Clone, Debug)]
pub struct ApiRequestMetrics {
    /// `api_requests_total{verb, resource}`.
    pub requests: IntCounterVec,
}

impl ApiRequestMetrics {
    /// Creates the counter and registers it in `registry`.
    ///
    /// # Errors
    ///
    /// It is registered there already.
    pub fn register(registry: &Registry) -> Result<Self, RuntimeError> {
        let name = "api_requests_total";
        let requests = IntCounterVec::new(
            Opts::new(
                name,
                "Requests this component sent to the Kubernetes API server, by verb and resource.",
            ),
            &["verb", "resource"],
        )
        .map_err(|source| RuntimeError::metric(name, source))?;
        registry
            .register(Box::new(requests.clone()))
            .map_err(|source| RuntimeError::metric(name, source))?;
        Ok(Self { requests })
    }
}

/// The Kubernetes verb and resource of a request `method path?query` (see the module docs).
pub fn classify(method: &Method, path: &str, query: Option<&str>) -> (&'static str, String) {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/... or /apis/<group>/<version>/...
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        ["api" | "apis", ..] => return (verb_of(method, false, query), "discovery".to_owned()),
        _ => return (verb_of(method, false, query), "other".to_owned()),
    };
    if rest.is_empty() {
        return (verb_of(method, false, query), "discovery".to_owned());
    }
    // namespaces/<ns>/<resource>/... is a namespaced resource; namespaces[/<name>[/sub]] the
    // Namespace itself.
    let rest = match rest {
        ["namespaces", _ns, resource, tail @ ..] => {
            let mut v = vec![*resource];
            v.extend_from_slice(tail);
            v
        }
        other => other.to_vec(),
    };
    let (resource, named, subresource) = match rest.as_slice() {
        [resource] => (*resource, false, None),
        [resource, _name] => (*resource, true, None),
        [resource, _name, sub, ..] => (*resource, true, Some(*sub)),
        [] => ("other", false, None),
    };
    let resource = match subresource {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource.to_owned(),
    };
    (verb_of(method, named, query), resource)
}

fn verb_of(method: &Method, named: bool, query: Option<&str>) -> &'static str {
    let watching = query.is_some_and(|q| {
        q.split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1" || kv == "watch")
    });
    match *method {
        Method::GET if watching => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    }
}

/// The layer that counts every request of the client it wraps.
#[derive(Clone, Debug)]
pub struct CountRequests(pub ApiRequestMetrics);

impl<S> Layer<S> for CountRequests {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Counted {
            inner,
            metrics: self.0.clone(),
        }
    }
}

/// A client service that counts its requests.
#[derive(Clone, Debug)]
pub struct Counted<S> {
    inner: S,
    metrics: ApiRequestMetrics,
}

impl<S, B> Service<Request<B>> for Counted<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let uri = request.uri();
        let (verb, resource) = classify(request.method(), uri.path(), uri.query());
        self.metrics
            .requests
            .with_label_values(&[verb, &resource])
            .inc();
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn requests_are_named_by_verb_and_resource() {
        let cases = [
            (
                Method::GET,
                "/api/v1/namespaces/a/pods",
                None,
                ("list", "pods"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a/pods",
                Some("watch=true&resourceVersion=5"),
                ("watch", "pods"),
            ),
            (
                Method::GET,
                "/api/v1/pods",
                Some("limit=500"),
                ("list", "pods"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a/pods/p",
                None,
                ("get", "pods"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces",
                None,
                ("list", "namespaces"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/team-a",
                None,
                ("get", "namespaces"),
            ),
            (
                Method::PATCH,
                "/apis/nvca.nvcf.nvidia.io/v2beta1/namespaces/c/modelcachebindings/b/status",
                Some("fieldManager=x"),
                ("patch", "modelcachebindings/status"),
            ),
            (
                Method::POST,
                "/apis/batch/v1/namespaces/a/jobs",
                None,
                ("create", "jobs"),
            ),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/a/leases/l",
                None,
                ("update", "leases"),
            ),
            (
                Method::DELETE,
                "/api/v1/persistentvolumes/pv-1",
                None,
                ("delete", "persistentvolumes"),
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/a/pods",
                None,
                ("deletecollection", "pods"),
            ),
            (Method::GET, "/apis", None, ("list", "discovery")),
            (Method::GET, "/apis/batch/v1", None, ("list", "discovery")),
            (Method::GET, "/version", None, ("list", "other")),
        ];
        for (method, path, query, (verb, resource)) in cases {
            assert_eq!(
                classify(&method, path, query),
                (verb, resource.to_owned()),
                "{method} {path}"
            );
        }
    }

    #[tokio::test]
    async fn the_layer_counts_each_request() {
        let registry = Registry::new();
        let metrics = ApiRequestMetrics::register(&registry).unwrap();
        let mut service =
            CountRequests(metrics.clone()).layer(tower::service_fn(|_: Request<()>| async {
                Ok::<_, std::convert::Infallible>(())
            }));
        for _ in 0..3 {
            let request = Request::get("/api/v1/namespaces/a/pods/p")
                .body(())
                .unwrap();
            service.call(request).await.unwrap();
        }
        assert_eq!(
            metrics.requests.with_label_values(&["get", "pods"]).get(),
            3
        );
        assert!(ApiRequestMetrics::register(&registry).is_err());
    }
}
