//! The mount table (`/proc/self/mountinfo`) and read-only bind mounts verified against it.
//!
//! A bind is never reported done from memory: [`ensure_read_only_bind`] reads the table, acts,
//! reads it again and answers only what the table shows. A view that was replaced underneath
//! (the kubelet unmounted the holder pod's volume and mounted a new one) leaves a stale bind on
//! another device or root; that is detected and redone, never trusted.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::io::Errno;
use rustix::mount::{MountFlags, UnmountFlags};

use crate::error::Error;

/// The mount table of this process's mount namespace.
pub const MOUNTINFO: &str = "/proc/self/mountinfo";

/// Detaching unmounts tried at one target before giving up ([`Error::StillMounted`]).
const MAX_STACKED: usize = 32;

/// One line of a mountinfo table (proc(5)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    pub mount_id: u64,
    pub parent_id: u64,
    /// The device (`st_dev`) of the mounted filesystem.
    pub major: u32,
    pub minor: u32,
    /// The directory of the filesystem mounted here (not `/` for a bind of a subdirectory).
    pub root: PathBuf,
    /// Where it is mounted, relative to this process's root.
    pub mount_point: PathBuf,
    /// Per-mount options (`rw`/`ro`, `nosuid`, ...).
    pub options: Vec<String>,
    pub fs_type: String,
    pub source: String,
    /// Per-superblock options.
    pub super_options: Vec<String>,
}

impl MountInfo {
    /// Whether this mount is read-only (the per-mount `ro` option).
    pub fn read_only(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
    }
}

/// Parses a mountinfo table: `id parent major:minor root mount-point options [optional
/// fields...] - fstype source super-options` per line, octal escapes (`\040` space, `\011` tab,
/// `\012` newline, `\134` backslash) decoded. A malformed line is an error naming its number.
pub fn parse_mountinfo(text: &str) -> Result<Vec<MountInfo>, Error> {
    parse_bytes(text.as_bytes())
}

/// Reads and parses `/proc/self/mountinfo`.
pub fn read_mountinfo() -> Result<Vec<MountInfo>, Error> {
    let bytes = std::fs::read(MOUNTINFO).map_err(|e| Error::io("read", MOUNTINFO, e))?;
    parse_bytes(&bytes)
}

fn parse_bytes(text: &[u8]) -> Result<Vec<MountInfo>, Error> {
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    if body.is_empty() {
        return Ok(Vec::new());
    }
    body.split(|&b| b == b'\n')
        .enumerate()
        .map(|(i, line)| {
            parse_line(line).map_err(|reason| Error::MountInfo {
                line: i + 1,
                reason,
                text: line.iter().copied().take(256).collect(),
            })
        })
        .collect()
}

fn parse_line(line: &[u8]) -> Result<MountInfo, &'static str> {
    let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let sep = fields
        .iter()
        .skip(6)
        .position(|f| *f == b"-")
        .map(|p| p + 6)
        .ok_or("no \" - \" separator after six fields")?;
    let [mount_id, parent_id, dev, root, mount_point, options] =
        fields.get(..6).ok_or("fewer than six fields")?
    else {
        return Err("fewer than six fields");
    };
    let [fs_type, source, super_options] = fields
        .get(sep + 1..)
        .ok_or("missing fields after the separator")?
    else {
        return Err("not three fields after the separator");
    };
    let (major, minor) = split_once(dev, b':').ok_or("device is not major:minor")?;
    Ok(MountInfo {
        mount_id: number(mount_id).ok_or("mount id is not a number")?,
        parent_id: number(parent_id).ok_or("parent id is not a number")?,
        major: number(major).ok_or("major is not a number")?,
        minor: number(minor).ok_or("minor is not a number")?,
        // The root within the filesystem: a path, except for pseudo filesystems whose root
        // names an object (nsfs: `net:[4026532179]`), kept as written.
        root: PathBuf::from(OsStr::from_bytes(&unescape(root)?)),
        mount_point: path(mount_point)?,
        options: list(options)?,
        fs_type: text(fs_type)?,
        source: text(source)?,
        super_options: list(super_options)?,
    })
}

