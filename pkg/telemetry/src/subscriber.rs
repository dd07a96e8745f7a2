//! Installing the global `tracing` subscriber and the OpenTelemetry tracer provider.

use std::fmt;
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_otlp::{SpanExporter, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::resource::TelemetryResourceDetector;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::format::{self, FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::{FmtContext, MakeWriter};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::{LogFormat, TelemetryConfig};
use crate::error::TelemetryError;

/// How long [`TelemetryGuard::shutdown`] waits for the last spans to reach the collector.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Targets whose spans are never turned into OpenTelemetry spans: the exporter's own transport
/// stack (exporting them would feed spans about exporting back into the exporter) and the SDK.
const OTEL_EXCLUDED_TARGETS: [&str; 8] = [
    "h2",
    "hyper",
    "hyper_util",
    "tonic",
    "tower",
    "opentelemetry",
    "opentelemetry_sdk",
    "opentelemetry_otlp",
];

/// Keeps the tracer provider alive; flushes and shuts it down when dropped.
///
/// Hold it in `main` for the life of the process. Dropping it (or calling
/// [`TelemetryGuard::shutdown`]) exports the spans still queued, waiting at most
/// [`SHUTDOWN_TIMEOUT`]. Do that while the Tokio runtime is still running: the OTLP transport
/// lives on it.
#[must_use = "dropping the guard shuts the tracer provider down"]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
    exporting: bool,
}

impl fmt::Debug for TelemetryGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TelemetryGuard")
            .field("active", &self.provider.is_some())
            .field("exporting", &self.exporting)
            .finish()
    }
}

impl TelemetryGuard {
    /// Whether spans are being exported over OTLP.
    #[must_use]
    pub fn exporting(&self) -> bool {
        self.exporting
    }

    /// Exports the queued spans and shuts the tracer provider down.
    ///
    /// Blocks for at most [`SHUTDOWN_TIMEOUT`]; on a multi-threaded Tokio runtime the wait is
    /// wrapped in `block_in_place` so the runtime keeps driving the exporter meanwhile.
    pub fn shutdown(mut self) -> Result<(), TelemetryError> {
        match self.provider.take() {
            Some(provider) => shutdown_provider(&provider),
            None => Ok(()),
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(err) = shutdown_provider(&provider)
        {
            // The subscriber may still be up; if not, this is a no-op.
            tracing::warn!(error = %err, "telemetry shutdown failed");
        }
    }
}

fn shutdown_provider(provider: &SdkTracerProvider) -> Result<(), TelemetryError> {
    let run = || provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT);
    let result = match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(run)
        }
        _ => run(),
    };
    result.map_err(TelemetryError::TracerShutdown)
}

/// Installs logging and tracing for the whole process. Call once, early in `main`.
///
/// This
/// - installs a global `tracing` subscriber: the log filter from `config.log_filter`, log lines
///   on standard error in `config.log_format`, each line inside a span carrying `trace_id` and
///   `span_id`, and `log` records bridged into `tracing`;
/// - builds an OpenTelemetry SDK tracer provider and bridges `tracing` spans into it. With an
///   OTLP endpoint configured the spans are batch-exported over gRPC; without one the provider
///   has no exporter but still issues real trace and span ids, so trace context propagates
///   across objects (see [`crate::inject_current`]) and ids appear in logs either way;
/// - registers that provider and the W3C TraceContext propagator as the OpenTelemetry globals;
/// - logs the warnings collected while reading the `OTEL_*` variables.
///
/// With export on it must be called inside a Tokio runtime (the gRPC channel is spawned on it).
///
/// # Errors
/// An invalid log filter, an unusable OTLP endpoint, no Tokio runtime while exporting, or a
/// subscriber installed before.
pub fn init(config: &TelemetryConfig) -> Result<TelemetryGuard, TelemetryError> {
    let filter = parse_filter(&config.log_filter)?;
    let provider = build_provider(config)?;
    let exporting = config.otel.export_enabled();
    let tracer = provider.tracer(config.component.clone());

    let otel_layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(otel_target_filter());

    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(log_layer(config.log_format, std::io::stderr))
        .with(otel_layer)
        .try_init();
    if let Err(err) = installed {
        // Nothing references the provider yet; shut it down so no exporter thread lingers.
        let _ = provider.shutdown_with_timeout(Duration::from_millis(100));
        return Err(TelemetryError::AlreadyInitialized(err));
    }

    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    opentelemetry::global::set_tracer_provider(provider.clone());

    for warning in &config.otel.warnings {
        tracing::warn!("{warning}");
    }
    tracing::debug!(
        component = %config.component,
        service_name = %config.otel.service_name,
        log_filter = %config.log_filter,
        log_format = %config.log_format,
        otlp_endpoint = config.otel.endpoint.as_deref().unwrap_or("none"),
        "telemetry initialised"
    );

    Ok(TelemetryGuard {
        provider: Some(provider),
        exporting,
    })
}

