//! Admission cases for the `KVCacheBackend` CRD, shared by the client-side CEL test
//! (`tests/cel.rs`, kube-cel) and the integration test against a real kube-apiserver.
//!
//! Every object is a complete, schema-valid `KVCacheBackend` built from vector V2 of the
//! reference (section 10) and varied. [`cases`] holds what the CRD's CEL rules decide;
//! [`schema_cases`] holds what the plain OpenAPI schema refuses (enums, bounds, maxItems), which
//! only a real API server checks.
//!
//! `message` is a substring of the refusal the API server returns (for CEL cases, of the rule's
//! message).

#![allow(dead_code)] // each test target uses part of this module

use serde_json::{Value, json};

/// One admission attempt: a create (`old` is `None`) or an update of `old` to `new`.
pub struct Case {
    /// What the case shows, starting with the reference vector id where there is one.
    pub name: &'static str,
    /// The stored object, for an update.
    pub old: Option<Value>,
    /// The object sent.
    pub new: Value,
    /// Whether admission accepts it.
    pub allowed: bool,
    /// A substring of the refusal, when refused.
    pub message: Option<&'static str>,
    /// For a CEL case the plain schema refuses first on a real API server (the server then skips
    /// CEL): a substring of that schema refusal. kube-cel evaluates only the rules, so
    /// `tests/cel.rs` still sees `message`.
    pub schema_message: Option<&'static str>,
}

const IMAGE: &str = "docker.io/kvcacheai/mooncake:0.3.13";

/// A backend named `kvc` with the given member groups and the V2 header.
fn backend(members: Vec<Value>) -> Value {
    json!({
        "apiVersion": "worker.gpustack.ai/v1alpha1",
        "kind": "KVCacheBackend",
        "metadata": {"name": "kvc"},
        "spec": {
            "image": IMAGE,
            "connection": {"managed": {"leader": {}, "members": members}},
        },
    })
}

/// The V2 tier: `/var/lib/kvcache`, 4Ti, 10M keys, LRU, 90/80.
fn v2_tier() -> Value {
    json!({
        "path": "/var/lib/kvcache",
        "capacity": "4Ti",
        "keyLimit": 10_000_000,
        "eviction": {"enabled": true, "policy": "LRU", "watermark": {"high": 90, "low": 80}},
    })
}

/// The V2 member group (DRAM, 500Gi) carrying `tier`.
fn group_with(tier: Value) -> Value {
    json!({
        "nodeSelector": {"kvcache": "true"},
        "medium": "DRAM",
        "capacityPerMember": "500Gi",
        "localDisks": [tier],
    })
}

/// A member group without a tier.
fn plain_group(label: &str, medium: &str, capacity: &str) -> Value {
    json!({
        "nodeSelector": {"kvcache": label},
        "medium": medium,
        "capacityPerMember": capacity,
    })
}

/// V1: DRAM only, no tier.
pub fn v1() -> Value {
    backend(vec![plain_group("true", "DRAM", "4Gi")])
}

/// V2: one group with the full tier.
pub fn v2() -> Value {
    backend(vec![group_with(v2_tier())])
}

/// V9: two groups, the tier on the second; `scaleIn.gracePeriodSeconds: 30`.
pub fn v9() -> Value {
    let mut obj = backend(vec![
        plain_group("true", "DRAM", "4Gi"),
        json!({
            "nodeSelector": {"kvcache-disk": "true"},
            "medium": "DRAM",
            "capacityPerMember": "500Gi",
            "localDisks": [v2_tier()],
        }),
    ]);
    obj["spec"]["connection"]["managed"]["scaleIn"] = json!({"gracePeriodSeconds": 30});
    obj
}

