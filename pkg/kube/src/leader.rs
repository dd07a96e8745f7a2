//! Lease-based leader election (`coordination.k8s.io/v1` Lease).
//!
//! Every replica of a controller runs a [`LeaderElector`]; at most one of them holds the Lease and
//! is the leader. Controllers keep computing on every replica but check
//! [`Leadership::is_leader`] (or [`Leadership::ensure_leader`]) before every write, and may watch
//! [`Leadership::subscribe`] to start and stop leader-only loops.
//!
//! How it stays safe:
//! - Every write of the Lease carries the resourceVersion read just before it (optimistic
//!   concurrency): two contenders can never both "win" the same Lease version.
//! - Expiry is judged on the contender's own monotonic clock, never by comparing the holder's
//!   `renewTime` with the local wall clock (as client-go does). Each contender remembers the
//!   Lease record it last read (the whole spec plus `resourceVersion`, see [`Observation`]) and
//!   when it first saw that exact record. It takes the Lease over only when the record has not
//!   changed for the holder's `leaseDurationSeconds` (ours if unset) since then, and increments
//!   `leaseTransitions` when the holder changes. A live holder changes the record with every
//!   renewal, so it keeps the Lease however far its wall clock is from ours; a dead one loses
//!   it one lease duration after we first saw its last record, even if its clock ran ahead.
//!   A Lease without a holder (released) is free at once.
//! - The leader's own claim expires locally `renew_deadline` after the start of its last
//!   successful renewal (measured on the monotonic clock). A contender can only have seen that
//!   renewal after it was written, so it waits at least `lease_duration` past that start;
//!   `renew_deadline < lease_duration`, so a leader whose renewals fail stops considering itself
//!   leader (and [`Leadership::is_leader`] turns false, even if the election task is stuck)
//!   before anyone else may take the Lease. Wall-clock offsets between replicas do not matter;
//!   this only assumes their clocks run at nearly the same rate.
//! - On cancellation the leader first stops reporting leadership, then releases the Lease (empty
//!   holder) so a successor can take over at once instead of waiting for expiry.
//!
//! The decision itself ([`observe`], [`decide`], [`desired_spec`], [`released_spec`]) is pure
//! and unit tested over synthetic times; the task around it only does I/O. The wall clock is used
//! only for the `acquireTime` / `renewTime` written into the Lease, which other tools display.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::error::{Error, is_already_exists, is_conflict};

/// Timing of the election. The defaults match client-go's (15 s / 10 s / 2 s).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// How long a Lease stays valid without a change to its record: a contender takes over only
    /// after it has seen the same record for this long on its own monotonic clock. Stored in
    /// whole seconds (rounded up) as `leaseDurationSeconds`; a holder's stored value is what
    /// contenders use.
    pub lease_duration: Duration,
    /// How long the leader keeps leading without a successful renewal. Must be shorter than
    /// `lease_duration`: the gap is the safety margin for request latency and clock-rate drift
    /// between replicas.
    pub renew_deadline: Duration,
    /// Pause between attempts to acquire or renew (jittered up to +20% while not leading).
    /// Must be shorter than `renew_deadline`.
    pub retry_period: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl LeaseConfig {
    /// Checks `retry_period < renew_deadline < lease_duration`, `lease_duration >= 1s` and
    /// that no duration is zero.
    pub fn validate(&self) -> Result<(), LeaderElectionError> {
        let invalid = |why: &str| Err(LeaderElectionError::InvalidConfig(why.to_owned()));
        if self.retry_period.is_zero() {
            return invalid("retry_period must be greater than zero");
        }
        if self.lease_duration < Duration::from_secs(1) {
            return invalid("lease_duration must be at least one second");
        }
        if self.lease_duration.as_secs() > i32::MAX as u64 {
            return invalid("lease_duration is too large");
        }
        if self.renew_deadline >= self.lease_duration {
            return invalid("renew_deadline must be shorter than lease_duration");
        }
        if self.retry_period >= self.renew_deadline {
            return invalid("retry_period must be shorter than renew_deadline");
        }
        Ok(())
    }

    /// `lease_duration` in whole seconds, rounded up, as stored in `leaseDurationSeconds`.
    pub fn lease_duration_seconds(&self) -> i32 {
        let secs =
            self.lease_duration.as_secs() + u64::from(self.lease_duration.subsec_nanos() > 0);
        i32::try_from(secs).unwrap_or(i32::MAX)
    }
}

