//! The staging copy of the block flow (roxReadOnly), on the component runtime: one reconcile per
//! staging pod of this node = fetch (caches, the pod's kubelet directories) -> the pure step
//! [`warmcache_modelvolume::agent::staging_step`] -> its IO: measure and create the primary claim,
//! create the mount holder, copy through the holder's volume (verified a mount first), record the
//! copy on the claim, answer the pod's hold container, or give up.
//!
//! # API calls (the chart's roles grant exactly these: generated from [`crate::rbac`])
//!
//! | resource | verbs | where | why |
//! |---|---|---|---|
//! | `pods` | list, watch | cluster, field `spec.nodeName=<node>` | this node's staging pods, mount holders and readers (hostPath readers: [`crate::host`]) |
//! | `pods` | create, delete | control namespace; hostPath readers' namespaces | mount holders of the primary and view holders (delete with a UID precondition) |
//! | `pods` | patch | hostPath readers' namespaces | un-pending a reader once its bind is verified (UID in the merge patch) |
//! | `persistentvolumeclaims`, `persistentvolumes` | get | hostPath readers' namespaces; cluster | the view claim and PV, read afresh before a bind |
//! | `persistentvolumeclaims`, `persistentvolumes` | get | writer namespaces; cluster | a non-root writer's writer view claim and PV and the binding's primary, read afresh before its root is opened ([`crate::open`]) |
//! | `pods` | get | cluster | the staging pod a primary claim was created for, to find it gone (then the claim is dropped and the election runs again); the binding's mount holder on another node |
//! | `persistentvolumeclaims` | get, list, watch, create, patch, delete | control namespace | the primary claim: created sized from the bytes, read afresh before a copy (never copied twice), the copy recorded (merge patch with resourceVersion), dropped after three failed copies (UID precondition) |
//! | `namespaces` | get | cluster | a capture source's namespace: its labels decide its sharing domain ([`crate::capture`]) |
//! | `persistentvolumeclaims` | patch | control namespace | a capture source's election of the binding controller's ReadWriteMany claim, and its undoing; a given-up capture (merge patches with resourceVersion) |
//! | `modelcachebindings` | list, watch | control namespace | the binding a staging pod or capture source names |
//! | `events` | create | | Events |

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Client, ResourceExt};
use serde_json::json;
use tracing::Instrument;
use warmcache_api_modelcache::v2beta1::ModelCacheBinding;
use warmcache_api_modelcache::writer_pvc_name;
use warmcache_modelvolume::agent::{
    AgentObserved, AgentStep, COMPONENT_LABEL, COPY_POD_ANNOTATION, COPY_POD_NAME_ANNOTATION,
    Doomed, HolderImage, HostReaderState, MOUNT_HOLDER, Staged, StagingState, copy_attempts,
    holder_name, host_reader, is_view_holder, staged_primary_claim, staging_state, staging_step,
};
use warmcache_modelvolume::capture::{CaptureKind, capture_sources, is_capture_source_of};
use warmcache_modelvolume::keys::{
    BINDING_ANNOTATION, MANAGED_BY_LABEL, MANAGED_BY_VALUE, MODEL_LABEL, ROLE_LABEL, ROLE_READER,
};
use warmcache_modelvolume::lifecycle::copied_bytes;
use warmcache_modelvolume::volume_keys::{
    BINDING_LABEL, COPIED_BYTES_ANNOTATION, COPY_ATTEMPTS_ANNOTATION, MANIFEST_DIGEST_ANNOTATION,
    SOURCE_NAMESPACE_LABEL,
};
use warmcache_modelvolume::writer::{
    HANDOFF_COPIED, HANDOFF_FAILED, HANDOFF_VOLUME, STAGING_LABEL,
};
use warmcache_runtime::{Action, Cache, ObjectRef, ReconcileError, Reconciler, WatcherConfig};

use crate::host::HostBinds;
use crate::metrics::Metrics;

/// Look again this often while waiting on something no watch reports (a kubelet mount).
pub const REQUEUE_WAITING: Duration = Duration::from_secs(10);
/// Look again after a failed copy.
pub const REQUEUE_AFTER_FAILED_COPY: Duration = Duration::from_secs(15);
/// Field manager of the agent's patches.
pub const FIELD_MANAGER: &str = "model-volume-controller";

