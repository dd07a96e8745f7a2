//! Crashes between (and inside) the copier's steps, and the retry that follows: the steps are
//! run one by one and the attempt is dropped where a crash would stop it (no clean-up runs).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../tests/common/mod.rs"]
mod common;

use std::fs;
use std::path::{Path, PathBuf};

use super::*;
use common::{hf_tree, names, sha256sum_check, tree, write};

const OURS: [&str; 2] = [MARKER, MANIFEST];

/// Where the attempt stops.
#[derive(Debug, Clone, Copy)]
enum Crash {
    /// After the marker's removal and the staging directory's creation.
    Begun,
    /// The staging directory is complete, nothing published.
    Copied,
    /// Publishing removed the root's old entries, renamed none.
    Cleared,
    /// Publishing renamed some of the entries.
    HalfRenamed,
    /// Published, no manifest.
    Published,
    /// Manifest written, no marker.
    ManifestWritten,
    /// Verified, no marker.
    Verified,
}

const CRASHES: [Crash; 7] = [
    Crash::Begun,
    Crash::Copied,
    Crash::Cleared,
    Crash::HalfRenamed,
    Crash::Published,
    Crash::ManifestWritten,
    Crash::Verified,
];

/// Runs attempt `name` of `src` into `dst` up to `crash`, the way `copy_tree` runs it.
fn crash_at(src: &Path, dst: &Path, name: &str, crash: Crash) {
    let mut a = Attempt::begin(src, dst, name, None).unwrap();
    if matches!(crash, Crash::Begun) {
        return;
    }
    a.copy().unwrap();
    match crash {
        Crash::Begun => unreachable!(),
        Crash::Copied => {}
        Crash::Cleared | Crash::HalfRenamed => {
            // The first half of `publish`, by hand.
            for n in names(dst) {
                if n != format!("{STAGING_PREFIX}{name}") {
                    let p = dst.join(&n);
                    if p.is_dir() && !p.is_symlink() {
                        fs::remove_dir_all(&p).unwrap();
                    } else {
                        fs::remove_file(&p).unwrap();
                    }
                }
            }
            if matches!(crash, Crash::HalfRenamed) {
                let staging = dst.join(format!("{STAGING_PREFIX}{name}"));
                let entries = names(&staging);
                assert!(entries.len() >= 2);
                for n in &entries[..entries.len() / 2] {
                    fs::rename(staging.join(n), dst.join(n)).unwrap();
                }
            }
        }
        Crash::Published | Crash::ManifestWritten | Crash::Verified => {
            a.publish().unwrap();
            if !matches!(crash, Crash::Published) {
                a.write_manifest().unwrap();
            }
            if matches!(crash, Crash::Verified) {
                a.verify().unwrap();
            }
        }
    }
}

struct Case {
    _tmp: tempfile::TempDir,
    old: PathBuf,
    new: PathBuf,
    dst: PathBuf,
}

/// A volume holding a complete copy of one tree, and a second, different tree to copy over it.
fn case() -> Case {
    let tmp = tempfile::tempdir().unwrap();
    let old = tmp.path().join("old");
    let new = tmp.path().join("new");
    let dst = tmp.path().join("vol");
    hf_tree(&old);
    write(&old.join("only-in-old/file"), b"old");
    write(&old.join("zz-old-top"), b"old");
    hf_tree(&new);
    write(&new.join("only-in-new"), b"new");
    write(&new.join("version.txt"), b"2");
    fs::create_dir(&dst).unwrap();
    copy_tree(&old, &dst, "first").unwrap();
    Case {
        _tmp: tmp,
        old,
        new,
        dst,
    }
}

fn assert_complete_copy_of(src: &Path, dst: &Path) {
    assert_eq!(tree(dst, &OURS, false), tree(src, &[], true));
    let mut want = names(src);
    want.extend(OURS.map(String::from));
    want.sort();
    assert_eq!(names(dst), want, "no leftovers at the root");
    let report = verify_manifest(dst).unwrap();
    assert_eq!(
        report.files,
        tree(src, &[], true)
            .values()
            .filter(|n| matches!(n, common::Node::File { .. }))
            .count() as u64
    );
    assert!(is_complete(dst).unwrap().is_some());
    sha256sum_check(dst);
}

#[test]
fn a_crash_at_any_step_leaves_no_marker_and_the_retry_converges() {
    for crash in CRASHES {
        for retry in ["second", "third"] {
            let c = case();
            assert!(is_complete(&c.dst).unwrap().is_some());
            crash_at(&c.new, &c.dst, "second", crash);
            assert_eq!(
                is_complete(&c.dst).unwrap(),
                None,
                "{crash:?}: no marker after the crash"
            );
            // The retry (the same attempt name, or a new one) publishes only the complete tree.
            copy_tree(&c.new, &c.dst, retry).unwrap();
            assert_complete_copy_of(&c.new, &c.dst);
        }
    }
}

