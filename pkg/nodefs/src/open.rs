//! Opening a fresh volume root for a non-root writer: giving the root directory of a mounted
//! volume (only that directory) to the writer's user and group.

use std::path::Path;

use rustix::fs::{Gid, Mode, Statx, StatxFlags, Uid};

use crate::at::{open_root_dir, stat_fd};
use crate::error::Error;
use crate::mounts::{MountInfo, top_mount};

/// What [`open_root`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenOutcome {
    /// The root was root's: it now belongs to the writer (and its owner has `rwx`).
    Opened,
    /// The root already belongs to the writer's user with `rwx` for it: nothing was changed.
    AlreadyOpen,
}

/// Checks that `st` (of a directory opened at `path`) is the root of the mount `mounts` shows
/// on top at `path`: by mount id, or by device on kernels without `STATX_MNT_ID`.
pub(crate) fn on_top_mount(st: &Statx, mounts: &[MountInfo], path: &Path) -> Result<(), Error> {
    let Some(top) = top_mount(mounts, path) else {
        return Err(Error::NotAVolumeRoot {
            path: path.to_path_buf(),
        });
    };
    let mnt_id = StatxFlags::from_bits_retain(st.stx_mask)
        .contains(StatxFlags::MNT_ID)
        .then_some(st.stx_mnt_id);
    let on_top = match mnt_id {
        Some(id) => id == top.mount_id,
        None => (st.stx_dev_major, st.stx_dev_minor) == (top.major, top.minor),
    };
    if on_top {
        Ok(())
    } else {
        Err(Error::NotAVolumeRoot {
            path: path.to_path_buf(),
        })
    }
}

/// Gives the root directory `path` of a mounted volume to `user`:`group`, through one open
/// descriptor:
///
/// - `path` itself is never a symbolic link (`O_NOFOLLOW`), and the directory opened must be the
///   root of the mount `mounts` shows on top at `path` (its mount id, or its device on kernels
///   without `STATX_MNT_ID`): a path that is not a mount point yet is the node's own disk and is
///   refused ([`Error::NotAVolumeRoot`]), as is one the kubelet mounted or unmounted between the
///   table's read and the open;
/// - a root owned by uid 0 gets `fchown(user, group)` and, if its owner lacked any of `rwx`,
///   `fchmod` adding them (nothing else of its mode changes);
/// - a root already owned by `user` only gets the missing owner bits, if any;
/// - a root owned by anyone else is refused ([`Error::ForeignOwner`]): it is not a fresh export.
///
/// Nothing beneath the root is read or changed.
///
/// # Errors
///
/// The refusals above, or the system call that failed (a driver squashing root refuses the
/// `fchown` with `EPERM`).
pub fn open_root(
    path: &Path,
    mounts: &[MountInfo],
    user: u32,
    group: u32,
) -> Result<OpenOutcome, Error> {
    let fd = open_root_dir(path)?;
    let st = stat_fd(&fd, || path.to_path_buf())?;
    on_top_mount(&st, mounts, path)?;
    let mode = u32::from(st.stx_mode) & 0o7777;
    let owner_rwx = mode & 0o700 == 0o700;
    match st.stx_uid {
        owner if owner == user && owner_rwx => Ok(OpenOutcome::AlreadyOpen),
        owner if owner == user || owner == 0 => {
            if owner == 0 {
                rustix::fs::fchown(&fd, Some(Uid::from_raw(user)), Some(Gid::from_raw(group)))
                    .map_err(|e| Error::io("chown the volume root", path, e))?;
            }
            // A chown may clear setuid/setgid bits: set the mode from what it is now.
            let now = stat_fd(&fd, || path.to_path_buf())?;
            let now_mode = u32::from(now.stx_mode) & 0o7777;
            if now_mode & 0o700 != 0o700 {
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(now_mode | 0o700))
                    .map_err(|e| Error::io("chmod the volume root", path, e))?;
            }
            Ok(OpenOutcome::Opened)
        }
        owner => Err(Error::ForeignOwner {
            path: path.to_path_buf(),
            owner,
        }),
    }
}
