//! The node agent's filesystem and mount core: measuring a staged model tree, copying it safely
//! into a freshly attached volume (manifest, verification, completion marker), and read-only
//! bind mounts of a view verified against the mount table. Linux only; synchronous (callers in
//! an async runtime run it on a blocking thread).
//!
//! The input trees are untrusted: a model repository or an engine may put symbolic links,
//! devices, FIFOs, sockets, hard links, long or newline-holding names in them. The rules, and why
//! each one exists:
//!
//! - **Never follow a symbolic link, in the source or the destination.** Every entry is opened
//!   relative to an open directory descriptor, one component at a time, with `O_NOFOLLOW`
//!   (`O_DIRECTORY` for directories); links are recreated verbatim with `readlinkat` /
//!   `symlinkat`. A retried extraction that merges into an earlier one is the classic escape: the
//!   earlier attempt left `d -> .` and `f -> ../victim`, the new tree has a real `d/f`, and a
//!   copier writing `root/d/f` by path writes the victim outside the volume. Here nothing is
//!   written through a path: the copy goes into a fresh staging directory where every entry is
//!   created with `O_CREAT|O_EXCL|O_NOFOLLOW` (or `mkdirat`/`symlinkat`, which never follow), and
//!   publishing removes the root's old entries (unlinking links, never following them) and
//!   `renameat`s the new ones in, which replaces a name and never writes through it.
//! - **Only regular files, directories and links.** A model never needs a device, FIFO or socket;
//!   one is an error naming it (opening a FIFO could block, a device could read anything).
//!   Setuid, setgid and sticky bits are cleared; owners and times are kept.
//! - **The marker is removed first and written last.** `.nvsnap-complete` means "the tree beside
//!   me is whole and verified". An earlier attempt's marker is removed and the removal fsynced
//!   before anything else in the volume is touched, so a crash at any later point leaves no
//!   stale marker over partial content; the new marker is written only after every file and
//!   directory was fsynced, published, listed in the manifest and verified by reading it back.
//! - **A manifest an operator can check.** `.nvsnap-manifest` is `sha256sum -c` input, names
//!   escaped as `sha256sum` escapes them, so a name holding a newline cannot forge a line. Paths
//!   in errors are escaped too ([`Shown`]).
//! - **Binds are verified against the mount table, never remembered.** A view can be replaced
//!   under a bind (the kubelet unmounts the holder pod's volume and mounts a new one), and a
//!   remembered "bound" would then serve stale or empty content. [`ensure_read_only_bind`] reads
//!   `/proc/self/mountinfo`, compares device, root and read-only flag, redoes what is stale, and
//!   reports success only when the table read afterwards shows the verified bind. A view that is
//!   not a mount point is refused: binding it would bind an empty directory.
//! - **A tree another party controls is reached without a link.** [`open_dir_beneath`] opens a
//!   directory of it (a capture source's landing in its pod's emptyDir) one component at a time
//!   with `O_NOFOLLOW|O_DIRECTORY`, refusing a link, `..` or another mount on the way;
//!   [`measure_dir`] and [`copy_dir_into_mount`] then work from that descriptor, so a link the
//!   pod swaps into the path afterwards changes nothing.
//! - **A selection leaves out, it never lets in.** A copy or a measure with a selection
//!   ([`Keep`]: a compile-cache set takes only its cache directories, never a credential) asks
//!   it about each entry's relative path before opening the entry; an entry left out is never
//!   opened, a directory left out never entered, and every symbolic link and non-UTF-8 name is
//!   left out. Everything else (no link followed, no mount crossed, special files refused,
//!   manifest, verification, marker) is the unselected copy's; an empty selection is a valid,
//!   complete copy of nothing.
//! - **A volume root is opened for a writer only on its mount.** [`open_root`] changes the owner
//!   of one directory, the root of a mounted volume, through the descriptor it checked: the
//!   opened directory must be the top mount at the path (never the node's disk under a kubelet
//!   directory not mounted yet), root-owned or already the writer's.
//! - **Bounded.** Directories nested deeper than [`MAX_DEPTH`] are refused (each level holds a
//!   descriptor), the manifest and marker are read with size limits, and a mount inside a tree
//!   being copied, removed or verified is refused rather than crossed.
//!
//! Threads: [`copy_tree`] copies regular files on one worker per core (at most four), each with
//! a hashing thread of its own, fsyncs on one more thread, and verifies (comparing each
//! published file with its source) on one thread per core; [`verify_manifest`] hashes on one
//! thread per core; all are joined before they return. `docs/node-agent.md` ("The filesystem rules")
//! describes the rules for operators; `docs/benchmarks.md` has the copy's cost against `cp -a`.

mod at;
mod beneath;
pub mod copy;
mod error;
pub mod measure;
pub mod mounts;
mod open;

pub use at::{Keep, MAX_DEPTH};
pub use beneath::{TreeDir, open_dir_beneath};
pub use copy::{
    CopyReport, MANIFEST, MARKER, STAGING_PREFIX, VerifyReport, copy_dir_into_mount,
    copy_dir_into_mount_selected, copy_tree, copy_tree_into_mount, copy_tree_selected, is_complete,
    verify_manifest,
};
pub use error::{Error, Problem, Shown};
pub use measure::{measure, measure_dir, measure_dir_selected};
pub use mounts::{
    BindOutcome, BindState, MountInfo, bind_state, ensure_read_only_bind,
    ensure_read_only_bind_over_empty, parse_mountinfo, read_mountinfo, top_mount, unbind,
};
pub use open::{OpenOutcome, open_root};