/// Parses a `RUST_LOG`-syntax filter, rejecting invalid directives instead of skipping them.
///
/// The OpenTelemetry SDK's own diagnostics are limited to warnings unless the filter names an
/// `opentelemetry*` target itself.
pub(crate) fn parse_filter(filter: &str) -> Result<EnvFilter, TelemetryError> {
    let mut env_filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::INFO.into())
        .parse(filter)
        .map_err(|source| TelemetryError::InvalidLogFilter {
            filter: filter.to_owned(),
            source,
        })?;
    if !filter.contains("opentelemetry")
        && let Ok(directive) = "opentelemetry=warn".parse()
    {
        // Target directives match by prefix: this covers opentelemetry_sdk and _otlp too.
        env_filter = env_filter.add_directive(directive);
    }
    Ok(env_filter)
}

/// The per-layer filter of the OpenTelemetry layer.
fn otel_target_filter() -> Targets {
    OTEL_EXCLUDED_TARGETS.iter().fold(
        Targets::new().with_default(LevelFilter::TRACE),
        |t, target| t.with_target(*target, LevelFilter::OFF),
    )
}

/// The resource: SDK attributes, `OTEL_RESOURCE_ATTRIBUTES`, `service.version`, `service.name`.
pub(crate) fn build_resource(config: &TelemetryConfig) -> Resource {
    let attributes = &config.otel.resource_attributes;
    let mut builder = Resource::builder_empty()
        .with_detector(Box::new(TelemetryResourceDetector))
        .with_attributes(
            attributes
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        );
    if let Some(version) = &config.version
        && !attributes.iter().any(|(k, _)| k == "service.version")
    {
        builder = builder.with_attribute(KeyValue::new("service.version", version.clone()));
    }
    builder
        .with_service_name(config.otel.service_name.clone())
        .build()
}

fn build_provider(config: &TelemetryConfig) -> Result<SdkTracerProvider, TelemetryError> {
    let builder = SdkTracerProvider::builder().with_resource(build_resource(config));
    let Some(endpoint) = &config.otel.endpoint else {
        return Ok(builder.build());
    };
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(TelemetryError::NoTokioRuntime {
            what: "telemetry::init with OTLP export",
        });
    }
    let exporter = SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint.clone())
        .build()
        .map_err(|source| TelemetryError::OtlpExporter {
            endpoint: endpoint.clone(),
            source,
        })?;
    Ok(builder.with_batch_exporter(exporter).build())
}

/// The log-line layer for `format`, writing to `writer`.
pub(crate) fn log_layer<S, W>(format: LogFormat, writer: W) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    match format {
        LogFormat::Plain => tracing_subscriber::fmt::layer()
            .with_writer(writer)
            .with_ansi(false)
            .event_format(WithTraceIds {
                inner: format::Format::default().with_ansi(false),
                json: false,
            })
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(writer)
            .event_format(WithTraceIds {
                inner: format::Format::default()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_span_list(true),
                json: true,
            })
            .boxed(),
    }
}

