//! The binding controller binary: `controller` reconciles ModelCacheBindings on the component
//! runtime (leader-elected, see [`controller`]); the offline storage capability catalog
//! commands (`catalog validate`, `catalog explain`) are what users and CI run on a catalog edit.
//!
//! The input is `-f FILE` (`-`: standard input), at most [`warmcache_cli::input::MAX_INPUT_BYTES`].
//! Exit codes ([`warmcache_cli::exit`], the same for every warmcache command): 0 when the
//! command succeeded (`validate`: the catalog is valid); 1 when the catalog is invalid (one
//! `<field path>: <reason>` line per refusal on stdout); 2 when the input cannot be used
//! (unreadable, too large, not text, not YAML), the command line is wrong, or the output cannot
//! be written (a message on stderr).

pub mod controller;
pub mod metrics;
pub mod pods;
pub mod qualify;
pub mod rbac;

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
    /// Reconcile the ModelCacheBindings of the control namespace (leader-elected), until
    /// SIGTERM or SIGINT.
    Controller(Box<ControllerArgs>),
    /// Qualify a StorageClass on a live cluster (seed 000): writer, cross-namespace read-only
    /// reader, EROFS on every write, Retain, a negative control; prints the report and removes
    /// what it created (docs/qualification.md).
    Qualify(Box<qualify::QualifyArgs>),
}

