//! The one writer of a cache across the namespaces of a sharing domain: the writer Lease.
//!
//! A `helmModelCache` binding names a Lease (`spec.resources.leaseName`, `init-lease-<hash>`) in
//! the control namespace; it records which namespace writes the cache and with which Job
//! (annotations [`WRITER_NAMESPACE_ANNOTATION`], [`WRITER_JOB_ANNOTATION`],
//! [`WRITER_JOB_UID_ANNOTATION`], [`WRITER_STATE_ANNOTATION`]; `holderIdentity` is
//! `<namespace>/<job>` for people). The binding's `spec.resources.writerNamespace` (the first
//! admission's namespace, immutable) is only the preferred first writer; the Lease is the record
//! that decides, and `status.writer` mirrors it.
//!
//! [`elect`] decides, without a client or a clock (the time is passed in):
//!
//! - **No Lease**: creating it is the election (an atomic create: a second controller gets
//!   AlreadyExists and decides again from the winner). The writer is `writerNamespace` when a
//!   reading pod there records a download step, else the first namespace (by name) of the domain
//!   whose pod does; a Job of ours already running in `writerNamespace` (a binding written before
//!   the Lease existed) is recorded as the holder.
//! - **The holder's Job exists**: the holder writes; the Lease records the Job's UID (state
//!   `Running`).
//! - **The holder's Job is gone** (only a NotFound means gone) but a reading pod of the holder's
//!   namespace records a step: the holder starts a new Job (a retry, or the Job a crash after
//!   the Lease write never created).
//! - **The holder's Job is gone and its namespace has no step left**: the Lease is marked `Gone`
//!   (`renewTime` = when it was seen gone); once `renewTime` + the grace period
//!   (`leaseDurationSeconds`) has passed, another namespace of the domain whose pod records a
//!   step **takes over**: the Lease is replaced with its resourceVersion and UID as
//!   preconditions (a conflict means another controller wrote first: decide again), and only
//!   then is a Job created there. A Lease that names a writer which never recorded a Job
//!   (`Starting`) is measured from its `renewTime` (when it was chosen) the same way.
//! - A Lease of an earlier binding of the same cache (another binding UID) is replaced at once;
//!   one without warmcache's labels is never touched ([`LeaseView::Foreign`]).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use warmcache_api_modelcache::v2beta1::{ModelCacheBinding, WriterState, WriterStatus};
use warmcache_api_modelcache::writer_job_name;

use crate::keys::{MANAGED_BY_LABEL, MANAGED_BY_VALUE};
use crate::volume_keys::{
    BINDING_LABEL, BINDING_UID_LABEL_ANNOTATION, WRITER_JOB_ANNOTATION, WRITER_JOB_UID_ANNOTATION,
    WRITER_NAMESPACE_ANNOTATION, WRITER_STATE_ANNOTATION,
};

/// Default grace period before another namespace takes the download over: 2 minutes after the
/// holder's Job was seen gone (a Deployment being rolled gets its pods back well within it).
pub const DEFAULT_TAKEOVER_GRACE_SECONDS: i64 = 120;

/// The writer record a Lease holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterRecord {
    /// The writer namespace.
    pub namespace: String,
    /// The writer Job's name.
    pub job_name: String,
    /// The writer Job's UID, once recorded.
    pub job_uid: Option<String>,
    /// Starting, Running or Gone.
    pub state: WriterState,
    /// The UID of the binding the record is for.
    pub binding_uid: Option<String>,
    /// `acquireTime`: when this writer was chosen.
    pub acquired: Option<Timestamp>,
    /// `renewTime`: when the writer was last confirmed (chosen, its Job recorded, or its Job
    /// seen gone).
    pub renewed: Option<Timestamp>,
    /// `leaseTransitions`: takeovers so far.
    pub transitions: i32,
    /// The Lease's resourceVersion (the precondition of every update).
    pub resource_version: Option<String>,
    /// The Lease's UID (a precondition too).
    pub uid: Option<String>,
}

impl WriterRecord {
    /// The record as `status.writer` shows it.
    pub fn status(&self) -> WriterStatus {
        WriterStatus {
            namespace: self.namespace.clone(),
            job_name: self.job_name.clone(),
            job_uid: self.job_uid.clone(),
            state: Some(self.state),
            takeovers: Some(self.transitions),
        }
    }
}

