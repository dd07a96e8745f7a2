//! The error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong when setting up or running the admission server.
///
/// Errors about TLS material always name the file involved, so an operator can tell which
/// mounted Secret key is at fault.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// A certificate or key file could not be read (missing, unreadable, a directory, ...).
    #[error("cannot read the TLS {what} file {}: {source}", .path.display())]
    ReadFile {
        /// `"certificate"` or `"private key"`.
        what: &'static str,
        /// The file that could not be read.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },

    /// The certificate file was read but holds no usable PEM certificate chain.
    #[error("the TLS certificate file {} is not usable: {reason}", .path.display())]
    InvalidCertificate {
        /// The certificate file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// The key file was read but holds no usable PEM private key (PKCS#8, PKCS#1 or SEC1).
    #[error("the TLS private key file {} is not usable: {reason}", .path.display())]
    InvalidKey {
        /// The key file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// Certificate and key each parse, but they do not belong together.
    #[error(
        "the TLS private key {} does not match the certificate {}: {source}",
        .key.display(),
        .cert.display()
    )]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// The check that failed.
        #[source]
        source: rustls::Error,
    },

    /// The rustls server configuration could not be built.
    #[error("cannot build the TLS server configuration: {0}")]
    TlsConfig(#[source] rustls::Error),

    /// A route was registered with a path that cannot be served.
    #[error("invalid admission route {path:?}: {reason}")]
    InvalidRoute {
        /// The path as given to the builder.
        path: String,
        /// Why it was refused.
        reason: &'static str,
    },

    /// A route's webhook registration would not be accepted by the API server, or would not do
    /// what it says.
    #[error("invalid webhook registration {webhook:?} of the route {path:?}: {reason}")]
    InvalidWebhook {
        /// The route's path.
        path: String,
        /// The webhook's name.
        webhook: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The name or the Service of the generated webhook configurations would not be accepted
    /// by the API server.
    #[error("invalid webhook configurations {name:?}: {reason}")]
    InvalidConfiguration {
        /// The configurations' name.
        name: String,
        /// What is wrong.
        reason: String,
    },

    /// The listening socket could not be set up, or the server stopped with an I/O error.
    #[error("the admission server failed: {0}")]
    Serve(#[source] std::io::Error),

    /// A background task (certificate reader) could not be run to completion.
    #[error("a background task of the admission server failed: {0}")]
    Task(#[source] tokio::task::JoinError),
}
