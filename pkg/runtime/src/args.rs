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

use clap::Args;
use warmcache_kube::LeaseConfig;
use warmcache_telemetry::LogFormat;

/// Flags of every component: the Kubernetes client, logging, the admin server and shutdown.
///
/// OpenTelemetry is configured with the standard `OTEL_*` environment variables (see
/// `docs/operations.md`), not with flags.
#[derive(Clone, Debug, Args)]
pub struct RuntimeArgs {
    /// Kubeconfig file. Without it, `$KUBECONFIG` or `~/.kube/config` when present, else the
    /// in-cluster service account.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use instead of the current one.
    #[arg(long = "kube-context", value_name = "NAME")]
    pub kube_context: Option<String>,
    /// Log filter (RUST_LOG syntax, e.g. `info,warmcache=debug`); overrides RUST_LOG.
    #[arg(long, value_name = "FILTER")]
    pub log_level: Option<String>,
    /// Log format: plain or json.
    #[arg(
        long,
        env = "WARMCACHE_LOG_FORMAT",
        default_value = "json",
        value_name = "FORMAT"
    )]
    pub log_format: LogFormat,
    /// Address of the admin server (/metrics, /livez, /readyz).
    #[arg(long, default_value = "0.0.0.0:8080", value_name = "ADDR")]
    pub admin_listen: SocketAddr,
    /// After SIGTERM or SIGINT, how long in-flight work (admission reviews, reconciles) may
    /// take to finish before the process exits anyway. Keep it below the pod's
    /// terminationGracePeriodSeconds (30 s by default).
    #[arg(
        long,
        default_value = "20s",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub shutdown_grace: Duration,
    /// Webhook servers only: after SIGTERM, how long `/readyz` fails while the server still
    /// accepts, so the API server stops sending reviews to this replica before its port closes
    /// (endpoint removal takes a few seconds to propagate). `0s` closes at once.
    #[arg(
        long,
        default_value = "5s",
        value_parser = parse_duration_or_zero,
        value_name = "DURATION"
    )]
    pub shutdown_delay: Duration,
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
    /// port, 1 s of shutdown grace, no shutdown delay.
    pub fn runtime_args(self) -> RuntimeArgs {
        RuntimeArgs {
            kubeconfig: self.kubeconfig,
            kube_context: self.kube_context,
            log_level: self.log_level,
            log_format: self.log_format,
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            shutdown_grace: Duration::from_secs(1),
            shutdown_delay: Duration::ZERO,
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
