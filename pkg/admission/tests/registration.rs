//! Webhook configurations generated from the routes' registrations, their retargeting for
//! tests, and the registrations refused when the router or the configurations are built.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::json;
use warmcache_admission::registration::{
    FailurePolicy, MatchPolicy, ReinvocationPolicy, Rule, Scope, SideEffects,
};
use warmcache_admission::{
    AdmissionError, AdmissionRequest, AdmissionResponse, AdmissionServer, AdmissionServerConfig,
    DynamicObject, Mutation, Operation, Route, ServiceTarget, TlsFiles, TypedRequest, Validation,
    Webhook,
};

/// A server with the default settings (`handler_timeout` 8 s).
fn server() -> AdmissionServer {
    AdmissionServer::new(AdmissionServerConfig::new(TlsFiles::in_dir("/nonexistent")))
}

fn server_with_handler_timeout(timeout: Duration) -> AdmissionServer {
    let mut config = AdmissionServerConfig::new(TlsFiles::in_dir("/nonexistent"));
    config.handler_timeout = timeout;
    AdmissionServer::new(config)
}

fn allow(req: AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    AdmissionResponse::from(&req)
}

fn pods_rule() -> Rule {
    Rule::for_resource::<Pod>([Operation::Create, Operation::Update]).scope(Scope::Namespaced)
}

fn service() -> ServiceTarget {
    ServiceTarget::new("warmcache-system", "warmcache-webhook", 8443)
}

fn selector(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(key.to_owned(), value.to_owned())])),
        match_expressions: None,
    }
}

fn full_server() -> AdmissionServer {
    // `timeoutSeconds: 5` below needs a shorter handler timeout than the default 8 s.
    server_with_handler_timeout(Duration::from_secs(3))
        .route(
            Route::mutating_typed("/mutate-pods", |_: TypedRequest<Pod>| Mutation::Allow).webhook(
                Webhook::new("pods.webhook.warmcache.io")
                    .rule(pods_rule())
                    .failure_policy(FailurePolicy::Ignore)
                    .timeout_seconds(5)
                    .side_effects(SideEffects::NoneOnDryRun)
                    .reinvocation_policy(ReinvocationPolicy::IfNeeded)
                    .match_policy(MatchPolicy::Exact)
                    .namespace_selector(selector("team", "a"))
                    .object_selector(selector("app", "engine")),
            ),
        )
        // Served but not registered: left out of the configurations.
        .route(Route::validating("/debug", allow))
        .route(
            Route::validating_typed("/validate-pods", |_: TypedRequest<Pod>| Validation::Allow)
                .webhook(Webhook::new("v.pods.webhook.warmcache.io").rule(pods_rule())),
        )
        .route(
            Route::validating("/validate-kvcachebackends", allow).webhook(
                Webhook::new("kvcachebackends.worker.gpustack.ai").rule(
                    Rule::new(
                        [Operation::Create, Operation::Update],
                        ["worker.gpustack.ai"],
                        ["v1alpha1"],
                        ["kvcachebackends"],
                    )
                    .scope(Scope::Cluster),
                ),
            ),
        )
}

#[test]
fn configurations_hold_every_registered_route_at_its_path() {
    let generated = full_server()
        .configurations("warmcache", &service())
        .unwrap();
    let mutating = serde_json::to_value(generated.mutating.unwrap()).unwrap();
    assert_eq!(
        mutating,
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "warmcache"},
            "webhooks": [{
                "name": "pods.webhook.warmcache.io",
                "admissionReviewVersions": ["v1"],
                "clientConfig": {"service": {"namespace": "warmcache-system",
                    "name": "warmcache-webhook", "path": "/mutate-pods", "port": 8443}},
                "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""],
                           "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
                "failurePolicy": "Ignore",
                "matchPolicy": "Exact",
                "namespaceSelector": {"matchLabels": {"team": "a"}},
                "objectSelector": {"matchLabels": {"app": "engine"}},
                "reinvocationPolicy": "IfNeeded",
                "sideEffects": "NoneOnDryRun",
                "timeoutSeconds": 5,
            }],
        })
    );
    let validating = serde_json::to_value(generated.validating.unwrap()).unwrap();
    assert_eq!(validating["kind"], "ValidatingWebhookConfiguration");
    assert_eq!(validating["metadata"]["name"], "warmcache");
    let webhooks = validating["webhooks"].as_array().unwrap();
    assert_eq!(webhooks.len(), 2, "{validating}");
    // Route order; defaults written out; no caBundle, no url, no reinvocationPolicy.
    assert_eq!(
        webhooks[0],
        json!({
            "name": "v.pods.webhook.warmcache.io",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {"namespace": "warmcache-system",
                "name": "warmcache-webhook", "path": "/validate-pods", "port": 8443}},
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""],
                       "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "sideEffects": "None",
            "timeoutSeconds": 10,
        })
    );
    assert_eq!(webhooks[1]["name"], "kvcachebackends.worker.gpustack.ai");
    assert_eq!(
        webhooks[1]["clientConfig"]["service"]["path"],
        "/validate-kvcachebackends"
    );
    assert_eq!(webhooks[1]["rules"][0]["scope"], "Cluster");
    // Pure: the same server gives the same objects.
    assert_eq!(
        full_server()
            .configurations("warmcache", &service())
            .unwrap(),
        full_server()
            .configurations("warmcache", &service())
            .unwrap()
    );
}

