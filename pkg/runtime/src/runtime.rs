//! The builder and the running component.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::NamespaceResourceScope;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector;
use kube::runtime::watcher;
use kube::{Client, Config, Resource};
use serde::de::DeserializeOwned;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use warmcache_admission::{
    AdmissionMetrics, AdmissionServer, ReloadingCertResolver, install_default_crypto_provider,
    spawn_reloader,
};
use warmcache_kube::{EventRecorder, LeaderElector, LeaderHandle, Leadership};
use warmcache_telemetry::{
    self as telemetry, Metrics, Readiness, ReconcileMetrics, TelemetryConfig, TelemetryGuard,
};

use crate::api_requests::{ApiRequestMetrics, CountRequests};
use crate::args::{AdmissionArgs, LeaderElectionArgs, RuntimeArgs};
use crate::controller::{self, Controller, Reconciler};
use crate::error::RuntimeError;
use crate::rate_limit::{RateLimit, RateLimitMetrics, TokenBucket};
use crate::readiness::{Gate, Gates};
use crate::watch::{self, Cache, WatchMetrics};

/// How long the process waits at exit for blocking-pool work (a synchronous admission handler
/// still running past its timeout) before leaving it behind.
pub const BLOCKING_SHUTDOWN_WAIT: Duration = Duration::from_secs(2);

/// How long releasing the Lease may take at shutdown without election flags (never used then;
/// with them, the renew deadline plus a second).
const LEASE_RELEASE_WAIT: Duration = Duration::from_secs(5);

/// Runs `main` on a new multi-threaded Tokio runtime, then leaves blocking work behind after
/// [`BLOCKING_SHUTDOWN_WAIT`]. For a binary's `fn main`.
pub fn block_on<F, T, E>(main: F) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
    E: From<RuntimeError>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|err| E::from(RuntimeError::AsyncRuntime(err)))?;
    let result = runtime.block_on(main);
    runtime.shutdown_timeout(BLOCKING_SHUTDOWN_WAIT);
    result
}

/// Puts a component together. See the crate documentation for a whole binary.
pub struct Builder {
    component: &'static str,
    version: Option<&'static str>,
    args: RuntimeArgs,
    client: bool,
    given_client: Option<Client>,
    leader: Option<LeaderElectionArgs>,
    telemetry: bool,
    paced_by_admissions: bool,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("component", &self.component)
            .field("args", &self.args)
            .field("client", &self.client)
            .field("leader", &self.leader)
            .finish_non_exhaustive()
    }
}

impl Builder {
    /// A component named `component` (lower-case, dashes: `binding-controller`): the service
    /// name of its traces, its metric prefix (`warmcache_binding_controller_`), its Event
    /// reporter and its default Lease name.
    pub fn new(component: &'static str, args: RuntimeArgs) -> Self {
        Self {
            component,
            version: None,
            args,
            client: false,
            given_client: None,
            leader: None,
            telemetry: true,
            paced_by_admissions: false,
        }
    }

    /// The version exported with traces (usually `env!("CARGO_PKG_VERSION")`).
    #[must_use]
    pub fn version(mut self, version: &'static str) -> Self {
        self.version = Some(version);
        self
    }

    /// Connects a Kubernetes client (from `--kubeconfig`, else the usual inference), every
    /// request counted and paced by `--kube-api-qps` and `--kube-api-burst`.
    #[must_use]
    pub fn with_client(mut self) -> Self {
        self.client = true;
        self
    }

    /// For admission webhooks: the requests the component makes while it answers a review (a
    /// cache miss's create, a lookup) are paced by the reviews the API server sends, not by
    /// `--kube-api-qps`: a client-side limit there only turns load into admissions that time out
    /// (and pods admitted unchanged). Its Events keep their own rate-limited client; its watches'
    /// lists and re-lists go through the unlimited one too.
    #[must_use]
    pub fn paced_by_admissions(mut self) -> Self {
        self.paced_by_admissions = true;
        self
    }

    /// Uses `client` instead of connecting from the flags (tests inject faults this way): as it
    /// is, without the runtime's request counting or rate limit.
    #[must_use]
    pub fn client(mut self, client: Client) -> Self {
        self.client = true;
        self.given_client = Some(client);
        self
    }

    /// Elects a leader through a Lease before controllers reconcile (implies a client).
    #[must_use]
    pub fn with_leader_election(mut self, args: LeaderElectionArgs) -> Self {
        self.client = true;
        self.leader = Some(args);
        self
    }

