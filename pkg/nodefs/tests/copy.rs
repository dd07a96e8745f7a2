//! The tree copier and measure on the real filesystem: a Hugging Face cache copied and compared,
//! `du -sb`, the symlink attack chain, links pointing outside, special files, hostile names,
//! corruption found by the manifest, reserved names, refusals, a selected copy (a compile-cache
//! set's) that leaves out what it must.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;
use std::time::{Duration, SystemTime};

use common::*;
use sha2::{Digest, Sha256};
use warmcache_nodefs::{
    Error, MANIFEST, MARKER, MAX_DEPTH, Problem, copy_tree, copy_tree_selected, is_complete,
    measure, measure_dir_selected, open_dir_beneath, verify_manifest,
};

const OURS: [&str; 2] = [MARKER, MANIFEST];

fn dirs() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let dst = tmp.path().join("vol");
    fs::create_dir(&src).unwrap();
    fs::create_dir(&dst).unwrap();
    (tmp, src, dst)
}

/// The published tree's `du -sb` without the marker and the manifest, as the copier measured it
/// (the marker removed first: on some filesystems a directory's size counts its entries).
fn published_du(dst: &Path) -> u64 {
    let marker = fs::read(dst.join(MARKER)).unwrap();
    fs::remove_file(dst.join(MARKER)).unwrap();
    let du = du_sb(dst) - fs::metadata(dst.join(MANIFEST)).unwrap().len();
    fs::write(dst.join(MARKER), marker).unwrap();
    du
}

#[test]
fn copies_a_hugging_face_cache() {
    let (_tmp, src, dst) = dirs();
    hf_tree(&src);
    if is_root() {
        // Ownership is kept: the agent runs as root and the download container as anyone.
        std::os::unix::fs::lchown(src.join("version.txt"), Some(1234), Some(5678)).unwrap();
        std::os::unix::fs::lchown(src.join("empty-dir"), Some(1001), Some(1002)).unwrap();
        std::os::unix::fs::lchown(
            src.join("models--acme--tiny-llm/snapshots")
                .join(REV)
                .join("config.json"),
            Some(77),
            Some(88),
        )
        .unwrap();
    }
    let report = copy_tree(&src, &dst, "a1").unwrap();

    assert_eq!(tree(&dst, &OURS, false), tree(&src, &[], true));
    assert_eq!(report.files, 12);
    assert_eq!(report.symlinks, 6);
    assert_eq!(report.dirs, 12);
    let mut want = names(&src);
    want.extend(OURS.map(String::from));
    want.sort();
    assert_eq!(
        names(&dst),
        want,
        "nothing else at the root (no staging directory left)"
    );

    // The marker holds the measured bytes; they are `du -sb` of the tree without our two files.
    assert_eq!(is_complete(&dst).unwrap(), Some(report.bytes));
    assert_eq!(
        fs::read_to_string(dst.join(MARKER)).unwrap(),
        format!("{}\n", report.bytes)
    );
    assert_eq!(published_du(&dst), report.bytes);
    let manifest = fs::read(dst.join(MANIFEST)).unwrap();
    assert_eq!(
        report.manifest_sha256,
        hex::encode(Sha256::digest(&manifest))
    );
    assert_eq!(manifest.iter().filter(|&&b| b == b'\n').count(), 12);
    let lines: Vec<&[u8]> = manifest
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    let mut sorted = lines.clone();
    sorted.sort_by(|a, b| a[66..].cmp(&b[66..]));
    assert_eq!(lines, sorted, "sorted by path");
    sha256sum_check(&dst);
    let v = verify_manifest(&dst).unwrap();
    assert_eq!(v.files, 12);

    // Ownership and modes, spelled out (the tree comparison covers them too).
    let m = fs::symlink_metadata(dst.join("private")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o600);
    assert_eq!(
        fs::symlink_metadata(dst.join("run.sh")).unwrap().mode() & 0o777,
        0o755
    );
    assert_eq!(
        fs::symlink_metadata(dst.join("empty-dir")).unwrap().mode() & 0o777,
        0o750
    );
    if is_root() {
        let m = fs::symlink_metadata(dst.join("version.txt")).unwrap();
        assert_eq!((m.uid(), m.gid()), (1234, 5678));
        let m = fs::symlink_metadata(
            dst.join("models--acme--tiny-llm/snapshots")
                .join(REV)
                .join("config.json"),
        )
        .unwrap();
        assert!(m.file_type().is_symlink());
        assert_eq!((m.uid(), m.gid()), (77, 88));
    }
    // Links resolve inside the copy, as in the cache.
    let cfg = dst
        .join("models--acme--tiny-llm/snapshots")
        .join(REV)
        .join("config.json");
    assert!(
        fs::read_to_string(cfg)
            .unwrap()
            .contains("LlamaForCausalLM")
    );
}

