//! Every API call `webhook serve` makes, as the permissions its chart roles grant (`cargo xtask
//! gen` renders them into `charts/warmcache/files/rbac/webhook.*.yaml`). Keep this list next to
//! the calls: a call added in `serve.rs` without its permission here fails the API server tests,
//! which run the server as the chart's ServiceAccount.

use warmcache_api_modelcache::MODEL_CACHE_STORAGE_CLASS;
use warmcache_catalog::CONFIG_MAP_NAME;
use warmcache_kube::rbac::{Permission, Scope, events};

/// The webhook's permissions.
const PERMISSIONS: &[Permission] = &[
    Permission {
        group: "nvca.nvcf.nvidia.io",
        resource: "modelcachebindings",
        verbs: &["list", "watch"],
        scope: Scope::ControlNamespace,
        names: &[],
        why: "the binding cache: admissions of a cached model make no API call",
    },
    Permission {
        group: "nvca.nvcf.nvidia.io",
        resource: "modelcachebindings",
        verbs: &["create", "get"],
        scope: Scope::ControlNamespace,
        names: &[],
        why: "create_or_get of the binding of a model's first admission (get reads the winner on AlreadyExists)",
    },
    Permission {
        group: "",
        resource: "namespaces",
        verbs: &["get", "list", "watch"],
        scope: Scope::Cluster,
        names: &[],
        why: "the sharing-domain and opt-out labels of the pod's namespace (metadata watch; get before the cache has it)",
    },
    Permission {
        group: "storage.k8s.io",
        resource: "storageclasses",
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        names: &[MODEL_CACHE_STORAGE_CLASS],
        why: "StorageClass nvcf-sc, the storage a new binding's decision is taken from (watched by name)",
    },
    Permission {
        group: "storage.k8s.io",
        resource: "csidrivers",
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        names: &[],
        why: "the CSIDriver of nvcf-sc's provisioner (fsGroupPolicy, attachRequired) for the decision",
    },
    Permission {
        group: "",
        resource: "configmaps",
        verbs: &["list", "watch"],
        scope: Scope::OwnNamespace,
        names: &[CONFIG_MAP_NAME],
        why: "the storage capability catalog (watched by name in the webhook's namespace)",
    },
    Permission {
        group: "leaderworkerset.x-k8s.io",
        resource: "leaderworkersets",
        verbs: &["get"],
        scope: Scope::Cluster,
        names: &[],
        why: "the LeaderWorkerSet of a worker pod that names no model itself",
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
        warmcache_kube::rbac::check(super::super::serve::COMPONENT, super::PERMISSIONS).unwrap();
    }
}
