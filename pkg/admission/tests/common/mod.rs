//! Shared helpers for the integration tests: a throwaway PKI, TLS/HTTP clients, a server runner.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SerialNumber,
};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_util::sync::CancellationToken;
use warmcache_admission::{AdmissionError, AdmissionServer, TlsFiles};

/// A test CA that signs leaves for 127.0.0.1.
pub struct Ca {
    pub name: String,
    pub der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

/// A leaf certificate and its key, PEM.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Self {
            name: name.to_owned(),
            der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        }
    }

    pub fn leaf(&self, serial: u8) -> Leaf {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        params.distinguished_name.push(
            DnType::CommonName,
            format!("webhook {} #{serial}", self.name),
        );
        params.serial_number = Some(SerialNumber::from_slice(&[serial]));
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }
}

impl Leaf {
    /// Writes `tls.crt` and `tls.key` into `dir`.
    pub fn write_to(&self, dir: &Path) {
        std::fs::write(dir.join("tls.crt"), &self.cert_pem).unwrap();
        std::fs::write(dir.join("tls.key"), &self.key_pem).unwrap();
    }
}

/// A client configuration trusting `cas`, offering `alpn`.
pub fn client_config(cas: &[&Ca], alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        roots.add(ca.der.clone()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

pub async fn connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> Result<TlsStream<tokio::net::TcpStream>, std::io::Error> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::IpAddress(addr.ip().into());
    TlsConnector::from(config).connect(name, tcp).await
}

/// The leaf certificate a fresh connection is served.
pub async fn served_cert(addr: SocketAddr, cas: &[&Ca]) -> CertificateDer<'static> {
    let stream = connect(addr, client_config(cas, &[b"http/1.1"]))
        .await
        .unwrap();
    let (_, session) = stream.get_ref();
    session.peer_certificates().unwrap()[0].clone().into_owned()
}

/// A reply as seen by the test client.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub content_type: String,
    pub body: Vec<u8>,
    /// The ALPN protocol the connection negotiated.
    pub alpn: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|err| panic!("reply is not JSON ({err}): {}", self.text()))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `response` of a 200 AdmissionReview reply.
    pub fn response(&self) -> Value {
        assert_eq!(self.status, 200, "{}", self.text());
        let review = self.json();
        assert_eq!(review["apiVersion"], "admission.k8s.io/v1", "{review}");
        assert_eq!(review["kind"], "AdmissionReview", "{review}");
        review["response"].clone()
    }
}

/// POSTs `body` with hyper over a new TLS connection, using HTTP/2 when `alpn` is `h2`.
pub async fn post(
    addr: SocketAddr,
    ca: &Ca,
    alpn: &[u8],
    path: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> Reply {
    let stream = connect(addr, client_config(&[ca], &[alpn])).await.unwrap();
    let negotiated = stream
        .get_ref()
        .1
        .alpn_protocol()
        .unwrap_or_default()
        .to_vec();
    assert_eq!(negotiated, alpn, "ALPN negotiation");
    let io = TokioIo::new(stream);

    let mut builder = hyper::Request::builder().method("POST");
    if let Some(content_type) = content_type {
        builder = builder.header("content-type", content_type);
    }
    let response = if alpn == b"h2" {
        let request = builder
            .uri(format!("https://{addr}{path}"))
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .unwrap();
        tokio::spawn(connection);
        sender.send_request(request).await.unwrap()
    } else {
        let request = builder
            .uri(path)
            .header("host", addr.to_string())
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(connection);
        sender.send_request(request).await.unwrap()
    };
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Reply {
        status,
        content_type,
        body,
        alpn: negotiated,
    }
}

/// POSTs a JSON value as `application/json` over HTTP/1.1.
pub async fn post_json(addr: SocketAddr, ca: &Ca, path: &str, body: &Value) -> Reply {
    post(
        addr,
        ca,
        b"http/1.1",
        path,
        Some("application/json"),
        serde_json::to_vec(body).unwrap(),
    )
    .await
}

/// Writes raw bytes on a new HTTP/1.1 TLS connection and reads until the server closes it
/// (or `wait` elapses). Returns what was read and whether the server closed the connection.
pub async fn raw_http1(
    addr: SocketAddr,
    ca: &Ca,
    request: &[u8],
    wait: Duration,
) -> (String, bool) {
    let mut stream = connect(addr, client_config(&[ca], &[b"http/1.1"]))
        .await
        .unwrap();
    stream.write_all(request).await.unwrap();
    stream.flush().await.unwrap();
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = tokio::time::timeout(wait, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    (String::from_utf8_lossy(&received).into_owned(), closed)
}

/// An AdmissionReview for creating a Pod named `name` with the given uid.
pub fn pod_review(uid: &str, name: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": name,
            "namespace": "team-a",
            "operation": "CREATE",
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "team-a"},
                "spec": {"containers": [{"name": "engine", "image": "vllm/vllm-openai"}]}
            },
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
}

/// A server running in the background on 127.0.0.1 with a random port.
pub struct Running {
    pub addr: SocketAddr,
    pub shutdown: CancellationToken,
    pub task: JoinHandle<Result<(), AdmissionError>>,
}

impl Running {
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(15), self.task)
            .await
            .expect("server did not stop")
            .unwrap()
            .unwrap();
    }
}

fn listener() -> (std::net::TcpListener, SocketAddr) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

/// Runs `server.serve(..)` (certificate loaded from the configured files, reloader started).
pub fn spawn_serve(server: AdmissionServer) -> Running {
    let (listener, addr) = listener();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server.serve(listener, shutdown.clone()));
    Running {
        addr,
        shutdown,
        task,
    }
}

/// Runs `server.serve_with_resolver(..)` with a resolver loaded from `files`.
pub fn spawn_with_resolver(
    server: AdmissionServer,
    resolver: Arc<warmcache_admission::ReloadingCertResolver>,
) -> Running {
    let (listener, addr) = listener();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server.serve_with_resolver(listener, resolver, shutdown.clone()));
    Running {
        addr,
        shutdown,
        task,
    }
}

/// Files of a mounted TLS Secret in `dir`.
pub fn files_in(dir: &Path) -> TlsFiles {
    TlsFiles::in_dir(dir)
}

/// Reads from `stream` (discarding the data) until the server closes it or `within` elapses;
/// true when it was closed.
pub async fn closed_within<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    within: Duration,
) -> bool {
    let mut buf = [0u8; 4096];
    tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// Polls `condition` every 20 ms until it holds; panics after `within`.
pub async fn eventually(within: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !condition() {
        assert!(started.elapsed() < within, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The bytes of `response.patch`: base64 text, as the server writes it (Go's `[]byte` form).
pub fn patch_bytes(response: &Value) -> Vec<u8> {
    assert!(
        response["patch"].is_string(),
        "the patch is not base64 text: {response}"
    );
    serde_json::from_value::<k8s_openapi::ByteString>(response["patch"].clone())
        .unwrap_or_else(|e| panic!("not base64: {e}: {response}"))
        .0
}
