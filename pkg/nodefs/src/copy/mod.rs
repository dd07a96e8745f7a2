//! The safe tree copier: an untrusted staged model tree into a volume root, published only when
//! complete, with a manifest, a verification pass and a completion marker written last.
//!
//! The steps of [`copy_tree`], each a method of `Attempt` so that tests can stop between them
//! as a crash would:
//!
//! 1. `Attempt::begin`: check the attempt name and that source and destination do not overlap;
//!    remove the completion marker of an earlier attempt and fsync the root (before anything else
//!    is touched: a crash from here on never leaves a marker over partial content); remove a
//!    leftover staging directory of this attempt; create it afresh.
//! 2. `Attempt::copy`: walk the source on directory descriptors and recreate it in the staging
//!    directory, every entry created exclusively and without following links; hash the bytes
//!    read from each source file (the bytes written), and keep the file's stamp as opened
//!    (inode, size, modification and change times, before the first read); queue every file
//!    and directory for fsync (a thread that runs on through steps 3 to 5, so waiting for the
//!    disk overlaps with them).
//! 3. `Attempt::publish`: remove every other entry of the root (symlink-safe), rename the
//!    staging directory's entries into the root, remove the staging directory, fsync the root.
//! 4. `Attempt::write_manifest`: the manifest, through a temporary file and a rename.
//! 5. `Attempt::verify`: read the manifest back (it must list what was hashed); read every
//!    published regular file back and compare it byte for byte with its source, opened again
//!    beneath the source's directory descriptors as the copy opened it (no link followed) and
//!    still the same inode with the same stamp, before and after the comparison; compare the
//!    published links and directories with what was copied. A stamp unchanged from before the
//!    copy's first read to after the comparison's last means nothing wrote the source meanwhile,
//!    so the bytes compared are the bytes hashed, and a published file equal to them has the
//!    digest its manifest line says: one SHA-256 pass in all ([`verify_manifest`], for a volume
//!    found later, hashes again). A published file that differs is an [`Error::Verify`] with
//!    [`Problem::Differs`] (it is hashed then, to name both digests); a source that changed
//!    (written, cut, extended, replaced, removed, swapped for a link) fails the attempt with
//!    [`Problem::SourceChanged`], so a capture source a live pod writes into during the copy is
//!    never published.
//! 6. `Attempt::wait_durable`, then `Attempt::mark`: once every fsync has completed, the
//!    marker with the measured byte count, through a temporary file.
//!
//! A crash after step 2 but before the fsyncs complete may leave published files whose data
//! did not reach the disk; there is no marker then, and the next attempt replaces them.
//!
//! Both reads of step 5 come from the page cache as a rule (the files were just written and
//! read): the comparison proves that what readers get equals what was hashed, the fsyncs waited
//! for before the marker put it on the disk, and neither re-reads the disk itself. On a
//! filesystem whose timestamps are coarse (not the multigrain ones of Linux 6.13 and later on
//! ext4, XFS, Btrfs and tmpfs), a write in the same clock tick as the copy's stat of a file
//! that had already changed in that tick does not move its stamp; the comparison still catches
//! it unless a second write in that tick put back the bytes the copy had read (the published
//! file then equals the source but was maybe never a whole state of it; it still matches its
//! manifest line).

mod manifest;
mod pipe;
mod scan;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, mpsc};

use rustix::fs::{AtFlags, Gid, Mode, OFlags, Statx, StatxTimestamp, Timespec, Timestamps, Uid};
use rustix::io::Errno;
use sha2::{Digest, Sha256};

use crate::at::{self, Keep, Kind, MAX_DEPTH, Mount, RelPath};
use crate::beneath::TreeDir;
use crate::error::{Error, Problem};
use manifest::Digests;
use pipe::{HashPipe, SyncQueue, Syncer};
use scan::{Against, Check, Stamp};

/// The completion marker at the volume root: the measured byte count, decimal, newline.
pub const MARKER: &str = ".nvsnap-complete";
/// The manifest at the volume root (`sha256sum -c` format).
pub const MANIFEST: &str = ".nvsnap-manifest";
/// The staging directories at the volume root: this prefix and the attempt name.
pub const STAGING_PREFIX: &str = ".nvsnap-staging-";

const MARKER_C: &CStr = c".nvsnap-complete";
const MANIFEST_C: &CStr = c".nvsnap-manifest";
/// The marker is a decimal `u64` and a newline: at most 21 bytes.
const MARKER_MAX: u64 = 32;

