//! The download step a writer Job runs, recorded on the pod ([`DOWNLOAD_STEP_ANNOTATION`]).
//!
//! For an init download it is the pod's own init container, as it was, with the pod volumes it
//! mounts and where it writes; for an engine that downloads by itself it is a container derived
//! on the engine's image (`hf download` / `huggingface-cli download`, or NIM's
//! `download-to-cache`). Secrets stay references: `valueFrom` and `envFrom` are copied as they
//! are, and a literal value of a secret-looking variable in the engine is named, never copied
//! ([`DownloadStep::env_from_pod`]); an init container holding a literal secret is not recorded
//! at all (the pod is left alone with `secret-in-download-step`).
//!
//! [`DOWNLOAD_STEP_ANNOTATION`]: crate::keys::DOWNLOAD_STEP_ANNOTATION

use k8s_openapi::api::core::v1::{
    Container, EnvVar, LocalObjectReference, Pod, PodSecurityContext, Volume,
};
use serde::{Deserialize, Serialize};
use warmcache_cli::text::shown;
use warmcache_modelid::Identity;

use crate::handle::Layout;
use crate::keys::{DOWNLOAD_STEP_VERSION, WAIT_MOUNT_PATH};
use crate::skip::{Skip, SkipReason};
use crate::words::{container_words, flag_values};

/// Largest recorded step (compact JSON); annotations share 256 KiB per object.
pub const MAX_DOWNLOAD_STEP_BYTES: usize = 32 * 1024;

/// Where the step came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StepOrigin {
    /// The pod's own download init container.
    Init,
    /// Derived from the engine, which downloads by itself.
    Engine,
    /// The download init container of the pod's LeaderWorkerSet leader template.
    LeaderInit,
    /// Derived from the leader template's engine.
    LeaderEngine,
}

/// A literal secret the controller copies from the pod's own spec into the Job, instead of the
/// value travelling in an annotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodEnvRef {
    /// The variable, as the Job's container gets it.
    pub name: String,
    /// The container of this pod whose `env` holds it.
    pub container: String,
}

/// What a writer Job runs to fill a cache (the record the controllers read).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DownloadStep {
    /// Contract version ([`DOWNLOAD_STEP_VERSION`]).
    pub version: String,
    /// Where the step came from.
    pub origin: StepOrigin,
    /// The container it was taken or derived from.
    pub source_container: String,
    /// The container to run. For `init`, the original init container; `env` keeps `valueFrom`
    /// references as they are.
    pub container: Container,
    /// Where, in `container`, the download writes: the cache's root is mounted here.
    pub dest: String,
    /// The pod volume the download wrote into (replaced by the cache in the Job); `None` when
    /// it wrote into its own filesystem or for derived steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub landing_volume: Option<String>,
    /// The pod volumes `container` mounts (by name), the landing volume included.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// Image pull secrets of the pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// The pod's service account (cloud credentials such as IRSA or workload identity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// The pod's security context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security_context: Option<PodSecurityContext>,
    /// Literal secrets of the engine that the controller copies from the pod (derived steps).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_from_pod: Vec<PodEnvRef>,
}

impl DownloadStep {
    /// Compact JSON, as recorded on the pod.
    ///
    /// # Errors
    ///
    /// A serialization error (not expected for these types), or a step longer than
    /// [`MAX_DOWNLOAD_STEP_BYTES`], as a `download-not-reproducible` skip.
    pub fn to_annotation(&self) -> Result<String, Skip> {
        let unrecorded = |e: &dyn std::fmt::Display| {
            Skip::new(
                SkipReason::DownloadNotReproducible,
                format!("the download step cannot be recorded: {e}"),
            )
        };
        // Written into a buffer of a typical step's size at once, rather than grown from empty.
        let mut bytes = Vec::with_capacity(2 * 1024);
        serde_json::to_writer(&mut bytes, self).map_err(|e| unrecorded(&e))?;
        let text = String::from_utf8(bytes).map_err(|e| unrecorded(&e))?;
        if text.len() > MAX_DOWNLOAD_STEP_BYTES {
            return Err(Skip::new(
                SkipReason::DownloadNotReproducible,
                format!(
                    "the download step of container {} is {} bytes as JSON, more than the {MAX_DOWNLOAD_STEP_BYTES} a pod annotation may carry for it",
                    shown(&self.source_container),
                    text.len()
                ),
            ));
        }
        Ok(text)
    }