#[test]
fn the_marker_goes_first() {
    let c = case();
    let before = names(&c.dst);
    let a = Attempt::begin(&c.new, &c.dst, "second", None).unwrap();
    // Nothing else was touched: the old content is all there, the marker is not.
    let mut now = names(&c.dst);
    now.retain(|n| n != ".nvsnap-staging-second");
    let mut want = before.clone();
    want.retain(|n| n != MARKER);
    assert_eq!(now, want);
    assert_eq!(
        tree(&c.dst, &[MANIFEST, ".nvsnap-staging-second"], false),
        tree(&c.old, &[], true)
    );
    drop(a);
}

#[test]
fn a_partial_staging_directory_and_partial_content_are_replaced() {
    // As a crash in the middle of writing leaves them: a half-written staging directory of the
    // same attempt, another attempt's, temporary manifest and marker files, and published
    // content of a third tree without a marker.
    let c = case();
    fs::remove_file(c.dst.join(MARKER)).unwrap();
    write(
        &c.dst
            .join(".nvsnap-staging-second/models--acme--tiny-llm/blobs/partial"),
        b"half",
    );
    write(&c.dst.join(".nvsnap-staging-other/x"), b"x");
    write(
        &c.dst.join(".nvsnap-staging-second.manifest"),
        b"partial manifest",
    );
    write(&c.dst.join(".nvsnap-staging-second.complete"), b"1");
    write(&c.dst.join("stray"), b"from a crashed attempt");
    copy_tree(&c.new, &c.dst, "second").unwrap();
    assert_complete_copy_of(&c.new, &c.dst);
}

#[test]
fn a_source_failing_midway_leaves_no_marker_then_converges() {
    let c = case();
    // Sorted last, so most of the tree is copied before the failure.
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        c.new.join("zzz-fifo"),
        Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    assert!(matches!(
        copy_tree(&c.new, &c.dst, "second"),
        Err(Error::SpecialFile { .. })
    ));
    assert_eq!(is_complete(&c.dst).unwrap(), None);
    // The old content is still there (unpublished attempt), without its marker.
    assert_eq!(tree(&c.dst, &OURS, false), tree(&c.old, &[], true));
    fs::remove_file(c.new.join("zzz-fifo")).unwrap();
    copy_tree(&c.new, &c.dst, "second").unwrap();
    assert_complete_copy_of(&c.new, &c.dst);
}

#[test]
fn verify_catches_a_tree_changed_after_the_copy() {
    let c = case();
    let mut a = Attempt::begin(&c.new, &c.dst, "second", None).unwrap();
    a.copy().unwrap();
    a.publish().unwrap();
    a.write_manifest().unwrap();
    // Something changes the published tree before verification.
    fs::write(c.dst.join("version.txt"), b"3").unwrap();
    match a.verify().unwrap_err() {
        Error::Verify { path, .. } => assert_eq!(path, Path::new("version.txt")),
        other => panic!("{other}"),
    }
    fs::write(c.dst.join("version.txt"), b"2").unwrap();
    a.verify().unwrap();
    // A link retargeted, and a directory added, are caught too (they are not in the manifest).
    let link = c
        .dst
        .join("models--acme--tiny-llm/snapshots")
        .join(common::REV)
        .join("config.json");
    let target = fs::read_link(&link).unwrap();
    fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
    assert!(matches!(
        a.verify(),
        Err(Error::Verify {
            problem: Problem::LinkTarget,
            ..
        })
    ));
    fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(target, &link).unwrap();
    fs::create_dir(c.dst.join("new-dir")).unwrap();
    assert!(matches!(
        a.verify(),
        Err(Error::Verify {
            problem: Problem::Extra,
            ..
        })
    ));
    fs::remove_dir(c.dst.join("new-dir")).unwrap();
    // A manifest that differs from what was hashed while copying.
    fs::write(c.dst.join(MANIFEST), b"").unwrap();
    assert!(matches!(
        a.verify(),
        Err(Error::Verify {
            problem: Problem::ManifestDiffers,
            ..
        })
    ));
}

/// An attempt of `c.new` into `c.dst` stopped before verification: copied, published, the
/// manifest written.
fn unverified(c: &Case) -> Attempt<'_> {
    let mut a = Attempt::begin(&c.new, &c.dst, "second", None).unwrap();
    a.copy().unwrap();
    a.publish().unwrap();
    a.write_manifest().unwrap();
    a
}

/// The blob of the hf tree's second shard (1 MiB and 17 bytes, so more than one read chunk).
fn shard(root: &Path) -> PathBuf {
    root.join("models--acme--tiny-llm/blobs")
        .join(format!("b3{}", "0".repeat(62)))
}

