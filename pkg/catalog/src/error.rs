//! Errors of the catalog loader: every refusal carries the field path it is about and a typed
//! reason that renders as one line.

use std::fmt;

/// Rendered path of the document root (used when the whole document is wrong).
pub const ROOT_PATH: &str = "(root)";

/// A field path in Kubernetes style: `drivers[2].readerMountOptions[0]`. Map keys that are not
/// plain identifiers render as `["key"]` (JSON-quoted), so a path is always one line.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FieldPath(String);

impl FieldPath {
    /// The document root.
    pub fn root() -> Self {
        Self(String::new())
    }

    /// This path followed by a field of a mapping.
    pub fn field(&self, name: &str) -> Self {
        let simple = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if simple {
            if self.0.is_empty() {
                Self(name.to_owned())
            } else {
                Self(format!("{}.{name}", self.0))
            }
        } else {
            Self(format!("{}[{}]", self.0, quote(name)))
        }
    }

    /// This path followed by a Kubernetes map key, rendered unquoted as Kubernetes does:
    /// `data[storage-provider-capabilities.yaml]`. Only for keys that are valid ConfigMap keys
    /// (no brackets, quotes or whitespace).
    pub fn key(&self, key: &str) -> Self {
        Self(format!("{}[{key}]", self.0))
    }

    /// This path followed by a list index.
    pub fn index(&self, index: usize) -> Self {
        Self(format!("{}[{index}]", self.0))
    }

    /// `prefix` followed by this path (for a catalog embedded in a ConfigMap).
    pub fn under(&self, prefix: &FieldPath) -> Self {
        if self.0.is_empty() {
            prefix.clone()
        } else if prefix.0.is_empty() || self.0.starts_with('[') {
            Self(format!("{}{}", prefix.0, self.0))
        } else {
            Self(format!("{}.{}", prefix.0, self.0))
        }
    }

