//! `webhook`: see the library crate for the commands.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use warmcache_webhook::{Cli, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match run(cli, &mut out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = out.flush();
            eprintln!("webhook: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