/// Errors building a [`LeaderElector`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaderElectionError {
    /// The [`LeaseConfig`] is inconsistent.
    #[error("invalid leader election timing: {0}")]
    InvalidConfig(String),
    /// The identity (which must be unique per replica, usually the pod name) is empty.
    #[error("leader election identity must not be empty")]
    EmptyIdentity,
    /// The lease name is empty.
    #[error("leader election lease name must not be empty")]
    EmptyLeaseName,
}

/// Returned by [`Leadership::ensure_leader`] when this replica must not write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("this replica does not hold the leader lease; the write was skipped")]
pub struct NotLeader;

/// One version of the Lease record as this replica read it: the whole spec plus the object's
/// `resourceVersion`. Any difference between two reads (a renewal, a takeover, a release, or any
/// other write to the object) counts as a sign of life of the holder.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LeaseRecord {
    /// The Lease spec (holderIdentity, acquireTime, renewTime, leaseDurationSeconds,
    /// leaseTransitions, ...).
    pub spec: LeaseSpec,
    /// `metadata.resourceVersion` of the object the spec was read from.
    pub resource_version: Option<String>,
}

impl LeaseRecord {
    /// The record of a Lease object as read from the API (a missing spec reads as empty).
    pub fn of(lease: &Lease) -> Self {
        Self {
            spec: lease.spec.clone().unwrap_or_default(),
            resource_version: lease.metadata.resource_version.clone(),
        }
    }
}

/// The Lease record this replica last saw, and when it first saw that exact record, on its own
/// monotonic clock. Other replicas' wall clocks never enter the decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    /// The record last read.
    pub record: LeaseRecord,
    /// When (monotonic, this replica's clock) `record` was first read.
    pub observed_at: Instant,
}

/// Folds a freshly read `record` into the previous observation: an unchanged record keeps the
/// time it was first seen, a changed (or first) one is stamped with `now`.
pub fn observe(previous: Option<Observation>, record: LeaseRecord, now: Instant) -> Observation {
    match previous {
        Some(previous) if previous.record == record => previous,
        _ => Observation {
            record,
            observed_at: now,
        },
    }
}

/// What to do with the Lease, given what we observed of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseAction {
    /// No Lease object exists: create it, held by us.
    Create,
    /// The Lease is free (no holder) or its holder let it expire: take it over, with this
    /// `leaseTransitions` value.
    Acquire {
        /// The `leaseTransitions` to write.
        lease_transitions: i32,
    },
    /// We hold the Lease: renew it.
    Renew,
    /// Somebody else holds a valid Lease: do nothing until at least `expires_at`.
    Wait {
        /// The current holder.
        holder: String,
        /// When (monotonic, our clock) the holder's claim runs out unless the record changes
        /// before then.
        expires_at: Instant,
    },
}

/// Decides what `identity` should do, given the last `observation` of the Lease (`None`: there
/// is no Lease object) at monotonic time `now` (the clock `observed_at` was taken from).
///
/// A Lease held by someone else stays valid until `observed_at` plus the record's
/// `leaseDurationSeconds` (or `config.lease_duration` if unset): the holder must change the
/// record within that time, as measured on our clock, or lose it. The record's `renewTime` and
/// `acquireTime` are never compared against our wall clock, so clock skew between replicas
/// cannot end a live holder's claim early nor extend a dead one's. A Lease without a holder is
/// free at once.
pub fn decide(
    observation: Option<&Observation>,
    now: Instant,
    identity: &str,
    config: &LeaseConfig,
) -> LeaseAction {
    let Some(observation) = observation else {
        return LeaseAction::Create;
    };
    let spec = &observation.record.spec;
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder == identity && !identity.is_empty() {
        return LeaseAction::Renew;
    }
    let transitions = spec.lease_transitions.unwrap_or(0);
    let take_over = LeaseAction::Acquire {
        lease_transitions: transitions.saturating_add(1),
    };
    if holder.is_empty() {
        return take_over;
    }
    let duration = match spec.lease_duration_seconds {
        Some(secs) if secs > 0 => Duration::from_secs(u64::from(secs.unsigned_abs())),
        _ => config.lease_duration,
    };
    match observation.observed_at.checked_add(duration) {
        Some(expires_at) if now >= expires_at => take_over,
        Some(expires_at) => LeaseAction::Wait {
            holder: holder.to_owned(),
            expires_at,
        },
        // Unrepresentably far in the future: the claim cannot have run out yet.
        None => LeaseAction::Wait {
            holder: holder.to_owned(),
            expires_at: now.checked_add(config.lease_duration).unwrap_or(now),
        },
    }
}