/// What the agent runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// This node.
    pub node: String,
    /// The kubelet's root directory.
    pub kubelet_root: PathBuf,
    /// The control namespace.
    pub control_namespace: String,
    /// Mount holder image and pull policy.
    pub holder_image: HolderImage,
    /// Smallest primary claim, bytes.
    pub min_bytes: u64,
    /// Staged downloads handled at once.
    pub concurrency: u16,
    /// The directory hostPath readers' binds are made under (`<bind root>/<hash>`), absolute,
    /// without a trailing slash.
    pub bind_root: String,
}

impl Settings {
    /// Settings from the command line.
    ///
    /// # Errors
    ///
    /// The flag that is not usable, and why.
    pub fn from_args(args: &crate::RunArgs) -> Result<Self, String> {
        if args.node_name.trim().is_empty() {
            return Err("--node-name (NODE_NAME) is empty: the agent must know its node".into());
        }
        if !args.kubelet_root.is_absolute() {
            return Err(format!(
                "--kubelet-root {} is not an absolute path",
                args.kubelet_root.display()
            ));
        }
        let bind_root = args
            .bind_root
            .to_str()
            .unwrap_or_default()
            .trim_end_matches('/');
        if !args.bind_root.is_absolute()
            || bind_root.is_empty()
            || args
                .bind_root
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(format!(
                "--bind-root {} is not an absolute UTF-8 path without `..` (nor `/`)",
                args.bind_root.display()
            ));
        }
        Ok(Self {
            bind_root: bind_root.to_owned(),
            node: args.node_name.clone(),
            kubelet_root: args.kubelet_root.clone(),
            control_namespace: args.control_namespace.clone(),
            holder_image: HolderImage {
                image: args.holder_image.clone(),
                pull_policy: args.holder_image_pull_policy.clone(),
            },
            min_bytes: args.min_size_gib.saturating_mul(1 << 30),
            concurrency: args.concurrency,
        })
    }
}

/// Where the kubelet keeps an emptyDir of a pod.
pub fn empty_dir_path(kubelet_root: &Path, pod_uid: &str, volume: &str) -> PathBuf {
    kubelet_root
        .join("pods")
        .join(pod_uid)
        .join("volumes")
        .join("kubernetes.io~empty-dir")
        .join(volume)
}

/// Where the kubelet mounts a CSI volume of a pod.
pub fn csi_mount_path(kubelet_root: &Path, pod_uid: &str, pv: &str) -> PathBuf {
    kubelet_root
        .join("pods")
        .join(pod_uid)
        .join("volumes")
        .join("kubernetes.io~csi")
        .join(pv)
        .join("mount")
}

