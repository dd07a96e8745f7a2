//! The KVCacheBackend controller: reconcile = fetch (caches), validate and build (the pure
//! renderer), apply (server-side apply, one field manager), prune what this backend no longer
//! renders, restart member Pods whose pod-spec hash is stale, status.
//!
//! Runs on the component runtime, leader-elected. The workloads live in the system namespace
//! (`--namespace`, default `gpustack-system`); backends are cluster-scoped and own them through
//! a controller ownerReference (without `blockOwnerDeletion`), so the garbage collector removes
//! them with a backend that lost its finalizer by force.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::core::PartialObjectMeta;
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;
use warmcache_api_kvcache::v1alpha1::KVCacheBackend;
use warmcache_kube::{
    Applier, EventRecorder, Leadership, add_finalizer, has_finalizer, remove_finalizer,
};
use warmcache_kvcache::names::{APP_NAME, LABEL_INSTANCE, LABEL_NAME, POD_SPEC_HASH_ANNOTATION};
use warmcache_kvcache::rollout::{Scheduled, restart_plan};
use warmcache_kvcache::status::{Observed, backend_status};
use warmcache_kvcache::store::{HEALTH_PATH, METRICS_PATH, SEGMENTS_DETAIL_PATH};
use warmcache_kvcache::survey::tier_was_empty;
use warmcache_kvcache::teardown::{
    CleanupAction, CleanupInput, CleanupPlan, DeleteReason, LABEL_CLEANUP_OF, TeardownStep,
    Workload, cleanup_image, cleanup_pass, teardown_step,
};
use warmcache_kvcache::{RenderContext, Rendered, render};
use warmcache_runtime::{Action, Cache, ReconcileError, Reconciler};

use crate::metrics::{ControllerMetrics, Outcome};

/// Field manager of everything the controller applies.
pub const FIELD_MANAGER: &str = "kvcache-operator";

/// The finalizer that holds a backend until its workloads are gone and its tier is emptied.
pub const FINALIZER: &str = warmcache_api_kvcache::FINALIZER;

/// Requeue while something is still changing (a rollout, a restart, a teardown step).
pub const REQUEUE_CHANGING: Duration = Duration::from_secs(5);

/// Requeue once settled, to re-read what the store reports.
pub const REQUEUE_SETTLED: Duration = warmcache_kvcache::status::SETTLED_REQUEUE;

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// A Kubernetes API call failed.
    #[error(transparent)]
    Kube(#[from] warmcache_kube::Error),
    /// The backend cannot be rendered (the webhook admitted something the renderer refuses,
    /// or the webhook was bypassed).
    #[error("cannot render the backend: {0}")]
    Render(#[from] warmcache_kvcache::RenderError),
    /// This replica lost the Lease mid-reconcile; the new leader takes over.
    #[error("not the leader any more")]
    NotLeader,
    /// The teardown cannot decide its next step.
    #[error("teardown: {0}")]
    Teardown(String),
}

impl ReconcileError for Failure {
    const CATEGORIES: &'static [&'static str] = &["render", "not_leader", "teardown"];

    fn category(&self) -> &'static str {
        match self {
            Self::Kube(err) => ReconcileError::category(err),
            Self::Render(_) => "render",
            Self::NotLeader => "not_leader",
            Self::Teardown(_) => "teardown",
        }
    }

    fn is_permanent(&self) -> bool {
        match self {
            Self::Kube(err) => ReconcileError::is_permanent(err),
            Self::Render(_) => true,
            Self::NotLeader | Self::Teardown(_) => false,
        }
    }
}