    /// Leaves the process-wide tracing subscriber alone: for tests that run several
    /// components in one process (a subscriber can be installed once per process).
    #[must_use]
    pub fn without_global_telemetry(mut self) -> Self {
        self.telemetry = false;
        self
    }

    /// Sets up telemetry, signals, metrics, the admin server (bound before this returns), the
    /// client and the election.
    pub async fn build(self) -> Result<Runtime, RuntimeError> {
        install_default_crypto_provider();
        let telemetry = if self.telemetry {
            let mut config = TelemetryConfig::from_env(
                self.component,
                self.args.log_level.as_deref(),
                self.args.log_format,
            );
            if let Some(version) = self.version {
                config = config.with_version(version);
            }
            Some(telemetry::init(&config)?)
        } else {
            None
        };
        let signal = telemetry::shutdown_signal()?;

        let metrics = Metrics::new(&format!("warmcache_{}", self.component.replace('-', "_")))?;
        let reconcile_metrics = ReconcileMetrics::register(metrics.registry())?;
        let watch_metrics = WatchMetrics::register(metrics.registry())?;
        let admission_metrics = AdmissionMetrics::new()
            .map_err(|source| RuntimeError::metric("warmcache_admission_*", source))?;
        let exposed = admission_metrics
            .exposition_registry(metrics.registry())
            .map_err(|source| RuntimeError::metric("warmcache_admission_*", source))?;

        let readiness = Readiness::new();
        let gates = Gates::new(readiness.clone());
        let started = gates.gate("startup");
        let admin_stop = CancellationToken::new();
        let admin_listener = tokio::net::TcpListener::bind(self.args.admin_listen)
            .await
            .map_err(|source| RuntimeError::Bind {
                addr: self.args.admin_listen,
                source,
            })?;
        let admin_addr = admin_listener
            .local_addr()
            .unwrap_or(self.args.admin_listen);
        let admin = tokio::spawn(telemetry::serve_admin_on(
            admin_listener,
            exposed,
            readiness,
            admin_stop.clone(),
        ));

        let elects = self.leader.as_ref().is_some_and(|args| args.leader_elect);
        // The Lease has a client (and a token bucket) of its own, as in client-go's
        // controller-manager: renewals never queue behind a burst of other requests. So do
        // Events: best effort, they never delay the component's own work (an admission's binding
        // create behind a backlog of skip Events, say), and their bucket bounds them.
        let (client, lease_client, events_client) = if let Some(client) = self.given_client.clone()
        {
            (Some(client), None, None)
        } else if self.client {
            let counted = ApiRequestMetrics::register(metrics.registry())?;
            let waits = RateLimitMetrics::register(metrics.registry())?;
            let config = client_config(&self.args).await?;
            let lease_client = if elects {
                Some(build_client(config.clone(), &self.args, &counted, &waits)?)
            } else {
                None
            };
            let events_client = build_client(config.clone(), &self.args, &counted, &waits)?;
            let client = if self.paced_by_admissions {
                let unlimited = RuntimeArgs {
                    kube_api_qps: 0.0,
                    ..self.args.clone()
                };
                build_client(config, &unlimited, &counted, &waits)?
            } else {
                build_client(config, &self.args, &counted, &waits)?
            };
            if self.args.kube_api_qps > 0.0 {
                tracing::info!(
                    qps = self.args.kube_api_qps,
                    burst = self.args.kube_api_burst,
                    "client-side rate limit on API requests"
                );
            } else {
                tracing::info!("no client-side rate limit on API requests (--kube-api-qps 0)");
            }
            (Some(client), lease_client, Some(events_client))
        } else {
            (None, None, None)
        };
        let recorder = events_client
            .or_else(|| client.clone())
            .map(|client| EventRecorder::new(client, self.component, identity().as_deref()));

        let lease_stop = CancellationToken::new();
        let lease_release_wait = self.leader.as_ref().map_or(LEASE_RELEASE_WAIT, |args| {
            args.leader_election_renew_deadline + Duration::from_secs(1)
        });
        let (leadership, elector) = match (&self.leader, &client) {
            (Some(args), Some(client)) if args.leader_elect => {
                let lease_client = lease_client.unwrap_or_else(|| client.clone());
                let handle = elect(self.component, args, lease_client, lease_stop.clone())?;
                (handle.leadership(), Some(handle))
            }
            _ => (Leadership::always_leader(), None),
        };

        tracing::info!(
            component = self.component,
            admin = %admin_addr,
            leader_election = elector.is_some(),
            "starting"
        );
        Ok(Runtime {
            component: self.component,
            shutdown_grace: self.args.shutdown_grace,
            client,
            recorder,
            metrics,
            reconcile_metrics,
            watch_metrics,
            admission_metrics,
            gates,
            started,
            leadership,
            elector,
            lease_stop,
            signal,
            work: CancellationToken::new(),
            tasks: Tasks::default(),
            serves_admission: false,
            shutdown_delay: self.args.shutdown_delay,
            lease_release_wait,
            admin,
            admin_stop,
            admin_addr,
            telemetry,
        })
    }
}

