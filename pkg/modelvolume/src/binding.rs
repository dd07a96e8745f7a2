//! The binding an admission creates, and whether an existing one may be joined.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use warmcache_api_modelcache::v2beta1::{
    BindingIdentity, BindingResources, ModelCacheBinding, ModelCacheBindingSpec, PopulationState,
    Workflow,
};
use warmcache_api_modelcache::{
    FINALIZER, identity_hash, init_lease_name, reader_pvc_name, writer_job_name, writer_pvc_name,
};
use warmcache_catalog::Decision;
use warmcache_cli::text::shown;

use crate::keys::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, TRACE_PARENT_ANNOTATION};
use crate::lifecycle::FAILURE_RECORD_CLOCK_MARGIN_SECONDS;
use crate::plan::Plan;
use crate::skip::{Skip, SkipReason};

/// The binding `plan` needs, with the storage decision `decision`: deterministic name in the
/// control namespace, warmcache's finalizer, the admission's trace context, and the names of
/// every object it will own (writer claim and Job; the reader claim for `regularModelCache`;
/// the writer Lease for `helmModelCache`; the StorageClass and Secret of an encrypted cache).
/// The writer runs in the pod's namespace, where its credentials are.
pub fn desired_binding(plan: &Plan, decision: &Decision) -> ModelCacheBinding {
    desired_binding_for(&plan.binding_target(), decision)
}

/// What a binding is made for and joined by: a model copy ([`Plan::binding_target`]) or a
/// compile-cache set ([`crate::cacheset::CacheSet::binding_target`]).
#[derive(Debug, Clone)]
pub(crate) struct BindingTarget<'a> {
    pub(crate) identity: &'a BindingIdentity,
    pub(crate) name: &'a str,
    pub(crate) control_namespace: &'a str,
    /// The pod's namespace (the writer namespace a new binding records).
    pub(crate) namespace: &'a str,
    pub(crate) sharing: &'a crate::scope::SharingDomain,
    /// The cache handle, for messages.
    pub(crate) handle: String,
    pub(crate) traceparent: Option<&'a str>,
}

/// [`desired_binding`] for any target.
pub(crate) fn desired_binding_for(
    target: &BindingTarget<'_>,
    decision: &Decision,
) -> ModelCacheBinding {
    let identity = target.identity.clone();
    let hash = identity_hash(&identity);
    let mut claims = vec![writer_pvc_name(&identity)];
    if identity.workflow == Workflow::RegularModelCache {
        claims.push(reader_pvc_name(&identity));
    }
    let encrypted = decision.decision.encryption_required;
    let resources = BindingResources {
        writer_namespace: target.namespace.to_owned(),
        persistent_volume_claim_names: claims,
        persistent_volume_names: Vec::new(),
        job_names: vec![writer_job_name(&identity)],
        storage_class_names: if encrypted {
            vec![format!("{hash}-sc")]
        } else {
            Vec::new()
        },
        secret_names: if encrypted {
            vec![hash.clone()]
        } else {
            Vec::new()
        },
        lease_name: if identity.workflow == Workflow::HelmModelCache {
            init_lease_name(&identity)
        } else {
            String::new()
        },
    };
    let spec = ModelCacheBindingSpec {
        identity,
        decision: decision.decision.clone(),
        storage_class: decision.storage_class.clone(),
        resources,
    };
    let mut binding = ModelCacheBinding::new(target.name, spec);
    binding.metadata = ObjectMeta {
        name: Some(target.name.to_owned()),
        namespace: Some(target.control_namespace.to_owned()),
        finalizers: Some(vec![FINALIZER.to_owned()]),
        labels: Some(BTreeMap::from([(
            MANAGED_BY_LABEL.to_owned(),
            MANAGED_BY_VALUE.to_owned(),
        )])),
        annotations: target
            .traceparent
            .map(|t| BTreeMap::from([(TRACE_PARENT_ANNOTATION.to_owned(), t.to_owned())])),
        ..ObjectMeta::default()
    };
    binding
}

/// Whether two identities name the same cache: workflow and both digests. The contract version
/// is left out, as it is left out of the name: a binding recorded under a later contract version
/// is still this cache.
fn same_identity(a: &BindingIdentity, b: &BindingIdentity) -> bool {
    a.workflow == b.workflow
        && a.sharing_domain_digest == b.sharing_domain_digest
        && a.cache_handle_digest == b.cache_handle_digest
}

