//! A directory of an untrusted tree, reached beneath a trusted root without following any
//! symbolic link: the landing of a capture source inside the pod's emptyDir, which the pod
//! controls (a component `ngc -> /etc` must be refused, not read through).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::at::{self, Kind, Mount};
use crate::error::Error;

/// A directory opened beneath a trusted root ([`open_dir_beneath`]): every later step (measuring,
/// copying) goes through its descriptor, so a link swapped into the path afterwards changes
/// nothing.
#[derive(Debug)]
pub struct TreeDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl TreeDir {
    /// The path it was opened as (for messages; never resolved again).
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Opens the directory `rel` beneath `root` one component at a time, never following a symbolic
/// link:
///
/// - `root` is the caller's (the kubelet's emptyDir directory of a pod): its last component must
///   not be a symbolic link, the components above it are resolved by the kernel and trusted;
/// - `rel` is untrusted: `/`-separated components, none empty, `.` or `..` (empty: `root`
///   itself); each is looked at without following it and must be a directory on the same mount
///   as `root` (a symbolic link is [`Error::Refused`], another mount [`Error::CrossesMount`]),
///   then opened beneath its parent's descriptor with `O_NOFOLLOW|O_DIRECTORY` (a link swapped in
///   between the look and the open fails the open) and checked to be on that mount again.
///
/// # Errors
///
/// The refusals above, or the system call that failed (a component that does not exist).
pub fn open_dir_beneath(root: &Path, rel: &str) -> Result<TreeDir, Error> {
    let mut fd = at::open_root_dir(root)?;
    let mount = Mount::of(&at::stat_fd(&fd, || root.to_path_buf())?);
    let mut path = root.to_path_buf();
    if rel.is_empty() {
        return Ok(TreeDir { fd, path });
    }
    for component in rel.split('/') {
        let child = path.join(component);
        if component.is_empty() || component == "." || component == ".." {
            return Err(Error::Refused {
                path: root.join(rel),
                reason: "is not a clean relative path beneath its root (an empty, `.` or `..` component)",
            });
        }
        let name = at::c_name(component.as_bytes(), || child.clone())?;
        let st = at::stat_at(&fd, &name, || child.clone())?;
        match Kind::of(&st) {
            Kind::Dir => {}
            Kind::Symlink => {
                return Err(Error::Refused {
                    path: child,
                    reason: "is a symbolic link; a directory of the tree is never reached through one",
                });
            }
            _ => {
                return Err(Error::Refused {
                    path: child,
                    reason: "is not a directory",
                });
            }
        }
        if !Mount::of(&st).same(mount) {
            return Err(Error::CrossesMount { path: child });
        }
        let next = at::open_dir_at(&fd, &name, || child.clone())?;
        if !Mount::of(&at::stat_fd(&next, || child.clone())?).same(mount) {
            return Err(Error::CrossesMount { path: child });
        }
        fd = next;
        path = child;
    }
    Ok(TreeDir { fd, path })
}

/// The path the kernel gives the open directory (`/proc/self/fd/<n>`), for the copier's overlap
/// check.
pub(crate) fn resolved(dir: &TreeDir) -> Result<PathBuf, Error> {
    use std::os::fd::AsRawFd;
    let link = PathBuf::from(format!("/proc/self/fd/{}", dir.fd.as_raw_fd()));
    std::fs::read_link(&link).map_err(|e| Error::io("resolve", &dir.path, e))
}
