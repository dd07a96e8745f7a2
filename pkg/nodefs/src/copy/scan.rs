//! Reading a published tree back: every entry beneath the volume root on descriptors (no
//! symbolic link followed, no mount crossed), every regular file hashed again (on as many
//! threads as there are cores, up to four), and the tree measured as `du -sb` would.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::mpsc;

use crate::at::{self, Kind, MAX_DEPTH, Mount, RelPath};
use crate::copy::manifest::Digests;
use crate::copy::pipe::{self, CHUNK};
use crate::error::Error;
use crate::measure::Measure;

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

struct Job {
    rel: Vec<u8>,
    path: PathBuf,
    file: File,
}

/// Scans the tree under `root_fd` (a directory at `root`), leaving out the root entries named in
/// `skip`.
pub(crate) fn scan(root_fd: BorrowedFd<'_>, root: &Path, skip: &[&CStr]) -> Result<Scan, Error> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 4);
    let root_st = at::stat_fd(root_fd, || root.to_path_buf())?;
    let mut out = Scan::default();
    let mut measure = Measure::default();
    measure.count(&root_st);
    let (job_tx, job_rx) = mpsc::sync_channel::<Job>(2 * workers);
    let job_rx = Mutex::new(job_rx);
    let (done_tx, done_rx) = mpsc::channel::<Result<(Vec<u8>, [u8; 32], u64), Error>>();
    let walked = std::thread::scope(|s| {
        for _ in 0..workers {
            let (job_rx, done_tx) = (&job_rx, done_tx.clone());
            pipe::spawn_scoped(s, "nodefs-verify", root, move || {
                hash_jobs(job_rx, &done_tx)
            })?;
        }
        drop(done_tx);
        let mut walker = Walker {
            root,
            skip,
            mount: Mount::of(&root_st),
            jobs: job_tx,
            scan: &mut out,
            measure: &mut measure,
        };
        let walked = walker.dir(root_fd, &mut RelPath::default(), 0);
        // Closing the queue lets the workers finish what is queued and stop.
        drop(walker);
        walked
    });
    let mut first_err = walked.err();
    for done in done_rx {
        match done {
            Ok((rel, digest, n)) => {
                out.files.insert(rel, digest);
                out.file_bytes = out.file_bytes.saturating_add(n);
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

type Done = mpsc::Sender<Result<(Vec<u8>, [u8; 32], u64), Error>>;

fn hash_jobs(jobs: &Mutex<mpsc::Receiver<Job>>, done: &Done) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(mut job) = job else { return };
        let result =
            pipe::hash_file(&mut job.file, &mut buf, &job.path).map(|(d, n)| (job.rel, d, n));
        if done.send(result).is_err() {
            return;
        }
    }
}

struct Walker<'a> {
    root: &'a Path,
    skip: &'a [&'a CStr],
    mount: Mount,
    jobs: mpsc::SyncSender<Job>,
    scan: &'a mut Scan,
    measure: &'a mut Measure,
}

impl Walker<'_> {
    fn dir(&mut self, dirfd: BorrowedFd<'_>, rel: &mut RelPath, depth: usize) -> Result<(), Error> {
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
                    self.dir(fd.as_fd(), rel, depth + 1)?;
                }
                Kind::File => {
                    let (file, _) = at::open_file_at(dirfd, &name, || rel.under(root))?;
                    let job = Job {
                        rel: rel.bytes().to_vec(),
                        path: rel.under(root),
                        file,
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
}