fn conflict(name: &str, why: impl std::fmt::Display) -> Skip {
    Skip::new(
        SkipReason::BindingConflict,
        format!("ModelCacheBinding {}: {why}", shown(name)),
    )
}

/// Whether `binding` (read under `plan`'s binding name) may be joined at `now`: the same
/// identity, in the control namespace, carrying warmcache's finalizer, with a UID, not being
/// deleted, not Retiring, and no failure record that still holds at `now`. Admission treats a
/// record as holding until `status.failureRecord.retryAfter` plus
/// [`FAILURE_RECORD_CLOCK_MARGIN_SECONDS`] (30 s), so a webhook whose clock runs behind the
/// controller's does not join before the controller retries. A failed binding whose record has
/// expired is joined again: the binding controller then retries the download. A failed binding
/// without a record (written before records existed) is not joined until the controller
/// records one. `now` is the caller's
/// clock (no clock is read here); [`Timestamp::MIN`] makes every failure record hold.
///
/// # Errors
///
/// The skip: `binding-conflict`, `binding-deleting`, `binding-retiring` or `download-failed`.
pub fn check_joinable(
    plan: &Plan,
    binding: &ModelCacheBinding,
    now: Timestamp,
) -> Result<String, Skip> {
    check_joinable_for(&plan.binding_target(), binding, now)
}

/// [`check_joinable`] for any target.
pub(crate) fn check_joinable_for(
    target: &BindingTarget<'_>,
    binding: &ModelCacheBinding,
    now: Timestamp,
) -> Result<String, Skip> {
    let name = target.name;
    if binding.metadata.name.as_deref() != Some(name) {
        return Err(conflict(
            name,
            format!(
                "the object given is named {}",
                shown(binding.metadata.name.as_deref().unwrap_or_default())
            ),
        ));
    }
    if let Some(ns) = binding.metadata.namespace.as_deref()
        && ns != target.control_namespace
    {
        return Err(conflict(
            name,
            format!(
                "it lives in namespace {}, not in the control namespace {}",
                shown(ns),
                shown(target.control_namespace)
            ),
        ));
    }
    if !same_identity(&binding.spec.identity, target.identity) {
        return Err(conflict(
            name,
            format!(
                "it records another identity (workflow {}, other sharing domain or cache handle digests) than this pod's ({} in {} {}, handle {}); it is left alone and never adopted",
                binding.spec.identity.workflow.as_str(),
                target.identity.workflow.as_str(),
                target.sharing.workflow.as_str(),
                shown(&target.sharing.domain),
                shown(&target.handle)
            ),
        ));
    }
    if !binding
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER)
    {
        return Err(conflict(
            name,
            format!(
                "it lacks the finalizer {FINALIZER}: warmcache did not create it and does not adopt it"
            ),
        ));
    }
    if binding.metadata.deletion_timestamp.is_some() {
        return Err(Skip::new(
            SkipReason::BindingDeleting,
            format!(
                "ModelCacheBinding {} is being deleted; the pod downloads on its own until a new binding exists",
                shown(name)
            ),
        ));
    }
    if binding.is_retiring() {
        return Err(Skip::new(
            SkipReason::BindingRetiring,
            format!(
                "ModelCacheBinding {} is Retiring: it had no readers past the idle period and is never joined again; the pod downloads on its own, and pods admitted after the reaper removed it get a new cache",
                shown(name)
            ),
        ));
    }
    let margin = SignedDuration::from_secs(FAILURE_RECORD_CLOCK_MARGIN_SECONDS);
    if let Some(record) = binding
        .status
        .as_ref()
        .and_then(|s| s.failure_record.as_ref())
        .filter(|r| r.holds_at(now.checked_sub(margin).unwrap_or(Timestamp::MIN)))
    {
        let until = record
            .retry_after
            .0
            .checked_add(margin)
            .unwrap_or(Timestamp::MAX);
        return Err(Skip::new(
            SkipReason::DownloadFailed,
            format!(
                "the download of ModelCacheBinding {} failed at {} (see its conditions); pods download on their own until {} (retryAfter {} plus {FAILURE_RECORD_CLOCK_MARGIN_SECONDS} s for clock skew), when admission joins the cache again and the binding controller retries",
                shown(name),
                record.failed_at.0,
                until,
                record.retry_after.0
            ),
        ));
    }
    let status = binding.status.as_ref();
    let failed_without_record = status.is_some_and(|s| s.failure_record.is_none())
        && status
            .and_then(|s| s.realized.as_ref())
            .and_then(|r| r.population_state)
            == Some(PopulationState::Failed);
    if failed_without_record {
        return Err(Skip::new(
            SkipReason::DownloadFailed,
            format!(
                "the download of ModelCacheBinding {} failed (see its conditions) and no failure record says until when; the pod downloads on its own until the binding controller records one",
                shown(name)
            ),
        ));
    }
    // An encrypted copy whose key is gone: no reader could open it.
    let key_missing = status.is_some_and(|s| {
        s.conditions.iter().any(|c| {
            c.type_ == crate::lifecycle::DEGRADED
                && c.status == "True"
                && c.reason == crate::lifecycle::Reason::EncryptionKeyMissing.as_str()
        })
    });
    if key_missing {
        return Err(Skip::new(
            SkipReason::BindingUnavailable,
            format!(
                "ModelCacheBinding {} is an encrypted cache whose key Secret is gone (Degraded/EncryptionKeyMissing): no reader could open it; the pod downloads on its own",
                shown(name)
            ),
        ));
    }
    match binding.metadata.uid.as_deref() {
        Some(uid) if !uid.is_empty() => Ok(uid.to_owned()),
        _ => Err(conflict(
            name,
            "it has no metadata.uid (not read from the API server)",
        )),
    }
}

