//! The real Mooncake store on the real node: its image, and the two parts of a cluster network
//! its pods need that [`PodNetwork`](crate::PodNetwork) does not give.
//!
//! # The image
//!
//! [`mooncake_image`] packs the store `hack/mooncake.sh` installs (PyPI
//! `mooncake-transfer-engine-non-cuda`, pinned there) the way [`hf_client_image`](crate::hf_client_image) packs the model
//! clients: the virtual environment and the Python that runs it at the paths they have on this
//! machine, the standard library, the busybox tools (`sh`, `find`, `wc`, `rm`: the operator's
//! survey init container and tier cleanup), and every shared library the wheel's programs load
//! (the `ldd` closure of the interpreter, of every extension module and of every ELF program in
//! the venv, such as the packaged `mooncake_master`, which links Debian's `libibverbs1` and
//! `libnuma1`). `mooncake_master` and `mc_store_rest_server` are on `PATH`, as the operator's
//! rendered commands name them; `python3` too (the members' preStop hook).
//!
//! It runs as uid 65532, gid 0 ([`MOONCAKE_USER`]), as the published store images do, so the
//! rendered `runAsNonRoot` Pods run it without `--store-image-user`, and a tier directory is
//! prepared for it with `install -d -o 65532 -g 0`.
//!
//! # Cluster DNS and Service addresses in pods
//!
//! The operator and the members reach the leader by its Service's DNS name
//! (`<backend>-leader.<namespace>.svc`, ports 50051 and 9003). The test node has no cluster DNS
//! (its pods' `resolv.conf` names this machine's servers, unreachable from a pod; the kit's
//! kubelet `resolvConf`, meant to give them none, is not what they get), and a
//! ClusterIP is a host loopback address that, inside a pod's network namespace, is the pod's
//! own. [`ClusterDns`] supplies what CoreDNS and kube-proxy would, for the pods of chosen
//! namespaces and no others: inside each such pod, a DNS server on UDP port 53 of each nameserver
//! its `resolv.conf` names (the kubelet gives the pods this node's own servers; one that is no
//! loopback address is added to the pod's `lo` first, so the questions stay in the pod) answering
//! `<service>.<namespace>.svc` (and `.svc.cluster.local`) with the Service's ClusterIP, and a
//! listener at each port of the chosen Services' ClusterIPs relaying to the same address on the
//! host, where `PodNetwork`'s Service listener relays to a Ready pod. A pod that itself declares
//! a Service port as a `containerPort` (the leader) gets no listener on that port: it binds the
//! port on every address, and a listener there first would take it from it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener as StdListener, UdpSocket as StdUdp};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::JoinHandle;

use crate::{ImageBuilder, TestkitError, pod_dirs, shared_libraries};

/// Environment variable naming the cached store's `mooncake_master` (what `hack/mooncake.sh`
/// prints); the store's other programs are beside it, in the venv's bin directory.
pub const ENV_MOONCAKE_MASTER: &str = "WARMCACHE_MOONCAKE_MASTER";

/// The user the image runs as: uid 65532, gid 0, as the published store images.
pub const MOONCAKE_USER: &str = "65532:0";

/// The uid of [`MOONCAKE_USER`], the owner a tier directory needs.
pub const MOONCAKE_UID: u32 = 65532;

/// `mooncake_master` as [`ENV_MOONCAKE_MASTER`] names it. Unlike the other tools of the kit,
/// nothing is installed when it is unset: the store is installed by `hack/mooncake.sh`
/// (`hack/test.sh` exports the variable), and a test that needs it fails, with this error.
pub fn mooncake_master() -> Result<PathBuf, TestkitError> {
    let path = std::env::var_os(ENV_MOONCAKE_MASTER).ok_or_else(|| {
        TestkitError::InvalidArgument(format!(
            "{ENV_MOONCAKE_MASTER} is not set: this test needs the real Mooncake store; run \
             `export {ENV_MOONCAKE_MASTER}=$(hack/mooncake.sh | tail -n 1)` (hack/test.sh does)"
        ))
    })?;
    let path = PathBuf::from(path);
    if !path.is_file() {
        return Err(TestkitError::InvalidArgument(format!(
            "{ENV_MOONCAKE_MASTER}={} is not a file (hack/mooncake.sh prints the path of the \
             cached store's mooncake_master)",
            path.display()
        )));
    }
    Ok(path)
}

