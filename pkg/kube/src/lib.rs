//! Kubernetes client helpers: conflict-aware updates, conditions, events, finalizers, leader election.
//!
//! Shared by every warmcache controller so they all write the same way:
//! - [`update_with_retry`] / [`update_status_with_retry`]: read, decide, write with the
//!   resourceVersion that was read; on 409 re-read and decide again (bounded).
//! - [`conditions`]: `metav1.Condition` bookkeeping with `observedGeneration`, pure.
//! - [`EventRecorder`]: best-effort Events for a component.
//! - [`add_finalizer`] / [`remove_finalizer`]: JSON patches guarded by a `test` op.
//! - [`LeaderElector`] / [`Leadership`]: Lease-based leader election gating writes.
//! - [`Applier`]: server-side apply with one field manager per component (force only on request);
//!   [`create_or_get`]: create, or return the stored object as [`Created::Existing`], never
//!   overwrite; [`controller_owner_reference`] / [`set_controller_owner`] /
//!   [`set_managed_labels`]: pure metadata stamping; [`apply::prune::prune_unlisted`]: opt-in
//!   deletion of unlisted children, never for model-cache components (only the reaper deletes).
//! - [`OwnerResolver`]: the top-level controller of a pod ([`TopLevelOwner`]) by following
//!   controller ownerReferences with bounded, cached dynamic GETs; a stale reference (NotFound,
//!   other UID) stops the walk at the last object that exists, RBAC Forbidden stops it and is
//!   reported in the [`Resolution`]; the pure step logic is [`owner::Walk`].
//! - [`rbac`]: each component's API calls as data, rendered into its least-privilege roles.
//! - [`category`], [`is_conflict`], [`is_not_found`], [`is_transient`]: stable error classes
//!   for `error_policy` and metric labels.

pub mod apply;
pub mod conditions;
pub mod error;
pub mod events;
pub mod finalizers;
pub mod leader;
pub mod owner;
pub mod rbac;
pub mod update;

pub use apply::{
    Applier, COMPONENT_LABEL, Created, MANAGED_BY_LABEL, MANAGED_BY_VALUE, MetadataError,
    controller_owner_reference, create_or_get, is_managed_by, managed_selector,
    set_controller_owner, set_managed_labels,
};
pub use conditions::{
    ConditionError, ConditionStatus, NewCondition, find_condition, is_condition_false,
    is_condition_true, is_condition_true_for_generation, remove_condition, set_condition,
};
pub use error::{
    Error, ErrorCategory, category, is_already_exists, is_conflict, is_not_found, is_timeout,
    is_transient,
};
pub use events::{EventRecorder, EventType};
pub use finalizers::{add_finalizer, has_finalizer, remove_finalizer};
pub use leader::{
    LeaderElectionError, LeaderElector, LeaderHandle, Leadership, LeaseAction, LeaseConfig,
    LeaseRecord, NotLeader, Observation,
};
pub use owner::{OwnerError, OwnerResolver, Resolution, Stop, TopLevelOwner};
pub use update::{
    Decision, RetryPolicy, Updated, update_status_with_retry, update_status_with_retry_policy,
    update_with_retry, update_with_retry_policy,
};
