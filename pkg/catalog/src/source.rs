//! Where a catalog comes from: the ConfigMap `nvcf-storage-capabilities`, the built-in copy
//! used only when that ConfigMap does not exist, or a file given to the offline commands.

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::Value;

use crate::digest::catalog_revision;
use crate::error::{FieldError, FieldErrors, FieldPath, LoadError, Refusal};
use crate::loader::{Catalog, parse_yaml, type_name};

/// Name of the ConfigMap that holds the catalog, in the namespace the controllers run in.
pub const CONFIG_MAP_NAME: &str = "nvcf-storage-capabilities";

/// Data key of that ConfigMap; its value is the catalog YAML document.
pub const CONFIG_MAP_KEY: &str = "storage-provider-capabilities.yaml";

/// The shipped catalog, compiled in. Byte-identical to
/// `config/catalog/nvcf-storage-capabilities-v1alpha1.yaml` (it is that file).
pub const BUILTIN_CATALOG: &str =
    include_str!("../../../config/catalog/nvcf-storage-capabilities-v1alpha1.yaml");

/// Path of [`BUILTIN_CATALOG`] relative to the repository root.
pub const BUILTIN_CATALOG_PATH: &str = "config/catalog/nvcf-storage-capabilities-v1alpha1.yaml";

/// One loaded catalog with its revision and whether it is the built-in copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogSnapshot {
    catalog: Catalog,
    revision: String,
    builtin: bool,
}

impl CatalogSnapshot {
    /// Loads a catalog payload (the ConfigMap value or a file's text).
    pub fn from_payload(payload: &str) -> Result<Self, LoadError> {
        Ok(Self {
            catalog: Catalog::from_yaml(payload)?,
            revision: catalog_revision(payload),
            builtin: false,
        })
    }

    /// The built-in catalog, flagged as such. Its validity is tested; the `Result` only keeps
    /// this free of a panic path.
    pub fn builtin() -> Result<Self, LoadError> {
        let mut snapshot = Self::from_payload(BUILTIN_CATALOG)?;
        snapshot.builtin = true;
        Ok(snapshot)
    }

    /// The catalog in effect given the ConfigMap as read: `None` (NotFound) selects the
    /// built-in copy. A ConfigMap that exists without the data key, with an empty value or with
    /// an invalid document is an error, never a fallback to the built-in copy. Error paths
    /// start at `data[storage-provider-capabilities.yaml]`.
    pub fn from_config_map(config_map: Option<&ConfigMap>) -> Result<Self, LoadError> {
        let Some(config_map) = config_map else {
            return Self::builtin();
        };
        let path = data_path();
        let payload = config_map
            .data
            .as_ref()
            .and_then(|data| data.get(CONFIG_MAP_KEY));
        let payload = match payload {
            None => return Err(invalid(path, Refusal::MissingData)),
            Some(p) if p.is_empty() => return Err(invalid(path, Refusal::EmptyData)),
            Some(p) => p,
        };
        load_embedded(payload, &path)
    }

    /// The validated catalog.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// `sha256:` digest of the payload ([`catalog_revision`]).
    pub fn revision(&self) -> &str {
        &self.revision
    }

    /// Whether this is the built-in copy (the ConfigMap was absent). The caller logs a warning
    /// and counts it.
    pub fn is_builtin(&self) -> bool {
        self.builtin
    }
}

fn data_path() -> FieldPath {
    FieldPath::root().field("data").key(CONFIG_MAP_KEY)
}

fn invalid(path: FieldPath, refusal: Refusal) -> LoadError {
    LoadError::Invalid(FieldErrors(vec![FieldError { path, refusal }]))
}

/// Loads a catalog held in a ConfigMap value: a YAML error is a refusal of that field, and
/// every path is prefixed with it.
fn load_embedded(payload: &str, prefix: &FieldPath) -> Result<CatalogSnapshot, LoadError> {
    CatalogSnapshot::from_payload(payload).map_err(|error| match error {
        LoadError::Yaml(e) => invalid(prefix.clone(), Refusal::NotYaml { message: e.message }),
        LoadError::Invalid(errors) => LoadError::Invalid(FieldErrors(
            errors
                .0
                .into_iter()
                .map(|e| FieldError {
                    path: e.path.under(prefix),
                    refusal: e.refusal,
                })
                .collect(),
        )),
    })
}

/// Which form a catalog file had.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileForm {
    /// The catalog document itself.
    Document,
    /// A ConfigMap manifest holding it.
    ConfigMap,
}

