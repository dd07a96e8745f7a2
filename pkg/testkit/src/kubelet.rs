//! A kubelet simulation: the control plane has no nodes, so tests write pod status themselves.

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus,
    Pod, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};

use crate::TestkitError;

const CONFLICT_RETRIES: usize = 10;

/// Plays kubelet for pods on the test control plane by writing the `pods/status` subresource.
///
/// This is a simulation: nothing runs, no container is pulled or started. It writes the fields a
/// kubelet would (phase, container statuses with running/terminated states, exit codes and
/// termination messages, `Ready` conditions) so that controllers and the real Job controller
/// react as they would on a cluster. Pods are never scheduled (there is no scheduler and there are
/// no Nodes); do not set `spec.nodeName` to a Node that does not exist, or the pod garbage
/// collector of kube-controller-manager deletes the pod as orphaned.
#[derive(Clone)]
pub struct Kubelet {
    client: Client,
}

impl std::fmt::Debug for Kubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubelet").finish_non_exhaustive()
    }
}

impl Kubelet {
    /// A kubelet simulation writing through `client` (needs `pods/status` update rights).
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    /// Sets `status.phase` (`Pending`, `Running`, `Succeeded`, `Failed`) and nothing else.
    ///
    /// The API server refuses to move a pod out of `Succeeded` or `Failed`.
    pub async fn set_phase(&self, ns: &str, pod: &str, phase: &str) -> Result<(), TestkitError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let patch = serde_json::json!({ "status": { "phase": phase } });
        pods.patch_status(pod, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| {
                TestkitError::kube(format!("setting phase {phase} on pod {ns}/{pod}"), e)
            })?;
        Ok(())
    }

    /// Marks the pod `Running`: every app container running and ready, init containers
    /// terminated, and the `Initialized`, `ContainersReady` and `Ready` conditions `True`.
    ///
    /// An init container already recorded as terminated (by
    /// [`terminate_container`](Self::terminate_container)) keeps its exit code, reason and
    /// message; every other init container is recorded as completed with exit code 0.
    pub async fn set_running(&self, ns: &str, pod: &str) -> Result<(), TestkitError> {
        self.update_status(ns, pod, |spec_pod, status| {
            let now = Time(Timestamp::now());
            let spec = spec_pod.spec.clone().unwrap_or_default();
            status.phase = Some("Running".into());
            status.start_time.get_or_insert_with(|| now.clone());
            // Init containers that already terminated (through `terminate_container`) keep their
            // exit code and message; the others are recorded as having completed just now.
            let previous = status.init_container_statuses.take().unwrap_or_default();
            status.init_container_statuses = spec.init_containers.as_ref().map(|cs| {
                cs.iter()
                    .map(|c| {
                        previous
                            .iter()
                            .find(|s| s.name == c.name && is_terminated(s))
                            .cloned()
                            .unwrap_or_else(|| terminated_status(c, 0, "", "Completed", &now))
                    })
                    .collect()
            });
            status.container_statuses = Some(
                spec.containers
                    .iter()
                    .map(|c| ContainerStatus {
                        ready: true,
                        started: Some(true),
                        state: Some(ContainerState {
                            running: Some(ContainerStateRunning {
                                started_at: Some(now.clone()),
                            }),
                            ..ContainerState::default()
                        }),
                        ..base_status(c)
                    })
                    .collect(),
            );
            let conditions = status.conditions.get_or_insert_with(Vec::new);
            for type_ in ["Initialized", "ContainersReady", "Ready"] {
                set_condition(conditions, type_, "True", &now);
            }
            Ok(())
        })
        .await
    }

    /// Records that `container` (an app container or an init container, looked up in the pod
    /// spec) terminated with `exit_code` and termination `message` (what the container wrote to
    /// its termination-message path). Reason is `Completed` for exit code 0, `Error` otherwise.
    ///
    /// When an app container terminates, the pod's `ContainersReady` and `Ready` conditions
    /// become `False`, as a kubelet reports them. The pod phase is left alone; set it with
    /// [`set_phase`](Self::set_phase).
    pub async fn terminate_container(
        &self,
        ns: &str,
        pod: &str,
        container: &str,
        exit_code: i32,
        message: &str,
    ) -> Result<(), TestkitError> {
        self.update_status(ns, pod, |current, status| {
            let spec = current.spec.clone().unwrap_or_default();
            let now = Time(Timestamp::now());
            let reason = if exit_code == 0 { "Completed" } else { "Error" };
            let (list, c, app_container) =
                if let Some(c) = spec.containers.iter().find(|c| c.name == container) {
                    (&mut status.container_statuses, c, true)
                } else if let Some(c) = spec
                    .init_containers
                    .iter()
                    .flatten()
                    .find(|c| c.name == container)
                {
                    (&mut status.init_container_statuses, c, false)
                } else {
                    return Err(TestkitError::NotFound(format!(
                        "pod {ns}/{pod} has no container or init container named {container}"
                    )));
                };
            let new = terminated_status(c, exit_code, message, reason, &now);
            let list = list.get_or_insert_with(Vec::new);
            match list.iter_mut().find(|s| s.name == container) {
                Some(existing) => {
                    let restart_count = existing.restart_count;
                    *existing = ContainerStatus {
                        restart_count,
                        ..new
                    };
                }
                None => list.push(new),
            }
            if app_container {
                let conditions = status.conditions.get_or_insert_with(Vec::new);
                for type_ in ["ContainersReady", "Ready"] {
                    set_condition(conditions, type_, "False", &now);
                }
            }
            Ok(())
        })
        .await
    }

    /// Re-reads the pod, lets `edit` change its status, and writes it back with the read
    /// resourceVersion; retries on conflicts.
    async fn update_status<F>(&self, ns: &str, pod: &str, mut edit: F) -> Result<(), TestkitError>
    where
        F: FnMut(&Pod, &mut PodStatus) -> Result<(), TestkitError>,
    {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let mut attempt = 0;
        loop {
            let mut current = pods
                .get(pod)
                .await
                .map_err(|e| TestkitError::kube(format!("reading pod {ns}/{pod}"), e))?;
            let mut status = current.status.clone().unwrap_or_default();
            edit(&current, &mut status)?;
            current.status = Some(status);
            match pods
                .replace_status(pod, &PostParams::default(), &current)
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < CONFLICT_RETRIES => {
                    attempt += 1;
                }
                Err(e) => {
                    return Err(TestkitError::kube(
                        format!("writing status of pod {ns}/{pod}"),
                        e,
                    ));
                }
            }
        }
    }
}

