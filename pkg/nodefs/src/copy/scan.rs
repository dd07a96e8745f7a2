//! Reading a published tree back: every entry beneath the volume root on descriptors (no
//! symbolic link followed, no mount crossed), every regular file checked (on as many threads as
//! there are cores, up to four), and the tree measured as `du -sb` would.
//!
//! A file is checked one of two ways ([`Check`]):
//!
//! - **Hashed again** ([`Check::Hash`], [`crate::verify_manifest`]): its SHA-256 is computed.
//! - **Compared with its source** ([`Check::Source`], the copy's own verification): the source
//!   file is opened again beneath the source's directory descriptors the way the copy opened it
//!   (one name at a time, `O_NOFOLLOW`; a link, a missing entry or another kind of file there is
//!   a changed source), must still be the inode the copy read with the same size, modification
//!   and change times ([`Stamp`]), and the published file must equal it byte for byte, the stamp
//!   unchanged after the comparison too. An unchanged stamp from before the copy's first read to
//!   after the comparison's last means nothing wrote the source in between (every write moves its
//!   change time), so the bytes compared are the bytes the copy hashed and wrote: the published
//!   file has the SHA-256 its manifest line says, without a second SHA-256 pass. When a
//!   comparison fails, the published file is hashed after all, to tell a changed source (the
//!   published file still has its digest) from a published file that differs from it.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CStr;
use std::fs::File;
use std::io::Seek;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::mpsc;

use rustix::fs::{Statx, StatxTimestamp};
use rustix::io::Errno;

use crate::at::{self, Kind, MAX_DEPTH, Mount, RelPath};
use crate::copy::Copied;
use crate::copy::manifest::Digests;
use crate::copy::pipe::{self, CHUNK};
use crate::error::Error;
use crate::measure::Measure;

/// How the regular files of a scanned tree are checked.
pub(crate) enum Check<'a> {
    /// Every regular file hashed again.
    Hash,
    /// Every copied file compared with its source (see the module documentation); a file that
    /// was not copied (an extra one) is hashed.
    Source(Against<'a>),
}

/// The source a published tree is compared with.
pub(crate) struct Against<'a> {
    /// The source's root directory, as the copy walked it.
    pub(crate) src_fd: BorrowedFd<'a>,
    /// Its path, for messages.
    pub(crate) source: &'a Path,
    /// What the copy recreated, with each file's digest and source stamp.
    pub(crate) copied: &'a Copied,
}

/// What says a source file is the one the copy read, unchanged: the inode, its size, and its
/// modification and change times (any write moves the change time, and no caller can set it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    inode: (u32, u32, u64),
    size: u64,
    mtime: (i64, u32),
    ctime: (i64, u32),
}

impl Stamp {
    pub(crate) fn of(st: &Statx) -> Stamp {
        fn t(ts: &StatxTimestamp) -> (i64, u32) {
            (ts.tv_sec, ts.tv_nsec)
        }
        Stamp {
            inode: at::inode(st),
            size: st.stx_size,
            mtime: t(&st.stx_mtime),
            ctime: t(&st.stx_ctime),
        }
    }
}

/// What a published tree holds.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// Regular files and their digests.
    pub(crate) files: Digests,
    /// Bytes of regular files hashed.
    pub(crate) file_bytes: u64,
    /// Symbolic links and their targets.
    pub(crate) symlinks: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Directories (the root not included).
    pub(crate) dirs: BTreeSet<Vec<u8>>,
    /// Anything else (devices, FIFOs, sockets) and its kind.
    pub(crate) special: BTreeMap<Vec<u8>, &'static str>,
    /// `du -sb` of the tree without the skipped root names.
    pub(crate) bytes: u64,
    /// Copied entries whose source changed since the copy read it ([`Check::Source`] only): a
    /// file whose source is gone, is another inode or kind of entry, or has another stamp or
    /// other bytes; a directory whose source cannot be opened as the same mount's directory.
    pub(crate) source_changed: BTreeSet<Vec<u8>>,
}

