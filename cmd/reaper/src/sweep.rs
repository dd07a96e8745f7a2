//! One sweep: read, ask the pure rules ([`warmcache_modelvolume::reaper`]), act with
//! preconditions. One paginated metadata list of the pods that read a model, then three passes:
//!
//! 1. **Bindings** of the control namespace, listed page by page: `idle-retirement` sets phase
//!    Retiring (status update with the resourceVersion read, an Event on the binding, the
//!    binding's readers listed afresh first); a Retiring or deleted binding past the retiring
//!    grace goes through `retired-binding`: every object it names is read, the earliest stage
//!    with objects left is deleted (UID preconditions, readers listed afresh before each stage),
//!    and when nothing is left the binding is deleted and its finalizer removed. A stage whose
//!    objects cannot go yet (attached, in use, terminating, a PV that would reclaim shared
//!    storage) is waited on within one budget per sweep (`stage_wait`), then left for the next
//!    sweep. Before the first deletion the primary PV is stamped with its last use (the
//!    retention clock).
//! 2. **View claims** (warmcache's, role `reader`, all namespaces, page by page), against what
//!    the bindings record, listed again after the retirements: `orphan-claim`.
//! 3. **PVs** (page by page, slimmed, with every VolumeAttachment): `orphan-view`,
//!    `abandoned-primary`, `expired-primary`, each deletion preceded by fresh reads (the claim
//!    its PV names, the binding of its model, the pods of its claim's namespace).
//! 4. **Encrypted caches' StorageClasses and key Secrets** (warmcache's encryption labels; the
//!    Secrets as metadata only, never a key), against fresh lists of every PV, every claim and
//!    the bindings, read in that order after the candidates: `orphan-encryption`. A class goes
//!    in one sweep, its Secret in a later one; each deletion is preceded by a fresh read of the
//!    binding of the cache (and, for a Secret, of its class). Nothing is listed beyond the
//!    candidates when there are none.
//!
//! API calls (the list [`crate::rbac`] grants): bindings list/get/delete/patch, bindings/status
//! update; pods list (cluster) and delete (mount holders); claims list/get/delete; PVs
//! list/get/delete/patch; VolumeAttachments list; namespaces get; Jobs and Leases get (metadata)
//! and delete; Secrets of the control namespace list (metadata) and delete; StorageClasses list
//! and delete; Events.
//!
//! Every delete carries the UID read as a precondition (volume and claim rules also the
//! resourceVersion), so an object recreated or changed in between is never deleted; NotFound is
//! success (idempotent: a crash anywhere is finished by the next sweep). With `--dry-run`
//! nothing is written: each action is printed as `would ...`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, DeleteParams, ListParams, ObjectList, Patch, PatchParams, PostParams, Preconditions,
    PropagationPolicy,
};
use kube::core::PartialObjectMeta;
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::Instrument;
use warmcache_api_modelcache::FINALIZER;
use warmcache_api_modelcache::v2beta1::{BindingPhase, ModelCacheBinding};
use warmcache_kube::{EventRecorder, Leadership};
use warmcache_modelvolume::encryption::{ROLE_ENCRYPTION, class_name};
use warmcache_modelvolume::keys::{
    CACHE_KEY_LABEL, MANAGED_BY_LABEL, MANAGED_BY_VALUE, MODEL_LABEL, ROLE_READER,
};
use warmcache_modelvolume::reaper::{
    self, BindingVerdict, ClaimVerdict, Cleanup, Config, EncryptionObject, EncryptionUses,
    EncryptionVerdict, Keep, Kind, NamespaceState, PvClass, PvFacts, PvVerdict, Rule, Seen, Target,
    ViewFacts,
};
use warmcache_modelvolume::volume_keys::{COMPLETE_LABEL, LAST_USED_ANNOTATION, VOLUME_ROLE_LABEL};

use crate::metrics::Metrics;

/// How a sweep behaves.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The rules' settings.
    pub config: Config,
    /// Print what would be done; write nothing.
    pub dry_run: bool,
    /// Objects per list page.
    pub page_size: u32,
    /// How long one retirement stage is waited on within a sweep before it is left for the next.
    pub stage_wait: Duration,
}

/// A write or read the sweep could not make; the sweep goes on with the other objects.
#[derive(Debug, thiserror::Error)]
#[error("{verb} {what}: {source}")]
pub struct SweepError {
    verb: &'static str,
    what: String,
    source: Box<dyn std::error::Error + Send + Sync>,
}

fn failed(verb: &'static str, what: impl Into<String>) -> impl FnOnce(kube::Error) -> SweepError {
    move |source| SweepError {
        verb,
        what: what.into(),
        source: Box::new(source),
    }
}

/// What a sweep did, in the order it did it.
#[derive(Debug, Default)]
pub struct Report {
    /// One line per action (or `would ...` action in a dry run).
    pub lines: Vec<String>,
    /// Actions taken (or that would be taken).
    pub actions: u64,
    /// Objects kept, by rule and reason.
    pub kept: BTreeMap<(Rule, Keep), u64>,
    /// Reads and writes that failed (the objects involved are left for the next sweep).
    pub errors: Vec<String>,
    /// Bindings looked at.
    pub bindings: u64,
    /// PVs looked at.
    pub volumes: u64,
    /// Until when this sweep may wait for retirement stages (one budget for the whole sweep).
    wait_until: Option<Instant>,
}

impl Report {
    /// The summary line.
    pub fn summary(&self) -> String {
        let kept: u64 = self.kept.values().sum();
        format!(
            "sweep: {} bindings and {} volumes looked at, {} actions, {} kept, {} errors",
            self.bindings,
            self.volumes,
            self.actions,
            kept,
            self.errors.len()
        )
    }
}

/// Runs sweeps against one cluster.
pub struct Sweeper {
    client: Client,
    settings: Settings,
    metrics: Option<Metrics>,
    recorder: Option<EventRecorder>,
    leadership: Option<Leadership>,
}

const LIVE_PODS: &str = "status.phase!=Succeeded,status.phase!=Failed";

enum Stop {
    NotLeader,
}

impl Sweeper {
    /// A sweeper; `metrics`, `recorder` and `leadership` are the runtime's when it runs as a
    /// Deployment (every write then checks leadership first).
    pub fn new(
        client: Client,
        settings: Settings,
        metrics: Option<Metrics>,
        recorder: Option<EventRecorder>,
        leadership: Option<Leadership>,
    ) -> Self {
        Self {
            client,
            settings,
            metrics,
            recorder,
            leadership,
        }
    }

