//! How big a tree is (`du -sb`), and how big a volume to provision for it.

use std::collections::HashSet;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use rustix::fs::{AtFlags, CWD, Statx};

use crate::at::{self, Kind, MAX_DEPTH, RelPath};
use crate::error::Error;

/// One GiB.
pub const GIB: u64 = 1 << 30;

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
    walk(fd.as_fd(), root, &mut rel, 0, &mut m)?;
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
) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Err(Error::TooDeep {
            path: rel.under(root),
            max: MAX_DEPTH,
        });
    }
    for name in at::list_dir(dirfd, || rel.under(root))? {
        let st = at::stat_at(dirfd, &name, || at::child(root, rel, &name))?;
        if !m.count(&st) || Kind::of(&st) != Kind::Dir {
            continue;
        }
        let fd = at::open_dir_at(dirfd, &name, || at::child(root, rel, &name))?;
        let len = rel.push(&name);
        walk(fd.as_fd(), root, rel, depth + 1, m)?;
        rel.truncate(len);
    }
    Ok(())
}

/// The size of a volume for a tree of `measured` bytes: 10% headroom (`measured / 100 * 10`),
/// rounded up to a whole GiB, at least 1 GiB and at least `min`. Saturates at `u64::MAX` instead
/// of overflowing (then it is no longer a whole number of GiB).
pub fn volume_size_bytes(measured: u64, min: u64) -> u64 {
    let wanted = measured.saturating_add(measured / 100 * 10);
    let rounded = wanted.div_ceil(GIB).saturating_mul(GIB);
    rounded.max(GIB).max(min)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn volume_sizes() {
        assert_eq!(volume_size_bytes(0, 0), GIB);
        assert_eq!(volume_size_bytes(1, 0), GIB);
        // 10% of 100 MiB fits in one GiB.
        assert_eq!(volume_size_bytes(100 << 20, 0), GIB);
        // Exactly 1 GiB needs 1.1 GiB: two.
        assert_eq!(volume_size_bytes(GIB, 0), 2 * GIB);
        // 930 MiB + 93 MiB = 1023 MiB: one.
        assert_eq!(volume_size_bytes(930 << 20, 0), GIB);
        // 16 GB of weights: 17.6 GB = 16.39 GiB -> 17 GiB.
        assert_eq!(volume_size_bytes(16_000_000_000, 0), 17 * GIB);
        // The headroom is measured / 100 * 10: 99 bytes get none.
        assert_eq!(volume_size_bytes(99, 0), GIB);
        assert_eq!(volume_size_bytes(5 * GIB, 100 * GIB), 100 * GIB);
        // A minimum that is not whole GiB is kept as given.
        assert_eq!(volume_size_bytes(0, GIB + 1), GIB + 1);
        assert_eq!(volume_size_bytes(u64::MAX, 0), u64::MAX);
        assert_eq!(volume_size_bytes(u64::MAX / 100 * 95, 0), u64::MAX);
        // Close to the top but no overflow: still whole GiB.
        assert_eq!(volume_size_bytes(u64::MAX / 10 * 9, 0) % GIB, 0);
        // Rounding up past the largest whole GiB saturates.
        assert_eq!(volume_size_bytes(u64::MAX - GIB / 2, 0), u64::MAX);
        assert_eq!(volume_size_bytes(0, u64::MAX), u64::MAX);
    }

    proptest! {
        #[test]
        fn volume_size_properties(measured in any::<u64>(), min in prop_oneof![Just(0u64), any::<u64>(), 0..(64 * GIB)]) {
            let size = volume_size_bytes(measured, min);
            let wanted = u128::from(measured) + u128::from(measured / 100 * 10);
            prop_assert!(size >= GIB);
            prop_assert!(size >= min);
            prop_assert!(u128::from(size) >= wanted.min(u128::from(u64::MAX)));
            if size != u64::MAX && size != min {
                prop_assert_eq!(size % GIB, 0);
                // The smallest whole GiB that holds it.
                prop_assert!(u128::from(size) < wanted + u128::from(GIB) || size == GIB);
            }
            // Monotonic in both arguments.
            prop_assert!(volume_size_bytes(measured.saturating_add(1), min) >= size);
            prop_assert!(volume_size_bytes(measured, min.saturating_add(1)) >= size);
        }
    }
}
