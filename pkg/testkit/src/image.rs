//! Container images built on the test machine, for the real node: no registry is reachable, so
//! every image a pod runs is packed here from local files and imported into the node's
//! containerd ([`RealNode::import_image`](crate::RealNode::import_image)).
//!
//! An image is one uncompressed layer in an OCI image layout, written as a tar archive that
//! `ctr images import` reads. The layer is made by GNU tar with sorted names and a fixed mtime,
//! so the same files give the same digest.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use crate::TestkitError;

/// The busybox-based tools image every real node imports: `/bin/sh` and the busybox applets
/// (`/bin/<applet>` links), `/etc/passwd` and `/etc/group` with `root` and `nobody`, a
/// world-writable `/tmp`. Its default command is `/bin/sh`.
pub const TOOLS_IMAGE: &str = "warmcache.test/tools:1";

/// The pod sandbox image of the real node (a static `pause` built by `hack/build-node.sh`).
pub const PAUSE_IMAGE: &str = "warmcache.test/pause:1";

/// A recipe for an image: files and directories copied from this machine into a root file
/// system, plus the image configuration. Build it with [`ImageBuilder::build`] and import the
/// result with [`RealNode::import_image`](crate::RealNode::import_image).
///
/// The reference must name a registry host with a dot and a tag (`warmcache.test/name:tag`), so
/// the kubelet never normalizes it to a Docker Hub name. Pods must use `imagePullPolicy: Never`.
///
/// ```no_run
/// # async fn example(node: &warmcache_testkit::RealNode) -> Result<(), warmcache_testkit::TestkitError> {
/// use warmcache_testkit::{ImageBuilder, TOOLS_IMAGE};
/// let dir = tempfile::tempdir().map_err(|e| warmcache_testkit::TestkitError::InvalidArgument(e.to_string()))?;
/// let image = ImageBuilder::new("warmcache.test/download:1")?
///     .tools() // busybox and /bin/sh, as in TOOLS_IMAGE
///     .directory("/path/to/model", "/model")
///     .file("/path/to/static-binary", "/bin/fetch", 0o755)
///     .entrypoint(["/bin/fetch"])
///     .build(dir.path())?;
/// node.import_image(&image).await?;
/// # let _ = TOOLS_IMAGE;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ImageBuilder {
    reference: String,
    entries: Vec<Entry>,
    tools: bool,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    env: Vec<String>,
    user: Option<String>,
    workdir: Option<String>,
}

#[derive(Debug, Clone)]
enum Entry {
    Directory {
        source: PathBuf,
        dest: String,
    },
    File {
        source: PathBuf,
        dest: String,
        mode: u32,
    },
    Contents {
        dest: String,
        contents: Vec<u8>,
        mode: u32,
    },
}

/// An image archive on disk (an OCI image layout in a tar file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageArchive {
    /// The image reference, e.g. `warmcache.test/tools:1`.
    pub reference: String,
    /// The archive.
    pub path: PathBuf,
    /// The manifest digest (`sha256:...`).
    pub manifest_digest: String,
    /// The layer's digest (`sha256:...`), which is also its diff id (the layer is uncompressed).
    pub layer_digest: String,
}

impl ImageBuilder {
    /// A new, empty image named `reference` (`<host with a dot>/<path>:<tag>`).
    pub fn new(reference: &str) -> Result<ImageBuilder, TestkitError> {
        validate_reference(reference)?;
        Ok(ImageBuilder {
            reference: reference.to_owned(),
            entries: Vec::new(),
            tools: false,
            entrypoint: Vec::new(),
            cmd: Vec::new(),
            env: vec!["PATH=/usr/local/bin:/usr/bin:/bin".to_owned()],
            user: None,
            workdir: None,
        })
    }

    /// Adds busybox (from this machine's `busybox-static`) with a link per applet in `/bin`,
    /// `/etc/passwd` and `/etc/group` (root and nobody) and a world-writable `/tmp`: what
    /// [`TOOLS_IMAGE`] contains.
    pub fn tools(mut self) -> ImageBuilder {
        self.tools = true;
        self
    }

