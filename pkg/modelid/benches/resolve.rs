//! Resolution cost against a plain `serde_json` parse of the same pod (the webhook parses every
//! pod anyway; resolving should cost a small fraction of that). Two pods: a realistic vLLM pod
//! (shell-wrapped engine, env expansion) and a large NIM pod (NGC download init with a script,
//! sidecars, ~70 env vars). After the criterion groups, the ratio resolve/parse is measured in the
//! same run and printed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::hint::black_box;
use std::time::Duration;

use criterion::Criterion;
use k8s_openapi::api::core::v1::Pod;
use warmcache_modelid::{Outcome, resolve};

#[path = "../../../hack/bench/per_call.rs"]
mod per_call;
use per_call::per_call;

const PODS: [(&str, &str); 2] = [
    ("vllm", include_str!("data/vllm-pod.json")),
    ("nim_large", include_str!("data/nim-large-pod.json")),
];

fn benches(c: &mut Criterion) {
    for (name, json) in PODS {
        let pod: Pod = serde_json::from_str(json).unwrap();
        assert!(
            matches!(resolve(&pod), Outcome::Resolved(_)),
            "{name} must resolve"
        );
        let mut g = c.benchmark_group(name);
        g.bench_function("serde_json_parse", |b| {
            b.iter(|| serde_json::from_str::<Pod>(black_box(json)).unwrap())
        });
        g.bench_function("resolve", |b| b.iter(|| resolve(black_box(&pod))));
        g.finish();
    }
}

fn print_ratios() {
    println!("\nresolve / serde_json parse of the same pod (same run, median of 7 batches):");
    for (name, json) in PODS {
        let pod: Pod = serde_json::from_str(json).unwrap();
        let parse = per_call(Duration::from_millis(300), || {
            black_box(serde_json::from_str::<Pod>(black_box(json)).unwrap());
        });
        let res = per_call(Duration::from_millis(300), || {
            black_box(resolve(black_box(&pod)));
        });
        println!(
            "  {name:<10} parse {:>9.1?}  resolve {:>9.1?}  ratio {:.3} ({:.1}% of the parse)",
            parse,
            res,
            res.as_secs_f64() / parse.as_secs_f64(),
            100.0 * res.as_secs_f64() / parse.as_secs_f64()
        );
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    c.final_summary();
    print_ratios();
}