/// What [`copy_tree`] published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyReport {
    /// `du -sb` of the published tree, the marker and the manifest left out (the marker holds it).
    pub bytes: u64,
    /// Regular files copied.
    pub files: u64,
    /// Symbolic links recreated.
    pub symlinks: u64,
    /// Directories created (the root not counted).
    pub dirs: u64,
    /// Hex SHA-256 of the manifest file.
    pub manifest_sha256: String,
}

/// What [`verify_manifest`] checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// Regular files hashed (all of them listed).
    pub files: u64,
    /// Their bytes.
    pub file_bytes: u64,
}

/// Copies the untrusted tree at `source` into the volume root `dest_root` as attempt `attempt`
/// (1 to 40 of `[a-z0-9-]`), publishes it, writes and verifies the manifest, and writes the
/// marker last. On any error the root holds no marker; running it again (same or another
/// attempt name) converges. See the module documentation for the steps.
///
/// `source` and `dest_root` are the caller's paths: their last component must not be a symbolic
/// link (the components above are resolved by the kernel and must be trusted). Hard links in the
/// source are copied as separate files; the root directory's own mode and owner are left alone.
pub fn copy_tree(source: &Path, dest_root: &Path, attempt: &str) -> Result<CopyReport, Error> {
    copy_tree_checked(source, dest_root, attempt, None)
}

/// [`copy_tree`] into the root of a mounted volume: the destination root, once opened, must be
/// the root of the mount `mounts` shows on top at `dest_root` (by mount id), checked on the
/// descriptor every write then goes through, before anything is touched. So a volume the kubelet
/// has not mounted yet, or unmounted (or replaced) between the caller's read of the mount table
/// and the copy, is refused with [`Error::NotAVolumeRoot`] instead of filled on the node's disk.
///
/// # Errors
///
/// As [`copy_tree`], and [`Error::NotAVolumeRoot`].
pub fn copy_tree_into_mount(
    source: &Path,
    dest_root: &Path,
    attempt: &str,
    mounts: &[crate::mounts::MountInfo],
) -> Result<CopyReport, Error> {
    copy_tree_checked(source, dest_root, attempt, Some(mounts))
}

/// [`copy_tree_into_mount`] from a directory opened beneath a trusted root
/// ([`crate::open_dir_beneath`]): the source is walked from that descriptor, so no path to it is
/// resolved again (a symbolic link the tree's owner swaps into the path afterwards changes
/// nothing).
///
/// # Errors
///
/// As [`copy_tree_into_mount`].
pub fn copy_dir_into_mount(
    source: &TreeDir,
    dest_root: &Path,
    attempt: &str,
    mounts: &[crate::mounts::MountInfo],
) -> Result<CopyReport, Error> {
    let a = Attempt::begin_from(
        source.path(),
        Some(source),
        dest_root,
        attempt,
        Some(mounts),
    )?;
    run_attempt(a)
}

/// [`copy_dir_into_mount`] of only the entries `keep` selects ([`Keep`]): an entry left out is
/// never opened, a directory left out never entered, symbolic links and non-UTF-8 names are left
/// out; the report, the manifest and the marker are those of the selected tree. Nothing
/// selected is a complete copy of an empty tree.
///
/// # Errors
///
/// As [`copy_dir_into_mount`] (a special file the selection takes is refused as there).
pub fn copy_dir_into_mount_selected(
    source: &TreeDir,
    dest_root: &Path,
    attempt: &str,
    mounts: &[crate::mounts::MountInfo],
    keep: &Keep,
) -> Result<CopyReport, Error> {
    let mut a = Attempt::begin_from(
        source.path(),
        Some(source),
        dest_root,
        attempt,
        Some(mounts),
    )?;
    a.keep = Some(keep);
    run_attempt(a)
}

/// [`copy_tree`] of only the entries `keep` selects, as [`copy_dir_into_mount_selected`] does.
///
/// # Errors
///
/// As [`copy_tree`].
pub fn copy_tree_selected(
    source: &Path,
    dest_root: &Path,
    attempt: &str,
    keep: &Keep,
) -> Result<CopyReport, Error> {
    let mut a = Attempt::begin(source, dest_root, attempt, None)?;
    a.keep = Some(keep);
    run_attempt(a)
}

fn copy_tree_checked(
    source: &Path,
    dest_root: &Path,
    attempt: &str,
    mounts: Option<&[crate::mounts::MountInfo]>,
) -> Result<CopyReport, Error> {
    run_attempt(Attempt::begin(source, dest_root, attempt, mounts)?)
}

