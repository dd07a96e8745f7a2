//! The status read from a REAL store: `mooncake_master` started on loopback with exactly the
//! leader flags [`render`] renders (only the two port values moved to free ports), and a member
//! (`mc_store_rest_server`) started from exactly the member environment it renders (the
//! downward-API Pod IP and the leader address pointed at loopback), with a temporary directory
//! as its tier. The replies are parsed by `warmcache_kvcache::store` and turned into a status by
//! `backend_status`, as the controller does.
//!
//! The store comes from `hack/mooncake.sh` (PyPI `mooncake-transfer-engine-non-cuda`
//! 0.3.13.post1); `WARMCACHE_MOONCAKE_MASTER` may name an installed `mooncake_master` instead
//! (its directory must hold `mc_store_rest_server`). The test fails, never skips, when the store
//! cannot be had. With `WARMCACHE_RECORD_MOONCAKE_FIXTURES=1` it also rewrites the replies under
//! `tests/fixtures/mooncake/0.3.13.post1/`, which `tests/status.rs` reads without a store.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStatus, Pod, PodCondition, PodSpec,
    PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use warmcache_api_kvcache::v1alpha1::KVCacheBackend;
use warmcache_kvcache::condition::find_condition;
use warmcache_kvcache::names::{labels, member_component};
use warmcache_kvcache::status::{Observed, backend_status};
use warmcache_kvcache::store::{self, Fetch, HttpReply, STORE_DEFAULT_TIER_BYTES};
use warmcache_kvcache::vectors;
use warmcache_kvcache::{RenderContext, ValidationContext, from_value, render, validate};

