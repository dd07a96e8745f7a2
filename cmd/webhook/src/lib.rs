//! The `webhook` binary: the offline `identify` command, which prints the model identity and
//! landing that model sharing would act on for a Pod or workload manifest, and the offline
//! `preview` command, which prints the pod admission would produce (or why it would leave the
//! pod alone) from the same pure functions the webhook runs (`warmcache_modelvolume`).
//!
//! Input and exit codes follow the convention of every warmcache command ([`warmcache_cli`]):
//! `-f FILE` (`-`: standard input, read once), at most
//! [`warmcache_cli::input::MAX_INPUT_BYTES`], YAML read as kubectl reads it; exit 0 when a report
//! was printed (whether or not a model was found, whether the pod is rewritten or left alone), 2
//! when an input cannot be used or the output cannot be written.

mod options;
mod preview;
pub mod rbac;
pub mod serve;

pub use options::{DEFAULT_GATES, GatesArg, ReaderModeArg, RewriteArgs};
pub use preview::{Labels, PreviewArgs, preview};
pub use serve::ServeArgs;

/// The global allocator of the `webhook` binary (set in its `main.rs`), and of the admission
/// benchmark, which measures the binary's path: mimalloc. A pod admission allocates a few hundred
/// small objects and frees them all, and glibc's malloc spent about 40% of the samples of one
/// (much of it consolidating its free lists on every request over 1 KB); see
/// `docs/benchmarks.md`, "Pod admission".
pub type Allocator = mimalloc::MiMalloc;

/// The value of [`Allocator`] to declare as `#[global_allocator]`.
pub const ALLOCATOR: Allocator = mimalloc::MiMalloc;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};
use serde_json::{Value, json};
use warmcache_cli::args::InputFile;
use warmcache_cli::input::{self, InputError, Source};
use warmcache_cli::{text, yaml};
use warmcache_modelid::{
    GroupError, LeaderWorkerSet, WorkloadError, lws_from_object, pod_from_object,
    resolve_with_group, unresolved_report,
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
    /// LeaderWorkerSet), as one JSON object. A stream of several documents (`helm template`
    /// output) prints one `{"object": ..., "report": ...}` per pod template, in order, and
    /// skips documents without one. Exits 0 whether or not a model is found, 2 when the input
    /// cannot be read.
    Identify(IdentifyArgs),
    /// Print what admission would do to a Pod (or the pod of a workload): the rewritten pod as
    /// YAML, or, when the pod is left alone, the skip reason as JSON
    /// (`{"reason", "message", "event", "uri"}`). The storage inputs are files: the catalog,
    /// StorageClass nvcf-sc, optionally its CSIDriver and the binding the cache would return. A
    /// stream prints one document per pod template (`---` separated; skips as
    /// `{"object": ..., "skip": ...}`). Exits 0 in both cases, 2 when an input cannot be used.
    Preview(Box<PreviewArgs>),
    /// Serve the mutating pod webhook over HTTPS (on the component runtime: admin server with
    /// /metrics, /healthz and /readyz, traces, graceful shutdown) until SIGTERM or SIGINT. GPU
    /// pods that download a model are rewritten to read the shared read-only copy; every pod
    /// left alone says why (annotation, metric, Event). Exits 0 after a clean shutdown, 1 when
    /// it cannot start or serve.
    Serve(Box<ServeArgs>),
}

/// `webhook identify`.
#[derive(Debug, Args)]
pub struct IdentifyArgs {
    /// The manifest (YAML or JSON: one object, or a stream of documents); `-` reads standard
    /// input.
    #[command(flatten)]
    pub input: InputFile,
    /// The LeaderWorkerSet a worker pod belongs to (needed when the worker names no model and
    /// its LeaderWorkerSet is not in the same stream).
    #[arg(long, value_name = "LWS.yaml")]
    pub lws: Option<PathBuf>,
}