/// What the controller reads and writes with.
pub struct Backends {
    /// The client.
    pub client: Client,
    /// Server-side apply as [`FIELD_MANAGER`].
    pub applier: Applier,
    /// Namespace of the workloads and the image setting.
    pub render: RenderContext,
    /// This replica's Lease, checked before every write.
    pub leadership: Leadership,
    /// The member, leader and cleanup Pods of every backend, in the system namespace.
    pub pods: Cache<Pod>,
    /// The member DaemonSets of every backend.
    pub daemonsets: Cache<DaemonSet>,
    /// Every backend (the teardown's shared-path check reads the others).
    pub backends: Cache<KVCacheBackend>,
    /// Every Node's metadata (the tier cleanup selects nodes by label).
    pub nodes: Cache<PartialObjectMeta<Node>>,
    /// Where a managed backend's leader admin port is reached
    /// ([`crate::scrape::DEFAULT_ADMIN_ADDRESS`]).
    pub admin_address: String,
    /// Events on backends and Nodes.
    pub recorder: Option<EventRecorder>,
    /// The controller's metrics ([`crate::metrics`]).
    pub metrics: ControllerMetrics,
}

impl Backends {
    fn ensure_leader(&self) -> Result<(), Failure> {
        self.leadership
            .ensure_leader()
            .map_err(|_| Failure::NotLeader)
    }

    fn namespaced<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.render.namespace)
    }

    async fn apply<K>(&self, object: &K) -> Result<(), Failure>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Serialize
            + Debug,
    {
        self.ensure_leader()?;
        self.applier
            .force_apply(&self.namespaced::<K>(), object)
            .await?;
        Ok(())
    }

    /// Applies every rendered object, dependencies first (accounts before the Pods that name
    /// them).
    async fn apply_rendered(&self, rendered: &Rendered) -> Result<(), Failure> {
        for account in &rendered.service_accounts {
            self.apply(account).await?;
        }
        for role in &rendered.roles {
            self.apply(role).await?;
        }
        for binding in &rendered.role_bindings {
            self.apply(binding).await?;
        }
        self.apply(&rendered.leader).await?;
        self.apply(&rendered.service).await?;
        for member in &rendered.members {
            self.apply(member).await?;
        }
        Ok(())
    }

    /// Deletes the objects of kind `K` this backend owns that it no longer renders (a member
    /// group removed from the spec, HA switched off). Returns how many were deleted.
    async fn prune<K>(
        &self,
        backend: &KVCacheBackend,
        keep: &BTreeSet<String>,
    ) -> Result<usize, Failure>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Debug,
    {
        let api = self.namespaced::<K>();
        let owned = owned_by(&api, backend).await?;
        let mut deleted = 0;
        for object in owned {
            let name = object.name_any();
            if keep.contains(&name) || object.meta().deletion_timestamp.is_some() {
                continue;
            }
            self.ensure_leader()?;
            tracing::info!(kind = %K::kind(&()), name, "deleting an object the backend no longer renders");
            delete_exact(&api, &object).await?;
            deleted += 1;
        }
        Ok(deleted)
    }

    /// Restarts at most one member Pod per group whose pod-spec hash is not its DaemonSet's
    /// (the DaemonSets use `OnDelete`), and only while none is terminating, every node the
    /// DaemonSet schedules has a Pod and every current Pod is ready: a template change rolls
    /// through the tier one node at a time instead of emptying it. Returns whether a rollout is
    /// still in progress.
    async fn restart_stale_members(&self, rendered: &Rendered) -> Result<bool, Failure> {
        let mut rolling = false;
        for member in &rendered.members {
            let Some(wanted) = member
                .spec
                .template
                .metadata
                .as_ref()
                .and_then(|meta| meta.annotations.as_ref())
                .and_then(|annotations| annotations.get(POD_SPEC_HASH_ANNOTATION))
            else {
                continue;
            };
            let selector = member
                .spec
                .selector
                .match_labels
                .clone()
                .unwrap_or_default();
            if selector.is_empty() {
                continue;
            }
            let state = self.pods.store().state();
            let pods: Vec<&Pod> = state
                .iter()
                .map(AsRef::as_ref)
                .filter(|pod| matches_labels(pod.labels(), &selector))
                .collect();
            // The DaemonSet as the DaemonSet controller last reported on it (the rendered one
            // has no status).
            let scheduled = self
                .daemonsets
                .store()
                .get(&warmcache_runtime::ObjectRef::from_obj(member))
                .and_then(|ds| Scheduled::of(&ds));
            let plan = restart_plan(&pods, wanted, scheduled);
            rolling |= plan.rolling();
            if let Some(held) = plan.held {
                tracing::debug!(
                    daemonset = member.name_any(),
                    stale = plan.stale,
                    ?held,
                    "member restart held"
                );
            }
            if let Some(pod) = plan.restart {
                self.ensure_leader()?;
                tracing::info!(
                    pod = pod.name_any(),
                    daemonset = member.name_any(),
                    "restarting a member whose pod spec is stale"
                );
                delete_exact(&self.namespaced::<Pod>(), pod).await?;
            }
        }
        Ok(rolling)
    }
}

