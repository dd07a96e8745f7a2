//! The watch, reconcile, API request and rate limit families documented in docs/operations.md
//! are the ones the runtime registers, and every shared flag is in its tables.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;

use clap::{CommandFactory, Parser};
use warmcache_runtime::api_requests::ApiRequestMetrics;
use warmcache_runtime::rate_limit::RateLimitMetrics;
use warmcache_runtime::{AdmissionArgs, LeaderElectionArgs, RuntimeArgs, WatchMetrics};
use warmcache_telemetry::{Metrics, ReconcileMetrics};

const OPERATIONS_MD: &str = include_str!("../../../docs/operations.md");

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    runtime: RuntimeArgs,
    #[command(flatten)]
    leader: LeaderElectionArgs,
    #[command(flatten)]
    admission: AdmissionArgs,
}

#[test]
fn documented_families_are_the_registered_ones() {
    let metrics = Metrics::new("warmcache_doc").unwrap();
    let reconcile = ReconcileMetrics::register(metrics.registry()).unwrap();
    let watch = WatchMetrics::register(metrics.registry()).unwrap();
    let requests = ApiRequestMetrics::register(metrics.registry()).unwrap();
    requests.requests.with_label_values(&["get", "pods"]);
    RateLimitMetrics::register(metrics.registry()).unwrap();
    drop(reconcile.start("c"));
    reconcile.failure("c", "x");
    for counter in [&watch.malformed, &watch.errors, &watch.resyncs] {
        counter.with_label_values(&["Pod"]);
    }
    let registered: BTreeSet<String> = metrics
        .registry()
        .gather()
        .iter()
        .map(|family| family.name().replacen("warmcache_doc", "<prefix>", 1))
        .collect();
    let documented: BTreeSet<String> = OPERATIONS_MD
        .lines()
        .filter_map(|line| line.strip_prefix("| `<prefix>_"))
        .filter_map(|rest| rest.split('`').next())
        .map(|name| format!("<prefix>_{name}"))
        .collect();
    assert_eq!(
        documented, registered,
        "docs/operations.md (left) and the registered families (right) differ"
    );
}

#[test]
fn every_shared_flag_is_documented() {
    let command = Cli::command();
    let flags: Vec<String> = command
        .get_arguments()
        .filter_map(|arg| arg.get_long().map(|long| format!("`--{long}")))
        .collect();
    assert!(flags.len() >= 14, "{flags:?}");
    for flag in flags {
        assert!(
            OPERATIONS_MD.contains(&flag),
            "{flag}` is not in docs/operations.md"
        );
    }
}
