//! The real node: kube-scheduler, containerd + runc, kubelet and the test CSI driver instances,
//! on loopback, attached to a [`ControlPlane`].
//!
//! # Isolation
//!
//! The node's processes (containerd and its shims and containers, the kubelet, the CSI drivers)
//! share one private mount namespace and one cgroup namespace, created by a holder process:
//!
//! - the namespace has its own tmpfs over `/run`, `/var/lib` and `/var/log` (the kubelet and
//!   containerd write fixed host paths there: `/var/log/containers`, `/var/lib/cni`,
//!   `/run/netns`, ...), stand-in files over the six `/proc/sys` entries the kubelet would
//!   rewrite (`vm.overcommit_memory`, `vm.panic_on_oom`, `kernel.panic`, `kernel.panic_on_oops`,
//!   `kernel.keys.root_maxkeys`, `kernel.keys.root_maxbytes`), and its own view of the cgroup
//!   file systems;
//! - every node process lives in the cgroup `warmcache-node-<id>` created under the test
//!   process's own cgroup in each hierarchy, which is the root of the node's cgroup namespace;
//!   the kubelet (cgroupfs driver, cgroup v1) creates its `kubepods` tree under it;
//! - the kubelet runs with `makeIPTablesUtilChains: false` and pods get a network namespace
//!   whose only interface pair stays inside it (`hack/node/cni/warmcache-isolated`), so no
//!   interface, address, route or iptables rule is added to the host.
//!
//! All of the node's mounts disappear with the namespace when its last process exits.
//!
//! # Cleanup
//!
//! Each process runs under the kit's supervisor (its stdin is a pipe from the test process), and
//! a janitor that also reads a pipe from the test process kills every process in the node's
//! cgroups once that pipe closes, removes the cgroups and then the node's directory. So nothing
//! of the node outlives the test process, even when it is killed with SIGKILL.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, StorageClass};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::csi::{self, CsiPublish, TestCsiDriver};
use crate::image::{self, ImageArchive};
use crate::plane::{
    self, NODE_NAME, Processes, free_ports, kubeconfig_yaml, random_suffix, wait_healthy, write,
};
use crate::{ControlPlane, FIELD_MANAGER, TestkitError};

/// Env var naming a directory that holds the node binaries built by `hack/build-node.sh`
/// (`kubelet`, `kube-scheduler`, `kubectl`, `csi-test-driver`, `pause`, `csi-provisioner`,
/// `csi-attacher`).
pub const ENV_NODE_BIN_DIR: &str = "WARMCACHE_NODE_BIN";

/// The namespace of the ConfigMap listing the images the node has (the never-pull policy's
/// parameter).
const IMAGES_CONFIG_MAP_NAMESPACE: &str = "kube-system";
const IMAGES_CONFIG_MAP: &str = "warmcache-testkit-node-images";
const NEVER_PULL_POLICY: &str = "warmcache-testkit-never-pull";

const NODE_BINARIES: [&str; 7] = [
    "kubelet",
    "kube-scheduler",
    "kubectl",
    "csi-test-driver",
    "pause",
    "csi-provisioner",
    "csi-attacher",
];

/// Programs from Debian packages the node runs: (path or name on PATH, package).
const SYSTEM_PROGRAMS: [(&str, &str); 10] = [
    ("containerd", "containerd"),
    ("containerd-shim-runc-v2", "containerd"),
    ("ctr", "containerd"),
    ("runc", "runc"),
    ("/usr/lib/cni/loopback", "containernetworking-plugins"),
    (image::BUSYBOX, "busybox-static"),
    ("ip", "iproute2"),
    ("unshare", "util-linux"),
    ("nsenter", "util-linux"),
    ("tar", "tar"),
];