fn matches_labels(labels: &BTreeMap<String, String>, selector: &BTreeMap<String, String>) -> bool {
    warmcache_kvcache::rollout::matches_labels(Some(labels), selector)
}

/// The objects of `api` labelled as this backend's and controlled by its UID.
async fn owned_by<K>(api: &Api<K>, backend: &KVCacheBackend) -> Result<Vec<K>, Failure>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let name = backend.name_any();
    let Some(uid) = backend.uid() else {
        return Ok(Vec::new());
    };
    let selector = format!("{LABEL_NAME}={APP_NAME},{LABEL_INSTANCE}={name}");
    let list = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| warmcache_kube::Error::List {
            resource: api.resource_url().to_owned(),
            selector: selector.clone(),
            category: warmcache_kube::category(&source),
            source: Box::new(source),
        })?;
    Ok(list
        .items
        .into_iter()
        .filter(|object| {
            object
                .owner_references()
                .iter()
                .any(|owner| owner.uid == uid && owner.controller == Some(true))
        })
        .collect())
}

/// Deletes exactly `object` (its UID as a precondition): an object recreated under the same
/// name meanwhile is left alone. Gone already is success.
async fn delete_exact<K>(api: &Api<K>, object: &K) -> Result<(), Failure>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    delete_named(api, &object.name_any(), object.uid()).await
}

/// Deletes `name`, only while it is the object with `uid` (when known). Gone already, or
/// replaced meanwhile, is success.
async fn delete_named<K>(api: &Api<K>, name: &str, uid: Option<String>) -> Result<(), Failure>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let params = DeleteParams::background().preconditions(Preconditions {
        uid,
        resource_version: None,
    });
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(err) if warmcache_kube::is_not_found(&err) || warmcache_kube::is_conflict(&err) => {
            Ok(())
        }
        Err(err) => {
            Err(warmcache_kube::Error::from_kube("delete", api.resource_url(), name, err).into())
        }
    }
}

impl Reconciler<KVCacheBackend> for Backends {
    type Error = Failure;

    async fn reconcile(&self, backend: Arc<KVCacheBackend>) -> Result<Action, Failure> {
        let (action, outcome) = self.reconcile_live(backend).await?;
        if let Some(outcome) = outcome {
            self.metrics.outcome(outcome);
        }
        Ok(action)
    }

    async fn permanent_failure(&self, backend: Arc<KVCacheBackend>, error: &Failure) {
        // A backend the renderer refuses: say so in the status, where `kubectl get` shows it.
        let api: Api<KVCacheBackend> = Api::all(self.client.clone());
        let mut status = backend.status.clone().unwrap_or_default();
        status.phase = Some("Error".to_owned());
        status.phase_message = Some(warmcache_kvcache::condition::cap_message(&format!(
            "the operator cannot render this backend: {error}"
        )));
        status.used_by = None;
        if self.ensure_leader().is_ok()
            && let Err(err) = self
                .applier
                .force_apply_status(&api, &backend.name_any(), &status_patch(status))
                .await
        {
            tracing::warn!(error = %err, "cannot record the failure in the status");
        }
    }
}

/// A status-only apply body. `usedBy` is left out: consumers own it.
fn status_patch(
    mut status: warmcache_api_kvcache::v1alpha1::KVCacheBackendStatus,
) -> serde_json::Value {
    status.used_by = None;
    serde_json::json!({
        "apiVersion": warmcache_api_kvcache::v1alpha1::API_VERSION,
        "kind": warmcache_api_kvcache::v1alpha1::KIND,
        "status": status,
    })
}

