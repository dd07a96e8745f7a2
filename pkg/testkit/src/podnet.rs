//! A pod network for the real test node: pods run as shipped (no hostNetwork, HTTP probes,
//! Service-registered webhooks, in-cluster API access, downloads from a model source), which a
//! real cluster's pod network and kube-proxy make work. The test node has neither: its
//! CNI gives every pod an `eth0` with a loopback-range address (127.201.X.Y) whose other end
//! stays in the pod, so the pod reaches nothing and, from the host, its address is the host's
//! own loopback. The kit's Service CIDR is a loopback /24 (see `service_range` in the kit's
//! `plane.rs`), so ClusterIPs are host addresses too. This bridge supplies the paths pods
//! need, and nothing else:
//!
//! - **pod IPs**: for every TCP `containerPort` of a pod, a listener on the host at the pod's IP
//!   and that port, each connection relayed to the same address inside the pod's network
//!   namespace: the kubelet's `httpGet` probes reach the pod as over a pod network.
//! - **Services** (what kube-proxy does): for every port of every Service with a selector, a
//!   listener on the host at its ClusterIP and port, each connection relayed to a Ready pod the
//!   selector matches, at the target port (numeric or named): the API server's calls of a
//!   Service-registered webhook reach a webhook pod. Pods are chosen from their Ready condition,
//!   as EndpointSlices would list them (the API server refuses loopback addresses in
//!   EndpointSlices, so there are none to read).
//! - **the API server**: inside every pod, a listener at the `kubernetes` Service's ClusterIP and
//!   port (what `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT` name, and what the API
//!   server's certificate names; a loopback address, so already local to the pod's `lo`), each
//!   connection relayed to the API server on the host: in-cluster clients work unchanged.
//! - **egress** ([`PodNetwork::start_with_egress`]): inside every pod, a listener at each given
//!   host loopback address (for example a simulated model source at `127.0.0.1:PORT`), each
//!   connection relayed to the same address on the host, so a client in a pod reaches the
//!   source at the address it has on the host.
//!
//! Sockets inside a pod are opened by a thread of this process that joined the pod's network
//! namespace (`setns`), as soon as the pod's sandbox has a process (the node's `pod<uid>`
//! cgroups are watched every 20 ms): before its containers start, as a CNI sets the network up
//! first on a cluster, so a one-shot container's first call does not race the bridge. Nothing
//! is added to any network namespace but listening sockets on loopback addresses. Every relayed
//! connection is counted per pod and port, so a test can tell that the API server really
//! connected to a pod.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::net::{IpAddr, SocketAddr, TcpListener as StdListener, TcpStream as StdStream};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How often the bridge looks for new pods and Services in the API.
const POLL: Duration = Duration::from_millis(200);
/// How often it looks for new pod sandboxes on the node: a pod's containers start shortly
/// after its sandbox, and a one-shot container (the uninstall hook) needs the API at once, as
/// it would have it on a cluster whose CNI set the network up before any container started.
const ATTACH_POLL: Duration = Duration::from_millis(20);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

type ConnectRequest = (SocketAddr, oneshot::Sender<std::io::Result<StdStream>>);
type Connector = std::sync::mpsc::Sender<ConnectRequest>;

/// What the bridge knows and did, for routing, failure messages and assertions.
#[derive(Default)]
struct State {
    /// Pod UID -> its netns thread and in-pod API listener, from the moment its sandbox runs.
    attached: BTreeMap<String, Attached>,
    /// Pod UIDs of host-network pods (nothing to bridge), from the API.
    host_network: BTreeSet<String>,
    /// Pod UID -> failed attach attempts so far (a sandbox being set up is retried).
    attempts: BTreeMap<String, u32>,
    /// Pod UID -> its pod IP listeners, once the API shows its IP.
    pods: BTreeMap<String, Bridged>,
    /// "namespace/service:port" -> its listener.
    services: BTreeMap<String, Tasks>,
    /// Pod UIDs or Service keys whose bridge failed (not retried), with why.
    failed: BTreeMap<String, String>,
    /// "namespace/pod:port" -> connections relayed into the pod (to its IP or through a
    /// Service).
    inbound: BTreeMap<String, u64>,
    /// "pod UID->host address" -> connections relayed from the pod to the API server or an
    /// egress address.
    outbound: BTreeMap<String, u64>,
    log: Vec<String>,
}

