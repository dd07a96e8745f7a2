//! The ModelCacheBinding controller (`binding-controller controller`): drives each binding of the
//! control namespace to Ready on the component runtime, leader-elected.
//!
//! One reconcile = dereference (caches, plus a fresh GET of the primary PV and of stale-looking
//! references) -> the pure step [`warmcache_modelvolume::lifecycle::step`] -> status (PUT to
//! `/status` with the cached resourceVersion: a conflict re-reads and re-decides) -> the step's
//! actions in order (creates under deterministic names, the completion update re-read until
//! stored, the writer claim's delete with a UID precondition). Each part runs in its own span
//! inside the runtime's reconcile span.
//!
//! # API calls (the chart's roles grant exactly these: generated from [`crate::rbac`] by
//! `cargo xtask gen`)
//!
//! | resource | verbs | where | why |
//! |---|---|---|---|
//! | `modelcachebindings` | list, watch | control namespace | the bindings |
//! | `modelcachebindings/status` | update | control namespace | status, references, views |
//! | `pods` | list, watch (metadata) | all namespaces, label `nvsnap.io/model` | references, reading namespaces (the cache keeps a `ReadingPod` of each: identity, owners and the labels and annotations of `POD_LABELS_READ` / `POD_ANNOTATIONS_READ`, not the download step) |
//! | `pods` | get (metadata) | reader namespaces | whether a reading pod records a download step, for the writer election (each pod read at most once, only for a binding with a writer Lease while its holder's Job is missing) |
//! | `pods` | get | writer namespace | the download step the writer Job runs, and the literal secrets a derived step copies from its pod (only when the Job is to be created) |
//! | `pods` | list | writer namespace, label `batch.kubernetes.io/job-name` | the writer's last words and bytes |
//! | `pods` | list | control namespace | roxReadOnly: the pods that keep a released primary claim (`kubernetes.io/pvc-protection`), named in `ReleasingPrimary` and `PrimaryClaimHeld` |
//! | `pods` | list, delete | reader namespaces, label `nvsnap.io/model=<hash>` | after a failed download, while the failure record holds: readers still waiting, not Ready and controlled by a ReplicaSet, StatefulSet, DaemonSet or LeaderWorkerSet are deleted (UID and resourceVersion preconditions) |
//! | `namespaces` | list, watch (metadata) | cluster | sharing-domain labels (tenancy check) |
//! | `persistentvolumeclaims` | list, watch | all, label `app.kubernetes.io/managed-by=warmcache` | primary, writer view, views |
//! | `persistentvolumeclaims` | create | control, writer and reader namespaces | primary claim, writer view claim, view claims |
//! | `persistentvolumeclaims` | delete | writer namespaces; control namespace | releasing the writer view claim (UID precondition), and an earlier writer namespace's left behind (a crash during a takeover); roxReadOnly: the complete primary claim, so its volume detaches |
//! | `volumeattachments` | list, watch | cluster | roxReadOnly: the detach gate (views wait until nothing attaches the complete primary) |
//! | `persistentvolumes` | list, watch | label `app.kubernetes.io/managed-by=warmcache` | views |
//! | `persistentvolumes` | get, update | cluster | the primary PV: completion labels and Retain; rebinding the writer view; roxReadOnly: the released primary the status records, when the cache does not hold it |
//! | `persistentvolumes` | create | cluster | writer view and read-only views |
//! | `jobs` | list, watch | all, label `nvsnap.io/role=writer` | the writer Job |
//! | `jobs` | create | writer namespace | the writer Job (roxReadOnly: the staging Job) |
//! | workload kinds (`replicasets`, `deployments`, `statefulsets`, `jobs`, `cronjobs`, `leaderworkersets`, ...) | get | reader namespaces | top-level owners and stale references |
//! | `storageclasses` | list, watch | cluster, name `nvcf-sc` | decision drift (with `--catalog-namespace`) |
//! | `csidrivers` | list, watch | cluster | decision drift (with `--catalog-namespace`) |
//! | `configmaps` | list, watch | `--catalog-namespace`, name `nvcf-storage-capabilities` | decision drift |
//! | `leases` | get, create, update | the runtime's namespace | leader election |
//! | `leases` | list, watch (label `app.kubernetes.io/managed-by=warmcache`), create, update | control namespace | the writer Lease of each helmModelCache binding (`spec.resources.leaseName`) |
//! | `leases` | get | control namespace | a fresh read of the writer Lease before releasing a writer view claim an earlier writer left behind |
//! | `jobs` | get | the writer Lease's namespace | confirming the holder's Job is gone (only NotFound means gone) |
//! | `events` | create | | Events on bindings |
//! | `secrets` | get (metadata only), create | control namespace | an encrypted cache's key Secret (`spec.resources.secretNames`): created with a generated key before the staging Job; read back as metadata only, so the controller never receives a key |
//! | `storageclasses` | get, create | cluster | an encrypted cache's StorageClass (`spec.resources.storageClassNames`), derived from nvcf-sc; and nvcf-sc itself, read while the encrypted class is missing |
//!
//! No `delete` on PersistentVolumes, Jobs or bindings: deleting data is the reaper's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind, PartialObjectMeta};
use kube::{Client, Resource, ResourceExt};
use tracing::Instrument;
use warmcache_api_modelcache::v2beta1::{ModelCacheBinding, RequestReference, Workflow};
use warmcache_api_modelcache::{
    SHARING_DOMAIN_LABEL, sha256_digest, writer_job_name, writer_pvc_name,
};
use warmcache_kube::{
    ConditionStatus, Decision, EventRecorder, Leadership, NewCondition, OwnerResolver,
    set_condition, update_with_retry,
};
use warmcache_modelvolume::DownloadStep;
use warmcache_modelvolume::encryption::{self, EncryptionNames};
use warmcache_modelvolume::keys::{
    BINDING_ANNOTATION, DOWNLOAD_STEP_ANNOTATION, MANAGED_BY_LABEL, MANAGED_BY_VALUE, MODEL_LABEL,
};
use warmcache_modelvolume::lease::{self, LeaseView, LeaseWrite};
use warmcache_modelvolume::lifecycle::{self, Action, LifecycleConfig, Observed, StepSource};
use warmcache_modelvolume::reading::{self, Reads};
use warmcache_modelvolume::view;
use warmcache_modelvolume::volume_keys::{BINDING_LABEL, ROLE_WRITER, VOLUME_ROLE_LABEL};
use warmcache_runtime::{Cache, ObjectRef, ReconcileError, Reconciler, WatcherConfig};

use crate::metrics::Metrics;
use crate::pods::ReadingPod;

/// Requeue after actions that changed nothing the status shows (their effect is checked soon).
pub const REQUEUE_WAITING: Duration = Duration::from_secs(5);
/// Requeue while the primary claim waits for its volume. The claim watch queues a reconcile when
/// the claim binds (the claim carries the binding's label); this is only the safety net. Every
/// binding waiting at 5 s (the earlier period) was 2,000 reconciles a second at 10,000 bindings
/// whose claims a slow provisioner had not bound yet, more than one core runs, and the queue
/// starved the bindings not yet reconciled.
pub const REQUEUE_CLAIM_PENDING: Duration = Duration::from_secs(60);
/// Requeue once settled: references of workloads deleted without a pod event are pruned then.
pub const REQUEUE_SETTLED: Duration = Duration::from_secs(300);

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// A Kubernetes API call failed.
    #[error(transparent)]
    Kube(#[from] warmcache_kube::Error),
    /// The owner walk of a pod failed (a guess would be worse than a retry).
    #[error("resolving the workload of pod {pod}: {source}")]
    Owner {
        /// `namespace/name`.
        pod: String,
        /// Why.
        source: Box<warmcache_kube::OwnerError>,
    },
    /// This replica lost the Lease mid-reconcile.
    #[error("not the leader any more")]
    NotLeader,
    /// The completion labels or Retain were not found on the re-read primary PV.
    #[error(
        "PersistentVolume {pv}: the completion labels and Retain were written but the re-read does not show them; the writer claim is kept"
    )]
    CompletionNotStored {
        /// The primary PV.
        pv: String,
    },
    /// An object under one of the binding's names belongs to something else.
    #[error(
        "{what} exists but does not belong to ModelCacheBinding {binding}; it is never adopted"
    )]
    Foreign {
        /// The object.
        what: String,
        /// The binding.
        binding: String,
    },
    /// A condition could not be recorded (a bug: the reasons are fixed words).
    #[error("condition: {0}")]
    Condition(#[from] warmcache_kube::ConditionError),
    /// Another writer of the writer Lease was first (AlreadyExists on create, a conflict on
    /// update): the election is decided again from what is stored.
    #[error("Lease {lease}: another controller wrote the writer record first; deciding again")]
    LeaseLost {
        /// `namespace/name`.
        lease: String,
    },
    /// The operating system's random source failed while generating an encrypted cache's key.
    #[error("generating the key of an encrypted cache: {0}")]
    KeyGeneration(String),
}

impl ReconcileError for Failure {
    const CATEGORIES: &'static [&'static str] = &[
        "owner",
        "not_leader",
        "completion_not_stored",
        "foreign_object",
        "condition",
        "writer_lease_lost",
        "key_generation",
    ];

    fn category(&self) -> &'static str {
        match self {
            Self::Kube(err) => ReconcileError::category(err),
            Self::Owner { .. } => "owner",
            Self::NotLeader => "not_leader",
            Self::CompletionNotStored { .. } => "completion_not_stored",
            Self::Foreign { .. } => "foreign_object",
            Self::Condition(_) => "condition",
            Self::LeaseLost { .. } => "writer_lease_lost",
            Self::KeyGeneration(_) => "key_generation",
        }
    }

    fn is_permanent(&self) -> bool {
        match self {
            Self::Kube(err) => ReconcileError::is_permanent(err),
            Self::Foreign { .. } | Self::Condition(_) => true,
            Self::Owner { .. }
            | Self::NotLeader
            | Self::CompletionNotStored { .. }
            | Self::LeaseLost { .. }
            | Self::KeyGeneration(_) => false,
        }
    }
}

/// What the controller is started with.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The control namespace (bindings and primary claims).
    pub control_namespace: String,
    /// Bindings reconciled at once.
    pub concurrency: u16,
    /// Sizes, mount options and writer Job settings.
    pub lifecycle: LifecycleConfig,
    /// Namespace of the catalog ConfigMap `nvcf-storage-capabilities` (the webhook's); when set,
    /// every binding's decision is compared with what the current storage gives
    /// (`DecisionDrift`).
    pub catalog_namespace: Option<String>,
    /// The feature gates drift decides with (the webhook's).
    pub gates: warmcache_catalog::Gates,
}

/// What the reconciler reads and writes with.
pub struct Bindings {
    client: Client,
    settings: Settings,
    leadership: Leadership,
    owners: OwnerResolver,
    pods: Cache<ReadingPod>,
    /// The pods of each binding, by the binding they name.
    pod_index: Arc<PodIndex>,
    /// The namespaces of each writer view claim name outside the control namespace.
    writer_claims: Arc<WriterClaimIndex>,
    namespaces: Cache<PartialObjectMeta<Namespace>>,
    claims: Cache<PersistentVolumeClaim>,
    volumes: Cache<PersistentVolume>,
    jobs: Cache<Job>,
    leases: Cache<Lease>,
    /// VolumeAttachments: the detach gate of roxReadOnly views.
    attachments: Cache<VolumeAttachment>,
    /// StorageClass nvcf-sc, CSIDrivers and the catalog ConfigMap, for drift (with
    /// `catalog_namespace`).
    drift: Option<DriftCaches>,
    recorder: Option<EventRecorder>,
    metrics: Metrics,
    /// Why the last completion write of a binding (by UID) failed; cleared on success.
    completion_errors: std::sync::Mutex<BTreeMap<String, String>>,
    /// Discovery answers of reference kinds (`apiVersion/kind` -> resource), so a stale check
    /// costs one GET, not a discovery round trip each time.
    kinds: std::sync::Mutex<BTreeMap<String, ApiResource>>,
    /// Status writes the binding cache may not show yet.
    own_writes: OwnWrites,
}

/// The caches decision drift reads.
#[derive(Clone)]
struct DriftCaches {
    classes: Cache<k8s_openapi::api::storage::v1::StorageClass>,
    drivers: Cache<k8s_openapi::api::storage::v1::CSIDriver>,
    catalogs: Cache<k8s_openapi::api::core::v1::ConfigMap>,
    namespace: String,
    gates: warmcache_catalog::Gates,
}

impl DriftCaches {
    /// The `DecisionDrift` condition of `binding`.
    fn condition(&self, binding: &ModelCacheBinding) -> lifecycle::WantedCondition {
        let class = self.classes.store().get(&ObjectRef::new(
            warmcache_api_modelcache::MODEL_CACHE_STORAGE_CLASS,
        ));
        let driver = class
            .as_ref()
            .and_then(|c| self.drivers.store().get(&ObjectRef::new(&c.provisioner)));
        let catalog = self
            .catalogs
            .store()
            .get(&ObjectRef::new(warmcache_catalog::CONFIG_MAP_NAME).within(&self.namespace));
        let drift = warmcache_modelvolume::drift::decision_drift(
            binding,
            &warmcache_modelvolume::drift::CurrentStorage {
                storage_class: class.as_deref(),
                csi_driver: driver.as_deref(),
                catalog: catalog.as_deref(),
                gates: self.gates,
            },
        );
        match drift {
            Some(message) => lifecycle::WantedCondition {
                type_: warmcache_modelvolume::drift::DECISION_DRIFT,
                status: true,
                reason: lifecycle::Reason::DecisionDrift,
                message,
            },
            None => lifecycle::WantedCondition {
                type_: warmcache_modelvolume::drift::DECISION_DRIFT,
                status: false,
                reason: lifecycle::Reason::NoDrift,
                message: "the current StorageClass and catalog give the recorded decision"
                    .to_owned(),
            },
        }
    }
}

