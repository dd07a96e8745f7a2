//! The admission: plan, binding, storage decision, rewrite.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use k8s_openapi::jiff::Timestamp;
use warmcache_api_modelcache::STORAGE_SELECTION_ANNOTATION;
use warmcache_api_modelcache::selection::{Mode, Selection};
use warmcache_api_modelcache::v2beta1::{ModelCacheBinding, PopulationState, Transition, Workflow};
use warmcache_catalog::{CatalogInput, DecisionInputs, Gates, Outcome};
use warmcache_cli::text::shown;

use crate::binding::{
    accept_winner, check_joinable, check_joinable_for, desired_binding, desired_binding_for,
};
use crate::keys::{BINDING_UID_ANNOTATION, CACHE_BINDING_UID_ANNOTATION, REVISION_ANNOTATION};
use crate::options::ReaderMode;
use crate::plan::{Plan, Request, plan};
use crate::rewrite::{SetRole, render, render_cache_set, render_capture, without_cache_set};
use crate::skip::{Skip, SkipReason};

/// The storage a new binding is decided on (everything `warmcache_catalog::decide` reads but the
/// workflow, which comes from the namespace).
#[derive(Debug, Clone, Copy)]
pub struct StorageInputs<'a> {
    /// StorageClass `nvcf-sc`; `None` when it does not exist.
    pub storage_class: Option<&'a StorageClass>,
    /// The CSIDriver named after its provisioner; `None` when none is registered.
    pub csi_driver: Option<&'a CSIDriver>,
    /// The catalog ConfigMap (or its absence).
    pub catalog: CatalogInput<'a>,
    /// Feature gates.
    pub gates: Gates,
}

/// What the caller does about the binding.
#[derive(Debug, Clone, PartialEq)]
pub enum BindingAction {
    /// The binding exists and is joined; the pod already carries its UID.
    Join {
        /// Its name.
        name: String,
        /// Its UID.
        uid: String,
    },
    /// Create this binding (`create_or_get`), then call [`Rewrite::complete`] with the object
    /// stored (the one created, or the winner read back on AlreadyExists).
    Create(Box<ModelCacheBinding>),
}

/// A rewritten pod and what the caller must do.
#[derive(Debug, Clone, PartialEq)]
pub struct Rewrite {
    /// The pod to admit. With [`BindingAction::Create`] it lacks the binding UID until
    /// [`Rewrite::complete`].
    pub pod: Pod,
    /// The binding to join or create.
    pub binding: BindingAction,
    /// The flow readers use.
    pub transition: Transition,
    /// How readers reach the copy.
    pub reader_mode: ReaderMode,
    /// The plan the rewrite follows (model, handle, landing, download step).
    pub plan: Plan,
    /// The binding of the pod's compile-cache set to join or create; `None` when the pod has
    /// no set (or it cannot be joined or created now). With [`BindingAction::Create`], call
    /// [`complete_cache_set`] once it is stored or could not be.
    pub cache_set: Option<BindingAction>,
}

