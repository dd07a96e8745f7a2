//! What a member really holds in host memory, and so what its Pod requests.
//!
//! Upstream requests `localBufferSize + capacityPerMember` (DRAM) or `localBufferSize` (VRAM),
//! which leaves out two buffers the store allocates on its own:
//!
//! - the **transfer (local) buffer**: when `localBufferSize` is unset or 0 nothing is rendered
//!   and the store allocates its default of 1 GiB (`DEFAULT_LOCAL_BUFFER_SIZE` of the store's
//!   client configuration);
//! - the **offload staging buffer** of a member with a disk tier: 1.25 GiB unless the member's
//!   `extraEnv` sets `MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES`. It is resident from the start:
//!   measured on `mooncake-transfer-engine-non-cuda` 0.3.13.post1 (TCP) with a 256Mi segment,
//!   the member's resident set was 94 MiB at idle without a tier and 1379 MiB with one, and
//!   1630 MiB once the segment had filled and buckets reached the tier (332 MiB without a tier).
//!
//! A request below what the process holds lets the scheduler put members on nodes that cannot
//! hold them, and under memory pressure the kubelet evicts the Pods furthest above their
//! request first: a member, whose segment is the cache. So [`member_memory`] requests all of it.
//! The default transfer buffer is not resident until transfers use it (the idle figure above
//! includes it); it is requested anyway, since a member under load touches it.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use warmcache_api_kvcache::v1alpha1::{Medium, MemberGroup};

use crate::error::RenderError;
use crate::quantity;
use crate::validate::member_path;

/// The store's transfer buffer when `localBufferSize` is unset or 0 (1 GiB).
pub const STORE_DEFAULT_LOCAL_BUFFER_BYTES: i64 = 1 << 30;

/// The store's offload staging buffer of a member with a disk tier (1.25 GiB).
pub const STORE_DEFAULT_OFFLOAD_BUFFER_BYTES: i64 = 1_342_177_280;

/// The member variable that sizes the offload staging buffer (not rendered; a group may set it
/// in `extraEnv`, and the request follows it).
pub const OFFLOAD_BUFFER_ENV: &str = "MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES";

/// The host memory a member of a group holds, part by part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberMemory {
    /// The segment in host memory: `capacityPerMember` for DRAM, 0 for VRAM (GPU memory).
    pub segment: i64,
    /// The transfer buffer: `localBufferSize`, or the store's default when unset or 0.
    pub local_buffer: i64,
    /// Whether `local_buffer` is the store's default.
    pub local_buffer_defaulted: bool,
    /// The offload staging buffer: 0 without a tier.
    pub offload_buffer: i64,
    /// The sum, requested by the member container (saturating at 2^63-1 bytes).
    pub request: i64,
}

/// The host memory a member of group `index` holds (see the module documentation).
///
/// Fails only for quantities the validator refuses (unparseable, or a declared segment plus
/// buffer beyond 2^63-1 bytes); the store's defaults are added saturating, so everything the
/// validator admits has a request.
pub fn member_memory(index: usize, group: &MemberGroup) -> Result<MemberMemory, RenderError> {
    let path = member_path(index);
    let segment = bytes(
        &format!("{path}.capacityPerMember"),
        &group.capacity_per_member,
    )?;
    let declared_buffer = match &group.local_buffer_size {
        Some(b) => bytes(&format!("{path}.localBufferSize"), b)?,
        None => 0,
    };
    let segment = if group.medium == Medium::Dram {
        segment
    } else {
        0
    };
    let declared = segment
        .checked_add(declared_buffer)
        .ok_or_else(|| RenderError::TooLarge {
            path: format!("{path}.localBufferSize"),
            value: group
                .local_buffer_size
                .as_ref()
                .map(|q| q.0.clone())
                .unwrap_or_default(),
        })?;
    let local_buffer_defaulted = declared_buffer <= 0;
    let local_buffer = if local_buffer_defaulted {
        STORE_DEFAULT_LOCAL_BUFFER_BYTES
    } else {
        declared_buffer
    };
    let offload_buffer = if group.local_disk().is_some() {
        offload_buffer_bytes(group)
    } else {
        0
    };
    let mut request = declared;
    if local_buffer_defaulted {
        request = request.saturating_add(local_buffer);
    }
    request = request.saturating_add(offload_buffer);
    Ok(MemberMemory {
        segment,
        local_buffer,
        local_buffer_defaulted,
        offload_buffer,
        request,
    })
}

/// The offload staging buffer of a tier member: the group's `extraEnv`
/// [`OFFLOAD_BUFFER_ENV`] when it is a whole number of bytes, else the store's default (the
/// last entry of that name wins, as the container runtime applies them).
pub fn offload_buffer_bytes(group: &MemberGroup) -> i64 {
    group
        .extra_env
        .iter()
        .flatten()
        .rev()
        .find(|e| e.name == OFFLOAD_BUFFER_ENV)
        .and_then(|e| e.value.as_deref())
        .and_then(|v| v.trim().parse::<i64>().ok())
        .filter(|v| *v >= 0)
        .unwrap_or(STORE_DEFAULT_OFFLOAD_BUFFER_BYTES)
}

