//! Serde round trip of the reference YAML vectors V1, V2 and V9 (section 10).

// Test helpers outside #[test] functions may fail loudly too (clippy.toml allows it only inside).
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use warmcache_api_kvcache::v1alpha1::{
    AllocationStrategy, BackendType, EvictionPolicy, HostPathType, KVCacheBackend, Medium, Protocol,
};

const HEADER: &str = "\
apiVersion: worker.gpustack.ai/v1alpha1
kind: KVCacheBackend
metadata: {name: kvc}
spec:
  image: docker.io/kvcacheai/mooncake:0.3.13
  connection:
    managed:
      leader: {}
      members:
";

const V1: &str = r#"      - nodeSelector: {kvcache: "true"}
        medium: DRAM
        capacityPerMember: 4Gi
"#;

const V2: &str = r#"      - nodeSelector: {kvcache: "true"}
        medium: DRAM
        capacityPerMember: 500Gi
        localDisks:
        - path: /var/lib/kvcache
          capacity: 4Ti
          keyLimit: 10000000
          eviction: {enabled: true, policy: LRU, watermark: {high: 90, low: 80}}
"#;

const V9: &str = r#"      - nodeSelector: {kvcache: "true"}
        medium: DRAM
        capacityPerMember: 4Gi
      - nodeSelector: {kvcache-disk: "true"}
        medium: DRAM
        capacityPerMember: 500Gi
        localDisks:
        - path: /var/lib/kvcache
          capacity: 4Ti
      scaleIn: {gracePeriodSeconds: 30}
"#;

/// Parses `HEADER + members` and checks that JSON and YAML serialization read back equal.
fn round_trip(members: &str) -> KVCacheBackend {
    let yaml = format!("{HEADER}{members}");
    let parsed: KVCacheBackend = serde_saphyr::from_str(&yaml).expect("vector parses");

    let json = serde_json::to_string(&parsed).expect("serializes to JSON");
    let from_json: KVCacheBackend = serde_json::from_str(&json).expect("JSON reads back");
    assert_eq!(from_json, parsed);

    let yaml_out = serde_saphyr::to_string(&parsed).expect("serializes to YAML");
    let from_yaml: KVCacheBackend = serde_saphyr::from_str(&yaml_out).expect("YAML reads back");
    assert_eq!(from_yaml, parsed);

    // Nothing the vector said is lost: every field of the input is in the output with the
    // same value (the output adds only defaults).
    let input: serde_json::Value = serde_saphyr::from_str(&yaml).expect("vector as JSON");
    let output = serde_json::to_value(&parsed).expect("to JSON value");
    assert_contains(&output, &input, "");
    parsed
}

/// Asserts that `outer` holds everything in `inner`.
fn assert_contains(outer: &serde_json::Value, inner: &serde_json::Value, path: &str) {
    match (outer, inner) {
        (serde_json::Value::Object(o), serde_json::Value::Object(i)) => {
            for (key, value) in i {
                let at = format!("{path}.{key}");
                let Some(found) = o.get(key) else {
                    panic!("{at} lost in the round trip")
                };
                assert_contains(found, value, &at);
            }
        }
        (serde_json::Value::Array(o), serde_json::Value::Array(i)) => {
            assert_eq!(o.len(), i.len(), "{path}: length");
            for (n, (found, value)) in o.iter().zip(i).enumerate() {
                assert_contains(found, value, &format!("{path}[{n}]"));
            }
        }
        _ => assert_eq!(outer, inner, "{path}"),
    }
}

#[test]
fn v1_dram_only() {
    let backend = round_trip(V1);
    assert_eq!(backend.metadata.name.as_deref(), Some("kvc"));
    let spec = &backend.spec;
    assert_eq!(spec.type_, BackendType::Mooncake);
    assert_eq!(spec.transport.protocol, Protocol::Auto);
    let managed = spec.connection.managed.as_ref().expect("managed");
    assert!(spec.connection.external.is_none());
    assert_eq!(managed.leader.replicas, 1);
    assert_eq!(
        managed.leader.allocation_strategy,
        AllocationStrategy::FreeRatioFirst
    );
    let group = &managed.members[0];
    assert_eq!(group.medium, Medium::Dram);
    assert_eq!(group.capacity_per_member, Quantity("4Gi".into()));
    assert_eq!(group.fabric_interface_count, 1);
    assert!(group.local_disk().is_none());
}

#[test]
fn v2_full_tier() {
    let backend = round_trip(V2);
    let managed = backend.spec.connection.managed.as_ref().expect("managed");
    let tier = managed.members[0].local_disk().expect("tier");
    assert_eq!(tier.path, "/var/lib/kvcache");
    assert_eq!(tier.capacity, Some(Quantity("4Ti".into())));
    assert_eq!(tier.key_limit, Some(10_000_000));
    assert!(!tier.clean_after_delete);
    let eviction = tier.eviction.as_ref().expect("eviction");
    assert!(eviction.enabled);
    assert_eq!(eviction.policy, Some(EvictionPolicy::Lru));
    let watermark = eviction.watermark.as_ref().expect("watermark");
    assert_eq!((watermark.high, watermark.low), (90, 80));
}

#[test]
fn v9_tier_on_second_group() {
    let backend = round_trip(V9);
    let managed = backend.spec.connection.managed.as_ref().expect("managed");
    assert_eq!(managed.members.len(), 2);
    assert!(managed.members[0].local_disk().is_none());
    let tier = managed.members[1].local_disk().expect("tier on group 1");
    assert!(tier.eviction.is_none());
    let scale_in = managed.scale_in.as_ref().expect("scaleIn");
    assert_eq!(scale_in.grace_period_seconds, Some(30));
}

#[test]
fn enum_spellings() {
    let text = serde_json::to_string(&[Protocol::Rdma, Protocol::Cann, Protocol::Auto])
        .expect("serializes");
    assert_eq!(text, r#"["RDMA","CANN","Auto"]"#);
    let text = serde_json::to_string(&[Medium::Dram, Medium::Vram]).expect("serializes");
    assert_eq!(text, r#"["DRAM","VRAM"]"#);
    let text = serde_json::to_string(&HostPathType::Unchecked).expect("serializes");
    assert_eq!(text, r#""""#);
}
