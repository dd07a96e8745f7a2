//! The test vectors of reference section 10 (V1-V14 admitted, X1-X33 refused) plus boundary
//! and ratchet cases, as data shared by this crate's tests, the operator's tests against a real
//! API server, and the fuzz target's seed corpus. Built only with the `vectors` feature.
//!
//! Every object is named `kvc` (X32 excepted); a test that stores them renames them.
//!
//! Each refusal says which layer refuses it on a real API server: the CRD's OpenAPI schema, one
//! of its CEL rules, or the operator's webhook. The schema and CEL run before validating
//! webhooks, so a vector refused there never reaches the webhook; [`crate::validate()`] refuses all
//! of them, with the path and reason given here.

use serde_json::{Value, json};

/// The image of every vector.
pub const IMAGE: &str = "docker.io/kvcacheai/mooncake:0.3.13";

/// Which layer of a real API server refuses a vector first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    /// The OpenAPI schema (enum, bounds, maxItems); the text is a substring of its message.
    Schema(&'static str),
    /// A CEL rule of the CRD; the text is a substring of its message.
    Cel(&'static str),
    /// The operator's validating webhook.
    Webhook,
}

/// What should happen to a vector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted.
    Admitted,
    /// Refused: [`crate::validate()`] reports `reason` (a substring) at `path`; on a real API
    /// server `layer` refuses it first.
    Refused {
        /// Field path of the refusal.
        path: &'static str,
        /// Substring of the reason.
        reason: &'static str,
        /// Which server layer refuses it.
        layer: Layer,
    },
}

/// One admission attempt: a create (`old` is `None`) or an update of `old` to `new`.
#[derive(Clone, Debug)]
pub struct Vector {
    /// Reference id (`V1`, `X27`) or our own (`B..` boundary, `R..` ratchet).
    pub id: &'static str,
    /// What the vector shows.
    pub what: &'static str,
    /// The stored object, for an update. Ratchet vectors hold objects that today's rules refuse
    /// (admitted under older ones); a test storing them must bypass the webhook for the create.
    pub old: Option<Value>,
    /// The object sent.
    pub new: Value,
    /// The expected verdict.
    pub verdict: Verdict,
}

