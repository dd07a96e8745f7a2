//! Typed admission: handlers that read the reviewed object as a Rust type `K` (a k8s-openapi
//! type such as `Pod`, or a custom resource) and answer with a typed outcome.
//!
//! - [`TypedRequest<K>`]: what the handler is given.
//! - [`Validation`] (validating routes: allow or deny, nothing else) and [`Mutation<K>`]
//!   (mutating routes: allow unchanged, allow the changed object, or deny), each optionally in
//!   a [`Reply`] carrying admission warnings. A denial lists [`FieldCause`]s and is sent as
//!   `422 Invalid` with `status.details.causes`, as the API server's own validation answers.
//! - For [`Mutation::Mutated`] the server computes the JSON patch from the typed change and
//!   applies it to the object as sent ([`raw_patch`]), so fields `K`
//!   does not model survive.

use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::authentication::v1::UserInfo;
use kube::core::admission::{AdmissionResponse, Operation};
use kube::core::response::{StatusCause, StatusDetails};
use kube::core::{GroupVersionKind, GroupVersionResource, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::patch::{decode_at_path, raw_patch, raw_patch_typed};
use crate::registration::RuleScope;
use crate::reuse::{KeptAnswers, Reusable, ReviewKey, joined_patch, patched};
use crate::route::Review;

/// The types a typed route can read objects as: a Kubernetes resource with a static type
/// (k8s-openapi types, `#[derive(CustomResource)]` types) that serializes and deserializes,
/// whose scope is known ([`RuleScope`]).
pub trait TypedResource:
    Resource<DynamicType = (), Scope: RuleScope> + Serialize + DeserializeOwned + Send + 'static
{
}

impl<K> TypedResource for K where
    K: Resource<DynamicType = (), Scope: RuleScope> + Serialize + DeserializeOwned + Send + 'static
{
}

/// A review request with its objects read as `K`.
///
/// Before the handler is called, the route checks that the request is about a `K` (the
/// request's `kind` is `K`'s group, version and kind; otherwise the webhook registration is
/// wrong) and decodes `object` and `oldObject` as `K`. Either failing is a handler failure,
/// answered by the route's [`OnHandlerError`](crate::OnHandlerError) policy with a message naming
/// the first field that does not fit (`spec.containers[0].ports[0].containerPort: invalid type:
/// string "x", expected i32`). So typed routes suit `CREATE`, `UPDATE` and `DELETE`; a
/// `CONNECT` request's object is an options kind, not `K`.
///
/// **Dry run.** When [`dry_run`](Self::dry_run) is true (`kubectl --dry-run=server`,
/// `PostParams { dry_run: true }`), the API server persists nothing, and a handler with side
/// effects beyond its answer (creating or updating other objects, calling a service) must not
/// perform them. Such a webhook is registered with
/// [`SideEffects::NoneOnDryRun`](crate::registration::SideEffects::NoneOnDryRun); one registered
/// with `None` must have no side effects at all. (The API server refuses dry-run requests that
/// would reach a webhook declaring other side effects.)
#[derive(Clone, Debug)]
pub struct TypedRequest<K> {
    /// The review's uid (correlates with the API server's logs; not the object's uid).
    pub uid: String,
    /// The kind of the object (always `K`'s).
    pub kind: GroupVersionKind,
    /// The resource requested (`pods`).
    pub resource: GroupVersionResource,
    /// The subresource requested, if any (`status`, `ephemeralcontainers`).
    pub sub_resource: Option<String>,
    /// The operation: `CREATE`, `UPDATE` or `DELETE` (a patch arrives as an `UPDATE` or a
    /// `CREATE`).
    pub operation: Operation,
    /// The object's namespace; `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    /// The object's name; empty on a `CREATE` with `generateName`.
    pub name: String,
    /// Who sent the request.
    pub user_info: UserInfo,
    /// Whether nothing will be persisted: see the type's documentation.
    pub dry_run: bool,
    /// The object as it would be stored; `None` for `DELETE`.
    pub object: Option<K>,
    /// The stored object, for `UPDATE` and `DELETE`.
    pub old_object: Option<K>,
}

/// One field a denial refers to, sent as a `status.details.causes` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldCause {
    /// The field's path as the API server writes it: `spec.containers[0].image`.
    pub field: String,
    /// A machine-readable reason, one of the API server's `CauseType`s: `FieldValueInvalid`,
    /// `FieldValueRequired`, `FieldValueForbidden`, `FieldValueNotSupported`,
    /// `FieldValueDuplicate`, ...
    pub reason: String,
    /// What is wrong, for people.
    pub message: String,
}