impl Rewrite {
    /// The rewrite with the pod's compile-cache set ([`crate::cacheset`]), given the set's
    /// binding found under [`crate::cacheset::CacheSet::binding_name`] (`None`: there is none),
    /// the storage a new one is decided on, and the caller's clock. Unchanged when the pod has
    /// no set, when the set's binding may not be joined (being deleted, Retiring, a failure
    /// record holding, another identity), when no durable storage is decided, or when its
    /// readers would read through hostPath: the pod then keeps its compile caches as they were.
    #[must_use]
    fn with_cache_set(
        mut self,
        req: &Request<'_>,
        found: Option<&ModelCacheBinding>,
        storage: &StorageInputs<'_>,
        now: Timestamp,
    ) -> Rewrite {
        let Some(set) = self.plan.cache_set.clone() else {
            return self;
        };
        let target = set.binding_target(&self.plan);
        let mode_of = |t: Transition| reader_mode(t, req.options.reader_mode, req.namespace_labels);
        let (role, uid, action) = match found {
            Some(b) => {
                let Ok(uid) = check_joinable_for(&target, b, now) else {
                    return self;
                };
                if mode_of(b.spec.decision.transition) == ReaderMode::HostPath {
                    return self;
                }
                let role = if !is_complete(b) {
                    SetRole::Capture
                } else if has_view(b, &self.plan.namespace) {
                    SetRole::Seed
                } else {
                    SetRole::Local
                };
                let action = BindingAction::Join {
                    name: set.binding_name.clone(),
                    uid: uid.clone(),
                };
                (role, Some(uid), action)
            }
            None => {
                let inputs = DecisionInputs {
                    storage_class: storage.storage_class,
                    csi_driver: storage.csi_driver,
                    catalog: storage.catalog,
                    workflow: self.plan.sharing.workflow,
                    gates: storage.gates,
                };
                let Ok(Outcome::Durable(decision)) = warmcache_catalog::decide(&inputs) else {
                    return self;
                };
                if mode_of(decision.decision.transition) == ReaderMode::HostPath {
                    return self;
                }
                let wanted = desired_binding_for(&target, &decision);
                (
                    SetRole::Capture,
                    None,
                    BindingAction::Create(Box::new(wanted)),
                )
            }
        };
        self.pod = render_cache_set(
            self.pod,
            &self.plan,
            &set,
            req.options,
            role,
            uid.as_deref(),
        );
        self.cache_set = Some(action);
        self
    }

    /// The skip when the binding to create could not be created or read back (`why`: the API
    /// error or the timeout): `binding-unavailable`, naming the binding and the model.
    pub fn unavailable(&self, why: impl std::fmt::Display) -> Skip {
        Skip::new(
            SkipReason::BindingUnavailable,
            format!(
                "ModelCacheBinding {}/{} could not be created or read back: {why}; the pod downloads on its own and the next pod of this model tries again",
                shown(self.plan.binding_namespace()),
                shown(&self.plan.binding_name)
            ),
        )
        .with_uri(self.plan.uri.clone())
        .with_selection(own_download(self.plan.sharing.workflow))
    }

    /// The pod to admit once the binding is stored: for [`BindingAction::Create`], `stored` is the
    /// object the API server holds (created by this admission, or the AlreadyExists winner) and
    /// must be what this admission would have created ([`accept_winner`]); its UID is recorded.
    ///
    /// # Errors
    ///
    /// The skip when the stored binding is not this admission's (`binding-conflict`,
    /// `binding-retiring`, `binding-deleting`).
    pub fn complete(self, stored: &ModelCacheBinding) -> Result<Pod, Skip> {
        let wanted = match self.binding {
            BindingAction::Join { .. } => return Ok(self.pod),
            BindingAction::Create(wanted) => wanted,
        };
        let workflow = self.plan.sharing.workflow;
        accept_winner(&wanted, stored).map_err(|s| {
            s.with_uri(self.plan.uri.clone())
                .with_selection(own_download(workflow))
        })?;
        let uid = match stored.metadata.uid.as_deref() {
            Some(uid) if !uid.is_empty() => uid.to_owned(),
            _ => {
                return Err(Skip::new(
                    SkipReason::BindingConflict,
                    format!(
                        "ModelCacheBinding {}: the stored object has no metadata.uid",
                        shown(&self.plan.binding_name)
                    ),
                )
                .with_uri(self.plan.uri.clone())
                .with_selection(own_download(workflow)));
            }
        };
        let selection =
            Selection::durable(workflow, &stored.spec.decision, &stored.spec.storage_class)
                .with_binding(self.plan.binding_name.clone(), uid.clone());
        let mut pod = self.pod;
        let annotations = pod
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        annotations.insert(BINDING_UID_ANNOTATION.to_owned(), uid);
        annotations.insert(
            STORAGE_SELECTION_ANNOTATION.to_owned(),
            selection.to_annotation(),
        );
        Ok(pod)
    }
}

