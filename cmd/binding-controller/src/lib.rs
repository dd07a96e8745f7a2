//! The binding controller binary: today its offline storage capability catalog commands
//! (`catalog validate`, `catalog explain`), which users and CI run on a catalog edit.
//!
//! The input is `-f FILE` (`-`: standard input), at most [`warmcache_cli::input::MAX_INPUT_BYTES`].
//! Exit codes ([`warmcache_cli::exit`], the same for every warmcache command): 0 when the
//! command succeeded (`validate`: the catalog is valid); 1 when the catalog is invalid (one
//! `<field path>: <reason>` line per refusal on stdout); 2 when the input cannot be used
//! (unreadable, too large, not text, not YAML), the command line is wrong, or the output cannot
//! be written (a message on stderr).

use std::io::Write;

use clap::{Parser, Subcommand, ValueEnum};
use warmcache_api_modelcache::v2beta1::Workflow;
use warmcache_catalog::{CatalogFile, FieldErrors, LoadError, YamlError, explain};
use warmcache_cli::args::InputFile;
use warmcache_cli::input::{self, InputError};

/// ModelCacheBinding controller.
#[derive(Debug, Parser)]
#[command(name = "binding-controller", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Offline checks of a storage capability catalog (no cluster access).
    #[command(subcommand)]
    Catalog(CatalogCommand),
}

/// `catalog` subcommands.
#[derive(Debug, Subcommand)]
pub enum CatalogCommand {
    /// Check a catalog: prints `ok` (exit 0), or one `<field path>: <reason>` line per error
    /// (exit 1).
    Validate {
        /// The catalog YAML, or a ConfigMap manifest holding it under
        /// `data[storage-provider-capabilities.yaml]`.
        #[command(flatten)]
        input: InputFile,
    },
    /// Print, as one JSON object, the flow the catalog gives a provisioner for a workflow.
    Explain {
        /// The catalog YAML, or a ConfigMap manifest holding it.
        #[command(flatten)]
        input: InputFile,
        /// The exact StorageClass provisioner to look up.
        #[arg(long)]
        provisioner: String,
        /// Who reads the cache.
        #[arg(long, value_enum)]
        workflow: WorkflowArg,
    },
}

/// `--workflow` values (the API spelling).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WorkflowArg {
    /// Readers in the namespace of the request only.
    #[value(name = "regularModelCache")]
    RegularModelCache,
    /// Readers in every namespace of a sharing domain.
    #[value(name = "helmModelCache")]
    HelmModelCache,
}

impl From<WorkflowArg> for Workflow {
    fn from(arg: WorkflowArg) -> Self {
        match arg {
            WorkflowArg::RegularModelCache => Self::RegularModelCache,
            WorkflowArg::HelmModelCache => Self::HelmModelCache,
        }
    }
}

/// How a command ended when it could read its input: the shared verdict (`Ok`, or `Refused`:
/// the catalog is invalid and the refusals were printed).
pub use warmcache_cli::exit::Verdict as Status;

/// Input that cannot be used at all, or output that cannot be written (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The input cannot be read, is too large or is not text.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The input is not YAML.
    #[error("{name}: {source}")]
    NotYaml {
        /// The input as named in messages.
        name: String,
        /// What the parser reported.
        source: YamlError,
    },
    /// Standard output cannot be written.
    #[error("cannot write the output: {0}")]
    Output(#[from] std::io::Error),
}

impl Error {
    /// The process exit code (always [`warmcache_cli::exit::UNUSABLE`]).
    pub const fn exit_code(&self) -> u8 {
        warmcache_cli::exit::UNUSABLE
    }
}

/// Runs a command, writing its result to `out`.
pub fn run(cli: Cli, out: &mut dyn Write) -> Result<Status, Error> {
    match cli.command {
        Command::Catalog(CatalogCommand::Validate { input }) => match load(&input)? {
            Ok(_) => {
                writeln!(out, "ok")?;
                Ok(Status::Ok)
            }
            Err(errors) => print_errors(out, &errors),
        },
        Command::Catalog(CatalogCommand::Explain {
            input,
            provisioner,
            workflow,
        }) => match load(&input)? {
            Ok(catalog) => {
                let explanation = explain(&catalog.snapshot, &provisioner, workflow.into());
                let json = serde_json::to_string(&explanation).map_err(std::io::Error::other)?;
                writeln!(out, "{json}")?;
                Ok(Status::Ok)
            }
            Err(errors) => print_errors(out, &errors),
        },
    }
}

fn print_errors(out: &mut dyn Write, errors: &FieldErrors) -> Result<Status, Error> {
    for error in errors {
        writeln!(out, "{error}")?;
    }
    Ok(Status::Refused)
}

/// Reads and loads a catalog file: the outer `Err` is unusable input, the inner one an invalid
/// catalog.
fn load(input: &InputFile) -> Result<Result<CatalogFile, FieldErrors>, Error> {
    let text = input::read(&input.file)?;
    match CatalogFile::parse(&text) {
        Ok(file) => Ok(Ok(file)),
        Err(LoadError::Invalid(errors)) => Ok(Err(errors)),
        Err(LoadError::Yaml(source)) => Err(Error::NotYaml {
            name: input::Source::of(&input.file).name(),
            source,
        }),
    }
}
