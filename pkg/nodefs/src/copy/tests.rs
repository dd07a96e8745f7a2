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
