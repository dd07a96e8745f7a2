//! The validating webhook for `KVCacheBackend`: the review handler and the serving command.
//!
//! Register it with `failurePolicy: Fail` for `kvcachebackends` (`CREATE` and `UPDATE` only;
//! deletion is gated by the operator's finalizer, not here). The API server also sends the
//! updates of an object that is being deleted, so the tier stays frozen while consumers hold
//! the backend; the operator's own finalizer removal changes no spec and is always admitted.

use std::sync::Arc;
use std::time::Duration;

use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use kube::core::response::{StatusCause, StatusDetails};
use tokio::task::JoinHandle;
use warmcache_admission::{
    AdmissionError, AdmissionMetrics, AdmissionServer, AdmissionServerConfig,
    ReloadingCertResolver, Route, TlsFiles, install_default_crypto_provider, spawn_reloader,
};
use warmcache_api_kvcache::v1alpha1::{GROUP, KIND};
use warmcache_kvcache::{FieldError, ValidationContext, validate_values};
use warmcache_telemetry::{self as telemetry, Readiness, TelemetryError};

use crate::WebhookArgs;

/// Path the webhook is served on.
pub const WEBHOOK_PATH: &str = "/validate-kvcachebackends";

/// Prefix of the binary's own Prometheus metrics. The admission server's series keep their
/// library names (`warmcache_admission_*`), the same in every binary.
pub const METRICS_PREFIX: &str = "warmcache_kvcache_operator";

/// How long the process waits at exit for review handlers that are still running (abandoned
/// at their timeout) before leaving them behind.
const BLOCKING_SHUTDOWN_WAIT: Duration = Duration::from_secs(2);

/// Why the webhook server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Tracing, metrics or the admin server failed.
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    /// The HTTPS server failed (certificates, binding, serving).
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    /// The admission metrics could not be registered.
    #[error("cannot register the admission metrics: {0}")]
    Metrics(#[from] warmcache_telemetry::prometheus::Error),
    /// The runtime or the listening socket could not be set up.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A background task ended abnormally.
    #[error("the {0} task ended abnormally")]
    Task(&'static str),
}

/// Answers one admission review of a `KVCacheBackend`.
pub fn review(
    request: &AdmissionRequest<DynamicObject>,
    ctx: &ValidationContext,
) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return response;
    }
    if request.kind.group != GROUP || request.kind.kind != KIND {
        return response.deny(format!(
            "this webhook validates {GROUP} {KIND} objects, and was sent a {}/{}: its registration is wrong",
            request.kind.group, request.kind.kind
        ));
    }
    let Some(object) = &request.object else {
        return response.deny("the admission request carries no object to validate");
    };
    let new_value = match serde_json::to_value(object) {
        Ok(value) => value,
        Err(err) => return response.deny(format!("the object cannot be read: {err}")),
    };
    let old_value = match request
        .old_object
        .as_ref()
        .map(serde_json::to_value)
        .transpose()
    {
        Ok(value) => value,
        Err(err) => return response.deny(format!("the stored object cannot be read: {err}")),
    };
    match validate_values(&new_value, old_value.as_ref(), ctx) {
        Ok(errors) if errors.is_empty() => response,
        Ok(errors) => deny(response, request, &errors),
        Err(err) => response.deny(format!(
            "{err}; this operator cannot judge a change to its spec (a metadata-only update is admitted)"
        )),
    }
}

/// A denial carrying every refusal: one `<path>: <reason>` per refusal in the message (joined
/// by "; "), and each as a status cause with its field.
fn deny(
    response: AdmissionResponse,
    request: &AdmissionRequest<DynamicObject>,
    errors: &[FieldError],
) -> AdmissionResponse {
    let message: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let mut response = response.deny(message.join("; "));
    response.result.code = 422;
    response.result.reason = "Invalid".to_owned();
    response.result.details = Some(StatusDetails {
        name: request.name.clone(),
        group: GROUP.to_owned(),
        kind: KIND.to_owned(),
        uid: String::new(),
        causes: errors
            .iter()
            .map(|e| StatusCause {
                reason: e.kind.cause_type().to_owned(),
                message: e.reason.clone(),
                field: e.path.clone(),
            })
            .collect(),
        retry_after_seconds: 0,
    });
    response
}

/// The admission server with the `KVCacheBackend` route, validating with `ctx`.
pub fn admission_server(config: AdmissionServerConfig, ctx: ValidationContext) -> AdmissionServer {
    let ctx = Arc::new(ctx);
    AdmissionServer::new(config).route(Route::validating(
        WEBHOOK_PATH,
        move |request: AdmissionRequest<DynamicObject>| review(&request, &ctx),
    ))
}