/// The client configuration the flags name (`--kubeconfig`, `--kube-context`), else the usual
/// inference.
async fn client_config(args: &RuntimeArgs) -> Result<Config, RuntimeError> {
    let options = KubeConfigOptions {
        context: args.kube_context.clone(),
        ..KubeConfigOptions::default()
    };
    let config =
        match &args.kubeconfig {
            Some(path) => {
                let from = Some(path.display().to_string());
                let kubeconfig =
                    Kubeconfig::read_from(path).map_err(|err| RuntimeError::ClientConfig {
                        from: from.clone(),
                        source: Box::new(err),
                    })?;
                Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(|err| RuntimeError::ClientConfig {
                        from,
                        source: Box::new(err),
                    })?
            }
            None if args.kube_context.is_some() => Config::from_kubeconfig(&options)
                .await
                .map_err(|err| RuntimeError::ClientConfig {
                    from: None,
                    source: Box::new(err),
                })?,
            None => Config::infer()
                .await
                .map_err(|err| RuntimeError::ClientConfig {
                    from: None,
                    source: Box::new(err),
                })?,
        };
    Ok(config)
}

/// A client of `config` whose every request waits for a token of its own bucket
/// (`--kube-api-qps`, `--kube-api-burst`; `api_request_wait_seconds`), then is counted
/// (`api_requests_total`): what this component costs the API server, and its bound.
fn build_client(
    config: Config,
    args: &RuntimeArgs,
    counted: &ApiRequestMetrics,
    waits: &RateLimitMetrics,
) -> Result<Client, RuntimeError> {
    let builder = kube::client::ClientBuilder::try_from(config)
        .map_err(|err| RuntimeError::ClientConfig {
            from: None,
            source: Box::new(err),
        })?
        .with_layer(&CountRequests(counted.clone()));
    let bucket = TokenBucket::new(args.kube_api_qps, args.kube_api_burst);
    if bucket.is_unlimited() {
        return Ok(builder.build());
    }
    // Outside the counting layer: a request is counted when its token lets it go, so one
    // given up while it waits was never sent and is not counted.
    Ok(builder
        .with_layer(&RateLimit::new(Arc::new(bucket), waits.clone()))
        .build())
}

/// This replica's name: `$POD_NAME`, else the host name.
fn identity() -> Option<String> {
    std::env::var("POD_NAME")
        .ok()
        .filter(|name| !name.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|name| name.trim().to_owned())
                .filter(|name| !name.is_empty())
        })
}

fn elect(
    component: &'static str,
    args: &LeaderElectionArgs,
    client: Client,
    stop: CancellationToken,
) -> Result<LeaderHandle, RuntimeError> {
    let config = args
        .lease_config()
        .map_err(|err| RuntimeError::LeaderElection(err.to_string()))?;
    let namespace = args.leader_election_namespace.as_deref().ok_or_else(|| {
        RuntimeError::LeaderElection(
            "no namespace for the Lease: set --leader-election-namespace or $POD_NAMESPACE"
                .to_owned(),
        )
    })?;
    let identity = args
        .leader_election_identity
        .clone()
        .or_else(identity)
        .ok_or_else(|| {
            RuntimeError::LeaderElection(
                "no identity: set --leader-election-identity or $POD_NAME".to_owned(),
            )
        })?;
    let lease = args.leader_election_lease.as_deref().unwrap_or(component);
    let elector = LeaderElector::new(client, namespace, lease, &identity, config)
        .map_err(|err| RuntimeError::LeaderElection(err.to_string()))?;
    tracing::info!(namespace, lease, identity, "campaigning for the Lease");
    Ok(elector.spawn(stop))
}