const VERSION_DIR: &str = "0.3.13.post1";
const SEGMENT: u64 = 64 * 1024 * 1024;
const TIER_CAPACITY: u64 = 1024 * 1024 * 1024;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `mooncake_master` from `WARMCACHE_MOONCAKE_MASTER` or `hack/mooncake.sh` (installing it on a
/// fresh machine), once per test binary.
fn master_binary() -> &'static Path {
    static MASTER: OnceLock<PathBuf> = OnceLock::new();
    MASTER.get_or_init(|| {
        if let Some(path) = std::env::var_os("WARMCACHE_MOONCAKE_MASTER") {
            return PathBuf::from(path);
        }
        let out = Command::new("bash")
            .arg(repo_root().join("hack/mooncake.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("running hack/mooncake.sh");
        assert!(
            out.status.success(),
            "hack/mooncake.sh failed; the real store is required for this test"
        );
        let text = String::from_utf8(out.stdout).unwrap();
        PathBuf::from(
            text.lines()
                .last()
                .expect("hack/mooncake.sh printed no path")
                .trim(),
        )
    })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process killed (SIGKILL: the member does not stop on SIGTERM once its leader is
/// gone) and reaped when dropped, so a failing test leaves nothing running.
struct Running {
    child: Child,
    what: &'static str,
    log: PathBuf,
}

impl Running {
    fn spawn(what: &'static str, mut command: Command, log: PathBuf) -> Self {
        let file = std::fs::File::create(&log).unwrap();
        command
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e}"));
        Self { child, what, log }
    }

    fn assert_alive(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "{} exited with {status}; its log:\n{}",
                self.what,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request to 127.0.0.1:`port` with `Connection: close`.
fn http(port: u16, method: &str, path: &str, body: Option<&str>) -> Fetch {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    let body = body.unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of the response head")?;
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    let mut body = raw[split + 4..].to_vec();
    if let Some(length) = head.lines().find_map(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("content-length:")
            .and_then(|v| v.trim().parse::<usize>().ok())
    }) {
        body.truncate(length);
    }
    Ok(HttpReply { status, body })
}

fn get(port: u16, path: &str) -> Fetch {
    http(port, "GET", path, None)
}

fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = f() {
            return value;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A fresh scratch directory.
fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("warmcache-mooncake-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A stored backend with one small DRAM group (64Mi segment, 16Mi buffer) and a tier at `tier`
/// (`capacity` unless `None`), admitted by the validator.
fn backend(tier: Option<(&Path, Option<&str>)>) -> KVCacheBackend {
    let mut group = json!({
        "nodeSelector": {},
        "medium": "DRAM",
        "capacityPerMember": "64Mi",
        "localBufferSize": "16Mi",
    });
    if let Some((path, capacity)) = tier {
        let mut disk = json!({"path": path.to_str().unwrap()});
        if let Some(capacity) = capacity {
            disk["capacity"] = json!(capacity);
        }
        group["localDisks"] = json!([disk]);
    }
    let mut b: KVCacheBackend = from_value(vectors::backend(vec![group])).unwrap();
    assert_eq!(validate(&b, None, &ValidationContext::default()), vec![]);
    b.metadata.uid = Some("uid-live".into());
    b.metadata.generation = Some(1);
    b.metadata.creation_timestamp = Some(Time(Timestamp::now()));
    b
}

fn container<'a>(containers: &'a [Container], name: &str) -> &'a Container {
    containers.iter().find(|c| c.name == name).unwrap()
}

/// The rendered leader args with the two port values moved; everything else as rendered.
fn leader_args(backend: &KVCacheBackend, rpc: u16, admin: u16) -> Vec<String> {
    let rendered = render(backend, &RenderContext::default()).unwrap();
    let spec = rendered.leader.spec.template.spec.unwrap();
    let leader = container(&spec.containers, "leader");
    assert_eq!(
        leader.command.as_deref(),
        Some(&["mooncake_master".to_owned()][..])
    );
    let args = leader.args.clone().unwrap();
    let moved: Vec<String> = args
        .iter()
        .map(|a| match a.as_str() {
            "-rpc_port=50051" => format!("-rpc_port={rpc}"),
            "-metrics_port=9003" => format!("-metrics_port={admin}"),
            other => other.to_owned(),
        })
        .collect();
    assert_eq!(
        moved.iter().zip(&args).filter(|(a, b)| a != b).count(),
        2,
        "exactly the two port flags move: {args:?}"
    );
    moved
}

struct Leader {
    process: Running,
    admin: u16,
    rpc: u16,
}

fn start_leader(backend: &KVCacheBackend, dir: &Path) -> Leader {
    let (rpc, admin) = (free_port(), free_port());
    let mut command = Command::new(master_binary());
    command
        .args(leader_args(backend, rpc, admin))
        .current_dir(dir);
    let mut process = Running::spawn("mooncake_master", command, dir.join("master.log"));
    wait_for("the leader to serve", Duration::from_secs(30), || {
        process.assert_alive();
        let reply = get(admin, store::HEALTH_PATH).ok()?;
        store::parse_health(&reply.body)
            .ok()
            .filter(|h| h.serving())
    });
    Leader {
        process,
        admin,
        rpc,
    }
}

/// Starts a member of group 0 from the rendered environment; returns it and its REST port.
fn start_member(backend: &KVCacheBackend, leader: &Leader, dir: &Path) -> (Running, u16) {
    let rendered = render(backend, &RenderContext::default()).unwrap();
    let spec = rendered.members[0].spec.template.spec.clone().unwrap();
    let member = container(&spec.containers, "member");
    assert_eq!(
        member.command.as_deref(),
        Some(&["mc_store_rest_server".to_owned()][..])
    );
    assert_eq!(member.args, None, "group 0 renders no args");
    let port = free_port();
    let bin = master_binary()
        .parent()
        .unwrap()
        .join("mc_store_rest_server");
    let mut command = Command::new(bin);
    command.env_clear();
    for key in ["PATH", "HOME", "LANG"] {
        if let Some(value) = std::env::var_os(key) {
            command.env(key, value);
        }
    }
    for env in member.env.iter().flatten() {
        let value = match (&env.value, &env.value_from) {
            (Some(v), _) if env.name == "MOONCAKE_MASTER" => {
                assert_eq!(v, "kvc-leader.gpustack-system.svc:50051");
                format!("127.0.0.1:{}", leader.rpc)
            }
            (Some(v), _) => v.clone(),
            (None, Some(from)) => {
                let field = &from.field_ref.as_ref().unwrap().field_path;
                assert_eq!(field, "status.podIP", "{}", env.name);
                "127.0.0.1".to_owned()
            }
            (None, None) => String::new(),
        };
        command.env(&env.name, value);
    }
    command.args(["--port", &port.to_string()]).current_dir(dir);
    let process = Running::spawn("mc_store_rest_server", command, dir.join("member.log"));
    (process, port)
}

struct Scrape {
    health: Fetch,
    metrics: Fetch,
    detail: Fetch,
    all: Fetch,
}

fn scrape(admin: u16) -> Scrape {
    Scrape {
        health: get(admin, store::HEALTH_PATH),
        metrics: get(admin, store::METRICS_PATH),
        detail: get(admin, store::SEGMENTS_DETAIL_PATH),
        all: get(admin, store::ALL_SEGMENTS_PATH),
    }
}

fn fixture_dir(scenario: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/mooncake")
        .join(VERSION_DIR)
        .join(scenario)
}

fn body(fetch: &Fetch) -> &[u8] {
    let reply = fetch.as_ref().unwrap();
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    &reply.body
}

/// With `WARMCACHE_RECORD_MOONCAKE_FIXTURES=1`, writes the replies as the fixtures of
/// `scenario`.
fn record(scenario: &str, scrape: &Scrape) {
    if std::env::var_os("WARMCACHE_RECORD_MOONCAKE_FIXTURES").is_none_or(|v| v != "1") {
        return;
    }
    let dir = fixture_dir(scenario);
    std::fs::create_dir_all(&dir).unwrap();
    for (file, fetch) in [
        ("health.json", &scrape.health),
        ("metrics.txt", &scrape.metrics),
        ("get_segments_detail.json", &scrape.detail),
        ("get_all_segments.txt", &scrape.all),
    ] {
        std::fs::write(dir.join(file), body(fetch)).unwrap();
    }
}

/// The member Pod the status joins the segment with: on `node-a`, IP 127.0.0.1, running and
/// ready since `started`.
fn member_pod(started: Timestamp) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("kvc-member-0-abcde".into()),
            labels: Some(labels("kvc", &member_component(0))),
            creation_timestamp: Some(Time(started)),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some("node-a".into()),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some("127.0.0.1".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..PodCondition::default()
            }]),
            container_statuses: Some(vec![ContainerStatus {
                name: "member".into(),
                ready: true,
                state: Some(ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: Some(Time(started)),
                    }),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            }]),
            ..PodStatus::default()
        }),
    }
}

