//! Every API call `model-volume-controller run` makes, as the permissions its chart roles grant
//! (`cargo xtask gen` renders them). The table of calls in [`crate::agent`]'s documentation says
//! where each is made; keep both next to the code.
//!
//! Staging pods live in the namespaces that read a model, so listing this node's pods is
//! cluster-wide (a ClusterRole; the watch is narrowed by field selector to the node and by
//! label to warmcache's pods). Everything the agent creates or deletes is in the control
//! namespace. No leader election: no Lease.

use warmcache_kube::rbac::{Permission, Scope, events};

/// The component name: roles, metrics.
pub const COMPONENT: &str = "model-volume-controller";

const OWN: &[Permission] = &[
    Permission {
        group: "",
        resource: "pods",
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        names: &[],
        why: "this node's staging pods and mount holders (field spec.nodeName, label app.kubernetes.io/managed-by=warmcache)",
    },
    Permission {
        group: "",
        resource: "pods",
        verbs: &["get"],
        scope: Scope::Cluster,
        names: &[],
        why: "the staging pod a primary claim was created for, read afresh to find it gone before its copy (the claim is then dropped and the election runs again); the binding's mount holder on another node",
    },
    Permission {
        group: "",
        resource: "pods",
        verbs: &["create", "delete"],
        scope: Scope::ControlNamespace,
        names: &[],
        why: "mount holders on this node: created to attach the primary, deleted (UID precondition) once the copy is answered",
    },
    Permission {
        group: "",
        resource: "persistentvolumeclaims",
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
        scope: Scope::ControlNamespace,
        names: &[],
        why: "the primary claim: created sized from the measured bytes (the atomic create elects one agent), read afresh before a copy, the copy and failed attempts recorded (merge patch with resourceVersion), deleted after three failed copies (UID precondition)",
    },
    Permission {
        group: "nvca.nvcf.nvidia.io",
        resource: "modelcachebindings",
        verbs: &["list", "watch"],
        scope: Scope::ControlNamespace,
        names: &[],
        why: "the binding a staging pod names (its UID and decision)",
    },
    events(Scope::Cluster),
];

/// The agent's permissions.
pub fn permissions() -> Vec<Permission> {
    OWN.to_vec()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_list_passes_the_check() {
        let permissions = super::permissions();
        warmcache_kube::rbac::check(super::COMPONENT, &permissions).unwrap();
        assert!(permissions.iter().all(|p| p.resource != "leases"));
    }
}
