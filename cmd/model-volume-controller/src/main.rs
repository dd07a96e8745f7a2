//! `model-volume-controller`: parses the command line and runs it (see the library).

use std::process::ExitCode;

use clap::Parser;
use warmcache_model_volume_controller::{Cli, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("model-volume-controller: {error}");
            ExitCode::from(1)
        }
    }
}