    /// One sweep at `now`.
    pub async fn sweep(&self, now: Timestamp) -> Report {
        let started = Instant::now();
        let span = tracing::info_span!("reaper.sweep", dry_run = self.settings.dry_run);
        let mut report = Report {
            wait_until: Some(started + self.settings.stage_wait),
            ..Report::default()
        };
        // The clock of each pass: `now` moved on by the time the sweep has taken.
        let at = |started: Instant| {
            k8s_openapi::jiff::SignedDuration::try_from(started.elapsed())
                .ok()
                .and_then(|d| now.checked_add(d).ok())
                .unwrap_or(now)
        };
        let result = async {
            let readers = match self.reading_models().await {
                Ok(r) => r,
                Err(e) => {
                    self.error(&mut report, &e);
                    return Ok(());
                }
            };
            self.bindings(now, &readers, &mut report).await?;
            // Without every binding nothing is known to be unnamed: the claim and volume passes
            // run only on a complete list, read after the retirements.
            let known = match self.known().await {
                Ok(k) => k,
                Err(e) => {
                    self.error(&mut report, &e);
                    return Ok(());
                }
            };
            self.claims(at(started), &known, &mut report).await?;
            self.volumes(at(started), &known, &mut report).await?;
            // After the primary rules: a primary whose storage they just handed to the
            // provisioner still exists (DeleteVolume needs the key), and keeps its key.
            self.encryption(&mut report)
                .instrument(tracing::info_span!("reaper.encryption"))
                .await
        }
        .instrument(span)
        .await;
        if let Err(Stop::NotLeader) = result {
            report
                .errors
                .push("lost leadership: the sweep stopped before its next write".to_owned());
        }
        if let Some(m) = &self.metrics {
            let unix = Timestamp::now().as_second();
            #[allow(clippy::cast_precision_loss)]
            m.swept(
                report.errors.is_empty(),
                started.elapsed().as_secs_f64(),
                unix as f64,
            );
        }
        tracing::info!(
            actions = report.actions,
            errors = report.errors.len(),
            "{}",
            report.summary()
        );
        report
    }

    fn may_write(&self) -> Result<(), Stop> {
        match &self.leadership {
            Some(l) if !l.is_leader() => Err(Stop::NotLeader),
            _ => Ok(()),
        }
    }

    fn act(&self, report: &mut Report, rule: Rule, action: &'static str, line: String) {
        let line = if self.settings.dry_run {
            format!("would {line} ({})", rule.as_str())
        } else {
            if let Some(m) = &self.metrics {
                m.action(rule, action);
            }
            format!("{line} ({})", rule.as_str())
        };
        tracing::info!(rule = rule.as_str(), action, "{line}");
        report.lines.push(line);
        report.actions += 1;
    }

    fn keep(&self, report: &mut Report, rule: Rule, reason: Keep, what: &str) {
        tracing::debug!(
            rule = rule.as_str(),
            reason = reason.as_str(),
            "kept {what}: {}",
            reason.words()
        );
        if let Some(m) = &self.metrics {
            m.kept(rule, reason);
        }
        *report.kept.entry((rule, reason)).or_default() += 1;
    }

    fn error(&self, report: &mut Report, err: &SweepError) {
        tracing::warn!(error = %err, "reaper: {err}");
        report.errors.push(err.to_string());
    }

    async fn list_all<K>(
        &self,
        api: &Api<K>,
        params: ListParams,
        mut each: impl FnMut(K),
    ) -> Result<(), kube::Error>
    where
        K: Clone + DeserializeOwned + Debug,
    {
        let mut params = params.limit(self.settings.page_size);
        loop {
            let page: ObjectList<K> = api.list(&params).await?;
            let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
            page.items.into_iter().for_each(&mut each);
            match next {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(()),
            }
        }
    }

    /// [`Sweeper::list_all`], metadata only (the API server sends no `data`, no `spec`).
    async fn list_all_metadata<K>(
        &self,
        api: &Api<K>,
        params: ListParams,
        mut each: impl FnMut(PartialObjectMeta<K>),
    ) -> Result<(), kube::Error>
    where
        K: Resource + Clone + DeserializeOwned + Debug,
    {
        let mut params = params.limit(self.settings.page_size);
        loop {
            let page = api.list_metadata(&params).await?;
            let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
            page.items.into_iter().for_each(&mut each);
            match next {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(()),
            }
        }
    }

    // ---- bindings ----

    async fn bindings(
        &self,
        now: Timestamp,
        readers: &BTreeSet<String>,
        report: &mut Report,
    ) -> Result<(), Stop> {
        let control = &self.settings.config.control_namespace;
        let api: Api<ModelCacheBinding> = Api::namespaced(self.client.clone(), control);
        let mut params = ListParams::default().limit(self.settings.page_size);
        loop {
            let page = match api.list(&params).await {
                Ok(page) => page,
                Err(e) => {
                    self.error(report, &failed("list", "ModelCacheBindings")(e));
                    return Ok(());
                }
            };
            let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
            for b in page.items {
                report.bindings += 1;
                let name = b.name_any();
                let span = tracing::info_span!("reaper.binding", binding = %name);
                if let Some(annotations) = b.metadata.annotations.as_ref()
                    && let Err(err) =
                        warmcache_telemetry::set_parent_from_annotations(&span, annotations)
                {
                    tracing::debug!(%err, "no trace context on the binding");
                }
                let read =
                    readers.contains(&warmcache_api_modelcache::identity_hash(&b.spec.identity));
                self.binding(b, read, now, report).instrument(span).await?;
            }
            match next {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(()),
            }
        }
    }

    /// Live pods reading `b` (at most one is counted): by the model label, then, for a
    /// compile-cache set's binding, by the set label.
    async fn live_readers(&self, b: &ModelCacheBinding) -> Result<usize, SweepError> {
        let hash = warmcache_api_modelcache::identity_hash(&b.spec.identity);
        let pods: Api<Pod> = Api::all(self.client.clone());
        for key in [MODEL_LABEL, CACHE_KEY_LABEL] {
            let params = ListParams::default()
                .labels(&format!("{key}={hash}"))
                .fields(LIVE_PODS)
                .limit(1);
            let page = pods
                .list_metadata(&params)
                .await
                .map_err(failed("list", format!("pods reading {}", b.name_any())))?;
            if !page.items.is_empty() {
                return Ok(page.items.len());
            }
        }
        Ok(0)
    }

    /// The model hashes live pods read (`nvsnap.io/model` of every pod not Succeeded or Failed):
    /// one paginated metadata list per sweep. A binding about to be written is checked again
    /// with [`Sweeper::live_readers`].
    async fn reading_models(&self) -> Result<BTreeSet<String>, SweepError> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let mut params = ListParams::default()
            .labels(MODEL_LABEL)
            .fields(LIVE_PODS)
            .limit(self.settings.page_size);
        let mut out = BTreeSet::new();
        loop {
            let page = pods
                .list_metadata(&params)
                .await
                .map_err(failed("list", "pods reading a model"))?;
            // A pod with a compile-cache set carries the model label too: one list finds both.
            for labels in page.items.iter().filter_map(|p| p.metadata.labels.as_ref()) {
                for key in [MODEL_LABEL, CACHE_KEY_LABEL] {
                    if let Some(hash) = labels.get(key) {
                        out.insert(hash.clone());
                    }
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(out),
            }
        }
    }

