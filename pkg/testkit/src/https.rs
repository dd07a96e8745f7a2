//! An HTTPS client for webhook servers under test: one kept-alive HTTP/1.1 connection over
//! rustls (ring), trusting one PEM CA, posting request bodies as the API server does. Tests use
//! it to send what a real API server never would (malformed reviews, other kinds); benchmarks
//! use several in parallel as a load generator on loopback.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio_rustls::TlsConnector;

use crate::TestkitError;

/// A reply: status and body.
#[derive(Debug, Clone)]
pub struct HttpsReply {
    /// The HTTP status.
    pub status: u16,
    /// The body.
    pub body: Vec<u8>,
}

impl HttpsReply {
    /// The body as JSON.
    ///
    /// # Errors
    ///
    /// The body is not JSON.
    pub fn json(&self) -> Result<serde_json::Value, TestkitError> {
        serde_json::from_slice(&self.body).map_err(|e| {
            TestkitError::Unavailable(format!(
                "the reply (status {}) is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            ))
        })
    }
}

/// One HTTPS connection to a webhook server.
pub struct HttpsClient {
    addr: SocketAddr,
    sender: SendRequest<Full<Bytes>>,
}

impl std::fmt::Debug for HttpsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpsClient")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

fn failed(what: &str, e: impl std::fmt::Display) -> TestkitError {
    TestkitError::Unavailable(format!("{what}: {e}"))
}

impl HttpsClient {
    /// Connects to `addr` (an IP address: the certificate must name it), trusting `ca_pem`.
    ///
    /// # Errors
    ///
    /// The CA does not parse, the connection or the TLS handshake fails.
    pub async fn connect(addr: SocketAddr, ca_pem: &str) -> Result<Self, TestkitError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            let cert = cert.map_err(|e| failed("reading the CA", e))?;
            roots.add(cert).map_err(|e| failed("adding the CA", e))?;
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| failed("TLS client configuration", e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| TestkitError::io(format!("connecting to {addr}"), e))?;
        tcp.set_nodelay(true)
            .map_err(|e| TestkitError::io("setting TCP_NODELAY", e))?;
        let stream = TlsConnector::from(Arc::new(config))
            .connect(ServerName::IpAddress(addr.ip().into()), tcp)
            .await
            .map_err(|e| TestkitError::io(format!("TLS handshake with {addr}"), e))?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| failed("HTTP/1.1 handshake", e))?;
        tokio::spawn(connection);
        Ok(Self { addr, sender })
    }

    /// POSTs `body` as `application/json` to `path` and reads the whole reply.
    ///
    /// # Errors
    ///
    /// The connection closed or the request failed.
    pub async fn post_json(
        &mut self,
        path: &str,
        body: Vec<u8>,
    ) -> Result<HttpsReply, TestkitError> {
        let request = hyper::Request::builder()
            .method("POST")
            .uri(path)
            .header("host", self.addr.to_string())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| failed("building the request", e))?;
        self.sender
            .ready()
            .await
            .map_err(|e| failed("the connection closed", e))?;
        let response = self
            .sender
            .send_request(request)
            .await
            .map_err(|e| failed(&format!("POST {path}"), e))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| failed("reading the reply", e))?
            .to_bytes()
            .to_vec();
        Ok(HttpsReply { status, body })
    }
}
