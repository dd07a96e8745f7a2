//! W3C trace context carried in Kubernetes object annotations.
//!
//! One model download is one trace: the admission webhook writes the context of its span onto
//! the `ModelCacheBinding` it creates, the controller that reconciles the binding continues the
//! trace from there and writes its own context onto the Job or Pod it creates, and so on to the
//! last reader. The values use the W3C Trace Context formats of the `traceparent` and
//! `tracestate` HTTP headers, stored under [`TRACE_PARENT_ANNOTATION`] and
//! [`TRACE_STATE_ANNOTATION`].
//!
//! These helpers use the W3C propagator directly (not the global one), so they behave the same
//! whether or not [`crate::init`] ran; a span only has a context to inject once a tracer
//! provider is bridged into `tracing`, which [`crate::init`] always does.

use std::collections::BTreeMap;

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::{SpanContext, TraceContextExt as _, TraceId};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::error::TelemetryError;

/// Annotation holding the W3C `traceparent` of the span that created or last handed over the
/// object (`00-<trace id>-<span id>-<flags>`).
pub const TRACE_PARENT_ANNOTATION: &str = "warmcache.nvidia.io/traceparent";

/// Annotation holding the W3C `tracestate` that goes with [`TRACE_PARENT_ANNOTATION`]; absent
/// when the state is empty.
pub const TRACE_STATE_ANNOTATION: &str = "warmcache.nvidia.io/tracestate";

const TRACEPARENT_HEADER: &str = "traceparent";
const TRACESTATE_HEADER: &str = "tracestate";

fn annotation_for(header: &str) -> Option<&'static str> {
    match header {
        TRACEPARENT_HEADER => Some(TRACE_PARENT_ANNOTATION),
        TRACESTATE_HEADER => Some(TRACE_STATE_ANNOTATION),
        _ => None,
    }
}

struct AnnotationInjector<'a>(&'a mut BTreeMap<String, String>);

impl Injector for AnnotationInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        let Some(annotation) = annotation_for(key) else {
            return;
        };
        if value.is_empty() {
            // Do not leave a stale tracestate next to a new traceparent.
            self.0.remove(annotation);
        } else {
            self.0.insert(annotation.to_owned(), value);
        }
    }
}

struct AnnotationExtractor<'a>(&'a BTreeMap<String, String>);

impl Extractor for AnnotationExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        annotation_for(key)
            .and_then(|a| self.0.get(a))
            .map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        [TRACEPARENT_HEADER, TRACESTATE_HEADER]
            .into_iter()
            .filter(|h| self.get(h).is_some())
            .collect()
    }
}

/// Writes the trace context of `cx` into `annotations`.
///
/// Returns `false` and leaves `annotations` untouched when `cx` has no valid span context.
pub fn inject_context(cx: &Context, annotations: &mut BTreeMap<String, String>) -> bool {
    if !cx.span().span_context().is_valid() {
        return false;
    }
    TraceContextPropagator::new().inject_context(cx, &mut AnnotationInjector(annotations));
    true
}

/// Writes the trace context of the current span into `annotations` (for an object about to be
/// created or patched).
///
/// The current `tracing` span is used; if it has no OpenTelemetry context, the current
/// OpenTelemetry context is tried. Returns `false` and leaves `annotations` untouched when
/// there is no valid context (no span, or telemetry not initialised).
pub fn inject_current(annotations: &mut BTreeMap<String, String>) -> bool {
    let from_span = tracing::Span::current().context();
    if inject_context(&from_span, annotations) {
        return true;
    }
    inject_context(&Context::current(), annotations)
}

/// The remote span context stored in `annotations`, if there is a valid one.
#[must_use]
pub fn extract_span_context(annotations: &BTreeMap<String, String>) -> Option<SpanContext> {
    let cx = extract(annotations);
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| sc.clone())
}

