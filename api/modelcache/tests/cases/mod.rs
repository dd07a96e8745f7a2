//! Shared table of CEL cases for the ModelCacheBinding CRD.
//!
//! Every object is a complete, schema-valid ModelCacheBinding, so a real kube-apiserver gets past
//! structural validation and reaches the `x-kubernetes-validations` rules. `tests/cel.rs`
//! evaluates the table with kube-cel against the rules of the generated CRD; an integration test
//! can replay the same table against a real API server:
//!
//! - `old == None`: create `new` through the main endpoint (the API server drops `status` on
//!   create when the status subresource is enabled).
//! - `old == Some(_)`: create `old` (main endpoint, then `old.status`, if any, through
//!   `/status`), then update to `new` through `target`. Every `old` is reachable that way.
//! - Main-endpoint updates keep `status` equal to the old one and `/status` updates keep `spec`
//!   and `metadata` equal to the old ones, because the API server would reset those parts
//!   anyway (`tests/cel.rs` checks this), so what is validated is exactly `new`.
//!
//! `message` is a substring of the refusal the API server returns.
#![allow(dead_code)] // each including test crate uses a different part of this module

use serde_json::{Value, json};
use warmcache_api_modelcache::v2beta1::{BindingIdentity, Workflow};
use warmcache_api_modelcache::v2beta1::{
    MSG_ACCESS_MODES_MATCH_TRANSITION, MSG_ENCRYPTION_NEEDS_ROX, MSG_PHASE_KEPT,
    MSG_PROVIDER_DATA_IDENTITY_IMMUTABLE, MSG_RESOLVED_REVISION_IMMUTABLE, MSG_RETIRING_IS_FINAL,
    MSG_SPEC_IMMUTABLE, MSG_STATUS_KEPT, MSG_WRITER_IDENTITY_WITH_RWX,
};
use warmcache_api_modelcache::{
    binding_name, identity_hash, init_lease_name, reader_pvc_name, sha256_digest, writer_job_name,
    writer_pvc_name,
};

/// The identity of the regularModelCache (rwxReadOnly) binding of the cases.
pub fn rwx_identity() -> BindingIdentity {
    BindingIdentity::new(Workflow::RegularModelCache, WRITER_NAMESPACE, CACHE_HANDLE)
}

/// The identity of the helmModelCache (roxReadOnly) binding of the cases.
pub fn rox_identity() -> BindingIdentity {
    BindingIdentity::new(Workflow::HelmModelCache, "nca-0123456789", CACHE_HANDLE)
}

/// Which endpoint an update goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The main resource endpoint (create, or update of spec/metadata; status is kept).
    Main,
    /// The `/status` subresource (update of status only; spec and metadata are kept).
    Status,
}

/// One admission case.
#[derive(Clone, Debug)]
pub struct Case {
    /// Unique, descriptive name.
    pub name: &'static str,
    /// The stored object, or `None` for a create.
    pub old: Option<Value>,
    /// The object sent.
    pub new: Value,
    /// Endpoint of the write.
    pub target: Target,
    /// Whether the API server accepts the write.
    pub allowed: bool,
    /// For a refusal: a substring of the refusal message.
    pub message: Option<&'static str>,
}

/// Namespace the test objects live in.
pub const NAMESPACE: &str = "default";

/// Cache handle of the test binding.
pub const CACHE_HANDLE: &str = "hf://Qwen/Qwen3-0.6B@v1";

/// Namespace of the first request (the writer namespace).
pub const WRITER_NAMESPACE: &str = "team-a";

/// A complete regularModelCache binding on an RWX driver (weka), no status.
pub fn rwx_binding() -> Value {
    json!({
        "apiVersion": "nvca.nvcf.nvidia.io/v2beta1",
        "kind": "ModelCacheBinding",
        "metadata": {
            "name": binding_name(&rwx_identity()),
            "namespace": NAMESPACE,
            "finalizers": [warmcache_api_modelcache::FINALIZER],
        },
        "spec": {
            "identity": {
                "version": "v1alpha1",
                "workflow": "regularModelCache",
                "sharingDomainDigest": sha256_digest(WRITER_NAMESPACE),
                "cacheHandleDigest": sha256_digest(CACHE_HANDLE),
            },
            "decision": {
                "provider": "weka",
                "provisioner": "csi.weka.io",
                "transition": "rwxReadOnly",
                "requiredAccessModes": ["ReadWriteMany"],
                "catalogDigest": sha256_digest("weka profile"),
                "encryptionRequired": false,
                "writerIdentity": "fsGroup",
            },
            "storageClass": {
                "name": "nvcf-sc",
                "uid": "5f0c1f3e-8a59-4c2a-9d0e-1b2c3d4e5f60",
                "reclaimPolicy": "Retain",
                "configurationDigest": format!("v1:{}", sha256_digest("nvcf-sc configuration")),
            },
            "resources": {
                "writerNamespace": WRITER_NAMESPACE,
                "persistentVolumeClaimNames": [
                    writer_pvc_name(&rwx_identity()),
                    reader_pvc_name(&rwx_identity()),
                ],
                "jobNames": [writer_job_name(&rwx_identity())],
            },
        },
    })
}