/// The writer Lease as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseView {
    /// The binding names no Lease (`regularModelCache`): the writer is always
    /// `spec.resources.writerNamespace`.
    NotUsed,
    /// The Lease does not exist.
    Absent,
    /// warmcache's Lease for this cache.
    Ours(WriterRecord),
    /// A Lease under the name that warmcache did not create (or made for another binding name):
    /// never written.
    Foreign(String),
}

/// Reads the writer Lease of `binding` (`None`: not found).
pub fn view(binding: &ModelCacheBinding, lease: Option<&Lease>) -> LeaseView {
    let name = &binding.spec.resources.lease_name;
    if name.is_empty() {
        return LeaseView::NotUsed;
    }
    let Some(lease) = lease else {
        return LeaseView::Absent;
    };
    let labels = lease.metadata.labels.clone().unwrap_or_default();
    let ours = labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY_VALUE)
        && labels.get(BINDING_LABEL) == binding.metadata.name.as_ref();
    if !ours {
        return LeaseView::Foreign(format!(
            "Lease {}/{name}",
            lease.metadata.namespace.clone().unwrap_or_default()
        ));
    }
    let annotations = lease.metadata.annotations.clone().unwrap_or_default();
    let spec = lease.spec.clone().unwrap_or_default();
    let get = |key: &str| annotations.get(key).filter(|v| !v.is_empty()).cloned();
    LeaseView::Ours(WriterRecord {
        namespace: get(WRITER_NAMESPACE_ANNOTATION).unwrap_or_default(),
        job_name: get(WRITER_JOB_ANNOTATION)
            .unwrap_or_else(|| writer_job_name(&binding.spec.identity)),
        job_uid: get(WRITER_JOB_UID_ANNOTATION),
        // An unreadable state is taken as gone: the record then only delays a takeover by
        // the grace period.
        state: get(WRITER_STATE_ANNOTATION)
            .and_then(|s| WriterState::parse(&s))
            .unwrap_or(WriterState::Gone),
        binding_uid: get(BINDING_UID_LABEL_ANNOTATION),
        acquired: spec.acquire_time.map(|t| t.0),
        renewed: spec.renew_time.map(|t| t.0),
        transitions: spec.lease_transitions.unwrap_or(0),
        resource_version: lease.metadata.resource_version.clone(),
        uid: lease.metadata.uid.clone(),
    })
}

/// A write of the writer Lease.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseWrite {
    /// Create it: the election (AlreadyExists: another controller chose first).
    Create(Box<Lease>),
    /// Replace it, with its resourceVersion and UID as preconditions (a conflict: someone
    /// else wrote first).
    Update(Box<Lease>),
    /// Replace it naming another writer namespace (a takeover), with the same preconditions.
    TakeOver(Box<Lease>),
}

impl LeaseWrite {
    /// The Lease written.
    pub fn lease(&self) -> &Lease {
        match self {
            Self::Create(l) | Self::Update(l) | Self::TakeOver(l) => l,
        }
    }
}

/// What [`elect`] decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Election {
    /// The namespace the writer Job runs in (or would): where the lifecycle looks for the Job
    /// and the writer view, and creates them.
    pub namespace: String,
    /// The Lease write that must succeed before a Job is created in [`Election::namespace`]
    /// (a create or a takeover); the lifecycle makes it only when it starts a Job.
    pub claim: Option<LeaseWrite>,
    /// A bookkeeping write (the Job's UID recorded, the holder marked gone), made whatever
    /// else happens.
    pub record: Option<LeaseWrite>,
    /// The previous writer namespace when [`Election::claim`] takes the download over (its
    /// writer claim is released).
    pub previous: Option<String>,
    /// A takeover waits for the grace period: the namespace that will take over and when.
    pub takeover_at: Option<(String, Timestamp)>,
    /// The writer as stored (for `status.writer`).
    pub stored: Option<WriterStatus>,
}

/// Everything [`elect`] reads.
#[derive(Debug, Clone)]
pub struct ElectionInput<'a> {
    /// The binding.
    pub binding: &'a ModelCacheBinding,
    /// Its writer Lease.
    pub lease: &'a LeaseView,
    /// The UID of this binding's writer Job in the holder's namespace (the Lease's, else
    /// `writerNamespace`), `None` when it is gone (NotFound).
    pub holder_job: Option<&'a str>,
    /// Namespaces of the domain with a live reading pod that records a download step.
    pub step_namespaces: &'a BTreeSet<String>,
    /// The time.
    pub now: Timestamp,
    /// Grace period before a takeover, in seconds.
    pub grace_seconds: i64,
}

