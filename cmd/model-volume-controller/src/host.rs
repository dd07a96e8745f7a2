//! Verified read-only binds for hostPath readers of block storage (reader mode `hostPath`), on
//! the component runtime: one reconcile per model of this node = fetch (the caches of this
//! node's reader pods and view holders, the binding, a fresh GET of the view claim and PV) ->
//! the pure step [`warmcache_modelvolume::agent::host_bind_step`] -> its IO: create or delete a
//! view holder, bind the holder's mount of the view onto `<bind root>/<hash>` (verified against
//! the mount table, only over an empty directory when nothing is bound there), un-pend the
//! readers once the table shows the bind, or unbind when no reader is left.
//!
//! All models' reconciles take one lock, so two reconciles (two readers of one model, or a
//! reader and its holder) never bind or unbind the same directory at once. Nothing is
//! remembered between reconciles: every one reads the mount table afresh, so a bind removed
//! by hand or left stale by a replaced volume is redone by the next (readers and holders are
//! looked at again every [`RECHECK`]).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Client, ResourceExt};
use serde_json::json;
use tracing::Instrument;
use warmcache_api_modelcache::v2beta1::ModelCacheBinding;
use warmcache_kube::EventType;
use warmcache_modelvolume::agent::{
    DoomedIn, HostBindObserved, HostBindStep, HostReader, HostReaderState, Unpend, bind_namespace,
    host_bind_step, host_reader, is_view_holder,
};
use warmcache_modelvolume::keys::{MODEL_LABEL, PENDING_LABEL};
use warmcache_nodefs::{BindOutcome, Error as NodeError};
use warmcache_runtime::{Action, Cache, ObjectRef};

use crate::agent::{Failure, REQUEUE_WAITING, Settings, api_error, csi_mount_path};
use crate::metrics::Metrics;

/// Look at a model's bind again this often while it has readers or holders (a bind removed or
/// made stale underneath is redone within this time).
pub const RECHECK: Duration = Duration::from_secs(30);
/// Look again this often when the directory holds data a pod wrote.
pub const RECHECK_OCCUPIED: Duration = Duration::from_secs(60);

/// The hostPath-reader part of the agent (its controller reconciles readers and view holders here).
pub struct HostBinds {
    pub(crate) client: Client,
    pub(crate) settings: Settings,
    pub(crate) bindings: Cache<ModelCacheBinding>,
    /// This node's pods (view holders among them).
    pub(crate) pods: Cache<Pod>,
    /// This node's pods, readers among them (the same cache as `pods`).
    pub(crate) readers: Cache<Pod>,
    pub(crate) metrics: Metrics,
    /// One bind or unbind at a time.
    pub(crate) lock: tokio::sync::Mutex<()>,
    /// Events on readers.
    pub(crate) recorder: warmcache_kube::EventRecorder,
}

fn reader_ref(r: &HostReader) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        namespace: Some(r.namespace.clone()),
        name: Some(r.name.clone()),
        uid: Some(r.uid.clone()),
        ..ObjectReference::default()
    }
}

fn on_node(pod: &Pod, node: &str) -> bool {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
}

impl HostBinds {
    /// A Warning on each live pending reader of `readers` (folded into a series when repeated).
    async fn warn_readers(&self, readers: &[HostReader], reason: &str, note: &str) {
        for r in readers.iter().filter(|r| r.live && r.pending) {
            self.recorder
                .publish(
                    &reader_ref(r),
                    EventType::Warning,
                    reason,
                    "BindReadOnlyView",
                    Some(note),
                )
                .await;
        }
    }

    /// This node's hostPath readers of `hash`, by namespace and name.
    fn readers_of(&self, hash: &str) -> Vec<HostReader> {
        let mut out: Vec<HostReader> = self
            .readers
            .store()
            .state()
            .iter()
            .filter(|p| on_node(p, &self.settings.node))
            .filter_map(|p| match host_reader(p, &self.settings.bind_root) {
                HostReaderState::Reader(r) if r.hash == hash => Some(r),
                _ => None,
            })
            .collect();
        out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        out
    }

    /// This node's view holders of `hash`, in any namespace.
    fn holders_of(&self, hash: &str) -> Vec<Arc<Pod>> {
        self.pods
            .store()
            .state()
            .into_iter()
            .filter(|p| is_view_holder(p) && on_node(p, &self.settings.node))
            .filter(|p| p.labels().get(MODEL_LABEL).map(String::as_str) == Some(hash))
            .collect()
    }

    /// The reader pods of the model of `holder` (for a holder's change).
    pub fn readers_of_holder(&self, holder: &Pod) -> Vec<ObjectRef<Pod>> {
        let Some(hash) = holder.labels().get(MODEL_LABEL) else {
            return Vec::new();
        };
        self.readers
            .store()
            .state()
            .iter()
            .filter(|p| p.labels().get(MODEL_LABEL) == Some(hash))
            .map(|p| ObjectRef::from_obj(p.as_ref()))
            .collect()
    }