fn daemonset(backend: &KVCacheBackend, desired: i32) -> DaemonSet {
    let mut ds = render(backend, &RenderContext::default()).unwrap().members[0].clone();
    ds.status = Some(DaemonSetStatus {
        desired_number_scheduled: desired,
        ..DaemonSetStatus::default()
    });
    ds
}

fn status_of(
    backend: &KVCacheBackend,
    scrape: &Scrape,
    pods: &[&Pod],
    daemonsets: &[&DaemonSet],
) -> warmcache_api_kvcache::v1alpha1::KVCacheBackendStatus {
    backend_status(
        backend,
        &Observed {
            namespace: "gpustack-system",
            health: Some(&scrape.health),
            metrics: Some(&scrape.metrics),
            segments: Some(&scrape.detail),
            member_daemonsets: daemonsets,
            ..Observed::default()
        },
        pods,
        Timestamp::now(),
    )
}

fn condition<'a>(
    status: &'a warmcache_api_kvcache::v1alpha1::KVCacheBackendStatus,
    type_: &str,
) -> (&'a str, &'a str, &'a str) {
    let c = find_condition(status.conditions.as_deref().unwrap(), type_).unwrap();
    (c.status.as_str(), c.reason.as_str(), c.message.as_str())
}

fn gauges(scrape: &Scrape) -> store::Gauges {
    store::parse_metrics(body(&scrape.metrics)).unwrap()
}

/// PUTs `count` values of 1 MB through the member's REST API; returns how many succeeded.
fn put(member_port: u16, prefix: &str, count: usize) -> usize {
    let value = "v".repeat(1_000_000);
    (0..count)
        .filter(|i| {
            let body = json!({"key": format!("{prefix}-{i}"), "value": value}).to_string();
            http(member_port, "PUT", "/api/put", Some(&body)).is_ok_and(|r| r.status == 200)
        })
        .count()
}

