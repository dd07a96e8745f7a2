//! Routes: a path, a handler, a failure policy and optionally the webhook registration, added
//! to the server with [`AdmissionServer::route`](crate::AdmissionServer::route).
//!
//! | handler reads | synchronous (blocking pool) | async |
//! |---|---|---|
//! | `AdmissionRequest<DynamicObject>`, answers an [`AdmissionResponse`] | [`Route::validating`], [`Route::mutating`] | [`Route::validating_async`], [`Route::mutating_async`] |
//! | [`TypedRequest<K>`](crate::TypedRequest), answers a [`Validation`] or [`Mutation<K>`] | [`Route::validating_typed`], [`Route::mutating_typed`] | [`Route::validating_typed_async`], [`Route::mutating_typed_async`] |
//!
//! Every route denies on handler failure unless [`Route::on_error`] says otherwise, and is
//! registered with the API server through [`Route::webhook`] and
//! [`AdmissionServer::configurations`](crate::AdmissionServer::configurations).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse};
use serde_json::Value;

use crate::registration::{TypedTarget, Webhook};
use crate::reuse::KeptAnswers;
use crate::typed::{self, Mutation, TypedOutput, TypedResource, Validation};

/// Whether a route backs a validating or a mutating webhook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteKind {
    /// Validating: the handler's response must not carry a patch (a patch is treated as a
    /// handler bug: the review is denied with an internal error). Typed validating handlers
    /// answer a [`Validation`], which cannot carry one.
    Validate,
    /// Mutating: the handler may attach a JSON patch with
    /// [`AdmissionResponse::with_patch`], or return [`Mutation::Mutated`].
    Mutate,
}

/// What a route answers when its handler fails: returns an error, panics, does not answer
/// within [`handler_timeout`](crate::AdmissionServerConfig::handler_timeout), (on a validating
/// route) returns a patch, or (on a typed route) is sent an object that does not decode as its
/// type or returns a change that cannot be made to the object as sent.
///
/// The webhook configuration's `failurePolicy` only covers failures the API server sees
/// (connection refused, TLS error, timeout); a review we answer is taken as given. So this
/// policy, not `failurePolicy`, decides what a handler failure does to the request:
///
/// - [`Deny`](Self::Deny), the default, for webhooks that guard our own resources, where an
///   unchecked object is worse than a refused one, e.g. KVCacheBackend validation.
/// - [`Allow`](Self::Allow) for webhooks on other people's workloads that must never block
///   them when warmcache misbehaves, e.g. the Pod-mutating webhook:
///   `.on_error(OnHandlerError::Allow)`, and `failurePolicy: Ignore` in its registration for
///   the transport failures.
///
/// Either way the review is logged at warn level and counted with verdict
/// [`Verdict::Error`](crate::Verdict::Error).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnHandlerError {
    /// Deny the request: `allowed: false`, `status.code: 500`, `status.reason: InternalError`
    /// and a message naming the failure.
    #[default]
    Deny,
    /// Allow the request unchanged (no patch, whatever the handler produced) with an
    /// `AdmissionResponse` warning naming the webhook route and the failure, which `kubectl`
    /// shows to whoever made the request.
    Allow,
}

/// What a dynamic handler may return: an [`AdmissionResponse`], or a `Result` whose error is a
/// handler failure handled by the route's [`OnHandlerError`] policy, with the error's text
/// (alternate form, so an `anyhow` chain is shown in full) in the message.
pub trait HandlerOutput: Send + 'static {
    /// The response, or the message of a handler failure.
    fn into_result(self) -> Result<AdmissionResponse, String>;
}

impl HandlerOutput for AdmissionResponse {
    fn into_result(self) -> Result<AdmissionResponse, String> {
        Ok(self)
    }
}

impl<E: fmt::Display + Send + 'static> HandlerOutput for Result<AdmissionResponse, E> {
    fn into_result(self) -> Result<AdmissionResponse, String> {
        self.map_err(|err| format!("{err:#}"))
    }
}

/// `request.object` and `request.oldObject` exactly as the API server sent them.
#[derive(Debug, Default)]
pub(crate) struct RawObjects {
    pub(crate) object: Option<Value>,
    pub(crate) old_object: Option<Value>,
}

/// A decoded review as handed to a route's handler.
pub(crate) struct Review {
    /// The request; for typed routes without `object` and `oldObject`, which are in `raw`.
    pub(crate) request: AdmissionRequest<DynamicObject>,
    pub(crate) raw: RawObjects,
}

