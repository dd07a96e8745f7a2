//! Dev-only: a real Kubernetes control plane on loopback for integration tests, plus fixtures.
//!
//! # What runs
//!
//! [`ControlPlane::shared`] starts, once per test binary, the real upstream binaries on
//! `127.0.0.1` with random free ports:
//!
//! - `etcd` (embedded etcd v3.6, a small wrapper in `hack/controlplane/etcd`, no fsync);
//! - `kube-apiserver` v1.36: TLS with a throwaway CA, admin access by a static bearer token in
//!   group `system:masters`, RBAC authorization, the default admission plugins (including
//!   `ServiceAccount`, `MutatingAdmissionWebhook` and `ValidatingAdmissionWebhook`), an ECDSA
//!   service-account signing key;
//! - `kube-controller-manager` v1.36 with all controllers: garbage collection through
//!   ownerReferences, namespace deletion, service accounts, Jobs, ReplicaSets and so on are real.
//!
//! Then every CRD in `*.yaml` under `<workspace>/config/crd/` is applied and awaited until
//! `Established`. A cold start takes a few seconds; every later call in the process is instant.
//!
//! # What is simulated
//!
//! By default there is no scheduler, no kubelet and there are no Nodes. Pods are accepted and
//! stay `Pending`; a test plays kubelet with [`Kubelet`], which writes `pods/status` (phase,
//! container states, exit codes, termination messages, `Ready` conditions). Controllers that only
//! watch pod status, including the real Job controller, react to that as on a cluster. Do not
//! point `spec.nodeName` at a Node that does not exist: the pod garbage collector deletes such
//! pods. This is the right tool for fast API-level tests and for scale runs.
//!
//! # The real node
//!
//! A test binary that needs pods to really run opts in with [`RealNode::shared`]: it adds
//! kube-scheduler, containerd 1.6 + runc, the kubelet (Node `127.0.0.1`) and the instances of
//! the **test** CSI driver ([`TestCsiDriver`]: a simulation of the storage behaviours the seeds
//! measured, on local directories) with the external-provisioner and external-attacher, to the
//! binary's shared plane. In such a binary the scheduler binds every pod, so the simulated
//! [`Kubelet`] belongs in other binaries.
//!
//! - Images: no registry is reachable. The node imports [`TOOLS_IMAGE`] (busybox) and
//!   [`PAUSE_IMAGE`]; [`ImageBuilder`] packs directories and binaries into more, imported with
//!   [`RealNode::import_image`]. Every container must say `imagePullPolicy: Never`: a
//!   ValidatingAdmissionPolicy refuses any pod that would pull or names an image the node lacks.
//! - Network: pods get an `eth0` that leads nowhere (no host interface, address, route or
//!   iptables rule is added). A pod that must reach a server on the host uses `hostNetwork:
//!   true`. There is no kube-proxy, no Service routing and no DNS; use exec probes.
//! - Isolation: node processes share a private mount namespace and a cgroup namespace rooted at
//!   a cgroup under the test process's own; the host's mounts, sysctls ([`KUBELET_SYSCTLS`]) and
//!   iptables are left as they were. Everything is removed when the test process exits, however
//!   it exits.
//! - Needs: root, cgroup v1, the Debian packages `containerd runc containernetworking-plugins
//!   busybox-static iproute2` (`hack/build-node.sh --install-packages`), and the node binaries
//!   (`WARMCACHE_NODE_BIN`, else `hack/build-node.sh` builds them: about 15 minutes cold).
//!
//! Helpers for pods there: [`tools_pod`], [`wait_pod_finished`], [`termination_message`].
//!
//! Client-side faults (409 conflicts, 500 errors, timeouts) come from [`FaultInjector`], a layer
//! inside the test's `kube::Client`; the API server itself is never made to fail. Crashes (a
//! write stored, then every later request of that client refused, as if its process died) come
//! from [`CrashSwitch`].
//!
//! # Using it
//!
//! ```no_run
//! # async fn example() -> Result<(), warmcache_testkit::TestkitError> {
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use warmcache_testkit::TestNamespace;
//!
//! let ns = TestNamespace::new("my-feature").await?; // starts the shared plane on first use
//! let config_maps = ns.api::<ConfigMap>();
//! // ... run the controller under test with `ns.client.clone()` and assert ...
//! ns.cleanup().await;
//! # Ok(())
//! # }
//! ```
//!
//! Rules for tests:
//!
//! - Get clients from [`ControlPlane::client`] (or [`TestNamespace::client`]) inside each test. A
//!   `kube::Client` is bound to the tokio runtime that created it and every `#[tokio::test]` has
//!   its own runtime, so a client must never be stored in a static and shared between tests.
//! - Tests in one binary share the API server: work in your own [`TestNamespace`], give
//!   cluster-scoped objects unique names, and scope webhooks to your namespace
//!   ([`WebhookRegistration::namespace_selector`] with [`TestNamespace::selector`]).
//! - In CI the control plane is required: if it cannot be built or started, the tests fail with
//!   the tail of the failing component's log. They are never skipped.
//!
//! # Processes and files
//!
//! Each component runs under a small `bash` supervisor whose stdin is a pipe from the test
//! process; when the test process exits for any reason, the pipe closes and the supervisor stops
//! the component, so no etcd or kube-apiserver outlives the tests. A janitor process then removes
//! the plane's temporary directory (`$TMPDIR/warmcache-testkit-*`), which holds the PKI, the
//! admin kubeconfig, etcd's data and one log per component (`etcd.log`, `kube-apiserver.log`,
//! `kube-controller-manager.log`; see [`ControlPlane::dir`] and [`ControlPlane::log_tail`]).
//!
//! For manual exploration, `hack/local-up.sh` (or `cargo run -p warmcache-testkit --bin
//! local-up`) starts the same plane in the foreground and prints an `export KUBECONFIG=...` line.
//!
//! # Environment
//!
//! - `WARMCACHE_CONTROL_PLANE_BIN`: a directory holding `etcd`, `kube-apiserver` and
//!   `kube-controller-manager`. When unset, the kit runs `hack/build-control-plane.sh`, which
//!   prints its cached build directory at once, or builds the pinned versions first (about
//!   12 minutes on a cold cache; needs Go 1.26).
//! - `WARMCACHE_NODE_BIN`: a directory holding the node binaries of `hack/build-node.sh`
//!   (`kubelet`, `kube-scheduler`, `kubectl`, `csi-test-driver`, `pause`, `csi-provisioner`,
//!   `csi-attacher`); when unset, [`RealNode`] runs that script.
//! - `WARMCACHE_CACHE_DIR`: where `hack/build-control-plane.sh` caches binaries (default
//!   `~/.cache/warmcache`); `local-up` also writes its kubeconfig under it.
//! - `WARMCACHE_TESTKIT_CRD_DIR`: install the CRDs from this directory instead of
//!   `<workspace>/config/crd`.
//! - `WARMCACHE_HELM`: a prebuilt `helm` binary for the chart tests; when unset,
//!   [`helm_binary`] runs `hack/build-helm.sh` (cached like the control plane).
//! - `TMPDIR`: parent of the plane's temporary directory.