fn split_once(s: &[u8], sep: u8) -> Option<(&[u8], &[u8])> {
    let i = s.iter().position(|&b| b == sep)?;
    Some((s.get(..i)?, s.get(i + 1..)?))
}

fn number<T: std::str::FromStr>(s: &[u8]) -> Option<T> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}

fn path(s: &[u8]) -> Result<PathBuf, &'static str> {
    let decoded = unescape(s)?;
    if decoded.first() != Some(&b'/') {
        return Err("a path field is not absolute");
    }
    Ok(PathBuf::from(OsStr::from_bytes(&decoded)))
}

fn text(s: &[u8]) -> Result<String, &'static str> {
    if s.is_empty() {
        return Err("an empty field");
    }
    Ok(String::from_utf8_lossy(&unescape(s)?).into_owned())
}

/// A comma-separated list, split before decoding (an option value may hold an escaped comma).
fn list(s: &[u8]) -> Result<Vec<String>, &'static str> {
    if s.is_empty() {
        return Err("an empty option list");
    }
    s.split(|&b| b == b',')
        .map(|o| Ok(String::from_utf8_lossy(&unescape(o)?).into_owned()))
        .collect()
}

/// Decodes `\ooo` (three octal digits) escapes.
fn unescape(s: &[u8]) -> Result<Vec<u8>, &'static str> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while let Some(&b) = s.get(i) {
        if b == b'\\' {
            let digits = s.get(i + 1..i + 4).ok_or("a truncated escape")?;
            if !digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                return Err("an escape that is not three octal digits");
            }
            let value = digits.iter().fold(0u32, |v, d| v * 8 + u32::from(d - b'0'));
            out.push(u8::try_from(value).map_err(|_| "an escape above \\377")?);
            i += 4;
        } else {
            out.push(b);
            i += 1;
        }
    }
    Ok(out)
}

/// The mount visible at exactly `path`: of the mounts at that mount point, the one on top of the
/// stack (normally the last in the table; when the table is not in mount order, the one no other
/// mount at that point is stacked on). Paths compare by component (`/a/b/` is `/a/b`); give them
/// as the kernel shows them (absolute, symbolic links resolved).
pub fn top_mount<'a>(mounts: &'a [MountInfo], path: &Path) -> Option<&'a MountInfo> {
    let at: Vec<&MountInfo> = mounts.iter().filter(|m| m.mount_point == path).collect();
    let mut top = *at.last()?;
    for _ in 0..at.len() {
        match at
            .iter()
            .find(|m| m.parent_id == top.mount_id && m.mount_id != top.mount_id)
        {
            Some(above) => top = above,
            None => break,
        }
    }
    Some(top)
}

/// What is mounted at a bind target, compared with its view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindState {
    /// Nothing is mounted at the target.
    Missing,
    /// The target shows the view's filesystem and root, read-only.
    Verified,
    /// The target shows another device or root than the view (the view was replaced).
    Stale { device: (u32, u32), root: PathBuf },
    /// The target shows the view, but writable.
    Writable,
}

/// The state of the bind of `source` (the holder pod's mount of the view) at `target`.
/// `source` must itself be a mount point; if it is not (the kubelet unmounted it and only an
/// empty directory is left), binding it would bind nothing and this is
/// [`Error::NotAMountPoint`].
pub fn bind_state(mounts: &[MountInfo], source: &Path, target: &Path) -> Result<BindState, Error> {
    let view = top_mount(mounts, source).ok_or_else(|| Error::NotAMountPoint {
        path: source.to_path_buf(),
    })?;
    let Some(bound) = top_mount(mounts, target) else {
        return Ok(BindState::Missing);
    };
    Ok(
        if (bound.major, bound.minor) != (view.major, view.minor) || bound.root != view.root {
            BindState::Stale {
                device: (bound.major, bound.minor),
                root: bound.root.clone(),
            }
        } else if !bound.read_only() {
            BindState::Writable
        } else {
            BindState::Verified
        },
    )
}

