//! What the binding controller's API-server tests share (`controller.rs`, `block.rs`): the
//! controller started in-process (as the chart's ServiceAccount unless the test brings a client,
//! for fault injection), the controller killed after its writes ([`Crashing`]), its metrics, the
//! reading pod the webhook leaves, every stored version of a binding, and the waits.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use warmcache_api_modelcache::v2beta1::{BindingIdentity, ModelCacheBinding, PopulationState};
use warmcache_api_modelcache::{SHARING_DOMAIN_LABEL, identity_hash};
use warmcache_binding_controller::controller::{Settings, start};
use warmcache_modelvolume::LifecycleConfig;
use warmcache_modelvolume::keys::{
    BINDING_ANNOTATION, BINDING_UID_ANNOTATION, DOWNLOAD_STEP_ANNOTATION, HANDLE_ANNOTATION,
    MODEL_LABEL, URI_ANNOTATION,
};
use warmcache_runtime::{LogFormat, Runtime, RuntimeArgs};
use warmcache_testkit::{ComponentAccount, ControlPlane, CrashSwitch, eventually};

/// The model every test caches.
pub const HANDLE: &str = "hf://Qwen/Qwen3-0.6B@v1";

/// How long a wait may take (2 cores, several test binaries' control planes).
pub const WAIT: Duration = Duration::from_secs(90);

/// A running controller: its stop token, its task, its admin address.
pub type Running = (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<Result<(), warmcache_runtime::RuntimeError>>,
    std::net::SocketAddr,
);

/// The controller on `control`. Without a client of the test's own (fault injection) it runs
/// as the ServiceAccount the chart gives it, with the roles generated from src/rbac.rs: a call
/// the list forgot fails the tests.
pub async fn controller(
    plane: &ControlPlane,
    control: &str,
    client: Option<Client>,
    catalog_namespace: Option<&str>,
    lifecycle: LifecycleConfig,
) -> Running {
    let account = match client {
        Some(_) => None,
        None => {
            let admin = plane.client().await.unwrap();
            let own = catalog_namespace.unwrap_or(control);
            Some(
                ComponentAccount::create(plane, &admin, "binding-controller", own, control)
                    .await
                    .unwrap(),
            )
        }
    };
    let kubeconfig = account
        .as_ref()
        .map_or(plane.kubeconfig_path(), |a| a.kubeconfig_path());
    let args = RuntimeArgs {
        kubeconfig: Some(kubeconfig.to_path_buf()),
        kube_context: None,
        log_level: None,
        log_format: LogFormat::Plain,
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        shutdown_grace: Duration::from_secs(5),
        shutdown_delay: Duration::ZERO,
        kube_api_qps: warmcache_runtime::DEFAULT_KUBE_API_QPS,
        kube_api_burst: warmcache_runtime::DEFAULT_KUBE_API_BURST,
    };
    let builder = Runtime::builder("binding-controller", args).without_global_telemetry();
    let builder = match client {
        Some(client) => builder.client(client),
        None => builder.with_client(),
    };
    let mut runtime = builder.build().await.unwrap();
    start(
        &mut runtime,
        &Settings {
            control_namespace: control.to_owned(),
            concurrency: 2,
            catalog_namespace: catalog_namespace.map(str::to_owned),
            gates: warmcache_catalog::Gates::DEFAULT,
            lifecycle,
        },
    )
    .unwrap();
    let stop = runtime.shutdown_token();
    let admin = runtime.admin_addr();
    let run = async move {
        let _account = account;
        runtime.run().await
    };
    (stop, tokio::spawn(run), admin)
}

/// The controller's `/metrics` (HTTP/1.0, so the body is not chunked).
pub async fn scrape(admin: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(admin).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: admin\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    assert!(head.contains(" 200"), "{head}");
    body.to_owned()
}

/// The value of `series` in a scrape.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The binding of `identity` the webhook creates, written from `writer`, without a writer
/// Lease (the tests of the Lease name it themselves).
pub fn binding_of_identity(
    control: &str,
    writer: &str,
    identity: BindingIdentity,
) -> ModelCacheBinding {
    let mut b = warmcache_api_modelcache::fixtures::binding(control, writer, identity);
    b.spec.resources.lease_name.clear();
    b
}

/// The download step the webhook records on a reading pod.
pub fn step_json() -> String {
    json!({
        "version": "v1alpha1",
        "origin": "init",
        "sourceContainer": "fetch",
        "container": {
            "name": "fetch",
            "image": "tools:1",
            "command": ["sh", "-c", "echo downloading > /models/qwen3/config.json"],
            "volumeMounts": [{ "name": "models", "mountPath": "/models" }],
        },
        "dest": "/models/qwen3",
        "landingVolume": "models",
        "volumes": [{ "name": "models", "emptyDir": {} }],
    })
    .to_string()
}

