//! `uninstall-hook`: parses the command line, runs the hook, maps the result to an exit code
//! (0 done, 1 something left, 2 unusable flags or output).

use std::process::ExitCode;

use clap::Parser;
use warmcache_uninstall_hook::{Cli, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut stdout = std::io::stdout();
    match run(cli, &mut stdout) {
        Ok(report) => ExitCode::from(report.code()),
        Err(error) => {
            eprintln!("uninstall-hook: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}
