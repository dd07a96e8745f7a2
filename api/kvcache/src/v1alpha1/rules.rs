//! The CEL rules (`x-kubernetes-validations`) the `KVCacheBackend` CRD carries.
//!
//! Every rule here needs only the object and, for transition rules, its previous version; each is
//! attached to the schema node it guards by `#[x_kube(validation = ...)]` in the parent module.
//! The messages are public so the operator's webhook, which re-checks the same facts, can say them
//! with the same words.
//!
//! # Per-position rules on `members`
//!
//! A member group is identified by its index in `spec.connection.managed.members`. Several rules
//! compare the group at index `i` with the group that was at index `i` before the update. That
//! list is `x-kubernetes-list-type: atomic`, so its items are not correlatable and a rule using
//! `oldSelf` may not sit inside an item. The rules therefore sit on the list itself (`self` and
//! `oldSelf` are the whole new and old lists) and walk the positions with
//! `[0, 1, ..., 31].all(i, ...)`: a one-variable macro over a literal list of every possible
//! index (the list has `maxItems: 32`). Two-variable comprehensions (`all(i, m, ...)`) would read
//! better but are missing from the client-side evaluator (kube-cel) the tests use, and the
//! literal keeps the API server's cost estimate exact (32 iterations of a constant-cost body).
//! Positions at or beyond the shorter list are not compared, so dropping the last group (tier
//! included) and appending a group (tier included) stay allowed.
//!
//! The whole rule set was checked with the CRD validation of kube-apiserver 1.36
//! (apiextensions-apiserver v0.36.3: structural schema, rule compilation, transition-rule
//! placement, estimated cost per rule and per CRD) and every case of the crate's CEL test was
//! also run through its CEL validator with the same outcome as kube-cel; the chart tests install
//! the CRD on kube-apiserver 1.30.14 too (the oldest the chart supports).
//!
//! # Quantities
//!
//! No rule reads a quantity's value: the sign checks of `capacityPerMember` (above 0),
//! `localBufferSize` and `localDisks[].capacity` (not negative), and a watermark's capacity above
//! 0, are the operator's validating webhook's (`warmcache_kvcache::validate`, failurePolicy
//! `Fail`, with the messages below), as the reference puts them. Quantity fields are
//! int-or-string, and kube-apiserver 1.30 and 1.31 (1.36 does not) estimate the cost of any string
//! function on an int-or-string value (`quantity(string(self))`, even `size(string(self))`) from
//! the largest request, not from the schema's `maxLength`: with `members` at 32 groups such a
//! rule exceeds the per-rule budget 2x, and those servers refuse the whole CRD. The chart
//! supports 1.30 (`kubeVersion`), and its tests install this CRD on a real 1.30 API server.

use kube::core::{Reason, Rule};

/// Highest number of member groups a backend may declare (`members` `maxItems`).
pub const MAX_MEMBER_GROUPS: u32 = 32;

