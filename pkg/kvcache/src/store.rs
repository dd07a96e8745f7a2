//! Reading the leader's admin endpoints (`mooncake_master`, port 9003) as the real store serves
//! them. The controller makes the HTTP requests and hands each reply ([`Fetch`]) to these pure
//! parsers; the fixtures under `tests/fixtures/mooncake/` are replies of a real
//! `mooncake_master` 0.3.13.post1 started with the flags [`crate::render::leader_args`] renders.
//!
//! - `GET /health`: JSON `{"status":"ok","role":"leader","ha_state":"serving",
//!   "service_ready":true,"leader_address":null,"view_version":null}`; [`parse_health`].
//! - `GET /metrics`: Prometheus text; the four gauges of [`Gauges`]; [`parse_metrics`]. The
//!   store answers 200 with zeroed gauges before its service is ready, so a capacity is taken
//!   only with `service_ready` (see [`crate::status`]).
//! - `GET /get_segments_detail` (0.3.12 and later): JSON `{"total_segments":N,"segments":[...]}`,
//!   one object per mounted segment; [`parse_segments_detail`].
//! - `GET /get_all_segments`: the segment names, one per line (an empty body without segments);
//!   the leader's readiness probe; [`parse_all_segments`].

use serde::Deserialize;

use crate::condition::clip_foreign;

/// `GET /health`.
pub const HEALTH_PATH: &str = "/health";
/// `GET /metrics`.
pub const METRICS_PATH: &str = "/metrics";
/// `GET /get_segments_detail`.
pub const SEGMENTS_DETAIL_PATH: &str = "/get_segments_detail";
/// `GET /get_all_segments`.
pub const ALL_SEGMENTS_PATH: &str = "/get_all_segments";

/// Memory capacity of all mounted segments, bytes.
pub const GAUGE_TOTAL_CAPACITY: &str = "master_total_capacity_bytes";
/// Memory allocated in all segments, bytes.
pub const GAUGE_ALLOCATED: &str = "master_allocated_bytes";
/// Disk-tier capacity of all members (their declared or default ceilings), bytes.
pub const GAUGE_TOTAL_FILE_CAPACITY: &str = "master_total_file_capacity_bytes";
/// Bytes really written to the disk tiers.
pub const GAUGE_ALLOCATED_FILE_SIZE: &str = "master_allocated_file_size_bytes";

/// Disk-tier ceiling a member reports when its tier declares no `capacity`: the store's default
/// `MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES`, 2 TiB (measured on 0.3.13.post1; it really evicts
/// at 90% of the disk, whatever this says).
pub const STORE_DEFAULT_TIER_BYTES: u64 = 2 * 1024 * 1024 * 1024 * 1024;

/// Most segments a listing may hold before it is refused as too large.
pub const MAX_LISTED_SEGMENTS: usize = 5000;
/// Most bytes of identifiers (segment, client and segment names) a listing may hold.
pub const MAX_LISTING_IDENTIFIER_BYTES: usize = 512 * 1024;
/// Largest reply body the parsers read (a listing of 5000 segments is well under it).
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// An HTTP reply from the admin endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpReply {
    /// Status code.
    pub status: u16,
    /// Body (the controller may stop reading at [`MAX_BODY_BYTES`]).
    pub body: Vec<u8>,
}

/// One GET of the admin endpoint: the reply, or why none came (connection refused, timeout,
/// DNS), in the HTTP client's words.
pub type Fetch = Result<HttpReply, String>;

/// Why a reply cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// No reply.
    #[error("the leader's admin endpoint did not answer: {0}")]
    Unreachable(String),
    /// A status other than 200.
    #[error("the leader answered {path} with HTTP {status}: {body}")]
    Status {
        /// Path asked.
        path: &'static str,
        /// Status code.
        status: u16,
        /// Body, clipped.
        body: String,
    },
    /// A 200 whose body is not what the store serves.
    #[error("the leader's {path} reply cannot be read: {reason}")]
    Malformed {
        /// Path asked.
        path: &'static str,
        /// Why.
        reason: String,
    },
}

