//! What resolution answers: a [`Resolution`] (identity, source, downloader, landing) or the
//! reason the pod downloads nothing we can share ([`Unresolved`]).

use std::fmt;

use serde::Serialize;
use serde_json::Value;
use warmcache_cli::text::{bounded, shown};

use crate::identity::{Identity, Scheme};
use crate::landing::Landing;
use crate::limits::MAX_REASON_BYTES;

/// The rule that recognised the artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// An init container with `NGC_MODEL_NAME` in its env.
    InitNgcEnv,
    /// An init container running `ngc registry model download-version`.
    InitNgcCli,
    /// An init container running `hf download` / `huggingface-cli download`.
    InitHfDownload,
    /// An init container running `aws s3 sync|cp` or `s5cmd cp|sync`.
    InitS3,
    /// An init container running `gsutil cp|rsync` or `gcloud storage cp|rsync`.
    InitGs,
    /// A KServe storage-initializer init container.
    KServeStorageInitializer,
    /// The main container's `NGC_MODEL_NAME` (its own script downloads from NGC).
    EnvNgcModelName,
    /// `--model`, `--model-path` or `--model-id` on the main container.
    ModelFlag,
    /// The positional model of `vllm serve <model>`.
    VllmServe,
    /// The main container's `HF_MODEL_ID`.
    EnvHfModelId,
    /// The main container's `MODEL_ID`.
    EnvModelId,
    /// The main container's `MODEL_PATH`.
    EnvModelPath,
    /// A NIM image's `NIM_MODEL_NAME`.
    EnvNimModelName,
    /// A NIM image (and its `NIM_MODEL_PROFILE`).
    NimImage,
}

impl Source {
    /// The label reported in `source`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Source::InitNgcEnv => "init env NGC_MODEL_NAME",
            Source::InitNgcCli => "init ngc registry model download-version",
            Source::InitHfDownload => "init huggingface-cli download",
            Source::InitS3 => "init s3",
            Source::InitGs => "init gs",
            Source::KServeStorageInitializer => "kserve storage-initializer",
            Source::EnvNgcModelName => "env NGC_MODEL_NAME",
            Source::ModelFlag => "--model",
            Source::VllmServe => "vllm serve <model>",
            Source::EnvHfModelId => "env HF_MODEL_ID",
            Source::EnvModelId => "env MODEL_ID",
            Source::EnvModelPath => "env MODEL_PATH",
            Source::EnvNimModelName => "env NIM_MODEL_NAME",
            Source::NimImage => "nim image",
        }
    }
}

/// Who downloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Downloader {
    /// An init container, before the engine starts.
    Init,
    /// The main container itself (the engine or its start script).
    Engine,
}

impl Downloader {
    /// `init` or `engine`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Downloader::Init => "init",
            Downloader::Engine => "engine",
        }
    }
}

/// A recognised artifact and where it lands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    /// The artifact.
    pub identity: Identity,
    /// The rule that found it.
    pub source: Source,
    /// Found on the pod's LeaderWorkerSet leader template (the pod is a worker).
    pub via_leader: bool,
    /// Who downloads.
    pub downloader: Downloader,
    /// The downloading init container's name (init downloads only).
    pub init_container: Option<String>,
    /// Index of that init container in the pod that was resolved (the leader template's pod when
    /// `via_leader`).
    pub init_index: Option<usize>,
    /// Index of the main container in this pod.
    pub main_index: usize,
    /// Where the bytes land in the main container.
    pub landing: Landing,
}

impl Resolution {
    /// The `source` label, prefixed with `lws leader template: ` for workers.
    pub fn source_label(&self) -> String {
        if self.via_leader {
            format!("lws leader template: {}", self.source.as_str())
        } else {
            self.source.as_str().to_owned()
        }
    }

    /// Whether the webhook may share this artifact: it is downloaded (not a local `path`) and its
    /// landing is substitutable.
    pub fn shareable(&self) -> bool {
        self.identity.scheme() != Scheme::Path && self.landing.substitutable
    }
}