/// The store's image `reference`, from the venv whose `bin/mooncake_master` is `master` (as
/// [`mooncake_master`] returns); `work` is a directory for staging.
pub fn mooncake_image(
    reference: &str,
    master: &Path,
    work: &Path,
) -> Result<ImageBuilder, TestkitError> {
    let bin = master.parent().ok_or_else(|| {
        TestkitError::InvalidArgument(format!("{} has no parent", master.display()))
    })?;
    for program in ["mooncake_master", "mc_store_rest_server", "python3"] {
        if !bin.join(program).exists() {
            return Err(TestkitError::InvalidArgument(format!(
                "{} holds no {program}: not the venv hack/mooncake.sh installs",
                bin.display()
            )));
        }
    }
    let venv = bin
        .parent()
        .ok_or_else(|| TestkitError::InvalidArgument(format!("{} has no parent", bin.display())))?;
    let cfg = std::fs::read_to_string(venv.join("pyvenv.cfg"))
        .map_err(|e| TestkitError::io(format!("reading {}/pyvenv.cfg", venv.display()), e))?;
    let setting = |key: &str| {
        cfg.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key).then(|| v.trim().to_owned())
        })
    };
    let home = PathBuf::from(setting("home").ok_or_else(|| {
        TestkitError::InvalidArgument(format!("{}/pyvenv.cfg names no home", venv.display()))
    })?);
    let base = home.parent().ok_or_else(|| {
        TestkitError::InvalidArgument(format!("{} has no parent", home.display()))
    })?;
    let version = setting("version").unwrap_or_default();
    let minor: String = version.split('.').take(2).collect::<Vec<_>>().join(".");
    let python = home.join(format!("python{minor}"));
    if minor.is_empty() || !python.is_file() {
        return Err(TestkitError::InvalidArgument(format!(
            "{}/pyvenv.cfg: no interpreter python{minor} in {}",
            venv.display(),
            home.display()
        )));
    }
    // The standard library without the base interpreter's own packages and the test suites.
    let stdlib = base.join(format!("lib/python{minor}"));
    let staged = work.join("mooncake-stdlib");
    std::fs::create_dir_all(&staged)
        .map_err(|e| TestkitError::io(format!("creating {}", staged.display()), e))?;
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
    // Everything that loads shared libraries: the interpreter, and every ELF object (extension
    // modules, the wheel's libraries, its programs such as the packaged mooncake_master) of
    // lib-dynload and of the venv.
    let mut loaders = vec![python.clone()];
    find_elf(&staged.join("lib-dynload"), &mut loaders)?;
    find_elf(venv, &mut loaders)?;
    let mut libraries = BTreeSet::new();
    for binary in &loaders {
        for library in shared_libraries(binary)? {
            // The wheel's own libraries are named through `$ORIGIN/..`: they are in the venv,
            // which is copied whole.
            let library = lexically_normal(&library);
            if !library.starts_with(venv) {
                libraries.insert(library);
            }
        }
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
            &format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display()),
        );
    for library in libraries {
        // fs::copy follows links: the library's contents under the name the loader asks for.
        image = image.file(&library, &dest(&library), 0o755);
    }
    Ok(image
        .contents(
            "/etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n\
             mooncake:x:65532:0:mooncake:/tmp:/bin/false\n",
            0o644,
        )
        .contents("/etc/group", "root:x:0:\nnogroup:x:65534:\n", 0o644)
        .env("HOME", "/tmp")
        .user(MOONCAKE_USER))
}

