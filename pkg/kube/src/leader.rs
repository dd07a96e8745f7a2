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
//! - A contender takes the Lease over only after the holder's `renewTime + leaseDurationSeconds`
//!   has passed, and increments `leaseTransitions` when the holder changes.
//! - The leader's own claim expires locally `renew_deadline` after the start of its last
//!   successful renewal (measured on the monotonic clock). `renew_deadline < lease_duration`, so
//!   a leader whose renewals fail stops considering itself leader (and [`Leadership::is_leader`]
//!   turns false, even if the election task is stuck) before anyone else may take the Lease. This
//!   assumes the replicas' wall clocks differ by less than `lease_duration - renew_deadline`.
//! - On cancellation the leader first stops reporting leadership, then releases the Lease (empty
//!   holder) so a successor can take over at once instead of waiting for expiry.
//!
//! The decision itself ([`decide`], [`desired_spec`], [`released_spec`]) is pure and unit tested
//! over times; the task around it only does I/O.

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
    /// How long a Lease stays valid after its last renewal; a contender waits this long after
    /// the holder's last `renewTime` before taking over. Stored in whole seconds (rounded up).
    pub lease_duration: Duration,
    /// How long the leader keeps leading without a successful renewal. Must be shorter than
    /// `lease_duration`: the gap is the safety margin against clock skew between replicas.
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

/// What to do with the Lease, given its current spec.
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
        /// When the holder's claim runs out unless renewed.
        expires_at: Timestamp,
    },
}

/// Decides what `identity` should do with a Lease whose spec is `lease` (`None`: there is no
/// Lease object) at wall-clock time `now`.
///
/// The holder's claim runs until `renewTime` (or `acquireTime` if never renewed) plus its
/// `leaseDurationSeconds` (or `config.lease_duration` if unset). A Lease without either time is
/// treated as expired.
pub fn decide(
    lease: Option<&LeaseSpec>,
    now: Timestamp,
    identity: &str,
    config: &LeaseConfig,
) -> LeaseAction {
    let Some(spec) = lease else {
        return LeaseAction::Create;
    };
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
    match expires_at(spec, config) {
        Some(expires_at) if now < expires_at => LeaseAction::Wait {
            holder: holder.to_owned(),
            expires_at,
        },
        _ => take_over,
    }
}

