//! Every API call `uninstall-hook` makes, as the permissions its chart roles grant (`cargo xtask
//! gen` renders them into `charts/warmcache/files/rbac/uninstall-hook.*.yaml`). Keep this list
//! next to the calls in `steps.rs`: the tests run the hook as a ServiceAccount bound to the
//! generated ClusterRole, so a missing permission fails them.
//!
//! Everything is cluster-scoped, on purpose. The bindings live in the control namespace, but a
//! Role there would have to be created (as a hook) in the namespace this hook deletes: a
//! retried uninstall, with the namespace already Terminating or gone, could not create it and
//! could never finish. The namespace permissions cannot name the namespace (it is a chart
//! value, the roles are generated). The account and its roles are pre-delete hooks: they exist
//! only while `helm uninstall` runs.

use warmcache_kube::rbac::{Permission, Scope};

/// The component name: ServiceAccount and roles `warmcache-uninstall-hook`.
pub const COMPONENT: &str = "uninstall-hook";

/// The hook's permissions.
const PERMISSIONS: &[Permission] = &[
    Permission {
        group: "worker.gpustack.ai",
        resource: "kvcachebackends",
        verbs: &["list", "delete"],
        scope: Scope::Cluster,
        names: &[],
        why: "step 1: delete every backend (cluster-scoped), then list until the operator's teardown removed them",
    },
    Permission {
        group: "worker.gpustack.ai",
        resource: "kvcachebackends",
        verbs: &["get", "patch"],
        scope: Scope::Cluster,
        names: &[],
        why: "--force: remove the operator's finalizer (a JSON patch guarded by a test op; get re-reads on a failed test)",
    },
    Permission {
        group: "nvca.nvcf.nvidia.io",
        resource: "modelcachebindings",
        verbs: &["get", "list", "patch"],
        scope: Scope::Cluster,
        names: &[],
        why: "step 2: remove the binding finalizer in the control namespace (cluster-wide: a Role in the namespace being deleted could not be recreated by a retried uninstall)",
    },
    Permission {
        group: "",
        resource: "namespaces",
        verbs: &["get", "delete"],
        scope: Scope::Cluster,
        names: &[],
        why: "step 3: delete the control namespace and wait until it is gone (its name is a chart value, so not named here)",
    },
    Permission {
        group: "",
        resource: "persistentvolumes",
        verbs: &["list"],
        scope: Scope::Cluster,
        names: &[],
        why: "report the volumes that keep model data (never deleted)",
    },
];

/// The permissions, for `cargo xtask gen`.
pub fn permissions() -> Vec<Permission> {
    PERMISSIONS.to_vec()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_list_passes_the_check() {
        warmcache_kube::rbac::check(super::COMPONENT, super::PERMISSIONS).unwrap();
    }
}
