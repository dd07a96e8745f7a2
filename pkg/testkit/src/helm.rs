//! The real Helm CLI for the chart tests: `$WARMCACHE_HELM`, else the binary
//! `hack/build-helm.sh` prints (built once from the pinned `helm.sh/helm/v4` module and cached
//! under `~/.cache/warmcache/helm`; about 3 minutes on a cold cache, needs Go).

use std::path::PathBuf;

use crate::TestkitError;
use crate::plane::{run_script, workspace_root};

/// The variable naming a prebuilt `helm` binary (skips `hack/build-helm.sh`).
pub const ENV_HELM: &str = "WARMCACHE_HELM";

/// The `helm` binary to run.
pub fn helm_binary() -> Result<PathBuf, TestkitError> {
    let path = match std::env::var_os(ENV_HELM) {
        Some(path) => PathBuf::from(path),
        None => run_script("hack/build-helm.sh", ENV_HELM)?,
    };
    if !path.is_file() {
        return Err(TestkitError::Binaries {
            message: format!("{} is not a helm binary", path.display()),
        });
    }
    Ok(path)
}

/// The chart directory, `charts/warmcache` of the workspace.
pub fn chart_dir() -> PathBuf {
    workspace_root().join("charts/warmcache")
}
