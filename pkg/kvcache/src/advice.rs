//! Admission **warnings**: configurations the API admits (upstream admits them, and refusing
//! them would change its verdicts) but that were measured not to do what they read as, on the
//! store this operator renders for (`mooncake-transfer-engine-non-cuda` 0.3.13.post1):
//!
//! - a tier too small for one bucket under its eviction marks. The tier is written one bucket
//!   (16Mi, 64 keys) at a time, and each bucket also carries its keys and record headers and a
//!   `.meta` file. Measured: a tier of exactly 16Mi fails every write of 1 MiB objects with
//!   `FILE_WRITE_FAIL` (those bytes count against the quota); at 17Mi the store's default disk
//!   watermark (on, high 0.90, low 0.80) evicts each bucket right after writing it. A tier works
//!   when `capacity x high >= bucket + overhead` and `capacity x low >= bucket` (with eviction
//!   disabled, `capacity >= bucket + overhead`); see [`min_tier_capacity`]. Re-measured with
//!   the default marks: 16Mi and 17Mi kept nothing on disk, 20Mi (this floor) kept one bucket;
//! - `keyLimit` while eviction is enabled: the store applies the key limit only with eviction
//!   disabled, so the field has no effect;
//! - a tier without `capacity`: the store then reports its default ceiling of 2 TiB (in
//!   `status.capacity`) while it really evicts once the disk is 90% full.
//!
//! Every warning names the field and stays under 256 characters, beyond which the API server
//! may cut it. Pure: a function of the backend.

use std::fmt;

use warmcache_api_kvcache::BUCKET_SIZE_FLOOR_BYTES;
use warmcache_api_kvcache::v1alpha1::{KVCacheBackend, LocalDisk};

use crate::quantity;
use crate::validate::member_path;

/// What one bucket carries beyond its 16Mi of values: its keys, the per-record headers and the
/// `.meta` file. Measured: 202 bytes of headers in a bucket of sixteen 1 MB values with short
/// keys and a 440-byte `.meta`; 1 MiB leaves room for 64 keys of up to 16 KiB each.
pub const BUCKET_OVERHEAD_BYTES: i64 = 1 << 20;

/// The store's disk watermark when the tier declares none: high, percent of capacity.
pub const STORE_DEFAULT_HIGH_WATERMARK: i32 = 90;

/// The store's disk watermark when the tier declares none: low, percent of capacity.
pub const STORE_DEFAULT_LOW_WATERMARK: i32 = 80;

/// The longest warning the API server passes on whole.
pub const MAX_WARNING_CHARS: usize = 256;

/// One admission warning: the field and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// Field path, as in refusals.
    pub path: String,
    /// What happens, and what to do.
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// The warnings for `backend` (see the module documentation), in group order. A backend the
/// validator refuses may get warnings too; the webhook only sends them with an admission.
pub fn warnings(backend: &KVCacheBackend) -> Vec<Warning> {
    let Some(managed) = &backend.spec.connection.managed else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (index, group) in managed.members.iter().enumerate() {
        if let Some(tier) = group.local_disk() {
            tier_warnings(
                &format!("{}.localDisks[0]", member_path(index)),
                tier,
                &mut out,
            );
        }
    }
    out
}

/// The eviction marks the store applies to `tier`, in percent: its declared watermark, else the
/// store's default; `None` when eviction is disabled (`eviction.enabled: false`).
pub fn effective_watermark(tier: &LocalDisk) -> Option<(i32, i32)> {
    match &tier.eviction {
        Some(eviction) if !eviction.enabled => None,
        Some(eviction) => Some(eviction.watermark.as_ref().map_or(
            (STORE_DEFAULT_HIGH_WATERMARK, STORE_DEFAULT_LOW_WATERMARK),
            |w| (w.high, w.low),
        )),
        None => Some((STORE_DEFAULT_HIGH_WATERMARK, STORE_DEFAULT_LOW_WATERMARK)),
    }
}

/// The smallest capacity, in bytes, that holds one complete bucket under `watermark` (percent
/// high and low; `None`: eviction disabled): `max(ceil((bucket + overhead) x 100 / high),
/// ceil(bucket x 100 / low))`, or `bucket + overhead` without eviction.
pub fn min_tier_capacity(watermark: Option<(i32, i32)>) -> i64 {
    let bucket = i128::from(BUCKET_SIZE_FLOOR_BYTES);
    let with_overhead = bucket + i128::from(BUCKET_OVERHEAD_BYTES);
    let need = match watermark {
        None => with_overhead,
        Some((high, low)) => {
            let high = i128::from(high.max(1));
            let low = i128::from(low.max(1));
            let by_high = (with_overhead * 100 + high - 1) / high;
            let by_low = (bucket * 100 + low - 1) / low;
            by_high.max(by_low)
        }
    };
    i64::try_from(need).unwrap_or(i64::MAX)
}

fn tier_warnings(path: &str, tier: &LocalDisk, out: &mut Vec<Warning>) {
    let watermark = effective_watermark(tier);
    let capacity = tier
        .capacity
        .as_ref()
        .and_then(|c| quantity::parse(c).ok())
        .and_then(|a| a.ceil_i64())
        .filter(|c| *c > 0);
    match capacity {
        None => out.push(Warning {
            path: format!("{path}.capacity"),
            message: "unset: the store then reports 2Ti as this tier's capacity while it really \
                      evicts at 90% of the disk; set what the tier may use on each node"
                .to_owned(),
        }),
        Some(capacity) => {
            let need = min_tier_capacity(watermark);
            if capacity < need {
                let marks = match watermark {
                    Some((high, low)) => format!("under its marks ({high}%/{low}%)"),
                    None => "with its overhead".to_owned(),
                };
                out.push(Warning {
                    path: format!("{path}.capacity"),
                    message: format!(
                        "{capacity} bytes hold no complete 16Mi bucket {marks}: every write \
                         fails or each bucket is evicted as it is written; use at least {}",
                        ceil_mib(need)
                    ),
                });
            }
        }
    }
    if tier.key_limit.is_some_and(|k| k > 0) && watermark.is_some() {
        out.push(Warning {
            path: format!("{path}.keyLimit"),
            message: "has no effect while eviction is enabled: the store applies a key limit \
                      only with eviction.enabled: false"
                .to_owned(),
        });
    }
}

