//! Registering admission webhooks served by a test with the real API server.

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhook,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};

use crate::crd::FIELD_MANAGER;
use crate::{TestkitError, eventually};

/// Everything needed to register one webhook. [`register_validating_webhook`] and
/// [`register_mutating_webhook`] cover the common case; use this to scope a webhook to one
/// namespace (recommended: tests in one binary share the API server, and an unscoped webhook with
/// `failurePolicy: Fail` intercepts the other tests' requests too).
#[derive(Clone, Debug)]
pub struct WebhookRegistration {
    /// Name of the configuration object. The webhook inside is named the same when it already
    /// has three dot-separated segments, else `<name>.testkit.warmcache.io`.
    pub name: String,
    /// `https://127.0.0.1:<port>/<path>` of the test's webhook server.
    pub url: String,
    /// PEM CA that signed the server's certificate (for example [`crate::WebhookPki::ca_pem`]).
    pub ca_pem: String,
    /// Which operations on which resources are sent to the webhook.
    pub rules: Vec<RuleWithOperations>,
    /// `failurePolicy: Fail` when true, `Ignore` when false.
    pub failure_policy_fail: bool,
    /// Restricts the webhook to matching namespaces (see [`crate::TestNamespace::selector`]).
    pub namespace_selector: Option<LabelSelector>,
    /// Restricts the webhook to matching objects.
    pub object_selector: Option<LabelSelector>,
    /// How long the API server waits for the webhook (default 10).
    pub timeout_seconds: i32,
}

impl WebhookRegistration {
    /// A registration with `failurePolicy: Fail`, no selectors and a 10 s timeout.
    pub fn new(name: &str, url: &str, ca_pem: &str, rules: Vec<RuleWithOperations>) -> Self {
        Self {
            name: name.to_owned(),
            url: url.to_owned(),
            ca_pem: ca_pem.to_owned(),
            rules,
            failure_policy_fail: true,
            namespace_selector: None,
            object_selector: None,
            timeout_seconds: 10,
        }
    }

    /// Sets the namespace selector.
    pub fn namespace_selector(mut self, selector: LabelSelector) -> Self {
        self.namespace_selector = Some(selector);
        self
    }

    /// Sets the object selector.
    pub fn object_selector(mut self, selector: LabelSelector) -> Self {
        self.object_selector = Some(selector);
        self
    }

    /// Sets the failure policy (`true` = `Fail`, `false` = `Ignore`).
    pub fn failure_policy_fail(mut self, fail: bool) -> Self {
        self.failure_policy_fail = fail;
        self
    }

    fn webhook_name(&self) -> String {
        if self.name.split('.').filter(|s| !s.is_empty()).count() >= 3 {
            self.name.clone()
        } else {
            format!("{}.testkit.warmcache.io", self.name)
        }
    }

    fn client_config(&self) -> WebhookClientConfig {
        WebhookClientConfig {
            url: Some(self.url.clone()),
            ca_bundle: Some(ByteString(self.ca_pem.clone().into_bytes())),
            service: None,
        }
    }

    fn failure_policy(&self) -> String {
        if self.failure_policy_fail {
            "Fail".into()
        } else {
            "Ignore".into()
        }
    }

    fn metadata(&self) -> ObjectMeta {
        ObjectMeta {
            name: Some(self.name.clone()),
            ..ObjectMeta::default()
        }
    }
}

/// Creates or replaces the ValidatingWebhookConfiguration `name` with one webhook calling `url`
/// (`sideEffects: None`, `admissionReviewVersions: [v1]`, `timeoutSeconds: 10`, failure policy
/// `Fail` or `Ignore`), applying to all namespaces.
///
/// The API server loads webhook configurations asynchronously (normally within a second), so the
/// webhook may not be called by requests made right after this returns; see
/// [`wait_for_webhook`].
pub async fn register_validating_webhook(
    client: &Client,
    name: &str,
    url: &str,
    ca_pem: &str,
    rules: Vec<RuleWithOperations>,
    failure_policy_fail: bool,
) -> Result<(), TestkitError> {
    let registration =
        WebhookRegistration::new(name, url, ca_pem, rules).failure_policy_fail(failure_policy_fail);
    register_validating(client, &registration).await
}

