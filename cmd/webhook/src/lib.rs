//! The `webhook` binary: the offline `identify` command, which prints the model identity and
//! landing that model sharing would act on for a Pod or workload manifest.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};
use serde_json::Value;
use warmcache_modelid::{
    GroupError, LeaderWorkerSet, lws_from_object, pod_from_object, resolve_with_group,
    unresolved_report,
};

/// Command line.
#[derive(Debug, Parser)]
#[command(name = "webhook", version, about = "warmcache pod webhook")]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the model identity and landing of a Pod, or of the pod a Deployment, StatefulSet,
    /// ReplicaSet, DaemonSet, Job, CronJob or LeaderWorkerSet creates (its leader for a
    /// LeaderWorkerSet), as one JSON object. Exits 0 whether or not a model is found, 2 when the
    /// input cannot be read.
    Identify(IdentifyArgs),
}

/// `webhook identify`.
#[derive(Debug, Args)]
pub struct IdentifyArgs {
    /// The manifest (YAML or JSON, one object); `-` reads standard input.
    #[arg(short = 'f', long = "filename", value_name = "POD.yaml")]
    pub file: PathBuf,
    /// The LeaderWorkerSet a worker pod belongs to (needed when the worker names no model).
    #[arg(long, value_name = "LWS.yaml")]
    pub lws: Option<PathBuf>,
}

/// Errors of `run`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The input cannot be read or is not a usable manifest.
    #[error("{path}: {message}")]
    Input {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// Writing the answer failed.
    #[error("writing the result: {0}")]
    Output(#[from] std::io::Error),
    /// The report could not be serialized as JSON.
    #[error("serializing the report: {0}")]
    Report(#[from] serde_json::Error),
}

impl Error {
    /// The process exit code: 2 for unusable input, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Input { .. } => 2,
            Error::Output(_) | Error::Report(_) => 1,
        }
    }
}

fn input_error(path: &Path, message: impl Into<String>) -> Error {
    Error::Input {
        path: path.display().to_string(),
        message: message.into(),
    }
}

/// Read one YAML or JSON object from `path` (`-`: standard input).
fn read_object(path: &Path) -> Result<Value, Error> {
    let text = if path == Path::new("-") {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| input_error(path, format!("cannot read standard input: {e}")))?;
        s
    } else {
        std::fs::read_to_string(path).map_err(|e| input_error(path, format!("cannot read: {e}")))?
    };
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .map_err(|e| input_error(path, format!("not YAML or JSON: {e}")))?;
    let mut docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    match docs.len() {
        1 => {}
        0 => return Err(input_error(path, "no object in the file")),
        n => {
            return Err(input_error(
                path,
                format!("{n} objects in the file; give one object per file"),
            ));
        }
    }
    let doc = docs.remove(0);
    if !doc.is_object() {
        return Err(input_error(
            path,
            "not a Kubernetes object (expected a mapping)",
        ));
    }
    Ok(doc)
}

/// `webhook identify`: print the identity report of the pod in `args.file`.
pub fn identify(args: &IdentifyArgs, out: &mut dyn Write) -> Result<(), Error> {
    let obj = read_object(&args.file)?;
    let pod = pod_from_object(&obj).map_err(|e| input_error(&args.file, e.to_string()))?;
    let group: Option<LeaderWorkerSet> = match &args.lws {
        Some(p) => {
            let v = read_object(p)?;
            Some(lws_from_object(&v).map_err(|e| input_error(p, e.to_string()))?)
        }
        None => None,
    };
    let text = match resolve_with_group(&pod, group.as_ref()) {
        Ok(outcome) => outcome.report_json()?,
        Err(e @ GroupError::Missing { .. }) => {
            unresolved_report(&format!("{e}; pass it with --lws"))?
        }
        Err(e @ GroupError::Mismatch { .. }) => {
            let p = args.lws.as_deref().unwrap_or(Path::new("--lws"));
            return Err(input_error(p, e.to_string()));
        }
    };
    writeln!(out, "{text}")?;
    Ok(())
}

/// Run a parsed command line, writing the answer to `out`.
pub fn run(cli: Cli, out: &mut dyn Write) -> Result<(), Error> {
    match cli.command {
        Command::Identify(args) => identify(&args, out),
    }
}

#[cfg(test)]
mod tests {
    use super::Error;

    #[test]
    fn a_report_that_cannot_be_serialized_fails_with_exit_code_1() {
        let Err(e) = serde_json::from_str::<serde_json::Value>("{") else {
            panic!("an unterminated object does not parse");
        };
        let err = Error::from(e);
        assert_eq!(err.exit_code(), 1);
        assert!(
            err.to_string().starts_with("serializing the report: "),
            "{err}"
        );
    }
}
