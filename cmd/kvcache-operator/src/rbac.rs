//! Every API call `kvcache-operator controller` makes, as the permissions its chart roles grant
//! (`cargo xtask gen` renders them into `charts/warmcache/files/rbac/kvcache-operator.*.yaml`).
//! Keep this list next to the calls in `controller.rs`: the API server tests run the controller
//! as the chart's ServiceAccount, so a missing permission fails them. `kvcache-operator webhook`
//! makes no API call and gets no role.
//!
//! "Own namespace" is the operator's system namespace (`--namespace`), where it renders the
//! workloads. Server-side apply of an object that does not exist yet is authorized as `create`
//! as well as `patch`, so every applied kind needs both.

use warmcache_kube::rbac::{Permission, Scope, events};

/// The controller's permissions.
const PERMISSIONS: &[Permission] = &[
    Permission {
        group: "worker.gpustack.ai",
        resource: "kvcachebackends",
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        names: &[],
        why: "the backends to reconcile (cluster-scoped); the teardown reads the others' paths",
    },
    Permission {
        group: "worker.gpustack.ai",
        resource: "kvcachebackends",
        verbs: &["get", "patch"],
        scope: Scope::Cluster,
        names: &[],
        why: "add and remove the teardown finalizer (JSON patches guarded by a test op; get re-reads the backend when the guard fails)",
    },
    Permission {
        group: "worker.gpustack.ai",
        resource: "kvcachebackends/status",
        verbs: &["patch"],
        scope: Scope::Cluster,
        names: &[],
        why: "the status, by server-side apply",
    },
    Permission {
        group: "",
        resource: "nodes",
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        names: &[],
        why: "the nodes a tier cleanup selects by label (metadata watch)",
    },
    Permission {
        group: "apps",
        resource: "deployments",
        verbs: &["list", "watch", "create", "patch", "delete"],
        scope: Scope::OwnNamespace,
        names: &[],
        why: "the leader Deployment: watched, applied (server-side apply), pruned when no longer rendered",
    },
    Permission {
        group: "apps",
        resource: "daemonsets",
        verbs: &["list", "watch", "create", "patch", "delete"],
        scope: Scope::OwnNamespace,
        names: &[],
        why: "one member DaemonSet per group: watched, applied, pruned when the group is removed",
    },
    Permission {
        group: "",
        resource: "services",
        verbs: &["list", "watch", "create", "patch", "delete"],
        scope: Scope::OwnNamespace,
        names: &[],
        why: "the leader Service: watched, applied, pruned",
    },
    Permission {
        group: "",
        resource: "pods",
        verbs: &["list", "watch", "create", "delete"],
        scope: Scope::OwnNamespace,
        names: &[],
        why: "member and leader Pods (readiness, one-at-a-time restarts by delete) and the tier cleanup Pods it creates and removes",
    },
    Permission {
        group: "",
        resource: "serviceaccounts",
        verbs: &["list", "create", "patch", "delete"],
        scope: Scope::OwnNamespace,
        names: &[],
        why: "the ServiceAccounts of an HA backend's Lease election: applied, pruned when HA is off",
    },
    Permission {
        group: "rbac.authorization.k8s.io",
        resource: "roles",
        verbs: &["list", "create", "patch", "delete"],
        scope: Scope::OwnNamespace,
        names: &[],
        why: "the Roles of an HA backend's Lease election: applied, pruned",
    },
    Permission {
        group: "rbac.authorization.k8s.io",
        resource: "rolebindings",
        verbs: &["list", "create", "patch", "delete"],
        scope: Scope::OwnNamespace,
        names: &[],
        why: "the RoleBindings of an HA backend's Lease election: applied, pruned",
    },
    Permission {
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "list", "watch", "create", "update", "patch"],
        scope: Scope::OwnNamespace,
        names: &[],
        why: "its own leader election (get, create, update), and what the Roles it renders for a backend's Lease election grant: Kubernetes lets it grant only what it holds (no escalate)",
    },
    events(Scope::Cluster),
];

/// The permissions, for `cargo xtask gen`.
pub fn permissions() -> Vec<Permission> {
    PERMISSIONS.to_vec()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_list_passes_the_check() {
        warmcache_kube::rbac::check(crate::webhook::COMPONENT, super::PERMISSIONS).unwrap();
    }
}