    /// The readers of `binding`'s model on this node.
    pub fn readers_of_binding(&self, binding: &ModelCacheBinding) -> Vec<ObjectRef<Pod>> {
        let hash = warmcache_api_modelcache::identity_hash(&binding.spec.identity);
        self.readers
            .store()
            .state()
            .iter()
            .filter(|p| p.labels().get(MODEL_LABEL) == Some(&hash))
            .map(|p| ObjectRef::from_obj(p.as_ref()))
            .collect()
    }

    /// The view holders of the model of `reader` (for a reader's change, its deletion
    /// included: the last reader gone unbinds through its holder's reconcile).
    pub fn holders_of_reader(&self, reader: &Pod) -> Vec<ObjectRef<Pod>> {
        reader
            .labels()
            .get(MODEL_LABEL)
            .map(|hash| {
                self.holders_of(hash)
                    .iter()
                    .map(|p| ObjectRef::from_obj(p.as_ref()))
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn get_view(
        &self,
        namespace: &str,
        claim: &str,
        pv: &str,
    ) -> Result<(Option<PersistentVolumeClaim>, Option<PersistentVolume>), Failure> {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        let claim = claims
            .get_opt(claim)
            .await
            .map_err(|e| api_error("get", "persistentvolumeclaims", claim, e))?;
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let pv = pvs
            .get_opt(pv)
            .await
            .map_err(|e| api_error("get", "persistentvolumes", pv, e))?;
        Ok((claim, pv))
    }

    async fn delete_holder(&self, d: &DoomedIn) -> Result<(), Failure> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(d.pod.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &d.namespace);
        match api.delete(&d.pod.name, &params).await {
            Ok(_) => Ok(()),
            Err(e) if warmcache_kube::is_not_found(&e) || warmcache_kube::is_conflict(&e) => Ok(()),
            Err(e) => Err(api_error("delete", "pods", &d.pod.name, e)),
        }
    }

    /// Removes the pending label of `u`, only from the pod with its UID (the UID in a merge
    /// patch is a precondition). A pod gone or replaced meanwhile is skipped.
    async fn unpend(&self, u: &Unpend) -> Result<bool, Failure> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &u.namespace);
        let patch = json!({ "metadata": { "uid": u.uid, "labels": { PENDING_LABEL: null } } });
        match api
            .patch(
                &u.name,
                &PatchParams {
                    field_manager: Some(crate::agent::FIELD_MANAGER.to_owned()),
                    ..PatchParams::default()
                },
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(e)
                if warmcache_kube::is_not_found(&e)
                    || warmcache_kube::is_conflict(&e)
                    || is_invalid(&e) =>
            {
                Ok(false)
            }
            Err(e) => Err(api_error("patch", "pods", &u.name, e)),
        }
    }

    /// One model's reconcile; `trigger` is the pod it was started for (its traceparent joins
    /// the span).
    pub async fn reconcile(&self, hash: &str, trigger: &Pod) -> Result<Action, Failure> {
        let span = tracing::info_span!("host_bind", model = %hash, pod = %trigger.name_any(), namespace = %trigger.namespace().unwrap_or_default());
        if let Err(err) =
            warmcache_telemetry::set_parent_from_annotations(&span, trigger.annotations())
        {
            tracing::debug!(error = %err, "the bind span starts its own trace");
        }
        async {
            let _one_at_a_time = self.lock.lock().await;
            self.reconcile_locked(hash).await
        }
        .instrument(span)
        .await
    }

