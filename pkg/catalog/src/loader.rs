//! The catalog document and its strict loader.
//!
//! The text is decoded to a generic YAML value first, then checked field by field, so every
//! refusal names its path and all refusals of a document are reported together. The rules are
//! the ones of the packaged JSON Schema ([`crate::SCHEMA`]), plus one the schema cannot express:
//! driver names are unique. Strings are checked with the schema's ECMA-262 notion of whitespace
//! and line breaks, so the loader and the schema agree on every document.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Map, Value};
use warmcache_api_modelcache::v2beta1::AccessMode;

use crate::error::{FieldError, FieldErrors, FieldPath, LoadError, Refusal, YamlError};

/// `apiVersion` of the catalog document.
pub const API_VERSION: &str = "storage.nvcf.nvidia.com/v1alpha1";
/// `kind` of the catalog document.
pub const KIND: &str = "StorageCapabilityCatalog";

/// Longest provisioner or provider accepted (the limit `spec.decision` of a ModelCacheBinding
/// has for both).
pub const MAX_NAME_LENGTH: usize = 253;
/// Longest reader mount option accepted (the limit of `spec.decision.requiredMountOptions`).
pub const MAX_MOUNT_OPTION_LENGTH: usize = 256;
/// Most reader mount options one driver may list (the limit of
/// `spec.decision.requiredMountOptions`).
pub const MAX_MOUNT_OPTIONS: usize = 32;

/// Reader mount options that negate each other. A driver may list at most one of each pair.
/// (`rw`, the negation of `ro`, is refused on its own: see [`makes_writable`].)
pub const NEGATING_MOUNT_OPTIONS: [(&str, &str); 2] =
    [("recovery", "norecovery"), ("uuid", "nouuid")];

/// Option names that would make a reader volume writable: `rw` (mount(8)'s negation of `ro`)
/// and `noro`, its `no`-form; with or without a value (`rw=1`).
pub const WRITABLE_MOUNT_OPTIONS: [&str; 2] = ["rw", "noro"];

const ROOT_FIELDS: &[&str] = &["apiVersion", "kind", "drivers"];
const DRIVER_FIELDS: &[&str] = &[
    "name",
    "provider",
    "accessModes",
    "readerMountOptions",
    "encryptionSupported",
    "writerIdentity",
];

/// Who owns the files the writer Job creates on a ReadWriteMany volume: the same type the
/// ModelCacheBinding records in `spec.decision.writerIdentity`.
pub use warmcache_api_modelcache::v2beta1::WriterIdentity;

/// One validated driver entry: what a qualification run proved for one CSI provisioner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverProfile {
    /// The exact `StorageClass.provisioner` this entry describes; the lookup key.
    pub name: String,
    /// Diagnostic label (`nvmesh`, `weka`, ...). `nvmesh` additionally marks volume handles
    /// that encode the namespace (see [`crate::volume_handle_encodes_namespace`]).
    pub provider: String,
    /// Modes qualified end to end in a cache workflow, in catalog order; empty = not enabled.
    pub access_modes: Vec<AccessMode>,
    /// Options put on reader volumes the controllers create, in catalog order.
    pub reader_mount_options: Vec<String>,
    /// Whether an encrypted cache was qualified on this driver (absent = false).
    pub encryption_supported: bool,
    /// Writer identity forced for ReadWriteMany; `None` = decided from the live CSIDriver.
    pub writer_identity: Option<WriterIdentity>,
}

impl DriverProfile {
    /// Whether the entry lists `mode`.
    pub fn qualifies(&self, mode: AccessMode) -> bool {
        self.access_modes.contains(&mode)
    }
}

/// A validated catalog: drivers in document order, names unique.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Catalog {
    drivers: Vec<DriverProfile>,
}

impl Catalog {
    /// Decodes and validates a catalog document. YAML that does not parse is
    /// [`LoadError::Yaml`]; anything else wrong is [`LoadError::Invalid`] with every refusal.
    pub fn from_yaml(text: &str) -> Result<Self, LoadError> {
        let value = parse_yaml(text)?;
        Self::from_value(&value).map_err(LoadError::Invalid)
    }