#[test]
fn setuid_setgid_and_sticky_bits_are_cleared() {
    let (_tmp, src, dst) = dirs();
    write(&src.join("tool"), b"x");
    fs::set_permissions(src.join("tool"), fs::Permissions::from_mode(0o6755)).unwrap();
    fs::create_dir(src.join("shared")).unwrap();
    fs::set_permissions(src.join("shared"), fs::Permissions::from_mode(0o3777)).unwrap();
    copy_tree(&src, &dst, "a1").unwrap();
    assert_eq!(
        fs::metadata(dst.join("tool")).unwrap().mode() & 0o7777,
        0o755
    );
    assert_eq!(
        fs::metadata(dst.join("shared")).unwrap().mode() & 0o7777,
        0o777
    );
}

#[test]
fn measure_is_du_sb() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("t");
    hf_tree(&root);
    // Hard links count once, here and in du.
    fs::hard_link(root.join("version.txt"), root.join("version-again.txt")).unwrap();
    fs::hard_link(root.join("private"), root.join("empty-dir/private-link")).unwrap();
    fs::create_dir_all(root.join("a/b/c/d")).unwrap();
    symlink("/etc/passwd", root.join("a/outside")).unwrap();
    symlink("../../../../nowhere/at/all", root.join("a/b/dangling")).unwrap();
    // A sparse file: apparent size, not blocks.
    let f = fs::File::create(root.join("sparse")).unwrap();
    f.set_len(10 << 20).unwrap();
    assert_eq!(measure(&root).unwrap(), du_sb(&root));
    // A link measures its own length; a file its size.
    symlink(&root, tmp.path().join("link")).unwrap();
    assert_eq!(
        measure(&tmp.path().join("link")).unwrap(),
        du_sb(&tmp.path().join("link"))
    );
    assert_eq!(measure(&root.join("sparse")).unwrap(), 10 << 20);
    assert!(matches!(
        measure(&tmp.path().join("absent")),
        Err(Error::Io { .. })
    ));
}

#[test]
fn measure_counts_special_files_like_du() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("t");
    fs::create_dir(&root).unwrap();
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        root.join("fifo"),
        rustix::fs::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap();
    write(&root.join("f"), b"12345");
    assert_eq!(measure(&root).unwrap(), du_sb(&root));
}

/// An earlier attempt left `d -> .` and `f -> ../victim` in the volume; the new tree has a real
/// `d/f`. Writing `vol/d/f` by path would write the victim outside the volume. Links are also
/// planted at the marker, the manifest, the staging directory and the temporary names.
#[test]
fn the_symlink_attack_chain_writes_nothing_outside() {
    let (tmp, src, dst) = dirs();
    let victim = tmp.path().join("victim");
    fs::write(&victim, b"precious").unwrap();
    let old = SystemTime::UNIX_EPOCH + Duration::from_secs(946_684_800);
    fs::File::options()
        .write(true)
        .open(&victim)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let victim_dir = tmp.path().join("victim-dir");
    fs::create_dir(&victim_dir).unwrap();
    fs::write(victim_dir.join("keep"), b"keep").unwrap();
    let before = fs::metadata(&victim).unwrap();

    symlink(".", dst.join("d")).unwrap();
    symlink("../victim", dst.join("f")).unwrap();
    symlink("../victim", dst.join(MARKER)).unwrap();
    symlink("../victim", dst.join(MANIFEST)).unwrap();
    symlink("../victim-dir", dst.join(".nvsnap-staging-a2")).unwrap();
    symlink("../victim", dst.join(".nvsnap-staging-a2.manifest")).unwrap();
    symlink("../victim", dst.join(".nvsnap-staging-a2.complete")).unwrap();
    symlink("../victim-dir", dst.join(".nvsnap-staging-old")).unwrap();
    write(&src.join("d/f"), b"new content");
    write(&src.join("f"), b"top f");

    let report = copy_tree(&src, &dst, "a2").unwrap();
    assert_eq!(report.files, 2);

    assert_eq!(fs::read(&victim).unwrap(), b"precious");
    let after = fs::metadata(&victim).unwrap();
    assert_eq!(
        (after.mtime(), after.mtime_nsec()),
        (before.mtime(), before.mtime_nsec())
    );
    assert_eq!(after.ino(), before.ino());
    assert_eq!(names(&victim_dir), vec!["keep"]);
    assert_eq!(fs::read(victim_dir.join("keep")).unwrap(), b"keep");

    let d = fs::symlink_metadata(dst.join("d")).unwrap();
    assert!(d.is_dir(), "d is a real directory now");
    assert!(fs::symlink_metadata(dst.join("d/f")).unwrap().is_file());
    assert_eq!(fs::read(dst.join("d/f")).unwrap(), b"new content");
    assert!(fs::symlink_metadata(dst.join("f")).unwrap().is_file());
    assert_eq!(fs::read(dst.join("f")).unwrap(), b"top f");
    assert_eq!(names(&dst), vec![MARKER, MANIFEST, "d", "f"]);
    assert!(fs::symlink_metadata(dst.join(MARKER)).unwrap().is_file());
    verify_manifest(&dst).unwrap();
}

