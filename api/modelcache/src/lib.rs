//! ModelCacheBinding API types (nvca.nvcf.nvidia.io/v2beta1) and CRD.
//!
//! A `ModelCacheBinding` is the durable record of one shared model cache: one binding per
//! (workflow, sharing domain, cache handle). Its spec freezes the storage decision taken before
//! any claim, Job or PersistentVolume exists; its status tracks which workloads use the cache and
//! what has been realized on the storage. The API server enforces the lifecycle rules with CEL
//! (`x-kubernetes-validations`), see [`v2beta1`].
//!
//! Code names the versioned type, `v2beta1::ModelCacheBinding`, so that a later API version is a
//! new module plus a conversion. This crate carries types, constants and pure naming helpers only.

#[cfg(feature = "fixtures")]
pub mod fixtures;
pub mod names;
pub mod selection;
pub mod v2beta1;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

pub use names::{
    binding_name, identity_hash, init_lease_name, is_identity_hash, reader_pvc_name, sha256_digest,
    writer_job_name, writer_pvc_name,
};

/// API group of the ModelCacheBinding resource.
pub const GROUP: &str = "nvca.nvcf.nvidia.io";

/// Kind of the binding resource.
pub const KIND: &str = "ModelCacheBinding";

/// Plural resource name (the path segment in the REST API).
pub const PLURAL: &str = "modelcachebindings";

/// Name of the CustomResourceDefinition object: `<plural>.<group>`.
pub const CRD_NAME: &str = "modelcachebindings.nvca.nvcf.nvidia.io";

/// Finalizer set on every binding at creation. Only the reaper removes it, after the resources
/// the binding names are gone (or the uninstall hook, which strips it before deleting the control
/// namespace).
pub const FINALIZER: &str = "nvca.nvcf.nvidia.io/model-cache-binding-finalizer";

/// Default control namespace: bindings and the primary volume of each cache live here.
pub const DEFAULT_CONTROL_NAMESPACE: &str = "nvca-modelcache-init";

/// Annotation on the request object that holds its persisted storage selection (JSON), written
/// before any storage side effect.
pub const STORAGE_SELECTION_ANNOTATION: &str = "nvca.nvcf.nvidia.io/model-cache-storage-selection";

/// Contract version of the persisted storage selection and of `spec.identity.version`.
pub const SELECTION_VERSION: &str = "v1alpha1";

/// Namespace label that opts a namespace into cross-namespace sharing. Namespaces carrying the
/// same value share caches (workflow `helmModelCache`, sharing domain = the label value); a
/// namespace without it shares only with itself (workflow `regularModelCache`, sharing domain =
/// the namespace name). The label is an administrator's tool, not a tenant's.
pub const SHARING_DOMAIN_LABEL: &str = "nvca.nvcf.nvidia.io/model-cache-sharing-domain";

/// Name of the StorageClass whose provisioner decides the model cache storage.
pub const MODEL_CACHE_STORAGE_CLASS: &str = "nvcf-sc";

/// The CustomResourceDefinition of every served ModelCacheBinding version (today only
/// `v2beta1`, which is also the storage version).
pub fn crd() -> CustomResourceDefinition {
    v2beta1::ModelCacheBinding::crd()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crd_name_matches_generated_crd() {
        let crd = crd();
        assert_eq!(crd.metadata.name.as_deref(), Some(CRD_NAME));
        assert_eq!(crd.spec.group, GROUP);
        assert_eq!(crd.spec.names.kind, KIND);
        assert_eq!(crd.spec.names.plural, PLURAL);
        assert_eq!(CRD_NAME, format!("{PLURAL}.{GROUP}"));
    }

    #[test]
    fn keys_are_in_our_group() {
        for key in [
            FINALIZER,
            STORAGE_SELECTION_ANNOTATION,
            SHARING_DOMAIN_LABEL,
        ] {
            let (prefix, name) = key.split_once('/').unwrap_or_default();
            assert_eq!(prefix, GROUP, "{key}");
            assert!(!name.is_empty() && name.len() <= 63, "{key}");
        }
    }
}
