//! The command-line flags every component shares, as clap argument groups a binary flattens into
//! its own command.
//!
//! ```
//! # use clap::Parser;
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     runtime: warmcache_runtime::RuntimeArgs,
//!     #[command(flatten)]
//!     leader: warmcache_runtime::LeaderElectionArgs,
//! }
//! let cli = Cli::parse_from(["binding-controller", "--log-format", "plain"]);
//! assert_eq!(cli.runtime.admin_listen.port(), 8080);
//! assert!(cli.leader.leader_elect);
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgMatches, Args, FromArgMatches};
use warmcache_kube::LeaseConfig;
use warmcache_telemetry::LogFormat;

/// The default of `--kube-api-qps`: requests a second the client sends at most, once its burst
/// is spent.
pub const DEFAULT_KUBE_API_QPS: f32 = 20.0;

/// The default of `--kube-api-burst`: requests the client may send at once.
pub const DEFAULT_KUBE_API_BURST: u32 = 40;

/// Flags of every component: the Kubernetes client, logging, the admin server and shutdown.
///
/// OpenTelemetry is configured with the standard `OTEL_*` environment variables (see
/// `docs/operations.md`), not with flags. Parsed as a clap argument group (flatten it), with
/// the client's rate limit checked as a whole: `--kube-api-burst 0` with a positive
/// `--kube-api-qps` is a usage error.
#[derive(Clone, Debug)]
pub struct RuntimeArgs {
    /// `--kubeconfig`: the kubeconfig file. Without it, `$KUBECONFIG` or `~/.kube/config` when
    /// present, else the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    /// `--kube-context`: the kubeconfig context to use instead of the current one.
    pub kube_context: Option<String>,
    /// `--log-level`: the log filter (RUST_LOG syntax); overrides RUST_LOG.
    pub log_level: Option<String>,
    /// `--log-format`: plain or json.
    pub log_format: LogFormat,
    /// `--admin-listen`: the address of the admin server (/metrics, /livez, /readyz).
    pub admin_listen: SocketAddr,
    /// `--shutdown-grace`: after SIGTERM or SIGINT, how long in-flight work may take to finish.
    pub shutdown_grace: Duration,
    /// `--shutdown-delay`: webhook servers only, how long `/readyz` fails after SIGTERM while
    /// the server still accepts.
    pub shutdown_delay: Duration,
    /// `--kube-api-qps`: requests a second the client sends at most once its burst is spent
    /// (a token bucket in front of every request); 0 is no limit. Default
    /// [`DEFAULT_KUBE_API_QPS`].
    pub kube_api_qps: f32,
    /// `--kube-api-burst`: requests the client may send at once (the bucket's size). Default
    /// [`DEFAULT_KUBE_API_BURST`].
    pub kube_api_burst: u32,
}

/// The command line of [`RuntimeArgs`]: the same fields, with their flags and help; converted
/// once the whole group is parsed and checked.
#[derive(Clone, Debug, Args)]
#[group(id = "RuntimeArgs")]
struct RuntimeFlags {
    /// Kubeconfig file. Without it, `$KUBECONFIG` or `~/.kube/config` when present, else the
    /// in-cluster service account.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use instead of the current one.
    #[arg(long = "kube-context", value_name = "NAME")]
    kube_context: Option<String>,
    /// Log filter (RUST_LOG syntax, e.g. `info,warmcache=debug`); overrides RUST_LOG.
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
    /// Log format: plain or json.
    #[arg(
        long,
        env = "WARMCACHE_LOG_FORMAT",
        default_value = "json",
        value_name = "FORMAT"
    )]
    log_format: LogFormat,
    /// Address of the admin server (/metrics, /livez, /readyz).
    #[arg(long, default_value = "0.0.0.0:8080", value_name = "ADDR")]
    admin_listen: SocketAddr,
    /// After SIGTERM or SIGINT, how long in-flight work (admission reviews, reconciles) may
    /// take to finish before the process exits anyway. Keep it below the pod's
    /// terminationGracePeriodSeconds (30 s by default).
    #[arg(
        long,
        default_value = "20s",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    shutdown_grace: Duration,
    /// Webhook servers only: after SIGTERM, how long `/readyz` fails while the server still
    /// accepts, so the API server stops sending reviews to this replica before its port closes
    /// (endpoint removal takes a few seconds to propagate). `0s` closes at once.
    #[arg(
        long,
        default_value = "5s",
        value_parser = parse_duration_or_zero,
        value_name = "DURATION"
    )]
    shutdown_delay: Duration,
    /// Requests a second the Kubernetes client sends at most once its burst is spent (a token
    /// bucket in front of every request, watches counted when opened; waiting requests go in
    /// arrival order). `0` turns the limit off.
    #[arg(
        long,
        default_value_t = DEFAULT_KUBE_API_QPS,
        value_parser = parse_qps,
        allow_negative_numbers = true,
        value_name = "QPS"
    )]
    kube_api_qps: f32,
    /// Requests the Kubernetes client may send at once before `--kube-api-qps` paces them (the
    /// token bucket's size). At least 1 unless `--kube-api-qps` is 0.
    #[arg(long, default_value_t = DEFAULT_KUBE_API_BURST, value_name = "N")]
    kube_api_burst: u32,
}

