//! Workspace tasks run by developers and CI: `cargo xtask crdgen [--check]` and `cargo xtask deps-check`.

mod crdgen;
mod deps;

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
    /// Write the CRD manifests generated from the Rust API types into config/crd/ and the chart.
    Crdgen {
        /// Do not write: fail when a committed file differs from what the types generate.
        #[arg(long)]
        check: bool,
    },
    /// Enforce the dependency direction of docs/architecture.md section 4 over `cargo metadata`.
    DepsCheck,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let root = workspace_root();
    let result = match cli.command {
        Command::Crdgen { check } => crdgen::run(&root, check),
        Command::DepsCheck => deps::run(&root),
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