fn api_error(verb: &'static str, resource: &str, name: &str, err: kube::Error) -> Failure {
    Failure::Kube(warmcache_kube::Error::from_kube(verb, resource, name, err))
}

fn now() -> Time {
    Time(Timestamp::now())
}

impl Bindings {
    fn ensure_leader(&self) -> Result<(), Failure> {
        self.leadership
            .ensure_leader()
            .map_err(|_| Failure::NotLeader)
    }

    /// Whether `namespace` belongs to the binding's sharing domain: the namespace itself for
    /// regularModelCache, the namespaces labelled with the domain for helmModelCache. A pod
    /// elsewhere carrying the binding's annotations gets nothing.
    fn in_domain(&self, binding: &ModelCacheBinding, namespace: &str) -> bool {
        let digest = &binding.spec.identity.sharing_domain_digest;
        match binding.spec.identity.workflow {
            Workflow::RegularModelCache => sha256_digest(namespace) == *digest,
            Workflow::HelmModelCache => self
                .namespaces
                .store()
                .get(&ObjectRef::new(namespace))
                .and_then(|ns| ns.labels().get(SHARING_DOMAIN_LABEL).cloned())
                .is_some_and(|domain| sha256_digest(&domain) == *digest),
        }
    }

    /// The live pods of `binding`: annotated with its name (and UID, when set), not terminating,
    /// in its sharing domain.
    /// Costs the binding's own pods: the candidates come from [`PodIndex`], each read from the
    /// cache (an entry whose pod is gone or names another binding is dropped from the index).
    fn pods_of(&self, binding: &ModelCacheBinding) -> Vec<Arc<ReadingPod>> {
        let name = binding.name_any();
        let uid = binding.uid();
        let store = self.pods.store();
        let mut pods: Vec<_> = self
            .pod_index
            .members(&name)
            .into_iter()
            .filter_map(|(ns, pod)| {
                let found = store
                    .get(&ObjectRef::new(&pod).within(&ns))
                    .filter(|p| reading::bindings_named(&p.annotations()).contains(&name.as_str()));
                if found.is_none() {
                    self.pod_index.forget(&name, &ns, &pod);
                }
                found
            })
            .filter(|p| {
                reading::reads(&p.annotations(), &name, uid.as_deref()).is_some()
                    && !p.terminating()
                    && p.labels().get(MANAGED_BY_LABEL) != Some(MANAGED_BY_VALUE)
                    && self.in_domain(binding, p.namespace())
            })
            .collect();
        pods.sort_by(|a, b| (a.namespace(), a.name()).cmp(&(b.namespace(), b.name())));
        pods
    }

    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.claims
            .store()
            .get(&ObjectRef::new(name).within(namespace))
    }

    /// `binding`'s writer view claims (`rw-pvc-<hash>`, its binding label, role writer) outside
    /// the control namespace and `writer_ns`, in namespaces where the cache holds no writer Job
    /// of the binding: an earlier writer's, left behind ([`Observed::stale_writer_claims`]).
    /// Reads the claim cache (which holds only warmcache's claims) where [`WriterClaimIndex`]
    /// says a claim of that name is, not every claim: at 10,000 bindings a pass over every
    /// claim per reconcile was a large part of the controller's CPU.
    fn stale_writer_claims(
        &self,
        binding: &ModelCacheBinding,
        writer_ns: &str,
    ) -> Vec<Arc<PersistentVolumeClaim>> {
        let name = binding.name_any();
        let claim = writer_pvc_name(&binding.spec.identity);
        let job = writer_job_name(&binding.spec.identity);
        let jobs = self.jobs.store();
        let claims = self.claims.store();
        self.writer_claims
            .namespaces(&claim)
            .into_iter()
            .filter_map(|ns| {
                let found = claims.get(&ObjectRef::new(&claim).within(&ns));
                if found.is_none() {
                    self.writer_claims.forget(&claim, &ns);
                }
                found
            })
            .filter(|c| {
                let ns = c.namespace().unwrap_or_default();
                c.name_any() == claim
                    && !ns.is_empty()
                    && ns != self.settings.control_namespace
                    && ns != writer_ns
                    && c.labels().get(BINDING_LABEL) == Some(&name)
                    && c.labels().get(VOLUME_ROLE_LABEL).map(String::as_str) == Some(ROLE_WRITER)
                    && c.metadata.deletion_timestamp.is_none()
                    && jobs.get(&ObjectRef::new(&job).within(&ns)).is_none()
            })
            .collect()
    }

    fn volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.volumes.store().get(&ObjectRef::new(name))
    }

    /// The writer Lease of `binding` (none for a binding that names no Lease).
    fn lease(&self, binding: &ModelCacheBinding) -> Option<Arc<Lease>> {
        let name = &binding.spec.resources.lease_name;
        if name.is_empty() {
            return None;
        }
        self.leases
            .store()
            .get(&ObjectRef::new(name).within(&self.settings.control_namespace))
    }

    /// The UID of `binding`'s writer Job in `namespace`: from the cache, and when the cache
    /// does not show one and `confirm` is set, from a fresh read (only NotFound means gone).
    async fn writer_job_uid(
        &self,
        binding: &ModelCacheBinding,
        namespace: &str,
        confirm: bool,
    ) -> Result<Option<String>, Failure> {
        let name = writer_job_name(&binding.spec.identity);
        let ours = |job: &Job| {
            job.annotations()
                .get(warmcache_modelvolume::volume_keys::BINDING_UID_LABEL_ANNOTATION)
                .is_some_and(|u| Some(u) == binding.metadata.uid.as_ref())
                && job.metadata.deletion_timestamp.is_none()
        };
        if let Some(job) = self
            .jobs
            .store()
            .get(&ObjectRef::new(&name).within(namespace))
        {
            return Ok(ours(&job).then(|| job.uid()).flatten());
        }
        if !confirm {
            return Ok(None);
        }
        let api: Api<Job> = Api::namespaced(self.client.clone(), namespace);
        let found = api
            .get_opt(&name)
            .await
            .map_err(|e| api_error("get", api.resource_url(), &name, e))?;
        Ok(found.filter(|j| ours(j)).and_then(|j| j.uid()))
    }

    /// Who writes `binding`'s download ([`lease::elect`] on the writer Lease, the holder's
    /// Job and the namespaces whose reading pods record a step).
    async fn election(
        &self,
        binding: &ModelCacheBinding,
        pods: &[Arc<ReadingPod>],
    ) -> Result<lease::Election, Failure> {
        let stored = self.lease(binding);
        let view = lease::view(binding, stored.as_deref());
        // A Ready binding needs no writer: its Job being gone is not worth a read.
        let ready = binding
            .status
            .as_ref()
            .and_then(|s| s.realized.as_ref())
            .and_then(|r| r.population_state)
            == Some(warmcache_api_modelcache::v2beta1::PopulationState::Ready);
        let (holder, confirm) = match &view {
            LeaseView::Ours(r) if !r.namespace.is_empty() => (r.namespace.clone(), !ready),
            _ => (binding.spec.resources.writer_namespace.clone(), false),
        };
        let holder_job = self.writer_job_uid(binding, &holder, confirm).await?;
        let step_namespaces = self
            .step_namespaces(binding, &view, holder_job.is_some(), pods)
            .await?;
        Ok(lease::elect(&lease::ElectionInput {
            binding,
            lease: &view,
            holder_job: holder_job.as_deref(),
            step_namespaces: &step_namespaces,
            now: Timestamp::now(),
            grace_seconds: self.settings.lifecycle.takeover_grace_seconds,
        }))
    }

    /// Workloads of the pods, and the stored references found stale.
    async fn references(
        &self,
        binding: &ModelCacheBinding,
        pods: &[Arc<ReadingPod>],
    ) -> Result<(Vec<RequestReference>, BTreeSet<String>), Failure> {
        let mut seen = Vec::new();
        for pod in pods {
            let resolution =
                self.owners
                    .resolve_node(pod.owner_node())
                    .await
                    .map_err(|source| Failure::Owner {
                        pod: format!("{}/{}", pod.namespace(), pod.name()),
                        source: Box::new(source),
                    })?;
            let top = resolution.top;
            if top.uid.is_empty() || top.name.is_empty() {
                continue;
            }
            seen.push(RequestReference {
                api_version: top.api_version,
                kind: top.kind,
                namespace: top.namespace.unwrap_or_default(),
                name: top.name,
                uid: top.uid,
            });
        }
        let seen_uids: BTreeSet<&str> = seen.iter().map(|r| r.uid.as_str()).collect();
        let mut stale = BTreeSet::new();
        let stored = binding
            .status
            .as_ref()
            .map(|s| s.request_references.clone())
            .unwrap_or_default();
        for r in stored
            .iter()
            .filter(|r| !seen_uids.contains(r.uid.as_str()))
        {
            if self.is_stale(r).await? {
                stale.insert(r.uid.clone());
            }
        }
        Ok((seen, stale))
    }

    /// A reference is stale when its object is NotFound or has another UID; any other answer
    /// keeps it (only NotFound means gone).
    async fn is_stale(&self, r: &RequestReference) -> Result<bool, Failure> {
        let (group, version) = match r.api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", r.api_version.as_str()),
        };
        let gvk = GroupVersionKind::gvk(group, version, &r.kind);
        let key = format!("{}/{}", r.api_version, r.kind);
        let known = self.kinds.lock().ok().and_then(|k| k.get(&key).cloned());
        let resource = match known {
            Some(resource) => Ok((resource, ())),
            None => kube::discovery::pinned_kind(&self.client, &gvk)
                .await
                .map(|(resource, _)| (resource, ())),
        };
        let resource = match resource {
            Ok((resource, ())) => {
                if let Ok(mut kinds) = self.kinds.lock() {
                    kinds.insert(key, resource.clone());
                }
                resource
            }
            // A kind the API server does not serve any more: its objects are gone.
            Err(kube::Error::Discovery(_)) => return Ok(true),
            Err(err) => {
                return Err(api_error("discover", &r.kind, &r.name, err));
            }
        };
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &r.namespace, &resource);
        match api.get_metadata_opt(&r.name).await {
            Ok(None) => Ok(true),
            Ok(Some(object)) => Ok(object.metadata.uid.as_deref() != Some(r.uid.as_str())),
            Err(err) => Err(api_error("get", &r.kind, &r.name, err)),
        }
    }

    /// Whether `pod` (a reading pod of the binding named `binding`) records a download step:
    /// remembered from an earlier read ([`PodIndex::step_known`]), else read from the API server
    /// (metadata only) and remembered. A pod deleted or replaced since the cache saw it has none
    /// (only NotFound or another UID means gone; any other error fails the reconcile).
    async fn pod_has_step(&self, binding: &str, pod: &ReadingPod) -> Result<bool, Failure> {
        let (ns, Some(uid)) = (pod.namespace(), pod.uid()) else {
            return Ok(false);
        };
        let name = pod.name();
        if let Some(known) = self.pod_index.step_known(binding, ns, name, uid) {
            return Ok(known);
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let fresh = api
            .get_metadata_opt(name)
            .await
            .map_err(|e| api_error("get", "pods", &format!("{ns}/{name}"), e))?
            .filter(|p| p.metadata.uid.as_deref() == Some(uid));
        let has_step = fresh
            .as_ref()
            .is_some_and(|p| p.annotations().contains_key(DOWNLOAD_STEP_ANNOTATION));
        self.metrics.step_read(
            "election",
            match (&fresh, has_step) {
                (None, _) => "gone",
                (Some(_), true) => "step",
                (Some(_), false) => "no_step",
            },
        );
        self.pod_index.record_step(binding, ns, name, uid, has_step);
        Ok(has_step)
    }

    /// Whether a reading pod of `namespace` among `pods` records a download step (pods read in
    /// name order until one does).
    async fn namespace_has_step(
        &self,
        binding: &str,
        namespace: &str,
        pods: &[Arc<ReadingPod>],
    ) -> Result<bool, Failure> {
        for pod in pods.iter().filter(|p| p.namespace() == namespace) {
            if self.pod_has_step(binding, pod).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The namespaces of `pods` with a reading pod that records a download step, as far as
    /// [`lease::elect`] reads them: none when it reads none, the one it reads first alone when
    /// that one has a step ([`election_reads_first`]), else all of them. Steps are not in the
    /// pod cache; each pod read for one is remembered, so a binding's pods are read once.
    async fn step_namespaces(
        &self,
        binding: &ModelCacheBinding,
        view: &LeaseView,
        holder_job: bool,
        pods: &[Arc<ReadingPod>],
    ) -> Result<BTreeSet<String>, Failure> {
        let Some(first) = election_reads_first(binding, view, holder_job) else {
            return Ok(BTreeSet::new());
        };
        let name = binding.name_any();
        if self.namespace_has_step(&name, &first, pods).await? {
            return Ok(BTreeSet::from([first]));
        }
        let others: BTreeSet<String> = pods
            .iter()
            .map(|p| p.namespace())
            .filter(|ns| *ns != first)
            .map(str::to_owned)
            .collect();
        let mut out = BTreeSet::new();
        for ns in others {
            if self.namespace_has_step(&name, &ns, pods).await? {
                out.insert(ns);
            }
        }
        Ok(out)
    }

    /// The download step of the first pod in the writer namespace that records one, with the
    /// literal secrets it copies from that pod and that pod's admission trace context. Read
    /// from the API server (the pod cache does not keep steps), only when the lifecycle would
    /// start a writer Job with it ([`wants_download_step`]): a pod deleted or replaced since the
    /// cache saw it, or one whose step does not decode, is passed over for the next; with none
    /// left the binding waits for a step as before (a pod's deletion requeues it anyway).
    async fn step_source(
        &self,
        binding: &str,
        writer_ns: &str,
        pods: &[Arc<ReadingPod>],
    ) -> Result<Option<(StepSource, Option<String>)>, Failure> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), writer_ns);
        for pod in pods.iter().filter(|p| p.namespace() == writer_ns) {
            let name = pod.name();
            let uid = pod.uid().unwrap_or_default();
            if self.pod_index.step_known(binding, writer_ns, name, uid) == Some(false) {
                continue;
            }
            let Some(full) = api
                .get_opt(name)
                .await
                .map_err(|e| api_error("get", "pods", &format!("{writer_ns}/{name}"), e))?
                .filter(|p| {
                    p.metadata.uid.as_deref() == Some(uid)
                        && p.metadata.deletion_timestamp.is_none()
                        && p.annotations().get(BINDING_ANNOTATION).map(String::as_str)
                            == Some(binding)
                })
            else {
                self.metrics.step_read("job", "gone");
                tracing::info!(pod = %name, namespace = writer_ns, "the pod whose download step the writer would run is gone; trying the next pod");
                continue;
            };
            let text = full.annotations().get(DOWNLOAD_STEP_ANNOTATION);
            self.metrics
                .step_read("job", if text.is_some() { "step" } else { "no_step" });
            self.pod_index
                .record_step(binding, writer_ns, name, uid, text.is_some());
            let Some(text) = text else {
                continue;
            };
            let Ok(step) = DownloadStep::from_annotation(text) else {
                tracing::warn!(pod = %name, "the download step annotation does not decode; trying the next pod");
                continue;
            };
            let containers: Vec<_> = full
                .spec
                .iter()
                .flat_map(|s| {
                    s.containers
                        .iter()
                        .chain(s.init_containers.iter().flatten())
                })
                .collect();
            let mut pod_env = Vec::new();
            for r in &step.env_from_pod {
                if let Some(e) = containers
                    .iter()
                    .filter(|c| c.name == r.container)
                    .flat_map(|c| c.env.iter().flatten())
                    .rev()
                    .find(|e| e.name == r.name)
                {
                    pod_env.push(e.clone());
                }
            }
            let traceparent = full
                .annotations()
                .get(warmcache_telemetry::TRACE_PARENT_ANNOTATION)
                .cloned();
            return Ok(Some((StepSource { step, pod_env }, traceparent)));
        }
        Ok(None)
    }

    /// The first object under one of `binding`'s names that is not in the caches (which hold
    /// only objects labelled as warmcache's) but exists without this binding's label: a claim
    /// or PV someone else created under our name. Only names missing from the caches are read,
    /// and the writer view's names only while `writer_view_possible` (a bound primary not yet
    /// complete, the only time the writer view is created): otherwise a binding waiting for its
    /// claim to bind, or Ready with its writer view retired, would read both on every
    /// reconcile (two requests per pod event under the client's rate limit, measured by the
    /// scale benchmark). A create under a name that turns out to be taken is refused anyway
    /// (`create_claim`, `create_pv`).
    async fn foreign_object(
        &self,
        binding: &ModelCacheBinding,
        writer_ns: &str,
        writer_view_possible: bool,
    ) -> Result<Option<String>, Failure> {
        let identity = &binding.spec.identity;
        let name = binding.name_any();
        let writer_ns = writer_ns.to_owned();
        let mut claims = vec![(
            self.settings.control_namespace.clone(),
            writer_pvc_name(identity),
        )];
        let mut volumes = Vec::new();
        if writer_view_possible {
            claims.push((writer_ns.clone(), writer_pvc_name(identity)));
            volumes.push(view::writer_view_pv_name_in(binding, &writer_ns));
        }
        for v in binding
            .status
            .iter()
            .flat_map(|s| s.realized.iter())
            .flat_map(|r| r.views.iter())
        {
            claims.push((v.namespace.clone(), v.persistent_volume_claim_name.clone()));
            volumes.push(v.persistent_volume_name.clone());
        }
        for (ns, claim) in claims {
            if self.claim(&ns, &claim).is_some() {
                continue;
            }
            let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
            if let Some(found) = api
                .get_opt(&claim)
                .await
                .map_err(|e| api_error("get", api.resource_url(), &claim, e))?
                && found.labels().get(BINDING_LABEL) != Some(&name)
            {
                return Ok(Some(format!("PersistentVolumeClaim {ns}/{claim}")));
            }
        }
        for pv in volumes {
            if self.volume(&pv).is_some() {
                continue;
            }
            let api: Api<PersistentVolume> = Api::all(self.client.clone());
            if let Some(found) = api
                .get_opt(&pv)
                .await
                .map_err(|e| api_error("get", "persistentvolumes", &pv, e))?
                && found.labels().get(BINDING_LABEL) != Some(&name)
            {
                return Ok(Some(format!("PersistentVolume {pv}")));
            }
        }
        Ok(None)
    }

    /// roxReadOnly: the pods of `namespace`, not finished, whose volumes name claim `claim`
    /// (`kubernetes.io/pvc-protection` keeps a deleted claim while they exist), as
    /// `namespace/name`.
    async fn claim_holders(&self, namespace: &str, claim: &str) -> Result<Vec<String>, Failure> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let pods = api
            .list(&ListParams::default())
            .await
            .map_err(|e| api_error("list", "pods", namespace, e))?;
        Ok(pods
            .items
            .iter()
            .filter(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                !matches!(phase, Some("Succeeded" | "Failed"))
            })
            .filter(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.volumes.as_ref())
                    .is_some_and(|vs| {
                        vs.iter().any(|v| {
                            v.persistent_volume_claim
                                .as_ref()
                                .is_some_and(|c| c.claim_name == claim)
                        })
                    })
            })
            .map(|p| format!("{namespace}/{}", p.name_any()))
            .collect())
    }

    async fn job_pods(&self, job: &Job) -> Result<Vec<Pod>, Failure> {
        let (Some(ns), Some(name)) = (job.namespace(), job.metadata.name.clone()) else {
            return Ok(Vec::new());
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let params = ListParams::default().labels(&format!("batch.kubernetes.io/job-name={name}"));
        api.list(&params)
            .await
            .map(|l| l.items)
            .map_err(|e| api_error("list", "pods", &name, e))
    }

    async fn create<K>(&self, api: &Api<K>, object: &K) -> Result<bool, Failure>
    where
        K: Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    {
        self.ensure_leader()?;
        let name = object.meta().name.clone().unwrap_or_default();
        match api.create(&PostParams::default(), object).await {
            Ok(_) => Ok(true),
            Err(err) if warmcache_kube::is_already_exists(&err) => Ok(false),
            Err(err) => Err(api_error("create", api.resource_url(), &name, err)),
        }
    }

    /// Frees PV `pv` for a new claim (its `claimRef` keeps the claim's name, loses its UID and
    /// resourceVersion), only while the PV is still at `resource_version`, the version the
    /// decision was made on; if it changed since, nothing is written and the next reconcile
    /// decides again. Used to adopt a retained primary and to rebind a writer view.
    async fn release_claim_ref(&self, pv: &str, resource_version: &str) -> Result<(), Failure> {
        self.ensure_leader()?;
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        update_with_retry(&api, pv, |current| {
            if current.metadata.resource_version.as_deref() != Some(resource_version) {
                return Decision::Unchanged;
            }
            let mut next = current.clone();
            if let Some(r) = next.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
                r.uid = None;
                r.resource_version = None;
            }
            Decision::Update(next)
        })
        .await?;
        Ok(())
    }

    /// Creates `pv` unless a PV of that name exists; an existing one must carry this binding's
    /// label, or it is someone else's.
    async fn create_pv(
        &self,
        binding: &ModelCacheBinding,
        pv: &PersistentVolume,
    ) -> Result<bool, Failure> {
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        if self.create(&api, pv).await? {
            return Ok(true);
        }
        let name = pv.name_any();
        let existing = api
            .get(&name)
            .await
            .map_err(|e| api_error("get", "persistentvolumes", &name, e))?;
        if existing.labels().get(BINDING_LABEL) != Some(&binding.name_any()) {
            return Err(Failure::Foreign {
                what: format!("PersistentVolume {name}"),
                binding: binding.name_any(),
            });
        }
        Ok(false)
    }

    /// Creates `claim` unless a claim of that name exists in its namespace; an existing one must
    /// carry this binding's label and, for a view, be pre-bound to the same PV: a claim under
    /// our name that names another volume would have readers read the wrong data.
    async fn create_claim(
        &self,
        binding: &ModelCacheBinding,
        claim: &PersistentVolumeClaim,
    ) -> Result<bool, Failure> {
        let ns = claim.namespace().unwrap_or_default();
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        if self.create(&api, claim).await? {
            return Ok(true);
        }
        let name = claim.name_any();
        let existing = api
            .get(&name)
            .await
            .map_err(|e| api_error("get", api.resource_url(), &name, e))?;
        let wanted_volume = claim.spec.as_ref().and_then(|s| s.volume_name.as_ref());
        let volume = existing.spec.as_ref().and_then(|s| s.volume_name.as_ref());
        let ours = existing.labels().get(BINDING_LABEL) == Some(&binding.name_any())
            && (wanted_volume.is_none()
                || existing.metadata.deletion_timestamp.is_some()
                || volume == wanted_volume);
        if !ours {
            return Err(Failure::Foreign {
                what: format!("PersistentVolumeClaim {ns}/{name}"),
                binding: binding.name_any(),
            });
        }
        Ok(false)
    }

    async fn run_action(
        &self,
        binding: &ModelCacheBinding,
        action: &Action,
    ) -> Result<(), Failure> {
        let span = tracing::info_span!("action", kind = action_label(action));
        // The Job continues the trace of the pod whose step it runs, each view the trace of a
        // reader of its namespace, the completion the Job's (the lifecycle puts the trace
        // context to continue on the object; it is replaced below by this span's own).
        let parent = match action {
            Action::CreateJob(job) => job.metadata.annotations.as_ref(),
            Action::CreateView(_, claim) => claim.metadata.annotations.as_ref(),
            Action::MarkComplete { annotations, .. } => Some(annotations),
            _ => None,
        };
        if let Some(annotations) = parent
            && let Err(err) = warmcache_telemetry::set_parent_from_annotations(&span, annotations)
        {
            tracing::debug!(error = %err, "the action span keeps the reconcile's trace");
        }
        async {
            match action {
                Action::CreatePrimaryClaim(claim) => {
                    if self.create_claim(binding, claim).await? {
                        tracing::info!(claim = %claim.name_any(), "created the primary claim");
                    }
                }
                Action::CreateWriterView(pv, claim) => {
                    self.create_pv(binding, pv).await?;
                    self.create_claim(binding, claim).await?;
                }
                Action::AdoptPrimary { pv, resource_version } => {
                    self.release_claim_ref(pv, resource_version).await?;
                    tracing::info!(pv, "adopting a retained complete primary");
                    if let Some(recorder) = &self.recorder {
                        recorder
                            .normal(binding, "AdoptedRetained", "AdoptPrimary", Some(&format!("the complete, retained PersistentVolume {pv} of this cache is reused: no download")))
                            .await;
                    }
                }
                Action::RebindWriterView { pv, resource_version } => {
                    self.release_claim_ref(pv, resource_version).await?;
                }
                Action::CreateJob(job) => {
                    let api = Api::namespaced(self.client.clone(), &job.namespace().unwrap_or_default());
                    let job = traced(job.as_ref());
                    if self.create(&api, &job).await? {
                        self.metrics.download_started();
                        tracing::info!(job = %job.name_any(), namespace = ?job.namespace(), "created the writer Job");
                        if let Some(recorder) = &self.recorder {
                            recorder
                                .normal(binding, "DownloadStarted", "CreateWriterJob", Some(&format!("writer Job {} in namespace {}", job.name_any(), job.namespace().unwrap_or_default())))
                                .await;
                        }
                    }
                }
                Action::MarkComplete { pv, labels, annotations } => {
                    let mut annotations = annotations.clone();
                    warmcache_telemetry::inject_current(&mut annotations);
                    let result = self.mark_complete(binding, pv, labels, &annotations).await;
                    let uid = binding.uid().unwrap_or_default();
                    if let Ok(mut errors) = self.completion_errors.lock() {
                        match &result {
                            Ok(()) => errors.remove(&uid),
                            Err(e) => errors.insert(uid, e.to_string()),
                        };
                    }
                    result?;
                }
                Action::ReleaseWriterClaim { namespace, name, uid } => {
                    self.ensure_leader()?;
                    let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
                    let params = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: Some(uid.clone()),
                            resource_version: None,
                        }),
                        ..DeleteParams::default()
                    };
                    match api.delete(name, &params).await {
                        Ok(_) => tracing::info!(claim = %name, namespace, "released the writer view claim"),
                        Err(err) if warmcache_kube::is_not_found(&err) => {}
                        Err(err) if warmcache_kube::is_conflict(&err) => {}
                        Err(err) => return Err(api_error("delete", api.resource_url(), name, err)),
                    }
                }
                Action::ReleasePrimaryClaim { name, uid } => {
                    self.ensure_leader()?;
                    let control = &self.settings.control_namespace;
                    let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), control);
                    let params = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: Some(uid.clone()),
                            resource_version: None,
                        }),
                        ..DeleteParams::default()
                    };
                    match api.delete(name, &params).await {
                        Ok(_) => tracing::info!(claim = %name, namespace = %control, "released the primary claim (complete: so its volume detaches; a failed capture: so the next starts afresh)"),
                        Err(err) if warmcache_kube::is_not_found(&err) => {}
                        Err(err) if warmcache_kube::is_conflict(&err) => {}
                        Err(err) => return Err(api_error("delete", api.resource_url(), name, err)),
                    }
                }
                Action::ReleaseStaleWriterClaim { namespace, name, uid } => {
                    self.release_stale_writer_claim(binding, namespace, name, uid).await?;
                }
                Action::CreateView(pv, claim) => {
                    let (pv, claim) = (traced(pv), traced(claim));
                    self.create_pv(binding, &pv).await?;
                    if self.create_claim(binding, &claim).await? {
                        self.metrics.view_created();
                        tracing::info!(namespace = ?claim.namespace(), pv = %pv.name_any(), "created a read-only view");
                    }
                }
                Action::WriteLease(write) => self.write_lease(binding, write).await?,
                Action::DeleteWaitingReaders { namespaces } => {
                    self.delete_waiting_readers(binding, namespaces).await?;
                }
                Action::CreateKeySecret(names) => self.create_key_secret(binding, names).await?,
                Action::RecordRevision { pv, revision } => {
                    self.ensure_leader()?;
                    let api: Api<PersistentVolume> = Api::all(self.client.clone());
                    update_with_retry(&api, pv, |current| {
                        let annotations = current.metadata.annotations.clone().unwrap_or_default();
                        if annotations.contains_key(warmcache_modelvolume::keys::REVISION_ANNOTATION) {
                            return Decision::Unchanged;
                        }
                        let mut next = current.clone();
                        next.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(
                            warmcache_modelvolume::keys::REVISION_ANNOTATION.to_owned(),
                            revision.clone(),
                        );
                        Decision::Update(next)
                    })
                    .await?;
                }
                Action::CreateEncryptedClass(class) => {
                    let api: Api<StorageClass> = Api::all(self.client.clone());
                    if self.create(&api, class.as_ref()).await? {
                        tracing::info!(class = %class.name_any(), "created the encrypted cache's StorageClass");
                    }
                }
            }
            Ok(())
        }
        .instrument(span)
        .await
    }

    /// Creates an encrypted cache's key Secret with a key from the operating system's random
    /// source. The key is in the request body only: nothing logs it, no error carries the
    /// object, and an AlreadyExists (another replica or an earlier reconcile won) keeps the
    /// stored key.
    async fn create_key_secret(
        &self,
        binding: &ModelCacheBinding,
        names: &EncryptionNames,
    ) -> Result<(), Failure> {
        self.ensure_leader()?;
        let mut bytes = [0u8; encryption::KEY_BYTES];
        getrandom::fill(&mut bytes).map_err(|e| Failure::KeyGeneration(e.to_string()))?;
        let secret = encryption::key_secret(
            binding,
            names,
            &encryption::EncryptionKey::from_bytes(bytes),
        );
        bytes.fill(0);
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &names.namespace);
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => {
                tracing::info!(secret = %names.secret, namespace = %names.namespace, "created the encrypted cache's key Secret");
                if let Some(recorder) = &self.recorder {
                    recorder
                        .normal(
                            binding,
                            "KeyCreated",
                            "CreateKeySecret",
                            Some(&format!(
                                "generated the key of this encrypted cache into Secret {}/{}",
                                names.namespace, names.secret
                            )),
                        )
                        .await;
                }
                Ok(())
            }
            Err(err) if warmcache_kube::is_already_exists(&err) => Ok(()),
            Err(err) => Err(api_error("create", api.resource_url(), &names.secret, err)),
        }
    }

    /// An encrypted binding's objects ([`lifecycle::EncryptionObserved`]): the key Secret's
    /// metadata (a metadata-only GET: the controller never receives the key), the encrypted
    /// StorageClass, and, while that is missing, the decision's StorageClass it is derived from.
    /// Nothing is read for other bindings, or when the binding's names are not the derived ones
    /// (the step reports that).
    async fn encryption_objects(
        &self,
        binding: &ModelCacheBinding,
    ) -> Result<
        (
            Option<ObjectMeta>,
            Option<StorageClass>,
            Option<StorageClass>,
        ),
        Failure,
    > {
        let Ok(Some(names)) = encryption::encryption_names(binding) else {
            return Ok((None, None, None));
        };
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &names.namespace);
        let secret = secrets
            .get_metadata_opt(&names.secret)
            .await
            .map_err(|e| api_error("get", secrets.resource_url(), &names.secret, e))?
            .map(|m| m.metadata);
        let classes: Api<StorageClass> = Api::all(self.client.clone());
        let class = classes
            .get_opt(&names.class)
            .await
            .map_err(|e| api_error("get", classes.resource_url(), &names.class, e))?;
        let base = match class {
            Some(_) => None,
            None => {
                let name = &binding.spec.storage_class.name;
                classes
                    .get_opt(name)
                    .await
                    .map_err(|e| api_error("get", classes.resource_url(), name, e))?
            }
        };
        Ok((secret, class, base))
    }

    /// Releases a writer view claim an earlier writer namespace left behind: reads the writer
    /// Lease afresh (the caches may lag a takeover) and keeps the claim when the Lease names its
    /// namespace; otherwise deletes it with its UID as precondition.
    async fn release_stale_writer_claim(
        &self,
        binding: &ModelCacheBinding,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<(), Failure> {
        let lease_name = &binding.spec.resources.lease_name;
        if lease_name.is_empty() {
            // Without a Lease the writer is always writerNamespace (never released here).
            if *namespace == binding.spec.resources.writer_namespace {
                return Ok(());
            }
        } else {
            let leases: Api<Lease> =
                Api::namespaced(self.client.clone(), &self.settings.control_namespace);
            let fresh = leases
                .get_opt(lease_name)
                .await
                .map_err(|e| api_error("get", leases.resource_url(), lease_name, e))?;
            let holder = fresh.as_ref().and_then(|l| {
                l.annotations()
                    .get(warmcache_modelvolume::volume_keys::WRITER_NAMESPACE_ANNOTATION)
                    .cloned()
            });
            if fresh.is_none() || holder.as_deref() == Some(namespace) {
                return Ok(());
            }
        }
        self.ensure_leader()?;
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => {
                tracing::info!(claim = %name, namespace, "released a writer view claim an earlier writer left behind");
                Ok(())
            }
            Err(err) if warmcache_kube::is_not_found(&err) || warmcache_kube::is_conflict(&err) => {
                Ok(())
            }
            Err(err) => Err(api_error("delete", api.resource_url(), name, err)),
        }
    }

    /// Deletes the readers of `binding` in `namespaces` that still wait for the copy, are not
    /// Ready and whose controller recreates them ([`lifecycle::reader_after_failure`] on a fresh
    /// list by the model label), each with its UID and resourceVersion as preconditions; a pod
    /// already gone, replaced or changed since the list is skipped (its change queues another
    /// reconcile). Waiting readers nothing would recreate (bare pods, Job pods) are kept and
    /// named in a `WaitingReadersKept` Event: they stop at their wait deadline.
    async fn delete_waiting_readers(
        &self,
        binding: &ModelCacheBinding,
        namespaces: &[String],
    ) -> Result<(), Failure> {
        let hash = warmcache_api_modelcache::identity_hash(&binding.spec.identity);
        let mut deleted = Vec::new();
        let mut kept = Vec::new();
        for ns in namespaces {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
            let pods = api
                .list(&ListParams::default().labels(&format!("{MODEL_LABEL}={hash}")))
                .await
                .map_err(|e| api_error("list", api.resource_url(), &hash, e))?;
            for pod in &pods.items {
                match lifecycle::reader_after_failure(binding, pod) {
                    lifecycle::WaitingReader::NotWaiting => continue,
                    lifecycle::WaitingReader::Keep(why) => {
                        kept.push(format!("{ns}/{} ({why})", pod.name_any()));
                        continue;
                    }
                    lifecycle::WaitingReader::Delete => {}
                }
                self.ensure_leader()?;
                let name = pod.name_any();
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: pod.uid(),
                        resource_version: pod.resource_version(),
                    }),
                    ..DeleteParams::default()
                };
                match api.delete(&name, &params).await {
                    Ok(_) => {
                        self.metrics.waiting_reader_deleted();
                        tracing::info!(pod = %name, namespace = %ns, "deleted a reader waiting for a failed download");
                        deleted.push(format!("{ns}/{name}"));
                    }
                    Err(err)
                        if warmcache_kube::is_not_found(&err)
                            || warmcache_kube::is_conflict(&err) => {}
                    Err(err) => return Err(api_error("delete", api.resource_url(), &name, err)),
                }
            }
        }
        if !deleted.is_empty()
            && let Some(recorder) = &self.recorder
        {
            let note = warmcache_cli::text::bounded(
                &format!(
                    "the download failed: readers still waiting were deleted so their controllers recreate them on their own download path: {}",
                    deleted.join(", ")
                ),
                1024,
            );
            recorder
                .normal(
                    binding,
                    "WaitingReadersDeleted",
                    "DeleteWaitingReaders",
                    Some(&note),
                )
                .await;
        }
        if !kept.is_empty() {
            tracing::info!(pods = ?kept, "kept readers waiting for a failed download: nothing would recreate them");
            if let Some(recorder) = &self.recorder {
                let note = warmcache_cli::text::bounded(
                    &format!(
                        "the download failed: readers still waiting were kept, as nothing would recreate them if deleted; they stop at their wait deadline (or delete them to rerun them on their own download): {}",
                        kept.join(", ")
                    ),
                    1024,
                );
                recorder
                    .warning(
                        binding,
                        "WaitingReadersKept",
                        "DeleteWaitingReaders",
                        Some(&note),
                    )
                    .await;
            }
        }
        Ok(())
    }

    /// Writes the writer Lease: a create (AlreadyExists: another controller chose first) or an
    /// update carrying the observed resourceVersion and UID (the API server refuses it when
    /// either changed). A lost write is [`Failure::LeaseLost`]: nothing after it in the step
    /// runs, and the next reconcile decides from the winner.
    async fn write_lease(
        &self,
        binding: &ModelCacheBinding,
        write: &LeaseWrite,
    ) -> Result<(), Failure> {
        self.ensure_leader()?;
        let lease = write.lease();
        let name = lease.name_any();
        let api: Api<Lease> =
            Api::namespaced(self.client.clone(), &self.settings.control_namespace);
        let lost = || Failure::LeaseLost {
            lease: format!("{}/{name}", self.settings.control_namespace),
        };
        let annotations = lease.annotations();
        let writer = annotations
            .get(warmcache_modelvolume::volume_keys::WRITER_NAMESPACE_ANNOTATION)
            .cloned()
            .unwrap_or_default();
        let state = annotations
            .get(warmcache_modelvolume::volume_keys::WRITER_STATE_ANNOTATION)
            .cloned()
            .unwrap_or_default();
        match write {
            LeaseWrite::Create(_) => match api.create(&PostParams::default(), lease).await {
                Ok(_) => {
                    self.metrics.lease_write("created");
                    tracing::info!(lease = %name, writer = %writer, state = %state, "recorded the writer");
                }
                Err(err) if warmcache_kube::is_already_exists(&err) => {
                    self.metrics.lease_write("lost");
                    return Err(lost());
                }
                Err(err) => return Err(api_error("create", api.resource_url(), &name, err)),
            },
            LeaseWrite::Update(_) | LeaseWrite::TakeOver(_) => {
                match api.replace(&name, &PostParams::default(), lease).await {
                    Ok(_) if matches!(write, LeaseWrite::TakeOver(_)) => {
                        self.metrics.lease_write("taken_over");
                        tracing::info!(lease = %name, writer = %writer, "took the download over");
                        if let Some(recorder) = &self.recorder {
                            recorder
                                .normal(
                                    binding,
                                    "WriterTakenOver",
                                    "TakeOverWriter",
                                    Some(&format!("namespace {writer} takes the download over")),
                                )
                                .await;
                        }
                    }
                    Ok(_) => {
                        self.metrics.lease_write("updated");
                        tracing::info!(lease = %name, writer = %writer, state = %state, "updated the writer record");
                    }
                    Err(err)
                        if warmcache_kube::is_conflict(&err)
                            || warmcache_kube::is_not_found(&err) =>
                    {
                        self.metrics.lease_write("lost");
                        return Err(lost());
                    }
                    Err(err) => return Err(api_error("replace", api.resource_url(), &name, err)),
                }
            }
        }
        Ok(())
    }

    /// Labels the primary PV complete and sets Retain (conflicts retried against a fresh read,
    /// bounded), then re-reads it and fails unless both are stored.
    async fn mark_complete(
        &self,
        binding: &ModelCacheBinding,
        pv: &str,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
    ) -> Result<(), Failure> {
        self.ensure_leader()?;
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        update_with_retry(&api, pv, |current| {
            let mut next = current.clone();
            next.metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .extend(labels.clone());
            next.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .extend(annotations.clone());
            if let Some(spec) = next.spec.as_mut() {
                spec.persistent_volume_reclaim_policy = Some(view::RETAIN.to_owned());
            }
            if next == *current {
                Decision::Unchanged
            } else {
                Decision::Update(next)
            }
        })
        .await?;
        let stored = api
            .get(pv)
            .await
            .map_err(|e| api_error("get", "persistentvolumes", pv, e))?;
        if !lifecycle::is_complete(binding, &stored) {
            return Err(Failure::CompletionNotStored { pv: pv.to_owned() });
        }
        self.metrics
            .download_succeeded(binding, lifecycle::recorded_bytes(&stored));
        tracing::info!(pv, "the primary is complete and retained");
        if let Some(recorder) = &self.recorder {
            recorder
                .normal(
                    binding,
                    "DownloadComplete",
                    "MarkComplete",
                    Some(&format!(
                        "PersistentVolume {pv} labelled complete, reclaim policy Retain"
                    )),
                )
                .await;
        }
        Ok(())
    }

    async fn write_status(
        &self,
        binding: &ModelCacheBinding,
        step: &lifecycle::Step,
    ) -> Result<bool, Failure> {
        let mut status = step.status.clone();
        let at = now();
        for c in &step.conditions {
            set_condition(
                &mut status.conditions,
                NewCondition::new(
                    c.type_,
                    ConditionStatus::from(c.status),
                    c.reason.as_str(),
                    c.message.clone(),
                )
                .observed_generation(binding.metadata.generation),
                at.clone(),
            )?;
        }
        if binding.status.as_ref() == Some(&status) {
            return Ok(false);
        }
        self.ensure_leader()?;
        let api: Api<ModelCacheBinding> =
            Api::namespaced(self.client.clone(), &self.settings.control_namespace);
        let mut next = binding.clone();
        next.status = Some(status);
        let name = binding.name_any();
        let written = api
            .replace_status(&name, &PostParams::default(), &next)
            .await
            .map_err(|e| api_error("replace_status", api.resource_url(), &name, e))?;
        if let Some(replaced) = binding.metadata.resource_version.as_deref() {
            self.own_writes.record(replaced, written);
        }
        Ok(true)
    }
}

