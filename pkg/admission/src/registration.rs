//! Webhook registrations carried by routes, and the `ValidatingWebhookConfiguration` /
//! `MutatingWebhookConfiguration` objects generated from them.
//!
//! A [`Route`](crate::Route) carries its registration ([`Webhook`]), so the path the API server
//! calls is the path the route serves by construction:
//!
//! ```
//! use warmcache_admission::registration::{FailurePolicy, Rule, Scope, ServiceTarget, Webhook};
//! use warmcache_admission::{
//!     AdmissionRequest, AdmissionResponse, AdmissionServer, AdmissionServerConfig,
//!     DynamicObject, Operation, Route, TlsFiles,
//! };
//!
//! let server = AdmissionServer::new(AdmissionServerConfig::new(TlsFiles::in_dir("/certs")))
//!     .route(
//!         Route::validating("/validate-configmaps", |req: AdmissionRequest<DynamicObject>| {
//!             AdmissionResponse::from(&req)
//!         })
//!         .webhook(
//!             Webhook::new("configmaps.example.warmcache.io")
//!                 .rule(
//!                     Rule::new([Operation::Create, Operation::Update], [""], ["v1"], ["configmaps"])
//!                         .scope(Scope::Namespaced),
//!                 )
//!                 .failure_policy(FailurePolicy::Ignore),
//!         ),
//!     );
//! let generated = server.configurations(
//!     "warmcache-example",
//!     &ServiceTarget::new("warmcache-system", "warmcache-webhook", 443),
//! )?;
//! let validating = generated.validating.expect("one validating route");
//! let webhook = &validating.webhooks.as_ref().expect("webhooks")[0];
//! let service = webhook.client_config.service.as_ref().expect("service");
//! assert_eq!(service.path.as_deref(), Some("/validate-configmaps"));
//! assert!(webhook.client_config.ca_bundle.is_none()); // injected by the chart or cert-manager
//! assert!(generated.mutating.is_none());
//! # Ok::<(), warmcache_admission::AdmissionError>(())
//! ```
//!
//! Registrations are checked when the router or the configurations are built
//! ([`AdmissionServer::router`](crate::AdmissionServer::router),
//! [`serve`](crate::AdmissionServer::serve),
//! [`configurations`](crate::AdmissionServer::configurations)): a webhook name that is not a
//! fully qualified lowercase DNS name, or appears twice, no rules or a rule with an empty list,
//! `timeoutSeconds` outside `1..=30` or not longer than the server's
//! [`handler_timeout`](crate::AdmissionServerConfig::handler_timeout), a label selector the API
//! server would refuse, a rule of a typed route covering anything but its type's resource (its
//! group, version, plural or a subresource carrying it, and scope), and a mutating-only setting
//! (`reinvocationPolicy`) on a validating route are refused with
//! [`AdmissionError::InvalidWebhook`]. A configuration name that is not a DNS subdomain, or a
//! Service without a name or namespace or with a port outside `1..=65535`, is refused by
//! [`configurations`](crate::AdmissionServer::configurations) with
//! [`AdmissionError::InvalidConfiguration`].

use std::collections::HashSet;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope, SubResourceScope};
use kube::core::admission::Operation;
use kube::core::{DynamicResourceScope, Resource};

use crate::error::AdmissionError;
use crate::route::RouteKind;
use crate::typed::TypedResource;

/// Longest `timeoutSeconds` the API server accepts.
pub const MAX_TIMEOUT_SECONDS: i32 = 30;

/// What the API server does when it cannot get an answer from the webhook (connection refused,
/// TLS error, timeout). A review the webhook answers is taken as given, whatever this says; see
/// [`OnHandlerError`](crate::OnHandlerError) for handler failures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Refuse the request (`Fail`): for webhooks guarding our own resources.
    #[default]
    Fail,
    /// Let the request through (`Ignore`): for webhooks on other people's workloads.
    Ignore,
}

impl FailurePolicy {
    fn as_str(self) -> &'static str {
        match self {
            Self::Fail => "Fail",
            Self::Ignore => "Ignore",
        }
    }
}