    /// What every binding records, listed afresh page by page.
    async fn known(&self) -> Result<Known, SweepError> {
        let api: Api<ModelCacheBinding> =
            Api::namespaced(self.client.clone(), &self.settings.config.control_namespace);
        let mut known = Known::default();
        self.list_all(&api, ListParams::default(), |b| {
            if let Some(realized) = b.status.as_ref().and_then(|s| s.realized.as_ref()) {
                if let Some(pv) = &realized.bound_persistent_volume_name {
                    known.primaries.insert(pv.clone());
                }
                for v in &realized.views {
                    known
                        .views
                        .insert((v.namespace.clone(), v.persistent_volume_claim_name.clone()));
                }
            }
        })
        .await
        .map_err(failed("list", "ModelCacheBindings"))?;
        Ok(known)
    }

    async fn binding(
        &self,
        b: ModelCacheBinding,
        read: bool,
        now: Timestamp,
        report: &mut Report,
    ) -> Result<(), Stop> {
        let name = b.name_any();
        let config = &self.settings.config;
        let what = format!("ModelCacheBinding {name}");
        match reaper::binding_verdict(&b, usize::from(read), now, config) {
            BindingVerdict::Keep(rule, reason) => {
                self.keep(report, rule, reason, &what);
                Ok(())
            }
            BindingVerdict::Retire => {
                // Afresh, right before the write: a pod admitted since the sweep's pod list.
                match self.live_readers(&b).await {
                    Ok(0) => {}
                    Ok(_) => {
                        self.keep(report, Rule::IdleRetirement, Keep::Referenced, &what);
                        return Ok(());
                    }
                    Err(e) => {
                        self.error(report, &e);
                        return Ok(());
                    }
                }
                let since = b
                    .status
                    .as_ref()
                    .and_then(|s| s.unreferenced_since.as_ref())
                    .map(|t| t.0.to_string())
                    .unwrap_or_default();
                self.act(
                    report,
                    Rule::IdleRetirement,
                    "retire",
                    format!(
                        "retire {what}: unreferenced since {since}, idle period {}s",
                        config.idle_seconds
                    ),
                );
                if self.settings.dry_run {
                    self.print_cleanup(&b, report).await;
                    return Ok(());
                }
                self.may_write()?;
                let retired = match self.retire(&b).await {
                    Ok(retired) => retired,
                    Err(e) => {
                        self.error(report, &e);
                        return Ok(());
                    }
                };
                // The second phase waits for the retiring grace (the next sweep, unless it is 0).
                match reaper::binding_verdict(&retired, 0, Timestamp::now(), config) {
                    BindingVerdict::Cleanup => self.cleanup(retired, report).await,
                    BindingVerdict::Keep(rule, reason) => {
                        self.keep(report, rule, reason, &what);
                        Ok(())
                    }
                    BindingVerdict::Retire => Ok(()),
                }
            }
            BindingVerdict::Cleanup => {
                if self.settings.dry_run {
                    self.print_cleanup(&b, report).await;
                    return Ok(());
                }
                self.cleanup(b, report).await
            }
        }
    }

    async fn retire(&self, b: &ModelCacheBinding) -> Result<ModelCacheBinding, SweepError> {
        let name = b.name_any();
        let api: Api<ModelCacheBinding> =
            Api::namespaced(self.client.clone(), &self.settings.config.control_namespace);
        let mut next = b.clone();
        let status = next.status.get_or_insert_with(Default::default);
        status.phase = Some(BindingPhase::Retiring);
        status.last_phase_transition_time = Some(Time(Timestamp::now()));
        // A PUT with the resourceVersion read: a reference recorded since then is a conflict,
        // and the binding is looked at again next sweep.
        let retired = api
            .replace_status(&name, &PostParams::default(), &next)
            .await
            .map_err(failed("retire", format!("ModelCacheBinding {name}")))?;
        if let Some(r) = &self.recorder {
            let note = format!(
                "no request reference and no reading pod for longer than the idle period ({}s): Retiring; the reaper deletes what the binding names, its complete data is kept for the retention",
                self.settings.config.idle_seconds
            );
            r.normal(&retired, "Retiring", "Retire", Some(&note)).await;
        }
        Ok(retired)
    }

    async fn observe<K>(&self, api: Api<K>, binding: &str, name: &str) -> Result<Seen, kube::Error>
    where
        K: Resource + Clone + DeserializeOwned + Debug,
    {
        Ok(match api.get_metadata_opt(name).await? {
            None => Seen::Gone,
            Some(meta) => present(&meta.metadata, binding, None),
        })
    }