impl FieldCause {
    /// A cause with the given reason.
    pub fn new(
        field: impl Into<String>,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// `FieldValueInvalid`: the value is not acceptable.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(field, "FieldValueInvalid", message)
    }

    /// `FieldValueRequired`: the field must be set.
    pub fn required(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(field, "FieldValueRequired", message)
    }

    /// `FieldValueForbidden`: the field must not be set (or not to this value).
    pub fn forbidden(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(field, "FieldValueForbidden", message)
    }
}

/// The answer of a typed validating handler. There is no way to change the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Validation {
    /// Admit the request.
    Allow,
    /// Refuse it: sent with `status.code: 422`, `status.reason: Invalid` and the causes in
    /// `status.details.causes`. An empty `message` is made of the causes (`<field>: <message>`
    /// joined by `"; "`).
    Deny {
        /// What is shown to whoever made the request, after the API server's `admission
        /// webhook "<name>" denied the request: `.
        message: String,
        /// The fields at fault.
        causes: Vec<FieldCause>,
    },
}

/// The answer of a typed mutating handler.
#[derive(Clone, Debug, PartialEq)]
pub enum Mutation<K> {
    /// Admit the request unchanged.
    Allow,
    /// Admit it changed into this object. The server sends the JSON patch from the object as
    /// read to this one, applied to the object as sent; an object equal to the one read is
    /// admitted without a patch. A change that cannot be made to the object as sent (see
    /// [`raw_patch`]) is a handler failure.
    Mutated(K),
    /// Refuse the request, as [`Validation::Deny`].
    Deny {
        /// What is shown to whoever made the request.
        message: String,
        /// The fields at fault.
        causes: Vec<FieldCause>,
    },
}

/// A typed outcome with admission warnings (`response.warnings`), which the API server returns
/// to the client as `Warning` headers and `kubectl` prints. Warnings go with any outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply<O> {
    /// The outcome.
    pub outcome: O,
    /// Warnings, in order; keep each under 120 characters.
    pub warnings: Vec<String>,
    /// Whether a [`Mutation::Mutated`] answer may be reused for later reviews of an equal
    /// object (see [`crate::reuse`]); ignored for other outcomes and on validating routes.
    pub reuse: Option<Reusable>,
}

impl<O> Reply<O> {
    /// The outcome without warnings.
    pub fn new(outcome: O) -> Self {
        Self {
            outcome,
            warnings: Vec::new(),
            reuse: None,
        }
    }

    /// Offers the answer for reuse (see [`crate::reuse`]).
    #[must_use]
    pub fn reusable(mut self, reuse: Reusable) -> Self {
        self.reuse = Some(reuse);
        self
    }

    /// Adds a warning.
    #[must_use]
    pub fn warning(mut self, warning: impl Into<String>) -> Self {
        self.warnings.push(warning.into());
        self
    }
}

impl From<Validation> for Reply<Validation> {
    fn from(outcome: Validation) -> Self {
        Self::new(outcome)
    }
}

impl<K> From<Mutation<K>> for Reply<Mutation<K>> {
    fn from(outcome: Mutation<K>) -> Self {
        Self::new(outcome)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Validation {}
    impl<K> Sealed for super::Mutation<K> {}
}

/// The typed outcomes: [`Validation`] and [`Mutation<K>`].
pub trait TypedOutcome: sealed::Sealed + Send + 'static {}

impl TypedOutcome for Validation {}
impl<K: Send + 'static> TypedOutcome for Mutation<K> {}

/// What a typed handler may return: the outcome `O`, a [`Reply<O>`], or a `Result` of either
/// whose error is a handler failure (handled by the route's
/// [`OnHandlerError`](crate::OnHandlerError) policy, its text in the message).
pub trait TypedOutput<O>: Send + 'static {
    /// The reply, or the message of a handler failure.
    fn into_reply(self) -> Result<Reply<O>, String>;
}

