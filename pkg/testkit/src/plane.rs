//! The real control plane: locating the binaries, generating its PKI, supervising the processes,
//! waiting for health and installing the workspace CRDs.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::crash::CrashSwitch;
use crate::faults::FaultInjector;
use crate::pki::{Ca, base64, ecdsa_key_pair_pem};
use crate::{TestkitError, crd};

/// Env var naming a directory that holds `etcd`, `kube-apiserver` and `kube-controller-manager`.
pub const ENV_BIN_DIR: &str = "WARMCACHE_CONTROL_PLANE_BIN";
/// Env var naming the directory whose `*.yaml` CRDs are installed (default
/// `<workspace>/config/crd`).
pub const ENV_CRD_DIR: &str = "WARMCACHE_TESTKIT_CRD_DIR";
/// Env var naming a directory that holds the `kube-apiserver` of the oldest Kubernetes version
/// the chart supports (`hack/build-oldest-apiserver.sh` prints it).
pub const ENV_OLDEST_APISERVER_BIN: &str = "WARMCACHE_OLDEST_APISERVER_BIN";
/// Env var naming a directory where every plane writes the API server's audit log of requests
/// made by ServiceAccounts (`<dir>/<plane>.audit.jsonl`), which `cargo xtask rbac-usage` reads
/// to prove each granted verb is used. Unset: no audit log.
pub const ENV_AUDIT_DIR: &str = "WARMCACHE_AUDIT_DIR";

/// The audit policy of every plane when [`ENV_AUDIT_DIR`] is set: metadata (who, what, which
/// role allowed it, the response code) of every request a ServiceAccount makes, and the
/// response body of the Roles it writes (the rules it had to hold itself, which the API server
/// checks without a request of its own), nothing else.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: RequestResponse
  userGroups: [system:serviceaccounts]
  verbs: [create, patch, update]
  resources:
  - group: rbac.authorization.k8s.io
    resources: [roles, clusterroles]
- level: Metadata
  userGroups: [system:serviceaccounts]
- level: None
";

const ETCD_TIMEOUT: Duration = Duration::from_secs(30);
const APISERVER_TIMEOUT: Duration = Duration::from_secs(120);
const CONTROLLER_MANAGER_TIMEOUT: Duration = Duration::from_secs(90);
const CRD_TIMEOUT: Duration = Duration::from_secs(60);
const START_ATTEMPTS: usize = 3;
const POLL: Duration = Duration::from_millis(100);

/// Runs a component under a bash supervisor whose stdin is a pipe from this process. When this
/// process exits (even by SIGKILL) the pipe closes, `read` returns, and the supervisor terminates
/// the component (TERM, then KILL after 2 s: the data is throwaway). If the component exits on
/// its own, the supervisor exits with the component's status so the kit can notice.
///
/// A CI timeout or a closed terminal signals the whole process group (TERM, HUP, INT). The
/// supervisor then stays alive until the component is gone (TERM, then KILL after 2 s), so that
/// the janitor, which waits for the supervisors, removes the directory only after the component
/// stopped writing to it. The trap runs a handler rather than ignoring the signals, so the
/// component starts with the default dispositions; the watcher ignores them, so it still
/// escalates to KILL if the supervisor is killed outright.
pub(crate) const SUPERVISOR: &str = r#"exec 3<&0
signalled=0
trap 'signalled=1' INT TERM HUP
"$@" </dev/null 3<&- &
child=$!
{ trap '' INT TERM HUP; read -r _ <&3; kill -TERM "$child" 2>/dev/null; sleep 2; kill -KILL "$child" 2>/dev/null; } &
watcher=$!
exec 3<&-
while :; do
  wait "$child"
  status=$?
  # `wait` also returns when a trapped signal arrives; the component may still be running.
  kill -0 "$child" 2>/dev/null || break
  if [ "$signalled" = 1 ]; then
    kill -TERM "$child" 2>/dev/null
    for _ in $(seq 1 40); do kill -0 "$child" 2>/dev/null || break; sleep 0.05; done
    kill -0 "$child" 2>/dev/null && kill -KILL "$child" 2>/dev/null
  fi
done
exec 2>/dev/null
kill -KILL "$watcher"
exit "$status""#;