    /// Read a recorded step back.
    ///
    /// # Errors
    ///
    /// The decoder's message when `text` is not a step.
    pub fn from_annotation(text: &str) -> Result<DownloadStep, serde_json::Error> {
        serde_json::from_str(text)
    }
}

/// Variable names whose literal values are secrets (case-insensitive substrings).
const SECRET_NAME_PARTS: [&str; 9] = [
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "API_KEY",
    "ACCESS_KEY",
    "PRIVATE_KEY",
    "CREDENTIAL",
    "AUTH",
];

/// Value prefixes of well-known credentials.
const SECRET_VALUE_PREFIXES: [&str; 5] = ["hf_", "nvapi-", "AKIA", "ghp_", "glpat-"];

/// Options whose value is a credential.
const SECRET_FLAGS: [&str; 6] = [
    "--token",
    "--api-key",
    "--api_key",
    "--password",
    "--secret-access-key",
    "--access-key",
];

/// Whether a literal `value` of variable `name` is a secret: a secret-looking name with a value
/// that is not a switch (`TOKENIZERS_PARALLELISM=false` is not a secret), or a value shaped
/// like a well-known credential.
pub(crate) fn is_secret_literal(name: &str, value: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    let v = value.trim();
    let switch = v.is_empty()
        || v.parse::<f64>().is_ok()
        || ["true", "false", "yes", "no", "on", "off"]
            .iter()
            .any(|s| v.eq_ignore_ascii_case(s));
    (SECRET_NAME_PARTS.iter().any(|p| upper.contains(p)) && !switch) || looks_like_credential(v)
}

fn looks_like_credential(v: &str) -> bool {
    SECRET_VALUE_PREFIXES
        .iter()
        .any(|p| v.starts_with(p) && v.len() >= p.len() + 16)
}

/// The first literal secret in `c` (at field path `c_path`): an env entry or a word of its
/// command line.
pub(crate) fn literal_secret(c: &Container, c_path: &str) -> Option<String> {
    for e in c.env.iter().flatten() {
        if e.value_from.is_none()
            && let Some(v) = &e.value
            && is_secret_literal(&e.name, v)
        {
            return Some(format!("{c_path}.env[{}]", e.name));
        }
    }
    let words = container_words(c);
    let flagged = flag_values(&words, &SECRET_FLAGS)
        .into_iter()
        .flatten()
        .any(|v| !v.starts_with('$'));
    if flagged
        || words.iter().any(|w| {
            let v = w.split_once('=').map_or(w.as_ref(), |(_, v)| v);
            looks_like_credential(v)
        })
    {
        let field = if c.args.as_ref().is_some_and(|a| !a.is_empty()) {
            "args"
        } else {
            "command"
        };
        return Some(format!("{c_path}.{field}"));
    }
    None
}

/// The pod volumes `c` mounts, in the pod's order.
fn mounted_volumes(pod: &Pod, c: &Container) -> Vec<Volume> {
    let names: Vec<&str> = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.name.as_str())
        .collect();
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter(|v| names.contains(&v.name.as_str()))
        .cloned()
        .collect()
}

fn pod_context(
    pod: &Pod,
) -> (
    Vec<LocalObjectReference>,
    Option<String>,
    Option<PodSecurityContext>,
) {
    let spec = pod.spec.as_ref();
    (
        spec.and_then(|s| s.image_pull_secrets.clone())
            .unwrap_or_default(),
        spec.and_then(|s| {
            s.service_account_name
                .clone()
                .or_else(|| s.service_account.clone())
        }),
        spec.and_then(|s| s.security_context.clone()),
    )
}

