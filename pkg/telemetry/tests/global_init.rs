//! `init` installs process-wide state, so it is exercised once, in its own test binary.

use std::collections::BTreeMap;

use warmcache_telemetry::{
    LogFormat, TRACE_PARENT_ANNOTATION, TelemetryConfig, TelemetryError, current_trace_id,
    extract_span_context, init, inject_current, set_parent_from_annotations,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_without_export_still_propagates_trace_context() {
    let no_env = |_: &str| None;
    let bad = TelemetryConfig::from_lookup("test", Some("info,x=nope"), LogFormat::Plain, no_env);
    assert!(matches!(
        init(&bad),
        Err(TelemetryError::InvalidLogFilter { .. })
    ));

    let config = TelemetryConfig::from_lookup("test", Some("debug"), LogFormat::Json, no_env);
    let guard = init(&config).unwrap();
    assert!(!guard.exporting());

    let fields: Vec<String> =
        opentelemetry::global::get_text_map_propagator(|p| p.fields().map(str::to_owned).collect());
    assert!(fields.iter().any(|f| f == "traceparent"), "{fields:?}");

    let mut annotations = BTreeMap::new();
    let origin = {
        let span = tracing::info_span!("admission");
        let _e = span.enter();
        tracing::info!("admitting");
        assert!(inject_current(&mut annotations));
        current_trace_id().unwrap()
    };
    let tp = &annotations[TRACE_PARENT_ANNOTATION];
    assert!(tp.starts_with("00-") && tp.len() == 55, "{tp}");
    assert_eq!(
        extract_span_context(&annotations).unwrap().trace_id(),
        origin
    );

    // Across an await point, in a spawned task.
    let continued = tokio::spawn(async move {
        use tracing::Instrument as _;
        let span = tracing::info_span!("reconcile");
        assert!(set_parent_from_annotations(&span, &annotations).unwrap());
        async {
            tokio::task::yield_now().await;
            current_trace_id()
        }
        .instrument(span)
        .await
    })
    .await
    .unwrap();
    assert_eq!(continued, Some(origin));

    let again = TelemetryConfig::from_lookup("test", None, LogFormat::Plain, no_env);
    assert!(matches!(
        init(&again),
        Err(TelemetryError::AlreadyInitialized(_))
    ));

    guard.shutdown().unwrap();
}
