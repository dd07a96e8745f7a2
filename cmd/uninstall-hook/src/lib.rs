//! `uninstall-hook`: the chart's Helm `pre-delete` Job. Run before Helm deletes the release's
//! objects, while the components still run, it leaves nothing stuck Terminating:
//!
//! 1. **KVCacheBackends**: deletes every one (cluster-scoped) and waits, at most
//!    `--backend-timeout`, until the kvcache operator has finished their teardown (its
//!    finalizer goes when the tier is empty); `--force` removes the operator's finalizer instead
//!    of waiting. `--kvcache-backends=false` skips the step (the operator is not part of the
//!    release: its backends are not ours to delete).
//! 2. **ModelCacheBindings**: removes the finalizer [`warmcache_api_modelcache::FINALIZER`] of
//!    every binding in the control namespace (a JSON patch guarded by a test of the finalizer
//!    list, `warmcache_kube::remove_finalizer`).
//! 3. **The control namespace**: deletes it and waits, at most `--namespace-timeout`, until it is
//!    gone, removing the binding finalizer again from any binding that got one meanwhile (the
//!    webhook may still create bindings until the namespace is Terminating).
//!    `--delete-namespace=false` skips the deletion (the namespace was not created by the chart).
//!
//! The steps run in this order and a step that does not finish stops the run: the namespace is
//! never deleted while a binding still holds a finalizer. Then the PersistentVolumes that keep
//! the model data (labelled `app.kubernetes.io/managed-by=warmcache`, or bound to a claim of the
//! control namespace) are listed with the command that removes them: they are kept on purpose,
//! never deleted here.
//!
//! Idempotent: an object already gone (NotFound) is done, so a second run after a failure
//! finishes the job. Exit codes ([`warmcache_cli::exit`]): 0 everything was done; 1 something is
//! left (each object named, with its finalizers and why: timeout, API error, interrupted); 2 the
//! flags or the kubeconfig are unusable, or the output cannot be written.
//!
//! Telemetry: a span per step (`backends`, `bindings`, `namespace`, `retained`), exported
//! through the standard `OTEL_*` variables like every component; no metrics: a one-shot Job is
//! gone before anything would scrape it (the runtime's admin server listens on an ephemeral
//! loopback port only). No leader election: Helm runs one Job.

pub mod rbac;
pub mod report;
pub mod steps;

use std::io::Write;
use std::time::Duration;

use clap::Parser;
use warmcache_runtime::{OneShotArgs, parse_duration};

pub use report::Report;
pub use steps::uninstall;

/// The component name: its ServiceAccount and roles are `warmcache-uninstall-hook`.
pub const COMPONENT: &str = rbac::COMPONENT;

/// The Helm pre-delete hook of warmcache.
#[derive(Debug, Parser)]
#[command(name = "uninstall-hook", version, about, long_about = None)]
pub struct Cli {
    /// The control namespace (ModelCacheBindings and primary claims).
    #[arg(
        long,
        env = "WARMCACHE_CONTROL_NAMESPACE",
        default_value = warmcache_api_modelcache::DEFAULT_CONTROL_NAMESPACE,
        value_name = "NAMESPACE"
    )]
    pub control_namespace: String,
    /// Delete every KVCacheBackend and wait for the operator's teardown (false: the kvcache
    /// operator is not part of this release; backends are left alone).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub kvcache_backends: bool,
    /// Delete the control namespace once its bindings hold no finalizer (false: the namespace
    /// was not created by the chart).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub delete_namespace: bool,
    /// Remove the kvcache operator's finalizer from the KVCacheBackends instead of waiting for
    /// their teardown (the tier directories on the nodes are then not emptied).
    #[arg(long, env = "WARMCACHE_UNINSTALL_FORCE")]
    pub force: bool,
    /// How long the operator may take to tear the KVCacheBackends down.
    #[arg(long, default_value = "2m", value_parser = parse_duration, value_name = "DURATION")]
    pub backend_timeout: Duration,
    /// How long the control namespace may take to go once deleted.
    #[arg(long, default_value = "90s", value_parser = parse_duration, value_name = "DURATION")]
    pub namespace_timeout: Duration,
    /// Pause between two looks at what is left.
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub poll_interval: Duration,
    /// The Kubernetes client and logging.
    #[command(flatten)]
    pub client: OneShotArgs,
}

