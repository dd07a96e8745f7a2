//! Every API call `binding-controller controller` makes, as the permissions its chart roles
//! grant (`cargo xtask gen` renders them into `charts/warmcache/files/rbac/binding-controller.*.yaml`).
//! The table of calls in [`crate::controller`]'s documentation says where each is made; keep
//! both next to the code. No `delete` on PersistentVolumes, Jobs or bindings: deleting data is
//! the reaper's.
//!
//! Claims, Jobs and reading pods live in whichever namespaces read a model, so those grants are
//! cluster-wide (a ClusterRole); bindings, the primary claim and the writer Leases are in the
//! control namespace; the leader-election Lease in the component's own.

use warmcache_api_modelcache::MODEL_CACHE_STORAGE_CLASS;
use warmcache_catalog::CONFIG_MAP_NAME;
use warmcache_kube::rbac::{Permission, Scope, events, leader_election};

/// The component name: roles, Lease, metrics.
pub const COMPONENT: &str = "binding-controller";

/// `get` on a kind that can own reading pods: top-level owners and stale request references
/// (the owner walk follows controller references with metadata-only GETs).
const fn owner(group: &'static str, resource: &'static str) -> Permission {
    Permission {
        group,
        resource,
        verbs: &["get"],
        scope: Scope::Cluster,
        names: &[],
        why: "top-level owners of reading pods, and stale request references",
    }
}

const OWN: &[Permission] = &[
    Permission {
        group: "nvca.nvcf.nvidia.io",
        resource: "modelcachebindings",
        verbs: &["list", "watch"],
        scope: Scope::ControlNamespace,
        names: &[],
        why: "the bindings to reconcile",
    },
    Permission {
        group: "nvca.nvcf.nvidia.io",
        resource: "modelcachebindings/status",
        verbs: &["update"],
        scope: Scope::ControlNamespace,
        names: &[],
        why: "status, references and views (PUT with the read resourceVersion)",
    },
    Permission {
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "list", "watch", "create", "update"],
        scope: Scope::ControlNamespace,
        names: &[],
        why: "the cluster-wide writer Lease of each binding (atomic create as election, update with preconditions; a fresh get before releasing a writer claim an earlier writer left behind)",
    },
    Permission {
        group: "",
        resource: "pods",
        verbs: &["get", "list", "watch"],
        scope: Scope::Cluster,
        names: &[],
        why: "reading pods of a binding (metadata watch), the download step of a reading pod (not kept in the watch cache: read for the writer election and when the writer Job is created, with the literal secrets a derived step copies from its pod), the writer's last words",
    },
    Permission {
        group: "",
        resource: "pods",
        verbs: &["delete"],
        scope: Scope::Cluster,
        names: &[],
        why: "after a failed download, readers still waiting (not Ready) are deleted so their controllers recreate them on their own download path (UID precondition)",
    },
    Permission {
        group: "",
        resource: "namespaces",
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        names: &[],
        why: "sharing-domain labels (tenancy check), metadata watch",
    },
    Permission {
        group: "",
        resource: "persistentvolumeclaims",
        verbs: &["get", "list", "watch", "create"],
        scope: Scope::Cluster,
        names: &[],
        why: "primary, writer view and read-only view claims: watched by label, created under deterministic names, read back on AlreadyExists",
    },
    Permission {
        group: "",
        resource: "persistentvolumeclaims",
        verbs: &["delete"],
        scope: Scope::Cluster,
        names: &[],
        why: "releasing the writer view claim once completion is stored, and (roxReadOnly) the complete primary claim so its volume detaches (UID precondition)",
    },
    Permission {
        group: "",
        resource: "persistentvolumes",
        verbs: &["get", "list", "watch", "create", "update"],
        scope: Scope::Cluster,
        names: &[],
        why: "the primary PV (completion labels, Retain), the writer view and read-only view PVs derived from it",
    },
    Permission {
        group: "batch",
        resource: "jobs",
        verbs: &["get", "list", "watch", "create"],
        scope: Scope::Cluster,
        names: &[],
        why: "the writer Job (created in the writer namespace; get confirms a Lease holder's Job is gone), and Job owners of reading pods",
    },
    owner("apps", "replicasets"),
    owner("apps", "deployments"),
    owner("apps", "statefulsets"),
    owner("apps", "daemonsets"),
    owner("batch", "cronjobs"),
    owner("leaderworkerset.x-k8s.io", "leaderworkersets"),
    Permission {
        group: "storage.k8s.io",
        resource: "storageclasses",
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        names: &[MODEL_CACHE_STORAGE_CLASS],
        why: "decision drift: what nvcf-sc says today (with --catalog-namespace)",
    },
    Permission {
        group: "storage.k8s.io",
        resource: "volumeattachments",
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        names: &[],
        why: "roxReadOnly: read-only views wait until no VolumeAttachment attaches the complete primary (a block driver refuses a read-only attach while it is attached read-write)",
    },
    Permission {
        group: "storage.k8s.io",
        resource: "csidrivers",
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        names: &[],
        why: "decision drift: the CSIDriver of nvcf-sc's provisioner (with --catalog-namespace)",
    },
    Permission {
        group: "",
        resource: "configmaps",
        verbs: &["list", "watch"],
        scope: Scope::OwnNamespace,
        names: &[CONFIG_MAP_NAME],
        why: "decision drift: the catalog, in the webhook's namespace (--catalog-namespace; the chart installs both in the release namespace)",
    },
    Permission {
        group: "",
        resource: "secrets",
        verbs: &["get", "create"],
        scope: Scope::ControlNamespace,
        names: &[],
        why: "an encrypted cache's key Secret: created with a generated key before the staging Job, read back as metadata only (the controller never receives a key)",
    },
    Permission {
        group: "storage.k8s.io",
        resource: "storageclasses",
        verbs: &["get", "create"],
        scope: Scope::Cluster,
        names: &[],
        why: "an encrypted cache's StorageClass, derived from nvcf-sc (read while the encrypted class is missing)",
    },
    events(Scope::ControlNamespace),
];

/// The controller's permissions: its own calls and the runtime's leader election.
pub fn permissions() -> Vec<Permission> {
    OWN.iter()
        .copied()
        .chain(leader_election(&[COMPONENT]))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_list_passes_the_check_and_includes_leader_election() {
        let permissions = super::permissions();
        warmcache_kube::rbac::check(super::COMPONENT, &permissions).unwrap();
        assert!(permissions.iter().any(
            |p| p.resource == "leases" && p.scope == warmcache_kube::rbac::Scope::OwnNamespace
        ));
    }
}