/// Reads the trace context stored in `annotations` into a new OpenTelemetry [`Context`].
///
/// A missing or malformed annotation gives an empty context (a span parented to it becomes the
/// root of a new trace); this never fails or panics. A malformed `tracestate` alone is dropped
/// and the `traceparent` still used.
///
/// The `traceparent` is checked strictly against the W3C format (`version-traceid-parentid-flags`
/// with exactly 2, 32, 16 and 2 lower-case hex digits) before it is parsed.
#[must_use]
pub fn extract(annotations: &BTreeMap<String, String>) -> Context {
    let well_formed = annotations
        .get(TRACE_PARENT_ANNOTATION)
        .is_some_and(|v| is_well_formed_traceparent(v.trim()));
    if !well_formed {
        return Context::new();
    }
    TraceContextPropagator::new()
        .extract_with_context(&Context::new(), &AnnotationExtractor(annotations))
}

/// The W3C `traceparent` shape; the propagator itself accepts short ids and a trailing dash.
fn is_well_formed_traceparent(value: &str) -> bool {
    let lower_hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let mut parts = value.split('-');
    let (Some(version), Some(trace_id), Some(parent_id), Some(flags)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let rest_ok = if version == "00" {
        parts.next().is_none()
    } else {
        // Later versions may append fields; "ff" is forbidden.
        version != "ff"
    };
    rest_ok
        && lower_hex(version, 2)
        && lower_hex(trace_id, 32)
        && lower_hex(parent_id, 16)
        && lower_hex(flags, 2)
}

/// Makes the trace stored in `annotations` the parent of `span`, so the work on this object
/// joins the trace of whoever created it.
///
/// Call it right after creating the span and before entering it or creating children (for
/// example on the span of one reconcile). Returns `Ok(true)` when the parent was set and
/// `Ok(false)` when the annotations hold no valid context; the span is then left as it is.
///
/// # Errors
/// [`TelemetryError::SetParent`] when the span is disabled by the log filter, was already
/// started, or no OpenTelemetry layer is installed. Callers usually log it and go on.
pub fn set_parent_from_annotations(
    span: &tracing::Span,
    annotations: &BTreeMap<String, String>,
) -> Result<bool, TelemetryError> {
    let cx = extract(annotations);
    if !cx.span().span_context().is_valid() {
        return Ok(false);
    }
    span.set_parent(cx).map_err(TelemetryError::SetParent)?;
    Ok(true)
}

/// The trace id of the current span, if telemetry is initialised and a span is entered.
///
/// Useful to put the id in an Event message or a status condition so an operator can look the
/// trace up.
#[must_use]
pub fn current_trace_id() -> Option<TraceId> {
    let cx = tracing::Span::current().context();
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| sc.trace_id())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LogFormat;
    use crate::subscriber::tests::{SharedBuf, test_subscriber};

    fn with_telemetry<R>(f: impl FnOnce() -> R) -> R {
        let (subscriber, _provider) = test_subscriber(LogFormat::Plain, SharedBuf::default());
        tracing::subscriber::with_default(subscriber, f)
    }

    fn traceparent_is_well_formed(v: &str) -> bool {
        let parts: Vec<&str> = v.split('-').collect();
        parts.len() == 4
            && parts[0] == "00"
            && parts[1].len() == 32
            && parts[2].len() == 16
            && parts[3].len() == 2
            && parts.iter().all(|p| {
                p.chars()
                    .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
            })
            && parts[1] != "0".repeat(32)
            && parts[2] != "0".repeat(16)
    }

    #[test]
    fn inject_then_extract_round_trips_the_trace_id() {
        with_telemetry(|| {
            let span = tracing::info_span!("admission");
            let _e = span.enter();
            let mut annotations = BTreeMap::new();
            annotations.insert("other".to_owned(), "kept".to_owned());
            annotations.insert(TRACE_STATE_ANNOTATION.to_owned(), "stale=1".to_owned());
            assert!(inject_current(&mut annotations));

            let tp = annotations.get(TRACE_PARENT_ANNOTATION).unwrap();
            assert!(traceparent_is_well_formed(tp), "{tp}");
            assert!(tp.ends_with("-01"), "sampled: {tp}");
            assert!(!annotations.contains_key(TRACE_STATE_ANNOTATION));
            assert_eq!(annotations.get("other").map(String::as_str), Some("kept"));

            let here = current_trace_id().unwrap();
            let sc = extract_span_context(&annotations).unwrap();
            assert_eq!(sc.trace_id(), here);
            assert!(sc.is_remote());
            assert_eq!(sc.span_id(), span.context().span().span_context().span_id());
        });
    }

    #[test]
    fn child_span_continues_the_trace_from_annotations() {
        with_telemetry(|| {
            let mut annotations = BTreeMap::new();
            let origin = {
                let webhook = tracing::info_span!("webhook");
                let _e = webhook.enter();
                assert!(inject_current(&mut annotations));
                current_trace_id().unwrap()
            };

            // Later, elsewhere (no span entered): a controller picks up the object.
            let reconcile = tracing::info_span!("reconcile");
            assert!(set_parent_from_annotations(&reconcile, &annotations).unwrap());
            let _e = reconcile.enter();
            assert_eq!(current_trace_id(), Some(origin));

            // And hands the trace on to the next object.
            let mut next = BTreeMap::new();
            assert!(inject_current(&mut next));
            assert_eq!(extract_span_context(&next).unwrap().trace_id(), origin);
            assert_ne!(
                next[TRACE_PARENT_ANNOTATION],
                annotations[TRACE_PARENT_ANNOTATION]
            );
        });
    }

    #[test]
    fn tracestate_round_trips() {
        let mut annotations = BTreeMap::new();
        annotations.insert(
            TRACE_PARENT_ANNOTATION.to_owned(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        );
        annotations.insert(TRACE_STATE_ANNOTATION.to_owned(), "vendor=abc".to_owned());
        let cx = extract(&annotations);
        let mut out = BTreeMap::new();
        assert!(inject_context(&cx, &mut out));
        assert_eq!(out, annotations);
    }

    #[test]
    fn malformed_annotations_give_a_fresh_root() {
        let tp = |v: &str| {
            let mut m = BTreeMap::new();
            m.insert(TRACE_PARENT_ANNOTATION.to_owned(), v.to_owned());
            m
        };
        let bad = [
            "",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-f067aa0ba902b7-01",
            "00-zzf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "💥-💥-💥-💥",
        ];
        with_telemetry(|| {
            for v in bad {
                let annotations = tp(v);
                assert!(extract_span_context(&annotations).is_none(), "{v:?}");
                assert!(!extract(&annotations).has_active_span(), "{v:?}");

                let span = tracing::info_span!("reconcile");
                assert!(!set_parent_from_annotations(&span, &annotations).unwrap());
                let _e = span.enter();
                // A new trace was started, with valid ids.
                assert!(current_trace_id().is_some());
            }
        });
        assert!(extract_span_context(&BTreeMap::new()).is_none());
    }

    #[test]
    fn later_traceparent_versions_are_read_as_version_00() {
        let mut annotations = BTreeMap::new();
        annotations.insert(
            TRACE_PARENT_ANNOTATION.to_owned(),
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future".to_owned(),
        );
        let sc = extract_span_context(&annotations).unwrap();
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(sc.is_sampled());
    }

    #[test]
    fn malformed_tracestate_alone_keeps_the_parent() {
        let mut annotations = BTreeMap::new();
        annotations.insert(
            TRACE_PARENT_ANNOTATION.to_owned(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        );
        annotations.insert(TRACE_STATE_ANNOTATION.to_owned(), "===,,, bad".to_owned());
        let sc = extract_span_context(&annotations).unwrap();
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.trace_state().header(), "");
    }

    #[test]
    fn nothing_to_inject_without_a_span_or_subscriber() {
        let mut annotations = BTreeMap::new();
        assert!(!inject_current(&mut annotations));
        assert!(annotations.is_empty());
        with_telemetry(|| {
            assert!(!inject_current(&mut annotations));
            assert!(current_trace_id().is_none());
        });
        assert!(annotations.is_empty());
    }

    #[test]
    fn set_parent_on_a_started_span_is_an_error() {
        with_telemetry(|| {
            let mut annotations = BTreeMap::new();
            annotations.insert(
                TRACE_PARENT_ANNOTATION.to_owned(),
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
            );
            let span = tracing::info_span!("reconcile");
            drop(span.enter());
            let err = set_parent_from_annotations(&span, &annotations).unwrap_err();
            assert!(matches!(err, TelemetryError::SetParent(_)), "{err}");
        });
    }
}