/// The step of an init download: init container `init` of `pod` (field path `init_path`),
/// writing to `dest` in its own view, into pod volume `landing_volume`.
pub(crate) fn from_init(
    pod: &Pod,
    init: &Container,
    init_path: &str,
    origin: StepOrigin,
    dest: String,
    landing_volume: Option<String>,
) -> Result<DownloadStep, Skip> {
    if let Some(field) = literal_secret(init, init_path) {
        return Err(Skip::new(
            SkipReason::SecretInDownloadStep,
            format!(
                "{field}: the download step holds a literal secret; the writer Job would need a copy of it, and warmcache never copies a secret's value: put it in a Secret and reference it with valueFrom or envFrom"
            ),
        ));
    }
    let (image_pull_secrets, service_account_name, pod_security_context) = pod_context(pod);
    Ok(DownloadStep {
        version: DOWNLOAD_STEP_VERSION.to_owned(),
        origin,
        source_container: init.name.clone(),
        container: init.clone(),
        dest,
        landing_volume,
        volumes: mounted_volumes(pod, init),
        image_pull_secrets,
        service_account_name,
        pod_security_context,
        env_from_pod: Vec::new(),
    })
}

/// Variables of the engine a derived Hugging Face download needs.
const HF_DOWNLOAD_ENV: [&str; 15] = [
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_ENDPOINT",
    "HF_HUB_ENABLE_HF_TRANSFER",
    "HF_HUB_DISABLE_XET",
    "HF_HUB_ETAG_TIMEOUT",
    "HF_HUB_DOWNLOAD_TIMEOUT",
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "NO_PROXY",
    "https_proxy",
    "http_proxy",
    "no_proxy",
    "REQUESTS_CA_BUNDLE",
    "SSL_CERT_FILE",
];

/// Variables of a NIM its `download-to-cache` needs.
const NIM_DOWNLOAD_ENV: [&str; 8] = [
    "NGC_API_KEY",
    "NGC_CLI_API_KEY",
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "NO_PROXY",
    "https_proxy",
    "http_proxy",
    "no_proxy",
];

/// The derived Hugging Face download: the engine's image runs `hf download` (or, on images
/// with huggingface_hub 0.x, `huggingface-cli download`) with the cache variable of the
/// layout pointing at the mounted cache. Positional parameters carry repo and revision, so no
/// value is ever parsed by a shell.
const HF_DOWNLOAD_SCRIPT: &str = r#"set -eu
repo="$1"; rev="$2"
if command -v hf >/dev/null 2>&1; then tool=hf; else tool=huggingface-cli; fi
if [ -n "$rev" ]; then exec "$tool" download "$repo" --revision "$rev"; fi
exec "$tool" download "$repo""#;

fn env_literal(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        value_from: None,
    }
}

/// Copy `names` from `engine`'s env: references as they are, non-secret literals by value,
/// secret literals as [`PodEnvRef`]s.
fn copied_env(engine: &Container, names: &[&str]) -> (Vec<EnvVar>, Vec<PodEnvRef>) {
    let mut env = Vec::new();
    let mut refs = Vec::new();
    let entries = engine.env.as_deref().unwrap_or_default();
    for name in names {
        let Some(e) = entries.iter().rev().find(|e| e.name == *name) else {
            continue;
        };
        match (&e.value, &e.value_from) {
            (_, Some(_)) => env.push(e.clone()),
            (Some(v), None) if is_secret_literal(name, v) => refs.push(PodEnvRef {
                name: (*name).to_owned(),
                container: engine.name.clone(),
            }),
            (Some(v), None) if !v.contains("$(") => env.push(env_literal(name, v)),
            _ => {}
        }
    }
    (env, refs)
}