/// Removes the plane's directory once this process is gone and every supervisor (whose pids arrive
/// on stdin, one per line) has exited. It ignores the signals a CI timeout or a closed terminal
/// sends to the whole process group, so the directory (CA key, admin token, etcd data) does not
/// outlive the run.
const JANITOR: &str = r#"trap '' INT TERM HUP
dir=$1
pids=()
while read -r pid; do pids+=("$pid"); done
for pid in "${pids[@]}"; do
  for _ in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
done
rm -rf -- "$dir""#;

static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();

/// A real Kubernetes control plane on loopback: etcd, kube-apiserver and kube-controller-manager
/// (all controllers, including garbage collection and namespace deletion), with the workspace's
/// CRDs installed and Established.
///
/// There is no scheduler and no kubelet: pods stay `Pending` until a test plays kubelet with
/// [`Kubelet`](crate::Kubelet), or a test binary adds a [`RealNode`](crate::RealNode).
///
/// Get the process-wide instance with [`ControlPlane::shared`]; clients are per test via
/// [`ControlPlane::client`].
pub struct ControlPlane {
    dir: PathBuf,
    bin_dir: PathBuf,
    kubeconfig_path: PathBuf,
    kubeconfig: Kubeconfig,
    server_url: String,
    ca_pem: String,
    token: String,
    node_credentials: NodeCredentials,
    etcd_url: String,
    crds: Vec<String>,
    startup: Duration,
    processes: Mutex<Processes>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("dir", &self.dir)
            .field("server_url", &self.server_url)
            .field("etcd_url", &self.etcd_url)
            .field("crds", &self.crds)
            .field("startup", &self.startup)
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Starts the process-wide control plane on first use and returns it; later calls (from any
    /// test, on any tokio runtime, concurrently) get the same instance.
    ///
    /// Startup runs on a dedicated thread with its own runtime, so it does not depend on the
    /// calling test's runtime, which is dropped when that test ends. If startup fails, this and
    /// every later call return an error: tests fail, they are never skipped.
    pub async fn shared() -> Result<&'static ControlPlane, TestkitError> {
        let slot = match SHARED.get() {
            Some(slot) => slot,
            None => tokio::task::spawn_blocking(|| {
                SHARED.get_or_init(|| ControlPlane::start().map_err(|e| e.chain()))
            })
            .await
            .map_err(|e| TestkitError::Unavailable(format!("startup task failed: {e}")))?,
        };
        slot.as_ref()
            .map_err(|message| TestkitError::Unavailable(message.clone()))
    }

    /// Starts a new, private control plane and blocks until it is ready (CRDs included).
    ///
    /// Prefer [`ControlPlane::shared`] in tests. This is for tools such as the `local-up` binary
    /// that own the plane's lifetime: dropping the returned value stops the processes and removes
    /// the plane's directory. Do not call it from inside an async task (it blocks).
    pub fn start() -> Result<ControlPlane, TestkitError> {
        on_startup_thread(start_blocking)
    }

    /// Starts a new, private plane whose API server is the oldest Kubernetes version the chart
    /// supports (`$WARMCACHE_OLDEST_APISERVER_BIN`, else the directory
    /// `hack/build-oldest-apiserver.sh` prints), with the kit's etcd and the workspace CRDs
    /// installed, and no controller manager (a newer controller manager than its API server is
    /// outside the version-skew policy). It is for validating objects against that version's
    /// schemas and admission; nothing reconciles on it. Blocks like [`ControlPlane::start`].
    pub fn start_oldest() -> Result<ControlPlane, TestkitError> {
        on_startup_thread(|| {
            let current = locate_binaries()?;
            let oldest = locate_oldest_apiserver()?;
            let binaries = Binaries {
                etcd: current.join("etcd"),
                apiserver: oldest.join("kube-apiserver"),
                controller_manager: None,
                dir: oldest,
            };
            start_with(&binaries)
        })
    }

    /// A new admin (`system:masters`) client, bound to the calling test's tokio runtime.
    ///
    /// Each call builds a fresh client: a `kube::Client` must not be shared across tests, because
    /// its request buffer runs as a task on the runtime that created it.
    pub async fn client(&self) -> Result<Client, TestkitError> {
        let config = self.config().await?;
        Client::try_from(config).map_err(|e| TestkitError::kube("building a client", e))
    }

