//! Certificate loading, startup errors and rotation without restart.

// Test code: helpers outside #[test] fns may unwrap/panic too (clippy.toml only covers #[test]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use warmcache_admission::{
    AdmissionError, AdmissionRequest, AdmissionResponse, AdmissionServer, AdmissionServerConfig,
    DynamicObject, ReloadingCertResolver, Route, TlsFiles,
};

fn allow_all(config: AdmissionServerConfig) -> AdmissionServer {
    AdmissionServer::new(config).route(Route::validating(
        "/validate",
        |req: AdmissionRequest<DynamicObject>| AdmissionResponse::from(&req),
    ))
}

async fn wait_for_cert(addr: std::net::SocketAddr, cas: &[&Ca], want: &Leaf) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if served_cert(addr, cas).await == want.der {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new certificate was not served within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn manual_reload_swaps_good_pairs_and_keeps_serving_on_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (ca_a, ca_b) = (Ca::new("CA A"), Ca::new("CA B"));
    let (leaf_a, leaf_b) = (ca_a.leaf(1), ca_b.leaf(2));
    leaf_a.write_to(dir.path());

    let files = files_in(dir.path());
    let resolver = ReloadingCertResolver::load(&files).unwrap();
    assert_eq!(resolver.generation(), 1);
    assert!(
        !resolver.reload_if_changed().unwrap(),
        "nothing changed yet"
    );
    let running = spawn_with_resolver(
        allow_all(AdmissionServerConfig::new(files.clone())),
        resolver.clone(),
    );
    let both = [&ca_a, &ca_b];
    assert_eq!(served_cert(running.addr, &both).await, leaf_a.der);
    // A connection made before the rotation keeps working afterwards.
    let early = post_json(running.addr, &ca_a, "/validate", &pod_review("u0", "p")).await;
    assert_eq!(early.response()["uid"], "u0");

    // Rotate to B (other CA, other serial): new connections see B, no restart.
    leaf_b.write_to(dir.path());
    assert!(resolver.reload_if_changed().unwrap());
    assert_eq!(resolver.generation(), 2);
    assert_eq!(served_cert(running.addr, &both).await, leaf_b.der);
    let reply = post_json(running.addr, &ca_b, "/validate", &pod_review("u1", "p")).await;
    assert_eq!(reply.response()["uid"], "u1");

    // Garbage certificate: refused, naming the file; B stays in service.
    std::fs::write(dir.path().join("tls.crt"), "not a certificate").unwrap();
    let err = resolver.reload_if_changed().unwrap_err();
    assert!(
        matches!(err, AdmissionError::InvalidCertificate { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("tls.crt"), "{err}");
    assert_eq!(served_cert(running.addr, &both).await, leaf_b.der);
    // The same bad content is reported once, not on every poll.
    assert!(!resolver.reload_if_changed().unwrap());
    assert_eq!(resolver.failed_reloads(), 1);

    // Certificate A with key B: mismatch refused, B still served.
    std::fs::write(dir.path().join("tls.crt"), &leaf_a.cert_pem).unwrap();
    let err = resolver.reload_if_changed().unwrap_err();
    assert!(matches!(err, AdmissionError::KeyMismatch { .. }), "{err}");
    assert_eq!(served_cert(running.addr, &both).await, leaf_b.der);

    // Garbage key.
    std::fs::write(
        dir.path().join("tls.key"),
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let err = resolver.reload_if_changed().unwrap_err();
    assert!(matches!(err, AdmissionError::InvalidKey { .. }), "{err}");
    assert!(err.to_string().contains("tls.key"), "{err}");

    // Files disappearing mid-rotation: an error naming the file, still serving B.
    std::fs::remove_file(dir.path().join("tls.key")).unwrap();
    let err = resolver.reload_if_changed().unwrap_err();
    assert!(err.to_string().contains("tls.key"), "{err}");
    assert_eq!(served_cert(running.addr, &both).await, leaf_b.der);

    // Back to a consistent pair (A): swapped in.
    leaf_a.write_to(dir.path());
    assert!(resolver.reload_if_changed().unwrap());
    assert_eq!(served_cert(running.addr, &both).await, leaf_a.der);
    running.stop().await;
}

/// Lays out `dir` like a kubelet-mounted Secret: `tls.crt -> ..data/tls.crt`,
/// `..data -> <version>`, and swaps `..data` atomically to a new version.
fn kubelet_publish(dir: &Path, version: &str, leaf: &Leaf) {
    let versioned = dir.join(version);
    std::fs::create_dir(&versioned).unwrap();
    leaf.write_to(&versioned);
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(version, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for name in ["tls.crt", "tls.key"] {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), &link).unwrap();
        }
    }
}

#[tokio::test]
async fn poller_follows_a_kubelet_symlink_swap() {
    let dir = tempfile::tempdir().unwrap();
    let (ca_a, ca_b) = (Ca::new("CA A"), Ca::new("CA B"));
    let (leaf_a, leaf_b) = (ca_a.leaf(1), ca_b.leaf(2));
    kubelet_publish(dir.path(), "..2026_01_01_a", &leaf_a);

    let mut config = AdmissionServerConfig::new(TlsFiles::in_dir(dir.path()));
    config.reload_interval = Duration::from_millis(100);
    let registry = prometheus::Registry::new();
    let metrics = warmcache_admission::AdmissionMetrics::new().unwrap();
    metrics.register(&registry).unwrap();
    let running = spawn_serve(allow_all(config).with_metrics(metrics.clone()));
    let both = [&ca_a, &ca_b];
    assert_eq!(served_cert(running.addr, &both).await, leaf_a.der);

    kubelet_publish(dir.path(), "..2026_02_01_b", &leaf_b);
    wait_for_cert(running.addr, &both, &leaf_b).await;
    let reply = post_json(running.addr, &ca_b, "/validate", &pod_review("u-b", "p")).await;
    assert_eq!(reply.response()["uid"], "u-b");
    assert!(metrics.cert_reloads().with_label_values(&["success"]).get() >= 1);

    // A garbage version published the same way: B keeps being served.
    let broken = Leaf {
        cert_pem: "garbage".to_owned(),
        key_pem: "garbage".to_owned(),
        der: leaf_b.der.clone(),
    };
    kubelet_publish(dir.path(), "..2026_03_01_broken", &broken);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while metrics.cert_reloads().with_label_values(&["failure"]).get() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the broken pair was never noticed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(served_cert(running.addr, &both).await, leaf_b.der);
    running.stop().await;
}

#[tokio::test]
async fn startup_fails_naming_the_bad_file() {
    let dir = tempfile::tempdir().unwrap();
    let files = files_in(dir.path());

    // Missing certificate.
    let err = ReloadingCertResolver::load(&files).unwrap_err();
    assert!(
        matches!(
            err,
            AdmissionError::ReadFile {
                what: "certificate",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains(&dir.path().join("tls.crt").display().to_string()),
        "{err}"
    );

    // The server refuses to start the same way.
    let running = spawn_serve(allow_all(AdmissionServerConfig::new(files.clone())));
    let err = running.task.await.unwrap().unwrap_err();
    assert!(err.to_string().contains("tls.crt"), "{err}");

    // Certificate present, key missing.
    let leaf = Ca::new("CA").leaf(1);
    std::fs::write(&files.cert, &leaf.cert_pem).unwrap();
    let err = ReloadingCertResolver::load(&files).unwrap_err();
    assert!(
        matches!(
            err,
            AdmissionError::ReadFile {
                what: "private key",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("tls.key"), "{err}");

    // Invalid certificate.
    std::fs::write(&files.key, &leaf.key_pem).unwrap();
    std::fs::write(&files.cert, "hello").unwrap();
    let err = ReloadingCertResolver::load(&files).unwrap_err();
    assert!(
        matches!(err, AdmissionError::InvalidCertificate { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("tls.crt"), "{err}");
    assert!(err.to_string().contains("no CERTIFICATE"), "{err}");

    // Invalid key.
    std::fs::write(&files.cert, &leaf.cert_pem).unwrap();
    std::fs::write(&files.key, &leaf.cert_pem).unwrap();
    let err = ReloadingCertResolver::load(&files).unwrap_err();
    assert!(matches!(err, AdmissionError::InvalidKey { .. }), "{err}");
    assert!(err.to_string().contains("tls.key"), "{err}");

    // Key of another certificate.
    std::fs::write(&files.key, Ca::new("CA").leaf(2).key_pem).unwrap();
    let err = ReloadingCertResolver::load(&files).unwrap_err();
    assert!(matches!(err, AdmissionError::KeyMismatch { .. }), "{err}");

    // A directory where the file should be.
    let err = ReloadingCertResolver::load(&TlsFiles::new(dir.path(), &files.key)).unwrap_err();
    assert!(matches!(err, AdmissionError::ReadFile { .. }), "{err}");
}

#[tokio::test]
async fn key_formats_pkcs8_and_sec1_load() {
    // rcgen writes PKCS#8; convert it to SEC1 by hand. (PKCS#1 is RSA-only, and ring cannot
    // generate RSA keys; rustls parses it through the same PrivateKeyDer path.)
    let dir = tempfile::tempdir().unwrap();
    let files = files_in(dir.path());

    let ca = Ca::new("CA");
    let leaf = ca.leaf(1);
    leaf.write_to(dir.path());
    ReloadingCertResolver::load(&files).unwrap();

    // SEC1 (EC PRIVATE KEY) via an RSA-free path: rcgen's default key is ECDSA P-256. The
    // SEC1 document is embedded in the PKCS#8 one as the privateKey OCTET STRING.
    let pkcs8 = rustls::pki_types::PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
    let sec1 = sec1_from_pkcs8(pkcs8.secret_der());
    let sec1_pem = pem("EC PRIVATE KEY", &sec1);
    assert!(matches!(
        rustls::pki_types::PrivateKeyDer::from_pem_slice(sec1_pem.as_bytes()).unwrap(),
        rustls::pki_types::PrivateKeyDer::Sec1(_)
    ));
    std::fs::write(&files.key, sec1_pem).unwrap();
    ReloadingCertResolver::load(&files).unwrap();
}

use rustls::pki_types::pem::PemObject;

/// Extracts the inner SEC1 `ECPrivateKey` from a PKCS#8 `PrivateKeyInfo` (DER):
/// the last OCTET STRING at the top level of the outer SEQUENCE.
fn sec1_from_pkcs8(der: &[u8]) -> Vec<u8> {
    fn read_len(bytes: &[u8], pos: &mut usize) -> usize {
        let first = bytes[*pos];
        *pos += 1;
        if first < 0x80 {
            return first as usize;
        }
        let n = (first & 0x7f) as usize;
        let mut len = 0usize;
        for _ in 0..n {
            len = (len << 8) | bytes[*pos] as usize;
            *pos += 1;
        }
        len
    }
    let mut pos = 0;
    assert_eq!(der[pos], 0x30);
    pos += 1;
    let _outer = read_len(der, &mut pos);
    let mut octets = None;
    while pos < der.len() {
        let tag = der[pos];
        pos += 1;
        let len = read_len(der, &mut pos);
        if tag == 0x04 {
            octets = Some(der[pos..pos + len].to_vec());
        }
        pos += len;
    }
    octets.unwrap()
}

fn pem(label: &str, der: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = String::new();
    for chunk in der.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                b64.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                b64.push('=');
            }
        }
    }
    let body: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        body.join("\n")
    )
}