    async fn reconcile_locked(&self, hash: &str) -> Result<Action, Failure> {
        let readers = self.readers_of(hash);
        let holders = self.holders_of(hash);
        let holder_refs: Vec<&Pod> = holders.iter().map(AsRef::as_ref).collect();
        let binding = readers.iter().find(|r| r.live).and_then(|r| {
            self.bindings
                .store()
                .get(&ObjectRef::new(&r.binding).within(&self.settings.control_namespace))
        });
        let named: Vec<HostReader> = match binding.as_deref() {
            Some(b) => readers
                .iter()
                .filter(|r| Some(&r.binding) == b.metadata.name.as_ref())
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        let view = binding.as_deref().and_then(|b| {
            let ns = bind_namespace(&named, b, &holder_refs)?;
            b.status
                .as_ref()?
                .realized
                .as_ref()?
                .views
                .iter()
                .find(|v| v.namespace == ns)
                .cloned()
        });
        let (claim, pv) = match &view {
            Some(v) => {
                self.get_view(
                    &v.namespace,
                    &v.persistent_volume_claim_name,
                    &v.persistent_volume_name,
                )
                .await?
            }
            None => (None, None),
        };
        let step = host_bind_step(&HostBindObserved {
            node: &self.settings.node,
            bind_root: &self.settings.bind_root,
            hash,
            readers: &readers,
            binding: binding.as_deref(),
            holders: &holder_refs,
            view_claim: claim.as_ref(),
            view_pv: pv.as_ref(),
            holder_image: &self.settings.holder_image,
        });
        self.metrics.host_step(&step);
        match step {
            HostBindStep::Wait(why) => {
                tracing::debug!(%why, "waiting");
                Ok(Action::requeue(REQUEUE_WAITING))
            }
            HostBindStep::Foreign(why) => {
                tracing::warn!(%why, "not binding");
                self.warn_readers(&readers, "ModelViewRefused", &why).await;
                Ok(Action::requeue(RECHECK))
            }
            HostBindStep::CreateHolder(h) => {
                let ns = h.namespace().unwrap_or_default();
                let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
                match api.create(&PostParams::default(), &h).await {
                    Ok(_) => {
                        tracing::info!(holder = %h.name_any(), namespace = %ns, "created the view holder");
                    }
                    Err(e) if warmcache_kube::is_already_exists(&e) => {}
                    Err(e) => return Err(api_error("create", "pods", &h.name_any(), e)),
                }
                Ok(Action::requeue(REQUEUE_WAITING))
            }
            HostBindStep::DeleteHolders(doomed) => {
                for d in &doomed {
                    self.delete_holder(d).await?;
                }
                Ok(Action::requeue(REQUEUE_WAITING))
            }
            HostBindStep::Bind {
                holder_uid,
                pv,
                target,
                unpend,
                retire,
            } => {
                let source = csi_mount_path(&self.settings.kubelet_root, &holder_uid, &pv);
                let (s, t) = (source.clone(), std::path::PathBuf::from(&target));
                let result = tokio::task::spawn_blocking(move || {
                    warmcache_nodefs::ensure_read_only_bind_over_empty(&s, &t)
                })
                .await
                .map_err(|_| Failure::Task("bind"))?;
                let outcome = match result {
                    Ok(o) => o,
                    Err(NodeError::NotAMountPoint { .. }) => {
                        self.metrics.bind("not_mounted");
                        tracing::debug!(view = %source.display(), "the view is not mounted yet; nothing is bound");
                        return Ok(Action::requeue(REQUEUE_WAITING));
                    }
                    Err(e @ NodeError::Occupied { .. }) => {
                        self.metrics.bind("occupied");
                        tracing::warn!(error = %e, "not binding over data a pod wrote; the readers stay pending");
                        self.warn_readers(
                            &readers,
                            "ModelDirectoryOccupied",
                            &format!(
                                "{e}: the read-only copy is bound only over an empty directory; the pod stays pending"
                            ),
                        )
                        .await;
                        return Ok(Action::requeue(RECHECK_OCCUPIED));
                    }
                    Err(e) => {
                        self.metrics.bind("failed");
                        return Err(Failure::Node {
                            what: format!("binding {} onto {target}", source.display()),
                            source: e,
                        });
                    }
                };
                self.metrics.bind(match outcome {
                    BindOutcome::Verified => "verified",
                    BindOutcome::Created => "created",
                    BindOutcome::Redone => "redone",
                });
                if outcome != BindOutcome::Verified {
                    tracing::info!(?outcome, view = %source.display(), %target, "bound the read-only view, verified against the mount table");
                }
                // Only now, with the table showing the bind.
                for u in &unpend {
                    if self.unpend(u).await? {
                        self.metrics.unpended();
                        let reference = ObjectReference {
                            api_version: Some("v1".to_owned()),
                            kind: Some("Pod".to_owned()),
                            namespace: Some(u.namespace.clone()),
                            name: Some(u.name.clone()),
                            uid: Some(u.uid.clone()),
                            ..ObjectReference::default()
                        };
                        self.recorder
                            .publish(
                                &reference,
                                EventType::Normal,
                                "ModelViewBound",
                                "Unpend",
                                Some(&format!(
                                    "{target} is a read-only bind of view {pv}, verified against the node's mount table"
                                )),
                            )
                            .await;
                        tracing::info!(reader = %u.name, namespace = %u.namespace, "un-pended the reader: its bind is verified");
                    }
                }
                for d in &retire {
                    self.delete_holder(d).await?;
                }
                Ok(Action::requeue(RECHECK))
            }
            HostBindStep::Unbind { target, holders } => {
                let t = std::path::PathBuf::from(&target);
                let unbound = tokio::task::spawn_blocking(move || warmcache_nodefs::unbind(&t))
                    .await
                    .map_err(|_| Failure::Task("unbind"))?
                    .map_err(|e| Failure::Node {
                        what: format!("unbinding {target}"),
                        source: e,
                    })?;
                if unbound {
                    self.metrics.bind("unbound");
                    tracing::info!(%target, "no reader of the model is left on the node: unbound");
                }
                // The holders after the bind: a mount of the volume would keep it busy.
                for d in &holders {
                    self.delete_holder(d).await?;
                }
                Ok(Action::await_change())
            }
        }
    }
}

fn is_invalid(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 422)
}