/// Why a pod is not resolved. Each reason names the field it comes from where there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unresolved {
    /// The pod carries the opt-out annotation.
    OptedOut {
        /// The annotation key.
        annotation: &'static str,
    },
    /// The pod has no containers (or no container at the requested index).
    NoContainers,
    /// Nothing in the pod downloads a model this resolver recognises.
    NoDownloader,
    /// A KServe storage-initializer reads a `pvc://` URI: the customer already shares a volume.
    PvcStorageUri {
        /// Field path.
        field: String,
        /// The URI.
        uri: String,
    },
    /// A download from a source that has no identity scheme (http, azure, hdfs, datasets, ...).
    UnsupportedSource {
        /// Field path.
        field: String,
        /// The value.
        value: String,
        /// Why.
        why: String,
    },
    /// A value that decides the identity or the landing is not known at admission.
    UnknownValue {
        /// Field path.
        field: String,
        /// What is unknown.
        what: String,
    },
    /// The download fetches only part of the artifact (file filters or named files).
    PartialDownload {
        /// Field path.
        field: String,
        /// What restricts it.
        what: String,
    },
    /// Several different downloads; one shared copy cannot stand in for all of them.
    MultipleDownloads {
        /// The first.
        first: String,
        /// The other one.
        other: String,
    },
    /// A value that should name an artifact is malformed.
    InvalidReference {
        /// Field path.
        field: String,
        /// The value.
        value: String,
        /// Why.
        why: String,
    },
    /// The download reads from a custom endpoint (a mirror, MinIO, another S3-compatible store):
    /// the identity names the artifact, not the store, so two stores would share one copy.
    CustomEndpoint {
        /// Field path of the endpoint setting.
        field: String,
        /// The endpoint; `None` when it is not set literally.
        endpoint: Option<String>,
    },
    /// The landing cannot be placed in the main container.
    LandingUnknown {
        /// Field path.
        field: String,
        /// Why.
        why: String,
    },
    /// The pod is a LeaderWorkerSet worker and the leader template did not resolve.
    LeaderUnresolved {
        /// The LeaderWorkerSet.
        leader_worker_set: String,
        /// The leader template's reason.
        reason: Box<Unresolved>,
    },
}

impl Unresolved {
    /// A stable short code for the reason (metrics labels, annotations, tests).
    pub fn code(&self) -> &'static str {
        match self {
            Unresolved::OptedOut { .. } => "opted-out",
            Unresolved::NoContainers => "no-containers",
            Unresolved::NoDownloader => "no-downloader",
            Unresolved::PvcStorageUri { .. } => "pvc-storage-uri",
            Unresolved::UnsupportedSource { .. } => "unsupported-source",
            Unresolved::UnknownValue { .. } => "unknown-value",
            Unresolved::PartialDownload { .. } => "partial-download",
            Unresolved::MultipleDownloads { .. } => "multiple-downloads",
            Unresolved::InvalidReference { .. } => "invalid-reference",
            Unresolved::CustomEndpoint { .. } => "custom-endpoint",
            Unresolved::LandingUnknown { .. } => "landing-unknown",
            Unresolved::LeaderUnresolved { .. } => "leader-unresolved",
        }
    }
}

impl Unresolved {
    /// The reason, unbounded: values are already cut by `shown`, nested reasons are not.
    fn write_reason(&self, f: &mut String) -> fmt::Result {
        use fmt::Write as _;
        match self {
            Unresolved::OptedOut { annotation } => {
                write!(f, "metadata.annotations[{annotation}]: the pod opted out of model sharing")
            }
            Unresolved::NoContainers => f.write_str("spec.containers: the pod has no main container"),
            Unresolved::NoDownloader => f.write_str(
                "no init container downloads a recognised artifact and the main container names no model to download",
            ),
            Unresolved::PvcStorageUri { field, uri } => write!(
                f,
                "{field}: storage URI {} reads a customer PersistentVolumeClaim, which is already shared",
                shown(uri)
            ),
            Unresolved::UnsupportedSource { field, value, why } => {
                write!(f, "{field}: {} is not a shareable source: {why}", shown(value))
            }
            Unresolved::UnknownValue { field, what } => write!(f, "{field}: {what}"),
            Unresolved::PartialDownload { field, what } => write!(
                f,
                "{field}: {what}; a shared copy holds whole artifacts only"
            ),
            Unresolved::MultipleDownloads { first, other } => write!(
                f,
                "the pod downloads more than one artifact ({first}; {other}); one shared copy cannot replace them"
            ),
            Unresolved::InvalidReference { field, value, why } => {
                write!(f, "{field}: {} does not name an artifact: {why}", shown(value))
            }
            Unresolved::CustomEndpoint { field, endpoint } => {
                match endpoint {
                    Some(e) => write!(f, "{field}: the download uses the custom endpoint {}", shown(e))?,
                    None => write!(
                        f,
                        "{field}: the download endpoint is not set literally and may be a custom store"
                    )?,
                }
                f.write_str(
                    "; the identity would not say which store the bytes come from, so the pod is left alone",
                )
            }
            Unresolved::LandingUnknown { field, why } => write!(f, "{field}: {why}"),
            Unresolved::LeaderUnresolved {
                leader_worker_set,
                reason,
            } => {
                write!(
                    f,
                    "worker of LeaderWorkerSet {} names no model and its leader template does not resolve: ",
                    shown(leader_worker_set)
                )?;
                reason.write_reason(f)
            }
        }
    }
}

