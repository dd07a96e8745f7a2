//! TLS for the webhook: certificate and key from files, reloaded when they change.
//!
//! Kubernetes mounts a TLS Secret as a directory in which `tls.crt` and `tls.key` are symlinks
//! into a `..data` directory; on rotation the kubelet writes a new timestamped directory and
//! swaps the `..data` symlink atomically. [`ReloadingCertResolver`] does not watch inodes or
//! use inotify: [`spawn_reloader`] re-reads both files every few seconds and compares their
//! bytes with the pair it saw last, which follows symlink swaps, in-place rewrites and
//! rename-over alike.
//!
//! A new pair is served only when the certificate chain parses, the key parses and the key
//! belongs to the leaf certificate. Anything else keeps the previous pair in service and is
//! reported (log line, [`AdmissionMetrics::cert_reloads`](crate::AdmissionMetrics) counter).
//! A pair that cannot be read or used is read once more straight away before it counts as a
//! failure: a read that straddles the kubelet's `..data` swap (new certificate, old key) then
//! sees the finished rotation. A rotation still half-finished on the second read is refused
//! once and picked up on the next poll, when both files are new.
//!
//! All crypto goes through rustls' *ring* provider, passed explicitly; nothing here depends on
//! a process-wide default provider being installed (see [`install_default_crypto_provider`]).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::AdmissionError;
use crate::metrics::AdmissionMetrics;

/// ALPN protocols offered by the server, most preferred first. kube-apiserver talks HTTP/2 to
/// webhooks when offered; HTTP/1.1 stays available for curl and older clients.
pub const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Paths of the PEM certificate chain and private key served by the webhook.
///
/// Typically `/etc/webhook/certs/tls.crt` and `/etc/webhook/certs/tls.key` from a mounted
/// `kubernetes.io/tls` Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM file with the leaf certificate first, optionally followed by intermediates.
    pub cert: PathBuf,
    /// PEM file with one private key: PKCS#8 (`PRIVATE KEY`), PKCS#1 (`RSA PRIVATE KEY`) or
    /// SEC1 (`EC PRIVATE KEY`).
    pub key: PathBuf,
}

impl TlsFiles {
    /// Certificate and key paths.
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        Self {
            cert: cert.into(),
            key: key.into(),
        }
    }

    /// `tls.crt` and `tls.key` inside `dir`, the layout of a mounted `kubernetes.io/tls` Secret.
    pub fn in_dir(dir: impl AsRef<Path>) -> Self {
        let dir = dir.as_ref();
        Self::new(dir.join("tls.crt"), dir.join("tls.key"))
    }
}

/// Installs rustls' *ring* provider as the process-wide default, if no default is set yet.
///
/// This crate never needs it (it passes the ring provider explicitly everywhere), but other
/// rustls users in the same binary (kube's client, for instance) may. Binaries should call it
/// first thing in `main`; calling it more than once is harmless.
pub fn install_default_crypto_provider() {
    // Err only means a provider is already installed, which is what we want.
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
}

/// The ring provider every TLS object of this crate is built with.
fn ring_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls [`ResolvesServerCert`] that serves the pair currently on disk.
///
/// Build it with [`ReloadingCertResolver::load`], keep it up to date with [`spawn_reloader`]
/// (or call [`reload_if_changed`](Self::reload_if_changed) yourself) and turn it into a server
/// configuration with [`tls_server_config`]. Every new TLS handshake gets the latest good
/// pair; established connections keep the certificate they negotiated.
pub struct ReloadingCertResolver {
    files: TlsFiles,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
    /// Raw bytes of the last pair we tried (good or bad), to detect changes and to report
    /// a bad pair once rather than on every poll. Held across a whole reload (read, parse,
    /// compare, swap), which serialises concurrent reloads.
    last_seen: Mutex<FileContents>,
    generation: AtomicU64,
    failures: AtomicU64,
}

#[derive(PartialEq, Eq)]
struct FileContents {
    cert: Vec<u8>,
    key: Vec<u8>,
}

/// A reload attempt that did not put a pair in service.
struct FailedReload {
    error: AdmissionError,
    /// The files as read, when they could be read (the pair was unusable).
    contents: Option<FileContents>,
}