/// A backend named `kvc` with the given member groups.
pub fn backend(members: Vec<Value>) -> Value {
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
pub fn v2_tier() -> Value {
    json!({
        "path": "/var/lib/kvcache",
        "capacity": "4Ti",
        "keyLimit": 10_000_000,
        "eviction": {"enabled": true, "policy": "LRU", "watermark": {"high": 90, "low": 80}},
    })
}

/// The V2 member group (DRAM, 500Gi) with the V2 tier.
pub fn v2_group() -> Value {
    json!({
        "nodeSelector": {"kvcache": "true"},
        "medium": "DRAM",
        "capacityPerMember": "500Gi",
        "localDisks": [v2_tier()],
    })
}

/// A DRAM group without a tier.
pub fn plain_group(label: &str) -> Value {
    json!({"nodeSelector": {"kvcache": label}, "medium": "DRAM", "capacityPerMember": "4Gi"})
}

/// V1: DRAM only, no tier.
pub fn v1() -> Value {
    backend(vec![plain_group("true")])
}

/// V2: one group with the full tier.
pub fn v2() -> Value {
    backend(vec![v2_group()])
}

/// V4: V2 with eviction disabled.
pub fn v4() -> Value {
    with(v2(), |o| tier0(o)["eviction"] = json!({"enabled": false}))
}

/// V9: two groups, the tier on the second; `scaleIn.gracePeriodSeconds: 30`.
pub fn v9() -> Value {
    let mut disk_group = v2_group();
    disk_group["nodeSelector"] = json!({"kvcache-disk": "true"});
    let mut obj = backend(vec![plain_group("true"), disk_group]);
    obj["spec"]["connection"]["managed"]["scaleIn"] = json!({"gracePeriodSeconds": 30});
    obj
}

/// An external backend publishing both endpoints.
pub fn external() -> Value {
    json!({
        "apiVersion": "worker.gpustack.ai/v1alpha1",
        "kind": "KVCacheBackend",
        "metadata": {"name": "kvc"},
        "spec": {"connection": {"external": {"endpoints": [
            {"name": "Client", "address": "store.example.internal:50051"},
            {"name": "Admin", "address": "store.example.internal:9003"},
        ]}}},
    })
}

/// `base` with `f` applied.
pub fn with(mut base: Value, f: impl FnOnce(&mut Value)) -> Value {
    f(&mut base);
    base
}

/// `spec.connection.managed` of `obj`.
pub fn managed(obj: &mut Value) -> &mut Value {
    &mut obj["spec"]["connection"]["managed"]
}

/// `spec.connection.managed.members` of `obj`.
pub fn members(obj: &mut Value) -> &mut Value {
    &mut managed(obj)["members"]
}

/// `members[0].localDisks[0]` of `obj`.
pub fn tier0(obj: &mut Value) -> &mut Value {
    &mut members(obj)[0]["localDisks"][0]
}

fn push(list: &mut Value, item: Value) {
    if let Some(items) = list.as_array_mut() {
        items.push(item);
    }
}

fn remove(obj: &mut Value, key: &str) {
    if let Some(fields) = obj.as_object_mut() {
        fields.remove(key);
    }
}

fn ok(id: &'static str, what: &'static str, old: Option<Value>, new: Value) -> Vector {
    Vector {
        id,
        what,
        old,
        new,
        verdict: Verdict::Admitted,
    }
}

fn refused(
    id: &'static str,
    what: &'static str,
    old: Option<Value>,
    new: Value,
    (path, reason, layer): (&'static str, &'static str, Layer),
) -> Vector {
    Vector {
        id,
        what,
        old,
        new,
        verdict: Verdict::Refused {
            path,
            reason,
            layer,
        },
    }
}

const M0: &str = "spec.connection.managed.members[0]";
const PATH0: &str = "spec.connection.managed.members[0].localDisks[0].path";

/// The valid vectors V1-V14 of reference section 10.1.
pub fn valid() -> Vec<Vector> {
    vec![
        ok("V1", "DRAM only, no tier", None, v1()),
        ok("V2", "full tier", None, v2()),
        ok(
            "V3",
            "boundary values: 16Mi segment, 16Mi tier, 64 keys",
            None,
            with(v2(), |o| {
                members(o)[0]["capacityPerMember"] = json!("16Mi");
                tier0(o)["capacity"] = json!("16Mi");
                tier0(o)["keyLimit"] = json!(64);
            }),
        ),
        ok("V4", "eviction disabled", None, v4()),
        ok(
            "V5",
            "empty eviction block",
            None,
            with(v2(), |o| tier0(o)["eviction"] = json!({})),
        ),
        ok(
            "V6",
            "policy without capacity",
            None,
            with(v2(), |o| {
                let tier = tier0(o);
                tier["eviction"] = json!({"policy": "FIFO"});
                remove(tier, "capacity");
            }),
        ),
        ok(
            "V7",
            "path /dev/infiniband-cache (a sibling)",
            None,
            with(v2(), |o| tier0(o)["path"] = json!("/dev/infiniband-cache")),
        ),
        ok(
            "V7",
            "path /mnt/..data/kv ('..data' is not '..')",
            None,
            with(v2(), |o| tier0(o)["path"] = json!("/mnt/..data/kv")),
        ),
        ok(
            "V8",
            "capacity 0 without eviction",
            None,
            with(v2(), |o| {
                let tier = tier0(o);
                tier["capacity"] = json!("0");
                remove(tier, "eviction");
            }),
        ),
        ok(
            "V9",
            "two groups, tier on the second, scaleIn 30",
            None,
            v9(),
        ),
        ok(
            "V10",
            "update dropping the last group, which carries the tier",
            Some(v9()),
            with(v9(), |o| {
                if let Some(m) = members(o).as_array_mut() {
                    m.truncate(1);
                }
            }),
        ),
        ok(
            "V11",
            "update editing capacity, keyLimit, eviction and cleanAfterDelete",
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
            "V12",
            "update widening the nodeSelector",
            Some(v2()),
            with(v2(), |o| members(o)[0]["nodeSelector"] = json!({})),
        ),
        ok(
            "V13",
            "update appending a group with a tier",
            Some(v1()),
            with(v1(), |o| {
                let mut tiered = v2_group();
                tiered["nodeSelector"] = json!({"kvcache-disk": "true"});
                push(members(o), tiered);
            }),
        ),
        ok(
            "V14",
            "leader extraArgs rendered last",
            None,
            with(v2(), |o| {
                managed(o)["leader"]["extraArgs"] =
                    json!(["-default_kv_lease_ttl=10m", "-client_ttl=30"]);
            }),
        ),
    ]
}

/// The invalid vectors X1-X33 of reference section 10.2.
pub fn invalid() -> Vec<Vector> {
    let two_groups = || with(v2(), |o| push(members(o), plain_group("other")));
    vec![
        refused(
            "X1",
            "capacityPerMember 8Mi on a tier group",
            None,
            with(v2(), |o| members(o)[0]["capacityPerMember"] = json!("8Mi")),
            (
                "spec.connection.managed.members[0].capacityPerMember",
                "must be at least 16Mi for a group declaring localDisks",
                Layer::Webhook,
            ),
        ),
        refused(
            "X2",
            "capacityPerMember 0",
            None,
            with(v2(), |o| members(o)[0]["capacityPerMember"] = json!("0")),
            (
                "spec.connection.managed.members[0].capacityPerMember",
                "must be greater than 0",
                Layer::Webhook,
            ),
        ),
        // The quantity sign checks are the webhook's: no CEL rule reads a quantity's value, so
        // the CRD installs on API servers that cost string functions on int-or-string fields
        // by the largest request (kube-apiserver 1.30 and 1.31; see warmcache_api_kvcache's
        // v1alpha1::rules).
        refused(
            "B50",
            "capacityPerMember written as the integer 0",
            None,
            with(v1(), |o| members(o)[0]["capacityPerMember"] = json!(0)),
            (
                "spec.connection.managed.members[0].capacityPerMember",
                "must be greater than 0",
                Layer::Webhook,
            ),
        ),
        refused(
            "B51",
            "capacityPerMember negative",
            None,
            with(v1(), |o| members(o)[0]["capacityPerMember"] = json!("-1Gi")),
            (
                "spec.connection.managed.members[0].capacityPerMember",
                "must be greater than 0",
                Layer::Webhook,
            ),
        ),
        refused(
            "B52",
            "localBufferSize negative",
            None,
            with(v1(), |o| members(o)[0]["localBufferSize"] = json!("-1")),
            (
                "spec.connection.managed.members[0].localBufferSize",
                "must not be negative",
                Layer::Webhook,
            ),
        ),
        refused(
            "B53",
            "tier capacity negative",
            None,
            with(v2(), |o| {
                let tier = tier0(o);
                tier["capacity"] = json!("-4Ti");
                remove(tier, "eviction");
            }),
            (
                "spec.connection.managed.members[0].localDisks[0].capacity",
                "must not be negative",
                Layer::Webhook,
            ),
        ),
        refused(
            "B54",
            "watermark with tier capacity 0",
            None,
            with(v2(), |o| tier0(o)["capacity"] = json!("0")),
            (
                "spec.connection.managed.members[0].localDisks[0].capacity",
                "capacity must be set above 0 when eviction.watermark is set",
                Layer::Webhook,
            ),
        ),
        refused(
            "B55",
            "watermark with tier capacity written as the integer 0",
            None,
            with(v2(), |o| tier0(o)["capacity"] = json!(0)),
            (
                "spec.connection.managed.members[0].localDisks[0].capacity",
                "capacity must be set above 0 when eviction.watermark is set",
                Layer::Webhook,
            ),
        ),
        refused(
            "X3",
            "tier capacity 1Mi",
            None,
            with(v2(), |o| tier0(o)["capacity"] = json!("1Mi")),
            (
                "spec.connection.managed.members[0].localDisks[0].capacity",
                "must be at least 16Mi, which is one bucket",
                Layer::Webhook,
            ),
        ),
        refused(
            "X4",
            "keyLimit 63",
            None,
            with(v2(), |o| tier0(o)["keyLimit"] = json!(63)),
            (
                "spec.connection.managed.members[0].localDisks[0].keyLimit",
                "must be at least 64, which is one bucket's worth of keys",
                Layer::Webhook,
            ),
        ),
        refused(
            "X5",
            "relative path",
            None,
            with(v2(), |o| tier0(o)["path"] = json!("var/lib/kvcache")),
            (PATH0, "must be an absolute path", Layer::Webhook),
        ),
        refused(
            "X6",
            "path /",
            None,
            with(v2(), |o| tier0(o)["path"] = json!("/")),
            (PATH0, "must not be the root directory", Layer::Webhook),
        ),
        refused(
            "X6",
            "path //",
            None,
            with(v2(), |o| tier0(o)["path"] = json!("//")),
            (PATH0, "must not be the root directory", Layer::Webhook),
        ),
        refused(
            "X7",
            "path /dev/infiniband",
            None,
            with(v2(), |o| tier0(o)["path"] = json!("/dev/infiniband")),
            (PATH0, "must not overlap /dev/infiniband", Layer::Webhook),
        ),
        refused(
            "X7",
            "path /dev/infiniband/x",
            None,
            with(v2(), |o| tier0(o)["path"] = json!("/dev/infiniband/x")),
            (PATH0, "must not overlap /dev/infiniband", Layer::Webhook),
        ),
        refused(
            "X7",
            "path /dev",
            None,
            with(v2(), |o| tier0(o)["path"] = json!("/dev")),
            (PATH0, "must not overlap /dev/infiniband", Layer::Webhook),
        ),
        refused(
            "X8",
            "path with a '..' component",
            None,
            with(v2(), |o| tier0(o)["path"] = json!("/var/lib/../kv")),
            (PATH0, "must not contain a \"..\" component", Layer::Webhook),
        ),
        refused(
            "X9",
            "path with a trailing space",
            None,
            with(v2(), |o| tier0(o)["path"] = json!("/var/lib/kvcache ")),
            (
                PATH0,
                "must not begin or end with whitespace",
                Layer::Webhook,
            ),
        ),
        refused(
            "X9",
            "path with a leading tab",
            None,
            with(v2(), |o| tier0(o)["path"] = json!("\t/var/lib/kvcache")),
            (
                PATH0,
                "must not begin or end with whitespace",
                Layer::Webhook,
            ),
        ),
        refused(
            "X10",
            "blank path",
            None,
            with(v2(), |o| tier0(o)["path"] = json!("   ")),
            (PATH0, "a directory on the node is required", Layer::Webhook),
        ),
        refused(
            "X11",
            "eviction disabled with a policy",
            None,
            with(v2(), |o| {
                tier0(o)["eviction"] = json!({"enabled": false, "policy": "LRU"})
            }),
            (
                "spec.connection.managed.members[0].localDisks[0].eviction.policy",
                "there is no order in which nothing leaves",
                Layer::Cel("policy cannot be set while eviction is disabled"),
            ),
        ),
        refused(
            "X12",
            "eviction disabled with a watermark",
            None,
            with(v2(), |o| {
                tier0(o)["eviction"] =
                    json!({"enabled": false, "watermark": {"high": 90, "low": 80}});
            }),
            (
                "spec.connection.managed.members[0].localDisks[0].eviction.watermark",
                "nothing for the marks to start and stop",
                Layer::Cel("watermark cannot be set while eviction is disabled"),
            ),
        ),
        refused(
            "X13",
            "watermark without capacity",
            None,
            with(v2(), |o| remove(tier0(o), "capacity")),
            (
                "spec.connection.managed.members[0].localDisks[0].capacity",
                "capacity must be set above 0 when eviction.watermark is set",
                Layer::Cel("capacity must be set above 0 when eviction.watermark is set"),
            ),
        ),
        refused(
            "X14",
            "equal watermarks",
            None,
            with(v2(), |o| {
                tier0(o)["eviction"]["watermark"] = json!({"high": 80, "low": 80})
            }),
            (
                "spec.connection.managed.members[0].localDisks[0].eviction.watermark.low",
                "where only its log would tell (high is 80)",
                Layer::Cel("low must be below high"),
            ),
        ),
        refused(
            "X14",
            "inverted watermarks",
            None,
            with(v2(), |o| {
                tier0(o)["eviction"]["watermark"] = json!({"high": 70, "low": 80})
            }),
            (
                "spec.connection.managed.members[0].localDisks[0].eviction.watermark.low",
                "where only its log would tell (high is 70)",
                Layer::Cel("low must be below high"),
            ),
        ),
        refused(
            "X15",
            "policy MRU",
            None,
            with(v2(), |o| tier0(o)["eviction"]["policy"] = json!("MRU")),
            (
                "spec.connection.managed.members[0].localDisks[0].eviction.policy",
                "unknown variant `MRU`",
                Layer::Schema("MRU"),
            ),
        ),
        refused(
            "X16",
            "watermark high 101",
            None,
            with(v2(), |o| {
                tier0(o)["eviction"]["watermark"] = json!({"high": 101, "low": 5})
            }),
            (
                "spec.connection.managed.members[0].localDisks[0].eviction.watermark.high",
                "must be between 1 and 100",
                Layer::Schema("less than or equal to 100"),
            ),
        ),
        refused(
            "X17",
            "two localDisks entries",
            None,
            with(v2(), |o| {
                let mut second = v2_tier();
                second["path"] = json!("/var/lib/kvcache2");
                push(&mut members(o)[0]["localDisks"], second);
            }),
            (
                "spec.connection.managed.members[0].localDisks",
                "at most one entry is allowed",
                Layer::Schema("must have at most 1 item"),
            ),
        ),
        refused(
            "X18",
            "two groups each with localDisks",
            None,
            with(v2(), |o| {
                let mut second = v2_group();
                second["nodeSelector"] = json!({"kvcache": "second"});
                second["localDisks"][0]["path"] = json!("/var/lib/kvcache2");
                push(members(o), second);
            }),
            (
                "spec.connection.managed.members[1].localDisks",
                "which figure belongs to which group (groups [0 1] declare it)",
                Layer::Cel("only one member group may declare localDisks"),
            ),
        ),
        refused(
            "X19",
            "leader extraArgs -enable_offload=false",
            None,
            with(v2(), |o| {
                managed(o)["leader"]["extraArgs"] = json!(["-enable_offload=false"])
            }),
            (
                "spec.connection.managed.leader.extraArgs[0]",
                "the key \"enable_offload\" is derived from this spec",
                Layer::Webhook,
            ),
        ),
        refused(
            "X20",
            "leader extraArgs -offload_on_evict=true",
            None,
            with(v2(), |o| {
                managed(o)["leader"]["extraArgs"] = json!(["-offload_on_evict=true"])
            }),
            (
                "spec.connection.managed.leader.extraArgs[0]",
                "the key \"offload_on_evict\" is derived from this spec",
                Layer::Webhook,
            ),
        ),
        refused(
            "X21",
            "leader extraArgs without the leading dash",
            None,
            with(v2(), |o| {
                managed(o)["leader"]["extraArgs"] = json!(["enable_offload=true"])
            }),
            (
                "spec.connection.managed.leader.extraArgs[0]",
                "must begin with \"-\"",
                Layer::Webhook,
            ),
        ),
        refused(
            "X22",
            "member extraEnv MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES",
            None,
            with(v2(), |o| {
                members(o)[0]["extraEnv"] =
                    json!([{"name": "MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES", "value": "1"}]);
            }),
            (
                "spec.connection.managed.members[0].extraEnv[MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES]",
                "is rendered from this spec",
                Layer::Webhook,
            ),
        ),
        refused(
            "X22",
            "member extraEnv MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT",
            None,
            with(v2(), |o| {
                members(o)[0]["extraEnv"] =
                    json!([{"name": "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT", "value": "1"}]);
            }),
            (
                "spec.connection.managed.members[0].extraEnv[MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT]",
                "is rendered from this spec",
                Layer::Webhook,
            ),
        ),
        refused(
            "X23",
            "member extraArgs -ssd_offload_path=/x",
            None,
            with(v2(), |o| {
                members(o)[0]["extraArgs"] = json!(["-ssd_offload_path=/x"])
            }),
            (
                "spec.connection.managed.members[0].extraArgs[0]",
                "the key \"ssd_offload_path\" is derived from this spec",
                Layer::Webhook,
            ),
        ),
        refused(
            "X24",
            "update adding localDisks to existing group 0",
            Some(with(v2(), |o| remove(&mut members(o)[0], "localDisks"))),
            v2(),
            (
                "spec.connection.managed.members[0].localDisks",
                "cannot be added to an existing member group",
                Layer::Cel("a localDisks tier cannot be added to an existing member group"),
            ),
        ),
        refused(
            "X25",
            "update removing localDisks from group 0",
            Some(v2()),
            with(v2(), |o| remove(&mut members(o)[0], "localDisks")),
            (
                "spec.connection.managed.members[0].localDisks",
                "cannot be removed from an existing member group",
                Layer::Cel("a localDisks tier cannot be removed from an existing member group"),
            ),
        ),
        refused(
            "X26",
            "update changing the tier path",
            Some(v2()),
            with(v2(), |o| tier0(o)["path"] = json!("/var/lib/kv2")),
            (
                "spec.connection.managed.members[0].localDisks[0].path",
                "the localDisks path is immutable",
                Layer::Cel("the localDisks path is immutable"),
            ),
        ),
        refused(
            "X27",
            "update dropping the first group (with the tier) of two",
            Some(two_groups()),
            backend(vec![plain_group("other")]),
            (
                M0,
                "this position now carries the group that was at position 1",
                Layer::Cel("a localDisks tier cannot be removed from an existing member group"),
            ),
        ),
        refused(
            "X28",
            "update swapping two groups",
            Some(two_groups()),
            backend(vec![plain_group("other"), v2_group()]),
            (
                M0,
                "this position now carries the group that was at position 1",
                Layer::Cel("a localDisks tier cannot be"),
            ),
        ),
        refused(
            "X29",
            "update changing medium DRAM to VRAM",
            Some(v2()),
            with(v2(), |o| members(o)[0]["medium"] = json!("VRAM")),
            (
                "spec.connection.managed.members[0].medium",
                "medium is immutable",
                Layer::Cel("medium is immutable"),
            ),
        ),
        refused(
            "X30",
            "both managed and external",
            None,
            with(v2(), |o| {
                o["spec"]["connection"]["external"] =
                    external()["spec"]["connection"]["external"].clone();
            }),
            (
                "spec.connection",
                "only one of managed or external may be set",
                Layer::Cel("only one of managed or external may be set"),
            ),
        ),
        refused(
            "X31",
            "scaleIn.gracePeriodSeconds 3601",
            None,
            with(v2(), |o| {
                managed(o)["scaleIn"] = json!({"gracePeriodSeconds": 3601})
            }),
            (
                "spec.connection.managed.scaleIn.gracePeriodSeconds",
                "must not exceed 3600",
                Layer::Schema("less than or equal to 3600"),
            ),
        ),
        refused(
            "X32",
            "a 60-character name",
            None,
            with(v2(), |o| o["metadata"]["name"] = json!("k".repeat(60))),
            (
                "metadata.name",
                "this backend renders an object named",
                Layer::Webhook,
            ),
        ),
        refused(
            "X33",
            "hostPaths mounted inside the tier",
            None,
            with(v2(), |o| {
                members(o)[0]["hostPaths"] = json!([{"path": "/var/lib/kvcache", "mountPath": "/var/lib/kvcache/sub", "type": "Directory"}]);
            }),
            (
                "spec.connection.managed.members[0].hostPaths[0].mountPath",
                "overlaps where this group's localDisks tier is mounted",
                Layer::Webhook,
            ),
        ),
    ]
}

/// Our own boundary cases around the reference's rules.
pub fn boundaries() -> Vec<Vector> {
    vec![
        refused(
            "B1",
            "capacityPerMember one byte below 16Mi on a tier group",
            None,
            with(v2(), |o| {
                members(o)[0]["capacityPerMember"] = json!("16777215")
            }),
            (
                "spec.connection.managed.members[0].capacityPerMember",
                "must be at least 16Mi",
                Layer::Webhook,
            ),
        ),
        ok(
            "B2",
            "capacityPerMember 8Mi without a tier",
            None,
            with(v1(), |o| members(o)[0]["capacityPerMember"] = json!("8Mi")),
        ),
        refused(
            "B3",
            "tier capacity 16Mi written as 16777215.5",
            None,
            with(v2(), |o| tier0(o)["capacity"] = json!("16777215.5")),
            (
                "spec.connection.managed.members[0].localDisks[0].capacity",
                "must be at least 16Mi",
                Layer::Webhook,
            ),
        ),
        ok(
            "B4",
            "16Mi written as 16384Ki and as an integer",
            None,
            with(v2(), |o| {
                members(o)[0]["capacityPerMember"] = json!(16_777_216);
                tier0(o)["capacity"] = json!("16384Ki");
            }),
        ),
        ok(
            "B5",
            "keyLimit 0 sets no limit",
            None,
            with(v2(), |o| tier0(o)["keyLimit"] = json!(0)),
        ),
        refused(
            "B6",
            "keyLimit 1",
            None,
            with(v2(), |o| tier0(o)["keyLimit"] = json!(1)),
            (
                "spec.connection.managed.members[0].localDisks[0].keyLimit",
                "must be at least 64",
                Layer::Webhook,
            ),
        ),
        ok(
            "B7",
            "scaleIn.gracePeriodSeconds 3600",
            None,
            with(v2(), |o| {
                managed(o)["scaleIn"] = json!({"gracePeriodSeconds": 3600})
            }),
        ),
        refused(
            "B8",
            "scaleIn.gracePeriodSeconds -1",
            None,
            with(v2(), |o| {
                managed(o)["scaleIn"] = json!({"gracePeriodSeconds": -1})
            }),
            (
                "spec.connection.managed.scaleIn.gracePeriodSeconds",
                "must not be negative",
                Layer::Schema("greater than or equal to 0"),
            ),
        ),
        ok(
            "B9",
            "watermark 100/99",
            None,
            with(v2(), |o| {
                tier0(o)["eviction"]["watermark"] = json!({"high": 100, "low": 99})
            }),
        ),
        ok(
            "B10",
            "a 54-character name: -leader and -member-0 fit in 63",
            None,
            with(v2(), |o| o["metadata"]["name"] = json!("k".repeat(54))),
        ),
        refused(
            "B11",
            "a 55-character name: -member-0 does not fit",
            None,
            with(v2(), |o| o["metadata"]["name"] = json!("k".repeat(55))),
            ("metadata.name", "-member-0", Layer::Webhook),
        ),
        refused(
            "B12",
            "a name with a dot (a valid name for the backend, not for its Service)",
            None,
            with(v2(), |o| o["metadata"]["name"] = json!("kvc.a")),
            ("metadata.name", "kvc.a-leader", Layer::Webhook),
        ),
        refused(
            "B13",
            "member extraEnv NVIDIA_VISIBLE_DEVICES",
            None,
            with(v2(), |o| {
                members(o)[0]["extraEnv"] =
                    json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]);
            }),
            (
                "spec.connection.managed.members[0].extraEnv[NVIDIA_VISIBLE_DEVICES]",
                "is rendered from this spec",
                Layer::Webhook,
            ),
        ),
        ok(
            "B14",
            "member extraArgs -device_name (deliberately allowed) and extraEnv of a free name",
            None,
            with(v2(), |o| {
                members(o)[0]["extraArgs"] = json!(["-device_name=mlx5_0"]);
                members(o)[0]["extraEnv"] =
                    json!([{"name": "MOONCAKE_USE_URING", "value": "true"}]);
            }),
        ),
        refused(
            "B15",
            "leader extraArgs -enable_oplog",
            None,
            with(v2(), |o| {
                managed(o)["leader"]["extraArgs"] = json!(["-enable_oplog=true"])
            }),
            (
                "spec.connection.managed.leader.extraArgs[0]",
                "the key \"enable_oplog\" is refused",
                Layer::Webhook,
            ),
        ),
        refused(
            "B16",
            "leader extraArgs setting one key twice",
            None,
            with(v2(), |o| {
                managed(o)["leader"]["extraArgs"] = json!(["-client_ttl=30", "--client_ttl=40"]);
            }),
            (
                "spec.connection.managed.leader.extraArgs[1]",
                "sets the key \"client_ttl\" a second time",
                Layer::Webhook,
            ),
        ),
        refused(
            "B17",
            "leader extraEnv KUBERNETES_POD_IP",
            None,
            with(v2(), |o| {
                managed(o)["leader"]["extraEnv"] =
                    json!([{"name": "KUBERNETES_POD_IP", "value": "1"}]);
            }),
            (
                "spec.connection.managed.leader.extraEnv[KUBERNETES_POD_IP]",
                "rendered by the operator for the leader",
                Layer::Webhook,
            ),
        ),
        refused(
            "B18",
            "highAvailability snapshot",
            None,
            with(v2(), |o| {
                managed(o)["leader"] = json!({"replicas": 2, "highAvailability": {
                    "snapshot": {"persistentVolumeClaimName": "snap"}}});
            }),
            (
                "spec.connection.managed.leader.highAvailability.snapshot",
                "snapshots are not supported",
                Layer::Webhook,
            ),
        ),
        refused(
            "B19",
            "two leader replicas without highAvailability",
            None,
            with(v2(), |o| managed(o)["leader"] = json!({"replicas": 2})),
            (
                "spec.connection.managed.leader.replicas",
                "requires highAvailability",
                Layer::Cel("more than one leader replica requires highAvailability"),
            ),
        ),
        ok(
            "B20",
            "three leader replicas with highAvailability (Lease addressing)",
            None,
            with(v2(), |o| {
                managed(o)["leader"] =
                    json!({"replicas": 3, "highAvailability": {"memberAddressing": "Lease"}});
            }),
        ),
        ok(
            "B21",
            "multiTenancy turned on (upstream renders the tenant-quota policy for it)",
            None,
            with(v2(), |o| managed(o)["leader"]["multiTenancy"] = json!(true)),
        ),
        refused(
            "B22",
            "a nodeSelector key that is not a label key",
            None,
            with(v2(), |o| {
                members(o)[0]["nodeSelector"] = json!({"bad key": "x"})
            }),
            (
                "spec.connection.managed.members[0].nodeSelector[bad key]",
                "is not a label key",
                Layer::Webhook,
            ),
        ),
        refused(
            "B23",
            "a nodeSelector value that is not a label value",
            None,
            with(v2(), |o| {
                members(o)[0]["nodeSelector"] = json!({"kvcache": "a b"})
            }),
            (
                "spec.connection.managed.members[0].nodeSelector[kvcache]",
                "is not a label value",
                Layer::Webhook,
            ),
        ),
        refused(
            "B24",
            "hostPaths mounted over each other",
            None,
            with(v1(), |o| {
                members(o)[0]["hostPaths"] = json!([
                    {"path": "/opt/a", "mountPath": "/opt/a"},
                    {"path": "/opt/b", "mountPath": "/opt/a/b"},
                ]);
            }),
            (
                "spec.connection.managed.members[0].hostPaths[1].mountPath",
                "overlaps the mount path of hostPaths[0]",
                Layer::Webhook,
            ),
        ),
        refused(
            "B25",
            "hostPaths mounted at /dev",
            None,
            with(v1(), |o| {
                members(o)[0]["hostPaths"] = json!([{"path": "/dev", "mountPath": "/dev"}]);
            }),
            (
                "spec.connection.managed.members[0].hostPaths[0].mountPath",
                "overlaps /dev/infiniband",
                Layer::Webhook,
            ),
        ),
        refused(
            "B26",
            "an image reference with upper-case letters in its path",
            None,
            with(v2(), |o| {
                o["spec"]["image"] = json!("docker.io/KVCache/mooncake:1")
            }),
            (
                "spec.image",
                "is not a container image reference",
                Layer::Webhook,
            ),
        ),
        refused(
            "B27",
            "a blank spec.image",
            None,
            with(v2(), |o| o["spec"]["image"] = json!("  ")),
            ("spec.image", "must not be blank", Layer::Webhook),
        ),
        refused(
            "B28",
            "no image here and no default image",
            None,
            with(v2(), |o| remove(&mut o["spec"], "image")),
            ("spec.image", "an image is required", Layer::Webhook),
        ),
        refused(
            "B29",
            "a member image of only whitespace",
            None,
            with(v2(), |o| members(o)[0]["image"] = json!("  ")),
            (
                "spec.connection.managed.members[0].image",
                "must not be blank",
                Layer::Webhook,
            ),
        ),
        refused(
            "B30",
            "an image pull secret without a name",
            None,
            with(v2(), |o| o["spec"]["imagePullSecrets"] = json!([{}])),
            (
                "spec.imagePullSecrets[0].name",
                "the name of a Secret",
                Layer::Schema("spec.imagePullSecrets[0].name: Required value"),
            ),
        ),
        ok("B31", "external backend", None, external()),
        refused(
            "B32",
            "external backend without an Admin endpoint",
            None,
            with(external(), |o| {
                o["spec"]["connection"]["external"]["endpoints"] =
                    json!([{"name": "Client", "address": "store:50051"}]);
            }),
            (
                "spec.connection.external.endpoints",
                "an entry named \"Admin\" is required",
                Layer::Webhook,
            ),
        ),
        refused(
            "B33",
            "external endpoint with a path",
            None,
            with(external(), |o| {
                o["spec"]["connection"]["external"]["endpoints"][1]["address"] =
                    json!("store:9003/metrics");
            }),
            (
                "spec.connection.external.endpoints[1].address",
                "must be host:port",
                Layer::Webhook,
            ),
        ),
        refused(
            "B34",
            "update moving the tier from the last group to a new last group",
            Some(v9()),
            with(v9(), |o| {
                members(o)[1]["localDisks"] = json!([]);
                let mut third = v2_group();
                third["nodeSelector"] = json!({"kvcache-disk2": "true"});
                push(members(o), third);
            }),
            (
                "spec.connection.managed.members[1].localDisks",
                "cannot be removed from an existing member group",
                Layer::Cel("a localDisks tier cannot be removed"),
            ),
        ),
        ok(
            "B35",
            "update dropping the last group behind the tier group",
            Some(two_groups_value()),
            v2(),
        ),
        refused(
            "B36",
            "update swapping two groups without tiers (caught by the move rule alone)",
            Some(backend(vec![plain_group("a"), plain_group("b")])),
            backend(vec![plain_group("b"), plain_group("a")]),
            (
                M0,
                "now carries the group that was at position 1",
                Layer::Webhook,
            ),
        ),
        ok(
            "B37",
            "update editing a group in place (not a move)",
            Some(backend(vec![plain_group("a"), plain_group("b")])),
            backend(vec![
                plain_group("a"),
                with(plain_group("b"), |g| g["capacityPerMember"] = json!("8Gi")),
            ]),
        ),
        refused(
            "B38",
            "a tier path over 4096 characters",
            None,
            with(v2(), |o| {
                tier0(o)["path"] = json!(format!("/{}", "a".repeat(4096)))
            }),
            (
                PATH0,
                "may not be more than 4096 bytes",
                Layer::Schema("4096"),
            ),
        ),
        refused(
            "B39",
            "capacityPerMember above 2^63-1 bytes (a decimal suffix is not capped)",
            None,
            with(v2(), |o| members(o)[0]["capacityPerMember"] = json!("10E")),
            (
                "spec.connection.managed.members[0].capacityPerMember",
                "must not exceed 9223372036854775807",
                Layer::Webhook,
            ),
        ),
        refused(
            "B40",
            "localBufferSize that overflows the memory request",
            None,
            with(v1(), |o| {
                members(o)[0]["capacityPerMember"] = json!("7Ei");
                members(o)[0]["localBufferSize"] = json!("7Ei");
            }),
            (
                "spec.connection.managed.members[0].localBufferSize",
                "together with capacityPerMember",
                Layer::Webhook,
            ),
        ),
        ok(
            "B41",
            "binary-suffixed quantities beyond 2^63-1 (Kubernetes caps them there)",
            None,
            with(v2(), |o| {
                members(o)[0]["capacityPerMember"] = json!("10000000Ei");
                tier0(o)["capacity"] = json!("8Ei");
            }),
        ),
        ok(
            "B42",
            "member extraEnv names with '-' and '.' (Kubernetes' env-name rule)",
            None,
            with(v2(), |o| {
                members(o)[0]["extraEnv"] = json!([{"name": "my.env-name", "value": "1"}, {"name": "GLOG_v", "value": "2"}]);
            }),
        ),
        ok(
            "B43",
            "hostPaths with '.' components (cleaned before they are compared)",
            None,
            with(v2(), |o| {
                members(o)[0]["hostPaths"] = json!([
                    {"path": "/opt/./a", "mountPath": "/opt/./a"},
                    {"path": "/opt/b", "mountPath": "/opt/b/."},
                ]);
            }),
        ),
        ok(
            "B44",
            "a spec.image with surrounding whitespace (trimmed before it is parsed)",
            None,
            with(v2(), |o| o["spec"]["image"] = json!(format!("  {IMAGE}\n"))),
        ),
        refused(
            "B45",
            "a one-character repository (upstream's parser wants two)",
            None,
            with(v2(), |o| o["spec"]["image"] = json!("docker.io/a:1")),
            (
                "spec.image",
                "is not a container image reference",
                Layer::Webhook,
            ),
        ),
        refused(
            "B46",
            "a digest that is not sha256 with 64 hexadecimal digits",
            None,
            with(v2(), |o| {
                o["spec"]["image"] = json!(format!(
                    "docker.io/kvcacheai/mooncake@sha256:{}",
                    "a".repeat(32)
                ))
            }),
            (
                "spec.image",
                "is not a container image reference",
                Layer::Webhook,
            ),
        ),
        ok(
            "B47",
            "external backend with a blank image (no image is run for it), a port with a leading zero",
            None,
            with(external(), |o| {
                o["spec"]["image"] = json!("  ");
                o["spec"]["connection"]["external"]["endpoints"][1]["address"] =
                    json!("store.example.internal:09003");
            }),
        ),
        ok(
            "B48",
            "an RDMA group with four fabric interfaces",
            None,
            with(v2(), |o| {
                members(o)[0]["transport"] = json!({"protocol": "RDMA"});
                members(o)[0]["fabricInterfaceCount"] = json!(4);
            }),
        ),
        ok(
            "B49",
            "an empty member image is an unset one",
            None,
            with(v2(), |o| members(o)[0]["image"] = json!("")),
        ),
    ]
}

