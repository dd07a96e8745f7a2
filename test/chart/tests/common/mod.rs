//! Runs the real Helm CLI on `charts/warmcache` for the chart tests: `helm template` into
//! parsed objects, `helm lint --strict`. The binary comes from
//! [`warmcache_testkit::helm_binary`] (`$WARMCACHE_HELM`, else `hack/build-helm.sh`).

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use warmcache_chart_tests::NAMESPACE;

/// The release name every render uses.
pub const RELEASE: &str = "warmcache";

/// A Helm invocation that failed, or output that is not YAML.
#[derive(Debug, thiserror::Error)]
pub enum HelmError {
    #[error(transparent)]
    Testkit(#[from] warmcache_testkit::TestkitError),
    #[error("running {command}: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    /// Helm exited non-zero; `output` is its stderr and stdout.
    #[error("{command} failed: {output}")]
    Failed { command: String, output: String },
    #[error("helm template printed YAML that does not parse: {0}")]
    Yaml(String),
}

impl HelmError {
    /// What Helm said, for tests that expect a refusal.
    pub fn output(&self) -> String {
        match self {
            HelmError::Failed { output, .. } => output.clone(),
            other => other.to_string(),
        }
    }
}

/// The Helm CLI and the chart.
#[derive(Debug, Clone)]
pub struct Helm {
    binary: PathBuf,
    chart: PathBuf,
}

impl Helm {
    /// Finds (or builds) the helm binary.
    pub fn new() -> Result<Helm, HelmError> {
        Ok(Helm {
            binary: warmcache_testkit::helm_binary()?,
            chart: warmcache_testkit::chart_dir(),
        })
    }

    /// The helm binary.
    pub fn binary(&self) -> &std::path::Path {
        &self.binary
    }

    /// The chart directory.
    pub fn chart(&self) -> &std::path::Path {
        &self.chart
    }

    fn run(&self, args: &[String]) -> Result<String, HelmError> {
        let command = format!("helm {}", args.join(" "));
        let output = Command::new(&self.binary)
            .args(args)
            // No user configuration, repositories or plugins of this machine.
            .env(
                "HELM_CONFIG_HOME",
                std::env::temp_dir().join("warmcache-helm-config"),
            )
            .env(
                "HELM_CACHE_HOME",
                std::env::temp_dir().join("warmcache-helm-cache"),
            )
            .env(
                "HELM_DATA_HOME",
                std::env::temp_dir().join("warmcache-helm-data"),
            )
            .output()
            .map_err(|source| HelmError::Spawn {
                command: command.clone(),
                source,
            })?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() {
            return Err(HelmError::Failed {
                command,
                output: format!("{}{stdout}", String::from_utf8_lossy(&output.stderr)),
            });
        }
        Ok(stdout)
    }

    fn value_args(sets: &[&str]) -> Vec<String> {
        sets.iter()
            .flat_map(|s| ["--set".to_owned(), (*s).to_owned()])
            .collect()
    }

    /// `helm template` with `--set` values: every object rendered, in order.
    pub fn template(&self, sets: &[&str]) -> Result<Vec<Value>, HelmError> {
        let mut args = vec![
            "template".to_owned(),
            RELEASE.to_owned(),
            self.chart.display().to_string(),
            "--namespace".to_owned(),
            NAMESPACE.to_owned(),
        ];
        args.extend(Self::value_args(sets));
        let text = self.run(&args)?;
        warmcache_cli::yaml::documents(&text).map_err(|e| HelmError::Yaml(e.to_string()))
    }

    /// `helm lint --strict` with `--set` values; its output.
    pub fn lint(&self, sets: &[&str]) -> Result<String, HelmError> {
        let mut args = vec![
            "lint".to_owned(),
            "--strict".to_owned(),
            self.chart.display().to_string(),
            "--namespace".to_owned(),
            NAMESPACE.to_owned(),
        ];
        args.extend(Self::value_args(sets));
        self.run(&args)
    }

    /// Any other helm command (install, upgrade, uninstall, ...).
    pub fn command(&self, args: &[&str]) -> Result<String, HelmError> {
        self.run(&args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>())
    }
}