/// A complete helmModelCache binding on NVMesh (roxReadOnly, encrypted), no status.
pub fn rox_binding() -> Value {
    let hash = identity_hash(&rox_identity());
    json!({
        "apiVersion": "nvca.nvcf.nvidia.io/v2beta1",
        "kind": "ModelCacheBinding",
        "metadata": {
            "name": binding_name(&rox_identity()),
            "namespace": NAMESPACE,
            "finalizers": [warmcache_api_modelcache::FINALIZER],
        },
        "spec": {
            "identity": {
                "version": "v1alpha1",
                "workflow": "helmModelCache",
                "sharingDomainDigest": sha256_digest("nca-0123456789"),
                "cacheHandleDigest": sha256_digest(CACHE_HANDLE),
            },
            "decision": {
                "provider": "nvmesh",
                "provisioner": "nvmesh-csi.excelero.com",
                "transition": "roxReadOnly",
                "requiredAccessModes": ["ReadWriteOnce", "ReadOnlyMany"],
                "requiredMountOptions": ["ro", "norecovery", "nouuid"],
                "catalogDigest": sha256_digest("nvmesh profile"),
                "encryptionRequired": true,
            },
            "storageClass": {
                "name": "nvcf-sc",
                "uid": "7a1b2c3d-0000-4000-8000-0123456789ab",
                "reclaimPolicy": "Retain",
                "configurationDigest": format!("v1:{}", sha256_digest("nvmesh class")),
            },
            "resources": {
                "writerNamespace": WRITER_NAMESPACE,
                "persistentVolumeClaimNames": [writer_pvc_name(&rox_identity())],
                "jobNames": [writer_job_name(&rox_identity())],
                "storageClassNames": [format!("{hash}-sc")],
                "secretNames": [hash],
                "leaseName": init_lease_name(&rox_identity()),
            },
        },
    })
}

/// A request reference to a Deployment.
pub fn reference(name: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "namespace": WRITER_NAMESPACE,
        "name": name,
        "uid": uid,
    })
}

/// A read-only view in `namespace`.
pub fn view(namespace: &str) -> Value {
    json!({
        "namespace": namespace,
        "persistentVolumeName": format!("ro-pv-{}-{namespace}", &identity_hash(&rwx_identity())[..16]),
        "persistentVolumeClaimName": reader_pvc_name(&rwx_identity()),
    })
}

/// A status in `phase` with one reference and one condition.
pub fn status(phase: &str) -> Value {
    json!({
        "phase": phase,
        "lastPhaseTransitionTime": "2026-01-01T00:00:00Z",
        "requestReferences": [reference("vllm", "0d9c6c62-1111-4a2b-8c3d-000000000001")],
        "conditions": [{
            "type": "Ready",
            "status": "False",
            "reason": "Populating",
            "message": "writer Job is downloading",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
            "observedGeneration": 1,
        }],
    })
}

/// An Active status whose `realized` records `provider_data_identity`.
pub fn status_with_identity(provider_data_identity: &str) -> Value {
    with(
        status("Active"),
        "/realized",
        json!({
            "boundPersistentVolumeName": "pvc-3c0e8d4a-5b6f-4a1e-9c2d-7e8f9a0b1c2d",
            "providerDataIdentity": provider_data_identity,
            "populationState": "Populating",
            "views": [view(WRITER_NAMESPACE)],
        }),
    )
}

/// `value` with the JSON pointer `pointer` set to `field` (missing objects are created).
pub fn with(mut value: Value, pointer: &str, field: Value) -> Value {
    let mut node = &mut value;
    let mut segments = pointer.split('/').skip(1).peekable();
    while let Some(segment) = segments.next() {
        let Value::Object(map) = node else {
            return value;
        };
        if segments.peek().is_none() {
            map.insert(segment.to_owned(), field);
            return value;
        }
        node = map.entry(segment.to_owned()).or_insert_with(|| json!({}));
    }
    value
}