/// What [`ensure_read_only_bind`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindOutcome {
    /// The verified bind was already there; nothing was done.
    Verified,
    /// There was no bind; one was made.
    Created,
    /// A stale or writable bind was unmounted and the bind made again.
    Redone,
}

/// Makes `target` a verified read-only (and `nosuid`, `nodev`) bind of the mount point `source`.
///
/// Reads the mount table; a verified bind is left alone; stale or writable mounts at the target
/// are detached (`MNT_DETACH`, each stacked one) and the bind made again; a missing one is made
/// (the target directory created if absent; a target that is a symbolic link or not a directory
/// is refused). The bind is `mount --bind` then a `MS_BIND|MS_REMOUNT|MS_RDONLY` remount. Then
/// the table is read again and anything but [`BindState::Verified`] is an error.
///
/// Both paths must be absolute; `source` is resolved (its symbolic links followed: it is the
/// kubelet's path), `target`'s parent is resolved and `target` itself must not be a link. A
/// target that is, contains or lies inside the source is refused.
pub fn ensure_read_only_bind(source: &Path, target: &Path) -> Result<BindOutcome, Error> {
    ensure_bind(source, target, false)
}

/// [`ensure_read_only_bind`] for a directory that pods also write into when nothing is bound
/// there (a hostPath reader's in-place fallback download): a missing bind is made only over an
/// **empty** target directory. A target holding anything while nothing is mounted there is
/// [`Error::Occupied`] and nothing is mounted: binding over it would hide what a running pod
/// wrote (and may still be writing) from that pod. Nothing in the target is ever removed. A
/// verified bind is left alone and a stale or writable one redone as by
/// [`ensure_read_only_bind`] (what lies under a mount is not looked at).
pub fn ensure_read_only_bind_over_empty(
    source: &Path,
    target: &Path,
) -> Result<BindOutcome, Error> {
    ensure_bind(source, target, true)
}

fn ensure_bind(source: &Path, target: &Path, over_empty: bool) -> Result<BindOutcome, Error> {
    absolute(source)?;
    absolute(target)?;
    let view = std::fs::canonicalize(source).map_err(|e| Error::io("resolve", source, e))?;
    let mounts = read_mountinfo()?;
    // Before the target is touched: binding an unmounted view would bind an empty directory.
    if top_mount(&mounts, &view).is_none() {
        return Err(Error::NotAMountPoint { path: view });
    }
    let exists = target_dir(target)?;
    let resolved = resolve(target, exists)?;
    if resolved.starts_with(&view) || view.starts_with(&resolved) {
        return Err(Error::Refused {
            path: resolved,
            reason: "is, contains or lies inside the view it would bind",
        });
    }
    if !exists {
        std::fs::create_dir_all(target).map_err(|e| Error::io("create directory", target, e))?;
        if !target_dir(target)? || resolve(target, true)? != resolved {
            return Err(Error::Refused {
                path: target.to_path_buf(),
                reason: "changed while it was being created",
            });
        }
    }
    let target = resolved;
    let outcome = match bind_state(&mounts, &view, &target)? {
        BindState::Verified => return Ok(BindOutcome::Verified),
        BindState::Missing => {
            if over_empty && !empty_dir(&target)? {
                return Err(Error::Occupied { path: target });
            }
            BindOutcome::Created
        }
        BindState::Stale { .. } | BindState::Writable => {
            detach_all(&target)?;
            BindOutcome::Redone
        }
    };
    bind_read_only(&view, &target)?;
    match bind_state(&read_mountinfo()?, &view, &target)? {
        BindState::Verified => Ok(outcome),
        state => {
            if state == BindState::Writable {
                // Our bind is on top but writable: never leave it for a reader.
                let _ =
                    rustix::mount::unmount(&target, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW);
            }
            Err(Error::BindNotVerified {
                view,
                target,
                state,
            })
        }
    }
}

