//! The `TierWasEmpty` survey (reference section 5.1): did the disk tier hold anything on the
//! nodes when the backend started?
//!
//! Each member Pod of a tier group runs the init container `local-disk-survey` first, which
//! writes `entries=<n> control=<m>` to its termination message (see
//! [`crate::render::survey_script`]). The controller hands [`tier_was_empty`] the group's
//! DaemonSet and Pods from its caches; the verdict is written once and never recomputed.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::SignedDuration;
use warmcache_api_kvcache::v1alpha1::{KVCacheBackend, condition};

use crate::condition::{
    ConditionStatus, EventSpec, EventType, NewCondition, find_condition, sample_list,
};
use crate::names::{LABEL_COMPONENT, LABEL_INSTANCE, member_component};
use crate::render::SURVEY_CONTAINER;

/// Member Pods created at most this long after the backend are its first generation: only they
/// can tell what the tier held before this backend wrote to it.
pub const FIRST_GENERATION_WINDOW: SignedDuration = SignedDuration::from_mins(30);

/// Reason of `TierWasEmpty=False`.
pub const REASON_PREEXISTING_CONTENT: &str = "PreexistingContent";
/// Reason of `TierWasEmpty=True`.
pub const REASON_EMPTY: &str = "Empty";
/// Reason of the Warning Event on the backend that goes with `TierWasEmpty=False`.
pub const EVENT_TIER_NOT_EMPTY: &str = "KVCacheTierNotEmpty";

/// One accepted survey reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SurveyReading {
    /// Entries in the tier directory (dotfiles included).
    pub entries: u64,
    /// Entries of `/` in the survey container: proof that the count ran.
    pub control: u64,
}

/// Why a survey reading is not accepted (reference section 5.1 step 4).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SurveyRejection {
    /// The Pod has no `local-disk-survey` init container status.
    #[error("the Pod has no status of the init container {SURVEY_CONTAINER}")]
    NoSurveyContainer,
    /// The survey has not terminated (yet).
    #[error("the survey has not terminated")]
    NotTerminated,
    /// The survey terminated without a message.
    #[error("the survey's termination message is empty")]
    EmptyMessage,
    /// The message is not `entries=<n> control=<m>`.
    #[error("the survey's termination message {0:?} is not \"entries=<n> control=<m>\"")]
    Malformed(String),
    /// `control` is 0: the count did not run.
    #[error("the survey's control count is 0, so its count did not run")]
    NoControl,
    /// `entries` is negative: -1 means the tier could not be listed.
    #[error("the survey could not list the tier (entries={0})")]
    Unreadable(i64),
}

/// Parses a survey's termination message `entries=<n> control=<m>` (surrounding whitespace
/// ignored) and applies the rejection rules: `control` must be an integer above 0 and `entries`
/// an integer of at least 0.
pub fn parse_survey_message(message: &str) -> Result<SurveyReading, SurveyRejection> {
    let text = message.trim();
    if text.is_empty() {
        return Err(SurveyRejection::EmptyMessage);
    }
    let malformed = || SurveyRejection::Malformed(crate::condition::clip_foreign(text));
    let mut words = text.split_ascii_whitespace();
    let (Some(first), Some(second), None) = (words.next(), words.next(), words.next()) else {
        return Err(malformed());
    };
    let number = |word: &str, key: &str| -> Option<i64> {
        let value = word.strip_prefix(key)?.strip_prefix('=')?;
        // Digits only, with an optional leading '-': no '+', no spaces, no hex.
        let digits = value.strip_prefix('-').unwrap_or(value);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        value.parse::<i64>().ok()
    };
    let entries = number(first, "entries").ok_or_else(malformed)?;
    let control = number(second, "control").ok_or_else(malformed)?;
    if control <= 0 {
        return Err(SurveyRejection::NoControl);
    }
    let entries = u64::try_from(entries).map_err(|_| SurveyRejection::Unreadable(entries))?;
    Ok(SurveyReading {
        entries,
        control: control.unsigned_abs(),
    })
}

/// The reading of a member Pod: the terminated state of its `local-disk-survey` init container
/// (the current state, or the last one when the container was restarted since).
pub fn survey_reading(pod: &Pod) -> Result<SurveyReading, SurveyRejection> {
    let status = pod
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref())
        .and_then(|statuses| statuses.iter().find(|s| s.name == SURVEY_CONTAINER))
        .ok_or(SurveyRejection::NoSurveyContainer)?;
    let terminated = status
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .or_else(|| {
            status
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
        })
        .ok_or(SurveyRejection::NotTerminated)?;
    parse_survey_message(terminated.message.as_deref().unwrap_or_default())
}

/// Whether `pod` belongs to the backend's first generation: created at most
/// [`FIRST_GENERATION_WINDOW`] after the backend. A missing timestamp on either is not.
pub fn is_first_generation(backend_created: Option<&Time>, pod: &Pod) -> bool {
    let (Some(backend), Some(created)) =
        (backend_created, pod.metadata.creation_timestamp.as_ref())
    else {
        return false;
    };
    created.0.duration_since(backend.0) <= FIRST_GENERATION_WINDOW
}

/// The verdict of one survey pass: the condition to write and, with `False`, the one Warning
/// Event to publish on the backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierVerdict {
    /// `TierWasEmpty`, True (`Empty`) or False (`PreexistingContent`).
    pub condition: NewCondition,
    /// `KVCacheTierNotEmpty`, with the condition's message, when the verdict is False.
    pub event: Option<EventSpec>,
}