    /// Validates an already decoded document.
    pub fn from_value(value: &Value) -> Result<Self, FieldErrors> {
        let mut errors = Vec::new();
        let catalog = check_root(value, &mut errors);
        match catalog {
            Some(catalog) if errors.is_empty() => Ok(catalog),
            _ => Err(FieldErrors(errors)),
        }
    }

    /// The driver entry for an exact provisioner.
    pub fn driver(&self, provisioner: &str) -> Option<&DriverProfile> {
        self.drivers.iter().find(|d| d.name == provisioner)
    }

    /// Every driver entry in document order.
    pub fn drivers(&self) -> &[DriverProfile] {
        &self.drivers
    }
}

/// Decodes YAML text into a generic value (one document; duplicate mapping keys refused).
pub fn parse_yaml(text: &str) -> Result<Value, YamlError> {
    serde_saphyr::from_str::<Value>(text).map_err(|e| YamlError {
        // The parser's advice about its own options means nothing to someone editing a catalog.
        message: one_line(&e.without_snippet().to_string())
            .replace(", set DuplicateKeyPolicy in Options if acceptable", "")
            .replace(
                "; use from_str_multiple or from_str_multiple_with_options",
                " (a catalog file holds exactly one)",
            ),
    })
}

/// Joins a multi-line parser message into one line.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// ECMA-262 `\s` (what the schema's `pattern`s mean by whitespace): TAB, LF, VT, FF, CR,
/// space, NBSP, every `Zs` character, LS, PS and the byte order mark. U+0085 is not included.
pub fn is_ecma_whitespace(c: char) -> bool {
    matches!(
        c,
        '\t'..='\r'
            | ' '
            | '\u{a0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200a}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202f}'
            | '\u{205f}'
            | '\u{3000}'
            | '\u{feff}'
    )
}

/// ECMA-262 line terminators (what the schema's `.` does not match): LF, CR, LS, PS.
pub fn is_line_terminator(c: char) -> bool {
    matches!(c, '\n' | '\r' | '\u{2028}' | '\u{2029}')
}

/// How a refusal names the YAML type of a value.
pub(crate) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

struct Checker<'e> {
    errors: &'e mut Vec<FieldError>,
}

impl Checker<'_> {
    fn push(&mut self, path: FieldPath, refusal: Refusal) {
        self.errors.push(FieldError { path, refusal });
    }

    fn wrong_type(&mut self, path: FieldPath, expected: &'static str, found: &Value) {
        self.push(
            path,
            Refusal::WrongType {
                expected,
                found: type_name(found),
            },
        );
    }

    /// Refuses keys outside `allowed`, in sorted order (independent of map ordering).
    fn unknown_fields(
        &mut self,
        path: &FieldPath,
        map: &Map<String, Value>,
        allowed: &'static [&'static str],
    ) {
        let mut unknown: Vec<&String> = map
            .keys()
            .filter(|k| !allowed.contains(&k.as_str()))
            .collect();
        unknown.sort();
        for name in unknown {
            self.push(
                path.field(name),
                Refusal::UnknownField {
                    name: name.clone(),
                    allowed,
                },
            );
        }
    }

    /// A required name-like string: present, a string, non-blank, no surrounding whitespace,
    /// at most [`MAX_NAME_LENGTH`] characters.
    fn name_field(
        &mut self,
        map: &Map<String, Value>,
        path: &FieldPath,
        field: &'static str,
        what: &'static str,
    ) -> Option<String> {
        let path = path.field(field);
        let Some(value) = map.get(field) else {
            self.push(path, Refusal::Missing { what });
            return None;
        };
        let Value::String(text) = value else {
            self.wrong_type(path, "a string", value);
            return None;
        };
        if text.chars().all(is_ecma_whitespace) {
            self.push(path, Refusal::Blank { field });
            return None;
        }
        let mut ok = true;
        if has_surrounding_whitespace(text) {
            self.push(
                path.clone(),
                Refusal::SurroundingWhitespace {
                    value: text.clone(),
                },
            );
            ok = false;
        } else if text.chars().any(is_line_terminator) {
            self.push(
                path.clone(),
                Refusal::LineBreak {
                    value: text.clone(),
                },
            );
            ok = false;
        }
        let length = text.chars().count();
        if length > MAX_NAME_LENGTH {
            self.push(
                path,
                Refusal::TooLong {
                    max: MAX_NAME_LENGTH,
                    found: length,
                },
            );
            ok = false;
        }
        ok.then(|| text.clone())
    }
}

