//! Rolling a member group onto a new pod template, one node at a time.
//!
//! The member DaemonSets use `OnDelete`: a template change (new image, new env, a changed tier
//! setting) restarts nothing by itself. The controller deletes member Pods whose pod-spec hash
//! annotation ([`POD_SPEC_HASH_ANNOTATION`]) differs from the template's, and [`restart_plan`]
//! decides which one and when:
//!
//! - at most **one** Pod per group per pass, so a change rolls through the tier node by node
//!   instead of emptying every segment at once (a restarted member loses its memory segment);
//! - only while **no** Pod of the group is terminating (the previous restart has finished
//!   leaving), the DaemonSet controller has **observed** the DaemonSet's current spec, the group
//!   has **a Pod for every node** the DaemonSet schedules (the previous restart has been
//!   replaced: between the old Pod's removal and the DaemonSet controller's new Pod, neither is
//!   there to hold the next restart), and **every** Pod that is already current is Ready (the
//!   replacement has come back), so an update that breaks members stops after the first one;
//! - the stale Pod taken is the first in name order, so every replica of the operator (and a
//!   restarted one) picks the same Pod.
//!
//! Pure: the Pods are whatever the caller read; no clock.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;

use crate::names::POD_SPEC_HASH_ANNOTATION;

/// Which member Pod of one group to restart now, if any, and how many are stale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RestartPlan<'a> {
    /// Pods of the group, not terminating, whose pod-spec hash is not the wanted one (a Pod
    /// without the annotation is stale).
    pub stale: usize,
    /// The one to delete now.
    pub restart: Option<&'a Pod>,
    /// Why nothing is restarted although some Pod is stale.
    pub held: Option<Hold>,
}

/// Why a stale Pod is not restarted on this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// A Pod of the group is still terminating.
    Terminating,
    /// The DaemonSet controller has not reported on the DaemonSet's current spec yet.
    Unobserved,
    /// The group has fewer Pods than nodes the DaemonSet schedules: a member (a restarted one,
    /// most likely) has not been replaced yet.
    Missing,
    /// A current Pod of the group is not Ready yet.
    NotReady,
}

/// What the DaemonSet controller reports of a group's DaemonSet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduled {
    /// `status.desiredNumberScheduled`: the nodes that should run a member.
    pub desired: usize,
    /// Whether `status.observedGeneration` has reached `metadata.generation`, so `desired`
    /// reflects the current spec (a changed `nodeSelector` changes it).
    pub observed: bool,
}

impl Scheduled {
    /// The report in `daemonset`'s status; `None` before the DaemonSet controller wrote one.
    pub fn of(daemonset: &DaemonSet) -> Option<Self> {
        let status = daemonset.status.as_ref()?;
        let observed = match (status.observed_generation, daemonset.metadata.generation) {
            (Some(observed), Some(generation)) => observed >= generation,
            (_, None) => true,
            (None, Some(_)) => false,
        };
        Some(Self {
            desired: usize::try_from(status.desired_number_scheduled).unwrap_or(0),
            observed,
        })
    }
}

impl RestartPlan<'_> {
    /// Whether the group is still rolling (some Pod is stale).
    pub fn rolling(&self) -> bool {
        self.stale > 0
    }
}

/// The restart decision for one group whose template carries `wanted_hash` (see the module
/// documentation). `pods` are the group's Pods, in any order; `scheduled` is what the DaemonSet
/// controller reports of the group's DaemonSet (`None`: nothing yet, which holds a restart).
pub fn restart_plan<'a>(
    pods: &[&'a Pod],
    wanted_hash: &str,
    scheduled: Option<Scheduled>,
) -> RestartPlan<'a> {
    let mut pods: Vec<&'a Pod> = pods.to_vec();
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let terminating = pods.iter().any(|pod| is_terminating(pod));
    let (stale, current): (Vec<&'a Pod>, Vec<&'a Pod>) = pods
        .iter()
        .copied()
        .filter(|pod| !is_terminating(pod))
        .partition(|pod| pod_spec_hash(pod) != Some(wanted_hash));
    let held = if stale.is_empty() {
        None
    } else if terminating {
        Some(Hold::Terminating)
    } else if !scheduled.is_some_and(|s| s.observed) {
        Some(Hold::Unobserved)
    } else if scheduled.is_some_and(|s| stale.len() + current.len() < s.desired) {
        Some(Hold::Missing)
    } else if !current.iter().all(|pod| is_ready(pod)) {
        Some(Hold::NotReady)
    } else {
        None
    };
    RestartPlan {
        stale: stale.len(),
        restart: if held.is_none() {
            stale.first().copied()
        } else {
            None
        },
        held,
    }
}

