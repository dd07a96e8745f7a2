//! Read-only binds against the real kernel, in a private mount namespace: each test re-runs
//! itself under `unshare --mount --propagation private` (so nothing it mounts is seen outside),
//! with tmpfs mounts standing in for the holder pod's view. Needs root; fails (does not skip)
//! without it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::ffi::CStr;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use rustix::mount::{MountFlags, UnmountFlags};
use warmcache_nodefs::{
    BindOutcome, BindState, Error, MANIFEST, MARKER, OpenOutcome, bind_state, copy_dir_into_mount,
    copy_dir_into_mount_selected, copy_tree_into_mount, ensure_read_only_bind,
    ensure_read_only_bind_over_empty, is_complete, measure, measure_dir, measure_dir_selected,
    open_dir_beneath, open_root, read_mountinfo, top_mount, unbind,
};

const IN_MOUNTNS: &str = "WARMCACHE_NODEFS_IN_MOUNTNS";

/// Runs `body` in a private mount namespace: re-executes this test binary for exactly `test`
/// under `unshare` unless already inside, and asserts the child ran the test and passed.
fn in_mount_namespace(test: &str, body: impl FnOnce()) {
    if std::env::var_os(IN_MOUNTNS).is_some() {
        body();
        return;
    }
    assert!(
        common::is_root(),
        "the mount tests need root (CAP_SYS_ADMIN, to unshare a mount namespace and mount tmpfs); run them as root, as CI does"
    );
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--"])
        .arg(&exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(IN_MOUNTNS, "1")
        .output()
        .unwrap_or_else(|e| panic!("running unshare(1) (util-linux) failed: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "{test} failed in its mount namespace: {}",
        out.status
    );
    assert!(
        stdout.contains("test result: ok. 1 passed"),
        "{test} did not run in its mount namespace"
    );
}

fn mount_tmpfs(at: &Path) {
    rustix::mount::mount("tmpfs", at, "tmpfs", MountFlags::empty(), None::<&CStr>).unwrap();
}

fn umount(at: &Path) {
    rustix::mount::unmount(at, UnmountFlags::DETACH).unwrap();
}

/// How many mounts the table shows at exactly `path`.
fn mounts_at(path: &Path) -> usize {
    read_mountinfo()
        .unwrap()
        .iter()
        .filter(|m| m.mount_point == path)
        .count()
}

struct Dirs {
    _tmp: tempfile::TempDir,
    view: PathBuf,
    target: PathBuf,
}

impl Dirs {
    /// A view directory with a tmpfs mounted on it (holding `model.bin`) and an absent target.
    fn new() -> Dirs {
        let tmp = tempfile::tempdir().unwrap();
        let base = fs::canonicalize(tmp.path()).unwrap();
        let view = base.join("pods/p1/volumes/kubernetes.io~csi/pv/mount");
        fs::create_dir_all(&view).unwrap();
        mount_tmpfs(&view);
        fs::write(view.join("model.bin"), b"weights v1").unwrap();
        let target = base.join("views/model");
        Dirs {
            _tmp: tmp,
            view,
            target,
        }
    }
}

impl Drop for Dirs {
    fn drop(&mut self) {
        // Unmount what a failing test left, so the temporary directory can go.
        for p in [&self.target, &self.view] {
            while mounts_at(p) > 0 {
                if rustix::mount::unmount(p.as_path(), UnmountFlags::DETACH).is_err() {
                    break;
                }
            }
        }
    }
}

#[test]
fn a_bind_is_created_verified_redone_and_removed() {
    in_mount_namespace("a_bind_is_created_verified_redone_and_removed", || {
        let d = Dirs::new();
        assert_eq!(
            ensure_read_only_bind(&d.view, &d.target).unwrap(),
            BindOutcome::Created
        );
        assert_eq!(fs::read(d.target.join("model.bin")).unwrap(), b"weights v1");
        // Read-only at the target, writable at the source.
        let err = fs::write(d.target.join("new"), b"x").unwrap_err();
        assert_eq!(
            err.raw_os_error(),
            Some(rustix::io::Errno::ROFS.raw_os_error()),
            "{err}"
        );
        fs::write(d.view.join("written-by-holder"), b"x").unwrap();
        assert!(
            d.target.join("written-by-holder").exists(),
            "the same filesystem"
        );
        let table = read_mountinfo().unwrap();
        let bound = top_mount(&table, &d.target).unwrap();
        assert!(bound.read_only());
        assert!(
            bound.options.iter().any(|o| o == "nosuid")
                && bound.options.iter().any(|o| o == "nodev")
        );
        assert_eq!(
            bind_state(&table, &d.view, &d.target).unwrap(),
            BindState::Verified
        );

        // Again: nothing to do.
        assert_eq!(
            ensure_read_only_bind(&d.view, &d.target).unwrap(),
            BindOutcome::Verified
        );
        assert_eq!(mounts_at(&d.target), 1);

        // The view replaced underneath (the kubelet remounted the volume): the bind is stale.
        umount(&d.view);
        mount_tmpfs(&d.view);
        fs::write(d.view.join("model.bin"), b"weights v2").unwrap();
        let table = read_mountinfo().unwrap();
        let stale = bind_state(&table, &d.view, &d.target).unwrap();
        let new_view = top_mount(&table, &d.view).unwrap();
        match &stale {
            BindState::Stale { device, .. } => {
                assert_ne!(*device, (new_view.major, new_view.minor))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            fs::read(d.target.join("model.bin")).unwrap(),
            b"weights v1",
            "stale content"
        );
        assert_eq!(
            ensure_read_only_bind(&d.view, &d.target).unwrap(),
            BindOutcome::Redone
        );
        assert_eq!(fs::read(d.target.join("model.bin")).unwrap(), b"weights v2");
        assert_eq!(
            mounts_at(&d.target),
            1,
            "the stale bind was unmounted, not stacked under"
        );

        // Unmounted by hand: missing, created again.
        umount(&d.target);
        let table = read_mountinfo().unwrap();
        assert_eq!(
            bind_state(&table, &d.view, &d.target).unwrap(),
            BindState::Missing
        );
        assert_eq!(
            ensure_read_only_bind(&d.view, &d.target).unwrap(),
            BindOutcome::Created
        );
        assert_eq!(
            ensure_read_only_bind(&d.view, &d.target).unwrap(),
            BindOutcome::Verified
        );

        assert!(unbind(&d.target).unwrap());
        assert_eq!(mounts_at(&d.target), 0);
        assert!(!unbind(&d.target).unwrap());
        assert!(!unbind(&d.target.join("absent")).unwrap());
        assert!(
            d.view.join("model.bin").exists(),
            "unbinding leaves the view alone"
        );
    });
}

#[test]
fn a_writable_bind_and_stacked_stale_mounts_are_redone() {
    in_mount_namespace(
        "a_writable_bind_and_stacked_stale_mounts_are_redone",
        || {
            let d = Dirs::new();
            fs::create_dir_all(&d.target).unwrap();
            // A writable bind made by someone else.
            rustix::mount::mount_bind(&d.view, &d.target).unwrap();
            let table = read_mountinfo().unwrap();
            assert_eq!(
                bind_state(&table, &d.view, &d.target).unwrap(),
                BindState::Writable
            );
            assert_eq!(
                ensure_read_only_bind(&d.view, &d.target).unwrap(),
                BindOutcome::Redone
            );
            assert_eq!(mounts_at(&d.target), 1);
            let err = fs::write(d.target.join("new"), b"x").unwrap_err();
            assert_eq!(
                err.raw_os_error(),
                Some(rustix::io::Errno::ROFS.raw_os_error())
            );

            // Two unrelated filesystems stacked on top of the verified bind: all of it goes.
            mount_tmpfs(&d.target);
            mount_tmpfs(&d.target);
            assert_eq!(mounts_at(&d.target), 3);
            assert!(matches!(
                bind_state(&read_mountinfo().unwrap(), &d.view, &d.target).unwrap(),
                BindState::Stale { .. }
            ));
            assert_eq!(
                ensure_read_only_bind(&d.view, &d.target).unwrap(),
                BindOutcome::Redone
            );
            assert_eq!(mounts_at(&d.target), 1);
            assert_eq!(fs::read(d.target.join("model.bin")).unwrap(), b"weights v1");

            // A bind of a subdirectory of the view is another root: stale.
            umount(&d.target);
            fs::create_dir(d.view.join("sub")).unwrap();
            rustix::mount::mount_bind(d.view.join("sub"), &d.target).unwrap();
            rustix::mount::mount_remount(&d.target, MountFlags::BIND | MountFlags::RDONLY, c"")
                .unwrap();
            match bind_state(&read_mountinfo().unwrap(), &d.view, &d.target).unwrap() {
                BindState::Stale { root, .. } => assert_eq!(root, Path::new("/sub")),
                other => panic!("{other:?}"),
            }
            assert_eq!(
                ensure_read_only_bind(&d.view, &d.target).unwrap(),
                BindOutcome::Redone
            );
            assert!(d.target.join("model.bin").exists());
            assert!(unbind(&d.target).unwrap());
        },
    );
}

#[test]
fn an_unmounted_view_is_refused_and_nothing_is_mounted() {
    in_mount_namespace(
        "an_unmounted_view_is_refused_and_nothing_is_mounted",
        || {
            let d = Dirs::new();
            // The kubelet unmounted the view: only its empty directory is left.
            umount(&d.view);
            let e = ensure_read_only_bind(&d.view, &d.target).unwrap_err();
            assert!(matches!(e, Error::NotAMountPoint { .. }), "{e}");
            assert!(e.to_string().contains("not a mount point"), "{e}");
            assert_eq!(mounts_at(&d.target), 0);
            assert!(!d.target.exists(), "the target is not even created");
            // Also with a target that exists.
            fs::create_dir_all(&d.target).unwrap();
            assert!(matches!(
                ensure_read_only_bind(&d.view, &d.target),
                Err(Error::NotAMountPoint { .. })
            ));
            assert_eq!(mounts_at(&d.target), 0);
            // An absent view is an error too.
            assert!(matches!(
                ensure_read_only_bind(&d.view.join("absent"), &d.target),
                Err(Error::Io { .. })
            ));
        },
    );
}

#[test]
fn bad_targets_are_refused() {
    in_mount_namespace("bad_targets_are_refused", || {
        let d = Dirs::new();
        let base = d.target.parent().unwrap().to_path_buf();
        fs::create_dir_all(&base).unwrap();
        // A symbolic link (here to a directory an attacker wants covered).
        let elsewhere = base.join("elsewhere");
        fs::create_dir(&elsewhere).unwrap();
        symlink(&elsewhere, &d.target).unwrap();
        let e = ensure_read_only_bind(&d.view, &d.target).unwrap_err();
        assert!(matches!(e, Error::Refused { .. }), "{e}");
        assert_eq!(mounts_at(&d.target), 0);
        assert_eq!(mounts_at(&elsewhere), 0);
        assert!(matches!(unbind(&d.target), Err(Error::Refused { .. })));
        fs::remove_file(&d.target).unwrap();
        // A regular file.
        fs::write(&d.target, b"").unwrap();
        assert!(matches!(
            ensure_read_only_bind(&d.view, &d.target),
            Err(Error::Refused { .. })
        ));
        fs::remove_file(&d.target).unwrap();
        // Inside the view, or the view itself, or one of its parents.
        for t in [
            d.view.join("inside"),
            d.view.clone(),
            d.view.parent().unwrap().to_path_buf(),
        ] {
            let e = ensure_read_only_bind(&d.view, &t).unwrap_err();
            assert!(matches!(e, Error::Refused { .. }), "{}: {e}", t.display());
        }
        assert_eq!(mounts_at(&d.view), 1);
        // Relative paths.
        assert!(matches!(
            ensure_read_only_bind(Path::new("view"), &d.target),
            Err(Error::NotAbsolute { .. })
        ));
        assert!(matches!(
            ensure_read_only_bind(&d.view, Path::new("t")),
            Err(Error::NotAbsolute { .. })
        ));
        assert!(matches!(
            unbind(Path::new("t")),
            Err(Error::NotAbsolute { .. })
        ));
        // The parent of a missing target is created.
        let deep = base.join("a/b/c");
        assert_eq!(
            ensure_read_only_bind(&d.view, &deep).unwrap(),
            BindOutcome::Created
        );
        assert!(unbind(&deep).unwrap());
        fs::write(d.view.join("still-writable"), b"x").unwrap();
        assert!(
            !d.view.join("inside").exists(),
            "a refused target is not created"
        );
    });
}

#[test]
fn a_bind_over_empty_never_hides_what_a_pod_wrote() {
    in_mount_namespace("a_bind_over_empty_never_hides_what_a_pod_wrote", || {
        let d = Dirs::new();
        // A reader's in-place download wrote into the directory while nothing was bound.
        fs::create_dir_all(d.target.join("snapshots")).unwrap();
        fs::write(d.target.join("snapshots/own.bin"), b"the pod's own").unwrap();
        match ensure_read_only_bind_over_empty(&d.view, &d.target) {
            Err(Error::Occupied { path }) => assert_eq!(path, d.target),
            other => panic!("{other:?}"),
        }
        assert_eq!(mounts_at(&d.target), 0, "nothing mounted over it");
        assert_eq!(
            fs::read(d.target.join("snapshots/own.bin")).unwrap(),
            b"the pod's own",
            "nothing removed"
        );
        // Emptied (by whoever owns it): bound, then verified, with no check of what lies under.
        fs::remove_dir_all(d.target.join("snapshots")).unwrap();
        assert_eq!(
            ensure_read_only_bind_over_empty(&d.view, &d.target).unwrap(),
            BindOutcome::Created
        );
        assert_eq!(fs::read(d.target.join("model.bin")).unwrap(), b"weights v1");
        assert_eq!(
            ensure_read_only_bind_over_empty(&d.view, &d.target).unwrap(),
            BindOutcome::Verified
        );
        // A stale bind (the view replaced underneath) is redone: the mount is ours to replace.
        umount(&d.view);
        mount_tmpfs(&d.view);
        fs::write(d.view.join("model.bin"), b"weights v2").unwrap();
        assert_eq!(
            ensure_read_only_bind_over_empty(&d.view, &d.target).unwrap(),
            BindOutcome::Redone
        );
        assert_eq!(fs::read(d.target.join("model.bin")).unwrap(), b"weights v2");
        assert_eq!(mounts_at(&d.target), 1);
        // A missing target directory is created empty and bound.
        let fresh = d.target.with_file_name("fresh");
        assert_eq!(
            ensure_read_only_bind_over_empty(&d.view, &fresh).unwrap(),
            BindOutcome::Created
        );
        assert!(unbind(&fresh).unwrap());
        assert!(unbind(&d.target).unwrap());
    });
}

/// A fresh root-owned volume root is given to the writer through its kubelet mount, and only
/// then: not before the volume is mounted (that is the node's disk), never through a link, never
/// one owned by someone else, and nothing beneath the root changes.
#[test]
fn a_fresh_volume_root_is_opened_for_its_writer_only_on_its_mount() {
    in_mount_namespace(
        "a_fresh_volume_root_is_opened_for_its_writer_only_on_its_mount",
        || {
            use std::os::unix::fs::{MetadataExt, PermissionsExt};
            let tmp = tempfile::tempdir().unwrap();
            let base = fs::canonicalize(tmp.path()).unwrap();
            let root = base.join("pods/writer/volumes/kubernetes.io~csi/pv/mount");
            fs::create_dir_all(&root).unwrap();
            fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();

            // Not mounted yet: the kubelet's directory on the node's disk is left alone.
            let err = open_root(&root, &read_mountinfo().unwrap(), 1000, 2000).unwrap_err();
            assert!(matches!(err, Error::NotAVolumeRoot { .. }), "{err}");
            assert_eq!(fs::metadata(&root).unwrap().uid(), 0);

            // Mounted, root-owned 0755 with root's file in it (what a fresh export looks like
            // after an earlier attempt wrote as root).
            rustix::mount::mount(
                "tmpfs",
                &root,
                "tmpfs",
                MountFlags::empty(),
                Some(c"mode=0755,uid=0,gid=0"),
            )
            .unwrap();
            fs::write(root.join("roots-file"), b"x").unwrap();
            let table = read_mountinfo().unwrap();
            assert_eq!(
                open_root(&root, &table, 1000, 2000).unwrap(),
                OpenOutcome::Opened
            );
            let meta = fs::metadata(&root).unwrap();
            assert_eq!(
                (meta.uid(), meta.gid(), meta.mode() & 0o7777),
                (1000, 2000, 0o755)
            );
            assert_eq!(fs::metadata(root.join("roots-file")).unwrap().uid(), 0);
            // Again: already the writer's.
            assert_eq!(
                open_root(&root, &table, 1000, 2000).unwrap(),
                OpenOutcome::AlreadyOpen
            );
            // The writer's, but without write for its owner: only the owner bits are added.
            fs::set_permissions(&root, fs::Permissions::from_mode(0o555)).unwrap();
            assert_eq!(
                open_root(&root, &table, 1000, 2000).unwrap(),
                OpenOutcome::Opened
            );
            assert_eq!(fs::metadata(&root).unwrap().mode() & 0o7777, 0o755);
            // Someone else's: refused, unchanged.
            std::os::unix::fs::chown(&root, Some(3000), Some(3000)).unwrap();
            let err = open_root(&root, &table, 1000, 2000).unwrap_err();
            assert!(
                matches!(err, Error::ForeignOwner { owner: 3000, .. }),
                "{err}"
            );
            assert_eq!(fs::metadata(&root).unwrap().uid(), 3000);
            // A link in place of the root, even to a mounted volume: refused.
            std::os::unix::fs::chown(&root, Some(0), Some(0)).unwrap();
            let link = base.join("pods/writer/volumes/kubernetes.io~csi/pv2/mount");
            fs::create_dir_all(link.parent().unwrap()).unwrap();
            symlink(&root, &link).unwrap();
            let err = open_root(&link, &table, 1000, 2000).unwrap_err();
            assert!(matches!(err, Error::Refused { .. }), "{err}");
            assert_eq!(fs::metadata(&root).unwrap().uid(), 0);
            // A mount the table read before does not show: refused (mounted since).
            let later = base.join("pods/writer/volumes/kubernetes.io~csi/pv3/mount");
            fs::create_dir_all(&later).unwrap();
            let before = read_mountinfo().unwrap();
            mount_tmpfs(&later);
            let err = open_root(&later, &before, 1000, 2000).unwrap_err();
            assert!(matches!(err, Error::NotAVolumeRoot { .. }), "{err}");
            umount(&later);
            // A volume mounted over the root after the table was read: the directory opened is
            // not the one the table shows, refused.
            mount_tmpfs(&root);
            let err = open_root(&root, &table, 1000, 2000).unwrap_err();
            assert!(matches!(err, Error::NotAVolumeRoot { .. }), "{err}");
            umount(&root);
            umount(&root);
        },
    );
}

/// The staging copy goes only into the mount the table showed: not into the kubelet's directory
/// before the volume is mounted there, nor into a volume mounted over it since the table was read;
/// into the mount itself, completely.
#[test]
fn a_copy_into_a_volume_is_refused_unless_the_volume_is_the_mount_the_table_shows() {
    in_mount_namespace(
        "a_copy_into_a_volume_is_refused_unless_the_volume_is_the_mount_the_table_shows",
        || {
            let tmp = tempfile::tempdir().unwrap();
            let base = fs::canonicalize(tmp.path()).unwrap();
            let tree = base.join("staged");
            fs::create_dir_all(tree.join("blobs")).unwrap();
            fs::write(tree.join("blobs/shard"), b"weights").unwrap();
            let volume = base.join("pods/holder/volumes/kubernetes.io~csi/pv/mount");
            fs::create_dir_all(&volume).unwrap();

            let err =
                copy_tree_into_mount(&tree, &volume, "a1", &read_mountinfo().unwrap()).unwrap_err();
            assert!(matches!(err, Error::NotAVolumeRoot { .. }), "{err}");
            assert_eq!(
                fs::read_dir(&volume).unwrap().count(),
                0,
                "the node's disk untouched"
            );

            mount_tmpfs(&volume);
            let table = read_mountinfo().unwrap();
            mount_tmpfs(&volume);
            let err = copy_tree_into_mount(&tree, &volume, "a2", &table).unwrap_err();
            assert!(matches!(err, Error::NotAVolumeRoot { .. }), "{err}");
            assert_eq!(fs::read_dir(&volume).unwrap().count(), 0);
            umount(&volume);

            let report = copy_tree_into_mount(&tree, &volume, "a3", &table).unwrap();
            assert!(report.bytes >= 7, "{report:?}");
            assert_eq!(is_complete(&volume).unwrap(), Some(report.bytes));
            assert_eq!(fs::read(volume.join("blobs/shard")).unwrap(), b"weights");
            umount(&volume);
        },
    );
}

/// A capture source's landing inside its pod's emptyDir, which the pod controls: reached one
/// component at a time without following a link (`ngc -> /etc` is refused, as is a link
/// anywhere on the path, a `..`, a file, and a mount inside the emptyDir), measured and copied
/// from the opened descriptor (a link swapped into the path after the open changes nothing), into
/// the mount the table shows, complete with marker and manifest; a selected copy (a
/// compile-cache set's) takes only what its selection accepts, through the same checks.
#[test]
fn a_capture_landing_is_reached_and_copied_without_following_a_link() {
    in_mount_namespace(
        "a_capture_landing_is_reached_and_copied_without_following_a_link",
        || {
            let tmp = tempfile::tempdir().unwrap();
            let base = fs::canonicalize(tmp.path()).unwrap();
            // The kubelet's emptyDir of the pod (a Memory emptyDir is a tmpfs mounted there).
            let empty_dir = base.join("pods/uid-1/volumes/kubernetes.io~empty-dir/ngc-cache");
            fs::create_dir_all(&empty_dir).unwrap();
            mount_tmpfs(&empty_dir);
            let landing = empty_dir.join("ngc/models");
            common::hf_tree(&landing);
            // What the pod could plant: links to the node's /etc, up the tree, and a file.
            symlink("/etc", empty_dir.join("etc-link")).unwrap();
            fs::create_dir_all(empty_dir.join("real")).unwrap();
            symlink("../..", empty_dir.join("real/up")).unwrap();
            symlink("ngc", empty_dir.join("ngc-link")).unwrap();
            fs::write(empty_dir.join("file"), b"x").unwrap();
            let refused = |rel: &str| {
                let err = open_dir_beneath(&empty_dir, rel).unwrap_err();
                assert!(
                    matches!(err, Error::Refused { .. }),
                    "{rel}: {err} ({err:?})"
                );
            };
            for rel in [
                "etc-link",
                "etc-link/ssl",
                "real/up",
                "real/up/volumes",
                "ngc-link/models",
                "file",
                "..",
                "ngc/../ngc/models",
                "./ngc",
                "ngc//models",
                "/ngc",
            ] {
                refused(rel);
            }
            // The root itself must not be a link either.
            let linked_root = base.join("linked-root");
            symlink(&empty_dir, &linked_root).unwrap();
            let err = open_dir_beneath(&linked_root, "ngc").unwrap_err();
            assert!(matches!(err, Error::Refused { .. }), "{err}");
            // A mount inside the emptyDir (another filesystem) is not the pod's tree.
            let inner = empty_dir.join("inner");
            fs::create_dir_all(&inner).unwrap();
            mount_tmpfs(&inner);
            let err = open_dir_beneath(&empty_dir, "inner").unwrap_err();
            assert!(matches!(err, Error::CrossesMount { .. }), "{err}");
            umount(&inner);
            // Nothing missing is created.
            assert!(open_dir_beneath(&empty_dir, "absent/dir").is_err());
            assert!(!empty_dir.join("absent").exists());

            // The landing, opened; then the pod swaps a link to another tree into its path: the
            // measure and the copy read what was opened, nothing behind the link.
            let opened = open_dir_beneath(&empty_dir, "ngc/models").unwrap();
            assert_eq!(opened.path(), landing.as_path());
            let expected = common::tree(&landing, &[], true);
            let bytes = measure(&landing).unwrap();
            let decoy = base.join("decoy");
            fs::create_dir_all(&decoy).unwrap();
            fs::write(decoy.join("secret"), b"node secret").unwrap();
            fs::rename(empty_dir.join("ngc"), empty_dir.join("ngc-moved")).unwrap();
            symlink(&decoy, empty_dir.join("ngc")).unwrap();
            assert_eq!(measure_dir(&opened).unwrap(), bytes);

            let volume = base.join("pods/holder/volumes/kubernetes.io~csi/pv/mount");
            fs::create_dir_all(&volume).unwrap();
            mount_tmpfs(&volume);
            let table = read_mountinfo().unwrap();
            let report = copy_dir_into_mount(&opened, &volume, "c1", &table).unwrap();
            assert_eq!(is_complete(&volume).unwrap(), Some(report.bytes));
            assert_eq!(common::tree(&volume, &[MARKER, MANIFEST], false), expected);
            assert!(!volume.join("secret").exists());
            common::sha256sum_check(&volume);
            // Selected (a compile-cache set's way): only what the selection takes replaces the
            // volume's content, measured alike, through the same mount check.
            let keep = |rel: &str| rel == "version.txt";
            let selected =
                copy_dir_into_mount_selected(&opened, &volume, "c3", &table, &keep).unwrap();
            assert_eq!((selected.files, selected.dirs), (1, 0));
            assert_eq!(
                common::names(&volume),
                [MARKER, MANIFEST, "version.txt"],
                "only the selected file"
            );
            // The directory itself and the selected file (the directory's own size differs
            // between source and copy on tmpfs, where it counts entries).
            let size = |p: &Path| fs::symlink_metadata(p).unwrap().len();
            assert_eq!(
                measure_dir_selected(&opened, &keep).unwrap(),
                size(&empty_dir.join("ngc-moved/models")) + size(&volume.join("version.txt"))
            );
            common::sha256sum_check(&volume);
            // Into a directory that is not the mount the table shows: refused, untouched.
            let unmounted = base.join("pods/holder2/volumes/kubernetes.io~csi/pv/mount");
            fs::create_dir_all(&unmounted).unwrap();
            let err = copy_dir_into_mount(&opened, &unmounted, "c1", &table).unwrap_err();
            assert!(matches!(err, Error::NotAVolumeRoot { .. }), "{err}");
            assert_eq!(fs::read_dir(&unmounted).unwrap().count(), 0);
            // A source overlapping the volume: refused.
            let inside = open_dir_beneath(&volume, "").unwrap();
            let err = copy_dir_into_mount(&inside, &volume, "c2", &table).unwrap_err();
            assert!(matches!(err, Error::Overlap { .. }), "{err}");
            drop(opened);
            drop(inside);
            umount(&volume);
            umount(&empty_dir);
        },
    );
}
