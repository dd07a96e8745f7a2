//! `binding-controller qualify`: seed 000's storage qualification, run on a live cluster against
//! one StorageClass, as evidence for a catalog entry (`docs/qualification.md`).
//!
//! One run, in order (every object carries the label [`RUN_LABEL`] with the run's id):
//!
//! 0. the run's own StorageClass `wq-<run>` ([`objects::run_class`]): a Retain copy of the class
//!    under test, which every claim of the run names, so no PersistentVolume that existed before
//!    the run (someone's Available model-cache PV of the class) can bind it; and each bound PV is
//!    checked ([`objects::verify_bound_pv`]: bound to the claim's UID, provisioned by the class's
//!    provisioner, of the run's class) before anything writes to it or changes it;
//! 1. **writer**: a fresh claim of the (run's) class in namespace A (`--writer-access-mode`: ReadWriteMany,
//!    ReadWriteOnce, or `auto`: ReadWriteMany, then ReadWriteOnce when the provisioner refuses
//!    it) and a Job writing a 16 MiB random payload and its SHA-256 (`writer-populates`); the
//!    claim's PV must be `Retain` like the class (`reclaim-retain`);
//! 2. the writer's pod is deleted, its claim released (only when the PV is Retain), and the run
//!    waits until no VolumeAttachment names the PV: block storage attaches read-only only after
//!    the read-write attachment is gone;
//! 3. **readers**: a read-only view of the writer's PV in A and in B, derived by
//!    [`warmcache_modelvolume::read_only_view`] exactly as the binding controller derives views
//!    (handle reused, or rewritten per namespace for providers whose handles encode it; class
//!    cleared; `csi.readOnly`; ReadOnlyMany; Retain; mount options), each mounted by a pod as
//!    the webhook renders readers (claim `readOnly: true`, mount `readOnly: true`, hardened,
//!    non-root). A's reader proves the data survived the writer (`data-survives-writer`), B's
//!    that another namespace sees identical bytes (`reader-identical-bytes`) and that every
//!    kind of write fails with EROFS (`reader-{create,append,rename,chmod,truncate,delete}-erofs`)
//!    and changed nothing (`reader-data-unchanged`);
//! 4. **negative control**: a fresh claim naming only the class, in B, comes back without the
//!    payload (`negative-control-empty`): what a reader claim that names only a class gets;
//! 5. the report (JSON, or text to cite in a catalog change), then every object of the run is
//!    removed, also after a failure or SIGINT/SIGTERM: pods and Jobs, claims, the views' PVs, the
//!    provisioned PVs after setting them to `Delete` so the provisioner frees the storage, and the
//!    run's StorageClass. Only PVs the run derived or verified are ever labelled, patched or
//!    deleted, and every delete names the object's UID.
//!
//! Exit codes: 0 qualified; 1 not qualified (each failed check named, on stdout and in the
//! report); 2 the run could not be made or finished (bad flags, a missing namespace or class,
//! interrupted, output not writable).
//!
//! Telemetry: a span per step and per check (`qualify`, `check{name}`); no metrics: a one-shot
//! command has nothing a scraper would see (the runtime's admin server listens on an ephemeral
//! loopback port only). No leader election.

pub mod objects;
pub mod report;
mod run;

use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;
use warmcache_runtime::{OneShotArgs, parse_duration};

pub use objects::{PAYLOAD_BYTES, RUN_LABEL};
pub use report::{Check, CheckName, CheckStatus, Report, WriteOp};
pub use run::{QualifyError, qualify};

use crate::{Error, Status};

/// The default image of the writer and reader pods: a shell and the coreutils applets the
/// scripts use (`head`, `sha256sum`, `truncate`, ...). Mirror it, or pass `--image`, where
/// Docker Hub is not reachable.
pub const DEFAULT_IMAGE: &str = "docker.io/library/busybox:1.37";

