//! The reaper: the only warmcache component that deletes, by the named rules of
//! [`warmcache_modelvolume::reaper`] (`docs/reaper.md` lists them with their defaults).
//!
//! ```text
//! reaper run   [--interval 10m] [--dry-run] [rule flags] [runtime and leader election flags]
//! reaper sweep [--dry-run] [rule flags] [--kubeconfig FILE]
//! ```
//!
//! `run` is the Deployment: one active replica (Lease), a sweep on start and then every
//! `--interval`. `sweep` is one sweep on demand (from a shell with a kubeconfig, or `kubectl exec`
//! into the reaper's pod), printing every action; with `--dry-run` it prints what each rule would
//! do and why, and writes nothing. A `sweep` next to a running Deployment is safe: every delete
//! carries the UID it read and NotFound is success.
//!
//! Exit codes ([`warmcache_cli::exit`]): 0 the sweep made every read and write it needed; 1 some
//! failed (each printed; their objects are left for the next sweep); 2 the flags or the
//! kubeconfig are unusable.

pub mod metrics;
pub mod rbac;
pub mod sweep;

use std::io::Write;
use std::time::Duration;

use clap::{Parser, Subcommand};
use k8s_openapi::jiff::Timestamp;
use warmcache_modelvolume::reaper::Config;
use warmcache_runtime::{LeaderElectionArgs, OneShotArgs, RuntimeArgs};

pub use sweep::{Report, Settings, Sweeper};

/// The component name: ServiceAccount, roles, metrics prefix, leader Lease.
pub const COMPONENT: &str = rbac::COMPONENT;

/// The reaper.
#[derive(Debug, Parser)]
#[command(name = "reaper", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Sweep on an interval (leader-elected) until SIGTERM or SIGINT.
    Run(Box<RunArgs>),
    /// One sweep now; prints every action (with --dry-run: what would be done) and exits.
    Sweep(Box<SweepArgs>),
}

/// The rules' settings (both commands).
#[derive(Clone, Debug, clap::Args)]
pub struct RuleArgs {
    /// The control namespace: ModelCacheBindings, primary claims, writer Leases.
    #[arg(long, default_value = warmcache_api_modelcache::DEFAULT_CONTROL_NAMESPACE)]
    pub control_namespace: String,
    /// idle-retirement: how long a binding stays without references before it is retired.
    #[arg(long, default_value = "1h", value_parser = parse_period, value_name = "DURATION")]
    pub idle_period: Duration,
    /// abandoned-primary: age (since creation) of a Released incomplete primary before its
    /// storage is deleted.
    #[arg(long, default_value = "15m", value_parser = parse_period, value_name = "DURATION")]
    pub abandon_after: Duration,
    /// expired-primary: how long a complete primary is kept after its last use; 0 keeps
    /// complete primaries forever.
    #[arg(long, default_value = "168h", value_parser = parse_period_or_zero, value_name = "DURATION")]
    pub retention: Duration,
    /// retired-binding: time between a binding becoming Retiring (or being deleted) and the
    /// deletion of what it names (admissions that read it while Active may still arrive).
    #[arg(long, default_value = "1m", value_parser = parse_period_or_zero, value_name = "DURATION")]
    pub retiring_grace: Duration,
    /// orphan-claim: age of a read-only view claim no pod uses before it is deleted.
    #[arg(long, default_value = "10m", value_parser = parse_period, value_name = "DURATION")]
    pub orphan_claim_after: Duration,
    /// Objects per list page (listing is paginated so a sweep's memory stays bounded).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=5000))]
    pub page_size: u32,
    /// How long a sweep waits for one retirement stage (claims detaching, Jobs going) before it
    /// leaves the binding for the next sweep.
    #[arg(long, default_value = "30s", value_parser = parse_period_or_zero, value_name = "DURATION")]
    pub stage_wait: Duration,
    /// Print what each rule would do and why; write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Arguments of `run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    #[command(flatten)]
    pub leader: LeaderElectionArgs,
    #[command(flatten)]
    pub rules: RuleArgs,
    /// Pause between sweeps.
    #[arg(long, default_value = "10m", value_parser = parse_period, value_name = "DURATION")]
    pub interval: Duration,
}

