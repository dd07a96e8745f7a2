//! Opening a fresh ReadWriteMany root for a non-root writer (the rules:
//! [`warmcache_modelvolume::open_root`]): a writer Job pod of this node labelled
//! `warmcache.nvidia.io/open-root` -> the pure checks of the pod against its binding -> the
//! writer view claim, its PV and the binding's primary read afresh and checked -> the root of
//! the kubelet's mount of that PV in that pod given to the writer's user and group
//! (`warmcache_nodefs::open_root`), once the mount table shows the mount.

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::{Api, ResourceExt};
use tracing::Instrument;
use warmcache_modelvolume::keys::BINDING_ANNOTATION;
use warmcache_modelvolume::open_root::{
    OpenRoot, OpenRootState, open_root_request, trusted_writer_view,
};
use warmcache_nodefs::OpenOutcome;
use warmcache_runtime::{Action, ObjectRef};

use crate::agent::{Agent, Failure, api_error, csi_mount_path};

/// Look again this often while the writer's volume is not mounted yet (the writer waits).
pub const REQUEUE_NOT_MOUNTED: Duration = Duration::from_secs(2);
/// Look again this often at a writer whose volume does not check out (it may settle).
pub const REQUEUE_REFUSED: Duration = Duration::from_secs(60);

impl Agent {
    /// The reconcile of a pod asking for its root, or `None` for any other pod.
    pub(crate) async fn open_root(&self, pod: &Pod) -> Option<Result<Action, Failure>> {
        // Only this node's pods (the watch is narrowed to them; a stale cache entry is not).
        if pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
            != Some(self.settings.node.as_str())
        {
            return None;
        }
        let binding = pod.annotations().get(BINDING_ANNOTATION).and_then(|name| {
            self.bindings
                .store()
                .get(&ObjectRef::new(name).within(&self.settings.control_namespace))
        });
        let writer = match open_root_request(pod, binding.as_deref()) {
            OpenRootState::NotAsked => return None,
            OpenRootState::Finished => return Some(Ok(Action::await_change())),
            OpenRootState::Wait(why) => {
                tracing::debug!(%why, "waiting to open a writer's root");
                return Some(Ok(Action::requeue(crate::agent::REQUEUE_WAITING)));
            }
            OpenRootState::Refused(why) => {
                self.metrics.root("refused");
                tracing::warn!(%why, "not opening a writer's root");
                return Some(Ok(Action::await_change()));
            }
            OpenRootState::Open(writer) => writer,
        };
        let binding = binding?;
        let span = tracing::info_span!("open_root", pod = %writer.name, namespace = %writer.namespace, binding = %writer.binding, uid = writer.user, gid = writer.group);
        if let Err(err) = warmcache_telemetry::set_parent_from_annotations(&span, pod.annotations())
        {
            tracing::debug!(error = %err, "the open_root span starts its own trace");
        }
        Some(
            self.open_writer_root(&binding, &writer, pod)
                .instrument(span)
                .await,
        )
    }

    async fn open_writer_root(
        &self,
        binding: &warmcache_api_modelcache::v2beta1::ModelCacheBinding,
        writer: &OpenRoot,
        pod: &Pod,
    ) -> Result<Action, Failure> {
        let claims: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &writer.namespace);
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let Some(claim) = claims
            .get_opt(&writer.claim)
            .await
            .map_err(|e| api_error("get", "persistentvolumeclaims", &writer.claim, e))?
        else {
            tracing::debug!(claim = %writer.claim, "the writer view claim does not exist yet");
            return Ok(Action::requeue(crate::agent::REQUEUE_WAITING));
        };
        let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        let (Some(pv_name), Some(primary_name), true) = (
            claim.spec.as_ref().and_then(|s| s.volume_name.clone()),
            binding
                .status
                .as_ref()
                .and_then(|s| s.realized.as_ref())
                .and_then(|r| r.bound_persistent_volume_name.clone()),
            bound,
        ) else {
            tracing::debug!(claim = %writer.claim, "the writer view claim is not Bound yet");
            return Ok(Action::requeue(crate::agent::REQUEUE_WAITING));
        };
        let get_pv = |name: String| {
            let pvs = pvs.clone();
            async move {
                pvs.get_opt(&name)
                    .await
                    .map_err(|e| api_error("get", "persistentvolumes", &name, e))
            }
        };
        let (Some(pv), Some(primary)) = (
            get_pv(pv_name.clone()).await?,
            get_pv(primary_name.clone()).await?,
        ) else {
            self.metrics.root("refused");
            tracing::warn!(pv = %pv_name, primary = %primary_name, "the writer view PV or the primary is gone; not opening");
            return Ok(Action::requeue(REQUEUE_REFUSED));
        };
        let pv_name = match trusted_writer_view(binding, writer, &claim, &pv, &primary) {
            Ok(name) => name,
            Err(why) => {
                self.metrics.root("refused");
                tracing::warn!(%why, "not opening a writer's root");
                return Ok(Action::requeue(REQUEUE_REFUSED));
            }
        };
        let path = csi_mount_path(&self.settings.kubelet_root, &writer.uid, &pv_name);
        let (at, user, group) = (path.clone(), writer.user, writer.group);
        let outcome = tokio::task::spawn_blocking(move || {
            let mounts = warmcache_nodefs::read_mountinfo()?;
            warmcache_nodefs::open_root(&at, &mounts, user, group)
        })
        .await
        .map_err(|_| Failure::Task("open root"))?;
        match outcome {
            Ok(OpenOutcome::Opened) => {
                self.metrics.root("opened");
                tracing::info!(path = %path.display(), uid = user, gid = group, "gave the fresh volume root to the writer");
                let note = format!(
                    "gave the root of volume {pv_name} to {user}:{group} so the non-root writer can write"
                );
                self.host
                    .recorder
                    .normal(pod, "ModelRootOpened", "OpenRoot", Some(&note))
                    .await;
                Ok(Action::await_change())
            }
            Ok(OpenOutcome::AlreadyOpen) => {
                self.metrics.root("already_open");
                Ok(Action::await_change())
            }
            Err(warmcache_nodefs::Error::NotAVolumeRoot { .. }) => {
                self.metrics.root("not_mounted");
                tracing::debug!(path = %path.display(), "the writer's volume is not mounted yet");
                Ok(Action::requeue(REQUEUE_NOT_MOUNTED))
            }
            Err(err @ warmcache_nodefs::Error::ForeignOwner { .. }) => {
                self.metrics.root("refused");
                tracing::warn!(error = %err, "not opening a writer's root");
                let note = err.to_string();
                self.host
                    .recorder
                    .warning(pod, "ModelRootForeign", "OpenRoot", Some(&note))
                    .await;
                Ok(Action::await_change())
            }
            Err(source) => {
                self.metrics.root("failed");
                Err(Failure::Node {
                    what: format!("opening {} for {user}:{group}", path.display()),
                    source,
                })
            }
        }
    }
}