/// Writes `file` with `bytes` into the handoff directory `dir`: the directory must be a real
/// directory (not a symlink), the temporary file is created exclusively (never through an
/// existing path or link) and renamed over `file` (a link there is replaced, not followed).
pub fn write_answer(dir: &Path, file: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let meta = dir.symlink_metadata()?;
    if !meta.is_dir() {
        return Err(std::io::Error::other(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    let tmp = dir.join(format!(".{file}.tmp"));
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(file))?;
    std::fs::File::open(dir)?.sync_all()
}

/// The hex SHA-256 of a manifest's bytes (what the copier reports as `manifest_sha256`).
pub fn manifest_digest(manifest: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(manifest))
}

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// A Kubernetes API call failed.
    #[error(transparent)]
    Kube(#[from] warmcache_kube::Error),
    /// A node filesystem step failed (measuring, the handoff).
    #[error("{what}: {source}")]
    Node {
        /// What the agent did.
        what: String,
        /// Why it failed.
        source: warmcache_nodefs::Error,
    },
    /// The answer to the hold container could not be written.
    #[error("{what}: {source}")]
    Handoff {
        /// What the agent did.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The holder's volume path is not a mount (the kubelet has not mounted it yet, or
    /// unmounted it): nothing is written there.
    #[error("{0} is not a mount point yet; nothing is copied into the node's own disk")]
    NotMounted(String),
    /// A blocking task did not finish.
    #[error("the {0} task failed")]
    Task(&'static str),
}

impl ReconcileError for Failure {
    const CATEGORIES: &'static [&'static str] =
        &["node_filesystem", "handoff", "not_mounted", "task"];

    fn category(&self) -> &'static str {
        match self {
            Self::Kube(e) => ReconcileError::category(e),
            Self::Node { .. } => "node_filesystem",
            Self::Handoff { .. } => "handoff",
            Self::NotMounted(_) => "not_mounted",
            Self::Task(_) => "task",
        }
    }
}

pub(crate) fn api_error(
    verb: &'static str,
    resource: &str,
    name: &str,
    err: kube::Error,
) -> Failure {
    Failure::Kube(warmcache_kube::Error::from_kube(verb, resource, name, err))
}

/// The reconciler of this node's staging pods.
pub struct Agent {
    pub(crate) client: Client,
    pub(crate) settings: Settings,
    pub(crate) bindings: Cache<ModelCacheBinding>,
    pub(crate) claims: Cache<PersistentVolumeClaim>,
    pub(crate) pods: Cache<Pod>,
    pub(crate) metrics: Metrics,
    pub(crate) host: Arc<HostBinds>,
}

impl Agent {
    pub(crate) fn claim(&self, binding: &ModelCacheBinding) -> Option<Arc<PersistentVolumeClaim>> {
        self.claims.store().get(
            &ObjectRef::new(&writer_pvc_name(&binding.spec.identity))
                .within(&self.settings.control_namespace),
        )
    }

    pub(crate) fn holder(&self, binding: &ModelCacheBinding) -> Option<Arc<Pod>> {
        self.pods
            .store()
            .get(&ObjectRef::new(&holder_name(binding)).within(&self.settings.control_namespace))
    }

    pub(crate) fn claims_api(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &self.settings.control_namespace)
    }

    pub(crate) fn pods_api(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.settings.control_namespace)
    }

    pub(crate) async fn delete_pod(&self, d: &Doomed) -> Result<(), Failure> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(d.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.pods_api().delete(&d.name, &params).await {
            Ok(_) => Ok(()),
            Err(e) if warmcache_kube::is_not_found(&e) || warmcache_kube::is_conflict(&e) => Ok(()),
            Err(e) => Err(api_error("delete", "pods", &d.name, e)),
        }
    }

    pub(crate) async fn delete_claim(&self, d: &Doomed) -> Result<(), Failure> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(d.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.claims_api().delete(&d.name, &params).await {
            Ok(_) => Ok(()),
            Err(e) if warmcache_kube::is_not_found(&e) || warmcache_kube::is_conflict(&e) => Ok(()),
            Err(e) => Err(api_error("delete", "persistentvolumeclaims", &d.name, e)),
        }
    }

    /// Merges `annotations` into the claim, only if it is still at `resource_version`.
    pub(crate) async fn annotate_claim(
        &self,
        claim: &PersistentVolumeClaim,
        annotations: BTreeMap<String, String>,
    ) -> Result<(), Failure> {
        let name = claim.name_any();
        let patch = json!({
            "metadata": {
                "resourceVersion": claim.resource_version(),
                "annotations": annotations,
            }
        });
        self.claims_api()
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| api_error("patch", "persistentvolumeclaims", &name, e))
    }

    /// Writes the answer `file` (with `words`) into the staging pod's handoff emptyDir: a temp
    /// file renamed into place, never through a symlink.
    async fn answer(
        &self,
        staged: &Staged,
        file: &'static str,
        words: String,
    ) -> Result<(), Failure> {
        let dir = empty_dir_path(&self.settings.kubelet_root, &staged.uid, HANDOFF_VOLUME);
        tokio::task::spawn_blocking(move || write_answer(&dir, file, words.as_bytes()))
            .await
            .map_err(|_| Failure::Task("handoff"))?
            .map_err(|source| Failure::Handoff {
                what: format!(
                    "answering the staging pod {}/{} ({file})",
                    staged.namespace, staged.name
                ),
                source,
            })
    }

    fn answered(&self, staged: &Staged) -> bool {
        let dir = empty_dir_path(&self.settings.kubelet_root, &staged.uid, HANDOFF_VOLUME);
        [HANDOFF_COPIED, HANDOFF_FAILED]
            .iter()
            .any(|f| dir.join(f).symlink_metadata().is_ok())
    }

    /// Whether the staging pod `claim` was created for is gone (read afresh): not found, another
    /// UID, finished, or being deleted. `false` for this pod, and when the claim does not say
    /// which pod it was.
    async fn claim_pod_gone(
        &self,
        claim: &PersistentVolumeClaim,
        staged: &Staged,
    ) -> Result<bool, Failure> {
        let a = claim.annotations();
        let (Some(uid), Some(name), Some(namespace)) = (
            a.get(COPY_POD_ANNOTATION),
            a.get(COPY_POD_NAME_ANNOTATION),
            a.get(SOURCE_NAMESPACE_LABEL),
        ) else {
            return Ok(false);
        };
        if *uid == staged.uid {
            return Ok(false);
        }
        let pod = Api::<Pod>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| api_error("get", "pods", name, e))?;
        Ok(match pod {
            None => true,
            Some(p) => {
                p.metadata.uid.as_ref() != Some(uid)
                    || p.metadata.deletion_timestamp.is_some()
                    || matches!(
                        p.status.as_ref().and_then(|s| s.phase.as_deref()),
                        Some("Failed" | "Succeeded")
                    )
            }
        })
    }

    async fn create_claim(
        &self,
        b: &ModelCacheBinding,
        staged: &Staged,
        traceparent: Option<&String>,
    ) -> Result<Action, Failure> {
        let source = empty_dir_path(
            &self.settings.kubelet_root,
            &staged.uid,
            &staged.staging_volume,
        );
        let measured = source.clone();
        let bytes = tokio::task::spawn_blocking(move || warmcache_nodefs::measure(&measured))
            .await
            .map_err(|_| Failure::Task("measure"))?
            .map_err(|e| Failure::Node {
                what: format!("measuring {}", source.display()),
                source: e,
            })?;
        let claim = staged_primary_claim(
            b,
            staged,
            &self.settings.node,
            bytes,
            self.settings.min_bytes,
        );
        self.create_elected_claim(claim, traceparent, bytes, "staged")
            .await
    }

    /// Creates `claim`, the primary claim sized from `bytes` of a `what` (staged, captured)
    /// tree, carrying `traceparent`: the atomic create is the election among agents
    /// (AlreadyExists: another agent won; its claim is seen through the watch).
    pub(crate) async fn create_elected_claim(
        &self,
        mut claim: PersistentVolumeClaim,
        traceparent: Option<&String>,
        bytes: u64,
        what: &str,
    ) -> Result<Action, Failure> {
        if let Some(tp) = traceparent {
            claim
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(
                    warmcache_telemetry::TRACE_PARENT_ANNOTATION.to_owned(),
                    tp.clone(),
                );
        }
        match self
            .claims_api()
            .create(&PostParams::default(), &claim)
            .await
        {
            Ok(_) => {
                tracing::info!(claim = %claim.name_any(), bytes, "created the primary claim sized from the {what} bytes");
                Ok(Action::requeue(REQUEUE_WAITING))
            }
            Err(e) if warmcache_kube::is_already_exists(&e) => Ok(Action::requeue(REQUEUE_WAITING)),
            Err(e) => Err(api_error(
                "create",
                "persistentvolumeclaims",
                &claim.name_any(),
                e,
            )),
        }
    }

    async fn copy(
        &self,
        staged: &Staged,
        claim: &PersistentVolumeClaim,
        holder_uid: &str,
        pv: &str,
    ) -> Result<Action, Failure> {
        let source = CopySource::Staged(empty_dir_path(
            &self.settings.kubelet_root,
            &staged.uid,
            &staged.staging_volume,
        ));
        self.copy_into(&staged.uid, source, claim, holder_uid, pv)
            .await
    }

    /// Copies `source` (the tree of the pod `pod_uid`) into the holder's mount of `pv`, once the
    /// mount table shows that mount, and records the copy on `claim`; a volume already holding
    /// a verified copy is recorded as it is; a failed copy increments the claim's attempts.
    pub(crate) async fn copy_into(
        &self,
        pod_uid: &str,
        source: CopySource,
        claim: &PersistentVolumeClaim,
        holder_uid: &str,
        pv: &str,
    ) -> Result<Action, Failure> {
        let captured = match &source {
            CopySource::Captured { kind, .. } => Some(*kind),
            CopySource::Staged(_) => None,
        };
        let shown = source.shown();
        let dest = csi_mount_path(&self.settings.kubelet_root, holder_uid, pv);
        // Only into the volume: the kubelet's directory is on the node's disk until mounted.
        let mounts = warmcache_nodefs::mounts::read_mountinfo().map_err(|e| Failure::Node {
            what: "reading the mount table".into(),
            source: e,
        })?;
        if warmcache_nodefs::mounts::top_mount(&mounts, &dest).is_none() {
            return Err(Failure::NotMounted(dest.display().to_string()));
        }
        let checked = mounts.clone();
        // A copy an earlier attempt published and verified (its record was lost: a crash or a
        // failed patch): recorded as it is, not copied again into a volume sized for one copy.
        let existing = dest.clone();
        let done = tokio::task::spawn_blocking(move || {
            match (
                warmcache_nodefs::is_complete(&existing),
                warmcache_nodefs::verify_manifest(&existing),
            ) {
                (Ok(Some(bytes)), Ok(_)) => {
                    std::fs::read(existing.join(warmcache_nodefs::MANIFEST))
                        .ok()
                        .map(|m| (bytes, manifest_digest(&m)))
                }
                _ => None,
            }
        })
        .await
        .map_err(|_| Failure::Task("verify"))?;
        if let Some((bytes, digest)) = done {
            tracing::info!(
                bytes,
                "the volume already holds a verified copy; recording it"
            );
            self.annotate_claim(
                claim,
                BTreeMap::from([
                    (COPIED_BYTES_ANNOTATION.to_owned(), bytes.to_string()),
                    (MANIFEST_DIGEST_ANNOTATION.to_owned(), digest),
                ]),
            )
            .await?;
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        let attempts = copy_attempts(claim);
        let attempt = format!(
            "{}-{attempts}",
            pod_uid
                .chars()
                .filter(char::is_ascii_alphanumeric)
                .take(12)
                .collect::<String>()
                .to_ascii_lowercase()
        );
        let started = Instant::now();
        let d = dest.clone();
        let result = tokio::task::spawn_blocking(move || match source {
            CopySource::Staged(s) => {
                warmcache_nodefs::copy_tree_into_mount(&s, &d, &attempt, &checked)
            }
            CopySource::Captured { root, path, kind } => {
                warmcache_nodefs::open_dir_beneath(&root, &path).and_then(|tree| {
                    if kind.filtered() {
                        // A compile-cache set: only what travels (never a credential).
                        warmcache_nodefs::copy_dir_into_mount_selected(
                            &tree,
                            &d,
                            &attempt,
                            &checked,
                            &warmcache_modelvolume::cacheset::travels,
                        )
                    } else {
                        warmcache_nodefs::copy_dir_into_mount(&tree, &d, &attempt, &checked)
                    }
                })
            }
        })
        .await
        .map_err(|_| Failure::Task("copy"))?;
        match result {
            Ok(report) => {
                let seconds = started.elapsed().as_secs_f64();
                if let Some(kind) = captured {
                    self.metrics.captured(kind, report.bytes, seconds);
                } else {
                    self.metrics.copied(report.bytes, seconds);
                }
                tracing::info!(
                    bytes = report.bytes,
                    files = report.files,
                    seconds,
                    "copied and verified the tree"
                );
                self.annotate_claim(
                    claim,
                    BTreeMap::from([
                        (COPIED_BYTES_ANNOTATION.to_owned(), report.bytes.to_string()),
                        (
                            MANIFEST_DIGEST_ANNOTATION.to_owned(),
                            report.manifest_sha256.clone(),
                        ),
                    ]),
                )
                .await?;
                Ok(Action::requeue(Duration::from_secs(1)))
            }
            Err(e) => {
                if let Some(kind) = captured {
                    self.metrics.capture_failed(kind);
                } else {
                    self.metrics.copy_failed();
                }
                tracing::warn!(error = %e, attempt = attempts + 1, source = %shown, dest = %dest.display(), "the copy failed");
                self.annotate_claim(
                    claim,
                    BTreeMap::from([(
                        COPY_ATTEMPTS_ANNOTATION.to_owned(),
                        (attempts + 1).to_string(),
                    )]),
                )
                .await?;
                Ok(Action::requeue(REQUEUE_AFTER_FAILED_COPY))
            }
        }
    }
}

