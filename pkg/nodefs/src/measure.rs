//! How big a tree is (`du -sb`), and how big a volume to provision for it.

use std::collections::HashSet;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use rustix::fs::{AtFlags, CWD, Statx};

use crate::at::{self, Keep, Kind, MAX_DEPTH, RelPath};
use crate::beneath::TreeDir;
use crate::error::Error;

/// The apparent size of the tree at `root` with `du -sb` semantics: the `st_size` of every inode
/// in it counted once (regular files, directories, symbolic links' own length, anything else),
/// hard links once by (device, inode). Never follows a symbolic link, `root` included (a link
/// measures its own length); refuses no kind of entry. Mounts inside the tree are crossed, as `du`
/// does without `-x`; a directory reached twice (a bind mount of another part of the tree) counts
/// once and is not entered again.
pub fn measure(root: &Path) -> Result<u64, Error> {
    let st = rustix::fs::statx(
        CWD,
        root,
        AtFlags::SYMLINK_NOFOLLOW,
        rustix::fs::StatxFlags::BASIC_STATS,
    )
    .map_err(|e| Error::io("stat (no symlinks)", root, e))?;
    let mut m = Measure::default();
    if !m.count(&st) || Kind::of(&st) != Kind::Dir {
        return Ok(m.bytes);
    }
    let fd = at::open_root_dir(root)?;
    let mut rel = RelPath::default();
    walk(fd.as_fd(), root, &mut rel, 0, &mut m, None)?;
    Ok(m.bytes)
}

/// [`measure`] of a directory opened beneath a trusted root ([`crate::open_dir_beneath`]),
/// walked from its descriptor (no path to it is resolved again).
///
/// # Errors
///
/// A system call that failed, or a tree deeper than [`MAX_DEPTH`].
pub fn measure_dir(dir: &TreeDir) -> Result<u64, Error> {
    measure_opened(dir, None)
}

/// [`measure_dir`] of only the entries `keep` selects ([`Keep`]: a directory left out is not
/// entered, symbolic links are left out): the bytes [`crate::copy_dir_into_mount_selected`] with
/// the same selection copies (the directory itself counted, as the copy's root is).
///
/// # Errors
///
/// As [`measure_dir`].
pub fn measure_dir_selected(dir: &TreeDir, keep: &Keep) -> Result<u64, Error> {
    measure_opened(dir, Some(keep))
}

fn measure_opened(dir: &TreeDir, keep: Option<&Keep>) -> Result<u64, Error> {
    let root = dir.path();
    let st = at::stat_fd(dir.fd(), || root.to_path_buf())?;
    let mut m = Measure::default();
    m.count(&st);
    let mut rel = RelPath::default();
    walk(dir.fd(), root, &mut rel, 0, &mut m, keep)?;
    Ok(m.bytes)
}

/// The running total of a measure.
#[derive(Debug, Default)]
pub(crate) struct Measure {
    pub(crate) bytes: u64,
    seen: HashSet<(u32, u32, u64)>,
}

impl Measure {
    /// Adds the inode unless it was counted already; true when it is new.
    pub(crate) fn count(&mut self, st: &Statx) -> bool {
        // Only inodes that can be reached twice need remembering: hard-linked files, and
        // directories (bind mounts).
        if (st.stx_nlink > 1 || Kind::of(st) == Kind::Dir) && !self.seen.insert(at::inode(st)) {
            return false;
        }
        self.bytes = self.bytes.saturating_add(st.stx_size);
        true
    }
}

fn walk(
    dirfd: BorrowedFd<'_>,
    root: &Path,
    rel: &mut RelPath,
    depth: usize,
    m: &mut Measure,
    keep: Option<&Keep>,
) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Err(Error::TooDeep {
            path: rel.under(root),
            max: MAX_DEPTH,
        });
    }
    for name in at::list_dir(dirfd, || rel.under(root))? {
        let len = rel.push(&name);
        let selected = rel.selected(keep);
        rel.truncate(len);
        if !selected {
            continue;
        }
        let st = at::stat_at(dirfd, &name, || at::child(root, rel, &name))?;
        if keep.is_some() && Kind::of(&st) == Kind::Symlink {
            continue;
        }
        if !m.count(&st) || Kind::of(&st) != Kind::Dir {
            continue;
        }
        let fd = at::open_dir_at(dirfd, &name, || at::child(root, rel, &name))?;
        let len = rel.push(&name);
        walk(fd.as_fd(), root, rel, depth + 1, m, keep)?;
        rel.truncate(len);
    }
    Ok(())
}
