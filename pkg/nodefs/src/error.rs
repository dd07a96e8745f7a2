//! The crate's one error type, and how paths from untrusted trees are shown in it.

use std::fmt;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::mounts::BindState;

/// Everything that can go wrong. Every variant names the path it is about (shown escaped, see
/// [`Shown`]) and, for system calls, the operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A system call failed.
    #[error("{op} {}: {cause}", Shown(path))]
    Io {
        /// What was being done, e.g. `"create file (exclusive, no symlinks)"`.
        op: &'static str,
        path: PathBuf,
        #[source]
        cause: io::Error,
    },
    /// The tree holds a device, FIFO or socket (a model never needs one).
    #[error(
        "{}: {kind} refused: a model tree may hold only regular files, directories and symbolic links",
        Shown(path)
    )]
    SpecialFile { path: PathBuf, kind: &'static str },
    /// Directories nested deeper than [`MAX_DEPTH`](crate::MAX_DEPTH).
    #[error("{}: more than {max} nested directories", Shown(path))]
    TooDeep { path: PathBuf, max: usize },
    /// A directory of a tree is reached through another mount than the tree's root (a mount
    /// inside it): copying, removing or verifying through it would act on another filesystem.
    #[error("{}: a mount inside the tree, refused", Shown(path))]
    CrossesMount { path: PathBuf },
    /// The copy attempt name is not 1 to 40 of `[a-z0-9-]`.
    #[error(
        "copy attempt {}: must be 1 to 40 characters of [a-z0-9-]",
        Shown(Path::new(attempt))
    )]
    InvalidAttempt { attempt: String },
    /// Source and destination are the same directory, or one is inside the other.
    #[error("source {} and destination {} overlap", Shown(tree), Shown(dest_root))]
    Overlap { tree: PathBuf, dest_root: PathBuf },
    /// A path refused for what it is: a symbolic link where a directory must be, not a
    /// directory, a name with a NUL byte, a bind target overlapping its view.
    #[error("{}: {reason}", Shown(path))]
    Refused { path: PathBuf, reason: &'static str },
    /// The published tree differs from the manifest or from what was copied.
    #[error("verification of {}: {}: {problem}", Shown(root), Shown(path))]
    Verify {
        root: PathBuf,
        /// The first differing path, relative to `root` (sorted by bytes).
        path: PathBuf,
        problem: Problem,
    },
    /// The manifest cannot be read as one.
    #[error("{} line {line}: {reason}", Shown(path))]
    Manifest {
        path: PathBuf,
        /// 1-based; 0 when the whole file is meant.
        line: usize,
        reason: &'static str,
    },
    /// The completion marker exists but is not what the copier writes.
    #[error("{}: {reason}", Shown(path))]
    Marker { path: PathBuf, reason: &'static str },
    /// A worker thread of the copy (hashing, syncing) stopped before its work was done.
    #[error("{}: the {worker} thread stopped unexpectedly", Shown(path))]
    Worker { path: PathBuf, worker: &'static str },
    /// A line of a mount table is not in the proc(5) mountinfo format.
    #[error(
        "mountinfo line {line}: {reason}: {}",
        Shown(Path::new(std::ffi::OsStr::from_bytes(text)))
    )]
    MountInfo {
        /// 1-based.
        line: usize,
        reason: &'static str,
        /// The line, truncated to 256 bytes.
        text: Vec<u8>,
    },
    /// A path that must be absolute is not.
    #[error("{}: must be an absolute path", Shown(path))]
    NotAbsolute { path: PathBuf },
    /// The view to bind is not itself a mount point (for example the kubelet unmounted it and
    /// only an empty directory is left): binding it would bind nothing.
    #[error(
        "{}: not a mount point, refusing to bind it (the view is not mounted)",
        Shown(path)
    )]
    NotAMountPoint { path: PathBuf },
    /// A volume root to open for a writer is not the root of the mount on top at its path (the
    /// kubelet has not mounted the volume there yet, or mounted or unmounted it meanwhile): the
    /// directory would be the node's own disk, and nothing is changed.
    #[error(
        "{}: not the root of a mounted volume (not mounted yet?); nothing is changed on the node's own disk",
        Shown(path)
    )]
    NotAVolumeRoot { path: PathBuf },
    /// A volume root to open for a writer is owned by another user than root or the writer: it
    /// is not a fresh export, and is left as it is.
    #[error(
        "{}: owned by uid {owner}, neither root nor the writer; not a fresh volume root, left as it is",
        Shown(path)
    )]
    ForeignOwner { path: PathBuf, owner: u32 },
    /// A bind was made but the mount table does not show the verified read-only bind.
    #[error(
        "bind {} onto {}: the mount table afterwards shows {state:?}",
        Shown(view),
        Shown(target)
    )]
    BindNotVerified {
        view: PathBuf,
        target: PathBuf,
        state: BindState,
    },
    /// A bind target that holds data while nothing is mounted there (a pod wrote into it):
    /// not bound over, nothing removed.
    #[error(
        "{}: holds data with nothing mounted there (a pod's own download?); not bound over, nothing removed",
        Shown(path)
    )]
    Occupied { path: PathBuf },
    /// Mounts stay stacked at a target after repeated detaching unmounts.
    #[error(
        "{}: still a mount point after {tries} detaching unmounts",
        Shown(path)
    )]
    StillMounted { path: PathBuf, tries: usize },
}