impl Backends {
    /// One status pass: read the leader's admin port, the workloads and the survey, derive the
    /// status ([`backend_status`]) and write it when it changed; publish the survey's Event.
    async fn write_status(
        &self,
        api: &Api<KVCacheBackend>,
        backend: &KVCacheBackend,
        teardown_message: Option<&str>,
    ) -> Result<(), Failure> {
        let name = backend.name_any();
        let namespace = self.render.namespace.as_str();
        let admin = if backend.spec.connection.managed.is_some() {
            Some(crate::scrape::admin_address(
                &self.admin_address,
                &name,
                namespace,
            ))
        } else {
            warmcache_kvcache::status::admin_address(backend, namespace)
        };
        let deleting = backend.meta().deletion_timestamp.is_some();
        // The listing before the gauges: a segment the listing shows mounted is then already
        // in the capacity read after it (the reverse order could report a member mounted with
        // the memory it brings still missing from `status.capacity`).
        let (health, segments, metrics) = match (&admin, deleting) {
            (Some(address), false) => {
                let health = crate::scrape::fetch(address, HEALTH_PATH).await;
                let segments = crate::scrape::fetch(address, SEGMENTS_DETAIL_PATH).await;
                let metrics = crate::scrape::fetch(address, METRICS_PATH).await;
                (Some(health), Some(segments), Some(metrics))
            }
            _ => (None, None, None),
        };
        // Backends that left without a teardown of ours (a finalizer stripped by hand or by
        // the uninstall hook) drop out of the sums too.
        let live: BTreeSet<String> = self
            .backends
            .store()
            .state()
            .iter()
            .map(|b| b.name_any())
            .collect();
        self.metrics.retain_readings(|known| live.contains(known));
        self.metrics.tier_reading(
            &name,
            warmcache_kvcache::status::store_gauges(health.as_ref(), metrics.as_ref()),
        );
        let pods = self.pods.store().state();
        let mine: Vec<&Pod> = pods
            .iter()
            .map(AsRef::as_ref)
            .filter(|pod| pod.labels().get(LABEL_INSTANCE) == Some(&name))
            .collect();
        let leader_selector = warmcache_kvcache::names::selector_labels(
            &name,
            warmcache_kvcache::names::LEADER_COMPONENT,
        );
        let leader_pods: Vec<&Pod> = mine
            .iter()
            .copied()
            .filter(|pod| matches_labels(pod.labels(), &leader_selector))
            .collect();
        let daemonsets = self.daemonsets.store().state();
        let groups = backend
            .spec
            .connection
            .managed
            .as_ref()
            .map_or(0, |managed| managed.members.len());
        let member_daemonsets: Vec<&DaemonSet> = (0..groups)
            .filter_map(|index| {
                let wanted = warmcache_kvcache::names::member_name(&name, index);
                daemonsets
                    .iter()
                    .map(AsRef::as_ref)
                    .find(|ds| ds.name_any() == wanted)
            })
            .collect();
        let survey_groups: Vec<(Option<&DaemonSet>, Vec<&Pod>)> = (0..groups)
            .map(|index| {
                let wanted = warmcache_kvcache::names::member_name(&name, index);
                let ds = member_daemonsets
                    .iter()
                    .copied()
                    .find(|ds| ds.name_any() == wanted);
                let pods = ds
                    .and_then(|ds| ds.spec.selector.match_labels.clone())
                    .map(|selector| {
                        mine.iter()
                            .copied()
                            .filter(|pod| matches_labels(pod.labels(), &selector))
                            .collect()
                    })
                    .unwrap_or_default();
                (ds, pods)
            })
            .collect();
        let verdict = if deleting {
            None
        } else {
            tier_was_empty(backend, &survey_groups)
        };
        let member_pods: Vec<&Pod> = mine
            .iter()
            .copied()
            .filter(|pod| {
                !leader_selector
                    .iter()
                    .all(|(k, v)| pod.labels().get(k) == Some(v))
            })
            .collect();
        let observed = Observed {
            namespace,
            health: health.as_ref(),
            metrics: metrics.as_ref(),
            segments: segments.as_ref(),
            leader_pods: &leader_pods,
            member_daemonsets: &member_daemonsets,
            tier_verdict: verdict.as_ref(),
            teardown_message,
        };
        let status = backend_status(backend, &observed, &member_pods, Timestamp::now());
        let mut before = backend.status.clone().unwrap_or_default();
        before.used_by = None;
        let mut after = status.clone();
        after.used_by = None;
        if before != after {
            self.ensure_leader()?;
            self.applier
                .force_apply_status(api, &name, &status_patch(status))
                .await?;
        }
        if let (Some(event), Some(recorder)) = (verdict.and_then(|v| v.event), &self.recorder) {
            recorder
                .warning(backend, event.reason, "Survey", Some(&event.message))
                .await;
        }
        Ok(())
    }
}