/// One survey pass (reference section 5.1). `groups` is index-aligned with
/// `spec.connection.managed.members`: for each group, its DaemonSet `<backend>-member-<i>` as
/// read from the cache (`None` when not found or unreadable) and the Pods its selector lists.
/// Entries of groups without a tier are ignored (pass `(None, vec![])`); a tier group whose entry
/// is missing counts as a DaemonSet not found.
///
/// Returns `None` (no verdict: leave the condition absent) when the backend is external, has no
/// tier, already has `TierWasEmpty` (written once, never recomputed), a tier group's DaemonSet is
/// missing, or not every node the DaemonSets want (`status.desiredNumberScheduled`) has reported
/// and none reported entries. `False` as soon as one node reports entries, naming every node that
/// did; `True` when every wanted node reported 0.
///
/// Only first-generation Pods ([`is_first_generation`]) are read, each with [`survey_reading`];
/// rejected readings are ignored. Readings are counted per node, so a node whose Pod was replaced
/// early is not counted twice; a node with several readings keeps the largest.
pub fn tier_was_empty(
    backend: &KVCacheBackend,
    groups: &[(Option<&DaemonSet>, Vec<&Pod>)],
) -> Option<TierVerdict> {
    let managed = backend.spec.connection.managed.as_ref()?;
    let existing = backend
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    if find_condition(existing, condition::TIER_WAS_EMPTY).is_some() {
        return None;
    }
    let name = backend.metadata.name.as_deref()?;
    let created = backend.metadata.creation_timestamp.as_ref();
    let mut any_tier = false;
    let mut wanted: i64 = 0;
    let mut surveyed = 0_i64;
    let mut content: BTreeMap<String, u64> = BTreeMap::new();
    for (index, group) in managed.members.iter().enumerate() {
        if group.local_disk().is_none() {
            continue;
        }
        any_tier = true;
        let (daemonset, pods) = groups.get(index)?;
        let daemonset = (*daemonset)?;
        wanted += i64::from(
            daemonset
                .status
                .as_ref()
                .map_or(0, |s| s.desired_number_scheduled),
        );
        let component = member_component(index);
        let mut nodes: BTreeMap<String, u64> = BTreeMap::new();
        for pod in pods {
            let labels = pod.metadata.labels.as_ref();
            let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
            if label(LABEL_INSTANCE) != Some(name) || label(LABEL_COMPONENT) != Some(&component) {
                continue;
            }
            if !is_first_generation(created, pod) {
                continue;
            }
            let Ok(reading) = survey_reading(pod) else {
                continue;
            };
            let node = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .or_else(|| pod.metadata.name.clone())
                .unwrap_or_default();
            let seen = nodes.entry(node).or_insert(0);
            *seen = (*seen).max(reading.entries);
        }
        surveyed += i64::try_from(nodes.len()).unwrap_or(i64::MAX);
        for (node, entries) in nodes {
            if entries > 0 {
                let seen = content.entry(node).or_insert(0);
                *seen = (*seen).max(entries);
            }
        }
    }
    if !any_tier {
        return None;
    }
    let generation = backend.metadata.generation;
    if !content.is_empty() {
        let listed: Vec<String> = content
            .iter()
            .map(|(node, entries)| format!("{node}: {entries}"))
            .collect();
        let message = format!(
            "the disk tier already held entries when this backend started ({}); nothing was removed, \
             and a key written here can read back as content the previous backend left",
            sample_list(&listed)
        );
        return Some(TierVerdict {
            condition: NewCondition {
                type_: condition::TIER_WAS_EMPTY,
                status: ConditionStatus::False,
                reason: REASON_PREEXISTING_CONTENT,
                message: message.clone(),
                observed_generation: generation,
            },
            event: Some(EventSpec {
                type_: EventType::Warning,
                reason: EVENT_TIER_NOT_EMPTY,
                message: crate::condition::cap_message(&message),
            }),
        });
    }
    if wanted > 0 && surveyed == wanted {
        return Some(TierVerdict {
            condition: NewCondition {
                type_: condition::TIER_WAS_EMPTY,
                status: ConditionStatus::True,
                reason: REASON_EMPTY,
                message: format!(
                    "the disk tier was empty on all {wanted} node(s) carrying it when this backend started"
                ),
                observed_generation: generation,
            },
            event: None,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages() {
        assert_eq!(
            parse_survey_message("entries=0 control=20"),
            Ok(SurveyReading {
                entries: 0,
                control: 20
            })
        );
        assert_eq!(
            parse_survey_message(" entries=5 control=20\n"),
            Ok(SurveyReading {
                entries: 5,
                control: 20
            })
        );
        assert_eq!(
            parse_survey_message("entries=-1 control=20"),
            Err(SurveyRejection::Unreadable(-1))
        );
        assert_eq!(
            parse_survey_message("entries=0 control=0"),
            Err(SurveyRejection::NoControl)
        );
        assert_eq!(
            parse_survey_message("entries=0 control=-3"),
            Err(SurveyRejection::NoControl)
        );
        assert_eq!(parse_survey_message(""), Err(SurveyRejection::EmptyMessage));
        assert_eq!(
            parse_survey_message("   "),
            Err(SurveyRejection::EmptyMessage)
        );
        for bad in [
            "entries=x control=20",
            "entries= control=20",
            "entries=+1 control=20",
            "entries=1",
            "control=20 entries=1",
            "entries=1 control=20 extra",
            "entries=1 control=2.5",
            "entries=99999999999999999999 control=1",
        ] {
            assert!(
                matches!(
                    parse_survey_message(bad),
                    Err(SurveyRejection::Malformed(_))
                ),
                "{bad:?} must be refused"
            );
        }
    }
}