    /// The path as text; the root renders as [`ROOT_PATH`].
    pub fn as_str(&self) -> &str {
        if self.0.is_empty() {
            ROOT_PATH
        } else {
            &self.0
        }
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Quotes a value for a message: in double quotes, with quotes, backslashes, control
/// characters and every whitespace or invisible character other than a plain space escaped, so
/// a reason is always one line and shows exactly what is in the document; a long value is cut
/// and marked with its length ([`warmcache_cli::text::shown`], the convention of every command).
pub(crate) fn quote(value: &str) -> String {
    warmcache_cli::text::shown(value)
}

/// Why a field was refused. `Display` gives the reason a person can act on, on one line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The field is not part of the format. `transitions` gets a specific hint: the flow is
    /// derived from `accessModes`, never declared.
    UnknownField {
        /// The refused key.
        name: String,
        /// The keys allowed at this place.
        allowed: &'static [&'static str],
    },
    /// A required field is absent.
    Missing {
        /// What the field must hold.
        what: &'static str,
    },
    /// A list every driver must state (possibly empty) is absent or null.
    ListNotStated {
        /// Provisioner of the driver (or `drivers[i]` when it has no usable name).
        driver: String,
        /// `accessModes` or `readerMountOptions`.
        field: &'static str,
    },
    /// The value has the wrong YAML type.
    WrongType {
        /// Expected type, for example "a string".
        expected: &'static str,
        /// Found type, for example "a number".
        found: &'static str,
    },
    /// `apiVersion` or `kind` is not the one this format has.
    WrongConstant {
        /// `apiVersion` or `kind`.
        field: &'static str,
        /// The value found.
        found: String,
        /// The only value accepted.
        expected: &'static str,
    },
    /// `drivers` is an empty list.
    NoDrivers,
    /// A string that must name something is empty or whitespace only.
    Blank {
        /// The field, for example "name".
        field: &'static str,
    },
    /// A string starts or ends with whitespace.
    SurroundingWhitespace {
        /// The value found.
        value: String,
    },
    /// A mount option holds a line break.
    LineBreak {
        /// The value found.
        value: String,
    },
    /// A string is longer than the format allows.
    TooLong {
        /// Maximum length in characters.
        max: usize,
        /// Actual length in characters.
        found: usize,
    },
    /// A list is longer than the format allows.
    TooManyItems {
        /// Maximum number of items.
        max: usize,
        /// Actual number of items.
        found: usize,
    },
    /// Two drivers have the same name.
    DuplicateDriver {
        /// The repeated provisioner.
        name: String,
        /// Index of the first driver with that name.
        first: usize,
    },
    /// An access mode outside ReadWriteOnce, ReadOnlyMany, ReadWriteMany.
    InvalidAccessMode {
        /// The value found.
        value: String,
    },
    /// An access mode listed twice.
    DuplicateAccessMode {
        /// The repeated mode.
        value: String,
        /// Index of its first occurrence.
        first: usize,
    },
    /// A mount option listed twice.
    DuplicateMountOption {
        /// The repeated option.
        value: String,
        /// Index of its first occurrence.
        first: usize,
    },
    /// A mount option holding a comma: the options are joined with commas, so one entry would
    /// smuggle in several (`"norecovery,rw"`).
    MountOptionWithComma {
        /// The value found.
        value: String,
    },
    /// A mount option that makes reader volumes writable (`rw`, `noro`, `ro=...`).
    WritableMountOption {
        /// The value found.
        value: String,
    },
    /// Two mount options negate each other (recovery/norecovery, uuid/nouuid).
    ConflictingMountOptions {
        /// The option listed first.
        earlier: String,
        /// The option listed later (the one this error is reported on).
        later: String,
    },
    /// The ReadWriteOnce+ReadOnlyMany shape without a `ro` reader mount option.
    RoxShapeWithoutRo {
        /// Provisioner of the driver.
        driver: String,
    },
    /// ReadOnlyMany without ReadWriteOnce or ReadWriteMany.
    RoxWithoutWriter {
        /// Provisioner of the driver.
        driver: String,
    },
    /// `writerIdentity` outside fsGroup, root.
    InvalidWriterIdentity {
        /// The value found (JSON text).
        value: String,
    },
    /// A ConfigMap manifest with another name than the one the controllers read.
    WrongConfigMapName {
        /// The name found (empty when absent).
        found: String,
    },
    /// The ConfigMap has no catalog under its data key.
    MissingData,
    /// The ConfigMap's data key holds an empty string.
    EmptyData,
    /// The catalog text inside a ConfigMap is not YAML.
    NotYaml {
        /// What the YAML parser reported (one line).
        message: String,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownField { name, allowed } => {
                if name == "transitions" {
                    write!(
                        f,
                        "unknown field \"transitions\": the flow is derived from accessModes and never declared; remove it"
                    )
                } else {
                    write!(
                        f,
                        "unknown field {}: allowed fields here are {}",
                        quote(name),
                        allowed.join(", ")
                    )
                }
            }
            Self::Missing { what } => write!(f, "required field is missing: {what}"),
            Self::ListNotStated { driver, field } => write!(
                f,
                "driver {} has no {field}: state it as a list, [] when nothing applies",
                quote(driver)
            ),
            Self::WrongType { expected, found } => {
                write!(f, "must be {expected}, found {found}")
            }
            Self::WrongConstant {
                field,
                found,
                expected,
            } => write!(
                f,
                "unsupported {field} {}: must be {expected}",
                quote(found)
            ),
            Self::NoDrivers => write!(
                f,
                "storage capability catalog has no drivers: list at least one driver"
            ),
            Self::Blank { field } if field.starts_with("readerMountOption") => write!(
                f,
                "blank {field}: a mount option must have a value; remove the empty entry"
            ),
            Self::Blank { field } => write!(
                f,
                "blank {field}: an empty provisioner or provider cannot name a driver"
            ),
            Self::SurroundingWhitespace { value } => write!(
                f,
                "value {} has surrounding whitespace: remove it",
                quote(value)
            ),
            Self::LineBreak { value } => write!(
                f,
                "value {} holds a line break: a mount option is one line",
                quote(value)
            ),
            Self::TooLong { max, found } => {
                write!(f, "too long: {found} characters, at most {max} allowed")
            }
            Self::TooManyItems { max, found } => {
                write!(f, "too many items: {found}, at most {max} allowed")
            }
            Self::DuplicateDriver { name, first } => write!(
                f,
                "catalog lists driver {} twice (first at drivers[{first}]): keep one entry per provisioner",
                quote(name)
            ),
            Self::InvalidAccessMode { value } => write!(
                f,
                "invalid accessMode {}: must be ReadWriteOnce, ReadOnlyMany or ReadWriteMany",
                quote(value)
            ),
            Self::DuplicateAccessMode { value, first } => write!(
                f,
                "duplicate accessMode {} (first at index {first})",
                quote(value)
            ),
            Self::DuplicateMountOption { value, first } => write!(
                f,
                "duplicate readerMountOption {} (first at index {first})",
                quote(value)
            ),
            Self::MountOptionWithComma { value } => write!(
                f,
                "readerMountOption {} holds a comma: each entry is one mount option (entries are joined with commas); list each option separately",
                quote(value)
            ),
            Self::WritableMountOption { value } => write!(
                f,
                "readerMountOption {} would make reader volumes writable: readers of a shared cache are read-only; remove it",
                quote(value)
            ),
            Self::ConflictingMountOptions { earlier, later } => write!(
                f,
                "readerMountOptions {} and {} conflict: keep the one the qualification run used",
                quote(earlier),
                quote(later)
            ),
            Self::RoxShapeWithoutRo { driver } => write!(
                f,
                "driver {} qualifies ReadWriteOnce with ReadOnlyMany, so its readers get derived read-only volumes: it must list readerMountOption \"ro\"",
                quote(driver)
            ),
            Self::RoxWithoutWriter { driver } => write!(
                f,
                "driver {} lists ReadOnlyMany with no writer mode: nothing could populate the cache; add the qualified writer mode (ReadWriteOnce or ReadWriteMany) or remove ReadOnlyMany",
                quote(driver)
            ),
            Self::InvalidWriterIdentity { value } => {
                write!(f, "invalid writerIdentity {value}: must be fsGroup or root")
            }
            Self::WrongConfigMapName { found } => write!(
                f,
                "the catalog ConfigMap must be named {}, found {}: the controllers read only that name",
                quote(crate::CONFIG_MAP_NAME),
                quote(found)
            ),
            Self::MissingData => write!(
                f,
                "the ConfigMap has no {} data: put the catalog document there",
                quote(crate::CONFIG_MAP_KEY)
            ),
            Self::EmptyData => write!(
                f,
                "the ConfigMap's {} data is empty: put the catalog document there",
                quote(crate::CONFIG_MAP_KEY)
            ),
            Self::NotYaml { message } => {
                write!(f, "parse storage capability catalog: not YAML: {message}")
            }
        }
    }
}

