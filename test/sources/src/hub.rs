//! A **simulation** of the Hugging Face Hub: the part of its HTTP API that the real `hf download`
//! client (PyPI `huggingface_hub`, 2.x) uses to download a model repository, over plain HTTP on
//! loopback. Point a client at it with `HF_ENDPOINT=http://<address>`.
//!
//! Served:
//! - `GET /api/models/{repo}` and `GET /api/models/{repo}/revision/{revision}`: the repository's
//!   info at a revision (a branch, a tag or a 40-hex commit): `sha` and `siblings`;
//! - `GET /api/models/{repo}/tree/{revision}[/{path}]?recursive=`: the tree listing (`oid`,
//!   `size`, and `lfs` with the SHA-256 for large files);
//! - `HEAD` and `GET /{repo}/resolve/{revision}/{path}`: the file, with `X-Repo-Commit`, `ETag`
//!   (the SHA-256 of an LFS file, a content id otherwise), `Content-Length` and byte ranges
//!   (`Range: bytes=N-` for a resumed download);
//! - errors as the Hub signals them (`X-Error-Code`: `RepoNotFound`, `RevisionNotFound`,
//!   `EntryNotFound`, `GatedRepo`), so the client raises its own exceptions.
//!
//! Not served: uploads, Xet storage (no `X-Xet-*` header is sent, so clients use plain HTTP),
//! pagination (listings are short), datasets and spaces.
//!
//! What the real Hub does not have, under `/_sim/`: `GET /_sim/stats` (bytes of file bodies
//! served, in all and per repository, and counts of requests), and `POST
//! /_sim/repos/{repo}/refs/{name}?commit=SHA` to move a branch or tag (a re-pointed tag). The
//! same operations are methods of [`Hub`] for in-process tests. A rate limit shared by every
//! download plays a WAN link.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::content::{BLOCK, Content};

/// The default branch, as on the Hub.
pub const DEFAULT_BRANCH: &str = "main";

/// A file of a commit.
#[derive(Clone, Debug)]
pub struct FileSpec {
    /// Path in the repository (`a/b.json`).
    pub path: String,
    pub content: Content,
    /// Stored in LFS (weights, large tokenizers): its ETag is its SHA-256, like on the Hub.
    pub lfs: bool,
}

/// Options of a simulated Hub.
#[derive(Clone, Debug, Default)]
pub struct HubOptions {
    /// Bytes per second shared by every file download (a WAN link); `None`: as fast as loopback.
    pub rate_limit: Option<u64>,
}

/// Errors of the simulation's own operations.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HubError {
    #[error("repository {0:?} does not exist")]
    NoRepo(String),
    #[error("repository {repo:?} has no commit {commit:?}")]
    NoCommit { repo: String, commit: String },
    #[error(
        "{0:?} is not a repository id: one or two segments of letters, digits, '-', '_' and '.'"
    )]
    BadRepoId(String),
    #[error("{0:?} is not a file path of a repository")]
    BadPath(String),
}

#[derive(Debug)]
struct File {
    content: Content,
    lfs: bool,
    sha256: OnceLock<String>,
}

impl File {
    fn sha256(&self) -> &str {
        self.sha256.get_or_init(|| self.content.sha256())
    }

    /// The Hub's `oid`: the git blob id. Ours is a 40-hex content id derived from the SHA-256
    /// (clients treat it as opaque; the Hub's is the git SHA-1).
    fn oid(&self) -> String {
        let digest = Sha256::digest(format!("blob {}", self.sha256()).as_bytes());
        hex::encode(&digest[..20])
    }

    fn etag(&self) -> String {
        if self.lfs {
            self.sha256().to_owned()
        } else {
            self.oid()
        }
    }
}

/// The files of one commit, by path.
type Tree = Arc<BTreeMap<String, Arc<File>>>;

#[derive(Debug, Default)]
struct Repo {
    commits: BTreeMap<String, Tree>,
    refs: BTreeMap<String, String>,
    /// A gated repository answers only requests carrying `Authorization: Bearer <token>`.
    token: Option<String>,
}