/// Arguments of `qualify`.
#[derive(Debug, clap::Args)]
pub struct QualifyArgs {
    /// The StorageClass to qualify (its provisioner is what a catalog entry names).
    #[arg(long, value_name = "NAME")]
    pub storage_class: String,
    /// Namespace of the writer (and of the same-namespace reader).
    #[arg(long, value_name = "NAMESPACE")]
    pub namespace_a: String,
    /// Namespace of the cross-namespace reader and of the negative control; not A.
    #[arg(long, value_name = "NAMESPACE")]
    pub namespace_b: String,
    /// Image of the writer and reader pods: needs a shell and coreutils (busybox has them).
    #[arg(long, default_value = DEFAULT_IMAGE, value_name = "IMAGE")]
    pub image: String,
    /// imagePullPolicy of those pods.
    #[arg(long, value_enum, default_value_t = PullPolicy::IfNotPresent)]
    pub image_pull_policy: PullPolicy,
    /// Access mode of the writer's claim; `auto` tries ReadWriteMany, then ReadWriteOnce when
    /// the provisioner refuses it.
    #[arg(long, value_enum, default_value_t = WriterMode::Auto)]
    pub writer_access_mode: WriterMode,
    /// The catalog provider the views are derived for (`nvmesh`: handles encode the namespace
    /// and are rewritten per reader). Default: the built-in catalog's entry for the class's
    /// provisioner, else none (handles reused).
    #[arg(long, value_name = "PROVIDER")]
    pub provider: Option<String>,
    /// Mount options of the read-only views on ReadWriteOnce storage (comma-separated; `ro`
    /// required). Default: the built-in catalog entry's readerMountOptions, else `ro`.
    /// ReadWriteMany views carry none, as the controller's.
    #[arg(long, value_delimiter = ',', value_name = "OPTION")]
    pub reader_mount_option: Vec<String>,
    /// Size of the claims.
    #[arg(long, default_value = "1Gi", value_name = "QUANTITY")]
    pub size: String,
    /// uid, gid and fsGroup of the pods (non-root: they pass Pod Security "restricted").
    #[arg(long, default_value_t = 65532, value_name = "UID")]
    pub run_as_user: i64,
    /// How long each step may take (a claim binding, a pod finishing, a detach).
    #[arg(long, default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    pub step_timeout: Duration,
    /// How long removing the run's objects may take before the leftovers are reported.
    #[arg(long, default_value = "2m", value_parser = parse_duration, value_name = "DURATION")]
    pub cleanup_timeout: Duration,
    /// Format of the report on standard output.
    #[arg(long, value_enum, default_value_t = OutputFormat::Json)]
    pub output: OutputFormat,
    /// Also write the JSON report to this file.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// The Kubernetes client and logging.
    #[command(flatten)]
    pub client: OneShotArgs,
}

/// `--image-pull-policy` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PullPolicy {
    /// Always pull.
    #[value(name = "Always")]
    Always,
    /// Pull when the node lacks the image.
    #[value(name = "IfNotPresent")]
    IfNotPresent,
    /// Never pull (the image must be on the node).
    #[value(name = "Never")]
    Never,
}

impl PullPolicy {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// `--writer-access-mode` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WriterMode {
    /// ReadWriteMany, then ReadWriteOnce when the provisioner refuses ReadWriteMany.
    #[value(name = "auto")]
    Auto,
    /// ReadWriteMany only.
    #[value(name = "ReadWriteMany")]
    ReadWriteMany,
    /// ReadWriteOnce only.
    #[value(name = "ReadWriteOnce")]
    ReadWriteOnce,
}

/// `--output` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// One JSON object.
    #[value(name = "json")]
    Json,
    /// Lines to read and to cite in a catalog change.
    #[value(name = "text")]
    Text,
}

