//! Every API call the reaper makes, as the permissions its chart roles grant (`cargo xtask gen`
//! renders them into `config/rbac/reaper.*`). Where each call is made: [`crate::sweep`].
//!
//! The reaper deletes, so its roles are the widest of warmcache's on storage objects; each
//! delete is guarded in code (UID precondition, warmcache's labels, the rule's proof) and the
//! `why` says which rule makes it. An encrypted cache's key Secret and StorageClass live as long
//! as its data, not its binding: only `orphan-encryption` deletes them, once no binding, volume
//! or claim can need them. The Secrets are listed and deleted as metadata only: the reaper
//! never receives a key (RBAC cannot say so: `list` on secrets would allow reading them, so the
//! grant is limited to the control namespace, where only warmcache's keys live).

use warmcache_kube::rbac::{Permission, Scope, events, leader_election};

/// The component name: roles, metrics, the leader Lease.
pub const COMPONENT: &str = "reaper";

const OWN: &[Permission] = &[
    Permission {
        group: "nvca.nvcf.nvidia.io",
        resource: "modelcachebindings",
        verbs: &["list", "get", "delete", "patch"],
        scope: Scope::ControlNamespace,
        names: &[],
        why: "bindings listed page by page; a Retiring one read afresh, deleted once what it names is gone (UID precondition) and its finalizer removed (JSON patch testing its UID and finalizers); the binding of a complete primary's model (or of an encrypted cache) read afresh before its storage (or its key and class) goes",
    },
    Permission {
        group: "nvca.nvcf.nvidia.io",
        resource: "modelcachebindings/status",
        verbs: &["update"],
        scope: Scope::ControlNamespace,
        names: &[],
        why: "idle-retirement: phase Retiring, written with the resourceVersion read",
    },
    Permission {
        group: "",
        resource: "pods",
        verbs: &["list"],
        scope: Scope::Cluster,
        names: &[],
        why: "live pods reading a binding (its model label), and the live pods of a namespace that holds a claim a rule would delete",
    },
    Permission {
        group: "",
        resource: "pods",
        verbs: &["delete"],
        scope: Scope::Cluster,
        names: &[],
        why: "orphan-claim: the mount holders (warmcache's, label app.kubernetes.io/component=mount-holder) of a deleted view claim, UID precondition",
    },
    Permission {
        group: "",
        resource: "persistentvolumeclaims",
        verbs: &["list", "get", "delete"],
        scope: Scope::Cluster,
        names: &[],
        why: "orphan-claim: view claims (warmcache's labels) listed page by page; orphan-encryption: every claim, for the StorageClass it asks for; retired-binding: the claims a binding names, read and deleted (UID precondition); the claim a Released PV names, read afresh to prove it gone",
    },
    Permission {
        group: "",
        resource: "persistentvolumes",
        verbs: &["list", "get", "delete", "patch"],
        scope: Scope::Cluster,
        names: &[],
        why: "volume rules: PVs listed page by page (orphan-encryption: every PV, for the classes and Secrets it names); a retirement's claims checked for their PV's reclaim policy; view PV objects deleted (UID and resourceVersion preconditions); a primary's reclaim policy set to Delete and its last use stamped (merge patch with resourceVersion)",
    },
    Permission {
        group: "storage.k8s.io",
        resource: "volumeattachments",
        verbs: &["list"],
        scope: Scope::Cluster,
        names: &[],
        why: "the guard of every volume rule: a PV a VolumeAttachment names is kept",
    },
    Permission {
        group: "",
        resource: "namespaces",
        verbs: &["get"],
        scope: Scope::Cluster,
        names: &[],
        why: "orphan-view and expired-primary: a namespace is gone only on NotFound",
    },
    Permission {
        group: "batch",
        resource: "jobs",
        verbs: &["get", "delete"],
        scope: Scope::Cluster,
        names: &[],
        why: "retired-binding: the writer Jobs a binding names, in its writer namespaces (background propagation, UID precondition)",
    },
    Permission {
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "delete"],
        scope: Scope::ControlNamespace,
        names: &[],
        why: "retired-binding: the writer Lease a binding names",
    },
    Permission {
        group: "",
        resource: "secrets",
        verbs: &["list", "delete"],
        scope: Scope::ControlNamespace,
        names: &[],
        why: "orphan-encryption: the key Secrets of encrypted caches (warmcache's encryption labels) listed as metadata only (never a key), deleted once nothing can need them (UID and resourceVersion preconditions, metadata-only answer)",
    },
    Permission {
        group: "storage.k8s.io",
        resource: "storageclasses",
        verbs: &["list", "delete"],
        scope: Scope::Cluster,
        names: &[],
        why: "orphan-encryption: the StorageClasses of encrypted caches (warmcache's encryption labels) listed, and a key Secret's class looked up by name before the Secret goes; a class deleted once no binding, volume or claim uses it (UID and resourceVersion preconditions)",
    },
    events(Scope::ControlNamespace),
];

/// The reaper's permissions: its own calls and the runtime's leader election.
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
        assert!(
            permissions.iter().all(
                |p| !p.verbs.contains(&"watch") && !p.verbs.contains(&"create")
                    || p.resource == "leases"
                    || p.resource == "events"
            ),
            "the reaper reads afresh and creates nothing of its own"
        );
        // Secrets: listed (as metadata) and deleted in the control namespace only; never read.
        let secrets: Vec<_> = permissions
            .iter()
            .filter(|p| p.resource == "secrets")
            .collect();
        assert_eq!(secrets.len(), 1, "{secrets:?}");
        assert_eq!(secrets[0].verbs, ["list", "delete"]);
        assert_eq!(
            secrets[0].scope,
            warmcache_kube::rbac::Scope::ControlNamespace
        );
    }
}