    /// Like [`client`](Self::client), with `faults` layered in front of the client's HTTP stack
    /// (see [`FaultInjector`]).
    pub async fn client_with_faults(&self, faults: FaultInjector) -> Result<Client, TestkitError> {
        let config = self.config().await?;
        let builder = kube::client::ClientBuilder::try_from(config)
            .map_err(|e| TestkitError::kube("building a client", e))?;
        Ok(builder.with_layer(&faults.layer()).build())
    }

    /// An admin client whose process "crashes" as `crash` says: its writes reach the server
    /// until the switch's last one, then every request fails (see [`CrashSwitch`]).
    pub async fn client_with_crash(&self, crash: &CrashSwitch) -> Result<Client, TestkitError> {
        let config = self.config().await?;
        let builder = kube::client::ClientBuilder::try_from(config)
            .map_err(|e| TestkitError::kube("building a client", e))?;
        Ok(builder.with_layer(&crash.layer()).build())
    }

    /// The client configuration for the admin user (server URL, CA and bearer token).
    pub async fn config(&self) -> Result<Config, TestkitError> {
        install_crypto_provider();
        Ok(
            Config::from_custom_kubeconfig(self.kubeconfig.clone(), &KubeConfigOptions::default())
                .await?,
        )
    }

    /// Path of a kubeconfig for the admin user (token auth, CA inline). It lives in the plane's
    /// directory and is removed when the plane stops.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The API server URL, `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// The cluster CA (PEM) that signed the API server's serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The admin bearer token (user `warmcache-testkit-admin`, group `system:masters`).
    pub fn admin_token(&self) -> &str {
        &self.token
    }

    /// The etcd client URL, `http://127.0.0.1:<port>`.
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// The plane's temporary directory: PKI, kubeconfig, etcd data and one log file per component
    /// (`etcd.log`, `kube-apiserver.log`, `kube-controller-manager.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory the binaries were taken from.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// Names of the CRDs installed at startup (all Established).
    pub fn installed_crds(&self) -> &[String] {
        &self.crds
    }

    /// How long startup took (from locating the binaries to the CRDs being Established).
    pub fn startup_duration(&self) -> Duration {
        self.startup
    }

    /// The last `lines` lines of a component's log (`"etcd"`, `"kube-apiserver"` or
    /// `"kube-controller-manager"`), for diagnosing a failing test.
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        tail(&self.dir.join(format!("{component}.log")), lines)
    }

    /// Stops the processes and removes the plane's directory, waiting for both. Dropping the plane
    /// does the same.
    pub fn shutdown(self) {
        drop(self);
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Ok(mut processes) = self.processes.lock() {
            processes.stop();
        }
    }
}

/// Credentials the plane creates at startup for a real node ([`RealNode`](crate::RealNode)): the
/// API server's static token file is read only at startup, so the kubelet's and the scheduler's
/// tokens exist on every plane, used or not.
#[derive(Clone)]
pub(crate) struct NodeCredentials {
    /// User `system:node:127.0.0.1`, group `system:nodes` (authorized by the Node authorizer).
    pub(crate) kubelet_token: String,
    /// User `system:kube-scheduler` (bound by the bootstrap RBAC policy).
    pub(crate) scheduler_token: String,
}

impl ControlPlane {
    pub(crate) fn node_credentials(&self) -> &NodeCredentials {
        &self.node_credentials
    }
}

/// The name of the real node: the kubelet refuses a loopback `--node-ip`, but
/// `--hostname-override=127.0.0.1` gives the Node the loopback address and this name.
pub(crate) const NODE_NAME: &str = "127.0.0.1";

/// rustls needs a process-wide crypto provider when more than one could be chosen; we use ring.
pub(crate) fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The workspace root (`pkg/testkit/../..`).
pub(crate) fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.join("../..");
    root.canonicalize().unwrap_or(root)
}

/// Runs a plane's startup on a thread of its own (it builds its own runtime, so it must not run
/// inside the caller's) and waits for it.
fn on_startup_thread(
    start: impl FnOnce() -> Result<ControlPlane, TestkitError> + Send + 'static,
) -> Result<ControlPlane, TestkitError> {
    let handle = std::thread::Builder::new()
        .name("warmcache-testkit-start".into())
        .spawn(start)
        .map_err(|e| TestkitError::io("spawning the control-plane startup thread", e))?;
    handle.join().map_err(|_| {
        TestkitError::Unavailable("the control-plane startup thread panicked".into())
    })?
}