/// Arguments of `sweep`.
#[derive(Debug, clap::Args)]
pub struct SweepArgs {
    #[command(flatten)]
    pub client: OneShotArgs,
    #[command(flatten)]
    pub rules: RuleArgs,
}

/// Why the reaper could not run (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The runtime failed (kubeconfig, startup, a task).
    #[error(transparent)]
    Runtime(#[from] warmcache_runtime::RuntimeError),
    /// The report cannot be written.
    #[error("cannot write the report: {0}")]
    Output(#[from] std::io::Error),
}

impl Error {
    /// The process exit code.
    pub const fn exit_code(&self) -> u8 {
        warmcache_cli::exit::UNUSABLE
    }
}

const MAX_PERIOD_SECONDS: u64 = 10 * 366 * 24 * 3600;

/// Parses a period: a whole number and a unit `s`, `m`, `h` or `d` (`90s`, `15m`, `168h`,
/// `7d`), greater than zero and at most ten years.
pub fn parse_period(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?}: expected a whole number and s, m, h or d (e.g. 15m)"))?;
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: the unit must be s, m, h or d")),
    };
    let seconds = n
        .checked_mul(scale)
        .filter(|s| *s <= MAX_PERIOD_SECONDS)
        .ok_or_else(|| format!("{text:?} is longer than ten years"))?;
    if seconds == 0 {
        return Err(format!("{text:?} must be greater than zero"));
    }
    Ok(Duration::from_secs(seconds))
}

/// [`parse_period`], also taking `0` (with or without a unit).
pub fn parse_period_or_zero(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t.trim_end_matches(['s', 'm', 'h', 'd'])
        .chars()
        .all(|c| c == '0')
        && t.starts_with('0')
    {
        return Ok(Duration::ZERO);
    }
    parse_period(text)
}

fn seconds(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

impl RuleArgs {
    /// The sweep settings these flags give.
    pub fn settings(&self) -> Settings {
        Settings {
            config: Config {
                control_namespace: self.control_namespace.clone(),
                idle_seconds: seconds(self.idle_period),
                abandon_after_seconds: seconds(self.abandon_after),
                retention_seconds: seconds(self.retention),
                orphan_claim_after_seconds: seconds(self.orphan_claim_after),
                retiring_grace_seconds: seconds(self.retiring_grace),
            },
            dry_run: self.dry_run,
            page_size: self.page_size,
            stage_wait: self.stage_wait,
        }
    }
}

/// Runs `cli`; `Ok` carries the exit code (0 or 1, see the crate documentation).
///
/// # Errors
///
/// The runtime cannot start (kubeconfig, admin port) or the report cannot be written.
pub fn run(cli: Cli, out: &mut dyn Write) -> Result<u8, Error> {
    match cli.command {
        Command::Run(args) => {
            serve(*args)?;
            Ok(warmcache_cli::exit::OK)
        }
        Command::Sweep(args) => sweep_once(*args, out),
    }
}

fn sweep_once(args: SweepArgs, out: &mut dyn Write) -> Result<u8, Error> {
    let settings = args.rules.settings();
    let report = warmcache_runtime::block_on(async move {
        let runtime = warmcache_runtime::Runtime::builder(COMPONENT, args.client.runtime_args())
            .version(env!("CARGO_PKG_VERSION"))
            .with_client()
            .build()
            .await?;
        let sweeper = Sweeper::new(runtime.client()?, settings, None, None, None);
        let report = sweeper.sweep(Timestamp::now()).await;
        runtime.shutdown_token().cancel();
        runtime.run().await?;
        Ok::<_, warmcache_runtime::RuntimeError>(report)
    })?;
    for line in &report.lines {
        writeln!(out, "{line}")?;
    }
    for error in &report.errors {
        writeln!(out, "error: {error}")?;
    }
    writeln!(out, "{}", report.summary())?;
    Ok(if report.errors.is_empty() {
        warmcache_cli::exit::OK
    } else {
        warmcache_cli::exit::REFUSED
    })
}

fn serve(args: RunArgs) -> Result<(), Error> {
    let settings = args.rules.settings();
    let interval = args.interval;
    warmcache_runtime::block_on(async move {
        let mut runtime = warmcache_runtime::Runtime::builder(COMPONENT, args.runtime)
            .version(env!("CARGO_PKG_VERSION"))
            .with_leader_election(args.leader)
            .build()
            .await?;
        start(&mut runtime, settings, interval)?;
        runtime.run().await
    })?;
    Ok(())
}

/// Starts the sweep loop on `runtime`: while this replica leads, a sweep at once and then every
/// `interval`; a drain stops it (a sweep cut short is finished by the next one).
///
/// # Errors
///
/// The runtime has no client, or the metrics cannot be registered.
pub fn start(
    runtime: &mut warmcache_runtime::Runtime,
    settings: Settings,
    interval: Duration,
) -> Result<(), warmcache_runtime::RuntimeError> {
    let metrics = metrics::Metrics::register(runtime.metrics().registry()).map_err(|err| {
        warmcache_runtime::RuntimeError::Task {
            task: "reaper metrics".to_owned(),
            message: err.to_string(),
        }
    })?;
    let leadership = runtime.leadership();
    let sweeper = Sweeper::new(
        runtime.client()?,
        settings,
        Some(metrics),
        runtime.recorder().cloned(),
        Some(leadership.clone()),
    );
    let stop = runtime.drain_token();
    runtime.spawn("sweep", async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok::<(), std::convert::Infallible>(()),
                () = leadership.wait_until_leader() => {}
            }
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                _ = sweeper.sweep(Timestamp::now()) => {}
            }
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                () = tokio::time::sleep(interval) => {}
            }
        }
    });
    Ok(())
}