/// `bytes` rounded up to whole MiB, written as a quantity (`20Mi`).
fn ceil_mib(bytes: i64) -> String {
    let mib = (i128::from(bytes) + (1 << 20) - 1) >> 20;
    format!("{mib}Mi")
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use warmcache_api_kvcache::v1alpha1::{Eviction, Watermark};

    use super::*;

    const MI: i64 = 1 << 20;

    fn tier(
        capacity: Option<&str>,
        key_limit: Option<i64>,
        eviction: Option<Eviction>,
    ) -> LocalDisk {
        LocalDisk {
            path: "/var/lib/kvcache".into(),
            capacity: capacity.map(|c| Quantity(c.into())),
            key_limit,
            eviction,
            clean_after_delete: false,
        }
    }

    fn of(tier: &LocalDisk) -> Vec<Warning> {
        let mut out = Vec::new();
        tier_warnings("t", tier, &mut out);
        out
    }

    fn marks(high: i32, low: i32) -> Option<Eviction> {
        Some(Eviction {
            enabled: true,
            policy: None,
            watermark: Some(Watermark { high, low }),
        })
    }

    fn disabled() -> Option<Eviction> {
        Some(Eviction {
            enabled: false,
            policy: None,
            watermark: None,
        })
    }

    #[test]
    fn the_floor_under_the_stores_default_marks_is_20mi() {
        // max(ceil(17Mi / 0.90), 16Mi / 0.80) = max(18.9Mi, 20Mi).
        assert_eq!(min_tier_capacity(Some((90, 80))), 20 * MI);
        assert_eq!(min_tier_capacity(None), 17 * MI);
        // A high mark close to 100 with a low one far below: the low mark decides.
        assert_eq!(min_tier_capacity(Some((100, 50))), 32 * MI);
        // Both marks high: the overhead under the high mark decides.
        assert!(min_tier_capacity(Some((95, 94))) > 17 * MI);
    }

    #[test]
    fn the_measured_failures_warn_and_a_working_tier_does_not() {
        // 16Mi: every 1 MiB write failed. 17Mi: each bucket evicted as written.
        for capacity in ["16Mi", "17Mi", "19Mi"] {
            let w = of(&tier(Some(capacity), None, None));
            assert_eq!(w.len(), 1, "{capacity}: {w:?}");
            assert_eq!(w[0].path, "t.capacity");
            assert!(
                w[0].message.contains("use at least 20Mi"),
                "{}",
                w[0].message
            );
            assert!(w[0].message.contains("(90%/80%)"), "{}", w[0].message);
        }
        assert_eq!(of(&tier(Some("20Mi"), None, None)), vec![]);
        assert_eq!(of(&tier(Some("4Ti"), None, None)), vec![]);
        // Declared marks are the ones judged.
        let w = of(&tier(Some("20Mi"), None, marks(100, 50)));
        assert!(w[0].message.contains("(100%/50%)") && w[0].message.contains("32Mi"));
        assert_eq!(of(&tier(Some("32Mi"), None, marks(100, 50))), vec![]);
        // Without eviction only the overhead counts.
        let w = of(&tier(Some("16Mi"), None, disabled()));
        assert!(w[0].message.contains("with its overhead") && w[0].message.contains("17Mi"));
        assert_eq!(of(&tier(Some("17Mi"), None, disabled())), vec![]);
        // An eviction block without marks keeps the store's default marks.
        assert_eq!(
            of(&tier(Some("17Mi"), None, Some(Eviction::default()))).len(),
            1
        );
    }

    #[test]
    fn a_tier_without_capacity_warns_that_2ti_is_reported() {
        for capacity in [None, Some("0")] {
            let w = of(&tier(capacity, None, None));
            assert_eq!(w.len(), 1);
            assert_eq!(w[0].path, "t.capacity");
            assert!(w[0].message.contains("2Ti") && w[0].message.contains("90% of the disk"));
        }
    }

    #[test]
    fn key_limit_warns_only_while_eviction_is_enabled() {
        let w = of(&tier(Some("1Gi"), Some(100_000), None));
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].path, "t.keyLimit");
        assert_eq!(
            of(&tier(Some("1Gi"), Some(100_000), marks(90, 80))).len(),
            1
        );
        assert_eq!(of(&tier(Some("1Gi"), Some(100_000), disabled())), vec![]);
        // 0 sets no limit.
        assert_eq!(of(&tier(Some("1Gi"), Some(0), None)), vec![]);
    }

    #[test]
    fn every_warning_fits_what_the_api_server_passes_on() {
        let path = format!("{}.localDisks[0]", member_path(31));
        let mut out = Vec::new();
        tier_warnings(&path, &tier(None, Some(1), None), &mut out);
        tier_warnings(
            &path,
            &tier(Some("16777217"), Some(1), marks(100, 1)),
            &mut out,
        );
        tier_warnings(&path, &tier(Some("16Mi"), None, disabled()), &mut out);
        assert_eq!(out.len(), 5);
        for w in &out {
            let text = w.to_string();
            assert!(
                text.chars().count() <= MAX_WARNING_CHARS,
                "{} chars: {text}",
                text.len()
            );
        }
    }
}