/// A reading pod as the webhook leaves it (metadata only matters here).
pub fn reader_pod(name: &str, b: &ModelCacheBinding) -> Pod {
    let hash = identity_hash(&b.spec.identity);
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": { MODEL_LABEL: hash },
            "annotations": {
                BINDING_ANNOTATION: b.name_any(),
                BINDING_UID_ANNOTATION: b.uid().unwrap(),
                HANDLE_ANNOTATION: HANDLE,
                URI_ANNOTATION: HANDLE,
                DOWNLOAD_STEP_ANNOTATION: step_json(),
            },
        },
        "spec": { "containers": [{ "name": "vllm", "image": "vllm:1" }] },
    }))
    .unwrap()
}

/// Puts namespace `ns` in sharing domain `domain`.
pub async fn label_domain(client: &Client, ns: &str, domain: &str) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .patch(
            ns,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { SHARING_DOMAIN_LABEL: domain } } })),
        )
        .await
        .unwrap();
}

/// The binding's population state.
pub fn population(b: &ModelCacheBinding) -> Option<PopulationState> {
    b.status.as_ref()?.realized.as_ref()?.population_state
}

/// A condition of the binding as (status, reason, message).
pub fn condition<'b>(b: &'b ModelCacheBinding, type_: &str) -> Option<(&'b str, &'b str, &'b str)> {
    b.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.as_str(), c.reason.as_str(), c.message.as_str()))
}

/// The first pod of Job `job` in `ns`, once it exists.
pub async fn job_pod(client: &Client, ns: &str, job: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    eventually(&format!("the pod of Job {ns}/{job}"), WAIT, || {
        let pods = pods.clone();
        async move {
            pods.list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}")))
                .await
                .ok()?
                .items
                .into_iter()
                .next()
        }
    })
    .await
    .unwrap()
}

/// The binding stops changing: no status churn (a reconcile that rewrites what it just wrote
/// would loop on its own watch events).
pub async fn assert_settled(api: &Api<ModelCacheBinding>, name: &str) {
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = api.get(name).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = api.get(name).await.unwrap();
    assert_eq!(
        before.metadata.resource_version, after.metadata.resource_version,
        "the binding keeps changing: {:?}\n{:?}",
        before.status, after.status
    );
}

/// One stored version of the binding: (resourceVersion, population, Ready status and reason,
/// Progressing reason).
pub type Version = (String, Option<PopulationState>, String, String);

/// Every version of binding `name` stored from `from` on, read by a chain of short watches
/// (each from the last version seen, so none is missed), until `done` is cancelled.
pub fn record_versions(
    client: Client,
    api: &Api<ModelCacheBinding>,
    name: &str,
    from: String,
    done: tokio_util::sync::CancellationToken,
) -> (Arc<Mutex<Vec<Version>>>, tokio::task::JoinHandle<()>) {
    let seen: Arc<Mutex<Vec<Version>>> = Arc::new(Mutex::new(Vec::new()));
    let url = api.resource_url().to_owned();
    let selector = format!("metadata.name%3D{name}");
    let out = Arc::clone(&seen);
    let task = tokio::spawn(async move {
        let mut rv = from;
        loop {
            let request = http::Request::get(format!(
                "{url}?watch=true&fieldSelector={selector}&resourceVersion={rv}&timeoutSeconds=1"
            ))
            .body(Vec::new())
            .unwrap();
            let text = client.request_text(request).await.unwrap();
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                let event: serde_json::Value = serde_json::from_str(line).unwrap();
                assert_ne!(event["type"], "ERROR", "the watch of the binding: {event}");
                let b: ModelCacheBinding = serde_json::from_value(event["object"].clone()).unwrap();
                rv = b.resource_version().unwrap();
                let ready = condition(&b, "Ready")
                    .map(|(s, r, _)| format!("{s}/{r}"))
                    .unwrap_or_default();
                let progressing = condition(&b, "Progressing")
                    .map(|(_, r, _)| r.to_owned())
                    .unwrap_or_default();
                out.lock()
                    .unwrap()
                    .push((rv.clone(), population(&b), ready, progressing));
            }
            if done.is_cancelled() {
                return;
            }
        }
    });
    (seen, task)
}