fn two_groups_value() -> Value {
    with(v2(), |o| push(members(o), plain_group("other")))
}

/// Ratchet cases: stored objects that today's rules refuse (admitted under older ones) stay
/// updatable as long as the update does not move the guarded value.
pub fn ratchets() -> Vec<Vector> {
    let small_tier = || with(v2(), |o| tier0(o)["capacity"] = json!("1Mi"));
    let small_segment = || with(v2(), |o| members(o)[0]["capacityPerMember"] = json!("8Mi"));
    let derived_arg = || {
        with(v2(), |o| {
            managed(o)["leader"]["extraArgs"] = json!(["-enable_offload=true"])
        })
    };
    let bucket_env = || {
        with(v2(), |o| {
            members(o)[0]["extraEnv"] =
                json!([{"name": "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT", "value": "8"}]);
        })
    };
    vec![
        ok(
            "R1",
            "metadata-only update (finalizer) of an object today's rules refuse",
            Some(small_tier()),
            with(small_tier(), |o| {
                o["metadata"]["finalizers"] = json!(["worker.gpustack.ai/kvcache"])
            }),
        ),
        ok(
            "R2",
            "tier capacity below the floor left alone while keyLimit moves",
            Some(small_tier()),
            with(small_tier(), |o| tier0(o)["keyLimit"] = json!(20_000_000)),
        ),
        refused(
            "R3",
            "tier capacity below the floor moved to another value below it",
            Some(small_tier()),
            with(v2(), |o| tier0(o)["capacity"] = json!("2Mi")),
            (
                "spec.connection.managed.members[0].localDisks[0].capacity",
                "must be at least 16Mi",
                Layer::Webhook,
            ),
        ),
        ok(
            "R4",
            "tier capacity rewritten in another unit (1Mi as 1024Ki) does not move",
            Some(small_tier()),
            with(v2(), |o| tier0(o)["capacity"] = json!("1024Ki")),
        ),
        ok(
            "R5",
            "capacityPerMember below the floor left alone while the nodeSelector moves",
            Some(small_segment()),
            with(small_segment(), |o| {
                members(o)[0]["nodeSelector"] = json!({"kvcache": "wide"})
            }),
        ),
        ok(
            "R6",
            "a derived leader flag left alone while a member group is appended",
            Some(derived_arg()),
            with(derived_arg(), |o| push(members(o), plain_group("more"))),
        ),
        refused(
            "R7",
            "a derived leader flag kept while the list moves",
            Some(derived_arg()),
            with(derived_arg(), |o| {
                managed(o)["leader"]["extraArgs"] =
                    json!(["-enable_offload=true", "-client_ttl=30"]);
            }),
            (
                "spec.connection.managed.leader.extraArgs[0]",
                "is derived from this spec",
                Layer::Webhook,
            ),
        ),
        ok(
            "R8",
            "a reserved member variable left alone while the tier capacity moves",
            Some(bucket_env()),
            with(bucket_env(), |o| tier0(o)["capacity"] = json!("8Ti")),
        ),
        ok(
            "R9",
            "no image and no default image, spec.image not moved",
            Some(with(v2(), |o| remove(&mut o["spec"], "image"))),
            with(v2(), |o| {
                remove(&mut o["spec"], "image");
                tier0(o)["capacity"] = json!("8Ti");
            }),
        ),
    ]
}

/// Every vector: valid, invalid, boundaries and ratchets.
pub fn all() -> Vec<Vector> {
    let mut all = valid();
    all.extend(invalid());
    all.extend(boundaries());
    all.extend(ratchets());
    all
}
