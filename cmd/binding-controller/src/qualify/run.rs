//! The IO half of `qualify`: creates the run's objects in order, waits (each wait bounded by
//! `--step-timeout` and ended by SIGINT/SIGTERM), feeds what the pods reported to the pure
//! checks, and always removes what it made (bounded by `--cleanup-timeout`).
//!
//! API calls: get Namespaces and CSIDrivers; get StorageClasses, and create, list and delete the
//! run's own (a Retain copy of the class under test, so the run's claims can only bind volumes
//! provisioned for them); create, get, list and delete PersistentVolumeClaims, Pods and Jobs in
//! the two namespaces; list Events there; create, get, list, patch (labels, reclaim policy) and
//! delete PersistentVolumes; list VolumeAttachments.
//!
//! A PersistentVolume is labelled, patched or deleted only when the run made it: a view it
//! created, or a volume bound to one of its claims that passed [`objects::verify_bound_pv`]
//! (bound to that claim's UID, provisioned by the class's provisioner, of the run's class);
//! every patch and delete names the object's UID, so an object recreated under the same name is
//! never touched.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass, VolumeAttachment};
use k8s_openapi::jiff::Timestamp;
use kube::api::Preconditions;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::Settings;
use super::objects::{self, PROVISIONED_BY, RUN_LABEL};
use super::report::{
    Check, CheckName, Payload, ReaderOutput, Report, StorageFacts, ViewFacts, WriteOp,
    evaluate_negative, evaluate_reader, evaluate_retain, evaluate_unchanged, evaluate_write,
    parse_writer,
};

const POLL: Duration = Duration::from_millis(500);

/// Why `qualify` could not run at all (nothing was created).
#[derive(Debug, thiserror::Error)]
pub enum QualifyError {
    /// A namespace named by a flag does not exist or cannot be read.
    #[error("{flag} {namespace}: {reason}")]
    Namespace {
        /// The flag.
        flag: &'static str,
        /// Its value.
        namespace: String,
        /// What the API server said.
        reason: String,
    },
    /// The StorageClass does not exist or cannot be read.
    #[error("--storage-class {name}: {reason}")]
    StorageClass {
        /// The class.
        name: String,
        /// What the API server said.
        reason: String,
    },
}

/// Why a step did not finish.
#[derive(Debug)]
enum StepError {
    Timeout(String),
    Interrupted,
    Api(String),
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepError::Timeout(what) => write!(f, "timed out waiting for {what}"),
            StepError::Interrupted => write!(f, "interrupted"),
            StepError::Api(e) => write!(f, "{e}"),
        }
    }
}

/// Why one writer attempt gave no populated claim.
#[derive(Debug)]
enum WriteFailure {
    /// The provisioner refused the access mode; nothing of the attempt is left.
    Refused(String),
    /// A claim was given (or is still pending) and the writer did not fill it: the verdict.
    Failed(String),
}

fn api(what: &str, e: kube::Error) -> StepError {
    StepError::Api(format!("{what}: {e}"))
}

/// Polls `probe` every half second until it gives a value, `timeout` passes, or `cancel` fires.
async fn poll<T, F, Fut>(
    what: &str,
    timeout: Duration,
    cancel: &CancellationToken,
    mut probe: F,
) -> Result<T, StepError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, StepError>>,
{
    let start = Instant::now();
    loop {
        if cancel.is_cancelled() {
            return Err(StepError::Interrupted);
        }
        if let Some(v) = probe().await? {
            return Ok(v);
        }
        if start.elapsed() >= timeout {
            return Err(StepError::Timeout(format!(
                "{what} ({}s)",
                timeout.as_secs()
            )));
        }
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            () = cancel.cancelled() => return Err(StepError::Interrupted),
        }
    }
}

struct Run<'a> {
    client: Client,
    settings: &'a Settings,
    id: String,
    cancel: CancellationToken,
    /// The PersistentVolumes the run may label, patch and delete (name, UID): the volumes
    /// provisioned for its claims that passed [`objects::verify_bound_pv`], and its views.
    ours: std::sync::Mutex<Vec<(String, String)>>,
    /// The class under test, read by the preflight.
    class: std::sync::OnceLock<StorageClass>,
}

/// Delete options that only delete the object of that UID (none: no precondition).
fn by_uid(uid: Option<String>) -> DeleteParams {
    DeleteParams::default().preconditions(Preconditions {
        uid,
        resource_version: None,
    })
}

fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let digest =
        warmcache_api_modelcache::sha256_digest(&format!("{nanos}/{}", std::process::id()));
    digest["sha256:".len().."sha256:".len() + 8].to_owned()
}

/// Runs the qualification and removes everything it created; the report says what was shown.
///
/// # Errors
///
/// [`QualifyError`] when a namespace or the class cannot be read (nothing was created then).
pub async fn qualify(
    client: Client,
    settings: &Settings,
    cancel: CancellationToken,
) -> Result<Report, QualifyError> {
    let id = run_id();
    let run = Run {
        client,
        settings,
        id: id.clone(),
        cancel,
        ours: std::sync::Mutex::new(Vec::new()),
        class: std::sync::OnceLock::new(),
    };
    let span = tracing::info_span!("qualify", run = %id, storage_class = %settings.storage_class);
    async move {
        let mut report = Report::new(
            &id,
            Timestamp::now().to_string(),
            &settings.namespace_a,
            &settings.namespace_b,
        );
        report.image = settings.image.clone();
        let class = run.preflight(&mut report).await?;
        tracing::info!(run = %id, "qualification started; every object is labelled {RUN_LABEL}={id}");
        let outcome = run.checks(&mut report, &class).await;
        match outcome {
            Ok(()) => {}
            Err(StepError::Interrupted) => {
                report.interrupted = Some("SIGINT or SIGTERM".to_owned());
                report.not_reached("interrupted");
            }
            Err(e) => report.not_reached(&format!("not reached: {e}")),
        }
        run.cleanup(&mut report).await;
        report.finish(Timestamp::now().to_string());
        Ok(report)
    }
    .instrument(span)
    .await
}