fn run_attempt(mut a: Attempt<'_>) -> Result<CopyReport, Error> {
    match a.run() {
        Ok(report) => Ok(report),
        Err(e) => {
            // Best effort: free the space of a staging directory that will never be published
            // (a retry removes it anyway). The original error is what matters.
            let _ = at::remove_entry(&a.root_fd, &a.staging_name, a.root_mount, &a.staging_path);
            Err(e)
        }
    }
}

/// Re-hashes every regular file under `root` against its `.nvsnap-manifest`, and checks that
/// the root holds exactly the listed regular files (besides the marker and the manifest) and no
/// device, FIFO or socket. The error names the first differing, missing or extra path (in byte
/// order). Symbolic links are not in the manifest and not checked.
pub fn verify_manifest(root: &Path) -> Result<VerifyReport, Error> {
    let fd = at::open_root_dir(root)?;
    let listed = read_manifest(fd.as_fd(), root)?;
    let found = scan::scan(fd.as_fd(), root, &[MARKER_C, MANIFEST_C], &Check::Hash)?;
    compare_files(root, &listed, &found)?;
    Ok(VerifyReport {
        files: found.files.len() as u64,
        file_bytes: found.file_bytes,
    })
}

/// The byte count in the completion marker under `root`, or `None` when there is none. The
/// marker must be a regular file (not a link) holding a decimal number and a newline; anything
/// else is an error. At most 32 bytes are read.
pub fn is_complete(root: &Path) -> Result<Option<u64>, Error> {
    let fd = at::open_root_dir(root)?;
    let path = root.join(MARKER);
    let marker = match rustix::fs::openat(
        &fd,
        MARKER_C,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(m) => m,
        Err(Errno::NOENT) => return Ok(None),
        Err(Errno::LOOP) => {
            return Err(Error::Marker {
                path,
                reason: "is a symbolic link",
            });
        }
        Err(e) => return Err(Error::io("open file (no symlinks)", path, e)),
    };
    let st = at::stat_fd(&marker, || path.clone())?;
    if Kind::of(&st) != Kind::File {
        return Err(Error::Marker {
            path,
            reason: "is not a regular file",
        });
    }
    let mut text = Vec::new();
    File::from(marker)
        .take(MARKER_MAX)
        .read_to_end(&mut text)
        .map_err(|e| Error::io("read", &path, e))?;
    parse_marker(&text).map(Some).ok_or(Error::Marker {
        path,
        reason: "does not hold a decimal byte count and a newline",
    })
}