/// Whether the binding that won a create race (`winner`, read back on AlreadyExists) is the one
/// this admission would have created (`wanted`): the same name, identity, decision, StorageClass
/// and owned object names. The writer namespace may differ in a `helmModelCache` domain (any
/// namespace of the domain may have been first); everything else must be equal, or the caches
/// were decided differently (a StorageClass or catalog change between the two admissions) and
/// the loser does not adopt it.
///
/// # Errors
///
/// A `binding-conflict` skip naming the part that differs (or the reason the winner may not be
/// joined at all: deleting, Retiring, failed).
pub fn accept_winner(wanted: &ModelCacheBinding, winner: &ModelCacheBinding) -> Result<(), Skip> {
    let name = wanted.metadata.name.as_deref().unwrap_or_default();
    if winner.metadata.name != wanted.metadata.name {
        return Err(conflict(name, "the object read back has another name"));
    }
    let (w, s) = (&wanted.spec, &winner.spec);
    if !same_identity(&w.identity, &s.identity) {
        return Err(conflict(
            name,
            "the existing binding records another identity",
        ));
    }
    if w.decision != s.decision {
        return Err(conflict(
            name,
            format!(
                "the existing binding was decided on provider {} ({}, profile {}), this admission decided provider {} ({}, profile {}): the storage changed between the two decisions",
                shown(&s.decision.provider),
                s.decision.transition.as_str(),
                shown(&s.decision.catalog_digest),
                shown(&w.decision.provider),
                w.decision.transition.as_str(),
                shown(&w.decision.catalog_digest)
            ),
        ));
    }
    if w.storage_class != s.storage_class {
        return Err(conflict(
            name,
            "the existing binding pins another StorageClass nvcf-sc (UID or configuration digest)",
        ));
    }
    let mut theirs = s.resources.clone();
    if w.identity.workflow == Workflow::HelmModelCache {
        theirs
            .writer_namespace
            .clone_from(&w.resources.writer_namespace);
    }
    if theirs != w.resources {
        return Err(conflict(
            name,
            format!(
                "the existing binding names other resources (writer namespace {})",
                shown(&s.resources.writer_namespace)
            ),
        ));
    }
    if !winner
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER)
    {
        return Err(conflict(
            name,
            format!("it lacks the finalizer {FINALIZER}"),
        ));
    }
    if winner.metadata.deletion_timestamp.is_some() {
        return Err(Skip::new(
            SkipReason::BindingDeleting,
            format!("ModelCacheBinding {} is being deleted", shown(name)),
        ));
    }
    if winner.is_retiring() {
        return Err(Skip::new(
            SkipReason::BindingRetiring,
            format!(
                "ModelCacheBinding {} is Retiring and is never joined again",
                shown(name)
            ),
        ));
    }
    Ok(())
}
