//! The CEL rules of the generated ModelCacheBinding CRD, evaluated with kube-cel against the
//! shared case table, plus checks that the generated schema is one the API server accepts.

// Helpers outside #[test] fns count as non-test code for clippy; this whole crate is a test.
#![allow(clippy::expect_used, clippy::panic)]

mod cases;

use std::collections::BTreeSet;

use cases::{Case, Target, cases};
use kube::CustomResourceExt;
use kube_cel::{ErrorKind, ScopeContext, Validator, analyze_rule, compile_schema};
use regex::Regex;
use serde_json::Value;
use warmcache_api_modelcache::v2beta1::{self, CEL_RULES, ModelCacheBinding};

/// The `openAPIV3Schema` of the generated CRD, as JSON.
fn crd_schema() -> Value {
    let crd = ModelCacheBinding::crd();
    assert_eq!(crd.spec.versions.len(), 1);
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("generated CRD has an openAPIV3Schema");
    serde_json::to_value(schema).expect("schema serializes")
}

/// Every `x-kubernetes-validations` entry as (path, rule, message), in walk order.
fn collect_rules(schema: &Value, path: &str, out: &mut Vec<(String, String, String)>) {
    if let Some(rules) = schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    {
        for rule in rules {
            out.push((
                path.to_owned(),
                rule["rule"].as_str().unwrap_or_default().to_owned(),
                rule["message"].as_str().unwrap_or_default().to_owned(),
            ));
        }
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, child) in props {
            let child_path = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            collect_rules(child, &child_path, out);
        }
    }
    if let Some(items) = schema.get("items") {
        collect_rules(items, &format!("{path}[]"), out);
    }
}

fn describe(case: &Case) -> String {
    format!(
        "case {:?} ({:?}, old: {})",
        case.name,
        case.target,
        case.old.is_some()
    )
}