/// The binaries of one plane.
struct Binaries {
    etcd: PathBuf,
    apiserver: PathBuf,
    /// `None`: a plane without controllers (see [`ControlPlane::start_oldest`]).
    controller_manager: Option<PathBuf>,
    /// What [`ControlPlane::bin_dir`] reports.
    dir: PathBuf,
}

fn start_blocking() -> Result<ControlPlane, TestkitError> {
    let dir = locate_binaries()?;
    let binaries = Binaries {
        etcd: dir.join("etcd"),
        apiserver: dir.join("kube-apiserver"),
        controller_manager: Some(dir.join("kube-controller-manager")),
        dir,
    };
    start_with(&binaries)
}

fn start_with(binaries: &Binaries) -> Result<ControlPlane, TestkitError> {
    let started = Instant::now();
    let mut last = None;
    for _ in 0..START_ATTEMPTS {
        match try_start(binaries, started) {
            Ok(plane) => return Ok(plane),
            Err(e) if is_port_collision(&e) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| TestkitError::Unavailable("no start attempt was made".into())))
}

fn is_port_collision(e: &TestkitError) -> bool {
    matches!(
        e,
        TestkitError::ComponentStart { log_tail, .. } if log_tail.contains("address already in use")
    )
}

/// `$WARMCACHE_CONTROL_PLANE_BIN`, else the directory printed by `hack/build-control-plane.sh`.
fn locate_binaries() -> Result<PathBuf, TestkitError> {
    let dir = match std::env::var_os(ENV_BIN_DIR) {
        Some(dir) => PathBuf::from(dir),
        None => run_script("hack/build-control-plane.sh", ENV_BIN_DIR)?,
    };
    for name in ["etcd", "kube-apiserver", "kube-controller-manager"] {
        if !dir.join(name).is_file() {
            return Err(TestkitError::Binaries {
                message: format!("{} has no `{name}`", dir.display()),
            });
        }
    }
    Ok(dir)
}

/// `$WARMCACHE_OLDEST_APISERVER_BIN`, else the directory printed by
/// `hack/build-oldest-apiserver.sh`.
fn locate_oldest_apiserver() -> Result<PathBuf, TestkitError> {
    let dir = match std::env::var_os(ENV_OLDEST_APISERVER_BIN) {
        Some(dir) => PathBuf::from(dir),
        None => run_script("hack/build-oldest-apiserver.sh", ENV_OLDEST_APISERVER_BIN)?,
    };
    if !dir.join("kube-apiserver").is_file() {
        return Err(TestkitError::Binaries {
            message: format!("{} has no `kube-apiserver`", dir.display()),
        });
    }
    Ok(dir)
}

/// Runs a build script of the workspace (`hack/...`) that prints a directory on its last line;
/// `env` names the variable that would have skipped it.
pub(crate) fn run_script(script: &str, env: &str) -> Result<PathBuf, TestkitError> {
    let script = workspace_root().join(script);
    let mut child = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| TestkitError::io(format!("running {}", script.display()), e))?;
    // Forward the script's progress (a cold build takes minutes) and keep the end for errors.
    let stderr = child.stderr.take();
    let forward = std::thread::spawn(move || {
        let mut last = std::collections::VecDeque::new();
        if let Some(stderr) = stderr {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("{line}");
                last.push_back(line);
                if last.len() > 30 {
                    last.pop_front();
                }
            }
        }
        Vec::from(last).join("\n")
    });
    let mut stdout = String::new();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            stdout.push_str(&line);
            stdout.push('\n');
        }
    }
    let status = child
        .wait()
        .map_err(|e| TestkitError::io(format!("waiting for {}", script.display()), e))?;
    let stderr_tail = forward.join().unwrap_or_default();
    if !status.success() {
        return Err(TestkitError::Binaries {
            message: format!(
                "{} failed ({status}); set {env} to a directory with prebuilt \
                 binaries to skip the build\n{stderr_tail}",
                script.display()
            ),
        });
    }
    stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| PathBuf::from(l.trim()))
        .ok_or_else(|| TestkitError::Binaries {
            message: format!("{} printed no directory", script.display()),
        })
}