/// Whether `pv` is labelled complete for the cache of identity hash `hash` (a candidate retained
/// primary: [`lifecycle::adoptable`] and [`lifecycle::released_primary`] check the rest).
fn complete_of_cache(pv: &PersistentVolume, hash: &str) -> bool {
    let l = pv.labels();
    l.get(MODEL_LABEL).map(String::as_str) == Some(hash)
        && l.get(warmcache_modelvolume::volume_keys::COMPLETE_LABEL)
            .map(String::as_str)
            == Some("true")
}

/// The PV to read afresh for a roxReadOnly binding whose primary claim is gone: the primary its
/// status records (`status.realized.boundPersistentVolumeName`, population Ready) when the PV
/// cache's candidates do not include it. The PV enters the cache with its completion labels,
/// and the claim's deletion comes through another watch: a lagging PV watch would otherwise
/// show no complete primary and Ready would go back. `None` in every other case (no read).
fn uncached_released_primary(
    binding: &ModelCacheBinding,
    cached: &[Arc<PersistentVolume>],
) -> Option<String> {
    if binding.spec.decision.transition
        != warmcache_api_modelcache::v2beta1::Transition::RoxReadOnly
    {
        return None;
    }
    let realized = binding.status.as_ref()?.realized.as_ref()?;
    if realized.population_state != Some(warmcache_api_modelcache::v2beta1::PopulationState::Ready)
    {
        return None;
    }
    let name = realized
        .bound_persistent_volume_name
        .as_ref()
        .filter(|n| !n.is_empty())?;
    (!cached
        .iter()
        .any(|pv| pv.metadata.name.as_ref() == Some(name)))
    .then(|| name.clone())
}