/// The checked settings of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The StorageClass under test.
    pub storage_class: String,
    /// The writer's namespace.
    pub namespace_a: String,
    /// The cross-namespace reader's namespace.
    pub namespace_b: String,
    /// Image of every pod.
    pub image: String,
    /// Its pull policy.
    pub image_pull_policy: PullPolicy,
    /// Which writer access modes to try, in order.
    pub writer_modes: Vec<&'static str>,
    /// `--provider`, when given.
    pub provider: Option<String>,
    /// `--reader-mount-option`, when given.
    pub reader_mount_options: Option<Vec<String>>,
    /// Claim size.
    pub size: String,
    /// uid, gid and fsGroup of the pods.
    pub run_as_user: i64,
    /// Bound of each step.
    pub step_timeout: Duration,
    /// Bound of the cleanup.
    pub cleanup_timeout: Duration,
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-'))
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Checks the flags of `qualify`; each refusal names its flag.
pub fn settings(args: &QualifyArgs) -> Result<Settings, Error> {
    let refuse = |message: String| Err(Error::Setting(message));
    if !is_dns_subdomain(&args.storage_class) {
        return refuse(format!(
            "--storage-class {:?} is not a StorageClass name",
            args.storage_class
        ));
    }
    for (flag, ns) in [
        ("--namespace-a", &args.namespace_a),
        ("--namespace-b", &args.namespace_b),
    ] {
        if !is_dns_label(ns) {
            return refuse(format!("{flag} {ns:?} is not a namespace name"));
        }
    }
    if args.namespace_a == args.namespace_b {
        return refuse(format!(
            "--namespace-b {:?} must differ from --namespace-a: the reader must be in another namespace",
            args.namespace_b
        ));
    }
    if args.image.trim().is_empty() || args.image.chars().any(char::is_whitespace) {
        return refuse(format!(
            "--image {:?} is not an image reference",
            args.image
        ));
    }
    let size_ok = {
        let digits = args
            .size
            .trim_end_matches(['K', 'M', 'G', 'T', 'P', 'E', 'i']);
        !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && digits != "0"
    };
    if !size_ok {
        return refuse(format!(
            "--size {:?} is not a quantity such as 1Gi",
            args.size
        ));
    }
    if args.run_as_user <= 0 {
        return refuse(format!(
            "--run-as-user {} must be a non-root uid (Pod Security \"restricted\")",
            args.run_as_user
        ));
    }
    if let Some(provider) = &args.provider
        && (provider.trim().is_empty() || provider.trim() != provider)
    {
        return refuse(format!("--provider {provider:?} is blank or padded"));
    }
    let reader_mount_options = if args.reader_mount_option.is_empty() {
        None
    } else {
        for o in &args.reader_mount_option {
            // The derivation's own rule: a blank or writable option is dropped from a view.
            if warmcache_modelvolume::view_mount_options(&[], std::slice::from_ref(o)).is_empty() {
                return refuse(format!(
                    "--reader-mount-option {o:?} is blank or would make readers writable"
                ));
            }
        }
        if !args.reader_mount_option.iter().any(|o| o == "ro") {
            return refuse(
                "--reader-mount-option must include ro (read-only views of ReadWriteOnce storage are mounted ro)"
                    .to_owned(),
            );
        }
        Some(args.reader_mount_option.clone())
    };
    let writer_modes = match args.writer_access_mode {
        WriterMode::Auto => vec!["ReadWriteMany", "ReadWriteOnce"],
        WriterMode::ReadWriteMany => vec!["ReadWriteMany"],
        WriterMode::ReadWriteOnce => vec!["ReadWriteOnce"],
    };
    Ok(Settings {
        storage_class: args.storage_class.clone(),
        namespace_a: args.namespace_a.clone(),
        namespace_b: args.namespace_b.clone(),
        image: args.image.clone(),
        image_pull_policy: args.image_pull_policy,
        writer_modes,
        provider: args.provider.clone(),
        reader_mount_options,
        size: args.size.clone(),
        run_as_user: args.run_as_user,
        step_timeout: args.step_timeout,
        cleanup_timeout: args.cleanup_timeout,
    })
}

/// Runs `qualify`: the report goes to `out` (and `--report`), the verdict is the exit code.
pub fn run_command(args: QualifyArgs, out: &mut dyn std::io::Write) -> Result<Status, Error> {
    let settings = settings(&args)?;
    let runtime_args = args.client.clone().runtime_args();
    let report = warmcache_runtime::block_on(async move {
        let runtime = warmcache_runtime::Runtime::builder("binding-controller", runtime_args)
            .version(env!("CARGO_PKG_VERSION"))
            .with_client()
            .build()
            .await?;
        let client = runtime.client()?;
        let report = qualify(client, &settings, runtime.shutdown_token()).await;
        Ok::<_, Error>(report)
    })?;
    let report = report.map_err(|e| Error::Setting(e.to_string()))?;
    emit(&report, args.output, args.report.as_deref(), out)
}

