//! The part of a LeaderWorkerSet (`leaderworkerset.x-k8s.io/v1`) that resolution reads. There is no
//! k8s-openapi type for it; this one keeps only the templates and ignores every other field.

use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use warmcache_cli::text::shown;

/// API version of LeaderWorkerSet.
pub const LWS_API_VERSION: &str = "leaderworkerset.x-k8s.io/v1";
/// Kind of LeaderWorkerSet.
pub const LWS_KIND: &str = "LeaderWorkerSet";
/// Pod label naming the pod's LeaderWorkerSet.
pub const LWS_NAME_LABEL: &str = "leaderworkerset.sigs.k8s.io/name";
/// Pod label with the pod's index in its group (`0` is the leader).
pub const LWS_WORKER_INDEX_LABEL: &str = "leaderworkerset.sigs.k8s.io/worker-index";

/// A LeaderWorkerSet, reduced to what resolution needs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaderWorkerSet {
    /// Object metadata; `name` must match the pod's group label.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The spec.
    pub spec: LeaderWorkerSetSpec,
}

/// `spec` of a LeaderWorkerSet.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaderWorkerSetSpec {
    /// The group's templates.
    pub leader_worker_template: LeaderWorkerTemplate,
}

/// `spec.leaderWorkerTemplate`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaderWorkerTemplate {
    /// The leader's template; when absent the leader runs the worker template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_template: Option<PodTemplateSpec>,
    /// The workers' template.
    pub worker_template: PodTemplateSpec,
}

impl LeaderWorkerSet {
    /// The template the leader (index 0) runs: `leaderTemplate`, else `workerTemplate`.
    pub fn leader_template(&self) -> &PodTemplateSpec {
        let t = &self.spec.leader_worker_template;
        t.leader_template.as_ref().unwrap_or(&t.worker_template)
    }

    /// A pod built from [`Self::leader_template`].
    pub fn leader_pod(&self) -> Pod {
        let t = self.leader_template();
        Pod {
            metadata: t.metadata.clone().unwrap_or_default(),
            spec: t.spec.clone(),
            status: None,
        }
    }
}

/// A LeaderWorkerSet worker cannot be resolved without its group.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    /// The worker names no model and its LeaderWorkerSet was not supplied (or does not exist).
    #[error(
        "metadata.labels[leaderworkerset.sigs.k8s.io/name]: pod is worker {} of LeaderWorkerSet {} and names no model itself; its leader template is needed and the LeaderWorkerSet is missing",
        shown(.index),
        shown(.name)
    )]
    Missing {
        /// The LeaderWorkerSet's name (pod label).
        name: String,
        /// The worker index (pod label).
        index: String,
    },
    /// The supplied LeaderWorkerSet is not the pod's.
    #[error(
        "metadata.name: the pod belongs to LeaderWorkerSet {} (label leaderworkerset.sigs.k8s.io/name), but the LeaderWorkerSet given is named {}",
        shown(.name),
        shown(.given)
    )]
    Mismatch {
        /// The pod's group.
        name: String,
        /// The name of the object supplied.
        given: String,
    },
}