/// Whether calling the webhook has side effects outside the reviewed object (`sideEffects`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SideEffects {
    /// The handler changes nothing but its answer (`None`).
    #[default]
    None,
    /// The handler writes elsewhere (creates an object, calls a service), but never for a
    /// dry-run request ([`TypedRequest::dry_run`](crate::TypedRequest::dry_run) or
    /// `AdmissionRequest::dry_run` is true): `NoneOnDryRun`. Without it the API server refuses
    /// dry-run requests the webhook would see.
    NoneOnDryRun,
}

impl SideEffects {
    fn as_str(self) -> &'static str {
        match self {
            Self::None => "None",
            Self::NoneOnDryRun => "NoneOnDryRun",
        }
    }
}

/// Whether a mutating webhook is called again when a later webhook changed the object
/// (`reinvocationPolicy`; mutating webhooks only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReinvocationPolicy {
    /// Called once (`Never`, the default when unset).
    Never,
    /// Called again if another webhook changed the object after it (`IfNeeded`); the handler
    /// must then be idempotent.
    IfNeeded,
}

impl ReinvocationPolicy {
    fn as_str(self) -> &'static str {
        match self {
            Self::Never => "Never",
            Self::IfNeeded => "IfNeeded",
        }
    }
}

/// How requests through other API versions of a resource match the rules (`matchPolicy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatchPolicy {
    /// Requests through any version are converted to the rule's version and sent
    /// (`Equivalent`).
    #[default]
    Equivalent,
    /// Only requests exactly matching a rule are sent (`Exact`).
    Exact,
}

impl MatchPolicy {
    fn as_str(self) -> &'static str {
        match self {
            Self::Equivalent => "Equivalent",
            Self::Exact => "Exact",
        }
    }
}

/// Which resources a rule covers by scope.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scope {
    /// Namespaced and cluster-scoped resources (`*`).
    #[default]
    All,
    /// Namespaced resources only.
    Namespaced,
    /// Cluster-scoped resources only.
    Cluster,
}

impl Scope {
    fn as_str(self) -> &'static str {
        match self {
            Self::All => "*",
            Self::Namespaced => "Namespaced",
            Self::Cluster => "Cluster",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Self::All => "of any scope",
            Self::Namespaced => "namespaced",
            Self::Cluster => "cluster-scoped",
        }
    }
}

/// The scope markers of resource types (`Resource::Scope`: k8s-openapi's
/// `NamespaceResourceScope`, `ClusterResourceScope` and `SubResourceScope`, kube's
/// `DynamicResourceScope`) as the [`Scope`] of rules for them.
pub trait RuleScope {
    /// The scope of a rule covering such resources: [`Scope::Namespaced`],
    /// [`Scope::Cluster`], or [`Scope::All`] when the type does not tell.
    const SCOPE: Scope;
}

impl RuleScope for NamespaceResourceScope {
    const SCOPE: Scope = Scope::Namespaced;
}

impl RuleScope for ClusterResourceScope {
    const SCOPE: Scope = Scope::Cluster;
}

impl RuleScope for SubResourceScope {
    const SCOPE: Scope = Scope::All;
}

impl RuleScope for DynamicResourceScope {
    const SCOPE: Scope = Scope::All;
}

/// One rule of a webhook: these operations on these resources are sent to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Operations sent to the webhook.
    pub operations: Vec<Operation>,
    /// API groups (`""` for the core group, `"*"` for all).
    pub api_groups: Vec<String>,
    /// API versions (`"*"` for all).
    pub api_versions: Vec<String>,
    /// Resources (`"pods"`, `"pods/status"`, `"*"`, ...).
    pub resources: Vec<String>,
    /// Scope of the resources covered.
    pub scope: Scope,
}

impl Rule {
    /// A rule for `operations` on `resources` of the given groups and versions, any scope.
    pub fn new<G, V, R>(
        operations: impl IntoIterator<Item = Operation>,
        api_groups: impl IntoIterator<Item = G>,
        api_versions: impl IntoIterator<Item = V>,
        resources: impl IntoIterator<Item = R>,
    ) -> Self
    where
        G: Into<String>,
        V: Into<String>,
        R: Into<String>,
    {
        Self {
            operations: operations.into_iter().collect(),
            api_groups: api_groups.into_iter().map(Into::into).collect(),
            api_versions: api_versions.into_iter().map(Into::into).collect(),
            resources: resources.into_iter().map(Into::into).collect(),
            scope: Scope::All,
        }
    }

