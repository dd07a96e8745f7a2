//! The shared clap arguments: every command that reads a manifest takes it as `-f FILE`
//! (`--filename`), with `-` for standard input, as `kubectl` does.

use std::path::PathBuf;

use clap::Args;

/// `-f FILE`: the input of a command.
#[derive(Debug, Clone, Args)]
pub struct InputFile {
    /// The input (YAML or JSON); `-` reads standard input.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub file: PathBuf,
}
