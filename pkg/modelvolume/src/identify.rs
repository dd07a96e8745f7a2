//! What the pod downloads, on top of `warmcache_modelid`.
//!
//! `warmcache_modelid` is the one reader of pod specs; this module only presents it with two
//! things it does not take as they are:
//!
//! - **Other spellings of the engine flags**: KServe's huggingfaceserver names the model with
//!   `--model_id` and its revision with `--model_revision`. A copy of the pod with those spelled
//!   `--model-id` / `--revision` is resolved; the pod itself is never changed by this.
//! - **Custom endpoints**: `warmcache_modelid` leaves a download from a custom endpoint alone
//!   (`custom-endpoint`), because its identity names the artifact, not the store. Model sharing
//!   makes the endpoint part of the cache handle instead: the endpoint setting the resolver
//!   reported is taken out of a copy of the pod (or, when a command sets it, replaced by the
//!   public store), the copy is resolved again, and the endpoint goes into the handle. An
//!   endpoint that is not set literally (from a Secret, say) cannot be part of a handle and
//!   stays a `custom-endpoint` skip.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::{Container, Pod};
use warmcache_modelid::{
    GroupError, LWS_NAME_LABEL, LWS_WORKER_INDEX_LABEL, LeaderWorkerSet, Outcome, Resolution,
    Unresolved, resolve_container, resolve_with_group,
};

use crate::skip::{Skip, SkipReason};

/// Flag spellings presented to the resolver in another form: (theirs, the resolver's).
const SPELLINGS: [(&str, &str); 2] = [
    ("--model_id", "--model-id"),
    ("--model_revision", "--revision"),
];

/// How often an endpoint is taken out before giving up (a pod sets at most a few).
const MAX_ENDPOINTS: usize = 8;

/// Public stores an endpoint set by a command is replaced with in the resolved copy.
const PUBLIC_HF: &str = "https://huggingface.co";
const PUBLIC_S3: &str = "https://s3.amazonaws.com";

/// What the pod downloads.
#[derive(Debug, Clone)]
pub(crate) struct Identified {
    /// The resolution (of the copy the resolver was given).
    pub(crate) resolution: Resolution,
    /// Custom endpoints the download reads from, as set in the pod.
    pub(crate) endpoints: Vec<String>,
}

/// The name of the LeaderWorkerSet `pod` is a worker of (label
/// `leaderworkerset.sigs.k8s.io/worker-index` other than `0`): the caller reads that object (same
/// namespace) and passes it in, in case the worker names no model itself.
pub fn leader_worker_set_name(pod: &Pod) -> Option<&str> {
    let labels = pod.metadata.labels.as_ref()?;
    let name = labels.get(LWS_NAME_LABEL)?;
    let index = labels
        .get(LWS_WORKER_INDEX_LABEL)
        .map_or("", String::as_str);
    (!index.is_empty() && index != "0").then_some(name.as_str())
}

/// Replace `from` by `to` in `s` where it is a whole option name (`--model_id` or
/// `--model_id=...`, not `--model_idx`).
fn respell(s: &str, from: &str, to: &str) -> String {
    let boundary = |c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ';' | '&' | '|' | '(');
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(from) {
        out.push_str(&rest[..i]);
        let before_ok = out.chars().last().is_none_or(boundary);
        let after = &rest[i + from.len()..];
        let after_ok = after.chars().next().is_none_or(|c| c == '=' || boundary(c));
        out.push_str(if before_ok && after_ok { to } else { from });
        rest = after;
    }
    out.push_str(rest);
    out
}

fn respell_container(c: &mut Container) {
    for list in [&mut c.command, &mut c.args].into_iter().flatten() {
        for s in list.iter_mut() {
            for (from, to) in SPELLINGS {
                if s.contains(from) {
                    *s = respell(s, from, to);
                }
            }
        }
    }
}

/// `pod` with the spellings of [`SPELLINGS`] changed in every container; `pod` itself (no copy)
/// when no container uses them, which is almost every pod.
fn respelled(pod: &Pod) -> Cow<'_, Pod> {
    let uses = pod.spec.iter().any(|spec| {
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .flat_map(|c| c.command.iter().flatten().chain(c.args.iter().flatten()))
            .any(|s| SPELLINGS.iter().any(|(from, _)| s.contains(from)))
    });
    if !uses {
        return Cow::Borrowed(pod);
    }
    let mut p = pod.clone();
    if let Some(spec) = p.spec.as_mut() {
        spec.containers.iter_mut().for_each(respell_container);
        spec.init_containers
            .iter_mut()
            .flatten()
            .for_each(respell_container);
    }
    Cow::Owned(p)
}

/// `spec.containers[3].env[X]` -> (init?, 3, "env[X]").
fn container_field(field: &str) -> Option<(bool, usize, &str)> {
    let (init, rest) = if let Some(r) = field.strip_prefix("spec.initContainers[") {
        (true, r)
    } else {
        (false, field.strip_prefix("spec.containers[")?)
    };
    let (idx, rest) = rest.split_once(']')?;
    let idx: usize = idx.parse().ok()?;
    Some((init, idx, rest.strip_prefix('.').unwrap_or(rest)))
}

fn container_mut(pod: &mut Pod, init: bool, idx: usize) -> Option<&mut Container> {
    let spec = pod.spec.as_mut()?;
    if init {
        spec.init_containers.as_mut()?.get_mut(idx)
    } else {
        spec.containers.get_mut(idx)
    }
}

