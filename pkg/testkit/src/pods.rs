//! Helpers for pods on the real node: a tools-image pod running a shell script, and waits that
//! report what the pod is stuck on when they time out.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Event, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::ListParams;

use crate::{TOOLS_IMAGE, TestkitError};

/// `rendered` (a pod a component rendered for a GPU node) made runnable on the test node, and
/// otherwise left as rendered: every container (init containers too) on [`TOOLS_IMAGE`] with
/// `imagePullPolicy: Never`, `gpu_resource` removed from requests and limits (the node has no
/// GPU), `restartPolicy: Never` (so the containers' reports can be read), a 1 s grace period,
/// and the container `engine` running `sh -c <script> <script_args...>` instead of its engine.
pub fn on_test_node(
    rendered: &Pod,
    gpu_resource: &str,
    engine: &str,
    script: &str,
    script_args: &[&str],
) -> Pod {
    let mut pod = rendered.clone();
    let spec = pod.spec.get_or_insert_with(PodSpec::default);
    spec.restart_policy = Some("Never".to_owned());
    spec.termination_grace_period_seconds = Some(1);
    let containers = spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut());
    for c in containers {
        c.image = Some(TOOLS_IMAGE.to_owned());
        c.image_pull_policy = Some("Never".to_owned());
        if let Some(r) = c.resources.as_mut() {
            for list in [r.requests.as_mut(), r.limits.as_mut()]
                .into_iter()
                .flatten()
            {
                list.remove(gpu_resource);
            }
        }
        if c.name == engine {
            let mut command = vec!["sh".to_owned(), "-c".to_owned(), script.to_owned()];
            command.extend(script_args.iter().map(|a| (*a).to_owned()));
            c.command = Some(command);
            c.args = None;
        }
    }
    pod
}

/// A pod with one container `main` running `sh -c <script>` in [`TOOLS_IMAGE`] with
/// `imagePullPolicy: Never` and `restartPolicy: Never`. Add volumes, mounts or a security
/// context to the returned value as needed.
pub fn tools_pod(name: &str, script: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            termination_grace_period_seconds: Some(1),
            containers: vec![tools_container("main", script)],
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

/// A container `name` running `sh -c <script>` in [`TOOLS_IMAGE`] (`imagePullPolicy: Never`).
pub fn tools_container(name: &str, script: &str) -> Container {
    Container {
        name: name.to_owned(),
        image: Some(TOOLS_IMAGE.to_owned()),
        image_pull_policy: Some("Never".into()),
        command: Some(vec!["sh".into(), "-c".into(), script.to_owned()]),
        ..Container::default()
    }
}

/// Waits until the pod's phase is `Succeeded` or `Failed` and returns it. On timeout the error
/// names the phase, the container states and the pod's recent Events.
pub async fn wait_pod_finished(
    pods: &Api<Pod>,
    name: &str,
    timeout: Duration,
) -> Result<Pod, TestkitError> {
    wait_pod(pods, name, timeout, "finished", |pod| {
        matches!(phase(pod), "Succeeded" | "Failed")
    })
    .await
}

/// Waits until the pod is `Running` with every container ready and returns it.
pub async fn wait_pod_running(
    pods: &Api<Pod>,
    name: &str,
    timeout: Duration,
) -> Result<Pod, TestkitError> {
    wait_pod(pods, name, timeout, "running and ready", |pod| {
        phase(pod) == "Running"
            && pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|cs| cs.iter().all(|c| c.ready))
    })
    .await
}

/// Waits until `done(pod)` holds and returns the pod; `what` names the awaited state.
pub async fn wait_pod<F>(
    pods: &Api<Pod>,
    name: &str,
    timeout: Duration,
    what: &str,
    mut done: F,
) -> Result<Pod, TestkitError>
where
    F: FnMut(&Pod) -> bool,
{
    let start = Instant::now();
    loop {
        let last = match pods.get_opt(name).await {
            Ok(Some(pod)) if done(&pod) => return Ok(pod),
            Ok(found) => found,
            Err(e) => return Err(TestkitError::kube(format!("reading pod {name}"), e)),
        };
        if start.elapsed() >= timeout {
            let state = match &last {
                Some(pod) => describe_pod(pod),
                None => "the pod does not exist".to_owned(),
            };
            let events = pod_events(pods, name).await;
            return Err(TestkitError::Timeout {
                what: format!("pod {name} to be {what}; {state}; events: {events}"),
                seconds: start.elapsed().as_secs_f64(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The termination message of `container` (app or init container), if it terminated.
pub fn termination_message(pod: &Pod, container: &str) -> Option<String> {
    let status = pod.status.as_ref()?;
    status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .find(|c| c.name == container)?
        .state
        .as_ref()?
        .terminated
        .as_ref()?
        .message
        .clone()
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn describe_pod(pod: &Pod) -> String {
    let mut out = format!("phase {:?}", phase(pod));
    let Some(status) = &pod.status else {
        return out;
    };
    for c in status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
    {
        let state = c.state.as_ref();
        let shown = if let Some(w) = state.and_then(|s| s.waiting.as_ref()) {
            format!(
                "waiting {} {}",
                w.reason.clone().unwrap_or_default(),
                w.message.clone().unwrap_or_default()
            )
        } else if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
            format!(
                "terminated exit {} {}",
                t.exit_code,
                t.message.clone().unwrap_or_default()
            )
        } else if state.and_then(|s| s.running.as_ref()).is_some() {
            format!("running ready={}", c.ready)
        } else {
            "no state".to_owned()
        };
        out.push_str(&format!("; {}: {shown}", c.name));
    }
    out
}

async fn pod_events(pods: &Api<Pod>, name: &str) -> String {
    let Some(namespace) = pods.namespace() else {
        return String::new();
    };
    let events: Api<Event> = Api::namespaced(pods.clone().into_client(), namespace);
    let params = ListParams::default().fields(&format!("involvedObject.name={name}"));
    match events.list(&params).await {
        Ok(list) => list
            .items
            .iter()
            .rev()
            .take(8)
            .map(|e| {
                format!(
                    "[{}] {}",
                    e.reason.clone().unwrap_or_default(),
                    e.message.clone().unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join(" | "),
        Err(e) => format!("(listing events failed: {e})"),
    }
}