/// Links in the source that point outside it are copied as links; nothing is read or written
/// through them (the victim's atime is far in the past, so a read would move it under relatime).
#[test]
fn links_pointing_outside_are_copied_not_followed() {
    let (tmp, src, dst) = dirs();
    let victim = tmp.path().join("x");
    fs::write(&victim, b"outside").unwrap();
    let past = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: 946_684_800,
            tv_nsec: 0,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: 946_684_800,
            tv_nsec: 0,
        },
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        &victim,
        &past,
        rustix::fs::AtFlags::empty(),
    )
    .unwrap();
    symlink("/etc/passwd", src.join("passwd")).unwrap();
    fs::create_dir(src.join("sub")).unwrap();
    symlink("../../x", src.join("sub/up")).unwrap();
    symlink(&victim, src.join("abs-victim")).unwrap();
    symlink("/", src.join("root")).unwrap();
    symlink("../x", src.join("dir-link")).unwrap();

    let report = copy_tree(&src, &dst, "a1").unwrap();
    assert_eq!((report.files, report.symlinks), (0, 5));
    assert_eq!(
        fs::read_link(dst.join("passwd")).unwrap(),
        Path::new("/etc/passwd")
    );
    assert_eq!(
        fs::read_link(dst.join("sub/up")).unwrap(),
        Path::new("../../x")
    );
    assert_eq!(fs::read_link(dst.join("abs-victim")).unwrap(), victim);
    assert_eq!(fs::read_link(dst.join("root")).unwrap(), Path::new("/"));
    let m = fs::metadata(&victim).unwrap();
    assert_eq!(
        (m.atime(), m.mtime()),
        (946_684_800, 946_684_800),
        "never read nor written"
    );
    assert_eq!(fs::read(&victim).unwrap(), b"outside");
    assert_eq!(
        fs::read(dst.join(MANIFEST)).unwrap(),
        b"",
        "links are not in the manifest"
    );
    assert_eq!(is_complete(&dst).unwrap(), Some(report.bytes));
}