/// The component's tasks, each with its name for logs and errors.
#[derive(Default)]
struct Tasks {
    set: JoinSet<Result<(), String>>,
    names: std::collections::HashMap<tokio::task::Id, String>,
}

/// How a task ended.
enum Ended {
    Ok,
    Failed { task: String, message: String },
    Panicked { task: String, message: String },
}

impl Tasks {
    fn spawn<F>(&mut self, name: String, task: F)
    where
        F: Future<Output = Result<(), String>> + Send + 'static,
    {
        let handle = self.set.spawn(task);
        self.names.insert(handle.id(), name);
    }

    fn len(&self) -> usize {
        self.set.len()
    }

    fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    fn name(&mut self, id: tokio::task::Id) -> String {
        self.names
            .remove(&id)
            .unwrap_or_else(|| format!("task {id}"))
    }

    async fn next(&mut self) -> Option<Ended> {
        let joined = self.set.join_next_with_id().await?;
        Some(match joined {
            Ok((id, Ok(()))) => {
                self.names.remove(&id);
                Ended::Ok
            }
            Ok((id, Err(message))) => Ended::Failed {
                task: self.name(id),
                message,
            },
            Err(join) => {
                let task = self.name(join.id());
                let message = if join.is_panic() {
                    panic_message(join.into_panic())
                } else {
                    "cancelled".to_owned()
                };
                Ended::Panicked { task, message }
            }
        })
    }
}

/// The text of a panic payload (`panic!("...")` carries a `&str` or a `String`).
pub(crate) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(text) => *text,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(text) => (*text).to_owned(),
            Err(_) => "a panic without a message".to_owned(),
        },
    }
}

/// A running component: its client, caches, controllers and servers, until [`Runtime::run`]
/// returns.
pub struct Runtime {
    component: &'static str,
    shutdown_grace: Duration,
    client: Option<Client>,
    recorder: Option<EventRecorder>,
    metrics: Metrics,
    reconcile_metrics: ReconcileMetrics,
    watch_metrics: WatchMetrics,
    admission_metrics: AdmissionMetrics,
    gates: Gates,
    started: Gate,
    leadership: Leadership,
    elector: Option<LeaderHandle>,
    lease_stop: CancellationToken,
    /// Cancelled on SIGTERM or SIGINT (or by [`Runtime::shutdown_token`]'s holder).
    signal: CancellationToken,
    /// Cancelled when the drain begins: every task stops taking new work.
    work: CancellationToken,
    tasks: Tasks,
    /// Whether an admission server runs: the drain then waits `shutdown_delay` first.
    serves_admission: bool,
    shutdown_delay: Duration,
    /// How long releasing the Lease may take at shutdown (the elector's renew deadline).
    lease_release_wait: Duration,
    admin: tokio::task::JoinHandle<Result<(), telemetry::TelemetryError>>,
    admin_stop: CancellationToken,
    admin_addr: SocketAddr,
    telemetry: Option<TelemetryGuard>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("component", &self.component)
            .field("client", &self.client.is_some())
            .field("leader_election", &self.elector.is_some())
            .field("admin_addr", &self.admin_addr)
            .field("tasks", &self.tasks.len())
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Starts a [`Builder`].
    pub fn builder(component: &'static str, args: RuntimeArgs) -> Builder {
        Builder::new(component, args)
    }