impl<O: TypedOutcome> TypedOutput<O> for O {
    fn into_reply(self) -> Result<Reply<O>, String> {
        Ok(Reply::new(self))
    }
}

impl<O: TypedOutcome> TypedOutput<O> for Reply<O> {
    fn into_reply(self) -> Result<Reply<O>, String> {
        Ok(self)
    }
}

impl<O: TypedOutcome, E: fmt::Display + Send + 'static> TypedOutput<O> for Result<O, E> {
    fn into_reply(self) -> Result<Reply<O>, String> {
        self.map(Reply::new).map_err(|err| format!("{err:#}"))
    }
}

impl<O: TypedOutcome, E: fmt::Display + Send + 'static> TypedOutput<O> for Result<Reply<O>, E> {
    fn into_reply(self) -> Result<Reply<O>, String> {
        self.map_err(|err| format!("{err:#}"))
    }
}

/// What is kept of a review to turn the handler's reply into a response.
pub(crate) struct Finish<K> {
    base: AdmissionResponse,
    operation: Operation,
    name: String,
    kind: GroupVersionKind,
    raw_object: Option<Value>,
    /// `raw_object` as decoded for the handler (kept on mutating routes, so the patch does not
    /// decode the object as sent again).
    decoded: Option<K>,
}

/// The JSON of `patch`, written into a buffer sized for a pod rewrite's patch at once (rather
/// than grown from empty, each step a copy).
fn patch_json(patch: &json_patch::Patch) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::with_capacity(8 * 1024);
    serde_json::to_writer(&mut bytes, patch).map_err(|err| err.to_string())?;
    Ok(bytes)
}

fn kind_text(group: &str, version: &str, kind: &str) -> String {
    if group.is_empty() {
        format!("{version}/{kind}")
    } else {
        format!("{group}/{version}/{kind}")
    }
}

/// Checks that `review` is about a `K` and decodes its objects, for a validating route.
pub(crate) fn prepare<K: TypedResource>(
    review: Review,
) -> Result<(TypedRequest<K>, Finish<K>), String> {
    prepare_with(review, |_| None)
}

/// [`prepare`] for a mutating route: a copy of the decoded object is kept for the patch.
pub(crate) fn prepare_mutating<K: TypedResource + Clone>(
    review: Review,
) -> Result<(TypedRequest<K>, Finish<K>), String> {
    prepare_with(review, |object: &Option<K>| object.clone())
}

fn prepare_with<K: TypedResource>(
    review: Review,
    keep: impl FnOnce(&Option<K>) -> Option<K>,
) -> Result<(TypedRequest<K>, Finish<K>), String> {
    let Review { request, raw } = review;
    let expected = (K::group(&()), K::version(&()), K::kind(&()));
    let sent = &request.kind;
    if sent.group != expected.0 || sent.version != expected.1 || sent.kind != expected.2 {
        return Err(format!(
            "this route reads {} objects and was sent a {}: its webhook registration is wrong",
            kind_text(&expected.0, &expected.1, &expected.2),
            kind_text(&sent.group, &sent.version, &sent.kind),
        ));
    }
    let kind = kind_text(&expected.0, &expected.1, &expected.2);
    let decode = |value: &Option<Value>, what: &str| -> Result<Option<K>, String> {
        value
            .as_ref()
            .map(|value| {
                decode_at_path::<K>(value).map_err(|(path, message)| {
                    if path.is_empty() || path == "." {
                        format!("{what} does not decode as {kind}: {message}")
                    } else {
                        format!("{what} does not decode as {kind} at {path}: {message}")
                    }
                })
            })
            .transpose()
    };
    let object = decode(&raw.object, "the object")?;
    let old_object = decode(&raw.old_object, "the stored object (oldObject)")?;
    let base = AdmissionResponse::from(&request);
    let finish = Finish {
        base,
        operation: request.operation.clone(),
        name: request.name.clone(),
        kind: request.kind.clone(),
        raw_object: raw.object,
        decoded: keep(&object),
    };
    let typed = TypedRequest {
        uid: request.uid,
        kind: request.kind,
        resource: request.resource,
        sub_resource: request.sub_resource,
        operation: request.operation,
        namespace: request.namespace,
        name: request.name,
        user_info: request.user_info,
        dry_run: request.dry_run,
        object,
        old_object,
    };
    Ok((typed, finish))
}

