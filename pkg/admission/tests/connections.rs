//! The connection layer: silent, half-open and idle connections are closed, for HTTP/1.1 and
//! HTTP/2, and the number of open connections is bounded.

// Test code: helpers outside #[test] fns may unwrap/panic too (clippy.toml only covers #[test]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warmcache_admission::{
    AdmissionMetrics, AdmissionRequest, AdmissionResponse, AdmissionServer, AdmissionServerConfig,
    CloseReason, DynamicObject, Route,
};

const BODY_TIMEOUT: Duration = Duration::from_millis(700);
const IDLE_TIMEOUT: Duration = Duration::from_secs(4);
/// Far beyond every timeout above: a connection still open then is never closed.
const PATIENCE: Duration = Duration::from_secs(15);

struct Fixture {
    _dir: tempfile::TempDir,
    ca: Ca,
    running: Running,
    metrics: AdmissionMetrics,
}

impl Fixture {
    fn closed(&self, reason: CloseReason) -> u64 {
        self.metrics
            .connections_closed()
            .with_label_values(&[reason.as_str()])
            .get()
    }

    /// Waits until `count` connections were closed for `reason` (the server counts a close
    /// just after the client may have seen it).
    async fn wait_closed(&self, reason: CloseReason, count: u64) {
        eventually(PATIENCE, reason.as_str(), || self.closed(reason) >= count).await;
        assert_eq!(self.closed(reason), count, "{}", reason.as_str());
    }
}

fn start(adjust: impl FnOnce(&mut AdmissionServerConfig)) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    ca.leaf(1).write_to(dir.path());
    let mut config = AdmissionServerConfig::new(files_in(dir.path()));
    config.body_timeout = BODY_TIMEOUT;
    config.idle_timeout = IDLE_TIMEOUT;
    adjust(&mut config);
    let metrics = AdmissionMetrics::new().unwrap();
    let server = AdmissionServer::new(config)
        .route(Route::validating(
            "/ok",
            |req: AdmissionRequest<DynamicObject>| AdmissionResponse::from(&req),
        ))
        .with_metrics(metrics.clone());
    Fixture {
        _dir: dir,
        ca,
        running: spawn_serve(server),
        metrics,
    }
}

fn review_request(uri: String) -> hyper::Request<Full<Bytes>> {
    hyper::Request::post(uri)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            serde_json::to_vec(&pod_review("uid", "p")).unwrap(),
        )))
        .unwrap()
}

async fn assert_reviewed(response: hyper::Response<hyper::body::Incoming>) {
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let review: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(review["response"]["allowed"], true, "{review}");
}

#[tokio::test]
async fn connections_silent_after_the_tls_handshake_are_closed() {
    let f = start(|_| {});
    for alpn in [b"h2".as_slice(), b"http/1.1".as_slice()] {
        let mut stream = connect(f.running.addr, client_config(&[&f.ca], &[alpn]))
            .await
            .unwrap();
        assert_eq!(stream.get_ref().1.alpn_protocol(), Some(alpn));
        assert!(
            closed_within(&mut stream, PATIENCE).await,
            "a silent {} connection was left open",
            String::from_utf8_lossy(alpn)
        );
    }
    f.wait_closed(CloseReason::HeaderTimeout, 2).await;
    eventually(PATIENCE, "no open connections", || {
        f.metrics.connections_open().get() == 0
    })
    .await;
    f.running.stop().await;
}

#[tokio::test]
async fn a_partial_http2_preface_is_closed() {
    let f = start(|_| {});
    let mut stream = connect(f.running.addr, client_config(&[&f.ca], &[b"h2"]))
        .await
        .unwrap();
    // 18 of the preface's 24 bytes.
    stream.write_all(b"PRI * HTTP/2.0\r\n\r\n").await.unwrap();
    stream.flush().await.unwrap();
    assert!(
        closed_within(&mut stream, PATIENCE).await,
        "a connection with half a preface was left open"
    );
    f.wait_closed(CloseReason::HeaderTimeout, 1).await;
    f.running.stop().await;
}

