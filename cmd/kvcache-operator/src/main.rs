//! `kvcache-operator`: parses the command line and runs it (see the library for the commands).

use std::process::ExitCode;

use clap::Parser;
use warmcache_kvcache_operator::{Cli, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut out = std::io::stdout().lock();
    let mut err = std::io::stderr();
    match run(cli, &mut out, &mut err) {
        Ok(outcome) => ExitCode::from(outcome.code()),
        Err(error) => {
            let code = error.exit_code();
            eprintln!("kvcache-operator: {error}");
            ExitCode::from(code)
        }
    }
}
