//! `reaper`: parses the command line, runs it, maps the result to an exit code.

use std::process::ExitCode;

use clap::Parser;
use warmcache_reaper::{Cli, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut stdout = std::io::stdout();
    match run(cli, &mut stdout) {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            eprintln!("reaper: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}
