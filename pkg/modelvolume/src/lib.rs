//! The pod rewrite of model sharing: which GPU pods are in scope, which cache they read (identity,
//! layout, endpoints, sharing domain, deterministic binding name), whether an existing binding
//! may be joined or which one to create, and the reader pod itself (read-only view claim or
//! hostPath, wait-for-marker init container, offline engine env, labels and annotations). Pure:
//! no client, no runtime, no clock; the webhook is a thin shell that reads caches, creates the
//! binding and patches the pod, and `webhook preview` runs the same functions offline.
//!
//! Entry points:
//!
//! - [`admit`]: one admission start to end, with a binding lookup;
//! - [`plan`] then [`decide`]: the same in two steps, for callers that look the bindings up by
//!   [`Plan::binding_name`] (and the compile-cache set's [`cacheset::CacheSet::binding_name`])
//!   themselves;
//! - [`complete_cache_set`]: after creating a compile-cache set's binding, the pod with its UID;
//! - [`Rewrite::complete`] / [`accept_winner`]: after creating the binding, whether the stored
//!   object (the created one or an AlreadyExists winner) is this admission's, and the pod with
//!   its UID;
//! - [`Verdict::admitted`]: the pod to admit in every case; [`Skip::annotate`] records a skip.
//!
//! Every reason a pod is left alone is a [`SkipReason`] with a stable code, a message naming the
//! field, and whether it warrants an Event. `docs/model-volume.md` describes what happens to a
//! pod, every reason, and the decisions taken where the references are silent.
//!
//! Idempotent: a pod that carries this namespace's rewrite is [`Verdict::Unchanged`]; a pod
//! that records a skip gets the same skip again, so `admitted(admitted(p)) == admitted(p)`.

mod admit;
mod binding;
mod handle;
mod identify;
pub mod keys;
mod options;
mod plan;
mod rewrite;
mod safety;
mod scope;
mod skip;
mod step;
mod words;

pub use admit::{
    BindingAction, POD_SECURITY_ENFORCE_LABEL, Rewrite, StorageInputs, Unchanged, Verdict, admit,
    admit_at, complete_cache_set, decide,
};
pub use binding::{accept_winner, check_joinable, desired_binding};
pub use handle::{CacheHandle, Layout, is_capture_handle};
pub use identify::leader_worker_set_name;
pub use options::{
    DEFAULT_GPU_RESOURCE, DEFAULT_NON_ROOT_USER, DEFAULT_POLL_SECONDS,
    DEFAULT_WAIT_DEADLINE_SECONDS, Options, OptionsError, ReaderMode,
};
pub use plan::{Capture, OFFLINE_ENV, Plan, Request, plan, well_formed_traceparent};
pub use scope::{SharingDomain, gpu_container, sharing_domain};
pub use skip::{MAX_MESSAGE_BYTES, Skip, SkipReason};
pub use step::{DownloadStep, MAX_DOWNLOAD_STEP_BYTES, PodEnvRef, StepOrigin};

/// The wait script the wait container runs (for tests and documentation).
pub fn wait_script() -> String {
    rewrite::wait_script()
}

pub mod agent;
pub mod cacheset;
pub mod capture;
pub mod drift;
pub mod encryption;
pub mod lease;
pub mod lifecycle;
pub mod open_root;
pub mod reading;
pub mod reaper;
#[cfg(test)]
mod testing;
pub mod view;
pub mod volume_keys;
pub mod writer;

pub use lifecycle::{
    Action, EncryptionObserved, LifecycleConfig, Observed, Reason, Step, StepSource,
    WantedCondition,
};
pub use view::{
    ViewError, read_only_view, reader_view, view_mount_options, view_size, writer_view,
};
pub use writer::{WriterError, WriterOptions, writer_job, writer_script};