/// The body of a 200 reply to `path`, or the error.
pub fn ok_body<'a>(path: &'static str, fetch: &'a Fetch) -> Result<&'a [u8], StoreError> {
    match fetch {
        Err(why) => Err(StoreError::Unreachable(clip_foreign(why))),
        Ok(reply) if reply.status != 200 => Err(StoreError::Status {
            path,
            status: reply.status,
            body: clip_foreign(&String::from_utf8_lossy(&reply.body)),
        }),
        Ok(reply) if reply.body.len() > MAX_BODY_BYTES => Err(StoreError::Malformed {
            path,
            reason: format!(
                "the body is {} bytes, more than the {MAX_BODY_BYTES} read",
                reply.body.len()
            ),
        }),
        Ok(reply) => Ok(&reply.body),
    }
}

/// The leader's `/health` reply.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Health {
    /// `ok` when the process is healthy.
    pub status: String,
    /// `leader`, or another role under HA.
    #[serde(default)]
    pub role: Option<String>,
    /// HA state (`serving` for the serving leader).
    #[serde(default)]
    pub ha_state: Option<String>,
    /// Whether the service plane is ready: only then are the metrics meaningful.
    pub service_ready: bool,
    /// Address of the serving leader, under HA.
    #[serde(default)]
    pub leader_address: Option<String>,
}

impl Health {
    /// Whether this leader serves: healthy and its service ready.
    pub fn serving(&self) -> bool {
        self.status == "ok" && self.service_ready
    }
}

fn malformed(path: &'static str, reason: impl Into<String>) -> StoreError {
    StoreError::Malformed {
        path,
        reason: clip_foreign(&reason.into()),
    }
}

/// Parses a `/health` body.
pub fn parse_health(body: &[u8]) -> Result<Health, StoreError> {
    serde_json::from_slice(body).map_err(|e| malformed(HEALTH_PATH, e.to_string()))
}

/// The four gauges of `/metrics` the status reads, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gauges {
    /// [`GAUGE_TOTAL_CAPACITY`].
    pub total_capacity_bytes: u64,
    /// [`GAUGE_ALLOCATED`].
    pub allocated_bytes: u64,
    /// [`GAUGE_TOTAL_FILE_CAPACITY`].
    pub total_file_capacity_bytes: u64,
    /// [`GAUGE_ALLOCATED_FILE_SIZE`].
    pub allocated_file_size_bytes: u64,
}

/// A sample value as a whole number of bytes: a non-negative integer, or a float (`1.5e9`,
/// `0E0`) that is finite, non-negative and whole.
fn sample_bytes(value: &str) -> Option<u64> {
    if let Ok(v) = value.parse::<u64>() {
        return Some(v);
    }
    let v: f64 = value.parse().ok()?;
    // u64::MAX as f64 rounds up to 2^64, so the bound is exclusive.
    (v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 18_446_744_073_709_551_616.0)
        .then_some(v as u64)
}

/// Parses the Prometheus text of `/metrics` and returns the four gauges. Each must appear once,
/// without labels, with a whole non-negative value; comments, other families and labelled
/// samples are skipped.
pub fn parse_metrics(body: &[u8]) -> Result<Gauges, StoreError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| malformed(METRICS_PATH, format!("not UTF-8: {e}")))?;
    let names = [
        GAUGE_TOTAL_CAPACITY,
        GAUGE_ALLOCATED,
        GAUGE_TOTAL_FILE_CAPACITY,
        GAUGE_ALLOCATED_FILE_SIZE,
    ];
    let mut values: [Option<u64>; 4] = [None; 4];
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // `name value [timestamp]`; a labelled sample has `{` right after its name.
        let mut parts = line.split_ascii_whitespace();
        let (Some(name), Some(value)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Some(index) = names.iter().position(|n| *n == name) else {
            continue;
        };
        if values[index].is_some() {
            return Err(malformed(
                METRICS_PATH,
                format!("{name} appears more than once"),
            ));
        }
        let bytes = sample_bytes(value).ok_or_else(|| {
            malformed(
                METRICS_PATH,
                format!("{name} has the value {value:?}, not a whole number of bytes"),
            )
        })?;
        values[index] = Some(bytes);
    }
    let missing: Vec<&str> = names
        .iter()
        .zip(values)
        .filter(|(_, v)| v.is_none())
        .map(|(n, _)| *n)
        .collect();
    match values {
        [
            Some(total),
            Some(allocated),
            Some(file_total),
            Some(file_allocated),
        ] => Ok(Gauges {
            total_capacity_bytes: total,
            allocated_bytes: allocated,
            total_file_capacity_bytes: file_total,
            allocated_file_size_bytes: file_allocated,
        }),
        _ => Err(malformed(
            METRICS_PATH,
            format!("it has no {}", missing.join(", ")),
        )),
    }
}