pub(crate) type HandlerFuture =
    Pin<Box<dyn Future<Output = Result<AdmissionResponse, String>> + Send>>;
pub(crate) type AsyncFn = Arc<dyn Fn(Review) -> HandlerFuture + Send + Sync>;
pub(crate) type SyncFn = Arc<dyn Fn(Review) -> Result<AdmissionResponse, String> + Send + Sync>;

/// A step run on the blocking pool.
pub(crate) type BlockingStep = Box<dyn FnOnce() -> Result<AdmissionResponse, String> + Send>;

/// What the async part of a typed async handler leaves to do.
pub(crate) enum AfterHandler {
    /// Nothing: the response.
    Done(Box<AdmissionResponse>),
    /// A step to run on the blocking pool (the patch of a changed object).
    Blocking(BlockingStep),
}

pub(crate) type StagedFuture = Pin<Box<dyn Future<Output = Result<AfterHandler, String>> + Send>>;
/// A typed async handler: decodes the review and starts the handler (on the blocking pool),
/// giving the future to run in a task.
pub(crate) type StagedFn = Arc<dyn Fn(Review) -> Result<StagedFuture, String> + Send + Sync>;

/// A route's handler: synchronous ones run on the blocking pool, async ones in a task; typed
/// async ones decode and patch on the blocking pool around their task.
#[derive(Clone)]
pub(crate) enum DynHandler {
    Sync(SyncFn),
    Async(AsyncFn),
    Staged(StagedFn),
}

/// One webhook endpoint of an [`AdmissionServer`](crate::AdmissionServer): its path, kind,
/// handler, [`OnHandlerError`] policy and, for
/// [`configurations`](crate::AdmissionServer::configurations), its [`Webhook`] registration.
///
/// ```
/// use k8s_openapi::api::core::v1::Pod;
/// use warmcache_admission::registration::{FailurePolicy, Rule, Scope, Webhook};
/// use warmcache_admission::{Mutation, OnHandlerError, Operation, Route, TypedRequest};
///
/// let route = Route::mutating_typed("/mutate-pods", |req: TypedRequest<Pod>| {
///     let Some(mut pod) = req.object else {
///         return Mutation::Allow;
///     };
///     pod.metadata
///         .labels
///         .get_or_insert_default()
///         .insert("warmcache.io/seen".into(), "true".into());
///     Mutation::Mutated(pod)
/// })
/// .on_error(OnHandlerError::Allow)
/// .webhook(
///     Webhook::new("pods.webhook.warmcache.io")
///         .rule(Rule::for_resource::<Pod>([Operation::Create]).scope(Scope::Namespaced))
///         .failure_policy(FailurePolicy::Ignore),
/// );
/// assert_eq!(route.path(), "/mutate-pods");
/// ```
///
/// Synchronous handlers run on tokio's blocking pool, at most
/// [`max_concurrent_handlers`](crate::AdmissionServerConfig::max_concurrent_handlers) at a
/// time, so CPU-heavy work cannot stall the server; a handler still running at the
/// [`handler_timeout`](crate::AdmissionServerConfig::handler_timeout) is abandoned (the review
/// is answered, the handler runs to completion in the background). Use the `_async`
/// constructors for I/O. A synchronous or typed route runs the whole review as one step on the
/// blocking pool within a handler slot (decoding the body and the objects, the handler,
/// computing the patch of a changed object, encoding the answer: work proportional to the
/// object, which the request's sender controls), so nothing decoded crosses threads. A typed
/// async handler's future is polled once in that step; only when it does not finish there (it
/// waits for I/O) does it go on in a task without a slot, and the patch is then computed in a
/// second blocking step within a slot. The whole is bounded by the same timeout. A typed async
/// route answers a review of at most
/// [`inline_body_bytes`](crate::AdmissionServerConfig::inline_body_bytes) (off by default) on
/// the async worker instead, without a slot or the hand-off to the blocking pool and back.
pub struct Route {
    pub(crate) path: String,
    pub(crate) kind: RouteKind,
    pub(crate) on_error: OnHandlerError,
    pub(crate) handler: DynHandler,
    /// The resource a typed route reads objects as (its handler reads the raw objects);
    /// `None` for dynamic routes.
    pub(crate) target: Option<TypedTarget>,
    pub(crate) webhook: Option<Webhook>,
}