impl RuntimeFlags {
    /// The flags as [`RuntimeArgs`], once they fit together.
    fn checked(self) -> Result<RuntimeArgs, clap::Error> {
        if self.kube_api_burst == 0 && self.kube_api_qps > 0.0 {
            return Err(clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!(
                    "invalid value '0' for '--kube-api-burst <N>': the client's token bucket must hold at least 1 request while --kube-api-qps is {} (--kube-api-qps 0 turns the limit off)",
                    self.kube_api_qps
                ),
            ));
        }
        Ok(RuntimeArgs {
            kubeconfig: self.kubeconfig,
            kube_context: self.kube_context,
            log_level: self.log_level,
            log_format: self.log_format,
            admin_listen: self.admin_listen,
            shutdown_grace: self.shutdown_grace,
            shutdown_delay: self.shutdown_delay,
            kube_api_qps: self.kube_api_qps,
            kube_api_burst: self.kube_api_burst,
        })
    }
}

impl From<RuntimeArgs> for RuntimeFlags {
    fn from(args: RuntimeArgs) -> Self {
        Self {
            kubeconfig: args.kubeconfig,
            kube_context: args.kube_context,
            log_level: args.log_level,
            log_format: args.log_format,
            admin_listen: args.admin_listen,
            shutdown_grace: args.shutdown_grace,
            shutdown_delay: args.shutdown_delay,
            kube_api_qps: args.kube_api_qps,
            kube_api_burst: args.kube_api_burst,
        }
    }
}

impl Args for RuntimeArgs {
    fn group_id() -> Option<clap::Id> {
        RuntimeFlags::group_id()
    }

    fn augment_args(cmd: clap::Command) -> clap::Command {
        RuntimeFlags::augment_args(cmd)
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        RuntimeFlags::augment_args_for_update(cmd)
    }
}

impl FromArgMatches for RuntimeArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        Self::from_arg_matches_mut(&mut matches.clone())
    }

    fn from_arg_matches_mut(matches: &mut ArgMatches) -> Result<Self, clap::Error> {
        RuntimeFlags::from_arg_matches_mut(matches)?.checked()
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        self.update_from_arg_matches_mut(&mut matches.clone())
    }

    fn update_from_arg_matches_mut(&mut self, matches: &mut ArgMatches) -> Result<(), clap::Error> {
        let mut flags = RuntimeFlags::from(self.clone());
        flags.update_from_arg_matches_mut(matches)?;
        *self = flags.checked()?;
        Ok(())
    }
}

/// Flags of a one-shot command (`binding-controller qualify`, `uninstall-hook`): the Kubernetes
/// client and logging only, plain logs on standard error by default. Nothing scrapes a one-shot
/// run, so [`OneShotArgs::runtime_args`] puts the admin server on an ephemeral loopback port.
#[derive(Clone, Debug, Args)]
pub struct OneShotArgs {
    /// Kubeconfig file. Without it, `$KUBECONFIG` or `~/.kube/config` when present, else the
    /// in-cluster service account.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use instead of the current one.
    #[arg(long = "kube-context", value_name = "NAME")]
    pub kube_context: Option<String>,
    /// Log filter (RUST_LOG syntax); logs go to standard error, reports to standard output.
    #[arg(long, value_name = "FILTER")]
    pub log_level: Option<String>,
    /// Log format: plain or json.
    #[arg(
        long,
        env = "WARMCACHE_LOG_FORMAT",
        default_value = "plain",
        value_name = "FORMAT"
    )]
    pub log_format: LogFormat,
}

impl OneShotArgs {
    /// The runtime's arguments for a one-shot run: the admin server on an ephemeral loopback
    /// port, 1 s of shutdown grace, no shutdown delay, the default client rate limit.
    pub fn runtime_args(self) -> RuntimeArgs {
        RuntimeArgs {
            kubeconfig: self.kubeconfig,
            kube_context: self.kube_context,
            log_level: self.log_level,
            log_format: self.log_format,
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            shutdown_grace: Duration::from_secs(1),
            shutdown_delay: Duration::ZERO,
            kube_api_qps: DEFAULT_KUBE_API_QPS,
            kube_api_burst: DEFAULT_KUBE_API_BURST,
        }
    }
}