    /// Why deleting `claim` now could cost data: its PV's reclaim policy is not Retain (the PV
    /// controller would reclaim the storage) where the storage is shared (a view) or complete (a
    /// primary).
    async fn reclaim_risk(
        &self,
        kind: Kind,
        claim: &PersistentVolumeClaim,
    ) -> Result<Option<Keep>, kube::Error> {
        let Some(pv) = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()) else {
            return Ok(None);
        };
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        let Some(pv) = api.get_opt(pv).await? else {
            return Ok(None);
        };
        let retained = pv
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
            == Some(warmcache_modelvolume::view::RETAIN);
        let complete = pv.labels().get(COMPLETE_LABEL).map(String::as_str) == Some("true");
        let at_risk = !retained && (kind != Kind::PrimaryClaim || complete);
        Ok(at_risk.then_some(Keep::NotRetain))
    }

    async fn observe_target(
        &self,
        t: &Target,
        binding: &str,
        attached: &BTreeSet<String>,
    ) -> Result<Seen, SweepError> {
        let c = self.client.clone();
        let ns = t.namespace.as_deref().unwrap_or_default();
        let seen = match t.kind {
            Kind::ReaderClaim | Kind::WriterClaim | Kind::PrimaryClaim => {
                let api: Api<PersistentVolumeClaim> = Api::namespaced(c, ns);
                match api.get_opt(&t.name).await {
                    Ok(None) => Ok(Seen::Gone),
                    Ok(Some(claim)) => {
                        let users = self
                            .claim_users(ns, &t.name)
                            .await
                            .map_err(failed("list", format!("pods of namespace {ns}")))?;
                        let mut busy = users.iter().any(|u| !u.holder).then_some(Keep::InUse);
                        if busy.is_none() {
                            busy = self
                                .reclaim_risk(t.kind, &claim)
                                .await
                                .map_err(failed("get", format!("the PV of {t}")))?;
                        }
                        Ok(present(&claim.metadata, binding, busy))
                    }
                    Err(e) => Err(e),
                }
            }
            Kind::ReaderVolume | Kind::WriterVolume => {
                let api: Api<PersistentVolume> = Api::all(c);
                match api.get_metadata_opt(&t.name).await {
                    Ok(None) => Ok(Seen::Gone),
                    Ok(Some(meta)) => {
                        let busy = attached.contains(&t.name).then_some(Keep::Attached);
                        Ok(present(&meta.metadata, binding, busy))
                    }
                    Err(e) => Err(e),
                }
            }
            Kind::Job => {
                self.observe(Api::<Job>::namespaced(c, ns), binding, &t.name)
                    .await
            }
            Kind::Lease => {
                self.observe(Api::<Lease>::namespaced(c, ns), binding, &t.name)
                    .await
            }
        };
        seen.map_err(failed("get", t.to_string()))
    }

    async fn delete_target(&self, t: &Target, uid: &str) -> Result<(), SweepError> {
        let c = self.client.clone();
        let ns = t.namespace.as_deref().unwrap_or_default();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            propagation_policy: Some(PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        let result = match t.kind {
            Kind::ReaderClaim | Kind::WriterClaim | Kind::PrimaryClaim => {
                delete(
                    Api::<PersistentVolumeClaim>::namespaced(c, ns),
                    &t.name,
                    &params,
                )
                .await
            }
            Kind::ReaderVolume | Kind::WriterVolume => {
                delete(Api::<PersistentVolume>::all(c), &t.name, &params).await
            }
            Kind::Job => delete(Api::<Job>::namespaced(c, ns), &t.name, &params).await,
            Kind::Lease => delete(Api::<Lease>::namespaced(c, ns), &t.name, &params).await,
        };
        result.map_err(failed("delete", t.to_string()))
    }

    async fn attached_volumes(&self) -> Result<BTreeSet<String>, SweepError> {
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        let mut out = BTreeSet::new();
        self.list_all(&api, ListParams::default(), |va| {
            if let Some(pv) = va.spec.source.persistent_volume_name {
                out.insert(pv);
            }
        })
        .await
        .map_err(failed("list", "VolumeAttachments"))?;
        Ok(out)
    }

    async fn observe_all(
        &self,
        b: &ModelCacheBinding,
        targets: &[Target],
    ) -> Result<Vec<(Target, Seen)>, SweepError> {
        let attached = self.attached_volumes().await?;
        let name = b.name_any();
        let mut seen = Vec::with_capacity(targets.len());
        for t in targets {
            seen.push((t.clone(), self.observe_target(t, &name, &attached).await?));
        }
        Ok(seen)
    }

    async fn print_cleanup(&self, b: &ModelCacheBinding, report: &mut Report) {
        let name = b.name_any();
        let seen = match self.observe_all(b, &reaper::named_resources(b)).await {
            Ok(seen) => seen,
            Err(e) => return self.error(report, &e),
        };
        for (t, s) in &seen {
            match s {
                Seen::Present { ours: true, .. } => self.act(
                    report,
                    Rule::RetiredBinding,
                    "delete",
                    format!("delete {t}, named by ModelCacheBinding {name}"),
                ),
                Seen::Present { ours: false, .. } => {
                    self.keep(report, Rule::RetiredBinding, Keep::NotOurs, &t.to_string());
                }
                Seen::Gone => {}
            }
        }
        self.act(
            report,
            Rule::RetiredBinding,
            "finalize",
            format!("delete ModelCacheBinding {name} and remove its finalizer once that is gone"),
        );
    }

    async fn stamp_last_use(&self, b: &ModelCacheBinding) -> Result<(), SweepError> {
        let status = b.status.as_ref();
        let Some(pv) = status
            .and_then(|s| s.realized.as_ref())
            .and_then(|r| r.bound_persistent_volume_name.as_deref())
        else {
            return Ok(());
        };
        let used = status
            .and_then(|s| s.unreferenced_since.as_ref())
            .map_or_else(Timestamp::now, |t| t.0);
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        let Some(meta) = api
            .get_metadata_opt(pv)
            .await
            .map_err(failed("get", format!("PersistentVolume {pv}")))?
        else {
            return Ok(());
        };
        let stored = meta
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LAST_USED_ANNOTATION))
            .and_then(|t| t.parse::<Timestamp>().ok());
        if stored.is_some_and(|s| s >= used) {
            return Ok(());
        }
        let patch = serde_json::json!({
            "metadata": {
                "resourceVersion": meta.metadata.resource_version,
                "annotations": {LAST_USED_ANNOTATION: used.to_string()},
            }
        });
        api.patch(pv, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(failed("stamp", format!("PersistentVolume {pv}")))?;
        Ok(())
    }

    async fn cleanup(&self, b: ModelCacheBinding, report: &mut Report) -> Result<(), Stop> {
        let name = b.name_any();
        self.may_write()?;
        if let Err(e) = self.stamp_last_use(&b).await {
            // Without the stamp the retention would count from the PV's creation: stop here.
            self.error(report, &e);
            return Ok(());
        }
        let targets = reaper::named_resources(&b);
        let mut reported = BTreeSet::new();
        loop {
            let seen = match self.observe_all(&b, &targets).await {
                Ok(seen) => seen,
                Err(e) => {
                    self.error(report, &e);
                    return Ok(());
                }
            };
            for (t, s) in &seen {
                if matches!(s, Seen::Present { ours: false, .. }) && reported.insert(t.clone()) {
                    self.keep(report, Rule::RetiredBinding, Keep::NotOurs, &t.to_string());
                }
            }
            match reaper::cleanup_step(&seen) {
                Cleanup::Delete(batch) => {
                    // A pod admitted since the binding was read keeps it: looked at afresh
                    // before every stage.
                    match self.live_readers(&b).await {
                        Ok(0) => {}
                        Ok(_) => {
                            self.keep(
                                report,
                                Rule::RetiredBinding,
                                Keep::Referenced,
                                &format!("ModelCacheBinding {name}"),
                            );
                            return Ok(());
                        }
                        Err(e) => {
                            self.error(report, &e);
                            return Ok(());
                        }
                    }
                    self.may_write()?;
                    for (t, uid) in batch {
                        match self.delete_target(&t, &uid).await {
                            Ok(()) => self.act(
                                report,
                                Rule::RetiredBinding,
                                "delete",
                                format!("deleted {t}, named by ModelCacheBinding {name}"),
                            ),
                            Err(e) => {
                                self.error(report, &e);
                                return Ok(());
                            }
                        }
                    }
                }
                Cleanup::Wait(t, reason) => {
                    // One waiting budget for the whole sweep: a stuck binding leaves the others
                    // (and the later passes) their turn, and is looked at again next sweep.
                    if report.wait_until.is_none_or(|d| Instant::now() >= d) {
                        self.keep(report, Rule::RetiredBinding, reason, &t.to_string());
                        tracing::info!(
                            binding = %name,
                            "retirement of {name} waits for {t}: {}",
                            reason.words()
                        );
                        return Ok(());
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Cleanup::Finish => {
                    self.may_write()?;
                    if let Err(e) = self.finish(&b).await {
                        self.error(report, &e);
                    } else {
                        self.act(
                            report,
                            Rule::RetiredBinding,
                            "finalize",
                            format!(
                                "deleted ModelCacheBinding {name}: everything it names is gone"
                            ),
                        );
                    }
                    return Ok(());
                }
            }
        }
    }

    /// Deletes the binding (UID precondition), then removes warmcache's finalizer with a JSON
    /// patch that tests the UID and the finalizers read: never a successor's finalizer, never a
    /// finalizer another controller added meanwhile (a failed test is left for the next sweep).
    async fn finish(&self, b: &ModelCacheBinding) -> Result<(), SweepError> {
        let name = b.name_any();
        let what = format!("ModelCacheBinding {name}");
        let api: Api<ModelCacheBinding> =
            Api::namespaced(self.client.clone(), &self.settings.config.control_namespace);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: b.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        delete(api.clone(), &name, &params)
            .await
            .map_err(failed("delete", what.clone()))?;
        let Some(current) = api
            .get_opt(&name)
            .await
            .map_err(failed("get", what.clone()))?
        else {
            return Ok(());
        };
        if current.metadata.uid != b.metadata.uid {
            return Ok(());
        }
        let finalizers = current.metadata.finalizers.clone().unwrap_or_default();
        if !finalizers.iter().any(|f| f == FINALIZER) {
            return Ok(());
        }
        let kept: Vec<&String> = finalizers.iter().filter(|f| *f != FINALIZER).collect();
        let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
            {"op": "test", "path": "/metadata/uid", "value": current.metadata.uid},
            {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
            {"op": "replace", "path": "/metadata/finalizers", "value": kept},
        ]))
        .map_err(|e| SweepError {
            verb: "build the finalizer patch of",
            what: what.clone(),
            source: Box::new(e),
        })?;
        match api
            .patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if warmcache_kube::is_not_found(&e) => Ok(()),
            Err(e) => Err(SweepError {
                verb: "remove the finalizer of",
                what,
                source: Box::new(e),
            }),
        }
    }

    // ---- view claims ----

    async fn claim_users(&self, namespace: &str, claim: &str) -> Result<Vec<PodUse>, kube::Error> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let mut users = Vec::new();
        self.list_all(&api, ListParams::default().fields(LIVE_PODS), |p| {
            if reaper::claims_of(&p).any(|c| c == claim) {
                users.push(PodUse {
                    holder: reaper::is_mount_holder(&p),
                    live: reaper::is_live(&p),
                    name: p.name_any(),
                    uid: p.metadata.uid.clone().unwrap_or_default(),
                });
            }
        })
        .await?;
        users.retain(|u| u.live);
        Ok(users)
    }

    async fn claims(&self, now: Timestamp, known: &Known, report: &mut Report) -> Result<(), Stop> {
        let api: Api<PersistentVolumeClaim> = Api::all(self.client.clone());
        let selector =
            format!("{VOLUME_ROLE_LABEL}={ROLE_READER},{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}");
        let mut candidates = Vec::new();
        let config = &self.settings.config;
        // The verdict without users first: only claims old enough need their namespace's pods.
        let listed = self
            .list_all(&api, ListParams::default().labels(&selector), |claim| {
                let recorded = known.records(&claim);
                match reaper::claim_verdict(&claim, recorded, &[], now, config) {
                    ClaimVerdict::Delete => candidates.push(claim),
                    ClaimVerdict::Keep(reason) => self.keep(
                        report,
                        Rule::OrphanClaim,
                        reason,
                        &format!(
                            "PersistentVolumeClaim {}/{}",
                            claim.namespace().unwrap_or_default(),
                            claim.name_any()
                        ),
                    ),
                    ClaimVerdict::Ignore => {}
                }
            })
            .await;
        if let Err(e) = listed {
            self.error(report, &failed("list", "view claims")(e));
            return Ok(());
        }
        for claim in candidates {
            let ns = claim.namespace().unwrap_or_default();
            let name = claim.name_any();
            let what = format!("PersistentVolumeClaim {ns}/{name}");
            let users = match self.claim_users(&ns, &name).await {
                Ok(u) => u,
                Err(e) => {
                    self.error(
                        report,
                        &failed("list", format!("pods of namespace {ns}"))(e),
                    );
                    continue;
                }
            };
            let pods: Vec<Pod> = users.iter().map(PodUse::as_pod).collect();
            let refs: Vec<&Pod> = pods.iter().collect();
            match reaper::claim_verdict(&claim, known.records(&claim), &refs, now, config) {
                ClaimVerdict::Delete => {}
                ClaimVerdict::Keep(reason) => {
                    self.keep(report, Rule::OrphanClaim, reason, &what);
                    continue;
                }
                ClaimVerdict::Ignore => continue,
            }
            match self.reclaim_risk(Kind::ReaderClaim, &claim).await {
                Ok(None) => {}
                Ok(Some(reason)) => {
                    self.keep(report, Rule::OrphanClaim, reason, &what);
                    continue;
                }
                Err(e) => {
                    self.error(report, &failed("get", format!("the PV of {what}"))(e));
                    continue;
                }
            }
            let holders: Vec<&PodUse> = users.iter().filter(|u| u.holder).collect();
            self.act(
                report,
                Rule::OrphanClaim,
                "delete",
                format!(
                    "delete {what}: no pod but {} mount holder(s) uses it",
                    holders.len()
                ),
            );
            if self.settings.dry_run {
                continue;
            }
            self.may_write()?;
            match delete_exact(
                api_ns::<PersistentVolumeClaim>(&self.client, &ns),
                &name,
                &claim.metadata,
            )
            .await
            {
                Ok(true) => {}
                Ok(false) => {
                    self.keep(report, Rule::OrphanClaim, Keep::Changed, &what);
                    continue;
                }
                Err(e) => {
                    self.error(report, &failed("delete", what.clone())(e));
                    continue;
                }
            }
            for h in holders {
                let pod = format!("Pod {ns}/{}", h.name);
                match delete(api_ns::<Pod>(&self.client, &ns), &h.name, &with_uid(&h.uid)).await {
                    Ok(()) => self.act(
                        report,
                        Rule::OrphanClaim,
                        "delete",
                        format!("deleted mount holder {pod} of {what}"),
                    ),
                    Err(e) => self.error(report, &failed("delete", pod)(e)),
                }
            }
        }
        Ok(())
    }

    // ---- volumes ----

    async fn namespace_state(
        &self,
        cache: &mut BTreeMap<String, NamespaceState>,
        namespace: &str,
    ) -> NamespaceState {
        if let Some(state) = cache.get(namespace) {
            return *state;
        }
        let api: Api<Namespace> = Api::all(self.client.clone());
        let state = match api.get_metadata(namespace).await {
            Ok(_) => NamespaceState::Live,
            Err(e) if warmcache_kube::is_not_found(&e) => NamespaceState::Gone,
            Err(e) => {
                tracing::info!(namespace, error = %e, "namespace unreadable: its volumes are kept");
                NamespaceState::Unknown
            }
        };
        cache.insert(namespace.to_owned(), state);
        state
    }

    /// Whether the claim `pv` names is gone, read afresh: NotFound, or a claim of that name
    /// with another UID. Anything else (the claim is there, the read failed) is not proof.
    async fn claim_gone(&self, pv: &PersistentVolume) -> Result<bool, SweepError> {
        let Some(claim) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
            return Ok(false);
        };
        let (Some(ns), Some(name), Some(uid)) = (&claim.namespace, &claim.name, &claim.uid) else {
            return Ok(false);
        };
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
        let current = api
            .get_metadata_opt(name)
            .await
            .map_err(failed("get", format!("PersistentVolumeClaim {ns}/{name}")))?;
        Ok(current.is_none_or(|c| c.metadata.uid.as_ref() != Some(uid)))
    }

    /// Whether a binding of the model a complete primary holds exists, read afresh (a binding
    /// adopting it may not have recorded it yet).
    async fn binding_exists(&self, pv: &PersistentVolume) -> Result<bool, SweepError> {
        let Some(hash) = pv.labels().get(MODEL_LABEL) else {
            return Ok(false);
        };
        self.binding_of_cache_exists(hash).await
    }

    /// Whether the binding of the cache `hash` (`model-cache-<hash>`) exists, read afresh.
    async fn binding_of_cache_exists(&self, hash: &str) -> Result<bool, SweepError> {
        let name = format!(
            "{}{hash}",
            warmcache_api_modelcache::names::BINDING_NAME_PREFIX
        );
        let api: Api<ModelCacheBinding> =
            Api::namespaced(self.client.clone(), &self.settings.config.control_namespace);
        api.get_metadata_opt(&name)
            .await
            .map(|b| b.is_some())
            .map_err(failed("get", format!("ModelCacheBinding {name}")))
    }

    async fn volumes(
        &self,
        now: Timestamp,
        known: &Known,
        report: &mut Report,
    ) -> Result<(), Stop> {
        let attached = match self.attached_volumes().await {
            Ok(a) => a,
            Err(e) => {
                self.error(report, &e);
                return Ok(());
            }
        };
        let control = self.settings.config.control_namespace.clone();
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        // Only what the rules need is kept from each page: the candidates (slimmed to the fields
        // the rules read), and each view's facts by the primary it was derived from.
        let mut candidates: Vec<PersistentVolume> = Vec::new();
        let mut views_of: BTreeMap<String, Vec<ListedView>> = BTreeMap::new();
        let mut looked = 0_u64;
        let listed = self
            .list_all(&api, ListParams::default(), |pv| {
                looked += 1;
                let class = reaper::classify(&pv, &control);
                if class == PvClass::Other {
                    return;
                }
                let pv = slim(pv);
                if class == PvClass::View
                    && let Some(source) = reaper::source_of(&pv)
                {
                    views_of
                        .entry(source.to_owned())
                        .or_default()
                        .push(ListedView {
                            name: pv.name_any(),
                            released: reaper::looks_released(&pv),
                            namespace: reaper::claim_namespace(&pv).map(str::to_owned),
                            meta: ObjectMeta {
                                uid: pv.metadata.uid.clone(),
                                resource_version: pv.metadata.resource_version.clone(),
                                ..ObjectMeta::default()
                            },
                        });
                }
                candidates.push(pv);
            })
            .await;
        report.volumes += looked;
        if let Err(e) = listed {
            self.error(report, &failed("list", "PersistentVolumes")(e));
            return Ok(());
        }
        let mut namespaces = BTreeMap::new();
        // Views an expired primary took with it: not looked at again.
        let mut handled: BTreeSet<String> = BTreeSet::new();
        for pv in candidates {
            let name = pv.name_any();
            if handled.contains(&name) {
                continue;
            }
            let what = format!("PersistentVolume {name}");
            let namespace = match reaper::claim_namespace(&pv) {
                Some(ns) => self.namespace_state(&mut namespaces, ns).await,
                None => NamespaceState::Live,
            };
            let mut views = Vec::new();
            let listed_views = views_of.remove(&name).unwrap_or_default();
            for view in &listed_views {
                let state = match &view.namespace {
                    Some(ns) => self.namespace_state(&mut namespaces, ns).await,
                    None => NamespaceState::Live,
                };
                views.push(ViewFacts {
                    name: view.name.clone(),
                    attached: attached.contains(&view.name),
                    released: view.released,
                    namespace: state,
                });
            }
            let mut facts = PvFacts {
                attached: attached.contains(&name),
                claim_in_use: false,
                claim_gone: true,
                namespace,
                named_by_binding: known.primaries.contains(&name),
                views,
            };
            let config = &self.settings.config;
            let mut verdict = reaper::pv_verdict(&pv, &facts, now, config);
            // Before any deletion, proof read afresh: the claim it was bound to is gone, no
            // binding of its model exists (a complete primary), no pod uses its claim.
            if matches!(
                verdict,
                PvVerdict::DeleteObject(_) | PvVerdict::Reclaim { .. }
            ) {
                let fresh = async {
                    if reaper::looks_released(&pv) {
                        facts.claim_gone = self.claim_gone(&pv).await?;
                    }
                    if reaper::classify(&pv, &control) == (PvClass::Primary { complete: true }) {
                        facts.named_by_binding |= self.binding_exists(&pv).await?;
                    }
                    if facts.namespace != NamespaceState::Gone
                        && let Some(c) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref())
                        && let (Some(cns), Some(cname)) = (&c.namespace, &c.name)
                    {
                        facts.claim_in_use = !self
                            .claim_users(cns, cname)
                            .await
                            .map_err(failed("list", format!("pods of namespace {cns}")))?
                            .is_empty();
                    }
                    Ok::<(), SweepError>(())
                };
                if let Err(e) = fresh.await {
                    self.error(report, &e);
                    continue;
                }
                verdict = reaper::pv_verdict(&pv, &facts, now, config);
            }
            match verdict {
                PvVerdict::Ignore => {}
                PvVerdict::Keep(rule, reason) => self.keep(report, rule, reason, &what),
                PvVerdict::DeleteObject(rule) => {
                    self.act(
                        report,
                        rule,
                        "delete",
                        format!("delete {what} (object only; Retain)"),
                    );
                    if self.settings.dry_run {
                        continue;
                    }
                    self.may_write()?;
                    match delete_exact(api.clone(), &name, &pv.metadata).await {
                        Ok(true) => {}
                        Ok(false) => self.keep(report, rule, Keep::Changed, &what),
                        Err(e) => self.error(report, &failed("delete", what)(e)),
                    }
                }
                PvVerdict::Reclaim { rule, views } => {
                    let views: Vec<&ListedView> = listed_views
                        .iter()
                        .filter(|v| views.contains(&v.name))
                        .collect();
                    handled.extend(views.iter().map(|v| v.name.clone()));
                    self.reclaim(&pv, rule, &views, report).await?;
                }
            }
        }
        Ok(())
    }

    async fn reclaim(
        &self,
        pv: &PersistentVolume,
        rule: Rule,
        views: &[&ListedView],
        report: &mut Report,
    ) -> Result<(), Stop> {
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        let name = pv.name_any();
        for view in views {
            let what = format!("PersistentVolume {}", view.name);
            self.act(
                report,
                rule,
                "delete",
                format!("delete {what}, a view of {name} (object only)"),
            );
            if self.settings.dry_run {
                continue;
            }
            self.may_write()?;
            // With the UID and resourceVersion the decision read: a view bound since then stays,
            // and the primary with it. The primary goes only after every view.
            match delete_exact(api.clone(), &view.name, &view.meta).await {
                Ok(true) => {}
                Ok(false) => {
                    self.keep(report, rule, Keep::Changed, &what);
                    return Ok(());
                }
                Err(e) => {
                    self.error(report, &failed("delete", what)(e));
                    return Ok(());
                }
            }
        }
        self.act(
            report,
            rule,
            "reclaim",
            format!("set the reclaim policy of PersistentVolume {name} to Delete: the provisioner deletes it and its storage"),
        );
        if self.settings.dry_run {
            return Ok(());
        }
        self.may_write()?;
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": pv.metadata.resource_version},
            "spec": {"persistentVolumeReclaimPolicy": "Delete"},
        });
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(e) if warmcache_kube::is_conflict(&e) => {
                self.keep(
                    report,
                    rule,
                    Keep::Changed,
                    &format!("PersistentVolume {name}"),
                );
            }
            Err(e) => self.error(
                report,
                &failed("reclaim", format!("PersistentVolume {name}"))(e),
            ),
        }
        Ok(())
    }
    // ---- encrypted caches' Secrets and classes ----

    /// `orphan-encryption`: the encrypted StorageClasses and key Secrets of the control
    /// namespace's caches (warmcache's encryption labels), against fresh lists of what may
    /// need them. The candidates are listed first, then every PV, every claim and the bindings,
    /// in that order: whatever provisions on a class, or copies a volume naming a Secret, has a
    /// binding (or a claim, or a PV) that exists before it and is read after it. Every list must
    /// succeed: a failed read is never proof that nothing uses them.
    async fn encryption(&self, report: &mut Report) -> Result<(), Stop> {
        let config = &self.settings.config;
        let control = config.control_namespace.as_str();
        let selector =
            format!("{VOLUME_ROLE_LABEL}={ROLE_ENCRYPTION},{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}");
        let mut uses = EncryptionUses::default();
        let classes_api: Api<StorageClass> = Api::all(self.client.clone());
        let mut classes = Vec::new();
        let listed = self
            .list_all(
                &classes_api,
                ListParams::default().labels(&selector),
                |class| {
                    // Every listed class keeps its Secret, also one the rule ignores.
                    uses.add_class(&class.name_any());
                    if reaper::encryption_hash(EncryptionObject::StorageClass(&class), config)
                        .is_some()
                    {
                        classes.push(class);
                    }
                },
            )
            .await;
        if let Err(e) = listed {
            self.error(report, &failed("list", "encrypted StorageClasses")(e));
            return Ok(());
        }
        let secrets_api: Api<Secret> = Api::namespaced(self.client.clone(), control);
        let mut secrets: Vec<ObjectMeta> = Vec::new();
        let listed = self
            .list_all_metadata(
                &secrets_api,
                ListParams::default().labels(&selector),
                |secret| {
                    if reaper::encryption_hash(EncryptionObject::Secret(&secret.metadata), config)
                        .is_some()
                    {
                        secrets.push(secret.metadata);
                    }
                },
            )
            .await;
        if let Err(e) = listed {
            self.error(
                report,
                &failed("list", format!("encryption Secrets of namespace {control}"))(e),
            );
            return Ok(());
        }
        if classes.is_empty() && secrets.is_empty() {
            return Ok(());
        }
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let claims: Api<PersistentVolumeClaim> = Api::all(self.client.clone());
        let bindings: Api<ModelCacheBinding> = Api::namespaced(self.client.clone(), control);
        let read = async {
            self.list_all(&pvs, ListParams::default(), |pv| uses.add_volume(&pv))
                .await
                .map_err(failed("list", "PersistentVolumes"))?;
            self.list_all(&claims, ListParams::default(), |c| uses.add_claim(&c))
                .await
                .map_err(failed("list", "PersistentVolumeClaims"))?;
            self.list_all(&bindings, ListParams::default(), |b| uses.add_binding(&b))
                .await
                .map_err(failed("list", "ModelCacheBindings"))?;
            Ok::<(), SweepError>(())
        };
        if let Err(e) = read.await {
            self.error(report, &e);
            return Ok(());
        }
        // The classes first: a Secret whose class was listed (deleted now or not) is kept this
        // sweep and looked at again next sweep, from fresh lists.
        for class in &classes {
            self.encryption_object(
                EncryptionObject::StorageClass(class),
                &uses,
                classes_api.clone(),
                report,
            )
            .await?;
        }
        for secret in &secrets {
            self.encryption_object(
                EncryptionObject::Secret(secret),
                &uses,
                classes_api.clone(),
                report,
            )
            .await?;
        }
        Ok(())
    }

    /// The `orphan-encryption` verdict for one object, acted on: before a deletion the binding
    /// of its cache is read afresh (and, for a Secret, its class by name, with any labels); the
    /// delete carries the UID and resourceVersion listed.
    async fn encryption_object(
        &self,
        object: EncryptionObject<'_>,
        uses: &EncryptionUses,
        classes: Api<StorageClass>,
        report: &mut Report,
    ) -> Result<(), Stop> {
        let config = &self.settings.config;
        let control = config.control_namespace.as_str();
        let rule = Rule::OrphanEncryption;
        let Some(hash) = reaper::encryption_hash(object, config) else {
            return Ok(());
        };
        let what = object.describe();
        let mut facts = uses.facts(object, hash, control);
        let mut verdict = reaper::encryption_verdict(object, &facts, config);
        if verdict == EncryptionVerdict::Delete {
            let fresh = async {
                facts.binding |= self.binding_of_cache_exists(hash).await?;
                if matches!(object, EncryptionObject::Secret(_)) {
                    let class = class_name(hash);
                    let params = ListParams::default()
                        .fields(&format!("metadata.name={class}"))
                        .limit(1);
                    let found = classes
                        .list_metadata(&params)
                        .await
                        .map_err(failed("list", format!("StorageClass {class}")))?;
                    facts.class_exists |= !found.items.is_empty();
                }
                Ok::<(), SweepError>(())
            };
            if let Err(e) = fresh.await {
                self.error(report, &e);
                return Ok(());
            }
            verdict = reaper::encryption_verdict(object, &facts, config);
        }
        match verdict {
            EncryptionVerdict::Ignore => Ok(()),
            EncryptionVerdict::Keep(reason) => {
                self.keep(report, rule, reason, &what);
                Ok(())
            }
            EncryptionVerdict::Delete => {
                let why = match object {
                    EncryptionObject::StorageClass(_) => {
                        "no binding of its cache, no volume and no claim uses it"
                    }
                    EncryptionObject::Secret(_) => {
                        "no binding of its cache, no volume, no claim and no StorageClass uses it"
                    }
                };
                self.act(report, rule, "delete", format!("delete {what}: {why}"));
                if self.settings.dry_run {
                    return Ok(());
                }
                self.may_write()?;
                let name = object.meta().name.clone().unwrap_or_default();
                let deleted = match object {
                    EncryptionObject::StorageClass(class) => {
                        delete_exact(classes, &name, &class.metadata).await
                    }
                    EncryptionObject::Secret(meta) => {
                        delete_secret_exact(&self.client, control, &name, meta).await
                    }
                };
                match deleted {
                    Ok(true) => {}
                    Ok(false) => self.keep(report, rule, Keep::Changed, &what),
                    Err(e) => self.error(report, &failed("delete", what)(e)),
                }
                Ok(())
            }
        }
    }
}

