//! Error types of this crate and a stable classification of [`kube::Error`].
//!
//! Controllers decide what to do after a failed API call by the *kind* of failure, not by its text:
//! a conflict means "re-read and re-decide", NotFound means "gone" (and only NotFound means gone),
//! a transient failure means "retry soon with backoff", anything else is a real error that needs a
//! human or a spec change. [`category`] maps a [`kube::Error`] onto that small, fixed set; the
//! [`ErrorCategory::as_str`] labels are stable and safe to use as metric label values.

use std::fmt;

use kube::core::response::reason;

/// HTTP status codes the classification looks at.
const TOO_MANY_REQUESTS: u16 = 429;
const GATEWAY_TIMEOUT: u16 = 504;

/// Status reasons (Kubernetes `metav1.StatusReason`) that mean "try again later".
const TRANSIENT_REASONS: &[&str] = &[
    "ServerTimeout",
    "Timeout",
    "TooManyRequests",
    "InternalError",
    "ServiceUnavailable",
    "StorageReadError",
];

/// The stable class of a failed Kubernetes API call.
///
/// The set is deliberately small so it can be used as a bounded metric label and as the basis of
/// an `error_policy` decision. New variants may be added; match with a wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCategory {
    /// The object does not exist (HTTP 404). The only answer that means "gone".
    NotFound,
    /// A write lost an optimistic-concurrency race (HTTP 409, reason `Conflict`): re-read and
    /// decide again.
    Conflict,
    /// A create found an object with the same name (HTTP 409, reason `AlreadyExists`).
    AlreadyExists,
    /// The request was rejected as invalid (HTTP 422 / 400), including a failed JSON-patch `test`.
    Invalid,
    /// The caller is not allowed to do this (HTTP 401 / 403).
    Forbidden,
    /// A failure that is expected to go away by itself: HTTP 5xx, 429, server or client timeouts,
    /// connection errors. Retry with backoff.
    Transient,
    /// Anything else: bad client configuration, undecodable responses, unexpected statuses.
    Other,
}

impl ErrorCategory {
    /// Every category.
    pub const ALL: [Self; 7] = [
        Self::NotFound,
        Self::Conflict,
        Self::AlreadyExists,
        Self::Invalid,
        Self::Forbidden,
        Self::Transient,
        Self::Other,
    ];

    /// The labels of [`ErrorCategory::ALL`], in that order.
    pub const LABELS: [&'static str; 7] = [
        "not_found",
        "conflict",
        "already_exists",
        "invalid",
        "forbidden",
        "transient",
        "other",
    ];

    /// A short, stable, lower-case label for metrics, logs and Event reasons.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::Conflict => "conflict",
            Self::AlreadyExists => "already_exists",
            Self::Invalid => "invalid",
            Self::Forbidden => "forbidden",
            Self::Transient => "transient",
            Self::Other => "other",
        }
    }

    /// Whether retrying the same request later may succeed without any change on our side.
    /// True for [`Transient`](Self::Transient) and [`Conflict`](Self::Conflict) (after a re-read).
    pub fn is_retryable(self) -> bool {
        matches!(self, Self::Transient | Self::Conflict)
    }
}

impl fmt::Display for ErrorCategory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Classifies a [`kube::Error`] into an [`ErrorCategory`].
pub fn category(err: &kube::Error) -> ErrorCategory {
    match err {
        kube::Error::Api(status) => {
            // Like apimachinery's `IsNotFound` & co: the reason decides; the HTTP code is used
            // only when the reason is missing or not one Kubernetes defines.
            let known = reason::is_known(&status.reason);
            let is = |r: &str, code: u16| status.reason == r || (!known && status.code == code);
            if is(reason::NOT_FOUND, 404) {
                ErrorCategory::NotFound
            } else if is(reason::CONFLICT, 409) {
                ErrorCategory::Conflict
            } else if status.reason == reason::ALREADY_EXISTS {
                ErrorCategory::AlreadyExists
            } else if is(reason::FORBIDDEN, 403) || is(reason::UNAUTHORIZED, 401) {
                ErrorCategory::Forbidden
            } else if status.code >= 500
                || status.code == TOO_MANY_REQUESTS
                || TRANSIENT_REASONS.contains(&status.reason.as_str())
            {
                ErrorCategory::Transient
            } else if is(reason::INVALID, 422) || is(reason::BAD_REQUEST, 400) {
                ErrorCategory::Invalid
            } else {
                ErrorCategory::Other
            }
        }
        // Transport-level failures: connection refused/reset, TLS handshake interrupted, request
        // timeouts from the tower stack, a watch/body stream cut mid-way.
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            ErrorCategory::Transient
        }
        _ => ErrorCategory::Other,
    }
}

