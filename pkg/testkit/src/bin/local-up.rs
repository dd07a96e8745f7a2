//! Starts the test control plane and, unless `--no-node` is given, the real node (kubelet,
//! containerd, kube-scheduler and the test CSI drivers) in the foreground for a developer, and
//! waits for Ctrl-C or SIGTERM.
//!
//! Prints the kubeconfig path, an `export KUBECONFIG=...` line and the path of the `kubectl`
//! built with the node. The kubeconfig is copied to
//! `${WARMCACHE_CACHE_DIR:-~/.cache/warmcache}/local/kubeconfig`; it stops working when this
//! process exits (the plane, the node and their data are removed).

use std::path::PathBuf;

use warmcache_testkit::{ControlPlane, RealNode, TestCsiDriver};

const USAGE: &str = "usage: local-up [--no-node]\n\n  --no-node  start only etcd, kube-apiserver and kube-controller-manager (no kubelet,\n             scheduler or CSI drivers; pods stay Pending)";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut with_node = true;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--no-node" => with_node = false,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?}\n{USAGE}").into()),
        }
    }

    eprintln!("local-up: starting etcd, kube-apiserver and kube-controller-manager ...");
    let plane = ControlPlane::start()?;
    println!(
        "control plane ready in {:.1}s at {}",
        plane.startup_duration().as_secs_f64(),
        plane.server_url()
    );
    if plane.installed_crds().is_empty() {
        println!("CRDs installed: none (config/crd has no manifests)");
    } else {
        println!("CRDs installed: {}", plane.installed_crds().join(", "));
    }
    println!("logs: {}", plane.dir().display());

    let node = if with_node {
        eprintln!(
            "local-up: starting the real node (kube-scheduler, containerd, kubelet, test CSI drivers) ..."
        );
        let node = RealNode::start(&plane)?;
        println!(
            "node {} Ready in {:.1}s",
            node.name(),
            node.startup_duration().as_secs_f64()
        );
        let classes: Vec<&str> = TestCsiDriver::ALL
            .iter()
            .map(|d| d.storage_class())
            .collect();
        println!(
            "StorageClasses of the TEST CSI driver: {}",
            classes.join(", ")
        );
        println!(
            "images: {} (pods must say imagePullPolicy: Never; no network beyond the pod)",
            node.images().join(", ")
        );
        println!("node dir: {}", node.dir().display());
        for cgroup in node.cgroups() {
            println!("node cgroup: {}", cgroup.display());
        }
        Some(node)
    } else {
        println!("no node (--no-node): pods stay Pending");
        None
    };

    let cache = std::env::var_os("WARMCACHE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/warmcache")))
        .unwrap_or_else(std::env::temp_dir);
    let local = cache.join("local");
    std::fs::create_dir_all(&local)?;
    let kubeconfig = local.join("kubeconfig");
    std::fs::copy(plane.kubeconfig_path(), &kubeconfig)?;

    if let Some(node) = &node {
        println!("kubectl: {}", node.kubectl().display());
    }
    println!("kubeconfig: {}", kubeconfig.display());
    println!("export KUBECONFIG={}", kubeconfig.display());
    println!("ready; press Ctrl-C to stop");

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            result = tokio::signal::ctrl_c() => result,
            _ = terminate.recv() => Ok(()),
        }
    })?;
    eprintln!("local-up: stopping");
    if let Some(node) = node {
        node.shutdown();
    }
    plane.shutdown();
    Ok(())
}
