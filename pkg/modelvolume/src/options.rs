//! What an operator configures: which pods are in scope, how readers reach block storage, and the
//! containers the rewrite adds.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use warmcache_api_modelcache::DEFAULT_CONTROL_NAMESPACE;
use warmcache_cli::text::shown;

use crate::keys::DEFAULT_HOST_ROOT;

/// The GPU resource a pod must request to be in scope when nothing else is configured.
pub const DEFAULT_GPU_RESOURCE: &str = "nvidia.com/gpu";

/// How long a reader waits for the completion marker before it gives up (seconds), as nvsnap's
/// `agent.modelVolume.waitDeadline`.
pub const DEFAULT_WAIT_DEADLINE_SECONDS: u32 = 3600;

/// How often the wait container looks for the markers (seconds).
pub const DEFAULT_POLL_SECONDS: u32 = 5;

/// The user the added containers run as when the pod names none, or names root: the
/// conventional `nonroot` uid of distroless images.
pub const DEFAULT_NON_ROOT_USER: i64 = 65532;

/// Longest wait deadline accepted (one week).
const MAX_WAIT_DEADLINE_SECONDS: u32 = 7 * 24 * 3600;

/// How readers of a `roxReadOnly` (block) cache reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ReaderMode {
    /// The per-namespace read-only view claim (the default; the only mode of `rwxReadOnly`).
    #[default]
    Pvc,
    /// A node directory the node agent bind-mounts the read-only view onto
    /// (`<host root>/<identity hash>`, `DirectoryOrCreate`, `HostToContainer` propagation);
    /// readers keep an in-place fallback download.
    HostPath,
}

impl ReaderMode {
    /// `pvc` or `hostPath`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ReaderMode::Pvc => "pvc",
            ReaderMode::HostPath => "hostPath",
        }
    }
}

/// Options of the rewrite. [`Options::default`] is the shipped configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Extended resources that make a pod a GPU pod (a non-zero request or limit of any of them
    /// on any container). Default: [`DEFAULT_GPU_RESOURCE`].
    pub gpu_resources: Vec<String>,
    /// The namespace the webhook runs in; never rewritten.
    pub webhook_namespace: Option<String>,
    /// The control namespace: bindings and primary volumes live there; never rewritten.
    pub control_namespace: String,
    /// Reader mode for `roxReadOnly` caches.
    pub reader_mode: ReaderMode,
    /// Root of hostPath reader directories on the nodes.
    pub host_root: String,
    /// Image of the wait container. `None`: the image of the container it stands in for (the
    /// download init container, or the engine), which the pod can already pull; it must have
    /// `/bin/sh`.
    pub wait_image: Option<String>,
    /// Seconds a reader waits for the completion marker.
    pub wait_deadline_seconds: u32,
    /// Seconds between two looks at the markers.
    pub poll_seconds: u32,
    /// Requests and limits of the wait container.
    pub wait_resources: ResourceRequirements,
    /// Requests and limits of a wait container that may download in place (hostPath readers).
    pub download_resources: ResourceRequirements,
    /// The user added containers run as when the pod names none or names root.
    pub fallback_user: i64,
    /// Maximum age of a floating revision's copy (seconds), or `None` to keep it until a refresh
    /// is asked for. Copies are kept per window of this length (Unix time divided by it), the
    /// same in every webhook replica: the first pod of a new window downloads anew into a new
    /// binding ([`crate::Plan::at`]).
    pub floating_revision_max_age_seconds: Option<u64>,
    /// Compile-cache sets ([`crate::cacheset`]): the engine's compile caches point into the
    /// scratch directory, the first Ready pod of each configuration and rank has them collected,
    /// and later pods start from them. Off by default.
    pub compile_cache_sets: bool,
}

fn resources(cpu: (&str, &str), memory: (&str, &str)) -> ResourceRequirements {
    let map = |c: &str, m: &str| {
        BTreeMap::from([
            ("cpu".to_owned(), Quantity(c.to_owned())),
            ("memory".to_owned(), Quantity(m.to_owned())),
        ])
    };
    ResourceRequirements {
        requests: Some(map(cpu.0, memory.0)),
        limits: Some(map(cpu.1, memory.1)),
        claims: None,
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            gpu_resources: vec![DEFAULT_GPU_RESOURCE.to_owned()],
            webhook_namespace: None,
            control_namespace: DEFAULT_CONTROL_NAMESPACE.to_owned(),
            reader_mode: ReaderMode::Pvc,
            host_root: DEFAULT_HOST_ROOT.to_owned(),
            wait_image: None,
            wait_deadline_seconds: DEFAULT_WAIT_DEADLINE_SECONDS,
            poll_seconds: DEFAULT_POLL_SECONDS,
            wait_resources: resources(("10m", "100m"), ("16Mi", "64Mi")),
            download_resources: resources(("1", "2"), ("1Gi", "4Gi")),
            fallback_user: DEFAULT_NON_ROOT_USER,
            floating_revision_max_age_seconds: None,
            compile_cache_sets: false,
        }
    }
}

/// An option that cannot work, with the option's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {why}")]
pub struct OptionsError {
    /// The option (`gpuResources[0]`, `hostRoot`, ...).
    pub field: String,
    /// What is wrong.
    pub why: String,
}