/// The Lease spec to write for `action` (`None` for [`LeaseAction::Wait`]).
pub fn desired_spec(
    action: &LeaseAction,
    previous: Option<&LeaseSpec>,
    now: Timestamp,
    identity: &str,
    config: &LeaseConfig,
) -> Option<LeaseSpec> {
    let base = previous.cloned().unwrap_or_default();
    let stamp = Some(MicroTime(now));
    let duration = Some(config.lease_duration_seconds());
    match action {
        LeaseAction::Wait { .. } => None,
        LeaseAction::Create => Some(LeaseSpec {
            holder_identity: Some(identity.to_owned()),
            lease_duration_seconds: duration,
            acquire_time: stamp.clone(),
            renew_time: stamp,
            lease_transitions: Some(0),
            ..base
        }),
        LeaseAction::Acquire { lease_transitions } => Some(LeaseSpec {
            holder_identity: Some(identity.to_owned()),
            lease_duration_seconds: duration,
            acquire_time: stamp.clone(),
            renew_time: stamp,
            lease_transitions: Some(*lease_transitions),
            ..base
        }),
        LeaseAction::Renew => Some(LeaseSpec {
            holder_identity: Some(identity.to_owned()),
            lease_duration_seconds: duration,
            acquire_time: base.acquire_time.clone().or_else(|| stamp.clone()),
            renew_time: stamp,
            lease_transitions: Some(base.lease_transitions.unwrap_or(0)),
            ..base
        }),
    }
}

/// The spec that gives the Lease up: no holder (and a one-second duration), so that any
/// contender's next [`decide`] returns [`LeaseAction::Acquire`] immediately. `leaseTransitions` is kept.
pub fn released_spec(previous: &LeaseSpec, now: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        ..previous.clone()
    }
}

/// Shared leadership state.
#[derive(Debug)]
struct Shared {
    /// Until when (monotonic) this replica may act as leader; `None` when not leading.
    deadline: Mutex<Option<Instant>>,
    /// Published leadership flag.
    tx: watch::Sender<bool>,
    /// Leadership without election (single replica, tests).
    always: bool,
}

impl Shared {
    fn new(always: bool) -> Self {
        let (tx, _rx) = watch::channel(always);
        Self {
            deadline: Mutex::new(None),
            tx,
            always,
        }
    }

    fn deadline(&self) -> Option<Instant> {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lead_until(&self, deadline: Instant) {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner) = Some(deadline);
        self.tx.send_if_modified(|v| !std::mem::replace(v, true));
    }

    fn step_down(&self) {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner) = None;
        self.tx.send_if_modified(|v| std::mem::replace(v, false));
    }
}

/// A cheap, cloneable view of this replica's leadership, to check before every write.
#[derive(Clone, Debug)]
pub struct Leadership {
    shared: Arc<Shared>,
}

impl Leadership {
    /// Leadership that is always held, for single-replica deployments and tests that do not
    /// exercise election.
    pub fn always_leader() -> Self {
        Self {
            shared: Arc::new(Shared::new(true)),
        }
    }

    /// Whether this replica currently holds the Lease *and* its last successful renewal is
    /// recent enough (within `renew_deadline`). Checked against the clock on every call, so it
    /// turns false on time even when the election task is blocked.
    pub fn is_leader(&self) -> bool {
        self.shared.always || self.shared.deadline().is_some_and(|d| Instant::now() < d)
    }

    /// `Ok(())` when [`is_leader`](Self::is_leader), else [`NotLeader`]. Call right before a write.
    pub fn ensure_leader(&self) -> Result<(), NotLeader> {
        if self.is_leader() {
            Ok(())
        } else {
            Err(NotLeader)
        }
    }

    /// A receiver of the leadership flag: `true` when leadership is gained, `false` when it is
    /// lost or released. The flag flips at the latest when the renew deadline passes.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.shared.tx.subscribe()
    }

    /// Waits until this replica leads (returns at once if it already does).
    pub async fn wait_until_leader(&self) {
        let mut rx = self.subscribe();
        // The sender lives in `self.shared`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|leading| *leading).await;
    }
}