    /// A rule for `operations` on the resource `K` (its group, version and plural) in `K`'s
    /// scope: `Rule::for_resource::<Pod>([Operation::Create])` covers `""`/`v1`/`pods`,
    /// `Namespaced`.
    pub fn for_resource<K>(operations: impl IntoIterator<Item = Operation>) -> Self
    where
        K: Resource<DynamicType = ()>,
        K::Scope: RuleScope,
    {
        Self::new(
            operations,
            [K::group(&()).into_owned()],
            [K::version(&()).into_owned()],
            [K::plural(&()).into_owned()],
        )
        .scope(<K::Scope as RuleScope>::SCOPE)
    }

    /// Restricts the rule to one scope.
    #[must_use]
    pub fn scope(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    fn to_k8s(&self) -> RuleWithOperations {
        RuleWithOperations {
            api_groups: Some(self.api_groups.clone()),
            api_versions: Some(self.api_versions.clone()),
            operations: Some(
                self.operations
                    .iter()
                    .map(|op| operation_name(op).to_owned())
                    .collect(),
            ),
            resources: Some(self.resources.clone()),
            scope: Some(self.scope.as_str().to_owned()),
        }
    }
}

fn operation_name(operation: &Operation) -> &'static str {
    match operation {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

/// The registration of one route's webhook: everything of a `ValidatingWebhook` or
/// `MutatingWebhook` but the client configuration, which
/// [`configurations`](crate::AdmissionServer::configurations) derives from the route's path and
/// the service serving it. `admissionReviewVersions` is always `["v1"]`, the only version the
/// server speaks.
#[derive(Clone, Debug, PartialEq)]
pub struct Webhook {
    /// Fully qualified webhook name (`pods.webhook.warmcache.io`), unique among all routes;
    /// the API server names it in its messages (`admission webhook "..." denied the request`).
    pub name: String,
    /// Which requests are sent to the webhook; at least one.
    pub rules: Vec<Rule>,
    /// `failurePolicy`; default [`FailurePolicy::Fail`].
    pub failure_policy: FailurePolicy,
    /// `timeoutSeconds`, `1..=30`; default 10. Must be longer than the server's
    /// [`handler_timeout`](crate::AdmissionServerConfig::handler_timeout) (8 s by default).
    pub timeout_seconds: i32,
    /// `sideEffects`; default [`SideEffects::None`].
    pub side_effects: SideEffects,
    /// `reinvocationPolicy`, mutating routes only; `Never` when unset.
    pub reinvocation_policy: Option<ReinvocationPolicy>,
    /// `matchPolicy`; default [`MatchPolicy::Equivalent`].
    pub match_policy: MatchPolicy,
    /// `namespaceSelector`; all namespaces when unset.
    pub namespace_selector: Option<LabelSelector>,
    /// `objectSelector`; all objects when unset.
    pub object_selector: Option<LabelSelector>,
}

impl Webhook {
    /// A registration named `name` with no rules yet, `failurePolicy: Fail`,
    /// `timeoutSeconds: 10`, `sideEffects: None`, `matchPolicy: Equivalent` and no selectors.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            rules: Vec::new(),
            failure_policy: FailurePolicy::Fail,
            timeout_seconds: 10,
            side_effects: SideEffects::None,
            reinvocation_policy: None,
            match_policy: MatchPolicy::Equivalent,
            namespace_selector: None,
            object_selector: None,
        }
    }

