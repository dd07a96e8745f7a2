//! Pods from workload objects: a Pod as is, or the pod a Deployment, StatefulSet, ReplicaSet,
//! DaemonSet, Job, CronJob or LeaderWorkerSet would create from its template.

use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, Pod, PodTemplateSpec, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::de::DeserializeOwned;
use serde_json::Value;
use warmcache_cli::text;

use crate::lws::{LWS_KIND, LeaderWorkerSet};

/// Why an object does not give a pod.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadError {
    /// `kind` is missing.
    #[error("kind: missing; expected a Pod or a workload with a pod template")]
    MissingKind,
    /// A kind without a pod template.
    #[error(
        "kind: {} has no pod template to read (expected Pod, Deployment, StatefulSet, ReplicaSet, DaemonSet, Job, CronJob or LeaderWorkerSet)",
        text::shown(.kind)
    )]
    UnsupportedKind {
        /// The kind given.
        kind: String,
    },
    /// A required field is missing.
    #[error("{path}: missing")]
    Missing {
        /// Field path.
        path: String,
    },
    /// A field does not decode.
    #[error("{path}: {message}")]
    Decode {
        /// Field path.
        path: String,
        /// The decoder's message.
        message: String,
    },
}

/// Longest decoder message kept in [`WorkloadError::Decode`] (serde quotes whole values).
const MAX_DECODE_MESSAGE_BYTES: usize = 512;

fn field<'v>(v: &'v Value, path: &[&str]) -> Option<&'v Value> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

/// Decode `v` (found at `prefix`) with the failing field's path in the error.
pub fn decode<T: DeserializeOwned>(v: &Value, prefix: &str) -> Result<T, WorkloadError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let inner = e.path().to_string();
        let path = match (prefix.is_empty(), inner.as_str()) {
            (true, p) => p.to_owned(),
            (false, ".") => prefix.to_owned(),
            (false, p) => format!("{prefix}.{p}"),
        };
        // The path holds map keys and the decoder's message may quote the input: both bounded.
        WorkloadError::Decode {
            path: text::path(&path),
            message: text::bounded(&e.into_inner().to_string(), MAX_DECODE_MESSAGE_BYTES),
        }
    })
}

fn template(v: &Value, path: &[&str]) -> Result<PodTemplateSpec, WorkloadError> {
    let at = path.join(".");
    let t = field(v, path).ok_or_else(|| WorkloadError::Missing { path: at.clone() })?;
    decode(t, &at)
}

fn pod_from_template(t: PodTemplateSpec, namespace: Option<String>) -> Pod {
    let mut metadata = t.metadata.unwrap_or_default();
    if metadata.namespace.is_none() {
        metadata.namespace = namespace;
    }
    Pod {
        metadata,
        spec: t.spec,
        status: None,
    }
}

/// The pod `obj` stands for. For a StatefulSet this is replica 0 as the StatefulSet controller
/// creates it: named `<name>-0`, owned by the StatefulSet, with one claim volume
/// `<template>-<name>-0` per `volumeClaimTemplates` entry. For a LeaderWorkerSet it is the leader:
/// `leaderTemplate`, else `workerTemplate` (which the leader then runs).
pub fn pod_from_object(obj: &Value) -> Result<Pod, WorkloadError> {
    let kind = obj
        .get("kind")
        .and_then(Value::as_str)
        .ok_or(WorkloadError::MissingKind)?;
    let meta: ObjectMeta = match obj.get("metadata") {
        Some(m) => decode(m, "metadata")?,
        None => ObjectMeta::default(),
    };
    let ns = meta.namespace.clone();
    match kind {
        "Pod" => decode(obj, ""),
        "Deployment" | "ReplicaSet" | "DaemonSet" | "Job" => {
            Ok(pod_from_template(template(obj, &["spec", "template"])?, ns))
        }
        "CronJob" => Ok(pod_from_template(
            template(obj, &["spec", "jobTemplate", "spec", "template"])?,
            ns,
        )),
        "StatefulSet" => {
            let name = meta.name.clone().filter(|n| !n.is_empty()).ok_or_else(|| {
                WorkloadError::Missing {
                    path: "metadata.name".to_owned(),
                }
            })?;
            let mut pod = pod_from_template(template(obj, &["spec", "template"])?, ns);
            let pod_name = format!("{name}-0");
            pod.metadata.name = Some(pod_name.clone());
            pod.metadata.owner_references = Some(vec![OwnerReference {
                api_version: "apps/v1".to_owned(),
                kind: "StatefulSet".to_owned(),
                name: name.clone(),
                controller: Some(true),
                ..Default::default()
            }]);
            let templates = field(obj, &["spec", "volumeClaimTemplates"])
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if let Some(spec) = pod.spec.as_mut() {
                let volumes = spec.volumes.get_or_insert_with(Vec::new);
                for (i, t) in templates.iter().enumerate() {
                    let Some(vct) = field(t, &["metadata", "name"]).and_then(Value::as_str) else {
                        return Err(WorkloadError::Missing {
                            path: format!("spec.volumeClaimTemplates[{i}].metadata.name"),
                        });
                    };
                    if volumes.iter().any(|v| v.name == vct) {
                        continue;
                    }
                    volumes.push(Volume {
                        name: vct.to_owned(),
                        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                            claim_name: format!("{vct}-{pod_name}"),
                            read_only: None,
                        }),
                        ..Default::default()
                    });
                }
            }
            Ok(pod)
        }
        k if k == LWS_KIND => {
            let lws: LeaderWorkerSet = decode(obj, "")?;
            let mut pod = lws.leader_pod();
            if pod.metadata.namespace.is_none() {
                pod.metadata.namespace = ns;
            }
            Ok(pod)
        }
        other => Err(WorkloadError::UnsupportedKind {
            kind: other.to_owned(),
        }),
    }
}

/// A LeaderWorkerSet from an object of that kind.
pub fn lws_from_object(obj: &Value) -> Result<LeaderWorkerSet, WorkloadError> {
    match obj.get("kind").and_then(Value::as_str) {
        Some(k) if k == LWS_KIND => decode(obj, ""),
        Some(k) => Err(WorkloadError::UnsupportedKind {
            kind: format!("{k} (a LeaderWorkerSet is expected here)"),
        }),
        None => Err(WorkloadError::MissingKind),
    }
}