#[tokio::test]
async fn an_idle_http2_connection_is_closed_after_the_idle_timeout() {
    let f = start(|_| {});
    let stream = connect(f.running.addr, client_config(&[&f.ca], &[b"h2"]))
        .await
        .unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    let connection = tokio::spawn(connection);
    let response = sender
        .send_request(review_request(format!("https://{}/ok", f.running.addr)))
        .await
        .unwrap();
    assert_reviewed(response).await;
    let idle = Instant::now();
    // The client keeps `sender`, so only the server can end the connection.
    tokio::time::timeout(PATIENCE, connection)
        .await
        .expect("an idle HTTP/2 connection was left open")
        .unwrap()
        .unwrap();
    // Closed by the idle timeout, not by the much shorter header timeout.
    assert!(idle.elapsed() >= IDLE_TIMEOUT / 2, "{:?}", idle.elapsed());
    f.wait_closed(CloseReason::Idle, 1).await;
    f.wait_closed(CloseReason::HeaderTimeout, 0).await;
    drop(sender);
    f.running.stop().await;
}

#[tokio::test]
async fn http1_keep_alive_lasts_the_idle_timeout_then_closes() {
    let f = start(|_| {});
    let stream = connect(f.running.addr, client_config(&[&f.ca], &[b"http/1.1"]))
        .await
        .unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    assert_reviewed(
        sender
            .send_request(review_request("/ok".into()))
            .await
            .unwrap(),
    )
    .await;

    // Idle for longer than the header timeout, well within the idle timeout: still usable.
    tokio::time::sleep(BODY_TIMEOUT * 2).await;
    sender
        .ready()
        .await
        .expect("the kept-alive connection is still open");
    assert_reviewed(
        sender
            .send_request(review_request("/ok".into()))
            .await
            .unwrap(),
    )
    .await;

    let idle = Instant::now();
    tokio::time::timeout(PATIENCE, connection)
        .await
        .expect("an idle HTTP/1.1 connection was left open")
        .unwrap()
        .unwrap();
    assert!(idle.elapsed() >= IDLE_TIMEOUT / 2, "{:?}", idle.elapsed());
    f.wait_closed(CloseReason::Idle, 1).await;
    drop(sender);
    f.running.stop().await;
}

#[tokio::test]
async fn a_kept_alive_http1_connection_must_finish_its_next_headers_in_time() {
    let f = start(|_| {});
    let mut stream = connect(f.running.addr, client_config(&[&f.ca], &[b"http/1.1"]))
        .await
        .unwrap();
    // One complete request (GET: answered with a 405 and a body of known length)...
    stream
        .write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut received = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&received).contains("with POST\n") {
        let n = stream.read(&mut buf).await.unwrap();
        assert_ne!(n, 0, "closed early: {}", String::from_utf8_lossy(&received));
        received.extend_from_slice(&buf[..n]);
    }
    assert!(received.starts_with(b"HTTP/1.1 405"));
    // ...then the start of another that never finishes.
    stream
        .write_all(b"POST /ok HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    assert!(closed_within(&mut stream, PATIENCE).await);
    f.wait_closed(CloseReason::HeaderTimeout, 1).await;
    f.wait_closed(CloseReason::Idle, 0).await;
    f.running.stop().await;
}

#[tokio::test]
async fn the_connection_limit_makes_new_clients_wait_for_a_free_slot() {
    let f = start(|c| {
        c.max_connections = 2;
        // Long enough that the connections held open here are not closed meanwhile.
        c.body_timeout = Duration::from_secs(30);
    });
    let addr = f.running.addr;
    let first = connect(addr, client_config(&[&f.ca], &[b"http/1.1"]))
        .await
        .unwrap();
    let _second = connect(addr, client_config(&[&f.ca], &[b"h2"]))
        .await
        .unwrap();
    eventually(PATIENCE, "two open connections", || {
        f.metrics.connections_open().get() == 2
    })
    .await;

    // The third is not accepted (its TLS handshake does not progress) while two are open.
    let mut third = tokio::spawn(connect(addr, client_config(&[&f.ca], &[b"http/1.1"])));
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut third)
            .await
            .is_err(),
        "a third connection was accepted beyond the limit of 2"
    );
    assert_eq!(f.metrics.connections_open().get(), 2);
    assert!(f.metrics.connection_limit_waits().get() >= 1);

    // Closing one frees its slot: the waiting client gets in and is served.
    drop(first);
    let third = tokio::time::timeout(PATIENCE, third)
        .await
        .expect("the waiting connection was accepted once a slot was free")
        .unwrap()
        .unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(third))
        .await
        .unwrap();
    tokio::spawn(connection);
    assert_reviewed(
        sender
            .send_request(review_request("/ok".into()))
            .await
            .unwrap(),
    )
    .await;
    f.wait_closed(CloseReason::Client, 1).await;
    assert_eq!(f.metrics.connections_open().get(), 2);
    f.running.stop().await;
}