impl Backends {
    /// A reconcile, and what it did for `reconcile_outcomes_total`.
    async fn reconcile_live(
        &self,
        backend: Arc<KVCacheBackend>,
    ) -> Result<(Action, Option<Outcome>), Failure> {
        let api: Api<KVCacheBackend> = Api::all(self.client.clone());
        if backend.meta().deletion_timestamp.is_some() {
            return self.teardown(&api, &backend).await;
        }
        if !has_finalizer(backend.as_ref(), FINALIZER) {
            self.ensure_leader()?;
            add_finalizer(&api, backend.as_ref(), FINALIZER).await?;
            // The change wakes the next reconcile.
            return Ok((Action::await_change(), Some(Outcome::FinalizerAdded)));
        }
        let managed = backend.spec.connection.managed.is_some();
        if !managed {
            self.write_status(&api, &backend, None).await?;
            return Ok((Action::requeue(REQUEUE_SETTLED), Some(Outcome::External)));
        }
        let rendered = render(backend.as_ref(), &self.render)?;
        self.apply_rendered(&rendered).await?;
        let members: BTreeSet<String> =
            rendered.members.iter().map(ResourceExt::name_any).collect();
        let accounts: BTreeSet<String> = rendered
            .service_accounts
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        let roles: BTreeSet<String> = rendered.roles.iter().map(ResourceExt::name_any).collect();
        let bindings: BTreeSet<String> = rendered
            .role_bindings
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        let mut pruned = self.prune::<DaemonSet>(&backend, &members).await?;
        pruned += self.prune::<RoleBinding>(&backend, &bindings).await?;
        pruned += self.prune::<Role>(&backend, &roles).await?;
        pruned += self.prune::<ServiceAccount>(&backend, &accounts).await?;
        let rolling = self.restart_stale_members(&rendered).await?;
        self.write_status(&api, &backend, None).await?;
        Ok(if rolling || pruned > 0 {
            (Action::requeue(REQUEUE_CHANGING), Some(Outcome::Changing))
        } else {
            (Action::requeue(REQUEUE_SETTLED), Some(Outcome::Settled))
        })
    }

    /// Teardown of a backend being deleted (reference section 6): wait for consumers, delete
    /// the workloads and wait until they are gone, empty the tier on every node when asked,
    /// then release the finalizer. Every step is decided by
    /// [`warmcache_kvcache::teardown`] from what is stored, so a crash resumes where it left.
    ///
    /// Runs in a `teardown` span (backend, step) inside the runtime's `reconcile` span; the tier
    /// cleanup pass has its own `tier_cleanup` span.
    async fn teardown(
        &self,
        api: &Api<KVCacheBackend>,
        backend: &KVCacheBackend,
    ) -> Result<(Action, Option<Outcome>), Failure> {
        if !has_finalizer(backend, FINALIZER) {
            return Ok((Action::await_change(), None));
        }
        let span = tracing::info_span!(
            "teardown",
            backend = %backend.name_any(),
            step = tracing::field::Empty,
        );
        self.teardown_steps(api, backend, &span)
            .instrument(span.clone())
            .await
    }

