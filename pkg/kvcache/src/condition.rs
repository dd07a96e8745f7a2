//! Status conditions, Events and message caps for the controller's decisions (pure: the clock
//! is passed in).
//!
//! `warmcache-kube` has a condition setter too, but that crate carries the Kubernetes client; the
//! decisions here must stay pure, so this module holds the small part they need: a setter over
//! `metav1.Condition` with the API conventions (`lastTransitionTime` moves only when `status`
//! moves; reason, message and `observedGeneration` are updated in place), and the caps of
//! reference section 5: a message is at most [`MAX_MESSAGE_BYTES`], a list of names shows at most
//! [`MAX_LISTED`] of them and then "and N more", and a string from elsewhere (an HTTP body, a
//! Pod's message) is clipped to [`MAX_FOREIGN_CHARS`] characters with [`FOREIGN_TRUNCATION`].

use std::fmt::Display;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Longest condition message, in bytes (the `metav1.Condition` schema limit).
pub const MAX_MESSAGE_BYTES: usize = 32768;
/// Names a message lists before it summarises the rest as "and N more".
pub const MAX_LISTED: usize = 20;
/// Characters kept of a string the operator did not write (an HTTP body, a Pod's message).
pub const MAX_FOREIGN_CHARS: usize = 2048;
/// Appended to a foreign string that was clipped.
pub const FOREIGN_TRUNCATION: &str = "… (truncated)";
/// Appended to a message cut to [`MAX_MESSAGE_BYTES`].
pub const MESSAGE_TRUNCATION: &str = " … (truncated)";

/// The status of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// It cannot be told whether the condition holds.
    Unknown,
}

impl ConditionStatus {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

/// A condition to record: everything but `lastTransitionTime`, which [`set_condition`] derives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewCondition {
    /// Condition type (one of `warmcache_api_kvcache::v1alpha1::condition`).
    pub type_: &'static str,
    /// Whether it holds.
    pub status: ConditionStatus,
    /// CamelCase reason.
    pub reason: &'static str,
    /// Human-readable explanation, capped by [`cap_message`] when recorded.
    pub message: String,
    /// `metadata.generation` of the backend it was computed from.
    pub observed_generation: Option<i64>,
}

/// Records `new` in `conditions`; returns whether anything changed. A condition of a new type is
/// appended with `lastTransitionTime = now`; a status change replaces everything and moves the
/// transition time; otherwise reason, message and `observedGeneration` are updated in place and
/// the transition time is kept.
pub fn set_condition(conditions: &mut Vec<Condition>, new: NewCondition, now: &Time) -> bool {
    let message = cap_message(&new.message);
    let status = new.status.as_str();
    let Some(existing) = conditions.iter_mut().find(|c| c.type_ == new.type_) else {
        conditions.push(Condition {
            type_: new.type_.to_owned(),
            status: status.to_owned(),
            reason: new.reason.to_owned(),
            message,
            observed_generation: new.observed_generation,
            last_transition_time: now.clone(),
        });
        return true;
    };
    let mut changed = false;
    if existing.status != status {
        existing.status = status.to_owned();
        existing.last_transition_time = now.clone();
        changed = true;
    }
    if existing.reason != new.reason {
        existing.reason = new.reason.to_owned();
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
    changed
}

/// The condition of type `type_`, if present.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// `message` cut to [`MAX_MESSAGE_BYTES`] on a character boundary, ending with
/// [`MESSAGE_TRUNCATION`] when cut.
pub fn cap_message(message: &str) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message.to_owned();
    }
    let mut cut = MAX_MESSAGE_BYTES - MESSAGE_TRUNCATION.len();
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{MESSAGE_TRUNCATION}", &message[..cut])
}

/// A string the operator did not write, clipped to [`MAX_FOREIGN_CHARS`] characters (ending with
/// [`FOREIGN_TRUNCATION`] when clipped) and with surrounding whitespace removed.
pub fn clip_foreign(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(MAX_FOREIGN_CHARS) {
        None => text.to_owned(),
        Some((end, _)) => format!("{}{FOREIGN_TRUNCATION}", &text[..end]),
    }
}

/// The items joined with `, `, at most [`MAX_LISTED`] of them, then `and N more`.
pub fn sample_list<T: Display>(items: &[T]) -> String {
    let mut out = items
        .iter()
        .take(MAX_LISTED)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > MAX_LISTED {
        out.push_str(&format!(" and {} more", items.len() - MAX_LISTED));
    }
    out
}

/// The type of an Event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Something worth knowing.
    Normal,
    /// Something an operator of the cluster should act on.
    Warning,
}

impl EventType {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// An Event to publish. Its message never carries an elapsed time or a counter, so the same
/// situation seen on a later pass yields the same Event, and the recorder folds the repeats.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventSpec {
    /// Normal or Warning.
    pub type_: EventType,
    /// CamelCase reason (reference section 7).
    pub reason: &'static str,
    /// The message, capped by [`cap_message`].
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(second).unwrap_or_default())
    }

    fn new(status: ConditionStatus, reason: &'static str, message: &str) -> NewCondition {
        NewCondition {
            type_: "LeaderAvailable",
            status,
            reason,
            message: message.to_owned(),
            observed_generation: Some(1),
        }
    }

    #[test]
    fn the_transition_time_moves_only_with_the_status() {
        let mut conditions = Vec::new();
        assert!(set_condition(
            &mut conditions,
            new(ConditionStatus::False, "LeaderStarting", "a"),
            &at(10)
        ));
        assert!(set_condition(
            &mut conditions,
            new(ConditionStatus::False, "LeaderStarting", "b"),
            &at(20)
        ));
        assert_eq!(conditions[0].last_transition_time, at(10));
        assert_eq!(conditions[0].message, "b");
        assert!(!set_condition(
            &mut conditions,
            new(ConditionStatus::False, "LeaderStarting", "b"),
            &at(30)
        ));
        assert!(set_condition(
            &mut conditions,
            new(ConditionStatus::True, "LeaderServing", "b"),
            &at(40)
        ));
        assert_eq!(conditions[0].last_transition_time, at(40));
        assert_eq!(conditions.len(), 1);
    }

    #[test]
    fn caps() {
        let long = "é".repeat(MAX_MESSAGE_BYTES);
        let capped = cap_message(&long);
        assert!(capped.len() <= MAX_MESSAGE_BYTES);
        assert!(capped.ends_with(MESSAGE_TRUNCATION));
        assert_eq!(cap_message("short"), "short");

        let foreign = "x".repeat(MAX_FOREIGN_CHARS + 1);
        assert_eq!(
            clip_foreign(&foreign),
            format!("{}{FOREIGN_TRUNCATION}", "x".repeat(MAX_FOREIGN_CHARS))
        );
        assert_eq!(
            clip_foreign(&"x".repeat(MAX_FOREIGN_CHARS)).len(),
            MAX_FOREIGN_CHARS
        );

        let names: Vec<String> = (0..25).map(|i| format!("n{i}")).collect();
        let listed = sample_list(&names);
        assert!(listed.starts_with("n0, n1, "));
        assert!(listed.ends_with("n19 and 5 more"), "{listed}");
        assert_eq!(sample_list(&names[..2]), "n0, n1");
    }
}