/// Errors of `run`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An input cannot be read at all.
    #[error(transparent)]
    Read(#[from] InputError),
    /// The input is not a usable manifest.
    #[error("{path}: {message}")]
    Input {
        /// The input as named in messages.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// Some documents of a stream could not be used (their errors were printed in the output).
    #[error("{path}: {count} document(s) could not be read; see the \"error\" entries")]
    Documents {
        /// The input.
        path: String,
        /// How many documents failed.
        count: usize,
    },
    /// Writing the answer failed.
    #[error("writing the result: {0}")]
    Output(#[from] std::io::Error),
    /// The report could not be serialized as JSON.
    #[error("serializing the report: {0}")]
    Report(#[from] serde_json::Error),
    /// The pod could not be serialized as YAML.
    #[error("serializing the pod as YAML: {0}")]
    Yaml(String),
    /// The webhook server could not start or serve.
    #[error(transparent)]
    Serve(#[from] serve::ServeError),
}

impl Error {
    /// The process exit code ([`warmcache_cli::exit`]): 2 for every failure of the offline
    /// commands, since no verdict was reached (a model that is not found is a report, exit 0);
    /// 1 when the server fails.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Serve(_) => warmcache_cli::exit::REFUSED,
            _ => warmcache_cli::exit::UNUSABLE,
        }
    }
}

fn input_error(path: &Path, message: impl Into<String>) -> Error {
    Error::Input {
        path: Source::of(path).name(),
        message: message.into(),
    }
}

/// Every non-empty document of the input `path` names.
fn read_documents(path: &Path) -> Result<Vec<Value>, Error> {
    let text = input::read(path)?;
    yaml::documents(&text).map_err(|e| input_error(path, e.to_string()))
}

/// The single object of `path` (for `--lws`).
fn read_object(path: &Path) -> Result<Value, Error> {
    let text = input::read(path)?;
    yaml::one_object(&text).map_err(|e| input_error(path, e.to_string()))
}

/// Where a document of a stream came from, for the `object` key of its entry.
fn object_ref(index: usize, doc: &Value) -> Value {
    let meta = doc.get("metadata");
    let field = |v: Option<&Value>| {
        v.and_then(Value::as_str)
            .map(|s| Value::String(text::escape(&text::bounded(s, 512))))
    };
    let mut o = serde_json::Map::new();
    o.insert("document".to_owned(), json!(index));
    for (key, value) in [
        ("apiVersion", field(doc.get("apiVersion"))),
        ("kind", field(doc.get("kind"))),
        ("namespace", field(meta.and_then(|m| m.get("namespace")))),
        ("name", field(meta.and_then(|m| m.get("name")))),
    ] {
        if let Some(v) = value {
            o.insert(key.to_owned(), v);
        }
    }
    Value::Object(o)
}

/// The report of one pod, as JSON text; the group is looked up among `groups` (the
/// LeaderWorkerSets of the stream and `--lws`) when the pod is a worker that names no model.
fn report(
    pod: &k8s_openapi::api::core::v1::Pod,
    group: Option<&LeaderWorkerSet>,
    groups: &BTreeMap<String, LeaderWorkerSet>,
    lws_path: Option<&Path>,
) -> Result<Result<String, String>, Error> {
    let mut result = resolve_with_group(pod, group);
    if let Err(GroupError::Missing { name, .. }) = &result
        && let Some(found) = groups.get(name)
    {
        result = resolve_with_group(pod, Some(found));
    }
    Ok(match result {
        Ok(outcome) => Ok(outcome.report_json()?),
        Err(e @ GroupError::Missing { .. }) => {
            Ok(unresolved_report(&format!("{e}; pass it with --lws"))?)
        }
        Err(e @ GroupError::Mismatch { .. }) => {
            let p = lws_path.unwrap_or(Path::new("--lws"));
            Err(format!("{}: {e}", Source::of(p).name()))
        }
    })
}

/// `webhook identify`: print the identity report of the pod in `args.input`, or one entry per
/// pod template of a stream.
pub fn identify(args: &IdentifyArgs, out: &mut dyn Write) -> Result<(), Error> {
    input::stdin_at_most_once(&[
        ("-f", Some(&args.input.file)),
        ("--lws", args.lws.as_deref()),
    ])?;
    let group: Option<LeaderWorkerSet> = match &args.lws {
        Some(p) => {
            let v = read_object(p)?;
            Some(lws_from_object(&v).map_err(|e| input_error(p, e.to_string()))?)
        }
        None => None,
    };
    let docs = read_documents(&args.input.file)?;
    match docs.as_slice() {
        [] => Err(input_error(&args.input.file, "no object in the input")),
        [doc] => {
            if !doc.is_object() {
                return Err(input_error(
                    &args.input.file,
                    "not a Kubernetes object (expected a mapping)",
                ));
            }
            let pod =
                pod_from_object(doc).map_err(|e| input_error(&args.input.file, e.to_string()))?;
            match report(&pod, group.as_ref(), &BTreeMap::new(), args.lws.as_deref())? {
                Ok(text) => writeln!(out, "{text}")?,
                Err(message) => {
                    return Err(Error::Input {
                        path: Source::of(args.lws.as_deref().unwrap_or(Path::new("--lws"))).name(),
                        message,
                    });
                }
            }
            Ok(())
        }
        docs => identify_stream(args, docs, group.as_ref(), out),
    }
}

/// A stream: one entry per document with a pod template, errors as entries (exit 2 at the
/// end), documents of other kinds skipped.
fn identify_stream(
    args: &IdentifyArgs,
    docs: &[Value],
    group: Option<&LeaderWorkerSet>,
    out: &mut dyn Write,
) -> Result<(), Error> {
    let groups: BTreeMap<String, LeaderWorkerSet> = docs
        .iter()
        .filter_map(|d| lws_from_object(d).ok())
        .filter_map(|l| l.metadata.name.clone().map(|n| (n, l)))
        .collect();
    let mut entries = 0usize;
    let mut failed = 0usize;
    for (index, doc) in docs.iter().enumerate() {
        let object = object_ref(index, doc);
        let entry = if !doc.is_object() {
            failed += 1;
            json!({"object": object, "error": "not a Kubernetes object (expected a mapping)"})
        } else {
            match pod_from_object(doc) {
                Err(WorkloadError::UnsupportedKind { .. }) => continue,
                Err(e) => {
                    failed += 1;
                    json!({"object": object, "error": text::escape(&text::bounded(&e.to_string(), 4096))})
                }
                Ok(pod) => match report(&pod, group, &groups, args.lws.as_deref())? {
                    Ok(report) => {
                        let report: Value = serde_json::from_str(&report)?;
                        json!({"object": object, "report": report})
                    }
                    Err(message) => {
                        failed += 1;
                        json!({"object": object, "error": message})
                    }
                },
            }
        };
        entries += 1;
        writeln!(out, "{}", serde_json::to_string_pretty(&entry)?)?;
    }
    let path = Source::of(&args.input.file).name();
    if failed > 0 {
        return Err(Error::Documents {
            path,
            count: failed,
        });
    }
    if entries == 0 {
        return Err(Error::Input {
            path,
            message: format!(
                "none of the {} documents has a pod template (expected Pod, Deployment, StatefulSet, ReplicaSet, DaemonSet, Job, CronJob or LeaderWorkerSet)",
                docs.len()
            ),
        });
    }
    Ok(())
}

/// Run a parsed command line, writing the answer to `out` and notes to `err`.
pub fn run(cli: Cli, out: &mut dyn Write, err: &mut dyn Write) -> Result<(), Error> {
    match cli.command {
        Command::Identify(args) => identify(&args, out),
        Command::Preview(args) => preview(&args, out, err),
        Command::Serve(args) => Ok(serve::run(*args)?),
    }
}

#[cfg(test)]
mod tests {
    use super::Error;

    #[test]
    fn a_report_that_cannot_be_serialized_fails_with_exit_code_2() {
        let Err(e) = serde_json::from_str::<serde_json::Value>("{") else {
            panic!("an unterminated object does not parse");
        };
        let err = Error::from(e);
        assert_eq!(err.exit_code(), 2);
        assert!(
            err.to_string().starts_with("serializing the report: "),
            "{err}"
        );
    }
}