#[test]
fn a_server_without_registered_routes_of_a_kind_has_no_configuration_of_it() {
    let generated = server()
        .route(Route::validating("/v", allow))
        .configurations("x", &service())
        .unwrap();
    assert!(generated.validating.is_none() && generated.mutating.is_none());
    let generated = server()
        .route(Route::mutating("/m", allow).webhook(Webhook::new("m.x.io").rule(pods_rule())))
        .configurations("x", &service())
        .unwrap();
    assert!(generated.validating.is_none());
    let mutating = generated.mutating.unwrap();
    // The default reinvocation policy is written out.
    assert_eq!(
        mutating.webhooks.unwrap()[0].reinvocation_policy.as_deref(),
        Some("Never")
    );
}

#[test]
fn with_url_points_every_webhook_at_a_base_url_and_ca() {
    let generated = full_server()
        .configurations("warmcache", &service())
        .unwrap()
        .with_url("https://127.0.0.1:9443/", b"-----BEGIN CERTIFICATE-----\n");
    let mutating = serde_json::to_value(generated.mutating.clone().unwrap()).unwrap();
    let config = &mutating["webhooks"][0]["clientConfig"];
    assert_eq!(config["url"], "https://127.0.0.1:9443/mutate-pods");
    assert!(config.get("service").is_none(), "{config}");
    // k8s-openapi's ByteString is base64 in JSON.
    assert_eq!(
        config["caBundle"],
        "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="
    );
    let validating = serde_json::to_value(generated.validating.clone().unwrap()).unwrap();
    let urls: Vec<&str> = validating["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["clientConfig"]["url"].as_str().unwrap())
        .collect();
    assert_eq!(
        urls,
        [
            "https://127.0.0.1:9443/validate-pods",
            "https://127.0.0.1:9443/validate-kvcachebackends"
        ]
    );
    // Retargeting again keeps the paths.
    let again = generated.with_url("https://10.0.0.1", b"other");
    let mutating = again.mutating.unwrap();
    assert_eq!(
        mutating.webhooks.unwrap()[0].client_config.url.as_deref(),
        Some("https://10.0.0.1/mutate-pods")
    );
}

fn refused(server: AdmissionServer) -> String {
    let from_router = server.router().map(drop).unwrap_err();
    let from_configurations = server
        .configurations("x", &service())
        .map(drop)
        .unwrap_err();
    assert_eq!(from_router.to_string(), from_configurations.to_string());
    assert!(
        matches!(from_router, AdmissionError::InvalidWebhook { .. }),
        "{from_router:?}"
    );
    from_router.to_string()
}

#[test]
fn invalid_registrations_are_refused_when_the_server_is_built() {
    let with = |webhook: Webhook| server().route(Route::validating("/v", allow).webhook(webhook));
    let ok = || Webhook::new("v.webhook.warmcache.io").rule(pods_rule());

    let err = refused(with(ok().timeout_seconds(0)));
    assert!(
        err.contains("\"/v\"") && err.contains("\"v.webhook.warmcache.io\""),
        "{err}"
    );
    assert!(
        err.contains("timeoutSeconds is 0; the API server accepts 1 to 30"),
        "{err}"
    );
    let err = refused(with(ok().timeout_seconds(31)));
    assert!(err.contains("timeoutSeconds is 31"), "{err}");
    assert!(with(ok().timeout_seconds(30)).router().is_ok());
    // 1 s is valid for the API server, but not above the default handler timeout (below).
    let short = server_with_handler_timeout(Duration::from_millis(500))
        .route(Route::validating("/v", allow).webhook(ok().timeout_seconds(1)));
    assert!(short.router().is_ok());

    let err = refused(with(Webhook::new("v.webhook.warmcache.io")));
    assert!(err.contains("no rules"), "{err}");
    let empty_resources = Rule::new([Operation::Create], [""], ["v1"], Vec::<String>::new());
    let err = refused(with(ok().rule(empty_resources)));
    assert!(err.contains("rules[1].resources is empty"), "{err}");
    let no_operations = Rule::new([], [""], ["v1"], ["pods"]);
    let err = refused(with(
        Webhook::new("v.webhook.warmcache.io").rule(no_operations),
    ));
    assert!(err.contains("rules[0].operations is empty"), "{err}");

    // Mutating-only settings on a validating route.
    let err = refused(with(ok().reinvocation_policy(ReinvocationPolicy::Never)));
    assert!(
        err.contains("reinvocationPolicy") && err.contains("validating"),
        "{err}"
    );

    for name in [
        "webhook.io",
        "Pods.webhook.io",
        "pods..webhook.io",
        "-a.b.c",
        "a_b.c.d",
        "",
    ] {
        let err = refused(with(Webhook::new(name).rule(pods_rule())));
        assert!(err.contains(&format!("{name:?}")), "{err}");
    }

    // Two routes registering the same name, even of different kinds.
    let err = refused(
        server()
            .route(Route::validating("/a", allow).webhook(ok()))
            .route(Route::mutating("/b", allow).webhook(ok())),
    );
    assert!(
        err.contains("\"/b\"") && err.contains("used by another route"),
        "{err}"
    );
}

#[tokio::test]
async fn serve_refuses_an_invalid_registration_before_listening() {
    let server = server()
        .route(Route::validating("/v", allow).webhook(Webhook::new("v.webhook.warmcache.io")));
    // The TLS files do not exist, but the registration is checked first.
    let err = server
        .serve(
            std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            tokio_util::sync::CancellationToken::new(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, AdmissionError::InvalidWebhook { .. }),
        "{err}"
    );
}

#[test]
fn a_timeout_not_longer_than_the_handler_timeout_is_refused() {
    let with = |server: AdmissionServer, seconds: i32| {
        server.route(
            Route::validating("/v", allow).webhook(
                Webhook::new("v.webhook.warmcache.io")
                    .rule(pods_rule())
                    .timeout_seconds(seconds),
            ),
        )
    };
    // The default handler timeout is 8 s: the API server would give up first at 8 s or less.
    for seconds in [1, 5, 8] {
        let err = refused(with(server(), seconds));
        assert!(
            err.contains(&format!(
                "timeoutSeconds is {seconds}, not longer than the server's handler_timeout of 8s"
            )),
            "{err}"
        );
    }
    assert!(with(server(), 9).router().is_ok());
    // The kvcache-operator's registration: 10 s with the default handler timeout.
    assert!(with(server(), 10).configurations("x", &service()).is_ok());
    // A handler timeout that is not a whole number of seconds.
    let err = refused(with(
        server_with_handler_timeout(Duration::from_millis(9500)),
        9,
    ));
    assert!(err.contains("handler_timeout of 9.5s"), "{err}");
    assert!(
        with(server_with_handler_timeout(Duration::from_millis(9500)), 10)
            .router()
            .is_ok()
    );
}

/// A typed `Pod` route may only be registered for pods: a rule also covering another resource
/// would send it objects it denies as not a `Pod`.
#[test]
fn a_typed_route_rule_must_cover_only_its_type() {
    let typed = |rule: Rule| {
        server().route(
            Route::mutating_typed("/m", |_: TypedRequest<Pod>| Mutation::Allow)
                .webhook(Webhook::new("m.webhook.warmcache.io").rule(rule)),
        )
    };
    let create = [Operation::Create];
    for (rule, needle) in [
        (
            Rule::new(
                create.clone(),
                ["", "apps"],
                ["v1"],
                ["pods", "deployments"],
            ),
            "rules[0].apiGroups holds \"apps\", but the route reads v1/Pod objects",
        ),
        (
            Rule::new(create.clone(), [""], ["v1"], ["pods", "deployments"]),
            "rules[0].resources holds \"deployments\"",
        ),
        (
            Rule::new(create.clone(), ["*"], ["v1"], ["pods"]),
            "rules[0].apiGroups holds \"*\"",
        ),
        (
            Rule::new(create.clone(), [""], ["*"], ["pods"]),
            "rules[0].apiVersions holds \"*\"",
        ),
        (
            Rule::new(create.clone(), [""], ["v1"], ["*"]),
            "rules[0].resources holds \"*\"",
        ),
        (
            Rule::new(create.clone(), [""], ["v1"], ["pods/*"]),
            "rules[0].resources holds \"pods/*\"",
        ),
        (
            Rule::new(create.clone(), [""], ["v1"], ["pods/eviction"]),
            "rules[0].resources holds \"pods/eviction\"",
        ),
        (
            Rule::for_resource::<Pod>(create.clone()).scope(Scope::Cluster),
            "rules[0].scope is Cluster, but Pod objects are namespaced",
        ),
    ] {
        let err = refused(typed(rule));
        assert!(err.contains(needle), "{needle}: {err}");
    }
    // Its own resource, subresources carrying it, any scope or its own.
    for rule in [
        Rule::for_resource::<Pod>(create.clone()),
        Rule::new(
            create.clone(),
            [""],
            ["v1"],
            ["pods", "pods/status", "pods/ephemeralcontainers"],
        ),
        Rule::for_resource::<Pod>(create.clone()).scope(Scope::All),
    ] {
        assert!(typed(rule.clone()).router().is_ok(), "{rule:?}");
    }
    // A second rule is checked too, and on validating typed routes.
    let err = refused(
        server().route(
            Route::validating_typed("/v", |_: TypedRequest<Pod>| Validation::Allow).webhook(
                Webhook::new("v.webhook.warmcache.io")
                    .rule(pods_rule())
                    .rule(Rule::new(create.clone(), ["apps"], ["v1"], ["deployments"])),
            ),
        ),
    );
    assert!(err.contains("rules[1].apiGroups holds \"apps\""), "{err}");
    // Dynamic routes read any object: the same rule is theirs to choose.
    assert!(
        server()
            .route(Route::validating("/v", allow).webhook(
                Webhook::new("v.webhook.warmcache.io").rule(Rule::new(
                    create,
                    ["", "apps"],
                    ["v1"],
                    ["pods", "deployments"]
                ))
            ))
            .router()
            .is_ok()
    );
}

#[test]
fn rules_for_a_resource_take_its_scope() {
    use k8s_openapi::api::core::v1::Namespace;
    let rule = |rule: Rule| {
        let generated = server()
            .route(
                Route::validating("/v", allow)
                    .webhook(Webhook::new("v.webhook.warmcache.io").rule(rule)),
            )
            .configurations("x", &service())
            .unwrap();
        serde_json::to_value(&generated.validating.unwrap().webhooks.unwrap()[0].rules).unwrap()
    };
    assert_eq!(
        rule(Rule::for_resource::<Pod>([Operation::Create])),
        json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                "resources": ["pods"], "scope": "Namespaced"}])
    );
    assert_eq!(
        rule(Rule::for_resource::<Namespace>([Operation::Create]))[0]["scope"],
        "Cluster"
    );
    // An explicit scope still wins.
    assert_eq!(
        rule(Rule::for_resource::<Pod>([Operation::Create]).scope(Scope::All))[0]["scope"],
        "*"
    );
}