/// The plane's Service CIDR, a /24 of the loopback range derived from the API server's port
/// (so concurrent planes differ), and the `kubernetes` Service's ClusterIP (its first address).
///
/// Loopback because nothing routes ClusterIPs here (no kube-proxy): the API server calls a
/// Service-registered webhook (as the chart registers its own) at the Service's ClusterIP, and a
/// loopback ClusterIP is an address of the host (and of every pod's `lo`) that a test can listen
/// on without adding an address or a route anywhere; a private range would leave by the host's
/// default route. Pod IPs (127.201.0.0/16, the node's CNI) cannot serve instead: the API server
/// refuses loopback addresses in Endpoints and EndpointSlices, so endpoint routing
/// (`--enable-aggregator-routing`) finds none. test/chart's install test listens there.
pub(crate) fn service_range(apiserver_port: u16) -> (String, std::net::Ipv4Addr) {
    let second = 202 + (apiserver_port >> 8) % 48;
    let third = apiserver_port & 0xff;
    (
        format!("127.{second}.{third}.0/24"),
        std::net::Ipv4Addr::new(127, second as u8, third as u8, 1),
    )
}

/// Random free loopback ports, distinct from each other (listeners are held until all are chosen).
pub(crate) fn free_ports<const N: usize>() -> Result<[u16; N], TestkitError> {
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0u16; N];
    for port in &mut ports {
        let listener = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| TestkitError::io("binding a free loopback port", e))?;
        *port = listener
            .local_addr()
            .map_err(|e| TestkitError::io("reading a bound port", e))?
            .port();
        listeners.push(listener);
    }
    Ok(ports)
}

pub(crate) fn write(path: &Path, contents: &str) -> Result<(), TestkitError> {
    fs::write(path, contents)
        .map_err(|e| TestkitError::io(format!("writing {}", path.display()), e))
}

/// A random lowercase alphanumeric string (not cryptographic; loopback-only test credentials and
/// object names).
pub(crate) fn random_suffix(len: usize) -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::with_capacity(len);
    while out.len() < len {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        hasher.write_u32(std::process::id());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        hasher.write_u128(nanos);
        let mut n = hasher.finish();
        for _ in 0..8 {
            if out.len() == len {
                break;
            }
            let idx = usize::try_from(n % 36).unwrap_or(0);
            out.push(char::from(ALPHABET[idx]));
            n /= 36;
        }
    }
    out
}

/// The supervised processes of one plane (or node) plus the janitor that removes its directory.
pub(crate) struct Processes {
    janitor: Option<Child>,
    janitor_stdin: Option<ChildStdin>,
    pub(crate) components: Vec<Component>,
}

pub(crate) struct Component {
    pub(crate) name: &'static str,
    pub(crate) child: Child,
    stdin: Option<ChildStdin>,
    pub(crate) log: PathBuf,
}

impl Processes {
    fn new(dir: &Path) -> Result<Self, TestkitError> {
        Self::with_janitor(JANITOR, &[dir.display().to_string()])
    }