    /// Adds a rule.
    #[must_use]
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }

    /// Sets `failurePolicy`.
    #[must_use]
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failure_policy = policy;
        self
    }

    /// Sets `timeoutSeconds` (checked to be within `1..=30` and longer than the server's
    /// `handler_timeout` when the server is built).
    #[must_use]
    pub fn timeout_seconds(mut self, seconds: i32) -> Self {
        self.timeout_seconds = seconds;
        self
    }

    /// Sets `sideEffects`.
    #[must_use]
    pub fn side_effects(mut self, side_effects: SideEffects) -> Self {
        self.side_effects = side_effects;
        self
    }

    /// Sets `reinvocationPolicy` (mutating routes only).
    #[must_use]
    pub fn reinvocation_policy(mut self, policy: ReinvocationPolicy) -> Self {
        self.reinvocation_policy = Some(policy);
        self
    }

    /// Sets `matchPolicy`.
    #[must_use]
    pub fn match_policy(mut self, policy: MatchPolicy) -> Self {
        self.match_policy = policy;
        self
    }

    /// Sets `namespaceSelector`.
    #[must_use]
    pub fn namespace_selector(mut self, selector: LabelSelector) -> Self {
        self.namespace_selector = Some(selector);
        self
    }

    /// Sets `objectSelector`.
    #[must_use]
    pub fn object_selector(mut self, selector: LabelSelector) -> Self {
        self.object_selector = Some(selector);
        self
    }
}

/// The in-cluster Service in front of the admission server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceTarget {
    /// Namespace of the Service.
    pub namespace: String,
    /// Name of the Service.
    pub name: String,
    /// Service port the API server connects to (443 by convention).
    pub port: i32,
}

impl ServiceTarget {
    /// The Service `namespace/name` on `port`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, port: i32) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            port,
        }
    }
}

/// The webhook configurations of a server: one of each kind, holding the webhooks of every route
/// of that kind that carries a registration, or `None` when there is no such route.
#[derive(Clone, Debug, PartialEq)]
pub struct WebhookConfigurations {
    /// The validating routes' webhooks.
    pub validating: Option<ValidatingWebhookConfiguration>,
    /// The mutating routes' webhooks.
    pub mutating: Option<MutatingWebhookConfiguration>,
}

impl WebhookConfigurations {
    /// For tests: calls every webhook at `base_url` followed by its route's path
    /// (`https://127.0.0.1:8443/mutate-pods`) instead of through the Service, trusting the PEM
    /// `ca_bundle`. Webhooks already addressed by URL get the new base and CA too (their path
    /// is kept).
    #[must_use]
    pub fn with_url(mut self, base_url: &str, ca_bundle: &[u8]) -> Self {
        let base = base_url.trim_end_matches('/');
        let retarget = |config: &mut WebhookClientConfig| {
            let path = match (config.service.take(), config.url.take()) {
                (Some(service), _) => service.path.unwrap_or_default(),
                (None, Some(url)) => url_path(&url).to_owned(),
                (None, None) => String::new(),
            };
            config.url = Some(format!("{base}{path}"));
            config.ca_bundle = Some(ByteString(ca_bundle.to_vec()));
        };
        if let Some(config) = &mut self.validating {
            for webhook in config.webhooks.iter_mut().flatten() {
                retarget(&mut webhook.client_config);
            }
        }
        if let Some(config) = &mut self.mutating {
            for webhook in config.webhooks.iter_mut().flatten() {
                retarget(&mut webhook.client_config);
            }
        }
        self
    }
}

/// The path of an `https://host[:port]/path` URL (`""` when it has none).
fn url_path(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.find('/').map_or("", |slash| &rest[slash..])
}

/// The resource a typed route reads objects as.
#[derive(Clone, Debug)]
pub(crate) struct TypedTarget {
    pub(crate) group: String,
    pub(crate) version: String,
    pub(crate) kind: String,
    pub(crate) plural: String,
    pub(crate) scope: Scope,
}

impl TypedTarget {
    pub(crate) fn of<K: TypedResource>() -> Self {
        Self {
            group: K::group(&()).into_owned(),
            version: K::version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            plural: K::plural(&()).into_owned(),
            scope: <K::Scope as RuleScope>::SCOPE,
        }
    }

    fn describe(&self) -> String {
        if self.group.is_empty() {
            format!("{}/{}", self.version, self.kind)
        } else {
            format!("{}/{}/{}", self.group, self.version, self.kind)
        }
    }
}

/// Subresources whose admission requests carry the resource itself (a `Pod` for
/// `pods/status`), which a typed route may be registered for.
const TYPED_SUBRESOURCES: [&str; 5] = [
    "status",
    "ephemeralcontainers",
    "resize",
    "approval",
    "finalize",
];

/// A route as the registration checks and generation see it.
pub(crate) struct Registered<'a> {
    pub(crate) path: &'a str,
    pub(crate) kind: RouteKind,
    /// What a typed route reads objects as.
    pub(crate) target: Option<&'a TypedTarget>,
    pub(crate) webhook: &'a Webhook,
}