#[test]
fn a_special_file_is_refused_and_no_marker_is_left() {
    let (_tmp, src, dst) = dirs();
    hf_tree(&src);
    copy_tree(&src, &dst, "a1").unwrap();
    assert!(is_complete(&dst).unwrap().is_some());

    let fifo = src.join("models--acme--tiny-llm/zz-fifo");
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    match copy_tree(&src, &dst, "a2").unwrap_err() {
        Error::SpecialFile { path, kind } => {
            assert_eq!(path, fifo);
            assert_eq!(kind, "FIFO");
        }
        other => panic!("{other}"),
    }
    assert_eq!(
        is_complete(&dst).unwrap(),
        None,
        "the earlier marker is gone"
    );
    assert!(!dst.join(MARKER).exists());
    assert!(
        !dst.join(".nvsnap-staging-a2").exists(),
        "the failed staging directory is removed"
    );
    fs::remove_file(&fifo).unwrap();

    let _sock = std::os::unix::net::UnixListener::bind(src.join("sock")).unwrap();
    let e = copy_tree(&src, &dst, "a3").unwrap_err();
    assert!(
        matches!(e, Error::SpecialFile { kind: "socket", .. }),
        "{e}"
    );
    assert!(e.to_string().contains("sock: socket refused"), "{e}");
    assert_eq!(is_complete(&dst).unwrap(), None);
    fs::remove_file(src.join("sock")).unwrap();

    if is_root() {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            src.join("null"),
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_bits_truncate(0o666),
            rustix::fs::makedev(1, 3),
        )
        .unwrap();
        let e = copy_tree(&src, &dst, "a4").unwrap_err();
        assert!(
            matches!(
                e,
                Error::SpecialFile {
                    kind: "character device",
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(is_complete(&dst).unwrap(), None);
        fs::remove_file(src.join("null")).unwrap();
    }

    // Fixed, the retry converges.
    let report = copy_tree(&src, &dst, "a5").unwrap();
    assert_eq!(tree(&dst, &OURS, false), tree(&src, &[], true));
    assert_eq!(is_complete(&dst).unwrap(), Some(report.bytes));
}

/// Names holding a newline, a backslash, a carriage return, bytes that are not UTF-8: copied,
/// listed escaped as sha256sum escapes them (so a newline cannot forge a line), checked by
/// `sha256sum -c`.
#[test]
fn hostile_names_cannot_forge_manifest_lines() {
    let (_tmp, src, dst) = dirs();
    let forged = format!("x\n{}  victim", "0".repeat(64));
    write(&src.join(&forged), b"forged");
    write(&src.join("back\\slash"), b"b");
    write(&src.join("carriage\rreturn"), b"c");
    write(&src.join("dir\nwith newline/inner"), b"i");
    write(&path_of(b"not-utf8-\xff\xfe"), b"n"); // relative: placed below
    fs::rename(
        path_of(b"not-utf8-\xff\xfe"),
        src.join(path_of(b"not-utf8-\xff\xfe")),
    )
    .unwrap();
    write(&src.join("z".repeat(255)), b"long");

    let report = copy_tree(&src, &dst, "a1").unwrap();
    assert_eq!(report.files, 6);
    let manifest = fs::read(dst.join(MANIFEST)).unwrap();
    assert_eq!(
        manifest.iter().filter(|&&b| b == b'\n').count(),
        6,
        "one line per file"
    );
    assert!(
        !manifest.windows(b"\n0000".len()).any(|w| w == b"\n0000"),
        "no forged line"
    );
    assert!(
        manifest
            .split(|&b| b == b'\n')
            .any(|l| l.starts_with(b"\\") && l.ends_with(b"dir\\nwith newline/inner"))
    );
    sha256sum_check(&dst);
    verify_manifest(&dst).unwrap();
    assert_eq!(tree(&dst, &OURS, false), tree(&src, &[], true));

    // A message naming such a path is one line, escaped.
    fs::write(dst.join(&forged), b"changed").unwrap();
    let e = verify_manifest(&dst).unwrap_err().to_string();
    assert!(!e.contains('\n'), "{e}");
    assert!(e.contains("x\\n0000"), "{e}");
}

#[test]
fn the_manifest_names_a_corrupted_missing_or_extra_file() {
    let (_tmp, src, dst) = dirs();
    hf_tree(&src);
    copy_tree(&src, &dst, "a1").unwrap();
    let blob = dst
        .join("models--acme--tiny-llm/blobs")
        .join(format!("b3{}", "0".repeat(62)));
    let rel = blob.strip_prefix(&dst).unwrap().to_path_buf();
    let original = fs::read(&blob).unwrap();

    // One byte flipped in the middle of a 1 MiB file.
    let mut flipped = original.clone();
    flipped[600_000] ^= 0x01;
    fs::write(&blob, &flipped).unwrap();
    match verify_manifest(&dst).unwrap_err() {
        Error::Verify {
            path,
            problem: Problem::Differs { expected, actual },
            ..
        } => {
            assert_eq!(path, rel);
            assert_eq!(expected, hex::encode(Sha256::digest(&original)));
            assert_eq!(actual, hex::encode(Sha256::digest(&flipped)));
        }
        other => panic!("{other}"),
    }
    fs::write(&blob, &original).unwrap();
    verify_manifest(&dst).unwrap();

    fs::remove_file(&blob).unwrap();
    match verify_manifest(&dst).unwrap_err() {
        Error::Verify {
            path,
            problem: Problem::Missing,
            ..
        } => assert_eq!(path, rel),
        other => panic!("{other}"),
    }
    // Replaced by a link to a good copy: not a regular file, named as such.
    fs::write(dst.join("copy"), &original).unwrap();
    symlink("../../copy", &blob).unwrap();
    fs::rename(dst.join("copy"), dst.join("empty-dir/copy")).unwrap();
    match verify_manifest(&dst).unwrap_err() {
        Error::Verify { path, problem, .. } => {
            // The first path in byte order: `empty-dir/copy` (extra) sorts before the blob.
            assert_eq!(path, Path::new("empty-dir/copy"));
            assert_eq!(problem, Problem::Extra);
        }
        other => panic!("{other}"),
    }
    fs::remove_file(dst.join("empty-dir/copy")).unwrap();
    match verify_manifest(&dst).unwrap_err() {
        Error::Verify { path, problem, .. } => {
            assert_eq!(path, rel);
            assert_eq!(
                problem,
                Problem::NotRegular {
                    kind: "symbolic link"
                }
            );
        }
        other => panic!("{other}"),
    }
    fs::remove_file(&blob).unwrap();
    fs::write(&blob, &original).unwrap();
    verify_manifest(&dst).unwrap();

    // An extra file, and an extra FIFO.
    fs::write(dst.join("models--acme--tiny-llm/refs/extra"), b"x").unwrap();
    match verify_manifest(&dst).unwrap_err() {
        Error::Verify {
            path,
            problem: Problem::Extra,
            ..
        } => {
            assert_eq!(path, Path::new("models--acme--tiny-llm/refs/extra"));
        }
        other => panic!("{other}"),
    }
    fs::remove_file(dst.join("models--acme--tiny-llm/refs/extra")).unwrap();
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        dst.join("fifo"),
        rustix::fs::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    match verify_manifest(&dst).unwrap_err() {
        Error::Verify {
            path,
            problem: Problem::Extra,
            ..
        } => assert_eq!(path, Path::new("fifo")),
        other => panic!("{other}"),
    }
    fs::remove_file(dst.join("fifo")).unwrap();
    verify_manifest(&dst).unwrap();

    // A tampered manifest is refused as a manifest.
    fs::write(dst.join(MANIFEST), b"not a manifest\n").unwrap();
    assert!(matches!(
        verify_manifest(&dst),
        Err(Error::Manifest { line: 1, .. })
    ));
    fs::remove_file(dst.join(MANIFEST)).unwrap();
    assert!(matches!(verify_manifest(&dst), Err(Error::Io { .. })));
}

#[test]
fn reserved_root_names_are_not_copied() {
    let (_tmp, src, dst) = dirs();
    write(&src.join(MARKER), b"999\n");
    write(&src.join(MANIFEST), b"forged\n");
    write(&src.join(".nvsnap-staging-x/f"), b"x");
    write(&src.join(".nvsnap-staging-x.manifest"), b"x");
    write(
        &src.join("sub").join(MARKER),
        b"a file like any other below the root",
    );
    write(&src.join(".nvsnap-other"), b"not reserved");
    let report = copy_tree(&src, &dst, "a1").unwrap();
    assert_eq!(names(&dst), vec![MARKER, MANIFEST, ".nvsnap-other", "sub"]);
    assert!(dst.join("sub").join(MARKER).is_file());
    assert_eq!(is_complete(&dst).unwrap(), Some(report.bytes));
    assert_ne!(report.bytes, 999);
}

#[test]
fn refusals_touch_nothing() {
    let (_tmp, src, dst) = dirs();
    write(&src.join("f"), b"f");
    copy_tree(&src, &dst, "a1").unwrap();
    for bad in ["", "A1", "a_1", "a.b", "a/b", "../x", &"a".repeat(41), "é"] {
        assert!(
            matches!(
                copy_tree(&src, &dst, bad),
                Err(Error::InvalidAttempt { .. })
            ),
            "{bad:?}"
        );
    }
    assert!(
        is_complete(&dst).unwrap().is_some(),
        "an invalid attempt touches nothing"
    );
    copy_tree(&src, &dst, &"a".repeat(40)).unwrap();

    // Overlaps: the same directory, one inside the other (also through a link).
    assert!(matches!(
        copy_tree(&src, &src, "a1"),
        Err(Error::Overlap { .. })
    ));
    fs::create_dir(src.join("inner")).unwrap();
    assert!(matches!(
        copy_tree(&src, &src.join("inner"), "a1"),
        Err(Error::Overlap { .. })
    ));
    fs::create_dir(dst.join("inner")).unwrap();
    assert!(matches!(
        copy_tree(&dst.join("inner"), &dst, "a1"),
        Err(Error::Overlap { .. })
    ));
    let tmp2 = tempfile::tempdir().unwrap();
    symlink(&dst, tmp2.path().join("alias")).unwrap();
    assert!(matches!(
        copy_tree(&dst, &tmp2.path().join("alias/inner"), "a1"),
        Err(Error::Overlap { .. })
    ));
    fs::remove_dir(dst.join("inner")).unwrap();
    assert!(
        is_complete(&dst).unwrap().is_some(),
        "refused overlaps touch nothing"
    );

    // A source root (or destination root) that is itself a link is refused.
    symlink(&src, tmp2.path().join("src-link")).unwrap();
    let e = copy_tree(&tmp2.path().join("src-link"), &dst, "a1").unwrap_err();
    assert!(matches!(e, Error::Refused { .. }), "{e}");
    let e = copy_tree(&src, &tmp2.path().join("alias"), "a1").unwrap_err();
    assert!(matches!(e, Error::Refused { .. }), "{e}");
    assert!(
        is_complete(&dst).unwrap().is_some(),
        "refused links touch nothing"
    );
}

#[test]
fn a_tree_deeper_than_the_limit_is_refused() {
    let (_tmp, src, dst) = dirs();
    let mut deep = src.clone();
    for _ in 0..=MAX_DEPTH {
        deep.push("d");
    }
    fs::create_dir_all(&deep).unwrap();
    assert!(matches!(
        copy_tree(&src, &dst, "a1"),
        Err(Error::TooDeep { .. })
    ));
    assert!(matches!(measure(&src), Err(Error::TooDeep { .. })));
    assert_eq!(is_complete(&dst).unwrap(), None);
    // At the limit it is copied.
    let (_tmp2, src2, dst2) = dirs();
    let mut ok = src2.clone();
    for _ in 0..MAX_DEPTH {
        ok.push("d");
    }
    fs::create_dir_all(&ok).unwrap();
    copy_tree(&src2, &dst2, "a1").unwrap();
}

#[test]
fn is_complete_reads_only_what_the_copier_writes() {
    let (_tmp, _src, dst) = dirs();
    assert_eq!(is_complete(&dst).unwrap(), None);
    for (text, ok) in [
        (&b"0\n"[..], Some(0)),
        (b"123\n", Some(123)),
        (b"18446744073709551615\n", Some(u64::MAX)),
        (b"18446744073709551616\n", None),
        (b"123", None),
        (b"123\n\n", None),
        (b"-1\n", None),
        (b"0123\n", None),
        (b"\n", None),
        (b" 1\n", None),
    ] {
        fs::write(dst.join(MARKER), text).unwrap();
        match ok {
            Some(n) => assert_eq!(is_complete(&dst).unwrap(), Some(n), "{text:?}"),
            None => assert!(
                matches!(is_complete(&dst), Err(Error::Marker { .. })),
                "{text:?}"
            ),
        }
    }
    fs::write(dst.join(MARKER), vec![b'1'; 1 << 20]).unwrap();
    assert!(matches!(is_complete(&dst), Err(Error::Marker { .. })));
    fs::remove_file(dst.join(MARKER)).unwrap();
    symlink("/etc/hostname", dst.join(MARKER)).unwrap();
    assert!(matches!(
        is_complete(&dst),
        Err(Error::Marker {
            reason: "is a symbolic link",
            ..
        })
    ));
    fs::remove_file(dst.join(MARKER)).unwrap();
    fs::create_dir(dst.join(MARKER)).unwrap();
    assert!(matches!(is_complete(&dst), Err(Error::Marker { .. })));
}

/// A selection like a compile-cache set's (`warmcache_modelvolume::cacheset::travels`, which
/// this crate does not depend on): inside `cache/` (or on the way to it), no component `secret`.
fn cache_only(rel: &str) -> bool {
    let parts: Vec<&str> = rel.split('/').collect();
    parts[0] == "cache" && !parts.iter().any(|p| *p == "secret" || p.ends_with(".pem"))
}

/// Only what the selection takes is measured and copied: a directory left out is never entered
/// (a FIFO in it does not fail the copy), links are left out (inside the selection too), names
/// that are not UTF-8 are left out; the manifest, the verification and the marker are those of
/// the selected tree, and the measure before the copy is the copy's bytes.
#[test]
fn a_selected_copy_takes_only_what_the_selection_accepts() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let (tmp, src, dst) = dirs();
    let victim = tmp.path().join("victim");
    fs::write(&victim, b"outside").unwrap();
    fs::create_dir_all(src.join("cache/kernels/ab")).unwrap();
    fs::write(src.join("cache/kernels/ab/k.cubin"), vec![7u8; 5000]).unwrap();
    fs::write(src.join("cache/index"), b"idx").unwrap();
    fs::create_dir_all(src.join("cache/secret")).unwrap();
    fs::write(src.join("cache/secret/token"), b"hf_xxx").unwrap();
    fs::write(src.join("cache/tls.pem"), b"key").unwrap();
    symlink(&victim, src.join("cache/out")).unwrap();
    symlink("kernels", src.join("cache/in")).unwrap();
    fs::write(src.join(OsStr::from_bytes(b"cache/\xff")), b"latin1").unwrap();
    fs::create_dir_all(src.join("other")).unwrap();
    fs::write(src.join("other/config"), b"creds").unwrap();
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        src.join("other/fifo"),
        rustix::fs::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    fs::write(src.join("top-file"), b"x").unwrap();

    let measured = measure_dir_selected(&open_dir_beneath(&src, "").unwrap(), &cache_only).unwrap();
    let report = copy_tree_selected(&src, &dst, "a1", &cache_only).unwrap();
    assert_eq!(
        (report.files, report.symlinks, report.dirs),
        (2, 0, 3),
        "{report:?}"
    );
    let mut found = paths_under(&dst);
    found.sort();
    assert_eq!(
        found,
        [
            ".nvsnap-complete",
            ".nvsnap-manifest",
            "cache",
            "cache/index",
            "cache/kernels",
            "cache/kernels/ab",
            "cache/kernels/ab/k.cubin",
        ]
    );
    assert_eq!(
        fs::read(dst.join("cache/kernels/ab/k.cubin")).unwrap(),
        vec![7u8; 5000]
    );
    verify_manifest(&dst).unwrap();
    sha256sum_check(&dst);
    assert_eq!(is_complete(&dst).unwrap(), Some(report.bytes));
    assert_eq!(report.bytes, published_du(&dst));
    // The measure sizes what is copied: the root directory and the selected entries.
    let size = |rel: &str| fs::symlink_metadata(src.join(rel)).unwrap().len();
    assert_eq!(
        measured,
        [
            "",
            "cache",
            "cache/index",
            "cache/kernels",
            "cache/kernels/ab",
            "cache/kernels/ab/k.cubin",
        ]
        .into_iter()
        .map(size)
        .sum::<u64>()
    );
    assert_eq!(fs::read(&victim).unwrap(), b"outside");

    // Nothing selected: a complete, verified copy of an empty tree (an earlier content gone).
    let none = copy_tree_selected(&src, &dst, "a2", &|_: &str| false).unwrap();
    assert_eq!((none.files, none.symlinks, none.dirs), (0, 0, 0));
    assert_eq!(paths_under(&dst).len(), 2, "{:?}", paths_under(&dst));
    assert_eq!(fs::read(dst.join(MANIFEST)).unwrap(), b"");
    assert_eq!(is_complete(&dst).unwrap(), Some(none.bytes));
    verify_manifest(&dst).unwrap();
    assert_eq!(
        measure_dir_selected(&open_dir_beneath(&src, "").unwrap(), &|_: &str| false).unwrap(),
        fs::symlink_metadata(&src).unwrap().len(),
        "nothing selected: the directory alone"
    );

    // The same tree unselected: the FIFO is refused, as always.
    assert!(matches!(
        copy_tree(&src, &dst, "a3"),
        Err(Error::SpecialFile { .. })
    ));
    // A FIFO the selection takes is refused too.
    let (_tmp2, src2, dst2) = dirs();
    fs::create_dir(src2.join("cache")).unwrap();
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        src2.join("cache/fifo"),
        rustix::fs::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    assert!(matches!(
        copy_tree_selected(&src2, &dst2, "a1", &cache_only),
        Err(Error::SpecialFile { .. })
    ));
    assert_eq!(is_complete(&dst2).unwrap(), None);
}

/// Every path beneath `root`, relative, without following links.
fn paths_under(root: &Path) -> Vec<String> {
    fn go(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            if e.file_type().unwrap().is_dir() {
                go(root, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    go(root, root, &mut out);
    out
}