    /// Starts `janitor` (a bash script that first reads supervisor pids from stdin until EOF)
    /// with `args` as `$1...`.
    pub(crate) fn with_janitor(janitor: &str, args: &[String]) -> Result<Self, TestkitError> {
        let mut janitor = Command::new("bash")
            .arg("-c")
            .arg(janitor)
            .arg("warmcache-testkit-janitor")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| TestkitError::io("spawning the cleanup process (bash)", e))?;
        let janitor_stdin = janitor.stdin.take();
        Ok(Self {
            janitor: Some(janitor),
            janitor_stdin,
            components: Vec::new(),
        })
    }

    pub(crate) fn spawn(
        &mut self,
        name: &'static str,
        binary: &Path,
        args: &[String],
        dir: &Path,
    ) -> Result<usize, TestkitError> {
        self.spawn_with(name, &[], binary, args, dir)
    }

    /// Like [`spawn`](Self::spawn), with `prefix` (a launcher and its arguments) before the
    /// binary on the supervised command line.
    pub(crate) fn spawn_with(
        &mut self,
        name: &'static str,
        prefix: &[String],
        binary: &Path,
        args: &[String],
        dir: &Path,
    ) -> Result<usize, TestkitError> {
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log)
            .map_err(|e| TestkitError::io(format!("creating {}", log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| TestkitError::io(format!("opening {}", log.display()), e))?;
        let mut child = Command::new("bash")
            .arg("-c")
            .arg(SUPERVISOR)
            .arg(format!("warmcache-testkit-{name}"))
            .args(prefix)
            .arg(binary)
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| TestkitError::io(format!("spawning {name} under bash"), e))?;
        let stdin = child.stdin.take();
        if let Some(janitor) = self.janitor_stdin.as_mut() {
            // Best effort: without the pid the janitor just removes the directory a bit earlier.
            let _ = writeln!(janitor, "{}", child.id());
        }
        self.components.push(Component {
            name,
            child,
            stdin,
            log,
        });
        Ok(self.components.len() - 1)
    }

    pub(crate) fn stop(&mut self) {
        for c in &mut self.components {
            c.stdin.take();
        }
        for c in &mut self.components {
            let _ = c.child.wait();
        }
        self.components.clear();
        self.janitor_stdin.take();
        if let Some(mut janitor) = self.janitor.take() {
            let _ = janitor.wait();
        }
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        self.stop();
    }
}