struct Tasks(Vec<JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

struct Attached {
    /// The pod's cgroup directory: the pod is gone when it is.
    dir: PathBuf,
    connect: Connector,
    _tasks: Tasks,
}

struct Bridged {
    /// "namespace/name".
    key: String,
    namespace: String,
    labels: BTreeMap<String, String>,
    ready: bool,
    ip: IpAddr,
    /// Container port names -> numbers.
    named_ports: BTreeMap<String, u16>,
    connect: Connector,
    _tasks: Tasks,
}

/// The running bridge; dropping it stops every listener.
pub struct PodNetwork {
    state: Arc<Mutex<State>>,
    _tasks: Tasks,
}

impl Drop for PodNetwork {
    fn drop(&mut self) {
        if let Ok(mut state) = self.state.lock() {
            state.pods.clear();
            state.attached.clear();
            state.services.clear();
        }
    }
}

impl PodNetwork {
    /// Starts bridging every pod of the node (all namespaces) that is not on the host network,
    /// and every Service. `cgroup_root` is one of the node's cgroup directories (where the
    /// kubelet's `pod<uid>` cgroups are), `apiserver` the API server's address on the host.
    pub async fn start(
        client: Client,
        cgroup_root: PathBuf,
        apiserver: SocketAddr,
    ) -> Result<PodNetwork, String> {
        Self::start_with_egress(client, cgroup_root, apiserver, &[]).await
    }

    /// [`start_with_egress`](Self::start_with_egress) for the kit's `plane` and its real
    /// `node` (its first cgroup directory, the plane's API server).
    pub async fn on_node(
        plane: &crate::ControlPlane,
        node: &crate::RealNode,
        egress: &[SocketAddr],
    ) -> Result<PodNetwork, String> {
        let client = plane.client().await.map_err(|e| e.to_string())?;
        let apiserver: SocketAddr = plane
            .server_url()
            .trim_start_matches("https://")
            .parse()
            .map_err(|e| format!("the API server's address {}: {e}", plane.server_url()))?;
        let cgroup = node
            .cgroups()
            .first()
            .cloned()
            .ok_or("the real node has no cgroup directory")?;
        Self::start_with_egress(client, cgroup, apiserver, egress).await
    }

    /// [`start`](Self::start), and inside every pod a listener at each address of `egress`
    /// (loopback addresses of this host) relaying to the same address on the host.
    pub async fn start_with_egress(
        client: Client,
        cgroup_root: PathBuf,
        apiserver: SocketAddr,
        egress: &[SocketAddr],
    ) -> Result<PodNetwork, String> {
        if let Some(addr) = egress.iter().find(|a| !a.ip().is_loopback()) {
            return Err(format!(
                "egress address {addr} is not a loopback address of this host"
            ));
        }
        let services: Api<Service> = Api::namespaced(client.clone(), "default");
        let mut cluster_api = None;
        for _ in 0..300 {
            if let Ok(Some(svc)) = services.get_opt("kubernetes").await {
                let spec = svc.spec.unwrap_or_default();
                let ip = spec.cluster_ip.unwrap_or_default();
                let port = spec
                    .ports
                    .unwrap_or_default()
                    .first()
                    .map(|p| p.port)
                    .unwrap_or(443);
                if let Ok(ip) = ip.parse::<IpAddr>() {
                    cluster_api = Some(SocketAddr::new(ip, port as u16));
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let cluster_api =
            cluster_api.ok_or("the Service default/kubernetes has no ClusterIP after 30 s")?;
        if !cluster_api.ip().is_loopback() {
            return Err(format!(
                "the kubernetes Service's ClusterIP {} is not a loopback address: this kit's \
                 Service CIDR cannot be bridged",
                cluster_api.ip()
            ));
        }
        let state = Arc::new(Mutex::new(State::default()));
        let tasks = Tasks(vec![
            tokio::spawn(attach_loop(
                cgroup_root,
                apiserver,
                cluster_api,
                egress.to_vec(),
                state.clone(),
            )),
            tokio::spawn(run(client, state.clone())),
        ]);
        Ok(PodNetwork {
            state,
            _tasks: tasks,
        })
    }

    /// Connections relayed into pods of `namespace` whose name starts with `prefix`, on `port`.
    pub fn inbound(&self, namespace: &str, prefix: &str, port: u16) -> u64 {
        let Ok(state) = self.state.lock() else {
            return 0;
        };
        state
            .inbound
            .iter()
            .filter(|(key, _)| {
                key.strip_prefix(&format!("{namespace}/"))
                    .is_some_and(|rest| rest.starts_with(prefix))
                    && key.ends_with(&format!(":{port}"))
            })
            .map(|(_, n)| n)
            .sum()
    }

    /// Connections relayed from pods to `target` on the host (the API server, or an egress
    /// address).
    pub fn outbound_to(&self, target: SocketAddr) -> u64 {
        let Ok(state) = self.state.lock() else {
            return 0;
        };
        let suffix = format!("->{target}");
        state
            .outbound
            .iter()
            .filter(|(key, _)| key.ends_with(&suffix))
            .map(|(_, n)| n)
            .sum()
    }

    /// What the bridge did: pods and Services bridged, failures, connection counts.
    pub fn report(&self) -> String {
        let Ok(state) = self.state.lock() else {
            return "pod network state poisoned".into();
        };
        let mut out = String::from("pod network bridge:\n");
        for line in state.log.iter().rev().take(80).rev() {
            out.push_str(&format!("  {line}\n"));
        }
        for (what, why) in &state.failed {
            out.push_str(&format!("  FAILED {what}: {why}\n"));
        }
        out.push_str(&format!(
            "  inbound {:?}\n  outbound {:?}\n",
            state.inbound, state.outbound
        ));
        out
    }
}

fn note(state: &Arc<Mutex<State>>, line: String) {
    if let Ok(mut s) = state.lock() {
        s.log.push(line);
    }
}

fn count(state: &Arc<Mutex<State>>, key: &str) {
    if let Ok(mut s) = state.lock() {
        *s.inbound.entry(key.to_owned()).or_default() += 1;
    }
}

/// Watches the node's cgroups for pod sandboxes and attaches to each one's network namespace
/// as soon as it has a process; detaches when its cgroup is gone.
async fn attach_loop(
    cgroup_root: PathBuf,
    apiserver: SocketAddr,
    cluster_api: SocketAddr,
    egress: Vec<SocketAddr>,
    state: Arc<Mutex<State>>,
) {
    let own_netns = std::fs::read_link("/proc/self/ns/net").ok();
    loop {
        let mut dirs = BTreeMap::new();
        pod_dirs(&cgroup_root, 4, &mut dirs);
        let new: Vec<(String, PathBuf)> = {
            let Ok(mut s) = state.lock() else { return };
            let gone: Vec<String> = s
                .attached
                .iter()
                .filter(|(_, a)| !a.dir.exists())
                .map(|(uid, _)| uid.clone())
                .collect();
            for uid in gone {
                s.attached.remove(&uid);
                s.log.push(format!("pod {uid}: sandbox gone, detached"));
            }
            dirs.into_iter()
                .filter(|(uid, _)| {
                    !s.attached.contains_key(uid)
                        && !s.host_network.contains(uid)
                        && !s.failed.contains_key(uid)
                })
                .collect()
        };
        for (uid, dir) in new {
            let Some(pid) = first_pid(&dir) else {
                // No process in the sandbox yet: next round.
                continue;
            };
            let netns_path = format!("/proc/{pid}/ns/net");
            // Still ours: a host-network pod (the API says so, see `run`), or a sandbox whose
            // first process (runc's init) has not joined the pod's namespace yet.
            if own_netns.is_some() && std::fs::read_link(&netns_path).ok() == own_netns {
                continue;
            }
            match attach(&uid, &netns_path, apiserver, cluster_api, &egress, &state) {
                Ok((connect, tasks)) => {
                    if let Ok(mut s) = state.lock() {
                        s.log.push(format!(
                            "pod {uid}: attached (pid {pid}, API at {cluster_api})"
                        ));
                        s.attached.insert(
                            uid,
                            Attached {
                                dir,
                                connect,
                                _tasks: Tasks(tasks),
                            },
                        );
                    }
                }
                // A sandbox being set up (lo not up yet, the process gone): again, for about
                // 5 s, then given up and reported.
                Err(why) => {
                    if let Ok(mut s) = state.lock() {
                        let n = s.attempts.entry(uid.clone()).or_default();
                        *n += 1;
                        if *n >= 250 {
                            s.log.push(format!("pod {uid}: attach failed: {why}"));
                            s.failed.insert(uid, why);
                        }
                    }
                }
            }
        }
        tokio::time::sleep(ATTACH_POLL).await;
    }
}

/// The kubelet's pod cgroups (`pod<uid>`) under `dir` (at most `depth` levels down), by UID.
pub fn pod_dirs(dir: &Path, depth: usize, out: &mut BTreeMap<String, PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if let Some(uid) = name.strip_prefix("pod")
            && uid.len() == 36
        {
            out.insert(uid.to_owned(), entry.path());
        } else if depth > 0 {
            pod_dirs(&entry.path(), depth - 1, out);
        }
    }
}

/// Exposes pods (their IPs, for probes) and Services as the API shows them.
async fn run(client: Client, state: Arc<Mutex<State>>) {
    let pods: Api<Pod> = Api::all(client.clone());
    let services: Api<Service> = Api::all(client);
    loop {
        match pods.list(&ListParams::default()).await {
            Ok(list) => {
                let live: BTreeSet<String> = list.items.iter().filter_map(|p| p.uid()).collect();
                if let Ok(mut s) = state.lock() {
                    let gone: Vec<String> = s
                        .pods
                        .keys()
                        .filter(|uid| !live.contains(*uid))
                        .cloned()
                        .collect();
                    for uid in gone {
                        if let Some(b) = s.pods.remove(&uid) {
                            s.log.push(format!("{}: gone, bridge closed", b.key));
                        }
                    }
                    for pod in &list.items {
                        if pod.spec.as_ref().and_then(|s| s.host_network) == Some(true)
                            && let Some(uid) = pod.uid()
                        {
                            s.host_network.insert(uid);
                        }
                    }
                    // Readiness and labels change over a pod's life.
                    for pod in &list.items {
                        if let Some(b) = pod.uid().and_then(|uid| s.pods.get_mut(&uid)) {
                            b.ready = is_ready(pod) && pod.metadata.deletion_timestamp.is_none();
                            b.labels = pod.labels().clone();
                        }
                    }
                }
                for pod in list.items {
                    bridge_if_new(&pod, &state).await;
                }
            }
            Err(e) => note(&state, format!("listing pods: {e}")),
        }
        match services.list(&ListParams::default()).await {
            Ok(list) => sync_services(&list.items, &state).await,
            Err(e) => note(&state, format!("listing services: {e}")),
        }
        tokio::time::sleep(POLL).await;
    }
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn sync_services(services: &[Service], state: &Arc<Mutex<State>>) {
    let mut wanted = BTreeMap::new();
    for svc in services {
        let spec = svc.spec.clone().unwrap_or_default();
        let (Some(selector), Some(ip)) = (
            spec.selector.filter(|s| !s.is_empty()),
            spec.cluster_ip
                .as_deref()
                .and_then(|ip| ip.parse::<IpAddr>().ok())
                .filter(IpAddr::is_loopback),
        ) else {
            continue;
        };
        let namespace = svc.namespace().unwrap_or_default();
        for port in spec.ports.iter().flatten() {
            if port.protocol.as_deref().unwrap_or("TCP") != "TCP" {
                continue;
            }
            let target = port
                .target_port
                .clone()
                .unwrap_or(IntOrString::Int(port.port));
            let key = format!("{namespace}/{}:{}", svc.name_any(), port.port);
            wanted.insert(
                key,
                (
                    SocketAddr::new(ip, port.port as u16),
                    namespace.clone(),
                    selector.clone(),
                    target,
                ),
            );
        }
    }
    let new: Vec<_> = {
        let Ok(mut s) = state.lock() else { return };
        s.services.retain(|key, _| wanted.contains_key(key));
        wanted
            .into_iter()
            .filter(|(key, _)| !s.services.contains_key(key) && !s.failed.contains_key(key))
            .collect()
    };
    for (key, (addr, namespace, selector, target)) in new {
        match TcpListener::bind(addr).await {
            Ok(listener) => {
                let task = tokio::spawn(serve_service(
                    listener,
                    namespace,
                    selector,
                    target,
                    state.clone(),
                ));
                if let Ok(mut s) = state.lock() {
                    s.log.push(format!("service {key}: routed at {addr}"));
                    s.services.insert(key, Tasks(vec![task]));
                }
            }
            Err(e) => {
                if let Ok(mut s) = state.lock() {
                    s.failed.insert(key, format!("listening on {addr}: {e}"));
                }
            }
        }
    }
}

/// kube-proxy for one Service port: each connection to a Ready pod the selector matches, in
/// turn.
async fn serve_service(
    listener: TcpListener,
    namespace: String,
    selector: BTreeMap<String, String>,
    target: IntOrString,
    state: Arc<Mutex<State>>,
) {
    let turn = AtomicUsize::new(0);
    loop {
        let Ok((outer, _)) = listener.accept().await else {
            return;
        };
        let chosen = state.lock().ok().and_then(|s| {
            let ready: Vec<(String, Connector, SocketAddr)> = s
                .pods
                .values()
                .filter(|b| {
                    b.ready
                        && b.namespace == namespace
                        && selector.iter().all(|(k, v)| b.labels.get(k) == Some(v))
                })
                .filter_map(|b| {
                    let port = match &target {
                        IntOrString::Int(n) => u16::try_from(*n).ok()?,
                        IntOrString::String(name) => *b.named_ports.get(name)?,
                    };
                    Some((
                        format!("{}:{port}", b.key),
                        b.connect.clone(),
                        SocketAddr::new(b.ip, port),
                    ))
                })
                .collect();
            if ready.is_empty() {
                return None;
            }
            let i = turn.fetch_add(1, Ordering::Relaxed) % ready.len();
            ready.into_iter().nth(i)
        });
        // No ready endpoint: the connection is closed, as a Service without endpoints refuses.
        let Some((key, connect, addr)) = chosen else {
            continue;
        };
        count(&state, &key);
        tokio::spawn(relay_into(outer, connect, addr, key, state.clone()));
    }
}

/// Relays `outer` to `addr` inside a pod (through its netns thread).
async fn relay_into(
    outer: TcpStream,
    connect: Connector,
    addr: SocketAddr,
    key: String,
    state: Arc<Mutex<State>>,
) {
    let (reply, answer) = oneshot::channel();
    if connect.send((addr, reply)).is_err() {
        return;
    }
    let inner = match answer.await {
        Ok(Ok(s)) => s,
        // Refused while the server is not listening yet: the caller sees the connection
        // closed, as a probe before the server starts would.
        Ok(Err(e)) => {
            note(&state, format!("{key}: connecting inside the pod: {e}"));
            return;
        }
        Err(_) => return,
    };
    match TcpStream::from_std(inner) {
        Ok(inner) => relay(outer, inner).await,
        Err(e) => note(&state, format!("{key}: {e}")),
    }
}

async fn bridge_if_new(pod: &Pod, state: &Arc<Mutex<State>>) {
    let Some(uid) = pod.uid() else { return };
    let namespace = pod.namespace().unwrap_or_default();
    let key = format!("{namespace}/{}", pod.name_any());
    let spec = pod.spec.clone().unwrap_or_default();
    if spec.host_network == Some(true) || pod.metadata.deletion_timestamp.is_some() {
        return;
    }
    let Some(ip) = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse::<IpAddr>().ok())
    else {
        return;
    };
    let connect = {
        let Ok(s) = state.lock() else { return };
        if s.pods.contains_key(&uid) || s.failed.contains_key(&uid) {
            return;
        }
        match s.attached.get(&uid) {
            Some(a) => a.connect.clone(),
            // Its sandbox is not attached yet: next round.
            None => return,
        }
    };
    let container_ports: Vec<_> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
        .collect();
    let ports: BTreeSet<u16> = container_ports
        .iter()
        .map(|p| p.container_port as u16)
        .collect();
    let named_ports: BTreeMap<String, u16> = container_ports
        .iter()
        .filter_map(|p| Some((p.name.clone()?, p.container_port as u16)))
        .collect();
    match expose(&key, ip, &ports, &connect, state).await {
        Ok(tasks) => {
            if let Ok(mut s) = state.lock() {
                s.log
                    .push(format!("{key} ({uid}): exposed at {ip}, ports {ports:?}"));
                s.pods.insert(
                    uid,
                    Bridged {
                        key,
                        namespace,
                        labels: pod.labels().clone(),
                        ready: is_ready(pod),
                        ip,
                        named_ports,
                        connect,
                        _tasks: Tasks(tasks),
                    },
                );
            }
        }
        Err(why) => {
            if let Ok(mut s) = state.lock() {
                s.log.push(format!("{key}: bridge failed: {why}"));
                s.failed.insert(uid, format!("{key}: {why}"));
            }
        }
    }
}

/// A process of the pod (its sandbox's pause first): `.../pod<uid>/<container>/cgroup.procs`.
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

/// A thread inside the pod's network namespace: listens at each address of `listen` there,
/// then opens connections there on request until every [`Connector`] is dropped.
fn netns_thread(
    netns: File,
    listen: Vec<SocketAddr>,
) -> Result<(Vec<StdListener>, Connector), String> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<Vec<StdListener>, String>>();
    let (tx, rx) = std::sync::mpsc::channel::<ConnectRequest>();
    std::thread::Builder::new()
        .name("podnet-netns".into())
        .spawn(move || {
            if let Err(e) = rustix::thread::move_into_link_name_space(
                netns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            ) {
                let _ = ready_tx.send(Err(format!("setns: {e}")));
                return;
            }
            let listeners: Result<Vec<StdListener>, String> = listen
                .iter()
                .map(|addr| {
                    StdListener::bind(addr)
                        .and_then(|l| l.set_nonblocking(true).map(|()| l))
                        .map_err(|e| format!("listening on {addr} in the pod: {e}"))
                })
                .collect();
            let ok = listeners.is_ok();
            let _ = ready_tx.send(listeners);
            if !ok {
                return;
            }
            while let Ok((addr, reply)) = rx.recv() {
                let stream = StdStream::connect_timeout(&addr, CONNECT_TIMEOUT)
                    .and_then(|s| s.set_nonblocking(true).map(|()| s));
                let _ = reply.send(stream);
            }
        })
        .map_err(|e| format!("spawning the netns thread: {e}"))?;
    let listeners = ready_rx
        .recv()
        .map_err(|_| "the netns thread ended".to_owned())??;
    Ok((listeners, tx))
}

/// Joins the pod's network namespace (a thread) and relays its connections to the
/// `kubernetes` Service to the API server, and those to each egress address to the same
/// address on the host.
fn attach(
    uid: &str,
    netns_path: &str,
    apiserver: SocketAddr,
    cluster_api: SocketAddr,
    egress: &[SocketAddr],
    state: &Arc<Mutex<State>>,
) -> Result<(Connector, Vec<JoinHandle<()>>), String> {
    let netns = File::open(netns_path).map_err(|e| format!("opening {netns_path}: {e}"))?;
    let mut listen = vec![cluster_api];
    listen.extend_from_slice(egress);
    let (listeners, connect) = netns_thread(netns, listen)?;
    let targets = std::iter::once(apiserver).chain(egress.iter().copied());
    let mut tasks = Vec::new();
    for (listener, target) in listeners.into_iter().zip(targets) {
        let listener =
            TcpListener::from_std(listener).map_err(|e| format!("listener for {target}: {e}"))?;
        let (st, k) = (state.clone(), uid.to_owned());
        tasks.push(tokio::spawn(async move {
            loop {
                let Ok((inner, _)) = listener.accept().await else {
                    return;
                };
                if let Ok(mut s) = st.lock() {
                    *s.outbound.entry(format!("{k}->{target}")).or_default() += 1;
                }
                let (st, k) = (st.clone(), k.clone());
                tokio::spawn(async move {
                    match TcpStream::connect(target).await {
                        Ok(outer) => relay(inner, outer).await,
                        Err(e) => note(&st, format!("pod {k}: connecting to {target}: {e}")),
                    }
                });
            }
        }));
    }
    Ok((connect, tasks))
}

/// Listens on the host at the pod's IP for each of its container ports.
async fn expose(
    key: &str,
    ip: IpAddr,
    ports: &BTreeSet<u16>,
    connect: &Connector,
    state: &Arc<Mutex<State>>,
) -> Result<Vec<JoinHandle<()>>, String> {
    let mut tasks = Vec::new();
    for &port in ports {
        let addr = SocketAddr::new(ip, port);
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("listening on {addr} on the host: {e}"))?;
        let (st, k, connect) = (state.clone(), format!("{key}:{port}"), connect.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let Ok((outer, _)) = listener.accept().await else {
                    return;
                };
                count(&st, &k);
                tokio::spawn(relay_into(
                    outer,
                    connect.clone(),
                    addr,
                    k.clone(),
                    st.clone(),
                ));
            }
        }));
    }
    Ok(tasks)
}

async fn relay(mut a: TcpStream, mut b: TcpStream) {
    let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
}
