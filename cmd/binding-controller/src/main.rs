//! `binding-controller`: parses the command line, runs it, maps the result to an exit code.

use std::process::ExitCode;

use clap::Parser;
use warmcache_binding_controller::{Cli, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Not locked: the controller logs to standard output while it runs.
    let mut stdout = std::io::stdout();
    match run(cli, &mut stdout) {
        Ok(status) => ExitCode::from(status.code()),
        Err(error) => {
            eprintln!("binding-controller: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}