mod account;
mod component_image;
mod crash;
mod crd;
mod csi;
mod error;
mod faults;
mod helm;
mod https;
mod image;
mod kubelet;
mod model_clients;
mod mooncake_image;
mod namespace;
mod node;
mod otlp;
mod pki;
mod plane;
mod podnet;
mod pods;
mod report;
mod webhook;

use std::time::{Duration, Instant};

pub use account::ComponentAccount;
pub use component_image::{
    COMPONENT_BINARIES, NONROOT, built_binaries_dir, component_image, shared_libraries,
};
pub use crash::{CrashLayer, CrashService, CrashSwitch};
pub use crd::{
    FIELD_MANAGER, LEADERWORKERSET_CRD, apply_crd, install_crds_from_dir,
    install_leaderworkerset_crd, parse_crds, wait_crd_established,
};
pub use csi::{CsiPublish, TestCsiDriver};
pub use error::TestkitError;
pub use faults::{Fault, FaultInjector, FaultLayer, FaultService};
pub use helm::{ENV_HELM, chart_dir, helm_binary};
pub use https::{HttpsClient, HttpsReply};
pub use image::{ImageArchive, ImageBuilder, PAUSE_IMAGE, TOOLS_IMAGE};
pub use k8s_openapi::api::admissionregistration::v1::RuleWithOperations;
pub use kubelet::Kubelet;
pub use model_clients::{ENV_MODEL_CLIENTS, hf_client_image, model_clients_dir};
pub use mooncake_image::{
    ClusterDns, ENV_MOONCAKE_MASTER, MOONCAKE_UID, MOONCAKE_USER, mooncake_image, mooncake_master,
};
pub use namespace::{TESTKIT_NAMESPACE_LABEL, TestNamespace};
pub use node::{ENV_NODE_BIN_DIR, KUBELET_SYSCTLS, RealNode};
pub use otlp::{OtlpReceiver, ReceivedSpan};
pub use pki::WebhookPki;
pub use plane::{ControlPlane, ENV_AUDIT_DIR, ENV_BIN_DIR, ENV_CRD_DIR, ENV_OLDEST_APISERVER_BIN};
pub use podnet::{PodNetwork, pod_dirs};
pub use pods::{
    on_test_node, termination_message, tools_container, tools_pod, wait_pod, wait_pod_finished,
    wait_pod_running,
};
pub use report::namespace_report;
pub use webhook::{
    WebhookRegistration, delete_mutating_webhook, delete_validating_webhook, register_mutating,
    register_mutating_webhook, register_validating, register_validating_webhook, wait_for_webhook,
};

