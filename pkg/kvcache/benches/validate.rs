//! Validation cost of the worst backend the CRD admits against a small typical one (V2), on
//! create and on an update that moves every group's guarded values, so every rule runs. The worst
//! backend has every bounded list at its CRD maximum (32 member groups, 32 hostPaths each, 32
//! imagePullSecrets, the tier path at 4096 bytes, host and mount paths at 1024, quantities at
//! 64, images at their longest valid form); the unbounded lists (extraArgs, extraEnv,
//! nodeSelector) get 64 entries each. After the criterion groups, the ratios worst/typical are
//! measured in the same run and printed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::hint::black_box;
use std::time::Duration;

use criterion::Criterion;
use serde_json::{Value, json};
use warmcache_api_kvcache::v1alpha1::KVCacheBackend;
use warmcache_kvcache::vectors::{self, members};
use warmcache_kvcache::{ValidationContext, from_value, validate};

#[path = "../../../hack/bench/per_call.rs"]
mod per_call;
use per_call::per_call;

/// A path of `len` bytes: `/<prefix>/aaaa...`.
fn long_path(prefix: &str, len: usize) -> String {
    let head = format!("/{prefix}/");
    format!("{head}{}", "a".repeat(len - head.len()))
}

/// A DNS subdomain of 253 bytes starting with `prefix`: labels of at most 63 joined by dots.
fn subdomain(prefix: &str) -> String {
    let mut name = format!("{prefix}{}", "a".repeat(62 - prefix.len()));
    while name.len() < 253 {
        let room = (253 - name.len() - 1).min(63);
        name.push('.');
        name.push_str(&"b".repeat(room));
    }
    name
}

/// A quantity of exactly 64 bytes worth `value` (leading zeros).
fn long_quantity(value: &str) -> String {
    format!("{}{value}", "0".repeat(64 - value.len()))
}

/// The longest image both grammars take: a 255-byte name, a 128-byte tag and a digest.
fn long_image(seed: char) -> String {
    let name = format!(
        "registry.example:5000/{}",
        seed.to_string().repeat(255 - 22)
    );
    format!("{name}:{}@sha256:{}", "t".repeat(128), "a".repeat(64))
}

fn worst(capacity: &str) -> Value {
    let group = |i: usize| {
        let host_paths: Vec<Value> = (0..32)
            .map(|j| {
                json!({
                    "path": long_path(&format!("h{i}-{j}"), 1024),
                    "mountPath": long_path(&format!("m{j}"), 1024),
                    "type": "Directory",
                })
            })
            .collect();
        let node_selector: serde_json::Map<String, Value> = (0..64)
            .map(|k| (format!("example.com/key-{k}"), json!(format!("value-{k}"))))
            .collect();
        let extra_args: Vec<Value> = (0..64).map(|k| json!(format!("-setting_{k}=x"))).collect();
        let extra_env: Vec<Value> = (0..64)
            .map(|k| json!({"name": format!("MY_VAR.{k}-x"), "value": "v"}))
            .collect();
        let mut g = json!({
            "nodeSelector": node_selector,
            "medium": "DRAM",
            "capacityPerMember": long_quantity(capacity),
            "localBufferSize": long_quantity("1Gi"),
            "image": long_image('b'),
            "extraArgs": extra_args,
            "extraEnv": extra_env,
            "hostPaths": host_paths,
            "runtimeClassName": subdomain("r"),
        });
        if i == 31 {
            g["localDisks"] = json!([{
                "path": long_path("tier", 4096),
                "capacity": long_quantity("4Ti"),
                "keyLimit": 10_000_000,
                "eviction": {"enabled": true, "policy": "LRU", "watermark": {"high": 90, "low": 80}},
            }]);
        }
        g
    };
    let mut value = vectors::backend((0..32).map(group).collect());
    value["spec"]["image"] = json!(long_image('c'));
    value["spec"]["imagePullSecrets"] = json!(
        (0..32)
            .map(|k| json!({"name": subdomain(&format!("s{k}"))}))
            .collect::<Vec<_>>()
    );
    value["spec"]["connection"]["managed"]["leader"]["extraArgs"] =
        json!((0..64).map(|k| format!("-flag_{k}=x")).collect::<Vec<_>>());
    value
}

fn typed(value: Value) -> KVCacheBackend {
    from_value(value).unwrap()
}

struct Case {
    name: &'static str,
    new: KVCacheBackend,
    old: Option<KVCacheBackend>,
}

fn cases() -> Vec<Case> {
    let ctx = ValidationContext::default();
    let typical = typed(vectors::v2());
    let typical_update = typed(vectors::with(vectors::v2(), |o| {
        members(o)[0]["capacityPerMember"] = json!("600Gi");
    }));
    let worst_old = typed(worst("500Gi"));
    let worst_new = typed(worst("600Gi"));
    let cases = vec![
        Case {
            name: "typical_create",
            new: typical.clone(),
            old: None,
        },
        Case {
            name: "typical_update",
            new: typical_update,
            old: Some(typical),
        },
        Case {
            name: "worst_create",
            new: worst_old.clone(),
            old: None,
        },
        Case {
            name: "worst_update",
            new: worst_new,
            old: Some(worst_old),
        },
    ];
    for case in &cases {
        let errors = validate(&case.new, case.old.as_ref(), &ctx);
        assert!(
            errors.is_empty(),
            "{} must be admitted: {} refusals, the first {:?}",
            case.name,
            errors.len(),
            errors.first()
        );
    }
    cases
}

fn benches(c: &mut Criterion, cases: &[Case]) {
    let ctx = ValidationContext::default();
    let mut g = c.benchmark_group("validate");
    for case in cases {
        g.bench_function(case.name, |b| {
            b.iter(|| validate(black_box(&case.new), black_box(case.old.as_ref()), &ctx))
        });
    }
    g.finish();
}

fn print_ratios(cases: &[Case]) {
    let ctx = ValidationContext::default();
    let time = |case: &Case| {
        per_call(Duration::from_millis(300), || {
            black_box(validate(black_box(&case.new), case.old.as_ref(), &ctx));
        })
    };
    let times: Vec<Duration> = cases.iter().map(time).collect();
    println!("\nworst admitted backend / typical backend (V2), same run, median of 7 batches:");
    for (kind, typical, worst) in [
        ("create", times[0], times[2]),
        ("update", times[1], times[3]),
    ] {
        println!(
            "  {kind:<6} typical {typical:>9.1?}  worst {worst:>9.1?}  ratio {:.1}",
            worst.as_secs_f64() / typical.as_secs_f64()
        );
    }
}

fn main() {
    let cases = cases();
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c, &cases);
    c.final_summary();
    print_ratios(&cases);
}
