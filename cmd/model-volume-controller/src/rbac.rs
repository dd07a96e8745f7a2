//! Every API call `model-volume-controller run` makes, as the permissions its chart roles grant
//! (`cargo xtask gen` renders them). The table of calls in [`crate::agent`]'s documentation says
//! where each is made; keep both next to the code.
//!
//! Staging pods live in the namespaces that read a model, so listing this node's pods is
//! cluster-wide (a ClusterRole; the watch is narrowed by field selector to the node and by
//! label to warmcache's pods, or to reader pods); capture sources are there too, and their
//! namespaces are read for their sharing-domain label. The primary claim lives in the control
//! namespace; mount holders live there (the primary's) and in reader namespaces (a hostPath
//! reader's view: a pod mounts only claims of its own namespace), so creating and deleting pods
//! is cluster-wide. No leader election: no Lease.

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
        why: "this node's pods (field spec.nodeName): staging pods, mount holders and hostPath readers",
    },
    Permission {
        group: "",
        resource: "pods",
        verbs: &["get"],
        scope: Scope::Cluster,
        names: &[],
        why: "the staging pod or capture source a primary claim was elected for, read afresh to find it gone before its copy (the election is then undone and runs again); the binding's mount holder on another node",
    },
    Permission {
        group: "",
        resource: "pods",
        verbs: &["create", "delete"],
        scope: Scope::Cluster,
        names: &[],
        why: "mount holders on this node: the primary's in the control namespace (created to attach it, deleted with a UID precondition once the copy is answered), a view's in a hostPath reader's namespace (deleted with a UID precondition once no reader of the model is left on the node)",
    },
    Permission {
        group: "",
        resource: "pods",
        verbs: &["patch"],
        scope: Scope::Cluster,
        names: &[],
        why: "un-pending a hostPath reader (its nvsnap.io/model-pending label removed, the UID in the merge patch as precondition) once its bind is verified against the mount table",
    },
    Permission {
        group: "",
        resource: "persistentvolumeclaims",
        verbs: &["get"],
        scope: Scope::Cluster,
        names: &[],
        why: "read afresh: the primary claim before a copy (never copied twice); a hostPath reader namespace's view claim (bound to the recorded view) before its bind; a non-root writer's writer view claim before its root is opened",
    },
    Permission {
        group: "",
        resource: "persistentvolumes",
        verbs: &["get"],
        scope: Scope::Cluster,
        names: &[],
        why: "read afresh: a hostPath reader namespace's view PV before its bind (the recorded one, pre-bound to the view claim, its handle derived from the primary's); a non-root writer's writer view PV and the binding's primary before its root is opened (pre-bound to the writer's claim, on the primary's handle)",
    },
    Permission {
        group: "",
        resource: "persistentvolumeclaims",
        verbs: &["list", "watch", "create", "patch", "delete"],
        scope: Scope::ControlNamespace,
        names: &[],
        why: "the primary claim: created sized from the measured bytes (the atomic create elects one agent), a ReadWriteMany one elected for a capture source and the election undone (merge patches with resourceVersion), the copy, failed attempts and a given-up capture recorded (merge patch with resourceVersion), deleted after three failed staged copies or when its staging pod or capture source is gone before the copy (UID precondition)",
    },
    Permission {
        group: "",
        resource: "namespaces",
        verbs: &["get"],
        scope: Scope::Cluster,
        names: &[],
        why: "a capture source's namespace, read afresh: its labels (an administrator's) decide its sharing domain, which must be the binding's before the pod's download is captured into the binding's primary",
    },
    Permission {
        group: "nvca.nvcf.nvidia.io",
        resource: "modelcachebindings",
        verbs: &["list", "watch"],
        scope: Scope::ControlNamespace,
        names: &[],
        why: "the binding a staging pod or a hostPath reader names (its UID, decision, data identity and recorded views)",
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