/// Whether the Pod's `Ready` condition is `True`.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

/// Whether the Pod is being deleted.
pub fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// The Pod's pod-spec hash annotation.
pub fn pod_spec_hash(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(POD_SPEC_HASH_ANNOTATION)
        .map(String::as_str)
}

/// Whether `labels` carry every pair of `selector` (an equality-based `matchLabels`; an empty
/// selector matches everything).
pub fn matches_labels(
    labels: Option<&BTreeMap<String, String>>,
    selector: &BTreeMap<String, String>,
) -> bool {
    selector
        .iter()
        .all(|(key, value)| labels.and_then(|l| l.get(key)) == Some(value))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn pod(name: &str, hash: Option<&str>, ready: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                annotations: hash
                    .map(|h| BTreeMap::from([(POD_SPEC_HASH_ANNOTATION.to_owned(), h.to_owned())])),
                ..ObjectMeta::default()
            },
            status: Some(PodStatus {
                conditions: Some(vec![PodCondition {
                    type_: "Ready".to_owned(),
                    status: if ready { "True" } else { "False" }.to_owned(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    fn terminating(mut pod: Pod) -> Pod {
        pod.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        pod
    }

    /// The DaemonSet controller's report for a group of `desired` nodes, current.
    fn every(desired: usize) -> Option<Scheduled> {
        Some(Scheduled {
            desired,
            observed: true,
        })
    }

    fn name(pod: Option<&Pod>) -> Option<&str> {
        pod.and_then(|p| p.metadata.name.as_deref())
    }

    #[test]
    fn nothing_to_do_when_every_pod_is_current() {
        let a = pod("a", Some("h2"), true);
        let b = pod("b", Some("h2"), false);
        let plan = restart_plan(&[&a, &b], "h2", every(2));
        assert_eq!(plan.stale, 0);
        assert!(!plan.rolling());
        assert_eq!(plan.restart, None);
        assert_eq!(plan.held, None);
    }

    #[test]
    fn one_stale_pod_at_a_time_in_name_order() {
        let c = pod("member-c", Some("h1"), true);
        let a = pod("member-a", Some("h1"), true);
        let b = pod("member-b", Some("h2"), true);
        // Given out of order: the first stale name is taken, whatever order the cache gave.
        let plan = restart_plan(&[&c, &b, &a], "h2", every(3));
        assert_eq!(plan.stale, 2);
        assert!(plan.rolling());
        assert_eq!(name(plan.restart), Some("member-a"));
        assert_eq!(plan.held, None);
    }

    #[test]
    fn a_pod_without_the_annotation_is_stale() {
        let a = pod("a", None, true);
        let plan = restart_plan(&[&a], "h2", every(1));
        assert_eq!(plan.stale, 1);
        assert_eq!(name(plan.restart), Some("a"));
    }

    #[test]
    fn a_stale_pod_that_is_not_ready_is_still_restarted() {
        // Its readiness does not matter: restarting it is what may fix it.
        let a = pod("a", Some("h1"), false);
        let b = pod("b", Some("h2"), true);
        let plan = restart_plan(&[&a, &b], "h2", every(2));
        assert_eq!(name(plan.restart), Some("a"));
    }

    #[test]
    fn held_while_a_current_pod_is_not_ready() {
        // b was restarted onto h2 and has not come back: a waits, so a broken template stops
        // after one member.
        let a = pod("a", Some("h1"), true);
        let b = pod("b", Some("h2"), false);
        let plan = restart_plan(&[&a, &b], "h2", every(2));
        assert_eq!(plan.stale, 1);
        assert_eq!(plan.restart, None);
        assert_eq!(plan.held, Some(Hold::NotReady));
    }

    #[test]
    fn held_while_a_pod_is_terminating() {
        let a = pod("a", Some("h1"), true);
        let b = terminating(pod("b", Some("h1"), true));
        let plan = restart_plan(&[&a, &b], "h2", every(2));
        // The terminating one is not counted as stale (it is already leaving).
        assert_eq!(plan.stale, 1);
        assert_eq!(plan.restart, None);
        assert_eq!(plan.held, Some(Hold::Terminating));
    }

    #[test]
    fn held_while_a_restarted_member_has_not_been_replaced() {
        // Three nodes; a was restarted and is gone, and the DaemonSet controller has not made its
        // replacement yet. Nothing current is unready, nothing terminates: only the count shows
        // that a member is missing, and b must wait for it.
        let b = pod("b", Some("h1"), true);
        let c = pod("c", Some("h1"), true);
        let plan = restart_plan(&[&b, &c], "h2", every(3));
        assert_eq!(plan.stale, 2);
        assert_eq!(plan.restart, None);
        assert_eq!(plan.held, Some(Hold::Missing));
        // The replacement exists but is not ready yet.
        let a = pod("a", Some("h2"), false);
        let plan = restart_plan(&[&a, &b, &c], "h2", every(3));
        assert_eq!(plan.held, Some(Hold::NotReady));
        // It is ready: the next one goes.
        let a = pod("a", Some("h2"), true);
        let plan = restart_plan(&[&a, &b, &c], "h2", every(3));
        assert_eq!(plan.held, None);
        assert_eq!(name(plan.restart), Some("b"));
    }

    #[test]
    fn more_pods_than_scheduled_nodes_do_not_hold() {
        // A node left the selector and its Pod is still there, or a Pod runs where the
        // DaemonSet controller does not count it: the rest of the group is complete.
        let a = pod("a", Some("h1"), true);
        let b = pod("b", Some("h1"), true);
        let plan = restart_plan(&[&a, &b], "h2", every(1));
        assert_eq!(name(plan.restart), Some("a"));
        let plan = restart_plan(&[&a, &b], "h2", every(0));
        assert_eq!(name(plan.restart), Some("a"));
    }

    #[test]
    fn held_until_the_daemonset_controller_reports_on_the_current_spec() {
        let a = pod("a", Some("h1"), true);
        let plan = restart_plan(&[&a], "h2", None);
        assert_eq!(plan.restart, None);
        assert_eq!(plan.held, Some(Hold::Unobserved));
        let behind = Some(Scheduled {
            desired: 1,
            observed: false,
        });
        let plan = restart_plan(&[&a], "h2", behind);
        assert_eq!(plan.restart, None);
        assert_eq!(plan.held, Some(Hold::Unobserved));
        // Nothing stale: nothing held, whatever the report.
        let current = pod("a", Some("h2"), true);
        let plan = restart_plan(&[&current], "h2", None);
        assert_eq!(plan.held, None);
        assert!(!plan.rolling());
    }

    #[test]
    fn the_report_is_read_from_the_daemonset_status() {
        use k8s_openapi::api::apps::v1::DaemonSetStatus;

        fn daemonset(generation: Option<i64>, status: Option<DaemonSetStatus>) -> DaemonSet {
            DaemonSet {
                metadata: ObjectMeta {
                    generation,
                    ..ObjectMeta::default()
                },
                status,
                ..DaemonSet::default()
            }
        }
        fn status(observed: Option<i64>, desired: i32) -> Option<DaemonSetStatus> {
            Some(DaemonSetStatus {
                observed_generation: observed,
                desired_number_scheduled: desired,
                ..DaemonSetStatus::default()
            })
        }
        assert_eq!(Scheduled::of(&daemonset(Some(2), None)), None);
        assert_eq!(
            Scheduled::of(&daemonset(Some(2), status(Some(1), 4))),
            Some(Scheduled {
                desired: 4,
                observed: false
            })
        );
        assert_eq!(
            Scheduled::of(&daemonset(Some(2), status(None, 4))),
            Some(Scheduled {
                desired: 4,
                observed: false
            })
        );
        assert_eq!(
            Scheduled::of(&daemonset(Some(2), status(Some(2), 4))),
            every(4)
        );
        assert_eq!(Scheduled::of(&daemonset(None, status(None, 3))), every(3));
        // A negative count (never written by the controller) counts as none.
        assert_eq!(
            Scheduled::of(&daemonset(Some(1), status(Some(1), -1))),
            every(0)
        );
    }

    #[test]
    fn an_empty_group_restarts_nothing() {
        let plan = restart_plan(&[], "h2", every(0));
        assert_eq!(plan.stale, 0);
        assert_eq!(plan.restart, None);
    }

    #[test]
    fn readiness() {
        assert!(is_ready(&pod("a", None, true)));
        assert!(!is_ready(&pod("a", None, false)));
        assert!(!is_ready(&Pod::default()));
        let mut other = pod("a", None, true);
        if let Some(c) = other.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            c[0].type_ = "ContainersReady".to_owned();
        }
        assert!(!is_ready(&other));
    }

    #[test]
    fn label_matching() {
        let labels = BTreeMap::from([
            ("a".to_owned(), "1".to_owned()),
            ("b".to_owned(), "2".to_owned()),
        ]);
        let selector = BTreeMap::from([("a".to_owned(), "1".to_owned())]);
        assert!(matches_labels(Some(&labels), &selector));
        assert!(matches_labels(Some(&labels), &BTreeMap::new()));
        assert!(matches_labels(None, &BTreeMap::new()));
        assert!(!matches_labels(None, &selector));
        let other = BTreeMap::from([("a".to_owned(), "2".to_owned())]);
        assert!(!matches_labels(Some(&labels), &other));
    }
}
