//! `webhook`: see the library crate for the commands.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use warmcache_webhook::{Cli, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let stderr = std::io::stderr();
    let mut err = stderr.lock();
    match run(cli, &mut out, &mut err) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = out.flush();
            let _ = writeln!(err, "webhook: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