/// Detaches every mount stacked at `target`; true when there was one. An absent target has
/// none; a target that is a symbolic link is refused.
pub fn unbind(target: &Path) -> Result<bool, Error> {
    absolute(target)?;
    if !target_dir(target)? {
        return Ok(false);
    }
    let target = std::fs::canonicalize(target).map_err(|e| Error::io("resolve", target, e))?;
    Ok(detach_all(&target)? > 0)
}

/// `target` with its symbolic links resolved; for an absent target, its nearest existing
/// ancestor resolved and the rest appended (`..` refused: it would resolve differently once the
/// directories exist).
fn resolve(target: &Path, exists: bool) -> Result<PathBuf, Error> {
    if exists {
        return std::fs::canonicalize(target).map_err(|e| Error::io("resolve", target, e));
    }
    if target
        .components()
        .any(|c| matches!(c, Component::ParentDir))
    {
        return Err(Error::Refused {
            path: target.to_path_buf(),
            reason: "holds a `..` component",
        });
    }
    let mut missing = Vec::new();
    let mut existing = target;
    loop {
        match std::fs::canonicalize(existing) {
            Ok(base) => return Ok(missing.iter().rev().fold(base, |p: PathBuf, c| p.join(c))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let (Some(name), Some(parent)) = (existing.file_name(), existing.parent()) else {
                    return Err(Error::io("resolve", target, e));
                };
                missing.push(name);
                existing = parent;
            }
            Err(e) => return Err(Error::io("resolve", existing, e)),
        }
    }
}

fn absolute(path: &Path) -> Result<(), Error> {
    if path.is_absolute() {
        Ok(())
    } else {
        Err(Error::NotAbsolute {
            path: path.to_path_buf(),
        })
    }
}