/// `kvcache-operator webhook`: builds a runtime and serves until SIGTERM or SIGINT.
pub fn run(args: WebhookArgs) -> Result<(), ServeError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|source| ServeError::Io {
            what: "cannot start the async runtime".into(),
            source,
        })?;
    let result = runtime.block_on(serve(args));
    // Review handlers run on the blocking pool; one still stuck in a validation must not keep
    // the process from exiting.
    runtime.shutdown_timeout(BLOCKING_SHUTDOWN_WAIT);
    result
}

/// The registry served on `/metrics`: the binary's own metrics under [`METRICS_PREFIX`], and
/// the admission server's under their documented names.
pub fn metrics_registry()
-> Result<(warmcache_telemetry::prometheus::Registry, AdmissionMetrics), ServeError> {
    let metrics = telemetry::Metrics::new(METRICS_PREFIX)?;
    let admission_metrics = AdmissionMetrics::new()?;
    let exposed = admission_metrics.exposition_registry(metrics.registry())?;
    Ok((exposed, admission_metrics))
}

async fn serve(args: WebhookArgs) -> Result<(), ServeError> {
    install_default_crypto_provider();
    let config = telemetry::TelemetryConfig::from_env(
        "kvcache-operator",
        args.log_level.as_deref(),
        args.log_format,
    )
    .with_version(env!("CARGO_PKG_VERSION"));
    let _telemetry = telemetry::init(&config)?;
    let shutdown = telemetry::shutdown_signal()?;

    let (registry, admission_metrics) = metrics_registry()?;
    let readiness = Readiness::new();
    readiness.set_not_ready("loading the webhook certificate");
    let admin: JoinHandle<Result<(), TelemetryError>> = tokio::spawn(telemetry::serve_admin(
        args.admin_listen,
        registry,
        readiness.clone(),
        shutdown.clone(),
    ));

    let ctx = ValidationContext {
        default_image: args.image.default_image.clone(),
    };
    match ctx.default_image() {
        Some(image) => tracing::info!(%image, "kv-cache-backend-image setting"),
        None => {
            tracing::warn!("no kv-cache-backend-image setting: backends must name their own image")
        }
    }

    let server_config = AdmissionServerConfig::new(TlsFiles::in_dir(&args.tls_dir));
    let result = serve_webhook(
        &args,
        server_config,
        ctx,
        admission_metrics,
        &readiness,
        &shutdown,
    )
    .await;
    // Whatever ended the webhook server, stop the admin server too and wait for it.
    shutdown.cancel();
    let admin_result = admin.await.map_err(|_| ServeError::Task("admin server"))?;
    result?;
    admin_result?;
    tracing::info!("webhook stopped");
    Ok(())
}