/// Every ELF object below `dir`: programs and shared objects (symbolic links are skipped: their
/// targets are found under their own names).
fn find_elf(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), TestkitError> {
    use std::io::Read;
    let entries = std::fs::read_dir(dir)
        .map_err(|e| TestkitError::io(format!("reading {}", dir.display()), e))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            find_elf(&path, out)?;
            continue;
        }
        if !kind.is_file() {
            continue;
        }
        let mut magic = [0u8; 4];
        let is_elf = File::open(&path)
            .and_then(|mut f| f.read_exact(&mut magic))
            .is_ok()
            && magic == *b"\x7fELF";
        if is_elf {
            out.push(path);
        }
    }
    Ok(())
}

/// `path` with its `.` and `..` components resolved without the file system (`a/b/../c` is
/// `a/c`), as the dynamic loader resolves an `$ORIGIN/..` path.
fn lexically_normal(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// How often [`ClusterDns`] looks for new pods and Services.
const POLL: Duration = Duration::from_millis(100);

/// Cluster DNS and ClusterIP access inside the pods of chosen namespaces (see the module
/// documentation); dropping it closes every listener it opened.
pub struct ClusterDns {
    state: Arc<Mutex<DnsState>>,
    task: JoinHandle<()>,
}

impl Drop for ClusterDns {
    fn drop(&mut self) {
        self.task.abort();
        if let Ok(mut s) = self.state.lock() {
            s.pods.clear();
        }
    }
}

#[derive(Default)]
struct DnsState {
    /// `<service>.<namespace>.svc` -> ClusterIP, for every Service.
    names: BTreeMap<String, Ipv4Addr>,
    /// Pod UID -> what was opened inside it.
    pods: BTreeMap<String, Attached>,
    /// DNS questions answered: (name, answered with an address).
    questions: BTreeMap<String, bool>,
    log: Vec<String>,
}

struct Attached {
    key: String,
    /// The pod's network namespace (`net:[inode]`).
    netns: PathBuf,
    /// Addresses listened at inside the pod (the DNS socket included).
    bound: BTreeSet<SocketAddr>,
    relayed: u64,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Attached {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl ClusterDns {
    /// Starts serving the pods of `namespaces` on the node whose pod cgroups are under
    /// `cgroup_root` (one of [`RealNode::cgroups`](crate::RealNode::cgroups)). DNS answers for
    /// every Service; ClusterIP listeners are opened for the Services `services` selects (a
    /// label selector, in every namespace).
    pub fn start(
        client: Client,
        cgroup_root: PathBuf,
        namespaces: &[&str],
        services: &str,
    ) -> ClusterDns {
        let state = Arc::new(Mutex::new(DnsState::default()));
        let namespaces: Vec<String> = namespaces.iter().map(|n| (*n).to_owned()).collect();
        let task = tokio::spawn(run(
            client,
            cgroup_root,
            namespaces,
            services.to_owned(),
            state.clone(),
        ));
        ClusterDns { state, task }
    }

    /// Whether a DNS question for `name` was answered with an address.
    pub fn answered(&self, name: &str) -> bool {
        self.state
            .lock()
            .is_ok_and(|s| s.questions.get(name).copied().unwrap_or(false))
    }

    /// What it did: the pods served and their listeners, the questions, failures.
    pub fn report(&self) -> String {
        let Ok(s) = self.state.lock() else {
            return "cluster DNS state poisoned\n".to_owned();
        };
        let mut out = String::from("cluster DNS (test stand-in):\n");
        for a in s.pods.values() {
            let bound: Vec<String> = a.bound.iter().map(ToString::to_string).collect();
            out.push_str(&format!(
                "  pod {}: listening at {}; {} connection(s) relayed\n",
                a.key,
                bound.join(", "),
                a.relayed
            ));
        }
        for (name, answered) in &s.questions {
            out.push_str(&format!(
                "  question {name}: {}\n",
                if *answered {
                    "answered"
                } else {
                    "no such Service"
                }
            ));
        }
        for line in s.log.iter().rev().take(20).rev() {
            out.push_str(&format!("  {line}\n"));
        }
        out
    }
}

fn note(state: &Arc<Mutex<DnsState>>, line: String) {
    if let Ok(mut s) = state.lock() {
        if s.log.len() > 200 {
            s.log.remove(0);
        }
        s.log.push(line);
    }
}

async fn run(
    client: Client,
    cgroup_root: PathBuf,
    namespaces: Vec<String>,
    selector: String,
    state: Arc<Mutex<DnsState>>,
) {
    let all_services: Api<Service> = Api::all(client.clone());
    loop {
        // The names, and the chosen Services' addresses.
        let mut relayed = Vec::new();
        match all_services.list(&ListParams::default()).await {
            Ok(list) => {
                let mut names = BTreeMap::new();
                for svc in &list.items {
                    let Some(ip) = svc
                        .spec
                        .as_ref()
                        .and_then(|s| s.cluster_ip.as_deref())
                        .and_then(|ip| ip.parse::<Ipv4Addr>().ok())
                    else {
                        continue;
                    };
                    let ns = svc.namespace().unwrap_or_default();
                    names.insert(format!("{}.{ns}.svc", svc.name_any()), ip);
                }
                if let Ok(mut s) = state.lock() {
                    s.names = names;
                }
            }
            Err(e) => note(&state, format!("listing Services: {e}")),
        }
        match all_services
            .list(&ListParams::default().labels(&selector))
            .await
        {
            Ok(list) => {
                for svc in &list.items {
                    let spec = svc.spec.clone().unwrap_or_default();
                    let Some(ip) = spec
                        .cluster_ip
                        .as_deref()
                        .and_then(|ip| ip.parse::<IpAddr>().ok())
                        .filter(IpAddr::is_loopback)
                    else {
                        continue;
                    };
                    for port in spec.ports.iter().flatten() {
                        if port.protocol.as_deref().unwrap_or("TCP") == "TCP" {
                            relayed.push(SocketAddr::new(ip, port.port as u16));
                        }
                    }
                }
            }
            Err(e) => note(&state, format!("listing Services {selector}: {e}")),
        }
        // The pods, by UID, and their sandboxes.
        let mut dirs = BTreeMap::new();
        pod_dirs(&cgroup_root, 4, &mut dirs);
        let mut live = BTreeSet::new();
        for ns in &namespaces {
            let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
            let list = match pods.list(&ListParams::default()).await {
                Ok(list) => list.items,
                Err(e) => {
                    note(&state, format!("listing pods of {ns}: {e}"));
                    continue;
                }
            };
            for pod in list {
                let Some(uid) = pod.uid() else { continue };
                live.insert(uid.clone());
                if pod.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
                    continue;
                }
                let Some(dir) = dirs.get(&uid) else { continue };
                let declared: BTreeSet<u16> = pod
                    .spec
                    .iter()
                    .flat_map(|s| s.containers.iter())
                    .flat_map(|c| c.ports.iter().flatten())
                    .map(|p| p.container_port as u16)
                    .collect();
                let wanted: Vec<SocketAddr> = relayed
                    .iter()
                    .filter(|a| !declared.contains(&a.port()))
                    .copied()
                    .collect();
                let key = format!("{ns}/{}", pod.name_any());
                attach(&uid, &key, dir, &wanted, &state);
            }
        }
        if let Ok(mut s) = state.lock() {
            s.pods.retain(|uid, _| live.contains(uid));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Opens, inside the pod `uid`, the listeners of `wanted` it does not have yet.
fn attach(uid: &str, key: &str, dir: &Path, wanted: &[SocketAddr], state: &Arc<Mutex<DnsState>>) {
    let Some(pid) = first_pid(dir) else { return };
    let netns_path = format!("/proc/{pid}/ns/net");
    // A sandbox whose first process (runc's init) has not joined the pod's namespace yet is
    // still in ours: binding there would listen on the host.
    let Ok(netns_id) = std::fs::read_link(&netns_path) else {
        return; // the process ended; the next pass finds another
    };
    if std::fs::read_link("/proc/self/ns/net").ok().as_ref() == Some(&netns_id) {
        return;
    }
    // The DNS server sits where the pod's resolv.conf sends its questions (known once a
    // container of the pod runs: the sandbox's own process has no resolv.conf).
    let mut wanted = wanted.to_vec();
    if let Some(servers) = pod_nameservers(dir) {
        wanted.extend(
            servers
                .into_iter()
                .map(|ip| SocketAddr::new(IpAddr::V4(ip), 53)),
        );
    }
    let missing: Vec<SocketAddr> = {
        let Ok(mut s) = state.lock() else { return };
        // A new sandbox of the same pod has a new namespace: everything again.
        if s.pods.get(uid).is_some_and(|a| a.netns != netns_id) {
            s.pods.remove(uid);
        }
        let bound = s.pods.get(uid).map(|a| &a.bound);
        wanted
            .iter()
            .filter(|a| !bound.is_some_and(|b| b.contains(a)))
            .copied()
            .collect()
    };
    if missing.is_empty() {
        return;
    }
    // A nameserver that is no loopback address (the host's, say 10.x) is not in the pod: it
    // becomes an address of the pod's `lo`, so its questions stay in the pod.
    for addr in missing
        .iter()
        .filter(|a| a.port() == 53 && !a.ip().is_loopback())
    {
        if let Err(e) = add_local_address(&netns_path, addr.ip()) {
            note(state, format!("{key}: {e}"));
            return;
        }
    }
    let netns = match File::open(&netns_path) {
        Ok(f) => f,
        Err(_) => return,
    };
    let sockets = match bind_in(netns, &missing) {
        Ok(s) => s,
        Err(e) => {
            note(state, format!("{key}: {e}"));
            return;
        }
    };
    let mut tasks = Vec::new();
    for socket in sockets {
        match socket {
            Bound::Dns(udp) => match UdpSocket::from_std(udp) {
                Ok(udp) => tasks.push(tokio::spawn(serve_dns(udp, state.clone()))),
                Err(e) => note(state, format!("{key}: DNS socket: {e}")),
            },
            Bound::Tcp(listener, target) => match TcpListener::from_std(listener) {
                Ok(listener) => tasks.push(tokio::spawn(relay_out(
                    listener,
                    target,
                    uid.to_owned(),
                    state.clone(),
                ))),
                Err(e) => note(state, format!("{key}: listener at {target}: {e}")),
            },
        }
    }
    if let Ok(mut s) = state.lock() {
        let entry = s.pods.entry(uid.to_owned()).or_insert_with(|| Attached {
            key: key.to_owned(),
            netns: netns_id.clone(),
            bound: BTreeSet::new(),
            relayed: 0,
            tasks: Vec::new(),
        });
        entry.bound.extend(missing.iter().copied());
        entry.tasks.extend(tasks);
        s.log.push(format!(
            "{key}: listening at {}",
            missing
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
}

enum Bound {
    Dns(StdUdp),
    Tcp(StdListener, SocketAddr),
}

/// Binds `addrs` inside the network namespace `netns` (port 53: UDP, the DNS server; others:
/// TCP), from a thread that joins it and ends; the sockets stay in that namespace.
fn bind_in(netns: File, addrs: &[SocketAddr]) -> Result<Vec<Bound>, String> {
    let addrs = addrs.to_vec();
    std::thread::Builder::new()
        .name("cluster-dns-netns".into())
        .spawn(move || -> Result<Vec<Bound>, String> {
            rustix::thread::move_into_link_name_space(
                netns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .map_err(|e| format!("setns: {e}"))?;
            addrs
                .iter()
                .map(|addr| {
                    if addr.port() == 53 {
                        StdUdp::bind(addr)
                            .and_then(|s| s.set_nonblocking(true).map(|()| Bound::Dns(s)))
                    } else {
                        StdListener::bind(addr)
                            .and_then(|l| l.set_nonblocking(true).map(|()| Bound::Tcp(l, *addr)))
                    }
                    .map_err(|e| format!("listening at {addr} in the pod: {e}"))
                })
                .collect()
        })
        .map_err(|e| format!("spawning the netns thread: {e}"))?
        .join()
        .map_err(|_| "the netns thread panicked".to_owned())?
}

/// Every process of the pod: `.../pod<uid>/<container>/cgroup.procs`.
fn pod_pids(dir: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            }
        }
    }
    pids
}

/// The IPv4 nameservers of the pod's `resolv.conf` (the kubelet writes one per pod: with no
/// cluster DNS, the node's own servers), read through a container process's root; glibc's
/// default, 127.0.0.1, when it names none. `None` while no container of the pod runs.
fn pod_nameservers(dir: &Path) -> Option<Vec<Ipv4Addr>> {
    let text = pod_pids(dir).into_iter().find_map(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/root/etc/resolv.conf")).ok()
    })?;
    let servers: Vec<Ipv4Addr> = text
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("nameserver")).then(|| words.next()?.parse().ok())?
        })
        .collect();
    Some(if servers.is_empty() {
        vec![Ipv4Addr::LOCALHOST]
    } else {
        servers
    })
}

/// Adds `ip`/32 to the `lo` of the network namespace `netns_path` (`ip` of iproute2, a
/// prerequisite of the node), unless it is there.
fn add_local_address(netns_path: &str, ip: IpAddr) -> Result<(), String> {
    let out = Command::new("nsenter")
        .arg(format!("--net={netns_path}"))
        .args(["ip", "address", "add"])
        .arg(format!("{ip}/32"))
        .args(["dev", "lo"])
        .output()
        .map_err(|e| format!("running nsenter ip address add {ip}/32 dev lo: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() || stderr.contains("File exists") {
        Ok(())
    } else {
        Err(format!(
            "ip address add {ip}/32 dev lo in the pod: {}",
            stderr.trim()
        ))
    }
}

/// A process of the pod: `.../pod<uid>/<container>/cgroup.procs`.
fn first_pid(dir: &Path) -> Option<u32> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs"))
            && let Some(pid) = text.lines().find_map(|l| l.trim().parse::<u32>().ok())
        {
            return Some(pid);
        }
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            }
        }
    }
    None
}