fn base_status(c: &Container) -> ContainerStatus {
    let image = c.image.clone().unwrap_or_default();
    ContainerStatus {
        name: c.name.clone(),
        image: image.clone(),
        image_id: format!("warmcache-testkit://{image}"),
        container_id: Some(format!("warmcache-testkit://{}", c.name)),
        ready: false,
        restart_count: 0,
        started: Some(false),
        ..ContainerStatus::default()
    }
}

fn terminated_status(
    c: &Container,
    exit_code: i32,
    message: &str,
    reason: &str,
    now: &Time,
) -> ContainerStatus {
    ContainerStatus {
        state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code,
                message: (!message.is_empty()).then(|| message.to_owned()),
                reason: Some(reason.to_owned()),
                started_at: Some(now.clone()),
                finished_at: Some(now.clone()),
                container_id: Some(format!("warmcache-testkit://{}", c.name)),
                signal: None,
            }),
            ..ContainerState::default()
        }),
        ..base_status(c)
    }
}

fn is_terminated(status: &ContainerStatus) -> bool {
    status
        .state
        .as_ref()
        .is_some_and(|state| state.terminated.is_some())
}

fn set_condition(conditions: &mut Vec<PodCondition>, type_: &str, status: &str, now: &Time) {
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = Some(now.clone());
            }
            c.status = status.to_owned();
        }
        None => conditions.push(PodCondition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            last_transition_time: Some(now.clone()),
            ..PodCondition::default()
        }),
    }
}
