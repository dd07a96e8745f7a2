//! The copy's helper threads: a hashing thread per file worker hashes the bytes the worker reads
//! (so hashing and writing overlap), and one syncing thread fsyncs what the workers finished (so
//! waiting for the disk overlaps with copying, publishing and verifying). The syncing thread is
//! joined before the marker is written.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::thread::JoinHandle;

use sha2::{Digest, Sha256};

use crate::at;
use crate::error::Error;

/// Bytes read and written per system call (256 KiB measured as fast as 1 MiB and faster than
/// 4 MiB on the benchmark's machine: the chunk is still in cache when it is hashed).
pub(crate) const CHUNK: usize = 256 << 10;
/// Chunks in flight between a worker and its hasher.
const BUFFERS: usize = 8;
/// Descriptors waiting to be synced (bounded: a tree of many small files must not exhaust
/// descriptors).
const SYNC_QUEUE: usize = 64;

enum Work {
    /// The next bytes of the current file (the vector's length).
    Data(Vec<u8>),
    /// End of the current file: send its digest and start the next.
    Finish,
}

/// The main thread's end of the hashing thread.
pub(crate) struct HashPipe {
    work: SyncSender<Work>,
    free: Receiver<Vec<u8>>,
    digests: Receiver<[u8; 32]>,
}

/// The hashing thread's end.
pub(crate) struct HashWorker {
    work: Receiver<Work>,
    free: Sender<Vec<u8>>,
    digests: Sender<[u8; 32]>,
}

pub(crate) fn hash_pipe() -> (HashPipe, HashWorker) {
    let (work_tx, work_rx) = mpsc::sync_channel(BUFFERS + 1);
    let (free_tx, free_rx) = mpsc::channel();
    let (digest_tx, digest_rx) = mpsc::channel();
    for _ in 0..BUFFERS {
        // Cannot fail: the receiver is alive.
        let _ = free_tx.send(vec![0u8; CHUNK]);
    }
    (
        HashPipe {
            work: work_tx,
            free: free_rx,
            digests: digest_rx,
        },
        HashWorker {
            work: work_rx,
            free: free_tx,
            digests: digest_tx,
        },
    )
}

impl HashWorker {
    /// Runs until the pipe is dropped.
    pub(crate) fn run(self) {
        let mut hasher = Sha256::new();
        while let Ok(work) = self.work.recv() {
            match work {
                Work::Data(buf) => {
                    hasher.update(&buf);
                    if self.free.send(buf).is_err() {
                        return;
                    }
                }
                Work::Finish => {
                    if self.digests.send(hasher.finalize_reset().into()).is_err() {
                        return;
                    }
                }
            }
        }
    }
}

impl HashPipe {
    /// Copies `src` to its end into `dst`, returning the SHA-256 of the bytes read (the hasher
    /// sees exactly the bytes written) and their count. `src_path` and `dst_path` are for messages.
    pub(crate) fn copy(
        &self,
        src: &mut File,
        dst: &mut File,
        src_path: &Path,
        dst_path: &Path,
    ) -> Result<([u8; 32], u64), Error> {
        let stopped = || Error::Worker {
            path: src_path.to_path_buf(),
            worker: "hashing",
        };
        let mut total = 0u64;
        loop {
            let mut buf = self.free.recv().map_err(|_| stopped())?;
            buf.resize(CHUNK, 0);
            let n = read_full(src, &mut buf).map_err(|e| Error::io("read", src_path, e))?;
            buf.truncate(n);
            if n > 0 {
                dst.write_all(&buf)
                    .map_err(|e| Error::io("write", dst_path, e))?;
            }
            total = total.saturating_add(n as u64);
            self.work.send(Work::Data(buf)).map_err(|_| stopped())?;
            if n < CHUNK {
                break;
            }
        }
        self.work.send(Work::Finish).map_err(|_| stopped())?;
        let digest = self.digests.recv().map_err(|_| stopped())?;
        Ok((digest, total))
    }
}

/// Starts a scoped thread, or says why it could not be started (instead of panicking as
/// `Scope::spawn` does).
pub(crate) fn spawn_scoped<'scope, T: Send + 'scope>(
    s: &'scope std::thread::Scope<'scope, '_>,
    name: &str,
    path: &Path,
    f: impl FnOnce() -> T + Send + 'scope,
) -> Result<std::thread::ScopedJoinHandle<'scope, T>, Error> {
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn_scoped(s, f)
        .map_err(|e| Error::io("start a thread for", path, e))
}

/// Reads until `buf` is full or the end of the file; returns the count read.
pub(crate) fn read_full(src: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while let Some(rest) = buf.get_mut(filled..) {
        if rest.is_empty() {
            break;
        }
        match src.read(rest) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// The SHA-256 of everything `file` reads to its end, and the count.
pub(crate) fn hash_file(
    file: &mut File,
    buf: &mut [u8],
    path: &Path,
) -> Result<([u8; 32], u64), Error> {
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    loop {
        let n = read_full(file, buf).map_err(|e| Error::io("read", path, e))?;
        let Some(bytes) = buf.get(..n) else { break };
        hasher.update(bytes);
        total = total.saturating_add(n as u64);
        if n < buf.len() {
            break;
        }
    }
    Ok((hasher.finalize().into(), total))
}

/// A queue of descriptors for the syncing thread.
#[derive(Clone)]
pub(crate) struct SyncQueue {
    tx: SyncSender<(PathBuf, OwnedFd)>,
}

impl SyncQueue {
    /// Queues `fd` (a file or directory whose writes are done) for `fsync`.
    pub(crate) fn push(&self, path: PathBuf, fd: OwnedFd) -> Result<(), Error> {
        self.tx.send((path, fd)).map_err(|e| Error::Worker {
            path: e.0.0,
            worker: "syncing",
        })
    }
}

/// The syncing thread: fsyncs what is queued, in order, stopping at the first failure. It runs
/// on while the attempt publishes and verifies (waiting for the disk overlaps with that work);
/// [`Syncer::wait`] is the point after which everything queued is durable.
pub(crate) struct Syncer {
    queue: SyncQueue,
    thread: JoinHandle<Result<(), Error>>,
    path: PathBuf,
}

impl Syncer {
    /// `path` names the tree in messages.
    pub(crate) fn start(path: &Path) -> Result<Syncer, Error> {
        let (tx, rx) = mpsc::sync_channel::<(PathBuf, OwnedFd)>(SYNC_QUEUE);
        let thread = std::thread::Builder::new()
            .name("nodefs-fsync".into())
            .spawn(move || {
                while let Ok((path, fd)) = rx.recv() {
                    at::fsync(&fd, &path)?;
                }
                Ok(())
            })
            .map_err(|e| Error::io("start the syncing thread for", path, e))?;
        Ok(Syncer {
            queue: SyncQueue { tx },
            thread,
            path: path.to_path_buf(),
        })
    }

    pub(crate) fn queue(&self) -> SyncQueue {
        self.queue.clone()
    }

    /// Closes the queue (every other [`SyncQueue`] must be dropped already) and waits until
    /// everything queued is synced.
    pub(crate) fn wait(self) -> Result<(), Error> {
        drop(self.queue);
        self.thread.join().unwrap_or(Err(Error::Worker {
            path: self.path,
            worker: "syncing",
        }))
    }
}
