//! The metric names documented in docs/operations.md are the ones the admission server
//! exports, under the same names whatever the embedding binary's registry prefix is.

// Test code: helpers outside #[test] fns may unwrap/panic too (clippy.toml only covers #[test]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;

use common::*;
use warmcache_admission::{
    AdmissionMetrics, AdmissionRequest, AdmissionResponse, AdmissionServer, AdmissionServerConfig,
    DynamicObject, Route,
};

const OPERATIONS_MD: &str = include_str!("../../../docs/operations.md");

/// Every `warmcache_admission_*` name written in backquotes in the operations guide.
fn documented() -> BTreeSet<String> {
    OPERATIONS_MD
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|quoted| quoted.starts_with("warmcache_admission_"))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn documented_admission_metrics_are_exported_under_their_documented_names() {
    // A component registry with a prefix, as warmcache_telemetry::Metrics builds them.
    let component =
        prometheus::Registry::new_custom(Some("warmcache_somecomponent".into()), None).unwrap();
    let runs = prometheus::IntCounter::new("reconcile_runs_total", "runs").unwrap();
    component.register(Box::new(runs.clone())).unwrap();
    runs.inc();
    let metrics = AdmissionMetrics::new().unwrap();
    let exposed = metrics.exposition_registry(&component).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    ca.leaf(1).write_to(dir.path());
    let server = AdmissionServer::new(AdmissionServerConfig::new(files_in(dir.path())))
        .route(Route::validating(
            "/ok",
            |req: AdmissionRequest<DynamicObject>| AdmissionResponse::from(&req),
        ))
        .with_metrics(metrics.clone());
    let running = spawn_serve(server);
    let reply = post_json(running.addr, &ca, "/ok", &pod_review("uid", "p")).await;
    assert_eq!(reply.response()["allowed"], true);

    let exported: BTreeSet<String> = exposed
        .gather()
        .iter()
        .map(|family| family.name().to_owned())
        .collect();
    let admission: BTreeSet<String> = exported
        .iter()
        .filter(|name| name.starts_with("warmcache_admission_"))
        .cloned()
        .collect();
    let documented = documented();
    assert!(
        !documented.is_empty(),
        "no admission metrics found in docs/operations.md"
    );
    assert_eq!(
        documented, admission,
        "docs/operations.md (left) and the exported admission metrics (right) differ"
    );
    // The component's own families keep its prefix; the admission ones do not get it.
    assert!(
        exported.contains("warmcache_somecomponent_reconcile_runs_total"),
        "{exported:?}"
    );
    assert!(
        !exported
            .iter()
            .any(|name| name.contains("somecomponent_admission")),
        "{exported:?}"
    );
    running.stop().await;
}