impl Repo {
    fn resolve(&self, revision: &str) -> Option<(String, Tree)> {
        let sha = self.refs.get(revision).map_or(revision, String::as_str);
        self.commits
            .get(sha)
            .map(|files| (sha.to_owned(), Arc::clone(files)))
    }
}

#[derive(Debug, Default)]
struct Counters {
    bytes_served: AtomicU64,
    file_requests: AtomicU64,
    api_requests: AtomicU64,
}

#[derive(Debug)]
struct Inner {
    repos: Mutex<BTreeMap<String, Repo>>,
    counters: Counters,
    by_repo: Mutex<BTreeMap<String, u64>>,
    limiter: Option<Limiter>,
}

/// What the simulation served since it started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    /// Bytes of file bodies sent (GET of `/resolve/`; a HEAD sends none).
    pub bytes_served: u64,
    /// The same, per repository.
    pub bytes_by_repo: BTreeMap<String, u64>,
    /// `HEAD` and `GET` requests of `/resolve/`.
    pub file_requests: u64,
    /// Requests of `/api/`.
    pub api_requests: u64,
}

/// A simulated Hub; cheap to clone (clones share everything).
#[derive(Clone, Debug)]
pub struct Hub {
    inner: Arc<Inner>,
}

impl Hub {
    pub fn new(options: HubOptions) -> Self {
        Hub {
            inner: Arc::new(Inner {
                repos: Mutex::new(BTreeMap::new()),
                counters: Counters::default(),
                by_repo: Mutex::new(BTreeMap::new()),
                limiter: options.rate_limit.filter(|r| *r > 0).map(Limiter::new),
            }),
        }
    }

    /// Adds a commit with exactly `files` to `repo` (created if new) and points `main` at it.
    /// Returns the commit's 40-hex id.
    pub fn publish(&self, repo: &str, files: Vec<FileSpec>) -> Result<String, HubError> {
        check_repo_id(repo)?;
        for f in &files {
            check_path(&f.path)?;
        }
        let mut repos = lock(&self.inner.repos);
        let entry = repos.entry(repo.to_owned()).or_default();
        let parent = entry.refs.get(DEFAULT_BRANCH).cloned().unwrap_or_default();
        let mut hasher = Sha256::new();
        hasher.update(repo.as_bytes());
        hasher.update([0]);
        hasher.update(parent.as_bytes());
        hasher.update([0]);
        hasher.update(entry.commits.len().to_le_bytes());
        let tree: BTreeMap<String, Arc<File>> = files
            .into_iter()
            .map(|f| {
                hasher.update(f.path.as_bytes());
                hasher.update(f.content.len().to_le_bytes());
                (
                    f.path,
                    Arc::new(File {
                        content: f.content,
                        lfs: f.lfs,
                        sha256: OnceLock::new(),
                    }),
                )
            })
            .collect();
        let sha = hex::encode(&hasher.finalize()[..20]);
        entry.commits.insert(sha.clone(), Arc::new(tree));
        entry.refs.insert(DEFAULT_BRANCH.to_owned(), sha.clone());
        Ok(sha)
    }

    /// Points branch or tag `name` of `repo` at `commit` (creating it): a moved tag.
    pub fn set_ref(&self, repo: &str, name: &str, commit: &str) -> Result<(), HubError> {
        let mut repos = lock(&self.inner.repos);
        let entry = repos
            .get_mut(repo)
            .ok_or_else(|| HubError::NoRepo(repo.to_owned()))?;
        if !entry.commits.contains_key(commit) {
            return Err(HubError::NoCommit {
                repo: repo.to_owned(),
                commit: commit.to_owned(),
            });
        }
        entry.refs.insert(name.to_owned(), commit.to_owned());
        Ok(())
    }