/// Wraps an event formatter and appends the OpenTelemetry trace and span ids of the current
/// span (`trace_id=… span_id=…` in plain lines, `"trace_id"`/`"span_id"` keys in JSON).
struct WithTraceIds<F> {
    inner: F,
    json: bool,
}

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'w> FormatFields<'w> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        // The OpenTelemetry layer attaches the span's context on enter, so the current
        // OpenTelemetry context is the one of the innermost entered span.
        let ids = ctx.lookup_current().and_then(|_| {
            let cx = opentelemetry::Context::current();
            let span = cx.span();
            let sc = span.span_context();
            sc.is_valid()
                .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
        });
        let Some((trace_id, span_id)) = ids else {
            return self.inner.format_event(ctx, writer, event);
        };

        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        let body = line.trim_end_matches('\n');
        if self.json {
            match body.strip_suffix('}') {
                Some(object) => {
                    let sep = if object.trim_end().ends_with('{') {
                        ""
                    } else {
                        ","
                    };
                    writeln!(
                        writer,
                        "{object}{sep}\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\"}}"
                    )
                }
                None => writeln!(writer, "{body}"),
            }
        } else {
            writeln!(writer, "{body} trace_id={trace_id} span_id={span_id}")
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::OtelSettings;
    use std::io;
    use std::sync::{Arc, Mutex};

    /// A subscriber like the one [`init`] installs, for `with_default` in tests.
    pub(crate) fn test_subscriber(
        format: LogFormat,
        out: SharedBuf,
    ) -> (impl Subscriber + Send + Sync, SdkTracerProvider) {
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(parse_filter("debug").unwrap())
            .with(log_layer(format, out))
            .with(
                tracing_opentelemetry::layer()
                    .with_tracer(provider.tracer("test"))
                    .with_filter(otel_target_filter()),
            );
        (subscriber, provider)
    }

    #[derive(Clone, Default)]
    pub(crate) struct SharedBuf(pub Arc<Mutex<Vec<u8>>>);

    impl SharedBuf {
        pub(crate) fn contents(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    impl io::Write for SharedBuf {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for SharedBuf {
        type Writer = SharedBuf;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    #[test]
    fn invalid_filter_is_rejected_with_its_text() {
        let err = parse_filter("info,kube=notalevel").unwrap_err();
        assert!(err.to_string().contains("kube=notalevel"), "{err}");
        assert!(parse_filter("info,kube=debug,warmcache_reaper=trace").is_ok());
    }

    #[test]
    fn sdk_diagnostics_are_quiet_unless_asked_for() {
        let quiet = parse_filter("debug").unwrap().to_string();
        assert!(quiet.contains("opentelemetry=warn"), "{quiet}");
        let asked = parse_filter("debug,opentelemetry_sdk=debug")
            .unwrap()
            .to_string();
        assert!(!asked.contains("opentelemetry=warn"), "{asked}");
    }

    #[test]
    fn plain_lines_carry_trace_ids_inside_spans_only() {
        let buf = SharedBuf::default();
        let (subscriber, _provider) = test_subscriber(LogFormat::Plain, buf.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("outside");
            let span = tracing::info_span!("reconcile", object = "ns/name");
            let _e = span.enter();
            tracing::info!(step = 1, "inside");
        });
        let out = buf.contents();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert!(lines[0].contains("outside") && !lines[0].contains("trace_id="));
        assert!(lines[1].contains("inside") && lines[1].contains("reconcile"));
        let trace_id = lines[1]
            .split_whitespace()
            .find_map(|w| w.strip_prefix("trace_id="))
            .unwrap();
        assert_eq!(trace_id.len(), 32);
        assert_ne!(trace_id, "0".repeat(32));
        assert!(!out.contains('\u{1b}'), "no ANSI escapes: {out:?}");
    }

    #[test]
    fn json_lines_are_objects_with_trace_ids() {
        let buf = SharedBuf::default();
        let (subscriber, _provider) = test_subscriber(LogFormat::Json, buf.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(k = "v", "outside");
            let span = tracing::info_span!("reconcile");
            let _e = span.enter();
            tracing::info!("inside");
        });
        let out = buf.contents();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        for l in &lines {
            assert!(l.starts_with('{') && l.ends_with('}'), "{l}");
        }
        assert!(!lines[0].contains("trace_id"));
        assert!(lines[1].contains("\"trace_id\":\"") && lines[1].contains("\"span_id\":\""));
        assert!(lines[1].contains("\"message\":\"inside\""), "{}", lines[1]);
    }

    #[test]
    fn resource_has_service_name_version_and_env_attributes() {
        let mut config =
            TelemetryConfig::from_lookup("reaper", None, LogFormat::Plain, |k| match k {
                "OTEL_RESOURCE_ATTRIBUTES" => Some("k8s.cluster.name=gpu-a".to_owned()),
                _ => None,
            })
            .with_version("0.1.0");
        let r = build_resource(&config);
        let get = |k: &'static str| r.get(&opentelemetry::Key::from_static_str(k));
        assert_eq!(get("service.name").unwrap().as_str(), "reaper");
        assert_eq!(get("service.version").unwrap().as_str(), "0.1.0");
        assert_eq!(get("k8s.cluster.name").unwrap().as_str(), "gpu-a");
        assert!(get("telemetry.sdk.name").is_some());

        config.otel = OtelSettings::from_lookup("reaper", |k| match k {
            "OTEL_RESOURCE_ATTRIBUTES" => Some("service.version=9".to_owned()),
            _ => None,
        });
        let r = build_resource(&config);
        let v = r.get(&opentelemetry::Key::from_static_str("service.version"));
        assert_eq!(v.unwrap().as_str(), "9");
    }

    #[test]
    fn otlp_export_outside_a_runtime_is_an_error_not_a_panic() {
        let config = TelemetryConfig::from_lookup("c", None, LogFormat::Plain, |k| match k {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://127.0.0.1:4317".to_owned()),
            _ => None,
        });
        let err = build_provider(&config).unwrap_err();
        assert!(
            matches!(err, TelemetryError::NoTokioRuntime { .. }),
            "{err}"
        );
    }

    #[tokio::test]
    async fn otlp_exporter_builds_inside_a_runtime() {
        let config = TelemetryConfig::from_lookup("c", None, LogFormat::Plain, |k| match k {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://127.0.0.1:4317".to_owned()),
            _ => None,
        });
        let provider = build_provider(&config).unwrap();
        // Nothing listens there; shutdown must still return within the timeout.
        let _ = provider.shutdown_with_timeout(Duration::from_secs(1));

        let bad = TelemetryConfig::from_lookup("c", None, LogFormat::Plain, |k| match k {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("not a uri".to_owned()),
            _ => None,
        });
        let err = build_provider(&bad).unwrap_err();
        assert!(err.to_string().contains("not a uri"), "{err}");
    }

    #[tokio::test]
    async fn otlp_exporter_accepts_an_https_collector() {
        // TLS to the collector uses ring and the system trust store; without the TLS features
        // the exporter refuses an https endpoint at build time.
        let config = TelemetryConfig::from_lookup("c", None, LogFormat::Plain, |k| match k {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" => Some("https://127.0.0.1:4317".to_owned()),
            _ => None,
        });
        let provider = build_provider(&config).unwrap();
        let _ = provider.shutdown_with_timeout(Duration::from_secs(1));
    }
}
