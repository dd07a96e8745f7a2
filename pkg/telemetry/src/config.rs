//! Telemetry configuration: log format, log filter and the `OTEL_*` environment.
//!
//! Everything here is a pure function over a lookup closure (`Fn(&str) -> Option<String>`) so it
//! can be tested without touching the process environment; [`TelemetryConfig::from_env`] is the
//! thin wrapper that reads the real environment.

use std::fmt;
use std::str::FromStr;

/// Log filter used when neither the flag nor `RUST_LOG` gives one.
pub const DEFAULT_LOG_FILTER: &str = "info";

/// Environment variable read for the log filter when no flag value is given.
pub const RUST_LOG_ENV: &str = "RUST_LOG";

/// `OTEL_SDK_DISABLED`: `true` (any case) turns span export off.
pub const OTEL_SDK_DISABLED: &str = "OTEL_SDK_DISABLED";
/// `OTEL_SERVICE_NAME`: the `service.name` resource attribute; wins over everything else.
pub const OTEL_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
/// `OTEL_RESOURCE_ATTRIBUTES`: `key=value,key=value` (values percent-encoded) added to the resource.
pub const OTEL_RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";
/// `OTEL_EXPORTER_OTLP_ENDPOINT`: collector endpoint for all signals; setting it turns export on.
pub const OTEL_EXPORTER_OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`: collector endpoint for traces; wins over the generic one.
pub const OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
/// `OTEL_EXPORTER_OTLP_PROTOCOL`: only `grpc` is supported; other values produce a warning.
pub const OTEL_EXPORTER_OTLP_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
/// `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`: as [`OTEL_EXPORTER_OTLP_PROTOCOL`], for traces only.
pub const OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";

/// The `service.name` resource attribute key.
const SERVICE_NAME_KEY: &str = "service.name";

/// How log lines are written to standard error.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum LogFormat {
    /// Human-readable single lines (`timestamp LEVEL span: target: message fields`), no colours.
    #[default]
    Plain,
    /// One JSON object per line, for log collectors.
    Json,
}

impl LogFormat {
    /// Every accepted value, in the spelling [`FromStr`] accepts and [`fmt::Display`] prints.
    pub const VARIANTS: [&'static str; 2] = ["plain", "json"];

    /// The canonical lower-case name (`plain` or `json`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Plain => "plain",
            LogFormat::Json => "json",
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The value given for a [`LogFormat`] is neither `plain` nor `json`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown log format {0:?}: expected one of plain, json")]
pub struct ParseLogFormatError(pub String);

impl FromStr for LogFormat {
    type Err = ParseLogFormatError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "plain" | "text" => Ok(LogFormat::Plain),
            "json" => Ok(LogFormat::Json),
            _ => Err(ParseLogFormatError(s.to_owned())),
        }
    }
}

/// Picks the log filter: an explicit, non-blank flag value wins, then a non-blank `RUST_LOG`,
/// then [`DEFAULT_LOG_FILTER`].
///
/// The result is not validated here; [`crate::init`] rejects an invalid filter with
/// [`crate::TelemetryError::InvalidLogFilter`].
#[must_use]
pub fn resolve_log_filter(flag: Option<&str>, rust_log: Option<&str>) -> String {
    [flag, rust_log]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|s| !s.is_empty())
        .unwrap_or(DEFAULT_LOG_FILTER)
        .to_owned()
}

/// OpenTelemetry settings read from the standard `OTEL_*` environment variables.
///
/// Only what this crate decides itself is read here. The OTLP exporter still reads its own
/// transport variables (`OTEL_EXPORTER_OTLP_{,TRACES_}HEADERS`, `_TIMEOUT`, `_COMPRESSION`,
/// `_INSECURE`) and the SDK reads `OTEL_TRACES_SAMPLER`/`_ARG` and `OTEL_BSP_*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtelSettings {
    /// The gRPC collector endpoint spans are exported to, or `None` when export is off.
    ///
    /// It is `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT` (used as
    /// is: gRPC has no per-signal path), unless `OTEL_SDK_DISABLED=true`.
    pub endpoint: Option<String>,
    /// The `service.name` resource attribute: `OTEL_SERVICE_NAME`, else `service.name` from
    /// `OTEL_RESOURCE_ATTRIBUTES`, else the component name the binary passed.
    pub service_name: String,
    /// Attributes from `OTEL_RESOURCE_ATTRIBUTES`, percent-decoded, in the given order,
    /// `service.name` excluded (it is in [`Self::service_name`]).
    pub resource_attributes: Vec<(String, String)>,
    /// Problems found while reading the variables (ignored entries, unsupported protocol).
    /// [`crate::init`] logs them as warnings once logging works.
    pub warnings: Vec<String>,
}

