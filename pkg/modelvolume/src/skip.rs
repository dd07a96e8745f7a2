//! Why a pod was left alone: a closed set of reasons with stable codes (annotation values, metric
//! labels, tests), a message naming the field it comes from, and whether it warrants an Event.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use warmcache_api_modelcache::STORAGE_SELECTION_ANNOTATION;
use warmcache_api_modelcache::selection::Selection;
use warmcache_cli::text::bounded;

use crate::keys::{SKIP_MESSAGE_ANNOTATION, SKIP_REASON_ANNOTATION};

/// Longest skip message kept (an Event message is at most 1 KiB).
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// Every reason a pod is left alone. [`SkipReason::ALL`] lists them in documentation order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SkipReason {
    // --- scope: the pod is not ours to consider (no annotation, no Event) ---
    /// No container requests a configured GPU resource.
    NotGpuPod,
    /// `kube-system`, the webhook's namespace or the control namespace.
    NamespaceExcluded,
    /// The namespace carries the opt-out label.
    NamespaceOptedOut,
    /// The pod carries the opt-out label or annotation.
    PodOptedOut,
    /// A pod warmcache itself runs (download Job, mount holder).
    OwnPod,
    /// A Windows pod (`spec.os.name: windows`): the added containers are Linux containers.
    WindowsPod,
    // --- what the pod downloads ---
    /// Nothing recognised downloads a model.
    NoDownloader,
    /// KServe `pvc://`: the customer's claim already holds the model.
    PvcStorageUri,
    /// The model is a path already in the pod (`path://`): nothing is downloaded.
    LocalPath,
    /// The landing is storage the customer shares already (their claim, a hostPath, an image or
    /// CSI volume) or the pod mounts another volume below it.
    LandingNotSubstitutable,
    /// A download from a source without an identity scheme.
    UnsupportedSource,
    /// A value deciding the identity is not known at admission.
    UnknownValue,
    /// Only part of an artifact is downloaded.
    PartialDownload,
    /// Several different artifacts are downloaded by init containers.
    MultipleDownloads,
    /// A value that should name an artifact is malformed.
    InvalidReference,
    /// The download endpoint is not set literally, so it cannot be part of the identity.
    CustomEndpoint,
    /// The landing cannot be placed in the main container.
    LandingUnknown,
    /// A LeaderWorkerSet worker whose leader template does not resolve.
    LeaderUnresolved,
    /// A LeaderWorkerSet worker whose LeaderWorkerSet was not found.
    LeaderWorkerSetMissing,
    /// The LeaderWorkerSet supplied is not the pod's.
    LeaderWorkerSetMismatch,
    // --- safety with real charts ---
    /// The landing is also written by something else (a scratch directory, another variable, a
    /// home directory, another container) and cannot be moved.
    LandingShared,
    /// The engine fetches another repository (tokenizer, draft model, adapter, revision) into
    /// the cache the shared copy would occupy.
    MultipleRepositories,
    /// A NIM without `NIM_MODEL_PROFILE`: the profile it picks depends on the GPU.
    NimProfileUnpinned,
    /// The engine's own script sets or references a cache variable the rewrite must set.
    EngineEnvConflict,
    /// The engine downloads something a writer Job cannot reproduce.
    DownloadNotReproducible,
    /// The download step holds a literal secret (token, key) that would have to be copied.
    SecretInDownloadStep,
    /// The pod already has a volume or container named like the ones the rewrite adds.
    NameConflict,
    /// The pod carries the rewrite of another sharing domain (a copied spec).
    RewrittenElsewhere,
    // --- storage ---
    /// Model caching is off (feature gate).
    CachingDisabled,
    /// No qualified durable storage for this workflow (StorageClass, catalog entry, flow,
    /// encryption).
    NoDurableStorage,
    /// The storage inputs cannot be decided on (broken catalog ConfigMap, wrong objects).
    StorageDecisionFailed,
    // --- the binding ---
    /// The binding is Retiring: it is never joined again.
    BindingRetiring,
    /// The binding is being deleted.
    BindingDeleting,
    /// A binding of this name exists with another identity or spec, or without warmcache's
    /// finalizer.
    BindingConflict,
    /// The binding's download failed; readers use their own download until it is retried.
    DownloadFailed,
    /// The binding could not be created or read back at the API server within the admission's
    /// time (the webhook never waits longer): the pod downloads on its own, the next pod of the
    /// model tries again.
    BindingUnavailable,
}