impl fmt::Debug for ReloadingCertResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingCertResolver")
            .field("files", &self.files)
            .field("generation", &self.generation())
            .field("failed_reloads", &self.failed_reloads())
            .finish_non_exhaustive()
    }
}

impl ReloadingCertResolver {
    /// Reads and checks the pair named by `files`.
    ///
    /// Fails, naming the file, when either file is missing or unreadable, when the certificate
    /// file holds no certificate, when the key file holds no key, or when the key does not
    /// belong to the certificate.
    pub fn load(files: &TlsFiles) -> Result<Arc<Self>, AdmissionError> {
        let provider = ring_provider();
        let contents = read_pair(files)?;
        let certified = certified_key(files, &contents, &provider)?;
        Ok(Arc::new(Self {
            files: files.clone(),
            provider,
            current: RwLock::new(Arc::new(certified)),
            last_seen: Mutex::new(contents),
            generation: AtomicU64::new(1),
            failures: AtomicU64::new(0),
        }))
    }

    /// Re-reads both files and, if either changed since the last attempt, tries to switch to
    /// the new pair.
    ///
    /// Returns `Ok(true)` when a new pair is now served, `Ok(false)` when nothing changed on
    /// disk, and an error when the new pair cannot be used; the previous pair then stays in
    /// service. A read or a pair that fails is re-read once before it counts as a failure, so
    /// a read that straddles the kubelet's `..data` symlink swap (new certificate, old key) is
    /// not reported. A pair that fails to parse or match is reported once (later calls return
    /// `Ok(false)` until the files change again); an unreadable file is reported on every call.
    ///
    /// Concurrent calls are serialised: reading, checking and swapping happen under one lock,
    /// so the pair in service is always the one read last. This reads files synchronously;
    /// from async code run it on a blocking thread (as [`spawn_reloader`] does).
    pub fn reload_if_changed(&self) -> Result<bool, AdmissionError> {
        self.reload_with(|| read_pair(&self.files))
    }

    /// [`reload_if_changed`](Self::reload_if_changed) with the files read by `read`.
    fn reload_with(
        &self,
        mut read: impl FnMut() -> Result<FileContents, AdmissionError>,
    ) -> Result<bool, AdmissionError> {
        let mut last_seen = self
            .last_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let first = match self.try_swap(&mut last_seen, read()) {
            Ok(changed) => return Ok(changed),
            Err(failed) => failed,
        };
        tracing::debug!(error = %first.error, "certificate pair not usable; reading it again");
        match self.try_swap(&mut last_seen, read()) {
            Ok(changed) => Ok(changed),
            Err(failed) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                // Remember a bad pair so it is reported once; a read error is retried.
                if let Some(contents) = failed.contents {
                    *last_seen = contents;
                }
                Err(failed.error)
            }
        }
    }

    /// Puts the pair `read` in service if it differs from `last_seen` and is usable. The
    /// caller holds the `last_seen` lock for the whole call.
    fn try_swap(
        &self,
        last_seen: &mut FileContents,
        read: Result<FileContents, AdmissionError>,
    ) -> Result<bool, Box<FailedReload>> {
        let contents = read.map_err(|error| {
            Box::new(FailedReload {
                error,
                contents: None,
            })
        })?;
        if *last_seen == contents {
            return Ok(false);
        }
        match certified_key(&self.files, &contents, &self.provider) {
            Ok(certified) => {
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(certified);
                *last_seen = contents;
                self.generation.fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Err(error) => Err(Box::new(FailedReload {
                error,
                contents: Some(contents),
            })),
        }
    }

    /// The pair served to new connections right now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// How many pairs have been put in service: 1 after [`load`](Self::load), plus one per
    /// successful reload.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// How many reload attempts failed (unreadable files or a bad pair) since startup.
    pub fn failed_reloads(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// The files this resolver reads.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }
}

impl ResolvesServerCert for ReloadingCertResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn read_file(what: &'static str, path: &Path) -> Result<Vec<u8>, AdmissionError> {
    std::fs::read(path).map_err(|source| AdmissionError::ReadFile {
        what,
        path: path.to_path_buf(),
        source,
    })
}

fn read_pair(files: &TlsFiles) -> Result<FileContents, AdmissionError> {
    Ok(FileContents {
        cert: read_file("certificate", &files.cert)?,
        key: read_file("private key", &files.key)?,
    })
}

fn certified_key(
    files: &TlsFiles,
    contents: &FileContents,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, AdmissionError> {
    let invalid_cert = |reason: String| AdmissionError::InvalidCertificate {
        path: files.cert.clone(),
        reason,
    };
    let invalid_key = |reason: String| AdmissionError::InvalidKey {
        path: files.key.clone(),
        reason,
    };

    let chain = CertificateDer::pem_slice_iter(&contents.cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| invalid_cert(format!("malformed PEM: {err}")))?;
    if chain.is_empty() {
        return Err(invalid_cert("no CERTIFICATE block found".to_owned()));
    }
    let key = PrivateKeyDer::from_pem_slice(&contents.key).map_err(|err| {
        invalid_key(match err {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "no PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY block found".to_owned()
            }
            other => format!("malformed PEM: {other}"),
        })
    })?;
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|err| invalid_key(format!("unsupported or corrupt key: {err}")))?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        Ok(()) => Ok(certified),
        Err(rustls::Error::InvalidCertificate(err)) => Err(invalid_cert(format!(
            "the leaf certificate cannot be parsed: {err:?}"
        ))),
        Err(source) => Err(AdmissionError::KeyMismatch {
            cert: files.cert.clone(),
            key: files.key.clone(),
            source,
        }),
    }
}

