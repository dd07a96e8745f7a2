//! `webhook`: see the library crate for the commands.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use warmcache_webhook::{Allocator, Cli, run};

/// Every allocation of the process goes through mimalloc ([`warmcache_webhook::Allocator`]).
#[global_allocator]
static GLOBAL: Allocator = warmcache_webhook::ALLOCATOR;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // No stdio lock is held across `run`: `serve` logs to standard error from its worker
    // threads, which would wait forever on a lock this thread holds.
    let mut out = std::io::BufWriter::new(std::io::stdout());
    let mut err = std::io::stderr();
    let result = run(cli, &mut out, &mut err);
    let flushed = out.flush();
    match (result, flushed) {
        (Ok(()), Ok(())) => ExitCode::SUCCESS,
        (Ok(()), Err(e)) => {
            let _ = writeln!(err, "webhook: writing the result: {e}");
            ExitCode::from(warmcache_cli::exit::UNUSABLE)
        }
        (Err(e), _) => {
            let _ = writeln!(err, "webhook: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