impl SkipReason {
    /// Every reason, in documentation order.
    pub const ALL: [SkipReason; 36] = [
        SkipReason::NotGpuPod,
        SkipReason::NamespaceExcluded,
        SkipReason::NamespaceOptedOut,
        SkipReason::PodOptedOut,
        SkipReason::OwnPod,
        SkipReason::WindowsPod,
        SkipReason::NoDownloader,
        SkipReason::PvcStorageUri,
        SkipReason::LocalPath,
        SkipReason::LandingNotSubstitutable,
        SkipReason::UnsupportedSource,
        SkipReason::UnknownValue,
        SkipReason::PartialDownload,
        SkipReason::MultipleDownloads,
        SkipReason::InvalidReference,
        SkipReason::CustomEndpoint,
        SkipReason::LandingUnknown,
        SkipReason::LeaderUnresolved,
        SkipReason::LeaderWorkerSetMissing,
        SkipReason::LeaderWorkerSetMismatch,
        SkipReason::LandingShared,
        SkipReason::MultipleRepositories,
        SkipReason::NimProfileUnpinned,
        SkipReason::EngineEnvConflict,
        SkipReason::DownloadNotReproducible,
        SkipReason::SecretInDownloadStep,
        SkipReason::NameConflict,
        SkipReason::RewrittenElsewhere,
        SkipReason::CachingDisabled,
        SkipReason::NoDurableStorage,
        SkipReason::StorageDecisionFailed,
        SkipReason::BindingRetiring,
        SkipReason::BindingDeleting,
        SkipReason::BindingConflict,
        SkipReason::DownloadFailed,
        SkipReason::BindingUnavailable,
    ];