/// One segment of `/get_segments_detail`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Segment {
    /// The member's advertised `host:port` (its `MOONCAKE_LOCAL_HOSTNAME`, the Pod IP, and its
    /// client port).
    pub segment_name: String,
    /// Segment identifier.
    pub segment_id: String,
    /// Identifier of the client (member) that mounted it.
    pub client_id: String,
    /// Segment size.
    #[serde(default)]
    pub size_bytes: Option<u64>,
    /// Transfer-engine endpoint.
    #[serde(default)]
    pub te_endpoint: Option<String>,
    /// Transfer protocol (`tcp`, `rdma`, ...).
    #[serde(default)]
    pub protocol: Option<String>,
    /// State in the store's words (`OK`, `Draining`, `Unmounting`, ...).
    #[serde(default)]
    pub status: Option<String>,
    /// Bytes allocated in it.
    #[serde(default)]
    pub allocator_used_bytes: Option<u64>,
    /// Its allocator's capacity.
    #[serde(default)]
    pub allocator_capacity_bytes: Option<u64>,
}

impl Segment {
    /// The host part of [`segment_name`](Self::segment_name): before the last `:`, without
    /// brackets (`[fd00::1]:13986` is `fd00::1`). The whole name when it has no port.
    pub fn host(&self) -> &str {
        let name = self.segment_name.as_str();
        if let Some(rest) = name.strip_prefix('[')
            && let Some((host, _)) = rest.split_once(']')
        {
            return host;
        }
        match name.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
                host
            }
            _ => name,
        }
    }
}

/// `/get_segments_detail`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct SegmentsDetail {
    /// The count the store reports.
    pub total_segments: u64,
    /// The segments.
    pub segments: Vec<Segment>,
}

/// Why a listing is refused as too large (more than [`MAX_LISTED_SEGMENTS`] segments or
/// [`MAX_LISTING_IDENTIFIER_BYTES`] of identifiers), or `None`.
pub fn listing_too_large(detail: &SegmentsDetail) -> Option<String> {
    if detail.segments.len() > MAX_LISTED_SEGMENTS {
        return Some(format!(
            "the leader lists {} segments, more than the {MAX_LISTED_SEGMENTS} the status holds",
            detail.segments.len()
        ));
    }
    let bytes: usize = detail
        .segments
        .iter()
        .map(|s| s.segment_id.len() + s.client_id.len() + s.segment_name.len())
        .sum();
    (bytes > MAX_LISTING_IDENTIFIER_BYTES).then(|| {
        format!(
            "the leader's segment identifiers take {bytes} bytes, more than the {MAX_LISTING_IDENTIFIER_BYTES} the status holds"
        )
    })
}

/// Parses a `/get_segments_detail` body.
pub fn parse_segments_detail(body: &[u8]) -> Result<SegmentsDetail, StoreError> {
    serde_json::from_slice(body).map_err(|e| malformed(SEGMENTS_DETAIL_PATH, e.to_string()))
}

/// Parses a `/get_all_segments` body: one segment name per line, blank lines skipped.
pub fn parse_all_segments(body: &[u8]) -> Result<Vec<String>, StoreError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| malformed(ALL_SEGMENTS_PATH, format!("not UTF-8: {e}")))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_values() {
        assert_eq!(sample_bytes("0"), Some(0));
        assert_eq!(sample_bytes("67108864"), Some(67_108_864));
        assert_eq!(sample_bytes("0E0"), Some(0));
        assert_eq!(sample_bytes("1.5e3"), Some(1500));
        assert_eq!(sample_bytes("1.5"), None);
        assert_eq!(sample_bytes("-1"), None);
        assert_eq!(sample_bytes("NaN"), None);
        assert_eq!(sample_bytes("+Inf"), None);
        assert_eq!(sample_bytes("1e30"), None);
    }

    #[test]
    fn hosts() {
        let seg = |name: &str| Segment {
            segment_name: name.to_owned(),
            segment_id: String::new(),
            client_id: String::new(),
            size_bytes: None,
            te_endpoint: None,
            protocol: None,
            status: None,
            allocator_used_bytes: None,
            allocator_capacity_bytes: None,
        };
        assert_eq!(seg("10.0.0.7:13986").host(), "10.0.0.7");
        assert_eq!(seg("[fd00::1]:13986").host(), "fd00::1");
        assert_eq!(seg("10.0.0.7").host(), "10.0.0.7");
        assert_eq!(seg("host:x").host(), "host:x");
    }
}