fn has_surrounding_whitespace(text: &str) -> bool {
    text.starts_with(is_ecma_whitespace) || text.ends_with(is_ecma_whitespace)
}

fn check_root(value: &Value, errors: &mut Vec<FieldError>) -> Option<Catalog> {
    let mut c = Checker { errors };
    let root = FieldPath::root();
    let Value::Object(map) = value else {
        c.wrong_type(root, "a mapping with apiVersion, kind and drivers", value);
        return None;
    };
    c.unknown_fields(&root, map, ROOT_FIELDS);
    for (field, expected) in [("apiVersion", API_VERSION), ("kind", KIND)] {
        let path = root.field(field);
        match map.get(field) {
            None => c.push(
                path,
                Refusal::Missing {
                    what: if field == "kind" {
                        "kind: StorageCapabilityCatalog"
                    } else {
                        "apiVersion: storage.nvcf.nvidia.com/v1alpha1"
                    },
                },
            ),
            Some(Value::String(found)) if found == expected => {}
            Some(found) => c.push(
                path,
                Refusal::WrongConstant {
                    field: if field == "kind" {
                        "kind"
                    } else {
                        "apiVersion"
                    },
                    found: match found {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    },
                    expected,
                },
            ),
        }
    }
    let drivers_path = root.field("drivers");
    let drivers = match map.get("drivers") {
        None => {
            c.push(
                drivers_path,
                Refusal::Missing {
                    what: "the list of drivers, one per CSI provisioner",
                },
            );
            return None;
        }
        Some(Value::Array(items)) => items,
        Some(other) => {
            c.wrong_type(drivers_path, "a list of drivers", other);
            return None;
        }
    };
    if drivers.is_empty() {
        c.push(drivers_path, Refusal::NoDrivers);
        return None;
    }
    let mut profiles = Vec::with_capacity(drivers.len());
    let mut first_index: BTreeMap<&str, usize> = BTreeMap::new();
    let mut complete = true;
    for (index, item) in drivers.iter().enumerate() {
        let path = drivers_path.index(index);
        let profile = check_driver(&mut c, item, &path);
        // Duplicates are judged on the raw name, whether or not the rest of the entry is valid.
        if let Some(Value::String(name)) = item.as_object().and_then(|m| m.get("name")) {
            if let Some(&first) = first_index.get(name.as_str()) {
                c.push(
                    path.field("name"),
                    Refusal::DuplicateDriver {
                        name: name.clone(),
                        first,
                    },
                );
            } else {
                first_index.insert(name.as_str(), index);
            }
        }
        match profile {
            Some(profile) => profiles.push(profile),
            None => complete = false,
        }
    }
    complete.then_some(Catalog { drivers: profiles })
}

/// A display name of a driver for messages: its name when it is a usable string, else its path.
fn driver_label(map: &Map<String, Value>, path: &FieldPath) -> String {
    match map.get("name") {
        Some(Value::String(name)) if !name.chars().all(is_ecma_whitespace) => name.clone(),
        _ => path.to_string(),
    }
}