/// `value` without the field at the JSON pointer `pointer`.
pub fn without(mut value: Value, pointer: &str) -> Value {
    if let Some((parent, key)) = pointer.rsplit_once('/')
        && let Some(Value::Object(map)) = value.pointer_mut(parent)
    {
        map.remove(key);
    }
    value
}

fn create(name: &'static str, new: Value) -> Case {
    Case {
        name,
        old: None,
        new,
        target: Target::Main,
        allowed: true,
        message: None,
    }
}

fn refused_create(name: &'static str, new: Value, message: &'static str) -> Case {
    Case {
        name,
        old: None,
        new,
        target: Target::Main,
        allowed: false,
        message: Some(message),
    }
}

fn update(name: &'static str, target: Target, old: Value, new: Value) -> Case {
    Case {
        name,
        old: Some(old),
        new,
        target,
        allowed: true,
        message: None,
    }
}

fn refused_update(
    name: &'static str,
    target: Target,
    old: Value,
    new: Value,
    message: &'static str,
) -> Case {
    Case {
        name,
        old: Some(old),
        new,
        target,
        allowed: false,
        message: Some(message),
    }
}

/// The binding `base` with `status`.
fn with_status(base: Value, status: Value) -> Value {
    with(base, "/status", status)
}

/// Every case.
pub fn cases() -> Vec<Case> {
    let rwx = rwx_binding();
    let rox = rox_binding();
    let active = with_status(rwx.clone(), status("Active"));
    let retiring = with_status(rwx.clone(), status("Retiring"));
    let recorded = with_status(rwx.clone(), status_with_identity("csi.weka.io/vol-0001"));
    let mut cases = Vec::new();

    // --- create: the decision rules run; transition rules never do -----------------------------
    cases.extend([
        create("create rwxReadOnly binding", rwx.clone()),
        create("create encrypted roxReadOnly helm binding", rox.clone()),
        create(
            "create roxReadOnly with modes in another order",
            with(
                rox.clone(),
                "/spec/decision/requiredAccessModes",
                json!(["ReadOnlyMany", "ReadWriteOnce"]),
            ),
        ),
        create(
            "create roxReadOnly without encryption or mount options",
            without(
                with(
                    rox.clone(),
                    "/spec/decision/encryptionRequired",
                    json!(false),
                ),
                "/spec/decision/requiredMountOptions",
            ),
        ),
        create(
            "create with a status (dropped by the server; transition rules skipped)",
            retiring.clone(),
        ),
        refused_create(
            "create rwxReadOnly with the roxReadOnly modes",
            with(
                rwx.clone(),
                "/spec/decision/requiredAccessModes",
                json!(["ReadWriteOnce", "ReadOnlyMany"]),
            ),
            MSG_ACCESS_MODES_MATCH_TRANSITION,
        ),
        refused_create(
            "create rwxReadOnly with an extra mode",
            with(
                rwx.clone(),
                "/spec/decision/requiredAccessModes",
                json!(["ReadWriteMany", "ReadOnlyMany"]),
            ),
            MSG_ACCESS_MODES_MATCH_TRANSITION,
        ),
        refused_create(
            "create roxReadOnly with ReadOnlyMany only",
            with(
                rox.clone(),
                "/spec/decision/requiredAccessModes",
                json!(["ReadOnlyMany"]),
            ),
            MSG_ACCESS_MODES_MATCH_TRANSITION,
        ),
        refused_create(
            "create roxReadOnly with ReadWriteOncePod instead of ReadWriteOnce",
            with(
                rox.clone(),
                "/spec/decision/requiredAccessModes",
                json!(["ReadWriteOncePod", "ReadOnlyMany"]),
            ),
            MSG_ACCESS_MODES_MATCH_TRANSITION,
        ),
        refused_create(
            "create roxReadOnly with a third mode",
            with(
                rox.clone(),
                "/spec/decision/requiredAccessModes",
                json!(["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany"]),
            ),
            MSG_ACCESS_MODES_MATCH_TRANSITION,
        ),
        refused_create(
            "create encrypted rwxReadOnly",
            with(
                rwx.clone(),
                "/spec/decision/encryptionRequired",
                json!(true),
            ),
            MSG_ENCRYPTION_NEEDS_ROX,
        ),
        create(
            "create rwxReadOnly with a root writer",
            with(rwx.clone(), "/spec/decision/writerIdentity", json!("root")),
        ),
        refused_create(
            "create rwxReadOnly without a writer identity",
            without(rwx.clone(), "/spec/decision/writerIdentity"),
            MSG_WRITER_IDENTITY_WITH_RWX,
        ),
        refused_create(
            "create roxReadOnly with a writer identity",
            with(
                rox.clone(),
                "/spec/decision/writerIdentity",
                json!("fsGroup"),
            ),
            MSG_WRITER_IDENTITY_WITH_RWX,
        ),
    ]);

    // --- main endpoint: spec is immutable, metadata is not -------------------------------------
    cases.extend([
        update(
            "identical spec with a new label",
            Target::Main,
            rwx.clone(),
            with(rwx.clone(), "/metadata/labels", json!({"team": "a"})),
        ),
        update(
            "identical spec while Active, finalizer removed",
            Target::Main,
            active.clone(),
            with(active.clone(), "/metadata/finalizers", json!([])),
        ),
        update(
            "identical spec while Retiring, finalizer removed",
            Target::Main,
            retiring.clone(),
            with(retiring.clone(), "/metadata/finalizers", json!([])),
        ),
        update(
            "identical encrypted roxReadOnly spec",
            Target::Main,
            rox.clone(),
            with(rox.clone(), "/metadata/annotations", json!({"note": "x"})),
        ),
        refused_update(
            "spec provider changed",
            Target::Main,
            rwx.clone(),
            with(rwx.clone(), "/spec/decision/provider", json!("ociFss")),
            MSG_SPEC_IMMUTABLE,
        ),
        refused_update(
            "spec workflow changed",
            Target::Main,
            rwx.clone(),
            with(
                rwx.clone(),
                "/spec/identity/workflow",
                json!("helmModelCache"),
            ),
            MSG_SPEC_IMMUTABLE,
        ),
        refused_update(
            "spec catalog digest changed",
            Target::Main,
            rwx.clone(),
            with(
                rwx.clone(),
                "/spec/decision/catalogDigest",
                json!(sha256_digest("other")),
            ),
            MSG_SPEC_IMMUTABLE,
        ),
        refused_update(
            "spec storage class uid changed",
            Target::Main,
            active.clone(),
            with(
                active.clone(),
                "/spec/storageClass/uid",
                json!("another-uid"),
            ),
            MSG_SPEC_IMMUTABLE,
        ),
        refused_update(
            "spec resources gain a job name",
            Target::Main,
            rwx.clone(),
            with(
                rwx.clone(),
                "/spec/resources/jobNames",
                json!([writer_job_name(&rwx_identity()), "another-job"]),
            ),
            MSG_SPEC_IMMUTABLE,
        ),
        refused_update(
            "spec optional lease name added",
            Target::Main,
            rwx.clone(),
            with(
                rwx.clone(),
                "/spec/resources/leaseName",
                json!(init_lease_name(&rox_identity())),
            ),
            MSG_SPEC_IMMUTABLE,
        ),
        refused_update(
            "spec optional mount options removed",
            Target::Main,
            rox.clone(),
            without(rox.clone(), "/spec/decision/requiredMountOptions"),
            MSG_SPEC_IMMUTABLE,
        ),
        refused_update(
            "spec writer identity changed",
            Target::Main,
            rwx.clone(),
            with(rwx.clone(), "/spec/decision/writerIdentity", json!("root")),
            MSG_SPEC_IMMUTABLE,
        ),
        refused_update(
            "spec encryption switched off",
            Target::Main,
            rox.clone(),
            with(
                rox.clone(),
                "/spec/decision/encryptionRequired",
                json!(false),
            ),
            MSG_SPEC_IMMUTABLE,
        ),
    ]);

    // --- /status: phase ---------------------------------------------------------------------------
    cases.extend([
        update(
            "first status write, Active",
            Target::Status,
            rwx.clone(),
            active.clone(),
        ),
        update(
            "first status write, Retiring",
            Target::Status,
            rwx.clone(),
            retiring.clone(),
        ),
        update(
            "first status write without a phase",
            Target::Status,
            rwx.clone(),
            without(active.clone(), "/status/phase"),
        ),
        update(
            "phase recorded on a status that had none",
            Target::Status,
            without(active.clone(), "/status/phase"),
            active.clone(),
        ),
        update(
            "Active stays Active with another reference",
            Target::Status,
            active.clone(),
            with(
                active.clone(),
                "/status/requestReferences",
                json!([
                    reference("vllm", "0d9c6c62-1111-4a2b-8c3d-000000000001"),
                    reference("sglang", "0d9c6c62-1111-4a2b-8c3d-000000000002"),
                ]),
            ),
        ),
        update(
            "Active to Retiring",
            Target::Status,
            active.clone(),
            retiring.clone(),
        ),
        update(
            "Retiring stays Retiring with references dropped",
            Target::Status,
            retiring.clone(),
            with(retiring.clone(), "/status/requestReferences", json!([])),
        ),
        refused_update(
            "Retiring back to Active",
            Target::Status,
            retiring.clone(),
            active.clone(),
            MSG_RETIRING_IS_FINAL,
        ),
        refused_update(
            "Retiring phase removed",
            Target::Status,
            retiring.clone(),
            without(retiring.clone(), "/status/phase"),
            MSG_PHASE_KEPT,
        ),
        refused_update(
            "Active phase removed",
            Target::Status,
            active.clone(),
            without(active.clone(), "/status/phase"),
            MSG_PHASE_KEPT,
        ),
        refused_update(
            "status removed while Active",
            Target::Status,
            active.clone(),
            rwx.clone(),
            MSG_STATUS_KEPT,
        ),
        refused_update(
            "status removed while Retiring",
            Target::Status,
            retiring.clone(),
            rwx.clone(),
            MSG_STATUS_KEPT,
        ),
    ]);

    // --- /status: realized.providerDataIdentity ---------------------------------------------------
    cases.extend([
        update(
            "providerDataIdentity in the first status write",
            Target::Status,
            rwx.clone(),
            recorded.clone(),
        ),
        update(
            "providerDataIdentity recorded when realized was absent",
            Target::Status,
            active.clone(),
            recorded.clone(),
        ),
        update(
            "providerDataIdentity recorded when realized had none",
            Target::Status,
            without(recorded.clone(), "/status/realized/providerDataIdentity"),
            recorded.clone(),
        ),
        update(
            "providerDataIdentity unchanged while the rest of realized moves on",
            Target::Status,
            recorded.clone(),
            with(
                with(
                    recorded.clone(),
                    "/status/realized/populationState",
                    json!("Ready"),
                ),
                "/status/realized/views",
                json!([view(WRITER_NAMESPACE), view("team-b")]),
            ),
        ),
        update(
            "providerDataIdentity unchanged while Retiring",
            Target::Status,
            recorded.clone(),
            with(recorded.clone(), "/status/phase", json!("Retiring")),
        ),
        update(
            "realized without providerDataIdentity removed",
            Target::Status,
            without(recorded.clone(), "/status/realized/providerDataIdentity"),
            active.clone(),
        ),
        refused_update(
            "providerDataIdentity changed",
            Target::Status,
            recorded.clone(),
            with_status(rwx.clone(), status_with_identity("csi.weka.io/vol-0002")),
            MSG_PROVIDER_DATA_IDENTITY_IMMUTABLE,
        ),
        refused_update(
            "providerDataIdentity removed",
            Target::Status,
            recorded.clone(),
            without(recorded.clone(), "/status/realized/providerDataIdentity"),
            MSG_PROVIDER_DATA_IDENTITY_IMMUTABLE,
        ),
        refused_update(
            "realized removed after providerDataIdentity was recorded",
            Target::Status,
            recorded.clone(),
            active.clone(),
            MSG_PROVIDER_DATA_IDENTITY_IMMUTABLE,
        ),
        refused_update(
            "status removed after providerDataIdentity was recorded",
            Target::Status,
            recorded.clone(),
            rwx.clone(),
            MSG_STATUS_KEPT,
        ),
    ]);

    // --- /status: resolvedRevision --------------------------------------------------------------
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let pinned = with(active.clone(), "/status/resolvedRevision", json!(commit));
    cases.extend([
        update(
            "resolvedRevision recorded",
            Target::Status,
            active.clone(),
            pinned.clone(),
        ),
        update(
            "resolvedRevision unchanged while Retiring",
            Target::Status,
            pinned.clone(),
            with(pinned.clone(), "/status/phase", json!("Retiring")),
        ),
        refused_update(
            "resolvedRevision changed",
            Target::Status,
            pinned.clone(),
            with(
                active.clone(),
                "/status/resolvedRevision",
                json!("fedcba9876543210fedcba9876543210fedcba98"),
            ),
            MSG_RESOLVED_REVISION_IMMUTABLE,
        ),
        update(
            "resolvedRevision dropped by a writer that does not know it",
            Target::Status,
            pinned.clone(),
            active.clone(),
        ),
    ]);

    cases
}