/// `object` with the current span's trace context in its annotations (when there is one).
fn traced<K: Resource + Clone>(object: &K) -> K {
    let mut object = object.clone();
    let mut annotations = object.meta().annotations.clone().unwrap_or_default();
    if warmcache_telemetry::inject_current(&mut annotations) {
        object.meta_mut().annotations = Some(annotations);
    }
    object
}

fn action_label(action: &Action) -> &'static str {
    match action {
        Action::CreatePrimaryClaim(_) => "create_primary_claim",
        Action::AdoptPrimary { .. } => "adopt_primary",
        Action::CreateWriterView(..) => "create_writer_view",
        Action::RebindWriterView { .. } => "rebind_writer_view",
        Action::CreateJob(_) => "create_job",
        Action::MarkComplete { .. } => "mark_complete",
        Action::ReleaseWriterClaim { .. } => "release_writer_claim",
        Action::ReleaseStaleWriterClaim { .. } => "release_stale_writer_claim",
        Action::ReleasePrimaryClaim { .. } => "release_primary_claim",
        Action::CreateView(..) => "create_view",
        Action::DeleteWaitingReaders { .. } => "delete_waiting_readers",
        Action::WriteLease(_) => "write_lease",
        Action::CreateKeySecret(_) => "create_key_secret",
        Action::CreateEncryptedClass(_) => "create_encrypted_class",
        Action::RecordRevision { .. } => "record_revision",
    }
}