    /// The stable kebab-case code (the skip-reason annotation, the metric label).
    pub const fn code(self) -> &'static str {
        match self {
            SkipReason::NotGpuPod => "not-a-gpu-pod",
            SkipReason::NamespaceExcluded => "namespace-excluded",
            SkipReason::NamespaceOptedOut => "namespace-opted-out",
            SkipReason::PodOptedOut => "pod-opted-out",
            SkipReason::OwnPod => "own-pod",
            SkipReason::WindowsPod => "windows-pod",
            SkipReason::NoDownloader => "no-downloader",
            SkipReason::PvcStorageUri => "pvc-storage-uri",
            SkipReason::LocalPath => "local-path",
            SkipReason::LandingNotSubstitutable => "landing-not-substitutable",
            SkipReason::UnsupportedSource => "unsupported-source",
            SkipReason::UnknownValue => "unknown-value",
            SkipReason::PartialDownload => "partial-download",
            SkipReason::MultipleDownloads => "multiple-downloads",
            SkipReason::InvalidReference => "invalid-reference",
            SkipReason::CustomEndpoint => "custom-endpoint",
            SkipReason::LandingUnknown => "landing-unknown",
            SkipReason::LeaderUnresolved => "leader-unresolved",
            SkipReason::LeaderWorkerSetMissing => "leader-worker-set-missing",
            SkipReason::LeaderWorkerSetMismatch => "leader-worker-set-mismatch",
            SkipReason::LandingShared => "landing-shared",
            SkipReason::MultipleRepositories => "multiple-repositories",
            SkipReason::NimProfileUnpinned => "nim-profile-unpinned",
            SkipReason::EngineEnvConflict => "engine-env-conflict",
            SkipReason::DownloadNotReproducible => "download-not-reproducible",
            SkipReason::SecretInDownloadStep => "secret-in-download-step",
            SkipReason::NameConflict => "name-conflict",
            SkipReason::RewrittenElsewhere => "rewritten-elsewhere",
            SkipReason::CachingDisabled => "caching-disabled",
            SkipReason::NoDurableStorage => "no-durable-storage",
            SkipReason::StorageDecisionFailed => "storage-decision-failed",
            SkipReason::BindingRetiring => "binding-retiring",
            SkipReason::BindingDeleting => "binding-deleting",
            SkipReason::BindingConflict => "binding-conflict",
            SkipReason::DownloadFailed => "download-failed",
            SkipReason::BindingUnavailable => "binding-unavailable",
        }
    }

    /// The reason with this code.
    pub fn from_code(code: &str) -> Option<SkipReason> {
        SkipReason::ALL.into_iter().find(|r| r.code() == code)
    }

    /// The UpperCamelCase reason of the Warning Event (the code's words capitalised:
    /// `no-durable-storage` -> `NoDurableStorage`).
    pub fn event_reason(self) -> String {
        self.code()
            .split('-')
            .map(|w| {
                let mut c = w.chars();
                c.next().map_or_else(String::new, |first| {
                    first.to_ascii_uppercase().to_string() + c.as_str()
                })
            })
            .collect()
    }

    /// Whether the pod is in scope at all: scope reasons leave the pod untouched (no
    /// annotation); every other reason records itself on the pod.
    pub const fn in_scope(self) -> bool {
        !matches!(
            self,
            SkipReason::NotGpuPod
                | SkipReason::NamespaceExcluded
                | SkipReason::NamespaceOptedOut
                | SkipReason::PodOptedOut
                | SkipReason::OwnPod
                | SkipReason::WindowsPod
        )
    }

    /// Whether a Warning Event goes on the pod: a model download was recognised but could not
    /// be served from the cache (no durable storage, a retiring or conflicting binding, a
    /// missing LeaderWorkerSet, a failed download, or a case where substituting would be
    /// unsafe). Pods that download nothing, opted out, share their own storage or were turned
    /// off by an administrator get none.
    pub const fn warrants_event(self) -> bool {
        !matches!(
            self,
            SkipReason::NotGpuPod
                | SkipReason::NamespaceExcluded
                | SkipReason::NamespaceOptedOut
                | SkipReason::PodOptedOut
                | SkipReason::OwnPod
                | SkipReason::WindowsPod
                | SkipReason::NoDownloader
                | SkipReason::PvcStorageUri
                | SkipReason::LocalPath
                | SkipReason::LandingNotSubstitutable
                | SkipReason::CachingDisabled
        )
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// A pod left alone: the reason and a message a person can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip {
    /// Why.
    pub reason: SkipReason,
    /// In words, with the field it comes from; at most [`MAX_MESSAGE_BYTES`].
    pub message: String,
    /// The model URI, when one was recognised.
    pub uri: Option<String>,
    /// The storage selection the pod records (the mode it runs in: `none` or `ephemeral`),
    /// when the admission got as far as the storage decision.
    pub selection: Option<Box<Selection>>,
}

impl Skip {
    /// A skip with `message` (bounded to [`MAX_MESSAGE_BYTES`]).
    pub fn new(reason: SkipReason, message: impl Into<String>) -> Skip {
        Skip {
            reason,
            message: bounded(&message.into(), MAX_MESSAGE_BYTES),
            uri: None,
            selection: None,
        }
    }

    /// The same skip, naming the model it concerns.
    #[must_use]
    pub fn with_uri(mut self, uri: impl Into<String>) -> Skip {
        self.uri = Some(uri.into());
        self
    }

    /// The same skip, recording the storage selection the pod runs with.
    #[must_use]
    pub fn with_selection(mut self, selection: Selection) -> Skip {
        self.selection = Some(Box::new(selection));
        self
    }

    /// The annotations the pod records: reason code and message, and the storage selection
    /// when there is one; none for scope reasons.
    pub fn annotations(&self) -> BTreeMap<String, String> {
        if !self.reason.in_scope() {
            return BTreeMap::new();
        }
        let mut out = BTreeMap::from([
            (
                SKIP_REASON_ANNOTATION.to_owned(),
                self.reason.code().to_owned(),
            ),
            (SKIP_MESSAGE_ANNOTATION.to_owned(), self.message.clone()),
        ]);
        if let Some(selection) = &self.selection {
            out.insert(
                STORAGE_SELECTION_ANNOTATION.to_owned(),
                selection.to_annotation(),
            );
        }
        out
    }

