//! Helpers shared by the runtime's test binaries.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warmcache_runtime::{Runtime, RuntimeArgs, RuntimeError};
use warmcache_telemetry::LogFormat;
use warmcache_telemetry::tokio_util::sync::CancellationToken;
use warmcache_testkit::ControlPlane;

/// The shared flags of a component under test: the test plane's kubeconfig, an admin server
/// on a free loopback port, plain logs.
pub fn runtime_args(plane: &ControlPlane, shutdown_grace: Duration) -> RuntimeArgs {
    RuntimeArgs {
        kubeconfig: Some(plane.kubeconfig_path().to_path_buf()),
        kube_context: None,
        log_level: Some("warn,warmcache_runtime=info".into()),
        log_format: LogFormat::Plain,
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        shutdown_grace,
        shutdown_delay: Duration::ZERO,
        kube_api_qps: warmcache_runtime::DEFAULT_KUBE_API_QPS,
        kube_api_burst: warmcache_runtime::DEFAULT_KUBE_API_BURST,
    }
}

/// One HTTP/1.1 GET on the admin server: status and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    let status = reply
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = reply
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    (status, body)
}

/// A runtime running in a task, with the token that stops it as SIGTERM would.
pub struct Running {
    pub stop: CancellationToken,
    pub handle: tokio::task::JoinHandle<Result<(), RuntimeError>>,
}

impl Running {
    pub fn start(runtime: Runtime) -> Self {
        let stop = runtime.shutdown_token();
        Self {
            stop,
            handle: tokio::spawn(runtime.run()),
        }
    }

    /// Stops it and asserts it drained cleanly.
    pub async fn stop(self) {
        self.stop.cancel();
        self.handle.await.unwrap().unwrap();
    }
}
