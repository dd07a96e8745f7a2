//! The warmcache image: every component binary under `/usr/local/bin`, the shared libraries they
//! link (found with `ldd`, copied from this machine), `/etc/passwd` and `/etc/group` with the
//! `nonroot` user 65532 the chart runs them as, and nothing else (no shell, no `/tmp`: the
//! chart mounts the root file system read-only and the components write no file). `hack/build-image.sh` builds it from release binaries as an OCI archive that
//! `skopeo copy oci-archive:...` or `crane push` sends to a registry; the chart tests import it
//! into the real node.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{ImageBuilder, TestkitError};

/// The binaries of the image, as the chart's Deployments name them (`/usr/local/bin/<name>`).
pub const COMPONENT_BINARIES: [&str; 6] = [
    "webhook",
    "binding-controller",
    "kvcache-operator",
    "uninstall-hook",
    "reaper",
    "model-volume-controller",
];

/// The user the image runs as, `nonroot` (uid and gid 65532).
pub const NONROOT: &str = "65532:65532";

/// The shared libraries `binary` loads (absolute paths from `ldd`, the dynamic loader included).
pub fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>, TestkitError> {
    let output = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|e| TestkitError::io(format!("running ldd {}", binary.display()), e))?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        // A static binary: "not a dynamic executable".
        if String::from_utf8_lossy(&output.stderr).contains("not a dynamic executable")
            || text.contains("not a dynamic executable")
            || text.contains("statically linked")
        {
            return Ok(Vec::new());
        }
        return Err(TestkitError::Command {
            command: format!("ldd {}", binary.display()),
            status: output.status.to_string(),
            output: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    let mut libraries = Vec::new();
    for line in text.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x...)"; the vDSO has no file.
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(path) = path.filter(|p| p.starts_with('/')) {
            libraries.push(PathBuf::from(path));
        } else if line.contains("not found") {
            return Err(TestkitError::InvalidArgument(format!(
                "{}: a shared library is missing: {}",
                binary.display(),
                line.trim()
            )));
        }
    }
    Ok(libraries)
}

/// Where cargo put the workspace's binaries for the running test binary
/// (`target/<profile>/deps/<test>` -> `target/<profile>`): the component binaries when the test
/// run built them (`cargo test --workspace`, or `cargo build --bins` first).
pub fn built_binaries_dir() -> Result<PathBuf, TestkitError> {
    let exe = std::env::current_exe().map_err(|e| TestkitError::io("finding this test", e))?;
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .ok_or_else(|| {
            TestkitError::InvalidArgument(format!("{} has no grandparent", exe.display()))
        })
}

/// The image named `reference` with `binaries` (each `<bin_dir>/<name>`, all required) and the
/// libraries they link.
pub fn component_image(
    reference: &str,
    bin_dir: &Path,
    binaries: &[&str],
) -> Result<ImageBuilder, TestkitError> {
    let mut image = ImageBuilder::new(reference)?;
    let mut libraries = BTreeSet::new();
    for name in binaries {
        let binary = bin_dir.join(name);
        if !binary.is_file() {
            return Err(TestkitError::Binaries {
                message: format!(
                    "{} is missing (build the component binaries first: cargo build --bins)",
                    binary.display()
                ),
            });
        }
        libraries.extend(shared_libraries(&binary)?);
        image = image.file(&binary, &format!("/usr/local/bin/{name}"), 0o755);
    }
    for library in libraries {
        let dest = library.display().to_string();
        // fs::copy follows links: the image gets the library's contents under the name the
        // binary asks for.
        image = image.file(&library, &dest, 0o755);
    }
    Ok(image
        .contents(
            "/etc/passwd",
            "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
            0o644,
        )
        .contents("/etc/group", "root:x:0:\nnonroot:x:65532:\n", 0o644)
        .user(NONROOT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_libraries_of_a_dynamic_binary_include_the_loader_and_libc() {
        let libraries = shared_libraries(Path::new("/bin/ls")).unwrap();
        assert!(
            libraries
                .iter()
                .any(|l| l.to_string_lossy().contains("libc.so")),
            "{libraries:?}"
        );
        assert!(
            libraries
                .iter()
                .any(|l| l.to_string_lossy().contains("ld-linux")),
            "{libraries:?}"
        );
        assert!(libraries.iter().all(|l| l.is_absolute()));
    }

    #[test]
    fn a_static_binary_needs_no_library() {
        assert!(
            shared_libraries(Path::new(crate::image::BUSYBOX))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn a_missing_binary_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = component_image("warmcache.test/warmcache:1", dir.path(), &["webhook"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("webhook is missing"), "{err}");
    }
}