/// Refusal messages of the rules, one per rule.
pub mod messages {
    /// `spec.type` changed on update.
    pub const TYPE_IMMUTABLE: &str = "type is immutable: a backend keeps the store it was created with; create another backend to run a different one";
    /// Neither `managed` nor `external` is set.
    pub const CONNECTION_NEITHER: &str =
        "one of managed or external must be set: a backend with neither describes no store at all";
    /// Both `managed` and `external` are set.
    pub const CONNECTION_BOTH: &str = "only one of managed or external may be set: a backend with both describes two stores at once";
    /// The update switched between `managed` and `external`.
    pub const CONNECTION_BRANCH_IMMUTABLE: &str = "the connection branch is immutable: a backend cannot switch between managed and external; create another backend instead";
    /// More than one leader replica without `highAvailability`.
    pub const LEADER_REPLICAS_NEED_HA: &str = "more than one leader replica requires highAvailability, which elects the single serving leader through a Kubernetes Lease; without it every replica would serve at once";
    /// Two or more member groups declare `localDisks`.
    pub const ONE_TIER_GROUP: &str = "only one member group may declare localDisks: the leader reports every disk tier through one pair of gauges, so status.capacity could not say which figure belongs to which group";
    /// The group at an existing position changed its `medium`.
    pub const MEDIUM_IMMUTABLE: &str = "medium is immutable: the group at each existing position of members keeps the medium it was created with. A group is identified by its position, so reordering members or removing an earlier group reaches this rule too";
    /// The group at an existing position gained a `localDisks` tier.
    pub const TIER_CANNOT_BE_ADDED: &str = "a localDisks tier cannot be added to an existing member group: its members would have to restart to mount the directory, and the leader would begin offloading to a tier that no existing key is on. A group is identified by its position in members, so reordering members or removing an earlier group reaches this rule too; append a new group instead";
    /// The group at an existing position lost its `localDisks` tier.
    pub const TIER_CANNOT_BE_REMOVED: &str = "a localDisks tier cannot be removed from an existing member group: whatever its members already wrote would stay on their nodes with nothing addressing it. A group is identified by its position in members, so reordering members or removing an earlier group reaches this rule too; only the last group may be removed, tier and all";
    /// The tier of the group at an existing position changed its `path`.
    pub const TIER_PATH_IMMUTABLE: &str = "the localDisks path is immutable: what the members at this position already wrote stays at the old path. A group is identified by its position in members, so reordering members reaches this rule too";
    /// `capacityPerMember` is zero or negative.
    pub const CAPACITY_PER_MEMBER_POSITIVE: &str = "capacityPerMember must be greater than 0: a member that contributes no memory is a Pod with no reason to run";
    /// `localBufferSize` is negative.
    pub const LOCAL_BUFFER_NOT_NEGATIVE: &str =
        "localBufferSize must not be negative: it is added to the member Pod's memory request";
    /// A tier's `capacity` is negative.
    pub const CAPACITY_NOT_NEGATIVE: &str = "capacity must not be negative: it caps what this tier stores (0 or unset leaves the store's own ceiling)";
    /// `eviction.watermark` is set on a tier without a positive `capacity`.
    pub const WATERMARK_NEEDS_CAPACITY: &str = "capacity must be set above 0 when eviction.watermark is set: the marks are percentages of it, and without one the store evicts nothing while the band reads as configured";
    /// `eviction.policy` is set while `eviction.enabled` is false.
    pub const POLICY_WHILE_DISABLED: &str = "policy cannot be set while eviction is disabled (enabled: false): there is no order in which nothing leaves. Remove one of the two";
    /// `eviction.watermark` is set while `eviction.enabled` is false.
    pub const WATERMARK_WHILE_DISABLED: &str = "watermark cannot be set while eviction is disabled (enabled: false): there is nothing for the marks to start and stop. Remove one of the two";
    /// `watermark.low` is not below `watermark.high`.
    pub const WATERMARK_LOW_BELOW_HIGH: &str = "low must be below high: with equal or inverted marks every write past the mark evicts, and the member refuses the pair at startup, where only its log would tell";
}

/// CEL for "the member group `group` declares a non-empty `localDisks`".
fn has_tier(group: &str) -> String {
    format!("(has({group}.localDisks) && size({group}.localDisks) > 0)")
}

/// `[0, 1, ..., MAX_MEMBER_GROUPS - 1]` as a CEL list literal.
fn positions() -> String {
    let items: Vec<String> = (0..MAX_MEMBER_GROUPS).map(|i| i.to_string()).collect();
    format!("[{}]", items.join(", "))
}

/// A rule on the members list that holds `body` for every position present in both the new
/// (`self[i]`) and the old (`oldSelf[i]`) list.
fn per_position(body: &str) -> String {
    format!(
        "{}.all(i, i >= size(self) || i >= size(oldSelf) || {body})",
        positions()
    )
}

/// On `spec.type`: the store type never changes.
pub fn type_immutable() -> Rule {
    Rule::new("self == oldSelf").message(messages::TYPE_IMMUTABLE)
}

/// On `spec.connection`: at least one branch is set.
pub fn connection_neither() -> Rule {
    Rule::new("has(self.managed) || has(self.external)")
        .message(messages::CONNECTION_NEITHER)
        .reason(Reason::FieldValueRequired)
}

/// On `spec.connection`: at most one branch is set.
pub fn connection_both() -> Rule {
    Rule::new("!(has(self.managed) && has(self.external))")
        .message(messages::CONNECTION_BOTH)
        .reason(Reason::FieldValueForbidden)
}