/// The defaults of the rules, as `docs/reaper.md` states them (checked by a test).
pub fn default_config() -> Config {
    Config::new(warmcache_api_modelcache::DEFAULT_CONTROL_NAMESPACE)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use warmcache_modelvolume::reaper;

    fn sweep_args(extra: &[&str]) -> Result<SweepArgs, clap::Error> {
        let mut argv = vec!["reaper", "sweep"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).map(|cli| match cli.command {
            Command::Sweep(a) => *a,
            Command::Run(_) => panic!("run"),
        })
    }

    #[test]
    fn the_flag_defaults_are_the_rules_defaults() {
        let s = sweep_args(&[]).unwrap().rules.settings();
        assert_eq!(s.config, default_config());
        assert_eq!(s.config.idle_seconds, reaper::DEFAULT_IDLE_SECONDS);
        assert!(!s.dry_run);
        let run = Cli::try_parse_from(["reaper", "run"]).unwrap();
        let Command::Run(r) = run.command else {
            panic!("sweep")
        };
        assert_eq!(
            r.interval.as_secs(),
            reaper::DEFAULT_INTERVAL_SECONDS,
            "the interval default"
        );
    }

    #[test]
    fn periods_take_days_and_zero_only_where_it_means_forever() {
        assert_eq!(parse_period("168h").unwrap().as_secs(), 168 * 3600);
        assert_eq!(parse_period("7d").unwrap().as_secs(), 7 * 86_400);
        assert_eq!(parse_period_or_zero("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_period_or_zero("0h").unwrap(), Duration::ZERO);
        assert_eq!(parse_period_or_zero("10m").unwrap().as_secs(), 600);
        for bad in ["", "h", "10", "10w", "-1h", "1.5h", "99999999999d", "0s"] {
            assert!(parse_period(bad).is_err(), "{bad}");
        }
        let forever = sweep_args(&["--retention", "0"]).unwrap().rules.settings();
        assert_eq!(forever.config.retention_seconds, 0);
        let err = sweep_args(&["--idle-period", "0"]).unwrap_err().to_string();
        assert!(err.contains("--idle-period"), "{err}");
        assert!(sweep_args(&["--page-size", "0"]).is_err());
    }
}
