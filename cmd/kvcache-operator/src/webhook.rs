//! The validating webhook for `KVCacheBackend`: the review handler and the serving command.
//!
//! Register it with `failurePolicy: Fail` for `kvcachebackends` (`CREATE` and `UPDATE` only;
//! deletion is gated by the operator's finalizer, not here). The API server also sends the
//! updates of an object that is being deleted, so the tier stays frozen while consumers hold
//! the backend; the operator's own finalizer removal changes no spec and is always admitted.

use std::sync::Arc;

use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use kube::core::response::{StatusCause, StatusDetails};
use warmcache_admission::registration::{FailurePolicy, Rule, Scope, SideEffects, Webhook};
use warmcache_admission::{
    AdmissionError, AdmissionServer, AdmissionServerConfig, Route, ServiceTarget, TlsFiles,
    WebhookConfigurations,
};
use warmcache_api_kvcache::SYSTEM_NAMESPACE;
use warmcache_api_kvcache::v1alpha1::{GROUP, KIND, KVCacheBackend};
use warmcache_kvcache::{FieldError, ValidationContext, validate_values};
use warmcache_runtime::{Runtime, RuntimeError};

use crate::WebhookArgs;

/// The component name: service name of its traces, prefix of its metrics
/// (`warmcache_kvcache_operator_*`).
pub const COMPONENT: &str = "kvcache-operator";

/// Path the webhook is served on.
pub const WEBHOOK_PATH: &str = "/validate-kvcachebackends";

/// Name of the webhook in its `ValidatingWebhookConfiguration`.
pub const WEBHOOK_NAME: &str = "kvcachebackends.worker.gpustack.ai";

/// Name of the generated `ValidatingWebhookConfiguration`.
pub const CONFIGURATION_NAME: &str = "kvcache-operator";

/// The Service the generated configuration sends reviews to: `kvcache-operator-webhook` in the
/// operator's namespace, port 443 (the chart maps it to `--listen`).
pub fn service() -> ServiceTarget {
    ServiceTarget::new(SYSTEM_NAMESPACE, "kvcache-operator-webhook", 443)
}

/// Why the webhook server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The component runtime failed: telemetry, the admin server, the certificate, binding,
    /// serving.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
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
        Ok(errors) if errors.is_empty() => with_warnings(response, &new_value, old_value.as_ref()),
        Ok(errors) => deny(response, request, &errors),
        Err(err) => response.deny(format!(
            "{err}; this operator cannot judge a change to its spec (a metadata-only update is admitted)"
        )),
    }
}