    /// Makes `repo` gated: only requests with `Authorization: Bearer <token>` are answered.
    pub fn gate(&self, repo: &str, token: &str) -> Result<(), HubError> {
        let mut repos = lock(&self.inner.repos);
        let entry = repos
            .get_mut(repo)
            .ok_or_else(|| HubError::NoRepo(repo.to_owned()))?;
        entry.token = Some(token.to_owned());
        Ok(())
    }

    /// The commit a revision of `repo` names now.
    pub fn resolve(&self, repo: &str, revision: &str) -> Option<String> {
        lock(&self.inner.repos)
            .get(repo)
            .and_then(|r| r.resolve(revision))
            .map(|(sha, _)| sha)
    }

    /// What was served so far.
    pub fn stats(&self) -> Stats {
        let c = &self.inner.counters;
        Stats {
            bytes_served: c.bytes_served.load(Ordering::Relaxed),
            bytes_by_repo: lock(&self.inner.by_repo).clone(),
            file_requests: c.file_requests.load(Ordering::Relaxed),
            api_requests: c.api_requests.load(Ordering::Relaxed),
        }
    }

    /// The HTTP API (see the module documentation).
    pub fn router(&self) -> Router {
        Router::new()
            .route("/_sim/stats", get(stats_handler))
            .route("/_sim/repos/{*rest}", post(set_ref_handler))
            .fallback(hub_handler)
            .with_state(self.clone())
    }

    /// Serves the API on `listener` until `shutdown` completes.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown)
            .await
    }

    /// Serves the API on a free port of 127.0.0.1 until the runtime ends; returns the address.
    pub async fn serve_loopback(&self) -> std::io::Result<std::net::SocketAddr> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(self.clone().serve(listener, std::future::pending()));
        Ok(addr)
    }

    fn count_bytes(&self, repo: &str, n: u64) {
        self.inner
            .counters
            .bytes_served
            .fetch_add(n, Ordering::Relaxed);
        *lock(&self.inner.by_repo)
            .entry(repo.to_owned())
            .or_insert(0) += n;
    }
}