    /// The component name.
    pub fn component(&self) -> &'static str {
        self.component
    }

    /// The Kubernetes client.
    pub fn client(&self) -> Result<Client, RuntimeError> {
        self.client.clone().ok_or(RuntimeError::NoClient)
    }

    /// The component's metrics (prefixed `warmcache_<component>_`): register its own series
    /// here.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The admission series (`warmcache_admission_*`), for servers started elsewhere.
    pub fn admission_metrics(&self) -> &AdmissionMetrics {
        &self.admission_metrics
    }

    /// Where the admin server listens (the port chosen, when `--admin-listen` named port 0).
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// This replica's leadership (always held without `--leader-elect`).
    pub fn leadership(&self) -> Leadership {
        self.leadership.clone()
    }

    /// The best-effort Event recorder of this component (with a client only).
    pub fn recorder(&self) -> Option<&EventRecorder> {
        self.recorder.as_ref()
    }

    /// A token cancelled when SIGTERM or SIGINT arrives; cancel it to stop the component as a
    /// signal would.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.signal.clone()
    }

    /// A token cancelled when the drain begins: long-running work of the component stops
    /// taking new work when it fires.
    pub fn drain_token(&self) -> CancellationToken {
        self.work.clone()
    }

    /// A new readiness gate: `/readyz` fails until it is released.
    pub fn readiness_gate(&self, name: &str) -> Gate {
        self.gates.gate(name)
    }

    /// Runs `task` until the drain; an error (or a panic) in it shuts the component down and
    /// is returned by [`run`](Self::run).
    pub fn spawn<F, E>(&mut self, name: &str, task: F)
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        self.tasks.spawn(name.to_owned(), async move {
            task.await.map_err(|err| format!("{err:#}"))
        });
    }

    /// Watches `K` (every namespace, or one) into a shared [`Cache`] that survives objects that
    /// do not decode; `/readyz` waits for its first list.
    pub fn watch<K>(
        &mut self,
        namespace: Option<&str>,
        config: watcher::Config,
    ) -> Result<Cache<K>, RuntimeError>
    where
        K: Resource<DynamicType = ()>
            + DeserializeOwned
            + Clone
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        let kind = kind_label::<K>();
        if namespace.is_some() && !is_namespaced::<K>() {
            return Err(RuntimeError::Watch {
                kind,
                problem: "a cluster-scoped kind is not watched in a namespace".to_owned(),
            });
        }
        let api = watch::dynamic_api::<K>(self.client()?, namespace);
        let writer = reflector::store::Writer::<K>::new(());
        let events = watch::trimmed(watch::guarded::<K>(
            api,
            config,
            kind,
            self.watch_metrics.clone(),
            writer.as_reader(),
        ));
        Ok(self.cache(kind, writer, events))
    }

    /// Watches only the metadata of `K` (labels, annotations, owners) into a shared [`Cache`];
    /// `/readyz` waits for its first list.
    pub fn watch_metadata<K>(
        &mut self,
        namespace: Option<&str>,
        config: watcher::Config,
    ) -> Result<Cache<PartialObjectMeta<K>>, RuntimeError>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + DeserializeOwned
            + Clone
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        self.watch_metadata_as(namespace, config, std::convert::identity)
    }

    /// [`Runtime::watch_metadata`], each object turned into `R` by `into` before it is cached:
    /// for a cache of many objects of which only a few fields are read (a pod's metadata, with
    /// its maps of labels and annotations, is about 2 kB in memory; a record of the keys read
    /// can be a fraction of that). `R` need not be a `Resource`, only a reflector `Lookup`
    /// (kind, name, namespace, UID): it need not carry an `ObjectMeta` (360 bytes before any
    /// field is set). Only for caches never written back: `R` is not the object.
    pub fn watch_metadata_as<K, R>(
        &mut self,
        namespace: Option<&str>,
        config: watcher::Config,
        into: fn(PartialObjectMeta<K>) -> R,
    ) -> Result<Cache<R>, RuntimeError>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + DeserializeOwned
            + Clone
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
        R: reflector::Lookup<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
    {
        let kind = kind_label::<K>();
        let client = self.client()?;
        let api: Api<PartialObjectMeta<K>> = match namespace {
            Some(namespace) => Api::namespaced(client, namespace),
            None => Api::all(client),
        };
        let events = watch::mapped(watch::trimmed(watch::metadata(api, config)), into);
        Ok(self.cache(kind, reflector::store::Writer::new(()), events))
    }

    /// Watches only the metadata of the cluster-scoped kind `K` (Nodes, ...) into a shared
    /// [`Cache`]; `/readyz` waits for its first list.
    pub fn watch_cluster_metadata<K>(
        &mut self,
        config: watcher::Config,
    ) -> Result<Cache<PartialObjectMeta<K>>, RuntimeError>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
            + DeserializeOwned
            + Clone
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        let kind = kind_label::<K>();
        let api: Api<PartialObjectMeta<K>> = Api::all(self.client()?);
        let events = watch::trimmed(watch::metadata(api, config));
        Ok(self.cache(kind, reflector::store::Writer::new(()), events))
    }

    fn cache<K, S>(
        &mut self,
        kind: &'static str,
        writer: reflector::store::Writer<K>,
        events: S,
    ) -> Cache<K>
    where
        K: reflector::Lookup<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
        S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    {
        let gate = self.gates.gate(&format!("{kind} cache"));
        // Export the kind's series with 0 from the start.
        for counter in [
            &self.watch_metrics.malformed,
            &self.watch_metrics.errors,
            &self.watch_metrics.resyncs,
        ] {
            counter.with_label_values(&[kind]);
        }
        let (cache, task) = watch::spawn_cache(
            kind,
            writer,
            events,
            self.watch_metrics.clone(),
            gate,
            self.work.clone(),
        );
        self.tasks.spawn(format!("{kind} watch"), async move {
            task.await
                .map_err(|join| format!("the watch task ended abnormally: {join}"))
        });
        cache
    }

    /// A controller for the objects of `cache`, reconciled by `reconciler`; add related kinds
    /// with [`Controller::owns`] and [`Controller::watches`], then
    /// [`start_controller`](Self::start_controller).
    pub fn controller<K, R>(
        &self,
        name: &'static str,
        cache: &Cache<K>,
        reconciler: R,
    ) -> Controller<K, R>
    where
        K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
        R: Reconciler<K>,
    {
        Controller::new(name, cache, reconciler)
    }

    /// Runs `controller` while this replica leads, until the drain (in-flight reconciles
    /// finish within `--shutdown-grace`).
    pub fn start_controller<K, R>(&mut self, controller: Controller<K, R>)
    where
        K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
        R: Reconciler<K>,
    {
        let name = format!("{} controller", controller.name);
        // Export the controller's series with 0 from the start.
        self.reconcile_metrics
            .runs
            .with_label_values(&[controller.name]);
        self.reconcile_metrics
            .duration
            .with_label_values(&[controller.name]);
        let run = controller::run_while_leader(
            controller,
            self.leadership.clone(),
            self.reconcile_metrics.clone(),
            self.recorder.clone(),
            self.work.clone(),
        );
        self.tasks.spawn(name, async move {
            run.await;
            Ok(())
        });
    }

    /// Serves `server` over HTTPS on every replica (leader or not): checks its routes, loads the
    /// certificate and binds `--listen` before returning, so bad routes, a bad Secret or a taken
    /// port fail startup, and releases its readiness gate once bound. On SIGTERM `/readyz`
    /// fails first and the server keeps accepting for `--shutdown-delay` (so the API server
    /// stops sending reviews to this replica before its port closes); then it stops accepting
    /// and lets reviews in flight finish (the server's `shutdown_grace`, bounded by
    /// `--shutdown-grace`).
    pub async fn serve_admission(
        &mut self,
        args: &AdmissionArgs,
        server: AdmissionServer,
    ) -> Result<SocketAddr, RuntimeError> {
        let server = server.with_metrics(self.admission_metrics.clone());
        let files = server.config().tls.clone();
        let reload_interval = server.config().reload_interval;
        // Everything serving would refuse, refused now: routes, registrations, certificate.
        let _checked = server.router()?;
        let resolver = tokio::task::spawn_blocking(move || ReloadingCertResolver::load(&files))
            .await
            .map_err(|join| RuntimeError::Panicked {
                task: "certificate loader".to_owned(),
                message: join.to_string(),
            })??;
        warmcache_admission::tls_server_config(Arc::clone(&resolver))?;
        // Registered once the server is known to be able to serve; a failed bind leaves it
        // held (the caller stops with the error anyway).
        let gate = self.gates.gate("webhook server");
        let listener =
            std::net::TcpListener::bind(args.listen).map_err(|source| RuntimeError::Bind {
                addr: args.listen,
                source,
            })?;
        listener
            .set_nonblocking(true)
            .map_err(|source| RuntimeError::Bind {
                addr: args.listen,
                source,
            })?;
        let addr = listener.local_addr().unwrap_or(args.listen);
        let stop = self.work.clone();
        let stop_reloader = stop.child_token();
        let reloader = spawn_reloader(
            Arc::clone(&resolver),
            reload_interval,
            stop_reloader.clone(),
            Some(self.admission_metrics.clone()),
        );
        tracing::info!(listen = %addr, "webhook serving");
        gate.release();
        self.serves_admission = true;
        self.tasks.spawn("webhook server".to_owned(), async move {
            let result = server.serve_with_resolver(listener, resolver, stop).await;
            // However serving ended, the reloader ends with it.
            stop_reloader.cancel();
            let _ = reloader.await;
            result.map_err(|err| format!("{err:#}"))
        });
        Ok(addr)
    }

    /// Reports ready once every gate is released, then runs until SIGTERM or SIGINT (or a task
    /// fails); then drains: `/readyz` fails, caches, controllers and servers stop taking new
    /// work and finish what is in flight within `--shutdown-grace`, the Lease is released, the
    /// admin server stops and traces are flushed.
    pub async fn run(mut self) -> Result<(), RuntimeError> {
        self.started.release();
        let waiting = self.gates.waiting();
        if !waiting.is_empty() {
            tracing::info!(waiting = %waiting.join(", "), "not ready yet");
        }
        let mut failure: Option<RuntimeError> = None;
        loop {
            tokio::select! {
                () = self.signal.cancelled() => break,
                ended = self.tasks.next(), if !self.tasks.is_empty() => {
                    match ended {
                        Some(Ended::Ok) | None => {
                            if self.signal.is_cancelled() { break; }
                            continue;
                        }
                        Some(Ended::Failed { task, message }) => {
                            tracing::error!(task, error = %message, "a task failed; shutting down");
                            failure = Some(RuntimeError::Task { task, message });
                            break;
                        }
                        Some(Ended::Panicked { task, message }) => {
                            tracing::error!(task, panic = %message, "a task panicked; shutting down");
                            failure = Some(RuntimeError::Panicked { task, message });
                            break;
                        }
                    }
                }
            }
        }
        tracing::info!(
            grace_ms = u64::try_from(self.shutdown_grace.as_millis()).unwrap_or(u64::MAX),
            "draining"
        );
        self.gates.shutting_down();
        if self.serves_admission && failure.is_none() && !self.shutdown_delay.is_zero() {
            // /readyz fails now; keep serving until the endpoint is gone from the API server's
            // view, so no review is sent to a closed port.
            tracing::info!(
                delay_ms = u64::try_from(self.shutdown_delay.as_millis()).unwrap_or(u64::MAX),
                "still serving while the endpoint is withdrawn"
            );
            tokio::time::sleep(self.shutdown_delay).await;
        }
        self.work.cancel();
        let drained = tokio::time::timeout(self.shutdown_grace, async {
            while let Some(ended) = self.tasks.next().await {
                match ended {
                    Ended::Ok => {}
                    Ended::Failed { task, message } => {
                        tracing::warn!(task, error = %message, "task ended with an error while draining");
                        if failure.is_none() {
                            failure = Some(RuntimeError::Task { task, message });
                        }
                    }
                    Ended::Panicked { task, message } => {
                        tracing::warn!(task, panic = %message, "task panicked while draining");
                    }
                }
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                still_running = self.tasks.len(),
                "work still running after the shutdown grace; abandoning it"
            );
            self.tasks.set.abort_all();
            // Wait for the aborts to land (each task stops at its next await), so nothing of
            // the component runs once the Lease is released.
            while self.tasks.next().await.is_some() {}
        }
        // Controllers stopped first, so no reconcile writes after the Lease is released.
        self.lease_stop.cancel();
        if let Some(elector) = self.elector.take()
            && tokio::time::timeout(self.lease_release_wait, elector.stopped())
                .await
                .is_err()
        {
            tracing::warn!("the Lease was not released in time; it expires on its own");
        }
        self.admin_stop.cancel();
        match self.admin.await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                if failure.is_none() {
                    failure = Some(err.into());
                }
            }
            Err(join) => tracing::warn!(error = %join, "admin server task ended abnormally"),
        }
        tracing::info!(component = self.component, "stopped");
        if let Some(guard) = self.telemetry.take()
            && let Err(err) = guard.shutdown()
        {
            eprintln!("{}: {err}", self.component);
        }
        failure.map_or(Ok(()), Err)
    }
}

/// Whether `K` is a namespaced kind.
fn is_namespaced<K: Resource>() -> bool
where
    K::Scope: 'static,
{
    std::any::TypeId::of::<K::Scope>() == std::any::TypeId::of::<NamespaceResourceScope>()
}

/// The kind of `K` as a `'static` metric label (kinds are few and fixed per binary).
fn kind_label<K: Resource<DynamicType = ()>>() -> &'static str {
    static KINDS: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let kind = K::kind(&());
    let mut kinds = KINDS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(known) = kinds.iter().find(|known| **known == kind.as_ref()) {
        return known;
    }
    let leaked: &'static str = Box::leak(kind.into_owned().into_boxed_str());
    kinds.push(leaked);
    leaked
}