/// Creates or replaces the MutatingWebhookConfiguration `name`; otherwise as
/// [`register_validating_webhook`] (reinvocation policy `Never`).
pub async fn register_mutating_webhook(
    client: &Client,
    name: &str,
    url: &str,
    ca_pem: &str,
    rules: Vec<RuleWithOperations>,
    failure_policy_fail: bool,
) -> Result<(), TestkitError> {
    let registration =
        WebhookRegistration::new(name, url, ca_pem, rules).failure_policy_fail(failure_policy_fail);
    register_mutating(client, &registration).await
}

/// Creates or replaces a ValidatingWebhookConfiguration from `registration`.
pub async fn register_validating(
    client: &Client,
    registration: &WebhookRegistration,
) -> Result<(), TestkitError> {
    let config = ValidatingWebhookConfiguration {
        metadata: registration.metadata(),
        webhooks: Some(vec![ValidatingWebhook {
            name: registration.webhook_name(),
            client_config: registration.client_config(),
            rules: Some(registration.rules.clone()),
            failure_policy: Some(registration.failure_policy()),
            side_effects: "None".into(),
            admission_review_versions: vec!["v1".into()],
            timeout_seconds: Some(registration.timeout_seconds),
            namespace_selector: registration.namespace_selector.clone(),
            object_selector: registration.object_selector.clone(),
            ..ValidatingWebhook::default()
        }]),
    };
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    api.patch(
        &registration.name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&config),
    )
    .await
    .map_err(|e| {
        TestkitError::kube(
            format!(
                "applying ValidatingWebhookConfiguration {}",
                registration.name
            ),
            e,
        )
    })?;
    Ok(())
}

/// Creates or replaces a MutatingWebhookConfiguration from `registration`.
pub async fn register_mutating(
    client: &Client,
    registration: &WebhookRegistration,
) -> Result<(), TestkitError> {
    let config = MutatingWebhookConfiguration {
        metadata: registration.metadata(),
        webhooks: Some(vec![MutatingWebhook {
            name: registration.webhook_name(),
            client_config: registration.client_config(),
            rules: Some(registration.rules.clone()),
            failure_policy: Some(registration.failure_policy()),
            side_effects: "None".into(),
            admission_review_versions: vec!["v1".into()],
            timeout_seconds: Some(registration.timeout_seconds),
            namespace_selector: registration.namespace_selector.clone(),
            object_selector: registration.object_selector.clone(),
            reinvocation_policy: Some("Never".into()),
            ..MutatingWebhook::default()
        }]),
    };
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    api.patch(
        &registration.name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&config),
    )
    .await
    .map_err(|e| {
        TestkitError::kube(
            format!(
                "applying MutatingWebhookConfiguration {}",
                registration.name
            ),
            e,
        )
    })?;
    Ok(())
}

/// Deletes the ValidatingWebhookConfiguration `name` (a missing one is not an error).
pub async fn delete_validating_webhook(client: &Client, name: &str) -> Result<(), TestkitError> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    ignore_not_found(api.delete(name, &DeleteParams::default()).await.map(drop)).map_err(|e| {
        TestkitError::kube(format!("deleting ValidatingWebhookConfiguration {name}"), e)
    })
}

/// Deletes the MutatingWebhookConfiguration `name` (a missing one is not an error).
pub async fn delete_mutating_webhook(client: &Client, name: &str) -> Result<(), TestkitError> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    ignore_not_found(api.delete(name, &DeleteParams::default()).await.map(drop))
        .map_err(|e| TestkitError::kube(format!("deleting MutatingWebhookConfiguration {name}"), e))
}

fn ignore_not_found(result: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        other => other,
    }
}

/// Waits until the API server calls a freshly registered webhook: retries `probe` every 100 ms
/// until it returns `true` or `timeout` passes.
///
/// A good probe sends a request the webhook must see (for example a `dryRun` create of an object
/// matching its rules) and reports whether the webhook's answer shows up: a denial message from a
/// validating webhook, a field set by a mutating one, or a hit counter in the test's server.
pub async fn wait_for_webhook<F, Fut>(timeout: Duration, mut probe: F) -> Result<(), TestkitError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually("the API server to call the webhook", timeout, || {
        let called = probe();
        async move { called.await.then_some(()) }
    })
    .await
}