    async fn teardown_steps(
        &self,
        api: &Api<KVCacheBackend>,
        backend: &KVCacheBackend,
        span: &tracing::Span,
    ) -> Result<(Action, Option<Outcome>), Failure> {
        let mut present: Vec<(Workload, Deleter)> = Vec::new();
        self.present::<Deployment>(backend, &mut present).await?;
        self.present::<Service>(backend, &mut present).await?;
        self.present::<DaemonSet>(backend, &mut present).await?;
        self.present::<RoleBinding>(backend, &mut present).await?;
        self.present::<Role>(backend, &mut present).await?;
        self.present::<ServiceAccount>(backend, &mut present)
            .await?;
        let workloads: Vec<Workload> = present.iter().map(|(w, _)| w.clone()).collect();
        let step = teardown_step(backend, &workloads);
        span.record(
            "step",
            match &step {
                TeardownStep::WaitForConsumers { .. } => "wait_for_consumers",
                TeardownStep::DeleteWorkloads { .. } => "delete_workloads",
                TeardownStep::CleanTier(_) => "clean_tier",
                TeardownStep::RemoveFinalizer => "remove_finalizer",
            },
        );
        match &step {
            TeardownStep::WaitForConsumers { message } => {
                self.write_status(api, backend, Some(message)).await?;
                Ok((Action::await_change(), Some(Outcome::WaitingForConsumers)))
            }
            TeardownStep::DeleteWorkloads { delete, message } => {
                self.write_status(api, backend, Some(message)).await?;
                for (workload, deleter) in &present {
                    if delete.contains(workload) {
                        self.ensure_leader()?;
                        deleter.delete(self).await?;
                    }
                }
                Ok((
                    Action::requeue(step.requeue().unwrap_or(REQUEUE_CHANGING)),
                    Some(Outcome::DeletingWorkloads),
                ))
            }
            TeardownStep::CleanTier(target) => {
                let span = tracing::info_span!(
                    "tier_cleanup",
                    backend = %backend.name_any(),
                    path = %target.path,
                    pending = tracing::field::Empty,
                    done = tracing::field::Empty,
                );
                let plan = self
                    .clean_tier(backend, target)
                    .instrument(span.clone())
                    .await?;
                span.record("pending", plan.pending.len());
                span.record("done", plan.done);
                if plan.done {
                    let action = self.release(api, backend).await?;
                    // Counted once the finalizer is off (a pass that fails before repeats),
                    // and once per backend (a stale cached copy can come through here again).
                    let uid = backend.uid().unwrap_or_default();
                    self.metrics.cleanup_finished(&uid, &plan.finished);
                    Ok((action, Some(Outcome::Released)))
                } else {
                    Ok((
                        Action::requeue(step.requeue().unwrap_or(REQUEUE_CHANGING)),
                        Some(Outcome::CleaningTier),
                    ))
                }
            }
            TeardownStep::RemoveFinalizer => {
                let action = self.release(api, backend).await?;
                Ok((action, Some(Outcome::Released)))
            }
        }
    }

    async fn release(
        &self,
        api: &Api<KVCacheBackend>,
        backend: &KVCacheBackend,
    ) -> Result<Action, Failure> {
        self.ensure_leader()?;
        match remove_finalizer(api, backend, FINALIZER).await {
            Ok(_) => {}
            Err(err) if err.is_not_found() => {}
            Err(err) => return Err(err.into()),
        }
        self.metrics.tier_reading(&backend.name_any(), None);
        Ok(Action::await_change())
    }