/// At most [`MAX_REASON_BYTES`]: values quoted from the pod are cut and escaped, and a reason that
/// nests others (several downloads, a leader's reason) is cut with a note of its full length.
impl fmt::Display for Unresolved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = String::new();
        self.write_reason(&mut text)?;
        f.write_str(&bounded(&text, MAX_REASON_BYTES))
    }
}

/// The answer of a resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The pod downloads this artifact.
    Resolved(Resolution),
    /// It does not (or not in a way that can be shared).
    Unresolved(Unresolved),
}

impl Outcome {
    /// The resolution, if any.
    pub fn resolution(&self) -> Option<&Resolution> {
        match self {
            Outcome::Resolved(r) => Some(r),
            Outcome::Unresolved(_) => None,
        }
    }

    /// The report `webhook identify` prints, as a JSON value:
    /// `{"uri", "source", "downloader", "initContainer", "landing": {"path", "volume", "kind",
    /// "substitutable"[, "nested"]}}`, or `{"uri": null, "reason": "..."}`. `landing.nested` is
    /// present only when a volume mounted below the landing blocks substitution.
    ///
    /// # Errors
    ///
    /// A serialization error from `serde_json` (not expected for these plain structs; returned
    /// rather than hidden).
    pub fn report(&self) -> Result<Value, serde_json::Error> {
        serde_json::to_value(self.ordered_report())
    }

    /// The same report as pretty-printed JSON text, keys in the documented order.
    ///
    /// # Errors
    ///
    /// As [`Outcome::report`].
    pub fn report_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(&self.ordered_report())
    }

    fn ordered_report(&self) -> Report<'_> {
        match self {
            Outcome::Resolved(r) => Report::Resolved {
                uri: r.identity.uri(),
                source: r.source_label(),
                downloader: r.downloader.as_str(),
                init_container: r.init_container.as_deref(),
                landing: LandingReport {
                    path: &r.landing.path,
                    volume: r.landing.volume.as_deref(),
                    kind: r.landing.kind.as_str(),
                    substitutable: r.landing.substitutable,
                    nested: r.landing.nested.as_deref(),
                },
            },
            Outcome::Unresolved(u) => Report::Unresolved {
                uri: (),
                reason: u.to_string(),
            },
        }
    }
}

#[derive(Serialize)]
#[serde(untagged)]
enum Report<'a> {
    Resolved {
        uri: String,
        source: String,
        downloader: &'static str,
        #[serde(rename = "initContainer")]
        init_container: Option<&'a str>,
        landing: LandingReport<'a>,
    },
    Unresolved {
        uri: (),
        reason: String,
    },
}

#[derive(Serialize)]
struct LandingReport<'a> {
    path: &'a str,
    volume: Option<&'a str>,
    kind: &'static str,
    substitutable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    nested: Option<&'a str>,
}

/// `{"uri": null, "reason": reason}` as pretty-printed JSON text, for answers that are not an
/// [`Outcome`] (a LeaderWorkerSet worker whose group is missing).
///
/// # Errors
///
/// As [`Outcome::report`].
pub fn unresolved_report(reason: &str) -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(&Report::Unresolved {
        uri: (),
        reason: reason.to_owned(),
    })
}
