//! Workspace tasks run by developers and CI: `cargo xtask gen [--check]` (every generated file)
//! `cargo xtask deps-check` and `cargo xtask rbac-usage DIR` (no granted verb unused).

mod deps;
mod generate;
mod rbac_usage;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "warmcache workspace tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write every generated file (CRDs, the catalog ConfigMap manifest, the webhook
    /// configurations, their chart copies) and remove stale ones from wholly generated
    /// directories.
    Gen {
        /// Do not write: fail, one line per file, when a committed file differs from what its
        /// source renders, is missing or is stale.
        #[arg(long)]
        check: bool,
    },
    /// `gen` restricted to the CRDs (config/crd/ and charts/warmcache/files/crds/), for scripts that
    /// name it; `gen` covers every generated file.
    Crdgen {
        /// As `gen --check`, for the CRDs only.
        #[arg(long)]
        check: bool,
    },
    /// Enforce the dependency direction of docs/architecture.md section 4 over `cargo metadata`.
    DepsCheck,
    /// Fail when a verb the generated roles grant was never used by the component it is
    /// granted to, according to the API servers' audit logs of a test run (`*.jsonl` in DIR,
    /// written when the tests run with WARMCACHE_AUDIT_DIR=DIR).
    RbacUsage {
        /// The directory of audit logs.
        dir: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let root = workspace_root();
    let result = match cli.command {
        Command::Gen { check } => generate::run(&root, None, check),
        Command::Crdgen { check } => generate::run(&root, Some("crds"), check),
        Command::DepsCheck => deps::run(&root),
        Command::RbacUsage { dir } => rbac_usage::run(&dir),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("xtask: {err:#}");
            ExitCode::from(2)
        }
    }
}

/// The workspace root: two levels above this crate's manifest (`hack/xtask`).
fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .nth(2)
        .map(PathBuf::from)
        .unwrap_or(manifest)
}