#[test]
fn invalid_label_selectors_are_refused() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    let expression = |key: &str, operator: &str, values: Option<Vec<&str>>| LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: values.map(|v| v.into_iter().map(String::from).collect()),
        }]),
    };
    let with = |selector: LabelSelector, object: bool| {
        let webhook = Webhook::new("v.webhook.warmcache.io").rule(pods_rule());
        let webhook = if object {
            webhook.object_selector(selector)
        } else {
            webhook.namespace_selector(selector)
        };
        server().route(Route::validating("/v", allow).webhook(webhook))
    };
    for (selector, needle) in [
        (
            expression("team", "Equals", Some(vec!["a"])),
            "namespaceSelector.matchExpressions[0].operator is \"Equals\"; it must be In, NotIn, Exists or DoesNotExist",
        ),
        (
            expression("team", "In", None),
            "namespaceSelector.matchExpressions[0].values is empty; the operator In needs",
        ),
        (
            expression("team", "NotIn", Some(vec![])),
            "matchExpressions[0].values is empty; the operator NotIn needs",
        ),
        (
            expression("team", "Exists", Some(vec!["a"])),
            "matchExpressions[0].values is set; the operator Exists takes no values",
        ),
        (
            expression("team", "DoesNotExist", Some(vec!["a"])),
            "the operator DoesNotExist takes no values",
        ),
        (
            expression("a b", "Exists", None),
            "matchExpressions[0].key is \"a b\": its name must be",
        ),
        (
            expression("Example.com/team", "Exists", None),
            "its prefix (before '/') must be a lowercase DNS subdomain",
        ),
        (
            expression("example.com/", "Exists", None),
            "its name must be 1 to 63 characters",
        ),
        (
            expression("team", "In", Some(vec!["ok", "-bad"])),
            "matchExpressions[0].values holds \"-bad\"",
        ),
        (
            selector("team/x/y", "a"),
            "namespaceSelector.matchLabels has the key \"team/x/y\"",
        ),
        (
            selector(&"k".repeat(64), "a"),
            "its name must be 1 to 63 characters",
        ),
        (
            selector("team", "a b"),
            "namespaceSelector.matchLabels[\"team\"] is \"a b\": a label value must be",
        ),
    ] {
        let err = refused(with(selector, false));
        assert!(err.contains(needle), "{needle}: {err}");
    }
    let err = refused(with(expression("team", "In", None), true));
    assert!(err.contains("objectSelector.matchExpressions[0]"), "{err}");
    for selector in [
        expression("example.com/team", "In", Some(vec!["a", "b-1", ""])),
        expression(
            "kubernetes.io/metadata.name",
            "NotIn",
            Some(vec!["kube-system"]),
        ),
        expression("team", "Exists", None),
        expression("team", "DoesNotExist", Some(vec![])),
        selector("app.kubernetes.io/name", "Engine_1.x"),
        selector("team", ""),
        LabelSelector::default(),
    ] {
        assert!(
            with(selector.clone(), true).router().is_ok(),
            "{selector:?}"
        );
    }
}