/// Rank of a population state along the flow (`Failed` is not part of a successful one).
fn rank(p: Option<PopulationState>) -> u8 {
    match p {
        None => 0,
        Some(PopulationState::Pending) => 1,
        Some(PopulationState::Populating) => 2,
        Some(PopulationState::Ready) => 3,
        Some(PopulationState::Failed) => u8::MAX,
    }
}

/// The stored versions of a successful flow never go backwards: the population only moves
/// forward (none → Pending → Populating → Ready, never Failed), and once Ready the binding
/// stays `Ready`/`Downloaded`. Returns the index of the first Ready version.
pub fn assert_never_backwards(versions: &[Version]) -> usize {
    for pair in versions.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        assert!(
            rank(after.1) >= rank(before.1) && rank(after.1) != u8::MAX,
            "version {} went from {:?} back to {:?}: {versions:?}",
            after.0,
            before.1,
            after.1
        );
    }
    let first_ready = versions
        .iter()
        .position(|(_, p, _, _)| *p == Some(PopulationState::Ready))
        .unwrap_or_else(|| panic!("never Ready: {versions:?}"));
    for (rv, p, ready, progressing) in &versions[first_ready..] {
        assert_eq!(
            (*p, ready.as_str()),
            (Some(PopulationState::Ready), "True/Downloaded"),
            "version {rv} went back from Ready ({progressing}): {versions:?}"
        );
    }
    first_ready
}

/// One crash of a [`Crashing`] controller: the stored write after which its instance died
/// (`METHOD path`) and the server's answer to it.
#[derive(Clone, Debug)]
pub struct Crash {
    /// The last write the instance sent.
    pub write: String,
    /// The HTTP status the server answered (the instance never saw it).
    pub answer: String,
}

/// How a [`Crashing`] controller ended: each crash, in order, and the writes of the last
/// instance, which was stopped after it had been idle.
#[derive(Debug)]
pub struct Crashed {
    /// Every crash, in order.
    pub crashes: Vec<Crash>,
    /// The stored writes of the instance running when [`Crashing::finish`] was called.
    pub last_writes: Vec<String>,
}

/// How long the last instance must make no write before [`Crashing::finish`] stops it.
const IDLE: Duration = Duration::from_secs(3);

/// The controller run as a chain of processes that die right after a write: instance `i`
/// runs on a client whose [`CrashSwitch`] lets `budget(i)` writes be stored (Events and writes
/// the server refuses do not count) and then refuses every request; once that last write is
/// stored the instance is
/// stopped (its caches and queues are lost) and instance `i + 1` starts on a new client and
/// fresh caches. `budget(i) == None` runs a controller that never crashes.
pub struct Crashing {
    finish: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Crashed>,
}

impl Crashing {
    /// Starts instance 0 on `control` (the admin's rights: fault clients bypass the roles).
    pub fn start(
        plane: &'static ControlPlane,
        control: &str,
        lifecycle: LifecycleConfig,
        budget: impl Fn(usize) -> Option<usize> + Send + 'static,
    ) -> Self {
        let finish = tokio_util::sync::CancellationToken::new();
        let finishing = finish.clone();
        let control = control.to_owned();
        let task = tokio::spawn(async move {
            let mut crashes = Vec::new();
            for instance in 0_usize.. {
                let switch = budget(instance)
                    .map_or_else(CrashSwitch::never, CrashSwitch::after_writes)
                    .ignoring("/events");
                let client = plane.client_with_crash(&switch).await.unwrap();
                let (stop, task, _) =
                    controller(plane, &control, Some(client), None, lifecycle.clone()).await;
                let answer = tokio::select! {
                    answer = switch.crashed() => Some(answer),
                    () = idle_after(&finishing, &switch) => None,
                };
                stop.cancel();
                task.abort();
                let _ = task.await;
                let Some(answer) = answer else {
                    return Crashed {
                        crashes,
                        last_writes: switch.stored(),
                    };
                };
                let refused = switch.writes().len() - switch.stored().len();
                eprintln!(
                    "instance {instance} of {control}: killed after {answer} (stored write {}, {refused} refused)",
                    switch.stored().len()
                );
                let (write, answer) = answer.rsplit_once(" -> ").unwrap_or((&answer, ""));
                crashes.push(Crash {
                    write: write.to_owned(),
                    answer: answer.to_owned(),
                });
            }
            unreachable!("more instances than a usize counts")
        });
        Self { finish, task }
    }

    /// Stops the chain once the running instance has made no write for a few seconds (it has
    /// nothing left to do), and says how it went.
    pub async fn finish(self) -> Crashed {
        self.finish.cancel();
        self.task.await.unwrap()
    }
}