#[test]
fn every_case_has_the_expected_outcome() {
    let schema = crd_schema();
    let validator = Validator::new();
    let mut failures = Vec::new();
    for case in cases() {
        let result = validator.validate(&schema, &case.new, case.old.as_ref());
        match (case.allowed, result) {
            (true, Ok(())) => {}
            (true, Err(errors)) => failures.push(format!("{}: refused: {errors}", describe(&case))),
            (false, Ok(())) => failures.push(format!("{}: allowed", describe(&case))),
            (false, Err(errors)) => {
                for error in errors.iter() {
                    if error.kind != ErrorKind::ValidationFailure {
                        failures.push(format!("{}: not a rule refusal: {error}", describe(&case)));
                    }
                }
                let expected = case.message.unwrap_or_default();
                if expected.is_empty() || !errors.iter().any(|e| e.message.contains(expected)) {
                    failures.push(format!(
                        "{}: refused, but not with {expected:?}: {errors}",
                        describe(&case)
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failing case(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn cases_are_well_formed() {
    let mut names = BTreeSet::new();
    for case in cases() {
        assert!(
            names.insert(case.name),
            "duplicate case name {:?}",
            case.name
        );
        assert_eq!(case.allowed, case.message.is_none(), "{}", describe(&case));
        match (&case.old, case.target) {
            (None, Target::Main) => {}
            (None, Target::Status) => panic!(
                "{}: a create goes through the main endpoint",
                describe(&case)
            ),
            // The API server keeps the stored status on main-endpoint updates...
            (Some(old), Target::Main) => {
                assert_eq!(
                    old.get("status"),
                    case.new.get("status"),
                    "{}",
                    describe(&case)
                );
            }
            // ...and the stored spec and metadata on /status updates.
            (Some(old), Target::Status) => {
                assert_eq!(old["spec"], case.new["spec"], "{}", describe(&case));
                assert_eq!(old["metadata"], case.new["metadata"], "{}", describe(&case));
                assert_ne!(
                    old.get("status"),
                    case.new.get("status"),
                    "{}",
                    describe(&case)
                );
            }
        }
    }
}

#[test]
fn every_rule_is_covered_by_allowed_and_refused_cases() {
    let cases = cases();
    for (rule, message) in CEL_RULES {
        assert!(
            cases.iter().any(|c| c.message == Some(message)),
            "no refused case for rule {rule:?}"
        );
    }
    let refused_updates = cases
        .iter()
        .filter(|c| !c.allowed && c.old.is_some())
        .count();
    let allowed_updates = cases
        .iter()
        .filter(|c| c.allowed && c.old.is_some())
        .count();
    let allowed_creates = cases
        .iter()
        .filter(|c| c.allowed && c.old.is_none())
        .count();
    let refused_creates = cases
        .iter()
        .filter(|c| !c.allowed && c.old.is_none())
        .count();
    assert!(
        refused_updates > 0 && allowed_updates > 0 && allowed_creates > 0 && refused_creates > 0
    );
}

#[test]
fn crd_carries_exactly_the_documented_rules() {
    let mut rules = Vec::new();
    collect_rules(&crd_schema(), "", &mut rules);
    let expected: Vec<(String, String, String)> = [
        ("", v2beta1::RULE_STATUS_KEPT, v2beta1::MSG_STATUS_KEPT),
        (
            "spec",
            v2beta1::RULE_SPEC_IMMUTABLE,
            v2beta1::MSG_SPEC_IMMUTABLE,
        ),
        (
            "spec.decision",
            v2beta1::RULE_ACCESS_MODES_MATCH_TRANSITION,
            v2beta1::MSG_ACCESS_MODES_MATCH_TRANSITION,
        ),
        (
            "spec.decision",
            v2beta1::RULE_ENCRYPTION_NEEDS_ROX,
            v2beta1::MSG_ENCRYPTION_NEEDS_ROX,
        ),
        (
            "spec.decision",
            v2beta1::RULE_WRITER_IDENTITY_WITH_RWX,
            v2beta1::MSG_WRITER_IDENTITY_WITH_RWX,
        ),
        ("status", v2beta1::RULE_PHASE_KEPT, v2beta1::MSG_PHASE_KEPT),
        (
            "status",
            v2beta1::RULE_RETIRING_IS_FINAL,
            v2beta1::MSG_RETIRING_IS_FINAL,
        ),
        (
            "status",
            v2beta1::RULE_PROVIDER_DATA_IDENTITY_IMMUTABLE,
            v2beta1::MSG_PROVIDER_DATA_IDENTITY_IMMUTABLE,
        ),
        (
            "status",
            v2beta1::RULE_RESOLVED_REVISION_IMMUTABLE,
            v2beta1::MSG_RESOLVED_REVISION_IMMUTABLE,
        ),
    ]
    .into_iter()
    .map(|(p, r, m)| (p.to_owned(), r.to_owned(), m.to_owned()))
    .collect();
    assert_eq!(rules, expected);
    assert_eq!(rules.len(), CEL_RULES.len());
    let documented: BTreeSet<_> = CEL_RULES
        .iter()
        .map(|(r, m)| (r.to_string(), m.to_string()))
        .collect();
    let generated: BTreeSet<_> = rules
        .iter()
        .map(|(_, r, m)| (r.clone(), m.clone()))
        .collect();
    assert_eq!(documented, generated);
    for (_, _, message) in &rules {
        assert!(
            !message.contains('\n'),
            "the API server refuses multi-line messages: {message}"
        );
    }
}

#[test]
fn rules_compile_and_use_only_crd_variables() {
    let schema = crd_schema();
    let compiled = compile_schema(&schema);
    assert!(
        !compiled.has_errors(),
        "{:?}",
        compiled.compilation_errors()
    );
    let nodes = [
        ("", &schema),
        ("spec", &schema["properties"]["spec"]),
        (
            "spec.decision",
            &schema["properties"]["spec"]["properties"]["decision"],
        ),
        ("status", &schema["properties"]["status"]),
    ];
    for (path, node) in nodes {
        let compiled_node = compile_schema(node);
        for rule in node["x-kubernetes-validations"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let text = rule["rule"].as_str().unwrap_or_default();
            let warnings = analyze_rule(text, &compiled_node, ScopeContext::CrdValidation);
            assert!(warnings.is_empty(), "{path}: {text}: {warnings:?}");
        }
    }
}

/// Structural-schema checks the API server applies to a CRD (and a few of our own).
fn check_structural(schema: &Value, path: &str, problems: &mut Vec<String>) {
    let Some(node) = schema.as_object() else {
        problems.push(format!("{path}: schema is not an object"));
        return;
    };
    for forbidden in [
        "$ref",
        "$schema",
        "definitions",
        "$defs",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "default",
    ] {
        if node.contains_key(forbidden) {
            problems.push(format!("{path}: has {forbidden}"));
        }
    }
    let Some(ty) = node.get("type").and_then(Value::as_str) else {
        problems.push(format!("{path}: no single type"));
        return;
    };
    if node.get("nullable") == Some(&Value::Bool(true)) && path != "status" {
        problems.push(format!(
            "{path}: nullable (optional fields are omitted, never null)"
        ));
    }
    if let Some(values) = node.get("enum").and_then(Value::as_array)
        && values.iter().any(Value::is_null)
    {
        problems.push(format!("{path}: enum contains null"));
    }
    let under_spec = path == "spec" || path.starts_with("spec.");
    match ty {
        "object" => {
            let props = node.get("properties").and_then(Value::as_object);
            if props.is_some() && node.contains_key("additionalProperties") {
                problems.push(format!(
                    "{path}: properties and additionalProperties together"
                ));
            }
            let Some(props) = props else {
                problems.push(format!("{path}: object without properties"));
                return;
            };
            for required in node
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if !required.as_str().is_some_and(|r| props.contains_key(r)) {
                    problems.push(format!("{path}: required {required} is not a property"));
                }
            }
            for (name, child) in props {
                let child_path = if path.is_empty() {
                    name.clone()
                } else {
                    format!("{path}.{name}")
                };
                match child.get("description").and_then(Value::as_str) {
                    Some(d) if !d.trim().is_empty() && !d.contains('\n') => {}
                    other => problems.push(format!("{child_path}: description {other:?}")),
                }
                check_structural(child, &child_path, problems);
            }
        }
        "array" => {
            let Some(items) = node.get("items") else {
                problems.push(format!("{path}: array without items"));
                return;
            };
            if under_spec && !node.contains_key("maxItems") {
                problems.push(format!("{path}: spec list without maxItems (CEL cost)"));
            }
            match node.get("x-kubernetes-list-type").and_then(Value::as_str) {
                Some("set") => {
                    if !matches!(
                        items["type"].as_str(),
                        Some("string" | "integer" | "boolean")
                    ) {
                        problems.push(format!("{path}: set of non-scalars"));
                    }
                }
                Some("map") => {
                    let keys = node["x-kubernetes-list-map-keys"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    let required = items["required"].as_array().cloned().unwrap_or_default();
                    if keys.is_empty() || keys.iter().any(|k| !required.contains(k)) {
                        problems.push(format!("{path}: map keys {keys:?} not all required"));
                    }
                }
                Some("atomic") => {}
                other => problems.push(format!("{path}: list type {other:?}")),
            }
            check_structural(items, &format!("{path}[]"), problems);
        }
        "string" => {
            let bounded = node.contains_key("maxLength")
                || node.contains_key("enum")
                || node
                    .get("pattern")
                    .and_then(Value::as_str)
                    .is_some_and(|p| p.contains("{64}$"));
            if under_spec && !bounded {
                problems.push(format!("{path}: unbounded spec string (CEL cost)"));
            }
            if let Some(pattern) = node.get("pattern").and_then(Value::as_str)
                && Regex::new(pattern).is_err()
            {
                problems.push(format!("{path}: bad pattern {pattern}"));
            }
        }
        "boolean" | "integer" => {}
        other => problems.push(format!("{path}: unexpected type {other}")),
    }
}

#[test]
fn generated_schema_is_structural() {
    let schema = crd_schema();
    let mut problems = Vec::new();
    check_structural(&schema, "", &mut problems);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // kube adds `nullable` to the optional root status; nothing else is nullable.
    assert_eq!(
        schema["properties"]["status"]["nullable"],
        Value::Bool(true)
    );
    assert_eq!(schema["required"], serde_json::json!(["spec"]));
}

/// Checks `value` against the OpenAPI schema the way the API server's structural validation
/// does, to make sure every case object reaches the CEL rules. Unknown fields count as errors
/// here (the API server would prune them, which would make a case meaningless).
fn check_value(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    if value.is_null() {
        if schema.get("nullable") != Some(&Value::Bool(true)) {
            errors.push(format!("{path}: null"));
        }
        return;
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array)
        && !values.contains(value)
    {
        errors.push(format!("{path}: {value} not in {values:?}"));
    }
    match schema["type"].as_str().unwrap_or_default() {
        "object" => {
            let Some(obj) = value.as_object() else {
                errors.push(format!("{path}: not an object"));
                return;
            };
            let props = schema["properties"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            for required in schema["required"].as_array().into_iter().flatten() {
                if !required.as_str().is_some_and(|r| obj.contains_key(r)) {
                    errors.push(format!("{path}: missing {required}"));
                }
            }
            for (key, child) in obj {
                let child_path = format!("{path}.{key}");
                match props.get(key) {
                    Some(child_schema) => check_value(child_schema, child, &child_path, errors),
                    None => errors.push(format!("{child_path}: unknown field")),
                }
            }
        }
        "array" => {
            let Some(items) = value.as_array() else {
                errors.push(format!("{path}: not an array"));
                return;
            };
            let len = items.len() as u64;
            if schema["minItems"].as_u64().is_some_and(|min| len < min)
                || schema["maxItems"].as_u64().is_some_and(|max| len > max)
            {
                errors.push(format!("{path}: {len} items out of bounds"));
            }
            match schema["x-kubernetes-list-type"].as_str() {
                Some("set") => {
                    let unique: BTreeSet<String> = items.iter().map(Value::to_string).collect();
                    if unique.len() != items.len() {
                        errors.push(format!("{path}: duplicate set items"));
                    }
                }
                Some("map") => {
                    let keys = schema["x-kubernetes-list-map-keys"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    let tuples: BTreeSet<String> = items
                        .iter()
                        .map(|item| {
                            keys.iter()
                                .map(|k| item[k.as_str().unwrap_or_default()].to_string())
                                .collect()
                        })
                        .collect();
                    if tuples.len() != items.len() {
                        errors.push(format!("{path}: duplicate map keys"));
                    }
                }
                _ => {}
            }
            for (i, item) in items.iter().enumerate() {
                check_value(&schema["items"], item, &format!("{path}[{i}]"), errors);
            }
        }
        "string" => {
            let Some(text) = value.as_str() else {
                errors.push(format!("{path}: not a string"));
                return;
            };
            let len = text.chars().count() as u64;
            if schema["minLength"].as_u64().is_some_and(|min| len < min)
                || schema["maxLength"].as_u64().is_some_and(|max| len > max)
            {
                errors.push(format!("{path}: length {len} out of bounds"));
            }
            if let Some(pattern) = schema["pattern"].as_str()
                && !Regex::new(pattern).expect("valid pattern").is_match(text)
            {
                errors.push(format!("{path}: {text:?} does not match {pattern}"));
            }
            if schema["format"] == "date-time" {
                let rfc3339 =
                    Regex::new(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
                        .expect("valid pattern");
                if !rfc3339.is_match(text) {
                    errors.push(format!("{path}: {text:?} is not a date-time"));
                }
            }
        }
        "boolean" => {
            if !value.is_boolean() {
                errors.push(format!("{path}: not a boolean"));
            }
        }
        "integer" => match value.as_i64() {
            Some(n) if schema["minimum"].as_f64().is_none_or(|min| n as f64 >= min) => {}
            _ => errors.push(format!("{path}: not an allowed integer")),
        },
        other => errors.push(format!("{path}: unexpected schema type {other:?}")),
    }
}

/// Checks a whole object: the parts the CRD schema leaves to the API server, then the schema.
fn check_object(schema: &Value, object: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    if object["apiVersion"] != v2beta1::API_VERSION || object["kind"] != "ModelCacheBinding" {
        errors.push("apiVersion/kind".to_owned());
    }
    let label = Regex::new("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$").expect("valid pattern");
    for field in ["name", "namespace"] {
        let value = object["metadata"][field].as_str().unwrap_or_default();
        if !label.is_match(value) || value.len() > 63 {
            errors.push(format!("metadata.{field}: {value:?}"));
        }
    }
    let mut body = object.clone();
    if let Some(map) = body.as_object_mut() {
        for key in ["apiVersion", "kind", "metadata"] {
            map.remove(key);
        }
    }
    check_value(schema, &body, "", &mut errors);
    errors
}

#[test]
fn case_objects_are_schema_valid() {
    let schema = crd_schema();
    let mut failures = Vec::new();
    for case in cases() {
        for (which, object) in [("old", case.old.as_ref()), ("new", Some(&case.new))] {
            let Some(object) = object else { continue };
            let errors = check_object(&schema, object);
            if !errors.is_empty() {
                failures.push(format!(
                    "{} {which}: {}",
                    describe(&case),
                    errors.join("; ")
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn schema_checker_rejects_invalid_objects() {
    // The checker above must not be vacuous.
    let schema = crd_schema();
    let base = cases::rwx_binding();
    let invalid = [
        cases::with(
            base.clone(),
            "/spec/decision/catalogDigest",
            serde_json::json!("sha256:XYZ"),
        ),
        cases::with(
            base.clone(),
            "/spec/identity/workflow",
            serde_json::json!("other"),
        ),
        cases::with(
            base.clone(),
            "/spec/storageClass/reclaimPolicy",
            serde_json::json!("Delete"),
        ),
        cases::with(
            base.clone(),
            "/spec/storageClass/configurationDigest",
            serde_json::json!("sha256:00"),
        ),
        cases::with(
            base.clone(),
            "/spec/decision/requiredAccessModes",
            serde_json::json!([]),
        ),
        cases::with(
            base.clone(),
            "/spec/decision/requiredMountOptions",
            serde_json::json!([" ro"]),
        ),
        cases::with(
            base.clone(),
            "/spec/resources/writerNamespace",
            serde_json::json!("Team_A"),
        ),
        cases::with(
            base.clone(),
            "/spec/resources/jobNames",
            serde_json::json!(["a", "a"]),
        ),
        cases::with(
            base.clone(),
            "/spec/resources/extra",
            serde_json::json!("x"),
        ),
        cases::without(base.clone(), "/spec/storageClass/uid"),
        cases::with(
            base.clone(),
            "/status",
            serde_json::json!({"phase": "Gone"}),
        ),
        cases::with(
            base.clone(),
            "/status/requestReferences",
            serde_json::json!([cases::reference("a", "u1"), cases::reference("b", "u1")]),
        ),
    ];
    for object in invalid {
        assert!(
            !check_object(&schema, &object).is_empty(),
            "accepted: {object}"
        );
    }
}

#[test]
fn case_objects_round_trip_through_the_rust_types() {
    // A read-modify-write client must send back exactly what it read, or `self == oldSelf`
    // on spec would refuse its update.
    for case in cases() {
        for object in case.old.iter().chain([&case.new]) {
            let typed: ModelCacheBinding = serde_json::from_value(object.clone())
                .unwrap_or_else(|e| panic!("{}: {e}", describe(&case)));
            let back = serde_json::to_value(&typed).expect("serializes");
            assert_eq!(&back, object, "{}", describe(&case));
        }
    }
}

#[test]
fn main_endpoint_cannot_touch_status_rules_and_create_skips_transition_rules() {
    // kube-cel mirrors the API server: with no old object, rules that read oldSelf do not run.
    let schema = crd_schema();
    let retiring = cases::with(cases::rwx_binding(), "/status", cases::status("Retiring"));
    assert!(Validator::new().validate(&schema, &retiring, None).is_ok());
}