impl fmt::Debug for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Route")
            .field("path", &self.path)
            .field("kind", &self.kind)
            .field("on_error", &self.on_error)
            .field("typed", &self.target.as_ref().map(|t| t.kind.as_str()))
            .field("webhook", &self.webhook.as_ref().map(|w| w.name.as_str()))
            .finish_non_exhaustive()
    }
}

impl Route {
    fn new(
        path: String,
        kind: RouteKind,
        handler: DynHandler,
        target: Option<TypedTarget>,
    ) -> Self {
        Self {
            path,
            kind,
            on_error: OnHandlerError::Deny,
            handler,
            target,
            webhook: None,
        }
    }

    /// A validating route with a synchronous handler of the request as sent.
    pub fn validating<F, R>(path: impl Into<String>, handler: F) -> Self
    where
        F: Fn(AdmissionRequest<DynamicObject>) -> R + Send + Sync + 'static,
        R: HandlerOutput,
    {
        Self::new(
            path.into(),
            RouteKind::Validate,
            sync_dynamic(handler),
            None,
        )
    }

    /// A mutating route with a synchronous handler of the request as sent; it may attach a
    /// JSON patch (see [`crate::patch`]).
    pub fn mutating<F, R>(path: impl Into<String>, handler: F) -> Self
    where
        F: Fn(AdmissionRequest<DynamicObject>) -> R + Send + Sync + 'static,
        R: HandlerOutput,
    {
        Self::new(path.into(), RouteKind::Mutate, sync_dynamic(handler), None)
    }