/// Each connection to `target` inside the pod, relayed to `target` on the host.
async fn relay_out(
    listener: TcpListener,
    target: SocketAddr,
    uid: String,
    state: Arc<Mutex<DnsState>>,
) {
    loop {
        let Ok((mut inner, _)) = listener.accept().await else {
            return;
        };
        if let Ok(mut s) = state.lock()
            && let Some(a) = s.pods.get_mut(&uid)
        {
            a.relayed += 1;
        }
        let state = state.clone();
        tokio::spawn(async move {
            match TcpStream::connect(target).await {
                Ok(mut outer) => {
                    let _ = tokio::io::copy_bidirectional(&mut inner, &mut outer).await;
                }
                Err(e) => note(&state, format!("connecting to {target} on the host: {e}")),
            }
        });
    }
}

/// Answers DNS questions for `<service>.<namespace>.svc[.cluster.local]`: an A record with the
/// ClusterIP, no record for other types of a known name, NXDOMAIN otherwise.
async fn serve_dns(socket: UdpSocket, state: Arc<Mutex<DnsState>>) {
    let mut buf = [0u8; 512];
    loop {
        let Ok((len, from)) = socket.recv_from(&mut buf).await else {
            return;
        };
        let Some(question) = parse_question(&buf[..len]) else {
            continue;
        };
        let lookup = question
            .name
            .trim_end_matches('.')
            .trim_end_matches(".cluster.local")
            .to_ascii_lowercase();
        let address = state.lock().ok().and_then(|mut s| {
            let ip = s.names.get(&lookup).copied();
            if question.qtype == 1 {
                s.questions.insert(question.name.clone(), ip.is_some());
            }
            ip
        });
        let reply = answer(&buf[..len], &question, address);
        let _ = socket.send_to(&reply, from).await;
    }
}

