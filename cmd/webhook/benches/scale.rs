//! Scale on the real API server (issue 17 item 7): many models, many pods, the `webhook serve`
//! process and the `binding-controller controller` process each running as its ServiceAccount
//! (the chart's generated roles, the default client rate limits), and the test kit's kubelet
//! simulation marking every pod Running as a kubelet would.
//!
//! `SCALE_MODELS` models (default 1,000) with `SCALE_PODS_PER_MODEL` bare pods each (default
//! 20, so 20,000 pods) in `SCALE_NAMESPACES` namespaces of one sharing domain (default 20): pod
//! `r` of model `m` lives in namespace `(m + r) % SCALE_NAMESPACES`, and pods are created a
//! round of models at a time (every model's first pod, then every model's second, ...), so each
//! model's first admission creates its binding and the rest join it, as a fleet scaling up does.
//! `SCALE_CONCURRENCY` creates are in flight at once (default 64). Two phases: the cold start
//! (every model's first pod: the bindings are created, the controller creates each one's claim
//! and Job), then, once every first pod's reference is recorded, the scale-up (every other pod
//! joins an existing binding). Measured:
//!
//! - pod create latency (p50, p99) and throughput, against the same pods in namespaces the
//!   webhook is not called for (the baseline, first, in the same run), printed as ratios;
//! - time to steady state of each phase: from its first create until every rewritten pod's
//!   reference is in its binding's `status.requestReferences`;
//! - per pod, from its create returning to its reference first showing in its binding (a watch
//!   of the bindings): p50, p99, max, per phase (target: p99 under 1 s);
//! - the same at a steady arrival rate, after the scale-up has settled: `SCALE_STEADY_RATE`
//!   pods a second (default 20; `0` leaves the phase out) for `SCALE_STEADY_SECONDS` (default
//!   60), each created at its own time whether or not earlier creates have returned, each
//!   joining its model's binding. The two burst phases measure how long a backlog takes to
//!   drain (the API server is saturated by the creates themselves); this one measures how long a
//!   reference takes when pods arrive at a rate the API server keeps up with;
//! - resident memory of both processes at steady state (VmRSS) and their peak (VmHWM) (target:
//!   at most 256 MiB at 100,000 pods).
//!
//! The binding controller is the release binary beside this benchmark's:
//!
//! ```sh
//! cargo build --release -p warmcache-binding-controller
//! cargo bench -p warmcache-webhook --bench scale
//! SCALE_MODELS=10000 SCALE_PODS_PER_MODEL=10 cargo bench -p warmcache-webhook --bench scale
//! ```
//!
//! `SCALE_CONTROLLER_CONCURRENCY` sets the controller's `--concurrency` (reconciles at once).
//!
//! `SCALE_CONTROLLER_WRAPPER` prefixes the controller's command line (a profiler such as
//! `heaptrack -o /tmp/binding-controller`).
//!
//! `SCALE_CONTROLLER_QPS` sets the controller's `--kube-api-qps` (its burst twice that; `0`
//! turns the client-side limit off); unset, the component's default applies, as in the chart.
//!
//! `SCALE_BASELINE=0` leaves the baseline out (at 100,000 pods it is another 100,000 pods on the
//! same API server and several minutes); its columns then print `-`.
//!
//! The controller's reads of pods for their download step (`pod_step_reads_total`, the pod
//! cache does not keep steps) are printed after the table.
//!
//! Nothing is asserted about time (the numbers go to docs/benchmarks.md); the run fails when the
//! product does the wrong thing: a pod not rewritten, a binding missing, a reference never
//! recorded.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use warmcache_api_modelcache::SHARING_DOMAIN_LABEL;
use warmcache_api_modelcache::v2beta1::ModelCacheBinding;
use warmcache_modelvolume::keys::{BINDING_ANNOTATION, DOWNLOAD_STEP_ANNOTATION};
use warmcache_testkit::{ComponentAccount, ControlPlane, Kubelet, built_binaries_dir, eventually};

