//! Kubernetes Events (`events.k8s.io/v1`) for a component, best effort.
//!
//! An Event explains to a human what a controller did or why it could not. Recording one must
//! never make the caller's work fail: errors are logged at `warn` and swallowed. Repeated events
//! with the same (type, reason, action, object) within a few minutes are folded into one Event
//! series by kube's [`Recorder`].
//!
//! RBAC: the component needs `create` and `patch` on `events` in API group `events.k8s.io` in
//! the namespaces of the objects it reports on (`default` for cluster-scoped objects).

use k8s_openapi::api::core::v1::ObjectReference;
pub use kube::runtime::events::EventType;
use kube::runtime::events::{Event, Recorder, Reporter};
use kube::{Client, Resource};
use tracing::warn;

use crate::conditions::truncate_with_marker;

/// Maximum length of an Event reason and action (events.k8s.io/v1 validation).
pub const MAX_EVENT_REASON_BYTES: usize = 128;

/// Maximum length of an Event note (events.k8s.io/v1 validation).
pub const MAX_EVENT_NOTE_BYTES: usize = 1024;

const NOTE_MARKER: &str = " ...[truncated]";

/// Publishes Events on behalf of one component (the `reportingController` of every Event).
///
/// Cheap to clone; clones share the de-duplication cache.
#[derive(Clone)]
pub struct EventRecorder {
    recorder: Recorder,
    reporter: Reporter,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder")
            .field("reporter", &self.reporter)
            .finish_non_exhaustive()
    }
}

impl EventRecorder {
    /// A recorder for `component` (for example `warmcache-binding-controller`).
    ///
    /// `instance` identifies this replica (usually the pod name); when `None`, the host name is
    /// used.
    pub fn new(client: Client, component: &str, instance: Option<&str>) -> Self {
        let reporter = match instance {
            Some(instance) => Reporter {
                controller: component.to_owned(),
                instance: Some(instance.to_owned()),
            },
            None => Reporter::from(component),
        };
        Self {
            recorder: Recorder::new(client, reporter.clone()),
            reporter,
        }
    }

    /// The reporter identity stamped on every Event.
    pub fn reporter(&self) -> &Reporter {
        &self.reporter
    }

    /// Records an Event about `regarding`. Never fails: a rejected or undeliverable Event is
    /// logged and dropped.
    ///
    /// `reason` (CamelCase, why) and `action` (CamelCase, what was done) are cut to
    /// [`MAX_EVENT_REASON_BYTES`]; `note` (human-readable detail) to [`MAX_EVENT_NOTE_BYTES`].
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: Option<&str>,
    ) {
        let event = build_event(type_, reason, action, note);
        if let Err(error) = self.recorder.publish(&event, regarding).await {
            warn!(
                %error,
                reason = %event.reason,
                action = %event.action,
                object_kind = regarding.kind.as_deref().unwrap_or_default(),
                object_namespace = regarding.namespace.as_deref().unwrap_or_default(),
                object_name = regarding.name.as_deref().unwrap_or_default(),
                "could not record an Event; continuing without it"
            );
        }
    }

    /// [`publish`](Self::publish) for an object whose type is known statically.
    pub async fn publish_for<K>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: Option<&str>,
    ) where
        K: Resource<DynamicType = ()>,
    {
        self.publish(&obj.object_ref(&()), type_, reason, action, note)
            .await;
    }

    /// Records a `Normal` Event about `obj`.
    pub async fn normal<K>(&self, obj: &K, reason: &str, action: &str, note: Option<&str>)
    where
        K: Resource<DynamicType = ()>,
    {
        self.publish_for(obj, EventType::Normal, reason, action, note)
            .await;
    }

    /// Records a `Warning` Event about `obj`.
    pub async fn warning<K>(&self, obj: &K, reason: &str, action: &str, note: Option<&str>)
    where
        K: Resource<DynamicType = ()>,
    {
        self.publish_for(obj, EventType::Warning, reason, action, note)
            .await;
    }
}

/// Builds the kube Event, cutting fields to the API limits.
fn build_event(type_: EventType, reason: &str, action: &str, note: Option<&str>) -> Event {
    Event {
        type_,
        reason: truncate_with_marker(reason, MAX_EVENT_REASON_BYTES, ""),
        action: truncate_with_marker(action, MAX_EVENT_REASON_BYTES, ""),
        note: note.map(|n| truncate_with_marker(n, MAX_EVENT_NOTE_BYTES, NOTE_MARKER)),
        secondary: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_cut_to_api_limits() {
        let long = "R".repeat(300);
        let note = "é".repeat(2000);
        let ev = build_event(EventType::Warning, &long, &long, Some(&note));
        assert_eq!(ev.reason.len(), MAX_EVENT_REASON_BYTES);
        assert_eq!(ev.action.len(), MAX_EVENT_REASON_BYTES);
        let n = ev.note.unwrap();
        assert!(n.len() <= MAX_EVENT_NOTE_BYTES);
        assert!(n.ends_with(NOTE_MARKER));
        assert_eq!(ev.type_, EventType::Warning);
    }

    #[test]
    fn short_fields_are_kept() {
        let ev = build_event(EventType::Normal, "Created", "CreateJob", None);
        assert_eq!(ev.reason, "Created");
        assert_eq!(ev.action, "CreateJob");
        assert!(ev.note.is_none());
        assert!(ev.secondary.is_none());
    }
}
