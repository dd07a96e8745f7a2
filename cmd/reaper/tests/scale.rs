//! A sweep over many bindings (10,000 by default, `WARMCACHE_REAPER_SCALE` to change) on the
//! real API server, by the real `reaper sweep` binary: it must look at every binding, act on
//! none (they are all referenced or inside the idle period) and stay within a fixed memory bound
//! (bindings are listed page by page). Prints the sweep's time and peak RSS
//! (`docs/benchmarks.md` records them); the assertion is on memory only, never on time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use warmcache_api_modelcache::v2beta1::{
    BindingIdentity, BindingPhase, ModelCacheBinding, ModelCacheBindingStatus, RequestReference,
    Workflow,
};
use warmcache_testkit::{ControlPlane, TestNamespace};

/// The peak resident set a sweep of any size may reach: what a page of bindings and the
/// process itself need, far below what holding 10,000 bindings at once would.
const MAX_RSS_KIB: u64 = 120 * 1024;

fn binding(control: &str, i: usize) -> ModelCacheBinding {
    let identity = BindingIdentity::new(
        Workflow::RegularModelCache,
        &format!("domain-{i}"),
        "hf://Qwen/Qwen3-0.6B@v1",
    );
    let mut b = warmcache_api_modelcache::fixtures::binding(control, "team-a", identity);
    // No finalizer: the namespace's deletion removes them at the end.
    b.metadata.finalizers = None;
    b
}

/// Nine in ten referenced, the rest unreferenced for a minute (inside the idle period).
fn status(i: usize) -> ModelCacheBindingStatus {
    let referenced = !i.is_multiple_of(10);
    ModelCacheBindingStatus {
        phase: Some(BindingPhase::Active),
        request_references: if referenced {
            vec![RequestReference {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                namespace: "team-a".into(),
                name: format!("vllm-{i}"),
                uid: format!("uid-{i}"),
            }]
        } else {
            Vec::new()
        },
        unreferenced_since: (!referenced).then(|| Time(Timestamp::now())),
        ..ModelCacheBindingStatus::default()
    }
}

fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_over_ten_thousand_bindings_stays_within_its_memory_bound() {
    let count: usize = std::env::var("WARMCACHE_REAPER_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let plane = ControlPlane::shared().await.unwrap();
    let control = TestNamespace::new("reap-scale").await.unwrap();
    let api: Api<ModelCacheBinding> = control.api();
    let started = Instant::now();
    stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            let ns = control.name.clone();
            async move {
                let mut b = api
                    .create(&PostParams::default(), &binding(&ns, i))
                    .await
                    .unwrap();
                b.status = Some(status(i));
                api.replace_status(&b.name_any(), &PostParams::default(), &b)
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
    println!("created {count} bindings in {:?}", started.elapsed());

    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_reaper"))
        .args([
            "sweep",
            "--control-namespace",
            &control.name,
            "--page-size",
            "500",
        ])
        .arg("--kubeconfig")
        .arg(plane.kubeconfig_path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut peak = 0;
    let deadline = Instant::now() + Duration::from_secs(900);
    let status = loop {
        if let Some(kib) = vm_hwm_kib(pid) {
            peak = peak.max(kib);
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the sweep did not end in 15 minutes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let elapsed = started.elapsed();
    let out = std::io::read_to_string(child.stdout.take().unwrap()).unwrap();
    println!("{out}");
    println!(
        "sweep over {count} bindings: {:.1} s, peak RSS {} MiB",
        elapsed.as_secs_f64(),
        peak / 1024
    );
    assert!(status.success(), "{status}: {out}");
    let summary = out.lines().last().unwrap();
    assert!(
        summary.starts_with(&format!("sweep: {count} bindings")),
        "every binding looked at: {summary}"
    );
    assert!(summary.contains(" 0 actions"), "{summary}");
    assert!(peak > 0, "the peak was read");
    assert!(
        peak <= MAX_RSS_KIB,
        "peak RSS {peak} KiB is above the bound of {MAX_RSS_KIB} KiB"
    );
    control.cleanup().await;
}
