//! The refusal type of validation and the errors of rendering and parsing.

use std::fmt;

/// What kind of problem a [`FieldError`] reports, in the Kubernetes vocabulary (it becomes the
/// `reason` of a status cause).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldErrorKind {
    /// The value is not acceptable.
    Invalid,
    /// A value is missing.
    Required,
    /// The value may not be set (here, or in combination with another field).
    Forbidden,
    /// The value is not one of the supported ones.
    NotSupported,
    /// The value repeats an earlier one.
    Duplicate,
    /// The list has too many items, or the string too many characters.
    TooMany,
}

impl FieldErrorKind {
    /// The Kubernetes cause type (`FieldValueInvalid`, ...).
    pub fn cause_type(self) -> &'static str {
        match self {
            Self::Invalid => "FieldValueInvalid",
            Self::Required => "FieldValueRequired",
            Self::Forbidden => "FieldValueForbidden",
            Self::NotSupported => "FieldValueNotSupported",
            Self::Duplicate => "FieldValueDuplicate",
            Self::TooMany => "FieldValueTooMany",
        }
    }
}

/// One refusal: the field path (`spec.connection.managed.members[0].localDisks[0].path`) and
/// why, in words meant for whoever wrote the object.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FieldError {
    /// Path of the refused field, from the object's root.
    pub path: String,
    /// What kind of problem it is.
    pub kind: FieldErrorKind,
    /// Why the value is refused.
    pub reason: String,
}

impl FieldError {
    /// A refusal of `kind` at `path`.
    pub fn new(path: impl Into<String>, kind: FieldErrorKind, reason: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            kind,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}

/// Why a backend could not be rendered. [`crate::validate()`] refuses every backend that would
/// hit one of these, so an admitted backend always renders.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The backend is external: the operator runs nothing for it.
    #[error("the backend is external: the operator renders no workloads for it")]
    External,
    /// The backend has neither branch, or both.
    #[error("spec.connection must set exactly one of managed or external")]
    Connection,
    /// `metadata.name` is missing.
    #[error("metadata.name is missing")]
    NoName,
    /// No image: neither the backend nor the group nor the default names one.
    #[error("{path}: no image is named here, and no default image is configured")]
    NoImage {
        /// Field that should have named it.
        path: String,
    },
    /// A quantity could not be read.
    #[error("{path}: {source}")]
    Quantity {
        /// Field holding the quantity.
        path: String,
        /// Why it could not be read.
        source: crate::quantity::QuantityError,
    },
    /// A quantity does not fit in a signed 64-bit number of bytes.
    #[error("{path}: {value} does not fit in 2^63-1 bytes")]
    TooLarge {
        /// Field holding the quantity.
        path: String,
        /// The quantity as written.
        value: String,
    },
    /// The pod template could not be serialized for its hash.
    #[error("cannot serialize the pod template of {name} for its hash: {message}")]
    Hash {
        /// DaemonSet name.
        name: String,
        /// serde_json's message.
        message: String,
    },
}

/// Why a YAML or JSON text is not a `KVCacheBackend` at all (the offline command exits 2).
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// The text is not YAML.
    #[error("not YAML: {0}")]
    Yaml(String),
    /// The text holds no document, or more than one.
    #[error("expected exactly one YAML document, found {0}")]
    Documents(usize),
    /// The document is not a mapping.
    #[error("the document is not a mapping (an object with apiVersion, kind, metadata and spec)")]
    NotAnObject,
    /// The document is not a `worker.gpustack.ai/v1alpha1` `KVCacheBackend`.
    #[error("the document is {found}, not a worker.gpustack.ai/v1alpha1 KVCacheBackend")]
    WrongKind {
        /// `apiVersion` and `kind` as found.
        found: String,
    },
}

/// The stored object of an update does not fit the API, so an update that changes its `spec`
/// cannot be judged (see [`crate::validate_values`]). Each problem carries its field path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the stored object does not fit the API: {}", join(.0))]
pub struct StoredObjectError(pub Vec<FieldError>);

fn join(errors: &[FieldError]) -> String {
    let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    lines.join("; ")
}