impl OtelSettings {
    /// Reads the settings through `lookup` (a variable name to its value).
    ///
    /// `component` is the default service name. Empty values count as unset.
    pub fn from_lookup<F>(component: &str, lookup: F) -> Self
    where
        F: Fn(&str) -> Option<String>,
    {
        let get = |key: &str| lookup(key).filter(|v| !v.trim().is_empty());
        let mut warnings = Vec::new();

        let sdk_disabled = match get(OTEL_SDK_DISABLED) {
            None => false,
            Some(v) if v.trim().eq_ignore_ascii_case("true") => true,
            Some(v) if v.trim().eq_ignore_ascii_case("false") => false,
            Some(v) => {
                warnings.push(format!(
                    "{OTEL_SDK_DISABLED}={v:?} is neither true nor false; treating it as false"
                ));
                false
            }
        };

        let configured_endpoint = get(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
            .or_else(|| get(OTEL_EXPORTER_OTLP_ENDPOINT))
            .map(|v| v.trim().to_owned());
        let endpoint = if sdk_disabled {
            None
        } else {
            configured_endpoint
        };

        if let Some(ep) = &endpoint {
            let protocol = get(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL)
                .or_else(|| get(OTEL_EXPORTER_OTLP_PROTOCOL));
            if let Some(p) = protocol
                && !p.trim().eq_ignore_ascii_case("grpc")
            {
                warnings.push(format!(
                    "OTLP protocol {p:?} is not supported by this build; exporting over gRPC to {ep}"
                ));
            }
        }

        let mut resource_attributes = Vec::new();
        let mut service_name_attribute = None;
        if let Some(raw) = get(OTEL_RESOURCE_ATTRIBUTES) {
            for (key, value) in parse_resource_attributes(&raw, &mut warnings) {
                if key == SERVICE_NAME_KEY {
                    service_name_attribute = Some(value);
                } else {
                    resource_attributes.push((key, value));
                }
            }
        }

        let service_name = get(OTEL_SERVICE_NAME)
            .map(|v| v.trim().to_owned())
            .or(service_name_attribute.filter(|v| !v.is_empty()))
            .unwrap_or_else(|| component.to_owned());

        OtelSettings {
            endpoint,
            service_name,
            resource_attributes,
            warnings,
        }
    }

    /// Whether spans are exported over OTLP.
    #[must_use]
    pub fn export_enabled(&self) -> bool {
        self.endpoint.is_some()
    }
}

/// Parses `key1=value1,key2=value2`; values are percent-decoded (W3C baggage encoding).
/// Entries without `=`, with an empty key or with a bad escape are skipped with a warning.
fn parse_resource_attributes(raw: &str, warnings: &mut Vec<String>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((key, value)) = entry.split_once('=') else {
            warnings.push(format!(
                "{OTEL_RESOURCE_ATTRIBUTES}: ignoring {entry:?} (expected key=value)"
            ));
            continue;
        };
        let key = key.trim();
        if key.is_empty() {
            warnings.push(format!(
                "{OTEL_RESOURCE_ATTRIBUTES}: ignoring {entry:?} (empty key)"
            ));
            continue;
        }
        let Some(value) = percent_decode(value.trim()) else {
            warnings.push(format!(
                "{OTEL_RESOURCE_ATTRIBUTES}: ignoring {entry:?} (invalid percent-encoding)"
            ));
            continue;
        };
        // A later duplicate replaces an earlier one, keeping the first position.
        if let Some(slot) = out.iter_mut().find(|(k, _)| k == key) {
            slot.1 = value;
        } else {
            out.push((key.to_owned(), value));
        }
    }
    out
}