impl Reconciler<ModelCacheBinding> for Bindings {
    type Error = Failure;

    async fn permanent_failure(&self, binding: Arc<ModelCacheBinding>, error: &Failure) {
        self.record_permanent(&binding, error).await;
    }

    async fn reconcile(
        &self,
        binding: Arc<ModelCacheBinding>,
    ) -> Result<warmcache_runtime::Action, Failure> {
        let binding = self.own_writes.freshest(binding);
        let b = binding.as_ref();
        let identity = &b.spec.identity;

        // Dereference.
        let observed = async {
            let pods = self.pods_of(b);
            let (seen, stale) = self.references(b, &pods).await?;
            let reader_namespaces: BTreeSet<String> =
                pods.iter().map(|p| p.namespace().to_owned()).collect();
            // How each pod reads this binding: the model copy, or (its compile-cache set) a
            // copy only ever filled by capture.
            let name = b.name_any();
            let uid = b.uid();
            let how = |p: &ReadingPod| {
                reading::reads(&p.annotations(), &name, uid.as_deref()).unwrap_or(Reads::Model)
            };
            // Capture sources keep their own download (or compile caches) until the node agent
            // captures one.
            let digest = &identity.cache_handle_digest;
            let mut capture_sources: Vec<String> = pods
                .iter()
                .filter(|p| {
                    reading::is_capture_source(how(p), &p.labels(), &p.annotations(), digest)
                })
                .map(|p| format!("{}/{}", p.namespace(), p.name()))
                .collect();
            capture_sources.sort();
            let model_uri = pods
                .iter()
                .find_map(|p| reading::shown_uri(how(p), &p.annotations(), digest));
            // Only readers of the model copy carry a download step a writer Job may run.
            let model_readers: Vec<_> = pods
                .iter()
                .filter(|p| how(p) == Reads::Model)
                .cloned()
                .collect();
            let writer = self.election(b, &model_readers).await?;
            let writer_ns = writer.namespace.clone();
            // After the election: it may have read which pods record a step.
            let traceparents = traceparents(&pods, |p| {
                self.pod_index.step_known(
                    &b.name_any(),
                    p.namespace(),
                    p.name(),
                    p.uid().unwrap_or_default(),
                ) == Some(true)
            });
            let previous_writer_claim = writer
                .previous
                .as_ref()
                .and_then(|ns| self.claim(ns, &writer_pvc_name(identity)));
            let stale_writer_claims = self.stale_writer_claims(b, &writer_ns);
            let primary_claim =
                self.claim(&self.settings.control_namespace, &writer_pvc_name(identity));
            let primary_pv = match primary_claim
                .as_ref()
                .and_then(|c| c.spec.as_ref())
                .and_then(|s| s.volume_name.clone())
            {
                Some(name) => {
                    let api: Api<PersistentVolume> = Api::all(self.client.clone());
                    api.get_opt(&name)
                        .await
                        .map_err(|e| api_error("get", "persistentvolumes", &name, e))?
                }
                None => None,
            };
            let writer_view_possible = primary_pv
                .as_ref()
                .is_some_and(|pv| !lifecycle::is_complete(b, pv));
            let mut foreign = self
                .foreign_object(b, &writer_ns, writer_view_possible)
                .await?;
            if foreign.is_none()
                && let LeaseView::Foreign(what) = lease::view(b, self.lease(b).as_deref())
            {
                foreign = Some(what);
            }
            let writer_view_pv = self.volume(&view::writer_view_pv_name_in(b, &writer_ns));
            let hash = warmcache_api_modelcache::identity_hash(identity);
            let mut retained: Vec<Arc<PersistentVolume>> = if primary_claim.is_none() {
                self.volumes
                    .store()
                    .state()
                    .into_iter()
                    .filter(|pv| complete_of_cache(pv, &hash))
                    .collect()
            } else {
                Vec::new()
            };
            // roxReadOnly, Ready, its primary claim released: the complete primary the status
            // records, read afresh when the PV cache does not hold it (yet).
            if primary_claim.is_none()
                && let Some(name) = uncached_released_primary(b, &retained)
            {
                let api: Api<PersistentVolume> = Api::all(self.client.clone());
                if let Some(pv) = api
                    .get_opt(&name)
                    .await
                    .map_err(|e| api_error("get", "persistentvolumes", &name, e))?
                    .filter(|pv| complete_of_cache(pv, &hash))
                {
                    retained.push(Arc::new(pv));
                }
            }
            // The detach gate (roxReadOnly): attachments of every candidate primary PV.
            let candidates: BTreeSet<String> = primary_pv
                .iter()
                .filter_map(|pv| pv.metadata.name.clone())
                .chain(retained.iter().filter_map(|pv| pv.metadata.name.clone()))
                .collect();
            let mut attachments: BTreeMap<String, Vec<String>> = BTreeMap::new();
            if b.spec.decision.transition
                == warmcache_api_modelcache::v2beta1::Transition::RoxReadOnly
            {
                for va in self.attachments.store().state() {
                    if let Some(pv) = va
                        .spec
                        .source
                        .persistent_volume_name
                        .as_ref()
                        .filter(|n| candidates.contains(*n))
                    {
                        attachments
                            .entry(pv.clone())
                            .or_default()
                            .push(va.name_any());
                    }
                }
            }
            // roxReadOnly: a released primary claim still there: the pods that keep it.
            let primary_claim_holders = match &primary_claim {
                Some(c) if c.metadata.deletion_timestamp.is_some() => {
                    self.claim_holders(&self.settings.control_namespace, &c.name_any())
                        .await?
                }
                _ => Vec::new(),
            };
            let writer_view_claim = self.claim(&writer_ns, &writer_pvc_name(identity));
            let encryption = self.encryption_objects(b).await?;
            let job = self
                .jobs
                .store()
                .get(&ObjectRef::new(&writer_job_name(identity)).within(&writer_ns));
            let finished = job.as_ref().is_some_and(|j| {
                j.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter().any(|c| {
                            (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True"
                        })
                    })
            });
            let job_pods = match (&job, finished) {
                (Some(j), true) => self.job_pods(j).await?,
                _ => Vec::new(),
            };
            let recorded: Vec<_> = b
                .status
                .as_ref()
                .and_then(|s| s.realized.as_ref())
                .map(|r| r.views.clone())
                .unwrap_or_default();
            let existing_views: BTreeSet<String> = recorded
                .iter()
                .filter(|v| {
                    self.volume(&v.persistent_volume_name).is_some()
                        && self
                            .claim(&v.namespace, &v.persistent_volume_claim_name)
                            .is_some()
                })
                .map(|v| v.namespace.clone())
                .collect();
            Ok::<_, Failure>((
                seen,
                stale,
                reader_namespaces,
                traceparents,
                model_uri,
                capture_sources,
                writer,
                previous_writer_claim,
                stale_writer_claims,
                model_readers,
                primary_claim,
                primary_pv,
                writer_view_pv,
                writer_view_claim,
                job,
                job_pods,
                existing_views,
                foreign,
                retained,
                attachments,
                primary_claim_holders,
                encryption,
            ))
        }
        .instrument(tracing::info_span!("dereference"))
        .await?;
        let (
            seen,
            stale,
            reader_namespaces,
            traceparents,
            model_uri,
            capture_sources,
            writer,
            previous_writer_claim,
            stale_writer_claims,
            model_readers,
            primary_claim,
            primary_pv,
            writer_view_pv,
            writer_view_claim,
            job,
            job_pods,
            existing_views,
            foreign,
            retained,
            attachments,
            primary_claim_holders,
            (key_secret, encrypted_class, base_class),
        ) = observed;