#[test]
fn the_configuration_name_and_service_are_checked() {
    let registered = || {
        server().route(
            Route::validating("/v", allow)
                .webhook(Webhook::new("v.webhook.warmcache.io").rule(pods_rule())),
        )
    };
    let invalid = |name: &str, service: ServiceTarget| {
        let err = registered().configurations(name, &service).unwrap_err();
        assert!(
            matches!(err, AdmissionError::InvalidConfiguration { .. }),
            "{err:?}"
        );
        err.to_string()
    };
    for name in [
        "",
        "Warmcache",
        "warm_cache",
        "-warmcache",
        "warmcache.",
        &"a".repeat(254),
    ] {
        let err = invalid(name, service());
        assert!(
            err.contains(&format!("{name:?}")) && err.contains("DNS subdomain"),
            "{err}"
        );
    }
    for port in [0, -1, 65536] {
        let err = invalid(
            "warmcache",
            ServiceTarget::new("warmcache-system", "warmcache-webhook", port),
        );
        assert!(
            err.contains(&format!(
                "the Service port is {port}; it must be 1 to 65535"
            )),
            "{err}"
        );
    }
    let err = invalid("warmcache", ServiceTarget::new("warmcache-system", "", 443));
    assert!(
        err.contains("the Service must have a name and a namespace"),
        "{err}"
    );
    let err = invalid(
        "warmcache",
        ServiceTarget::new("", "warmcache-webhook", 443),
    );
    assert!(
        err.contains("the Service must have a name and a namespace"),
        "{err}"
    );
    for (name, port) in [("warmcache", 1), ("warmcache.webhooks-1", 65535)] {
        assert!(
            registered()
                .configurations(name, &ServiceTarget::new("ns", "svc", port))
                .is_ok()
        );
    }
}