#[test]
fn the_real_store_reports_a_tier_that_fills_only_under_memory_pressure() {
    let dir = scratch("tier");
    let tier = dir.join("tier");
    std::fs::create_dir(&tier).unwrap();
    let backend = backend(Some((&tier, Some("1Gi"))));

    let mut leader = start_leader(&backend, &dir);

    // The leader alone: serving, no segment, zero capacity reported.
    let alone = scrape(leader.admin);
    record("leader-only", &alone);
    let health = store::parse_health(body(&alone.health)).unwrap();
    assert!(health.serving());
    assert_eq!(health.role.as_deref(), Some("leader"));
    assert_eq!(
        gauges(&alone),
        store::Gauges {
            total_capacity_bytes: 0,
            allocated_bytes: 0,
            total_file_capacity_bytes: 0,
            allocated_file_size_bytes: 0,
        }
    );
    let detail = store::parse_segments_detail(body(&alone.detail)).unwrap();
    assert_eq!(detail.total_segments, 0);
    assert_eq!(
        store::parse_all_segments(body(&alone.all)).unwrap(),
        Vec::<String>::new()
    );
    let ds = daemonset(&backend, 1);
    let status = status_of(&backend, &alone, &[], &[&ds]);
    assert_eq!(status.phase.as_deref(), Some("Provisioning"));
    assert_eq!(condition(&status, "LeaderAvailable").1, "LeaderServing");
    assert_eq!(condition(&status, "MembersMounted").1, "NoSegments");

    // A member from the rendered environment mounts its segment and its tier.
    let (mut member, member_port) = start_member(&backend, &leader, &dir);
    let started = Timestamp::now();
    let detail = wait_for("the member's segment", Duration::from_secs(90), || {
        member.assert_alive();
        leader.process.assert_alive();
        let d = store::parse_segments_detail(
            &get(leader.admin, store::SEGMENTS_DETAIL_PATH).ok()?.body,
        )
        .ok()?;
        (d.segments.len() == 1).then_some(d)
    });
    let segment = &detail.segments[0];
    assert_eq!(segment.host(), "127.0.0.1");
    assert_eq!(segment.size_bytes, Some(SEGMENT));
    assert_eq!(segment.protocol.as_deref(), Some("tcp"));
    assert_eq!(segment.status.as_deref(), Some("OK"));
    // The REST port opens once the store is set up (the rendered readiness probe).
    wait_for("the member's REST port", Duration::from_secs(60), || {
        member.assert_alive();
        TcpStream::connect(("127.0.0.1", member_port)).ok()
    });

    let mounted = scrape(leader.admin);
    record("mounted", &mounted);
    let g = gauges(&mounted);
    assert_eq!(g.total_capacity_bytes, SEGMENT);
    assert_eq!(
        g.total_file_capacity_bytes, TIER_CAPACITY,
        "the declared capacity"
    );
    assert_eq!(g.allocated_file_size_bytes, 0);
    assert_eq!(
        store::parse_all_segments(body(&mounted.all)).unwrap(),
        vec![segment.segment_name.clone()]
    );
    let pod = member_pod(started);
    let status = status_of(&backend, &mounted, &[&pod], &[&ds]);
    assert_eq!(
        status.phase.as_deref(),
        Some("Ready"),
        "{:?}",
        status.phase_message
    );
    assert_eq!(status.phase_message.as_deref(), Some(""));
    assert_eq!(condition(&status, "MembersMounted").0, "True");
    let members = status.members.as_ref().unwrap();
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].node_name.as_deref(), Some("node-a"));
    assert_eq!(members[0].segment_id, segment.segment_id);
    assert_eq!(members[0].medium.as_deref(), Some("DRAM"));
    let capacity = status.capacity.as_ref().unwrap();
    assert_eq!(
        capacity.total.as_ref().unwrap().0,
        "1088Mi",
        "64Mi of memory + the 1Gi tier"
    );
    let (observed, _, message) = condition(&status, "CapacityObserved");
    assert_eq!(observed, "True");
    assert!(message.contains("0 bytes written"), "{message}");
    assert!(
        message.contains("nothing has been written to the tier yet"),
        "{message}"
    );

    // Low memory: a few keys stay in memory, and the tier stays empty past the store's 10 s
    // offload heartbeat.
    assert_eq!(put(member_port, "low", 4), 4);
    std::thread::sleep(Duration::from_secs(12));
    let low = scrape(leader.admin);
    let g = gauges(&low);
    assert_eq!(g.allocated_bytes, 4_000_000);
    assert_eq!(
        g.allocated_file_size_bytes, 0,
        "the tier is written only under memory pressure"
    );
    assert_eq!(std::fs::read_dir(&tier).unwrap().count(), 0);
    let status = status_of(&backend, &low, &[&pod], &[&ds]);
    assert!(
        condition(&status, "CapacityObserved")
            .2
            .contains("nothing has been written to the tier yet")
    );

    // Memory pressure: past the segment's size, evicted keys go to the tier.
    let accepted = put(member_port, "high", 100);
    assert!(accepted > 40, "only {accepted} of 100 puts were accepted");
    let g = wait_for("bytes on the tier", Duration::from_secs(90), || {
        member.assert_alive();
        let reply = get(leader.admin, store::METRICS_PATH).ok()?;
        store::parse_metrics(&reply.body)
            .ok()
            .filter(|g| g.allocated_file_size_bytes > 0)
    });
    assert!(
        std::fs::read_dir(&tier).unwrap().count() > 0,
        "bucket files on disk"
    );
    let filled = scrape(leader.admin);
    record("filled", &filled);
    let status = status_of(&backend, &filled, &[&pod], &[&ds]);
    let (_, _, message) = condition(&status, "CapacityObserved");
    assert!(!message.contains("nothing has been written"), "{message}");
    assert!(message.contains(" bytes written"), "{message}");
    assert!(g.allocated_file_size_bytes <= TIER_CAPACITY);

    drop(member);
    drop(leader);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_tier_without_capacity_reports_the_stores_default_and_the_status_says_so() {
    let dir = scratch("default");
    let tier = dir.join("tier");
    std::fs::create_dir(&tier).unwrap();
    let backend = backend(Some((&tier, None)));
    let mut leader = start_leader(&backend, &dir);
    let (mut member, _) = start_member(&backend, &leader, &dir);
    wait_for("the member's segment", Duration::from_secs(90), || {
        member.assert_alive();
        leader.process.assert_alive();
        let reply = get(leader.admin, store::METRICS_PATH).ok()?;
        store::parse_metrics(&reply.body)
            .ok()
            .filter(|g| g.total_capacity_bytes > 0 && g.total_file_capacity_bytes > 0)
    });
    let scraped = scrape(leader.admin);
    record("default-capacity", &scraped);
    assert_eq!(
        gauges(&scraped).total_file_capacity_bytes,
        STORE_DEFAULT_TIER_BYTES
    );
    let pod = member_pod(Timestamp::now() - SignedDuration::from_secs(5));
    let status = status_of(&backend, &scraped, &[&pod], &[]);
    let (_, _, message) = condition(&status, "CapacityObserved");
    assert!(
        message.contains("the store's default of 2199023255552 bytes (2Ti)"),
        "{message}"
    );
    assert_eq!(status.capacity.unwrap().total.unwrap().0, "2097216Mi");
    drop(member);
    drop(leader);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_leader_without_a_tier_renders_no_offload_and_reports_no_file_capacity() {
    let dir = scratch("plain");
    let backend = backend(None);
    assert!(
        !leader_args(&backend, 1, 2)
            .iter()
            .any(|a| a.contains("offload"))
    );
    let leader = start_leader(&backend, &dir);
    let scraped = scrape(leader.admin);
    let status = status_of(&backend, &scraped, &[], &[]);
    assert_eq!(condition(&status, "CapacityObserved").0, "True");
    assert!(
        !condition(&status, "CapacityObserved")
            .2
            .contains("disk tier")
    );
    // An unknown flag makes the real master exit (the reference's fact the renderer relies on).
    let mut bad = Command::new(master_binary());
    bad.arg("-no_such_flag=1").current_dir(&dir);
    let status = bad
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success());
    drop(leader);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The families the real leader serves match the recorded fixture (the store did not drift).
#[test]
fn the_recorded_fixture_matches_the_live_leader() {
    let dir = scratch("families");
    let backend = backend(Some((&dir, Some("1Gi"))));
    let leader = start_leader(&backend, &dir);
    let live = scrape(leader.admin);
    let families = |text: &[u8]| -> Vec<String> {
        let mut f: Vec<String> = String::from_utf8_lossy(text)
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(str::to_owned)
            .collect();
        f.sort();
        f
    };
    let recorded = std::fs::read(fixture_dir("leader-only").join("metrics.txt")).unwrap();
    assert_eq!(families(body(&live.metrics)), families(&recorded));
    let recorded_health: Value = serde_json::from_slice(
        &std::fs::read(fixture_dir("leader-only").join("health.json")).unwrap(),
    )
    .unwrap();
    let live_health: Value = serde_json::from_slice(body(&live.health)).unwrap();
    assert_eq!(live_health, recorded_health);
    drop(leader);
    std::fs::remove_dir_all(&dir).unwrap();
}