        // Decide (pure), first without a download step: the pod cache keeps none, and the
        // lifecycle reads one only where it would start the writer Job.
        let mut observed = Observed {
            binding: b,
            now: now(),
            seen_references: seen,
            stale_references: stale,
            reader_namespaces,
            traceparents,
            model_uri,
            writer,
            step: None,
            capture_sources,
            primary_claim: primary_claim.as_deref(),
            primary_pv: primary_pv.as_ref(),
            writer_view_pv: writer_view_pv.as_deref(),
            writer_view_claim: writer_view_claim.as_deref(),
            previous_writer_claim: previous_writer_claim.as_deref(),
            stale_writer_claims: stale_writer_claims.iter().map(AsRef::as_ref).collect(),
            job: job.as_deref(),
            job_pods: job_pods.iter().collect(),
            existing_views,
            foreign,
            completion_error: self
                .completion_errors
                .lock()
                .ok()
                .and_then(|e| e.get(&b.uid().unwrap_or_default()).cloned()),
            retained: retained.iter().map(AsRef::as_ref).collect(),
            attachments,
            primary_claim_holders,
            encryption: lifecycle::EncryptionObserved {
                secret: key_secret.as_ref(),
                class: encrypted_class.as_ref(),
                base_class: base_class.as_ref(),
            },
            config: &self.settings.lifecycle,
        };
        let decide = |observed: &Observed<'_>| {
            let _span = tracing::info_span!("decide").entered();
            lifecycle::step(observed)
        };
        let mut step = decide(&observed);
        if wants_download_step(&step) {
            // Read from the API server (rare: until the writer Job exists), then decided again.
            let writer_ns = observed.writer.namespace.clone();
            let source = self
                .step_source(&b.name_any(), &writer_ns, &model_readers)
                .instrument(tracing::info_span!("download_step", namespace = %writer_ns))
                .await?;
            if let Some((source, traceparent)) = source {
                if let Some(tp) = traceparent {
                    observed.traceparents.insert(writer_ns, tp);
                }
                observed.step = Some(source);
                step = decide(&observed);
            }
        }
        let failed_now = step.conditions.iter().any(|c| {
            c.type_ == lifecycle::DEGRADED
                && c.status
                && c.reason == lifecycle::Reason::DownloadFailed
        });
        let failed_before = b
            .status
            .as_ref()
            .and_then(|s| s.realized.as_ref())
            .and_then(|r| r.population_state)
            == Some(warmcache_api_modelcache::v2beta1::PopulationState::Failed);

        let held = lifecycle::Reason::PrimaryClaimHeld.as_str();
        let held_now = step
            .conditions
            .iter()
            .any(|c| c.type_ == lifecycle::DEGRADED && c.status && c.reason.as_str() == held);
        let held_before = b
            .status
            .iter()
            .flat_map(|s| s.conditions.iter())
            .any(|c| c.type_ == lifecycle::DEGRADED && c.status == "True" && c.reason == held);

        if let Some(drift) = &self.drift {
            step.conditions.push(drift.condition(b));
        }

        // Status first (views recorded before they are created).
        let wrote = self
            .write_status(b, &step)
            .instrument(tracing::info_span!("status"))
            .await?;
        if failed_now && !failed_before {
            self.metrics.download_failed();
            if let Some(recorder) = &self.recorder {
                let message = degraded_message(&step);
                recorder
                    .warning(b, "DownloadFailed", "WatchWriterJob", message.as_deref())
                    .await;
            }
        }

        if held_now && !held_before {
            self.metrics.primary_claim_held();
            if let Some(recorder) = &self.recorder {
                let message = degraded_message(&step);
                recorder
                    .warning(
                        b,
                        "PrimaryClaimHeld",
                        "ReleasePrimaryClaim",
                        message.as_deref(),
                    )
                    .await;
            }
        }

        // Then the actions, in order.
        for action in &step.actions {
            self.metrics.action(action_label(action));
            self.run_action(b, action).await?;
        }
        let waiting = step.conditions.iter().any(|c| {
            c.type_ == lifecycle::PROGRESSING
                && c.status
                && c.reason == lifecycle::Reason::PrimaryClaimPending
        });
        let recheck = step.recheck_at.map(|at| {
            let seconds = at.duration_since(Timestamp::now()).as_secs_f64().ceil();
            Duration::from_secs_f64(seconds.clamp(1.0, REQUEUE_SETTLED.as_secs_f64()))
        });
        Ok(if !wrote && !step.actions.is_empty() {
            warmcache_runtime::Action::requeue(REQUEUE_WAITING)
        } else if waiting {
            warmcache_runtime::Action::requeue(REQUEUE_CLAIM_PENDING)
        } else if let Some(after) = recheck {
            warmcache_runtime::Action::requeue(after)
        } else {
            warmcache_runtime::Action::requeue(REQUEUE_SETTLED)
        })
    }
}

impl Bindings {
    /// Records a permanent failure as `Degraded` on the binding (the runtime then waits for a
    /// change); best effort: a failed write is logged.
    async fn record_permanent(&self, binding: &ModelCacheBinding, error: &Failure) {
        let reason = match error {
            Failure::Foreign { .. } => lifecycle::Reason::ForeignObject.as_str(),
            _ => "ReconcileFailed",
        };
        let mut status = binding.status.clone().unwrap_or_default();
        let changed = set_condition(
            &mut status.conditions,
            NewCondition::new(
                lifecycle::DEGRADED,
                ConditionStatus::True,
                reason,
                error.to_string(),
            )
            .observed_generation(binding.metadata.generation),
            now(),
        );
        if !matches!(changed, Ok(true)) || self.ensure_leader().is_err() {
            return;
        }
        let api: Api<ModelCacheBinding> =
            Api::namespaced(self.client.clone(), &self.settings.control_namespace);
        let mut next = binding.clone();
        next.status = Some(status);
        if let Err(err) = api
            .replace_status(&binding.name_any(), &PostParams::default(), &next)
            .await
        {
            tracing::warn!(error = %err, "could not record the failure on the binding");
        }
    }
}

/// The message of the step's Degraded condition, for the Event that reports it.
fn degraded_message(step: &lifecycle::Step) -> Option<String> {
    step.conditions
        .iter()
        .find(|c| c.type_ == lifecycle::DEGRADED)
        .map(|c| c.message.clone())
}

/// The admission trace context of a reading pod per namespace (pods in name order; one known to
/// record a download step, `has_step`, is preferred; the writer Job continues the trace of the
/// pod whose step it runs, see [`Bindings::step_source`]).
fn traceparents(
    pods: &[Arc<ReadingPod>],
    has_step: impl Fn(&ReadingPod) -> bool,
) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, (bool, String)> = BTreeMap::new();
    for pod in pods {
        let a = pod.annotations();
        let Some(tp) = a.get(warmcache_telemetry::TRACE_PARENT_ANNOTATION) else {
            continue;
        };
        let ns = pod.namespace();
        let has_step = has_step(pod);
        match out.get(ns) {
            Some((true, _)) => {}
            Some((false, _)) if !has_step => {}
            _ => {
                out.insert(ns.to_owned(), (has_step, tp.to_owned()));
            }
        }
    }
    out.into_iter().map(|(ns, (_, tp))| (ns, tp)).collect()
}

/// Whether `step`, decided without a download step ([`Observed::step`] `None`), stopped for want
/// of one. The lifecycle reads the step only where it would start the writer Job, and without
/// one it reports there, on Ready, that it waits for a step, for a takeover or for a capture;
/// decided again with the step, it starts the Job (or, a capture source aside, reports the same).
fn wants_download_step(step: &lifecycle::Step) -> bool {
    step.conditions.iter().any(|c| {
        c.type_ == lifecycle::READY
            && matches!(
                c.reason,
                lifecycle::Reason::WaitingForDownloadStep
                    | lifecycle::Reason::WaitingForTakeover
                    | lifecycle::Reason::WaitingForCapture
            )
    })
}

/// The namespace whose download step [`lease::elect`] reads first, or `None` when it reads no
/// step at all; when that namespace has a step, `elect` reads no other, so it decides the same
/// from that namespace alone (tested against `elect` below). No step is read for a binding
/// without a Lease or with a foreign one (the writer is fixed), nor while the holder's Job
/// exists with the Lease absent or recording this binding's writer; first read is the recorded
/// holder's namespace, or, without a usable record, `writerNamespace` (the preferred first
/// writer).
fn election_reads_first(
    binding: &ModelCacheBinding,
    view: &LeaseView,
    holder_job: bool,
) -> Option<String> {
    let record = match view {
        LeaseView::NotUsed | LeaseView::Foreign(_) => return None,
        LeaseView::Absent => None,
        LeaseView::Ours(r) => Some(r),
    };
    let usable = record.filter(|r| {
        !r.namespace.is_empty()
            && r.binding_uid
                .as_ref()
                .is_none_or(|u| binding.metadata.uid.as_ref() == Some(u))
    });
    match usable {
        Some(r) => (!holder_job).then(|| r.namespace.clone()),
        None if record.is_none() && holder_job => None,
        None => Some(binding.spec.resources.writer_namespace.clone()),
    }
}

/// The pods of each binding (by the name their [`BINDING_ANNOTATION`] carries), kept from the pod
/// watch's changes, so a reconcile reads its binding's pods instead of filtering every pod of
/// the cluster. Kept as a superset: a pod is added on every change in which the cache holds it
/// and removed when it is gone from the cache; readers check each entry against the cache and
/// drop those that no longer match (a relabelled pod, a deletion missed while the watch lagged).
///
/// Each entry also remembers, once a read of the pod from the API server has told, whether that
/// pod (by UID) records a download step: the pod cache does not keep the step (0.7 kB a pod), and
/// admission writes it once, so a pod is read for it at most once while it lives.
#[derive(Debug, Default)]
pub struct PodIndex {
    by_binding: std::sync::Mutex<BTreeMap<Arc<str>, Members>>,
}

/// The pods of one binding, sorted by `(namespace, name)`, held at their exact length: at
/// 10,000 bindings of 10 pods a B-tree node per binding and a heap copy of the namespace per pod
/// were some 7 MB. The namespaces (a cluster has few) are shared with the pod cache's values.
type Members = Vec<Member>;

/// One pod of a binding, with what is known of its download step.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Member {
    namespace: Arc<str>,
    name: Box<str>,
    step: Option<StepSeen>,
}

impl Member {
    fn key(&self) -> (&str, &str) {
        (&self.namespace, &self.name)
    }
}

/// What a read of a pod from the API server told of its download step.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StepSeen {
    /// The UID of the pod read (a pod recreated under the same name is another pod).
    uid: Box<str>,
    /// Whether it records a download step.
    has_step: bool,
}

/// Where `namespace/name` is (or would go) in `members`.
fn member_at(members: &Members, namespace: &str, name: &str) -> Result<usize, usize> {
    members.binary_search_by(|m| m.key().cmp(&(namespace, name)))
}

impl PodIndex {
    /// Records a change of `pod`: `present` when the cache now holds it.
    pub fn observe(&self, pod: &ReadingPod, present: bool) {
        let (ns, name) = (pod.namespace(), pod.name());
        if ns.is_empty() || name.is_empty() {
            return;
        }
        let Ok(mut index) = self.by_binding.lock() else {
            return;
        };
        for binding in reading::bindings_named(&pod.annotations()) {
            if present {
                let members = match index.get_mut(binding) {
                    Some(members) => members,
                    None => index.entry(crate::pods::shared(binding)).or_default(),
                };
                if let Err(at) = member_at(members, ns, name) {
                    members.reserve_exact(1);
                    members.insert(
                        at,
                        Member {
                            namespace: Arc::clone(pod.shared_namespace()),
                            name: name.into(),
                            step: None,
                        },
                    );
                }
            } else if let Some(members) = index.get_mut(binding) {
                if let Ok(at) = member_at(members, ns, name) {
                    members.remove(at);
                    members.shrink_to_fit();
                }
                if members.is_empty() {
                    index.remove(binding);
                }
            }
        }
    }

    /// The `(namespace, name)` of the pods recorded for `binding`.
    pub fn members(&self, binding: &str) -> Vec<(String, String)> {
        self.by_binding
            .lock()
            .ok()
            .and_then(|index| {
                index.get(binding).map(|members| {
                    members
                        .iter()
                        .map(|m| (m.namespace.to_string(), m.name.to_string()))
                        .collect()
                })
            })
            .unwrap_or_default()
    }

    /// Drops one entry found stale.
    pub fn forget(&self, binding: &str, namespace: &str, name: &str) {
        if let Ok(mut index) = self.by_binding.lock()
            && let Some(members) = index.get_mut(binding)
        {
            if let Ok(at) = member_at(members, namespace, name) {
                members.remove(at);
                members.shrink_to_fit();
            }
            if members.is_empty() {
                index.remove(binding);
            }
        }
    }

    /// Whether the pod `namespace/name` of `binding` with UID `uid` records a download step, if
    /// a read of that pod told.
    pub fn step_known(
        &self,
        binding: &str,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Option<bool> {
        let index = self.by_binding.lock().ok()?;
        let members = index.get(binding)?;
        let seen = members
            .get(member_at(members, namespace, name).ok()?)?
            .step
            .as_ref()?;
        (&*seen.uid == uid).then_some(seen.has_step)
    }

    /// Remembers what a read of the pod `namespace/name` (UID `uid`) of `binding` told of its
    /// download step; nothing when the index no longer holds the pod.
    pub fn record_step(
        &self,
        binding: &str,
        namespace: &str,
        name: &str,
        uid: &str,
        has_step: bool,
    ) {
        if let Ok(mut index) = self.by_binding.lock()
            && let Some(members) = index.get_mut(binding)
            && let Some(member) = member_at(members, namespace, name)
                .ok()
                .and_then(|at| members.get_mut(at))
        {
            member.step = Some(StepSeen {
                uid: uid.into(),
                has_step,
            });
        }
    }
}

/// The namespaces holding a writer view claim of each name (`rw-pvc-<hash>`, role writer),
/// outside the control namespace: where [`Bindings::stale_writer_claims`] looks, instead of a
/// pass over the whole claim cache. Kept by the claim watch's mapping (updated before the
/// reconcile a change triggers is queued); a superset, checked against the cache when read
/// (an entry the cache no longer holds is dropped then).
#[derive(Debug, Default)]
pub struct WriterClaimIndex {
    by_name: std::sync::Mutex<BTreeMap<String, BTreeSet<String>>>,
}

impl WriterClaimIndex {
    /// Records a change of `claim`: `present` when the cache now holds it. Claims other than
    /// writer view claims outside `control` are not recorded.
    pub fn observe(&self, control: &str, claim: &PersistentVolumeClaim, present: bool) {
        let (Some(ns), Some(name)) = (claim.namespace(), claim.metadata.name.as_ref()) else {
            return;
        };
        if ns == control
            || claim.labels().get(VOLUME_ROLE_LABEL).map(String::as_str) != Some(ROLE_WRITER)
        {
            return;
        }
        let Ok(mut index) = self.by_name.lock() else {
            return;
        };
        if present {
            index.entry(name.clone()).or_default().insert(ns);
        } else if let Some(set) = index.get_mut(name) {
            set.remove(&ns);
            if set.is_empty() {
                index.remove(name);
            }
        }
    }

