//! Status conditions (`metav1.Condition`) with `observedGeneration`.
//!
//! Pure functions over a `Vec<Condition>`; the clock is passed in. Semantics follow the
//! Kubernetes API conventions (and apimachinery's `SetStatusCondition`):
//! `lastTransitionTime` changes only when `status` changes; `reason`, `message` and
//! `observedGeneration` are updated in place.
//!
//! Input handling (a deliberate choice):
//! - `type` and `reason` are *validated* and a bad value is an error ([`ConditionError`]): they
//!   are identifiers chosen by our code, so a bad one is a bug to surface, and the API server would
//!   reject the whole status write anyway.
//! - `message` is *sanitized*: it is free text that often embeds an error from elsewhere, so it
//!   is cut to [`MAX_MESSAGE_BYTES`] on a UTF-8 character boundary and ends with
//!   [`TRUNCATION_MARKER`] when cut. A long message never makes a status write fail.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Maximum length of a condition message in bytes (the `metav1.Condition` schema limit).
pub const MAX_MESSAGE_BYTES: usize = 32768;

/// Maximum length of a condition reason in bytes (the `metav1.Condition` schema limit).
pub const MAX_REASON_BYTES: usize = 1024;

/// Maximum length of a condition type in bytes (the `metav1.Condition` schema limit).
pub const MAX_TYPE_BYTES: usize = 316;

/// Appended to a message that was cut to fit [`MAX_MESSAGE_BYTES`].
pub const TRUNCATION_MARKER: &str = " ...[truncated]";

/// The status of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// It cannot be determined whether the condition holds.
    Unknown,
}

impl ConditionStatus {
    /// The wire value: `"True"`, `"False"` or `"Unknown"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

impl From<bool> for ConditionStatus {
    fn from(value: bool) -> Self {
        if value { Self::True } else { Self::False }
    }
}

/// A condition to record with [`set_condition`]; everything except `lastTransitionTime`, which
/// is derived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewCondition {
    /// Condition type in CamelCase, for example `Ready`, `Progressing`, `Degraded`.
    pub type_: String,
    /// Whether the condition holds.
    pub status: ConditionStatus,
    /// A CamelCase, machine-readable reason for the last change, e.g. `DownloadFailed`.
    pub reason: String,
    /// A human-readable explanation. Cut to [`MAX_MESSAGE_BYTES`] if longer.
    pub message: String,
    /// `metadata.generation` of the object the condition was computed from.
    pub observed_generation: Option<i64>,
}

impl NewCondition {
    /// A condition without an observed generation; add one with
    /// [`observed_generation`](Self::observed_generation).
    pub fn new(
        type_: impl Into<String>,
        status: ConditionStatus,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_: type_.into(),
            status,
            reason: reason.into(),
            message: message.into(),
            observed_generation: None,
        }
    }

    /// Sets the generation the condition was computed from.
    #[must_use]
    pub fn observed_generation(mut self, generation: Option<i64>) -> Self {
        self.observed_generation = generation;
        self
    }
}

/// A condition that cannot be stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConditionError {
    /// The type is empty, too long, or not of the form `[prefix/]Name`.
    #[error(
        "condition type {type_:?} is not valid: it must be an optionally DNS-prefixed name \
         of letters, digits, '-', '_' and '.', starting and ending with a letter or digit, \
         at most {MAX_TYPE_BYTES} bytes"
    )]
    InvalidType {
        /// The rejected type.
        type_: String,
    },
    /// The reason is empty, too long, or not CamelCase.
    #[error(
        "condition reason {reason:?} is not valid: it must start with a letter, contain only \
         letters, digits, '_', ',' and ':', not end with ',' or ':', and be at most \
         {MAX_REASON_BYTES} bytes"
    )]
    InvalidReason {
        /// The rejected reason.
        reason: String,
    },
}

/// Whether `reason` matches `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$` and fits the length limit.
pub fn is_valid_reason(reason: &str) -> bool {
    let bytes = reason.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    bytes.len() <= MAX_REASON_BYTES
        && first.is_ascii_alphabetic()
        && (last.is_ascii_alphanumeric() || *last == b'_')
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b',' | b':'))
}