/// Whether `target` is a directory (false when absent); a symbolic link or anything else is
/// refused.
fn target_dir(target: &Path) -> Result<bool, Error> {
    match std::fs::symlink_metadata(target) {
        Ok(m) if m.file_type().is_symlink() => Err(Error::Refused {
            path: target.to_path_buf(),
            reason: "is a symbolic link, refused as a bind target",
        }),
        Ok(m) if m.is_dir() => Ok(true),
        Ok(_) => Err(Error::Refused {
            path: target.to_path_buf(),
            reason: "is not a directory",
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io("stat (no symlinks)", target, e)),
    }
}

/// Whether the directory `dir` (resolved, not a link) has no entry.
fn empty_dir(dir: &Path) -> Result<bool, Error> {
    let mut entries = std::fs::read_dir(dir).map_err(|e| Error::io("read directory", dir, e))?;
    match entries.next() {
        None => Ok(true),
        Some(Ok(_)) => Ok(false),
        Some(Err(e)) => Err(Error::io("read directory", dir, e)),
    }
}

/// Unmounts (detaching, never following a link) until the table shows nothing at `target`;
/// returns how many were unmounted.
fn detach_all(target: &Path) -> Result<usize, Error> {
    for done in 0..MAX_STACKED {
        if top_mount(&read_mountinfo()?, target).is_none() {
            return Ok(done);
        }
        match rustix::mount::unmount(target, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW) {
            // Not a mount point any more: someone else unmounted it; the table says next round.
            Ok(()) | Err(Errno::INVAL) => {}
            Err(e) => return Err(Error::io("unmount (detach)", target, e)),
        }
    }
    if top_mount(&read_mountinfo()?, target).is_none() {
        return Ok(MAX_STACKED);
    }
    Err(Error::StillMounted {
        path: target.to_path_buf(),
        tries: MAX_STACKED,
    })
}

fn bind_read_only(view: &Path, target: &Path) -> Result<(), Error> {
    rustix::mount::mount_bind(view, target).map_err(|e| Error::io("bind mount", target, e))?;
    let flags = MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV;
    if let Err(e) = rustix::mount::mount_remount(target, flags, c"") {
        // Never leave a writable bind behind.
        let _ = rustix::mount::unmount(target, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW);
        return Err(Error::io("remount read-only", target, e));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 shared:7 - ext3 /dev/root rw,errors=continue
40 27 0:45 /dir\\040with\\011tab /mnt/a\\040b\\012c\\134d ro,nosuid - tmpfs my\\040src rw,size=1k,opt=a\\054b
84 63 0:4 net:[4026532179] /run/netns/cni-f402 rw shared:36 - nsfs nsfs rw
";

    #[test]
    fn parses_fields_escapes_and_optional_fields() {
        let m = parse_mountinfo(SAMPLE).unwrap();
        assert_eq!(m.len(), 5);
        // A namespace file bind-mounted (what a CNI leaves under /run/netns): its root names
        // the namespace, not a path.
        assert_eq!(m[4].root, Path::new("net:[4026532179]"));
        assert_eq!(m[4].fs_type, "nsfs");
        assert_eq!(m[0].mount_id, 22);
        assert_eq!(m[0].fs_type, "proc");
        assert_eq!(m[1].major, 254);
        assert_eq!(m[1].minor, 0);
        assert_eq!(m[1].mount_point, Path::new("/"));
        assert_eq!(m[2].parent_id, 35);
        assert_eq!(m[2].root, Path::new("/mnt1"));
        assert_eq!(m[2].options, vec!["rw", "noatime"]);
        assert_eq!(m[2].fs_type, "ext3");
        assert_eq!(m[2].source, "/dev/root");
        assert_eq!(m[2].super_options, vec!["rw", "errors=continue"]);
        assert!(!m[2].read_only());
        assert_eq!(m[3].root, Path::new("/dir with\ttab"));
        assert_eq!(m[3].mount_point, Path::new("/mnt/a b\nc\\d"));
        assert_eq!(m[3].source, "my src");
        assert_eq!(m[3].super_options, vec!["rw", "size=1k", "opt=a,b"]);
        assert!(m[3].read_only());
    }

    #[test]
    fn malformed_lines_name_their_number() {
        let good = "22 27 0:21 / /proc rw - proc proc rw\n";
        let cases = [
            ("22 27 0:21 / /proc rw proc proc rw", "separator"),
            ("22 27 0:21 / /proc rw - proc proc", "three fields"),
            ("22 27 0:21 / /proc rw - proc proc rw extra", "three fields"),
            ("x 27 0:21 / /proc rw - proc proc rw", "mount id"),
            ("22 27 021 / /proc rw - proc proc rw", "major:minor"),
            ("22 27 0:x / /proc rw - proc proc rw", "minor"),
            ("22 27 0:21 / proc rw - proc proc rw", "absolute"),
            ("22 27 0:21 / /p\\04 rw - proc proc rw", "escape"),
            ("22 27 0:21 / /p\\09x rw - proc proc rw", "octal"),
            ("22 27 0:21 / /p\\777 rw - proc proc rw", "above"),
            ("", "separator"),
            ("- 27 0:21 / /proc rw", "separator"),
        ];
        for (bad, reason) in cases {
            let text = format!("{good}{bad}\n{good}");
            match parse_mountinfo(&text).unwrap_err() {
                Error::MountInfo {
                    line, reason: r, ..
                } => {
                    assert_eq!(line, 2, "{bad:?}");
                    assert!(r.contains(reason), "{bad:?}: {r}");
                }
                other => panic!("{other}"),
            }
        }
        assert!(parse_mountinfo("").unwrap().is_empty());
        // The line is shown escaped in the message.
        let e = parse_mountinfo("1 2 x\x1b[31m").unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("\\u{1b}"), "{e}");
    }

    #[test]
    fn reads_this_process_table() {
        let m = read_mountinfo().unwrap();
        let root = top_mount(&m, Path::new("/")).expect("a mount at /");
        assert!(!root.fs_type.is_empty());
        assert!(top_mount(&m, Path::new("/proc")).is_some());
    }

    fn mount(id: u64, parent: u64, dev: (u32, u32), root: &str, at: &str, opts: &str) -> MountInfo {
        MountInfo {
            mount_id: id,
            parent_id: parent,
            major: dev.0,
            minor: dev.1,
            root: root.into(),
            mount_point: at.into(),
            options: opts.split(',').map(String::from).collect(),
            fs_type: "tmpfs".into(),
            source: "none".into(),
            super_options: vec!["rw".into()],
        }
    }

    #[test]
    fn top_mount_is_the_top_of_the_stack() {
        let table = vec![
            mount(1, 0, (8, 1), "/", "/", "rw"),
            mount(5, 1, (0, 50), "/", "/t", "rw"),
            mount(6, 5, (0, 51), "/", "/t", "ro"),
            mount(7, 1, (0, 52), "/", "/u", "rw"),
        ];
        assert_eq!(top_mount(&table, Path::new("/t")).unwrap().mount_id, 6);
        assert_eq!(top_mount(&table, Path::new("/t/")).unwrap().mount_id, 6);
        assert!(top_mount(&table, Path::new("/t/x")).is_none());
        // Out of mount order: the one stacked on top still wins.
        let reordered = vec![table[0].clone(), table[2].clone(), table[1].clone()];
        assert_eq!(top_mount(&reordered, Path::new("/t")).unwrap().mount_id, 6);
    }

    #[test]
    fn bind_states() {
        let view = mount(10, 1, (0, 60), "/", "/pods/p/volumes/v/mount", "ro");
        let base = vec![mount(1, 0, (8, 1), "/", "/", "rw"), view.clone()];
        let src = Path::new("/pods/p/volumes/v/mount");
        let tgt = Path::new("/views/v");
        assert_eq!(bind_state(&base, src, tgt).unwrap(), BindState::Missing);
        let mut t = base.clone();
        t.push(mount(11, 1, (0, 60), "/", "/views/v", "ro,nosuid"));
        assert_eq!(bind_state(&t, src, tgt).unwrap(), BindState::Verified);
        let mut t = base.clone();
        t.push(mount(11, 1, (0, 60), "/", "/views/v", "rw"));
        assert_eq!(bind_state(&t, src, tgt).unwrap(), BindState::Writable);
        let mut t = base.clone();
        t.push(mount(11, 1, (0, 59), "/", "/views/v", "ro"));
        assert_eq!(
            bind_state(&t, src, tgt).unwrap(),
            BindState::Stale {
                device: (0, 59),
                root: "/".into()
            }
        );
        let mut t = base.clone();
        t.push(mount(11, 1, (0, 60), "/sub", "/views/v", "ro"));
        assert!(matches!(
            bind_state(&t, src, tgt).unwrap(),
            BindState::Stale { .. }
        ));
        // A verified bind under a stale one on top is still stale: the top is what readers see.
        let mut t = base.clone();
        t.push(mount(11, 1, (0, 60), "/", "/views/v", "ro"));
        t.push(mount(12, 11, (0, 61), "/", "/views/v", "ro"));
        assert!(matches!(
            bind_state(&t, src, tgt).unwrap(),
            BindState::Stale { .. }
        ));
        // The view not mounted (only its directory left): an error, not Missing.
        let unmounted = vec![base[0].clone()];
        assert!(matches!(
            bind_state(&unmounted, src, tgt),
            Err(Error::NotAMountPoint { .. })
        ));
    }
}
