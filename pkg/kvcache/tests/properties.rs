//! Property: every backend the validator admits renders without error, and deterministically.
//! Also: the validator itself is deterministic and total (never panics) on generated backends,
//! and an update that changes nothing in `spec` is always admitted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use warmcache_kvcache::{RenderContext, ValidationContext, from_value, render, validate};

fn pick<T: Clone + std::fmt::Debug + 'static>(items: &'static [T]) -> impl Strategy<Value = T> {
    prop::sample::select(items)
}

/// Mostly a value from `good`, sometimes one from `bad`, so that a fair share of the generated
/// backends is admitted while every rule still gets exercised.
fn mostly<T: Clone + std::fmt::Debug + 'static>(
    good: &'static [T],
    bad: &'static [T],
) -> impl Strategy<Value = T> {
    prop_oneof![12 => pick(good), 1 => pick(bad)]
}

const QUANTITIES: &[&str] = &[
    "16Mi", "16384Ki", "4Gi", "500Gi", "4Ti", "1.5Gi", "1e9", "17000000",
];
const BAD_QUANTITIES: &[&str] = &[
    "0", "1", "8Mi", "16777215", "100m", "-1Gi", "7Ei", "10E", "lots",
];
const PATHS: &[&str] = &[
    "/var/lib/kvcache",
    "/mnt/..data/kv",
    "/dev/infiniband-cache",
    "/mnt/it's here",
    "/mnt/a b",
];
const BAD_PATHS: &[&str] = &[
    "/dev/infiniband",
    "/",
    "//",
    "var/lib/kv",
    "/var/../kv",
    " /x",
    "   ",
    "",
];
const ARGS: &[&str] = &[
    "-client_ttl=30",
    "-default_kv_lease_ttl=10m",
    "--metrics_host=0.0.0.0",
    "-device_name=mlx5_0",
];
const BAD_ARGS: &[&str] = &[
    "-enable_offload=false",
    "-offload_on_evict=true",
    "nodash",
    "-",
    "-ssd_offload_path=/x",
    "-enable_oplog",
    "-a b",
];
const ENV_NAMES: &[&str] = &["GLOG_v", "MOONCAKE_USE_URING"];
const BAD_ENV_NAMES: &[&str] = &[
    "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT",
    "KUBERNETES_POD_IP",
    "1BAD",
    "NVIDIA_VISIBLE_DEVICES",
];
const PROTOCOLS: &[&str] = &["Auto", "TCP", "RDMA", "EFA", "CANN", "ROCM", "MUSA", "MACA"];
const NAMES: &[&str] = &["kvc", "a", "store-1"];
const BAD_NAMES: &[&str] = &["kvc.b", "Kvc", "kvc-", "0kvc"];
const IMAGES: &[&str] = &[
    "docker.io/kvcacheai/mooncake:0.3.13",
    "mooncake",
    "repo:latest",
];
const BAD_IMAGES: &[&str] = &["Bad/Image", "  "];

fn eviction() -> impl Strategy<Value = Option<Value>> {
    let watermark = prop::option::of(
        prop_oneof![8 => (51i32..=100, 1i32..=50), 1 => (0i32..=102, 0i32..=102)]
            .prop_map(|(h, l)| json!({"high": h, "low": l})),
    );
    prop::option::of(
        (
            prop::option::of(any::<bool>()),
            prop::option::of(pick(&["FIFO", "LRU"])),
            watermark,
        )
            .prop_map(|(enabled, policy, watermark)| {
                let mut e = Map::new();
                if let Some(enabled) = enabled {
                    e.insert("enabled".into(), json!(enabled));
                }
                if let Some(policy) = policy {
                    e.insert("policy".into(), json!(policy));
                }
                if let Some(w) = watermark {
                    e.insert("watermark".into(), w);
                }
                Value::Object(e)
            }),
    )
}

fn tier() -> impl Strategy<Value = Value> {
    (
        mostly(PATHS, BAD_PATHS),
        prop::option::of(mostly(QUANTITIES, BAD_QUANTITIES)),
        prop::option::of(mostly(&[0i64, 64, 10_000_000], &[1, 63, -1])),
        eviction(),
        any::<bool>(),
    )
        .prop_map(|(path, capacity, keys, eviction, clean)| {
            let mut t = Map::new();
            t.insert("path".into(), json!(path));
            if let Some(c) = capacity {
                t.insert("capacity".into(), json!(c));
            }
            if let Some(k) = keys {
                t.insert("keyLimit".into(), json!(k));
            }
            if let Some(e) = eviction {
                t.insert("eviction".into(), e);
            }
            t.insert("cleanAfterDelete".into(), json!(clean));
            Value::Object(t)
        })
}