/// The writer of a binding without a Lease (`regularModelCache`), or whose Lease is foreign:
/// always `spec.resources.writerNamespace`; `holder_job` is the UID of its Job there.
pub fn fixed(b: &ModelCacheBinding, holder_job: Option<&str>) -> Election {
    let namespace = b.spec.resources.writer_namespace.clone();
    let stored = WriterStatus {
        namespace: namespace.clone(),
        job_name: writer_job_name(&b.spec.identity),
        job_uid: holder_job.map(str::to_owned),
        state: holder_job.map(|_| WriterState::Running),
        takeovers: None,
    };
    Election {
        namespace,
        claim: None,
        record: None,
        previous: None,
        takeover_at: None,
        stored: Some(stored),
    }
}

/// The first writer: `writerNamespace` when it has a step, else the first namespace that does.
fn first_writer(input: &ElectionInput<'_>) -> Option<String> {
    let preferred = &input.binding.spec.resources.writer_namespace;
    if input.step_namespaces.contains(preferred) {
        return Some(preferred.clone());
    }
    input.step_namespaces.iter().next().cloned()
}

/// The writer of the download (see the module documentation).
pub fn elect(input: &ElectionInput<'_>) -> Election {
    let b = input.binding;
    let now = input.now;
    let record = match input.lease {
        LeaseView::NotUsed | LeaseView::Foreign(_) => return fixed(b, input.holder_job),
        LeaseView::Absent => None,
        LeaseView::Ours(r) => Some(r),
    };
    let mut out = Election {
        namespace: b.spec.resources.writer_namespace.clone(),
        claim: None,
        record: None,
        previous: None,
        takeover_at: None,
        stored: record.map(WriterRecord::status),
    };
    let stale = record.is_some_and(|r| r.binding_uid.is_some() && r.binding_uid != b.metadata.uid);
    let record = match record {
        Some(r) if !stale && !r.namespace.is_empty() => r,
        _ => {
            // No record for this binding: the first writer, or the Job already running in
            // writerNamespace.
            if record.is_none()
                && let Some(uid) = input.holder_job
            {
                out.record = Some(LeaseWrite::Create(Box::new(writer_lease(
                    b,
                    None,
                    &out.namespace,
                    Some(uid),
                    WriterState::Running,
                    0,
                    now,
                    input.grace_seconds,
                ))));
                return out;
            }
            if let Some(ns) = first_writer(input) {
                let lease = writer_lease(
                    b,
                    record,
                    &ns,
                    None,
                    WriterState::Starting,
                    record.map_or(0, |r| r.transitions.saturating_add(1)),
                    now,
                    input.grace_seconds,
                );
                out.claim = Some(if record.is_some() {
                    LeaseWrite::Update(Box::new(lease))
                } else {
                    LeaseWrite::Create(Box::new(lease))
                });
                out.namespace = ns;
            }
            return out;
        }
    };
    let holder = record.namespace.clone();
    out.namespace.clone_from(&holder);
    if let Some(uid) = input.holder_job {
        if record.job_uid.as_deref() != Some(uid) || record.state != WriterState::Running {
            out.record = Some(LeaseWrite::Update(Box::new(writer_lease(
                b,
                Some(record),
                &holder,
                Some(uid),
                WriterState::Running,
                record.transitions,
                now,
                input.grace_seconds,
            ))));
        }
        return out;
    }
    if input.step_namespaces.contains(&holder) {
        // The holder can start its own Job again.
        return out;
    }
    if record.state == WriterState::Running {
        // First seen gone: the grace period starts now.
        out.record = Some(LeaseWrite::Update(Box::new(writer_lease(
            b,
            Some(record),
            &holder,
            record.job_uid.as_deref(),
            WriterState::Gone,
            record.transitions,
            now,
            input.grace_seconds,
        ))));
    }
    let Some(candidate) = input
        .step_namespaces
        .iter()
        .find(|ns| **ns != holder)
        .cloned()
    else {
        return out;
    };
    let since = match record.state {
        WriterState::Running => now,
        WriterState::Starting | WriterState::Gone => {
            record.renewed.or(record.acquired).unwrap_or(Timestamp::MIN)
        }
    };
    let at = since
        .checked_add(SignedDuration::from_secs(input.grace_seconds.max(0)))
        .unwrap_or(Timestamp::MAX);
    if now < at {
        out.takeover_at = Some((candidate, at));
        return out;
    }
    out.claim = Some(LeaseWrite::TakeOver(Box::new(writer_lease(
        b,
        Some(record),
        &candidate,
        None,
        WriterState::Starting,
        record.transitions.saturating_add(1),
        now,
        input.grace_seconds,
    ))));
    out.previous = Some(holder);
    out.namespace = candidate;
    out
}

