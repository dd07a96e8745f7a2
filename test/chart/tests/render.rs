//! The chart rendered by the real Helm CLI for every toggle combination the issue names
//! (everything on, everything off, each component alone, cert-manager on and off, CRDs off),
//! `helm lint --strict`, and the schema refusing bad values. Every rendered pod passes Pod
//! Security "restricted", no role grants a wildcard, and the generated files (CRDs, catalog,
//! webhook configurations, roles) arrive unchanged apart from what the chart must set.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::sync::OnceLock;

use common::Helm;
use serde_json::Value;
use warmcache_chart_tests::{NAMESPACE, find, key, of_kind, pod_templates};

fn helm() -> &'static Helm {
    static HELM: OnceLock<Helm> = OnceLock::new();
    HELM.get_or_init(|| Helm::new().expect("the helm binary (hack/build-helm.sh)"))
}

const DEPLOYMENTS: [(&str, &str); 5] = [
    ("webhook", "warmcache-webhook"),
    ("bindingController", "warmcache-binding-controller"),
    ("kvcacheOperator", "warmcache-kvcache-operator"),
    ("kvcacheOperator", "warmcache-kvcache-operator-webhook"),
    ("reaper", "warmcache-reaper"),
];

/// The node agent's DaemonSet (off by default: only block storage needs it).
const AGENT: &str = "warmcache-model-volume-controller";

/// Every component toggle and the `app.kubernetes.io/component` of its accounts and roles.
const COMPONENTS: [(&str, &str); 5] = [
    ("webhook", "webhook"),
    ("bindingController", "binding-controller"),
    ("kvcacheOperator", "kvcache-operator"),
    ("reaper", "reaper"),
    ("modelVolumeController", "model-volume-controller"),
];

/// The one container that may break Pod Security "restricted" (`DaemonSet/<ns>/<name>`,
/// container), and why: the node agent runs as root (the staged trees it copies keep their
/// owners), privileged (the `Bidirectional` propagation of its bind root requires it; the API
/// server refuses `Bidirectional` in an unprivileged container) and mounts two hostPaths (the
/// kubelet root and the bind root). docs/install.md documents that its namespace needs the
/// "privileged" level; `assert_agent_exception` checks it deviates in exactly these ways.
const RESTRICTED_EXCEPTION: (&str, &str) = (
    "DaemonSet/warmcache-system/warmcache-model-volume-controller",
    "model-volume-controller",
);

fn names(objects: &[Value], kind: &str) -> BTreeSet<String> {
    of_kind(objects, kind)
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{pointer} in {v}"))
}

/// Pod Security "restricted" (v1.30 rules), checked on a pod template. The node agent's pod is
/// the documented exception ([`RESTRICTED_EXCEPTION`]), checked by [`assert_agent_exception`].
fn assert_restricted(what: &str, template: &Value) {
    if what == RESTRICTED_EXCEPTION.0 {
        assert_agent_exception(template);
        return;
    }
    let spec = &template["spec"];
    for forbidden in ["hostNetwork", "hostPID", "hostIPC"] {
        assert_ne!(
            spec.get(forbidden),
            Some(&Value::Bool(true)),
            "{what}: {forbidden}"
        );
    }
    for volume in spec["volumes"].as_array().into_iter().flatten() {
        assert!(volume.get("hostPath").is_none(), "{what}: hostPath volume");
    }
    let pod = &spec["securityContext"];
    assert_eq!(pod["runAsNonRoot"], true, "{what}: runAsNonRoot");
    assert_eq!(
        pod["seccompProfile"]["type"], "RuntimeDefault",
        "{what}: seccomp"
    );
    let containers: Vec<&Value> = ["initContainers", "containers"]
        .iter()
        .flat_map(|k| spec[*k].as_array().into_iter().flatten())
        .collect();
    assert!(!containers.is_empty(), "{what}: no containers");
    for c in containers {
        let name = c["name"].as_str().unwrap_or("?");
        let sc = &c["securityContext"];
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{what}/{name}");
        assert_ne!(
            sc.get("privileged"),
            Some(&Value::Bool(true)),
            "{what}/{name}"
        );
        assert_eq!(
            sc["capabilities"]["drop"],
            serde_json::json!(["ALL"]),
            "{what}/{name}"
        );
        assert!(
            sc["capabilities"].get("add").is_none(),
            "{what}/{name}: adds capabilities"
        );
        assert_ne!(
            sc.get("runAsUser"),
            Some(&Value::from(0)),
            "{what}/{name}: root"
        );
        assert!(
            c.pointer("/resources/limits/memory").is_some(),
            "{what}/{name}: memory limit"
        );
        assert!(
            c.pointer("/resources/requests/cpu").is_some(),
            "{what}/{name}: cpu request"
        );
        for port in c["ports"].as_array().into_iter().flatten() {
            assert!(port.get("hostPort").is_none(), "{what}/{name}: hostPort");
        }
    }
}