/// Checks every registration against the server's `handler_timeout`, and that no webhook
/// name is used twice.
pub(crate) fn check_all<'a>(
    registered: impl IntoIterator<Item = Registered<'a>>,
    handler_timeout: Duration,
) -> Result<(), AdmissionError> {
    let mut names = HashSet::new();
    for route in registered {
        check(&route, handler_timeout)?;
        if !names.insert(route.webhook.name.as_str()) {
            return Err(refuse(
                &route,
                "this webhook name is used by another route; names must be unique".to_owned(),
            ));
        }
    }
    Ok(())
}

fn refuse(route: &Registered<'_>, reason: String) -> AdmissionError {
    AdmissionError::InvalidWebhook {
        path: route.path.to_owned(),
        webhook: route.webhook.name.clone(),
        reason,
    }
}

fn check(route: &Registered<'_>, handler_timeout: Duration) -> Result<(), AdmissionError> {
    let webhook = route.webhook;
    check_name(&webhook.name).map_err(|reason| refuse(route, reason))?;
    if webhook.rules.is_empty() {
        return Err(refuse(
            route,
            "it has no rules, so the API server would send it nothing".to_owned(),
        ));
    }
    for (index, rule) in webhook.rules.iter().enumerate() {
        let empty = [
            ("operations", rule.operations.is_empty()),
            ("apiGroups", rule.api_groups.is_empty()),
            ("apiVersions", rule.api_versions.is_empty()),
            ("resources", rule.resources.is_empty()),
        ];
        if let Some((field, _)) = empty.iter().find(|(_, empty)| *empty) {
            return Err(refuse(
                route,
                format!("rules[{index}].{field} is empty; list at least one (or \"*\")"),
            ));
        }
        if rule.resources.iter().any(String::is_empty) {
            return Err(refuse(
                route,
                format!("rules[{index}].resources holds an empty name"),
            ));
        }
        if let Some(target) = route.target {
            check_typed_rule(index, rule, target).map_err(|reason| refuse(route, reason))?;
        }
    }
    if !(1..=MAX_TIMEOUT_SECONDS).contains(&webhook.timeout_seconds) {
        return Err(refuse(
            route,
            format!(
                "timeoutSeconds is {}; the API server accepts 1 to {MAX_TIMEOUT_SECONDS}",
                webhook.timeout_seconds
            ),
        ));
    }
    let timeout = Duration::from_secs(u64::try_from(webhook.timeout_seconds).unwrap_or(0));
    if timeout <= handler_timeout {
        return Err(refuse(
            route,
            format!(
                "timeoutSeconds is {}, not longer than the server's handler_timeout of {:?}: the \
                 API server would give up before the server answers a slow or failed handler \
                 (and its OnHandlerError answer would be lost); raise timeoutSeconds or lower \
                 AdmissionServerConfig::handler_timeout",
                webhook.timeout_seconds, handler_timeout
            ),
        ));
    }
    for (field, selector) in [
        ("namespaceSelector", &webhook.namespace_selector),
        ("objectSelector", &webhook.object_selector),
    ] {
        if let Some(selector) = selector {
            check_selector(selector)
                .map_err(|reason| refuse(route, format!("{field}.{reason}")))?;
        }
    }
    if route.kind == RouteKind::Validate && webhook.reinvocation_policy.is_some() {
        return Err(refuse(
            route,
            "reinvocationPolicy is set, but it only exists for mutating webhooks and this route \
             is validating"
                .to_owned(),
        ));
    }
    Ok(())
}

