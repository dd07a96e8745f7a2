//! Trees on the real filesystem, and comparing them.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;

pub const REV: &str = "0123456789abcdef0123456789abcdef01234567";

/// Whether this process is root (tests that chown or mount need it; CI runs as root).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

pub fn write(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
}

/// Deterministic pseudo-random bytes.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut v = vec![0u8; len];
    rng.fill(&mut v);
    v
}

/// A Hugging Face cache as `hf download` leaves it under `HF_HOME/hub`: blobs, snapshot links
/// into `../../blobs`, `refs/main`, lock files, nested directories, empty files, a name with
/// spaces, an empty directory, assorted modes.
pub fn hf_tree(root: &Path) {
    let repo = root.join("models--acme--tiny-llm");
    let blobs = repo.join("blobs");
    let snap = repo.join("snapshots").join(REV);
    let files: [(&str, Vec<u8>, &str); 6] = [
        (
            "config.json",
            br#"{"architectures":["LlamaForCausalLM"],"hidden_size":64}"#.to_vec(),
            "b1",
        ),
        ("model-00001-of-00002.safetensors", bytes(1, 300_000), "b2"),
        (
            "model-00002-of-00002.safetensors",
            bytes(2, 1_048_576 + 17),
            "b3",
        ),
        ("tokenizer.json", bytes(3, 70_000), "b4"),
        ("empty.txt", Vec::new(), "b5"),
        (
            "nested/dir with spaces/special tokens map.json",
            b"{}".to_vec(),
            "b6",
        ),
    ];
    for (name, content, blob) in &files {
        let blob_name = format!("{blob}{}", "0".repeat(62));
        write(&blobs.join(&blob_name), content);
        let link = snap.join(name);
        fs::create_dir_all(link.parent().unwrap()).unwrap();
        let depth = name.matches('/').count();
        let target = format!("{}../../blobs/{blob_name}", "../".repeat(depth));
        symlink(target, &link).unwrap();
    }
    write(&repo.join("refs").join("main"), REV.as_bytes());
    write(&root.join(".locks/models--acme--tiny-llm/b2.lock"), b"");
    write(&root.join("version.txt"), b"1");
    write(&root.join("a file with spaces.txt"), b"spaces\n");
    fs::create_dir_all(root.join("empty-dir")).unwrap();
    fs::create_dir_all(repo.join(".no_exist").join(REV)).unwrap();
    write(&root.join("run.sh"), b"#!/bin/sh\n");
    fs::set_permissions(root.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    write(&root.join("private"), b"secret");
    fs::set_permissions(root.join("private"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(root.join("empty-dir"), fs::Permissions::from_mode(0o750)).unwrap();
}

/// `du -sb PATH`.
pub fn du_sb(path: &Path) -> u64 {
    let out = Command::new("du").arg("-sb").arg(path).output().unwrap();
    assert!(
        out.status.success(),
        "du: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    text.split_whitespace().next().unwrap().parse().unwrap()
}

/// One entry of a tree, as compared between source and copy.
#[derive(Debug, PartialEq, Eq)]
pub enum Node {
    Dir {
        mode: u32,
        uid: u32,
        gid: u32,
    },
    File {
        mode: u32,
        uid: u32,
        gid: u32,
        mtime: (i64, i64),
        content: Blob,
    },
    Link {
        target: PathBuf,
        uid: u32,
        gid: u32,
    },
}

/// File content, shown as its length and digest.
#[derive(PartialEq, Eq)]
pub struct Blob(pub Vec<u8>);

impl std::fmt::Debug for Blob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use sha2::Digest;
        let digest = hex::encode(sha2::Sha256::digest(&self.0));
        write!(f, "{} bytes, sha256 {}", self.0.len(), &digest[..12])
    }
}

/// Every entry under `root` by relative path (never following links), leaving out the root
/// entries named in `skip`. Permission bits as the copier keeps them (setuid, setgid and sticky
/// cleared) when `copied_modes`.
pub fn tree(root: &Path, skip: &[&str], copied_modes: bool) -> BTreeMap<PathBuf, Node> {
    let mut out = BTreeMap::new();
    walk(root, root, skip, copied_modes, &mut out);
    out
}

fn walk(root: &Path, dir: &Path, skip: &[&str], copied: bool, out: &mut BTreeMap<PathBuf, Node>) {
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let rel = path.strip_prefix(root).unwrap().to_path_buf();
        if dir == root && skip.iter().any(|s| entry.file_name() == OsStr::new(s)) {
            continue;
        }
        let m = fs::symlink_metadata(&path).unwrap();
        let mode = if copied {
            m.mode() & 0o777
        } else {
            m.mode() & 0o7777
        };
        let node = if m.file_type().is_symlink() {
            Node::Link {
                target: fs::read_link(&path).unwrap(),
                uid: m.uid(),
                gid: m.gid(),
            }
        } else if m.is_dir() {
            walk(root, &path, skip, copied, out);
            Node::Dir {
                mode,
                uid: m.uid(),
                gid: m.gid(),
            }
        } else if m.is_file() {
            Node::File {
                mode,
                uid: m.uid(),
                gid: m.gid(),
                mtime: (m.mtime(), m.mtime_nsec()),
                content: Blob(fs::read(&path).unwrap()),
            }
        } else {
            panic!("{} is not a file, directory or link", path.display());
        };
        out.insert(rel, node);
    }
}

/// The names directly in `dir`, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Runs `sha256sum -c --quiet .nvsnap-manifest` in `root`, as an operator would.
pub fn sha256sum_check(root: &Path) {
    let out = Command::new("sha256sum")
        .args(["-c", "--quiet", "--strict", ".nvsnap-manifest"])
        .current_dir(root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sha256sum -c: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn path_of(bytes: &[u8]) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(bytes))
}