    /// `pod` with [`Skip::annotations`] recorded, or `None` when the skip changes nothing (a
    /// scope reason, or the pod already records exactly this skip).
    pub fn annotate(&self, pod: &Pod) -> Option<Pod> {
        let wanted = self.annotations();
        if wanted.is_empty() {
            return None;
        }
        let current = pod.metadata.annotations.as_ref();
        if wanted
            .iter()
            .all(|(k, v)| current.and_then(|a| a.get(k)) == Some(v))
        {
            return None;
        }
        let mut out = pod.clone();
        out.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(wanted);
        Some(out)
    }

    /// The JSON report: `{"reason", "message", "event", "uri", "selection"}` (`uri` and
    /// `selection` null when none).
    pub fn report(&self) -> Value {
        json!({
            "reason": self.reason.code(),
            "message": self.message,
            "event": self.reason.warrants_event(),
            "uri": self.uri,
            "selection": self.selection,
        })
    }
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason.code(), self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_kebab_case_and_round_trip() {
        let mut seen = std::collections::BTreeSet::new();
        for r in SkipReason::ALL {
            let code = r.code();
            assert!(seen.insert(code), "{code} twice");
            assert!(
                code.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'),
                "{code}"
            );
            assert_eq!(SkipReason::from_code(code), Some(r));
            assert!(code.len() <= 63, "a label value: {code}");
        }
        assert_eq!(SkipReason::from_code("nope"), None);
    }

    #[test]
    fn event_reasons_are_camel_case() {
        assert_eq!(
            SkipReason::NoDurableStorage.event_reason(),
            "NoDurableStorage"
        );
        assert_eq!(SkipReason::NotGpuPod.event_reason(), "NotAGpuPod");
        for r in SkipReason::ALL {
            let e = r.event_reason();
            assert!(
                e.chars().next().is_some_and(|c| c.is_ascii_uppercase()),
                "{e}"
            );
            assert!(e.chars().all(|c| c.is_ascii_alphanumeric()), "{e}");
        }
    }

    #[test]
    fn scope_reasons_record_nothing_and_raise_no_event() {
        for r in SkipReason::ALL {
            if !r.in_scope() {
                assert!(!r.warrants_event(), "{r}");
                let s = Skip::new(r, "m");
                assert!(s.annotations().is_empty());
                assert_eq!(s.annotate(&Pod::default()), None);
            } else {
                let s = Skip::new(r, "m");
                let pod = s.annotate(&Pod::default()).expect("annotated");
                let a = pod.metadata.annotations.expect("annotations");
                assert_eq!(a[SKIP_REASON_ANNOTATION], r.code());
                assert_eq!(a[SKIP_MESSAGE_ANNOTATION], "m");
                // Recording the same skip again changes nothing.
                assert_eq!(
                    s.annotate(&Pod {
                        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                            annotations: Some(a),
                            ..Default::default()
                        },
                        ..Default::default()
                    }),
                    None
                );
            }
        }
    }

    #[test]
    fn the_issue_event_list_raises_events() {
        for r in [
            SkipReason::NoDurableStorage,
            SkipReason::BindingRetiring,
            SkipReason::LeaderWorkerSetMissing,
            SkipReason::BindingConflict,
            SkipReason::DownloadFailed,
            SkipReason::LandingShared,
            SkipReason::MultipleRepositories,
            SkipReason::NimProfileUnpinned,
        ] {
            assert!(r.warrants_event(), "{r}");
        }
    }

    #[test]
    fn messages_are_bounded() {
        let s = Skip::new(SkipReason::UnknownValue, "x".repeat(10_000));
        assert!(
            s.message.len() <= MAX_MESSAGE_BYTES + 64,
            "{}",
            s.message.len()
        );
        let r = s.with_uri("hf://a/b").report();
        assert_eq!(r["reason"], "unknown-value");
        assert_eq!(r["event"], true);
        assert_eq!(r["uri"], "hf://a/b");
    }
}