    /// Copies the directory `source` (recursively, keeping modes and ownership) to `dest` in the
    /// image.
    pub fn directory(mut self, source: impl AsRef<Path>, dest: &str) -> ImageBuilder {
        self.entries.push(Entry::Directory {
            source: source.as_ref().to_path_buf(),
            dest: dest.to_owned(),
        });
        self
    }

    /// Copies the file `source` (a static binary of ours, say) to `dest` with `mode`.
    pub fn file(mut self, source: impl AsRef<Path>, dest: &str, mode: u32) -> ImageBuilder {
        self.entries.push(Entry::File {
            source: source.as_ref().to_path_buf(),
            dest: dest.to_owned(),
            mode,
        });
        self
    }

    /// Writes `contents` to `dest` with `mode`.
    pub fn contents(mut self, dest: &str, contents: impl Into<Vec<u8>>, mode: u32) -> ImageBuilder {
        self.entries.push(Entry::Contents {
            dest: dest.to_owned(),
            contents: contents.into(),
            mode,
        });
        self
    }

    /// The image's entrypoint.
    pub fn entrypoint<I, S>(mut self, args: I) -> ImageBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.entrypoint = args.into_iter().map(Into::into).collect();
        self
    }

    /// The image's default command (arguments to the entrypoint, or the command itself).
    pub fn cmd<I, S>(mut self, args: I) -> ImageBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.cmd = args.into_iter().map(Into::into).collect();
        self
    }

    /// Adds an environment variable (`PATH` is set by default).
    pub fn env(mut self, name: &str, value: &str) -> ImageBuilder {
        self.env.retain(|e| !e.starts_with(&format!("{name}=")));
        self.env.push(format!("{name}={value}"));
        self
    }

    /// The user the image runs as (`uid`, `uid:gid`, or a name from its `/etc/passwd`).
    pub fn user(mut self, user: &str) -> ImageBuilder {
        self.user = Some(user.to_owned());
        self
    }

    /// The working directory.
    pub fn workdir(mut self, dir: &str) -> ImageBuilder {
        self.workdir = Some(dir.to_owned());
        self
    }

    /// Stages the root file system under `work_dir`, packs it and writes
    /// `<work_dir>/<name>-<tag>.oci.tar`.
    pub fn build(&self, work_dir: &Path) -> Result<ImageArchive, TestkitError> {
        let stage = tempfile::Builder::new()
            .prefix("image-")
            .tempdir_in(work_dir)
            .map_err(|e| TestkitError::io(format!("staging image {}", self.reference), e))?;
        let rootfs = stage.path().join("rootfs");
        mkdir(&rootfs)?;
        if self.tools {
            stage_tools(&rootfs)?;
        }
        for entry in &self.entries {
            self.stage(entry, &rootfs)?;
        }
        let layout = stage.path().join("layout");
        let blobs = layout.join("blobs/sha256");
        mkdir(&blobs)?;

        let layer_tmp = stage.path().join("layer.tar");
        run(Command::new("tar")
            .arg("--create")
            .arg(format!("--file={}", layer_tmp.display()))
            .arg(format!("--directory={}", rootfs.display()))
            .args([
                "--sort=name",
                "--numeric-owner",
                "--mtime=@0",
                "--format=gnu",
                ".",
            ]))?;
        let layer_digest = sha256_file(&layer_tmp)?;
        let layer_size = file_size(&layer_tmp)?;
        rename(&layer_tmp, &blobs.join(hex_of(&layer_digest)))?;

        let mut config = serde_json::Map::new();
        config.insert("Env".into(), json!(self.env));
        if !self.entrypoint.is_empty() {
            config.insert("Entrypoint".into(), json!(self.entrypoint));
        }
        if !self.cmd.is_empty() {
            config.insert("Cmd".into(), json!(self.cmd));
        }
        if let Some(user) = &self.user {
            config.insert("User".into(), json!(user));
        }
        config.insert(
            "WorkingDir".into(),
            json!(self.workdir.clone().unwrap_or_else(|| "/".into())),
        );
        let config = json!({
            "architecture": oci_arch(),
            "os": "linux",
            "config": config,
            "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
            "history": [{ "created_by": "warmcache-testkit ImageBuilder" }],
        });
        let (config_digest, config_size) = write_blob(&blobs, &config)?;
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": config_size,
            },
            "layers": [{
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest,
                "size": layer_size,
            }],
        });
        let (manifest_digest, manifest_size) = write_blob(&blobs, &manifest)?;
        let tag = self
            .reference
            .rsplit_once(':')
            .map(|(_, t)| t)
            .unwrap_or("latest");
        let index = json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": manifest_size,
                "platform": { "architecture": oci_arch(), "os": "linux" },
                "annotations": {
                    "io.containerd.image.name": self.reference,
                    "org.opencontainers.image.ref.name": tag,
                },
            }],
        });
        write_file(&layout.join("index.json"), index.to_string().as_bytes())?;
        write_file(
            &layout.join("oci-layout"),
            br#"{"imageLayoutVersion":"1.0.0"}"#,
        )?;

        let path = work_dir.join(format!("{}.oci.tar", archive_stem(&self.reference)));
        run(Command::new("tar")
            .arg("--create")
            .arg(format!("--file={}", path.display()))
            .arg(format!("--directory={}", layout.display()))
            .args([
                "--sort=name",
                "--numeric-owner",
                "--owner=0",
                "--group=0",
                "--mtime=@0",
            ])
            .args(["oci-layout", "index.json", "blobs"]))?;
        Ok(ImageArchive {
            reference: self.reference.clone(),
            path,
            manifest_digest,
            layer_digest,
        })
    }

    fn stage(&self, entry: &Entry, rootfs: &Path) -> Result<(), TestkitError> {
        match entry {
            Entry::Directory { source, dest } => {
                let target = in_rootfs(rootfs, dest)?;
                mkdir(&target)?;
                let mut from = source.clone().into_os_string();
                from.push("/.");
                run(Command::new("cp").arg("-a").arg(from).arg(&target))
            }
            Entry::File { source, dest, mode } => {
                let target = in_rootfs(rootfs, dest)?;
                if let Some(parent) = target.parent() {
                    mkdir(parent)?;
                }
                fs::copy(source, &target).map_err(|e| {
                    TestkitError::io(
                        format!("copying {} into image {}", source.display(), self.reference),
                        e,
                    )
                })?;
                chmod(&target, *mode)
            }
            Entry::Contents {
                dest,
                contents,
                mode,
            } => {
                let target = in_rootfs(rootfs, dest)?;
                if let Some(parent) = target.parent() {
                    mkdir(parent)?;
                }
                write_file(&target, contents)?;
                chmod(&target, *mode)
            }
        }
    }
}