impl Run<'_> {
    async fn preflight(&self, report: &mut Report) -> Result<StorageClass, QualifyError> {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        for (flag, ns) in [
            ("--namespace-a", &self.settings.namespace_a),
            ("--namespace-b", &self.settings.namespace_b),
        ] {
            match namespaces.get_opt(ns).await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    return Err(QualifyError::Namespace {
                        flag,
                        namespace: ns.clone(),
                        reason: "no such namespace (create it first)".to_owned(),
                    });
                }
                Err(e) => {
                    return Err(QualifyError::Namespace {
                        flag,
                        namespace: ns.clone(),
                        reason: e.to_string(),
                    });
                }
            }
        }
        let classes: Api<StorageClass> = Api::all(self.client.clone());
        let class = match classes.get_opt(&self.settings.storage_class).await {
            Ok(Some(c)) => c,
            Ok(None) => {
                return Err(QualifyError::StorageClass {
                    name: self.settings.storage_class.clone(),
                    reason: "no such StorageClass".to_owned(),
                });
            }
            Err(e) => {
                return Err(QualifyError::StorageClass {
                    name: self.settings.storage_class.clone(),
                    reason: e.to_string(),
                });
            }
        };
        // A missing or unreadable CSIDriver is only a fact of the report.
        let driver = Api::<CSIDriver>::all(self.client.clone())
            .get_opt(&class.provisioner)
            .await
            .ok()
            .flatten();
        report.storage_class = StorageFacts {
            name: self.settings.storage_class.clone(),
            provisioner: class.provisioner.clone(),
            reclaim_policy: class.reclaim_policy.clone(),
            volume_binding_mode: class.volume_binding_mode.clone(),
            fs_group_policy: driver.as_ref().and_then(|d| d.spec.fs_group_policy.clone()),
            attach_required: driver.as_ref().and_then(|d| d.spec.attach_required),
        };
        let _ = self.class.set(class.clone());
        Ok(class)
    }

    fn provisioner(&self) -> &str {
        self.class.get().map_or("", |c| c.provisioner.as_str())
    }

    fn ours(&self) -> std::sync::MutexGuard<'_, Vec<(String, String)>> {
        self.ours
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The UID of a PV the run may touch, `None` for any other.
    fn our_uid(&self, pv: &str) -> Option<String> {
        self.ours()
            .iter()
            .find(|(name, _)| name == pv)
            .map(|(_, uid)| uid.clone())
    }

    /// Whether the run's claims wait for a consumer before they are provisioned.
    fn waits_for_consumer(&self) -> bool {
        self.class
            .get()
            .and_then(|c| c.volume_binding_mode.as_deref())
            == Some("WaitForFirstConsumer")
    }

    /// Waits until the run's claim `ns/claim` is Bound, with a binder pod
    /// ([`objects::binder_pod`]) consuming it first when the class waits for a consumer (the
    /// pod is gone again when this returns a volume).
    async fn bind(
        &self,
        ns: &str,
        part: &str,
        claim: &str,
    ) -> Result<Result<String, String>, StepError> {
        let binder = self.waits_for_consumer();
        if binder {
            let pod = objects::binder_pod(self.settings, &self.id, part, ns, claim);
            self.pods(ns)
                .create(&PostParams::default(), &pod)
                .await
                .map_err(|e| api(&format!("creating pod {ns}/{}", pod.name_any()), e))?;
        }
        let bound = self.wait_bound(ns, claim).await;
        if binder && matches!(bound, Ok(Ok(_))) {
            self.wait_gone_pods(ns, &format!("{part}-bind")).await?;
        }
        bound
    }

    /// Checks that the volume `pv` bound by the run's claim `ns/claim` is the run's own (see
    /// [`objects::verify_bound_pv`]); only then may the run use, label, patch or delete it.
    /// Any other volume stops the step: nothing is written to it, it is not changed.
    async fn verify(&self, ns: &str, claim: &str, pv: &str) -> Result<(), StepError> {
        let claim_uid = self
            .pvcs(ns)
            .get(claim)
            .await
            .map_err(|e| api(&format!("reading claim {ns}/{claim}"), e))?
            .metadata
            .uid
            .unwrap_or_default();
        let volume = self
            .pvs()
            .get(pv)
            .await
            .map_err(|e| api(&format!("reading PersistentVolume {pv}"), e))?;
        match objects::verify_bound_pv(
            &volume,
            &claim_uid,
            self.provisioner(),
            &objects::class_name(&self.id),
        ) {
            Ok(()) => {
                let uid = volume.metadata.uid.clone().unwrap_or_default();
                self.ours().push((pv.to_owned(), uid));
                Ok(())
            }
            Err(why) => {
                tracing::error!(claim = %format!("{ns}/{claim}"), pv, "{why}");
                Err(StepError::Api(format!(
                    "the claim {ns}/{claim} bound a volume the run did not provision; the run stopped before using it and leaves that PersistentVolume untouched: {why}"
                )))
            }
        }
    }

    fn pvcs(&self, ns: &str) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), ns)
    }

    fn pods(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), ns)
    }

    fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    /// The last warning Events of an object, for a failure's detail.
    async fn warnings(&self, ns: &str, name: &str) -> Vec<String> {
        self.warnings_of(ns, name, None).await
    }

    /// The last warning Events of an object (of that UID when given: a claim recreated under
    /// the same name must not inherit its predecessor's Events).
    async fn warnings_of(&self, ns: &str, name: &str, uid: Option<&str>) -> Vec<String> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), ns);
        let mut fields = format!("involvedObject.name={name}");
        if let Some(uid) = uid {
            fields.push_str(&format!(",involvedObject.uid={uid}"));
        }
        let list = events
            .list(&ListParams::default().fields(&fields))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let mut out: Vec<String> = list
            .into_iter()
            .filter(|e| e.type_.as_deref() == Some("Warning"))
            .map(|e| {
                format!(
                    "{}: {}",
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default().trim()
                )
            })
            .collect();
        out.dedup();
        let skip = out.len().saturating_sub(3);
        out.split_off(skip)
    }

    async fn with_warnings(&self, e: StepError, ns: &str, names: &[&str]) -> String {
        let mut detail = e.to_string();
        for name in names {
            let w = self.warnings(ns, name).await;
            if !w.is_empty() {
                detail.push_str(&format!("; {name}: {}", w.join(" | ")));
            }
        }
        detail
    }

    /// Waits until a claim is Bound; `Ok(Err(message))` when its provisioning failed.
    async fn wait_bound(&self, ns: &str, name: &str) -> Result<Result<String, String>, StepError> {
        let uid = self
            .pvcs(ns)
            .get(name)
            .await
            .map_err(|e| api(&format!("reading claim {ns}/{name}"), e))?
            .metadata
            .uid;
        let uid = uid.as_deref();
        let claims = self.pvcs(ns);
        poll(
            &format!("claim {ns}/{name} to bind"),
            self.settings.step_timeout,
            &self.cancel,
            || {
                let claims = claims.clone();
                async move {
                    let c = claims
                        .get(name)
                        .await
                        .map_err(|e| api(&format!("reading claim {ns}/{name}"), e))?;
                    if c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
                        && let Some(pv) = c.spec.as_ref().and_then(|s| s.volume_name.clone())
                    {
                        return Ok(Some(Ok(pv)));
                    }
                    let failed = self
                        .warnings_of(ns, name, uid)
                        .await
                        .into_iter()
                        .find(|w| w.starts_with("ProvisioningFailed"));
                    Ok(failed.map(Err))
                }
            },
        )
        .await
    }

    /// Waits until a pod has finished and returns it.
    async fn wait_pod(&self, ns: &str, name: &str) -> Result<Pod, StepError> {
        let pods = self.pods(ns);
        poll(
            &format!("pod {ns}/{name} to finish"),
            self.settings.step_timeout,
            &self.cancel,
            || {
                let pods = pods.clone();
                async move {
                    let p = pods
                        .get(name)
                        .await
                        .map_err(|e| api(&format!("reading pod {ns}/{name}"), e))?;
                    let phase = p.status.as_ref().and_then(|s| s.phase.clone());
                    Ok(matches!(phase.as_deref(), Some("Succeeded" | "Failed")).then_some(p))
                }
            },
        )
        .await
    }

    /// Labels one of the run's PVs (the UID in the patch is a precondition: the API server
    /// refuses it for any other object of that name). Refuses a PV that is not the run's.
    async fn label_pv(&self, pv: &str, part: &str) -> Result<(), StepError> {
        let Some(uid) = self.our_uid(pv) else {
            return Err(StepError::Api(format!(
                "PersistentVolume {pv} is not the run's: not labelled"
            )));
        };
        let labels = objects::labels(&self.id, part);
        self.pvs()
            .patch(
                pv,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "uid": uid, "labels": labels } })),
            )
            .await
            .map_err(|e| api(&format!("labelling PersistentVolume {pv}"), e))?;
        Ok(())
    }

    async fn checks(&self, report: &mut Report, class: &StorageClass) -> Result<(), StepError> {
        let s = self.settings;
        let (a, b) = (s.namespace_a.as_str(), s.namespace_b.as_str());

        // 0. The run's own class: a Retain copy of the class under test that the run's claims
        // name, so only volumes provisioned for them can bind them.
        let run_class = objects::run_class(class, &self.id);
        Api::<StorageClass>::all(self.client.clone())
            .create(&PostParams::default(), &run_class)
            .await
            .map_err(|e| {
                api(
                    &format!("creating the run's StorageClass {}", run_class.name_any()),
                    e,
                )
            })?;

        // 1. The writer: a fresh claim of the class and a Job filling it.
        let writer = async {
            let mut last = String::new();
            for mode in &s.writer_modes {
                match self.write(report, mode).await? {
                    Ok(payload) => return Ok(Ok(payload)),
                    // Only a mode the provisioner refused gives way to the next one: a claim
                    // that bound and a writer that failed on it is the verdict (seed 002's
                    // root-owned export refuses a non-root writer in every mode).
                    Err(WriteFailure::Refused(detail)) => last = detail,
                    Err(WriteFailure::Failed(detail)) => return Ok(Err(detail)),
                }
            }
            Ok::<_, StepError>(Err(last))
        }
        .instrument(tracing::info_span!("check", name = "writer-populates"))
        .await;
        let payload = match writer {
            Ok(Ok(p)) => p,
            Ok(Err(detail)) => {
                report.set(Check::failed(CheckName::WriterPopulates, detail));
                report.not_reached("not reached: the writer did not populate a claim");
                return Ok(());
            }
            Err(StepError::Interrupted) => return Err(StepError::Interrupted),
            Err(e) => {
                let detail = e.to_string();
                report.set(Check::failed(CheckName::WriterPopulates, detail));
                return Err(e);
            }
        };
        report.set(Check::passed(
            CheckName::WriterPopulates,
            format!(
                "a {} claim of class {} (through the run's copy {}) bound and the writer wrote {} bytes (sha256 {})",
                report.writer.access_mode.as_deref().unwrap_or("?"),
                s.storage_class,
                objects::class_name(&self.id),
                payload.bytes,
                payload.sha256
            ),
        ));
        let Some(pv_name) = report.writer.persistent_volume.clone() else {
            return Err(StepError::Api("the writer's claim has no volume".into()));
        };
        let mode = report.writer.access_mode.clone().unwrap_or_default();

        // 2. Retain, then release the writer's claim and wait for the detach.
        let pv = self
            .pvs()
            .get(&pv_name)
            .await
            .map_err(|e| api(&format!("reading PersistentVolume {pv_name}"), e))?;
        let pv_policy = pv
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.clone());
        let retain = evaluate_retain(
            report.storage_class.reclaim_policy.as_deref(),
            pv_policy.as_deref(),
        );
        let retained = retain.status == super::CheckStatus::Passed;
        report.set(retain);
        let writer_claim = objects::name(&self.id, "writer");
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), a);
        jobs.delete(&writer_claim, &DeleteParams::background())
            .await
            .map_err(|e| api("deleting the writer Job", e))?;
        self.wait_gone_pods(a, "writer").await?;
        if retained {
            // As the controller does once completion is stored: the claim goes, the data stays.
            self.pvcs(a)
                .delete(&writer_claim, &DeleteParams::default())
                .await
                .map_err(|e| api("releasing the writer's claim", e))?;
        }
        let detach_start = Instant::now();
        self.wait_detached(std::slice::from_ref(&pv_name)).await?;
        report.writer.detach = Some(format!(
            "writer pod deleted{}; no VolumeAttachment of {pv_name} left after {:.1}s (read-only attachments only after the read-write one is gone)",
            if retained {
                " and its claim released"
            } else {
                " (claim kept: the volume is not Retain)"
            },
            detach_start.elapsed().as_secs_f64()
        ));
        let primary = self
            .pvs()
            .get(&pv_name)
            .await
            .map_err(|e| api(&format!("reading PersistentVolume {pv_name}"), e))?;

        // 3. The views, derived as the controller derives them, and their readers; 4. the
        // negative control, concurrently.
        let provisioner = report.storage_class.provisioner.clone();
        let builtin = warmcache_catalog::CatalogSnapshot::builtin().ok();
        let entry = builtin
            .as_ref()
            .and_then(|c| c.catalog().driver(&provisioner).cloned());
        let provider = s
            .provider
            .clone()
            .or_else(|| entry.as_ref().map(|e| e.provider.clone()));
        report.provider = provider.clone();
        let mount_options = if mode == "ReadWriteMany" {
            Vec::new()
        } else {
            s.reader_mount_options.clone().unwrap_or_else(|| {
                entry
                    .as_ref()
                    .map(|e| e.reader_mount_options.clone())
                    .filter(|o| o.iter().any(|x| x == "ro"))
                    .unwrap_or_else(|| vec!["ro".to_owned()])
            })
        };
        let binding = objects::view_binding(
            s,
            &self.id,
            &provisioner,
            provider.as_deref().unwrap_or(""),
            &mode,
            mount_options,
        );
        let mut views = Vec::new();
        for ns in [a, b] {
            match warmcache_modelvolume::read_only_view(
                &binding,
                &primary,
                ns,
                Some(payload.bytes),
                &[],
            ) {
                Ok(view) => views.push(view),
                Err(e) => {
                    let detail = format!("no read-only view can be derived for {ns}: {e}");
                    for name in [
                        CheckName::DataSurvivesWriter,
                        CheckName::ReaderIdenticalBytes,
                    ] {
                        report.set(Check::failed(name, detail.clone()));
                    }
                    report.not_reached("not reached: no read-only view");
                    return Ok(());
                }
            }
        }
        for (pv, claim) in &mut views {
            let ns = claim.metadata.namespace.clone().unwrap_or_default();
            let part = if ns == a { "view-a" } else { "view-b" };
            objects::add_labels(&mut pv.metadata, &self.id, part);
            objects::add_labels(&mut claim.metadata, &self.id, part);
            report.views.push(ViewFacts {
                namespace: ns.clone(),
                persistent_volume: pv.name_any(),
                persistent_volume_claim: claim.name_any(),
                volume_handle: pv
                    .spec
                    .as_ref()
                    .and_then(|s| s.csi.as_ref())
                    .map(|c| c.volume_handle.clone())
                    .unwrap_or_default(),
                mount_options: pv
                    .spec
                    .as_ref()
                    .and_then(|s| s.mount_options.clone())
                    .unwrap_or_default(),
                seen: None,
            });
            let created = self
                .pvs()
                .create(&PostParams::default(), pv)
                .await
                .map_err(|e| {
                    api(
                        &format!("creating view PersistentVolume {}", pv.name_any()),
                        e,
                    )
                })?;
            self.ours()
                .push((created.name_any(), created.uid().unwrap_or_default()));
            self.pvcs(&ns)
                .create(&PostParams::default(), claim)
                .await
                .map_err(|e| api(&format!("creating view claim {ns}/{}", claim.name_any()), e))?;
        }
        let claim_name = views.first().map(|(_, c)| c.name_any()).unwrap_or_default();
        let control_claim = objects::writer_claim(s, &self.id, "control", b, &mode);
        self.pvcs(b)
            .create(&PostParams::default(), &control_claim)
            .await
            .map_err(|e| api("creating the negative control's claim", e))?;
        // The control's pod is created once its volume is known to be the run's (`control`).
        for (ns, part, claim, writes) in [
            (a, "reader-a", claim_name.clone(), false),
            (b, "reader-b", claim_name.clone(), true),
        ] {
            let pod = objects::reader_pod(s, &self.id, part, ns, &claim, writes);
            self.pods(ns)
                .create(&PostParams::default(), &pod)
                .await
                .map_err(|e| api(&format!("creating pod {ns}/{}", pod.name_any()), e))?;
        }
        let reader_a = self
            .read(a, "reader-a", &claim_name)
            .instrument(tracing::info_span!("check", name = "data-survives-writer"));
        let reader_b = self
            .read(b, "reader-b", &claim_name)
            .instrument(tracing::info_span!(
                "check",
                name = "reader-identical-bytes"
            ));
        let control = self.control(b).instrument(tracing::info_span!(
            "check",
            name = "negative-control-empty"
        ));
        let (seen_a, seen_b, seen_control) = tokio::join!(reader_a, reader_b, control);

        let mut interrupted = false;
        match seen_a {
            Ok(seen) => {
                report.set(evaluate_reader(
                    CheckName::DataSurvivesWriter,
                    &payload,
                    &seen,
                ));
                if let Some(v) = report.views.get_mut(0) {
                    v.seen = Some(seen);
                }
            }
            Err(e) => {
                interrupted |= matches!(e, StepError::Interrupted);
                report.set(Check::failed(CheckName::DataSurvivesWriter, e.to_string()));
            }
        }
        match seen_b {
            Ok(seen) => {
                report.set(evaluate_reader(
                    CheckName::ReaderIdenticalBytes,
                    &payload,
                    &seen,
                ));
                for op in WriteOp::ALL {
                    report.set(evaluate_write(op, &seen));
                }
                report.set(evaluate_unchanged(&payload, &seen));
                if let Some(v) = report.views.get_mut(1) {
                    v.seen = Some(seen);
                }
            }
            Err(e) => {
                interrupted |= matches!(e, StepError::Interrupted);
                let detail = e.to_string();
                report.set(Check::failed(CheckName::ReaderIdenticalBytes, detail));
                report.not_reached(&format!(
                    "not reached: the reader in {b} did not run (see reader-identical-bytes)"
                ));
            }
        }
        match seen_control {
            Ok(seen) => {
                report.set(evaluate_negative(&payload, &seen));
                report.negative_control = Some(seen);
            }
            Err(e) => {
                interrupted |= matches!(e, StepError::Interrupted);
                report.set(Check::failed(
                    CheckName::NegativeControlEmpty,
                    e.to_string(),
                ));
            }
        }
        if interrupted {
            return Err(StepError::Interrupted);
        }
        Ok(())
    }

    /// One writer attempt with access mode `mode`: `Ok(Err(_))` when this mode did not give a
    /// populated claim, [`WriteFailure::Refused`] when the provisioner refused the mode (its
    /// claim is deleted again, so the next mode may be tried).
    async fn write(
        &self,
        report: &mut Report,
        mode: &str,
    ) -> Result<Result<Payload, WriteFailure>, StepError> {
        let s = self.settings;
        let a = s.namespace_a.as_str();
        let claim = objects::writer_claim(s, &self.id, "writer", a, mode);
        let claim_name = claim.name_any();
        // A failed attempt of another mode may still be going away.
        self.wait_claim_gone(a, &claim_name).await?;
        self.pvcs(a)
            .create(&PostParams::default(), &claim)
            .await
            .map_err(|e| api(&format!("creating claim {a}/{claim_name}"), e))?;
        let pv = match self.bind(a, "writer", &claim_name).await {
            Ok(Ok(pv)) => pv,
            Ok(Err(refused)) => {
                report
                    .writer
                    .attempts
                    .push(format!("{mode}: refused by the provisioner ({refused})"));
                self.wait_gone_pods(a, "writer-bind").await?;
                // Not bound: deleting it frees nothing but the claim.
                self.pvcs(a)
                    .delete(&claim_name, &DeleteParams::default())
                    .await
                    .map_err(|e| api("deleting the refused claim", e))?;
                return Ok(Err(WriteFailure::Refused(format!(
                    "no claim of class {} could be provisioned: {}",
                    s.storage_class,
                    report.writer.attempts.join("; ")
                ))));
            }
            Err(StepError::Timeout(what)) => {
                let detail = self
                    .with_warnings(StepError::Timeout(what), a, &[&claim_name])
                    .await;
                report.writer.attempts.push(format!("{mode}: {detail}"));
                return Ok(Err(WriteFailure::Failed(detail)));
            }
            Err(e) => return Err(e),
        };
        // Before anything is written to it or changed on it: the volume must be the run's.
        if let Err(e) = self.verify(a, &claim_name, &pv).await {
            report
                .writer
                .attempts
                .push(format!("{mode}: bound to {pv}, {e}"));
            return Err(e);
        }
        self.label_pv(&pv, "writer").await?;
        let job = objects::writer_job(s, &self.id, a, &claim_name);
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), a);
        jobs.create(&PostParams::default(), &job)
            .await
            .map_err(|e| api("creating the writer Job", e))?;
        report.writer.access_mode = Some(mode.to_owned());
        report.writer.persistent_volume_claim = Some(claim_name.clone());
        report.writer.persistent_volume = Some(pv.clone());
        report.writer.volume_handle = self
            .pvs()
            .get(&pv)
            .await
            .ok()
            .and_then(|p| p.spec.and_then(|s| s.csi).map(|c| c.volume_handle));
        report
            .writer
            .attempts
            .push(format!("{mode}: bound to {pv}"));

        let done = poll(
            "the writer Job to finish",
            s.step_timeout,
            &self.cancel,
            || {
                let jobs = jobs.clone();
                let name = claim_name.clone();
                async move {
                    let j = jobs
                        .get(&name)
                        .await
                        .map_err(|e| api("reading the writer Job", e))?;
                    let conditions = j.status.and_then(|s| s.conditions).unwrap_or_default();
                    Ok(conditions
                        .iter()
                        .find(|c| {
                            (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True"
                        })
                        .map(|c| c.type_ == "Complete"))
                }
            },
        )
        .await;
        let writer_pods = self
            .pods(a)
            .list(&ListParams::default().labels(&format!("job-name={claim_name}")))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let message = writer_pods
            .iter()
            .find_map(termination_message)
            .unwrap_or_default();
        let pod_names: Vec<String> = writer_pods.iter().map(ResourceExt::name_any).collect();
        match done {
            Ok(true) => Ok(parse_writer(&message)
                .inspect(|payload| {
                    report.writer.payload = Some(payload.clone());
                })
                .map_err(WriteFailure::Failed)),
            Ok(false) => {
                let mut names: Vec<&str> = pod_names.iter().map(String::as_str).collect();
                names.push(&claim_name);
                let why = self
                    .with_warnings(StepError::Api("the writer Job failed".into()), a, &names)
                    .await;
                Ok(Err(WriteFailure::Failed(format!(
                    "{why}: {}",
                    message.trim()
                ))))
            }
            Err(StepError::Timeout(what)) => {
                let mut names: Vec<&str> = pod_names.iter().map(String::as_str).collect();
                names.push(&claim_name);
                Ok(Err(WriteFailure::Failed(
                    self.with_warnings(StepError::Timeout(what), a, &names)
                        .await,
                )))
            }
            Err(e) => Err(e),
        }
    }

    /// Waits for a reader pod and reads what it reported.
    async fn read(&self, ns: &str, part: &str, claim: &str) -> Result<ReaderOutput, StepError> {
        let name = objects::name(&self.id, part);
        match self.wait_pod(ns, &name).await {
            Ok(pod) => {
                let message = termination_message(&pod).unwrap_or_default();
                if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")
                    && !message.contains("sha256=")
                {
                    return Err(StepError::Api(format!(
                        "reader pod {ns}/{name} failed: {}",
                        message.trim()
                    )));
                }
                Ok(ReaderOutput::parse(&message))
            }
            Err(StepError::Interrupted) => Err(StepError::Interrupted),
            Err(e) => Err(StepError::Api(
                self.with_warnings(e, ns, &[&name, claim]).await,
            )),
        }
    }

    /// The negative control: its claim binds (it is provisioned from the class), its volume
    /// is checked to be the run's, then its pod reads.
    async fn control(&self, ns: &str) -> Result<ReaderOutput, StepError> {
        let claim = objects::name(&self.id, "control");
        match self.bind(ns, "control", &claim).await {
            Ok(Ok(pv)) => {
                self.verify(ns, &claim, &pv).await?;
                self.label_pv(&pv, "control").await?;
                let pod =
                    objects::reader_pod(self.settings, &self.id, "control", ns, &claim, false);
                self.pods(ns)
                    .create(&PostParams::default(), &pod)
                    .await
                    .map_err(|e| api(&format!("creating pod {ns}/{}", pod.name_any()), e))?;
            }
            Ok(Err(refused)) => {
                return Err(StepError::Api(format!(
                    "the class-only claim {ns}/{claim} was not provisioned ({refused}): the control is inconclusive"
                )));
            }
            Err(StepError::Interrupted) => return Err(StepError::Interrupted),
            Err(e) => {
                return Err(StepError::Api(self.with_warnings(e, ns, &[&claim]).await));
            }
        }
        self.read(ns, "control", &claim).await
    }

    async fn wait_claim_gone(&self, ns: &str, name: &str) -> Result<(), StepError> {
        let claims = self.pvcs(ns);
        poll(
            &format!("claim {ns}/{name} to be gone"),
            self.settings.step_timeout,
            &self.cancel,
            || {
                let claims = claims.clone();
                async move {
                    let c = claims
                        .get_opt(name)
                        .await
                        .map_err(|e| api(&format!("reading claim {ns}/{name}"), e))?;
                    Ok(c.is_none().then_some(()))
                }
            },
        )
        .await
    }

    async fn wait_gone_pods(&self, ns: &str, part: &str) -> Result<(), StepError> {
        let pods = self.pods(ns);
        let selector = format!("{RUN_LABEL}={},{}={part}", self.id, objects::PART_LABEL);
        poll(
            &format!("the {part} pods in {ns} to be gone"),
            self.settings.step_timeout,
            &self.cancel,
            || {
                let pods = pods.clone();
                let selector = selector.clone();
                async move {
                    let list = pods
                        .list(&ListParams::default().labels(&selector))
                        .await
                        .map_err(|e| api(&format!("listing pods in {ns}"), e))?;
                    for p in &list.items {
                        if p.metadata.deletion_timestamp.is_none() {
                            let _ = pods.delete(&p.name_any(), &DeleteParams::default()).await;
                        }
                    }
                    Ok(list.items.is_empty().then_some(()))
                }
            },
        )
        .await
    }

    /// Waits until no VolumeAttachment names any of `pvs`.
    async fn wait_detached(&self, pvs: &[String]) -> Result<(), StepError> {
        let attachments: Api<VolumeAttachment> = Api::all(self.client.clone());
        poll(
            "the volume to be detached",
            self.settings.step_timeout,
            &self.cancel,
            || {
                let attachments = attachments.clone();
                async move {
                    let list = attachments
                        .list(&ListParams::default())
                        .await
                        .map_err(|e| api("listing VolumeAttachments", e))?;
                    let attached = list.items.iter().any(|va| {
                        va.spec
                            .source
                            .persistent_volume_name
                            .as_ref()
                            .is_some_and(|n| pvs.contains(n))
                    });
                    Ok((!attached).then_some(()))
                }
            },
        )
        .await
    }

    /// Removes every object of the run, also after a failure or a signal: pods and Jobs first
    /// (so volumes detach), then claims, the views' PVs, the provisioned PVs set to Delete so
    /// their provisioner frees the storage, and last the run's StorageClass. Only the run's PVs
    /// are touched (its views and the volumes verified as provisioned for its claims); a claim
    /// bound to any other PV is kept when deleting it would delete that volume, and reported.
    /// Every delete names the object's UID. Bounded by `--cleanup-timeout`; whatever is left is
    /// reported with a command that removes it.
    async fn cleanup(&self, report: &mut Report) {
        let span = tracing::info_span!("cleanup");
        let deadline = self.settings.cleanup_timeout;
        let never = CancellationToken::new();
        let selector = format!("{RUN_LABEL}={}", self.id);
        let lp = ListParams::default().labels(&selector);
        let namespaces = [
            self.settings.namespace_a.clone(),
            self.settings.namespace_b.clone(),
        ];
        let ours: Vec<(String, String)> = self.ours().clone();
        let pv_names: Vec<String> = ours.iter().map(|(n, _)| n.clone()).collect();
        async {
            let mut notes: Vec<String> = Vec::new();
            let removed = &mut report.cleanup.removed;
            for ns in &namespaces {
                let jobs: Api<Job> = Api::namespaced(self.client.clone(), ns);
                for j in jobs.list(&lp).await.map(|l| l.items).unwrap_or_default() {
                    let dp = DeleteParams {
                        preconditions: by_uid(j.uid()).preconditions,
                        ..DeleteParams::background()
                    };
                    if jobs.delete(&j.name_any(), &dp).await.is_ok() {
                        removed.push(format!("Job {ns}/{}", j.name_any()));
                    }
                }
                let pods = self.pods(ns);
                for p in pods.list(&lp).await.map(|l| l.items).unwrap_or_default() {
                    if pods.delete(&p.name_any(), &by_uid(p.uid())).await.is_ok() {
                        removed.push(format!("Pod {ns}/{}", p.name_any()));
                    }
                }
            }
            let _ = poll("the run's pods to be gone", deadline, &never, || {
                let lp = lp.clone();
                let namespaces = namespaces.clone();
                async move {
                    for ns in &namespaces {
                        let left = Api::<Pod>::namespaced(self.client.clone(), ns)
                            .list(&lp)
                            .await
                            .map_err(|e| api("listing pods", e))?;
                        if !left.items.is_empty() {
                            return Ok(None);
                        }
                    }
                    Ok(Some(()))
                }
            })
            .await;
            // The run's claims; one bound to a volume that is not the run's is deleted only
            // when that volume is Retain (it is then Released with its data), else kept.
            let mut claims_to_delete: Vec<(String, PersistentVolumeClaim)> = Vec::new();
            let mut kept: Vec<(String, String)> = Vec::new();
            for ns in &namespaces {
                for c in self.pvcs(ns).list(&lp).await.map(|l| l.items).unwrap_or_default() {
                    let bound = c.spec.as_ref().and_then(|s| s.volume_name.clone());
                    match bound {
                        Some(pv) if !pv_names.contains(&pv) => {
                            let policy = self
                                .pvs()
                                .get_opt(&pv)
                                .await
                                .ok()
                                .flatten()
                                .and_then(|v| v.spec.and_then(|s| s.persistent_volume_reclaim_policy));
                            if policy.as_deref() == Some("Retain") {
                                notes.push(format!(
                                    "PersistentVolume {pv} (not the run's; left untouched, Released with its data when the run's claim {ns}/{} went: clear its spec.claimRef to make it Available again)",
                                    c.name_any()
                                ));
                                claims_to_delete.push((ns.clone(), c));
                            } else {
                                notes.push(format!(
                                    "PersistentVolumeClaim {ns}/{} (bound to PersistentVolume {pv}, which is not the run's, reclaimPolicy {}: kept, since deleting the claim would delete that volume; set the PV to Retain, then delete the claim)",
                                    c.name_any(),
                                    policy.as_deref().unwrap_or("unknown")
                                ));
                                kept.push((ns.clone(), c.name_any()));
                            }
                        }
                        _ => claims_to_delete.push((ns.clone(), c)),
                    }
                }
            }
            let _ = poll("the run's volumes to be detached", deadline, &never, || {
                let pvs = pv_names.clone();
                let attachments: Api<VolumeAttachment> = Api::all(self.client.clone());
                async move {
                    let list = attachments
                        .list(&ListParams::default())
                        .await
                        .map_err(|e| api("listing VolumeAttachments", e))?;
                    Ok((!list.items.iter().any(|va| {
                        va.spec
                            .source
                            .persistent_volume_name
                            .as_ref()
                            .is_some_and(|n| pvs.contains(n))
                    }))
                    .then_some(()))
                }
            })
            .await;
            // The run's provisioned PVs: Delete, so the provisioner frees the storage once
            // unbound (the UID in the patch is a precondition).
            for (name, uid) in &ours {
                if let Ok(pv) = self.pvs().get(name).await
                    && pv.uid().as_deref() == Some(uid.as_str())
                    && pv.annotations().contains_key(PROVISIONED_BY)
                {
                    let _ = self
                        .pvs()
                        .patch(
                            name,
                            &PatchParams::default(),
                            &Patch::Merge(json!({
                                "metadata": { "uid": uid },
                                "spec": { "persistentVolumeReclaimPolicy": "Delete" },
                            })),
                        )
                        .await;
                }
            }
            for (ns, c) in &claims_to_delete {
                if self
                    .pvcs(ns)
                    .delete(&c.name_any(), &by_uid(c.uid()))
                    .await
                    .is_ok()
                {
                    removed.push(format!("PersistentVolumeClaim {ns}/{}", c.name_any()));
                }
            }
            // Views (static copies) are deleted as objects; provisioned PVs go with their
            // backing volume (the provisioner's).
            for (name, uid) in &ours {
                let Ok(pv) = self.pvs().get(name).await else {
                    continue;
                };
                let provisioned = pv.annotations().contains_key(PROVISIONED_BY);
                if !provisioned
                    && self
                        .pvs()
                        .delete(name, &by_uid(Some(uid.clone())))
                        .await
                        .is_ok()
                {
                    removed.push(format!("PersistentVolume {name}"));
                }
            }
            let gone = poll("the run's objects to be gone", deadline, &never, || {
                let lp = lp.clone();
                let namespaces = namespaces.clone();
                let ours = ours.clone();
                let kept = kept.clone();
                async move {
                    for ns in &namespaces {
                        let left = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), ns)
                            .list(&lp)
                            .await
                            .map_err(|e| api("listing claims", e))?;
                        if left
                            .items
                            .iter()
                            .any(|c| !kept.contains(&(ns.clone(), c.name_any())))
                        {
                            return Ok(None);
                        }
                    }
                    for (name, uid) in &ours {
                        let pv = self
                            .pvs()
                            .get_opt(name)
                            .await
                            .map_err(|e| api("reading PersistentVolumes", e))?;
                        if pv.is_some_and(|p| p.uid().as_deref() == Some(uid.as_str())) {
                            return Ok(None);
                        }
                    }
                    Ok(Some(()))
                }
            })
            .await;
            for name in &pv_names {
                if matches!(self.pvs().get_opt(name).await, Ok(None))
                    && !removed.iter().any(|r| r == &format!("PersistentVolume {name}"))
                {
                    removed.push(format!("PersistentVolume {name}"));
                }
            }
            // Last, the run's StorageClass: only the one of that name carrying the run's label.
            let classes: Api<StorageClass> = Api::all(self.client.clone());
            let class_name = objects::class_name(&self.id);
            let mut class_left = false;
            for c in classes.list(&lp).await.map(|l| l.items).unwrap_or_default() {
                if c.name_any() != class_name
                    || c.labels().get(RUN_LABEL).map(String::as_str) != Some(self.id.as_str())
                {
                    continue;
                }
                if classes.delete(&class_name, &by_uid(c.uid())).await.is_ok() {
                    removed.push(format!("StorageClass {class_name}"));
                } else {
                    class_left = true;
                }
            }
            let mut left = Vec::new();
            if gone.is_err() {
                for ns in &namespaces {
                    for c in self.pvcs(ns).list(&lp).await.map(|l| l.items).unwrap_or_default() {
                        if !kept.contains(&(ns.clone(), c.name_any())) {
                            left.push(format!("PersistentVolumeClaim {ns}/{}", c.name_any()));
                        }
                    }
                    for p in self.pods(ns).list(&lp).await.map(|l| l.items).unwrap_or_default() {
                        left.push(format!("Pod {ns}/{}", p.name_any()));
                    }
                }
                for (name, uid) in &ours {
                    if let Ok(Some(pv)) = self.pvs().get_opt(name).await
                        && pv.uid().as_deref() == Some(uid.as_str())
                    {
                        let phase = pv.status.and_then(|s| s.phase).unwrap_or_default();
                        left.push(format!("PersistentVolume {name} ({phase})"));
                    }
                }
            }
            if class_left {
                left.push(format!("StorageClass {class_name}"));
            }
            if !left.is_empty() {
                report.cleanup.command = Some(format!(
                    "kubectl delete pod,job,pvc -l {selector} -n {} && kubectl delete pod,job,pvc -l {selector} -n {} && kubectl delete pv -l {selector} && kubectl delete storageclass -l {selector}",
                    namespaces[0], namespaces[1]
                ));
            }
            left.extend(notes);
            if !left.is_empty() {
                tracing::warn!(left = ?left, "cleanup left objects behind");
            }
            report.cleanup.leftovers = left;
        }
        .instrument(span)
        .await;
    }
}

fn termination_message(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == objects::CONTAINER)?
        .state
        .as_ref()?
        .terminated
        .as_ref()?
        .message
        .clone()
}