/// The checked settings of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The control namespace.
    pub control_namespace: String,
    /// Whether step 1 runs.
    pub kvcache_backends: bool,
    /// Whether the control namespace is deleted.
    pub delete_namespace: bool,
    /// Strip the backends' finalizer instead of waiting.
    pub force: bool,
    /// Bound of the backends' teardown.
    pub backend_timeout: Duration,
    /// Bound of the namespace's deletion.
    pub namespace_timeout: Duration,
    /// Pause between polls.
    pub poll_interval: Duration,
}

/// The flags cannot be used, the client cannot be configured, or the output cannot be written
/// (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag value is not usable.
    #[error("{0}")]
    Setting(String),
    /// The runtime (logging, the Kubernetes client) could not start.
    #[error(transparent)]
    Runtime(#[from] warmcache_runtime::RuntimeError),
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

/// Whether `name` is a namespace name (an RFC 1123 label).
fn is_namespace_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-'))
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// The settings of a command line, checked.
pub fn settings(cli: &Cli) -> Result<Settings, Error> {
    if !is_namespace_name(&cli.control_namespace) {
        return Err(Error::Setting(format!(
            "--control-namespace {:?} is not a namespace name",
            cli.control_namespace
        )));
    }
    if cli.poll_interval > cli.backend_timeout.min(cli.namespace_timeout) {
        return Err(Error::Setting(
            "--poll-interval must not be longer than --backend-timeout and --namespace-timeout"
                .to_owned(),
        ));
    }
    Ok(Settings {
        control_namespace: cli.control_namespace.clone(),
        kvcache_backends: cli.kvcache_backends,
        delete_namespace: cli.delete_namespace,
        force: cli.force,
        backend_timeout: cli.backend_timeout,
        namespace_timeout: cli.namespace_timeout,
        poll_interval: cli.poll_interval,
    })
}

/// Runs the hook: the report goes to `out` as the steps happen, its last line the summary.
/// `Ok` carries the verdict: [`Report::code`] is 0 when everything was done, 1 when something
/// is left.
pub fn run(cli: Cli, out: &mut dyn Write) -> Result<Report, Error> {
    let settings = settings(&cli)?;
    let runtime_args = cli.client.runtime_args();
    warmcache_runtime::block_on(async move {
        let runtime = warmcache_runtime::Runtime::builder(COMPONENT, runtime_args)
            .version(env!("CARGO_PKG_VERSION"))
            .with_client()
            .build()
            .await?;
        let client = runtime.client()?;
        let stop = runtime.shutdown_token();
        let report = uninstall(client, &settings, stop.clone(), out).await?;
        // Nothing else runs: stopping now only flushes the traces.
        stop.cancel();
        runtime.run().await?;
        Ok(report)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Result<Cli, clap::Error> {
        let mut argv = vec!["uninstall-hook"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv)
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let s = settings(&parse(&[]).unwrap()).unwrap();
        assert_eq!(
            s,
            Settings {
                control_namespace: "nvca-modelcache-init".to_owned(),
                kvcache_backends: true,
                delete_namespace: true,
                force: false,
                backend_timeout: Duration::from_secs(120),
                namespace_timeout: Duration::from_secs(90),
                poll_interval: Duration::from_secs(1),
            }
        );
        let s = settings(
            &parse(&[
                "--control-namespace",
                "cache-ctl",
                "--force",
                "--kvcache-backends=false",
                "--delete-namespace",
                "false",
                "--backend-timeout",
                "5m",
                "--namespace-timeout",
                "30s",
                "--poll-interval",
                "200ms",
            ])
            .unwrap(),
        )
        .unwrap();
        assert_eq!(s.control_namespace, "cache-ctl");
        assert!(s.force && !s.kvcache_backends && !s.delete_namespace);
        assert_eq!(s.backend_timeout, Duration::from_secs(300));
        assert_eq!(s.namespace_timeout, Duration::from_secs(30));
        assert_eq!(s.poll_interval, Duration::from_millis(200));
    }

    #[test]
    fn bad_flags_are_refused_with_exit_code_2() {
        for bad in [
            &["--backend-timeout", "0s"][..],
            &["--namespace-timeout", "soon"],
            &["--kvcache-backends", "maybe"],
            &["--unknown"],
        ] {
            let err = parse(bad).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad:?}");
        }
        for bad in [
            &["--control-namespace", "Not_A_Namespace"][..],
            &["--poll-interval", "5m"],
        ] {
            let err = settings(&parse(bad).unwrap()).unwrap_err();
            assert_eq!(err.exit_code(), warmcache_cli::exit::UNUSABLE);
            assert!(err.to_string().contains(bad[0]), "{err}");
        }
    }
}