/// The files of a realistic model repository of about `weight_bytes` bytes of weights, as a
/// Hugging Face model repository lays them out: `shards` safetensors-like shards with their
/// index, `config.json`, `generation_config.json`, `tokenizer_config.json` and a tokenizer.
/// `salt` changes every generated byte (a new upload of the same names).
pub fn model_files(repo: &str, salt: &str, weight_bytes: u64, shards: u32) -> Vec<FileSpec> {
    let shards = shards.max(1);
    let per_shard = weight_bytes / u64::from(shards);
    let mut files = Vec::new();
    let mut weight_map = serde_json::Map::new();
    for i in 1..=shards {
        let name = format!("model-{i:05}-of-{shards:05}.safetensors");
        let size = if i == shards {
            weight_bytes - per_shard * u64::from(shards - 1)
        } else {
            per_shard
        };
        weight_map.insert(format!("model.layers.{i}.weight"), json!(name));
        files.push(FileSpec {
            content: Content::generated(&[repo, salt, &name], size),
            path: name,
            lfs: true,
        });
    }
    let literal = |path: &str, value: serde_json::Value| FileSpec {
        path: path.to_owned(),
        content: Content::Literal(Bytes::from(
            serde_json::to_vec_pretty(&value).unwrap_or_default(),
        )),
        lfs: false,
    };
    files.push(literal(
        "model.safetensors.index.json",
        json!({"metadata": {"total_size": weight_bytes}, "weight_map": weight_map}),
    ));
    files.push(literal(
        "config.json",
        json!({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16", "_name_or_path": repo, "salt": salt}),
    ));
    files.push(literal(
        "generation_config.json",
        json!({"bos_token_id": 1, "eos_token_id": 2}),
    ));
    files.push(literal(
        "tokenizer_config.json",
        json!({"tokenizer_class": "PreTrainedTokenizerFast"}),
    ));
    files.push(FileSpec {
        path: "tokenizer.json".to_owned(),
        content: Content::generated(&[repo, salt, "tokenizer.json"], 256 * 1024),
        lfs: true,
    });
    files
}

/// Shared pacing of every download: each chunk is sent when the link would have carried it.
#[derive(Debug)]
struct Limiter {
    bytes_per_second: u64,
    next: tokio::sync::Mutex<Option<Instant>>,
}

impl Limiter {
    fn new(bytes_per_second: u64) -> Self {
        Limiter {
            bytes_per_second,
            next: tokio::sync::Mutex::new(None),
        }
    }

    async fn take(&self, n: u64) {
        let until = {
            let mut next = self.next.lock().await;
            let now = Instant::now();
            let start = next.filter(|t| *t > now).unwrap_or(now);
            let until = start + Duration::from_secs_f64(n as f64 / self.bytes_per_second as f64);
            *next = Some(until);
            until
        };
        tokio::time::sleep_until(until).await;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn check_repo_id(repo: &str) -> Result<(), HubError> {
    let segments: Vec<&str> = repo.split('/').collect();
    let ok = (1..=2).contains(&segments.len())
        && segments.iter().all(|s| {
            !s.is_empty()
                && *s != "."
                && *s != ".."
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        });
    if ok {
        Ok(())
    } else {
        Err(HubError::BadRepoId(repo.to_owned()))
    }
}

fn check_path(path: &str) -> Result<(), HubError> {
    let ok = !path.is_empty()
        && path
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != ".." && !s.contains('\0'));
    if ok {
        Ok(())
    } else {
        Err(HubError::BadPath(path.to_owned()))
    }
}

/// Decodes `%XX` escapes; `None` for a malformed escape or bytes that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let mut response = (status, axum::Json(json!({ "error": message }))).into_response();
    let headers = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(code) {
        headers.insert("x-error-code", v);
    }
    if let Ok(v) = HeaderValue::from_str(message) {
        headers.insert("x-error-message", v);
    }
    response
}

async fn stats_handler(State(hub): State<Hub>) -> Response {
    axum::Json(hub.stats()).into_response()
}

#[derive(Deserialize)]
struct RefQuery {
    commit: String,
}

async fn set_ref_handler(
    State(hub): State<Hub>,
    uri: Uri,
    Query(query): Query<RefQuery>,
) -> Response {
    // /_sim/repos/{repo}/refs/{name}
    let rest = uri.path().trim_start_matches("/_sim/repos/");
    let Some((repo, name)) = rest.rsplit_once("/refs/") else {
        return error(
            StatusCode::NOT_FOUND,
            "NotFound",
            "expected /_sim/repos/{repo}/refs/{name}?commit=SHA",
        );
    };
    let (Some(repo), Some(name)) = (percent_decode(repo), percent_decode(name)) else {
        return error(StatusCode::BAD_REQUEST, "BadRequest", "malformed escape");
    };
    match hub.set_ref(&repo, &name, &query.commit) {
        Ok(()) => {
            axum::Json(json!({ "repo": repo, "ref": name, "commit": query.commit })).into_response()
        }
        Err(e) => error(StatusCode::NOT_FOUND, "NotFound", &e.to_string()),
    }
}

/// The Hub's own routes: `/api/models/...` and `/{repo}/resolve/...`.
async fn hub_handler(
    State(hub): State<Hub>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let path = uri.path();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if let Some(rest) = path.strip_prefix("/api/models/") {
        hub.inner
            .counters
            .api_requests
            .fetch_add(1, Ordering::Relaxed);
        if method != Method::GET {
            return error(StatusCode::METHOD_NOT_ALLOWED, "NotAllowed", "GET only");
        }
        return api(&hub, rest, uri.query().unwrap_or(""), &headers);
    }
    // {repo}/resolve/{revision}/{path...}, the repo id one or two segments.
    let at = match segments.iter().position(|s| *s == "resolve") {
        Some(at @ (1 | 2)) if segments.len() > at + 2 => at,
        _ => return error(StatusCode::NOT_FOUND, "NotFound", "no such route"),
    };
    if method != Method::GET && method != Method::HEAD {
        return error(StatusCode::METHOD_NOT_ALLOWED, "NotAllowed", "GET or HEAD");
    }
    hub.inner
        .counters
        .file_requests
        .fetch_add(1, Ordering::Relaxed);
    let repo = segments[..at].join("/");
    let (Some(revision), Some(file)) = (
        percent_decode(segments[at + 1]),
        percent_decode(&segments[at + 2..].join("/")),
    ) else {
        return error(StatusCode::BAD_REQUEST, "BadRequest", "malformed escape");
    };
    resolve(
        &hub,
        &repo,
        &revision,
        &file,
        method == Method::HEAD,
        &headers,
    )
}

/// Looks a revision of a repository up, with the Hub's errors.
fn lookup(
    hub: &Hub,
    repo: &str,
    revision: &str,
    headers: &HeaderMap,
) -> Result<(String, Tree), Box<Response>> {
    let repos = lock(&hub.inner.repos);
    let Some(r) = repos.get(repo) else {
        return Err(Box::new(error(
            StatusCode::NOT_FOUND,
            "RepoNotFound",
            &format!("Repository Not Found for url: {repo}"),
        )));
    };
    if let Some(token) = &r.token {
        let expected = format!("Bearer {token}");
        let given = headers
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes);
        if given != Some(expected.as_bytes()) {
            return Err(Box::new(error(
                StatusCode::UNAUTHORIZED,
                "GatedRepo",
                &format!(
                    "Access to model {repo} is restricted. You must have access to it and be authenticated to access it."
                ),
            )));
        }
    }
    r.resolve(revision).ok_or_else(|| {
        Box::new(error(
            StatusCode::NOT_FOUND,
            "RevisionNotFound",
            &format!("Invalid rev id: {revision}"),
        ))
    })
}

fn api(hub: &Hub, rest: &str, query: &str, headers: &HeaderMap) -> Response {
    let segments: Vec<&str> = rest.split('/').collect();
    // {repo} | {repo}/revision/{rev} | {repo}/tree/{rev}[/{path}]
    let marker = segments
        .iter()
        .position(|s| *s == "revision" || *s == "tree")
        .filter(|at| (1..=2).contains(at));
    let (repo, kind, revision, sub) = match marker {
        Some(at) if segments.len() > at + 1 => (
            segments[..at].join("/"),
            segments[at],
            segments[at + 1],
            segments[at + 2..].join("/"),
        ),
        None if (1..=2).contains(&segments.len()) => (
            segments.join("/"),
            "revision",
            DEFAULT_BRANCH,
            String::new(),
        ),
        _ => return error(StatusCode::NOT_FOUND, "NotFound", "no such route"),
    };
    let (Some(revision), Some(sub)) = (percent_decode(revision), percent_decode(&sub)) else {
        return error(StatusCode::BAD_REQUEST, "BadRequest", "malformed escape");
    };
    let (sha, files) = match lookup(hub, &repo, &revision, headers) {
        Ok(found) => found,
        Err(response) => return *response,
    };
    if kind == "revision" {
        let siblings: Vec<_> = files.keys().map(|p| json!({ "rfilename": p })).collect();
        return axum::Json(json!({
            "_id": sha,
            "id": repo,
            "modelId": repo,
            "sha": sha,
            "private": false,
            "gated": false,
            "disabled": false,
            "tags": [],
            "siblings": siblings,
        }))
        .into_response();
    }
    let recursive = query
        .split('&')
        .any(|kv| kv == "recursive=True" || kv == "recursive=true" || kv == "recursive=1");
    let prefix = if sub.is_empty() {
        String::new()
    } else {
        format!("{sub}/")
    };
    let mut entries = Vec::new();
    let mut dirs = std::collections::BTreeSet::new();
    for (path, file) in files.iter() {
        let Some(below) = path.strip_prefix(&prefix) else {
            continue;
        };
        // Every directory between the listed one and the file.
        let parts: Vec<&str> = below.split('/').collect();
        for depth in 1..parts.len() {
            if depth > 1 && !recursive {
                break;
            }
            dirs.insert(format!("{prefix}{}", parts[..depth].join("/")));
        }
        if parts.len() > 1 && !recursive {
            continue;
        }
        let mut entry = json!({
            "type": "file",
            "oid": file.oid(),
            "size": file.content.len(),
            "path": path,
        });
        if file.lfs {
            entry["lfs"] = json!({
                "oid": file.sha256(),
                "size": file.content.len(),
                "pointerSize": 134,
            });
        }
        entries.push(entry);
    }
    if entries.is_empty() && dirs.is_empty() && !sub.is_empty() {
        return error(
            StatusCode::NOT_FOUND,
            "EntryNotFound",
            &format!("{sub} does not exist on {revision}"),
        );
    }
    let mut listing: Vec<_> = dirs
        .into_iter()
        .map(|d| json!({ "type": "directory", "oid": "0".repeat(40), "size": 0, "path": d }))
        .collect();
    listing.extend(entries);
    axum::Json(listing).into_response()
}

fn resolve(
    hub: &Hub,
    repo: &str,
    revision: &str,
    path: &str,
    head: bool,
    headers: &HeaderMap,
) -> Response {
    let (sha, files) = match lookup(hub, repo, revision, headers) {
        Ok(found) => found,
        Err(response) => return *response,
    };
    let Some(file) = files.get(path).cloned() else {
        return error(
            StatusCode::NOT_FOUND,
            "EntryNotFound",
            &format!("{path} does not exist on {revision}"),
        );
    };
    let total = file.content.len();
    let range = match headers.get(header::RANGE).map(|v| parse_range(v, total)) {
        None => None,
        Some(Some(range)) => Some(range),
        Some(None) => {
            let mut response = error(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "RangeNotSatisfiable",
                "unsatisfiable range",
            );
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{total}")) {
                response.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return response;
        }
    };
    let (start, end) = range.unwrap_or((0, total));
    let mut response_headers = HeaderMap::new();
    let mut put = |name: header::HeaderName, value: String| {
        if let Ok(v) = HeaderValue::from_str(&value) {
            response_headers.insert(name, v);
        }
    };
    put(header::HeaderName::from_static("x-repo-commit"), sha);
    put(header::ETAG, format!("\"{}\"", file.etag()));
    put(header::ACCEPT_RANGES, "bytes".to_owned());
    put(header::CONTENT_LENGTH, (end - start).to_string());
    put(header::CONTENT_TYPE, "application/octet-stream".to_owned());
    let status = if range.is_some() {
        put(
            header::CONTENT_RANGE,
            format!("bytes {start}-{}/{total}", end.saturating_sub(1)),
        );
        StatusCode::PARTIAL_CONTENT
    } else {
        StatusCode::OK
    };
    if head {
        return (status, response_headers).into_response();
    }
    let hub = hub.clone();
    let repo = repo.to_owned();
    let stream = futures::stream::unfold(start, move |offset| {
        let file = Arc::clone(&file);
        let hub = hub.clone();
        let repo = repo.clone();
        async move {
            if offset >= end {
                return None;
            }
            let want = usize::try_from((end - offset).min(BLOCK)).unwrap_or(BLOCK as usize);
            let chunk: Bytes = file.content.chunk(offset, want);
            if chunk.is_empty() {
                return None;
            }
            let n = chunk.len() as u64;
            if let Some(limiter) = &hub.inner.limiter {
                limiter.take(n).await;
            }
            hub.count_bytes(&repo, n);
            Some((Ok::<Bytes, std::convert::Infallible>(chunk), offset + n))
        }
    });
    (status, response_headers, Body::from_stream(stream)).into_response()
}

/// `bytes=START-[END]` (one range) within a file of `total` bytes, as a half-open range.
fn parse_range(value: &HeaderValue, total: u64) -> Option<(u64, u64)> {
    let spec = value.to_str().ok()?.trim().strip_prefix("bytes=")?;
    let (first, last) = spec.split_once('-')?;
    if first.is_empty() {
        // bytes=-N: the last N bytes.
        let n: u64 = last.parse().ok()?;
        if n == 0 || total == 0 {
            return None;
        }
        return Some((total.saturating_sub(n), total));
    }
    let start: u64 = first.parse().ok()?;
    let end = if last.is_empty() {
        total
    } else {
        last.parse::<u64>().ok()?.saturating_add(1).min(total)
    };
    (start < total && start < end).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(parse_range(&v("bytes=0-"), 10), Some((0, 10)));
        assert_eq!(parse_range(&v("bytes=3-5"), 10), Some((3, 6)));
        assert_eq!(parse_range(&v("bytes=3-50"), 10), Some((3, 10)));
        assert_eq!(parse_range(&v("bytes=-4"), 10), Some((6, 10)));
        assert_eq!(parse_range(&v("bytes=10-"), 10), None);
        assert_eq!(parse_range(&v("bytes=5-3"), 10), None);
        assert_eq!(parse_range(&v("items=0-"), 10), None);
        assert_eq!(parse_range(&v("bytes=x-"), 10), None);
    }

    #[test]
    fn ids_paths_and_escapes() {
        assert!(check_repo_id("org/model-1.5_b").is_ok());
        assert!(check_repo_id("gpt2").is_ok());
        for bad in ["", "a/b/c", "../x", "a/", "a b"] {
            assert!(check_repo_id(bad).is_err(), "{bad}");
        }
        assert!(check_path("a/b.json").is_ok());
        for bad in ["", "/a", "a//b", "a/../b", "./a"] {
            assert!(check_path(bad).is_err(), "{bad}");
        }
        assert_eq!(
            percent_decode("refs%2Fpr%2F1").as_deref(),
            Some("refs/pr/1")
        );
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%4"), None);
    }

    #[test]
    fn publishing_moves_main_and_refs_move_on_request() {
        let hub = Hub::new(HubOptions::default());
        let first = hub
            .publish("org/m", model_files("org/m", "1", 1000, 2))
            .unwrap();
        hub.set_ref("org/m", "v1", &first).unwrap();
        let second = hub
            .publish("org/m", model_files("org/m", "2", 1000, 2))
            .unwrap();
        assert_ne!(first, second);
        assert_eq!(first.len(), 40);
        assert_eq!(
            hub.resolve("org/m", "main").as_deref(),
            Some(second.as_str())
        );
        assert_eq!(hub.resolve("org/m", "v1").as_deref(), Some(first.as_str()));
        assert_eq!(
            hub.resolve("org/m", &first).as_deref(),
            Some(first.as_str())
        );
        hub.set_ref("org/m", "v1", &second).unwrap();
        assert_eq!(hub.resolve("org/m", "v1").as_deref(), Some(second.as_str()));
        assert_eq!(
            hub.set_ref("org/m", "v1", "0000"),
            Err(HubError::NoCommit {
                repo: "org/m".into(),
                commit: "0000".into()
            })
        );
        assert_eq!(
            hub.set_ref("org/x", "v1", &first),
            Err(HubError::NoRepo("org/x".into()))
        );
        assert!(hub.publish("a/b/c", Vec::new()).is_err());
    }

    #[test]
    fn model_files_are_a_loadable_layout() {
        let files = model_files("org/m", "s", 10_000, 3);
        let total: u64 = files
            .iter()
            .filter(|f| f.path.ends_with(".safetensors"))
            .map(|f| f.content.len())
            .sum();
        assert_eq!(total, 10_000);
        let index = files
            .iter()
            .find(|f| f.path == "model.safetensors.index.json")
            .unwrap();
        let index: serde_json::Value = serde_json::from_slice(&index.content.to_vec()).unwrap();
        assert_eq!(index["metadata"]["total_size"], 10_000);
        assert_eq!(
            index["weight_map"]["model.layers.3.weight"],
            "model-00003-of-00003.safetensors"
        );
    }
}