pub(crate) fn tail(path: &Path, lines: usize) -> String {
    match fs::read_to_string(path) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// Polls `probe` until it succeeds; fails fast if the component's supervisor exits.
pub(crate) async fn wait_healthy<F, Fut>(
    component: &mut Component,
    timeout: Duration,
    mut probe: F,
) -> Result<(), TestkitError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let start = Instant::now();
    loop {
        let exited = component
            .child
            .try_wait()
            .map_err(|e| TestkitError::io(format!("checking {}", component.name), e))?;
        if let Some(status) = exited {
            return Err(start_error(component, format!("exited early ({status})")));
        }
        let last = match probe().await {
            Ok(()) => return Ok(()),
            Err(message) => message,
        };
        if start.elapsed() > timeout {
            return Err(start_error(
                component,
                format!(
                    "not healthy after {}s; last probe: {last}",
                    timeout.as_secs()
                ),
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

pub(crate) fn start_error(component: &Component, reason: String) -> TestkitError {
    TestkitError::ComponentStart {
        component: component.name,
        reason,
        log: component.log.clone(),
        log_tail: tail(&component.log, 40),
    }
}

async fn etcd_healthy(port: u16) -> Result<(), String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    stream
        .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response))
        .await
        .map_err(|_| "no answer within 5s".to_owned())?
        .map_err(|e| format!("read: {e}"))?;
    if response.contains("\"health\":\"true\"") {
        Ok(())
    } else {
        Err(format!(
            "unhealthy answer: {}",
            response.lines().last().unwrap_or("")
        ))
    }
}

pub(crate) fn kubeconfig_yaml(server: &str, ca_pem: &str, token: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: warmcache-testkit
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: warmcache-testkit-admin
  user:
    token: {token}
contexts:
- name: warmcache-testkit
  context:
    cluster: warmcache-testkit
    user: warmcache-testkit-admin
    namespace: default
current-context: warmcache-testkit
",
        ca = base64(ca_pem.as_bytes()),
    )
}

fn try_start(binaries: &Binaries, started: Instant) -> Result<ControlPlane, TestkitError> {
    let dir = tempfile::Builder::new()
        .prefix("warmcache-testkit-")
        .tempdir()
        .map_err(|e| TestkitError::io("creating the control plane's temporary directory", e))?
        .keep();
    // From here on the janitor owns the directory's removal.
    let mut processes = Processes::new(&dir)?;

    let [etcd_port, peer_port, apiserver_port] = free_ports::<3>()?;
    let (service_range, kubernetes_service_ip) = service_range(apiserver_port);

    // --- PKI and credentials ---
    let ca = Ca::generate("warmcache-testkit CA")?;
    let (serving_cert, serving_key) = ca.leaf(
        "kube-apiserver",
        &[
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ],
        &[
            std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            std::net::IpAddr::V4(kubernetes_service_ip),
        ],
        true,
        false,
    )?;
    // The API server's client certificate towards kubelets (they trust the plane's CA).
    let (kubelet_client_cert, kubelet_client_key) =
        ca.leaf("kube-apiserver-kubelet-client", &[], &[], false, true)?;
    let (sa_key, sa_pub) = ecdsa_key_pair_pem()?;
    let token = random_suffix(32);
    let node_credentials = NodeCredentials {
        kubelet_token: random_suffix(32),
        scheduler_token: random_suffix(32),
    };
    let p = |name: &str| dir.join(name);
    write(&p("ca.crt"), &ca.cert_pem)?;
    write(&p("ca.key"), &ca.key_pem)?;
    write(&p("apiserver.crt"), &serving_cert)?;
    write(&p("apiserver.key"), &serving_key)?;
    write(&p("sa.key"), &sa_key)?;
    write(&p("sa.pub"), &sa_pub)?;
    write(&p("kubelet-client.crt"), &kubelet_client_cert)?;
    write(&p("kubelet-client.key"), &kubelet_client_key)?;
    write(
        &p("tokens.csv"),
        &format!(
            "{token},warmcache-testkit-admin,warmcache-testkit-admin,\"system:masters\"\n\
             {kubelet},system:node:{NODE_NAME},system:node:{NODE_NAME},\"system:nodes\"\n\
             {scheduler},system:kube-scheduler,system:kube-scheduler\n",
            kubelet = node_credentials.kubelet_token,
            scheduler = node_credentials.scheduler_token,
        ),
    )?;

    let etcd_url = format!("http://127.0.0.1:{etcd_port}");
    let server_url = format!("https://127.0.0.1:{apiserver_port}");
    let kubeconfig_text = kubeconfig_yaml(&server_url, &ca.cert_pem, &token);
    let kubeconfig_path = p("kubeconfig");
    write(&kubeconfig_path, &kubeconfig_text)?;
    let kubeconfig = Kubeconfig::from_yaml(&kubeconfig_text)?;

    let s = |path: PathBuf| path.display().to_string();
    let audit_args = match std::env::var_os(ENV_AUDIT_DIR) {
        Some(audit_dir) => {
            let audit_dir = PathBuf::from(audit_dir);
            fs::create_dir_all(&audit_dir).map_err(|e| {
                TestkitError::io(
                    format!("creating the audit directory {}", audit_dir.display()),
                    e,
                )
            })?;
            write(&p("audit-policy.yaml"), AUDIT_POLICY)?;
            let plane = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| random_suffix(12));
            vec![
                format!("--audit-policy-file={}", s(p("audit-policy.yaml"))),
                format!(
                    "--audit-log-path={}",
                    s(audit_dir.join(format!("{plane}.audit.jsonl")))
                ),
                "--audit-log-format=json".to_owned(),
                "--audit-log-maxsize=0".to_owned(),
                "--audit-log-maxbackup=0".to_owned(),
            ]
        }
        None => Vec::new(),
    };
    let etcd_args = vec![
        format!("--data-dir={}", s(p("etcd-data"))),
        format!("--listen-client-urls={etcd_url}"),
        format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
    ];
    let apiserver_args = vec![
        format!("--etcd-servers={etcd_url}"),
        format!("--secure-port={apiserver_port}"),
        "--bind-address=127.0.0.1".to_owned(),
        "--advertise-address=127.0.0.1".to_owned(),
        format!("--cert-dir={}", s(p("apiserver-certs"))),
        format!("--tls-cert-file={}", s(p("apiserver.crt"))),
        format!("--tls-private-key-file={}", s(p("apiserver.key"))),
        format!("--client-ca-file={}", s(p("ca.crt"))),
        format!("--token-auth-file={}", s(p("tokens.csv"))),
        // Node: the real node's kubelet (group system:nodes) gets what its pods need.
        "--authorization-mode=Node,RBAC".to_owned(),
        format!(
            "--kubelet-client-certificate={}",
            s(p("kubelet-client.crt"))
        ),
        format!("--kubelet-client-key={}", s(p("kubelet-client.key"))),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
        format!("--service-account-key-file={}", s(p("sa.pub"))),
        format!("--service-account-signing-key-file={}", s(p("sa.key"))),
        "--api-audiences=https://kubernetes.default.svc.cluster.local".to_owned(),
        format!("--service-cluster-ip-range={service_range}"),
        "--endpoint-reconciler-type=none".to_owned(),
        "--enable-priority-and-fairness=false".to_owned(),
        "--allow-privileged=true".to_owned(),
        "--profiling=false".to_owned(),
    ]
    .into_iter()
    .chain(audit_args)
    .collect::<Vec<_>>();
    let controller_manager_args = vec![
        format!("--kubeconfig={}", s(kubeconfig_path.clone())),
        format!("--service-account-private-key-file={}", s(p("sa.key"))),
        format!("--root-ca-file={}", s(p("ca.crt"))),
        format!("--cluster-signing-cert-file={}", s(p("ca.crt"))),
        format!("--cluster-signing-key-file={}", s(p("ca.key"))),
        "--use-service-account-credentials=false".to_owned(),
        "--leader-elect=false".to_owned(),
        "--controllers=*".to_owned(),
        "--secure-port=0".to_owned(),
        "--bind-address=127.0.0.1".to_owned(),
        "--profiling=false".to_owned(),
    ];

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| TestkitError::io("building the startup runtime", e))?;

    let crds = runtime.block_on(async {
        install_crypto_provider();
        let etcd = processes.spawn("etcd", &binaries.etcd, &etcd_args, &dir)?;
        wait_healthy(&mut processes.components[etcd], ETCD_TIMEOUT, || {
            etcd_healthy(etcd_port)
        })
        .await?;

        let apiserver =
            processes.spawn("kube-apiserver", &binaries.apiserver, &apiserver_args, &dir)?;
        let config =
            Config::from_custom_kubeconfig(kubeconfig.clone(), &KubeConfigOptions::default())
                .await?;
        let client =
            Client::try_from(config).map_err(|e| TestkitError::kube("building a client", e))?;
        wait_healthy(
            &mut processes.components[apiserver],
            APISERVER_TIMEOUT,
            || {
                let client = client.clone();
                async move {
                    let request = http::Request::get("/readyz")
                        .body(Vec::new())
                        .map_err(|e| e.to_string())?;
                    client
                        .request_text(request)
                        .await
                        .map(drop)
                        .map_err(|e| e.to_string())
                }
            },
        )
        .await?;

        if let Some(controller_manager) = &binaries.controller_manager {
            let controller_manager = processes.spawn(
                "kube-controller-manager",
                controller_manager,
                &controller_manager_args,
                &dir,
            )?;
            // The serviceaccounts controller creating `default/default` shows the controllers run.
            let service_accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
            wait_healthy(
                &mut processes.components[controller_manager],
                CONTROLLER_MANAGER_TIMEOUT,
                || {
                    let service_accounts = service_accounts.clone();
                    async move {
                        match service_accounts.get_opt("default").await {
                            Ok(Some(_)) => Ok(()),
                            Ok(None) => {
                                Err("ServiceAccount default/default not created yet".into())
                            }
                            Err(e) => Err(e.to_string()),
                        }
                    }
                },
            )
            .await?;
        }

        let crd_dir = std::env::var_os(ENV_CRD_DIR)
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace_root().join("config/crd"));
        crd::install_crds_from_dir(&client, &crd_dir, CRD_TIMEOUT).await
    })?;
    drop(runtime);

    Ok(ControlPlane {
        dir,
        bin_dir: binaries.dir.clone(),
        kubeconfig_path,
        kubeconfig,
        server_url,
        ca_pem: ca.cert_pem,
        token,
        node_credentials,
        etcd_url,
        crds,
        startup: started.elapsed(),
        processes: Mutex::new(processes),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_suffix_is_dns_safe() {
        let a = random_suffix(12);
        let b = random_suffix(12);
        assert_eq!(a.len(), 12);
        assert_ne!(a, b);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
    }

    #[test]
    fn free_ports_are_distinct() {
        let [a, b, c] = free_ports::<3>().unwrap();
        assert!(a != b && b != c && a != c);
    }

    #[test]
    fn generated_kubeconfig_parses() {
        let text = kubeconfig_yaml(
            "https://127.0.0.1:6443",
            "-----BEGIN CERTIFICATE-----\n",
            "t",
        );
        let kc = Kubeconfig::from_yaml(&text).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("warmcache-testkit"));
    }
}