/// Returns once `finish` is cancelled and `switch`'s instance then made no write for [`IDLE`].
async fn idle_after(finish: &tokio_util::sync::CancellationToken, switch: &CrashSwitch) {
    finish.cancelled().await;
    loop {
        let before = switch.writes().len();
        tokio::time::sleep(IDLE).await;
        if switch.writes().len() == before && !switch.is_dead() {
            return;
        }
    }
}

/// What a crash chain must have covered: for each `(method, path part, n)`, at least `n`
/// crashes right after such a write; every crash after a DELETE deleted one of `deletable`
/// (nothing else is deleted); the last instance stored nothing.
pub fn assert_crashed_after(crashed: &Crashed, wanted: &[(&str, &str, usize)], deletable: &[&str]) {
    let list: Vec<String> = crashed
        .crashes
        .iter()
        .map(|c| format!("{} -> {}", c.write, c.answer))
        .collect();
    assert!(
        crashed.last_writes.is_empty(),
        "the last instance still stored writes: {:?}; crashes: {list:#?}",
        crashed.last_writes
    );
    for (method, path, n) in wanted {
        let seen = crashed
            .crashes
            .iter()
            .filter(|c| c.write.starts_with(&format!("{method} ")) && c.write.contains(path))
            .count();
        assert!(
            seen >= *n,
            "{seen} crashes after {method} {path}, wanted at least {n}: {list:#?}"
        );
    }
    for c in &crashed.crashes {
        if let Some(path) = c.write.strip_prefix("DELETE ") {
            let path = path.split('?').next().unwrap_or_default();
            assert!(
                deletable.iter().any(|d| path.ends_with(d)),
                "deleted {path}, not one of {deletable:?}: {list:#?}"
            );
        }
    }
    eprintln!("{} crashes, each after one write: {list:#?}", list.len());
}

/// How many runs of [`crash_after_every_n`] share the API server at a time.
const RUNS_AT_A_TIME: usize = 4;

/// How often [`crash_after_every_n`] runs again an N whose flow happened to end before its
/// `N`th write while a later N crashed: the number of status writes depends on what each
/// instance observes and when, so one flow may be a write or two shorter than another.
const RETRIES_OF_A_SHORT_RUN: usize = 4;

/// The crash matrix one crash per run: `run(n)` (a whole flow whose controller dies right after
/// its `n`th stored write, a fresh one finishing) for N = 1, 2, ..., a few at a time, until a
/// run ends without a crash (its flow stored fewer writes than N). An N below the last crash
/// whose run ended without one runs again (the flow's length varies with timing) up to
/// [`RETRIES_OF_A_SHORT_RUN`] times. Asserts one crash in each run before, a crash after each
/// N from 1 to the last, and at least `min` of them. Returns the write after which each run
/// crashed, by N.
pub async fn crash_after_every_n<F, Fut>(min: usize, run: F) -> Vec<(usize, String)>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Crashed> + Send + 'static,
{
    fn crash_of(n: usize, crashed: Crashed) -> Option<(usize, String)> {
        match crashed.crashes.as_slice() {
            [] => None,
            [crash] => Some((n, format!("{} -> {}", crash.write, crash.answer))),
            more => panic!("run {n}: one crash expected, got {more:?}"),
        }
    }
    let mut covered = Vec::new();
    let mut first = 1;
    loop {
        let mut runs = tokio::task::JoinSet::new();
        for n in first..first + RUNS_AT_A_TIME {
            let running = run(n);
            runs.spawn(async move { (n, running.await) });
        }
        let mut finished = false;
        while let Some(done) = runs.join_next().await {
            let (n, crashed) = done.unwrap();
            match crash_of(n, crashed) {
                Some(crash) => covered.push(crash),
                None => finished = true,
            }
        }
        if finished {
            break;
        }
        first += RUNS_AT_A_TIME;
        assert!(first < 100, "the flow never ended: {covered:?}");
    }
    let last = covered.iter().map(|(n, _)| *n).max().unwrap_or(0);
    for n in 1..last {
        for retry in 1..=RETRIES_OF_A_SHORT_RUN {
            if covered.iter().any(|(c, _)| *c == n) {
                break;
            }
            eprintln!(
                "run {n} ended before its write {n} while a later run crashed; again ({retry})"
            );
            if let Some(crash) = crash_of(n, run(n).await) {
                covered.push(crash);
            }
        }
    }
    covered.sort();
    eprintln!("crashed after write N: {covered:#?}");
    assert!(last >= min, "every write of the flow: {covered:#?}");
    assert_eq!(
        covered.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        (1..=last).collect::<Vec<_>>(),
        "a crash after each write up to the last"
    );
    covered
}
