//! What a failing real-node test needs to say: every pod of a namespace with its conditions,
//! container states and the tail of each container's logs, the namespace's recent Events, and
//! each node's conditions and taints (a pressure condition explains pods that never start).

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams, LogParams};
use kube::{Client, ResourceExt};

/// Pods (phase, IP, conditions, container states, the last 25 log lines of each container, of
/// its previous run too) and the last 40 Events of `namespace`, then every node's conditions and
/// taints, as text.
pub async fn namespace_report(client: &Client, namespace: &str) -> String {
    let mut out = format!("--- namespace {namespace}\n");
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    for pod in pods
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let name = pod.name_any();
        let status = pod.status.clone().unwrap_or_default();
        out.push_str(&format!(
            "pod {name}: phase {:?}, ip {:?}, conditions {:?}\n",
            status.phase,
            status.pod_ip,
            status
                .conditions
                .iter()
                .flatten()
                .map(|c| format!(
                    "{}={} {}",
                    c.type_,
                    c.status,
                    c.message.clone().unwrap_or_default()
                ))
                .collect::<Vec<_>>()
        ));
        let containers = status
            .init_container_statuses
            .iter()
            .flatten()
            .chain(status.container_statuses.iter().flatten());
        for c in containers {
            out.push_str(&format!(
                "  container {}: ready {}, restarts {}, state {:?}, last {:?}\n",
                c.name, c.ready, c.restart_count, c.state, c.last_state
            ));
            for previous in [false, true] {
                let log = pods
                    .logs(
                        &name,
                        &LogParams {
                            container: Some(c.name.clone()),
                            previous,
                            tail_lines: Some(25),
                            ..LogParams::default()
                        },
                    )
                    .await
                    .unwrap_or_default();
                if !log.is_empty() {
                    out.push_str(&format!(
                        "  --- log{}:\n{log}\n",
                        if previous { " (previous)" } else { "" }
                    ));
                }
            }
        }
    }
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let mut events = events
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    events.sort_by_key(|e| e.last_timestamp.clone().map(|t| t.0));
    for e in events.iter().rev().take(40).rev() {
        out.push_str(&format!(
            "event {} {}: {} {}\n",
            e.involved_object.name.clone().unwrap_or_default(),
            e.type_.clone().unwrap_or_default(),
            e.reason.clone().unwrap_or_default(),
            e.message.clone().unwrap_or_default()
        ));
    }
    out.push_str(&nodes_report(client).await);
    out
}

/// Each node's conditions (type=status reason) and taints, a line each.
async fn nodes_report(client: &Client) -> String {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let mut out = String::new();
    for node in nodes {
        let spec = node.spec.clone().unwrap_or_default();
        let status = node.status.clone().unwrap_or_default();
        out.push_str(&format!(
            "node {}: conditions {:?}, taints {:?}\n",
            node.name_any(),
            status
                .conditions
                .iter()
                .flatten()
                .map(|c| format!(
                    "{}={} {}",
                    c.type_,
                    c.status,
                    c.reason.clone().unwrap_or_default()
                ))
                .collect::<Vec<_>>(),
            spec.taints
                .iter()
                .flatten()
                .map(|t| format!("{}:{}", t.key, t.effect))
                .collect::<Vec<_>>()
        ));
    }
    out
}