    /// One cleanup pass, its calls made; returns the plan (done, pending, finished nodes).
    async fn clean_tier(
        &self,
        backend: &KVCacheBackend,
        target: &warmcache_kvcache::teardown::CleanupTarget<'_>,
    ) -> Result<CleanupPlan, Failure> {
        let name = backend.name_any();
        let nodes: Vec<Node> = self
            .nodes
            .store()
            .state()
            .iter()
            .map(|meta| Node {
                metadata: meta.metadata.clone(),
                ..Node::default()
            })
            .collect();
        let node_refs: Vec<&Node> = nodes.iter().collect();
        let backends = self.backends.store().state();
        let backend_refs: Vec<&KVCacheBackend> = backends.iter().map(AsRef::as_ref).collect();
        let pods = self.pods.store().state();
        let cleanup_pods: Vec<&Pod> = pods
            .iter()
            .map(AsRef::as_ref)
            .filter(|pod| pod.labels().get(LABEL_CLEANUP_OF) == Some(&name))
            .collect();
        let input = CleanupInput {
            backend,
            namespace: &self.render.namespace,
            nodes: &node_refs,
            backends: &backend_refs,
            pods: &cleanup_pods,
            now: Timestamp::now(),
            image: cleanup_image(backend, target.group, self.render.default_image.as_deref()),
        };
        let plan = cleanup_pass(&input).map_err(|err| Failure::Teardown(err.to_string()))?;
        let pods_api = self.namespaced::<Pod>();
        for action in &plan.actions {
            self.ensure_leader()?;
            match action {
                CleanupAction::CreatePod(pod) => {
                    match pods_api.create(&Default::default(), pod.as_ref()).await {
                        Ok(_) => {}
                        Err(err) if warmcache_kube::is_already_exists(&err) => {}
                        Err(err) => {
                            return Err(warmcache_kube::Error::from_kube(
                                "create",
                                pods_api.resource_url(),
                                &pod.name_any(),
                                err,
                            )
                            .into());
                        }
                    }
                }
                CleanupAction::DeletePod { name, uid, why } => {
                    tracing::info!(pod = name, ?why, "deleting a cleanup Pod");
                    delete_named(&pods_api, name, uid.clone()).await?;
                    if *why == DeleteReason::SharedPath {
                        self.metrics.cleanup_stopped();
                    }
                }
                CleanupAction::NodeEvent {
                    node,
                    reason,
                    message,
                } => {
                    if let Some(recorder) = &self.recorder {
                        let regarding = nodes
                            .iter()
                            .find(|n| n.name_any() == *node)
                            .cloned()
                            .unwrap_or_else(|| Node {
                                metadata: kube::api::ObjectMeta {
                                    name: Some(node.clone()),
                                    ..Default::default()
                                },
                                ..Node::default()
                            });
                        recorder
                            .warning(&regarding, reason, "CleanTier", Some(message))
                            .await;
                    }
                }
            }
        }
        if !plan.done {
            tracing::debug!(pending = ?plan.pending, "tier cleanup pending");
        }
        Ok(plan)
    }

    /// Adds the objects of kind `K` the backend owns to `present`, each with its deleter.
    async fn present<K>(
        &self,
        backend: &KVCacheBackend,
        present: &mut Vec<(Workload, Deleter)>,
    ) -> Result<(), Failure>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Debug,
    {
        let api = self.namespaced::<K>();
        for object in owned_by(&api, backend).await? {
            present.push((
                Workload {
                    kind: K::kind(&()).into_owned(),
                    name: object.name_any(),
                    terminating: object.meta().deletion_timestamp.is_some(),
                },
                Deleter {
                    kind: K::kind(&()).into_owned(),
                    name: object.name_any(),
                    uid: object.uid(),
                },
            ));
        }
        Ok(())
    }
}

/// Deletes one workload by kind, name and UID.
#[derive(Debug)]
struct Deleter {
    kind: String,
    name: String,
    uid: Option<String>,
}

impl Deleter {
    async fn delete(&self, backends: &Backends) -> Result<(), Failure> {
        let uid = self.uid.clone();
        match self.kind.as_str() {
            "Deployment" => {
                delete_named(&backends.namespaced::<Deployment>(), &self.name, uid).await
            }
            "Service" => delete_named(&backends.namespaced::<Service>(), &self.name, uid).await,
            "DaemonSet" => delete_named(&backends.namespaced::<DaemonSet>(), &self.name, uid).await,
            "RoleBinding" => {
                delete_named(&backends.namespaced::<RoleBinding>(), &self.name, uid).await
            }
            "Role" => delete_named(&backends.namespaced::<Role>(), &self.name, uid).await,
            "ServiceAccount" => {
                delete_named(&backends.namespaced::<ServiceAccount>(), &self.name, uid).await
            }
            other => Err(Failure::Teardown(format!("no deleter for kind {other}"))),
        }
    }
}