/// A typed route's rule may only cover its own resource (or a subresource carrying it), in its
/// version and scope: any other request would reach the route and be denied as not a `K`.
fn check_typed_rule(index: usize, rule: &Rule, target: &TypedTarget) -> Result<(), String> {
    let reads = target.describe();
    if let Some(group) = rule.api_groups.iter().find(|g| **g != target.group) {
        return Err(format!(
            "rules[{index}].apiGroups holds {group:?}, but the route reads {reads} objects (API \
             group {:?}) and would deny every other object sent to it; list only {:?}",
            target.group, target.group
        ));
    }
    if let Some(version) = rule.api_versions.iter().find(|v| **v != target.version) {
        return Err(format!(
            "rules[{index}].apiVersions holds {version:?}, but the route reads {reads} objects \
             and would deny requests sent in another version; list only {:?} (matchPolicy \
             Equivalent converts requests made through other versions)",
            target.version
        ));
    }
    let covers_target = |resource: &str| match resource.split_once('/') {
        None => resource == target.plural,
        Some((parent, sub)) => parent == target.plural && TYPED_SUBRESOURCES.contains(&sub),
    };
    if let Some(resource) = rule.resources.iter().find(|r| !covers_target(r)) {
        return Err(format!(
            "rules[{index}].resources holds {resource:?}, but the route reads {reads} objects \
             and would deny every other object sent to it; list {:?} or its subresources \
             carrying it ({})",
            target.plural,
            TYPED_SUBRESOURCES
                .map(|sub| format!("{}/{sub}", target.plural))
                .join(", ")
        ));
    }
    if rule.scope != Scope::All && target.scope != Scope::All && rule.scope != target.scope {
        return Err(format!(
            "rules[{index}].scope is {}, but {} objects are {}, so the rule matches none",
            rule.scope.as_str(),
            target.kind,
            target.scope.describe()
        ));
    }
    Ok(())
}

/// The API server's checks of a label selector (`matchLabels` keys and values,
/// `matchExpressions` keys, operators and values); the error starts with the field at fault.
fn check_selector(selector: &LabelSelector) -> Result<(), String> {
    for (key, value) in selector.match_labels.iter().flatten() {
        check_label_key(key)
            .map_err(|reason| format!("matchLabels has the key {key:?}: {reason}"))?;
        check_label_value(value)
            .map_err(|reason| format!("matchLabels[{key:?}] is {value:?}: {reason}"))?;
    }
    for (index, requirement) in selector.match_expressions.iter().flatten().enumerate() {
        let at = format!("matchExpressions[{index}]");
        check_label_key(&requirement.key)
            .map_err(|reason| format!("{at}.key is {:?}: {reason}", requirement.key))?;
        let values = requirement.values.as_deref().unwrap_or_default();
        match requirement.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(format!(
                    "{at}.values is empty; the operator {} needs at least one value",
                    requirement.operator
                ));
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(format!(
                    "{at}.values is set; the operator {} takes no values",
                    requirement.operator
                ));
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => {
                return Err(format!(
                    "{at}.operator is {other:?}; it must be In, NotIn, Exists or DoesNotExist"
                ));
            }
        }
        for value in values {
            check_label_value(value)
                .map_err(|reason| format!("{at}.values holds {value:?}: {reason}"))?;
        }
    }
    Ok(())
}

/// A label name or value: 1 to 63 characters, alphanumeric at both ends, `-`, `_` and `.` in
/// between.
fn is_label_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name.
fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !is_dns_subdomain(prefix)
    {
        return Err(
            "its prefix (before '/') must be a lowercase DNS subdomain of at most 253 characters"
                .to_owned(),
        );
    }
    if !is_label_name(name) {
        return Err(
            "its name must be 1 to 63 characters of A-Z, a-z, 0-9, '-', '_' and '.', \
             alphanumeric at both ends"
                .to_owned(),
        );
    }
    Ok(())
}

/// A label value: empty, or like a label name.
fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_label_name(value) {
        Ok(())
    } else {
        Err(
            "a label value must be empty or 1 to 63 characters of A-Z, a-z, 0-9, '-', '_' and \
             '.', alphanumeric at both ends"
                .to_owned(),
        )
    }
}