/// The selection of a pod that keeps its own download: the workflow's non-durable mode
/// ([`Mode::fallback`]).
fn own_download(workflow: Workflow) -> Selection {
    Selection::non_durable(workflow, Mode::fallback(workflow))
}

/// `pod` recording `selection`.
fn with_selection(mut pod: Pod, selection: &Selection) -> Pod {
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            STORAGE_SELECTION_ANNOTATION.to_owned(),
            selection.to_annotation(),
        );
    pod
}

/// A pod that already carries this namespace's rewrite: nothing to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unchanged {
    /// The binding it reads.
    pub binding: String,
}

/// The answer of one admission.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Rewrite the pod.
    Rewrite(Box<Rewrite>),
    /// The pod already reads the cache (a re-admission): admit it as it is.
    Unchanged(Unchanged),
    /// Leave the pod alone ([`Skip::annotate`] records why, for in-scope pods).
    Skip(Skip),
}

impl Verdict {
    /// The pod to admit in place of `original`: the rewritten pod, the pod with the skip
    /// recorded, or `original` itself.
    pub fn admitted(&self, original: &Pod) -> Pod {
        match self {
            Verdict::Rewrite(r) => r.pod.clone(),
            Verdict::Unchanged(_) => original.clone(),
            Verdict::Skip(s) => s.annotate(original).unwrap_or_else(|| original.clone()),
        }
    }

    /// The skip, if this is one.
    pub fn skip(&self) -> Option<&Skip> {
        match self {
            Verdict::Skip(s) => Some(s),
            _ => None,
        }
    }
}

/// Whether `binding`'s copy is complete (`status.realized.populationState: Ready`).
fn is_complete(binding: &ModelCacheBinding) -> bool {
    binding
        .status
        .as_ref()
        .and_then(|s| s.realized.as_ref())
        .is_some_and(|r| r.population_state == Some(PopulationState::Ready))
}

/// The skip of a capture source whose readers would read through hostPath.
fn capture_needs_view_claims() -> Skip {
    Skip::new(
        SkipReason::DownloadNotReproducible,
        "the engine downloads by itself what no writer Job can reproduce, and its own download is captured only where readers read view claims; this block storage serves readers through hostPath (readerMode hostPath), so the pod keeps its own download",
    )
}

fn has_view(binding: &ModelCacheBinding, namespace: &str) -> bool {
    binding
        .status
        .as_ref()
        .and_then(|s| s.realized.as_ref())
        .is_some_and(|r| r.views.iter().any(|v| v.namespace == namespace))
}

/// The namespace label of Pod Security admission that rejects pods breaking a level.
pub const POD_SECURITY_ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";

/// How readers reach a cache of `transition`: hostPath readers only for block storage
/// (`roxReadOnly`), and never in a namespace whose Pod Security level (`baseline` or
/// `restricted`) forbids hostPath volumes: the pod would be refused, so it reads the view
/// claim instead.
fn reader_mode(
    transition: Transition,
    configured: ReaderMode,
    namespace_labels: &std::collections::BTreeMap<String, String>,
) -> ReaderMode {
    let forbids_host_path = namespace_labels
        .get(POD_SECURITY_ENFORCE_LABEL)
        .is_some_and(|l| matches!(l.trim(), "baseline" | "restricted"));
    match transition {
        Transition::RoxReadOnly if !forbids_host_path => configured,
        _ => ReaderMode::Pvc,
    }
}

/// The rewrite of `req` planned as `plan`, given the binding found under the plan's name
/// (`None` when there is none), the binding found under its compile-cache set's name
/// ([`crate::cacheset::CacheSet::binding_name`]; `None` when there is none or the pod has no
/// set), the storage a new binding would be decided on, and the time (`now`, the caller's
/// clock) a binding's failure record is compared with ([`check_joinable`]). A rewrite takes its
/// compile-cache set ([`Rewrite::cache_set`]).
pub fn decide(
    req: &Request<'_>,
    plan: Plan,
    binding: Option<&ModelCacheBinding>,
    set_binding: Option<&ModelCacheBinding>,
    storage: &StorageInputs<'_>,
    now: Timestamp,
) -> Verdict {
    match decide_model(req, plan, binding, storage, now) {
        Verdict::Rewrite(r) => {
            Verdict::Rewrite(Box::new(r.with_cache_set(req, set_binding, storage, now)))
        }
        other => other,
    }
}

