//! Reading a `KVCacheBackend` from YAML or JSON, with the field path of every shape problem.
//!
//! Shape problems are what the API server's schema would refuse before any rule runs: a wrong
//! type, a value outside an enum, a missing required field, and (as `kubectl apply` asks the
//! server for strict field validation by default) a field the API does not have.

use serde_json::Value;
use warmcache_api_kvcache::v1alpha1::{API_VERSION, KIND, KVCacheBackend};

use warmcache_cli::text;

use crate::error::{FieldError, FieldErrorKind, ParseError};

/// Why a text did not yield a backend.
#[derive(Debug, thiserror::Error)]
pub enum DecodeFailure {
    /// The text is not a `KVCacheBackend` document at all.
    #[error(transparent)]
    NotABackend(#[from] ParseError),
    /// It is one, but its fields do not fit the API.
    #[error("the backend does not fit the API ({} problem(s))", .0.len())]
    Shape(Vec<FieldError>),
}

/// Reads exactly one YAML (or JSON) document holding a `worker.gpustack.ai/v1alpha1`
/// `KVCacheBackend`.
pub fn parse_backend(text: &str) -> Result<KVCacheBackend, DecodeFailure> {
    let document = parse_document(text)?;
    from_value(document).map_err(DecodeFailure::Shape)
}

/// Reads exactly one YAML (or JSON) document and checks that it names itself a
/// `worker.gpustack.ai/v1alpha1` `KVCacheBackend`, without decoding its fields (see
/// [`crate::validate_values`], which decides some updates on the raw document).
pub fn parse_document(text: &str) -> Result<Value, ParseError> {
    // Read as kubectl reads it (YAML 1.1 integers, empty documents skipped), the convention of
    // every command; a parser message is bounded.
    let mut documents =
        warmcache_cli::yaml::documents(text).map_err(|e| ParseError::Yaml(e.message))?;
    if documents.len() != 1 {
        return Err(ParseError::Documents(documents.len()));
    }
    let document = documents.remove(0);
    if !document.is_object() {
        return Err(ParseError::NotAnObject);
    }
    let api_version = document.get("apiVersion").and_then(Value::as_str);
    let kind = document.get("kind").and_then(Value::as_str);
    if api_version != Some(API_VERSION) || kind != Some(KIND) {
        return Err(ParseError::WrongKind {
            found: format!(
                "apiVersion {} kind {}",
                api_version.map_or_else(|| "(none)".to_owned(), warmcache_cli::text::shown),
                kind.map_or_else(|| "(none)".to_owned(), warmcache_cli::text::shown),
            ),
        });
    }
    Ok(document)
}

/// Converts a JSON object (an admission request's object, or a parsed document) into a backend,
/// refusing fields the API does not have and values of the wrong shape, each with its path.
pub fn from_value(value: Value) -> Result<KVCacheBackend, Vec<FieldError>> {
    let backend = decode_typed(&value)?;
    let mut unknown = Vec::new();
    // The root: what a KVCacheBackend has, and nothing else (`kubectl apply --validate=strict`).
    if let Value::Object(root) = &value {
        for (key, child) in root {
            if !ROOT_FIELDS.contains(&key.as_str()) && !child.is_null() {
                unknown.push(unknown_field(text::path(key)));
            }
        }
    }
    // Each part against its typed value serialized back: metadata through k8s-openapi's
    // ObjectMeta (ownerReferences and managedFields items included), spec and status through
    // this API's types.
    let parts = [
        ("metadata", serde_json::to_value(&backend.metadata)),
        ("spec", serde_json::to_value(&backend.spec)),
        ("status", serde_json::to_value(&backend.status)),
    ];
    for (name, output) in parts {
        if let (Some(input), Ok(output)) = (value.get(name), output) {
            unknown_fields(name, input, &output, &mut unknown);
        }
    }
    if unknown.is_empty() {
        Ok(backend)
    } else {
        Err(unknown)
    }
}

/// Converts a stored object (the old object of an update) into a backend: like [`from_value`],
/// but fields the API does not have are ignored rather than refused, since the API server, not
/// the author, wrote them (a newer CRD version may carry fields this operator does not know).
pub fn stored_from_value(value: &Value) -> Result<KVCacheBackend, Vec<FieldError>> {
    decode_typed(value)
}

/// Decodes `value`, reporting the first wrong type, enum value or missing field with its path.
fn decode_typed(value: &Value) -> Result<KVCacheBackend, Vec<FieldError>> {
    serde_path_to_error::deserialize(value).map_err(|err| {
        let path = err.path().to_string();
        let path = if path == "." { String::new() } else { path };
        vec![FieldError::new(
            if path.is_empty() {
                "(root)".to_owned()
            } else {
                path
            },
            FieldErrorKind::Invalid,
            format!("does not fit the API: {}", err.into_inner()),
        )]
    })
}

/// The fields of a `KVCacheBackend` at the root of the object.
const ROOT_FIELDS: [&str; 5] = ["apiVersion", "kind", "metadata", "spec", "status"];

fn unknown_field(path: String) -> FieldError {
    FieldError::new(
        path,
        FieldErrorKind::NotSupported,
        "is not a field of KVCacheBackend: the API server would refuse it under strict field validation \
         (kubectl's default) or drop it silently otherwise",
    )
}

/// Reports every key of `input` that the typed value (serialized back, `output`) does not have.
fn unknown_fields(path: &str, input: &Value, output: &Value, found: &mut Vec<FieldError>) {
    match (input, output) {
        (Value::Object(input), Value::Object(output)) => {
            for (key, value) in input {
                let child = format!("{path}.{key}");
                match output.get(key) {
                    Some(out) => unknown_fields(&child, value, out, found),
                    // An explicit null of an optional field is the same as leaving it out.
                    None if value.is_null() => {}
                    None => found.push(unknown_field(text::path(&child))),
                }
            }
        }
        (Value::Array(input), Value::Array(output)) => {
            for (i, (value, out)) in input.iter().zip(output).enumerate() {
                unknown_fields(&format!("{path}[{i}]"), value, out, found);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str =
        "apiVersion: worker.gpustack.ai/v1alpha1\nkind: KVCacheBackend\nmetadata: {name: kvc}\n";

    #[test]
    fn a_huge_kind_is_shown_bounded() {
        let text = format!("apiVersion: v1\nkind: {}\n", "K".repeat(1_000_000));
        let Err(e) = parse_document(&text) else {
            panic!("not a backend");
        };
        let message = e.to_string();
        assert!(message.len() < 300, "{}", message.len());
        assert!(message.contains("(1000000 bytes in all)"), "{message}");
    }

    #[test]
    fn yaml_is_read_as_kubectl_reads_it() {
        // A YAML 1.1 octal spelling is an integer, as kubectl sends it (and then a type error
        // for a string field), not the string "0555".
        let text = format!("{HEADER}spec:\n  image: 0555\n");
        let Ok(document) = parse_document(&text) else {
            panic!("one backend document");
        };
        assert_eq!(document["spec"]["image"], serde_json::json!(365));
    }

    fn shape(text: &str) -> Vec<String> {
        match parse_backend(text) {
            Err(DecodeFailure::Shape(errors)) => errors.iter().map(ToString::to_string).collect(),
            other => panic!("expected shape errors, got {other:?}"),
        }
    }

    #[test]
    fn reads_a_backend() {
        let text = format!(
            "{HEADER}spec:\n  image: x:1\n  connection:\n    managed:\n      leader: {{}}\n      members:\n      \
             - nodeSelector: {{kvcache: \"true\"}}\n        medium: DRAM\n        capacityPerMember: 4Gi\n"
        );
        let backend = parse_backend(&text).unwrap();
        assert_eq!(backend.metadata.name.as_deref(), Some("kvc"));
        let managed = backend.spec.connection.managed.unwrap();
        assert_eq!(managed.leader.replicas, 1);
        assert_eq!(managed.members[0].capacity_per_member.0, "4Gi");
    }

    #[test]
    fn enum_values_are_refused_with_their_path() {
        let text = format!(
            "{HEADER}spec:\n  connection:\n    managed:\n      leader: {{}}\n      members:\n      \
             - nodeSelector: {{}}\n        medium: HBM\n        capacityPerMember: 4Gi\n"
        );
        let errors = shape(&text);
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].starts_with("spec.connection.managed.members[0].medium: "),
            "{errors:?}"
        );
        assert!(errors[0].contains("HBM"), "{errors:?}");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let text = format!(
            "{HEADER}spec:\n  connection:\n    managed:\n      leader: {{replica: 2}}\n      members:\n      \
             - nodeSelector: {{}}\n        medium: DRAM\n        capacityPerMember: 4Gi\n        localDisk: \
             {{path: /x}}\n"
        );
        let errors = shape(&text);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].starts_with("spec.connection.managed.leader.replica: "));
        assert!(errors[1].starts_with("spec.connection.managed.members[0].localDisk: "));
    }

