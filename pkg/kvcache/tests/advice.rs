//! Admission warnings of whole backends (`warmcache_kvcache::advice::warnings`): which of the
//! reference vectors draw which warning, at which field, and that none is a refusal.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::json;
use warmcache_kvcache::advice::warnings;
use warmcache_kvcache::vectors::{self, members, tier0, with};
use warmcache_kvcache::{ValidationContext, from_value, validate};

fn paths(value: serde_json::Value) -> Vec<String> {
    let backend = from_value(value).unwrap();
    assert_eq!(
        validate(&backend, None, &ValidationContext::default()),
        vec![],
        "warnings are only about admitted backends here"
    );
    warnings(&backend).into_iter().map(|w| w.path).collect()
}

#[test]
fn a_backend_without_a_tier_draws_none() {
    assert_eq!(paths(vectors::v1()), Vec::<String>::new());
}

#[test]
fn the_full_tier_vector_draws_only_the_key_limit_warning() {
    // V2: 4Ti, keyLimit 10000000, eviction enabled with LRU and 90/80 marks.
    assert_eq!(
        paths(vectors::v2()),
        ["spec.connection.managed.members[0].localDisks[0].keyLimit"]
    );
    // With eviction disabled the key limit applies (and marks and policy must go).
    assert_eq!(
        paths(with(vectors::v2(), |o| {
            tier0(o)["eviction"] = json!({"enabled": false});
        })),
        Vec::<String>::new()
    );
}

#[test]
fn the_boundary_vector_is_admitted_with_the_small_tier_warning() {
    // V3: capacity exactly 16Mi is admitted (upstream's verdict), and measured not to work.
    let value = with(vectors::v2(), |o| {
        members(o)[0]["capacityPerMember"] = json!("16Mi");
        tier0(o)["capacity"] = json!("16Mi");
        tier0(o)["keyLimit"] = json!(64);
        tier0(o)["eviction"] = json!({"enabled": false});
    });
    assert_eq!(
        paths(value),
        ["spec.connection.managed.members[0].localDisks[0].capacity"]
    );
}

#[test]
fn a_tier_without_capacity_on_the_second_group() {
    let value = with(vectors::v1(), |o| {
        members(o).as_array_mut().unwrap().push(
            json!({"nodeSelector": {}, "medium": "DRAM", "capacityPerMember": "1Gi",
                "localDisks": [{"path": "/var/lib/kvcache"}]}),
        );
    });
    assert_eq!(
        paths(value),
        ["spec.connection.managed.members[1].localDisks[0].capacity"]
    );
}