/// The node agent's pod breaks "restricted" in exactly the documented ways and no other: one
/// container, root and privileged, the two hostPaths mounted at their own paths with the
/// propagation each needs; no host namespaces, no host ports, no added capabilities, a
/// read-only root file system, requests and a memory limit.
fn assert_agent_exception(template: &Value) {
    let what = RESTRICTED_EXCEPTION.0;
    let spec = &template["spec"];
    for forbidden in ["hostNetwork", "hostPID", "hostIPC"] {
        assert_ne!(
            spec.get(forbidden),
            Some(&Value::Bool(true)),
            "{what}: {forbidden}"
        );
    }
    assert!(
        spec.get("initContainers").is_none(),
        "{what}: init containers"
    );
    let containers = spec["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "{what}: one container");
    let c = &containers[0];
    assert_eq!(c["name"], RESTRICTED_EXCEPTION.1, "{what}");
    let sc = &c["securityContext"];
    assert_eq!(
        sc["privileged"], true,
        "{what}: Bidirectional needs privileged"
    );
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{what}");
    assert!(sc.get("capabilities").is_none(), "{what}: {sc}");
    assert_eq!(spec["securityContext"]["runAsUser"], 0, "{what}: root");
    assert_eq!(
        spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
        "{what}"
    );
    assert!(c.pointer("/resources/limits/memory").is_some(), "{what}");
    assert!(c.pointer("/resources/requests/cpu").is_some(), "{what}");
    for port in c["ports"].as_array().into_iter().flatten() {
        assert!(port.get("hostPort").is_none(), "{what}: hostPort");
    }
    // Exactly two volumes, both hostPaths, each mounted at its own host path.
    let volumes = spec["volumes"].as_array().unwrap();
    assert_eq!(volumes.len(), 2, "{what}: {volumes:?}");
    let mounts = c["volumeMounts"].as_array().unwrap();
    assert_eq!(mounts.len(), 2, "{what}: {mounts:?}");
    let mut propagations = BTreeSet::new();
    for mount in mounts {
        let volume = volumes
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap_or_else(|| panic!("{what}: {mount}"));
        assert_eq!(
            volume["hostPath"]["path"], mount["mountPath"],
            "{what}: a hostPath is mounted at its own path"
        );
        assert!(mount.get("readOnly").is_none(), "{what}: {mount}");
        propagations.insert(format!(
            "{}={}",
            mount["name"].as_str().unwrap(),
            mount["mountPropagation"].as_str().unwrap()
        ));
    }
    assert_eq!(
        propagations,
        BTreeSet::from([
            "bind-root=Bidirectional".to_owned(),
            "kubelet-root=HostToContainer".to_owned(),
        ]),
        "{what}"
    );
}

/// No role grants a wildcard or an escalating verb, and every binding names a rendered role
/// and a rendered ServiceAccount.
fn assert_least_privilege(objects: &[Value]) {
    for role in of_kind(objects, "ClusterRole")
        .into_iter()
        .chain(of_kind(objects, "Role"))
    {
        for rule in role["rules"].as_array().unwrap() {
            for field in ["apiGroups", "resources", "verbs", "resourceNames"] {
                for item in rule[field].as_array().into_iter().flatten() {
                    assert_ne!(item, "*", "{}: {field} wildcard", key(role));
                }
            }
            for verb in rule["verbs"].as_array().unwrap() {
                assert!(
                    warmcache_kube::rbac::VERBS.contains(&verb.as_str().unwrap()),
                    "{}: verb {verb}",
                    key(role)
                );
            }
            assert!(rule.get("nonResourceURLs").is_none(), "{}", key(role));
        }
    }
    let accounts = names(objects, "ServiceAccount");
    for kind in ["ClusterRoleBinding", "RoleBinding"] {
        for binding in of_kind(objects, kind) {
            let role_kind = str_at(binding, "/roleRef/kind");
            let role_name = str_at(binding, "/roleRef/name");
            let role = of_kind(objects, role_kind).into_iter().find(|r| {
                r["metadata"]["name"] == role_name
                    && r["metadata"].get("namespace") == binding["metadata"].get("namespace")
            });
            assert!(
                role.is_some(),
                "{}: names {role_kind} {role_name}",
                key(binding)
            );
            // A component's role is bound to its own account only.
            let component = binding["metadata"]["labels"]["app.kubernetes.io/component"]
                .as_str()
                .unwrap();
            assert_eq!(
                role.unwrap()["metadata"]["labels"]["app.kubernetes.io/component"],
                component,
                "{}",
                key(binding)
            );
            let subjects = binding["subjects"].as_array().unwrap();
            assert_eq!(subjects.len(), 1, "{}", key(binding));
            assert_eq!(
                subjects[0]["name"],
                format!("warmcache-{component}"),
                "{}",
                key(binding)
            );
            for subject in subjects {
                assert_eq!(subject["kind"], "ServiceAccount", "{}", key(binding));
                assert_eq!(subject["namespace"], NAMESPACE, "{}", key(binding));
                assert!(
                    accounts.contains(str_at(subject, "/name")),
                    "{}",
                    key(binding)
                );
            }
        }
    }
}

fn assert_common(objects: &[Value]) {
    for (what, template) in pod_templates(objects) {
        assert_restricted(&what, template);
    }
    assert_least_privilege(objects);
    let keys: Vec<String> = objects.iter().map(key).collect();
    let unique: BTreeSet<&String> = keys.iter().collect();
    assert_eq!(
        unique.len(),
        keys.len(),
        "an object rendered twice: {keys:?}"
    );
    for object in objects {
        let labels = &object["metadata"]["labels"];
        assert_eq!(
            labels["app.kubernetes.io/managed-by"],
            "Helm",
            "{}",
            key(object)
        );
        assert_eq!(
            labels["app.kubernetes.io/instance"],
            "warmcache",
            "{}",
            key(object)
        );
    }
}

#[test]
fn defaults_render_every_component_restricted_and_least_privileged() {
    let objects = helm().template(&[]).unwrap();
    assert_common(&objects);
    let deployments = names(&objects, "Deployment");
    for (_, name) in DEPLOYMENTS {
        assert!(deployments.contains(name), "{deployments:?}");
    }
    // The node agent is off by default (only block storage needs it): no DaemonSet, nothing
    // privileged, no hostPath anywhere.
    assert!(
        of_kind(&objects, "DaemonSet").is_empty(),
        "{:?}",
        names(&objects, "DaemonSet")
    );
    for (what, template) in pod_templates(&objects) {
        for volume in template["spec"]["volumes"].as_array().into_iter().flatten() {
            assert!(
                volume.get("hostPath").is_none(),
                "{what}: hostPath {volume}"
            );
        }
    }
    // The reaper: one leader-elected replica, POD_NAME and POD_NAMESPACE for its Lease, the
    // admin port's probes, the documented defaults of its rules.
    let reaper = find(&objects, "Deployment", "warmcache-reaper").unwrap();
    assert_eq!(reaper["spec"]["replicas"], 1);
    let container = &reaper["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        reaper["spec"]["template"]["spec"]["serviceAccountName"],
        "warmcache-reaper"
    );
    assert_eq!(
        container["command"],
        serde_json::json!(["/usr/local/bin/reaper"])
    );
    assert_eq!(
        container["args"],
        serde_json::json!([
            "run",
            "--interval=10m",
            "--control-namespace=nvca-modelcache-init",
            "--idle-period=1h",
            "--retention=168h",
            "--abandon-after=15m",
            "--orphan-claim-after=10m",
            "--retiring-grace=1m",
            "--kube-api-qps=20",
            "--kube-api-burst=40",
        ])
    );
    let env = container["env"].as_array().unwrap();
    for (name, path) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        assert!(
            env.iter()
                .any(|e| e["name"] == name && e["valueFrom"]["fieldRef"]["fieldPath"] == path),
            "{name}: {env:?}"
        );
    }
    assert_eq!(container["ports"][0]["containerPort"], 8080);
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/livez");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    // One ServiceAccount per component with API calls; the KVCacheBackend webhook has none
    // and mounts no token.
    assert_eq!(
        names(&objects, "ServiceAccount"),
        BTreeSet::from([
            "warmcache-binding-controller".to_owned(),
            "warmcache-kvcache-operator".to_owned(),
            "warmcache-reaper".to_owned(),
            "warmcache-uninstall-hook".to_owned(),
            "warmcache-webhook".to_owned(),
        ])
    );
    let kv_webhook = find(&objects, "Deployment", "warmcache-kvcache-operator-webhook").unwrap();
    assert_eq!(
        kv_webhook["spec"]["template"]["spec"]["automountServiceAccountToken"],
        false
    );
    // The control namespace, enforcing restricted.
    let control = find(&objects, "Namespace", "nvca-modelcache-init").unwrap();
    assert_eq!(
        control["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    // The webhook has a PodDisruptionBudget; the controllers are leader-elected singletons.
    assert!(find(&objects, "PodDisruptionBudget", "warmcache-webhook").is_some());
    // No StorageClass unless asked for.
    assert!(of_kind(&objects, "StorageClass").is_empty());
}

fn normalized(v: &Value) -> Value {
    match v {
        Value::Number(n) => n.as_f64().map(Value::from).unwrap_or(Value::Null),
        Value::Array(items) => Value::Array(items.iter().map(normalized).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), normalized(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[test]
fn the_generated_files_arrive_unchanged() {
    let objects = helm().template(&[]).unwrap();
    let root = warmcache_testkit::chart_dir().join("../..");
    // CRDs: the generated schema, plus the keep annotation.
    for crd in of_kind(&objects, "CustomResourceDefinition") {
        let name = str_at(crd, "/metadata/name");
        let file = root.join(format!(
            "config/crd/{}_{}.yaml",
            str_at(crd, "/spec/group"),
            str_at(crd, "/spec/names/plural")
        ));
        let generated =
            warmcache_cli::yaml::one_object(&std::fs::read_to_string(&file).unwrap()).unwrap();
        // Helm reads YAML numbers as floats: compare them as numbers (schemars writes some
        // minimums as 0.0, Helm prints them as 0).
        assert!(
            normalized(&crd["spec"]) == normalized(&generated["spec"]),
            "{name}: the rendered CRD differs from {}",
            file.display()
        );
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
            "{name}"
        );
    }
    assert_eq!(of_kind(&objects, "CustomResourceDefinition").len(), 2);
    // The catalog: its data byte for byte, in the release namespace.
    let catalog = find(&objects, "ConfigMap", "nvcf-storage-capabilities").unwrap();
    assert_eq!(catalog["metadata"]["namespace"], NAMESPACE);
    let generated = warmcache_cli::yaml::one_object(
        &std::fs::read_to_string(
            root.join("config/catalog/nvcf-storage-capabilities.configmap.yaml"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(catalog["data"], generated["data"]);
    // Roles: every generated role (config/rbac/<component>.<role>.yaml, the node agent's
    // included, so it is on here), with its rules, in its namespace.
    let objects = helm()
        .template(&["modelVolumeController.enabled=true"])
        .unwrap();
    let mut files: Vec<String> = std::fs::read_dir(root.join("config/rbac"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".yaml"))
        .collect();
    files.sort();
    for component in ["reaper", "model-volume-controller"] {
        assert!(
            files
                .iter()
                .any(|f| f.starts_with(&format!("{component}."))),
            "{component}: no generated roles in {files:?}"
        );
    }
    for file in &files {
        let (kind, namespace) = if file.ends_with(".clusterrole.yaml") {
            ("ClusterRole", None)
        } else if file.ends_with(".control-role.yaml") {
            ("Role", Some("nvca-modelcache-init"))
        } else if file.ends_with(".role.yaml") {
            ("Role", Some(NAMESPACE))
        } else {
            panic!("{file}: not a role file name")
        };
        let generated = warmcache_cli::yaml::one_object(
            &std::fs::read_to_string(root.join("config/rbac").join(file)).unwrap(),
        )
        .unwrap();
        let name = str_at(&generated, "/metadata/name");
        let rendered = of_kind(&objects, kind)
            .into_iter()
            .find(|r| {
                r["metadata"]["name"] == name
                    && r["metadata"].get("namespace").and_then(Value::as_str) == namespace
            })
            .unwrap_or_else(|| panic!("{file}: {kind} {name} in {namespace:?}"));
        assert_eq!(rendered["rules"], generated["rules"], "{file}");
    }
}

#[test]
fn webhook_configurations_get_the_namespace_the_exclusions_and_the_ca() {
    let objects = helm()
        .template(&["webhook.excludedNamespaces={batch-jobs,ci}"])
        .unwrap();
    let secret = find(&objects, "Secret", "warmcache-webhook-tls").unwrap();
    assert_eq!(secret["type"], "kubernetes.io/tls");
    let ca = str_at(secret, "/data/ca.crt");
    for key in ["tls.crt", "tls.key"] {
        assert!(!str_at(secret, &format!("/data/{key}")).is_empty());
    }
    let pods = find(
        &objects,
        "MutatingWebhookConfiguration",
        "warmcache-webhook",
    )
    .unwrap();
    let hook = &pods["webhooks"][0];
    assert_eq!(hook["clientConfig"]["caBundle"], ca);
    assert_eq!(hook["clientConfig"]["service"]["namespace"], NAMESPACE);
    assert_eq!(hook["clientConfig"]["service"]["name"], "warmcache-webhook");
    assert!(find(&objects, "Service", "warmcache-webhook").is_some());
    let excluded = hook["namespaceSelector"]["matchExpressions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["key"] == "kubernetes.io/metadata.name")
        .unwrap();
    assert_eq!(excluded["operator"], "NotIn");
    assert_eq!(
        excluded["values"],
        serde_json::json!([
            "kube-system",
            NAMESPACE,
            "nvca-modelcache-init",
            "batch-jobs",
            "ci"
        ])
    );
    // What the code generated stays: failure policy, timeout, reinvocation, side effects.
    assert_eq!(hook["failurePolicy"], "Ignore");
    assert_eq!(hook["timeoutSeconds"], 5);
    assert_eq!(hook["reinvocationPolicy"], "IfNeeded");
    assert_eq!(hook["sideEffects"], "NoneOnDryRun");
    let kv = find(
        &objects,
        "ValidatingWebhookConfiguration",
        "kvcache-operator",
    )
    .unwrap();
    assert_eq!(kv["webhooks"][0]["clientConfig"]["caBundle"], ca);
    assert_eq!(
        kv["webhooks"][0]["clientConfig"]["service"]["namespace"],
        NAMESPACE
    );
    assert!(find(&objects, "Service", "kvcache-operator-webhook").is_some());
    // A second render generates another CA (helm template cannot look the Secret up); an
    // install keeps the first one (the real-install test).
    let again = helm().template(&[]).unwrap();
    let again = find(&again, "Secret", "warmcache-webhook-tls").unwrap();
    assert_ne!(str_at(again, "/data/ca.crt"), ca);
}

#[test]
fn cert_manager_issues_the_certificate_and_injects_the_ca() {
    let objects = helm().template(&["certManager.enabled=true"]).unwrap();
    assert_common(&objects);
    assert!(find(&objects, "Secret", "warmcache-webhook-tls").is_none());
    let certificate = find(&objects, "Certificate", "warmcache-webhook").unwrap();
    assert_eq!(certificate["spec"]["secretName"], "warmcache-webhook-tls");
    let dns: Vec<&str> = certificate["spec"]["dnsNames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        dns.contains(&"warmcache-webhook.warmcache-system.svc"),
        "{dns:?}"
    );
    assert!(
        dns.contains(&"kvcache-operator-webhook.warmcache-system.svc"),
        "{dns:?}"
    );
    assert_eq!(
        certificate["spec"]["issuerRef"]["name"],
        "warmcache-webhook-ca"
    );
    assert!(find(&objects, "Issuer", "warmcache-selfsigned").is_some());
    for (kind, name) in [
        ("MutatingWebhookConfiguration", "warmcache-webhook"),
        ("ValidatingWebhookConfiguration", "kvcache-operator"),
    ] {
        let config = find(&objects, kind, name).unwrap();
        assert_eq!(
            config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            "warmcache-system/warmcache-webhook"
        );
        assert!(
            config["webhooks"][0]["clientConfig"]
                .get("caBundle")
                .is_none()
        );
    }
    // An issuer of the cluster's: no self-signed chain.
    let objects = helm()
        .template(&[
            "certManager.enabled=true",
            "certManager.issuerRef.name=corp-ca",
            "certManager.issuerRef.kind=ClusterIssuer",
        ])
        .unwrap();
    assert!(of_kind(&objects, "Issuer").is_empty());
    let certificate = find(&objects, "Certificate", "warmcache-webhook").unwrap();
    assert_eq!(certificate["spec"]["issuerRef"]["name"], "corp-ca");
    assert_eq!(certificate["spec"]["issuerRef"]["kind"], "ClusterIssuer");
}

fn all_off() -> Vec<&'static str> {
    vec![
        "webhook.enabled=false",
        "bindingController.enabled=false",
        "kvcacheOperator.enabled=false",
        "reaper.enabled=false",
        "modelVolumeController.enabled=false",
        "crds.enabled=false",
        "catalog.enabled=false",
        "controlNamespace.create=false",
        "uninstallHook.enabled=false",
    ]
}

#[test]
fn everything_off_renders_nothing() {
    let objects = helm().template(&all_off()).unwrap();
    assert!(
        objects.is_empty(),
        "{:?}",
        objects.iter().map(key).collect::<Vec<_>>()
    );
}

#[test]
fn each_component_alone_renders_only_its_objects() {
    for (component, label) in COMPONENTS {
        let mut sets: Vec<String> = all_off().into_iter().map(str::to_owned).collect();
        sets.retain(|s| !s.starts_with(&format!("{component}.")));
        // The node agent is off by default: on it must be switched.
        sets.push(format!("{component}.enabled=true"));
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        let objects = helm().template(&sets).unwrap();
        assert_common(&objects);
        let expected: BTreeSet<String> = DEPLOYMENTS
            .iter()
            .filter(|(c, _)| *c == component)
            .map(|(_, name)| (*name).to_owned())
            .collect();
        assert_eq!(names(&objects, "Deployment"), expected, "{component}");
        let daemon_sets: BTreeSet<String> = if component == "modelVolumeController" {
            BTreeSet::from([AGENT.to_owned()])
        } else {
            BTreeSet::new()
        };
        assert_eq!(names(&objects, "DaemonSet"), daemon_sets, "{component}");
        let has_webhook = matches!(component, "webhook" | "kvcacheOperator");
        assert_eq!(
            find(&objects, "Secret", "warmcache-webhook-tls").is_some(),
            has_webhook,
            "{component}"
        );
        assert_eq!(
            find(
                &objects,
                "MutatingWebhookConfiguration",
                "warmcache-webhook"
            )
            .is_some(),
            component == "webhook"
        );
        assert_eq!(
            find(
                &objects,
                "ValidatingWebhookConfiguration",
                "kvcache-operator"
            )
            .is_some(),
            component == "kvcacheOperator"
        );
        // Every role belongs to the component that is on.
        for kind in [
            "ServiceAccount",
            "ClusterRole",
            "Role",
            "ClusterRoleBinding",
            "RoleBinding",
        ] {
            for object in of_kind(&objects, kind) {
                assert_eq!(
                    object["metadata"]["labels"]["app.kubernetes.io/component"],
                    label,
                    "{component}: {}",
                    key(object)
                );
            }
        }
    }
}

#[test]
fn the_reaper_and_the_node_agent_alone_render_exactly_their_objects() {
    let alone = |component: &str| -> BTreeSet<String> {
        let mut sets: Vec<String> = all_off().into_iter().map(str::to_owned).collect();
        sets.retain(|s| !s.starts_with(&format!("{component}.")));
        sets.push(format!("{component}.enabled=true"));
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        helm().template(&sets).unwrap().iter().map(key).collect()
    };
    let control = "nvca-modelcache-init";
    let set = |keys: &[String]| keys.iter().cloned().collect::<BTreeSet<String>>();
    // The reaper: its account, the three generated roles (cluster, its Lease in its own
    // namespace, the control namespace) bound to it, the Deployment and its admin Service.
    assert_eq!(
        alone("reaper"),
        set(&[
            format!("ServiceAccount/{NAMESPACE}/warmcache-reaper"),
            "ClusterRole//warmcache-reaper".to_owned(),
            "ClusterRoleBinding//warmcache-reaper".to_owned(),
            format!("Role/{NAMESPACE}/warmcache-reaper"),
            format!("RoleBinding/{NAMESPACE}/warmcache-reaper"),
            format!("Role/{control}/warmcache-reaper-control"),
            format!("RoleBinding/{control}/warmcache-reaper-control"),
            format!("Deployment/{NAMESPACE}/warmcache-reaper"),
            format!("Service/{NAMESPACE}/warmcache-reaper"),
        ])
    );
    // The node agent: no Lease (one agent per node), so no Role in its own namespace.
    assert_eq!(
        alone("modelVolumeController"),
        set(&[
            format!("ServiceAccount/{NAMESPACE}/{AGENT}"),
            format!("ClusterRole//{AGENT}"),
            format!("ClusterRoleBinding//{AGENT}"),
            format!("Role/{control}/{AGENT}-control"),
            format!("RoleBinding/{control}/{AGENT}-control"),
            format!("DaemonSet/{NAMESPACE}/{AGENT}"),
            format!("Service/{NAMESPACE}/{AGENT}"),
        ])
    );
}

/// The uninstall hook's Job (templates/uninstall-hook.yaml, docs/uninstall.md#the-job).
const HOOK: &str = "warmcache-uninstall-hook";

#[test]
fn the_uninstall_hook_is_a_pre_delete_job_whose_flags_follow_the_values() {
    // Every object of the hook is a pre-delete hook deleted once it succeeded (and replaced by
    // the next run when it failed); the account and its role come first (-20), the Job after.
    let assert_hook = |object: &Value, weight: &str| {
        let annotations = &object["metadata"]["annotations"];
        assert_eq!(annotations["helm.sh/hook"], "pre-delete", "{}", key(object));
        assert_eq!(
            annotations["helm.sh/hook-weight"],
            weight,
            "{}",
            key(object)
        );
        assert_eq!(
            annotations["helm.sh/hook-delete-policy"],
            "before-hook-creation,hook-succeeded",
            "{}",
            key(object)
        );
    };
    let job = |objects: &[Value]| -> Value { find(objects, "Job", HOOK).unwrap().clone() };
    let args = |job: &Value| -> Vec<String> {
        job["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect()
    };

    // Defaults: the backends are the release's (it runs their operator) and the namespace is
    // deleted (the chart created it); the deadline is both timeouts plus 60 s.
    let objects = helm().template(&[]).unwrap();
    for kind in ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"] {
        assert_hook(find(&objects, kind, HOOK).unwrap(), "-20");
    }
    let defaults = job(&objects);
    assert_hook(&defaults, "-10");
    assert_eq!(defaults["spec"]["backoffLimit"], 0);
    assert_eq!(defaults["spec"]["activeDeadlineSeconds"], 120 + 90 + 60);
    let spec = &defaults["spec"]["template"]["spec"];
    assert_eq!(spec["serviceAccountName"], HOOK);
    assert_eq!(spec["restartPolicy"], "Never");
    assert_eq!(
        spec["containers"][0]["command"],
        serde_json::json!(["/usr/local/bin/uninstall-hook"])
    );
    assert_eq!(
        args(&defaults),
        [
            "--control-namespace=nvca-modelcache-init",
            "--kvcache-backends=true",
            "--delete-namespace=true",
            "--backend-timeout=120s",
            "--namespace-timeout=90s",
        ]
    );

    // Other timeouts move the default deadline; --force only when asked for.
    let forced = job(&helm()
        .template(&[
            "uninstallHook.backendTimeoutSeconds=300",
            "uninstallHook.namespaceTimeoutSeconds=45",
            "uninstallHook.force=true",
        ])
        .unwrap());
    assert_eq!(forced["spec"]["activeDeadlineSeconds"], 300 + 45 + 60);
    assert_eq!(
        args(&forced),
        [
            "--control-namespace=nvca-modelcache-init",
            "--kvcache-backends=true",
            "--delete-namespace=true",
            "--backend-timeout=300s",
            "--namespace-timeout=45s",
            "--force",
        ]
    );
    // A deadline given is taken as it is.
    let given = job(&helm()
        .template(&[
            "uninstallHook.activeDeadlineSeconds=250",
            "uninstallHook.backendTimeoutSeconds=300",
        ])
        .unwrap());
    assert_eq!(given["spec"]["activeDeadlineSeconds"], 250);
    assert!(!args(&given).contains(&"--force".to_owned()));

    // Alone (every other toggle off): exactly the hook's account, role, binding and Job, all
    // restricted and least privileged. Without the operator the backends are not the release's,
    // and a namespace the chart did not create is not deleted.
    let mut sets = all_off();
    sets.retain(|s| *s != "uninstallHook.enabled=false");
    let objects = helm().template(&sets).unwrap();
    assert_common(&objects);
    assert_eq!(
        objects.iter().map(key).collect::<BTreeSet<String>>(),
        BTreeSet::from([
            format!("ServiceAccount/{NAMESPACE}/{HOOK}"),
            format!("ClusterRole//{HOOK}"),
            format!("ClusterRoleBinding//{HOOK}"),
            format!("Job/{NAMESPACE}/{HOOK}"),
        ])
    );
    for object in &objects {
        let weight = if object["kind"] == "Job" {
            "-10"
        } else {
            "-20"
        };
        assert_hook(object, weight);
    }
    let alone = job(&objects);
    assert_eq!(
        args(&alone),
        [
            "--control-namespace=nvca-modelcache-init",
            "--kvcache-backends=false",
            "--delete-namespace=false",
            "--backend-timeout=120s",
            "--namespace-timeout=90s",
        ]
    );
}

#[test]
fn the_node_agent_daemon_set_runs_on_every_gpu_node_with_the_hosts_paths() {
    let objects = helm()
        .template(&["modelVolumeController.enabled=true"])
        .unwrap();
    assert_common(&objects);
    let agent = find(&objects, "DaemonSet", AGENT).unwrap();
    let spec = &agent["spec"]["template"]["spec"];
    assert_eq!(spec["serviceAccountName"], AGENT);
    let container = &spec["containers"][0];
    assert_eq!(
        container["command"],
        serde_json::json!(["/usr/local/bin/model-volume-controller"])
    );
    assert_eq!(
        container["args"],
        serde_json::json!([
            "run",
            "--node-name=$(NODE_NAME)",
            "--control-namespace=nvca-modelcache-init",
            "--kubelet-root=/var/lib/kubelet",
            "--bind-root=/var/lib/containerd/nvsnap-models",
            "--holder-image=registry.k8s.io/pause:3.10",
            "--holder-image-pull-policy=IfNotPresent",
            "--min-size-gib=1",
            "--concurrency=2",
            "--kube-api-qps=20",
            "--kube-api-burst=40",
        ])
    );
    // NODE_NAME from the downward API, defined before the argument that expands it.
    let env = container["env"].as_array().unwrap();
    assert_eq!(env[0]["name"], "NODE_NAME");
    assert_eq!(
        env[0]["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    let volumes: Vec<(String, String)> = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["hostPath"]["path"].as_str().unwrap().to_owned(),
                v["hostPath"]["type"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        volumes,
        vec![
            ("/var/lib/kubelet".to_owned(), "Directory".to_owned()),
            (
                "/var/lib/containerd/nvsnap-models".to_owned(),
                "DirectoryOrCreate".to_owned()
            ),
        ]
    );
    // The GPU taint is tolerated by default, so the agent reaches the GPU nodes.
    assert_eq!(
        spec["tolerations"],
        serde_json::json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    );
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/livez");
    assert_eq!(container["ports"][0]["containerPort"], 8080);
    // The metrics Service is headless (every agent pod is scraped).
    let service = find(&objects, "Service", AGENT).unwrap();
    assert_eq!(service["spec"]["clusterIP"], "None");
}

#[test]
fn crds_off_and_not_kept() {
    let objects = helm().template(&["crds.enabled=false"]).unwrap();
    assert!(of_kind(&objects, "CustomResourceDefinition").is_empty());
    let objects = helm().template(&["crds.keep=false"]).unwrap();
    for crd in of_kind(&objects, "CustomResourceDefinition") {
        assert!(
            crd["metadata"]
                .pointer("/annotations/helm.sh~1resource-policy")
                .is_none(),
            "{}",
            key(crd)
        );
    }
}

#[test]
fn the_storage_class_is_retained_and_needs_a_provisioner() {
    let objects = helm()
        .template(&[
            "storageClass.create=true",
            "storageClass.provisioner=csi.weka.io",
            "storageClass.parameters.filesystemName=models",
        ])
        .unwrap();
    let class = find(&objects, "StorageClass", "nvcf-sc").unwrap();
    assert_eq!(class["provisioner"], "csi.weka.io");
    assert_eq!(class["reclaimPolicy"], "Retain");
    assert_eq!(class["parameters"]["filesystemName"], "models");
    let err = helm().template(&["storageClass.create=true"]).unwrap_err();
    assert!(
        err.output().contains("storageClass.provisioner: required"),
        "{err}"
    );
}

#[test]
fn values_reach_the_components() {
    let objects = helm()
        .template(&[
            "webhook.gpuResources={nvidia.com/gpu,amd.com/gpu}",
            "webhook.featureGates=ModelCacheEncryption=true",
            "bindingController.primarySize=2Ti",
            "bindingController.viewMountOptions={noatime}",
            "bindingController.openRootWaitSeconds=120",
            "kvcacheOperator.storeImageUsers={lmcache/=1000}",
            "controlNamespace.name=models-control",
            "otel.endpoint=http://collector:4317",
            "otel.env.OTEL_TRACES_SAMPLER_ARG=0.1",
            "image.repository=registry.example/warmcache",
            "image.tag=1.2.3",
            "reaper.interval=30m",
            "reaper.idlePeriod=7d",
            "reaper.retention=0",
            "reaper.abandonAfter=2h",
            "reaper.orphanClaimAfter=20m",
            "reaper.retiringGrace=90s",
            "reaper.dryRun=true",
            "modelVolumeController.enabled=true",
            "modelVolumeController.kubeletRoot=/data/kubelet",
            "modelVolumeController.bindRoot=/data/binds",
            "modelVolumeController.holderImage=registry.example/pause:3.10",
            "modelVolumeController.holderImagePullPolicy=Never",
            "modelVolumeController.minSizeGiB=20",
            "modelVolumeController.concurrency=3",
            "modelVolumeController.kubeApi.qps=5",
            "modelVolumeController.kubeApi.burst=10",
            "bindingController.kubeApi.qps=100",
            "bindingController.kubeApi.burst=200",
            "kvcacheOperator.kubeApi.qps=0",
            "modelVolumeController.nodeSelector.nvidia\\.com/gpu\\.product=H100",
            "modelVolumeController.extraTolerations[0].key=storage",
            "modelVolumeController.extraTolerations[0].operator=Exists",
            "webhook.compileCacheSets=true",
            "webhook.answerReuseMs=250",
        ])
        .unwrap();
    let args = |name: &str| -> Vec<String> {
        let d = find(&objects, "Deployment", name)
            .or_else(|| find(&objects, "DaemonSet", name))
            .unwrap();
        d["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect()
    };
    let webhook = args("warmcache-webhook");
    for expected in [
        "--gpu-resource=nvidia.com/gpu",
        "--gpu-resource=amd.com/gpu",
        "--feature-gates=ModelCacheEncryption=true",
        "--control-namespace=models-control",
        // The agent is deployed: it collects compile-cache sets.
        "--compile-cache-sets",
        "--answer-reuse-ms=250",
    ] {
        assert!(webhook.contains(&expected.to_owned()), "{webhook:?}");
    }
    // Answers are reused for 1 s unless the values say otherwise; 0 (never) reaches the flag.
    for (values, expected) in [
        (&[][..], "--answer-reuse-ms=1000"),
        (&["webhook.answerReuseMs=0"], "--answer-reuse-ms=0"),
    ] {
        let objects = helm().template(values).unwrap();
        let d = find(&objects, "Deployment", "warmcache-webhook").unwrap();
        let args = &d["spec"]["template"]["spec"]["containers"][0]["args"];
        assert!(
            args.as_array().unwrap().contains(&Value::from(expected)),
            "{values:?}: {args}"
        );
    }
    // Off by default; and without the agent nothing would collect a set, so it stays off.
    for values in [
        &["modelVolumeController.enabled=true"][..],
        &["webhook.compileCacheSets=true"],
    ] {
        let objects = helm().template(values).unwrap();
        let d = find(&objects, "Deployment", "warmcache-webhook").unwrap();
        let args = d["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
        assert!(!args.contains("--compile-cache-sets"), "{values:?}: {args}");
    }
    let controller = args("warmcache-binding-controller");
    for expected in [
        "--primary-size=2Ti",
        "--view-mount-option=noatime",
        "--control-namespace=models-control",
        "--catalog-namespace=warmcache-system",
        // The webhook's gates, so decision drift decides with them.
        "--feature-gates=ModelCacheEncryption=true",
        // The agent is deployed: it opens fresh roots for non-root writers.
        "--node-agent-opens-roots",
        "--open-root-wait-seconds=120",
        // Its own client rate limit.
        "--kube-api-qps=100",
        "--kube-api-burst=200",
    ] {
        assert!(controller.contains(&expected.to_owned()), "{controller:?}");
    }
    // Without the agent, or told not to, writers of root-owned exports stay uid 0.
    for values in [
        &[][..],
        &[
            "modelVolumeController.enabled=true",
            "modelVolumeController.opensWriterRoots=false",
        ],
    ] {
        let objects = helm().template(values).unwrap();
        let d = find(&objects, "Deployment", "warmcache-binding-controller").unwrap();
        let args = d["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
        assert!(
            !args.contains("--node-agent-opens-roots"),
            "{values:?}: {args}"
        );
        assert!(
            !args.contains("--open-root-wait-seconds"),
            "{values:?}: {args}"
        );
    }
    assert!(
        args("warmcache-kvcache-operator").contains(&"--store-image-user=lmcache/=1000".to_owned())
    );
    // qps 0 turns the operator's limit off; its burst keeps the default.
    let operator = args("warmcache-kvcache-operator");
    for expected in ["--kube-api-qps=0", "--kube-api-burst=40"] {
        assert!(operator.contains(&expected.to_owned()), "{operator:?}");
    }
    // The reaper's rules: `retention=0` (an integer on the command line) keeps caches forever.
    assert_eq!(
        args("warmcache-reaper"),
        [
            "run",
            "--interval=30m",
            "--control-namespace=models-control",
            "--idle-period=7d",
            "--retention=0",
            "--abandon-after=2h",
            "--orphan-claim-after=20m",
            "--retiring-grace=90s",
            "--dry-run",
            "--kube-api-qps=20",
            "--kube-api-burst=40",
        ]
    );
    assert_eq!(
        args(AGENT),
        [
            "run",
            "--node-name=$(NODE_NAME)",
            "--control-namespace=models-control",
            "--kubelet-root=/data/kubelet",
            "--bind-root=/data/binds",
            "--holder-image=registry.example/pause:3.10",
            "--holder-image-pull-policy=Never",
            "--min-size-gib=20",
            "--concurrency=3",
            "--kube-api-qps=5",
            "--kube-api-burst=10",
        ]
    );
    let agent = &find(&objects, "DaemonSet", AGENT).unwrap()["spec"]["template"]["spec"];
    assert_eq!(
        agent["nodeSelector"],
        serde_json::json!({"nvidia.com/gpu.product": "H100"})
    );
    // extraTolerations add to the GPU default.
    assert_eq!(
        agent["tolerations"],
        serde_json::json!([
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "storage", "operator": "Exists"},
        ])
    );
    let mounts = &agent["containers"][0]["volumeMounts"];
    assert_eq!(mounts[0]["mountPath"], "/data/kubelet");
    assert_eq!(agent["volumes"][0]["hostPath"]["path"], "/data/kubelet");
    assert_eq!(mounts[1]["mountPath"], "/data/binds");
    assert_eq!(agent["volumes"][1]["hostPath"]["path"], "/data/binds");
    assert_eq!(
        agent["containers"][0]["image"],
        "registry.example/warmcache:1.2.3"
    );
    // The control-namespace Roles follow the name.
    assert!(
        of_kind(&objects, "Role")
            .iter()
            .any(|r| r["metadata"]["namespace"] == "models-control")
    );
    assert!(find(&objects, "Namespace", "models-control").is_some());
    let deployment = find(&objects, "Deployment", "warmcache-webhook").unwrap();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "registry.example/warmcache:1.2.3");
    let env = container["env"].as_array().unwrap();
    assert!(env.iter().any(
        |e| e["name"] == "OTEL_EXPORTER_OTLP_ENDPOINT" && e["value"] == "http://collector:4317"
    ));
    assert!(
        env.iter()
            .any(|e| e["name"] == "OTEL_SERVICE_NAME" && e["value"] == "webhook")
    );
    // The protocol is the only one the components export (grpc), and the extra variables of
    // otel.env reach every component, the uninstall hook's Job included.
    for (kind, name) in [
        ("Deployment", "warmcache-webhook"),
        ("Deployment", "warmcache-reaper"),
        ("DaemonSet", AGENT),
        ("Job", "warmcache-uninstall-hook"),
    ] {
        let workload = find(&objects, kind, name).unwrap();
        let env = workload["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap();
        for (variable, value) in [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.1"),
        ] {
            assert_eq!(
                env.iter().filter(|e| e["name"] == variable).count(),
                1,
                "{name}: {variable} in {env:?}"
            );
            assert!(
                env.iter()
                    .any(|e| e["name"] == variable && e["value"] == value),
                "{name}: {variable}={value} in {env:?}"
            );
        }
    }
}

#[test]
fn every_deployment_and_the_uninstall_hook_take_their_own_scheduling_and_resources() {
    // Values prefix, workload, whether it has replicas. The KVCacheBackend webhook has its own
    // replicas and resources (kvcacheOperator.webhook) and is scheduled like the operator.
    let workloads = [
        ("webhook", "Deployment", "warmcache-webhook", true),
        (
            "bindingController",
            "Deployment",
            "warmcache-binding-controller",
            true,
        ),
        (
            "kvcacheOperator",
            "Deployment",
            "warmcache-kvcache-operator",
            true,
        ),
        (
            "kvcacheOperator.webhook",
            "Deployment",
            "warmcache-kvcache-operator-webhook",
            true,
        ),
        ("reaper", "Deployment", "warmcache-reaper", true),
        ("uninstallHook", "Job", HOOK, false),
    ];
    // Distinctive values per workload: its index in the CPU request, memory limit and replicas,
    // its values prefix in the node selector, toleration and affinity.
    let pool = |prefix: &str| prefix.replace('.', "-").to_lowercase();
    fn scheduled_by(prefix: &str) -> &str {
        if prefix == "kvcacheOperator.webhook" {
            "kvcacheOperator"
        } else {
            prefix
        }
    }
    let mut sets: Vec<String> = Vec::new();
    for (i, (prefix, _, _, replicas)) in workloads.iter().enumerate() {
        sets.push(format!("{prefix}.resources.requests.cpu={}m", 101 + i));
        sets.push(format!("{prefix}.resources.limits.memory={}Mi", 301 + i));
        if *replicas {
            sets.push(format!("{prefix}.replicas={}", 3 + i));
        }
        if scheduled_by(prefix) != *prefix {
            continue;
        }
        let pool = pool(prefix);
        sets.push(format!("{prefix}.nodeSelector.example\\.com/pool={pool}"));
        sets.push(format!("{prefix}.tolerations[0].key=example.com/{pool}"));
        sets.push(format!("{prefix}.tolerations[0].operator=Exists"));
        sets.push(format!("{prefix}.tolerations[0].effect=NoSchedule"));
        let term = format!(
            "{prefix}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution\
             .nodeSelectorTerms[0].matchExpressions[0]"
        );
        sets.push(format!("{term}.key=example.com/zone"));
        sets.push(format!("{term}.operator=In"));
        sets.push(format!("{term}.values[0]={pool}"));
    }
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let objects = helm().template(&sets).unwrap();
    assert_common(&objects);
    for (i, (prefix, kind, name, replicas)) in workloads.iter().enumerate() {
        let workload = find(&objects, kind, name).unwrap_or_else(|| panic!("{kind} {name}"));
        if *replicas {
            assert_eq!(workload["spec"]["replicas"], 3 + i, "{name}");
        }
        let spec = &workload["spec"]["template"]["spec"];
        let resources = &spec["containers"][0]["resources"];
        assert_eq!(
            resources["requests"]["cpu"],
            format!("{}m", 101 + i),
            "{name}: {resources}"
        );
        assert_eq!(
            resources["limits"]["memory"],
            format!("{}Mi", 301 + i),
            "{name}: {resources}"
        );
        let pool = pool(scheduled_by(prefix));
        assert_eq!(
            spec["nodeSelector"],
            serde_json::json!({"example.com/pool": pool}),
            "{name}"
        );
        assert_eq!(
            spec["tolerations"],
            serde_json::json!([
                {"key": format!("example.com/{pool}"), "operator": "Exists", "effect": "NoSchedule"}
            ]),
            "{name}"
        );
        assert_eq!(
            spec["affinity"],
            serde_json::json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "example.com/zone", "operator": "In", "values": [pool]}
                ]}]
            }}}),
            "{name}"
        );
    }
}

#[test]
fn lint_strict_passes_for_the_matrix() {
    for sets in [
        vec![],
        all_off(),
        vec!["certManager.enabled=true"],
        vec!["crds.enabled=false"],
        vec!["serviceMonitor.enabled=true"],
        vec![
            "modelVolumeController.enabled=true",
            "reaper.retention=0",
            "serviceMonitor.enabled=true",
        ],
    ] {
        let output = helm()
            .lint(&sets)
            .unwrap_or_else(|e| panic!("{sets:?}: {e}"));
        assert!(output.contains("0 chart(s) failed"), "{sets:?}: {output}");
    }
}

#[test]
fn the_schema_refuses_bad_values_naming_the_field() {
    for (set, field) in [
        ("webhook.replicas=0", "/webhook/replicas"),
        ("webhook.bogus=1", "/webhook"),
        ("bogus=1", "bogus"),
        ("webhook.readerMode=nfs", "/webhook/readerMode"),
        // What `webhook serve --answer-reuse-ms` refuses (its pod would crash-loop).
        ("webhook.answerReuseMs=60001", "/webhook/answerReuseMs"),
        ("webhook.answerReuseMs=-1", "/webhook/answerReuseMs"),
        ("webhook.answerReuseMs=1.5", "/webhook/answerReuseMs"),
        (
            "webhook.featureGates=CachingSupport",
            "/webhook/featureGates",
        ),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("log.format=xml", "/log/format"),
        (
            "controlNamespace.name=Not_A_Namespace",
            "/controlNamespace/name",
        ),
        (
            "bindingController.primarySize=lots",
            "/bindingController/primarySize",
        ),
        (
            "bindingController.concurrency=0",
            "/bindingController/concurrency",
        ),
        (
            "bindingController.kubeApi.burst=0",
            "/bindingController/kubeApi/burst",
        ),
        ("reaper.kubeApi.qps=-1", "/reaper/kubeApi/qps"),
        (
            "kvcacheOperator.storeImageUsers={root}",
            "/kvcacheOperator/storeImageUsers/0",
        ),
        (
            "storageClass.volumeBindingMode=Later",
            "/storageClass/volumeBindingMode",
        ),
        ("otel.env.NOT_OTEL=1", "/otel/env"),
        // Set by the chart (a second one in the pod's env), or a protocol the components
        // would not export with.
        ("otel.env.OTEL_SERVICE_NAME=x", "/otel/env"),
        (
            "otel.env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf",
            "/otel/env",
        ),
        (
            "otel.env.OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
            "/otel/env",
        ),
        // The components export OTLP over gRPC only: any other protocol would be warned about
        // and exported over gRPC anyway, to a collector that does not receive it.
        ("otel.protocol=http/protobuf", "/otel/protocol"),
        (
            "certManager.issuerRef.kind=Vault",
            "/certManager/issuerRef/kind",
        ),
        // Durations the reaper's flags would refuse (its pod would crash-loop): no unit, a
        // unit it does not know, zero where zero is not "off", a negative, a fraction.
        ("reaper.interval=10", "/reaper/interval"),
        ("reaper.interval=0m", "/reaper/interval"),
        ("reaper.idlePeriod=1w", "/reaper/idlePeriod"),
        ("reaper.idlePeriod=1h30m", "/reaper/idlePeriod"),
        ("reaper.abandonAfter=-15m", "/reaper/abandonAfter"),
        ("reaper.orphanClaimAfter=1.5h", "/reaper/orphanClaimAfter"),
        ("reaper.retention=forever", "/reaper/retention"),
        ("reaper.retention=168", "/reaper/retention"),
        ("reaper.retention=7 days", "/reaper/retention"),
        ("reaper.retiringGrace=1", "/reaper/retiringGrace"),
        ("reaper.dryRun=maybe", "/reaper/dryRun"),
        ("reaper.replicas=0", "/reaper/replicas"),
        ("reaper.bogus=1", "/reaper"),
        (
            "modelVolumeController.kubeletRoot=var/lib/kubelet",
            "/modelVolumeController/kubeletRoot",
        ),
        (
            "modelVolumeController.bindRoot=/",
            "/modelVolumeController/bindRoot",
        ),
        (
            "modelVolumeController.holderImagePullPolicy=Sometimes",
            "/modelVolumeController/holderImagePullPolicy",
        ),
        (
            "modelVolumeController.minSizeGiB=0",
            "/modelVolumeController/minSizeGiB",
        ),
        (
            "modelVolumeController.holderImage=",
            "/modelVolumeController/holderImage",
        ),
    ] {
        let err = helm().template(&[set]).expect_err(set);
        let output = err.output();
        assert!(
            output.contains("values don't meet the specifications of the schema"),
            "{set}: {output}"
        );
        assert!(
            output.contains(field),
            "{set}: expected {field} in {output}"
        );
    }
}

#[test]
fn service_monitors_select_each_components_admin_port() {
    let objects = helm().template(&["serviceMonitor.enabled=true"]).unwrap();
    assert_eq!(
        names(&objects, "ServiceMonitor"),
        BTreeSet::from(
            [
                "webhook",
                "binding-controller",
                "kvcache-operator",
                "kvcache-operator-webhook",
                "reaper",
            ]
            .map(|c| format!("warmcache-{c}"))
        )
    );
    let objects = helm()
        .template(&[
            "serviceMonitor.enabled=true",
            "modelVolumeController.enabled=true",
        ])
        .unwrap();
    let monitors = of_kind(&objects, "ServiceMonitor");
    assert_eq!(monitors.len(), 6);
    assert!(find(&objects, "ServiceMonitor", AGENT).is_some());
    for monitor in monitors {
        let component = str_at(
            monitor,
            "/spec/selector/matchLabels/app.kubernetes.io~1component",
        );
        let service = of_kind(&objects, "Service")
            .into_iter()
            .find(|s| s["spec"]["selector"]["app.kubernetes.io/component"] == component)
            .unwrap_or_else(|| panic!("no Service for {component}"));
        assert!(
            service["spec"]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "admin")
        );
        // The Service's labels must match the monitor's selector (it selects Services).
        assert_eq!(
            service["metadata"]["labels"]["app.kubernetes.io/component"],
            component
        );
        assert_eq!(monitor["spec"]["endpoints"][0]["port"], "admin");
    }
}

#[test]
fn the_control_namespace_may_be_the_release_namespace() {
    // Two Roles of one component in one namespace stay apart (warmcache-<component> and
    // warmcache-<component>-control), and so do their bindings.
    let objects = helm()
        .template(&[
            "controlNamespace.name=warmcache-system",
            "controlNamespace.create=false",
        ])
        .unwrap();
    assert_common(&objects);
    let roles = names(&objects, "Role");
    assert!(roles.contains("warmcache-webhook"), "{roles:?}");
    assert!(roles.contains("warmcache-webhook-control"), "{roles:?}");
    assert_eq!(names(&objects, "RoleBinding"), roles);
}

#[test]
fn the_dashboard_is_valid_json_and_queries_only_documented_metrics() {
    let objects = helm()
        .template(&["grafana.dashboards.enabled=true"])
        .unwrap();
    let map = find(&objects, "ConfigMap", "warmcache-grafana-dashboards").unwrap();
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
    let dashboard: Value = serde_json::from_str(str_at(map, "/data/warmcache.json")).unwrap();
    assert_eq!(dashboard["uid"], "warmcache");
    let root = warmcache_testkit::chart_dir().join("../..");
    let docs: String = [
        "docs/binding-controller.md",
        "docs/model-volume.md",
        "docs/kvcache-local-disk.md",
        "docs/operations.md",
        "docs/reaper.md",
        "docs/node-agent.md",
    ]
    .iter()
    .map(|d| std::fs::read_to_string(root.join(d)).unwrap())
    .collect();
    let mut queried = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = str_at(target, "/expr");
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                let Some(rest) = word.strip_prefix("warmcache_") else {
                    continue;
                };
                queried += 1;
                // The family as the docs name it: without the component prefix and the
                // histogram's _bucket series.
                let family = rest.strip_suffix("_bucket").unwrap_or(rest);
                let suffix = [
                    "binding_controller_",
                    "kvcache_operator_",
                    "webhook_",
                    "reaper_",
                    "model_volume_controller_",
                ]
                .iter()
                .find_map(|p| family.strip_prefix(p))
                .unwrap_or(family);
                assert!(
                    docs.contains(&format!("`{suffix}"))
                        || docs.contains(&format!("warmcache_{family}")),
                    "{}: {word} is not a documented metric",
                    panel["title"]
                );
            }
        }
    }
    assert!(queried >= 10, "{queried}");
    // The reaper's panel: what each rule did and kept, by rule.
    let exprs: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .map(|t| str_at(t, "/expr"))
        .collect();
    for metric in [
        "warmcache_reaper_actions_total",
        "warmcache_reaper_kept_total",
    ] {
        assert!(
            exprs
                .iter()
                .any(|e| e.contains(metric) && e.contains("by (rule")),
            "no panel on {metric} by rule: {exprs:?}"
        );
    }
    // What the issue asks the dashboard to show: downloads, bindings by phase, time to Ready,
    // webhook latency and skips, reaper actions, KV tier capacity and usage; and the bytes the
    // model cache holds and downloads. Each is some query holding every one of its parts.
    for (what, parts) in [
        (
            "downloads started",
            &["warmcache_binding_controller_downloads_started_total"][..],
        ),
        (
            "downloads failed",
            &["warmcache_binding_controller_downloads_failed_total"],
        ),
        (
            "bindings by phase",
            &[
                "warmcache_binding_controller_bindings_by_phase",
                "by (phase)",
            ],
        ),
        (
            "time to Ready",
            &[
                "histogram_quantile",
                "warmcache_binding_controller_time_to_ready_seconds_bucket",
            ],
        ),
        (
            "cached bytes",
            &["warmcache_binding_controller_cached_bytes"],
        ),
        (
            "downloaded bytes",
            &["rate(warmcache_binding_controller_downloaded_bytes_total"],
        ),
        (
            "webhook admission latency",
            &[
                "histogram_quantile",
                "warmcache_webhook_pod_admission_duration_seconds_bucket",
            ],
        ),
        (
            "webhook skips",
            &[
                "warmcache_webhook_pod_admissions_total",
                "outcome=\"skipped\"",
                "by (reason)",
            ],
        ),
        ("reaper actions", &["warmcache_reaper_actions_total"]),
        (
            "KV tier capacity and usage",
            &["warmcache_kvcache_operator_tier_bytes", "by (measure)"],
        ),
    ] {
        assert!(
            exprs.iter().any(|e| parts.iter().all(|p| e.contains(p))),
            "no query of {what} ({parts:?}): {exprs:?}"
        );
    }
    // Bindings by phase sit next to bindings by population state.
    let panel = |title: &str| {
        dashboard["panels"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["title"] == title)
            .unwrap_or_else(|| panic!("no panel {title}"))
    };
    let population = &panel("Bindings by population state")["gridPos"];
    let phase = &panel("Bindings by phase")["gridPos"];
    assert_eq!(phase["y"], population["y"]);
    assert_eq!(
        phase["x"].as_u64().unwrap(),
        population["x"].as_u64().unwrap() + population["w"].as_u64().unwrap()
    );
    // Panel ids are unique and panels do not overlap.
    let panels = dashboard["panels"].as_array().unwrap();
    let ids: BTreeSet<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), panels.len());
    for (i, a) in panels.iter().enumerate() {
        for b in &panels[i + 1..] {
            let r = |p: &Value, k: &str| p["gridPos"][k].as_u64().unwrap();
            let apart = r(a, "x") + r(a, "w") <= r(b, "x")
                || r(b, "x") + r(b, "w") <= r(a, "x")
                || r(a, "y") + r(a, "h") <= r(b, "y")
                || r(b, "y") + r(b, "h") <= r(a, "y");
            assert!(apart, "{} overlaps {}", a["title"], b["title"]);
        }
    }
    // Off by default.
    let objects = helm().template(&[]).unwrap();
    assert!(find(&objects, "ConfigMap", "warmcache-grafana-dashboards").is_none());
}

#[test]
fn values_that_would_break_a_cluster_are_refused_or_adjusted() {
    // A control namespace the chart would create and the uninstall hook delete must be its own.
    for name in ["warmcache-system", "default", "kube-system"] {
        let set = format!("controlNamespace.name={name}");
        let err = helm().template(&[&set]).unwrap_err();
        assert!(err.output().contains("cannot create"), "{name}: {err}");
    }
    // One replica: no PodDisruptionBudget that would block every drain.
    let objects = helm()
        .template(&["webhook.replicas=1", "kvcacheOperator.webhook.replicas=1"])
        .unwrap();
    assert!(of_kind(&objects, "PodDisruptionBudget").is_empty());
    // The writer TTL must outlast the controller's look at a finished Job.
    let err = helm()
        .template(&["bindingController.writerTtlSeconds=0"])
        .unwrap_err();
    assert!(
        err.output().contains("/bindingController/writerTtlSeconds"),
        "{err}"
    );
}