impl Scan {
    /// The kind of a non-regular entry at `path`, if there is one.
    pub(crate) fn other_kind(&self, path: &[u8]) -> Option<&'static str> {
        if self.dirs.contains(path) {
            Some(Kind::Dir.name())
        } else if self.symlinks.contains_key(path) {
            Some(Kind::Symlink.name())
        } else {
            self.special.get(path).copied()
        }
    }
}

/// A published regular file to check.
struct Job {
    rel: Vec<u8>,
    path: PathBuf,
    file: File,
    /// Its source to compare it with, if it is compared rather than hashed.
    source: Option<SourceFile>,
}

/// A source file opened again, and what the copy recorded of it.
struct SourceFile {
    file: File,
    path: PathBuf,
    stamp: Stamp,
    digest: [u8; 32],
}

/// One file checked: its path, the SHA-256 it is known to have (computed, or proven equal to the
/// copy's by the comparison), its bytes, and whether its source changed.
struct Checked {
    rel: Vec<u8>,
    digest: [u8; 32],
    bytes: u64,
    source_changed: bool,
}

/// Scans the tree under `root_fd` (a directory at `root`), leaving out the root entries named in
/// `skip`, checking its regular files as `check` says.
pub(crate) fn scan(
    root_fd: BorrowedFd<'_>,
    root: &Path,
    skip: &[&CStr],
    check: &Check<'_>,
) -> Result<Scan, Error> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 4);
    let root_st = at::stat_fd(root_fd, || root.to_path_buf())?;
    let mut out = Scan::default();
    let mut measure = Measure::default();
    measure.count(&root_st);
    let (job_tx, job_rx) = mpsc::sync_channel::<Job>(2 * workers);
    let job_rx = Mutex::new(job_rx);
    let (done_tx, done_rx) = mpsc::channel::<Result<Checked, Error>>();
    let against = match check {
        Check::Hash => None,
        Check::Source(a) => Some(a),
    };
    let src_mount = match against {
        Some(a) => Some(Mount::of(&at::stat_fd(a.src_fd, || {
            a.source.to_path_buf()
        })?)),
        None => None,
    };
    let walked = std::thread::scope(|s| {
        for _ in 0..workers {
            let (job_rx, done_tx) = (&job_rx, done_tx.clone());
            pipe::spawn_scoped(s, "nodefs-verify", root, move || {
                check_jobs(job_rx, &done_tx)
            })?;
        }
        drop(done_tx);
        let mut walker = Walker {
            root,
            skip,
            mount: Mount::of(&root_st),
            against,
            src_mount,
            jobs: job_tx,
            scan: &mut out,
            measure: &mut measure,
        };
        let src = against.map(|a| a.src_fd);
        let walked = walker.dir(root_fd, src, &mut RelPath::default(), 0);
        // Closing the queue lets the workers finish what is queued and stop.
        drop(walker);
        walked
    });
    let mut first_err = walked.err();
    for done in done_rx {
        match done {
            Ok(c) => {
                if c.source_changed {
                    out.source_changed.insert(c.rel.clone());
                }
                out.files.insert(c.rel, c.digest);
                out.file_bytes = out.file_bytes.saturating_add(c.bytes);
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    out.bytes = measure.bytes;
    Ok(out)
}

type Done = mpsc::Sender<Result<Checked, Error>>;

fn check_jobs(jobs: &Mutex<mpsc::Receiver<Job>>, done: &Done) {
    let mut buf = vec![0u8; CHUNK];
    let mut src_buf = Vec::new();
    loop {
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        let result = check_file(job, &mut buf, &mut src_buf);
        if done.send(result).is_err() {
            return;
        }
    }
}

fn check_file(mut job: Job, buf: &mut [u8], src_buf: &mut Vec<u8>) -> Result<Checked, Error> {
    let Some(mut src) = job.source.take() else {
        let (digest, bytes) = pipe::hash_file(&mut job.file, buf, &job.path)?;
        return Ok(Checked {
            rel: job.rel,
            digest,
            bytes,
            source_changed: false,
        });
    };
    src_buf.resize(buf.len(), 0);
    let (equal, bytes) = same_bytes(&mut job, &mut src, buf, src_buf)?;
    // After the last read: a write to the source during the comparison moved its change time.
    let now = at::stat_fd(&src.file, || src.path.clone())?;
    let unchanged = Stamp::of(&now) == src.stamp;
    if equal && unchanged {
        return Ok(Checked {
            rel: job.rel,
            digest: src.digest,
            bytes,
            source_changed: false,
        });
    }
    // Not proven: the published file's own digest says which side changed.
    job.file
        .rewind()
        .map_err(|e| Error::io("seek", &job.path, e))?;
    let (digest, bytes) = pipe::hash_file(&mut job.file, buf, &job.path)?;
    Ok(Checked {
        rel: job.rel,
        source_changed: !unchanged || digest == src.digest,
        digest,
        bytes,
    })
}

/// Whether the published file and its source read the same bytes to their ends; the published
/// file's bytes read (up to the first difference).
fn same_bytes(
    job: &mut Job,
    src: &mut SourceFile,
    buf: &mut [u8],
    src_buf: &mut [u8],
) -> Result<(bool, u64), Error> {
    let mut total = 0u64;
    loop {
        let n = pipe::read_full(&mut job.file, buf).map_err(|e| Error::io("read", &job.path, e))?;
        let m =
            pipe::read_full(&mut src.file, src_buf).map_err(|e| Error::io("read", &src.path, e))?;
        total = total.saturating_add(n as u64);
        if buf.get(..n) != src_buf.get(..m) {
            return Ok((false, total));
        }
        if n < buf.len() {
            return Ok((true, total));
        }
    }
}

/// Opens the source entry `name` again beneath `dir` the way the copy opened it (no link
/// followed); `None` when it is not the same file any more (gone, a link, another kind or inode,
/// another stamp).
fn reopen_source_file(
    dir: BorrowedFd<'_>,
    name: &CStr,
    stamp: Stamp,
    path: impl Fn() -> PathBuf,
) -> Result<Option<File>, Error> {
    match at::open_file_at(dir, name, path) {
        Ok((file, st)) => Ok((Stamp::of(&st) == stamp).then_some(file)),
        Err(Error::SpecialFile { .. }) => Ok(None),
        Err(e) if gone(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Opens the source directory `name` again beneath `dir` (no link followed, on the source's
/// mount); `None` when it is not a directory of that mount any more.
fn reopen_source_dir(
    dir: BorrowedFd<'_>,
    name: &CStr,
    mount: Mount,
    path: impl Fn() -> PathBuf,
) -> Result<Option<OwnedFd>, Error> {
    let fd = match at::open_dir_at(dir, name, &path) {
        Ok(fd) => fd,
        Err(e) if gone(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    let st = at::stat_fd(&fd, path)?;
    Ok(Mount::of(&st).same(mount).then_some(fd))
}

/// An open that failed because the name is gone or is no longer what it was (a link where
/// `O_NOFOLLOW` refuses, a file where a directory was).
fn gone(e: &Error) -> bool {
    [Errno::NOENT, Errno::LOOP, Errno::NOTDIR]
        .iter()
        .any(|n| e.raw_os_error() == Some(n.raw_os_error()))
}

struct Walker<'a> {
    root: &'a Path,
    skip: &'a [&'a CStr],
    mount: Mount,
    /// The source to compare with, and its mount.
    against: Option<&'a Against<'a>>,
    src_mount: Option<Mount>,
    jobs: mpsc::SyncSender<Job>,
    scan: &'a mut Scan,
    measure: &'a mut Measure,
}

impl Walker<'_> {
    /// Walks `dirfd`; `src` is the matching source directory when the files beneath are compared
    /// with their sources (`None` beneath a directory that was not copied or whose source
    /// changed: its files are hashed).
    fn dir(
        &mut self,
        dirfd: BorrowedFd<'_>,
        src: Option<BorrowedFd<'_>>,
        rel: &mut RelPath,
        depth: usize,
    ) -> Result<(), Error> {
        if depth > MAX_DEPTH {
            return Err(Error::TooDeep {
                path: rel.under(self.root),
                max: MAX_DEPTH,
            });
        }
        let root = self.root;
        for name in at::list_dir(dirfd, || rel.under(root))? {
            if rel.is_root() && self.skip.contains(&name.as_c_str()) {
                continue;
            }
            let path = || at::child(root, rel, &name);
            let st = at::stat_at(dirfd, &name, path)?;
            self.measure.count(&st);
            let len = rel.push(&name);
            match Kind::of(&st) {
                Kind::Dir => {
                    if !Mount::of(&st).same(self.mount) {
                        return Err(Error::CrossesMount {
                            path: rel.under(root),
                        });
                    }
                    let fd = at::open_dir_at(dirfd, &name, || rel.under(root))?;
                    if !Mount::of(&at::stat_fd(&fd, || rel.under(root))?).same(self.mount) {
                        return Err(Error::CrossesMount {
                            path: rel.under(root),
                        });
                    }
                    self.scan.dirs.insert(rel.bytes().to_vec());
                    let sub_src = self.source_dir(src, &name, rel)?;
                    self.dir(
                        fd.as_fd(),
                        sub_src.as_ref().map(|f| f.as_fd()),
                        rel,
                        depth + 1,
                    )?;
                }
                Kind::File => {
                    let (file, _) = at::open_file_at(dirfd, &name, || rel.under(root))?;
                    let source = self.source_file(src, &name, rel)?;
                    let job = Job {
                        rel: rel.bytes().to_vec(),
                        path: rel.under(root),
                        file,
                        source,
                    };
                    self.jobs.send(job).map_err(|e| Error::Worker {
                        path: e.0.path,
                        worker: "hashing",
                    })?;
                }
                Kind::Symlink => {
                    let target = rustix::fs::readlinkat(dirfd, &name, Vec::new())
                        .map_err(|e| Error::io("read symbolic link", rel.under(root), e))?;
                    self.scan
                        .symlinks
                        .insert(rel.bytes().to_vec(), target.into_bytes());
                }
                Kind::Special(kind) => {
                    self.scan.special.insert(rel.bytes().to_vec(), kind);
                }
            }
            rel.truncate(len);
        }
        Ok(())
    }
    /// The source directory matching the published directory `rel` (just pushed, named `name`)
    /// beneath the source directory `src`, when it is compared; a changed one is recorded.
    fn source_dir(
        &mut self,
        src: Option<BorrowedFd<'_>>,
        name: &CStr,
        rel: &RelPath,
    ) -> Result<Option<OwnedFd>, Error> {
        let (Some(a), Some(src), Some(mount)) = (self.against, src, self.src_mount) else {
            return Ok(None);
        };
        if !a.copied.dirs.contains(rel.bytes()) {
            return Ok(None);
        }
        let fd = reopen_source_dir(src, name, mount, || rel.under(a.source))?;
        if fd.is_none() {
            self.scan.source_changed.insert(rel.bytes().to_vec());
        }
        Ok(fd)
    }

    /// The source of the published file `rel` (just pushed, named `name`) beneath the source
    /// directory `src`, when it is compared; a changed one is recorded (the file is then hashed).
    fn source_file(
        &mut self,
        src: Option<BorrowedFd<'_>>,
        name: &CStr,
        rel: &RelPath,
    ) -> Result<Option<SourceFile>, Error> {
        let (Some(a), Some(src)) = (self.against, src) else {
            return Ok(None);
        };
        let (Some(digest), Some(stamp)) = (
            a.copied.files.get(rel.bytes()),
            a.copied.sources.get(rel.bytes()),
        ) else {
            return Ok(None);
        };
        let path = || rel.under(a.source);
        match reopen_source_file(src, name, *stamp, path)? {
            Some(file) => Ok(Some(SourceFile {
                file,
                path: path(),
                stamp: *stamp,
                digest: *digest,
            })),
            None => {
                self.scan.source_changed.insert(rel.bytes().to_vec());
                Ok(None)
            }
        }
    }
}