/// An admission carrying the warnings of [`warmcache_kvcache::advice::warnings`] (shown by
/// `kubectl` as `Warning: ...`), on a create and on an update that changes the spec: a
/// metadata-only update (the operator's finalizer changes) draws none. Warnings never change
/// the verdict, so upstream's admissions and refusals stay as they are.
fn with_warnings(
    mut response: AdmissionResponse,
    new: &serde_json::Value,
    old: Option<&serde_json::Value>,
) -> AdmissionResponse {
    if old.is_some_and(|old| old.get("spec") == new.get("spec")) {
        return response;
    }
    let Ok(backend) = warmcache_kvcache::from_value(new.clone()) else {
        return response;
    };
    let warnings: Vec<String> = warmcache_kvcache::advice::warnings(&backend)
        .iter()
        .map(ToString::to_string)
        .collect();
    if !warnings.is_empty() {
        response.warnings = Some(warnings);
    }
    response
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

/// The webhook's registration: `CREATE` and `UPDATE` of `kvcachebackends`, `failurePolicy:
/// Fail` (an unchecked backend is worse than a refused one), 10 s, no side effects. `DELETE` is
/// not validated: the finalizer gates deletion.
pub fn registration() -> Webhook {
    Webhook::new(WEBHOOK_NAME)
        .rule(
            Rule::for_resource::<KVCacheBackend>(vec![Operation::Create, Operation::Update])
                .scope(Scope::Cluster),
        )
        .failure_policy(FailurePolicy::Fail)
        .timeout_seconds(10)
        .side_effects(SideEffects::None)
}

/// The admission server with the `KVCacheBackend` route, validating with `ctx`.
pub fn admission_server(config: AdmissionServerConfig, ctx: ValidationContext) -> AdmissionServer {
    let ctx = Arc::new(ctx);
    AdmissionServer::new(config).route(
        Route::validating(
            WEBHOOK_PATH,
            move |request: AdmissionRequest<DynamicObject>| review(&request, &ctx),
        )
        .webhook(registration()),
    )
}

/// The webhook configuration generated from the route (`cargo xtask gen` writes it to
/// `config/webhook/`): the path, rules and policies the server was built with, by construction.
pub fn webhook_configurations() -> Result<WebhookConfigurations, AdmissionError> {
    admission_server(
        AdmissionServerConfig::new(TlsFiles::in_dir("/unused")),
        ValidationContext::default(),
    )
    .configurations(CONFIGURATION_NAME, &service())
}

/// `kvcache-operator webhook`: serves on the component runtime until SIGTERM or SIGINT.
pub fn run(args: WebhookArgs) -> Result<(), ServeError> {
    warmcache_runtime::block_on(serve(args))
}

async fn serve(args: WebhookArgs) -> Result<(), ServeError> {
    let mut runtime = Runtime::builder(COMPONENT, args.runtime)
        .version(env!("CARGO_PKG_VERSION"))
        .build()
        .await?;
    let ctx = ValidationContext {
        default_image: args.image.default_image.clone(),
    };
    match ctx.default_image() {
        Some(image) => tracing::info!(%image, "kv-cache-backend-image setting"),
        None => {
            tracing::warn!("no kv-cache-backend-image setting: backends must name their own image")
        }
    }
    let config = AdmissionServerConfig::new(TlsFiles::in_dir(&args.admission.tls_dir));
    runtime
        .serve_admission(&args.admission, admission_server(config, ctx))
        .await?;
    runtime.run().await?;
    Ok(())
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
    fn measured_misconfigurations_are_admitted_with_warnings() {
        let ctx = ValidationContext::default();
        // A tier without capacity: admitted, with the 2Ti warning.
        let ok = review(&request("CREATE", Some(tiered("1Gi")), None), &ctx);
        assert!(ok.allowed);
        let warnings = ok.warnings.unwrap();
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0]
                .starts_with("spec.connection.managed.members[0].localDisks[0].capacity: unset"),
            "{warnings:?}"
        );
        // A 16Mi tier with a key limit: both warnings, still admitted.
        let mut small = tiered("1Gi");
        small["spec"]["connection"]["managed"]["members"][0]["localDisks"][0]["capacity"] =
            json!("16Mi");
        small["spec"]["connection"]["managed"]["members"][0]["localDisks"][0]["keyLimit"] =
            json!(1000);
        let ok = review(&request("CREATE", Some(small.clone()), None), &ctx);
        assert!(ok.allowed);
        let warnings = ok.warnings.unwrap();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains(".capacity: 16777216 bytes hold no complete 16Mi bucket"));
        assert!(warnings[1].contains(".keyLimit: has no effect while eviction is enabled"));
        // A metadata-only update draws none (the finalizer changes of the operator).
        let mut finalized = small.clone();
        finalized["metadata"]["finalizers"] = json!(["worker.gpustack.ai/kvcache"]);
        let ok = review(
            &request("UPDATE", Some(finalized), Some(small.clone())),
            &ctx,
        );
        assert!(ok.allowed);
        assert_eq!(ok.warnings, None);
        // A spec change does.
        let mut edited = small.clone();
        edited["spec"]["image"] = json!("repo/store:2");
        let ok = review(&request("UPDATE", Some(edited), Some(small)), &ctx);
        assert_eq!(ok.warnings.map(|w| w.len()), Some(2));
        // A refusal carries its refusals only.
        let refused = review(&request("CREATE", Some(tiered("8Mi")), None), &ctx);
        assert!(!refused.allowed);
        assert_eq!(refused.warnings, None);
        // No tier, no warning.
        let plain =
            backend(json!([{"nodeSelector": {}, "medium": "DRAM", "capacityPerMember": "1Gi"}]));
        assert_eq!(
            review(&request("CREATE", Some(plain), None), &ctx).warnings,
            None
        );
    }

    #[test]
    fn the_generated_configuration_is_the_route() {
        let configs = webhook_configurations().unwrap();
        assert!(configs.mutating.is_none());
        let config = configs.validating.unwrap();
        assert_eq!(config.metadata.name.as_deref(), Some(CONFIGURATION_NAME));
        let webhooks = config.webhooks.unwrap();
        assert_eq!(webhooks.len(), 1);
        let webhook = &webhooks[0];
        assert_eq!(webhook.name, WEBHOOK_NAME);
        assert_eq!(webhook.failure_policy.as_deref(), Some("Fail"));
        assert_eq!(webhook.timeout_seconds, Some(10));
        let service = webhook.client_config.service.as_ref().unwrap();
        assert_eq!(service.path.as_deref(), Some(WEBHOOK_PATH));
        assert_eq!(service.namespace, SYSTEM_NAMESPACE);
        let rules = webhook.rules.as_ref().unwrap();
        assert_eq!(
            rules[0].operations.as_deref(),
            Some(&["CREATE".to_owned(), "UPDATE".to_owned()][..])
        );
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&["kvcachebackends".to_owned()][..])
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