    #[test]
    fn unknown_fields_outside_spec_are_refused() {
        let spec = "spec:\n  image: x:1\n  connection:\n    managed:\n      leader: {}\n      members:\n      \
             - nodeSelector: {}\n        medium: DRAM\n        capacityPerMember: 4Gi\n";
        let head = "apiVersion: worker.gpustack.ai/v1alpha1\nkind: KVCacheBackend\n";
        let errors = shape(&format!(
            "{head}metadata: {{name: kvc}}\nsepc: {{}}\n{spec}"
        ));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("sepc: is not a field"), "{errors:?}");
        let errors = shape(&format!(
            "{head}metadata: {{name: kvc, lables: {{a: b}}, labels: {{a: b}}}}\n{spec}"
        ));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("metadata.lables: "), "{errors:?}");
        let errors = shape(&format!(
            "{head}metadata:\n  name: kvc\n  ownerReferences:\n  - {{apiVersion: v1, kind: X, nmae: owner, name: owner, uid: u}}\n{spec}"
        ));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("metadata.ownerReferences[0].nmae: "),
            "{errors:?}"
        );
        let errors = shape(&format!(
            "{head}metadata:\n  name: kvc\n  managedFields:\n  - {{manager: m, operation: Apply, fieldsV1: {{f:spec: {{}}}}, tmie: x}}\n{spec}"
        ));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("metadata.managedFields[0].tmie: "),
            "{errors:?}"
        );
        let errors = shape(&format!(
            "{head}metadata: {{name: kvc}}\n{spec}status: {{phsae: Ready}}\n"
        ));
        assert!(errors[0].starts_with("status.phsae: "), "{errors:?}");
        // An invisible character in a key is shown escaped.
        let errors = shape(&format!(
            "{head}metadata: {{name: kvc, \"na\u{200b}me\": x}}\n{spec}"
        ));
        assert!(
            errors[0].starts_with("metadata.na\\u{200b}me: "),
            "{errors:?}"
        );
        // Every field ObjectMeta has is taken; a stored object stays lenient.
        let full = format!(
            "{head}metadata:\n  name: kvc\n  generateName: k\n  namespace: ''\n  uid: u\n  resourceVersion: '1'\n  \
             generation: 2\n  creationTimestamp: '2024-01-01T00:00:00Z'\n  labels: {{a: b}}\n  annotations: {{a: b}}\n  \
             finalizers: [x/y]\n  deletionGracePeriodSeconds: 0\n  selfLink: /x\n{spec}"
        );
        assert!(
            parse_backend(&full).is_ok(),
            "{:?}",
            parse_backend(&full).err()
        );
        let stored = parse_document(&format!(
            "{head}metadata: {{name: kvc, lables: {{}}}}\nsepc: 1\n{spec}"
        ))
        .unwrap();
        assert!(stored_from_value(&stored).is_ok());
    }

    #[test]
    fn not_a_backend() {
        assert!(matches!(
            parse_backend("a: [b"),
            Err(DecodeFailure::NotABackend(ParseError::Yaml(_)))
        ));
        assert!(matches!(
            parse_backend(""),
            Err(DecodeFailure::NotABackend(ParseError::Documents(0)))
        ));
        assert!(matches!(
            parse_backend("- 1\n"),
            Err(DecodeFailure::NotABackend(ParseError::NotAnObject))
        ));
        assert!(matches!(
            parse_backend("apiVersion: v1\nkind: ConfigMap\n"),
            Err(DecodeFailure::NotABackend(ParseError::WrongKind { .. }))
        ));
        assert!(matches!(
            parse_backend(&format!("{HEADER}spec: {{}}\n---\n{HEADER}spec: {{}}\n")),
            Err(DecodeFailure::NotABackend(ParseError::Documents(2)))
        ));
    }
}
