//! The CRD's CEL rules, evaluated client-side with kube-cel against the shared cases, plus checks
//! that the generated schema is structural and carries the stated defaults and bounds.
//!
//! Everything here reads the schema from `KVCacheBackend::crd()`, so it tests exactly what the
//! CRD carries.

// Test helpers outside #[test] functions may fail loudly too (clippy.toml allows it only inside).
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod cases;

use std::collections::BTreeSet;

use kube::CustomResourceExt;
use kube_cel::{ErrorKind, Validator, compile_schema};
use serde_json::{Value, json};
use warmcache_api_kvcache::v1alpha1::{self, KVCacheBackend};

/// The CRD's `openAPIV3Schema` as JSON.
fn schema() -> Value {
    let crd = KVCacheBackend::crd();
    let version = crd.spec.versions.first().expect("one version");
    let schema = version
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("openAPIV3Schema");
    serde_json::to_value(schema).expect("schema serializes")
}

/// The schema node at `path` (property names; `[]` steps into `items`).
fn node<'a>(schema: &'a Value, path: &str) -> &'a Value {
    let mut at = schema;
    for step in path.split('.') {
        at = if step == "[]" {
            &at["items"]
        } else {
            &at["properties"][step]
        };
        assert!(!at.is_null(), "no schema node at {path} (step {step})");
    }
    at
}

const MEMBERS: &str = "spec.connection.managed.members";
const LOCAL_DISK: &str = "spec.connection.managed.members.[].localDisks.[]";

/// Every `x-kubernetes-validations` rule in the schema, with the path of its node.
fn all_rules(at: &Value, path: &str, out: &mut Vec<(String, String)>) {
    let Some(obj) = at.as_object() else { return };
    if let Some(rules) = obj
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    {
        for rule in rules {
            let text = rule["rule"].as_str().expect("rule is a string").to_owned();
            out.push((path.to_owned(), text));
        }
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (name, prop) in props {
            all_rules(prop, &format!("{path}.{name}"), out);
        }
    }
    if let Some(items) = obj.get("items") {
        all_rules(items, &format!("{path}[]"), out);
    }
    if let Some(extra) = obj.get("additionalProperties") {
        all_rules(extra, &format!("{path}{{}}"), out);
    }
}

#[test]
fn rules_compile() {
    let compiled = compile_schema(&schema());
    assert!(
        !compiled.has_errors(),
        "rules that do not compile: {:?}",
        compiled.compilation_errors()
    );
}