/// What is wrong with one path when a published tree is verified.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// Listed (or copied) but not in the tree.
    Missing,
    /// In the tree but not listed (or not copied).
    Extra,
    /// The content's SHA-256 differs.
    Differs { expected: String, actual: String },
    /// Listed as a regular file, but the tree holds another kind of entry there.
    NotRegular { kind: &'static str },
    /// A symbolic link's target differs from the copied one.
    LinkTarget,
    /// The manifest on disk differs from what the copier hashed.
    ManifestDiffers,
    /// The copy's source is not what the copy read any more (another inode or kind of entry, a
    /// symbolic link, gone, another size or modification or change time, other bytes): a source
    /// written during or after the copy, whose published copy cannot be vouched for.
    SourceChanged,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Missing => f.write_str("missing"),
            Problem::Extra => f.write_str("not listed (extra)"),
            Problem::Differs { expected, actual } => {
                write!(f, "content differs: sha256 {actual}, expected {expected}")
            }
            Problem::NotRegular { kind } => write!(f, "listed as a regular file but is a {kind}"),
            Problem::LinkTarget => f.write_str("symbolic link target differs from the copied one"),
            Problem::ManifestDiffers => f.write_str("the manifest differs from what was copied"),
            Problem::SourceChanged => {
                f.write_str("the source changed during or after the copy (not what was read)")
            }
        }
    }
}

impl Error {
    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
        cause: impl Into<io::Error>,
    ) -> Self {
        Error::Io {
            op,
            path: path.into(),
            cause: cause.into(),
        }
    }

    /// The OS error of a failed system call, if this is one.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::Io { cause, .. } => cause.raw_os_error(),
            _ => None,
        }
    }
}

/// At most this many bytes of a path are shown in a message.
const SHOWN_MAX: usize = 1024;

/// A path shown safely in a message or log line: printable characters as they are; `\`,
/// control characters (newline, carriage return, escape, ...) and bytes that are not UTF-8 as
/// escapes (`\\`, `\n`, `\u{1b}`, `\xff`); at most 1024 bytes, then `...`. A hostile file name
/// can neither break a log line nor forge one.
pub struct Shown<'a>(pub &'a Path);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.0.as_os_str().as_bytes();
        let (bytes, cut) = match bytes.get(..SHOWN_MAX) {
            Some(head) if bytes.len() > SHOWN_MAX => (head, true),
            _ => (bytes, false),
        };
        for chunk in bytes.utf8_chunks() {
            for c in chunk.valid().chars() {
                match c {
                    '\\' => f.write_str("\\\\")?,
                    '\n' => f.write_str("\\n")?,
                    '\r' => f.write_str("\\r")?,
                    '\t' => f.write_str("\\t")?,
                    c if c.is_control() || is_invisible(c) => write!(f, "\\u{{{:x}}}", c as u32)?,
                    c => fmt::Write::write_char(f, c)?,
                }
            }
            for b in chunk.invalid() {
                write!(f, "\\x{b:02x}")?;
            }
        }
        if cut {
            f.write_str("...")?;
        }
        Ok(())
    }
}

/// Format characters that would let a name reorder or hide text in a terminal (bidirectional
/// overrides, zero-width characters, line and paragraph separators).
fn is_invisible(c: char) -> bool {
    matches!(c, '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    fn shown(bytes: &[u8]) -> String {
        Shown(Path::new(OsStr::from_bytes(bytes))).to_string()
    }

    #[test]
    fn escapes_what_could_break_a_line() {
        assert_eq!(shown(b"a b/c.json"), "a b/c.json");
        assert_eq!(shown(b"x\ny"), "x\\ny");
        assert_eq!(shown(b"x\\y"), "x\\\\y");
        assert_eq!(shown(b"\r\t\x1b[31m"), "\\r\\t\\u{1b}[31m");
        assert_eq!(shown(b"caf\xc3\xa9"), "café");
        assert_eq!(shown(b"bad\xff\xfe"), "bad\\xff\\xfe");
        assert_eq!(shown("a\u{202e}b".as_bytes()), "a\\u{202e}b");
    }

    #[test]
    fn long_paths_are_cut() {
        let long = vec![b'a'; 5000];
        let s = shown(&long);
        assert_eq!(s.len(), SHOWN_MAX + 3);
        assert!(s.ends_with("..."));
    }

    #[test]
    fn messages_name_path_and_operation() {
        let e = Error::io(
            "open",
            "/v/a\nb",
            io::Error::from_raw_os_error(rustix::io::Errno::LOOP.raw_os_error()),
        );
        let s = e.to_string();
        assert!(s.starts_with("open /v/a\\nb: "), "{s}");
        assert!(!s.contains('\n'));
        assert_eq!(
            e.raw_os_error(),
            Some(rustix::io::Errno::LOOP.raw_os_error())
        );
    }
}