/// Writes the report and turns it into the verdict: an interrupted run is no verdict (exit 2).
pub fn emit(
    report: &Report,
    format: OutputFormat,
    file: Option<&std::path::Path>,
    out: &mut dyn std::io::Write,
) -> Result<Status, Error> {
    let json = serde_json::to_string_pretty(report).map_err(std::io::Error::other)?;
    if let Some(path) = file {
        std::fs::write(path, format!("{json}\n")).map_err(|e| {
            Error::Output(std::io::Error::new(
                e.kind(),
                format!("--report {}: {e}", path.display()),
            ))
        })?;
    }
    match format {
        OutputFormat::Json => writeln!(out, "{json}")?,
        OutputFormat::Text => write!(out, "{}", report.text())?,
    }
    if let Some(reason) = &report.interrupted {
        return Err(Error::Setting(format!(
            "the run was interrupted ({reason}); its objects were removed (see the report's cleanup)"
        )));
    }
    Ok(if report.qualified {
        Status::Ok
    } else {
        Status::Refused
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Cli, Command};
    use clap::Parser;

    fn parse(extra: &[&str]) -> Result<QualifyArgs, clap::Error> {
        let mut argv = vec!["binding-controller", "qualify"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv)? {
            Cli {
                command: Command::Qualify(args),
            } => Ok(*args),
            other => panic!("{other:?}"),
        }
    }

    const BASE: [&str; 6] = [
        "--storage-class",
        "nvcf-sc",
        "--namespace-a",
        "team-a",
        "--namespace-b",
        "team-b",
    ];

    /// The base flags with `extra` added, a flag of the base replaced by the one in `extra`.
    fn with<'a>(extra: &[&'a str]) -> Vec<&'a str> {
        let mut v: Vec<&'a str> = Vec::new();
        for pair in BASE.chunks(2) {
            if !extra.contains(&pair[0]) {
                v.extend_from_slice(pair);
            }
        }
        v.extend_from_slice(extra);
        v
    }

    #[test]
    fn defaults_are_documented_values() {
        let s = settings(&parse(&BASE).unwrap()).unwrap();
        assert_eq!(s.image, DEFAULT_IMAGE);
        assert_eq!(s.image_pull_policy, PullPolicy::IfNotPresent);
        assert_eq!(s.writer_modes, ["ReadWriteMany", "ReadWriteOnce"]);
        assert_eq!(s.step_timeout, Duration::from_secs(300));
        assert_eq!(s.cleanup_timeout, Duration::from_secs(120));
        assert_eq!(s.size, "1Gi");
        assert_eq!(s.run_as_user, 65532);
        assert_eq!(s.provider, None);
        assert_eq!(s.reader_mount_options, None);
        let args = parse(&with(&[
            "--writer-access-mode",
            "ReadWriteOnce",
            "--provider",
            "nvmesh",
            "--reader-mount-option",
            "ro,norecovery,nouuid",
            "--image-pull-policy",
            "Never",
            "--output",
            "text",
        ]))
        .unwrap();
        assert_eq!(args.output, OutputFormat::Text);
        let s = settings(&args).unwrap();
        assert_eq!(s.writer_modes, ["ReadWriteOnce"]);
        assert_eq!(s.provider.as_deref(), Some("nvmesh"));
        assert_eq!(
            s.reader_mount_options,
            Some(vec!["ro".into(), "norecovery".into(), "nouuid".into()])
        );
        assert_eq!(s.image_pull_policy.as_str(), "Never");
    }

    #[test]
    fn required_flags_and_parse_errors_are_usage_errors() {
        for missing in [0, 2, 4] {
            let mut argv: Vec<&str> = BASE.to_vec();
            argv.drain(missing..missing + 2);
            let err = parse(&argv).unwrap_err();
            assert_eq!(err.exit_code(), 2);
            assert!(err.to_string().contains(BASE[missing]), "{err}");
        }
        for (bad, flag) in [
            (&["--step-timeout", "0s"][..], "--step-timeout"),
            (&["--step-timeout", "2d"], "--step-timeout"),
            (&["--cleanup-timeout", "90"], "--cleanup-timeout"),
            (
                &["--writer-access-mode", "ReadWriteOncePod"],
                "--writer-access-mode",
            ),
            (&["--output", "yaml"], "--output"),
            (&["--image-pull-policy", "never"], "--image-pull-policy"),
        ] {
            let err = parse(&with(bad)).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad:?}");
            assert!(err.to_string().contains(flag), "{bad:?}: {err}");
        }
    }

    #[test]
    fn unusable_values_are_refused_naming_the_flag() {
        for (bad, flag) in [
            (&["--namespace-b", "team-a"][..], "--namespace-b"),
            (&["--namespace-a", "Team_A"], "--namespace-a"),
            (&["--storage-class", "Not A Class"], "--storage-class"),
            (&["--size", "lots"], "--size"),
            (&["--size", "0"], "--size"),
            (&["--run-as-user", "0"], "--run-as-user"),
            (&["--image", ""], "--image"),
            (&["--provider", " nvmesh"], "--provider"),
            (&["--reader-mount-option", "ro,rw"], "--reader-mount-option"),
            (
                &["--reader-mount-option", "norecovery"],
                "--reader-mount-option",
            ),
        ] {
            let args = parse(&with(bad)).unwrap();
            let err = settings(&args).unwrap_err();
            assert_eq!(err.exit_code(), warmcache_cli::exit::UNUSABLE, "{bad:?}");
            assert!(err.to_string().contains(flag), "{bad:?}: {err}");
        }
    }
}
