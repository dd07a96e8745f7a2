//! The node agent (`model-volume-controller`, a DaemonSet): the steps of the model lifecycle that
//! can only happen on a node: the block (roxReadOnly) staging copy ([`agent`]), the capture of a
//! Ready pod's own download into its binding's primary ([`capture`]), verified read-only binds
//! for hostPath readers of block storage ([`host`]) and fresh ReadWriteMany roots opened for
//! non-root writers ([`open`]); see `docs/node-agent.md`.
//!
//! ```text
//! model-volume-controller run --node-name NODE [--kubelet-root DIR] [--control-namespace NS]
//!                             [--holder-image IMAGE] [--bind-root DIR] [--min-size-gib N]
//!                             [runtime flags]
//! ```
//!
//! It acts only on pods of its own node (`--node-name`, from the downward API in the chart) and
//! on the claims and mount holders it creates for them. No leader election: each node's agent
//! is the only one that can reach its node's volumes; the atomic create of a primary claim is
//! the election between agents.

pub mod agent;
pub mod capture;
pub mod host;
pub mod metrics;
pub mod open;
pub mod rbac;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// The node agent.
#[derive(Debug, Parser)]
#[command(name = "model-volume-controller", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent of one node until SIGTERM or SIGINT.
    Run(Box<RunArgs>),
}

/// Arguments of `run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub runtime: warmcache_runtime::RuntimeArgs,
    /// This node's name (the chart passes `spec.nodeName` through the downward API).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// The kubelet's root directory on this node, as the agent sees it (`pods/<uid>/volumes`).
    #[arg(long, default_value = "/var/lib/kubelet", value_name = "DIR")]
    pub kubelet_root: PathBuf,
    /// The control namespace: bindings, primary claims and mount holders live here.
    #[arg(long, default_value = warmcache_api_modelcache::DEFAULT_CONTROL_NAMESPACE)]
    pub control_namespace: String,
    /// Image of mount holder pods: a pause image present on the nodes (runs as 65535).
    #[arg(
        long,
        default_value = "registry.k8s.io/pause:3.10",
        value_name = "IMAGE"
    )]
    pub holder_image: String,
    /// Pull policy of the mount holder image.
    #[arg(long, default_value = "IfNotPresent", value_parser = ["IfNotPresent", "Always", "Never"])]
    pub holder_image_pull_policy: String,
    /// The node directory hostPath readers mount (`<bind root>/<model hash>`, the webhook's
    /// host root), as the agent sees it: it must be mounted in the agent with `Bidirectional`
    /// propagation so its binds reach the node and the readers.
    #[arg(
        long,
        default_value = warmcache_modelvolume::keys::DEFAULT_HOST_ROOT,
        value_name = "DIR"
    )]
    pub bind_root: PathBuf,
    /// Smallest primary claim of a block cache, in GiB (the measured bytes + 10 % otherwise).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub min_size_gib: u64,
    /// Staged downloads handled at once.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub concurrency: u16,
}

/// Why the agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag is not usable.
    #[error("{0}")]
    Usage(String),
    /// The runtime failed.
    #[error(transparent)]
    Runtime(#[from] warmcache_runtime::RuntimeError),
}

/// Runs `cli`.
///
/// # Errors
///
/// A bad flag, or the runtime failing (startup, a watch that cannot start, a task failing).
pub fn run(cli: Cli) -> Result<(), Error> {
    match cli.command {
        Command::Run(args) => serve(*args),
    }
}

fn serve(args: RunArgs) -> Result<(), Error> {
    let settings = agent::Settings::from_args(&args).map_err(Error::Usage)?;
    warmcache_runtime::block_on(async move {
        let mut runtime =
            warmcache_runtime::Runtime::builder("model-volume-controller", args.runtime)
                .version(env!("CARGO_PKG_VERSION"))
                .with_client()
                .build()
                .await?;
        agent::start(&mut runtime, &settings)?;
        runtime.run().await
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    fn args(extra: &[&str]) -> Result<RunArgs, clap::Error> {
        let mut argv = vec!["model-volume-controller", "run"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).map(|cli| match cli.command {
            Command::Run(a) => *a,
        })
    }

    #[test]
    fn flags_have_defaults_and_refuse_bad_values() {
        let a = args(&["--node-name", "gpu-1"]).unwrap();
        let s = agent::Settings::from_args(&a).unwrap();
        assert_eq!(s.node, "gpu-1");
        assert_eq!(s.kubelet_root, PathBuf::from("/var/lib/kubelet"));
        assert_eq!(s.control_namespace, "nvca-modelcache-init");
        assert_eq!(s.min_bytes, 1 << 30);
        assert_eq!(s.bind_root, "/var/lib/containerd/nvsnap-models");
        let relative = args(&["--node-name", "n", "--bind-root", "models"]).unwrap();
        assert!(
            agent::Settings::from_args(&relative)
                .unwrap_err()
                .contains("--bind-root")
        );
        assert!(args(&["--node-name", "n", "--min-size-gib", "0"]).is_err());
        assert!(args(&["--node-name", "n", "--concurrency", "0"]).is_err());
        let relative = args(&["--node-name", "n", "--kubelet-root", "var/lib/kubelet"]).unwrap();
        assert!(
            agent::Settings::from_args(&relative)
                .unwrap_err()
                .contains("--kubelet-root")
        );
        let empty = args(&["--node-name", ""]).unwrap();
        assert!(
            agent::Settings::from_args(&empty)
                .unwrap_err()
                .contains("--node-name")
        );
    }
}
