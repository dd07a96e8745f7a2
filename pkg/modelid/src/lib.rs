//! Model identity and landing resolution: which artifact an unmodified pod downloads (as one URI
//! shared by every chart that names it), who downloads it, and where the bytes land. Pure: no
//! client, no runtime, no I/O.
//!
//! Entry points: [`resolve`] (a pod), [`resolve_with_group`] (a pod that may be a LeaderWorkerSet
//! worker; the caller supplies the LeaderWorkerSet), [`Identity`] (parse/render model URIs) and
//! [`pod_from_object`] (the pod a workload object creates). The rules, in order, and every form
//! they recognise are documented in `docs/model-identity.md`.

mod argv;
mod env;
mod identity;
mod landing;
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
    let e = env::Env::of(&c, "spec.containers[0]");
    shell::parse(script, &e, &[], None)
        .into_iter()
        .map(|cmd| {
            cmd.words
                .into_iter()
                .map(|w| (!w.unknown).then_some(w.text))
                .collect()
        })
        .collect()
}