const SHARD: &str =
    "models--acme--tiny-llm/blobs/b300000000000000000000000000000000000000000000000000000000000000";

fn verify_problem(a: &Attempt<'_>) -> (PathBuf, Problem) {
    match a.verify() {
        Err(Error::Verify { path, problem, .. }) => (path, problem),
        other => panic!("expected a verification error, got {other:?}"),
    }
}

/// A named change to a file.
type Change = (&'static str, fn(&Path));

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[test]
fn verify_compares_every_published_byte_with_the_source() {
    use std::os::unix::fs::FileExt;
    let original = fs::read(shard(&case().new)).unwrap();
    // The published copy changed after the copy: one byte in the last (short) chunk, one in the
    // middle, the file cut short, the file extended. Each is named with the digest it now has,
    // and no marker is written.
    let changes: [Change; 4] = [
        ("a byte near the end", |p| {
            let f = fs::OpenOptions::new().write(true).open(p).unwrap();
            f.write_all_at(b"\xff", 1_048_576 + 3).unwrap();
        }),
        ("a byte in the middle", |p| {
            let f = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .unwrap();
            let mut b = [0u8; 1];
            f.read_exact_at(&mut b, 300_000).unwrap();
            f.write_all_at(&[b[0] ^ 1], 300_000).unwrap();
        }),
        ("cut short", |p| {
            fs::OpenOptions::new()
                .write(true)
                .open(p)
                .unwrap()
                .set_len(1000)
                .unwrap();
        }),
        ("extended", |p| {
            fs::OpenOptions::new()
                .append(true)
                .open(p)
                .unwrap()
                .write_all(b"x")
                .unwrap();
        }),
    ];
    for (what, change) in changes {
        let c = case();
        let mut a = unverified(&c);
        change(&shard(&c.dst));
        let now = fs::read(shard(&c.dst)).unwrap();
        assert_ne!(now, original, "{what}");
        let (path, problem) = verify_problem(&a);
        assert_eq!(path, Path::new(SHARD), "{what}");
        assert_eq!(
            problem,
            Problem::Differs {
                expected: sha256_hex(&original),
                actual: sha256_hex(&now),
            },
            "{what}"
        );
        // The attempt stops there, as `run` stops it: no marker.
        a.wait_durable().unwrap();
        assert_eq!(is_complete(&c.dst).unwrap(), None, "{what}");
        // Put back, the same attempt verifies (the source did not change).
        fs::write(shard(&c.dst), &original).unwrap();
        a.verify().unwrap();
    }
}

#[test]
fn a_source_changed_after_the_copy_fails_verification() {
    use std::os::unix::fs::FileExt;
    // Each change to the source between the copy and the verification (the published copy is
    // untouched and still matches its manifest line): other bytes of the same size, the same
    // bytes written again (only the change time moves), cut short, extended, replaced by
    // another file with the same bytes (another inode), removed.
    let changes: [Change; 6] = [
        ("other bytes", |p| {
            let f = fs::OpenOptions::new().write(true).open(p).unwrap();
            f.write_all_at(b"\0\0\0\0", 4096).unwrap();
        }),
        ("the same bytes written again", |p| {
            let f = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .unwrap();
            let mut b = [0u8; 4];
            f.read_exact_at(&mut b, 4096).unwrap();
            // Past the clock tick of the copy's stat, on any timestamp granularity.
            std::thread::sleep(std::time::Duration::from_millis(20));
            f.write_all_at(&b, 4096).unwrap();
        }),
        ("cut short", |p| {
            fs::OpenOptions::new()
                .write(true)
                .open(p)
                .unwrap()
                .set_len(4096)
                .unwrap();
        }),
        ("extended", |p| {
            fs::OpenOptions::new()
                .append(true)
                .open(p)
                .unwrap()
                .write_all(b"x")
                .unwrap();
        }),
        ("replaced by a copy", |p| {
            let tmp = p.with_extension("tmp");
            fs::copy(p, &tmp).unwrap();
            fs::rename(&tmp, p).unwrap();
        }),
        ("removed", |p| fs::remove_file(p).unwrap()),
    ];
    for (what, change) in changes {
        let c = case();
        let mut a = unverified(&c);
        let published = fs::read(shard(&c.dst)).unwrap();
        change(&shard(&c.new));
        let (path, problem) = verify_problem(&a);
        assert_eq!(
            (path.as_path(), problem),
            (Path::new(SHARD), Problem::SourceChanged),
            "{what}"
        );
        assert_eq!(fs::read(shard(&c.dst)).unwrap(), published, "{what}");
        a.wait_durable().unwrap();
        assert_eq!(is_complete(&c.dst).unwrap(), None, "{what}");
    }
}

#[test]
fn a_source_swapped_for_a_symlink_fails_verification_without_following_it() {
    use rustix::fs::inotify;
    let c = case();
    let a = unverified(&c);
    // A file with the same bytes and another directory of the same content, watched: the link
    // must not even be opened through.
    let bait = c._tmp.path().join("bait");
    fs::create_dir(&bait).unwrap();
    fs::copy(shard(&c.new), bait.join("shard")).unwrap();
    let nested = c
        .new
        .join("models--acme--tiny-llm/snapshots")
        .join(common::REV);
    copy_dir(&nested.join("nested"), &bait.join("nested"));
    let watch =
        inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC).unwrap();
    let opened = inotify::WatchFlags::OPEN | inotify::WatchFlags::ACCESS;
    inotify::add_watch(&watch, bait.join("shard"), opened).unwrap();
    inotify::add_watch(&watch, bait.join("nested"), opened).unwrap();

    fs::remove_file(shard(&c.new)).unwrap();
    std::os::unix::fs::symlink(bait.join("shard"), shard(&c.new)).unwrap();
    let (path, problem) = verify_problem(&a);
    assert_eq!(
        (path.as_path(), problem),
        (Path::new(SHARD), Problem::SourceChanged)
    );

    // A source directory swapped for a link to a copy of itself: named, nothing followed.
    let c = case();
    let a = unverified(&c);
    let dir = c.new.join("models--acme--tiny-llm/blobs");
    copy_dir(&dir, &bait.join("blobs"));
    inotify::add_watch(&watch, bait.join("blobs"), opened).unwrap();
    fs::rename(&dir, c._tmp.path().join("blobs-away")).unwrap();
    std::os::unix::fs::symlink(bait.join("blobs"), &dir).unwrap();
    let (path, problem) = verify_problem(&a);
    assert_eq!(
        (path.as_path(), problem),
        (
            Path::new("models--acme--tiny-llm/blobs"),
            Problem::SourceChanged
        )
    );

    let mut buf = [std::mem::MaybeUninit::uninit(); 4096];
    match inotify::Reader::new(&watch, &mut buf).next() {
        Err(Errno::AGAIN) => {}
        other => panic!("a link target was opened or read: {other:?}"),
    }
}