/// An external backend publishing both endpoints.
pub fn external() -> Value {
    json!({
        "apiVersion": "worker.gpustack.ai/v1alpha1",
        "kind": "KVCacheBackend",
        "metadata": {"name": "kvc"},
        "spec": {
            "connection": {"external": {"endpoints": [
                {"name": "Client", "address": "store.example.internal:50051"},
                {"name": "Admin", "address": "store.example.internal:9003"},
            ]}},
        },
    })
}

/// `base` with `f` applied.
fn with(mut base: Value, f: impl FnOnce(&mut Value)) -> Value {
    f(&mut base);
    base
}

/// `spec.connection.managed.members` of `obj`.
fn members(obj: &mut Value) -> &mut Value {
    &mut obj["spec"]["connection"]["managed"]["members"]
}

/// `members[0].localDisks[0]` of `obj`.
fn tier0(obj: &mut Value) -> &mut Value {
    &mut members(obj)[0]["localDisks"][0]
}

/// Appends `item` to the array `list`.
fn push(list: &mut Value, item: Value) {
    if let Some(items) = list.as_array_mut() {
        items.push(item);
    }
}

/// Removes `key` from the object `obj`.
fn remove(obj: &mut Value, key: &str) {
    if let Some(fields) = obj.as_object_mut() {
        fields.remove(key);
    }
}

fn ok(name: &'static str, old: Option<Value>, new: Value) -> Case {
    Case {
        name,
        old,
        new,
        allowed: true,
        message: None,
        schema_message: None,
    }
}

fn refused(name: &'static str, old: Option<Value>, new: Value, message: &'static str) -> Case {
    Case {
        name,
        old,
        new,
        allowed: false,
        message: Some(message),
        schema_message: None,
    }
}

/// Marks a refused case whose object the schema refuses before CEL runs on a real API server.
fn shadowed_by_schema(mut case: Case, schema_message: &'static str) -> Case {
    case.schema_message = Some(schema_message);
    case
}

