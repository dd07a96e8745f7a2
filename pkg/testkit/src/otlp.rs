//! An OTLP trace receiver on loopback: the gRPC `TraceService` the components' exporters talk to
//! (`OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:<port>`), decoding real OTLP with the
//! `opentelemetry-proto` types, keeping every span it is sent for a test to inspect.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::error::TestkitError;

/// One span as received, ids in lowercase hex (the W3C `traceparent` spelling).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceivedSpan {
    /// The resource's `service.name`.
    pub service: String,
    /// The span name.
    pub name: String,
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// 16 hex digits, empty for a root span.
    pub parent_span_id: String,
    /// The span's string attributes (`key`, value).
    pub attributes: Vec<(String, String)>,
}

impl ReceivedSpan {
    /// The value of string attribute `key`.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct Collector {
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
}

fn string_value(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        _ => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = Vec::new();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
                .map(|kv| string_value(kv.value.as_ref()))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    received.push(ReceivedSpan {
                        service: service.clone(),
                        name: span.name,
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        attributes: span
                            .attributes
                            .iter()
                            .map(|kv| (kv.key.clone(), string_value(kv.value.as_ref())))
                            .collect(),
                    });
                }
            }
        }
        self.spans
            .lock()
            .map_err(|_| tonic::Status::internal("poisoned"))?
            .extend(received);
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// The receiver; stops when dropped.
pub struct OtlpReceiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl OtlpReceiver {
    /// Listens on a free loopback port.
    ///
    /// # Errors
    ///
    /// The port cannot be bound.
    pub async fn start() -> Result<Self, TestkitError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|source| TestkitError::Io {
                context: "binding the OTLP receiver on loopback".into(),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| TestkitError::Io {
            context: "the OTLP receiver's address".into(),
            source,
        })?;
        let collector = Collector::default();
        let spans = Arc::clone(&collector.spans);
        let (stop, stopped) = oneshot::channel::<()>();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let task = tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(collector))
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = served {
                tracing::warn!("otlp receiver stopped: {e}");
            }
        });
        Ok(Self {
            addr,
            spans,
            stop: Some(stop),
            task,
        })
    }

    /// `http://127.0.0.1:<port>`, for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}