fn bytes(path: &str, text: &Quantity) -> Result<i64, RenderError> {
    let amount = quantity::parse(text).map_err(|source| RenderError::Quantity {
        path: path.to_owned(),
        source,
    })?;
    amount.ceil_i64().ok_or_else(|| RenderError::TooLarge {
        path: path.to_owned(),
        value: text.0.clone(),
    })
}

#[cfg(test)]
mod tests {
    use warmcache_api_kvcache::v1alpha1::{EnvEntry, LocalDisk};

    use super::*;

    const GI: i64 = 1 << 30;
    const MI: i64 = 1 << 20;

    fn group(medium: Medium, segment: &str, buffer: Option<&str>, tier: bool) -> MemberGroup {
        let mut value = serde_json::json!({
            "nodeSelector": {},
            "medium": if medium == Medium::Dram { "DRAM" } else { "VRAM" },
            "capacityPerMember": segment,
        });
        if let Some(buffer) = buffer {
            value["localBufferSize"] = serde_json::json!(buffer);
        }
        let mut group: MemberGroup = serde_json::from_value(value).unwrap();
        if tier {
            group.local_disks = Some(vec![LocalDisk {
                path: "/var/lib/kvcache".into(),
                capacity: Some(Quantity("1Gi".into())),
                key_limit: None,
                eviction: None,
                clean_after_delete: false,
            }]);
        }
        group
    }

    #[test]
    fn a_dram_member_without_a_tier_requests_its_segment_and_the_default_buffer() {
        let m = member_memory(0, &group(Medium::Dram, "4Gi", None, false)).unwrap();
        assert_eq!(m.segment, 4 * GI);
        assert_eq!(m.local_buffer, GI);
        assert!(m.local_buffer_defaulted);
        assert_eq!(m.offload_buffer, 0);
        assert_eq!(m.request, 5 * GI);
        // 0 renders nothing, so the store's default applies as well.
        let zero = member_memory(0, &group(Medium::Dram, "4Gi", Some("0"), false)).unwrap();
        assert_eq!(zero.request, 5 * GI);
    }

    #[test]
    fn a_declared_buffer_replaces_the_default() {
        let m = member_memory(0, &group(Medium::Dram, "256Mi", Some("16Mi"), false)).unwrap();
        assert!(!m.local_buffer_defaulted);
        assert_eq!(m.request, 272 * MI);
    }

    #[test]
    fn a_tier_member_adds_the_offload_staging_buffer() {
        // The measured case: a 256Mi segment, nothing else declared, held about 1.35-1.6 GiB.
        let m = member_memory(0, &group(Medium::Dram, "256Mi", None, true)).unwrap();
        assert_eq!(m.offload_buffer, STORE_DEFAULT_OFFLOAD_BUFFER_BYTES);
        assert_eq!(m.request, 256 * MI + GI + 1280 * MI);
        assert!(m.request > 1630 * MI, "above the measured resident set");
    }

    #[test]
    fn the_offload_buffer_follows_extra_env() {
        let mut g = group(Medium::Dram, "256Mi", Some("16Mi"), true);
        g.extra_env = Some(vec![
            EnvEntry {
                name: OFFLOAD_BUFFER_ENV.into(),
                value: Some("1".into()),
            },
            EnvEntry {
                name: OFFLOAD_BUFFER_ENV.into(),
                value: Some(" 268435456 ".into()),
            },
        ]);
        let m = member_memory(0, &g).unwrap();
        assert_eq!(m.offload_buffer, 256 * MI);
        assert_eq!(m.request, 528 * MI);
        // Not a number of bytes: the store's default is what it falls back to, and requested.
        g.extra_env = Some(vec![EnvEntry {
            name: OFFLOAD_BUFFER_ENV.into(),
            value: Some("1Gi".into()),
        }]);
        assert_eq!(
            member_memory(0, &g).unwrap().offload_buffer,
            STORE_DEFAULT_OFFLOAD_BUFFER_BYTES
        );
    }

    #[test]
    fn a_vram_member_requests_only_host_buffers() {
        let m = member_memory(0, &group(Medium::Vram, "40Gi", None, false)).unwrap();
        assert_eq!(m.segment, 0);
        assert_eq!(m.request, GI);
        let m = member_memory(0, &group(Medium::Vram, "40Gi", Some("2Gi"), true)).unwrap();
        assert_eq!(m.request, 2 * GI + STORE_DEFAULT_OFFLOAD_BUFFER_BYTES);
    }

    #[test]
    fn defaults_saturate_rather_than_fail() {
        // 10E (decimal) is beyond 2^63-1 bytes: the validator refuses it, and so does rendering.
        assert!(member_memory(0, &group(Medium::Dram, "10E", None, true)).is_err());
        // A declared segment plus buffer beyond it is refused too (the validator's B40).
        assert!(member_memory(0, &group(Medium::Dram, "7Ei", Some("7Ei"), false)).is_err());
        // 8Ei reads as 2^63-1, as Kubernetes caps it; the defaults on top saturate.
        let m = member_memory(0, &group(Medium::Dram, "8Ei", None, true)).unwrap();
        assert_eq!(m.request, i64::MAX);
    }
}
