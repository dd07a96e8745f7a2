//! Directory-fd-relative primitives shared by the walkers: every name is one path component
//! resolved against an open directory, and no call follows a symbolic link.

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Statx, StatxFlags};
use rustix::io::Errno;

use crate::error::Error;

/// Directories nested deeper than this below a walked root are refused ([`Error::TooDeep`]):
/// each level holds a directory descriptor open (two while copying), and a hostile tree must not
/// exhaust descriptors or the stack. A model tree is a handful of levels deep.
pub const MAX_DEPTH: usize = 128;

/// The statx fields the walkers use (the mount id tells a mount inside a tree even when it is a
/// bind of the same filesystem).
const STATX_MASK: StatxFlags = StatxFlags::BASIC_STATS.union(StatxFlags::MNT_ID);

/// A selection of the entries of a tree ([`crate::copy_dir_into_mount_selected`],
/// [`crate::measure_dir_selected`]): called with each entry's path relative to the walked root
/// (`/`-separated, no leading `./`, never empty) before the entry is opened; `false` leaves the
/// entry out, and a directory left out is not descended into. A selecting walk also leaves out
/// every symbolic link (whatever it names is the reader's to resolve, and a selection decides by
/// path) and every name that is not UTF-8.
pub type Keep = dyn Fn(&str) -> bool;

/// A path relative to a walked root, as bytes joined with `/` (no leading `./`).
#[derive(Debug, Default, Clone)]
pub(crate) struct RelPath(Vec<u8>);

impl RelPath {
    /// Appends one component; returns the length to [`RelPath::truncate`] back to.
    pub(crate) fn push(&mut self, name: &CStr) -> usize {
        let len = self.0.len();
        if !self.0.is_empty() {
            self.0.push(b'/');
        }
        self.0.extend_from_slice(name.to_bytes());
        len
    }

    pub(crate) fn truncate(&mut self, len: usize) {
        self.0.truncate(len);
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }

    pub(crate) fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether a selecting walk takes this path: always without a selection; with one, only a
    /// UTF-8 path it accepts (a name that is not UTF-8 is never taken).
    pub(crate) fn selected(&self, keep: Option<&Keep>) -> bool {
        keep.is_none_or(|keep| std::str::from_utf8(&self.0).is_ok_and(keep))
    }

    /// `root/self`, for messages.
    pub(crate) fn under(&self, root: &Path) -> PathBuf {
        if self.0.is_empty() {
            root.to_path_buf()
        } else {
            root.join(OsStr::from_bytes(&self.0))
        }
    }
}

/// `root/rel/name`, for messages.
pub(crate) fn child(root: &Path, rel: &RelPath, name: &CStr) -> PathBuf {
    rel.under(root).join(OsStr::from_bytes(name.to_bytes()))
}

/// What an entry is, from its own (never followed) status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Dir,
    File,
    Symlink,
    Special(&'static str),
}

impl Kind {
    pub(crate) fn of(st: &Statx) -> Kind {
        match FileType::from_raw_mode(u32::from(st.stx_mode)) {
            FileType::Directory => Kind::Dir,
            FileType::RegularFile => Kind::File,
            FileType::Symlink => Kind::Symlink,
            FileType::Fifo => Kind::Special("FIFO"),
            FileType::Socket => Kind::Special("socket"),
            FileType::CharacterDevice => Kind::Special("character device"),
            FileType::BlockDevice => Kind::Special("block device"),
            FileType::Unknown => Kind::Special("file of unknown type"),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Dir => "directory",
            Kind::File => "regular file",
            Kind::Symlink => "symbolic link",
            Kind::Special(kind) => kind,
        }
    }
}

/// The mount an inode was reached through: its device and, where the kernel reports it (Linux
/// 5.8 and later), the mount id.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mount {
    dev: (u32, u32),
    mnt_id: Option<u64>,
}

impl Mount {
    pub(crate) fn of(st: &Statx) -> Mount {
        Mount {
            dev: (st.stx_dev_major, st.stx_dev_minor),
            mnt_id: StatxFlags::from_bits_retain(st.stx_mask)
                .contains(StatxFlags::MNT_ID)
                .then_some(st.stx_mnt_id),
        }
    }

    /// Whether both were reached through the same mount.
    pub(crate) fn same(self, other: Mount) -> bool {
        self.dev == other.dev
            && match (self.mnt_id, other.mnt_id) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }
}

/// The identity of an inode: device and inode number.
pub(crate) fn inode(st: &Statx) -> (u32, u32, u64) {
    (st.stx_dev_major, st.stx_dev_minor, st.stx_ino)
}

/// `statx(dirfd, name, AT_SYMLINK_NOFOLLOW)`: the entry itself, never what a link points to.
pub(crate) fn stat_at(
    dirfd: impl AsFd,
    name: &CStr,
    path: impl FnOnce() -> PathBuf,
) -> Result<Statx, Error> {
    rustix::fs::statx(
        dirfd,
        name,
        AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT,
        STATX_MASK,
    )
    .map_err(|e| Error::io("stat (no symlinks)", path(), e))
}

/// `statx` of an open descriptor.
pub(crate) fn stat_fd(fd: impl AsFd, path: impl FnOnce() -> PathBuf) -> Result<Statx, Error> {
    rustix::fs::statx(fd, c"", AtFlags::EMPTY_PATH, STATX_MASK)
        .map_err(|e| Error::io("stat", path(), e))
}