/// Arguments of `controller`: the shared flags of every component, leader election, and the
/// lifecycle settings.
#[derive(Debug, clap::Args)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub runtime: warmcache_runtime::RuntimeArgs,
    #[command(flatten)]
    pub leader: warmcache_runtime::LeaderElectionArgs,
    /// The control namespace: bindings and primary claims live here.
    #[arg(long, default_value = warmcache_api_modelcache::DEFAULT_CONTROL_NAMESPACE)]
    pub control_namespace: String,
    /// Size of the ReadWriteMany primary claim (nothing is measured before the download).
    #[arg(long, default_value = "100Gi", value_name = "QUANTITY")]
    pub primary_size: String,
    /// Extra mount options of read-only views (comma-separated); those negating a required one
    /// (recovery vs norecovery, rw, ...) are dropped.
    #[arg(long, value_delimiter = ',', value_name = "OPTION")]
    pub view_mount_option: Vec<String>,
    /// activeDeadlineSeconds of writer Jobs.
    #[arg(long, default_value_t = warmcache_modelvolume::writer::DEFAULT_ACTIVE_DEADLINE_SECONDS)]
    pub writer_deadline_seconds: i64,
    /// ttlSecondsAfterFinished of writer Jobs (a failed Job's TTL gates its retry; how long a
    /// failure holds is `--failure-record-seconds`).
    #[arg(long, default_value_t = warmcache_modelvolume::writer::DEFAULT_TTL_SECONDS_AFTER_FINISHED)]
    pub writer_ttl_seconds: i32,
    /// Seconds the writer of a helmModelCache download must have been gone (its Job gone, no
    /// reading pod with a download step left in its namespace) before another namespace of the
    /// sharing domain takes the download over through the writer Lease.
    #[arg(long, default_value_t = warmcache_modelvolume::lease::DEFAULT_TAKEOVER_GRACE_SECONDS)]
    pub writer_takeover_grace_seconds: i64,
    /// Seconds a failure record holds after a failed download: admission leaves new pods of the
    /// model on their own download, readers still waiting are deleted, no retry starts.
    #[arg(long, default_value_t = warmcache_modelvolume::lifecycle::DEFAULT_FAILURE_RECORD_SECONDS)]
    pub failure_record_seconds: i64,
    /// The node agent (model-volume-controller) runs on the nodes writers land on and opens
    /// fresh ReadWriteMany roots: a binding whose writer identity is `root` (a driver applying
    /// no fsGroup) then gets a non-root writer that waits for the agent to give it its root,
    /// instead of a writer running as uid 0. The chart sets it with the agent.
    #[arg(long)]
    pub node_agent_opens_roots: bool,
    /// With --node-agent-opens-roots: seconds the writer waits for its root before it fails.
    #[arg(long, default_value_t = warmcache_modelvolume::writer::DEFAULT_OPEN_ROOT_WAIT_SECONDS, value_parser = clap::value_parser!(u32).range(1..=86400))]
    pub open_root_wait_seconds: u32,
    /// How many bindings are reconciled at once.
    #[arg(long, default_value_t = 4)]
    pub concurrency: u16,
    /// Namespace of the catalog ConfigMap nvcf-storage-capabilities (the webhook's namespace).
    /// When given, each binding's frozen decision is compared with what StorageClass nvcf-sc and
    /// the catalog give today, reported as the DecisionDrift condition (never acted on).
    #[arg(long, value_name = "NAMESPACE")]
    pub catalog_namespace: Option<String>,
    /// Feature gates, `Name=true|false,...`, as the webhook is given them (CachingSupport,
    /// HelmModelCaching: default true; ModelCacheEncryption: default false): decision drift
    /// compares each binding with the decision these gates give today.
    #[arg(long = "feature-gates", value_name = "k=v,...", value_parser = warmcache_catalog::Gates::parse, default_value = "")]
    pub feature_gates: warmcache_catalog::Gates,
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
    /// A controller setting is not usable.
    #[error("{0}")]
    Setting(String),
    /// The controller failed.
    #[error(transparent)]
    Controller(#[from] warmcache_runtime::RuntimeError),
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
        Command::Controller(args) => {
            serve(*args)?;
            Ok(Status::Ok)
        }
        Command::Qualify(args) => qualify::run_command(*args, out),
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

/// The settings of `controller`, checked.
pub fn settings(args: &ControllerArgs) -> Result<controller::Settings, Error> {
    let size = k8s_openapi::apimachinery::pkg::api::resource::Quantity(args.primary_size.clone());
    let valid_size = {
        let s = args
            .primary_size
            .trim_end_matches(['K', 'M', 'G', 'T', 'P', 'E', 'i']);
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
    };
    if !valid_size {
        return Err(Error::Setting(format!(
            "--primary-size {:?} is not a quantity such as 100Gi",
            args.primary_size
        )));
    }
    let ns = &args.control_namespace;
    let valid_ns = !ns.is_empty()
        && ns.len() <= 63
        && ns
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-'))
        && !ns.starts_with('-')
        && !ns.ends_with('-');
    if !valid_ns {
        return Err(Error::Setting(format!(
            "--control-namespace {ns:?} is not a namespace name"
        )));
    }
    if args.writer_deadline_seconds <= 0 || args.writer_ttl_seconds < 0 {
        return Err(Error::Setting(
            "--writer-deadline-seconds must be positive and --writer-ttl-seconds not negative"
                .to_owned(),
        ));
    }
    if args.failure_record_seconds < 0 {
        return Err(Error::Setting(
            "--failure-record-seconds must not be negative".to_owned(),
        ));
    }
    if !(0..=i64::from(i32::MAX)).contains(&args.writer_takeover_grace_seconds) {
        return Err(Error::Setting(
            "--writer-takeover-grace-seconds must be between 0 and 2147483647".to_owned(),
        ));
    }
    let writer = warmcache_modelvolume::WriterOptions {
        active_deadline_seconds: args.writer_deadline_seconds,
        ttl_seconds_after_finished: args.writer_ttl_seconds,
        open_root_wait_seconds: args
            .node_agent_opens_roots
            .then_some(args.open_root_wait_seconds),
        ..warmcache_modelvolume::WriterOptions::default()
    };
    Ok(controller::Settings {
        control_namespace: ns.clone(),
        concurrency: args.concurrency,
        catalog_namespace: args.catalog_namespace.clone(),
        gates: args.feature_gates,
        lifecycle: warmcache_modelvolume::LifecycleConfig {
            primary_size: size,
            extra_mount_options: args.view_mount_option.clone(),
            writer,
            takeover_grace_seconds: args.writer_takeover_grace_seconds,
            failure_record_seconds: args.failure_record_seconds,
            primary_release_grace_seconds:
                warmcache_modelvolume::lifecycle::DEFAULT_PRIMARY_RELEASE_GRACE_SECONDS,
        },
    })
}

fn serve(args: ControllerArgs) -> Result<(), Error> {
    let settings = settings(&args)?;
    warmcache_runtime::block_on(async move {
        let mut runtime = warmcache_runtime::Runtime::builder("binding-controller", args.runtime)
            .version(env!("CARGO_PKG_VERSION"))
            .with_leader_election(args.leader)
            .build()
            .await?;
        controller::start(&mut runtime, &settings)?;
        runtime.run().await
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> ControllerArgs {
        let mut argv = vec!["binding-controller", "controller"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv) {
            Ok(Cli {
                command: Command::Controller(args),
            }) => *args,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn controller_settings_have_defaults_and_refuse_bad_values() {
        let s = settings(&args(&[])).unwrap();
        assert_eq!(s.control_namespace, "nvca-modelcache-init");
        assert_eq!(s.lifecycle.primary_size.0, "100Gi");
        assert_eq!(s.lifecycle.writer.active_deadline_seconds, 6 * 3600);
        assert_eq!(s.lifecycle.takeover_grace_seconds, 120);
        assert_eq!(s.lifecycle.failure_record_seconds, 3600);
        assert_eq!(s.gates, warmcache_catalog::Gates::DEFAULT);
        assert_eq!(s.lifecycle.writer.open_root_wait_seconds, None);
        let s = settings(&args(&["--node-agent-opens-roots"])).unwrap();
        assert_eq!(s.lifecycle.writer.open_root_wait_seconds, Some(600));
        let s = settings(&args(&[
            "--node-agent-opens-roots",
            "--open-root-wait-seconds",
            "30",
        ]))
        .unwrap();
        assert_eq!(s.lifecycle.writer.open_root_wait_seconds, Some(30));
        assert!(
            Cli::try_parse_from([
                "binding-controller",
                "controller",
                "--open-root-wait-seconds",
                "0"
            ])
            .is_err()
        );
        let s = settings(&args(&["--feature-gates", "CachingSupport=false"])).unwrap();
        assert!(!s.gates.caching_support && s.gates.helm_model_caching);
        let refused = Cli::try_parse_from([
            "binding-controller",
            "controller",
            "--feature-gates",
            "Caching=true",
        ])
        .unwrap_err()
        .to_string();
        assert!(refused.contains("unknown feature gate"), "{refused}");
        let s = settings(&args(&[
            "--writer-takeover-grace-seconds",
            "30",
            "--failure-record-seconds",
            "600",
        ]))
        .unwrap();
        assert_eq!(s.lifecycle.takeover_grace_seconds, 30);
        assert_eq!(s.lifecycle.failure_record_seconds, 600);
        let s = settings(&args(&[
            "--primary-size",
            "2Ti",
            "--view-mount-option",
            "noatime,nodiratime",
            "--control-namespace",
            "cache-ctl",
        ]))
        .unwrap();
        assert_eq!(s.lifecycle.primary_size.0, "2Ti");
        assert_eq!(s.lifecycle.extra_mount_options, ["noatime", "nodiratime"]);
        assert_eq!(s.control_namespace, "cache-ctl");
        for bad in [
            &["--primary-size", "lots"][..],
            &["--primary-size", "Gi"],
            &["--control-namespace", "Not_A_Namespace"],
            &["--writer-deadline-seconds", "0"],
            &["--writer-takeover-grace-seconds", "3000000000"],
        ] {
            let err = settings(&args(bad)).unwrap_err();
            assert_eq!(err.exit_code(), warmcache_cli::exit::UNUSABLE, "{bad:?}");
            assert!(err.to_string().contains(bad[0]), "{err}");
        }
        for (bad, flag) in [
            ("--failure-record-seconds=-1", "--failure-record-seconds"),
            (
                "--writer-takeover-grace-seconds=-5",
                "--writer-takeover-grace-seconds",
            ),
        ] {
            let err = settings(&args(&[bad])).unwrap_err();
            assert_eq!(err.exit_code(), warmcache_cli::exit::UNUSABLE, "{bad}");
            assert!(err.to_string().contains(flag), "{err}");
        }
    }
}