/// On `spec.connection`: the branch (managed or external) never changes.
pub fn connection_branch_immutable() -> Rule {
    Rule::new(
        "has(self.managed) == has(oldSelf.managed) && has(self.external) == has(oldSelf.external)",
    )
    .message(messages::CONNECTION_BRANCH_IMMUTABLE)
}

/// On `spec.connection.managed.leader`: more than one replica needs `highAvailability`.
pub fn leader_replicas_need_ha() -> Rule {
    Rule::new("!has(self.replicas) || self.replicas <= 1 || has(self.highAvailability)")
        .message(messages::LEADER_REPLICAS_NEED_HA)
        .field_path(".replicas")
        .reason(Reason::FieldValueForbidden)
}

/// On `spec.connection.managed.members`: at most one group declares a tier.
pub fn one_tier_group() -> Rule {
    Rule::new(format!("size(self.filter(m, {})) <= 1", has_tier("m")))
        .message(messages::ONE_TIER_GROUP)
        .reason(Reason::FieldValueForbidden)
}

/// On `spec.connection.managed.members` (transition): `medium` is frozen per position.
pub fn medium_immutable() -> Rule {
    Rule::new(per_position("self[i].medium == oldSelf[i].medium"))
        .message(messages::MEDIUM_IMMUTABLE)
}

/// On `spec.connection.managed.members` (transition): a group that had no tier gets none.
pub fn tier_cannot_be_added() -> Rule {
    let body = format!("{} || !{}", has_tier("oldSelf[i]"), has_tier("self[i]"));
    Rule::new(per_position(&body))
        .message(messages::TIER_CANNOT_BE_ADDED)
        .reason(Reason::FieldValueForbidden)
}

/// On `spec.connection.managed.members` (transition): a group that had a tier keeps it.
pub fn tier_cannot_be_removed() -> Rule {
    let body = format!("!{} || {}", has_tier("oldSelf[i]"), has_tier("self[i]"));
    Rule::new(per_position(&body))
        .message(messages::TIER_CANNOT_BE_REMOVED)
        .reason(Reason::FieldValueForbidden)
}

/// On `spec.connection.managed.members` (transition): a kept tier keeps its path.
pub fn tier_path_immutable() -> Rule {
    let body = format!(
        "!{} || !{} || self[i].localDisks[0].path == oldSelf[i].localDisks[0].path",
        has_tier("self[i]"),
        has_tier("oldSelf[i]")
    );
    Rule::new(per_position(&body))
        .message(messages::TIER_PATH_IMMUTABLE)
        .reason(Reason::FieldValueForbidden)
}

/// On `members[].localDisks[]`: a watermark (with eviction enabled) needs a capacity. That it
/// is above 0 is the operator's webhook's check (see [the module docs](self#quantities)).
pub fn watermark_needs_capacity() -> Rule {
    Rule::new(
        "!has(self.eviction) || !has(self.eviction.watermark) \
         || (has(self.eviction.enabled) && !self.eviction.enabled) \
         || has(self.capacity)",
    )
    .message(messages::WATERMARK_NEEDS_CAPACITY)
    .field_path(".capacity")
    .reason(Reason::FieldValueRequired)
}

/// On `members[].localDisks[].eviction`: no policy while eviction is disabled.
pub fn policy_while_disabled() -> Rule {
    Rule::new("!has(self.enabled) || self.enabled || !has(self.policy)")
        .message(messages::POLICY_WHILE_DISABLED)
        .field_path(".policy")
        .reason(Reason::FieldValueForbidden)
}

/// On `members[].localDisks[].eviction`: no watermark while eviction is disabled.
pub fn watermark_while_disabled() -> Rule {
    Rule::new("!has(self.enabled) || self.enabled || !has(self.watermark)")
        .message(messages::WATERMARK_WHILE_DISABLED)
        .field_path(".watermark")
        .reason(Reason::FieldValueForbidden)
}

/// On `members[].localDisks[].eviction.watermark`: `low < high`.
pub fn watermark_low_below_high() -> Rule {
    Rule::new("self.low < self.high")
        .message(messages::WATERMARK_LOW_BELOW_HIGH)
        .field_path(".low")
}