/// The step derived from an engine that downloads `identity` by itself into `layout`; `Err`
/// when no Job can reproduce what the engine fetches.
pub(crate) fn derived(
    pod: &Pod,
    engine: &Container,
    origin: StepOrigin,
    identity: &Identity,
    layout: Layout,
) -> Result<DownloadStep, Skip> {
    let image = engine.image.clone().unwrap_or_default();
    if image.is_empty() {
        return Err(Skip::new(
            SkipReason::DownloadNotReproducible,
            format!(
                "container {} names no image to run the download on",
                shown(&engine.name)
            ),
        ));
    }
    let (mut env, env_from_pod, command, args) = match (identity.scheme(), layout) {
        (warmcache_modelid::Scheme::Hf, Layout::Hub | Layout::HubCache) => {
            let (copied, refs) = copied_env(engine, &HF_DOWNLOAD_ENV);
            let var = if layout == Layout::Hub {
                "HF_HOME"
            } else {
                "HF_HUB_CACHE"
            };
            let mut env = vec![
                env_literal(var, WAIT_MOUNT_PATH),
                env_literal("HOME", "/tmp"),
                env_literal("HF_HUB_DISABLE_TELEMETRY", "1"),
            ];
            env.extend(copied);
            (
                env,
                refs,
                vec![
                    "/bin/sh".to_owned(),
                    "-c".to_owned(),
                    HF_DOWNLOAD_SCRIPT.to_owned(),
                ],
                vec![
                    "nvsnap-download".to_owned(),
                    identity.reference().to_owned(),
                    identity.revision().unwrap_or_default().to_owned(),
                ],
            )
        }
        (warmcache_modelid::Scheme::Nim, Layout::Nim) => {
            let Some(profile) = identity.profile() else {
                return Err(Skip::new(
                    SkipReason::NimProfileUnpinned,
                    "the NIM has no NIM_MODEL_PROFILE",
                ));
            };
            let (copied, refs) = copied_env(engine, &NIM_DOWNLOAD_ENV);
            let mut env = vec![
                env_literal("NIM_CACHE_PATH", WAIT_MOUNT_PATH),
                env_literal("NIM_MODEL_PROFILE", profile),
            ];
            env.extend(copied);
            (
                env,
                refs,
                vec!["download-to-cache".to_owned()],
                vec!["--profile".to_owned(), profile.to_owned()],
            )
        }
        _ => {
            return Err(Skip::new(
                SkipReason::DownloadNotReproducible,
                format!(
                    "container {} downloads {} by itself; a writer Job can reproduce engine downloads of hf:// models and of NIM profiles only",
                    shown(&engine.name),
                    shown(&identity.uri())
                ),
            ));
        }
    };
    env.dedup_by(|a, b| a.name == b.name);
    let (image_pull_secrets, service_account_name, pod_security_context) = pod_context(pod);
    Ok(DownloadStep {
        version: DOWNLOAD_STEP_VERSION.to_owned(),
        origin,
        source_container: engine.name.clone(),
        container: Container {
            name: "download".to_owned(),
            image: Some(image),
            image_pull_policy: engine.image_pull_policy.clone(),
            command: Some(command),
            args: Some(args),
            env: Some(env),
            env_from: engine.env_from.clone(),
            ..Container::default()
        },
        dest: WAIT_MOUNT_PATH.to_owned(),
        landing_volume: None,
        volumes: Vec::new(),
        image_pull_secrets,
        service_account_name,
        pod_security_context,
        env_from_pod,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_literals() {
        assert!(is_secret_literal("HF_TOKEN", "hf_abcdefghijklmnopqrstu"));
        assert!(is_secret_literal("NGC_API_KEY", "abc"));
        assert!(is_secret_literal("AWS_SECRET_ACCESS_KEY", "x/y"));
        assert!(is_secret_literal(
            "WHATEVER",
            "hf_abcdefghijklmnopqrstuvwxyz"
        ));
        assert!(!is_secret_literal("TOKENIZERS_PARALLELISM", "false"));
        assert!(!is_secret_literal("HF_HUB_DISABLE_TOKEN_AUTH", "1"));
        assert!(!is_secret_literal("HF_HOME", "/models"));
        assert!(!is_secret_literal("HF_TOKEN", ""));
    }

    #[test]
    fn literal_secrets_in_argv() {
        let c = |args: &[&str]| Container {
            name: "c".into(),
            args: Some(args.iter().map(|s| (*s).to_owned()).collect()),
            ..Container::default()
        };
        assert_eq!(
            literal_secret(
                &c(&["hf", "download", "x", "--token", "abc"]),
                "spec.initContainers[0]"
            ),
            Some("spec.initContainers[0].args".to_owned())
        );
        assert_eq!(
            literal_secret(&c(&["sh", "-c", "hf download x --token=$HF_TOKEN"]), "p"),
            None
        );
        assert_eq!(
            literal_secret(
                &c(&["sh", "-c", "HF_TOKEN=hf_0123456789abcdefghij hf download x"]),
                "p"
            ),
            Some("p.args".to_owned())
        );
    }
}