fn invalid(field: impl Into<String>, why: impl Into<String>) -> OptionsError {
    OptionsError {
        field: field.into(),
        why: why.into(),
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// An extended resource name: `<domain>/<name>`, lowercase DNS domain, a name of letters,
/// digits, `-`, `_`, `.`.
fn is_resource_name(s: &str) -> bool {
    let Some((domain, name)) = s.split_once('/') else {
        return false;
    };
    !domain.is_empty()
        && domain.len() <= 253
        && domain.split('.').all(is_dns_label)
        && !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn check_resources(field: &str, r: &ResourceRequirements) -> Result<(), OptionsError> {
    for (part, map) in [("requests", &r.requests), ("limits", &r.limits)] {
        let Some(map) = map else {
            return Err(invalid(
                format!("{field}.{part}"),
                "must be set: every container warmcache adds has requests and limits",
            ));
        };
        for key in ["cpu", "memory"] {
            match map.get(key) {
                Some(q) if !q.0.trim().is_empty() => {}
                _ => {
                    return Err(invalid(
                        format!("{field}.{part}.{key}"),
                        "must be set: every container warmcache adds has requests and limits",
                    ));
                }
            }
        }
    }
    Ok(())
}

impl Options {
    /// Check every option; the first problem is returned with the option's name.
    ///
    /// # Errors
    ///
    /// An [`OptionsError`] naming the option and what is wrong.
    pub fn validate(&self) -> Result<(), OptionsError> {
        if self.gpu_resources.is_empty() {
            return Err(invalid(
                "gpuResources",
                "list at least one GPU resource (for example nvidia.com/gpu)",
            ));
        }
        for (i, r) in self.gpu_resources.iter().enumerate() {
            if !is_resource_name(r) {
                return Err(invalid(
                    format!("gpuResources[{i}]"),
                    format!(
                        "{} is not an extended resource name (<domain>/<name>, such as nvidia.com/gpu)",
                        shown(r)
                    ),
                ));
            }
        }
        if let Some(ns) = &self.webhook_namespace
            && !is_dns_label(ns)
        {
            return Err(invalid(
                "webhookNamespace",
                format!("{} is not a namespace name", shown(ns)),
            ));
        }
        if !is_dns_label(&self.control_namespace) {
            return Err(invalid(
                "controlNamespace",
                format!("{} is not a namespace name", shown(&self.control_namespace)),
            ));
        }
        let root = &self.host_root;
        if !root.starts_with('/')
            || warmcache_modelid::paths::clean(root) != *root
            || root == "/"
            || root.chars().any(|c| c.is_control())
        {
            return Err(invalid(
                "hostRoot",
                format!(
                    "{} must be a clean absolute directory other than /",
                    shown(root)
                ),
            ));
        }
        if let Some(image) = &self.wait_image
            && (image.is_empty() || image.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return Err(invalid(
                "waitImage",
                format!("{} is not an image reference", shown(image)),
            ));
        }
        if self.poll_seconds == 0 {
            return Err(invalid("pollSeconds", "must be at least 1"));
        }
        if self.wait_deadline_seconds < self.poll_seconds
            || self.wait_deadline_seconds > MAX_WAIT_DEADLINE_SECONDS
        {
            return Err(invalid(
                "waitDeadlineSeconds",
                format!(
                    "{} must be between pollSeconds ({}) and {MAX_WAIT_DEADLINE_SECONDS} (one week)",
                    self.wait_deadline_seconds, self.poll_seconds
                ),
            ));
        }
        check_resources("waitResources", &self.wait_resources)?;
        check_resources("downloadResources", &self.download_resources)?;
        if self.fallback_user <= 0 {
            return Err(invalid(
                "fallbackUser",
                "must be a non-root uid (greater than 0)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(Options::default().validate(), Ok(()));
    }

    #[test]
    fn each_invalid_option_names_its_field() {
        let cases: Vec<(Options, &str)> = vec![
            (
                Options {
                    gpu_resources: vec![],
                    ..Options::default()
                },
                "gpuResources",
            ),
            (
                Options {
                    gpu_resources: vec!["nvidia.com/gpu".into(), "gpu".into()],
                    ..Options::default()
                },
                "gpuResources[1]",
            ),
            (
                Options {
                    webhook_namespace: Some("Warm Cache".into()),
                    ..Options::default()
                },
                "webhookNamespace",
            ),
            (
                Options {
                    control_namespace: String::new(),
                    ..Options::default()
                },
                "controlNamespace",
            ),
            (
                Options {
                    host_root: "relative/dir".into(),
                    ..Options::default()
                },
                "hostRoot",
            ),
            (
                Options {
                    host_root: "/var/lib/../x".into(),
                    ..Options::default()
                },
                "hostRoot",
            ),
            (
                Options {
                    wait_image: Some("busy box".into()),
                    ..Options::default()
                },
                "waitImage",
            ),
            (
                Options {
                    poll_seconds: 0,
                    ..Options::default()
                },
                "pollSeconds",
            ),
            (
                Options {
                    wait_deadline_seconds: 2,
                    ..Options::default()
                },
                "waitDeadlineSeconds",
            ),
            (
                Options {
                    wait_resources: ResourceRequirements::default(),
                    ..Options::default()
                },
                "waitResources.requests",
            ),
            (
                Options {
                    fallback_user: 0,
                    ..Options::default()
                },
                "fallbackUser",
            ),
        ];
        for (options, field) in cases {
            let err = options.validate().expect_err(field);
            assert_eq!(err.field, field, "{err}");
            assert!(err.to_string().starts_with(&format!("{field}: ")), "{err}");
        }
    }

    #[test]
    fn resource_names() {
        for ok in [
            "nvidia.com/gpu",
            "amd.com/gpu",
            "nvidia.com/mig-1g.10gb",
            "gpu.intel.com/i915",
        ] {
            assert!(is_resource_name(ok), "{ok}");
        }
        for bad in [
            "gpu",
            "/gpu",
            "nvidia.com/",
            "Nvidia.com/gpu",
            "nvidia.com/g pu",
        ] {
            assert!(!is_resource_name(bad), "{bad}");
        }
    }
}