fn parse_marker(text: &[u8]) -> Option<u64> {
    let digits = text.strip_suffix(b"\n")?;
    let leading_zero = digits.len() > 1 && digits.first() == Some(&b'0');
    if digits.is_empty() || leading_zero || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// Whether `attempt` is 1 to 40 of `[a-z0-9-]`.
fn valid_attempt(attempt: &str) -> bool {
    (1..=40).contains(&attempt.len())
        && attempt
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Source root entries that are never copied: the copier writes its own.
fn reserved(name: &CStr) -> bool {
    let b = name.to_bytes();
    b == MARKER.as_bytes() || b == MANIFEST.as_bytes() || b.starts_with(STAGING_PREFIX.as_bytes())
}

/// What the copy step recreated.
#[derive(Debug, Default)]
pub(crate) struct Copied {
    /// The SHA-256 of the bytes read from each file's source (and written).
    pub(crate) files: Digests,
    /// Each file's source as the copy opened it, before the first read.
    pub(crate) sources: BTreeMap<Vec<u8>, Stamp>,
    pub(crate) symlinks: BTreeMap<Vec<u8>, Vec<u8>>,
    pub(crate) dirs: BTreeSet<Vec<u8>>,
}

/// One copy attempt, step by step.
pub(crate) struct Attempt<'a> {
    source: &'a Path,
    dest_root: &'a Path,
    src_fd: OwnedFd,
    root_fd: OwnedFd,
    root_mount: Mount,
    staging_name: CString,
    staging_path: PathBuf,
    staging_fd: OwnedFd,
    /// Temporary names of the manifest and the marker (`<staging>.manifest`, `<staging>.complete`:
    /// `.` is not an attempt character, so they never collide with a staging directory, and their
    /// prefix keeps them out of any copy).
    manifest_tmp: CString,
    marker_tmp: CString,
    copied: Copied,
    manifest: Vec<u8>,
    /// Running from the copy step until [`Attempt::wait_durable`].
    syncer: Option<Syncer>,
    /// The selection of the source's entries, if any ([`Keep`]).
    keep: Option<&'a Keep>,
}

impl<'a> Attempt<'a> {
    /// Step 1 (see the module documentation).
    pub(crate) fn begin(
        source: &'a Path,
        dest_root: &'a Path,
        attempt: &str,
        mounts: Option<&[crate::mounts::MountInfo]>,
    ) -> Result<Self, Error> {
        Self::begin_from(source, None, dest_root, attempt, mounts)
    }

    /// Step 1, the source either opened at `source` or, when given, the already opened `tree`
    /// (`source` is then only its name in messages).
    pub(crate) fn begin_from(
        source: &'a Path,
        tree: Option<&TreeDir>,
        dest_root: &'a Path,
        attempt: &str,
        mounts: Option<&[crate::mounts::MountInfo]>,
    ) -> Result<Self, Error> {
        if !valid_attempt(attempt) {
            return Err(Error::InvalidAttempt {
                attempt: attempt.to_string(),
            });
        }
        let overlap = || Error::Overlap {
            tree: source.to_path_buf(),
            dest_root: dest_root.to_path_buf(),
        };
        let canon_src = match tree {
            Some(t) => crate::beneath::resolved(t)?,
            None => std::fs::canonicalize(source).map_err(|e| Error::io("resolve", source, e))?,
        };
        let canon_dst =
            std::fs::canonicalize(dest_root).map_err(|e| Error::io("resolve", dest_root, e))?;
        if canon_src.starts_with(&canon_dst) || canon_dst.starts_with(&canon_src) {
            return Err(overlap());
        }
        let src_fd = match tree {
            Some(t) => t
                .fd()
                .try_clone_to_owned()
                .map_err(|e| Error::io("duplicate the directory descriptor", source, e))?,
            None => at::open_root_dir(source)?,
        };
        let root_fd = at::open_root_dir(dest_root)?;
        let src_st = at::stat_fd(&src_fd, || source.to_path_buf())?;
        let root_st = at::stat_fd(&root_fd, || dest_root.to_path_buf())?;
        if at::inode(&src_st) == at::inode(&root_st) {
            return Err(overlap());
        }
        if let Some(mounts) = mounts {
            crate::open::on_top_mount(&root_st, mounts, dest_root)?;
        }
        let root_mount = Mount::of(&root_st);

        // The marker goes first, durably, before anything else in the root is touched.
        let marker_path = dest_root.join(MARKER);
        at::remove_entry(&root_fd, MARKER_C, root_mount, &marker_path)?;
        at::fsync(&root_fd, dest_root)?;

        let staging = format!("{STAGING_PREFIX}{attempt}");
        let staging_path = dest_root.join(&staging);
        let staging_name = at::c_name(staging.as_bytes(), || staging_path.clone())?;
        let manifest_tmp = at::c_name(format!("{staging}.manifest").as_bytes(), || {
            staging_path.clone()
        })?;
        let marker_tmp = at::c_name(format!("{staging}.complete").as_bytes(), || {
            staging_path.clone()
        })?;
        at::remove_entry(&root_fd, &staging_name, root_mount, &staging_path)?;
        rustix::fs::mkdirat(&root_fd, &staging_name, Mode::RWXU)
            .map_err(|e| Error::io("create directory", &staging_path, e))?;
        let staging_fd = at::open_dir_at(&root_fd, &staging_name, || staging_path.clone())?;
        Ok(Attempt {
            source,
            dest_root,
            src_fd,
            root_fd,
            root_mount,
            staging_name,
            staging_path,
            staging_fd,
            manifest_tmp,
            marker_tmp,
            copied: Copied::default(),
            manifest: Vec::new(),
            syncer: None,
            keep: None,
        })
    }

    /// Steps 2 to 6.
    fn run(&mut self) -> Result<CopyReport, Error> {
        self.copy()?;
        self.publish()?;
        self.write_manifest()?;
        let bytes = self.verify()?;
        self.wait_durable()?;
        self.mark(bytes)?;
        Ok(CopyReport {
            bytes,
            files: self.copied.files.len() as u64,
            symlinks: self.copied.symlinks.len() as u64,
            dirs: self.copied.dirs.len() as u64,
            manifest_sha256: hex::encode(Sha256::digest(&self.manifest)),
        })
    }

    /// Step 2: the source into the staging directory, everything fsynced.
    ///
    /// The main thread walks the source and creates every entry; regular files go to a pool of
    /// workers (one per core, at most four), each copying a file at a time with a hashing thread
    /// of its own; a syncing thread fsyncs finished files and directories. All are joined here.
    pub(crate) fn copy(&mut self) -> Result<(), Error> {
        let workers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, 4);
        let syncer = Syncer::start(&self.staging_path)?;
        let sync = syncer.queue();
        let (job_tx, job_rx) = mpsc::sync_channel::<FileJob>(workers);
        let job_rx = Mutex::new(job_rx);
        let (done_tx, done_rx) = mpsc::channel::<FileCopied>();
        let failed = AtomicBool::new(false);
        let src_mount = Mount::of(&at::stat_fd(&self.src_fd, || self.source.to_path_buf())?);
        let mut copied = Copied::default();
        let staging = self.staging_path.as_path();
        let walked = std::thread::scope(|s| {
            for _ in 0..workers {
                let (hash, hash_worker) = pipe::hash_pipe();
                pipe::spawn_scoped(s, "nodefs-hash", staging, move || hash_worker.run())?;
                let (jobs, sync, done, failed) = (&job_rx, sync.clone(), done_tx.clone(), &failed);
                pipe::spawn_scoped(s, "nodefs-copy", staging, move || {
                    file_worker(jobs, &hash, &sync, &done, failed)
                })?;
            }
            // On an early return above, the queues dropped with this closure stop the threads
            // already started.
            drop(done_tx);
            let mut c = Copier {
                source: self.source,
                staging: &self.staging_path,
                src_mount,
                jobs: job_tx,
                sync,
                failed: &failed,
                copied: &mut copied,
                keep: self.keep,
            };
            let walked = c
                .dir(
                    self.src_fd.as_fd(),
                    self.staging_fd.as_fd(),
                    &mut RelPath::default(),
                    0,
                )
                .and_then(|()| at::fsync(&self.staging_fd, &self.staging_path));
            // Dropping the copier closes the job queue: the workers finish what is queued and
            // stop, dropping their sync queues.
            drop(c);
            walked
        });
        let mut errors: Vec<Error> = walked.err().into_iter().collect();
        for done in done_rx {
            match done {
                Ok((rel, digest, stamp)) => {
                    copied.sources.insert(rel.clone(), stamp);
                    copied.files.insert(rel, digest);
                }
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            self.copied = copied;
            self.syncer = Some(syncer);
            return Ok(());
        }
        // A failed fsync is found only by waiting for the syncing thread.
        errors.extend(syncer.wait().err());
        // The cause, rather than a thread that stopped because of it.
        let (mut cause, mut stopped) = (None, None);
        for e in errors {
            match e {
                Error::Worker { .. } => stopped.get_or_insert(e),
                e => cause.get_or_insert(e),
            };
        }
        cause.or(stopped).map_or(Ok(()), Err)
    }

    /// Every file and directory copied is on disk: waits for the syncing thread, whose fsyncs ran
    /// alongside publishing and verification.
    pub(crate) fn wait_durable(&mut self) -> Result<(), Error> {
        match self.syncer.take() {
            Some(syncer) => syncer.wait(),
            None => Ok(()),
        }
    }

    /// Step 3: replace the root's content with the staging directory's.
    pub(crate) fn publish(&mut self) -> Result<(), Error> {
        let root = self.dest_root;
        for name in at::list_dir(&self.root_fd, || root.to_path_buf())? {
            if name != self.staging_name {
                let path = root.join(OsStr::from_bytes(name.to_bytes()));
                at::remove_entry(&self.root_fd, &name, self.root_mount, &path)?;
            }
        }
        at::fsync(&self.root_fd, root)?;
        for name in at::list_dir(&self.staging_fd, || self.staging_path.clone())? {
            // renameat never follows a link, neither the entry's nor one at the new name (which
            // the removal above cleared: a link planted there would be replaced, not written
            // through).
            rustix::fs::renameat(&self.staging_fd, &name, &self.root_fd, &name).map_err(|e| {
                Error::io(
                    "rename into the root",
                    self.staging_path.join(OsStr::from_bytes(name.to_bytes())),
                    e,
                )
            })?;
        }
        rustix::fs::unlinkat(&self.root_fd, &self.staging_name, AtFlags::REMOVEDIR)
            .map_err(|e| Error::io("remove directory", &self.staging_path, e))?;
        at::fsync(&self.root_fd, root)
    }

    /// Step 4.
    pub(crate) fn write_manifest(&mut self) -> Result<(), Error> {
        self.manifest = manifest::format(&self.copied.files);
        write_replace(
            self.root_fd.as_fd(),
            self.dest_root,
            self.root_mount,
            &self.manifest_tmp,
            MANIFEST_C,
            &self.manifest,
        )
    }

    /// Step 5: returns the measured bytes of the published tree.
    pub(crate) fn verify(&self) -> Result<u64, Error> {
        let root = self.dest_root;
        let listed = read_manifest(self.root_fd.as_fd(), root)?;
        if let Some(path) = first_difference(&listed, &self.copied.files) {
            return Err(verify_error(root, &path, Problem::ManifestDiffers));
        }
        let check = Check::Source(Against {
            src_fd: self.src_fd.as_fd(),
            source: self.source,
            copied: &self.copied,
        });
        let found = scan::scan(self.root_fd.as_fd(), root, &[MARKER_C, MANIFEST_C], &check)?;
        compare_files(root, &listed, &found)?;
        let mut problems = Vec::new();
        problems.extend(
            found
                .source_changed
                .first()
                .map(|p| (p.clone(), Problem::SourceChanged)),
        );
        problems.extend(first_in_maps(
            &self.copied.symlinks,
            &found.symlinks,
            |_, _| Problem::LinkTarget,
        ));
        problems.extend(first_in_sets(&self.copied.dirs, &found.dirs));
        if let Some((path, problem)) = problems.into_iter().min_by(|a, b| a.0.cmp(&b.0)) {
            return Err(verify_error(root, &path, problem));
        }
        Ok(found.bytes)
    }

    /// Step 6.
    pub(crate) fn mark(&self, bytes: u64) -> Result<(), Error> {
        write_replace(
            self.root_fd.as_fd(),
            self.dest_root,
            self.root_mount,
            &self.marker_tmp,
            MARKER_C,
            format!("{bytes}\n").as_bytes(),
        )
    }
}

/// Writes `bytes` to `tmp` (created exclusively, no link followed, mode 0644), fsyncs it,
/// renames it over `name` and fsyncs the root.
fn write_replace(
    root_fd: BorrowedFd<'_>,
    root: &Path,
    mount: Mount,
    tmp: &CStr,
    name: &CStr,
    bytes: &[u8],
) -> Result<(), Error> {
    let tmp_path = root.join(OsStr::from_bytes(tmp.to_bytes()));
    at::remove_entry(root_fd, tmp, mount, &tmp_path)?;
    let fd = create_file(root_fd, tmp, &tmp_path)?;
    rustix::fs::fchmod(&fd, Mode::from_bits_truncate(0o644))
        .map_err(|e| Error::io("chmod", &tmp_path, e))?;
    let mut file = File::from(fd);
    file.write_all(bytes)
        .map_err(|e| Error::io("write", &tmp_path, e))?;
    at::fsync(&file, &tmp_path)?;
    drop(file);
    rustix::fs::renameat(root_fd, tmp, root_fd, name)
        .map_err(|e| Error::io("rename", &tmp_path, e))?;
    at::fsync(root_fd, root)
}

/// `openat(O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW)`: a new file or an error, never an existing file
/// and never through a link.
fn create_file(dirfd: BorrowedFd<'_>, name: &CStr, path: &Path) -> Result<OwnedFd, Error> {
    rustix::fs::openat(
        dirfd,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::RUSR | Mode::WUSR,
    )
    .map_err(|e| Error::io("create file (exclusive, no symlinks)", path, e))
}

fn read_manifest(root_fd: BorrowedFd<'_>, root: &Path) -> Result<Digests, Error> {
    let path = root.join(MANIFEST);
    let (file, st) = at::open_file_at(root_fd, MANIFEST_C, || path.clone())?;
    if st.stx_size > manifest::MAX_MANIFEST_BYTES {
        return Err(Error::Manifest {
            path,
            line: 0,
            reason: "larger than 64 MiB",
        });
    }
    let mut text = Vec::new();
    file.take(manifest::MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(|e| Error::io("read", &path, e))?;
    if text.len() as u64 > manifest::MAX_MANIFEST_BYTES {
        return Err(Error::Manifest {
            path,
            line: 0,
            reason: "larger than 64 MiB",
        });
    }
    manifest::parse(&text, &path)
}

fn verify_error(root: &Path, rel: &[u8], problem: Problem) -> Error {
    Error::Verify {
        root: root.to_path_buf(),
        path: PathBuf::from(OsStr::from_bytes(rel)),
        problem,
    }
}

/// The listed regular files against the found ones, and no special files.
fn compare_files(root: &Path, listed: &Digests, found: &scan::Scan) -> Result<(), Error> {
    let files = first_in_maps(listed, &found.files, |want, got| Problem::Differs {
        expected: hex::encode(want),
        actual: hex::encode(got),
    })
    .map(|(path, problem)| match (problem, found.other_kind(&path)) {
        // A listed file that is there as something else: say what it is.
        (Problem::Missing, Some(kind)) => (path, Problem::NotRegular { kind }),
        (problem, _) => (path, problem),
    });
    let special = found
        .special
        .keys()
        .next()
        .map(|p| (p.clone(), Problem::Extra));
    match [files, special]
        .into_iter()
        .flatten()
        .min_by(|a, b| a.0.cmp(&b.0))
    {
        Some((path, problem)) => Err(verify_error(root, &path, problem)),
        None => Ok(()),
    }
}

/// The first key (in byte order) where two maps differ: missing from `found`, extra in it, or a
/// different value (`differs`).
fn first_in_maps<V: PartialEq>(
    want: &BTreeMap<Vec<u8>, V>,
    found: &BTreeMap<Vec<u8>, V>,
    differs: impl Fn(&V, &V) -> Problem,
) -> Option<(Vec<u8>, Problem)> {
    let missing = want
        .keys()
        .find(|k| !found.contains_key(*k))
        .map(|k| (k.clone(), Problem::Missing));
    let extra = found
        .keys()
        .find(|k| !want.contains_key(*k))
        .map(|k| (k.clone(), Problem::Extra));
    let changed = want.iter().find_map(|(k, v)| {
        found
            .get(k)
            .filter(|g| *g != v)
            .map(|g| (k.clone(), differs(v, g)))
    });
    [missing, extra, changed]
        .into_iter()
        .flatten()
        .min_by(|a, b| a.0.cmp(&b.0))
}

fn first_in_sets(
    want: &BTreeSet<Vec<u8>>,
    found: &BTreeSet<Vec<u8>>,
) -> Option<(Vec<u8>, Problem)> {
    let missing = want
        .difference(found)
        .next()
        .map(|k| (k.clone(), Problem::Missing));
    let extra = found
        .difference(want)
        .next()
        .map(|k| (k.clone(), Problem::Extra));
    [missing, extra]
        .into_iter()
        .flatten()
        .min_by(|a, b| a.0.cmp(&b.0))
}

fn first_difference(a: &Digests, b: &Digests) -> Option<Vec<u8>> {
    first_in_maps(a, b, |_, _| Problem::ManifestDiffers).map(|(p, _)| p)
}

/// One file copied: its relative path, the SHA-256 of its source bytes, and its source's stamp
/// as opened (before the first read).
type FileCopied = Result<(Vec<u8>, [u8; 32], Stamp), Error>;

/// A regular file to copy: both ends open, the destination created (empty) by the walker.
struct FileJob {
    src: File,
    dst: File,
    st: Statx,
    rel: Vec<u8>,
    src_path: PathBuf,
    dst_path: PathBuf,
}

/// Copies the queued files until the queue closes; after a failure anywhere (`failed`) the rest
/// is only drained.
fn file_worker(
    jobs: &Mutex<mpsc::Receiver<FileJob>>,
    hash: &HashPipe,
    sync: &SyncQueue,
    done: &mpsc::Sender<FileCopied>,
    failed: &AtomicBool,
) {
    loop {
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        if failed.load(Ordering::Relaxed) {
            continue;
        }
        let result = copy_file(job, hash, sync);
        if result.is_err() {
            failed.store(true, Ordering::Relaxed);
        }
        if done.send(result).is_err() {
            return;
        }
    }
}

fn copy_file(mut job: FileJob, hash: &HashPipe, sync: &SyncQueue) -> FileCopied {
    // Readahead for a source that is not in the page cache; advisory, so a failure is ignored.
    let _ = rustix::fs::fadvise(&job.src, 0, None, rustix::fs::Advice::Sequential);
    let (digest, _) = hash.copy(&mut job.src, &mut job.dst, &job.src_path, &job.dst_path)?;
    let fd = OwnedFd::from(job.dst);
    set_metadata(&fd, &job.st, &job.dst_path)?;
    sync.push(job.dst_path, fd)?;
    Ok((job.rel, digest, Stamp::of(&job.st)))
}

/// The copy step's walker.
struct Copier<'a> {
    source: &'a Path,
    staging: &'a Path,
    src_mount: Mount,
    jobs: mpsc::SyncSender<FileJob>,
    sync: SyncQueue,
    failed: &'a AtomicBool,
    copied: &'a mut Copied,
    keep: Option<&'a Keep>,
}

impl Copier<'_> {
    fn dir(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        rel: &mut RelPath,
        depth: usize,
    ) -> Result<(), Error> {
        if depth > MAX_DEPTH {
            return Err(Error::TooDeep {
                path: rel.under(self.source),
                max: MAX_DEPTH,
            });
        }
        let source = self.source;
        for name in at::list_dir(src, || rel.under(source))? {
            if rel.is_root() && reserved(&name) {
                continue;
            }
            if self.failed.load(Ordering::Relaxed) {
                // A file worker failed: its error is the one reported; stop walking.
                return Ok(());
            }
            // Left out by the selection: never opened (nor even looked at).
            let len = rel.push(&name);
            let selected = rel.selected(self.keep);
            rel.truncate(len);
            if !selected {
                continue;
            }
            let st = at::stat_at(src, &name, || at::child(source, rel, &name))?;
            if self.keep.is_some() && Kind::of(&st) == Kind::Symlink {
                continue;
            }
            let len = rel.push(&name);
            let src_path = || rel.under(source);
            match Kind::of(&st) {
                Kind::Dir => {
                    if !Mount::of(&st).same(self.src_mount) {
                        return Err(Error::CrossesMount { path: src_path() });
                    }
                    let sfd = at::open_dir_at(src, &name, src_path)?;
                    // The opened directory is authoritative for its metadata.
                    let sst = at::stat_fd(&sfd, src_path)?;
                    if !Mount::of(&sst).same(self.src_mount) {
                        return Err(Error::CrossesMount { path: src_path() });
                    }
                    let dst_path = rel.under(self.staging);
                    rustix::fs::mkdirat(dst, &name, Mode::RWXU)
                        .map_err(|e| Error::io("create directory", &dst_path, e))?;
                    let dfd = at::open_dir_at(dst, &name, || dst_path.clone())?;
                    self.copied.dirs.insert(rel.bytes().to_vec());
                    self.dir(sfd.as_fd(), dfd.as_fd(), rel, depth + 1)?;
                    // After the children: creating them changed the directory's mtime.
                    set_metadata(&dfd, &sst, &dst_path)?;
                    self.sync.push(dst_path, dfd)?;
                }
                Kind::File => {
                    let (sfile, sst) = at::open_file_at(src, &name, src_path)?;
                    let dst_path = rel.under(self.staging);
                    let dfile = File::from(create_file(dst, &name, &dst_path)?);
                    let job = FileJob {
                        src: sfile,
                        dst: dfile,
                        st: sst,
                        rel: rel.bytes().to_vec(),
                        src_path: src_path(),
                        dst_path,
                    };
                    self.jobs.send(job).map_err(|e| Error::Worker {
                        path: e.0.src_path,
                        worker: "copying",
                    })?;
                }
                Kind::Symlink => {
                    let target = rustix::fs::readlinkat(src, &name, Vec::new())
                        .map_err(|e| Error::io("read symbolic link", src_path(), e))?;
                    let dst_path = rel.under(self.staging);
                    rustix::fs::symlinkat(&target, dst, &name)
                        .map_err(|e| Error::io("create symbolic link", &dst_path, e))?;
                    rustix::fs::chownat(dst, &name, uid(&st), gid(&st), AtFlags::SYMLINK_NOFOLLOW)
                        .map_err(|e| Error::io("chown (no symlinks)", &dst_path, e))?;
                    rustix::fs::utimensat(dst, &name, &times(&st), AtFlags::SYMLINK_NOFOLLOW)
                        .map_err(|e| Error::io("set times (no symlinks)", &dst_path, e))?;
                    self.copied
                        .symlinks
                        .insert(rel.bytes().to_vec(), target.into_bytes());
                }
                Kind::Special(kind) => {
                    return Err(Error::SpecialFile {
                        path: src_path(),
                        kind,
                    });
                }
            }
            rel.truncate(len);
        }
        Ok(())
    }
}