/// Whether `type_` is a valid condition type: `[dns-subdomain/]name`, where name matches
/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]` and is at most 63 bytes long (the
/// `metav1.Condition` schema pattern).
pub fn is_valid_type(type_: &str) -> bool {
    if type_.is_empty() || type_.len() > MAX_TYPE_BYTES {
        return false;
    }
    let (prefix, name) = match type_.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, type_),
    };
    let name_ok = {
        let b = name.as_bytes();
        match (b.first(), b.last()) {
            (Some(f), Some(l)) => {
                b.len() <= 63
                    && f.is_ascii_alphanumeric()
                    && l.is_ascii_alphanumeric()
                    && b.iter()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
            }
            _ => false,
        }
    };
    let prefix_ok = prefix.is_none_or(|p| {
        p.len() <= 253
            && p.split('.').all(|label| {
                let b = label.as_bytes();
                match (b.first(), b.last()) {
                    (Some(f), Some(l)) => {
                        (f.is_ascii_lowercase() || f.is_ascii_digit())
                            && (l.is_ascii_lowercase() || l.is_ascii_digit())
                            && b.iter()
                                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                    }
                    _ => false,
                }
            })
    });
    name_ok && prefix_ok
}

/// Cuts `message` to at most [`MAX_MESSAGE_BYTES`] bytes on a character boundary, ending it with
/// [`TRUNCATION_MARKER`] when it was cut. Shorter messages are returned unchanged.
pub fn truncate_message(message: &str) -> String {
    truncate_with_marker(message, MAX_MESSAGE_BYTES, TRUNCATION_MARKER)
}

/// Cuts `text` to at most `max_bytes` bytes (marker included) on a character boundary.
pub(crate) fn truncate_with_marker(text: &str, max_bytes: usize, marker: &str) -> String {
    if text.len() <= max_bytes {
        return text.to_owned();
    }
    let with_marker = marker.len() <= max_bytes;
    let mut cut = if with_marker {
        max_bytes - marker.len()
    } else {
        max_bytes
    };
    while cut > 0 && !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut out = String::with_capacity(cut + marker.len());
    out.push_str(&text[..cut]);
    if with_marker {
        out.push_str(marker);
    }
    out
}

/// Records `new` in `conditions` and returns whether anything changed.
///
/// - No condition of that type yet: it is appended with `lastTransitionTime = now`.
/// - The status differs: status, reason, message, observedGeneration are replaced and
///   `lastTransitionTime = now`.
/// - The status is the same: reason, message and observedGeneration are replaced if different;
///   `lastTransitionTime` is kept.
///
/// `conditions` is left untouched when an error is returned.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    new: NewCondition,
    now: Time,
) -> Result<bool, ConditionError> {
    if !is_valid_type(&new.type_) {
        return Err(ConditionError::InvalidType { type_: new.type_ });
    }
    if !is_valid_reason(&new.reason) {
        return Err(ConditionError::InvalidReason { reason: new.reason });
    }
    let message = truncate_message(&new.message);
    let status = new.status.as_str();

    let Some(existing) = conditions.iter_mut().find(|c| c.type_ == new.type_) else {
        conditions.push(Condition {
            type_: new.type_,
            status: status.to_owned(),
            reason: new.reason,
            message,
            observed_generation: new.observed_generation,
            last_transition_time: now,
        });
        return Ok(true);
    };

    let mut changed = false;
    if existing.status != status {
        existing.status = status.to_owned();
        existing.last_transition_time = now;
        changed = true;
    }
    if existing.reason != new.reason {
        existing.reason = new.reason;
        changed = true;
    }
    if existing.message != message {
        existing.message = message;
        changed = true;
    }
    if existing.observed_generation != new.observed_generation {
        existing.observed_generation = new.observed_generation;
        changed = true;
    }
    Ok(changed)
}

/// The condition of type `type_`, if present.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of type `type_` is present with status `True`.
pub fn is_condition_true(conditions: &[Condition], type_: &str) -> bool {
    find_condition(conditions, type_).is_some_and(|c| c.status == ConditionStatus::True.as_str())
}

/// Whether the condition of type `type_` is present with status `False`.
pub fn is_condition_false(conditions: &[Condition], type_: &str) -> bool {
    find_condition(conditions, type_).is_some_and(|c| c.status == ConditionStatus::False.as_str())
}

/// Whether the condition of type `type_` is `True` *and* was computed from `generation` (its
/// `observedGeneration` equals it): "true for the current spec", not for an older one.
pub fn is_condition_true_for_generation(
    conditions: &[Condition],
    type_: &str,
    generation: Option<i64>,
) -> bool {
    find_condition(conditions, type_).is_some_and(|c| {
        c.status == ConditionStatus::True.as_str() && c.observed_generation == generation
    })
}

/// Removes the condition of type `type_`; returns whether one was removed.
pub fn remove_condition(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    fn ready(status: ConditionStatus, reason: &str, msg: &str, generation: i64) -> NewCondition {
        NewCondition::new("Ready", status, reason, msg).observed_generation(Some(generation))
    }

    #[test]
    fn appends_new_condition_with_now() {
        let mut conds = Vec::new();
        let changed = set_condition(
            &mut conds,
            ready(ConditionStatus::True, "Done", "ok", 1),
            at(10),
        )
        .unwrap();
        assert!(changed);
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0].type_, "Ready");
        assert_eq!(conds[0].status, "True");
        assert_eq!(conds[0].reason, "Done");
        assert_eq!(conds[0].message, "ok");
        assert_eq!(conds[0].observed_generation, Some(1));
        assert_eq!(conds[0].last_transition_time, at(10));
    }

    #[test]
    fn same_status_keeps_transition_time_but_updates_details() {
        let mut conds = Vec::new();
        set_condition(
            &mut conds,
            ready(ConditionStatus::False, "Waiting", "a", 1),
            at(10),
        )
        .unwrap();
        let changed = set_condition(
            &mut conds,
            ready(ConditionStatus::False, "StillWaiting", "b", 2),
            at(20),
        )
        .unwrap();
        assert!(changed);
        assert_eq!(conds[0].last_transition_time, at(10));
        assert_eq!(conds[0].reason, "StillWaiting");
        assert_eq!(conds[0].message, "b");
        assert_eq!(conds[0].observed_generation, Some(2));
    }

    #[test]
    fn identical_condition_is_not_a_change() {
        let mut conds = Vec::new();
        set_condition(
            &mut conds,
            ready(ConditionStatus::True, "Done", "ok", 3),
            at(10),
        )
        .unwrap();
        let before = conds.clone();
        let changed = set_condition(
            &mut conds,
            ready(ConditionStatus::True, "Done", "ok", 3),
            at(99),
        )
        .unwrap();
        assert!(!changed);
        assert_eq!(conds, before);
    }

    #[test]
    fn status_change_moves_transition_time() {
        let mut conds = Vec::new();
        set_condition(
            &mut conds,
            ready(ConditionStatus::Unknown, "Pending", "", 1),
            at(10),
        )
        .unwrap();
        let changed = set_condition(
            &mut conds,
            ready(ConditionStatus::True, "Pending", "", 1),
            at(30),
        )
        .unwrap();
        assert!(changed);
        assert_eq!(conds[0].status, "True");
        assert_eq!(conds[0].last_transition_time, at(30));
    }

    #[test]
    fn other_types_are_left_alone() {
        let mut conds = Vec::new();
        set_condition(
            &mut conds,
            ready(ConditionStatus::True, "Done", "", 1),
            at(1),
        )
        .unwrap();
        set_condition(
            &mut conds,
            NewCondition::new("Degraded", ConditionStatus::False, "AsExpected", ""),
            at(2),
        )
        .unwrap();
        set_condition(
            &mut conds,
            ready(ConditionStatus::False, "Broken", "", 2),
            at(3),
        )
        .unwrap();
        assert_eq!(conds.len(), 2);
        let degraded = find_condition(&conds, "Degraded").unwrap();
        assert_eq!(degraded.last_transition_time, at(2));
        assert!(is_condition_false(&conds, "Degraded"));
        assert!(!is_condition_true(&conds, "Ready"));
        assert!(is_condition_false(&conds, "Ready"));
        assert!(!is_condition_true(&conds, "Missing"));
        assert!(!is_condition_false(&conds, "Missing"));
    }

    #[test]
    fn generation_aware_truth() {
        let mut conds = Vec::new();
        set_condition(
            &mut conds,
            ready(ConditionStatus::True, "Done", "", 4),
            at(1),
        )
        .unwrap();
        assert!(is_condition_true_for_generation(&conds, "Ready", Some(4)));
        assert!(!is_condition_true_for_generation(&conds, "Ready", Some(5)));
    }

    #[test]
    fn remove() {
        let mut conds = Vec::new();
        set_condition(
            &mut conds,
            ready(ConditionStatus::True, "Done", "", 1),
            at(1),
        )
        .unwrap();
        assert!(!remove_condition(&mut conds, "Other"));
        assert!(remove_condition(&mut conds, "Ready"));
        assert!(conds.is_empty());
        assert!(find_condition(&conds, "Ready").is_none());
    }

    #[test]
    fn reason_pattern() {
        for ok in [
            "A",
            "Ready",
            "DownloadFailed",
            "Not_Ready",
            "a:b,c_",
            "X1",
            "Abc_",
        ] {
            assert!(is_valid_reason(ok), "{ok}");
        }
        for bad in [
            "",
            "1Abc",
            "Has Space",
            "Dash-ed",
            "Ends:",
            "Ends,",
            "_x",
            "Ünïcode",
        ] {
            assert!(!is_valid_reason(bad), "{bad}");
        }
        assert!(!is_valid_reason(&"A".repeat(MAX_REASON_BYTES + 1)));
        assert!(is_valid_reason(&"A".repeat(MAX_REASON_BYTES)));
    }

    #[test]
    fn type_pattern() {
        for ok in ["Ready", "nvca.nvidia.io/Ready", "a", "Claim-Bound", "x.y_z"] {
            assert!(is_valid_type(ok), "{ok}");
        }
        for bad in [
            "",
            "-Ready",
            "Ready-",
            "Has Space",
            "UPPER.io/Ready",
            "a/",
            "/a",
            "a/b/c",
        ] {
            assert!(!is_valid_type(bad), "{bad}");
        }
    }

    #[test]
    fn invalid_input_is_rejected_without_touching_the_list() {
        let mut conds = Vec::new();
        let err = set_condition(
            &mut conds,
            NewCondition::new("Ready", ConditionStatus::True, "not camel", ""),
            at(1),
        )
        .unwrap_err();
        assert!(matches!(err, ConditionError::InvalidReason { .. }));
        let err = set_condition(
            &mut conds,
            NewCondition::new("bad type", ConditionStatus::True, "Ok", ""),
            at(1),
        )
        .unwrap_err();
        assert!(matches!(err, ConditionError::InvalidType { .. }));
        assert!(conds.is_empty());
    }

    #[test]
    fn long_messages_are_truncated_on_a_char_boundary() {
        let short = "fine";
        assert_eq!(truncate_message(short), short);
        let exact = "x".repeat(MAX_MESSAGE_BYTES);
        assert_eq!(truncate_message(&exact), exact);

        // 3-byte characters so the cut point falls inside one.
        let long = "€".repeat(MAX_MESSAGE_BYTES);
        let cut = truncate_message(&long);
        assert!(cut.len() <= MAX_MESSAGE_BYTES);
        assert!(cut.ends_with(TRUNCATION_MARKER));
        assert!(
            cut.trim_end_matches(TRUNCATION_MARKER)
                .chars()
                .all(|c| c == '€')
        );
        assert!(cut.len() > MAX_MESSAGE_BYTES - TRUNCATION_MARKER.len() - 3);

        let mut conds = Vec::new();
        set_condition(
            &mut conds,
            NewCondition::new("Ready", ConditionStatus::False, "Failed", long),
            at(1),
        )
        .unwrap();
        assert!(conds[0].message.len() <= MAX_MESSAGE_BYTES);
    }

    #[test]
    fn truncation_with_tiny_budget_never_exceeds_it() {
        assert_eq!(truncate_with_marker("abcdef", 3, "..."), "...");
        assert_eq!(truncate_with_marker("abcdef", 2, "..."), "ab");
        assert_eq!(truncate_with_marker("abcdef", 5, "..."), "ab...");
    }

    #[test]
    fn status_from_bool() {
        assert_eq!(ConditionStatus::from(true), ConditionStatus::True);
        assert_eq!(ConditionStatus::from(false).as_str(), "False");
    }
}