/// Flags of components that lead through a Lease (controllers, the reaper). Webhooks and the
/// admin server run on every replica regardless.
#[derive(Clone, Debug, Args)]
pub struct LeaderElectionArgs {
    /// Elect a leader through a Lease before reconciling. `--leader-elect=false` runs every
    /// replica as leader: only for a single replica.
    #[arg(
        long,
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub leader_elect: bool,
    /// Namespace of the Lease (default: the pod's namespace from `$POD_NAMESPACE`).
    #[arg(long, env = "POD_NAMESPACE", value_name = "NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// Name of the Lease (default: the component name).
    #[arg(long, value_name = "NAME")]
    pub leader_election_lease: Option<String>,
    /// This replica's identity in the Lease (default: `$POD_NAME`, else the host name). Must be
    /// unique per replica.
    #[arg(long, env = "POD_NAME", value_name = "ID")]
    pub leader_election_identity: Option<String>,
    /// How long a Lease stays valid without renewal before another replica takes over.
    #[arg(long, default_value = "15s", value_parser = parse_duration, value_name = "DURATION")]
    pub leader_election_lease_duration: Duration,
    /// How long the leader keeps leading without a successful renewal.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub leader_election_renew_deadline: Duration,
    /// Pause between attempts to acquire or renew the Lease.
    #[arg(long, default_value = "2s", value_parser = parse_duration, value_name = "DURATION")]
    pub leader_election_retry_period: Duration,
}

impl LeaderElectionArgs {
    /// The Lease timing, checked (`retry < renew < lease`).
    pub fn lease_config(&self) -> Result<LeaseConfig, warmcache_kube::LeaderElectionError> {
        let config = LeaseConfig {
            lease_duration: self.leader_election_lease_duration,
            renew_deadline: self.leader_election_renew_deadline,
            retry_period: self.leader_election_retry_period,
        };
        config.validate()?;
        Ok(config)
    }
}

/// Flags of components that serve admission webhooks.
#[derive(Clone, Debug, Args)]
pub struct AdmissionArgs {
    /// Directory holding tls.crt and tls.key (a mounted kubernetes.io/tls Secret); reloaded
    /// when they change.
    #[arg(long, value_name = "DIR")]
    pub tls_dir: PathBuf,
    /// Address of the HTTPS webhook server.
    #[arg(long, default_value = "0.0.0.0:9443", value_name = "ADDR")]
    pub listen: SocketAddr,
}

/// Parses a duration flag: a whole number followed by `ms`, `s`, `m` or `h` (`500ms`, `15s`,
/// `2m`, `1h`). Zero and values over a day are refused.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit: write e.g. 15s, 500ms, 2m or 1h"))?;
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(format!(
            "{text:?} does not start with a number: write e.g. 15s"
        ));
    }
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{number:?} is too large"))?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?}: use ms, s, m or h"
            ));
        }
    };
    let millis = value
        .checked_mul(millis_per_unit)
        .ok_or_else(|| format!("{text:?} is too large"))?;
    if millis == 0 {
        return Err(format!("{text:?} must be greater than zero"));
    }
    if millis > 86_400_000 {
        return Err(format!("{text:?} is longer than a day"));
    }
    Ok(Duration::from_millis(millis))
}

/// Parses `--kube-api-qps`: a finite number, 0 or more (0: no limit).
pub fn parse_qps(text: &str) -> Result<f32, String> {
    let qps: f32 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of requests a second"))?;
    if !qps.is_finite() {
        return Err(format!("{text:?} is not a finite number"));
    }
    if qps < 0.0 {
        return Err(format!("{text:?} is negative: use 0 to turn the limit off"));
    }
    // -0 is 0.
    Ok(qps.abs())
}

