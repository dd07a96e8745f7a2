//! Labels and annotations the binding controller writes on the storage objects of a cache
//! (primary PV and claim, views, the writer Job). Pod keys are in [`crate::keys`].

/// Label on every storage object of a cache: its role (`primary`, `writer`, `reader-shared`,
/// `reader`).
pub const VOLUME_ROLE_LABEL: &str = "nvsnap.io/role";

/// [`VOLUME_ROLE_LABEL`] of the primary claim and PV.
pub const ROLE_PRIMARY: &str = "primary";

/// [`VOLUME_ROLE_LABEL`] of the writer view and the writer Job.
pub const ROLE_WRITER: &str = "writer";

/// [`VOLUME_ROLE_LABEL`] of a read-only view PV (nvsnap's name).
pub const ROLE_READER_SHARED: &str = "reader-shared";

/// Label naming the binding an object belongs to (its name, `model-cache-<hash>`).
pub const BINDING_LABEL: &str = "nvca.nvcf.nvidia.io/model-cache-binding";

/// Label on a view PV: the name of the primary PV it was derived from.
pub const SOURCE_PV_LABEL: &str = "nvsnap.io/source-pv";

/// Label on the primary PV, `"true"` once the download completed (stored together with
/// reclaim policy Retain before any claim is released).
pub const COMPLETE_LABEL: &str = "nvsnap.io/model-complete";

/// Label on the complete primary PV: the namespace the download was written from.
pub const SOURCE_NAMESPACE_LABEL: &str = "nvsnap.io/model-source-namespace";

/// Annotation on the complete primary PV: the bytes the writer measured.
pub const BYTES_ANNOTATION: &str = "nvsnap.io/model-bytes";

/// Annotation on the complete primary PV: the binding's `spec.identity.cacheHandleDigest`, the
/// identity a later binding checks before adopting it.
pub const HANDLE_DIGEST_ANNOTATION: &str = "nvca.nvcf.nvidia.io/model-cache-handle-digest";

/// Annotation on the writer Job: the UID of the binding it writes for.
pub const BINDING_UID_LABEL_ANNOTATION: &str = "nvca.nvcf.nvidia.io/model-cache-binding-uid";

/// The download container of the writer Job.
pub const WRITER_CONTAINER: &str = "download";

/// Annotation on the writer Lease: the namespace of the writer (the Job's namespace).
pub const WRITER_NAMESPACE_ANNOTATION: &str = "warmcache.nvidia.io/writer-namespace";

/// Annotation on the writer Lease: the name of the writer Job.
pub const WRITER_JOB_ANNOTATION: &str = "warmcache.nvidia.io/writer-job";

/// Annotation on the writer Lease: the UID of the writer Job, once it exists.
pub const WRITER_JOB_UID_ANNOTATION: &str = "warmcache.nvidia.io/writer-job-uid";

/// Annotation on the writer Lease: `Starting`, `Running` or `Gone`
/// ([`warmcache_api_modelcache::v2beta1::WriterState`]).
pub const WRITER_STATE_ANNOTATION: &str = "warmcache.nvidia.io/writer-state";

/// Annotation the node agent puts on a roxReadOnly primary claim once its copy of the staged
/// download is complete and verified: the bytes of the tree (the binding controller then labels
/// the PV complete with them).
pub const COPIED_BYTES_ANNOTATION: &str = "warmcache.nvidia.io/copied-bytes";

/// Annotation on a roxReadOnly primary claim (by the node agent) and its complete PV: the SHA-256
/// of the volume's file manifest (`.nvsnap-manifest`).
pub const MANIFEST_DIGEST_ANNOTATION: &str = "warmcache.nvidia.io/manifest-sha256";

/// Annotation the node agent keeps on a roxReadOnly primary claim: its failed copy attempts.
pub const COPY_ATTEMPTS_ANNOTATION: &str = "warmcache.nvidia.io/copy-attempts";

/// Annotation the node agent puts on a primary claim it was elected to fill from a capture
/// source ([`crate::keys::CAPTURE_LABEL`]), with the value [`COPY_SOURCE_CAPTURE`]; a claim for a
/// staging pod has none. The binding controller starts no writer Job while a capture fills the
/// claim, and tells the two apart in its conditions.
pub const COPY_SOURCE_ANNOTATION: &str = "warmcache.nvidia.io/copy-source";

/// [`COPY_SOURCE_ANNOTATION`] of a claim filled from a capture source.
pub const COPY_SOURCE_CAPTURE: &str = "capture";

/// Annotation the node agent puts on a primary claim when it gives up capturing a capture
/// source's download into it ([`crate::keys::CAPTURE_LABEL`]) after three failed copies: its
/// words. The binding controller then writes the failure record and releases the claim.
pub const COPY_FAILED_ANNOTATION: &str = "warmcache.nvidia.io/copy-failed";

/// Annotation the node agent puts on a roxReadOnly primary claim it created: its node.
pub const COPY_NODE_ANNOTATION: &str = "warmcache.nvidia.io/copy-node";

/// Annotation the reaper puts on a primary PV when the binding that read it retires: the
/// binding's `status.unreferencedSince` (RFC 3339), the last time anything read the volume. The
/// retention of a complete primary counts from it (from the PV's creation when absent).
pub const LAST_USED_ANNOTATION: &str = "warmcache.nvidia.io/last-used";
