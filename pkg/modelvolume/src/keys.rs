//! Every label, annotation, name and path the rewrite writes, in one place.
//!
//! Keys keep the names of the systems they come from (see `docs/model-volume.md`, "Names"):
//! `nvsnap.io/...` for what the nvsnap model volume defined (the model key label, the role and
//! pending labels, the URI, landing and download-step annotations, the volume and container
//! names, the marker file, the re-landing path), `nvca.nvcf.nvidia.io/model-cache-...` for the
//! NVCA model cache (the binding, the opt-out, the skip record) and `warmcache.nvidia.io/...` for
//! the trace context every warmcache component reads.

/// Pod label: the cache the pod reads, as the binding's 48-hex identity hash (the suffix of the
/// binding name `model-cache-<hash>`). Selects every pod of one cache.
pub const MODEL_LABEL: &str = "nvsnap.io/model";

/// Pod label: `reader` on every rewritten workload pod.
pub const ROLE_LABEL: &str = "nvsnap.io/model-role";

/// Value of [`ROLE_LABEL`] on rewritten pods.
pub const ROLE_READER: &str = "reader";

/// Pod label: `"true"` while the pod waits for something only a controller can provide: the
/// read-only view claim of its namespace (not yet recorded on the binding), or, for hostPath
/// readers, the node agent's read-only bind mount.
pub const PENDING_LABEL: &str = "nvsnap.io/model-pending";

/// Pod annotation: the model identity URI (`hf://org/repo@rev`).
pub const URI_ANNOTATION: &str = "nvsnap.io/model-uri";

/// Pod annotation (from its template): an operator-chosen value folded into the cache handle,
/// for changes the identity cannot see (a floating tag re-pointed, a wheel installed at start).
/// Another value is another copy.
pub const CACHE_SALT_ANNOTATION: &str = "nvsnap.io/cache-salt";

/// Longest salt folded into a handle (bytes).
pub const MAX_SALT_BYTES: usize = 253;

/// Namespace label an administrator sets (or changes) to refresh the copies of floating
/// revisions its pods read: its value folds into the handle of every floating revision (none, a
/// branch, a tag), so the next pods download anew into a new binding. Namespaces of one
/// sharing domain share a copy only while their values are equal.
pub const REFRESH_LABEL: &str = "nvca.nvcf.nvidia.io/model-cache-refresh";

/// Reader pod annotation: the commit its copy holds, when the binding it joins has recorded one
/// (`status.resolvedRevision`: the download of a floating revision resolved it).
pub const REVISION_ANNOTATION: &str = "nvsnap.io/model-revision";

/// Pod label: `"true"` on a **capture source**, a pod whose engine downloads, by its own script,
/// an artifact no writer Job can reproduce (an NGC model pulled in the main container), into an
/// emptyDir. The pod keeps its own download; once it is Ready, the node agent of its node copies
/// the landing into the binding's primary, and later pods read that copy.
pub const CAPTURE_LABEL: &str = "nvsnap.io/model-capture";

/// Capture-source pod annotation: the pod's emptyDir volume the landing lies in.
pub const CAPTURE_VOLUME_ANNOTATION: &str = "nvsnap.io/model-capture-volume";

/// Capture-source pod annotation: the landing's path inside [`CAPTURE_VOLUME_ANNOTATION`],
/// relative, `/`-separated, without `.` or `..` components (empty: the volume's root).
pub const CAPTURE_PATH_ANNOTATION: &str = "warmcache.nvidia.io/model-capture-path";

/// Pod annotation: the landing, the directory the main container reads the model from.
pub const LANDING_ANNOTATION: &str = "nvsnap.io/model-landing";

/// Pod annotation: the download step the writer Job runs, as compact JSON
/// ([`crate::DownloadStep`]); secrets appear only as references.
pub const DOWNLOAD_STEP_ANNOTATION: &str = "nvsnap.io/model-download-init";

/// Pod annotation: the name of the ModelCacheBinding the pod reads.
pub const BINDING_ANNOTATION: &str = "nvca.nvcf.nvidia.io/model-cache-binding";

/// Pod annotation: the UID of that binding (set once the binding exists).
pub const BINDING_UID_ANNOTATION: &str = "nvca.nvcf.nvidia.io/model-cache-binding-uid";

/// Pod annotation: the full cache handle (identity URI, layout and endpoints) whose digest the
/// binding records.
pub const HANDLE_ANNOTATION: &str = "nvca.nvcf.nvidia.io/model-cache-handle";

/// Pod annotation: why the pod was left alone (a stable code, [`crate::SkipReason::code`]).
pub const SKIP_REASON_ANNOTATION: &str = "nvca.nvcf.nvidia.io/model-cache-skip-reason";

/// Pod annotation: the skip reason in words, with the field it comes from.
pub const SKIP_MESSAGE_ANNOTATION: &str = "nvca.nvcf.nvidia.io/model-cache-skip-message";