/// What a copy reads.
#[derive(Debug, Clone)]
pub(crate) enum CopySource {
    /// A staging pod's emptyDir (the root's last component is never followed).
    Staged(PathBuf),
    /// A capture source's landing: `path` beneath its emptyDir `root`, reached without following
    /// any link ([`warmcache_nodefs::open_dir_beneath`]); a compile-cache set
    /// ([`CaptureKind::filtered`]) copied through the selection
    /// [`warmcache_modelvolume::cacheset::travels`].
    Captured {
        /// The pod's emptyDir on the node.
        root: PathBuf,
        /// The landing inside it (clean, relative).
        path: String,
        /// What the capture fills.
        kind: CaptureKind,
    },
}

impl CopySource {
    fn shown(&self) -> String {
        match self {
            Self::Staged(p) => p.display().to_string(),
            Self::Captured { root, path, .. } => root.join(path).display().to_string(),
        }
    }
}

impl Reconciler<Pod> for Agent {
    type Error = Failure;

    async fn reconcile(&self, pod: Arc<Pod>) -> Result<Action, Failure> {
        // A view holder: its model's binds (the last reader gone reaches the holder this way).
        if is_view_holder(&pod) {
            return match pod.labels().get(MODEL_LABEL) {
                Some(hash) => self.host.reconcile(hash, &pod).await,
                None => Ok(Action::await_change()),
            };
        }
        // A hostPath reader: its model's binds.
        match host_reader(&pod, &self.settings.bind_root) {
            HostReaderState::Reader(r) => return self.host.reconcile(&r.hash, &pod).await,
            HostReaderState::Refused(why) => {
                tracing::warn!(pod = %pod.name_any(), namespace = %pod.namespace().unwrap_or_default(), %why, "not serving a hostPath reader");
                return Ok(Action::await_change());
            }
            HostReaderState::NotHostReader => {}
        }
        // A non-root writer waiting for its fresh root.
        if let Some(done) = self.open_root(&pod).await {
            return done;
        }
        // A capture source (of its model, of its compile-cache set, or both): each landing
        // copied into its binding's primary once the pod is Ready.
        let captures = capture_sources(&pod);
        if !captures.is_empty() {
            return self.captures(&pod, captures).await;
        }
        let staged = match staging_state(&pod) {
            StagingState::Staged(s) => s,
            _ => return Ok(Action::await_change()),
        };
        if pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
            != Some(self.settings.node.as_str())
        {
            return Ok(Action::await_change());
        }
        let span = tracing::info_span!("staged_copy", pod = %staged.name, namespace = %staged.namespace, binding = %staged.binding);
        let traceparent = pod
            .annotations()
            .get(warmcache_telemetry::TRACE_PARENT_ANNOTATION)
            .cloned();
        if let Err(err) = warmcache_telemetry::set_parent_from_annotations(&span, pod.annotations())
        {
            tracing::debug!(error = %err, "the copy span starts its own trace");
        }
        async {
            if self.answered(&staged) {
                return Ok(Action::await_change());
            }
            let binding = self
                .bindings
                .store()
                .get(&ObjectRef::new(&staged.binding).within(&self.settings.control_namespace));
            let claim = binding.as_deref().and_then(|b| self.claim(b));
            let holder = binding.as_deref().and_then(|b| self.holder(b));
            let claim_pod_gone = match claim.as_deref() {
                Some(c) if copied_bytes(c).is_none() => self.claim_pod_gone(c, &staged).await?,
                _ => false,
            };
            let step = staging_step(&AgentObserved {
                node: &self.settings.node,
                staged: &staged,
                binding: binding.as_deref(),
                claim: claim.as_deref(),
                holder: holder.as_deref(),
                holder_image: &self.settings.holder_image,
                claim_pod_gone,
            });
            self.metrics.step(&step);
            match step {
                AgentStep::Wait(why) => {
                    tracing::debug!(%why, "waiting");
                    Ok(Action::requeue(REQUEUE_WAITING))
                }
                AgentStep::DropClaim { claim } => {
                    // The binding's holder runs on the gone pod's node, outside this cache.
                    if let Some(b) = binding.as_deref() {
                        let name = holder_name(b);
                        let holder = self
                            .pods_api()
                            .get_opt(&name)
                            .await
                            .map_err(|e| api_error("get", "pods", &name, e))?;
                        if let Some(d) = holder
                            .filter(|h| {
                                h.labels().get(COMPONENT_LABEL).map(String::as_str)
                                    == Some(MOUNT_HOLDER)
                            })
                            .and_then(|h| Some(Doomed { name: h.metadata.name?, uid: h.metadata.uid? }))
                        {
                            self.delete_pod(&d).await?;
                        }
                    }
                    self.delete_claim(&claim).await?;
                    tracing::info!(claim = %claim.name, "dropped a primary claim whose staging pod is gone before its copy; electing again");
                    Ok(Action::requeue(REQUEUE_WAITING))
                }
                AgentStep::Foreign(why) => {
                    tracing::warn!(%why, "not copying");
                    Ok(Action::await_change())
                }
                AgentStep::CreateClaim => match binding.as_deref() {
                    Some(b) => self.create_claim(b, &staged, traceparent.as_ref()).await,
                    None => Ok(Action::await_change()),
                },
                AgentStep::CreateHolder(h) => {
                    match self.pods_api().create(&PostParams::default(), &h).await {
                        Ok(_) => tracing::info!(holder = %h.name_any(), "created the mount holder"),
                        Err(e) if warmcache_kube::is_already_exists(&e) => {}
                        Err(e) => return Err(api_error("create", "pods", &h.name_any(), e)),
                    }
                    Ok(Action::requeue(REQUEUE_WAITING))
                }
                AgentStep::DeleteHolder(d) => {
                    self.delete_pod(&d).await?;
                    Ok(Action::requeue(REQUEUE_WAITING))
                }
                AgentStep::Copy { holder_uid, pv } => {
                    // The cache may lag the copy's record: read the claim afresh, and never
                    // copy again into one that records a copy.
                    let Some(name) = claim.as_deref().map(ResourceExt::name_any) else {
                        return Ok(Action::requeue(REQUEUE_WAITING));
                    };
                    let fresh = self
                        .claims_api()
                        .get_opt(&name)
                        .await
                        .map_err(|e| api_error("get", "persistentvolumeclaims", &name, e))?;
                    match fresh {
                        Some(c) if copied_bytes(&c).is_none() => {
                            self.copy(&staged, &c, &holder_uid, &pv).await
                        }
                        _ => Ok(Action::requeue(Duration::from_secs(1))),
                    }
                }
                AgentStep::AnswerCopied { holder } => {
                    // The holder first: once answered, the staging pod ends and nothing would
                    // come back for a holder left behind (it keeps the volume attached).
                    if let Some(d) = holder {
                        self.delete_pod(&d).await?;
                    }
                    self.answer(&staged, HANDOFF_COPIED, String::new()).await?;
                    tracing::info!("answered the staging pod: copied");
                    Ok(Action::await_change())
                }
                AgentStep::GiveUp {
                    holder,
                    claim,
                    words,
                } => {
                    if let Some(d) = holder {
                        self.delete_pod(&d).await?;
                    }
                    if let Some(d) = claim {
                        self.delete_claim(&d).await?;
                    }
                    self.answer(&staged, HANDOFF_FAILED, words.clone()).await?;
                    self.metrics.gave_up();
                    tracing::warn!(%words, "gave up copying the staged download");
                    Ok(Action::await_change())
                }
            }
        }
        .instrument(span)
        .await
    }
}