/// The pod sandbox image: the static `pause` binary as its entrypoint, run as 65535.
pub(crate) fn pause_image(
    pause_binary: &Path,
    work_dir: &Path,
) -> Result<ImageArchive, TestkitError> {
    ImageBuilder::new(PAUSE_IMAGE)?
        .file(pause_binary, "/pause", 0o755)
        .entrypoint(["/pause"])
        .user("65535:65535")
        .build(work_dir)
}

/// The tools image ([`TOOLS_IMAGE`]).
pub(crate) fn tools_image(work_dir: &Path) -> Result<ImageArchive, TestkitError> {
    ImageBuilder::new(TOOLS_IMAGE)?
        .tools()
        .cmd(["/bin/sh"])
        .build(work_dir)
}

/// Where the tools image takes busybox from (Debian's busybox-static).
pub(crate) const BUSYBOX: &str = "/bin/busybox";

fn stage_tools(rootfs: &Path) -> Result<(), TestkitError> {
    let bin = rootfs.join("bin");
    for dir in ["bin", "etc", "root", "var", "proc", "sys", "dev"] {
        mkdir(&rootfs.join(dir))?;
    }
    let tmp = rootfs.join("tmp");
    mkdir(&tmp)?;
    chmod(&tmp, 0o1777)?;
    fs::copy(BUSYBOX, bin.join("busybox")).map_err(|e| {
        TestkitError::io(
            format!("copying {BUSYBOX} (Debian package busybox-static) into the tools image"),
            e,
        )
    })?;
    chmod(&bin.join("busybox"), 0o755)?;
    let list = Command::new(BUSYBOX)
        .arg("--list")
        .output()
        .map_err(|e| TestkitError::io(format!("running {BUSYBOX} --list"), e))?;
    if !list.status.success() {
        return Err(TestkitError::Command {
            command: format!("{BUSYBOX} --list"),
            status: list.status.to_string(),
            output: String::from_utf8_lossy(&list.stderr).into_owned(),
        });
    }
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        let applet = applet.trim();
        if applet.is_empty() || applet == "busybox" || applet.contains('/') {
            continue;
        }
        let link = bin.join(applet);
        std::os::unix::fs::symlink("busybox", &link)
            .map_err(|e| TestkitError::io(format!("linking {}", link.display()), e))?;
    }
    write_file(
        &rootfs.join("etc/passwd"),
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
    )?;
    write_file(&rootfs.join("etc/group"), b"root:x:0:\nnobody:x:65534:\n")?;
    Ok(())
}