/// Cases decided by the CRD's CEL rules (every rule, admitted and refused, on create and update).
pub fn cases() -> Vec<Case> {
    vec![
        // ---- admitted on create ----
        ok("V1 create: DRAM only, no tier", None, v1()),
        ok("V2 create: full tier", None, v2()),
        ok(
            "V3 create: boundary values (16Mi segment, 16Mi tier, 64 keys)",
            None,
            with(v2(), |o| {
                members(o)[0]["capacityPerMember"] = json!("16Mi");
                tier0(o)["capacity"] = json!("16Mi");
                tier0(o)["keyLimit"] = json!(64);
            }),
        ),
        ok(
            "V4 create: eviction disabled, nothing else in the block",
            None,
            with(v2(), |o| tier0(o)["eviction"] = json!({"enabled": false})),
        ),
        ok(
            "V5 create: empty eviction block (enabled defaults to true)",
            None,
            with(v2(), |o| tier0(o)["eviction"] = json!({})),
        ),
        ok(
            "V6 create: policy without capacity",
            None,
            with(v2(), |o| {
                let tier = tier0(o);
                tier["eviction"] = json!({"policy": "FIFO"});
                remove(tier, "capacity");
            }),
        ),
        ok(
            "V7 create: a '..data' path component is not '..'",
            None,
            with(v2(), |o| tier0(o)["path"] = json!("/mnt/..data/kv")),
        ),
        ok(
            "V8 create: capacity 0 without eviction",
            None,
            with(v2(), |o| {
                let tier = tier0(o);
                tier["capacity"] = json!("0");
                remove(tier, "eviction");
            }),
        ),
        ok("V9 create: tier on the second of two groups", None, v9()),
        ok(
            "V14 create: leader extraArgs",
            None,
            with(v2(), |o| {
                o["spec"]["connection"]["managed"]["leader"]["extraArgs"] =
                    json!(["-default_kv_lease_ttl=10m", "-client_ttl=30"]);
            }),
        ),
        ok(
            "create: quantities written as integers",
            None,
            with(v2(), |o| {
                members(o)[0]["capacityPerMember"] = json!(536_870_912_000_i64);
                members(o)[0]["localBufferSize"] = json!(0);
                tier0(o)["capacity"] = json!(4_398_046_511_104_i64);
            }),
        ),
        ok(
            "create: watermark with an integer capacity",
            None,
            with(v2(), |o| tier0(o)["capacity"] = json!(1_073_741_824)),
        ),
        ok(
            "create: localBufferSize 0 and positive",
            None,
            with(v2(), |o| members(o)[0]["localBufferSize"] = json!("1Gi")),
        ),
        ok(
            "create: three leader replicas with highAvailability",
            None,
            with(v2(), |o| {
                o["spec"]["connection"]["managed"]["leader"] =
                    json!({"replicas": 3, "highAvailability": {}});
            }),
        ),
        ok(
            "create: VRAM group next to the tier group",
            None,
            with(v2(), |o| {
                push(members(o), plain_group("gpu", "VRAM", "16Gi"));
            }),
        ),
        ok("create: external backend", None, external()),
        // ---- refused on create ----
        refused(
            "neither managed nor external",
            None,
            with(v1(), |o| o["spec"]["connection"] = json!({})),
            "one of managed or external must be set",
        ),
        refused(
            "X30 create: both managed and external",
            None,
            with(v1(), |o| {
                o["spec"]["connection"]["external"] =
                    external()["spec"]["connection"]["external"].clone();
            }),
            "only one of managed or external may be set",
        ),
        refused(
            "create: two leader replicas without highAvailability",
            None,
            with(v2(), |o| {
                o["spec"]["connection"]["managed"]["leader"] = json!({"replicas": 2});
            }),
            "more than one leader replica requires highAvailability",
        ),
        refused(
            "X11 create: eviction disabled with a policy",
            None,
            with(v2(), |o| {
                tier0(o)["eviction"] = json!({"enabled": false, "policy": "LRU"});
            }),
            "policy cannot be set while eviction is disabled",
        ),
        refused(
            "X12 create: eviction disabled with a watermark",
            None,
            with(v2(), |o| {
                tier0(o)["eviction"] =
                    json!({"enabled": false, "watermark": {"high": 90, "low": 80}});
            }),
            "watermark cannot be set while eviction is disabled",
        ),
        refused(
            "X13 create: watermark without capacity",
            None,
            with(v2(), |o| {
                remove(tier0(o), "capacity");
            }),
            "capacity must be set above 0 when eviction.watermark is set",
        ),
        refused(
            "X14 create: equal watermarks",
            None,
            with(v2(), |o| {
                tier0(o)["eviction"]["watermark"] = json!({"high": 80, "low": 80});
            }),
            "low must be below high",
        ),
        refused(
            "X14 create: inverted watermarks",
            None,
            with(v2(), |o| {
                tier0(o)["eviction"]["watermark"] = json!({"high": 70, "low": 80});
            }),
            "low must be below high",
        ),
        refused(
            "X18 create: two groups each with localDisks",
            None,
            with(v2(), |o| {
                let second = with(group_with(v2_tier()), |g| {
                    g["nodeSelector"] = json!({"kvcache": "second"});
                    g["localDisks"][0]["path"] = json!("/var/lib/kvcache2");
                });
                push(members(o), second);
            }),
            "only one member group may declare localDisks",
        ),
        // ---- admitted on update ----
        ok("update: nothing changed", Some(v2()), v2()),
        ok(
            "V10 update: drop the last group, which carries the tier",
            Some(v9()),
            with(v9(), |o| {
                if let Some(m) = members(o).as_array_mut() {
                    m.truncate(1);
                }
            }),
        ),
        ok(
            "V11 update: tier capacity, keyLimit, eviction and cleanAfterDelete edited in place",
            Some(v2()),
            with(v2(), |o| {
                let tier = tier0(o);
                tier["capacity"] = json!("8Ti");
                tier["keyLimit"] = json!(20_000_000);
                tier["eviction"] = json!({"enabled": true, "policy": "FIFO", "watermark": {"high": 95, "low": 60}});
                tier["cleanAfterDelete"] = json!(true);
            }),
        ),
        ok(
            "V12 update: nodeSelector widened",
            Some(v2()),
            with(v2(), |o| {
                members(o)[0]["nodeSelector"] = json!({});
            }),
        ),
        ok(
            "V13 update: append a group with a tier",
            Some(v1()),
            with(v1(), |o| {
                let tiered = with(group_with(v2_tier()), |g| {
                    g["nodeSelector"] = json!({"kvcache-disk": "true"});
                });
                push(members(o), tiered);
            }),
        ),
        ok(
            "update: drop the last group (no tier) behind the tier group",
            Some(with(v2(), |o| {
                push(members(o), plain_group("gpu", "VRAM", "16Gi"));
            })),
            v2(),
        ),
        ok(
            "update: external endpoints edited",
            Some(external()),
            with(external(), |o| {
                o["spec"]["connection"]["external"]["endpoints"][0]["address"] =
                    json!("store2.example.internal:50051");
            }),
        ),
        // ---- refused on update ----
        refused(
            "X24 update: localDisks added to existing group 0",
            Some(with(v2(), |o| {
                remove(&mut members(o)[0], "localDisks");
            })),
            v2(),
            "a localDisks tier cannot be added to an existing member group",
        ),
        refused(
            "X25 update: localDisks removed from group 0",
            Some(v2()),
            with(v2(), |o| {
                remove(&mut members(o)[0], "localDisks");
            }),
            "a localDisks tier cannot be removed from an existing member group",
        ),
        refused(
            "X25 update: localDisks emptied on group 0",
            Some(v2()),
            with(v2(), |o| members(o)[0]["localDisks"] = json!([])),
            "a localDisks tier cannot be removed from an existing member group",
        ),
        refused(
            "X26 update: tier path changed",
            Some(v2()),
            with(v2(), |o| tier0(o)["path"] = json!("/var/lib/kv2")),
            "the localDisks path is immutable",
        ),
        refused(
            "X27 update: first group (with the tier) dropped",
            Some(with(v2(), |o| {
                push(members(o), plain_group("other", "DRAM", "4Gi"));
            })),
            backend(vec![plain_group("other", "DRAM", "4Gi")]),
            "a localDisks tier cannot be removed from an existing member group",
        ),
        refused(
            "X28 update: groups swapped",
            Some(with(v2(), |o| {
                push(members(o), plain_group("other", "DRAM", "4Gi"));
            })),
            with(v2(), |o| {
                if let Some(m) = members(o).as_array_mut() {
                    m.insert(0, plain_group("other", "DRAM", "4Gi"));
                }
            }),
            "a localDisks tier cannot be added to an existing member group",
        ),
        refused(
            "X29 update: medium DRAM to VRAM",
            Some(v2()),
            with(v2(), |o| members(o)[0]["medium"] = json!("VRAM")),
            "medium is immutable",
        ),
        refused(
            "X29 update: medium of the second group changed",
            Some(v9()),
            with(v9(), |o| members(o)[1]["medium"] = json!("VRAM")),
            "medium is immutable",
        ),
        refused(
            "X18 update: a second tier group appended",
            Some(v2()),
            with(v2(), |o| {
                let second = with(group_with(v2_tier()), |g| {
                    g["nodeSelector"] = json!({"kvcache": "second"});
                    g["localDisks"][0]["path"] = json!("/var/lib/kvcache2");
                });
                push(members(o), second);
            }),
            "only one member group may declare localDisks",
        ),
        // While `type` has a single enum value, the schema refuses any change before the
        // immutability rule runs; the rule guards the day a second type is added.
        shadowed_by_schema(
            refused(
                "update: type changed",
                Some(v2()),
                with(v2(), |o| o["spec"]["type"] = json!("Redis")),
                "type is immutable",
            ),
            "supported values: \"Mooncake\"",
        ),
        refused(
            "update: connection branch changed from managed to external",
            Some(v1()),
            external(),
            "the connection branch is immutable",
        ),
        refused(
            "update: connection branch changed from external to managed",
            Some(external()),
            v1(),
            "the connection branch is immutable",
        ),
        refused(
            "X14 update: watermarks inverted on an existing tier",
            Some(v2()),
            with(v2(), |o| {
                tier0(o)["eviction"]["watermark"] = json!({"high": 80, "low": 90});
            }),
            "low must be below high",
        ),
    ]
}