/// Namespace label, pod label and pod annotation that keep pods out of model sharing with the
/// value `"true"` (the same key as [`warmcache_modelid::OPT_OUT_ANNOTATION`]; the label form can
/// also be used in the webhook's `namespaceSelector` and `objectSelector`).
pub const OPT_OUT: &str = warmcache_modelid::OPT_OUT_ANNOTATION;

/// Pod label naming the tool that manages a pod; pods carrying [`MANAGED_BY_VALUE`] are
/// warmcache's own (download Jobs, mount holders) and never rewritten.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";

/// Value of [`MANAGED_BY_LABEL`] on objects warmcache creates.
pub const MANAGED_BY_VALUE: &str = "warmcache";

/// Annotation with the W3C `traceparent` of the admission's span, on the pod and on a binding
/// it creates, so the controllers continue the trace. Equal to
/// `warmcache_telemetry::TRACE_PARENT_ANNOTATION` (a pure crate cannot depend on the telemetry
/// crate; the webhook's tests check the two agree).
pub const TRACE_PARENT_ANNOTATION: &str = "warmcache.nvidia.io/traceparent";

/// The pod volume holding the shared copy (the read-only view claim, or the hostPath).
pub const MODEL_VOLUME: &str = "nvsnap-model";

/// The pod volume (an `emptyDir`) for caches the engine must write next to a read-only
/// `HF_HOME` (`HF_MODULES_CACHE`).
pub const SCRATCH_VOLUME: &str = "nvsnap-cache";

/// Where [`SCRATCH_VOLUME`] is mounted in the main container.
pub const SCRATCH_PATH: &str = "/opt/nvsnap/cache";

/// The init container that waits for the completion marker.
pub const WAIT_CONTAINER: &str = "nvsnap-model-wait";

/// Where the wait container (and the writer Job of an engine download) mounts the cache.
pub const WAIT_MOUNT_PATH: &str = "/nvsnap-model";

/// The completion marker at the root of a finished cache (the writer writes the byte count into
/// it).
pub const COMPLETE_MARKER: &str = ".nvsnap-complete";

/// The failure marker at the root of a cache whose download failed (its content is the reason).
pub const FAILURE_MARKER: &str = ".nvsnap-failed";

/// File beside the completion marker: the commit the download resolved (40 lowercase hex), when
/// it could tell (a Hugging Face download).
pub const REVISION_FILE: &str = ".nvsnap-revision";

/// Default root of hostPath reader directories on the nodes (`<root>/<identity hash>`).
pub const DEFAULT_HOST_ROOT: &str = "/var/lib/containerd/nvsnap-models";

/// Namespaces that are never rewritten, whatever the options say.
pub const ALWAYS_EXCLUDED_NAMESPACES: [&str; 1] = ["kube-system"];

/// Contract version of [`DOWNLOAD_STEP_ANNOTATION`].
pub const DOWNLOAD_STEP_VERSION: &str = "v1alpha1";

/// Pod label: the compile-cache set the pod belongs to, as its binding's 48-hex identity hash
/// (the suffix of `model-cache-<hash>`; [`crate::cacheset`]). Selects every pod of one set, as
/// [`MODEL_LABEL`] selects every pod of one model copy; a pod carries both.
pub const CACHE_KEY_LABEL: &str = "nvsnap.io/cache-key";

/// Pod annotation: the rank of the pod's compile-cache set (its LeaderWorkerSet worker index,
/// `0` outside a group).
pub const CACHE_ORDINAL_ANNOTATION: &str = "nvsnap.io/cache-ordinal";

/// Pod label: `"true"` on a pod admitted while its compile-cache set was not complete: once it
/// is Ready, the node agent of its node may collect its compile caches into the set.
pub const CACHE_CAPTURE_LABEL: &str = "warmcache.nvidia.io/cache-capture";

/// Pod annotation: the name of the ModelCacheBinding of the pod's compile-cache set.
pub const CACHE_BINDING_ANNOTATION: &str = "warmcache.nvidia.io/cache-set-binding";

/// Pod annotation: the UID of that binding (set once the binding exists).
pub const CACHE_BINDING_UID_ANNOTATION: &str = "warmcache.nvidia.io/cache-set-binding-uid";

/// Pod annotation: the compile-cache set's handle (`cache://<sha256>?rank=<n>`), whose digest
/// the set's binding records.
pub const CACHE_HANDLE_ANNOTATION: &str = "warmcache.nvidia.io/cache-set-handle";

/// The pod volume holding the set a pod is seeded from (the namespace's read-only view claim of
/// the set's binding).
pub const SEED_VOLUME: &str = "nvsnap-cache-seed";

/// The init container that copies the set into the scratch directory before the engine starts.
pub const SEED_CONTAINER: &str = "nvsnap-cache-seed";

/// Where [`SEED_CONTAINER`] mounts [`SEED_VOLUME`].
pub const SEED_MOUNT_PATH: &str = "/nvsnap-cache-seed";