fn validate_reference(reference: &str) -> Result<(), TestkitError> {
    let bad = |why: &str| {
        Err(TestkitError::InvalidArgument(format!(
            "image reference {reference:?} {why} (expected <host with a dot>/<path>:<tag>, \
             e.g. warmcache.test/tools:1)"
        )))
    };
    let Some((host, rest)) = reference.split_once('/') else {
        return bad("has no registry host");
    };
    if !host.contains('.') {
        return bad("does not start with a registry host containing a dot");
    }
    let Some((path, tag)) = rest.rsplit_once(':') else {
        return bad("has no tag");
    };
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/".contains(c);
    if path.is_empty() || !path.chars().all(ok_char) || !host.chars().all(ok_char) {
        return bad("has characters outside [a-z0-9._-/]");
    }
    let tag_ok = !tag.is_empty()
        && tag.len() <= 128
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if !tag_ok {
        return bad("has an invalid tag");
    }
    Ok(())
}

fn archive_stem(reference: &str) -> String {
    reference
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// `dest` (absolute, without `..`) under `rootfs`.
fn in_rootfs(rootfs: &Path, dest: &str) -> Result<PathBuf, TestkitError> {
    let relative = dest.strip_prefix('/').ok_or_else(|| {
        TestkitError::InvalidArgument(format!("image path {dest:?} must be absolute"))
    })?;
    if relative.split('/').any(|c| c == "..") {
        return Err(TestkitError::InvalidArgument(format!(
            "image path {dest:?} must not contain .."
        )));
    }
    Ok(rootfs.join(relative))
}

fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn write_blob(blobs: &Path, value: &serde_json::Value) -> Result<(String, u64), TestkitError> {
    let bytes = value.to_string().into_bytes();
    let tmp = blobs.join("blob.tmp");
    write_file(&tmp, &bytes)?;
    let digest = sha256_file(&tmp)?;
    rename(&tmp, &blobs.join(hex_of(&digest)))?;
    Ok((digest, bytes.len() as u64))
}

fn hex_of(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

/// `sha256:<hex>` of a file (coreutils' sha256sum streams it).
fn sha256_file(path: &Path) -> Result<String, TestkitError> {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .map_err(|e| TestkitError::io(format!("running sha256sum {}", path.display()), e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.split_whitespace().next() {
        Some(hex) if out.status.success() && hex.len() == 64 => Ok(format!("sha256:{hex}")),
        _ => Err(TestkitError::Command {
            command: format!("sha256sum {}", path.display()),
            status: out.status.to_string(),
            output: String::from_utf8_lossy(&out.stderr).into_owned(),
        }),
    }
}

fn file_size(path: &Path) -> Result<u64, TestkitError> {
    fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| TestkitError::io(format!("reading the size of {}", path.display()), e))
}

fn mkdir(path: &Path) -> Result<(), TestkitError> {
    fs::create_dir_all(path)
        .map_err(|e| TestkitError::io(format!("creating {}", path.display()), e))
}

fn chmod(path: &Path, mode: u32) -> Result<(), TestkitError> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| TestkitError::io(format!("chmod {mode:o} {}", path.display()), e))
}

fn rename(from: &Path, to: &Path) -> Result<(), TestkitError> {
    fs::rename(from, to)
        .map_err(|e| TestkitError::io(format!("moving {} to {}", from.display(), to.display()), e))
}

fn write_file(path: &Path, contents: &[u8]) -> Result<(), TestkitError> {
    fs::write(path, contents)
        .map_err(|e| TestkitError::io(format!("writing {}", path.display()), e))
}

/// Runs a command to completion; a failure carries the end of its output.
pub(crate) fn run(command: &mut Command) -> Result<(), TestkitError> {
    let shown = describe(command);
    let out = command
        .output()
        .map_err(|e| TestkitError::io(format!("running {shown}"), e))?;
    if out.status.success() {
        return Ok(());
    }
    let mut output = String::from_utf8_lossy(&out.stderr).into_owned();
    output.push_str(&String::from_utf8_lossy(&out.stdout));
    let start = output.len().saturating_sub(2000);
    let start = (start..output.len())
        .find(|i| output.is_char_boundary(*i))
        .unwrap_or(output.len());
    Err(TestkitError::Command {
        command: shown,
        status: out.status.to_string(),
        output: output[start..].to_owned(),
    })
}

pub(crate) fn describe(command: &Command) -> String {
    let mut shown = command.get_program().to_string_lossy().into_owned();
    for arg in command.get_args().take(4) {
        shown.push(' ');
        shown.push_str(&arg.to_string_lossy());
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_need_a_dotted_host_and_a_tag() {
        assert!(validate_reference("warmcache.test/tools:1").is_ok());
        assert!(validate_reference("warmcache.test/a/b-c:v1.2_3").is_ok());
        for bad in [
            "busybox",
            "busybox:1",
            "library/busybox:1",
            "warmcache.test/tools",
            "warmcache.test/Tools:1",
            "warmcache.test/tools:",
            "warmcache.test/:1",
        ] {
            assert!(validate_reference(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn image_paths_stay_in_the_rootfs() {
        let root = Path::new("/r");
        assert_eq!(in_rootfs(root, "/bin/x").unwrap(), Path::new("/r/bin/x"));
        assert!(in_rootfs(root, "bin/x").is_err());
        assert!(in_rootfs(root, "/a/../../etc").is_err());
    }

    #[test]
    fn a_built_image_is_an_oci_layout_with_the_files() {
        let work = tempfile::tempdir().unwrap();
        let src = work.path().join("src");
        fs::create_dir_all(src.join("sub")).unwrap();
        fs::write(src.join("sub/data.txt"), "hello").unwrap();
        let build = || {
            ImageBuilder::new("warmcache.test/unit:1")
                .unwrap()
                .directory(&src, "/payload")
                .contents("/etc/motd", "hi\n", 0o644)
                .entrypoint(["/bin/true"])
                .env("A", "b")
                .user("1000")
                .build(work.path())
                .unwrap()
        };
        let image = build();
        assert!(image.path.is_file());
        let listing = Command::new("tar")
            .arg("-tf")
            .arg(&image.path)
            .output()
            .unwrap();
        let listing = String::from_utf8(listing.stdout).unwrap();
        assert!(listing.contains("index.json"), "{listing}");
        assert!(listing.contains("oci-layout"), "{listing}");
        let layer = format!("blobs/sha256/{}", hex_of(&image.layer_digest));
        assert!(listing.contains(&layer), "{listing}");
        // The layer holds the staged files.
        let out = work.path().join("out");
        fs::create_dir_all(&out).unwrap();
        run(Command::new("tar")
            .arg("-xf")
            .arg(&image.path)
            .arg("-C")
            .arg(&out))
        .unwrap();
        let files = Command::new("tar")
            .arg("-tf")
            .arg(out.join(&layer))
            .output()
            .unwrap();
        let files = String::from_utf8(files.stdout).unwrap();
        assert!(files.contains("./payload/sub/data.txt"), "{files}");
        assert!(files.contains("./etc/motd"), "{files}");
        let index: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(out.join("index.json")).unwrap()).unwrap();
        assert_eq!(
            index["manifests"][0]["annotations"]["io.containerd.image.name"],
            "warmcache.test/unit:1"
        );
        // Same inputs, same digests.
        let again = build();
        assert_eq!(again.manifest_digest, image.manifest_digest);
        assert_eq!(again.layer_digest, image.layer_digest);
    }
}