    /// The namespaces recorded for the claim name `name`.
    pub fn namespaces(&self, name: &str) -> Vec<String> {
        self.by_name
            .lock()
            .ok()
            .and_then(|index| index.get(name).map(|s| s.iter().cloned().collect()))
            .unwrap_or_default()
    }

    /// Drops one entry found stale.
    pub fn forget(&self, name: &str, namespace: &str) {
        if let Ok(mut index) = self.by_name.lock()
            && let Some(set) = index.get_mut(name)
        {
            set.remove(namespace);
            if set.is_empty() {
                index.remove(name);
            }
        }
    }
}

/// The bindings whose status this controller wrote and whose cached copy may still be the one
/// written over (read your own writes). A reconcile queued while a status write was in flight
/// (a pod arriving, say) otherwise starts from the cached binding of before that write, builds
/// on its `resourceVersion` and loses to the write it follows with a conflict: a wasted request
/// and a retry after a backoff, while the API server is busiest. Each entry is the object the
/// API server returned and the `resourceVersion` it replaced; it is used only while the cache
/// still shows exactly that version of that binding (so it is never older than the cache), and
/// dropped as soon as the cache shows anything else.
#[derive(Debug, Default)]
pub struct OwnWrites {
    written: std::sync::Mutex<BTreeMap<String, (String, Arc<ModelCacheBinding>)>>,
}

impl OwnWrites {
    /// Records that `written` (as the API server returned it) replaced `replaced`, the
    /// `resourceVersion` the write was based on.
    pub fn record(&self, replaced: &str, written: ModelCacheBinding) {
        let Some(name) = written.metadata.name.clone() else {
            return;
        };
        if let Ok(mut map) = self.written.lock() {
            map.insert(name, (replaced.to_owned(), Arc::new(written)));
        }
    }

    /// The newest state of `cached` known here: the object last written when the cache still
    /// shows the version that write replaced (same UID), else `cached` (and the entry, if any,
    /// is dropped: the cache has caught up or moved on).
    pub fn freshest(&self, cached: Arc<ModelCacheBinding>) -> Arc<ModelCacheBinding> {
        let Some(name) = cached.metadata.name.as_deref() else {
            return cached;
        };
        let Ok(mut map) = self.written.lock() else {
            return cached;
        };
        match map.get(name) {
            Some((replaced, written))
                if cached.metadata.resource_version.as_deref() == Some(replaced.as_str())
                    && cached.metadata.uid.is_some()
                    && written.metadata.uid == cached.metadata.uid =>
            {
                Arc::clone(written)
            }
            Some(_) => {
                map.remove(name);
                cached
            }
            None => cached,
        }
    }

    /// Entries held (for tests).
    pub fn len(&self) -> usize {
        self.written.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The bindings a pod reads (its model copy's and its compile-cache set's), in the control
/// namespace.
fn binding_of_pod(control: &str, pod: &ReadingPod) -> Vec<ObjectRef<ModelCacheBinding>> {
    reading::bindings_named(&pod.annotations())
        .into_iter()
        .map(|name| ObjectRef::new(name).within(control))
        .collect()
}

/// The binding a storage object or Job belongs to (its [`BINDING_LABEL`]).
fn binding_of<K: Resource>(control: &str, object: &K) -> Vec<ObjectRef<ModelCacheBinding>> {
    object
        .meta()
        .labels
        .as_ref()
        .and_then(|l| l.get(BINDING_LABEL))
        .map(|name| ObjectRef::new(name).within(control))
        .into_iter()
        .collect()
}

/// The binding whose primary PV a VolumeAttachment attaches: the PV's claimRef names the
/// binding's primary claim in the control namespace.
fn binding_of_attachment(
    control: &str,
    bindings: &Cache<ModelCacheBinding>,
    volumes: &Cache<PersistentVolume>,
    va: &VolumeAttachment,
) -> Vec<ObjectRef<ModelCacheBinding>> {
    let Some(pv) = va
        .spec
        .source
        .persistent_volume_name
        .as_ref()
        .and_then(|name| volumes.store().get(&ObjectRef::new(name)))
    else {
        return Vec::new();
    };
    let Some(claim) = pv
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .filter(|r| r.namespace.as_deref() == Some(control))
        .and_then(|r| r.name.clone())
    else {
        return Vec::new();
    };
    bindings
        .store()
        .state()
        .iter()
        .filter(|b| writer_pvc_name(&b.spec.identity) == claim)
        .map(|b| ObjectRef::new(&b.name_any()).within(control))
        .collect()
}

/// Registers the watches and starts the controller on `runtime` (reconciling while leading).
pub fn start(
    runtime: &mut warmcache_runtime::Runtime,
    settings: &Settings,
) -> Result<(), warmcache_runtime::RuntimeError> {
    let control = settings.control_namespace.clone();
    let ours = WatcherConfig::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"));
    let bindings = runtime.watch::<ModelCacheBinding>(Some(&control), WatcherConfig::default())?;
    let pods = runtime.watch_metadata_as::<Pod, ReadingPod>(
        None,
        WatcherConfig::default().labels(MODEL_LABEL),
        ReadingPod::from_meta,
    )?;
    let namespaces = runtime.watch_cluster_metadata::<Namespace>(WatcherConfig::default())?;
    let claims = runtime.watch::<PersistentVolumeClaim>(None, ours.clone())?;
    let volumes = runtime.watch::<PersistentVolume>(None, ours.clone())?;
    let jobs = runtime.watch::<Job>(
        None,
        WatcherConfig::default().labels(&format!(
            "{MANAGED_BY_LABEL}={MANAGED_BY_VALUE},{VOLUME_ROLE_LABEL}={ROLE_WRITER}"
        )),
    )?;
    let leases = runtime.watch::<Lease>(Some(&control), ours.clone())?;
    let attachments = runtime.watch::<VolumeAttachment>(None, WatcherConfig::default())?;
    let metrics =
        Metrics::register(runtime.metrics().registry(), bindings.clone()).map_err(|err| {
            warmcache_runtime::RuntimeError::Task {
                task: "controller metrics".to_owned(),
                message: err.to_string(),
            }
        })?;
    let drift = match &settings.catalog_namespace {
        Some(namespace) => Some(DriftCaches {
            classes: runtime.watch(
                None,
                WatcherConfig::default().fields(&format!(
                    "metadata.name={}",
                    warmcache_api_modelcache::MODEL_CACHE_STORAGE_CLASS
                )),
            )?,
            drivers: runtime.watch(None, WatcherConfig::default())?,
            catalogs: runtime.watch(
                Some(namespace),
                WatcherConfig::default().fields(&format!(
                    "metadata.name={}",
                    warmcache_catalog::CONFIG_MAP_NAME
                )),
            )?,
            namespace: namespace.clone(),
            gates: settings.gates,
        }),
        None => None,
    };
    let client = runtime.client()?;
    let pod_index = Arc::new(PodIndex::default());
    let writer_claims = Arc::new(WriterClaimIndex::default());
    let reconciler = Bindings {
        owners: OwnerResolver::new(client.clone()),
        client,
        settings: settings.clone(),
        leadership: runtime.leadership(),
        pods: pods.clone(),
        pod_index: Arc::clone(&pod_index),
        writer_claims: Arc::clone(&writer_claims),
        namespaces: namespaces.clone(),
        claims: claims.clone(),
        volumes: volumes.clone(),
        jobs: jobs.clone(),
        leases: leases.clone(),
        attachments: attachments.clone(),
        drift: drift.clone(),
        recorder: runtime.recorder().cloned(),
        metrics,
        completion_errors: std::sync::Mutex::new(BTreeMap::new()),
        kinds: std::sync::Mutex::new(BTreeMap::new()),
        own_writes: OwnWrites::default(),
    };
    let (c1, c2, c3, c4, c5, c6) = (
        control.clone(),
        control.clone(),
        control.clone(),
        control.clone(),
        control.clone(),
        control,
    );
    let controller = runtime
        .controller("modelcachebinding", &bindings, reconciler)
        .watches(&pods, {
            let (index, pods) = (Arc::clone(&pod_index), pods.clone());
            move |p| {
                // The index is updated before the reconcile this change triggers is queued.
                let present = pods.store().get(&ObjectRef::from_obj(p)).is_some();
                index.observe(p, present);
                binding_of_pod(&c1, p)
            }
        })
        .watches(&claims, {
            let (index, claims) = (writer_claims, claims.clone());
            move |c| {
                // The index is updated before the reconcile this change triggers is queued.
                let present = claims.store().get(&ObjectRef::from_obj(c)).is_some();
                index.observe(&c2, c, present);
                binding_of(&c2, c)
            }
        })
        .watches(&volumes, move |v| binding_of(&c3, v))
        .watches(&jobs, move |j| binding_of(&c4, j))
        .watches(&leases, move |l| binding_of(&c6, l))
        .watches(&attachments, {
            let (bindings, volumes, control) = (
                bindings.clone(),
                volumes.clone(),
                settings.control_namespace.clone(),
            );
            move |va: &VolumeAttachment| binding_of_attachment(&control, &bindings, &volumes, va)
        })
        .watches(&namespaces, {
            let bindings = bindings.clone();
            move |ns: &PartialObjectMeta<Namespace>| {
                // A namespace of a sharing domain changed: the helmModelCache bindings may gain
                // or lose it (a label removed is caught by the settled requeue). Namespaces
                // without the label map to nothing, so a resync costs nothing for them.
                if !ns.labels().contains_key(SHARING_DOMAIN_LABEL) {
                    return Vec::new();
                }
                bindings
                    .store()
                    .state()
                    .iter()
                    .filter(|b| b.spec.identity.workflow == Workflow::HelmModelCache)
                    .map(|b| ObjectRef::new(&b.name_any()).within(&c5))
                    .collect()
            }
        })
        .concurrency(settings.concurrency);
    let controller = match drift {
        // Any change of the storage the decision reads: every binding is compared again.
        Some(d) => {
            let all = |bindings: &Cache<ModelCacheBinding>, control: &str| {
                bindings
                    .store()
                    .state()
                    .iter()
                    .map(|b| ObjectRef::new(&b.name_any()).within(control))
                    .collect::<Vec<_>>()
            };
            let (b1, b2, b3) = (bindings.clone(), bindings.clone(), bindings.clone());
            let (n1, n2, n3) = (
                settings.control_namespace.clone(),
                settings.control_namespace.clone(),
                settings.control_namespace.clone(),
            );
            controller
                .watches(&d.classes, move |_| all(&b1, &n1))
                .watches(&d.drivers, move |_| all(&b2, &n2))
                .watches(&d.catalogs, move |_| all(&b3, &n3))
        }
        None => controller,
    };
    runtime.start_controller(controller);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, binding: Option<&str>) -> ReadingPod {
        let mut p = PartialObjectMeta::<Pod>::default();
        p.metadata.namespace = Some(ns.into());
        p.metadata.name = Some(name.into());
        p.metadata.annotations =
            binding.map(|b| BTreeMap::from([(BINDING_ANNOTATION.to_owned(), b.to_owned())]));
        ReadingPod::from_meta(p)
    }

    /// A released block primary missing from the PV cache is read afresh, once it is the one
    /// the status records as Ready; never for RWX, before Ready, or when the cache holds it.
    #[test]
    fn a_released_block_primary_missing_from_the_cache_is_read_afresh() {
        use warmcache_api_modelcache::v2beta1::{
            ModelCacheBindingStatus, PopulationState, RealizedStorage, Transition,
        };
        let identity = warmcache_api_modelcache::v2beta1::BindingIdentity::new(
            Workflow::HelmModelCache,
            "domain",
            "hf://m@v1",
        );
        let spec = warmcache_api_modelcache::v2beta1::ModelCacheBindingSpec {
            identity,
            decision: warmcache_api_modelcache::v2beta1::BindingDecision {
                provider: "nvmesh".into(),
                provisioner: "nvmesh-csi.example".into(),
                transition: Transition::RoxReadOnly,
                required_access_modes: Vec::new(),
                required_mount_options: Vec::new(),
                catalog_digest: String::new(),
                encryption_required: false,
                writer_identity: None,
            },
            storage_class: warmcache_api_modelcache::v2beta1::BindingStorageClass {
                name: "nvcf-sc".into(),
                uid: String::new(),
                reclaim_policy: warmcache_api_modelcache::v2beta1::ReclaimPolicy::Retain,
                configuration_digest: String::new(),
            },
            resources: warmcache_api_modelcache::v2beta1::BindingResources::default(),
        };
        let mut b = ModelCacheBinding::new("model-cache-x", spec);
        assert_eq!(uncached_released_primary(&b, &[]), None, "no status");
        let status = |population| ModelCacheBindingStatus {
            realized: Some(RealizedStorage {
                population_state: Some(population),
                bound_persistent_volume_name: Some("pv-primary".into()),
                ..RealizedStorage::default()
            }),
            ..ModelCacheBindingStatus::default()
        };
        b.status = Some(status(PopulationState::Populating));
        assert_eq!(uncached_released_primary(&b, &[]), None, "not Ready yet");
        b.status = Some(status(PopulationState::Ready));
        assert_eq!(
            uncached_released_primary(&b, &[]),
            Some("pv-primary".to_owned())
        );
        let mut cached = PersistentVolume::default();
        cached.metadata.name = Some("pv-primary".into());
        let cached = [Arc::new(cached)];
        assert_eq!(uncached_released_primary(&b, &cached), None, "in the cache");
        b.spec.decision.transition = Transition::RwxReadOnly;
        assert_eq!(uncached_released_primary(&b, &[]), None, "RWX");

        let hash = "abc";
        let mut pv = PersistentVolume::default();
        assert!(!complete_of_cache(&pv, hash));
        pv.metadata.labels = Some(BTreeMap::from([
            (MODEL_LABEL.to_owned(), hash.to_owned()),
            (
                warmcache_modelvolume::volume_keys::COMPLETE_LABEL.to_owned(),
                "true".to_owned(),
            ),
        ]));
        assert!(complete_of_cache(&pv, hash));
        assert!(!complete_of_cache(&pv, "other"));
    }

    /// [`election_reads_first`] against [`lease::elect`]: when it names no namespace, `elect`
    /// decides the same from no step at all; when it names one that has a step, the same from
    /// that namespace alone. Every Lease view, record, holder Job and set of step namespaces.
    #[test]
    fn the_election_decides_the_same_from_the_step_namespaces_it_reads() {
        use lease::{ElectionInput, WriterRecord};
        use warmcache_api_modelcache::v2beta1::WriterState;
        let identity = warmcache_api_modelcache::v2beta1::BindingIdentity::new(
            Workflow::HelmModelCache,
            "domain",
            "hf://m@v1",
        );
        let mut binding = warmcache_api_modelcache::fixtures::binding("control", "b", identity);
        binding.spec.resources.lease_name = "init-lease-x".into();
        binding.metadata.uid = Some("binding-uid".into());
        let now = Timestamp::now();
        let long_ago = now
            .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(3600))
            .unwrap();
        let mut views = vec![
            LeaseView::NotUsed,
            LeaseView::Absent,
            LeaseView::Foreign("Lease x/init-lease-x".into()),
        ];
        for namespace in ["", "a", "b", "c"] {
            for binding_uid in [None, Some("binding-uid"), Some("earlier-uid")] {
                for state in [
                    WriterState::Starting,
                    WriterState::Running,
                    WriterState::Gone,
                ] {
                    for renewed in [now, long_ago] {
                        views.push(LeaseView::Ours(WriterRecord {
                            namespace: namespace.into(),
                            job_name: "writer".into(),
                            job_uid: Some("job-uid".into()),
                            state,
                            binding_uid: binding_uid.map(str::to_owned),
                            acquired: Some(long_ago),
                            renewed: Some(renewed),
                            transitions: 0,
                            resource_version: Some("1".into()),
                            uid: Some("lease-uid".into()),
                        }));
                    }
                }
            }
        }
        let sets: Vec<BTreeSet<String>> = (0..16_u8)
            .map(|bits| {
                ["a", "b", "c", "d"]
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| bits & (1 << i) != 0)
                    .map(|(_, ns)| (*ns).to_owned())
                    .collect()
            })
            .collect();
        let elect = |view: &LeaseView, job: Option<&str>, steps: &BTreeSet<String>| {
            lease::elect(&ElectionInput {
                binding: &binding,
                lease: view,
                holder_job: job,
                step_namespaces: steps,
                now,
                grace_seconds: 120,
            })
        };
        let mut narrowed = 0;
        for view in &views {
            for job in [None, Some("job-uid"), Some("other-job")] {
                let first = election_reads_first(&binding, view, job.is_some());
                for steps in &sets {
                    let full = elect(view, job, steps);
                    match &first {
                        None => assert_eq!(
                            full,
                            elect(view, job, &BTreeSet::new()),
                            "{view:?} {job:?} {steps:?}"
                        ),
                        Some(ns) if steps.contains(ns) => {
                            narrowed += 1;
                            assert_eq!(
                                full,
                                elect(view, job, &BTreeSet::from([ns.clone()])),
                                "{view:?} {job:?} {steps:?}"
                            );
                        }
                        Some(_) => {}
                    }
                }
            }
        }
        assert!(narrowed > 0);
    }