/// The writer Lease of `binding` naming `namespace` as the writer. `base` is the Lease as
/// observed (its resourceVersion and UID become the update's preconditions, and its acquire
/// time is kept while the writer namespace stays the same).
#[allow(clippy::too_many_arguments)]
pub fn writer_lease(
    binding: &ModelCacheBinding,
    base: Option<&WriterRecord>,
    namespace: &str,
    job_uid: Option<&str>,
    state: WriterState,
    transitions: i32,
    now: Timestamp,
    grace_seconds: i64,
) -> Lease {
    let job = writer_job_name(&binding.spec.identity);
    let name = binding.metadata.name.clone().unwrap_or_default();
    let mut annotations = BTreeMap::from([
        (WRITER_NAMESPACE_ANNOTATION.to_owned(), namespace.to_owned()),
        (WRITER_JOB_ANNOTATION.to_owned(), job.clone()),
        (
            WRITER_STATE_ANNOTATION.to_owned(),
            state.as_str().to_owned(),
        ),
        (
            BINDING_UID_LABEL_ANNOTATION.to_owned(),
            binding.metadata.uid.clone().unwrap_or_default(),
        ),
    ]);
    if let Some(uid) = job_uid {
        annotations.insert(WRITER_JOB_UID_ANNOTATION.to_owned(), uid.to_owned());
    }
    let same_writer = base.filter(|r| r.namespace == namespace);
    let acquired = same_writer.and_then(|r| r.acquired).unwrap_or(now);
    Lease {
        metadata: ObjectMeta {
            name: Some(binding.spec.resources.lease_name.clone()),
            namespace: binding.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([
                (MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned()),
                (BINDING_LABEL.to_owned(), name),
            ])),
            annotations: Some(annotations),
            resource_version: base.and_then(|r| r.resource_version.clone()),
            uid: base.and_then(|r| r.uid.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(format!("{namespace}/{job}")),
            lease_duration_seconds: Some(i32::try_from(grace_seconds).unwrap_or(i32::MAX)),
            acquire_time: Some(MicroTime(acquired)),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::binding;
    use warmcache_api_modelcache::init_lease_name;
    use warmcache_api_modelcache::v2beta1::Transition;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn leased() -> ModelCacheBinding {
        let mut b = binding(Transition::RwxReadOnly);
        b.spec.resources.lease_name = init_lease_name(&b.spec.identity);
        b
    }

    fn stored(b: &ModelCacheBinding, write: &LeaseWrite, rv: &str) -> WriterRecord {
        let mut lease = write.lease().clone();
        lease.metadata.resource_version = Some(rv.into());
        lease.metadata.uid = Some("lease-uid".into());
        match view(b, Some(&lease)) {
            LeaseView::Ours(r) => r,
            other => panic!("{other:?}"),
        }
    }

    fn input<'a>(
        b: &'a ModelCacheBinding,
        lease: &'a LeaseView,
        job: Option<&'a str>,
        steps: &'a BTreeSet<String>,
        now: Timestamp,
    ) -> ElectionInput<'a> {
        ElectionInput {
            binding: b,
            lease,
            holder_job: job,
            step_namespaces: steps,
            now,
            grace_seconds: 60,
        }
    }

    fn set(ns: &[&str]) -> BTreeSet<String> {
        ns.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn without_a_lease_name_the_writer_is_the_first_namespace() {
        let b = binding(Transition::RwxReadOnly);
        let steps = set(&["team-b"]);
        let e = elect(&input(&b, &LeaseView::NotUsed, None, &steps, at(0)));
        assert_eq!(e.namespace, "team-a");
        assert!(e.claim.is_none() && e.record.is_none() && e.takeover_at.is_none());
        assert_eq!(e.stored.unwrap().namespace, "team-a");
        assert_eq!(view(&b, None), LeaseView::NotUsed);
    }

    #[test]
    fn creating_the_lease_is_the_election_of_the_first_writer() {
        let b = leased();
        // writerNamespace has a step: it writes.
        let steps = set(&["team-a", "team-b"]);
        let e = elect(&input(&b, &LeaseView::Absent, None, &steps, at(0)));
        assert_eq!(e.namespace, "team-a");
        let Some(LeaseWrite::Create(lease)) = &e.claim else {
            panic!("{e:?}")
        };
        let a = lease.metadata.annotations.as_ref().unwrap();
        assert_eq!(a[WRITER_NAMESPACE_ANNOTATION], "team-a");
        assert_eq!(a[WRITER_STATE_ANNOTATION], "Starting");
        assert_eq!(a[BINDING_UID_LABEL_ANNOTATION], "binding-uid-1");
        assert_eq!(
            lease.metadata.name.as_deref(),
            Some(b.spec.resources.lease_name.as_str())
        );
        assert_eq!(
            lease.metadata.namespace.as_deref(),
            Some("nvca-modelcache-init")
        );
        assert!(lease.metadata.resource_version.is_none());
        // writerNamespace has no reading pod left: the first namespace that has one writes.
        let steps = set(&["team-c", "team-b"]);
        let e = elect(&input(&b, &LeaseView::Absent, None, &steps, at(0)));
        assert_eq!(e.namespace, "team-b");
        // Nobody records a step: nothing is claimed.
        let e = elect(&input(
            &b,
            &LeaseView::Absent,
            None,
            &BTreeSet::new(),
            at(0),
        ));
        assert!(e.claim.is_none());
        assert_eq!(e.namespace, "team-a");
        // A Job already running in writerNamespace (written before the Lease existed) is
        // recorded as the holder, whatever the steps.
        let e = elect(&input(&b, &LeaseView::Absent, Some("job-1"), &steps, at(0)));
        assert_eq!(e.namespace, "team-a");
        assert!(e.claim.is_none());
        let Some(LeaseWrite::Create(lease)) = &e.record else {
            panic!("{e:?}")
        };
        assert_eq!(
            lease.metadata.annotations.as_ref().unwrap()[WRITER_JOB_UID_ANNOTATION],
            "job-1"
        );
    }

    #[test]
    fn the_holder_records_its_job_then_keeps_writing() {
        let b = leased();
        let steps = set(&["team-a"]);
        let first = elect(&input(&b, &LeaseView::Absent, None, &steps, at(0)));
        let rec = stored(&b, first.claim.as_ref().unwrap(), "1");
        assert_eq!(rec.state, WriterState::Starting);
        let lease = LeaseView::Ours(rec);
        let e = elect(&input(&b, &lease, Some("job-1"), &steps, at(5)));
        assert_eq!(e.namespace, "team-a");
        let Some(w @ LeaseWrite::Update(l)) = &e.record else {
            panic!("{e:?}")
        };
        assert_eq!(l.metadata.resource_version.as_deref(), Some("1"));
        assert_eq!(l.metadata.uid.as_deref(), Some("lease-uid"));
        let rec = stored(&b, w, "2");
        assert_eq!(rec.job_uid.as_deref(), Some("job-1"));
        assert_eq!(rec.state, WriterState::Running);
        assert_eq!(rec.acquired, Some(at(0)), "the acquire time is kept");
        // Recorded: nothing more to write, even with no step left anywhere.
        let lease = LeaseView::Ours(rec);
        let e = elect(&input(&b, &lease, Some("job-1"), &BTreeSet::new(), at(9)));
        assert!(e.record.is_none() && e.claim.is_none());
        assert_eq!(e.stored.unwrap().job_uid.as_deref(), Some("job-1"));
    }

    #[test]
    fn a_gone_holder_is_taken_over_only_after_the_grace_period() {
        let b = leased();
        let steps = set(&["team-a"]);
        let first = elect(&input(&b, &LeaseView::Absent, None, &steps, at(0)));
        let rec = stored(&b, first.claim.as_ref().unwrap(), "1");
        let running = elect(&input(
            &b,
            &LeaseView::Ours(rec),
            Some("job-1"),
            &steps,
            at(1),
        ));
        let rec = stored(&b, running.record.as_ref().unwrap(), "2");

        // Job gone, but the holder still has a pod with a step: it writes again itself.
        let lease = LeaseView::Ours(rec.clone());
        let e = elect(&input(&b, &lease, None, &steps, at(100)));
        assert_eq!(e.namespace, "team-a");
        assert!(e.claim.is_none() && e.record.is_none() && e.takeover_at.is_none());

        // Job gone and no pod left in the holder's namespace; team-b has one: marked gone,
        // taken over after the grace period.
        let others = set(&["team-b"]);
        let e = elect(&input(&b, &lease, None, &others, at(100)));
        assert_eq!(e.namespace, "team-a");
        assert!(e.claim.is_none());
        assert_eq!(e.takeover_at, Some(("team-b".to_owned(), at(160))));
        let gone = stored(&b, e.record.as_ref().unwrap(), "3");
        assert_eq!(gone.state, WriterState::Gone);
        assert_eq!(gone.renewed, Some(at(100)));
        let lease = LeaseView::Ours(gone);
        let e = elect(&input(&b, &lease, None, &others, at(159)));
        assert!(e.claim.is_none() && e.record.is_none());
        assert_eq!(e.takeover_at, Some(("team-b".to_owned(), at(160))));
        let e = elect(&input(&b, &lease, None, &others, at(160)));
        assert_eq!(e.namespace, "team-b");
        assert_eq!(e.previous.as_deref(), Some("team-a"));
        let Some(w @ LeaseWrite::TakeOver(l)) = &e.claim else {
            panic!("{e:?}")
        };
        assert_eq!(
            l.metadata.resource_version.as_deref(),
            Some("3"),
            "rv precondition"
        );
        assert_eq!(
            l.metadata.uid.as_deref(),
            Some("lease-uid"),
            "uid precondition"
        );
        let taken = stored(&b, w, "4");
        assert_eq!(taken.namespace, "team-b");
        assert_eq!(taken.state, WriterState::Starting);
        assert_eq!(taken.transitions, 1);
        assert_eq!(taken.job_uid, None);
        assert_eq!(taken.acquired, Some(at(160)));
        assert_eq!(
            l.spec.as_ref().unwrap().holder_identity.as_deref(),
            Some(format!("team-b/{}", writer_job_name(&b.spec.identity)).as_str())
        );

        // Nobody else has a step: marked gone, no takeover planned.
        let lease = LeaseView::Ours(rec);
        let e = elect(&input(&b, &lease, None, &BTreeSet::new(), at(100)));
        assert!(e.takeover_at.is_none() && e.claim.is_none());
        assert!(e.record.is_some());
    }

    #[test]
    fn a_writer_chosen_without_a_job_is_measured_from_its_choice() {
        // A crash after the Lease write, and the chosen namespace's pods gone since.
        let b = leased();
        let first = elect(&input(
            &b,
            &LeaseView::Absent,
            None,
            &set(&["team-a"]),
            at(0),
        ));
        let lease = LeaseView::Ours(stored(&b, first.claim.as_ref().unwrap(), "1"));
        let others = set(&["team-b"]);
        let e = elect(&input(&b, &lease, None, &others, at(30)));
        assert!(
            e.record.is_none(),
            "no gone mark needed: measured from the choice"
        );
        assert_eq!(e.takeover_at, Some(("team-b".to_owned(), at(60))));
        let e = elect(&input(&b, &lease, None, &others, at(61)));
        assert_eq!(e.namespace, "team-b");
    }

    #[test]
    fn foreign_and_stale_leases() {
        let b = leased();
        let steps = set(&["team-b"]);
        let first = elect(&input(&b, &LeaseView::Absent, None, &steps, at(0)));
        let mut foreign = first.claim.as_ref().unwrap().lease().clone();
        foreign.metadata.labels = None;
        let v = view(&b, Some(&foreign));
        assert!(
            matches!(&v, LeaseView::Foreign(what) if what.contains(&b.spec.resources.lease_name))
        );
        let e = elect(&input(&b, &v, None, &steps, at(0)));
        assert!(e.claim.is_none() && e.record.is_none(), "never written");

        // A record of an earlier binding of the same cache is replaced at once.
        let mut other = b.clone();
        other.metadata.uid = Some("old-binding".into());
        let old = elect(&input(
            &other,
            &LeaseView::Absent,
            None,
            &set(&["team-a"]),
            at(0),
        ));
        let lease = LeaseView::Ours(stored(&b, old.claim.as_ref().unwrap(), "7"));
        let e = elect(&input(&b, &lease, None, &steps, at(1)));
        assert_eq!(e.namespace, "team-b");
        let Some(LeaseWrite::Update(l)) = &e.claim else {
            panic!("{e:?}")
        };
        assert_eq!(l.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(
            l.metadata.annotations.as_ref().unwrap()[BINDING_UID_LABEL_ANNOTATION],
            "binding-uid-1"
        );
    }
}