/// Like [`parse_duration`], also taking `0s` (and `0`, `0ms`) for "none".
pub fn parse_duration_or_zero(text: &str) -> Result<Duration, String> {
    if matches!(text.trim(), "0" | "0s" | "0ms") {
        return Ok(Duration::ZERO);
    }
    parse_duration(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        runtime: RuntimeArgs,
        #[command(flatten)]
        leader: LeaderElectionArgs,
        #[command(flatten)]
        admission: AdmissionArgs,
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in [
            "",
            "15",
            "s",
            "0s",
            "-1s",
            "1.5s",
            "15 s",
            "15sec",
            "25h",
            "99999999999999999999s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn defaults_and_overrides() {
        let cli = Cli::parse_from(["x", "--tls-dir", "/certs"]);
        assert_eq!(cli.runtime.admin_listen, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(cli.runtime.shutdown_grace, Duration::from_secs(20));
        assert_eq!(cli.runtime.shutdown_delay, Duration::from_secs(5));
        assert_eq!(parse_duration_or_zero("0s"), Ok(Duration::ZERO));
        assert!(parse_duration_or_zero("-0s").is_err());
        assert_eq!(cli.admission.listen, "0.0.0.0:9443".parse().unwrap());
        assert!(cli.leader.leader_elect);
        assert_eq!(
            cli.leader.lease_config().unwrap(),
            LeaseConfig::default(),
            "the flag defaults are client-go's"
        );
        let cli = Cli::parse_from([
            "x",
            "--tls-dir",
            "/certs",
            "--leader-elect=false",
            "--log-format",
            "plain",
            "--leader-election-lease-duration",
            "4s",
            "--leader-election-renew-deadline",
            "3s",
            "--leader-election-retry-period",
            "500ms",
        ]);
        assert!(!cli.leader.leader_elect);
        assert_eq!(cli.runtime.log_format, LogFormat::Plain);
        assert_eq!(
            cli.leader.lease_config().unwrap().retry_period,
            Duration::from_millis(500)
        );
    }

    #[test]
    fn client_rate_limit_flags() {
        let cli = Cli::parse_from(["x", "--tls-dir", "/c"]);
        assert_eq!(cli.runtime.kube_api_qps, DEFAULT_KUBE_API_QPS);
        assert_eq!(cli.runtime.kube_api_burst, DEFAULT_KUBE_API_BURST);
        assert_eq!((DEFAULT_KUBE_API_QPS, DEFAULT_KUBE_API_BURST), (20.0, 40));
        let cli = Cli::parse_from([
            "x",
            "--tls-dir",
            "/c",
            "--kube-api-qps",
            "5.5",
            "--kube-api-burst",
            "1",
        ]);
        assert_eq!(cli.runtime.kube_api_qps, 5.5);
        assert_eq!(cli.runtime.kube_api_burst, 1);
        // 0 turns the limit off; the burst does not matter then.
        for off in [
            &["--kube-api-qps", "0"][..],
            &["--kube-api-qps=0", "--kube-api-burst", "0"],
            &["--kube-api-qps", "-0"],
        ] {
            let cli = Cli::try_parse_from(["x", "--tls-dir", "/c"].iter().chain(off)).unwrap();
            assert_eq!(cli.runtime.kube_api_qps, 0.0, "{off:?}");
            assert!(cli.runtime.kube_api_qps.is_sign_positive(), "{off:?}");
        }
    }

    #[test]
    fn bad_client_rate_limits_are_usage_errors_naming_the_flag() {
        for (bad, flag) in [
            (&["--kube-api-qps", "-1"][..], "--kube-api-qps"),
            (&["--kube-api-qps=-0.5"], "--kube-api-qps"),
            (&["--kube-api-qps", "NaN"], "--kube-api-qps"),
            (&["--kube-api-qps", "inf"], "--kube-api-qps"),
            (&["--kube-api-qps=-inf"], "--kube-api-qps"),
            (&["--kube-api-qps", "1e39"], "--kube-api-qps"),
            (&["--kube-api-qps", "fast"], "--kube-api-qps"),
            (&["--kube-api-qps", ""], "--kube-api-qps"),
            (&["--kube-api-burst", "0"], "--kube-api-burst"),
            (
                &["--kube-api-qps", "3", "--kube-api-burst", "0"],
                "--kube-api-burst",
            ),
            (&["--kube-api-burst=-1"], "--kube-api-burst"),
            (&["--kube-api-burst", "4294967296"], "--kube-api-burst"),
        ] {
            let err = Cli::try_parse_from(["x", "--tls-dir", "/c"].iter().chain(bad))
                .map(|_| ())
                .unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad:?}: {err}");
            let text = err.to_string();
            assert!(text.contains(flag), "{bad:?}: {text}");
        }
    }

    #[test]
    fn an_update_is_checked_too() {
        let mut cli = Cli::parse_from(["x", "--tls-dir", "/c"]);
        cli.try_update_from(["x", "--kube-api-qps", "0", "--kube-api-burst", "0"])
            .unwrap();
        assert_eq!(
            (cli.runtime.kube_api_qps, cli.runtime.kube_api_burst),
            (0.0, 0)
        );
        let err = cli
            .try_update_from(["x", "--kube-api-qps", "3", "--kube-api-burst", "0"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--kube-api-burst"), "{err}");
    }

    #[test]
    fn inconsistent_lease_timing_is_refused() {
        let cli = Cli::parse_from([
            "x",
            "--tls-dir",
            "/certs",
            "--leader-election-renew-deadline",
            "20s",
        ]);
        let err = cli.leader.lease_config().unwrap_err().to_string();
        assert!(err.contains("renew_deadline"), "{err}");
        assert!(Cli::try_parse_from(["x", "--tls-dir", "/c", "--shutdown-grace", "0s"]).is_err());
    }
}