/// `pv` with only what the volume rules read (names, labels and annotations, times, claim
/// reference, reclaim policy, CSI driver, handle and read-only flag, phase and its last
/// change): a sweep keeps one per candidate.
fn slim(pv: PersistentVolume) -> PersistentVolume {
    let spec = pv
        .spec
        .map(|s| k8s_openapi::api::core::v1::PersistentVolumeSpec {
            claim_ref: s
                .claim_ref
                .map(|c| k8s_openapi::api::core::v1::ObjectReference {
                    namespace: c.namespace,
                    name: c.name,
                    uid: c.uid,
                    ..Default::default()
                }),
            persistent_volume_reclaim_policy: s.persistent_volume_reclaim_policy,
            csi: s
                .csi
                .map(|c| k8s_openapi::api::core::v1::CSIPersistentVolumeSource {
                    driver: c.driver,
                    volume_handle: c.volume_handle,
                    read_only: c.read_only,
                    ..Default::default()
                }),
            ..Default::default()
        });
    PersistentVolume {
        metadata: ObjectMeta {
            name: pv.metadata.name,
            uid: pv.metadata.uid,
            resource_version: pv.metadata.resource_version,
            labels: pv.metadata.labels,
            annotations: pv.metadata.annotations.map(|mut a| {
                a.retain(|k, _| {
                    k == LAST_USED_ANNOTATION || k == reaper::PROVISIONED_BY_ANNOTATION
                });
                a
            }),
            creation_timestamp: pv.metadata.creation_timestamp,
            deletion_timestamp: pv.metadata.deletion_timestamp,
            ..ObjectMeta::default()
        },
        spec,
        status: pv
            .status
            .map(|s| k8s_openapi::api::core::v1::PersistentVolumeStatus {
                phase: s.phase,
                last_phase_transition_time: s.last_phase_transition_time,
                ..Default::default()
            }),
    }
}

