//! The simulated Hub's HTTP answers, byte for byte over a raw connection: ranges (a resumed
//! download), HEAD without a body, the Hub's error codes, hostile paths, and the `/_sim/` API.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warmcache_test_sources::hub::{Hub, HubOptions, Stats, model_files};

/// One HTTP/1.1 request; returns the status, the headers (lowercase names) and the body.
async fn request(addr: &str, head: &str) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("{head}\r\nHost: hub\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.to_ascii_lowercase(), v.trim().to_owned())
        })
        .collect();
    let mut body = raw[split + 4..].to_vec();
    // Chunked bodies (a streamed file without a known length is never sent; JSON may be).
    if let Some(decoded) = dechunk(&body) {
        body = decoded;
    }
    (status, headers, body)
}

fn dechunk(body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = body;
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).ok()?, 16).ok()?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size + 2..)?;
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn ranges_head_errors_and_hostile_paths() {
    let hub = Hub::new(HubOptions::default());
    let files = model_files("org/m", "1", 300_000, 1);
    let commit = hub.publish("org/m", files.clone()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(hub.clone().serve(listener, std::future::pending()));
    let shard = files
        .iter()
        .find(|f| f.path.ends_with(".safetensors"))
        .unwrap();
    let whole = shard.content.to_vec();
    let url = format!("/org/m/resolve/main/{}", shard.path);

    // HEAD: the metadata the client reads, no body, nothing counted.
    let (status, headers, body) = request(&addr, &format!("HEAD {url} HTTP/1.1")).await;
    assert_eq!(status, 200);
    assert!(body.is_empty());
    assert_eq!(header(&headers, "x-repo-commit"), Some(commit.as_str()));
    assert_eq!(
        header(&headers, "etag"),
        Some(format!("\"{}\"", shard.content.sha256()).as_str())
    );
    assert_eq!(header(&headers, "content-length"), Some("300000"));
    assert_eq!(hub.stats().bytes_served, 0);

    // A resumed download: the rest of the file from an offset, byte for byte.
    let (status, headers, body) =
        request(&addr, &format!("GET {url} HTTP/1.1\r\nRange: bytes=70000-")).await;
    assert_eq!(status, 206);
    assert_eq!(
        header(&headers, "content-range"),
        Some("bytes 70000-299999/300000")
    );
    assert!(body == whole[70_000..], "the ranged body differs");
    let (status, _, body) =
        request(&addr, &format!("GET {url} HTTP/1.1\r\nRange: bytes=10-19")).await;
    assert_eq!((status, body.as_slice()), (206, &whole[10..20]));
    let (status, headers, _) = request(
        &addr,
        &format!("GET {url} HTTP/1.1\r\nRange: bytes=300000-"),
    )
    .await;
    assert_eq!(status, 416);
    assert_eq!(header(&headers, "content-range"), Some("bytes */300000"));
    assert_eq!(hub.stats().bytes_served, 230_000 + 10);

    // The Hub's error codes, which the client turns into its exceptions.
    for (head, code) in [
        (
            "GET /org/none/resolve/main/config.json HTTP/1.1",
            "RepoNotFound",
        ),
        (
            "GET /org/m/resolve/nope/config.json HTTP/1.1",
            "RevisionNotFound",
        ),
        (
            "GET /org/m/resolve/main/missing.json HTTP/1.1",
            "EntryNotFound",
        ),
        (
            "GET /api/models/org/m/revision/nope HTTP/1.1",
            "RevisionNotFound",
        ),
        (
            "GET /api/models/org/m/tree/main/nodir HTTP/1.1",
            "EntryNotFound",
        ),
    ] {
        let (status, headers, _) = request(&addr, head).await;
        assert_eq!(status, 404, "{head}");
        assert_eq!(header(&headers, "x-error-code"), Some(code), "{head}");
    }
    // Hostile paths find nothing and serve nothing.
    for head in [
        "GET /org/m/resolve/main/../../etc/passwd HTTP/1.1",
        "GET /org/m/resolve/main/%2e%2e%2fconfig.json HTTP/1.1",
        "GET /org/m/resolve/main/%zz HTTP/1.1",
        "GET /org/m/resolve/%ff/config.json HTTP/1.1",
        "GET /a/b/c/d/resolve/main/config.json HTTP/1.1",
        "PUT /org/m/resolve/main/config.json HTTP/1.1",
    ] {
        let (status, _, _) = request(&addr, head).await;
        assert!((400..500).contains(&status), "{head}: {status}");
    }

    // Info by tag escape, and the simulation's own API.
    let (status, _, body) = request(
        &addr,
        &format!("POST /_sim/repos/org/m/refs/v1?commit={commit} HTTP/1.1\r\nContent-Length: 0"),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let (status, _, body) = request(&addr, "GET /api/models/org/m/revision/v1 HTTP/1.1").await;
    assert_eq!(status, 200);
    let info: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(info["sha"], commit.as_str());
    assert_eq!(info["siblings"].as_array().unwrap().len(), files.len());
    let (status, _, body) = request(&addr, "GET /_sim/stats HTTP/1.1").await;
    assert_eq!(status, 200);
    let stats: Stats = serde_json::from_slice(&body).unwrap();
    assert_eq!(stats.bytes_served, 230_010);
    assert_eq!(stats, hub.stats());
    let (status, _, _) = request(
        &addr,
        "POST /_sim/repos/org/m/refs/v1?commit=0000 HTTP/1.1\r\nContent-Length: 0",
    )
    .await;
    assert_eq!(status, 404);
}