/// Decodes `%XX` escapes; `None` if an escape is malformed or the result is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hi = bytes.get(i + 1).and_then(|c| (*c as char).to_digit(16))?;
            let lo = bytes.get(i + 2).and_then(|c| (*c as char).to_digit(16))?;
            out.push(u8::try_from(hi * 16 + lo).ok()?);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Everything [`crate::init`] needs, resolved from flags and the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// The component name (for example `modelcache-controller`): the default service name and
    /// the name of the tracer (instrumentation scope).
    pub component: String,
    /// The component's version, exported as `service.version` unless `OTEL_RESOURCE_ATTRIBUTES`
    /// sets one.
    pub version: Option<String>,
    /// The resolved log filter, in `RUST_LOG` syntax (see [`resolve_log_filter`]).
    pub log_filter: String,
    /// How log lines are written.
    pub log_format: LogFormat,
    /// OpenTelemetry settings from the `OTEL_*` variables.
    pub otel: OtelSettings,
}

impl TelemetryConfig {
    /// Resolves the configuration through `lookup` instead of the process environment.
    ///
    /// `log_filter_flag` is the value of the binary's log-level flag, if the user gave one; it
    /// wins over `RUST_LOG`.
    pub fn from_lookup<F>(
        component: &str,
        log_filter_flag: Option<&str>,
        log_format: LogFormat,
        lookup: F,
    ) -> Self
    where
        F: Fn(&str) -> Option<String>,
    {
        let rust_log = lookup(RUST_LOG_ENV);
        TelemetryConfig {
            component: component.to_owned(),
            version: None,
            log_filter: resolve_log_filter(log_filter_flag, rust_log.as_deref()),
            log_format,
            otel: OtelSettings::from_lookup(component, lookup),
        }
    }

    /// Resolves the configuration from the process environment (`RUST_LOG`, `OTEL_*`).
    #[must_use]
    pub fn from_env(component: &str, log_filter_flag: Option<&str>, log_format: LogFormat) -> Self {
        Self::from_lookup(component, log_filter_flag, log_format, |key| {
            std::env::var(key).ok()
        })
    }