/// A catalog read from a file: either the document itself or a ConfigMap manifest holding it
/// under [`CONFIG_MAP_KEY`] (recognized by `kind: ConfigMap`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogFile {
    /// The catalog and the revision of its payload (the ConfigMap value for a manifest).
    pub snapshot: CatalogSnapshot,
    /// Which form the file had.
    pub form: FileForm,
}

impl CatalogFile {
    /// Parses a file's text. [`LoadError::Yaml`] when the file is not YAML; otherwise every
    /// refusal with its path (for a manifest, paths start at `metadata` or `data[...]`).
    pub fn parse(text: &str) -> Result<Self, LoadError> {
        let value = parse_yaml(text)?;
        let is_config_map = value
            .as_object()
            .and_then(|m| m.get("kind"))
            .and_then(Value::as_str)
            == Some("ConfigMap");
        if !is_config_map {
            let catalog = Catalog::from_value(&value).map_err(LoadError::Invalid)?;
            return Ok(Self {
                snapshot: CatalogSnapshot {
                    catalog,
                    revision: catalog_revision(text),
                    builtin: false,
                },
                form: FileForm::Document,
            });
        }
        let mut errors = Vec::new();
        let root = FieldPath::root();
        match value.get("apiVersion") {
            Some(Value::String(v)) if v == "v1" => {}
            found => errors.push(FieldError {
                path: root.field("apiVersion"),
                refusal: Refusal::WrongConstant {
                    field: "apiVersion",
                    found: match found {
                        Some(Value::String(s)) => s.clone(),
                        Some(other) => other.to_string(),
                        None => String::new(),
                    },
                    expected: "v1",
                },
            }),
        }
        let name = value.pointer("/metadata/name");
        if name.and_then(Value::as_str) != Some(CONFIG_MAP_NAME) {
            errors.push(FieldError {
                path: root.field("metadata").field("name"),
                refusal: Refusal::WrongConfigMapName {
                    found: match name {
                        Some(Value::String(s)) => s.clone(),
                        Some(other) => other.to_string(),
                        None => String::new(),
                    },
                },
            });
        }
        let path = data_path();
        let loaded = match value.get("data").and_then(|d| d.get(CONFIG_MAP_KEY)) {
            None => Err(invalid(path, Refusal::MissingData)),
            Some(Value::String(p)) if p.is_empty() => Err(invalid(path, Refusal::EmptyData)),
            Some(Value::String(p)) => load_embedded(p, &path),
            Some(other) => Err(invalid(
                path,
                Refusal::WrongType {
                    expected: "a string holding the catalog document",
                    found: type_name(other),
                },
            )),
        };
        match loaded {
            Ok(snapshot) if errors.is_empty() => Ok(Self {
                snapshot,
                form: FileForm::ConfigMap,
            }),
            Ok(_) => Err(LoadError::Invalid(FieldErrors(errors))),
            Err(LoadError::Invalid(more)) => {
                errors.extend(more.0);
                Err(LoadError::Invalid(FieldErrors(errors)))
            }
            Err(yaml @ LoadError::Yaml(_)) => Err(yaml),
        }
    }
}

/// Renders the ConfigMap manifest that holds `payload` as [`CONFIG_MAP_KEY`] (no namespace: it
/// is applied in the namespace the controllers run in). The value is a literal block scalar
/// when that reproduces `payload` byte for byte, and a double-quoted scalar otherwise.
pub fn render_config_map(payload: &str) -> String {
    let head = format!(
        "# Generated by `cargo xtask gen` from {BUILTIN_CATALOG_PATH}; do not edit by hand (see docs/catalog.md).\n\
         # Apply it in the namespace the warmcache controllers run in.\n\
         apiVersion: v1\n\
         kind: ConfigMap\n\
         metadata:\n  name: {CONFIG_MAP_NAME}\n\
         data:\n  {CONFIG_MAP_KEY}: "
    );
    let block = block_scalar(payload);
    if let Some(block) = block {
        let text = format!("{head}{block}");
        if embedded_payload(&text).as_deref() == Some(payload) {
            return text;
        }
    }
    // JSON string syntax is valid YAML double-quoted syntax once line and paragraph separators
    // (which serde_json leaves raw) are escaped too.
    let quoted = serde_json::Value::String(payload.to_owned())
        .to_string()
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029");
    format!("{head}{quoted}\n")
}

