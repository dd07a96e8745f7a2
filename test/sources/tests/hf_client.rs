//! The real `hf` CLI (PyPI huggingface_hub, pinned by hack/model-clients.sh) downloads from the
//! simulated Hub: every byte arrives as the simulation generated it, the hub layout and the flat
//! `--local-dir` layout are the client's own, tags resolve (and move), gated repositories need
//! the token, the byte count is exact, and the rate limit paces downloads.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use warmcache_test_sources::hub::{FileSpec, Hub, HubOptions, model_files};

/// The directory holding `hf`: `WARMCACHE_MODEL_CLIENTS`, else what hack/model-clients.sh
/// installs (cached).
fn clients() -> PathBuf {
    if let Some(dir) = std::env::var_os("WARMCACHE_MODEL_CLIENTS") {
        return PathBuf::from(dir);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hack/model-clients.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .output()
        .expect("run hack/model-clients.sh");
    assert!(
        out.status.success(),
        "hack/model-clients.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    PathBuf::from(stdout.lines().last().expect("a path").trim())
}

struct Served {
    hub: Hub,
    endpoint: String,
}

async fn serve(options: HubOptions) -> Served {
    let hub = Hub::new(options);
    let endpoint = format!("http://{}", hub.serve_loopback().await.unwrap());
    Served { hub, endpoint }
}

/// The path `hf download` prints on its last line (`path: <dir>` since huggingface_hub 2).
fn printed_path(stdout: &str) -> String {
    let last = stdout.lines().last().unwrap_or_default().trim();
    last.strip_prefix("path:").unwrap_or(last).trim().to_owned()
}

/// `hf <args>` against `endpoint`, with a home of its own (no token but `token`).
async fn hf(endpoint: &str, home: &Path, token: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(clients().join("hf"));
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("HF_HOME", home.join("hf-home"))
        .env("HF_ENDPOINT", endpoint)
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        .env("NO_COLOR", "1");
    if let Some(token) = token {
        cmd.env("HF_TOKEN", token);
    }
    tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("hf finishes within 2 minutes")
        .expect("hf runs")
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: hf exited {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    printed_path(&String::from_utf8_lossy(&out.stdout))
}

fn total(files: &[FileSpec]) -> u64 {
    files.iter().map(|f| f.content.len()).sum()
}

/// Every file of `files` is under `dir` with exactly the simulation's bytes.
fn assert_tree(dir: &Path, files: &[FileSpec]) {
    for f in files {
        let got = std::fs::read(dir.join(&f.path))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.join(&f.path).display()));
        assert!(got == f.content.to_vec(), "{} differs", f.path);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hf_download_fetches_each_byte_once_in_the_hub_layout() {
    let s = serve(HubOptions::default()).await;
    let files = model_files("org/llm", "1", 3 << 20, 3);
    let commit = s.hub.publish("org/llm", files.clone()).unwrap();
    let home = tempfile::tempdir().unwrap();
    let cache = home.path().join("cache");
    let cache_arg = cache.to_str().unwrap();

    let out = hf(
        &s.endpoint,
        home.path(),
        None,
        &["download", "org/llm", "--cache-dir", cache_arg],
    )
    .await;
    let snapshot = PathBuf::from(ok(&out, "first download"));
    assert_eq!(
        snapshot,
        cache.join("models--org--llm/snapshots").join(&commit),
        "the client prints its snapshot directory"
    );
    assert_tree(&snapshot, &files);
    assert_eq!(
        std::fs::read_to_string(cache.join("models--org--llm/refs/main")).unwrap(),
        commit
    );
    let served = s.hub.stats();
    assert_eq!(served.bytes_served, total(&files));
    assert_eq!(served.bytes_by_repo.get("org/llm"), Some(&total(&files)));

    // The client's cache answers the second download; the Hub sends no file body again.
    let out = hf(
        &s.endpoint,
        home.path(),
        None,
        &["download", "org/llm", "--cache-dir", cache_arg],
    )
    .await;
    ok(&out, "second download");
    assert_eq!(s.hub.stats().bytes_served, total(&files));

    // A flat --local-dir download (what many charts do) is a second full fetch.
    let flat = home.path().join("flat");
    let out = hf(
        &s.endpoint,
        home.path(),
        None,
        &["download", "org/llm", "--local-dir", flat.to_str().unwrap()],
    )
    .await;
    ok(&out, "local-dir download");
    assert_tree(&flat, &files);
    assert_eq!(s.hub.stats().bytes_served, 2 * total(&files));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tag_resolves_to_its_commit_until_it_is_moved() {
    let s = serve(HubOptions::default()).await;
    let v1 = model_files("org/tagged", "1", 1 << 20, 2);
    let first = s.hub.publish("org/tagged", v1.clone()).unwrap();
    s.hub.set_ref("org/tagged", "v1.0", &first).unwrap();
    let v2 = model_files("org/tagged", "2", 1 << 20, 2);
    let second = s.hub.publish("org/tagged", v2.clone()).unwrap();
    let home = tempfile::tempdir().unwrap();
    let cache = home.path().join("cache");
    let args = |rev: &'static str| {
        [
            "download".to_owned(),
            "org/tagged".to_owned(),
            "--revision".to_owned(),
            rev.to_owned(),
            "--cache-dir".to_owned(),
            cache.to_str().unwrap().to_owned(),
        ]
    };
    let run = |rev: &'static str| {
        let args = args(rev);
        let endpoint = s.endpoint.clone();
        let home = home.path().to_owned();
        async move {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            hf(&endpoint, &home, None, &a).await
        }
    };

    let snapshot = PathBuf::from(ok(&run("v1.0").await, "tag v1.0"));
    assert!(snapshot.ends_with(&first), "{}", snapshot.display());
    assert_tree(&snapshot, &v1);
    let main = PathBuf::from(ok(&run("main").await, "main"));
    assert!(main.ends_with(&second));
    assert_tree(&main, &v2);
    // The client keeps blobs by ETag: files the two commits share are not fetched again.
    let new_in_v2: u64 = v2
        .iter()
        .filter(|f| {
            !v1.iter()
                .any(|o| o.path == f.path && o.content == f.content)
        })
        .map(|f| f.content.len())
        .sum();
    assert!(new_in_v2 < total(&v2), "the commits share small files");
    assert_eq!(s.hub.stats().bytes_served, total(&v1) + new_in_v2);

    // The tag moves to the second commit: the client follows it, and finds those bytes cached.
    s.hub.set_ref("org/tagged", "v1.0", &second).unwrap();
    let moved = PathBuf::from(ok(&run("v1.0").await, "moved tag"));
    assert!(moved.ends_with(&second));
    assert_eq!(
        std::fs::read_to_string(cache.join("models--org--tagged/refs/v1.0")).unwrap(),
        second
    );
    assert_eq!(s.hub.stats().bytes_served, total(&v1) + new_in_v2);

    // An unknown revision is the client's RevisionNotFound, not a partial download.
    let out = run("no-such-tag").await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no-such-tag") || stderr.contains("Revision"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_repository_needs_the_token() {
    let s = serve(HubOptions::default()).await;
    let files = model_files("org/gated", "1", 64 << 10, 1);
    s.hub.publish("org/gated", files.clone()).unwrap();
    s.hub.gate("org/gated", "hf_secret").unwrap();
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("m");
    let args = [
        "download",
        "org/gated",
        "--local-dir",
        dir.to_str().unwrap(),
    ];

    let out = hf(&s.endpoint, home.path(), None, &args).await;
    assert!(!out.status.success(), "a gated repo without a token");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("restricted") || stderr.contains("gated") || stderr.contains("Gated"),
        "{stderr}"
    );
    let out = hf(&s.endpoint, home.path(), Some("hf_wrong"), &args).await;
    assert!(!out.status.success(), "a wrong token");
    assert_eq!(s.hub.stats().bytes_served, 0);

    ok(
        &hf(&s.endpoint, home.path(), Some("hf_secret"), &args).await,
        "with the token",
    );
    assert_tree(&dir, &files);
    assert_eq!(s.hub.stats().bytes_served, total(&files));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_paces_every_download() {
    // 1 MiB/s shared: 1.5 MiB of files cannot arrive in under about 1.5 s (a lower bound the
    // limiter guarantees, whatever the machine's speed).
    let s = serve(HubOptions {
        rate_limit: Some(1 << 20),
    })
    .await;
    let files = model_files("org/slow", "1", (3 << 20) / 2 - 300 * 1024, 2);
    s.hub.publish("org/slow", files.clone()).unwrap();
    let bytes = total(&files);
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("m");
    let started = Instant::now();
    ok(
        &hf(
            &s.endpoint,
            home.path(),
            None,
            &["download", "org/slow", "--local-dir", dir.to_str().unwrap()],
        )
        .await,
        "rate-limited download",
    );
    let elapsed = started.elapsed();
    let floor = Duration::from_secs_f64(bytes as f64 / f64::from(1u32 << 20));
    assert!(
        elapsed >= floor.mul_f64(0.95),
        "{bytes} bytes at 1 MiB/s took only {elapsed:?}"
    );
    assert_tree(&dir, &files);
}