    /// Sets the version exported as `service.version`.
    #[must_use]
    pub fn with_version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn log_format_parses_and_displays() {
        assert_eq!("plain".parse::<LogFormat>(), Ok(LogFormat::Plain));
        assert_eq!("JSON".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert_eq!(" json ".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert!("yaml".parse::<LogFormat>().is_err());
        for v in LogFormat::VARIANTS {
            let f: LogFormat = v.parse().unwrap();
            assert_eq!(f.to_string(), v);
        }
        assert_eq!(LogFormat::default(), LogFormat::Plain);
    }

    #[test]
    fn filter_precedence_flag_then_rust_log_then_default() {
        assert_eq!(resolve_log_filter(Some("debug"), Some("warn")), "debug");
        assert_eq!(resolve_log_filter(None, Some("warn")), "warn");
        assert_eq!(resolve_log_filter(Some("  "), Some("warn")), "warn");
        assert_eq!(resolve_log_filter(None, None), "info");
        assert_eq!(resolve_log_filter(Some(""), Some("")), "info");
    }

    #[test]
    fn config_reads_rust_log_through_lookup() {
        let c = TelemetryConfig::from_lookup(
            "reaper",
            None,
            LogFormat::Json,
            env(&[("RUST_LOG", "kube=debug,info")]),
        );
        assert_eq!(c.log_filter, "kube=debug,info");
        let c = TelemetryConfig::from_lookup(
            "reaper",
            Some("trace"),
            LogFormat::Json,
            env(&[("RUST_LOG", "kube=debug,info")]),
        );
        assert_eq!(c.log_filter, "trace");
        assert_eq!(c.component, "reaper");
        assert_eq!(c.with_version("1.2.3").version.as_deref(), Some("1.2.3"));
    }

    #[test]
    fn export_off_without_endpoint() {
        let s = OtelSettings::from_lookup("reaper", env(&[]));
        assert_eq!(s.endpoint, None);
        assert!(!s.export_enabled());
        assert_eq!(s.service_name, "reaper");
        assert!(s.resource_attributes.is_empty());
        assert!(s.warnings.is_empty());
    }

    #[test]
    fn traces_endpoint_wins_over_generic() {
        let s = OtelSettings::from_lookup(
            "c",
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://generic:4317"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4317"),
            ]),
        );
        assert_eq!(s.endpoint.as_deref(), Some("http://traces:4317"));

        let s = OtelSettings::from_lookup(
            "c",
            env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://generic:4317")]),
        );
        assert_eq!(s.endpoint.as_deref(), Some("http://generic:4317"));

        let s = OtelSettings::from_lookup(
            "c",
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://generic:4317"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", ""),
            ]),
        );
        assert_eq!(s.endpoint.as_deref(), Some("http://generic:4317"));
    }

    #[test]
    fn sdk_disabled_turns_export_off() {
        let ep = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317");
        for v in ["true", "TRUE", " True "] {
            let s = OtelSettings::from_lookup("c", env(&[ep, ("OTEL_SDK_DISABLED", v)]));
            assert_eq!(s.endpoint, None, "{v}");
        }
        let s = OtelSettings::from_lookup("c", env(&[ep, ("OTEL_SDK_DISABLED", "false")]));
        assert!(s.export_enabled());
        assert!(s.warnings.is_empty());
        let s = OtelSettings::from_lookup("c", env(&[ep, ("OTEL_SDK_DISABLED", "yes")]));
        assert!(s.export_enabled());
        assert_eq!(s.warnings.len(), 1);
    }

    #[test]
    fn service_name_precedence() {
        let s = OtelSettings::from_lookup(
            "component",
            env(&[
                ("OTEL_SERVICE_NAME", "from-env"),
                ("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attrs"),
            ]),
        );
        assert_eq!(s.service_name, "from-env");
        let s = OtelSettings::from_lookup(
            "component",
            env(&[("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attrs")]),
        );
        assert_eq!(s.service_name, "from-attrs");
        assert!(s.resource_attributes.is_empty());
        let s = OtelSettings::from_lookup("component", env(&[("OTEL_SERVICE_NAME", "")]));
        assert_eq!(s.service_name, "component");
    }

    #[test]
    fn resource_attributes_are_parsed_and_decoded() {
        let s = OtelSettings::from_lookup(
            "c",
            env(&[(
                "OTEL_RESOURCE_ATTRIBUTES",
                "k8s.cluster.name=gpu-a, deployment.environment = prod ,note=a%2Cb%20c,\
                 broken,=nokey,bad=%zz,k8s.cluster.name=gpu-b,",
            )]),
        );
        assert_eq!(
            s.resource_attributes,
            vec![
                ("k8s.cluster.name".to_owned(), "gpu-b".to_owned()),
                ("deployment.environment".to_owned(), "prod".to_owned()),
                ("note".to_owned(), "a,b c".to_owned()),
            ]
        );
        assert_eq!(s.warnings.len(), 3, "{:?}", s.warnings);
    }

    #[test]
    fn unsupported_protocol_warns_only_when_exporting() {
        let s = OtelSettings::from_lookup(
            "c",
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ]),
        );
        assert!(s.export_enabled());
        assert_eq!(s.warnings.len(), 1);
        let s = OtelSettings::from_lookup(
            "c",
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
            ]),
        );
        assert!(s.warnings.is_empty());
        let s =
            OtelSettings::from_lookup("c", env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")]));
        assert!(s.warnings.is_empty());
    }

    #[test]
    fn percent_decode_edge_cases() {
        assert_eq!(percent_decode("plain").as_deref(), Some("plain"));
        assert_eq!(percent_decode("%41%42").as_deref(), Some("AB"));
        assert_eq!(percent_decode("%4"), None);
        assert_eq!(percent_decode("%"), None);
        assert_eq!(percent_decode("%ff"), None); // not UTF-8 on its own
        assert_eq!(percent_decode("%C3%A9").as_deref(), Some("é"));
    }
}