async fn serve_webhook(
    args: &WebhookArgs,
    config: AdmissionServerConfig,
    ctx: ValidationContext,
    metrics: AdmissionMetrics,
    readiness: &Readiness,
    shutdown: &warmcache_telemetry::tokio_util::sync::CancellationToken,
) -> Result<(), ServeError> {
    // Load the certificate and bind before reporting ready, so that a bad Secret or a taken
    // port fails the process instead of serving errors.
    let files = config.tls.clone();
    let resolver = tokio::task::spawn_blocking(move || ReloadingCertResolver::load(&files))
        .await
        .map_err(|_| ServeError::Task("certificate loader"))??;
    let listener = std::net::TcpListener::bind(args.listen).map_err(|source| ServeError::Io {
        what: format!("cannot listen on {}", args.listen),
        source,
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|source| ServeError::Io {
            what: format!("cannot set up the listener on {}", args.listen),
            source,
        })?;
    let stop_reloader = shutdown.child_token();
    let reloader = spawn_reloader(
        Arc::clone(&resolver),
        config.reload_interval,
        stop_reloader.clone(),
        Some(metrics.clone()),
    );
    let server = admission_server(config, ctx).with_metrics(metrics);
    tracing::info!(listen = %args.listen, path = WEBHOOK_PATH, "webhook serving");
    readiness.set_ready(true);
    let result = server
        .serve_with_resolver(listener, resolver, shutdown.clone())
        .await;
    readiness.set_not_ready("shutting down");
    stop_reloader.cancel();
    reloader
        .await
        .map_err(|_| ServeError::Task("certificate reloader"))?;
    result.map_err(ServeError::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn request(
        operation: &str,
        object: Option<Value>,
        old: Option<Value>,
    ) -> AdmissionRequest<DynamicObject> {
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "3d2c1b0a-0000-4000-8000-000000000001",
                "kind": {"group": "worker.gpustack.ai", "version": "v1alpha1", "kind": "KVCacheBackend"},
                "resource": {"group": "worker.gpustack.ai", "version": "v1alpha1", "resource": "kvcachebackends"},
                "name": "kvc",
                "operation": operation,
                "userInfo": {"username": "alice"},
                "object": object,
                "oldObject": old,
                "dryRun": false
            }
        });
        warmcache_admission::decode_review(&serde_json::to_vec(&review).unwrap()).unwrap()
    }

    fn backend(spec_members: Value) -> Value {
        json!({
            "apiVersion": "worker.gpustack.ai/v1alpha1",
            "kind": "KVCacheBackend",
            "metadata": {"name": "kvc"},
            "spec": {"image": "repo/store:1", "connection": {"managed": {"leader": {}, "members": spec_members}}},
        })
    }

    fn tiered(capacity: &str) -> Value {
        backend(
            json!([{"nodeSelector": {}, "medium": "DRAM", "capacityPerMember": capacity,
            "localDisks": [{"path": "/var/lib/kvcache"}]}]),
        )
    }

    #[test]
    fn admits_and_refuses_with_paths_and_causes() {
        let ctx = ValidationContext::default();
        let ok = review(&request("CREATE", Some(tiered("1Gi")), None), &ctx);
        assert!(ok.allowed);
        let refused = review(&request("CREATE", Some(tiered("8Mi")), None), &ctx);
        assert!(!refused.allowed);
        assert_eq!(refused.uid, "3d2c1b0a-0000-4000-8000-000000000001");
        assert!(refused.result.message.starts_with(
            "spec.connection.managed.members[0].capacityPerMember: must be at least 16Mi"
        ));
        assert_eq!(refused.result.code, 422);
        assert_eq!(refused.result.reason, "Invalid");
        let details = refused.result.details.unwrap();
        assert_eq!(details.kind, "KVCacheBackend");
        assert_eq!(details.causes.len(), 1);
        assert_eq!(
            details.causes[0].field,
            "spec.connection.managed.members[0].capacityPerMember"
        );
        assert_eq!(details.causes[0].reason, "FieldValueInvalid");
    }

    #[test]
    fn metadata_only_updates_are_admitted_even_when_the_stored_object_is_unreadable() {
        let ctx = ValidationContext::default();
        // A stored object from a future version with a field this operator does not know.
        let mut stored = tiered("8Mi");
        stored["spec"]["connection"]["managed"]["members"][0]["medium"] = json!("HBM");
        let mut new = stored.clone();
        new["metadata"]["finalizers"] = json!([]);
        assert!(review(&request("UPDATE", Some(new), Some(stored.clone())), &ctx).allowed);
        // A spec change of that object is refused with a reason.
        let mut changed = stored.clone();
        changed["spec"]["image"] = json!("repo/store:2");
        let refused = review(
            &request("UPDATE", Some(changed), Some(stored.clone())),
            &ctx,
        );
        assert!(!refused.allowed);
        assert!(
            refused.result.message.contains("medium"),
            "{}",
            refused.result.message
        );
        // A change whose new object decodes, of a stored object that does not: refused, naming
        // the stored object's problem.
        let fixed = tiered("1Gi");
        let refused = review(&request("UPDATE", Some(fixed), Some(stored)), &ctx);
        assert!(!refused.allowed);
        assert!(
            refused.result.message.starts_with(
                "the stored object does not fit the API: spec.connection.managed.members[0].medium: "
            ),
            "{}",
            refused.result.message
        );
    }

    #[test]
    fn ratchets_apply_on_update() {
        let ctx = ValidationContext::default();
        let stored = tiered("8Mi");
        let mut edited = stored.clone();
        edited["spec"]["connection"]["managed"]["members"][0]["nodeSelector"] = json!({"a": "b"});
        assert!(review(&request("UPDATE", Some(edited), Some(stored.clone())), &ctx).allowed);
        let moved = tiered("9Mi");
        assert!(!review(&request("UPDATE", Some(moved), Some(stored)), &ctx).allowed);
    }

    #[test]
    fn admission_metrics_keep_their_documented_names() {
        let (registry, metrics) = metrics_registry().unwrap();
        metrics.observe_review(WEBHOOK_PATH, warmcache_admission::Verdict::Denied, 0.01);
        let names: Vec<String> = registry
            .gather()
            .iter()
            .map(|family| family.name().to_owned())
            .collect();
        assert!(
            names
                .iter()
                .any(|n| n == "warmcache_admission_reviews_total"),
            "{names:?}"
        );
        assert!(
            !names
                .iter()
                .any(|n| n.starts_with(METRICS_PREFIX) && n.contains("admission")),
            "{names:?}"
        );
    }

    #[test]
    fn other_operations_and_kinds() {
        let ctx = ValidationContext::default();
        assert!(review(&request("DELETE", None, Some(tiered("8Mi"))), &ctx).allowed);
        let mut wrong = request("CREATE", Some(tiered("1Gi")), None);
        wrong.kind.kind = "ConfigMap".into();
        let refused = review(&wrong, &ctx);
        assert!(!refused.allowed);
        assert!(refused.result.message.contains("registration is wrong"));
        assert!(!review(&request("CREATE", None, None), &ctx).allowed);
    }
}