impl<K: TypedResource> Finish<K> {
    pub(crate) fn validation(self, reply: Reply<Validation>) -> Result<AdmissionResponse, String> {
        let response = match reply.outcome {
            Validation::Allow => self.base,
            Validation::Deny { message, causes } => self.deny(message, causes),
        };
        Ok(with_warnings(response, reply.warnings))
    }

    pub(crate) fn mutation(self, reply: Reply<Mutation<K>>) -> Result<AdmissionResponse, String> {
        self.mutation_kept(reply, None)
    }

    /// [`Self::mutation`], keeping a reusable changed answer in `kept` under its key.
    pub(crate) fn mutation_kept(
        mut self,
        reply: Reply<Mutation<K>>,
        kept: Option<(&KeptAnswers, ReviewKey)>,
    ) -> Result<AdmissionResponse, String> {
        let Reply {
            outcome,
            warnings,
            reuse,
        } = reply;
        let response = match outcome {
            Mutation::Allow => self.base,
            Mutation::Deny { message, causes } => self.deny(message, causes),
            Mutation::Mutated(object) => {
                let Some(raw) = self.raw_object.take() else {
                    return Err(format!(
                        "the handler returned a changed object for a {:?} request, which \
                         carries no object to change",
                        self.operation
                    ));
                };
                let patch = match &self.decoded {
                    Some(decoded) => raw_patch_typed(&raw, decoded, &object),
                    None => raw_patch(&raw, &object),
                }
                .map_err(|err| err.to_string())?;
                let encoding = |err: String| format!("the patch cannot be encoded: {err}");
                let per_review = reuse.as_ref().map_or(&[][..], |r| r.per_review.as_slice());
                if patch.0.is_empty() && per_review.is_empty() && reuse.is_none() {
                    self.base
                } else {
                    let bytes = patch_json(&patch).map_err(encoding)?;
                    let sent = joined_patch(&bytes, per_review).ok_or_else(|| {
                        encoding("the per-review operations do not encode".to_owned())
                    })?;
                    if let (Some(reuse), Some((answers, key))) = (&reuse, kept) {
                        answers.keep(key, raw, bytes, warnings.clone(), Arc::clone(&reuse.reuse));
                    }
                    if sent == b"[]" {
                        self.base
                    } else {
                        patched(self.base, sent)
                            .ok_or_else(|| encoding("no patch type".to_owned()))?
                    }
                }
            }
        };
        Ok(with_warnings(response, warnings))
    }

    fn deny(self, message: String, causes: Vec<FieldCause>) -> AdmissionResponse {
        let message = if !message.is_empty() {
            message
        } else if causes.is_empty() {
            "refused by the admission webhook".to_owned()
        } else {
            causes
                .iter()
                .map(|cause| format!("{}: {}", cause.field, cause.message))
                .collect::<Vec<_>>()
                .join("; ")
        };
        let mut response = self.base.deny(message);
        response.result.code = 422;
        response.result.reason = "Invalid".to_owned();
        response.result.details = Some(StatusDetails {
            name: self.name,
            group: self.kind.group,
            kind: self.kind.kind,
            uid: String::new(),
            causes: causes
                .into_iter()
                .map(|cause| StatusCause {
                    reason: cause.reason,
                    message: cause.message,
                    field: cause.field,
                })
                .collect(),
            retry_after_seconds: 0,
        });
        response
    }
}

fn with_warnings(mut response: AdmissionResponse, warnings: Vec<String>) -> AdmissionResponse {
    if !warnings.is_empty() {
        response.warnings = Some(warnings);
    }
    response
}
