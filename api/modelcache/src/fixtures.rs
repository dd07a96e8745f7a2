//! A binding as the webhook creates one, for tests of the components that read bindings
//! (feature `fixtures`; never in a build of a binary). One fixture, so the tests of the binding
//! controller, the reaper, the uninstall hook and the chart agree on what a binding looks like.

use crate::v2beta1::{
    BindingDecision, BindingIdentity, BindingResources, BindingStorageClass, ModelCacheBinding,
    ModelCacheBindingSpec, ReclaimPolicy, Transition, Workflow, WriterIdentity,
};
use crate::{
    FINALIZER, MODEL_CACHE_STORAGE_CLASS, binding_name, init_lease_name, reader_pvc_name,
    sha256_digest, writer_job_name, writer_pvc_name,
};

/// The provisioner of [`binding`]'s decision (no driver of that name runs anywhere).
pub const PROVISIONER: &str = "fake.csi.warmcache.io";

/// The binding of `identity` in `control` with the webhook's names and finalizer: a shared
/// file system (`weka`, RwxReadOnly, fsGroup writer) on `nvcf-sc`, written from
/// `writer_namespace`; the writer claim and Job, the reader claim of a regularModelCache and the
/// writer Lease of a helmModelCache, as `desired_binding` records them.
pub fn binding(
    control: &str,
    writer_namespace: &str,
    identity: BindingIdentity,
) -> ModelCacheBinding {
    binding_with(control, writer_namespace, identity, Transition::RwxReadOnly)
}

/// [`binding`] with another transition (`RoxReadOnly` for block storage: no writer identity).
pub fn binding_with(
    control: &str,
    writer_namespace: &str,
    identity: BindingIdentity,
    transition: Transition,
) -> ModelCacheBinding {
    let workflow = identity.workflow;
    let mut claims = vec![writer_pvc_name(&identity)];
    if workflow == Workflow::RegularModelCache {
        claims.push(reader_pvc_name(&identity));
    }
    let spec = ModelCacheBindingSpec {
        identity: identity.clone(),
        decision: BindingDecision {
            provider: "weka".into(),
            provisioner: PROVISIONER.into(),
            transition,
            required_access_modes: transition.required_access_modes().to_vec(),
            required_mount_options: Vec::new(),
            catalog_digest: sha256_digest("profile"),
            encryption_required: false,
            writer_identity: (transition == Transition::RwxReadOnly)
                .then_some(WriterIdentity::FsGroup),
        },
        storage_class: BindingStorageClass {
            name: MODEL_CACHE_STORAGE_CLASS.into(),
            uid: "sc-uid".into(),
            reclaim_policy: ReclaimPolicy::Retain,
            configuration_digest: format!("v1:{}", sha256_digest("sc")),
        },
        resources: BindingResources {
            writer_namespace: writer_namespace.into(),
            persistent_volume_claim_names: claims,
            job_names: vec![writer_job_name(&identity)],
            lease_name: if workflow == Workflow::HelmModelCache {
                init_lease_name(&identity)
            } else {
                String::new()
            },
            ..BindingResources::default()
        },
    };
    let mut b = ModelCacheBinding::new(&binding_name(&identity), spec);
    b.metadata.namespace = Some(control.into());
    b.metadata.finalizers = Some(vec![FINALIZER.into()]);
    b
}