/// Polls `probe` every 100 ms until it returns `Some`, and returns that value; fails with
/// [`TestkitError::Timeout`] naming `what` once `timeout` has passed.
///
/// Use it for anything a controller does asynchronously ("the ConfigMap is gone", "the status
/// says Ready"): fixed sleeps make tests slow and flaky.
pub async fn eventually<T, F, Fut>(
    what: &str,
    timeout: Duration,
    mut probe: F,
) -> Result<T, TestkitError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = probe().await {
            return Ok(value);
        }
        if start.elapsed() >= timeout {
            return Err(TestkitError::Timeout {
                what: what.to_owned(),
                seconds: start.elapsed().as_secs_f64(),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Compares what the API server answered for one admission case with what was expected:
/// `verdict` is `Ok(())` when the write was admitted and the server's message when it was
/// refused; `message`, when given, must appear in that refusal. Returns a line describing the
/// mismatch, or `None` when the verdict is the expected one.
pub fn verdict_mismatch(
    case: &str,
    verdict: &Result<(), String>,
    allowed: bool,
    message: Option<&str>,
) -> Option<String> {
    match (verdict, allowed) {
        (Ok(()), true) => None,
        (Err(msg), false) => message
            .filter(|want| !msg.contains(want))
            .map(|want| format!("{case}: refused, but {msg:?} lacks {want:?}")),
        (Ok(()), false) => Some(format!("{case}: admitted, expected a refusal")),
        (Err(msg), true) => Some(format!("{case}: refused ({msg}), expected admission")),
    }
}

#[cfg(test)]
mod verdict_tests {
    use super::verdict_mismatch;

    #[test]
    fn each_kind_of_mismatch_is_reported() {
        assert_eq!(verdict_mismatch("a", &Ok(()), true, None), None);
        assert_eq!(
            verdict_mismatch("a", &Err("x is bad".into()), false, Some("bad")),
            None
        );
        assert_eq!(
            verdict_mismatch("a", &Err("x is bad".into()), false, None),
            None
        );
        assert!(verdict_mismatch("a", &Err("x".into()), false, Some("bad")).is_some());
        assert!(verdict_mismatch("a", &Ok(()), false, None).is_some());
        assert!(verdict_mismatch("a", &Err("x".into()), true, None).is_some());
    }
}