/// Cases refused by the OpenAPI schema itself rather than by a CEL rule. kube-cel does not check
/// these (it evaluates CEL only); a real API server does.
pub fn schema_cases() -> Vec<Case> {
    vec![
        refused(
            "X15 create: eviction policy MRU",
            None,
            with(v2(), |o| tier0(o)["eviction"]["policy"] = json!("MRU")),
            "MRU",
        ),
        refused(
            "X16 create: watermark high 101",
            None,
            with(v2(), |o| {
                tier0(o)["eviction"]["watermark"] = json!({"high": 101, "low": 5});
            }),
            "less than or equal to 100",
        ),
        refused(
            "X17 create: two localDisks entries",
            None,
            with(v2(), |o| {
                let second = with(v2_tier(), |t| t["path"] = json!("/var/lib/kvcache2"));
                push(&mut members(o)[0]["localDisks"], second);
            }),
            "must have at most 1 item",
        ),
        refused(
            "X31 create: scaleIn.gracePeriodSeconds 3601",
            None,
            with(v2(), |o| {
                o["spec"]["connection"]["managed"]["scaleIn"] = json!({"gracePeriodSeconds": 3601});
            }),
            "less than or equal to 3600",
        ),
        refused(
            "create: six leader replicas",
            None,
            with(v2(), |o| {
                o["spec"]["connection"]["managed"]["leader"] =
                    json!({"replicas": 6, "highAvailability": {}});
            }),
            "less than or equal to 5",
        ),
        refused(
            "create: keyLimit negative",
            None,
            with(v2(), |o| tier0(o)["keyLimit"] = json!(-1)),
            "greater than or equal to 0",
        ),
        refused(
            "create: no member groups",
            None,
            with(v2(), |o| *members(o) = json!([])),
            "at least 1 item",
        ),
        refused(
            "create: medium HBM",
            None,
            with(v2(), |o| members(o)[0]["medium"] = json!("HBM")),
            "HBM",
        ),
        refused(
            "create: capacityPerMember not a quantity",
            None,
            with(v2(), |o| members(o)[0]["capacityPerMember"] = json!("lots")),
            "should match",
        ),
        refused(
            "create: hostPaths path not absolute",
            None,
            with(v2(), |o| {
                members(o)[0]["hostPaths"] =
                    json!([{"path": "var/run/x", "mountPath": "/run/x", "type": ""}]);
            }),
            "should match",
        ),
        refused(
            "create: fabricInterfaceCount 0",
            None,
            with(v2(), |o| members(o)[0]["fabricInterfaceCount"] = json!(0)),
            "greater than or equal to 1",
        ),
        refused(
            "create: runtimeClassName not a DNS subdomain",
            None,
            with(v2(), |o| {
                members(o)[0]["runtimeClassName"] = json!("Bad_Name")
            }),
            "should match",
        ),
        refused(
            "create: transport protocol QUIC",
            None,
            with(v2(), |o| {
                o["spec"]["transport"] = json!({"protocol": "QUIC"})
            }),
            "QUIC",
        ),
        refused(
            "create: external endpoint named Metrics",
            None,
            with(external(), |o| {
                o["spec"]["connection"]["external"]["endpoints"][1]["name"] = json!("Metrics");
            }),
            "Metrics",
        ),
    ]
}