/// A lowercase DNS subdomain (RFC 1123): at most 253 characters, labels of `a-z`, `0-9` and
/// `-` (not first or last) separated by `.`.
fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// Checks the name of the generated configurations (a DNS subdomain, as object names are) and
/// the Service they call (a name, a namespace, a port in `1..=65535`).
pub(crate) fn check_configuration(
    name: &str,
    service: &ServiceTarget,
) -> Result<(), AdmissionError> {
    let refuse = |reason: String| AdmissionError::InvalidConfiguration {
        name: name.to_owned(),
        reason,
    };
    if !is_dns_subdomain(name) {
        return Err(refuse(
            "the name must be a lowercase DNS subdomain: at most 253 characters, labels of a-z, \
             0-9 and '-' (not first or last) separated by '.'"
                .to_owned(),
        ));
    }
    if service.name.is_empty() || service.namespace.is_empty() {
        return Err(refuse(format!(
            "the Service must have a name and a namespace, not {:?} in {:?}",
            service.name, service.namespace
        )));
    }
    if !(1..=65535).contains(&service.port) {
        return Err(refuse(format!(
            "the Service port is {}; it must be 1 to 65535",
            service.port
        )));
    }
    Ok(())
}

/// The API server's rule for webhook names: a lowercase DNS subdomain (RFC 1123) of at least
/// three labels.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 253 {
        return Err(format!(
            "the name must be 1 to 253 characters long, not {}",
            name.len()
        ));
    }
    let labels: Vec<&str> = name.split('.').collect();
    for label in &labels {
        let valid = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !valid {
            return Err(
                "the name must be a lowercase DNS name: labels of a-z, 0-9 and '-' (not first \
                 or last), 1 to 63 characters, separated by '.'"
                    .to_owned(),
            );
        }
    }
    if labels.len() < 3 {
        return Err(
            "the name must be fully qualified, with at least three labels \
             (pods.webhook.warmcache.io)"
                .to_owned(),
        );
    }
    Ok(())
}

fn client_config(path: &str, service: &ServiceTarget) -> WebhookClientConfig {
    WebhookClientConfig {
        ca_bundle: None,
        service: Some(ServiceReference {
            name: service.name.clone(),
            namespace: service.namespace.clone(),
            path: Some(path.to_owned()),
            port: Some(service.port),
        }),
        url: None,
    }
}

/// The configurations for `registered` (already checked), named `name`.
pub(crate) fn build<'a>(
    name: &str,
    service: &ServiceTarget,
    registered: impl IntoIterator<Item = Registered<'a>>,
) -> WebhookConfigurations {
    let mut validating = Vec::new();
    let mut mutating = Vec::new();
    for route in registered {
        let webhook = route.webhook;
        let rules = Some(webhook.rules.iter().map(Rule::to_k8s).collect());
        match route.kind {
            RouteKind::Validate => validating.push(ValidatingWebhook {
                admission_review_versions: vec!["v1".to_owned()],
                client_config: client_config(route.path, service),
                failure_policy: Some(webhook.failure_policy.as_str().to_owned()),
                match_conditions: None,
                match_policy: Some(webhook.match_policy.as_str().to_owned()),
                name: webhook.name.clone(),
                namespace_selector: webhook.namespace_selector.clone(),
                object_selector: webhook.object_selector.clone(),
                rules,
                side_effects: webhook.side_effects.as_str().to_owned(),
                timeout_seconds: Some(webhook.timeout_seconds),
            }),
            RouteKind::Mutate => mutating.push(MutatingWebhook {
                admission_review_versions: vec!["v1".to_owned()],
                client_config: client_config(route.path, service),
                failure_policy: Some(webhook.failure_policy.as_str().to_owned()),
                match_conditions: None,
                match_policy: Some(webhook.match_policy.as_str().to_owned()),
                name: webhook.name.clone(),
                namespace_selector: webhook.namespace_selector.clone(),
                object_selector: webhook.object_selector.clone(),
                reinvocation_policy: Some(
                    webhook
                        .reinvocation_policy
                        .unwrap_or(ReinvocationPolicy::Never)
                        .as_str()
                        .to_owned(),
                ),
                rules,
                side_effects: webhook.side_effects.as_str().to_owned(),
                timeout_seconds: Some(webhook.timeout_seconds),
            }),
        }
    }
    let metadata = || ObjectMeta {
        name: Some(name.to_owned()),
        ..ObjectMeta::default()
    };
    WebhookConfigurations {
        validating: (!validating.is_empty()).then(|| ValidatingWebhookConfiguration {
            metadata: metadata(),
            webhooks: Some(validating),
        }),
        mutating: (!mutating.is_empty()).then(|| MutatingWebhookConfiguration {
            metadata: metadata(),
            webhooks: Some(mutating),
        }),
    }
}
