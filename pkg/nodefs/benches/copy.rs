//! `copy_tree` (copy with one SHA-256 pass over the source bytes, fsync, publish, manifest,
//! verification that reads every published file back and compares it byte for byte with its
//! source read again, marker) against `cp -a` of the same tree, and against `cp -a` followed by
//! `sync` (the same durability).
//!
//! The tree is a Hugging Face cache of an 8B model as `hf download` leaves it: four
//! safetensors-like shards of random bytes (`NODEFS_BENCH_BYTES` in total, default 2 GiB), a
//! tokenizer.json of a few MB, config.json, generation_config.json, the weight index, blobs
//! linked from `snapshots/<rev>/`, `refs/main`. Built once under `NODEFS_BENCH_DIR` (default
//! `$TMPDIR`, else /tmp); every copy goes to the same filesystem.
//!
//! Page cache: the source (a few GiB) stays in the page cache after the warm-up, so every run
//! reads it from memory; the numbers compare CPU and the write path, not source disk reads.
//! Writes land in the page cache too: `cp -a` returns before they reach the disk, `copy_tree`
//! fsyncs every file, so `cp -a && sync` is the fair floor for durability. After every run the
//! copy is removed and `sync` waits for the disk to settle (not timed), so one run's writeback
//! does not slow the next. Runs alternate (cp, cp + sync, copy_tree) three times after one
//! warm-up of each; medians are printed.
//!
//! `cargo bench -p warmcache-nodefs --bench copy` (or `NODEFS_BENCH_BYTES=268435456 ...` for a
//! quick run).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

const REV: &str = "0e9e39f249a16976918f6564b8830bc894c89659";
const ROUNDS: usize = 3;