/// [`decide`] for the model copy alone.
fn decide_model(
    req: &Request<'_>,
    plan: Plan,
    binding: Option<&ModelCacheBinding>,
    storage: &StorageInputs<'_>,
    now: Timestamp,
) -> Verdict {
    let uri = plan.uri.clone();
    let workflow = plan.sharing.workflow;
    // Every pod that gets this far records the storage selection it runs with: durable when it
    // reads the binding, else the workflow's non-durable mode (its own download).
    let skip = |s: Skip| {
        Verdict::Skip(
            s.with_uri(uri.clone())
                .with_selection(own_download(workflow)),
        )
    };
    // The gates come first: switched off, no pod reads a cache, not even an existing one.
    if let Some(off) = storage.gates.caching_off(workflow) {
        return Verdict::Skip(
            Skip::new(
                SkipReason::CachingDisabled,
                format!("{}: {off}", off.reason()),
            )
            .with_uri(uri)
            .with_selection(Selection::non_durable(workflow, Mode::None)),
        );
    }
    match binding {
        Some(b) => {
            let uid = match check_joinable(&plan, b, now) {
                Ok(uid) => uid,
                Err(s) => return skip(s),
            };
            let transition = b.spec.decision.transition;
            let mode = reader_mode(transition, req.options.reader_mode, req.namespace_labels);
            let pending = !has_view(b, &plan.namespace);
            let selection = Selection::durable(workflow, &b.spec.decision, &b.spec.storage_class)
                .with_binding(plan.binding_name.clone(), uid.clone());
            // A capture source keeps its own download until its cache is complete; from then on
            // its pods read the captured copy like any other reader.
            if let Some(capture) = plan.capture.clone()
                && !is_complete(b)
            {
                if mode == ReaderMode::HostPath {
                    return skip(capture_needs_view_claims());
                }
                let pod = with_selection(
                    render_capture(req.pod, &plan, &capture, Some(&uid)),
                    &selection,
                );
                return Verdict::Rewrite(Box::new(Rewrite {
                    pod,
                    binding: BindingAction::Join {
                        name: plan.binding_name.clone(),
                        uid,
                    },
                    transition,
                    reader_mode: mode,
                    plan,
                    cache_set: None,
                }));
            }
            if plan.capture.is_some() && mode == ReaderMode::HostPath {
                return skip(capture_needs_view_claims());
            }
            let mut pod = with_selection(
                render(req.pod, &plan, req.options, mode, Some(&uid), pending),
                &selection,
            );
            // The commit the copy holds, once the download recorded it; a value the pod brought
            // itself is never kept (it would name a commit nobody checked).
            let annotations = pod
                .metadata
                .annotations
                .get_or_insert_with(Default::default);
            match b
                .status
                .as_ref()
                .and_then(|s| s.resolved_revision.as_ref())
                .filter(|r| crate::handle::is_commit(r))
            {
                Some(revision) => {
                    annotations.insert(REVISION_ANNOTATION.to_owned(), revision.clone());
                }
                None => {
                    annotations.remove(REVISION_ANNOTATION);
                }
            }
            Verdict::Rewrite(Box::new(Rewrite {
                pod,
                binding: BindingAction::Join {
                    name: plan.binding_name.clone(),
                    uid,
                },
                transition,
                reader_mode: mode,
                plan,
                cache_set: None,
            }))
        }
        None => {
            let inputs = DecisionInputs {
                storage_class: storage.storage_class,
                csi_driver: storage.csi_driver,
                catalog: storage.catalog,
                workflow: plan.sharing.workflow,
                gates: storage.gates,
            };
            let decision = match warmcache_catalog::decide(&inputs) {
                Ok(Outcome::Durable(d)) => d,
                Ok(Outcome::NonDurable(n)) => {
                    return skip(Skip::new(
                        SkipReason::NoDurableStorage,
                        format!("{}: {n}; the pod downloads on its own", n.reason()),
                    ));
                }
                Err(e) => {
                    return skip(Skip::new(
                        SkipReason::StorageDecisionFailed,
                        format!("no storage decision: {e}"),
                    ));
                }
            };
            let wanted = desired_binding(&plan, &decision);
            let transition = decision.decision.transition;
            let mode = reader_mode(transition, req.options.reader_mode, req.namespace_labels);
            // Durable, without the binding reference until the binding is stored (`complete`).
            let selection =
                Selection::durable(workflow, &wanted.spec.decision, &wanted.spec.storage_class);
            let rendered = match &plan.capture {
                Some(_) if mode == ReaderMode::HostPath => {
                    return skip(capture_needs_view_claims());
                }
                Some(capture) => render_capture(req.pod, &plan, capture, None),
                None => render(req.pod, &plan, req.options, mode, None, true),
            };
            let mut pod = with_selection(rendered, &selection);
            // A new cache has no commit yet: a value the pod brought itself is not kept.
            if let Some(a) = pod.metadata.annotations.as_mut() {
                a.remove(REVISION_ANNOTATION);
            }
            Verdict::Rewrite(Box::new(Rewrite {
                pod,
                binding: BindingAction::Create(Box::new(wanted)),
                transition,
                reader_mode: mode,
                plan,
                cache_set: None,
            }))
        }
    }
}

