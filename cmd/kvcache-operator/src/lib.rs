//! The `kvcache-operator` binary: the validating webhook for `KVCacheBackend` and the offline
//! `validate` and `render` commands.
//!
//! ```text
//! kvcache-operator validate -f NEW.yaml [--old OLD.yaml] [--default-image IMAGE]
//! kvcache-operator render   -f BACKEND.yaml [--namespace NS] [--default-image IMAGE] [--store-image-user PATTERN=USER]
//! kvcache-operator webhook  --tls-dir DIR [--listen ADDR] [--admin-listen ADDR] [--default-image IMAGE]
//! ```
//!
//! - `validate` prints `ok` and exits 0 when the backend (created, or updated from `--old`) is
//!   admitted; otherwise it prints one `<field path>: <reason>` line per refusal and exits 1.
//!   Input that cannot be read, is not YAML, or is not a `KVCacheBackend` exits 2, as does a
//!   change to the spec of an `--old` object that does not fit the API. The decision is
//!   [`warmcache_kvcache::validate_values`], the webhook's: an update that leaves `spec`
//!   unchanged is admitted before either object is decoded.
//! - `render` prints the leader Deployment, the leader Service and one member DaemonSet per
//!   group as a YAML stream, exactly as the operator applies them, preceded for an HA leader by
//!   the ServiceAccounts, Roles and RoleBindings of its Lease election; a backend `validate`
//!   refuses is refused here too (exit 1, same lines).
//! - `webhook` serves the validating webhook over HTTPS (certificate and key `tls.crt` and
//!   `tls.key` in `--tls-dir`, reloaded when they change) on [`WEBHOOK_PATH`], and an admin
//!   server with `/metrics`, `/livez` and `/readyz`, until SIGTERM or SIGINT.
//!
//! The `kv-cache-backend-image` setting (the image of backends that name none) is given with
//! `--default-image` or the `KV_CACHE_BACKEND_IMAGE` environment variable.

pub mod controller;
pub mod metrics;
pub mod offline;
pub mod rbac;
pub mod scrape;
pub mod webhook;

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use warmcache_api_kvcache::SYSTEM_NAMESPACE;
use warmcache_cli::args::InputFile;

pub use webhook::{WEBHOOK_PATH, review};

/// Environment variable carrying the `kv-cache-backend-image` setting.
pub const DEFAULT_IMAGE_ENV: &str = "KV_CACHE_BACKEND_IMAGE";

/// Environment variable carrying the controller's `--store-image-user` rules (comma-separated).
pub const STORE_IMAGE_USER_ENV: &str = "KVCACHE_STORE_IMAGE_USER";

/// Command line of `kvcache-operator`.
#[derive(Debug, Parser)]
#[command(
    name = "kvcache-operator",
    version,
    about = "KVCacheBackend operator: validating webhook, offline validate and render"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a backend as the webhook would (exit 0 admitted, 1 refused, 2 unreadable input).
    Validate(ValidateArgs),
    /// Print the objects the operator applies for a backend, as a YAML stream: the leader
    /// Deployment and Service and one member DaemonSet per group, preceded for an HA backend by
    /// the ServiceAccounts, Roles and RoleBindings of its Lease election.
    Render(RenderArgs),
    /// Serve the validating webhook for KVCacheBackend over HTTPS.
    Webhook(WebhookArgs),
    /// Reconcile KVCacheBackends into workloads (leader-elected), until SIGTERM or SIGINT.
    Controller(ControllerArgs),
}

/// The image setting, shared by every subcommand.
#[derive(Debug, Clone, Args)]
pub struct ImageSetting {
    /// The "kv-cache-backend-image" setting: the store image of backends that name none.
    #[arg(long = "default-image", env = DEFAULT_IMAGE_ENV, value_name = "IMAGE")]
    pub default_image: Option<String>,
}

impl ImageSetting {
    /// Refuses a setting that `spec.image` would refuse (a space, a newline, 120 KB, ...), so a
    /// bad value stops the command at startup instead of being rendered into workloads.
    pub fn check(&self) -> Result<(), RunError> {
        match self.default_image.as_deref() {
            Some(image) => {
                warmcache_kvcache::check_default_image(image).map_err(RunError::DefaultImage)
            }
            None => Ok(()),
        }
    }
}

/// Arguments of `validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The backend to validate (YAML or JSON; "-" reads standard input).
    #[command(flatten)]
    pub input: InputFile,
    /// The stored backend it updates; without it the backend is validated as created.
    #[arg(long, value_name = "OLD.yaml")]
    pub old: Option<PathBuf>,
    #[command(flatten)]
    pub image: ImageSetting,
}

/// Arguments of `render`.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// The backend to render (YAML or JSON; "-" reads standard input).
    #[command(flatten)]
    pub input: InputFile,
    /// Namespace of the rendered workloads.
    #[arg(long, short = 'n', default_value = SYSTEM_NAMESPACE)]
    pub namespace: String,
    #[command(flatten)]
    pub image: ImageSetting,
    /// The controller's `--store-image-user` rules, to render what it would apply.
    #[arg(
        long = "store-image-user",
        value_name = "PATTERN=USER",
        value_delimiter = ','
    )]
    pub store_image_user: Vec<warmcache_kvcache::security::ImageUser>,
}