/// What the bindings record, collected page by page: the names the claim and volume rules must
/// not treat as unnamed.
#[derive(Debug, Default)]
struct Known {
    /// `status.realized.boundPersistentVolumeName` of every binding.
    primaries: BTreeSet<String>,
    /// `status.realized.views` of every binding, as (namespace, claim).
    views: BTreeSet<(String, String)>,
}

impl Known {
    fn records(&self, claim: &PersistentVolumeClaim) -> bool {
        self.views
            .contains(&(claim.namespace().unwrap_or_default(), claim.name_any()))
    }
}

/// A view PV (read-only or writer) as listed: what the primary rules need of it.
#[derive(Clone, Debug)]
struct ListedView {
    name: String,
    released: bool,
    namespace: Option<String>,
    /// Its UID and resourceVersion as listed (the delete's preconditions).
    meta: ObjectMeta,
}

/// A live pod that mounts a claim.
#[derive(Clone, Debug)]
struct PodUse {
    name: String,
    uid: String,
    holder: bool,
    live: bool,
}

impl PodUse {
    /// The pod as the pure rules read it (labels and liveness only).
    fn as_pod(&self) -> Pod {
        let mut labels = std::collections::BTreeMap::new();
        if self.holder {
            labels.insert(
                warmcache_modelvolume::agent::COMPONENT_LABEL.to_owned(),
                warmcache_modelvolume::agent::MOUNT_HOLDER.to_owned(),
            );
            labels.insert(MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned());
        }
        Pod {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(labels),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }
}

fn present(meta: &ObjectMeta, binding: &str, busy: Option<Keep>) -> Seen {
    Seen::Present {
        uid: meta.uid.clone().unwrap_or_default(),
        ours: reaper::is_ours(meta, Some(binding)),
        terminating: meta.deletion_timestamp.is_some(),
        busy,
    }
}

/// Deletes `name` if it still is the object `read` describes (UID and resourceVersion
/// preconditions): `Ok(false)` when it changed since (409), `Ok(true)` when it is gone.
async fn delete_exact<K>(api: Api<K>, name: &str, read: &ObjectMeta) -> Result<bool, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: read.uid.clone(),
            resource_version: read.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    match delete(api, name, &params).await {
        Ok(()) => Ok(true),
        Err(e) if warmcache_kube::is_conflict(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Deletes the Secret `name` of `namespace` if it still is the object `read` describes (UID and
/// resourceVersion preconditions), as [`delete_exact`], asking for the answer as metadata: the
/// API server returns a deleted object that still has finalizers, and the reaper never receives
/// a key. The answer is not read.
async fn delete_secret_exact(
    client: &Client,
    namespace: &str,
    name: &str,
    read: &ObjectMeta,
) -> Result<bool, kube::Error> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: read.uid.clone(),
            resource_version: read.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    let mut request = kube::core::Request::new(Secret::url_path(&(), Some(namespace)))
        .delete(name, &params)
        .map_err(kube::Error::BuildRequest)?;
    request.headers_mut().insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static(METADATA_ONLY),
    );
    match client.request_text(request).await {
        Ok(_) => Ok(true),
        Err(e) if warmcache_kube::is_not_found(&e) => Ok(true),
        Err(e) if warmcache_kube::is_conflict(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The media type of a metadata-only answer (what `list_metadata` asks for).
const METADATA_ONLY: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";

fn with_uid(uid: &str) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}

fn api_ns<K>(client: &Client, namespace: &str) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    Api::namespaced(client.clone(), namespace)
}

/// Deletes `name`; NotFound is success (already gone).
async fn delete<K>(api: Api<K>, name: &str, params: &DeleteParams) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    match api.delete(name, params).await {
        Ok(_) => Ok(()),
        Err(e) if warmcache_kube::is_not_found(&e) => Ok(()),
        Err(e) => Err(e),
    }
}