/// Opens a directory given by a full path whose last component must not be a symbolic link (the
/// components above it are the caller's, trusted, and resolved by the kernel).
pub(crate) fn open_root_dir(path: &Path) -> Result<OwnedFd, Error> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::NOTDIR | Errno::LOOP
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_symlink()) =>
        {
            Error::Refused {
                path: path.to_path_buf(),
                reason: "is a symbolic link, refused where a directory must be",
            }
        }
        e => Error::io("open directory (no symlinks)", path, e),
    })
}

/// Opens the directory `name` beneath `dirfd`; fails (`ELOOP`, `ENOTDIR`) rather than follow a
/// symbolic link that replaced it.
pub(crate) fn open_dir_at(
    dirfd: impl AsFd,
    name: &CStr,
    path: impl FnOnce() -> PathBuf,
) -> Result<OwnedFd, Error> {
    rustix::fs::openat(
        dirfd,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io("open directory (no symlinks)", path(), e))
}

/// Opens the regular file `name` beneath `dirfd` for reading: never follows a symbolic link,
/// never blocks on a FIFO swapped in after the caller's stat, and checks the opened inode is a
/// regular file.
pub(crate) fn open_file_at(
    dirfd: impl AsFd,
    name: &CStr,
    path: impl Fn() -> PathBuf,
) -> Result<(File, Statx), Error> {
    let fd = rustix::fs::openat(
        dirfd,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io("open file (no symlinks)", path(), e))?;
    let st = stat_fd(&fd, &path)?;
    match Kind::of(&st) {
        Kind::File => Ok((File::from(fd), st)),
        other => Err(Error::SpecialFile {
            path: path(),
            kind: other.name(),
        }),
    }
}

/// The names in a directory, without `.` and `..`, sorted by bytes (a deterministic order; the
/// listing's own descriptor is closed before the caller descends).
pub(crate) fn list_dir(
    dirfd: impl AsFd,
    path: impl Fn() -> PathBuf,
) -> Result<Vec<CString>, Error> {
    let mut dir = rustix::fs::Dir::read_from(dirfd)
        .map_err(|e| Error::io("open directory listing", path(), e))?;
    let mut names = Vec::new();
    while let Some(entry) = dir.read() {
        let entry = entry.map_err(|e| Error::io("read directory", path(), e))?;
        let name = entry.file_name();
        if name != c"." && name != c".." {
            names.push(name.to_owned());
        }
    }
    names.sort_unstable();
    Ok(names)
}

/// Removes the entry `name` beneath `dirfd` and, for a directory, everything below it, on
/// descriptors: a symbolic link is unlinked, never followed, and a directory reached through
/// another mount than `mount` (a mount inside the tree) is refused rather than emptied. Absent
/// is fine.
pub(crate) fn remove_entry(
    dirfd: impl AsFd,
    name: &CStr,
    mount: Mount,
    path: &Path,
) -> Result<(), Error> {
    remove_entry_at(dirfd.as_fd(), name, mount, path, 0)
}

fn remove_entry_at(
    dirfd: std::os::fd::BorrowedFd<'_>,
    name: &CStr,
    root: Mount,
    path: &Path,
    depth: usize,
) -> Result<(), Error> {
    let st = match rustix::fs::statx(dirfd, name, AtFlags::SYMLINK_NOFOLLOW, STATX_MASK) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(Error::io("stat (no symlinks)", path, e)),
    };
    if Kind::of(&st) != Kind::Dir {
        return match rustix::fs::unlinkat(dirfd, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(Error::io("remove", path, e)),
        };
    }
    if !Mount::of(&st).same(root) {
        return Err(Error::CrossesMount {
            path: path.to_path_buf(),
        });
    }
    if depth >= MAX_DEPTH {
        return Err(Error::TooDeep {
            path: path.to_path_buf(),
            max: MAX_DEPTH,
        });
    }
    let fd = open_dir_at(dirfd, name, || path.to_path_buf())?;
    // The opened directory must be the one just checked (not a mount stacked in between).
    if !Mount::of(&stat_fd(&fd, || path.to_path_buf())?).same(root) {
        return Err(Error::CrossesMount {
            path: path.to_path_buf(),
        });
    }
    for child in list_dir(&fd, || path.to_path_buf())? {
        let child_path = path.join(OsStr::from_bytes(child.to_bytes()));
        remove_entry_at(fd.as_fd(), &child, root, &child_path, depth + 1)?;
    }
    drop(fd);
    match rustix::fs::unlinkat(dirfd, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(Error::io("remove directory", path, e)),
    }
}

/// `fsync` of a directory or file descriptor.
pub(crate) fn fsync(fd: impl AsFd, path: &Path) -> Result<(), Error> {
    rustix::fs::fsync(fd).map_err(|e| Error::io("fsync", path, e))
}

/// A path as a C string (for the few calls that take a whole caller path).
pub(crate) fn c_name(bytes: &[u8], path: impl FnOnce() -> PathBuf) -> Result<CString, Error> {
    CString::new(bytes).map_err(|_| Error::Refused {
        path: path(),
        reason: "contains a NUL byte",
    })
}