/// The value of the variable `name` (a count or a rate), `default` when unset.
fn env_or<T>(name: &str, default: T) -> T
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|e| panic!("{name}={v}: not a number: {e}")),
        Err(_) => default,
    }
}

/// Pod `replica` of model `model`: vLLM downloading `bench/model-<model>` by itself.
fn model_pod(model: usize, replica: usize) -> Pod {
    pod(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": format!("m{model}-r{replica}"), "labels": {"app": "scale"}},
        "spec": {
            "containers": [{
                "name": "vllm",
                "image": "vllm/vllm-openai:v0.20.0",
                "args": ["--model", format!("bench/model-{model}")],
                "env": [{"name": "HF_HOME", "value": "/models/hf"}],
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                "volumeMounts": [{"name": "m", "mountPath": "/models"}]
            }],
            "volumes": [{"name": "m", "emptyDir": {}}]
        }
    }))
}

/// The pods in creation order: round `r` creates every model's pod `r`.
fn plan(models: usize, per_model: usize, namespaces: &[String]) -> Vec<(String, Pod)> {
    (0..per_model)
        .flat_map(|r| {
            (0..models).map(move |m| (namespaces[(m + r) % namespaces.len()].clone(), (m, r)))
        })
        .map(|(ns, (m, r))| (ns, model_pod(m, r)))
        .collect()
}

/// One created pod: its UID, whether the webhook rewrote it, when its create returned and how
/// long the create took.
struct Created {
    uid: String,
    rewritten: bool,
    returned: Instant,
    latency: Duration,
}

/// How pods are sent: as fast as `concurrency` creates in flight allow, or one every
/// `1 / rate` seconds (an arrival rate below what the API server can take).
#[derive(Clone, Copy)]
enum Pace {
    InFlight(usize),
    PerSecond(f64),
}

/// Creates `pods` at `pace`, each marked Running by the kubelet simulation once created.
async fn create_all(client: &Client, pods: Vec<(String, Pod)>, pace: Pace) -> Vec<Created> {
    let kubelet = Kubelet::new(client.clone());
    let first = tokio::time::Instant::now();
    let in_flight = match pace {
        Pace::InFlight(n) => n,
        // Every create starts at its own time; none waits for another.
        Pace::PerSecond(_) => pods.len().max(1),
    };
    futures::stream::iter(pods.into_iter().enumerate())
        .map(|(i, (ns, pod))| {
            let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let kubelet = kubelet.clone();
            async move {
                if let Pace::PerSecond(rate) = pace {
                    tokio::time::sleep_until(first + Duration::from_secs_f64(i as f64 / rate))
                        .await;
                }
                let started = Instant::now();
                let created = api
                    .create(&PostParams::default(), &pod)
                    .await
                    .expect("pod creation is never blocked");
                let returned = Instant::now();
                kubelet
                    .set_running(&ns, &created.name_any())
                    .await
                    .expect("the kubelet simulation marks the pod Running");
                Created {
                    uid: created.uid().unwrap_or_default(),
                    rewritten: created.annotations().contains_key(BINDING_ANNOTATION),
                    returned,
                    latency: returned - started,
                }
            }
        })
        .buffer_unordered(in_flight)
        .collect()
        .await
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1000.0)
}