/// `kvcache-operator controller`: reconciles on the component runtime until SIGTERM or SIGINT.
pub fn run(args: crate::ControllerArgs) -> Result<(), warmcache_runtime::RuntimeError> {
    warmcache_runtime::block_on(serve(args))
}

async fn serve(args: crate::ControllerArgs) -> Result<(), warmcache_runtime::RuntimeError> {
    if let Some(problem) = warmcache_kvcache::names::dns1123_label_problem(&args.namespace) {
        return Err(warmcache_runtime::RuntimeError::Task {
            task: "--namespace".to_owned(),
            message: format!("{:?} is not a namespace name: {problem}", args.namespace),
        });
    }
    let mut runtime = warmcache_runtime::Runtime::builder("kvcache-operator", args.runtime)
        .version(env!("CARGO_PKG_VERSION"))
        .with_leader_election(args.leader)
        .build()
        .await?;
    let settings = Settings {
        namespace: args.namespace,
        default_image: args.image.default_image,
        concurrency: args.concurrency,
        admin_address: args.leader_admin_address,
        image_users: args.store_image_user,
    };
    start(&mut runtime, &settings)?;
    runtime.run().await
}

/// What the controller is started with.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Namespace of the workloads.
    pub namespace: String,
    /// The `kv-cache-backend-image` setting.
    pub default_image: Option<String>,
    /// Backends reconciled at once.
    pub concurrency: u16,
    /// Where a managed backend's leader admin port is reached (`{name}`, `{namespace}`).
    pub admin_address: String,
    /// `--store-image-user` rules ([`warmcache_kvcache::security`]).
    pub image_users: Vec<warmcache_kvcache::security::ImageUser>,
}

/// Registers the controller's watches and starts it on `runtime` (reconciling while leading).
pub fn start(
    runtime: &mut warmcache_runtime::Runtime,
    settings: &Settings,
) -> Result<(), warmcache_runtime::RuntimeError> {
    use warmcache_runtime::WatcherConfig;

    let ours = WatcherConfig::default().labels(&format!("{LABEL_NAME}={APP_NAME}"));
    let namespace = Some(settings.namespace.as_str());
    let backends = runtime.watch::<KVCacheBackend>(None, WatcherConfig::default())?;
    let deployments = runtime.watch::<Deployment>(namespace, ours.clone())?;
    let services = runtime.watch::<Service>(namespace, ours.clone())?;
    let daemonsets = runtime.watch::<DaemonSet>(namespace, ours.clone())?;
    let pods = runtime.watch::<Pod>(namespace, ours)?;
    let nodes = runtime.watch_cluster_metadata::<Node>(WatcherConfig::default())?;
    let metrics = ControllerMetrics::register(runtime.metrics().registry(), backends.clone())
        .map_err(|err| warmcache_runtime::RuntimeError::Task {
            task: "controller metrics".to_owned(),
            message: err.to_string(),
        })?;
    let reconciler = Backends {
        client: runtime.client()?,
        applier: Applier::new(FIELD_MANAGER),
        render: RenderContext {
            namespace: settings.namespace.clone(),
            default_image: settings.default_image.clone(),
            image_users: settings.image_users.clone(),
        },
        leadership: runtime.leadership(),
        pods: pods.clone(),
        daemonsets: daemonsets.clone(),
        backends: backends.clone(),
        nodes,
        admin_address: settings.admin_address.clone(),
        recorder: runtime.recorder().cloned(),
        metrics,
    };
    let controller = runtime
        .controller("kvcachebackend", &backends, reconciler)
        .owns(&deployments)
        .owns(&services)
        .owns(&daemonsets)
        .watches(&pods, member_owner)
        .concurrency(settings.concurrency);
    runtime.start_controller(controller);
    Ok(())
}

/// The backend a member Pod belongs to (its `app.kubernetes.io/instance` label): Pods are owned
/// by their DaemonSet, not by the backend.
fn member_owner(pod: &Pod) -> Vec<warmcache_runtime::ObjectRef<KVCacheBackend>> {
    pod.labels()
        .get(LABEL_INSTANCE)
        .map(|name| warmcache_runtime::ObjectRef::new(name))
        .into_iter()
        .collect()
}