#[test]
fn cel_cases() {
    let compiled = compile_schema(&schema());
    let validator = Validator::new();
    let mut failed_rules = BTreeSet::new();
    let mut problems = Vec::new();

    for case in cases::cases() {
        let result = validator.validate_compiled(&compiled, &case.new, case.old.as_ref());
        match (&result, case.allowed) {
            (Ok(()), true) => {}
            (Ok(()), false) => {
                problems.push(format!("{}: admitted, expected a refusal", case.name))
            }
            (Err(errors), allowed) => {
                for error in errors.iter() {
                    if error.kind != ErrorKind::ValidationFailure {
                        problems.push(format!(
                            "{}: rule could not be evaluated ({:?}): {error}",
                            case.name, error.kind
                        ));
                    }
                    failed_rules.insert(error.rule.clone());
                }
                if allowed {
                    problems.push(format!(
                        "{}: refused, expected admission: {errors}",
                        case.name
                    ));
                } else if let Some(message) = case.message
                    && !errors.iter().any(|e| e.message.contains(message))
                {
                    problems.push(format!(
                        "{}: refused, but no error says {message:?}: {errors}",
                        case.name
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // Every rule the CRD carries is refused by at least one case (and, since every case that
    // is expected to pass does pass, each is also seen admitting).
    let mut rules = Vec::new();
    all_rules(&schema(), "", &mut rules);
    let never_refused: Vec<_> = rules
        .iter()
        .filter(|(_, rule)| !failed_rules.contains(rule))
        .collect();
    assert!(
        never_refused.is_empty(),
        "rules no case refuses: {never_refused:#?}"
    );
}

#[test]
fn schema_cases_pass_cel() {
    // These are refused by the OpenAPI schema, not by CEL: the CEL rules alone admit them, so
    // the refusal a real API server gives comes from the schema keyword each one names.
    let compiled = compile_schema(&schema());
    let validator = Validator::new();
    for case in cases::schema_cases() {
        assert!(!case.allowed, "{}: schema cases are refusals", case.name);
        if let Err(errors) = validator.validate_compiled(&compiled, &case.new, case.old.as_ref()) {
            // A value the schema refuses may also make a rule fail to evaluate (quantity() of a
            // string that is no quantity); what must not happen is a rule deciding against it.
            let decided: Vec<_> = errors
                .iter()
                .filter(|e| e.kind != ErrorKind::EvaluationError)
                .collect();
            assert!(
                decided.is_empty(),
                "{}: a CEL rule refuses it too: {decided:?}",
                case.name
            );
        }
    }
}

#[test]
fn schema_refuses_the_schema_cases() {
    let s = schema();
    let tier = node(&s, LOCAL_DISK);
    assert_eq!(
        node(tier, "eviction.policy")["enum"],
        json!(["FIFO", "LRU"]),
        "X15"
    );
    for mark in ["high", "low"] {
        let mark = node(tier, &format!("eviction.watermark.{mark}"));
        assert_eq!(mark["minimum"], json!(1.0));
        assert_eq!(mark["maximum"], json!(100.0), "X16");
    }
    assert_eq!(
        node(&s, &format!("{MEMBERS}.[].localDisks"))["maxItems"],
        json!(1),
        "X17"
    );
    let grace = node(&s, "spec.connection.managed.scaleIn.gracePeriodSeconds");
    assert_eq!(
        (&grace["minimum"], &grace["maximum"]),
        (&json!(0.0), &json!(3600.0)),
        "X31"
    );
}

#[test]
fn defaults_and_bounds() {
    let s = schema();
    let spec = node(&s, "spec");
    let leader = node(spec, "connection.managed.leader");
    let member = node(&s, &format!("{MEMBERS}.[]"));
    let tier = node(&s, LOCAL_DISK);

    let defaults = [
        (node(spec, "type"), json!("Mooncake")),
        (node(spec, "transport"), json!({})),
        (node(spec, "transport.protocol"), json!("Auto")),
        (node(leader, "replicas"), json!(1)),
        (node(leader, "allocationStrategy"), json!("FreeRatioFirst")),
        (
            node(leader, "highAvailability.memberAddressing"),
            json!("Service"),
        ),
        (node(member, "fabricInterfaceCount"), json!(1)),
        (node(member, "transport.protocol"), json!("Auto")),
        (node(tier, "eviction.enabled"), json!(true)),
        (node(tier, "cleanAfterDelete"), json!(false)),
    ];
    for (at, default) in defaults {
        assert_eq!(at["default"], default, "default of {at}");
    }
    // A member group's transport has no default: unset means "use the backend's".
    assert!(node(member, "transport").get("default").is_none());

    let enums = [
        (node(spec, "type"), json!(["Mooncake"])),
        (
            node(spec, "imagePullPolicy"),
            json!(["Always", "IfNotPresent", "Never"]),
        ),
        (
            node(spec, "transport.protocol"),
            json!(["Auto", "TCP", "RDMA", "EFA", "CANN", "ROCM", "MUSA", "MACA"]),
        ),
        (
            node(leader, "highAvailability.memberAddressing"),
            json!(["Lease", "Service"]),
        ),
        (
            node(leader, "allocationStrategy"),
            json!(["Random", "FreeRatioFirst"]),
        ),
        (node(member, "medium"), json!(["DRAM", "VRAM"])),
        (
            node(member, "hostPaths.[].type"),
            json!([
                "",
                "DirectoryOrCreate",
                "Directory",
                "FileOrCreate",
                "File",
                "Socket",
                "CharDevice",
                "BlockDevice"
            ]),
        ),
        (
            node(spec, "connection.external.endpoints.[].name"),
            json!(["Client", "Admin"]),
        ),
    ];
    for (at, values) in enums {
        assert_eq!(at["enum"], values, "enum of {at}");
    }

    let bounds = [
        (node(spec, "image"), "maxLength", json!(512)),
        (node(member, "image"), "maxLength", json!(512)),
        (node(spec, "imagePullSecrets"), "maxItems", json!(32)),
        (node(leader, "replicas"), "minimum", json!(1.0)),
        (node(leader, "replicas"), "maximum", json!(5.0)),
        (
            node(spec, "connection.managed.members"),
            "minItems",
            json!(1),
        ),
        (
            node(spec, "connection.managed.members"),
            "maxItems",
            json!(32),
        ),
        (node(member, "fabricInterfaceCount"), "minimum", json!(1.0)),
        (node(member, "hostPaths"), "maxItems", json!(32)),
        (node(member, "hostPaths.[].path"), "maxLength", json!(1024)),
        (
            node(member, "hostPaths.[].path"),
            "pattern",
            json!("^(/[^/]+)+$"),
        ),
        (
            node(member, "hostPaths.[].mountPath"),
            "maxLength",
            json!(1024),
        ),
        (
            node(member, "hostPaths.[].mountPath"),
            "pattern",
            json!("^(/[^/]+)+$"),
        ),
        (node(member, "runtimeClassName"), "maxLength", json!(253)),
        (node(tier, "path"), "maxLength", json!(4096)),
        (node(tier, "keyLimit"), "minimum", json!(0.0)),
        (
            node(spec, "connection.external.endpoints"),
            "minItems",
            json!(1),
        ),
        (
            node(spec, "connection.external.endpoints.[].address"),
            "maxLength",
            json!(259),
        ),
        (
            node(leader, "highAvailability.snapshot.intervalSeconds"),
            "minimum",
            json!(1.0),
        ),
        (
            node(leader, "highAvailability.snapshot.retentionCount"),
            "minimum",
            json!(1.0),
        ),
    ];
    for (at, keyword, value) in bounds {
        assert_eq!(at[keyword], value, "{keyword} of {at}");
    }
    assert!(node(member, "runtimeClassName")["pattern"].is_string());

    let status = node(&s, "status");
    let list_types = [
        (node(spec, "imagePullSecrets"), "atomic", None),
        (node(spec, "connection.managed.members"), "atomic", None),
        (node(leader, "extraArgs"), "atomic", None),
        (node(leader, "extraEnv"), "map", Some(json!(["name"]))),
        (node(member, "extraArgs"), "atomic", None),
        (node(member, "extraEnv"), "map", Some(json!(["name"]))),
        (node(member, "localDisks"), "map", Some(json!(["path"]))),
        (node(member, "hostPaths"), "atomic", None),
        (
            node(spec, "connection.external.endpoints"),
            "map",
            Some(json!(["name"])),
        ),
        (node(status, "conditions"), "map", Some(json!(["type"]))),
        (node(status, "endpoints"), "map", Some(json!(["name"]))),
        (node(status, "members"), "map", Some(json!(["segmentID"]))),
        (
            node(status, "usedBy"),
            "map",
            Some(json!(["kind", "namespace", "name"])),
        ),
    ];
    for (at, list_type, keys) in list_types {
        assert_eq!(
            at["x-kubernetes-list-type"],
            json!(list_type),
            "list type of {at}"
        );
        if let Some(keys) = keys {
            assert_eq!(at["x-kubernetes-list-map-keys"], keys, "map keys of {at}");
            // A list-map key must be required or defaulted.
            for key in keys.as_array().expect("keys") {
                let key = key.as_str().expect("key");
                let required = at["items"]["required"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|k| k == key));
                let defaulted = at["items"]["properties"][key].get("default").is_some();
                assert!(required || defaulted, "map key {key} of {at}");
            }
        }
    }

    for quantity in [
        node(member, "capacityPerMember"),
        node(member, "localBufferSize"),
        node(tier, "capacity"),
        node(status, "capacity.total"),
        node(status, "capacity.used"),
    ] {
        assert_eq!(quantity["x-kubernetes-int-or-string"], json!(true));
        assert!(quantity.get("type").is_none(), "int-or-string has no type");
        assert!(
            quantity["pattern"]
                .as_str()
                .is_some_and(|p| p.contains("KMGTPE"))
        );
        assert!(quantity["maxLength"].is_number(), "bounds quantity() cost");
        assert!(quantity["description"].is_string(), "field docs survive");
    }
}

/// Walks the schema and reports every place that breaks Kubernetes' structural-schema rules.
fn structural_problems(at: &Value, path: &str, out: &mut Vec<String>) {
    let Some(obj) = at.as_object() else {
        out.push(format!("{path}: schema is not an object"));
        return;
    };
    for forbidden in [
        "$ref",
        "oneOf",
        "anyOf",
        "allOf",
        "not",
        "definitions",
        "$defs",
    ] {
        if obj.contains_key(forbidden) {
            out.push(format!("{path}: carries {forbidden}"));
        }
    }
    let int_or_string = obj.get("x-kubernetes-int-or-string") == Some(&json!(true));
    let preserve = obj.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true));
    match obj.get("type").and_then(Value::as_str) {
        Some(_) if int_or_string => out.push(format!("{path}: int-or-string with a type")),
        Some(_) => {}
        None if int_or_string || preserve => {}
        None => out.push(format!("{path}: no type")),
    }
    if obj.contains_key("properties") && obj.contains_key("additionalProperties") {
        out.push(format!("{path}: both properties and additionalProperties"));
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (name, prop) in props {
            structural_problems(prop, &format!("{path}.{name}"), out);
        }
    }
    if let Some(items) = obj.get("items") {
        structural_problems(items, &format!("{path}[]"), out);
    }
    if let Some(extra) = obj.get("additionalProperties")
        && extra.is_object()
    {
        structural_problems(extra, &format!("{path}{{}}"), out);
    }
}

#[test]
fn schema_is_structural() {
    let mut problems = Vec::new();
    structural_problems(&schema(), "", &mut problems);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn rules_sit_where_documented() {
    let mut rules = Vec::new();
    all_rules(&schema(), "", &mut rules);
    let at = |path: &str| -> Vec<&str> {
        rules
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, r)| r.as_str())
            .collect()
    };
    assert_eq!(at(".spec.type"), [v1alpha1::rules::type_immutable().rule]);
    assert_eq!(at(".spec.connection").len(), 3);
    assert_eq!(at(".spec.connection.managed.leader").len(), 1);
    assert_eq!(at(".spec.connection.managed.members").len(), 5);
    // Quantities carry no rule: their sign checks are the webhook's (v1alpha1::rules, "Quantities").
    for quantity in [
        ".spec.connection.managed.members[].capacityPerMember",
        ".spec.connection.managed.members[].localBufferSize",
        ".spec.connection.managed.members[].localDisks[].capacity",
    ] {
        assert!(at(quantity).is_empty(), "{quantity}: {:?}", at(quantity));
    }
    let reading = rules
        .iter()
        .filter(|(_, r)| r.contains("quantity(") || r.contains("string(self"))
        .collect::<Vec<_>>();
    assert!(
        reading.is_empty(),
        "rules that convert an int-or-string value (kube-apiserver 1.30 and 1.31 cost them by the \
         largest request and refuse the CRD): {reading:?}"
    );
    assert_eq!(
        at(".spec.connection.managed.members[].localDisks[]").len(),
        1
    );
    assert_eq!(
        at(".spec.connection.managed.members[].localDisks[].eviction").len(),
        2
    );
    assert_eq!(
        at(".spec.connection.managed.members[].localDisks[].eviction.watermark").len(),
        1
    );
    assert_eq!(rules.len(), 14, "{rules:#?}");

    // Transition rules (oldSelf) only on correlatable nodes: never below an atomic list's items.
    for (path, rule) in &rules {
        if rule.contains("oldSelf") {
            assert!(
                !path.contains("[]"),
                "transition rule inside list items at {path}"
            );
        }
    }
}