/// The running election: leadership view plus the task.
#[derive(Debug)]
pub struct LeaderHandle {
    leadership: Leadership,
    task: JoinHandle<()>,
}

impl LeaderHandle {
    /// The leadership view to hand to controllers.
    pub fn leadership(&self) -> Leadership {
        self.leadership.clone()
    }

    /// Shortcut for [`Leadership::is_leader`].
    pub fn is_leader(&self) -> bool {
        self.leadership.is_leader()
    }

    /// Shortcut for [`Leadership::subscribe`].
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leadership.subscribe()
    }

    /// Waits for the election task to end (after its cancellation token fired and the Lease was
    /// released).
    pub async fn stopped(self) {
        if let Err(error) = self.task.await {
            warn!(%error, "leader election task ended abnormally");
        }
    }
}

/// Result of one acquire-or-renew round.
#[derive(Debug)]
enum Round {
    /// We hold the Lease (created, acquired or renewed it).
    Holding,
    /// Somebody else holds a valid Lease.
    HeldBy(String),
    /// Our write lost a race (409); the next round re-reads.
    Contended,
}

/// Campaigns for one Lease on behalf of one replica. See the module docs.
#[derive(Clone, Debug)]
pub struct LeaderElector {
    api: Api<Lease>,
    lease_name: String,
    identity: String,
    config: LeaseConfig,
}

impl LeaderElector {
    /// An elector for Lease `namespace/lease_name`, campaigning as `identity` (unique per
    /// replica, usually the pod name).
    pub fn new(
        client: Client,
        namespace: &str,
        lease_name: &str,
        identity: &str,
        config: LeaseConfig,
    ) -> Result<Self, LeaderElectionError> {
        config.validate()?;
        if identity.is_empty() {
            return Err(LeaderElectionError::EmptyIdentity);
        }
        if lease_name.is_empty() {
            return Err(LeaderElectionError::EmptyLeaseName);
        }
        Ok(Self {
            api: Api::namespaced(client, namespace),
            lease_name: lease_name.to_owned(),
            identity: identity.to_owned(),
            config,
        })
    }

    /// The identity this elector campaigns as.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Starts campaigning on the current tokio runtime. The task runs until `cancel` fires;
    /// then it steps down and releases the Lease if it holds it.
    pub fn spawn(self, cancel: CancellationToken) -> LeaderHandle {
        let shared = Arc::new(Shared::new(false));
        let leadership = Leadership {
            shared: Arc::clone(&shared),
        };
        let task = tokio::spawn(self.run(shared, cancel));
        LeaderHandle { leadership, task }
    }