/// True when the API answered 409 `Conflict`: the write was based on a stale resourceVersion.
/// `AlreadyExists` (also 409) is *not* a conflict.
pub fn is_conflict(err: &kube::Error) -> bool {
    category(err) == ErrorCategory::Conflict
}

/// True when the API answered 404 `NotFound`. This is the only answer that proves an object is
/// gone; timeouts and 5xx prove nothing.
pub fn is_not_found(err: &kube::Error) -> bool {
    category(err) == ErrorCategory::NotFound
}

/// True when the API answered 409 `AlreadyExists` to a create.
pub fn is_already_exists(err: &kube::Error) -> bool {
    category(err) == ErrorCategory::AlreadyExists
}

/// True for failures expected to go away by themselves: HTTP 5xx, 429, server-side timeouts and
/// client-side transport errors (connection, TLS, request timeout).
pub fn is_transient(err: &kube::Error) -> bool {
    category(err) == ErrorCategory::Transient
}

/// Whether an API status code is a gateway/server timeout. Kept for callers that want to
/// distinguish "the outcome of the write is unknown" from "the write was refused".
pub fn is_timeout(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => {
            status.code == GATEWAY_TIMEOUT
                || status.reason == reason::TIMEOUT
                || status.reason == reason::SERVER_TIMEOUT
        }
        kube::Error::Service(source) => {
            // tower's timeout layer and hyper-util's connect timeout both surface as boxed
            // errors; look for an `Elapsed`-like message rather than depending on their types.
            let text = source.to_string().to_ascii_lowercase();
            text.contains("timed out") || text.contains("timeout") || text.contains("elapsed")
        }
        _ => false,
    }
}

