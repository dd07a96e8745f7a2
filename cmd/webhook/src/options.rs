//! The flags that decide what the rewrite does, shared by `webhook serve` and `webhook preview`
//! so a preview runs with exactly the flags the deployed webhook runs with.

use clap::{Args, ValueEnum};
use warmcache_catalog::Gates;
use warmcache_modelvolume::{
    DEFAULT_GPU_RESOURCE, DEFAULT_POLL_SECONDS, DEFAULT_WAIT_DEADLINE_SECONDS, Options,
    OptionsError, ReaderMode,
};

/// How readers of block storage reach the copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReaderModeArg {
    /// The namespace's read-only view claim.
    Pvc,
    /// A node directory the node agent bind-mounts the view onto.
    #[value(name = "hostPath")]
    HostPath,
}

/// Feature gates from the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatesArg(pub Gates);

/// The gates when none is given: caching on, sharing domains on, encryption off.
pub const DEFAULT_GATES: Gates = Gates::DEFAULT;

fn parse_gates(s: &str) -> Result<GatesArg, String> {
    Gates::parse(s).map(GatesArg)
}

/// What the rewrite does: which pods are in scope, how readers reach block storage, the wait
/// container, the control namespace and the feature gates.
#[derive(Debug, Clone, Args)]
pub struct RewriteArgs {
    /// Feature gates, `Name=true|false,...`: CachingSupport (default true), HelmModelCaching
    /// (default true), ModelCacheEncryption (default false).
    #[arg(long = "feature-gates", value_name = "k=v,...", value_parser = parse_gates, default_value = "")]
    pub feature_gates: GatesArg,
    /// GPU resources that put a pod in scope (repeatable).
    #[arg(long = "gpu-resource", value_name = "RESOURCE", default_value = DEFAULT_GPU_RESOURCE)]
    pub gpu_resources: Vec<String>,
    /// Reader mode for roxReadOnly (block) caches.
    #[arg(long = "reader-mode", value_enum, default_value = "pvc")]
    pub reader_mode: ReaderModeArg,
    /// Image of the wait container (default: the image of the container it stands in for).
    #[arg(long = "wait-image", value_name = "IMAGE")]
    pub wait_image: Option<String>,
    /// Seconds a reader waits for the completion marker.
    #[arg(long = "wait-deadline", value_name = "SECONDS", default_value_t = DEFAULT_WAIT_DEADLINE_SECONDS)]
    pub wait_deadline: u32,
    /// The control namespace bindings live in.
    #[arg(long = "control-namespace", value_name = "NS", default_value = warmcache_api_modelcache::DEFAULT_CONTROL_NAMESPACE)]
    pub control_namespace: String,
    /// Maximum age of the copy of a floating revision (a Hugging Face branch or tag, or none):
    /// the first pod of each window of this many seconds downloads anew into a new binding. 0
    /// keeps a floating revision's copy until its salt or its namespace's refresh label changes.
    #[arg(
        long = "floating-revision-max-age",
        value_name = "SECONDS",
        default_value_t = 0
    )]
    pub floating_revision_max_age: u64,
    /// Compile-cache sets: point the engine's compile caches into a scratch directory, have the
    /// node agent collect them from the first Ready pod of each configuration and rank, and
    /// seed later pods from them. Needs the node agent (the chart passes it only with the agent).
    #[arg(long = "compile-cache-sets")]
    pub compile_cache_sets: bool,
}

impl RewriteArgs {
    /// The rewrite's options, for a webhook running in `webhook_namespace`.
    ///
    /// # Errors
    ///
    /// An option that cannot work, named.
    pub fn options(&self, webhook_namespace: Option<String>) -> Result<Options, OptionsError> {
        let options = Options {
            gpu_resources: self.gpu_resources.clone(),
            webhook_namespace,
            control_namespace: self.control_namespace.clone(),
            reader_mode: match self.reader_mode {
                ReaderModeArg::Pvc => ReaderMode::Pvc,
                ReaderModeArg::HostPath => ReaderMode::HostPath,
            },
            wait_image: self.wait_image.clone(),
            wait_deadline_seconds: self.wait_deadline,
            poll_seconds: DEFAULT_POLL_SECONDS.min(self.wait_deadline.max(1)),
            floating_revision_max_age_seconds: (self.floating_revision_max_age > 0)
                .then_some(self.floating_revision_max_age),
            compile_cache_sets: self.compile_cache_sets,
            ..Options::default()
        };
        options.validate()?;
        Ok(options)
    }
}