fn block_scalar(payload: &str) -> Option<String> {
    if payload.is_empty() {
        return None;
    }
    let chomp = if !payload.ends_with('\n') {
        "-"
    } else if payload.ends_with("\n\n") {
        "+"
    } else {
        ""
    };
    let mut out = format!("|{chomp}\n");
    for line in payload.strip_suffix('\n').unwrap_or(payload).split('\n') {
        if !line.is_empty() {
            out.push_str("    ");
            out.push_str(line);
        }
        out.push('\n');
    }
    Some(out)
}

fn embedded_payload(manifest: &str) -> Option<String> {
    let value = parse_yaml(manifest).ok()?;
    value
        .get("data")?
        .get(CONFIG_MAP_KEY)?
        .as_str()
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn config_map(data: Option<BTreeMap<String, String>>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(CONFIG_MAP_NAME.into()),
                ..ObjectMeta::default()
            },
            data,
            ..ConfigMap::default()
        }
    }

    #[test]
    fn absent_config_map_selects_the_builtin_copy() {
        let snapshot = CatalogSnapshot::from_config_map(None).expect("builtin");
        assert!(snapshot.is_builtin());
        assert_eq!(snapshot.revision(), catalog_revision(BUILTIN_CATALOG));
    }

    #[test]
    fn present_config_map_is_authoritative_and_identical_but_for_the_flag() {
        let cm = config_map(Some(BTreeMap::from([(
            CONFIG_MAP_KEY.to_owned(),
            BUILTIN_CATALOG.to_owned(),
        )])));
        let from_cm = CatalogSnapshot::from_config_map(Some(&cm)).expect("valid");
        let builtin = CatalogSnapshot::builtin().expect("builtin");
        assert!(!from_cm.is_builtin());
        assert_eq!(from_cm.catalog(), builtin.catalog());
        assert_eq!(from_cm.revision(), builtin.revision());
    }

    #[test]
    fn existing_config_map_without_catalog_is_an_error_not_a_fallback() {
        for data in [
            None,
            Some(BTreeMap::new()),
            Some(BTreeMap::from([("other".to_owned(), "x".to_owned())])),
        ] {
            let err = CatalogSnapshot::from_config_map(Some(&config_map(data))).unwrap_err();
            let errors = err.field_errors().expect("field errors");
            assert!(
                errors.has("data[storage-provider-capabilities.yaml]", |r| *r
                    == Refusal::MissingData)
            );
        }
        let empty = config_map(Some(BTreeMap::from([(
            CONFIG_MAP_KEY.to_owned(),
            String::new(),
        )])));
        let err = CatalogSnapshot::from_config_map(Some(&empty)).unwrap_err();
        assert!(
            err.field_errors()
                .expect("field errors")
                .has("data[storage-provider-capabilities.yaml]", |r| *r
                    == Refusal::EmptyData)
        );
    }

    #[test]
    fn invalid_config_map_paths_start_at_the_data_key() {
        let bad = BUILTIN_CATALOG.replace("provider: weka", "provider: weka\n    transitions: {}");
        let cm = config_map(Some(BTreeMap::from([(CONFIG_MAP_KEY.to_owned(), bad)])));
        let err = CatalogSnapshot::from_config_map(Some(&cm)).unwrap_err();
        let errors = err.field_errors().expect("field errors");
        assert!(
            errors.has(
                "data[storage-provider-capabilities.yaml].drivers[1].transitions",
                |r| matches!(r, Refusal::UnknownField { name, .. } if name == "transitions")
            ),
            "{errors}"
        );

        let cm = config_map(Some(BTreeMap::from([(
            CONFIG_MAP_KEY.to_owned(),
            "drivers: [\n".to_owned(),
        )])));
        let err = CatalogSnapshot::from_config_map(Some(&cm)).unwrap_err();
        assert!(err.field_errors().expect("field errors").has(
            "data[storage-provider-capabilities.yaml]",
            |r| matches!(r, Refusal::NotYaml { .. })
        ));
    }

    #[test]
    fn rendered_config_map_round_trips_any_payload() {
        for payload in [
            BUILTIN_CATALOG,
            "a: 1",
            "a: 1\n\n\n",
            "  leading: space\n",
            "x: \"tab\there\"\r\nend: 1\n",
            "kind: x\n\n# c\n",
            "odd: \"\u{2028}\"\n",
            "",
        ] {
            let manifest = render_config_map(payload);
            assert_eq!(
                embedded_payload(&manifest).as_deref(),
                Some(payload),
                "{manifest}"
            );
        }
    }
}