/// Owner, permission bits (setuid, setgid and sticky cleared) and times of the source, in that
/// order (a chown may clear mode bits; a chmod does not change the times).
fn set_metadata(fd: &OwnedFd, st: &Statx, path: &Path) -> Result<(), Error> {
    rustix::fs::fchown(fd, uid(st), gid(st)).map_err(|e| Error::io("chown", path, e))?;
    rustix::fs::fchmod(fd, Mode::from_bits_truncate(u32::from(st.stx_mode) & 0o777))
        .map_err(|e| Error::io("chmod", path, e))?;
    rustix::fs::futimens(fd, &times(st)).map_err(|e| Error::io("set times", path, e))
}

fn uid(st: &Statx) -> Option<Uid> {
    Some(Uid::from_raw(st.stx_uid))
}

fn gid(st: &Statx) -> Option<Gid> {
    Some(Gid::from_raw(st.stx_gid))
}

fn times(st: &Statx) -> Timestamps {
    fn ts(t: &StatxTimestamp) -> Timespec {
        Timespec {
            tv_sec: t.tv_sec,
            tv_nsec: i64::from(t.tv_nsec),
        }
    }
    Timestamps {
        last_access: ts(&st.stx_atime),
        last_modification: ts(&st.stx_mtime),
    }
}

#[cfg(test)]
mod tests;