    #[test]
    fn the_pod_index_remembers_steps_by_uid() {
        let index = PodIndex::default();
        index.observe(&pod("a", "p1", Some("mcb-1")), true);
        assert_eq!(index.step_known("mcb-1", "a", "p1", "u1"), None);
        index.record_step("mcb-1", "a", "p1", "u1", true);
        assert_eq!(index.step_known("mcb-1", "a", "p1", "u1"), Some(true));
        // A pod recreated under the same name is another pod.
        assert_eq!(index.step_known("mcb-1", "a", "p1", "u2"), None);
        // A later change of the same pod keeps what was learned.
        index.observe(&pod("a", "p1", Some("mcb-1")), true);
        assert_eq!(index.step_known("mcb-1", "a", "p1", "u1"), Some(true));
        // Nothing is remembered of a pod the index does not hold.
        index.record_step("mcb-1", "a", "p9", "u9", true);
        assert_eq!(index.step_known("mcb-1", "a", "p9", "u9"), None);
        index.observe(&pod("a", "p1", Some("mcb-1")), false);
        assert_eq!(index.step_known("mcb-1", "a", "p1", "u1"), None);
        assert!(index.by_binding.lock().unwrap().is_empty());
    }

    #[test]
    fn traceparents_prefer_a_pod_known_to_record_a_step() {
        let with_tp = |ns: &str, name: &str, tp: &str| {
            let mut p = PartialObjectMeta::<Pod>::default();
            p.metadata.namespace = Some(ns.into());
            p.metadata.name = Some(name.into());
            p.metadata.annotations = Some(BTreeMap::from([
                (BINDING_ANNOTATION.to_owned(), "mcb-1".to_owned()),
                (
                    warmcache_telemetry::TRACE_PARENT_ANNOTATION.to_owned(),
                    tp.to_owned(),
                ),
            ]));
            Arc::new(ReadingPod::from_meta(p))
        };
        let pods = [
            with_tp("a", "p1", "tp-1"),
            with_tp("a", "p2", "tp-2"),
            with_tp("b", "p3", "tp-3"),
        ];
        let none = traceparents(&pods, |_| false);
        assert_eq!(none.get("a").map(String::as_str), Some("tp-1"));
        assert_eq!(none.get("b").map(String::as_str), Some("tp-3"));
        let p2 = traceparents(&pods, |p| p.name() == "p2");
        assert_eq!(p2.get("a").map(String::as_str), Some("tp-2"));
    }

    #[test]
    fn own_writes_stand_in_only_for_the_version_they_replaced() {
        let binding = |uid: &str, rv: &str, refs: usize| -> ModelCacheBinding {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "nvca.nvcf.nvidia.io/v2beta1",
                "kind": "ModelCacheBinding",
                "metadata": {"name": "model-cache-x", "namespace": "ctl", "uid": uid, "resourceVersion": rv},
                "spec": {
                    "identity": {"version": "v1alpha1", "workflow": "helmModelCache",
                        "sharingDomainDigest": format!("sha256:{}", "a".repeat(64)),
                        "cacheHandleDigest": format!("sha256:{}", "b".repeat(64))},
                    "decision": {"provider": "weka", "provisioner": "csi.weka.io",
                        "requiredAccessModes": ["ReadWriteMany"], "transition": "rwxReadOnly",
                        "writerIdentity": "fsGroup", "encryptionRequired": false,
                        "catalogDigest": format!("sha256:{}", "c".repeat(64))},
                    "resources": {"writerNamespace": "team"},
                    "storageClass": {"name": "nvcf-sc", "uid": "sc", "reclaimPolicy": "Retain",
                        "configurationDigest": format!("v1:sha256:{}", "d".repeat(64))}
                },
                "status": {"phase": "Active", "requestReferences": (0..refs).map(|i| serde_json::json!(
                    {"apiVersion": "v1", "kind": "Pod", "namespace": "team", "name": format!("p{i}"), "uid": format!("u{i}")}
                )).collect::<Vec<_>>()}
            }))
            .unwrap()
        };
        let writes = OwnWrites::default();
        let cached = Arc::new(binding("uid-1", "10", 1));
        // Nothing written: the cached object.
        assert!(Arc::ptr_eq(&writes.freshest(Arc::clone(&cached)), &cached));
        // A write based on version 10 returned version 11 with two references: while the
        // cache still shows 10, a reconcile starts from 11.
        writes.record("10", binding("uid-1", "11", 2));
        let fresh = writes.freshest(Arc::clone(&cached));
        assert_eq!(fresh.metadata.resource_version.as_deref(), Some("11"));
        assert_eq!(fresh.status.as_ref().unwrap().request_references.len(), 2);
        // Asked again before the cache moves: still the written one.
        let again = writes.freshest(Arc::clone(&cached));
        assert_eq!(again.metadata.resource_version.as_deref(), Some("11"));
        assert_eq!(writes.len(), 1);
        // The cache caught up (or moved past it, another writer's version): the cached object,
        // and the entry is gone, so an older write can never stand in for a newer cache.
        let caught_up = Arc::new(binding("uid-1", "12", 3));
        assert!(Arc::ptr_eq(
            &writes.freshest(Arc::clone(&caught_up)),
            &caught_up
        ));
        assert!(writes.is_empty());
        assert!(Arc::ptr_eq(&writes.freshest(Arc::clone(&cached)), &cached));
        // A binding deleted and created again under the same name at the same version string
        // is another object: never the old one's write.
        writes.record("10", binding("uid-1", "11", 2));
        let recreated = Arc::new(binding("uid-2", "10", 0));
        assert!(Arc::ptr_eq(
            &writes.freshest(Arc::clone(&recreated)),
            &recreated
        ));
        assert!(writes.is_empty());
    }

    #[test]
    fn the_writer_claim_index_holds_writer_claims_outside_the_control_namespace() {
        let claim = |ns: &str, name: &str, role: &str| PersistentVolumeClaim {
            metadata: kube::api::ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                labels: Some(BTreeMap::from([(
                    VOLUME_ROLE_LABEL.to_owned(),
                    role.to_owned(),
                )])),
                ..Default::default()
            },
            ..Default::default()
        };
        let index = WriterClaimIndex::default();
        index.observe("ctl", &claim("a", "rw-pvc-1", ROLE_WRITER), true);
        index.observe("ctl", &claim("b", "rw-pvc-1", ROLE_WRITER), true);
        index.observe("ctl", &claim("a", "rw-pvc-2", ROLE_WRITER), true);
        // Seen twice (a resync): unchanged.
        index.observe("ctl", &claim("a", "rw-pvc-1", ROLE_WRITER), true);
        // The primary in the control namespace, and a claim of another role: not recorded.
        index.observe("ctl", &claim("ctl", "rw-pvc-1", ROLE_WRITER), true);
        index.observe("ctl", &claim("c", "rw-pvc-1", "reader"), true);
        assert_eq!(index.namespaces("rw-pvc-1"), vec!["a", "b"]);
        assert_eq!(index.namespaces("rw-pvc-2"), vec!["a"]);
        assert!(index.namespaces("rw-pvc-3").is_empty());
        // Deleted, and found stale on read.
        index.observe("ctl", &claim("a", "rw-pvc-1", ROLE_WRITER), false);
        index.forget("rw-pvc-1", "b");
        assert!(index.namespaces("rw-pvc-1").is_empty());
        index.observe("ctl", &claim("a", "rw-pvc-2", ROLE_WRITER), false);
        assert!(index.by_name.lock().unwrap().is_empty());
    }

    #[test]
    fn the_pod_index_holds_each_bindings_pods() {
        let index = PodIndex::default();
        index.observe(&pod("a", "p1", Some("mcb-1")), true);
        index.observe(&pod("b", "p2", Some("mcb-1")), true);
        index.observe(&pod("a", "p3", Some("mcb-2")), true);
        index.observe(&pod("a", "p4", None), true);
        // The same change seen twice (a resync) changes nothing.
        index.observe(&pod("a", "p1", Some("mcb-1")), true);
        assert_eq!(
            index.members("mcb-1"),
            vec![("a".into(), "p1".into()), ("b".into(), "p2".into())]
        );
        assert_eq!(index.members("mcb-2"), vec![("a".into(), "p3".into())]);
        assert!(index.members("mcb-3").is_empty());
        // Deleted, and found stale on read.
        index.observe(&pod("a", "p1", Some("mcb-1")), false);
        index.forget("mcb-1", "b", "p2");
        assert!(index.members("mcb-1").is_empty());
        index.observe(&pod("a", "p3", Some("mcb-2")), false);
        assert!(index.by_binding.lock().unwrap().is_empty());

        // Members stay sorted by namespace, then name, whatever order they arrive in, and a
        // removal from the middle keeps the rest.
        for (ns, name) in [
            ("b", "p0"),
            ("a", "p9"),
            ("a", "p1"),
            ("c", "p5"),
            ("a", "p5"),
        ] {
            index.observe(&pod(ns, name, Some("mcb-4")), true);
        }
        let sorted = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter().map(|(a, b)| ((*a).into(), (*b).into())).collect()
        };
        assert_eq!(
            index.members("mcb-4"),
            sorted(&[
                ("a", "p1"),
                ("a", "p5"),
                ("a", "p9"),
                ("b", "p0"),
                ("c", "p5")
            ])
        );
        index.record_step("mcb-4", "a", "p9", "u9", false);
        index.observe(&pod("a", "p5", Some("mcb-4")), false);
        assert_eq!(
            index.members("mcb-4"),
            sorted(&[("a", "p1"), ("a", "p9"), ("b", "p0"), ("c", "p5")])
        );
        assert_eq!(index.step_known("mcb-4", "a", "p9", "u9"), Some(false));
        assert_eq!(index.step_known("mcb-4", "c", "p5", "u9"), None);
    }
}