/// The staging pods and capture sources (of a model or a compile-cache set) of a binding this
/// node's cache holds (for changes of its claim, holder or binding).
fn staging_pods_of(pods: &Cache<Pod>, binding: &str) -> Vec<ObjectRef<Pod>> {
    pods.store()
        .state()
        .iter()
        .filter(|p| {
            (p.labels().contains_key(STAGING_LABEL)
                && p.annotations().get(BINDING_ANNOTATION).map(String::as_str) == Some(binding))
                || is_capture_source_of(p, binding)
        })
        .map(|p| ObjectRef::from_obj(p.as_ref()))
        .collect()
}

/// Registers the watches and starts the agent on `runtime`.
///
/// # Errors
///
/// A watch or the metrics cannot be registered.
pub fn start(
    runtime: &mut warmcache_runtime::Runtime,
    settings: &Settings,
) -> Result<(), warmcache_runtime::RuntimeError> {
    let control = settings.control_namespace.clone();
    let ours = format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}");
    // Every pod of this node (staging pods, mount holders, readers): ONE cache and ONE
    // controller. Two controllers waiting for one cache's first list can miss its wake-up (the
    // store's readiness wakes only the last task that polled it), leaving one never started.
    let pods = runtime.watch::<Pod>(
        None,
        WatcherConfig::default().fields(&format!("spec.nodeName={}", settings.node)),
    )?;
    let claims = runtime
        .watch::<PersistentVolumeClaim>(Some(&control), WatcherConfig::default().labels(&ours))?;
    let bindings = runtime.watch::<ModelCacheBinding>(Some(&control), WatcherConfig::default())?;

    let metrics = Metrics::register(runtime.metrics().registry()).map_err(|err| {
        warmcache_runtime::RuntimeError::Task {
            task: "agent metrics".to_owned(),
            message: err.to_string(),
        }
    })?;
    let host = Arc::new(HostBinds {
        client: runtime.client()?,
        settings: settings.clone(),
        bindings: bindings.clone(),
        pods: pods.clone(),
        readers: pods.clone(),
        metrics: metrics.clone(),
        lock: tokio::sync::Mutex::new(()),
        recorder: warmcache_kube::EventRecorder::new(
            runtime.client()?,
            "warmcache-model-volume-controller",
            Some(&settings.node),
        ),
    });
    let agent = Agent {
        client: runtime.client()?,
        settings: settings.clone(),
        bindings: bindings.clone(),
        claims: claims.clone(),
        pods: pods.clone(),
        metrics,
        host: Arc::clone(&host),
    };
    let (p1, p2, p3) = (pods.clone(), pods.clone(), pods.clone());
    let controller = runtime
        .controller("staged-copy", &pods, agent)
        // A holder changed: the staging pods of its binding; a view holder, the readers of its
        // model. A reader changed or went: its model's view holders (the last reader gone
        // unbinds through its holder's reconcile).
        .watches(&pods, {
            let host = Arc::clone(&host);
            move |p: &Pod| {
                if is_view_holder(p) {
                    return host.readers_of_holder(p);
                }
                if p.labels().get(ROLE_LABEL).map(String::as_str) == Some(ROLE_READER) {
                    return host.holders_of_reader(p);
                }
                if p.labels().get(COMPONENT_LABEL).map(String::as_str) != Some(MOUNT_HOLDER) {
                    return Vec::new();
                }
                p.labels()
                    .get(BINDING_LABEL)
                    .map(|b| staging_pods_of(&p1, b))
                    .unwrap_or_default()
            }
        })
        .watches(&claims, move |c: &PersistentVolumeClaim| {
            c.labels()
                .get(BINDING_LABEL)
                .map(|b| staging_pods_of(&p2, b))
                .unwrap_or_default()
        })
        // The binding recorded a view or its completion: the readers of its model, and its
        // capture sources (complete: their holder goes; a failure record: they wait).
        .watches(&bindings, {
            let host = Arc::clone(&host);
            move |b: &ModelCacheBinding| {
                let mut pods = host.readers_of_binding(b);
                if let Some(name) = b.metadata.name.as_deref() {
                    pods.extend(staging_pods_of(&p3, name));
                }
                pods
            }
        })
        .concurrency(settings.concurrency);
    runtime.start_controller(controller);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::unwrap_used)]
    fn answers_replace_links_and_refuse_a_linked_directory() {
        let base = std::env::temp_dir().join(format!("mvc-answer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let dir = base.join("handoff");
        std::fs::create_dir_all(&dir).unwrap();
        let victim = base.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join(HANDOFF_FAILED)).unwrap();
        std::os::unix::fs::symlink(&victim, dir.join(".failed.tmp")).unwrap();
        write_answer(&dir, HANDOFF_FAILED, b"no space").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(
            std::fs::read_to_string(dir.join(HANDOFF_FAILED)).unwrap(),
            "no space"
        );
        assert!(
            !dir.join(HANDOFF_FAILED)
                .symlink_metadata()
                .unwrap()
                .file_type()
                .is_symlink()
        );
        let linked = base.join("linked");
        std::os::unix::fs::symlink(&dir, &linked).unwrap();
        assert!(write_answer(&linked, HANDOFF_COPIED, b"").is_err());
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn kubelet_paths() {
        let root = Path::new("/var/lib/kubelet");
        assert_eq!(
            empty_dir_path(root, "u1", "nvsnap-staging"),
            Path::new("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/nvsnap-staging")
        );
        assert_eq!(
            csi_mount_path(root, "u2", "pvc-9"),
            Path::new("/var/lib/kubelet/pods/u2/volumes/kubernetes.io~csi/pvc-9/mount")
        );
    }
}