    /// A validating route with an async handler of the request as sent.
    pub fn validating_async<F, Fut, R>(path: impl Into<String>, handler: F) -> Self
    where
        F: Fn(AdmissionRequest<DynamicObject>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: HandlerOutput,
    {
        Self::new(
            path.into(),
            RouteKind::Validate,
            async_dynamic(handler),
            None,
        )
    }

    /// A mutating route with an async handler of the request as sent.
    pub fn mutating_async<F, Fut, R>(path: impl Into<String>, handler: F) -> Self
    where
        F: Fn(AdmissionRequest<DynamicObject>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: HandlerOutput,
    {
        Self::new(path.into(), RouteKind::Mutate, async_dynamic(handler), None)
    }

    /// A validating route reading objects as `K`, with a synchronous handler answering a
    /// [`Validation`] (which cannot carry a change). See [`TypedRequest`](crate::TypedRequest)
    /// for what the handler is given and what fails before it is called.
    pub fn validating_typed<K, F, R>(path: impl Into<String>, handler: F) -> Self
    where
        K: TypedResource,
        F: Fn(typed::TypedRequest<K>) -> R + Send + Sync + 'static,
        R: TypedOutput<Validation>,
    {
        let handler = DynHandler::Sync(Arc::new(move |review: Review| {
            let (request, finish) = typed::prepare::<K>(review)?;
            finish.validation(handler(request).into_reply()?)
        }));
        Self::new(
            path.into(),
            RouteKind::Validate,
            handler,
            Some(TypedTarget::of::<K>()),
        )
    }

    /// A mutating route reading objects as `K`, with a synchronous handler answering a
    /// [`Mutation<K>`]; for [`Mutation::Mutated`] the server computes the JSON patch from the
    /// typed change and applies it to the object as sent (see
    /// [`patch::raw_patch`](crate::patch::raw_patch)), so fields `K` does not model are kept.
    /// A copy of the decoded object is kept for the patch (hence `K: Clone`), so the object as
    /// sent is decoded once.
    pub fn mutating_typed<K, F, R>(path: impl Into<String>, handler: F) -> Self
    where
        K: TypedResource + Clone,
        F: Fn(typed::TypedRequest<K>) -> R + Send + Sync + 'static,
        R: TypedOutput<Mutation<K>>,
    {
        let kept = Arc::new(KeptAnswers::new());
        let handler = DynHandler::Sync(Arc::new(move |review: Review| {
            let mut key = kept.key(&review);
            if let Some(key) = key.as_mut()
                && let Some(response) = kept.answer(&review, key)
            {
                return Ok(response);
            }
            let (request, finish) = typed::prepare_mutating::<K>(review)?;
            let reply = handler(request).into_reply()?;
            finish.mutation_kept(reply, key.map(|key| (&*kept, key)))
        }));
        Self::new(
            path.into(),
            RouteKind::Mutate,
            handler,
            Some(TypedTarget::of::<K>()),
        )
    }

    /// [`validating_typed`](Self::validating_typed) with an async handler.
    pub fn validating_typed_async<K, F, Fut, R>(path: impl Into<String>, handler: F) -> Self
    where
        K: TypedResource,
        F: Fn(typed::TypedRequest<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: TypedOutput<Validation>,
    {
        let handler = DynHandler::Staged(Arc::new(move |review: Review| {
            let (request, finish) = typed::prepare::<K>(review)?;
            let running = handler(request);
            let future: StagedFuture = Box::pin(async move {
                let reply = running.await.into_reply()?;
                finish
                    .validation(reply)
                    .map(|response| AfterHandler::Done(Box::new(response)))
            });
            Ok(future)
        }));
        Self::new(
            path.into(),
            RouteKind::Validate,
            handler,
            Some(TypedTarget::of::<K>()),
        )
    }

    /// [`mutating_typed`](Self::mutating_typed) with an async handler.
    pub fn mutating_typed_async<K, F, Fut, R>(path: impl Into<String>, handler: F) -> Self
    where
        K: TypedResource + Clone,
        F: Fn(typed::TypedRequest<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: TypedOutput<Mutation<K>>,
    {
        let kept = Arc::new(KeptAnswers::new());
        let handler = DynHandler::Staged(Arc::new(move |review: Review| {
            let mut key = kept.key(&review);
            if let Some(key) = key.as_mut()
                && let Some(response) = kept.answer(&review, key)
            {
                let future: StagedFuture = Box::pin(std::future::ready(Ok(AfterHandler::Done(
                    Box::new(response),
                ))));
                return Ok(future);
            }
            let kept = Arc::clone(&kept);
            let (request, finish) = typed::prepare_mutating::<K>(review)?;
            let running = handler(request);
            let future: StagedFuture = Box::pin(async move {
                let reply = running.await.into_reply()?;
                if matches!(reply.outcome, Mutation::Mutated(_)) {
                    Ok(AfterHandler::Blocking(Box::new(move || {
                        finish.mutation_kept(reply, key.map(|key| (&*kept, key)))
                    })))
                } else {
                    finish
                        .mutation(reply)
                        .map(|response| AfterHandler::Done(Box::new(response)))
                }
            });
            Ok(future)
        }));
        Self::new(
            path.into(),
            RouteKind::Mutate,
            handler,
            Some(TypedTarget::of::<K>()),
        )
    }

    /// Sets what the route answers when its handler fails (default [`OnHandlerError::Deny`]).
    #[must_use]
    pub fn on_error(mut self, policy: OnHandlerError) -> Self {
        self.on_error = policy;
        self
    }

    /// Attaches the route's webhook registration, from which
    /// [`configurations`](crate::AdmissionServer::configurations) generates the
    /// `ValidatingWebhookConfiguration` or `MutatingWebhookConfiguration` entry calling this
    /// route's path.
    #[must_use]
    pub fn webhook(mut self, webhook: Webhook) -> Self {
        self.webhook = Some(webhook);
        self
    }

    /// The path served.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Validating or mutating.
    pub fn kind(&self) -> RouteKind {
        self.kind
    }

    /// What the route answers when its handler fails.
    pub fn error_policy(&self) -> OnHandlerError {
        self.on_error
    }

    /// The webhook registration, if one was attached.
    pub fn registration(&self) -> Option<&Webhook> {
        self.webhook.as_ref()
    }
}

fn sync_dynamic<F, R>(handler: F) -> DynHandler
where
    F: Fn(AdmissionRequest<DynamicObject>) -> R + Send + Sync + 'static,
    R: HandlerOutput,
{
    DynHandler::Sync(Arc::new(move |review: Review| {
        handler(review.request).into_result()
    }))
}

fn async_dynamic<F, Fut, R>(handler: F) -> DynHandler
where
    F: Fn(AdmissionRequest<DynamicObject>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = R> + Send + 'static,
    R: HandlerOutput,
{
    let handler = Arc::new(handler);
    DynHandler::Async(Arc::new(move |review: Review| {
        let handler = Arc::clone(&handler);
        Box::pin(async move { handler(review.request).await.into_result() })
    }))
}