    async fn run(self, shared: Arc<Shared>, cancel: CancellationToken) {
        let lease = format!(
            "{}/{}",
            self.api.namespace().unwrap_or_default(),
            self.lease_name
        );
        let identity = self.identity.as_str();
        info!(%lease, identity, "starting leader election");
        // The Lease record last read and when we first saw it (our monotonic clock).
        let mut observation = None;
        loop {
            let started = Instant::now();
            // Bound each round: as leader by the time left on our claim, otherwise by the renew
            // deadline, so a hung request cannot keep a stale leader leading.
            let budget = match shared.deadline() {
                Some(deadline) => deadline.saturating_duration_since(started),
                None => self.config.renew_deadline,
            };
            let round = tokio::select! {
                () = cancel.cancelled() => break,
                r = tokio::time::timeout(budget, self.round(&mut observation)) => r,
            };
            let was_leading = shared.deadline().is_some();
            match round {
                Ok(Ok(Round::Holding)) => {
                    shared.lead_until(started + self.config.renew_deadline);
                    if !was_leading {
                        info!(%lease, identity, "acquired the lease; now leading");
                    }
                }
                Ok(Ok(Round::HeldBy(holder))) => {
                    if was_leading {
                        warn!(%lease, identity, %holder, "the lease is held by another replica; stepping down");
                    }
                    shared.step_down();
                }
                Ok(Ok(Round::Contended)) => {
                    debug!(%lease, identity, "lease write conflicted; re-reading next round");
                }
                Ok(Err(error)) => warn!(%lease, identity, %error, "lease acquire/renew failed"),
                Err(_) => warn!(%lease, identity, "lease acquire/renew timed out"),
            }
            let now = Instant::now();
            let wait = match shared.deadline() {
                Some(deadline) if now >= deadline => {
                    warn!(%lease, identity, "could not renew the lease within the renew deadline; stepping down");
                    shared.step_down();
                    self.jittered_retry()
                }
                Some(deadline) => self
                    .config
                    .retry_period
                    .min(deadline.saturating_duration_since(now)),
                None => self.jittered_retry(),
            };
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep(wait) => {}
            }
        }
        // Stop writes first, then hand the Lease over.
        shared.step_down();
        match tokio::time::timeout(self.config.renew_deadline, self.release()).await {
            Ok(Ok(true)) => info!(%lease, identity, "released the lease"),
            Ok(Ok(false)) => debug!(%lease, identity, "not holding the lease; nothing to release"),
            Ok(Err(error)) => {
                warn!(%lease, identity, %error, "could not release the lease; it will expire")
            }
            Err(_) => warn!(%lease, identity, "releasing the lease timed out; it will expire"),
        }
    }

    fn jittered_retry(&self) -> Duration {
        self.config
            .retry_period
            .mul_f64(1.0 + 0.2 * fastrand::f64())
    }

    /// One read-decide-write round. `observation` carries what earlier rounds saw of the Lease
    /// and is updated with this round's read.
    async fn round(&self, observation: &mut Option<Observation>) -> Result<Round, Error> {
        let resource = self.api.resource_url();
        let name = self.lease_name.as_str();
        let existing = self
            .api
            .get_opt(name)
            .await
            .map_err(|e| Error::from_kube("get", resource, name, e))?;
        // Stamped after the read: a later observation can only delay a takeover.
        let observed_now = Instant::now();
        // Wall-clock time only goes into what we write (acquireTime / renewTime).
        let wall_now = Timestamp::now();
        *observation = existing
            .as_ref()
            .map(|lease| observe(observation.take(), LeaseRecord::of(lease), observed_now));
        let action = decide(
            observation.as_ref(),
            observed_now,
            &self.identity,
            &self.config,
        );
        let spec = observation.as_ref().map(|o| &o.record.spec);
        let Some(desired) = desired_spec(&action, spec, wall_now, &self.identity, &self.config)
        else {
            return Ok(match action {
                LeaseAction::Wait { holder, .. } => Round::HeldBy(holder),
                _ => Round::Contended,
            });
        };
        match existing {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.to_owned()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(desired),
                };
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(Round::Holding),
                    Err(e) if is_already_exists(&e) || is_conflict(&e) => Ok(Round::Contended),
                    Err(e) => Err(Error::from_kube("create", resource, name, e)),
                }
            }
            Some(mut lease) => {
                if lease
                    .metadata
                    .resource_version
                    .as_deref()
                    .is_none_or(str::is_empty)
                {
                    return Err(Error::MissingResourceVersion {
                        resource: resource.to_owned(),
                        name: name.to_owned(),
                    });
                }
                lease.spec = Some(desired);
                match self.api.replace(name, &PostParams::default(), &lease).await {
                    Ok(_) => Ok(Round::Holding),
                    Err(e) if is_conflict(&e) => Ok(Round::Contended),
                    Err(e) => Err(Error::from_kube("replace", resource, name, e)),
                }
            }
        }
    }

    /// Gives the Lease up if the stored holder is us. Returns whether it was released.
    async fn release(&self) -> Result<bool, Error> {
        let resource = self.api.resource_url();
        let name = self.lease_name.as_str();
        for _ in 0..3 {
            let Some(mut lease) = self
                .api
                .get_opt(name)
                .await
                .map_err(|e| Error::from_kube("get", resource, name, e))?
            else {
                return Ok(false);
            };
            let spec = lease.spec.clone().unwrap_or_default();
            if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
                return Ok(false);
            }
            lease.spec = Some(released_spec(&spec, Timestamp::now()));
            match self.api.replace(name, &PostParams::default(), &lease).await {
                Ok(_) => return Ok(true),
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(Error::from_kube("replace", resource, name, e)),
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "me";
    const OTHER: &str = "other";

    fn cfg() -> LeaseConfig {
        LeaseConfig::default()
    }

    /// Wall-clock time `secs` after a fixed base (what gets written into the Lease).
    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    /// A fixed monotonic base per test; `at(base, ms)` is `ms` milliseconds after it.
    fn at(base: Instant, millis: u64) -> Instant {
        base + Duration::from_millis(millis)
    }

    fn held(holder: &str, renewed: i64, duration: Option<i32>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.to_owned()),
            acquire_time: Some(MicroTime(t(0))),
            renew_time: Some(MicroTime(t(renewed))),
            lease_duration_seconds: duration,
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    fn record(spec: LeaseSpec, resource_version: u32) -> LeaseRecord {
        LeaseRecord {
            spec,
            resource_version: Some(resource_version.to_string()),
        }
    }

    /// `spec` first seen at `observed_at`.
    fn seen(spec: LeaseSpec, observed_at: Instant) -> Observation {
        Observation {
            record: record(spec, 1),
            observed_at,
        }
    }

    #[test]
    fn no_lease_means_create() {
        assert_eq!(
            decide(None, Instant::now(), ME, &cfg()),
            LeaseAction::Create
        );
        let spec = desired_spec(&LeaseAction::Create, None, t(5), ME, &cfg()).unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some(ME));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.acquire_time, Some(MicroTime(t(5))));
        assert_eq!(spec.renew_time, Some(MicroTime(t(5))));
        assert_eq!(spec.lease_transitions, Some(0));
    }

    #[test]
    fn our_lease_is_renewed_even_if_expired() {
        let base = Instant::now();
        let spec = held(ME, 10, Some(15), 3);
        let obs = seen(spec.clone(), base);
        assert_eq!(
            decide(Some(&obs), at(base, 1_000), ME, &cfg()),
            LeaseAction::Renew
        );
        assert_eq!(
            decide(Some(&obs), at(base, 100_000), ME, &cfg()),
            LeaseAction::Renew
        );
        let renewed = desired_spec(&LeaseAction::Renew, Some(&spec), t(12), ME, &cfg()).unwrap();
        assert_eq!(renewed.renew_time, Some(MicroTime(t(12))));
        assert_eq!(
            renewed.acquire_time,
            Some(MicroTime(t(0))),
            "acquireTime is kept"
        );
        assert_eq!(
            renewed.lease_transitions,
            Some(3),
            "renewal is not a transition"
        );
    }

    #[test]
    fn valid_foreign_lease_means_wait_until_expiry() {
        let base = Instant::now();
        let spec = held(OTHER, 10, Some(15), 1);
        let obs = seen(spec.clone(), base);
        for millis in [0, 1_000, 14_999] {
            assert_eq!(
                decide(Some(&obs), at(base, millis), ME, &cfg()),
                LeaseAction::Wait {
                    holder: OTHER.into(),
                    expires_at: at(base, 15_000)
                },
                "at +{millis} ms"
            );
        }
        assert!(
            desired_spec(
                &decide(Some(&obs), at(base, 1_000), ME, &cfg()),
                Some(&spec),
                t(11),
                ME,
                &cfg()
            )
            .is_none()
        );
    }

    #[test]
    fn expired_foreign_lease_is_taken_over_with_a_transition() {
        let base = Instant::now();
        let spec = held(OTHER, 10, Some(15), 1);
        let action = decide(
            Some(&seen(spec.clone(), base)),
            at(base, 15_000),
            ME,
            &cfg(),
        );
        assert_eq!(
            action,
            LeaseAction::Acquire {
                lease_transitions: 2
            }
        );
        // What is written carries our wall clock, whatever the monotonic clock said.
        let taken = desired_spec(&action, Some(&spec), t(25), ME, &cfg()).unwrap();
        assert_eq!(taken.holder_identity.as_deref(), Some(ME));
        assert_eq!(taken.acquire_time, Some(MicroTime(t(25))));
        assert_eq!(taken.renew_time, Some(MicroTime(t(25))));
        assert_eq!(taken.lease_transitions, Some(2));
        assert_eq!(taken.lease_duration_seconds, Some(15));
    }

    #[test]
    fn holder_declared_duration_wins_over_ours() {
        let base = Instant::now();
        // The holder declared 60 s; our 15 s default must not let us take over early.
        let obs = seen(held(OTHER, 10, Some(60), 0), base);
        assert!(matches!(
            decide(Some(&obs), at(base, 20_000), ME, &cfg()),
            LeaseAction::Wait { .. }
        ));
        assert!(matches!(
            decide(Some(&obs), at(base, 59_999), ME, &cfg()),
            LeaseAction::Wait { .. }
        ));
        assert!(matches!(
            decide(Some(&obs), at(base, 60_000), ME, &cfg()),
            LeaseAction::Acquire { .. }
        ));
        // No (or a nonsensical) declared duration: ours applies.
        for duration in [None, Some(0), Some(-5)] {
            let obs = seen(held(OTHER, 10, duration, 0), base);
            assert!(
                matches!(
                    decide(Some(&obs), at(base, 14_999), ME, &cfg()),
                    LeaseAction::Wait { .. }
                ),
                "{duration:?}"
            );
            assert!(
                matches!(
                    decide(Some(&obs), at(base, 15_000), ME, &cfg()),
                    LeaseAction::Acquire { .. }
                ),
                "{duration:?}"
            );
        }
    }

    #[test]
    fn released_leases_are_free_at_once() {
        let base = Instant::now();
        let spec = released_spec(&held(OTHER, 10, Some(15), 4), t(11));
        assert_eq!(spec.holder_identity, None);
        assert_eq!(spec.lease_transitions, Some(4));
        // Seen this very instant: no waiting.
        assert_eq!(
            decide(Some(&seen(spec, base)), base, ME, &cfg()),
            LeaseAction::Acquire {
                lease_transitions: 5
            }
        );
        let empty_holder = LeaseSpec {
            holder_identity: Some(String::new()),
            ..held(OTHER, 10, Some(15), 0)
        };
        assert!(matches!(
            decide(Some(&seen(empty_holder, base)), base, ME, &cfg()),
            LeaseAction::Acquire { .. }
        ));
        // A lease object with an empty spec.
        assert_eq!(
            decide(Some(&seen(LeaseSpec::default(), base)), base, ME, &cfg()),
            LeaseAction::Acquire {
                lease_transitions: 1
            }
        );
    }

    #[test]
    fn record_times_are_never_compared_with_our_wall_clock() {
        let base = Instant::now();
        // Holder clocks far behind, far ahead, or no times at all: all the same to us. Each is
        // respected for a full lease duration after we first saw it and no longer.
        for (renew_time, acquire_time) in [
            (Some(t(-3_600)), Some(t(-7_200))),
            (Some(t(3_600)), Some(t(3_000))),
            (None, Some(t(-3_600))),
            (None, None),
        ] {
            let spec = LeaseSpec {
                holder_identity: Some(OTHER.into()),
                renew_time: renew_time.map(MicroTime),
                acquire_time: acquire_time.map(MicroTime),
                lease_duration_seconds: Some(15),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            };
            let obs = seen(spec, base);
            assert_eq!(
                decide(Some(&obs), at(base, 14_999), ME, &cfg()),
                LeaseAction::Wait {
                    holder: OTHER.into(),
                    expires_at: at(base, 15_000)
                },
                "renewTime {renew_time:?}, acquireTime {acquire_time:?}"
            );
            assert!(
                matches!(
                    decide(Some(&obs), at(base, 15_000), ME, &cfg()),
                    LeaseAction::Acquire { .. }
                ),
                "renewTime {renew_time:?}, acquireTime {acquire_time:?}"
            );
        }
    }

    #[test]
    fn skewed_holder_that_keeps_renewing_is_never_taken_over() {
        let base = Instant::now();
        // The holder's wall clock is an hour behind ours: by our wall clock its lease expired
        // long ago. It renews every 2 s; we read every 3 s for ten minutes.
        let mut observation = None;
        for round in 0..200u64 {
            let now = at(base, round * 3_000);
            let renewed = i64::try_from(round * 3_000 / 2_000 * 2).unwrap() - 3_600;
            let rv = u32::try_from(round * 3 / 2).unwrap();
            let read = record(held(OTHER, renewed, Some(15), 0), rv);
            let obs = observe(observation.take(), read, now);
            assert!(
                matches!(
                    decide(Some(&obs), now, ME, &cfg()),
                    LeaseAction::Wait { ref holder, .. } if holder == OTHER
                ),
                "round {round}"
            );
            observation = Some(obs);
        }
    }

    #[test]
    fn stalled_record_is_taken_over_one_duration_after_we_first_saw_it() {
        let base = Instant::now();
        let first = record(held(OTHER, -3_600, Some(15), 2), 7);
        let obs = observe(None, first.clone(), at(base, 1_000));
        assert_eq!(obs.observed_at, at(base, 1_000));
        // Re-reading the same record keeps the first sighting; the clock keeps running.
        let mut obs = obs;
        for millis in [4_000, 8_000, 12_000, 15_999] {
            obs = observe(Some(obs), first.clone(), at(base, millis));
            assert_eq!(obs.observed_at, at(base, 1_000));
            assert!(
                matches!(
                    decide(Some(&obs), at(base, millis), ME, &cfg()),
                    LeaseAction::Wait { .. }
                ),
                "at +{millis} ms"
            );
        }
        let obs = observe(Some(obs), first.clone(), at(base, 16_000));
        assert_eq!(
            decide(Some(&obs), at(base, 16_000), ME, &cfg()),
            LeaseAction::Acquire {
                lease_transitions: 3
            }
        );

        // Any change restarts the count, even one that only bumps the resourceVersion.
        let obs = observe(None, first.clone(), base);
        let bumped = LeaseRecord {
            resource_version: Some("8".into()),
            ..first.clone()
        };
        let obs = observe(Some(obs), bumped, at(base, 14_000));
        assert_eq!(obs.observed_at, at(base, 14_000));
        assert!(matches!(
            decide(Some(&obs), at(base, 20_000), ME, &cfg()),
            LeaseAction::Wait { .. }
        ));
        assert!(matches!(
            decide(Some(&obs), at(base, 29_000), ME, &cfg()),
            LeaseAction::Acquire { .. }
        ));
        // A renewal (new renewTime) restarts it too.
        let renewed = record(held(OTHER, -3_598, Some(15), 2), 7);
        let obs = observe(Some(observe(None, first, base)), renewed, at(base, 14_000));
        assert_eq!(obs.observed_at, at(base, 14_000));
    }

    #[test]
    fn records_are_read_whole_from_the_object() {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some("l".into()),
                resource_version: Some("42".into()),
                ..ObjectMeta::default()
            },
            spec: Some(held(OTHER, 1, Some(15), 0)),
        };
        assert_eq!(
            LeaseRecord::of(&lease),
            record(held(OTHER, 1, Some(15), 0), 42)
        );
        let bare = Lease {
            spec: None,
            ..lease
        };
        assert_eq!(LeaseRecord::of(&bare).spec, LeaseSpec::default());
    }

    #[test]
    fn config_validation() {
        assert!(LeaseConfig::default().validate().is_ok());
        let ok = LeaseConfig {
            lease_duration: Duration::from_millis(2500),
            renew_deadline: Duration::from_secs(2),
            retry_period: Duration::from_millis(300),
        };
        assert!(ok.validate().is_ok());
        assert_eq!(ok.lease_duration_seconds(), 3);
        for bad in [
            LeaseConfig {
                renew_deadline: Duration::from_secs(15),
                ..cfg()
            },
            LeaseConfig {
                retry_period: Duration::from_secs(10),
                ..cfg()
            },
            LeaseConfig {
                retry_period: Duration::ZERO,
                ..cfg()
            },
            LeaseConfig {
                lease_duration: Duration::from_millis(900),
                renew_deadline: Duration::from_millis(500),
                retry_period: Duration::from_millis(100),
            },
        ] {
            assert!(
                matches!(bad.validate(), Err(LeaderElectionError::InvalidConfig(_))),
                "{bad:?}"
            );
        }
    }

    #[tokio::test]
    async fn leadership_expires_by_the_clock() {
        let shared = Arc::new(Shared::new(false));
        let leadership = Leadership {
            shared: Arc::clone(&shared),
        };
        let mut rx = leadership.subscribe();
        assert!(!leadership.is_leader());
        assert_eq!(leadership.ensure_leader(), Err(NotLeader));

        shared.lead_until(Instant::now() + Duration::from_millis(200));
        assert!(leadership.is_leader());
        assert!(rx.has_changed().unwrap());
        assert!(*rx.borrow_and_update());

        // Without renewal, the claim lapses on time even though nobody called step_down.
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(!leadership.is_leader());

        shared.step_down();
        assert!(rx.has_changed().unwrap());
        assert!(!*rx.borrow_and_update());
        // Stepping down twice does not notify twice.
        shared.step_down();
        assert!(!rx.has_changed().unwrap());
    }

    #[tokio::test]
    async fn always_leader() {
        let l = Leadership::always_leader();
        assert!(l.is_leader());
        assert!(l.ensure_leader().is_ok());
        assert!(*l.subscribe().borrow());
        l.wait_until_leader().await;
    }
}