#[test]
fn a_source_written_during_the_copy_is_never_published() {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    let c = case();
    // A writer rewriting a large file of the source again and again (as a live pod may) while
    // the copy runs: the copy must fail, whatever bytes it read.
    let big = c.new.join("big.bin");
    let a_bytes = common::bytes(7, 8 << 20);
    let b_bytes = common::bytes(8, 8 << 20);
    fs::write(&big, &a_bytes).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, started, big) = (stop.clone(), started.clone(), big.clone());
        std::thread::spawn(move || {
            use std::os::unix::fs::FileExt;
            let f = fs::OpenOptions::new().write(true).open(&big).unwrap();
            let mut flip = false;
            while !stop.load(Ordering::Relaxed) {
                let bytes = if flip { &a_bytes } else { &b_bytes };
                for (i, chunk) in bytes.chunks(64 << 10).enumerate() {
                    f.write_all_at(chunk, (i * (64 << 10)) as u64).unwrap();
                }
                flip = !flip;
                started.store(true, Ordering::Relaxed);
            }
        })
    };
    while !started.load(Ordering::Relaxed) {
        std::thread::yield_now();
    }
    let result = copy_tree(&c.new, &c.dst, "second");
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    match result {
        Err(Error::Verify {
            path,
            problem: Problem::SourceChanged,
            ..
        }) => assert_eq!(path, Path::new("big.bin")),
        other => panic!("expected the changed source to fail the copy, got {other:?}"),
    }
    assert_eq!(is_complete(&c.dst).unwrap(), None);
}

/// `cp -a`, for bait trees.
fn copy_dir(from: &Path, to: &Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn attempt_names() {
    for ok in ["a", "0", "attempt-1", "abc-123-def", &"z".repeat(40)] {
        assert!(valid_attempt(ok), "{ok}");
    }
    for bad in [
        "",
        "A",
        "a_b",
        "a.b",
        "a/b",
        " ",
        "a\n",
        &"z".repeat(41),
        "ä",
    ] {
        assert!(!valid_attempt(bad), "{bad:?}");
    }
    assert!(reserved(c".nvsnap-complete"));
    assert!(reserved(c".nvsnap-manifest"));
    assert!(reserved(c".nvsnap-staging-"));
    assert!(reserved(c".nvsnap-staging-x.manifest"));
    assert!(!reserved(c".nvsnap-completed"));
    assert!(!reserved(c".nvsnap-manifest2"));
    assert!(!reserved(c"nvsnap-staging-x"));
}