fn group() -> impl Strategy<Value = Value> {
    (
        (
            pick(&["DRAM", "VRAM"]),
            mostly(QUANTITIES, BAD_QUANTITIES),
            prop::option::of(mostly(&["0", "1Gi", "64Mi"], BAD_QUANTITIES)),
            prop::option::of(tier()),
            prop::option::of(pick(PROTOCOLS)),
        ),
        (
            prop::collection::vec(mostly(ARGS, BAD_ARGS), 0..2),
            prop::collection::vec(mostly(ENV_NAMES, BAD_ENV_NAMES), 0..2),
            prop::option::of(mostly(IMAGES, BAD_IMAGES)),
            prop::option::of(prop::sample::select(
                &[
                    ("/opt/b", "/opt/b"),
                    ("/opt/b", "/var/lib/kvcache/sub"),
                    ("/dev", "/dev"),
                    ("/opt/c", "/opt/c/d"),
                ][..],
            )),
            mostly(&["true", "x", ""], &["a b"]),
        ),
    )
        .prop_map(|((medium, capacity, buffer, tier, protocol), (args, env, image, host, label))| {
            let mut g = Map::new();
            g.insert("nodeSelector".into(), json!({"kvcache": label}));
            g.insert("medium".into(), json!(medium));
            g.insert("capacityPerMember".into(), json!(capacity));
            if let Some(b) = buffer {
                g.insert("localBufferSize".into(), json!(b));
            }
            if let Some(t) = tier {
                g.insert("localDisks".into(), json!([t]));
            }
            if let Some(p) = protocol {
                g.insert("transport".into(), json!({"protocol": p}));
            }
            if !args.is_empty() {
                g.insert("extraArgs".into(), json!(args));
            }
            if !env.is_empty() {
                let entries: Vec<Value> = env.iter().map(|n| json!({"name": n, "value": "1"})).collect();
                g.insert("extraEnv".into(), json!(entries));
            }
            if let Some(i) = image {
                g.insert("image".into(), json!(i));
            }
            if let Some((path, mount)) = host {
                g.insert(
                    "hostPaths".into(),
                    json!([{"path": "/opt/a", "mountPath": "/opt/a"}, {"path": path, "mountPath": mount, "type": "Directory"}]),
                );
            }
            Value::Object(g)
        })
}

fn backend() -> impl Strategy<Value = Value> {
    (
        mostly(NAMES, BAD_NAMES),
        prop::option::of(mostly(IMAGES, BAD_IMAGES)),
        prop::collection::vec(group(), 1..4),
        (
            1i32..=6,
            any::<bool>(),
            prop::option::of(pick(&["Lease", "Service"])),
        ),
        prop::collection::vec(mostly(ARGS, BAD_ARGS), 0..2),
        prop::option::of(prop_oneof![8 => 0i32..=3600, 1 => -1i32..=3601]),
        prop::option::of(pick(PROTOCOLS)),
    )
        .prop_map(
            |(name, image, groups, (replicas, ha, addressing), args, grace, protocol)| {
                let mut leader = Map::new();
                leader.insert("replicas".into(), json!(replicas));
                if ha {
                    let mut h = Map::new();
                    if let Some(a) = addressing {
                        h.insert("memberAddressing".into(), json!(a));
                    }
                    leader.insert("highAvailability".into(), Value::Object(h));
                }
                if !args.is_empty() {
                    leader.insert("extraArgs".into(), json!(args));
                }
                let mut managed = Map::new();
                managed.insert("leader".into(), Value::Object(leader));
                managed.insert("members".into(), json!(groups));
                if let Some(g) = grace {
                    managed.insert("scaleIn".into(), json!({"gracePeriodSeconds": g}));
                }
                let mut spec = Map::new();
                if let Some(i) = image {
                    spec.insert("image".into(), json!(i));
                }
                spec.insert("connection".into(), json!({"managed": managed}));
                if let Some(p) = protocol {
                    spec.insert("transport".into(), json!({"protocol": p}));
                }
                json!({
                    "apiVersion": "worker.gpustack.ai/v1alpha1",
                    "kind": "KVCacheBackend",
                    "metadata": {"name": name, "uid": "0b9e8f4a-1111-2222-3333-444455556666"},
                    "spec": spec,
                })
            },
        )
}

fn contexts() -> impl Strategy<Value = Option<String>> {
    prop::option::of(pick(&["docker.io/kvcacheai/mooncake:0.3.13", ""]).prop_map(str::to_owned))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn admitted_backends_render_deterministically(value in backend(), default_image in contexts()) {
        let Ok(backend) = from_value(value) else { return Ok(()) };
        let vctx = ValidationContext { default_image: default_image.clone() };
        let errors = validate(&backend, None, &vctx);
        prop_assert_eq!(&errors, &validate(&backend, None, &vctx));
        // An update that changes nothing is admitted, whatever today's rules say.
        prop_assert!(validate(&backend, Some(&backend), &vctx).is_empty());
        if errors.is_empty() {
            let rctx = RenderContext { default_image, ..RenderContext::default() };
            let first = render(&backend, &rctx);
            prop_assert!(first.is_ok(), "admitted but not rendered: {:?}", first);
            let first = first.unwrap();
            let second = render(&backend, &rctx).unwrap();
            prop_assert_eq!(&first, &second);
            prop_assert_eq!(first.to_yaml_stream().unwrap(), second.to_yaml_stream().unwrap());
            let groups = backend.spec.connection.managed.as_ref().unwrap().members.len();
            prop_assert_eq!(first.members.len(), groups);
        }
    }
}

/// The property above means something only if the generator produces admitted backends often
/// enough.
#[test]
fn the_generator_produces_admitted_backends() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = backend();
    let ctx = ValidationContext {
        default_image: Some("docker.io/kvcacheai/mooncake:0.3.13".into()),
    };
    let mut admitted = 0;
    let mut tiered = 0;
    for _ in 0..2000 {
        let value = strategy.new_tree(&mut runner).unwrap().current();
        if let Ok(backend) = from_value(value)
            && validate(&backend, None, &ctx).is_empty()
        {
            admitted += 1;
            let managed = backend.spec.connection.managed.as_ref().unwrap();
            if managed.members.iter().any(|g| g.local_disk().is_some()) {
                tiered += 1;
            }
        }
    }
    eprintln!("{admitted} of 2000 generated backends admitted, {tiered} of them with a tier");
    assert!(
        admitted >= 150,
        "only {admitted} of 2000 generated backends were admitted"
    );
    assert!(tiered >= 50, "only {tiered} admitted backends had a tier");
}