/// One refused field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Where in the document.
    pub path: FieldPath,
    /// Why.
    pub refusal: Refusal,
}

impl fmt::Display for FieldError {
    /// `<field path>: <reason>`, one line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.refusal)
    }
}

/// Every refusal of one document, in document order. Never empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldErrors(pub Vec<FieldError>);

impl FieldErrors {
    /// The refusals.
    pub fn iter(&self) -> std::slice::Iter<'_, FieldError> {
        self.0.iter()
    }

    /// Whether any refusal is at `path` and satisfies `matches`.
    pub fn has(&self, path: &str, matches: impl Fn(&Refusal) -> bool) -> bool {
        self.0
            .iter()
            .any(|e| e.path.as_str() == path && matches(&e.refusal))
    }
}

impl fmt::Display for FieldErrors {
    /// One `<field path>: <reason>` line per refusal.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl<'a> IntoIterator for &'a FieldErrors {
    type Item = &'a FieldError;
    type IntoIter = std::slice::Iter<'a, FieldError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// A text that is not YAML at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("parse storage capability catalog: not YAML: {message}")]
pub struct YamlError {
    /// What the YAML parser reported, on one line (with its line and column when known).
    pub message: String,
}

/// Why a catalog could not be loaded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// The text is not YAML.
    #[error(transparent)]
    Yaml(#[from] YamlError),
    /// The text is YAML but not a valid catalog (or catalog ConfigMap).
    #[error("invalid storage capability catalog:\n{0}")]
    Invalid(FieldErrors),
}

impl LoadError {
    /// The field errors, when the document was read.
    pub fn field_errors(&self) -> Option<&FieldErrors> {
        match self {
            Self::Invalid(errors) => Some(errors),
            Self::Yaml(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_render_kubernetes_style() {
        let root = FieldPath::root();
        assert_eq!(root.as_str(), ROOT_PATH);
        let p = root
            .field("drivers")
            .index(2)
            .field("readerMountOptions")
            .index(0);
        assert_eq!(p.as_str(), "drivers[2].readerMountOptions[0]");
        assert_eq!(
            root.field("drivers").index(0).field("odd key\n").as_str(),
            "drivers[0][\"odd key\\n\"]"
        );
        let data = root.field("data").key(crate::CONFIG_MAP_KEY);
        assert_eq!(data.as_str(), "data[storage-provider-capabilities.yaml]");
        assert_eq!(
            p.under(&data).as_str(),
            "data[storage-provider-capabilities.yaml].drivers[2].readerMountOptions[0]"
        );
        assert_eq!(root.under(&data), data);
        assert_eq!(
            root.field("a b").under(&data).as_str(),
            "data[storage-provider-capabilities.yaml][\"a b\"]"
        );
    }

    #[test]
    fn reasons_are_single_lines() {
        let refusals = [
            Refusal::SurroundingWhitespace {
                value: " ro\n".into(),
            },
            Refusal::LineBreak {
                value: "a\u{2028}b".into(),
            },
            Refusal::UnknownField {
                name: "x\ny".into(),
                allowed: &["a"],
            },
            Refusal::NotYaml {
                message: "bad".into(),
            },
        ];
        assert_eq!(
            Refusal::Blank {
                field: "readerMountOption"
            }
            .to_string(),
            "blank readerMountOption: a mount option must have a value; remove the empty entry"
        );
        assert!(
            Refusal::Blank { field: "provider" }
                .to_string()
                .starts_with("blank provider: an empty provisioner or provider")
        );
        for refusal in refusals {
            let text = refusal.to_string();
            assert!(!text.contains('\n') && !text.contains('\u{2028}'), "{text}");
        }
    }
}