/// A rustls server configuration (ring provider, TLS 1.2 and 1.3, no client authentication,
/// ALPN `h2` then `http/1.1`) that takes its certificate from `resolver` on every handshake.
pub fn tls_server_config(
    resolver: Arc<ReloadingCertResolver>,
) -> Result<Arc<rustls::ServerConfig>, AdmissionError> {
    let mut config = rustls::ServerConfig::builder_with_provider(ring_provider())
        .with_safe_default_protocol_versions()
        .map_err(AdmissionError::TlsConfig)?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Polls the resolver's files every `interval` until `shutdown` is cancelled.
///
/// Successful swaps are logged at info level, failures at warn level (the old pair keeps being
/// served). With `metrics`, every swap and every failure also increments
/// `..._certificate_reloads_total{result="success"|"failure"}`. The first poll happens one
/// `interval` after the call; an `interval` of zero is treated as one second.
pub fn spawn_reloader(
    resolver: Arc<ReloadingCertResolver>,
    interval: Duration,
    shutdown: CancellationToken,
    metrics: Option<AdmissionMetrics>,
) -> JoinHandle<()> {
    let interval = if interval.is_zero() {
        Duration::from_secs(1)
    } else {
        interval
    };
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = ticker.tick() => {}
            }
            let task_resolver = Arc::clone(&resolver);
            let outcome = tokio::task::spawn_blocking(move || task_resolver.reload_if_changed())
                .await
                .map_err(AdmissionError::Task)
                .and_then(|result| result);
            match outcome {
                Ok(false) => {}
                Ok(true) => {
                    tracing::info!(
                        cert = %resolver.files().cert.display(),
                        generation = resolver.generation(),
                        "webhook TLS certificate reloaded"
                    );
                    if let Some(metrics) = &metrics {
                        metrics.observe_cert_reload(true);
                    }
                }
                Err(err) => {
                    tracing::warn!(
                        error = %err,
                        "webhook TLS certificate not reloaded; still serving the previous one"
                    );
                    if let Some(metrics) = &metrics {
                        metrics.observe_cert_reload(false);
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Pair {
        cert: Vec<u8>,
        key: Vec<u8>,
        der: Vec<u8>,
    }

    fn pair(name: &str) -> Pair {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        Pair {
            cert: cert.pem().into_bytes(),
            key: key.serialize_pem().into_bytes(),
            der: cert.der().to_vec(),
        }
    }

    fn contents(cert: &Pair, key: &Pair) -> FileContents {
        FileContents {
            cert: cert.cert.clone(),
            key: key.key.clone(),
        }
    }

    fn resolver_serving(first: &Pair) -> (tempfile::TempDir, Arc<ReloadingCertResolver>) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tls.crt"), &first.cert).unwrap();
        std::fs::write(dir.path().join("tls.key"), &first.key).unwrap();
        let resolver = ReloadingCertResolver::load(&TlsFiles::in_dir(dir.path())).unwrap();
        (dir, resolver)
    }

    fn served(resolver: &ReloadingCertResolver) -> Vec<u8> {
        resolver.current().cert[0].to_vec()
    }

    /// Feeds `reads` to `reload_with` one per read.
    fn reload_from(
        resolver: &ReloadingCertResolver,
        reads: Vec<Result<FileContents, AdmissionError>>,
    ) -> Result<bool, AdmissionError> {
        let mut reads = reads.into_iter();
        resolver.reload_with(|| reads.next().unwrap())
    }

    #[test]
    fn a_read_straddling_the_symlink_swap_is_read_again_and_not_counted() {
        let (a, b) = (pair("a"), pair("b"));
        let (_dir, resolver) = resolver_serving(&a);
        // New certificate with the old key, then the finished rotation.
        let swapped = reload_from(&resolver, vec![Ok(contents(&b, &a)), Ok(contents(&b, &b))]);
        assert!(swapped.unwrap());
        assert_eq!(served(&resolver), b.der);
        assert_eq!(resolver.failed_reloads(), 0);
        assert_eq!(resolver.generation(), 2);
    }

    #[test]
    fn an_unreadable_file_is_read_again_and_not_counted() {
        let (a, b) = (pair("a"), pair("b"));
        let (dir, resolver) = resolver_serving(&a);
        let missing = AdmissionError::ReadFile {
            what: "private key",
            path: dir.path().join("tls.key"),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        let swapped = reload_from(&resolver, vec![Err(missing), Ok(contents(&b, &b))]);
        assert!(swapped.unwrap());
        assert_eq!(served(&resolver), b.der);
        assert_eq!(resolver.failed_reloads(), 0);
    }

    #[test]
    fn a_pair_still_mismatched_on_the_second_read_counts_once() {
        let (a, b) = (pair("a"), pair("b"));
        let (_dir, resolver) = resolver_serving(&a);
        let err =
            reload_from(&resolver, vec![Ok(contents(&b, &a)), Ok(contents(&b, &a))]).unwrap_err();
        assert!(matches!(err, AdmissionError::KeyMismatch { .. }), "{err}");
        assert_eq!(resolver.failed_reloads(), 1);
        assert_eq!(served(&resolver), a.der);
        assert_eq!(resolver.generation(), 1);
        // The same bad pair again is not reported again.
        assert!(!reload_from(&resolver, vec![Ok(contents(&b, &a))]).unwrap());
        assert_eq!(resolver.failed_reloads(), 1);
        // The finished rotation is picked up.
        assert!(reload_from(&resolver, vec![Ok(contents(&b, &b))]).unwrap());
        assert_eq!(served(&resolver), b.der);
    }

    #[test]
    fn concurrent_reloads_while_files_rotate_end_serving_the_newest_pair() {
        use std::sync::atomic::AtomicBool;

        let pairs: Vec<Pair> = (0..4).map(|i| pair(&format!("p{i}"))).collect();
        let (dir, resolver) = resolver_serving(&pairs[0]);
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let resolver = Arc::clone(&resolver);
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        // Mismatches from non-atomic writes are expected; only the end state
                        // matters.
                        let _ = resolver.reload_if_changed();
                    }
                })
            })
            .collect();
        // Rotate through the pairs, each file replaced atomically (write + rename).
        let mut last = 0;
        for round in 0..300 {
            last = round % pairs.len();
            for (name, bytes) in [
                ("tls.crt", &pairs[last].cert),
                ("tls.key", &pairs[last].key),
            ] {
                let tmp = dir.path().join(format!(".{name}.tmp"));
                std::fs::write(&tmp, bytes).unwrap();
                std::fs::rename(&tmp, dir.path().join(name)).unwrap();
            }
        }
        // Let the readers see the final files a few more times, then stop them.
        std::thread::sleep(Duration::from_millis(100));
        stop.store(true, Ordering::Relaxed);
        for reader in readers {
            reader.join().unwrap();
        }
        assert_eq!(served(&resolver), pairs[last].der);
        // And nothing is left for a later poll to fix: the state is consistent.
        assert!(!resolver.reload_if_changed().unwrap());
        assert_eq!(served(&resolver), pairs[last].der);
    }
}