/// Errors returned by the API helpers of this crate ([`crate::update_with_retry`],
/// [`crate::add_finalizer`], ...).
///
/// Every variant names the object (`resource`: the collection URL such as
/// `/api/v1/namespaces/ns/configmaps`, and `name`) so the message stands on its own in a log line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The object does not exist (404). Distinguished from every other failure because only
    /// NotFound proves an object is gone.
    #[error("{resource}/{name} was not found")]
    NotFound {
        /// Collection URL of the object.
        resource: String,
        /// Object name.
        name: String,
        /// The API error.
        #[source]
        source: Box<kube::Error>,
    },

    /// Every attempt to write the object lost a resourceVersion race; the helper re-read and
    /// re-decided each time and gave up after `attempts` writes.
    #[error(
        "gave up writing {resource}/{name}: {attempts} attempts all hit a resourceVersion conflict"
    )]
    ConflictRetriesExhausted {
        /// Collection URL of the object.
        resource: String,
        /// Object name.
        name: String,
        /// How many writes were attempted.
        attempts: u32,
        /// The last conflict.
        #[source]
        source: Box<kube::Error>,
    },

    /// The caller's decision function refused to update the object.
    #[error("update of {resource}/{name} aborted: {reason}")]
    Aborted {
        /// Collection URL of the object.
        resource: String,
        /// Object name.
        name: String,
        /// The reason given by the decision function.
        reason: String,
    },

    /// The object read from the API has no `metadata.resourceVersion`, so a write could not be
    /// made conditional on it. The helpers refuse to write unconditionally.
    #[error(
        "{resource}/{name} has no metadata.resourceVersion; refusing to write it unconditionally"
    )]
    MissingResourceVersion {
        /// Collection URL of the object.
        resource: String,
        /// Object name.
        name: String,
    },

    /// The object returned by a decision function carries a different resourceVersion than the
    /// object it was given: it was not derived from the state just read.
    #[error(
        "the new {resource}/{name} carries resourceVersion {found} but was decided from {expected}"
    )]
    ResourceVersionMismatch {
        /// Collection URL of the object.
        resource: String,
        /// Object name.
        name: String,
        /// resourceVersion of the object handed to the decision function.
        expected: String,
        /// resourceVersion found on the returned object.
        found: String,
    },

    /// Any other failed API call.
    #[error("{verb} {resource}/{name} failed ({category})")]
    Api {
        /// What was attempted: `get`, `replace`, `replace_status`, `patch`.
        verb: &'static str,
        /// Collection URL of the object.
        resource: String,
        /// Object name.
        name: String,
        /// Classification of `source`.
        category: ErrorCategory,
        /// The API error.
        #[source]
        source: Box<kube::Error>,
    },

    /// The object to write has no `metadata.name` (this is a bug in the caller).
    #[error("the object to write to {resource} has no metadata.name")]
    MissingName {
        /// Collection URL of the object.
        resource: String,
    },

    /// A list call failed.
    #[error("list {resource}?labelSelector={selector} failed ({category})")]
    List {
        /// Collection URL.
        resource: String,
        /// The label selector of the list.
        selector: String,
        /// Classification of `source`.
        category: ErrorCategory,
        /// The API error.
        #[source]
        source: Box<kube::Error>,
    },

    /// A JSON patch could not be built (this is a bug, not an API failure).
    #[error("could not build the JSON patch for {resource}/{name}")]
    BuildPatch {
        /// Collection URL of the object.
        resource: String,
        /// Object name.
        name: String,
        /// The serialization error.
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    /// Wraps a [`kube::Error`] from `verb` on `resource/name`, turning 404 into [`Error::NotFound`].
    pub fn from_kube(verb: &'static str, resource: &str, name: &str, source: kube::Error) -> Self {
        match category(&source) {
            ErrorCategory::NotFound => Self::NotFound {
                resource: resource.to_owned(),
                name: name.to_owned(),
                source: Box::new(source),
            },
            category => Self::Api {
                verb,
                resource: resource.to_owned(),
                name: name.to_owned(),
                category,
                source: Box::new(source),
            },
        }
    }

    /// The stable class of this error (see [`ErrorCategory`]).
    ///
    /// [`Error::ConflictRetriesExhausted`] is a [`ErrorCategory::Conflict`]; `Aborted`,
    /// `MissingResourceVersion`, `ResourceVersionMismatch`, `MissingName` and `BuildPatch` are
    /// [`ErrorCategory::Other`].
    pub fn category(&self) -> ErrorCategory {
        match self {
            Self::NotFound { .. } => ErrorCategory::NotFound,
            Self::ConflictRetriesExhausted { .. } => ErrorCategory::Conflict,
            Self::Api { category, .. } | Self::List { category, .. } => *category,
            Self::Aborted { .. }
            | Self::MissingName { .. }
            | Self::MissingResourceVersion { .. }
            | Self::ResourceVersionMismatch { .. }
            | Self::BuildPatch { .. } => ErrorCategory::Other,
        }
    }

    /// True only for a 404 from the API server.
    pub fn is_not_found(&self) -> bool {
        self.category() == ErrorCategory::NotFound
    }

    /// True for a resourceVersion conflict (including exhausted conflict retries).
    pub fn is_conflict(&self) -> bool {
        self.category() == ErrorCategory::Conflict
    }

    /// True for failures expected to go away by themselves (5xx, 429, timeouts, connection).
    pub fn is_transient(&self) -> bool {
        self.category() == ErrorCategory::Transient
    }

    /// The underlying [`kube::Error`], when there is one.
    pub fn kube_error(&self) -> Option<&kube::Error> {
        match self {
            Self::NotFound { source, .. }
            | Self::ConflictRetriesExhausted { source, .. }
            | Self::Api { source, .. }
            | Self::List { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    #[test]
    fn the_labels_are_the_categories_words() {
        let words: Vec<&str> = ErrorCategory::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(words, ErrorCategory::LABELS);
    }

    fn api(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(Status {
            status: None,
            code,
            message: String::new(),
            metadata: None,
            reason: reason.to_owned(),
            details: None,
        }))
    }

    #[test]
    fn classifies_api_statuses() {
        assert_eq!(category(&api(404, "NotFound")), ErrorCategory::NotFound);
        assert_eq!(category(&api(404, "")), ErrorCategory::NotFound);
        assert_eq!(category(&api(409, "Conflict")), ErrorCategory::Conflict);
        assert_eq!(category(&api(409, "")), ErrorCategory::Conflict);
        assert_eq!(
            category(&api(409, "AlreadyExists")),
            ErrorCategory::AlreadyExists
        );
        assert_eq!(category(&api(422, "Invalid")), ErrorCategory::Invalid);
        assert_eq!(category(&api(400, "BadRequest")), ErrorCategory::Invalid);
        assert_eq!(category(&api(403, "Forbidden")), ErrorCategory::Forbidden);
        assert_eq!(
            category(&api(401, "Unauthorized")),
            ErrorCategory::Forbidden
        );
        assert_eq!(
            category(&api(500, "InternalError")),
            ErrorCategory::Transient
        );
        assert_eq!(category(&api(500, "")), ErrorCategory::Transient);
        assert_eq!(
            category(&api(503, "ServiceUnavailable")),
            ErrorCategory::Transient
        );
        assert_eq!(category(&api(504, "Timeout")), ErrorCategory::Transient);
        assert_eq!(
            category(&api(429, "TooManyRequests")),
            ErrorCategory::Transient
        );
        assert_eq!(category(&api(410, "Expired")), ErrorCategory::Other);
        // A known reason wins over the code; an unknown reason falls back to the code.
        assert_eq!(category(&api(404, "Conflict")), ErrorCategory::Conflict);
        assert_eq!(category(&api(404, "Whatever")), ErrorCategory::NotFound);
        assert_eq!(category(&api(422, "")), ErrorCategory::Invalid);
    }

    #[test]
    fn helpers_agree_with_category() {
        assert!(is_conflict(&api(409, "Conflict")));
        assert!(!is_conflict(&api(409, "AlreadyExists")));
        assert!(is_already_exists(&api(409, "AlreadyExists")));
        assert!(is_not_found(&api(404, "NotFound")));
        assert!(!is_not_found(&api(500, "InternalError")));
        assert!(is_transient(&api(502, "")));
        assert!(!is_transient(&api(404, "NotFound")));
        assert!(is_timeout(&api(504, "Timeout")));
        assert!(!is_timeout(&api(500, "InternalError")));
    }

    #[test]
    fn transport_errors_are_transient() {
        let err = kube::Error::Service("connection refused".into());
        assert!(is_transient(&err));
        let err = kube::Error::Service("request timed out".into());
        assert!(is_timeout(&err));
        let err = kube::Error::SerdeError(serde_json::from_str::<u8>("x").unwrap_err());
        assert_eq!(category(&err), ErrorCategory::Other);
    }

    #[test]
    fn crate_error_wraps_not_found_distinctly() {
        let e = Error::from_kube(
            "get",
            "/api/v1/namespaces/a/configmaps",
            "x",
            api(404, "NotFound"),
        );
        assert!(e.is_not_found());
        assert!(matches!(e, Error::NotFound { .. }));
        let e = Error::from_kube("get", "/api/v1/namespaces/a/configmaps", "x", api(500, ""));
        assert!(e.is_transient());
        assert!(!e.is_not_found());
        assert_eq!(
            e.to_string(),
            "get /api/v1/namespaces/a/configmaps/x failed (transient)"
        );
    }

    #[test]
    fn labels_are_stable() {
        assert_eq!(ErrorCategory::NotFound.as_str(), "not_found");
        assert_eq!(ErrorCategory::Transient.to_string(), "transient");
        assert!(ErrorCategory::Conflict.is_retryable());
        assert!(!ErrorCategory::Invalid.is_retryable());
    }
}
