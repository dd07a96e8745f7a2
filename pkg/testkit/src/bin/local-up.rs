//! Starts the test control plane in the foreground for a developer and waits for Ctrl-C.
//!
//! Prints the kubeconfig path and an `export KUBECONFIG=...` line. The kubeconfig is copied to
//! `${WARMCACHE_CACHE_DIR:-~/.cache/warmcache}/local/kubeconfig`; it stops working when this
//! process exits (the plane and its data are removed).

use std::path::PathBuf;

use warmcache_testkit::ControlPlane;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    eprintln!("local-up: starting etcd, kube-apiserver and kube-controller-manager ...");
    let plane = ControlPlane::start()?;

    let cache = std::env::var_os("WARMCACHE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/warmcache")))
        .unwrap_or_else(std::env::temp_dir);
    let local = cache.join("local");
    std::fs::create_dir_all(&local)?;
    let kubeconfig = local.join("kubeconfig");
    std::fs::copy(plane.kubeconfig_path(), &kubeconfig)?;

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
    println!("kubeconfig: {}", kubeconfig.display());
    println!("export KUBECONFIG={}", kubeconfig.display());
    println!("press Ctrl-C to stop");

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(tokio::signal::ctrl_c())?;
    eprintln!("local-up: stopping");
    plane.shutdown();
    Ok(())
}