fn check_driver(c: &mut Checker<'_>, item: &Value, path: &FieldPath) -> Option<DriverProfile> {
    let Value::Object(map) = item else {
        c.wrong_type(path.clone(), "a mapping", item);
        return None;
    };
    let before = c.errors.len();
    c.unknown_fields(path, map, DRIVER_FIELDS);
    let label = driver_label(map, path);
    let name = c.name_field(
        map,
        path,
        "name",
        "the exact StorageClass provisioner this entry describes",
    );
    let provider = c.name_field(
        map,
        path,
        "provider",
        "a provider label such as nvmesh, weka, ociFss",
    );
    let access_modes = check_access_modes(c, map, path, &label);
    let reader_mount_options = check_mount_options(c, map, path, &label);
    let encryption_supported = match map.get("encryptionSupported") {
        None => Some(false),
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => {
            c.wrong_type(path.field("encryptionSupported"), "a boolean", other);
            None
        }
    };
    let writer_identity = match map.get("writerIdentity") {
        None => Some(None),
        Some(Value::String(s)) if s == "fsGroup" => Some(Some(WriterIdentity::FsGroup)),
        Some(Value::String(s)) if s == "root" => Some(Some(WriterIdentity::Root)),
        Some(other) => {
            c.push(
                path.field("writerIdentity"),
                Refusal::InvalidWriterIdentity {
                    value: match other {
                        Value::String(s) => crate::error::quote(s),
                        other => other.to_string(),
                    },
                },
            );
            None
        }
    };

    // Shape rules, on the raw lists (as the schema's `contains` sees them).
    let raw_modes: Vec<&str> = raw_strings(map.get("accessModes"));
    let has = |mode: &str| raw_modes.contains(&mode);
    if has("ReadWriteOnce") && has("ReadOnlyMany") {
        let options = raw_strings(map.get("readerMountOptions"));
        if map.get("readerMountOptions").is_some_and(Value::is_array) && !options.contains(&"ro") {
            c.push(
                path.field("readerMountOptions"),
                Refusal::RoxShapeWithoutRo {
                    driver: label.clone(),
                },
            );
        }
    }
    if has("ReadOnlyMany") && !has("ReadWriteOnce") && !has("ReadWriteMany") {
        c.push(
            path.field("accessModes"),
            Refusal::RoxWithoutWriter { driver: label },
        );
    }

    if c.errors.len() != before {
        return None;
    }
    Some(DriverProfile {
        name: name?,
        provider: provider?,
        access_modes: access_modes?,
        reader_mount_options: reader_mount_options?,
        encryption_supported: encryption_supported?,
        writer_identity: writer_identity?,
    })
}

fn raw_strings(value: Option<&Value>) -> Vec<&str> {
    match value {
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// The list a driver must state, possibly empty. `None` after reporting when it is absent,
/// null or not a list.
fn stated_list<'v>(
    c: &mut Checker<'_>,
    map: &'v Map<String, Value>,
    path: &FieldPath,
    field: &'static str,
    label: &str,
) -> Option<&'v Vec<Value>> {
    match map.get(field) {
        None | Some(Value::Null) => {
            c.push(
                path.field(field),
                Refusal::ListNotStated {
                    driver: label.to_owned(),
                    field,
                },
            );
            None
        }
        Some(Value::Array(items)) => Some(items),
        Some(other) => {
            c.wrong_type(path.field(field), "a list", other);
            None
        }
    }
}

fn check_access_modes(
    c: &mut Checker<'_>,
    map: &Map<String, Value>,
    path: &FieldPath,
    label: &str,
) -> Option<Vec<AccessMode>> {
    let items = stated_list(c, map, path, "accessModes", label)?;
    let list_path = path.field("accessModes");
    let mut modes = Vec::with_capacity(items.len());
    let mut ok = true;
    let mut seen: Vec<&Value> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let item_path = list_path.index(index);
        if let Some(first) = seen.iter().position(|v| *v == item) {
            // Reported once per repeat, whatever the value (the schema's uniqueItems).
            c.push(
                item_path,
                Refusal::DuplicateAccessMode {
                    value: item
                        .as_str()
                        .map_or_else(|| item.to_string(), str::to_owned),
                    first,
                },
            );
            ok = false;
            continue;
        }
        seen.push(item);
        let mode = match item.as_str() {
            Some("ReadWriteOnce") => AccessMode::ReadWriteOnce,
            Some("ReadOnlyMany") => AccessMode::ReadOnlyMany,
            Some("ReadWriteMany") => AccessMode::ReadWriteMany,
            other => {
                c.push(
                    item_path,
                    Refusal::InvalidAccessMode {
                        value: other.map_or_else(|| item.to_string(), str::to_owned),
                    },
                );
                ok = false;
                continue;
            }
        };
        modes.push(mode);
    }
    ok.then_some(modes)
}