fn main() {
    let base = std::env::var_os("NODEFS_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let total: u64 = std::env::var("NODEFS_BENCH_BYTES")
        .ok()
        .map(|v| v.parse().expect("NODEFS_BENCH_BYTES: a byte count"))
        .unwrap_or(2 << 30);
    let work = tempfile::Builder::new()
        .prefix("nodefs-bench-")
        .tempdir_in(&base)
        .unwrap();
    let src = work.path().join("hub");
    let t = Instant::now();
    let bytes = build_tree(&src, total);
    sync();
    println!(
        "tree: {} in {} files under {} (built in {:.1} s)",
        human(bytes),
        count_files(&src),
        src.display(),
        t.elapsed().as_secs_f64()
    );

    // The floor of the hashing: one SHA-256 pass over every byte, on one thread (`copy_tree`
    // makes exactly one, spread over the cores).
    let t = Instant::now();
    hash_tree(&src);
    let hash_once = t.elapsed();

    let mut cp = Vec::new();
    let mut cp_sync = Vec::new();
    let mut ours = Vec::new();
    for round in 0..=ROUNDS {
        let d = work.path().join(format!("cp-{round}"));
        let a = time(|| run_cp(&src, &d));
        drop_tree(&d);
        let d = work.path().join(format!("cps-{round}"));
        let b = time(|| {
            run_cp(&src, &d);
            sync();
        });
        drop_tree(&d);
        let d = work.path().join(format!("ours-{round}"));
        fs::create_dir(&d).unwrap();
        let mut report = None;
        let c = time(|| {
            report = Some(warmcache_nodefs::copy_tree(&src, &d, &format!("bench-{round}")).unwrap())
        });
        let report = report.unwrap();
        assert_eq!(
            warmcache_nodefs::is_complete(&d).unwrap(),
            Some(report.bytes)
        );
        drop_tree(&d);
        if round == 0 {
            println!(
                "warm-up: cp -a {:.2} s, cp -a + sync {:.2} s, copy_tree {:.2} s",
                a.as_secs_f64(),
                b.as_secs_f64(),
                c.as_secs_f64()
            );
            continue;
        }
        println!(
            "round {round}: cp -a {:.2} s, cp -a + sync {:.2} s, copy_tree {:.2} s ({} files, {} links)",
            a.as_secs_f64(),
            b.as_secs_f64(),
            c.as_secs_f64(),
            report.files,
            report.symlinks
        );
        cp.push(a);
        cp_sync.push(b);
        ours.push(c);
    }
    let (cp, cp_sync, ours) = (median(cp), median(cp_sync), median(ours));
    let gib = bytes as f64 / f64::from(1u32 << 30);
    println!();
    println!("median of {ROUNDS}, {}:", human(bytes));
    println!(
        "  one SHA-256 pass, one thread  {:>6.2} s",
        hash_once.as_secs_f64()
    );
    println!(
        "  cp -a                         {:>6.2} s  ({:.2} GiB/s)",
        cp.as_secs_f64(),
        gib / cp.as_secs_f64()
    );
    println!(
        "  cp -a && sync                 {:>6.2} s",
        cp_sync.as_secs_f64()
    );
    println!(
        "  copy_tree                     {:>6.2} s  ({:.2} GiB/s)",
        ours.as_secs_f64(),
        gib / ours.as_secs_f64()
    );
    println!(
        "  copy_tree / cp -a             {:>6.2}x  (target: at most 1.2x)",
        ours.as_secs_f64() / cp.as_secs_f64()
    );
    println!(
        "  copy_tree / (cp -a && sync)   {:>6.2}x",
        ours.as_secs_f64() / cp_sync.as_secs_f64()
    );
}

/// Builds the cache; returns the bytes of regular files.
fn build_tree(hub: &Path, total: u64) -> u64 {
    let repo = hub.join("models--meta-llama--Llama-3.1-8B-Instruct");
    let blobs = repo.join("blobs");
    let snap = repo.join("snapshots").join(REV);
    fs::create_dir_all(&blobs).unwrap();
    fs::create_dir_all(&snap).unwrap();
    fs::create_dir_all(repo.join("refs")).unwrap();
    fs::write(repo.join("refs/main"), REV).unwrap();
    let mut rng = fastrand::Rng::with_seed(42);
    let tokenizer_len = (9 << 20).min(total / 100);
    let shard_len = (total.saturating_sub(tokenizer_len + (64 << 10))) / 4;
    let mut written = 0u64;
    let mut add = |name: &str, len: u64, text: bool, rng: &mut fastrand::Rng| {
        let blob = hex::encode(rng.u64(..).to_le_bytes()).repeat(8);
        let mut f = fs::File::create(blobs.join(&blob)).unwrap();
        let mut buf = vec![0u8; 8 << 20];
        let mut left = len;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            if text {
                for b in &mut buf[..n] {
                    *b = b"abcdefghij {}\":,0123456789\n"[rng.usize(..27)];
                }
            } else {
                rng.fill(&mut buf[..n]);
            }
            f.write_all(&buf[..n]).unwrap();
            left -= n as u64;
        }
        symlink(format!("../../blobs/{blob}"), snap.join(name)).unwrap();
        written += len;
    };
    for i in 1..=4 {
        add(
            &format!("model-0000{i}-of-00004.safetensors"),
            shard_len,
            false,
            &mut rng,
        );
    }
    add("tokenizer.json", tokenizer_len, true, &mut rng);
    add("tokenizer_config.json", 50_000, true, &mut rng);
    add("model.safetensors.index.json", 23_950, true, &mut rng);
    add("config.json", 855, true, &mut rng);
    add("generation_config.json", 184, true, &mut rng);
    add("special_tokens_map.json", 296, true, &mut rng);
    written
}

fn run_cp(src: &Path, dst: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(src)
        .arg(dst)
        .status()
        .unwrap();
    assert!(status.success(), "cp -a failed");
}

fn sync() {
    rustix::fs::sync();
}

fn drop_tree(path: &Path) {
    fs::remove_dir_all(path).unwrap();
    sync();
}

fn time(f: impl FnOnce()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn hash_tree(dir: &Path) {
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = fs::symlink_metadata(e.path()).unwrap();
        if m.is_dir() {
            hash_tree(&e.path());
        } else if m.is_file() {
            let mut h = Sha256::new();
            let mut f = fs::File::open(e.path()).unwrap();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = f.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
            std::hint::black_box(h.finalize());
        }
    }
}

fn count_files(dir: &Path) -> usize {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                count_files(&e.path())
            } else {
                usize::from(m.is_file())
            }
        })
        .sum()
}

fn human(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / f64::from(1u32 << 30))
}