/// The host sysctls the kubelet would rewrite at start (`setupKernelTunables`), with the values
/// it wants: the node's mount namespace shows it stand-in files holding exactly these values.
pub const KUBELET_SYSCTLS: [(&str, &str); 6] = [
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

const CONTAINERD_TIMEOUT: Duration = Duration::from_secs(30);
const KUBELET_TIMEOUT: Duration = Duration::from_secs(60);
const NODE_READY_TIMEOUT: Duration = Duration::from_secs(120);
const CSI_TIMEOUT: Duration = Duration::from_secs(60);
const HOLDER_TIMEOUT: Duration = Duration::from_secs(10);

/// Kills everything in the node's cgroups once the test process is gone, then removes the
/// cgroups and the node's directory. `$1` is the directory, `$2...` the node's cgroup
/// directories (one per hierarchy). Supervisor pids arrive on stdin, one per line, until EOF.
const NODE_JANITOR: &str = r#"trap '' INT TERM HUP
dir=$1
shift
cgroups=("$@")
pids=()
while read -r pid; do pids+=("$pid"); done
procs() {
  local cg
  for cg in "${cgroups[@]}"; do
    [ -d "$cg" ] && find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -un
}
# Freeze the tree first (no new process can be forked while the rest is killed).
for cg in "${cgroups[@]}"; do
  case $cg in */freezer/*) [ -w "$cg/freezer.state" ] && echo FROZEN > "$cg/freezer.state" 2>/dev/null ;; esac
done
for _ in $(seq 1 200); do
  left=$(procs)
  [ -z "$left" ] && break
  kill -KILL $left 2>/dev/null
  for cg in "${cgroups[@]}"; do
    case $cg in */freezer/*) [ -w "$cg/freezer.state" ] && echo THAWED > "$cg/freezer.state" 2>/dev/null ;; esac
  done
  sleep 0.05
done
for pid in "${pids[@]}"; do
  for _ in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
done
for cg in "${cgroups[@]}"; do
  for _ in $(seq 1 40); do
    [ -d "$cg" ] || break
    find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
    [ -d "$cg" ] && sleep 0.05
  done
done
# A mount under the directory visible here would be the host's: leave the directory then.
if ! awk -v d="$dir" 'index($5, d) == 1 { found = 1 } END { exit !found }' /proc/self/mountinfo; then
  rm -rf --one-file-system -- "$dir"
fi"#;

/// Runs a node program: joins the node's cgroups, then enters the holder's mount and cgroup
/// namespaces (or, with `--new-namespace`, creates them: the holder itself).
const NODE_ENTER: &str = r#"#!/bin/sh
# Generated by warmcache-testkit: runs "$@" as a process of the real test node.
set -e
dir=$(dirname "$0")
while read -r procs; do echo $$ > "$procs"; done < "$dir/cgroup-procs"
if [ "$1" = --new-namespace ]; then
  shift
  exec unshare --mount --cgroup --propagation private -- "$@"
fi
holder=$(cat "$dir/holder.pid")
exec nsenter --mount="/proc/$holder/ns/mnt" --cgroup="/proc/$holder/ns/cgroup" -- "$@"
"#;

static SHARED: OnceLock<Result<RealNode, String>> = OnceLock::new();

/// A real Kubernetes node on loopback attached to a [`ControlPlane`]: kube-scheduler,
/// containerd 1.6 with runc, the kubelet (node name `127.0.0.1`), and the test CSI driver
/// instances of [`TestCsiDriver`] with their external-provisioner (and external-attacher).
/// Pods really run: images come only from [`RealNode::import_image`] (the tools image
/// [`TOOLS_IMAGE`](crate::TOOLS_IMAGE) is always there) and every container must say
/// `imagePullPolicy: Never`, which a ValidatingAdmissionPolicy of the kit enforces.
///
/// A test binary opts in with [`RealNode::shared`]. In that binary the scheduler binds every
/// pod to the node, so keep tests that play kubelet with [`Kubelet`](crate::Kubelet) in other
/// test binaries.
pub struct RealNode {
    dir: PathBuf,
    bin_dir: PathBuf,
    containerd_socket: PathBuf,
    cgroups: Vec<PathBuf>,
    startup: Duration,
    images: Mutex<BTreeSet<String>>,
    kubeconfig_path: PathBuf,
    processes: Mutex<Processes>,
}

impl std::fmt::Debug for RealNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNode")
            .field("dir", &self.dir)
            .field("cgroups", &self.cgroups)
            .field("startup", &self.startup)
            .finish_non_exhaustive()
    }
}

impl RealNode {
    /// Starts, once per test binary, a node attached to [`ControlPlane::shared`] and returns
    /// it; later calls get the same node. A failure is returned to this and every later caller:
    /// tests fail, they are never skipped.
    pub async fn shared() -> Result<&'static RealNode, TestkitError> {
        let plane = ControlPlane::shared().await?;
        let slot = match SHARED.get() {
            Some(slot) => slot,
            None => tokio::task::spawn_blocking(move || {
                SHARED.get_or_init(|| RealNode::start(plane).map_err(|e| e.chain()))
            })
            .await
            .map_err(|e| TestkitError::Unavailable(format!("node startup task failed: {e}")))?,
        };
        slot.as_ref()
            .map_err(|message| TestkitError::Unavailable(format!("real node: {message}")))
    }

    /// Starts a node attached to `plane` and blocks until it is Ready with every CSI driver
    /// registered. Dropping the node stops it and removes its directory and cgroups. At most one
    /// node per plane (its name is fixed). Do not call it from inside an async task.
    pub fn start(plane: &ControlPlane) -> Result<RealNode, TestkitError> {
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("warmcache-testkit-node".into())
                .spawn_scoped(scope, || start_blocking(plane))
                .map_err(|e| TestkitError::io("spawning the node startup thread", e))?
                .join()
                .map_err(|_| TestkitError::Unavailable("the node startup thread panicked".into()))?
        })
    }

    /// The Node's name, `127.0.0.1`.
    pub fn name(&self) -> &'static str {
        NODE_NAME
    }

    /// The node's directory: configuration, the kubelet's root, containerd's state, CSI state
    /// and one log per process (`<component>.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory the node binaries were taken from (`kubectl` among them).
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The `kubectl` built with the node (same Kubernetes version as the plane).
    pub fn kubectl(&self) -> PathBuf {
        self.bin_dir.join("kubectl")
    }

    /// The admin kubeconfig of the plane the node is attached to.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The node's cgroup directories, one per hierarchy (host paths); empty once it stopped.
    pub fn cgroups(&self) -> &[PathBuf] {
        &self.cgroups
    }

    /// How long startup took, from locating the binaries to the Node being Ready with every CSI
    /// driver registered.
    pub fn startup_duration(&self) -> Duration {
        self.startup
    }

    /// The last `lines` lines of a node process's log: `containerd`, `kubelet`,
    /// `kube-scheduler`, `csi-<short name>`, `provisioner-<short name>`,
    /// `attacher-namespaced-block`.
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        plane::tail(&self.dir.join(format!("{component}.log")), lines)
    }

    /// The images imported into the node's containerd.
    pub fn images(&self) -> Vec<String> {
        self.images
            .lock()
            .map(|i| i.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Imports an image into the node's containerd and adds it to the list the never-pull
    /// policy allows. Pods then name it with `imagePullPolicy: Never`.
    pub async fn import_image(&self, image: &ImageArchive) -> Result<(), TestkitError> {
        let client = Client::try_from(kube_config(&self.kubeconfig_path).await?)
            .map_err(|e| TestkitError::kube("building a client", e))?;
        let (dir, socket, archive) = (
            self.dir.clone(),
            self.containerd_socket.clone(),
            image.clone(),
        );
        tokio::task::spawn_blocking(move || import(&dir, &socket, &archive))
            .await
            .map_err(|e| TestkitError::Unavailable(format!("image import task failed: {e}")))??;
        let list = {
            let mut images = self
                .images
                .lock()
                .map_err(|_| TestkitError::Unavailable("node image list poisoned".into()))?;
            images.insert(image.reference.clone());
            images.iter().cloned().collect::<Vec<_>>()
        };
        apply_images_config_map(&client, &list).await?;
        wait_image_admitted(&client, &image.reference).await
    }

    /// What the test CSI driver `driver` received in NodePublishVolume so far (its journal).
    pub fn csi_publishes(&self, driver: TestCsiDriver) -> Result<Vec<CsiPublish>, TestkitError> {
        csi::read_publish_journal(&csi::state_dir(&self.dir, driver).join("node-publish.jsonl"))
    }

    /// The host directory holding a test CSI volume's data (the export root pods see; on
    /// [`TestCsiDriver::TenantFs`] each namespace's export is `tenants/<namespace>` under it), for
    /// the volume handle `handle` (any namespace segment is ignored).
    pub fn csi_volume_dir(&self, driver: TestCsiDriver, handle: &str) -> PathBuf {
        let id = match driver {
            TestCsiDriver::NamespacedBlock => handle.rsplit_once(':').map_or(handle, |(id, _)| id),
            _ => handle,
        };
        csi::state_dir(&self.dir, driver).join("volumes").join(id)
    }

    /// The hex SHA-256 of the key a test CSI volume was created with (the driver records the
    /// digest, never the key), for the volume handle `handle`; `None` for a volume created
    /// without a key or one the driver does not know.
    pub fn csi_volume_key_digest(&self, driver: TestCsiDriver, handle: &str) -> Option<String> {
        let id = match driver {
            TestCsiDriver::NamespacedBlock => handle.rsplit_once(':').map_or(handle, |(id, _)| id),
            _ => handle,
        };
        let meta = csi::state_dir(&self.dir, driver)
            .join("meta")
            .join(format!("{id}.json"));
        let text = std::fs::read_to_string(meta).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v["keySha256"].as_str().map(str::to_owned)
    }

    /// Stops every node process and removes the node's cgroups and directory, waiting for all
    /// of it. Dropping the node does the same.
    pub fn shutdown(self) {
        drop(self);
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        if let Ok(mut processes) = self.processes.lock() {
            processes.stop();
        }
    }
}

async fn kube_config(kubeconfig: &Path) -> Result<kube::Config, TestkitError> {
    plane::install_crypto_provider();
    let text = fs::read_to_string(kubeconfig)
        .map_err(|e| TestkitError::io(format!("reading {}", kubeconfig.display()), e))?;
    let parsed = kube::config::Kubeconfig::from_yaml(&text)?;
    Ok(kube::Config::from_custom_kubeconfig(parsed, &Default::default()).await?)
}

/// `$WARMCACHE_NODE_BIN`, else the directory printed by `hack/build-node.sh`.
fn locate_node_binaries() -> Result<PathBuf, TestkitError> {
    let dir = match std::env::var_os(ENV_NODE_BIN_DIR) {
        Some(dir) => PathBuf::from(dir),
        None => plane::run_script("hack/build-node.sh", ENV_NODE_BIN_DIR)?,
    };
    for name in NODE_BINARIES {
        if !dir.join(name).is_file() {
            return Err(TestkitError::Binaries {
                message: format!(
                    "{} has no `{name}` (build the node binaries with hack/build-node.sh)",
                    dir.display()
                ),
            });
        }
    }
    Ok(dir)
}

fn find_program(name: &str) -> Option<PathBuf> {
    if name.starts_with('/') {
        let path = PathBuf::from(name);
        return path.is_file().then_some(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

fn check_machine() -> Result<(), TestkitError> {
    let status = fs::read_to_string("/proc/self/status")
        .map_err(|e| TestkitError::io("reading /proc/self/status", e))?;
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("");
    if uid != "0" {
        return Err(TestkitError::Unsupported(format!(
            "the real node needs root (mounts, cgroups, containers); this process runs as uid {uid}"
        )));
    }
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        return Err(TestkitError::Unsupported(
            "the real node supports cgroup v1 (this project's machine kind); this machine has \
             only cgroup v2"
                .into(),
        ));
    }
    let missing: Vec<String> = SYSTEM_PROGRAMS
        .iter()
        .filter(|(program, _)| find_program(program).is_none())
        .map(|(program, package)| format!("{program} (Debian package {package})"))
        .collect();
    if !missing.is_empty() {
        return Err(TestkitError::Binaries {
            message: format!(
                "the real node needs {}; run `hack/build-node.sh --install-packages` as root",
                missing.join(", ")
            ),
        });
    }
    Ok(())
}

/// One v1 (or the hybrid unified) cgroup hierarchy the test process is in.
#[derive(Debug, Clone)]
struct Hierarchy {
    /// Mount point, e.g. `/sys/fs/cgroup/memory`.
    mount_point: PathBuf,
    /// `cgroup` or `cgroup2`.
    fs_type: String,
    /// Mount options naming the hierarchy (`memory`, `cpu,cpuacct`, `name=systemd`; empty for
    /// cgroup2).
    options: String,
    /// The test process's cgroup in it, e.g. `/` or `/process_api/<id>`.
    current: String,
}

/// The cgroup hierarchies under `/sys/fs/cgroup` and the test process's place in each.
fn hierarchies() -> Result<Vec<Hierarchy>, TestkitError> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| TestkitError::io("reading /proc/self/mountinfo", e))?;
    let own = fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| TestkitError::io("reading /proc/self/cgroup", e))?;
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split_whitespace().collect();
        let right: Vec<&str> = right.split_whitespace().collect();
        let (Some(mount_point), Some(fs_type), Some(super_options)) =
            (left.get(4), right.first(), right.get(2))
        else {
            continue;
        };
        if !mount_point.starts_with("/sys/fs/cgroup/") {
            continue;
        }
        let names: Vec<&str> = match *fs_type {
            "cgroup" => super_options
                .split(',')
                .filter(|o| !matches!(*o, "rw" | "ro") && !o.starts_with("release_agent"))
                .collect(),
            "cgroup2" => Vec::new(),
            _ => continue,
        };
        let current = own.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let mut ours: Vec<&str> = controllers.split(',').filter(|c| !c.is_empty()).collect();
            let mut theirs = names.clone();
            ours.sort_unstable();
            theirs.sort_unstable();
            (ours == theirs).then(|| path.to_owned())
        });
        let Some(current) = current else {
            continue;
        };
        out.push(Hierarchy {
            mount_point: PathBuf::from(mount_point),
            fs_type: (*fs_type).to_owned(),
            options: names.join(","),
            current,
        });
    }
    if !out.iter().any(|h| h.fs_type == "cgroup") {
        return Err(TestkitError::Unsupported(
            "no cgroup v1 hierarchy is mounted under /sys/fs/cgroup".into(),
        ));
    }
    Ok(out)
}

/// Creates `<hierarchy>/<current>/<name>` in every hierarchy (cpuset gets its parent's cpus
/// and mems), returning the host paths.
fn create_cgroups(hierarchies: &[Hierarchy], name: &str) -> Result<Vec<PathBuf>, TestkitError> {
    let mut out = Vec::new();
    for h in hierarchies {
        let parent = h.mount_point.join(h.current.trim_start_matches('/'));
        let dir = parent.join(name);
        fs::create_dir(&dir)
            .map_err(|e| TestkitError::io(format!("creating cgroup {}", dir.display()), e))?;
        out.push(dir.clone());
        if h.options.split(',').any(|o| o == "cpuset") {
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let value = fs::read_to_string(parent.join(file)).map_err(|e| {
                    TestkitError::io(format!("reading {}", parent.join(file).display()), e)
                })?;
                fs::write(dir.join(file), value.trim()).map_err(|e| {
                    TestkitError::io(format!("writing {}", dir.join(file).display()), e)
                })?;
            }
        }
    }
    Ok(out)
}

/// The holder's namespace set-up, run by `sh` inside the new mount and cgroup namespaces.
fn namespace_init_script(dir: &Path, hierarchies: &[Hierarchy]) -> String {
    let d = dir.display();
    let mut script = String::from(
        "# Generated by warmcache-testkit: the real node's private mount namespace.\nset -e\n\
         mount --make-rshared /\n\
         mount -t tmpfs -o mode=0755 warmcache-node-run /run\n\
         mkdir -p /run/lock /run/netns\n\
         mount -t tmpfs -o mode=0755 warmcache-node-var-lib /var/lib\n\
         mkdir -p /var/lib/cni\n\
         mount -t tmpfs -o mode=0755 warmcache-node-var-log /var/log\n",
    );
    for (entry, _) in KUBELET_SYSCTLS {
        let file = entry.replace('/', ".");
        script.push_str(&format!(
            "mount --bind '{d}/sysctl/{file}' /proc/sys/{entry}\n"
        ));
    }
    // This namespace's cgroup root is the node's cgroup: remount each hierarchy so the node's
    // processes see it as `/`.
    script.push_str("mount -t tmpfs -o mode=0755 warmcache-node-cgroup /sys/fs/cgroup\n");
    for h in hierarchies {
        let mount_point = h.mount_point.display();
        script.push_str(&format!("mkdir -p '{mount_point}'\n"));
        if h.fs_type == "cgroup2" {
            script.push_str(&format!("mount -t cgroup2 cgroup2 '{mount_point}'\n"));
        } else {
            script.push_str(&format!(
                "mount -t cgroup -o '{}' cgroup '{mount_point}'\n",
                h.options
            ));
        }
    }
    script.push_str(&format!(
        "echo $$ > '{d}/holder.pid'\nexec sleep infinity\n"
    ));
    script
}

fn containerd_config(dir: &Path, socket: &Path) -> String {
    let d = dir.display();
    let s = socket.display();
    format!(
        r#"# Generated by warmcache-testkit: containerd of the real test node.
version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{s}"
[ttrpc]
  address = "{s}.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  enable_selinux = false
  # Machines of this kind lack CAP_SYS_RESOURCE in the bounding set: an oom_score_adj below
  # containerd's own (the kubelet asks -998 for sandboxes) fails in runc. Clamp instead.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "/run/warmcache-node-runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d}/cni/bin"
    conf_dir = "{d}/cni/net.d"
    max_conf_num = 1
"#,
        pause = image::PAUSE_IMAGE,
    )
}

/// The kubelet's configuration. Its disk eviction signals are off ("0%" disables a signal) and
/// image garbage collection waits for a full disk: this node never pulls, so an image the kubelet
/// reclaims under disk pressure (the sandbox image between pods first) is gone for the rest of
/// the test, and a nearly full build machine then fails every pod with an unrelated pull error.
/// A full disk still fails loudly (ENOSPC).
fn kubelet_config(dir: &Path, socket: &Path, port: u16, healthz_port: u16) -> String {
    let d = dir.display();
    let s = socket.display();
    format!(
        r#"# Generated by warmcache-testkit: kubelet of the real test node.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: "{d}/ca.crt"}}
authorization: {{mode: AlwaysAllow}}
containerRuntimeEndpoint: "unix://{s}"
imageServiceEndpoint: "unix://{s}"
cgroupDriver: cgroupfs
cgroupRoot: /
failCgroupV1: false
failSwapOn: false
makeIPTablesUtilChains: false
protectKernelDefaults: false
oomScoreAdj: 0
podLogsDir: "{d}/pod-logs"
volumePluginDir: "{d}/volume-plugins"
resolvConf: "{d}/resolv.conf"
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{memory.available: "100Mi", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%", imagefs.inodesFree: "0%"}}
maxPods: 250
rotateCertificates: false
serverTLSBootstrap: false
nodeStatusUpdateFrequency: 2s
"#
    )
}

const CNI_CONFIG: &str = r#"{"cniVersion": "1.0.0", "name": "warmcache-isolated", "plugins": [{"type": "warmcache-isolated"}]}
"#;

/// A raw `GET path` over loopback HTTP; Ok when the status is 200.
async fn http_ok(port: u16, path: &str) -> Result<(), String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response))
        .await
        .map_err(|_| "no answer within 5s".to_owned())?
        .map_err(|e| format!("read: {e}"))?;
    if response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200") {
        Ok(())
    } else {
        Err(format!(
            "answer: {}",
            response.lines().next().unwrap_or_default()
        ))
    }
}

fn import(dir: &Path, socket: &Path, archive: &ImageArchive) -> Result<(), TestkitError> {
    image::run(
        Command::new("sh")
            .arg(dir.join("node-enter.sh"))
            .arg("ctr")
            .arg(format!("--address={}", socket.display()))
            .args(["--namespace=k8s.io", "images", "import"])
            .arg(&archive.path),
    )
}

fn never_pull_policy() -> (serde_json::Value, serde_json::Value) {
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": { "name": NEVER_PULL_POLICY, "labels": { "warmcache.io/testkit": "true" } },
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": { "apiVersion": "v1", "kind": "ConfigMap" },
            "matchConstraints": {
                "resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["pods"],
                }],
            },
            "variables": [
                { "name": "containers", "expression":
                    "object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : [])" },
                { "name": "images", "expression": "params.data.images.split('\\n')" },
            ],
            "validations": [
                {
                    "expression": "variables.containers.all(c, has(c.imagePullPolicy) && c.imagePullPolicy == 'Never')",
                    "messageExpression": "'the real test node never pulls: set imagePullPolicy: Never on ' + variables.containers.filter(c, !has(c.imagePullPolicy) || c.imagePullPolicy != 'Never').map(c, c.name).join(', ')",
                    "reason": "Forbidden",
                },
                {
                    "expression": "variables.containers.all(c, c.image in variables.images)",
                    "messageExpression": "'image ' + variables.containers.filter(c, !(c.image in variables.images)).map(c, c.image).join(', ') + ' is not on the real test node (imported: ' + variables.images.join(', ') + '); build it with ImageBuilder and RealNode::import_image'",
                    "reason": "Forbidden",
                },
            ],
        },
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": { "name": NEVER_PULL_POLICY, "labels": { "warmcache.io/testkit": "true" } },
        "spec": {
            "policyName": NEVER_PULL_POLICY,
            "validationActions": ["Deny"],
            "paramRef": {
                "name": IMAGES_CONFIG_MAP,
                "namespace": IMAGES_CONFIG_MAP_NAMESPACE,
                "parameterNotFoundAction": "Deny",
            },
        },
    });
    (policy, binding)
}

async fn apply_images_config_map(client: &Client, images: &[String]) -> Result<(), TestkitError> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), IMAGES_CONFIG_MAP_NAMESPACE);
    let body = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": IMAGES_CONFIG_MAP, "namespace": IMAGES_CONFIG_MAP_NAMESPACE },
        "data": { "images": images.join("\n") },
    });
    config_maps
        .patch(
            IMAGES_CONFIG_MAP,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|e| TestkitError::kube("applying the node's image list", e))?;
    Ok(())
}

async fn install_cluster_objects(client: &Client, images: &[String]) -> Result<(), TestkitError> {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    apply_images_config_map(client, images).await?;
    let (policy, binding) = never_pull_policy();
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .patch(NEVER_PULL_POLICY, &apply, &Patch::Apply(&policy))
        .await
        .map_err(|e| TestkitError::kube("applying the never-pull admission policy", e))?;
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .patch(NEVER_PULL_POLICY, &apply, &Patch::Apply(&binding))
        .await
        .map_err(|e| TestkitError::kube("binding the never-pull admission policy", e))?;
    for driver in TestCsiDriver::ALL {
        Api::<CSIDriver>::all(client.clone())
            .patch(
                driver.driver_name(),
                &apply,
                &Patch::Apply(&driver.csi_driver_object()),
            )
            .await
            .map_err(|e| {
                TestkitError::kube(format!("applying CSIDriver {}", driver.driver_name()), e)
            })?;
        Api::<StorageClass>::all(client.clone())
            .patch(
                driver.storage_class(),
                &apply,
                &Patch::Apply(&driver.storage_class_object()),
            )
            .await
            .map_err(|e| {
                TestkitError::kube(
                    format!("applying StorageClass {}", driver.storage_class()),
                    e,
                )
            })?;
    }
    Ok(())
}

/// The never-pull policy takes effect asynchronously (the API server's policy informer); a
/// pod that would pull must be refused before the node counts as up.
async fn wait_policy_active(client: &Client) -> Result<(), TestkitError> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::PostParams;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let probe: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "generateName": "warmcache-testkit-policy-probe-" },
        "spec": { "containers": [{ "name": "c", "image": "warmcache.test/none:1", "imagePullPolicy": "Always" }] },
    }))
    .map_err(|e| TestkitError::InvalidArgument(format!("policy probe pod: {e}")))?;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    crate::eventually(
        "the never-pull admission policy to refuse a pod",
        Duration::from_secs(30),
        || {
            let pods = pods.clone();
            let probe = probe.clone();
            let dry_run = dry_run.clone();
            async move {
                match pods.create(&dry_run, &probe).await {
                    Err(kube::Error::Api(s)) if s.message.contains("never pulls") => Some(()),
                    _ => None,
                }
            }
        },
    )
    .await
}

/// The never-pull policy reads its image list through the API server's informer: wait until a
/// pod naming `reference` is admitted (dry run), so a test's next create does not race it.
async fn wait_image_admitted(client: &Client, reference: &str) -> Result<(), TestkitError> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::PostParams;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let probe: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "generateName": "warmcache-testkit-image-probe-" },
        "spec": { "containers": [{ "name": "c", "image": reference, "imagePullPolicy": "Never" }] },
    }))
    .map_err(|e| TestkitError::InvalidArgument(format!("image probe pod: {e}")))?;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    crate::eventually(
        &format!("the never-pull admission policy to admit {reference}"),
        Duration::from_secs(30),
        || {
            let (pods, probe, dry_run) = (pods.clone(), probe.clone(), dry_run.clone());
            async move { pods.create(&dry_run, &probe).await.ok().map(drop) }
        },
    )
    .await
}

fn start_blocking(plane: &ControlPlane) -> Result<RealNode, TestkitError> {
    let started = Instant::now();
    check_machine()?;
    let bin_dir = locate_node_binaries()?;
    let hierarchies = hierarchies()?;

    let dir = tempfile::Builder::new()
        .prefix("warmcache-node-")
        .tempdir()
        .map_err(|e| TestkitError::io("creating the node's temporary directory", e))?
        .keep();
    let dir = dir.canonicalize().unwrap_or(dir);
    for shadowed in ["/run", "/var/lib", "/var/log", "/sys", "/proc"] {
        if dir.starts_with(shadowed) {
            let _ = fs::remove_dir(&dir);
            return Err(TestkitError::InvalidArgument(format!(
                "the node directory {} is under {shadowed}, which the node's namespace replaces; \
                 set TMPDIR elsewhere",
                dir.display()
            )));
        }
    }
    let cgroup_name = format!("warmcache-node-{}", random_suffix(8));
    // The janitor owns the directory and the cgroups from here on.
    let cgroup_paths: Vec<PathBuf> = hierarchies
        .iter()
        .map(|h| {
            h.mount_point
                .join(h.current.trim_start_matches('/'))
                .join(&cgroup_name)
        })
        .collect();
    let mut janitor_args = vec![dir.display().to_string()];
    janitor_args.extend(cgroup_paths.iter().map(|p| p.display().to_string()));
    let mut processes = Processes::with_janitor(NODE_JANITOR, &janitor_args)?;
    let cgroups = create_cgroups(&hierarchies, &cgroup_name)?;

    // --- files ---
    let p = |name: &str| dir.join(name);
    for sub in [
        "sysctl",
        "cni/bin",
        "cni/net.d",
        "containerd",
        "kubelet",
        "kubelet-pki",
        "pod-logs",
        "volume-plugins",
        "images",
    ] {
        fs::create_dir_all(p(sub))
            .map_err(|e| TestkitError::io(format!("creating {}", p(sub).display()), e))?;
    }
    for (entry, value) in KUBELET_SYSCTLS {
        write(
            &p(&format!("sysctl/{}", entry.replace('/', "."))),
            &format!("{value}\n"),
        )?;
    }
    write(
        &p("cgroup-procs"),
        &cgroups
            .iter()
            .map(|c| format!("{}\n", c.join("cgroup.procs").display()))
            .collect::<String>(),
    )?;
    write(&p("node-enter.sh"), NODE_ENTER)?;
    write(&p("ns-init.sh"), &namespace_init_script(&dir, &hierarchies))?;
    write(
        &p("resolv.conf"),
        "# warmcache test node: pods have no DNS\n",
    )?;
    write(&p("ca.crt"), plane.ca_pem())?;
    let cni_plugin = plane::workspace_root().join("hack/node/cni/warmcache-isolated");
    fs::copy(&cni_plugin, p("cni/bin/warmcache-isolated"))
        .map_err(|e| TestkitError::io(format!("copying {}", cni_plugin.display()), e))?;
    std::os::unix::fs::symlink("/usr/lib/cni/loopback", p("cni/bin/loopback"))
        .map_err(|e| TestkitError::io("linking the CNI loopback plugin", e))?;
    write(&p("cni/net.d/10-warmcache-isolated.conflist"), CNI_CONFIG)?;
    let socket = p("containerd/containerd.sock");
    write(&p("containerd.toml"), &containerd_config(&dir, &socket))?;
    let [kubelet_port, healthz_port] = free_ports::<2>()?;
    write(
        &p("kubelet.yaml"),
        &kubelet_config(&dir, &socket, kubelet_port, healthz_port),
    )?;
    let credentials = plane.node_credentials();
    write(
        &p("kubelet.kubeconfig"),
        &kubeconfig_yaml(
            plane.server_url(),
            plane.ca_pem(),
            &credentials.kubelet_token,
        ),
    )?;
    write(
        &p("scheduler.kubeconfig"),
        &kubeconfig_yaml(
            plane.server_url(),
            plane.ca_pem(),
            &credentials.scheduler_token,
        ),
    )?;
    let admin_kubeconfig = plane.kubeconfig_path().display().to_string();
    let s = |path: PathBuf| path.display().to_string();
    let enter = |new: bool| {
        let mut v = vec!["/bin/sh".to_owned(), s(p("node-enter.sh"))];
        if new {
            v.push("--new-namespace".into());
        }
        v
    };
    let sh = PathBuf::from("/bin/sh");

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| TestkitError::io("building the node startup runtime", e))?;
    let images = runtime.block_on(async {
        plane::install_crypto_provider();
        let client = plane.client().await?;

        // The holder: creates the namespaces, then sleeps.
        let holder = processes.spawn_with(
            "namespace-holder",
            &enter(true),
            &sh,
            &[s(p("ns-init.sh"))],
            &dir,
        )?;
        let holder_pid = p("holder.pid");
        wait_healthy(&mut processes.components[holder], HOLDER_TIMEOUT, || {
            let ready = holder_pid.is_file();
            async move {
                if ready {
                    Ok(())
                } else {
                    Err("holder.pid not written yet".into())
                }
            }
        })
        .await?;

        let containerd = processes.spawn_with(
            "containerd",
            &enter(false),
            Path::new("containerd"),
            &[format!("--config={}", s(p("containerd.toml")))],
            &dir,
        )?;
        wait_healthy(
            &mut processes.components[containerd],
            CONTAINERD_TIMEOUT,
            || {
                let socket = socket.clone();
                async move {
                    let out = Command::new("ctr")
                        .arg(format!("--address={}", socket.display()))
                        .arg("version")
                        .output()
                        .map_err(|e| e.to_string())?;
                    if out.status.success() {
                        Ok(())
                    } else {
                        Err(String::from_utf8_lossy(&out.stderr).into_owned())
                    }
                }
            },
        )
        .await?;

        let image_dir = p("images");
        let mut images = Vec::new();
        for archive in [
            image::pause_image(&bin_dir.join("pause"), &image_dir)?,
            image::tools_image(&image_dir)?,
        ] {
            import(&dir, &socket, &archive)?;
            images.push(archive.reference);
        }
        install_cluster_objects(&client, &images).await?;

        let kubelet = processes.spawn_with(
            "kubelet",
            &enter(false),
            &bin_dir.join("kubelet"),
            &[
                format!("--config={}", s(p("kubelet.yaml"))),
                format!("--kubeconfig={}", s(p("kubelet.kubeconfig"))),
                format!("--root-dir={}", s(p("kubelet"))),
                format!("--cert-dir={}", s(p("kubelet-pki"))),
                format!("--hostname-override={NODE_NAME}"),
                "--v=2".into(),
            ],
            &dir,
        )?;
        processes.spawn(
            "kube-scheduler",
            &bin_dir.join("kube-scheduler"),
            &[
                format!("--kubeconfig={}", s(p("scheduler.kubeconfig"))),
                format!(
                    "--authentication-kubeconfig={}",
                    s(p("scheduler.kubeconfig"))
                ),
                format!(
                    "--authorization-kubeconfig={}",
                    s(p("scheduler.kubeconfig"))
                ),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
                "--profiling=false".into(),
            ],
            &dir,
        )?;

        let registry = p("kubelet/plugins_registry");
        for driver in TestCsiDriver::ALL {
            let state = csi::state_dir(&dir, driver);
            let socket = p(&format!(
                "kubelet/plugins/{}/csi.sock",
                driver.driver_name()
            ));
            processes.spawn_with(
                component_name("csi", driver),
                &enter(false),
                &bin_dir.join("csi-test-driver"),
                &[
                    format!("--name={}", driver.driver_name()),
                    format!("--profile={}", driver.profile()),
                    format!("--csi-socket={}", s(socket.clone())),
                    format!("--registration-dir={}", s(registry.clone())),
                    format!("--state-dir={}", s(state)),
                    format!("--node-id={NODE_NAME}"),
                ],
                &dir,
            )?;
            let sidecar_args = vec![
                format!("--csi-address={}", s(socket.clone())),
                format!("--kubeconfig={admin_kubeconfig}"),
                "--leader-election=false".into(),
                "--retry-interval-start=500ms".into(),
                "--retry-interval-max=5s".into(),
                "--v=2".into(),
            ];
            let mut provisioner_args = sidecar_args.clone();
            provisioner_args.push("--extra-create-metadata".into());
            processes.spawn(
                component_name("provisioner", driver),
                &bin_dir.join("csi-provisioner"),
                &provisioner_args,
                &dir,
            )?;
            if driver.attach_required() {
                processes.spawn(
                    component_name("attacher", driver),
                    &bin_dir.join("csi-attacher"),
                    &sidecar_args,
                    &dir,
                )?;
            }
        }

        wait_healthy(&mut processes.components[kubelet], KUBELET_TIMEOUT, || {
            http_ok(healthz_port, "/healthz")
        })
        .await?;
        let nodes: Api<Node> = Api::all(client.clone());
        wait_healthy(
            &mut processes.components[kubelet],
            NODE_READY_TIMEOUT,
            || {
                let nodes = nodes.clone();
                async move {
                    let node = nodes
                        .get_opt(NODE_NAME)
                        .await
                        .map_err(|e| e.to_string())?
                        .ok_or_else(|| format!("Node {NODE_NAME} not registered yet"))?;
                    let ready = node
                        .status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .into_iter()
                        .find(|c| c.type_ == "Ready");
                    match ready {
                        Some(c) if c.status == "True" => Ok(()),
                        Some(c) => Err(format!(
                            "Ready={} ({})",
                            c.status,
                            c.message.unwrap_or_default()
                        )),
                        None => Err("no Ready condition yet".into()),
                    }
                }
            },
        )
        .await?;
        let csi_nodes: Api<CSINode> = Api::all(client.clone());
        wait_healthy(&mut processes.components[kubelet], CSI_TIMEOUT, || {
            let csi_nodes = csi_nodes.clone();
            async move {
                let registered: BTreeSet<String> = csi_nodes
                    .get_opt(NODE_NAME)
                    .await
                    .map_err(|e| e.to_string())?
                    .map(|n| n.spec.drivers.into_iter().map(|d| d.name).collect())
                    .unwrap_or_default();
                let missing: Vec<&str> = TestCsiDriver::ALL
                    .iter()
                    .map(|d| d.driver_name())
                    .filter(|d| !registered.contains(*d))
                    .collect();
                if missing.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "CSI drivers not registered yet: {}",
                        missing.join(", ")
                    ))
                }
            }
        })
        .await
        .map_err(|e| with_driver_logs(e, &dir))?;
        wait_policy_active(&client).await?;
        wait_image_admitted(&client, image::TOOLS_IMAGE).await?;
        Ok::<_, TestkitError>(images)
    })?;
    drop(runtime);

    Ok(RealNode {
        dir,
        bin_dir,
        containerd_socket: socket,
        cgroups,
        startup: started.elapsed(),
        images: Mutex::new(images.into_iter().collect()),
        kubeconfig_path: PathBuf::from(admin_kubeconfig),
        processes: Mutex::new(processes),
    })
}

fn component_name(kind: &str, driver: TestCsiDriver) -> &'static str {
    match (kind, driver) {
        ("csi", TestCsiDriver::SharedFs) => "csi-shared-fs",
        ("csi", TestCsiDriver::RootOwnedFs) => "csi-root-owned-fs",
        ("csi", TestCsiDriver::NamespacedBlock) => "csi-namespaced-block",
        ("provisioner", TestCsiDriver::SharedFs) => "provisioner-shared-fs",
        ("provisioner", TestCsiDriver::RootOwnedFs) => "provisioner-root-owned-fs",
        ("provisioner", TestCsiDriver::NamespacedBlock) => "provisioner-namespaced-block",
        ("csi", TestCsiDriver::TenantFs) => "csi-tenant-fs",
        ("provisioner", TestCsiDriver::TenantFs) => "provisioner-tenant-fs",
        _ => "attacher-namespaced-block",
    }
}

/// A CSI registration timeout is about the drivers, not the kubelet: add their log tails.
fn with_driver_logs(e: TestkitError, dir: &Path) -> TestkitError {
    match e {
        TestkitError::ComponentStart {
            reason,
            log,
            mut log_tail,
            ..
        } => {
            for driver in TestCsiDriver::ALL {
                let name = component_name("csi", driver);
                log_tail.push_str(&format!(
                    "\n--- last lines of {name}.log ---\n{}",
                    plane::tail(&dir.join(format!("{name}.log")), 10)
                ));
            }
            TestkitError::ComponentStart {
                component: "csi-test-driver",
                reason,
                log,
                log_tail,
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_namespace_script_stands_in_for_every_kubelet_sysctl() {
        let h = vec![
            Hierarchy {
                mount_point: "/sys/fs/cgroup/memory".into(),
                fs_type: "cgroup".into(),
                options: "memory".into(),
                current: "/a".into(),
            },
            Hierarchy {
                mount_point: "/sys/fs/cgroup/unified".into(),
                fs_type: "cgroup2".into(),
                options: String::new(),
                current: "/".into(),
            },
        ];
        let script = namespace_init_script(Path::new("/tmp/n"), &h);
        for (entry, _) in KUBELET_SYSCTLS {
            assert!(script.contains(&format!("/proc/sys/{entry}\n")), "{entry}");
        }
        assert!(script.contains("mount -t cgroup -o 'memory' cgroup '/sys/fs/cgroup/memory'"));
        assert!(script.contains("mount -t cgroup2 cgroup2 '/sys/fs/cgroup/unified'"));
        for shadowed in ["/run\n", "/var/lib\n", "/var/log\n"] {
            assert!(script.contains(shadowed), "{shadowed}");
        }
    }
}
