//! The error type of the test kit.

use std::path::PathBuf;

/// Everything that can go wrong while starting the control plane or driving it from a test.
///
/// Startup errors carry the tail of the failing component's log, so a failed CI run shows why
/// etcd, kube-apiserver or kube-controller-manager did not come up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestkitError {
    /// The control-plane binaries could not be located or built.
    #[error("control-plane binaries unavailable: {message}")]
    Binaries {
        /// What was tried and what failed.
        message: String,
    },

    /// A file-system or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What the kit was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// Generating certificates or keys failed.
    #[error("generating {what}: {source}")]
    Pki {
        /// Which piece of TLS material was being generated.
        what: &'static str,
        /// The underlying error.
        #[source]
        source: rcgen::Error,
    },

    /// A control-plane component exited or did not become healthy in time.
    #[error("{component} failed to start: {reason}\n--- last lines of {log} ---\n{log_tail}")]
    ComponentStart {
        /// `etcd`, `kube-apiserver` or `kube-controller-manager`.
        component: &'static str,
        /// Why the kit gave up on it.
        reason: String,
        /// The component's log file.
        log: PathBuf,
        /// The last lines of that log.
        log_tail: String,
    },

    /// The shared control plane failed to start earlier in this process; every later caller
    /// gets this error with the original message.
    #[error("the shared control plane is unavailable: {0}")]
    Unavailable(String),

    /// A call to the Kubernetes API failed.
    #[error("{context}: {source}")]
    Kube {
        /// What the kit was doing.
        context: String,
        /// The underlying client error.
        #[source]
        source: kube::Error,
    },

    /// The generated kubeconfig could not be loaded into a client configuration.
    #[error("loading the generated kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),

    /// A CRD manifest could not be parsed.
    #[error("parsing CRD manifest {path}: {message}")]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },

    /// A condition polled by the kit did not hold before its deadline.
    #[error("timed out after {seconds:.1}s waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long the kit waited.
        seconds: f64,
    },

    /// An object the kit needed does not exist or lacks a field the kit needs.
    #[error("{0}")]
    NotFound(String),

    /// An external command the kit runs (tar, ctr, ...) failed.
    #[error("{command} failed ({status}): {output}")]
    Command {
        /// The command line, shortened to the program and its first arguments.
        command: String,
        /// Its exit status.
        status: String,
        /// The end of what it printed.
        output: String,
    },

    /// This machine cannot run what was asked (the real node needs root and cgroup v1, for
    /// example); the message says what is missing.
    #[error("unsupported here: {0}")]
    Unsupported(String),

    /// A caller passed an argument the kit cannot use.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl TestkitError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn kube(context: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube {
            context: context.into(),
            source,
        }
    }

    /// The error and all its sources on one line (used for the cached shared-startup failure).
    pub(crate) fn chain(&self) -> String {
        let mut out = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            let text = s.to_string();
            if !out.contains(&text) {
                out.push_str(": ");
                out.push_str(&text);
            }
            source = s.source();
        }
        out
    }
}
