//! Reads the leader's admin port (`/health`, `/metrics`, `/get_segments_detail`): plain HTTP/1.1
//! GETs with a deadline and a body limit, so a slow or hostile store cannot hold a reconcile or
//! its memory.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Deadline of one GET, connection included.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(3);

/// Largest body read from the store (a segment listing of 5000 entries is well below it).
pub const MAX_BODY_BYTES: usize = warmcache_kvcache::store::MAX_BODY_BYTES;

/// Where a backend's leader admin port is reached: `{name}` and `{namespace}` are replaced by
/// the backend name and the workloads' namespace. The default is the leader Service's DNS name;
/// an operator run outside the cluster (or a test) points it elsewhere.
pub const DEFAULT_ADMIN_ADDRESS: &str = "{name}-leader.{namespace}.svc:9003";

/// The admin address of backend `name` from `template`.
pub fn admin_address(template: &str, name: &str, namespace: &str) -> String {
    template
        .replace("{name}", name)
        .replace("{namespace}", namespace)
}

/// Why a GET failed, in words for a condition message.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// No answer in time.
    #[error("{url}: no answer within {}s", SCRAPE_TIMEOUT.as_secs())]
    Timeout {
        /// What was read.
        url: String,
    },
    /// The connection or the exchange failed.
    #[error("{url}: {message}")]
    Failed {
        /// What was read.
        url: String,
        /// Why.
        message: String,
    },
}

/// GETs `path` from `address` and returns the reply as the status derivation takes it
/// ([`warmcache_kvcache::store::Fetch`]): any HTTP status is a reply; no answer is the error.
pub async fn fetch(address: &str, path: &str) -> warmcache_kvcache::store::Fetch {
    get(address, path).await.map_err(|err| err.to_string())
}

/// GETs `path` from `address` (host:port): the status and the body.
pub async fn get(
    address: &str,
    path: &str,
) -> Result<warmcache_kvcache::store::HttpReply, ScrapeError> {
    let url = format!("http://{address}{path}");
    match tokio::time::timeout(SCRAPE_TIMEOUT, get_inner(address, path, &url)).await {
        Ok(result) => result,
        Err(_) => Err(ScrapeError::Timeout { url }),
    }
}

async fn get_inner(
    address: &str,
    path: &str,
    url: &str,
) -> Result<warmcache_kvcache::store::HttpReply, ScrapeError> {
    let failed = |message: String| ScrapeError::Failed {
        url: url.to_owned(),
        message,
    };
    let stream = TcpStream::connect(address)
        .await
        .map_err(|err| failed(format!("cannot connect: {err}")))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|err| failed(err.to_string()))?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let request = Request::get(path)
        .header(hyper::header::HOST, address)
        .header(hyper::header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|err| failed(err.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|err| failed(err.to_string()))?;
    let status = response.status().as_u16();
    let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
        .map_err(|err| failed(format!("reading the body: {err}")))?
        .to_bytes();
    driver.abort();
    Ok(warmcache_kvcache::store::HttpReply {
        status,
        body: body.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn serve_once(reply: &'static [u8]) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = stream.read(&mut buf).await;
            let _ = stream.write_all(reply).await;
            tokio::time::sleep(Duration::from_secs(10)).await;
        });
        addr
    }

    #[tokio::test]
    async fn reads_bodies_refuses_statuses_and_limits_time_and_size() {
        let ok = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
        let reply = get(&ok, "/health").await.unwrap();
        assert_eq!((reply.status, reply.body.as_slice()), (200, &b"ok"[..]));
        let missing = serve_once(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n").await;
        assert_eq!(get(&missing, "/x").await.unwrap().status, 404);
        let silent = serve_once(b"").await;
        assert!(matches!(
            get(&silent, "/x").await.unwrap_err(),
            ScrapeError::Timeout { .. }
        ));
        let huge = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 999999999\r\n\r\n").await;
        let err = get(&huge, "/metrics").await.unwrap_err();
        assert!(
            matches!(
                err,
                ScrapeError::Failed { .. } | ScrapeError::Timeout { .. }
            ),
            "{err}"
        );
        assert_eq!(
            admin_address(DEFAULT_ADMIN_ADDRESS, "kvc", "gpustack-system"),
            "kvc-leader.gpustack-system.svc:9003"
        );
    }
}