/// The sum of a component's `<prefix>_api_requests_total` series.
fn api_requests(metrics: &str, prefix: &str) -> f64 {
    let name = format!("{prefix}_api_requests_total{{");
    metrics
        .lines()
        .filter(|l| l.starts_with(&name))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

/// VmRSS and VmHWM of `pid`, in MiB.
fn memory_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("process {pid} is gone: {e}"));
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map(|kib| kib / 1024.0)
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The binding controller as a process of its own, as the chart's ServiceAccount.
struct Controller {
    child: Child,
    admin: std::net::SocketAddr,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
    _account: ComponentAccount,
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Controller {
    async fn start(
        plane: &ControlPlane,
        client: &Client,
        control: &str,
        qps: Option<usize>,
    ) -> Controller {
        let binary = built_binaries_dir().unwrap().join("binding-controller");
        assert!(
            binary.is_file(),
            "{} is missing: cargo build --release -p warmcache-binding-controller",
            binary.display()
        );
        let home = namespace(client, "sc-bc", &[]).await;
        let account = ComponentAccount::create(plane, client, "binding-controller", &home, control)
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("binding-controller.log");
        let out = std::fs::File::create(&log).unwrap();
        let admin: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        // `SCALE_CONTROLLER_WRAPPER` runs the controller under a profiler (e.g. `heaptrack -o
        // /tmp/bc`); the memory printed is then the wrapper's, unless it execs the controller
        // (as `env` does).
        let wrapper = std::env::var("SCALE_CONTROLLER_WRAPPER").unwrap_or_default();
        let mut words = wrapper.split_whitespace();
        let mut command = match words.next() {
            Some(program) => {
                let mut c = Command::new(program);
                c.args(words).arg(&binary);
                c
            }
            None => Command::new(&binary),
        };
        let child = command
            .arg("controller")
            .arg("--kubeconfig")
            .arg(account.kubeconfig_path())
            .args(["--control-namespace", control])
            .args(["--admin-listen", &admin.to_string()])
            .args(["--leader-elect=false", "--log-format", "plain"])
            .args(
                std::env::var("SCALE_CONTROLLER_CONCURRENCY")
                    .ok()
                    .map(|c| ["--concurrency".to_owned(), c])
                    .into_iter()
                    .flatten(),
            )
            .args(qps.iter().flat_map(|q| {
                [
                    "--kube-api-qps".to_owned(),
                    q.to_string(),
                    "--kube-api-burst".to_owned(),
                    (q * 2).max(1).to_string(),
                ]
            }))
            .env("OTEL_SDK_DISABLED", "true")
            .env_remove("POD_NAMESPACE")
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let controller = Controller {
            child,
            admin,
            log,
            _dir: dir,
            _account: account,
        };
        let ready = eventually("the binding controller's /readyz", TIMEOUT, || async move {
            matches!(http_get(admin, "/readyz").await, Some((200, _))).then_some(())
        })
        .await;
        if ready.is_err() {
            panic!(
                "the binding controller never became ready:\n{}",
                std::fs::read_to_string(&controller.log).unwrap_or_default()
            );
        }
        controller
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    async fn metrics(&self) -> String {
        http_get(self.admin, "/metrics")
            .await
            .map(|(_, body)| body)
            .unwrap_or_default()
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

/// Watches the bindings of `control` and notes when each reference UID first shows.
fn watch_references(client: &Client, control: &str) -> Arc<Mutex<HashMap<String, Instant>>> {
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let api: Api<ModelCacheBinding> = Api::namespaced(client.clone(), control);
    let into = seen.clone();
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Ok(Some(event)) = events.try_next().await {
            let now = Instant::now();
            let bindings: Vec<ModelCacheBinding> = match event {
                watcher::Event::Apply(b) | watcher::Event::InitApply(b) => vec![b],
                _ => Vec::new(),
            };
            let mut seen = into.lock().unwrap();
            for b in bindings {
                for r in b.status.iter().flat_map(|s| &s.request_references) {
                    seen.entry(r.uid.clone()).or_insert(now);
                }
            }
        }
    });
    seen
}

/// One phase's pods and what they gave.
struct Phase {
    name: &'static str,
    created: Vec<Created>,
    created_took: Duration,
    steady_after: Duration,
    /// Per pod, create returned -> reference first seen, sorted.
    to_reference: Vec<Duration>,
}

/// Creates `pods` (every one must be rewritten), then waits until each one's reference shows in
/// its binding.
async fn phase(
    name: &'static str,
    client: &Client,
    pods: Vec<(String, Pod)>,
    pace: Pace,
    seen: &Arc<Mutex<HashMap<String, Instant>>>,
    controller: &Controller,
) -> Phase {
    let count = pods.len();
    let started = Instant::now();
    let created = create_all(client, pods, pace).await;
    let created_took = started.elapsed();
    let not_rewritten = created.iter().filter(|c| !c.rewritten).count();
    assert_eq!(
        not_rewritten, 0,
        "{name}: every pod reads its model's binding ({not_rewritten} of {count} not rewritten)"
    );
    println!(
        "{name}: {count} pods created and marked Running in {:.1} s",
        created_took.as_secs_f64()
    );
    let wanted: Vec<String> = created.iter().map(|c| c.uid.clone()).collect();
    let recorded = eventually(
        &format!("{name}: every pod's reference recorded in its binding"),
        Duration::from_secs(3600),
        || {
            let (seen, wanted) = (seen.clone(), &wanted);
            async move {
                let seen = seen.lock().unwrap();
                wanted
                    .iter()
                    .map(|uid| seen.get(uid).copied())
                    .collect::<Option<Vec<Instant>>>()
            }
        },
    )
    .await;
    let steady_after = started.elapsed();
    let at = match recorded {
        Ok(at) => at,
        Err(e) => panic!("{e}\n--- binding controller:\n{}", controller.log_tail()),
    };
    let mut to_reference: Vec<Duration> = created
        .iter()
        .zip(at)
        .map(|(c, at)| at.saturating_duration_since(c.returned))
        .collect();
    to_reference.sort();
    Phase {
        name,
        created,
        created_took,
        steady_after,
        to_reference,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let models = env_or::<usize>("SCALE_MODELS", 1000);
    let per_model = env_or::<usize>("SCALE_PODS_PER_MODEL", 20);
    let namespace_count = env_or::<usize>("SCALE_NAMESPACES", 20).max(1);
    let concurrency = env_or::<usize>("SCALE_CONCURRENCY", 64).max(1);
    let total = models * per_model;
    let steady_rate = env_or::<f64>("SCALE_STEADY_RATE", 20.0);
    let steady_seconds = env_or::<f64>("SCALE_STEADY_SECONDS", 60.0);
    println!(
        "scale: {models} models x {per_model} pods = {total} pods in {namespace_count} namespaces, {concurrency} creates in flight, then {steady_rate} pods/s for {steady_seconds} s, controller --kube-api-qps {} --concurrency {}",
        std::env::var("SCALE_CONTROLLER_QPS").unwrap_or_else(|_| "default".into()),
        std::env::var("SCALE_CONTROLLER_CONCURRENCY").unwrap_or_else(|_| "default".into())
    );

    let plane = ControlPlane::shared().await.unwrap();
    let client = client().await;
    let served = Served::start(&client).await;
    let qps = std::env::var("SCALE_CONTROLLER_QPS")
        .ok()
        .map(|v| v.parse::<usize>().expect("SCALE_CONTROLLER_QPS: a count"));
    let controller = Controller::start(plane, &client, &served.control, qps).await;

    // Baseline: the same pods where the webhook is not called (warmcache disabled for them).
    let with_baseline = env_or::<usize>("SCALE_BASELINE", 1) != 0;
    let mut plain = Vec::new();
    let started = Instant::now();
    let baseline = if with_baseline {
        for _ in 0..namespace_count {
            plain.push(namespace(&client, "sc-base", &[]).await);
        }
        let baseline = create_all(
            &client,
            plan(models, per_model, &plain),
            Pace::InFlight(concurrency),
        )
        .await;
        println!(
            "baseline: {total} pods created and marked Running in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        baseline
    } else {
        println!("baseline: not run (SCALE_BASELINE=0)");
        Vec::new()
    };
    let baseline_took = started.elapsed();

    // With warmcache: one sharing domain over every namespace.
    let domain = unique("scale");
    let mut namespaces = Vec::new();
    for _ in 0..namespace_count {
        namespaces.push(
            served
                .namespace(&client, "sc", &[(SHARING_DOMAIN_LABEL, domain.as_str())])
                .await,
        );
    }
    let seen = watch_references(&client, &served.control);
    let (cold_plan, warm_plan): (Vec<_>, Vec<_>) = plan(models, per_model, &namespaces)
        .into_iter()
        .enumerate()
        .partition(|(i, _)| *i < models);
    let strip = |p: Vec<(usize, (String, Pod))>| p.into_iter().map(|(_, p)| p).collect::<Vec<_>>();
    let cold = phase(
        "cold start (each model's first pod)",
        &client,
        strip(cold_plan),
        Pace::InFlight(concurrency),
        &seen,
        &controller,
    )
    .await;
    let warm = phase(
        "scale-up (the other pods join)",
        &client,
        strip(warm_plan),
        Pace::InFlight(concurrency),
        &seen,
        &controller,
    )
    .await;
    // Steady arrival: once the scale-up has settled, more pods at a fixed rate, each joining its
    // model's binding (replicas past `per_model`, models in turn).
    let steady = if steady_rate > 0.0 && steady_seconds > 0.0 {
        let count = (steady_rate * steady_seconds).round() as usize;
        let pods = (0..count)
            .map(|i| {
                let (m, r) = (i % models, per_model + i / models);
                (
                    namespaces[(m + r) % namespaces.len()].clone(),
                    model_pod(m, r),
                )
            })
            .collect();
        Some(
            phase(
                "steady arrival",
                &client,
                pods,
                Pace::PerSecond(steady_rate),
                &seen,
                &controller,
            )
            .await,
        )
    } else {
        println!("steady arrival: not run (SCALE_STEADY_RATE=0)");
        None
    };
    let (webhook_rss, webhook_hwm) = memory_mib(served.pid());
    let (controller_rss, controller_hwm) = memory_mib(controller.pid());
    let webhook_requests = api_requests(&served.metrics().await, "warmcache_webhook");
    let controller_metrics = controller.metrics().await;
    let controller_requests = api_requests(&controller_metrics, "warmcache_binding_controller");
    if std::env::var_os("SCALE_SHOW_REQUESTS").is_some() {
        for line in controller_metrics
            .lines()
            .filter(|l| l.starts_with("warmcache_binding_controller_api_requests_total{"))
        {
            println!("{line}");
        }
    }
    let bindings = served
        .bindings(&client)
        .list(&Default::default())
        .await
        .unwrap();
    assert_eq!(bindings.items.len(), models, "one binding per model");
    // What the controller's pod cache holds per pod: the metadata of rewritten pods, as JSON.
    let sample = Api::<Pod>::namespaced(client.clone(), &namespaces[0])
        .list_metadata(&ListParams::default().limit(200))
        .await
        .unwrap();
    let mean = |f: &dyn Fn(&kube::core::ObjectMeta) -> usize| {
        sample.items.iter().map(|p| f(&p.metadata)).sum::<usize>() / sample.items.len().max(1)
    };
    let meta_bytes = mean(&|m| serde_json::to_vec(m).map_or(0, |v| v.len()));
    let annotation_bytes = mean(&|m| serde_json::to_vec(&m.annotations).map_or(0, |v| v.len()));
    let managed_bytes = mean(&|m| {
        m.managed_fields
            .as_ref()
            .and_then(|f| serde_json::to_vec(f).ok())
            .map_or(0, |v| v.len())
    });
    // The annotations the controller's pod cache keeps, each key and value (JSON).
    let kept = warmcache_binding_controller::pods::POD_ANNOTATIONS_READ;
    let kept_bytes: Vec<(&str, usize)> = kept
        .iter()
        .map(|key| {
            (
                *key,
                mean(&|m| {
                    m.annotations
                        .as_ref()
                        .and_then(|a| a.get(*key))
                        .map_or(0, |v| key.len() + v.len() + 6)
                }),
            )
        })
        .collect();
    let step_bytes = mean(&|m| {
        m.annotations
            .as_ref()
            .and_then(|a| a.get(DOWNLOAD_STEP_ANNOTATION))
            .map_or(0, String::len)
    });

    let mut base: Vec<Duration> = baseline.iter().map(|c| c.latency).collect();
    base.sort();
    let mut with: Vec<Duration> = cold
        .created
        .iter()
        .chain(&warm.created)
        .map(|c| c.latency)
        .collect();
    with.sort();
    let with_took = cold.created_took + warm.created_took;
    let all_pods = total + steady.as_ref().map_or(0, |p| p.created.len());

    println!();
    println!("| | with warmcache | without | ratio |");
    println!("|---|---|---|---|");
    if base.is_empty() {
        println!(
            "| pod create p50 / p99 | {} / {} ms | - | - |",
            ms(percentile(&with, 0.5)),
            ms(percentile(&with, 0.99)),
        );
        println!(
            "| {total} pods created and Running | {:.1} s | - | - |",
            with_took.as_secs_f64(),
        );
    } else {
        println!(
            "| pod create p50 / p99 | {} / {} ms | {} / {} ms | {:.2}x / {:.2}x |",
            ms(percentile(&with, 0.5)),
            ms(percentile(&with, 0.99)),
            ms(percentile(&base, 0.5)),
            ms(percentile(&base, 0.99)),
            percentile(&with, 0.5).as_secs_f64() / percentile(&base, 0.5).as_secs_f64(),
            percentile(&with, 0.99).as_secs_f64() / percentile(&base, 0.99).as_secs_f64(),
        );
        println!(
            "| {total} pods created and Running | {:.1} s | {:.1} s | {:.2}x |",
            with_took.as_secs_f64(),
            baseline_took.as_secs_f64(),
            with_took.as_secs_f64() / baseline_took.as_secs_f64()
        );
    }
    if let Some(p) = &steady {
        let mut latency: Vec<Duration> = p.created.iter().map(|c| c.latency).collect();
        latency.sort();
        println!(
            "| {}: {} pods at {steady_rate}/s, pod create p50 / p99 | {} / {} ms | - | |",
            p.name,
            p.created.len(),
            ms(percentile(&latency, 0.5)),
            ms(percentile(&latency, 0.99)),
        );
    }
    for p in [Some(&cold), Some(&warm), steady.as_ref()]
        .into_iter()
        .flatten()
    {
        println!(
            "| {}: {} pods, steady (every reference recorded) after | {:.1} s | - | |",
            p.name,
            p.created.len(),
            p.steady_after.as_secs_f64()
        );
        println!(
            "| {}: create returned -> reference recorded p50 / p99 / max | {} / {} / {} ms (target p99 < 1000) | - | |",
            p.name,
            ms(percentile(&p.to_reference, 0.5)),
            ms(percentile(&p.to_reference, 0.99)),
            ms(*p.to_reference.last().unwrap()),
        );
    }
    println!("| webhook memory: now / peak | {webhook_rss:.0} / {webhook_hwm:.0} MiB | - | |");
    println!(
        "| binding controller memory: now / peak | {controller_rss:.0} / {controller_hwm:.0} MiB | - | |"
    );
    println!(
        "| rewritten pod metadata (JSON), mean: whole / managedFields / annotations / download step | {meta_bytes} / {managed_bytes} / {annotation_bytes} / {step_bytes} B | - | |"
    );
    println!(
        "| annotations the controller's pod cache keeps (JSON key and value), mean | {} B: {} | - | |",
        kept_bytes.iter().map(|(_, b)| b).sum::<usize>(),
        kept_bytes
            .iter()
            .map(|(k, b)| format!("{k} {b}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "| bindings | {} (one per model) | - | |",
        bindings.items.len()
    );
    println!(
        "| API requests per pod: webhook / binding controller | {:.3} / {:.3} | - | |",
        webhook_requests / all_pods as f64,
        controller_requests / all_pods as f64
    );
    for line in controller_metrics
        .lines()
        .filter(|l| l.starts_with("warmcache_binding_controller_pod_step_reads_total{"))
    {
        println!("{line}");
    }

    served.stop(&client).await;
    drop(controller);
}