/// Take the endpoint the resolver reported at `field` out of `pod`; `false` when it cannot be.
fn neutralize(pod: &mut Pod, field: &str, endpoint: &str) -> bool {
    let Some((init, idx, rest)) = container_field(field) else {
        return false;
    };
    let Some(c) = container_mut(pod, init, idx) else {
        return false;
    };
    if let Some(name) = rest.strip_prefix("env[").and_then(|r| r.strip_suffix(']')) {
        let Some(env) = c.env.as_mut() else {
            return false;
        };
        let before = env.len();
        env.retain(|e| e.name != name);
        return env.len() != before;
    }
    if rest == "args" || rest == "command" {
        let hf = crate::words::script_assignments(c, &["HF_ENDPOINT"])
            .iter()
            .any(|(_, v)| v.contains(endpoint));
        let public = if hf { PUBLIC_HF } else { PUBLIC_S3 };
        let mut changed = false;
        for list in [&mut c.command, &mut c.args].into_iter().flatten() {
            for s in list.iter_mut() {
                if s.contains(endpoint) {
                    *s = s.replace(endpoint, public);
                    changed = true;
                }
            }
        }
        return changed;
    }
    false
}

fn skip_of(u: &Unresolved) -> Skip {
    let reason = match u {
        Unresolved::OptedOut { .. } => SkipReason::PodOptedOut,
        Unresolved::NoContainers => SkipReason::NoDownloader,
        Unresolved::NoDownloader => SkipReason::NoDownloader,
        Unresolved::PvcStorageUri { .. } => SkipReason::PvcStorageUri,
        Unresolved::UnsupportedSource { .. } => SkipReason::UnsupportedSource,
        Unresolved::UnknownValue { .. } => SkipReason::UnknownValue,
        Unresolved::PartialDownload { .. } => SkipReason::PartialDownload,
        Unresolved::MultipleDownloads { .. } => SkipReason::MultipleDownloads,
        Unresolved::InvalidReference { .. } => SkipReason::InvalidReference,
        Unresolved::CustomEndpoint { .. } => SkipReason::CustomEndpoint,
        Unresolved::LandingUnknown { .. } => SkipReason::LandingUnknown,
        Unresolved::LeaderUnresolved { .. } => SkipReason::LeaderUnresolved,
    };
    Skip::new(reason, u.to_string())
}

fn resolve_once(pod: &Pod, main: usize, group: Option<&LeaderWorkerSet>) -> Result<Outcome, Skip> {
    if leader_worker_set_name(pod).is_some() {
        resolve_with_group(pod, group).map_err(|e| match e {
            GroupError::Missing { .. } => {
                Skip::new(SkipReason::LeaderWorkerSetMissing, e.to_string())
            }
            GroupError::Mismatch { .. } => {
                Skip::new(SkipReason::LeaderWorkerSetMismatch, e.to_string())
            }
        })
    } else {
        Ok(resolve_container(pod, main))
    }
}

/// Resolve `pod` (main container `main`, LeaderWorkerSet `group` for workers) with the other
/// spellings and custom endpoints of the module docs.
pub(crate) fn identify(
    pod: &Pod,
    main: usize,
    group: Option<&LeaderWorkerSet>,
) -> Result<Identified, Skip> {
    let mut copy = respelled(pod);
    let mut endpoints: Vec<String> = Vec::new();
    let mut seen: Vec<(String, String)> = Vec::new();
    loop {
        match resolve_once(&copy, main, group)? {
            Outcome::Resolved(resolution) => {
                return Ok(Identified {
                    resolution,
                    endpoints,
                });
            }
            Outcome::Unresolved(Unresolved::CustomEndpoint {
                field,
                endpoint: Some(endpoint),
            }) if seen.len() < MAX_ENDPOINTS
                && !seen.iter().any(|(f, e)| *f == field && *e == endpoint) =>
            {
                if !neutralize(copy.to_mut(), &field, &endpoint) {
                    return Err(skip_of(&Unresolved::CustomEndpoint {
                        field,
                        endpoint: Some(endpoint),
                    }));
                }
                endpoints.push(endpoint.clone());
                seen.push((field, endpoint));
            }
            Outcome::Unresolved(u) => return Err(skip_of(&u)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn respelling_changes_whole_option_names_only() {
        assert_eq!(
            respell("--model_id=x", "--model_id", "--model-id"),
            "--model-id=x"
        );
        assert_eq!(
            respell("--model_id", "--model_id", "--model-id"),
            "--model-id"
        );
        assert_eq!(
            respell(
                "python -m huggingfaceserver --model_id x --model_idx y",
                "--model_id",
                "--model-id"
            ),
            "python -m huggingfaceserver --model-id x --model_idx y"
        );
        assert_eq!(
            respell("a--model_id", "--model_id", "--model-id"),
            "a--model_id"
        );
    }

    #[test]
    fn container_fields_parse() {
        assert_eq!(
            container_field("spec.containers[2].env[HF_ENDPOINT]"),
            Some((false, 2, "env[HF_ENDPOINT]"))
        );
        assert_eq!(
            container_field("spec.initContainers[0].args"),
            Some((true, 0, "args"))
        );
        assert_eq!(container_field("the container script"), None);
    }
}
