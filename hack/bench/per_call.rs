//! The baseline timer shared by the benchmarks that print ratios (`pkg/*/benches`), included
//! with `#[path]` so the pure crates need no helper crate: both sides of a ratio are measured
//! the same way, in the same run.

use std::time::{Duration, Instant};

/// Median time per call of `f` over several batches of about `budget` each.
pub fn per_call(budget: Duration, mut f: impl FnMut()) -> Duration {
    let mut n: u32 = 1;
    loop {
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        if t.elapsed() >= budget / 10 || n >= 1 << 20 {
            break;
        }
        n *= 2;
    }
    let mut samples: Vec<Duration> = (0..7)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                f();
            }
            t.elapsed() / n
        })
        .collect();
    samples.sort();
    samples[samples.len() / 2]
}
