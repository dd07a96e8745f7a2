//! Model identity and landing resolution: which artifact an unmodified pod downloads (as one URI
//! shared by every chart that names it), who downloads it, and where the bytes land. Pure: no
//! client, no runtime, no I/O.
//!
//! Entry points: [`resolve`] (a pod), [`resolve_with_group`] (a pod that may be a LeaderWorkerSet
//! worker; the caller supplies the LeaderWorkerSet), [`Identity`] (parse/render model URIs) and
//! [`pod_from_object`] (the pod a workload object creates). The rules, in order, and every form
//! they recognise are documented in `docs/model-identity.md`.
//!
//! # Bounds
//!
//! Resolution runs in the admission path of every pod, so it is bounded in time and memory for
//! any input: its cost grows with the size of the pod (at most `n log n`), never with what the
//! pod's values describe. Every expansion is metered: Kubernetes `$(VAR)` references in `env`,
//! `command` and `args`; `$VAR`/`${VAR}` in scripts; the working directory built by relative
//! `cd`; environment changes made visible to commands; commands read from nested scripts.
//!
//! | bound | value | what it limits |
//! |---|---|---|
//! | [`MAX_VALUE_BYTES`] | 1 MiB | one value after expansion (an env value, an argument, a word) |
//! | [`MAX_EXPANSION_BYTES`] | 4 MiB | all bytes inserted by expansions in one pod |
//! | [`MAX_SHELL_DEPTH`] | 4 | `sh -c` nesting followed |
//! | [`MAX_EXPORTS`] | 256 | environment changes visible to the commands of one container |
//! | [`MAX_COMMANDS`] | 10 000 | commands read from the scripts of one pod |
//! | [`MAX_PATH_BYTES`] | 4096 | a destination path (Linux `PATH_MAX`) |
//! | [`MAX_REASON_BYTES`] | 2048 | one reason; quoted values are cut by `warmcache_cli::text::shown` |
//!
//! A value past a bound is never truncated and trusted: it is unknown, and the container whose
//! reading hit the bound leaves the pod alone with [`Unresolved::UnknownValue`], whose reason
//! names the field (`spec.containers[0].env[20]`, `spec.initContainers[0].command`) and the
//! bound. A destination longer than [`MAX_PATH_BYTES`] is [`Unresolved::LandingUnknown`]; an
//! identity reference longer than 4096 bytes (revision or profile longer than 1024) is invalid.
//! Commands share the exports made before them instead of copying them, variables are looked up
//! in ordered maps, volumes are indexed by name, and scripts are read one token at a time.

mod argv;
mod env;
mod identity;
mod landing;
mod limits;
mod lws;
mod outcome;
pub mod paths;
mod recognise;
mod resolve;
mod shell;
mod workload;

pub use identity::{Identity, IdentityError, Scheme};
pub use landing::{
    DEFAULT_HF_HOME, DEFAULT_MOUNT_ROOT, DEFAULT_NIM_CACHE_PATH, Landing, LandingKind,
    RELANDED_HF_HOME, landing_in, volume_kind,
};
pub use limits::{
    MAX_COMMANDS, MAX_EXPANSION_BYTES, MAX_EXPORTS, MAX_PATH_BYTES, MAX_REASON_BYTES,
    MAX_SHELL_DEPTH, MAX_VALUE_BYTES,
};
pub use lws::{
    GroupError, LWS_API_VERSION, LWS_KIND, LWS_NAME_LABEL, LWS_WORKER_INDEX_LABEL, LeaderWorkerSet,
    LeaderWorkerSetSpec, LeaderWorkerTemplate,
};
pub use outcome::{Downloader, Outcome, Resolution, Source, Unresolved, unresolved_report};
pub use resolve::{
    main_container_index, opted_out, resolve, resolve_container, resolve_with_group,
};
pub use workload::{WorkloadError, decode, lws_from_object, pod_from_object};

/// Pod annotation that keeps a pod out of model sharing: with the value `"true"`, resolution
/// answers [`Unresolved::OptedOut`] and the webhook leaves the pod as it is. Set it on the pod
/// template (Deployment, StatefulSet, LeaderWorkerSet, ...), not on the workload object.
pub const OPT_OUT_ANNOTATION: &str = "nvca.nvcf.nvidia.io/model-cache-opt-out";

/// Resolve `script` as the commands it runs, for tests and tooling: each command's words, with
/// `None` for a word whose value is not known from the given literal env.
#[doc(hidden)]
pub fn debug_shell_commands(script: &str, env: &[(&str, &str)]) -> Vec<Vec<Option<String>>> {
    use k8s_openapi::api::core::v1::{Container, EnvVar};
    let c = Container {
        name: "debug".to_owned(),
        env: Some(
            env.iter()
                .map(|(n, v)| EnvVar {
                    name: (*n).to_owned(),
                    value: Some((*v).to_owned()),
                    value_from: None,
                })
                .collect(),
        ),
        ..Default::default()
    };
    let budget = limits::Budget::default();
    let meter = limits::Meter::new(&budget);
    let e = env::Env::of(&c, "spec.containers[0]", &meter);
    shell::parse(script, &e, &meter, &shell::Exports::default(), None)
        .into_iter()
        .map(|cmd| {
            cmd.words
                .into_iter()
                .map(|w| (!w.unknown).then_some(w.text))
                .collect()
        })
        .collect()
}

/// What resolving `pod` (as [`resolve`] does) cost: the outcome, the bytes its expansions
/// inserted and the commands its scripts ran, for tests that check the work stays within
/// [`MAX_EXPANSION_BYTES`] and [`MAX_COMMANDS`].
#[doc(hidden)]
pub fn debug_resolve_cost(pod: &k8s_openapi::api::core::v1::Pod) -> (Outcome, usize, usize) {
    let budget = limits::Budget::default();
    let outcome = resolve::resolve_metered(pod, main_container_index(pod), &budget);
    (outcome, budget.expanded(), budget.commands())
}