/// The admitted pod (a rewrite's, after [`Rewrite::complete`]) once the compile-cache set's
/// binding its rewrite creates (`action`, [`Rewrite::cache_set`]) is stored: `stored` is the
/// object the API server holds (created here, or the AlreadyExists winner), `None` when it could
/// not be created or read back. A stored binding that is this admission's gets its UID recorded;
/// otherwise the pod is taken out of the set (it keeps its caches in its scratch directory) and
/// the next pod tries again. A joined set (or none) leaves the pod as it is.
pub fn complete_cache_set(
    action: Option<&BindingAction>,
    pod: Pod,
    stored: Option<&ModelCacheBinding>,
) -> Pod {
    let Some(BindingAction::Create(wanted)) = action else {
        return pod;
    };
    let uid = stored
        .filter(|s| accept_winner(wanted, s).is_ok())
        .and_then(|s| s.metadata.uid.clone())
        .filter(|u| !u.is_empty());
    match uid {
        Some(uid) => {
            let mut pod = pod;
            pod.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(CACHE_BINDING_UID_ANNOTATION.to_owned(), uid);
            pod
        }
        None => without_cache_set(pod),
    }
}

/// One admission, start to end, without a clock: [`admit_at`] with [`Timestamp::MIN`], so a
/// binding's failure record holds whatever its age (offline callers such as `webhook preview`).
pub fn admit<'b>(
    req: &Request<'_>,
    lookup: impl Fn(&str, &str) -> Option<&'b ModelCacheBinding>,
    storage: &StorageInputs<'_>,
) -> Verdict {
    admit_at(req, lookup, storage, Timestamp::MIN)
}

/// One admission, start to end, at `now`: [`plan`], look the binding up with
/// `lookup(namespace, name)` (a cache read), and its compile-cache set's the same way, then
/// [`decide`].
pub fn admit_at<'b>(
    req: &Request<'_>,
    lookup: impl Fn(&str, &str) -> Option<&'b ModelCacheBinding>,
    storage: &StorageInputs<'_>,
    now: Timestamp,
) -> Verdict {
    let plan = match plan(req) {
        Ok(p) => p.at(now),
        Err(v) => return v,
    };
    let found = lookup(plan.binding_namespace(), plan.binding_name());
    let set = plan
        .cache_set()
        .and_then(|s| lookup(plan.binding_namespace(), s.binding_name()));
    decide(req, plan, found, set, storage, now)
}
