//! YAML (and JSON, a subset) read as `kubectl` reads it.
//!
//! `kubectl` converts YAML with the YAML 1.1 rules of `sigs.k8s.io/yaml`, so a plain
//! `defaultMode: 0555` reaches the API server as the integer 365 (octal), and `0o555`, `0x1ff`
//! and `0b101` are integers too. YAML 1.2, the default of our parser, would read `0555` as 555
//! or refuse it; charts are written for kubectl, so we read them as kubectl does. A quoted
//! `'0555'` stays a string, as it does for kubectl.

use serde_json::Value;

use crate::text;

/// Longest parser message kept; the parser quotes the input around an error, and the input is
/// untrusted.
const MAX_MESSAGE_BYTES: usize = 2048;

/// The input is not YAML (or JSON).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not YAML or JSON: {message}")]
pub struct YamlError {
    /// What the parser reported (bounded).
    pub message: String,
}

/// Why a text is not exactly one object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocumentError {
    /// Not YAML.
    #[error(transparent)]
    Yaml(#[from] YamlError),
    /// No document, or more than one.
    #[error("{0} documents in the input; give exactly one object")]
    Count(usize),
    /// The document is not a mapping.
    #[error("not a Kubernetes object (the document is not a mapping)")]
    NotAnObject,
}

fn options() -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    options.legacy_octal_numbers = true;
    options
}

/// A parser message for the user: it quotes the input around the error, so each line is
/// escaped (bidirectional overrides, zero-width characters) and the whole is bounded.
fn parser_message(message: &str) -> String {
    let escaped: Vec<String> = message.lines().map(text::escape).collect();
    text::bounded(&escaped.join("\n"), MAX_MESSAGE_BYTES)
}

/// Every non-empty document of `text`, in order (an empty document, such as the one after a
/// trailing `---`, holds nothing and is skipped, as kubectl skips it).
pub fn documents(text: &str) -> Result<Vec<Value>, YamlError> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple_with_options(text, options()).map_err(|e| YamlError {
            message: parser_message(&e.to_string()),
        })?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// The single object (a mapping) of `text`.
pub fn one_object(text: &str) -> Result<Value, DocumentError> {
    let mut docs = documents(text)?;
    if docs.len() != 1 {
        return Err(DocumentError::Count(docs.len()));
    }
    let doc = docs.remove(0);
    if doc.is_object() {
        Ok(doc)
    } else {
        Err(DocumentError::NotAnObject)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one(text: &str) -> Value {
        match one_object(text) {
            Ok(v) => v,
            Err(e) => panic!("{text:?}: {e}"),
        }
    }

    #[test]
    fn yaml_1_1_integers_read_as_kubectl_reads_them() {
        let v = one("a: 0555\nb: 0400\nc: 0o644\nd: 0x1ff\ne: 0b101\nf: 420\ng: 0\nh: -012\n");
        assert_eq!(
            v,
            json!({"a": 365, "b": 256, "c": 420, "d": 511, "e": 5, "f": 420, "g": 0, "h": -10})
        );
    }

    #[test]
    fn quoted_octal_spellings_stay_strings() {
        let v = one("a: '0555'\nb: \"0400\"\n");
        assert_eq!(v, json!({"a": "0555", "b": "0400"}));
    }

    #[test]
    fn json_reads_unchanged() {
        let v = one(r#"{"apiVersion": "v1", "kind": "Pod", "n": 1.5, "m": [1, "x"]}"#);
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "Pod", "n": 1.5, "m": [1, "x"]})
        );
    }

    #[test]
    fn empty_documents_are_skipped() {
        let docs =
            documents("---\n# Source: chart/templates/a.yaml\n---\na: 1\n---\n---\nb: 2\n---\n");
        assert_eq!(docs, Ok(vec![json!({"a": 1}), json!({"b": 2})]));
        assert_eq!(one_object(""), Err(DocumentError::Count(0)));
        assert_eq!(
            one_object("a: 1\n---\nb: 2\n"),
            Err(DocumentError::Count(2))
        );
        assert_eq!(one_object("- 1\n"), Err(DocumentError::NotAnObject));
    }

    #[test]
    fn parser_messages_are_bounded() {
        let text = format!("a: [{}\n", "x, ".repeat(100_000));
        let Err(e) = documents(&text) else {
            panic!("an unterminated flow sequence is not YAML");
        };
        assert!(
            e.message.len() <= MAX_MESSAGE_BYTES + 40,
            "{}",
            e.message.len()
        );
    }

    #[test]
    fn parser_messages_escape_invisible_characters() {
        let Err(e) = documents("a: [x\u{202e}y, \n") else {
            panic!("an unterminated flow sequence is not YAML");
        };
        // Line breaks separate the parser's snippet lines; nothing else invisible remains.
        let invisible: Vec<char> = e
            .message
            .chars()
            .filter(|c| *c != '\n' && text::is_invisible(*c))
            .collect();
        assert!(invisible.is_empty(), "{invisible:?} in {:?}", e.message);
        assert!(!e.message.contains('\u{202e}'));
    }

    #[test]
    fn duplicate_keys_are_refused() {
        assert!(documents("a: 1\na: 2\n").is_err());
    }
}