struct Question {
    name: String,
    qtype: u16,
    /// Where the question section ends in the query.
    end: usize,
}

/// The first question of a standard query.
fn parse_question(query: &[u8]) -> Option<Question> {
    if query.len() < 12 || query[2] & 0x80 != 0 || u16::from_be_bytes([query[4], query[5]]) < 1 {
        return None;
    }
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*query.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + len)?).into_owned());
        at += len;
    }
    let qtype = u16::from_be_bytes([*query.get(at)?, *query.get(at + 1)?]);
    query.get(at + 2..at + 4)?;
    Some(Question {
        name: labels.join("."),
        qtype,
        end: at + 4,
    })
}

fn answer(query: &[u8], question: &Question, address: Option<Ipv4Addr>) -> Vec<u8> {
    let known = address.is_some();
    let a_record = address.filter(|_| question.qtype == 1);
    let mut out = Vec::with_capacity(question.end + 16);
    out.extend_from_slice(&query[..2]); // id
    // QR, the query's RD, RA; NXDOMAIN for an unknown name.
    out.push(0x80 | (query[2] & 0x01));
    out.push(0x80 | if known { 0 } else { 3 });
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&u16::from(a_record.is_some()).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&query[12..question.end]);
    if let Some(ip) = a_record {
        out.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4]);
        out.extend_from_slice(&ip.octets());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            q.push(label.len() as u8);
            q.extend_from_slice(label.as_bytes());
        }
        q.push(0);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&1u16.to_be_bytes());
        q
    }

    #[test]
    fn a_known_name_gets_its_address_and_an_unknown_one_nxdomain() {
        let q = query("kvc-leader.ns.svc", 1);
        let question = parse_question(&q).unwrap();
        assert_eq!(question.name, "kvc-leader.ns.svc");
        let reply = answer(&q, &question, Some(Ipv4Addr::new(127, 0, 9, 7)));
        assert_eq!(&reply[..2], &[0x12, 0x34]);
        assert_eq!(reply[3] & 0x0f, 0);
        assert_eq!(u16::from_be_bytes([reply[6], reply[7]]), 1);
        assert_eq!(&reply[reply.len() - 4..], &[127, 0, 9, 7]);

        let aaaa = query("kvc-leader.ns.svc", 28);
        let question = parse_question(&aaaa).unwrap();
        let reply = answer(&aaaa, &question, Some(Ipv4Addr::new(127, 0, 9, 7)));
        assert_eq!(reply[3] & 0x0f, 0);
        assert_eq!(u16::from_be_bytes([reply[6], reply[7]]), 0);

        let reply = answer(&q, &parse_question(&q).unwrap(), None);
        assert_eq!(reply[3] & 0x0f, 3);
    }

    #[test]
    fn elf_objects_are_found_and_scripts_are_not() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::copy("/bin/ls", dir.path().join("sub/prog")).unwrap();
        std::fs::write(dir.path().join("script"), "#!/bin/sh\n").unwrap();
        let mut out = Vec::new();
        find_elf(dir.path(), &mut out).unwrap();
        assert_eq!(out, vec![dir.path().join("sub/prog")]);
    }

    #[test]
    fn origin_relative_paths_are_resolved() {
        assert_eq!(
            lexically_normal(Path::new("/v/lib/mooncake/./../libs/libx.so")),
            PathBuf::from("/v/lib/libs/libx.so")
        );
    }
}
