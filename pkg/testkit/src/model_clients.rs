//! The real model download clients in an image for the real node: the Hugging Face CLI `hf`
//! (PyPI `huggingface_hub`, installed and pinned by `hack/model-clients.sh`), with the Python
//! that runs it, so a pod downloads a model the way charts do (`hf download ...`), from a
//! simulated model source reached through [`PodNetwork`](crate::PodNetwork)'s egress.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{ImageBuilder, TestkitError, shared_libraries};

/// Environment variable naming the bin directory of the clients' virtual environment (what
/// `hack/model-clients.sh` prints); without it the script is run (it installs once, cached).
pub const ENV_MODEL_CLIENTS: &str = "WARMCACHE_MODEL_CLIENTS";

/// The bin directory holding `hf` (and the venv's `python`).
pub fn model_clients_dir() -> Result<PathBuf, TestkitError> {
    if let Some(dir) = std::env::var_os(ENV_MODEL_CLIENTS) {
        return Ok(PathBuf::from(dir));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hack/model-clients.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .map_err(|e| TestkitError::io(format!("running {}", script.display()), e))?;
    if !out.status.success() {
        return Err(TestkitError::Command {
            command: script.display().to_string(),
            status: out.status.to_string(),
            output: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .last()
        .map(|l| PathBuf::from(l.trim()))
        .ok_or_else(|| {
            TestkitError::InvalidArgument(format!("{} printed no path", script.display()))
        })
}

/// An image `reference` with the busybox tools (`/bin/sh`, `sha256sum`, ...) and `hf` on its
/// `PATH`: the virtual environment of `clients` (a bin directory as [`model_clients_dir`]
/// returns) and its base interpreter, each at the path it has on this machine (the venv's
/// scripts name their interpreter by absolute path), the interpreter's standard library
/// without its tests and its own site-packages, and every shared library they load. `work` is
/// a directory for staging.
pub fn hf_client_image(
    reference: &str,
    clients: &Path,
    work: &Path,
) -> Result<ImageBuilder, TestkitError> {
    let venv = clients.parent().ok_or_else(|| {
        TestkitError::InvalidArgument(format!("{} has no parent", clients.display()))
    })?;
    let cfg = std::fs::read_to_string(venv.join("pyvenv.cfg"))
        .map_err(|e| TestkitError::io(format!("reading {}/pyvenv.cfg", venv.display()), e))?;
    let home = cfg
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "home").then(|| PathBuf::from(v.trim()))
        })
        .ok_or_else(|| {
            TestkitError::InvalidArgument(format!("{}/pyvenv.cfg names no home", venv.display()))
        })?;
    let base = home.parent().ok_or_else(|| {
        TestkitError::InvalidArgument(format!("{} has no parent", home.display()))
    })?;
    let version = cfg
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "version").then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    let minor: String = version.split('.').take(2).collect::<Vec<_>>().join(".");
    let python = home.join(format!("python{minor}"));
    if minor.is_empty() || !python.is_file() {
        return Err(TestkitError::InvalidArgument(format!(
            "{}/pyvenv.cfg: no interpreter python{minor} in {}",
            venv.display(),
            home.display()
        )));
    }
    let stdlib = base.join(format!("lib/python{minor}"));
    let staged = work.join("stdlib");
    std::fs::create_dir_all(&staged)
        .map_err(|e| TestkitError::io(format!("creating {}", staged.display()), e))?;
    // The standard library without the base interpreter's own packages and the test suites.
    let copy = Command::new("sh")
        .arg("-c")
        .arg(
            "tar -C \"$1\" --exclude=./site-packages --exclude=./test --exclude=./idlelib \
             --exclude=./tkinter --exclude=./turtledemo --exclude=./ensurepip -cf - . \
             | tar -C \"$2\" -xf -",
        )
        .arg("sh")
        .arg(&stdlib)
        .arg(&staged)
        .output()
        .map_err(|e| TestkitError::io("copying the standard library", e))?;
    if !copy.status.success() {
        return Err(TestkitError::Command {
            command: format!("tar of {}", stdlib.display()),
            status: copy.status.to_string(),
            output: String::from_utf8_lossy(&copy.stderr).into_owned(),
        });
    }
    // Everything that loads shared libraries: the interpreter and every extension module.
    let mut loaders = vec![python.clone()];
    for dir in [staged.join("lib-dynload"), venv.to_path_buf()] {
        find_extensions(&dir, &mut loaders);
    }
    let mut libraries = BTreeSet::new();
    for binary in &loaders {
        libraries.extend(shared_libraries(binary)?);
    }
    let dest = |p: &Path| p.display().to_string();
    let mut image = ImageBuilder::new(reference)?
        .tools()
        .file(&python, &dest(&python), 0o755)
        .file(&python, &dest(&home.join("python3")), 0o755)
        .directory(&staged, &dest(&stdlib))
        .directory(venv, &dest(venv))
        .env(
            "PATH",
            &format!("{}:/usr/local/bin:/usr/bin:/bin", clients.display()),
        )
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1");
    for library in libraries {
        image = image.file(&library, &dest(&library), 0o755);
    }
    Ok(image)
}

/// Every `*.so` below `dir`.
fn find_extensions(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => find_extensions(&path, out),
            Ok(t) if t.is_file() && path.extension().is_some_and(|e| e == "so") => out.push(path),
            _ => {}
        }
    }
}