fn check_mount_options(
    c: &mut Checker<'_>,
    map: &Map<String, Value>,
    path: &FieldPath,
    label: &str,
) -> Option<Vec<String>> {
    let items = stated_list(c, map, path, "readerMountOptions", label)?;
    let list_path = path.field("readerMountOptions");
    let mut ok = true;
    if items.len() > MAX_MOUNT_OPTIONS {
        c.push(
            list_path.clone(),
            Refusal::TooManyItems {
                max: MAX_MOUNT_OPTIONS,
                found: items.len(),
            },
        );
        ok = false;
    }
    let mut options: Vec<String> = Vec::with_capacity(items.len().min(MAX_MOUNT_OPTIONS));
    // Index of the first occurrence of each item, so a long list is checked in linear time.
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (index, item) in items.iter().enumerate() {
        let item_path = list_path.index(index);
        let key = item.to_string();
        if let Some(&first) = seen.get(&key) {
            c.push(
                item_path,
                Refusal::DuplicateMountOption {
                    value: item
                        .as_str()
                        .map_or_else(|| item.to_string(), str::to_owned),
                    first,
                },
            );
            ok = false;
            continue;
        }
        seen.insert(key, index);
        let Value::String(option) = item else {
            c.wrong_type(item_path, "a string", item);
            ok = false;
            continue;
        };
        if option.chars().all(is_ecma_whitespace) {
            c.push(
                item_path,
                Refusal::Blank {
                    field: "readerMountOption",
                },
            );
            ok = false;
            continue;
        }
        if has_surrounding_whitespace(option) {
            c.push(
                item_path.clone(),
                Refusal::SurroundingWhitespace {
                    value: option.clone(),
                },
            );
            ok = false;
        } else if option.chars().any(is_line_terminator) {
            c.push(
                item_path.clone(),
                Refusal::LineBreak {
                    value: option.clone(),
                },
            );
            ok = false;
        }
        let length = option.chars().count();
        if length > MAX_MOUNT_OPTION_LENGTH {
            c.push(
                item_path.clone(),
                Refusal::TooLong {
                    max: MAX_MOUNT_OPTION_LENGTH,
                    found: length,
                },
            );
            ok = false;
        }
        if option.contains(',') {
            c.push(
                item_path.clone(),
                Refusal::MountOptionWithComma {
                    value: option.clone(),
                },
            );
            ok = false;
        }
        if makes_writable(option) {
            c.push(
                item_path.clone(),
                Refusal::WritableMountOption {
                    value: option.clone(),
                },
            );
            ok = false;
        }
        if let Some(earlier) = negated(option).and_then(|n| options.iter().find(|o| *o == n)) {
            c.push(
                item_path.clone(),
                Refusal::ConflictingMountOptions {
                    earlier: earlier.clone(),
                    later: option.clone(),
                },
            );
            ok = false;
        }
        options.push(option.clone());
    }
    ok.then_some(options)
}

/// Whether two reader mount options negate each other ([`NEGATING_MOUNT_OPTIONS`]).
pub fn negate_each_other(a: &str, b: &str) -> bool {
    negated(a) == Some(b)
}

/// The option that negates `option`, if it is one of a [`NEGATING_MOUNT_OPTIONS`] pair.
fn negated(option: &str) -> Option<&'static str> {
    NEGATING_MOUNT_OPTIONS.iter().find_map(|&(x, y)| {
        if option == x {
            Some(y)
        } else if option == y {
            Some(x)
        } else {
            None
        }
    })
}

/// Whether a reader mount option would make the reader's volume writable: its name (before any
/// `=`) is one of [`WRITABLE_MOUNT_OPTIONS`], or it gives `ro` a value (`ro=0`), which no mount
/// helper needs and some option parsers read as false.
pub fn makes_writable(option: &str) -> bool {
    let (name, value) = match option.split_once('=') {
        Some((name, value)) => (name, Some(value)),
        None => (option, None),
    };
    WRITABLE_MOUNT_OPTIONS.contains(&name) || (name == "ro" && value.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whitespace_matches_ecma() {
        for c in [
            '\t', '\n', '\u{b}', '\u{c}', '\r', ' ', '\u{a0}', '\u{2000}', '\u{feff}',
        ] {
            assert!(is_ecma_whitespace(c), "{c:?}");
        }
        for c in ['\u{85}', '\u{180e}', '\u{200b}', 'a'] {
            assert!(!is_ecma_whitespace(c), "{c:?}");
        }
    }

    #[test]
    fn negating_pairs_in_both_orders() {
        assert!(!negate_each_other("ro", "rw"), "rw is refused on its own");
        assert!(negate_each_other("nouuid", "uuid"));
        assert!(negate_each_other("recovery", "norecovery"));
        assert!(!negate_each_other("ro", "norecovery"));
        assert!(!negate_each_other("ro", "ro"));
    }
}