/// Arguments of `webhook`: the shared flags of every component (`--admin-listen`,
/// `--log-level`, `--log-format`, `--shutdown-grace`, ...; see `docs/operations.md`) and of
/// webhook servers (`--tls-dir`, `--listen`).
#[derive(Debug, Args)]
pub struct WebhookArgs {
    #[command(flatten)]
    pub runtime: warmcache_runtime::RuntimeArgs,
    #[command(flatten)]
    pub admission: warmcache_runtime::AdmissionArgs,
    #[command(flatten)]
    pub image: ImageSetting,
}

/// Arguments of `controller`: the shared flags of every component, leader election, and the
/// namespace of the workloads.
#[derive(Debug, Args)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub runtime: warmcache_runtime::RuntimeArgs,
    #[command(flatten)]
    pub leader: warmcache_runtime::LeaderElectionArgs,
    /// Namespace of the rendered workloads (the operator's system namespace).
    #[arg(long, short = 'n', default_value = SYSTEM_NAMESPACE)]
    pub namespace: String,
    /// How many backends are reconciled at once.
    #[arg(long, default_value_t = 4)]
    pub concurrency: u16,
    /// Where a managed backend's leader admin port (status and capacity) is read: `{name}` and
    /// `{namespace}` are replaced. The default is the leader Service; change it only to run the
    /// operator outside the cluster.
    #[arg(long, default_value = scrape::DEFAULT_ADMIN_ADDRESS, value_name = "HOST:PORT")]
    pub leader_admin_address: String,
    /// Store images that do not run as a numeric non-root user (the published ones run as
    /// 65532), as PATTERN=USER: PATTERN is the start of an image reference or `*`; USER is a
    /// non-root uid to run them as (runAsUser, runAsNonRoot kept) or `image` for the image's
    /// own user, root included (no runAsNonRoot). The first matching rule decides; other images
    /// stay restricted. Repeat the flag or separate rules with commas. See
    /// docs/kvcache-local-disk.md, "Images that run as root".
    #[arg(
        long = "store-image-user",
        env = STORE_IMAGE_USER_ENV,
        value_name = "PATTERN=USER",
        value_delimiter = ','
    )]
    pub store_image_user: Vec<warmcache_kvcache::security::ImageUser>,
    #[command(flatten)]
    pub image: ImageSetting,
}

/// How a command ended, when it did not fail: the shared verdict (`Ok`: admitted, rendered, or
/// served until shutdown; `Refused`: the refusals were printed).
pub use warmcache_cli::exit::Verdict as Outcome;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// An input cannot be read, is too large, is not text, or two flags name standard input.
    #[error(transparent)]
    Read(#[from] warmcache_cli::input::InputError),
    /// An input file is not a `KVCacheBackend` document.
    #[error("{path}: {source}")]
    NotABackend {
        /// The file.
        path: String,
        /// Why.
        source: warmcache_kvcache::ParseError,
    },
    /// The stored object given with `--old` does not fit the API.
    #[error("{path} (the stored object) does not fit the API:\n{lines}")]
    OldShape {
        /// The file.
        path: String,
        /// One line per problem.
        lines: String,
    },
    /// The `kv-cache-backend-image` setting (`--default-image`, `KV_CACHE_BACKEND_IMAGE`) is not
    /// an image `spec.image` would admit.
    #[error("--default-image / {DEFAULT_IMAGE_ENV}: {0}")]
    DefaultImage(String),
    /// `--namespace` is not a namespace name.
    #[error("--namespace {namespace:?} is not a namespace name: {problem}")]
    Namespace {
        /// The value given.
        namespace: String,
        /// Why it is not one.
        problem: String,
    },
    /// Writing the output failed.
    #[error("cannot write the output: {0}")]
    Output(#[from] std::io::Error),
    /// The rendered objects could not be written as YAML.
    #[error("cannot write the rendered objects as YAML: {0}")]
    Yaml(String),
    /// Rendering failed for a backend the validator admitted.
    #[error("cannot render the backend: {0}")]
    Render(#[from] warmcache_kvcache::RenderError),
    /// The webhook server failed.
    #[error(transparent)]
    Webhook(#[from] webhook::ServeError),
    /// The controller failed.
    #[error(transparent)]
    Controller(#[from] warmcache_runtime::RuntimeError),
}

impl RunError {
    /// The process exit code ([`warmcache_cli::exit`]): every failure is 2, since no verdict
    /// was reached (a refusal is [`Outcome::Refused`], exit 1).
    pub fn exit_code(&self) -> u8 {
        warmcache_cli::exit::UNUSABLE
    }
}

/// Runs the command, writing results to `out` and notes to `err`.
pub fn run(cli: Cli, out: &mut dyn Write, err: &mut dyn Write) -> Result<Outcome, RunError> {
    let image = match &cli.command {
        Command::Validate(args) => &args.image,
        Command::Render(args) => &args.image,
        Command::Webhook(args) => &args.image,
        Command::Controller(args) => &args.image,
    };
    image.check()?;
    match cli.command {
        Command::Validate(args) => offline::validate(&args, out),
        Command::Render(args) => offline::render(&args, out, err),
        Command::Controller(args) => {
            controller::run(args)?;
            Ok(Outcome::Ok)
        }
        Command::Webhook(args) => {
            webhook::run(args)?;
            Ok(Outcome::Ok)
        }
    }
}