/// When the holder's claim on `spec` runs out, if it can be told.
fn expires_at(spec: &LeaseSpec, config: &LeaseConfig) -> Option<Timestamp> {
    let last = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?.0;
    let duration = match spec.lease_duration_seconds {
        Some(secs) if secs > 0 => Duration::from_secs(u64::from(secs.unsigned_abs())),
        _ => config.lease_duration,
    };
    Some(last.saturating_add(duration).unwrap_or(Timestamp::MAX))
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

/// The spec that gives the Lease up: no holder, one-second duration, so that any contender's
/// next [`decide`] returns [`LeaseAction::Acquire`] immediately. `leaseTransitions` is kept.
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
                r = tokio::time::timeout(budget, self.round()) => r,
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

    /// One read-decide-write round.
    async fn round(&self) -> Result<Round, Error> {
        let resource = self.api.resource_url();
        let name = self.lease_name.as_str();
        let now = Timestamp::now();
        let existing = self
            .api
            .get_opt(name)
            .await
            .map_err(|e| Error::from_kube("get", resource, name, e))?;
        let spec = existing
            .as_ref()
            .map(|lease| lease.spec.clone().unwrap_or_default());
        let action = decide(spec.as_ref(), now, &self.identity, &self.config);
        let Some(desired) = desired_spec(&action, spec.as_ref(), now, &self.identity, &self.config)
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

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
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

    #[test]
    fn no_lease_means_create() {
        assert_eq!(decide(None, t(0), ME, &cfg()), LeaseAction::Create);
        let spec = desired_spec(&LeaseAction::Create, None, t(5), ME, &cfg()).unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some(ME));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.acquire_time, Some(MicroTime(t(5))));
        assert_eq!(spec.renew_time, Some(MicroTime(t(5))));
        assert_eq!(spec.lease_transitions, Some(0));
    }

    #[test]
    fn our_lease_is_renewed_even_if_expired() {
        let spec = held(ME, 10, Some(15), 3);
        assert_eq!(decide(Some(&spec), t(11), ME, &cfg()), LeaseAction::Renew);
        assert_eq!(decide(Some(&spec), t(100), ME, &cfg()), LeaseAction::Renew);
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
        let spec = held(OTHER, 10, Some(15), 1);
        for now in [10, 11, 24] {
            assert_eq!(
                decide(Some(&spec), t(now), ME, &cfg()),
                LeaseAction::Wait {
                    holder: OTHER.into(),
                    expires_at: t(25)
                },
                "at {now}"
            );
        }
        assert!(
            desired_spec(
                &decide(Some(&spec), t(11), ME, &cfg()),
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
        let spec = held(OTHER, 10, Some(15), 1);
        let action = decide(Some(&spec), t(25), ME, &cfg());
        assert_eq!(
            action,
            LeaseAction::Acquire {
                lease_transitions: 2
            }
        );
        let taken = desired_spec(&action, Some(&spec), t(25), ME, &cfg()).unwrap();
        assert_eq!(taken.holder_identity.as_deref(), Some(ME));
        assert_eq!(taken.acquire_time, Some(MicroTime(t(25))));
        assert_eq!(taken.renew_time, Some(MicroTime(t(25))));
        assert_eq!(taken.lease_transitions, Some(2));
        assert_eq!(taken.lease_duration_seconds, Some(15));
    }

    #[test]
    fn holder_declared_duration_wins_over_ours() {
        // The holder declared 60 s; our 15 s default must not let us take over early.
        let spec = held(OTHER, 10, Some(60), 0);
        assert!(matches!(
            decide(Some(&spec), t(30), ME, &cfg()),
            LeaseAction::Wait { .. }
        ));
        assert!(matches!(
            decide(Some(&spec), t(70), ME, &cfg()),
            LeaseAction::Acquire { .. }
        ));
        // No declared duration: ours applies.
        let spec = held(OTHER, 10, None, 0);
        assert!(matches!(
            decide(Some(&spec), t(24), ME, &cfg()),
            LeaseAction::Wait { .. }
        ));
        assert!(matches!(
            decide(Some(&spec), t(25), ME, &cfg()),
            LeaseAction::Acquire { .. }
        ));
    }

    #[test]
    fn released_or_timeless_leases_are_free() {
        let spec = released_spec(&held(OTHER, 10, Some(15), 4), t(11));
        assert_eq!(spec.holder_identity, None);
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(
            decide(Some(&spec), t(11), ME, &cfg()),
            LeaseAction::Acquire {
                lease_transitions: 5
            }
        );
        let empty_holder = LeaseSpec {
            holder_identity: Some(String::new()),
            ..held(OTHER, 10, Some(15), 0)
        };
        assert!(matches!(
            decide(Some(&empty_holder), t(11), ME, &cfg()),
            LeaseAction::Acquire { .. }
        ));
        let no_times = LeaseSpec {
            holder_identity: Some(OTHER.into()),
            ..LeaseSpec::default()
        };
        assert_eq!(
            decide(Some(&no_times), t(0), ME, &cfg()),
            LeaseAction::Acquire {
                lease_transitions: 1
            }
        );
        // A lease object with an empty spec.
        assert!(matches!(
            decide(Some(&LeaseSpec::default()), t(0), ME, &cfg()),
            LeaseAction::Acquire { .. }
        ));
    }

    #[test]
    fn acquire_time_is_used_when_never_renewed() {
        let spec = LeaseSpec {
            renew_time: None,
            ..held(OTHER, 0, Some(15), 0)
        };
        assert!(matches!(
            decide(Some(&spec), t(14), ME, &cfg()),
            LeaseAction::Wait { .. }
        ));
        assert!(matches!(
            decide(Some(&spec), t(15), ME, &cfg()),
            LeaseAction::Acquire { .. }
        ));
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
