//! Every object the chart renders, validated by the real kube-apiserver of the test kit:
//! server-side apply with `dryRun=All` and `fieldValidation=Strict` (unknown or duplicate
//! fields are errors, not warnings), and every pod template admitted by Pod Security
//! "restricted" (a dry-run Pod in a namespace that enforces it), but the node agent's: the
//! documented exception, refused by "restricted" and "baseline" and admitted where the
//! namespace allows "privileged" (what docs/install.md asks of its namespace). Kinds of other projects'
//! CRDs (cert-manager, Prometheus Operator) are not installed on the test plane; they are
//! counted, and only they may be skipped.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::Helm;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, pinned_kind};
use serde_json::{Value, json};
use warmcache_chart_tests::{NAMESPACE, key, of_kind, pod_templates};
use warmcache_testkit::ControlPlane;

const FOREIGN_GROUPS: [&str; 2] = ["cert-manager.io", "monitoring.coreos.com"];

fn gvk(object: &Value) -> GroupVersionKind {
    let api_version = object["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    GroupVersionKind::gvk(group, version, object["kind"].as_str().unwrap())
}

/// The node agent's DaemonSet, the one pod template that needs Pod Security "privileged".
const AGENT: &str = "DaemonSet/warmcache-system/warmcache-model-volume-controller";

async fn ensure_namespace(client: &kube::Client, name: &str) {
    ensure_namespace_at(client, name, "restricted").await;
}

async fn ensure_namespace_at(client: &kube::Client, name: &str, level: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": level}},
    }))
    .unwrap();
    api.patch(
        name,
        &PatchParams::apply("chart-test").force(),
        &Patch::Apply(&namespace),
    )
    .await
    .unwrap();
}

/// Dry-runs every object; returns how many of each foreign group were skipped.
async fn validate(client: &kube::Client, objects: &[Value]) -> usize {
    let mut skipped = 0;
    for object in objects {
        let gvk = gvk(object);
        if FOREIGN_GROUPS.contains(&gvk.group.as_str()) {
            skipped += 1;
            continue;
        }
        let (resource, capabilities) = pinned_kind(client, &gvk).await.unwrap_or_else(|e| {
            panic!(
                "{}: the API server does not serve {gvk:?}: {e}",
                key(object)
            )
        });
        let api: Api<DynamicObject> = match capabilities.scope {
            Scope::Cluster => Api::all_with(client.clone(), &resource),
            Scope::Namespaced => {
                let namespace = object["metadata"]["namespace"].as_str().unwrap_or_else(|| {
                    panic!("{}: namespaced object without a namespace", key(object))
                });
                Api::namespaced_with(client.clone(), namespace, &resource)
            }
        };
        let name = object["metadata"]["name"].as_str().unwrap();
        let params = PatchParams::apply("chart-test")
            .force()
            .dry_run()
            .validation_strict();
        if let Err(e) = api.patch(name, &params, &Patch::Apply(object)).await {
            panic!("{}: refused by the API server: {e}", key(object));
        }
    }
    skipped
}

/// A pod template as a Pod (dry run) in `namespace`, with the chart's ServiceAccounts there.
async fn admit_pod(
    client: &kube::Client,
    objects: &[Value],
    namespace: &str,
    template: &Value,
) -> Result<(), kube::Error> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    // `default` for pods that name no account (the KVCacheBackend webhook, which reads nothing
    // from the API); a plane without a controller manager has none.
    let default =
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}});
    for account in of_kind(objects, "ServiceAccount")
        .into_iter()
        .chain([&default])
    {
        let mut account: ServiceAccount = serde_json::from_value(account.clone()).unwrap();
        account.metadata.namespace = Some(namespace.to_owned());
        let name = account.metadata.name.clone().unwrap();
        accounts
            .patch(
                &name,
                &PatchParams::apply("chart-test").force(),
                &Patch::Apply(&account),
            )
            .await
            .unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template.get("metadata").cloned().unwrap_or(json!({})),
        "spec": template["spec"],
    });
    pod["metadata"]["generateName"] = json!("chart-test-");
    let pod: Pod = serde_json::from_value(pod).unwrap();
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    pods.create(&params, &pod).await.map(|_| ())
}

/// Each pod template as a dry-run Pod in the release namespace, which enforces "restricted";
/// the node agent's is refused there and under "baseline", and admitted under "privileged".
/// Returns how many agent pods were checked.
async fn admit_pods(client: &kube::Client, objects: &[Value]) -> usize {
    let mut agents = 0;
    for (what, template) in pod_templates(objects) {
        if what == AGENT {
            agents += 1;
            for level in ["restricted", "baseline"] {
                let namespace = format!("chart-test-{level}");
                ensure_namespace_at(client, &namespace, level).await;
                match admit_pod(client, objects, &namespace, template).await {
                    Err(kube::Error::Api(status)) => {
                        let message = status.message;
                        assert!(
                            message.contains("violates PodSecurity")
                                && message.contains("privileged")
                                && message.contains("hostPath"),
                            "{what} under {level}: {message}"
                        );
                    }
                    other => panic!("{what}: admitted under {level}: {other:?}"),
                }
            }
            ensure_namespace_at(client, "chart-test-privileged", "privileged").await;
            if let Err(e) = admit_pod(client, objects, "chart-test-privileged", template).await {
                panic!("{what}: refused in a namespace enforcing privileged: {e}");
            }
            continue;
        }
        if let Err(e) = admit_pod(client, objects, NAMESPACE, template).await {
            panic!("{what}: its pod is refused in a namespace enforcing restricted: {e}");
        }
    }
    agents
}

/// The render matrix on one API server: the defaults, everything on (the node agent too), and
/// cert-manager with the optional StorageClass.
async fn validate_matrix(client: &kube::Client) {
    let helm = Helm::new().unwrap();
    ensure_namespace(client, NAMESPACE).await;
    ensure_namespace(client, "nvca-modelcache-init").await;

    let objects = helm.template(&["serviceMonitor.enabled=true"]).unwrap();
    assert_eq!(
        validate(client, &objects).await,
        5,
        "the five ServiceMonitors"
    );
    assert_eq!(
        admit_pods(client, &objects).await,
        0,
        "no node agent by default"
    );

    // Everything on, the node agent too.
    let objects = helm
        .template(&[
            "serviceMonitor.enabled=true",
            "modelVolumeController.enabled=true",
        ])
        .unwrap();
    assert_eq!(
        validate(client, &objects).await,
        6,
        "the six ServiceMonitors"
    );
    assert_eq!(admit_pods(client, &objects).await, 1, "the node agent");

    let objects = helm
        .template(&[
            "certManager.enabled=true",
            "storageClass.create=true",
            "storageClass.provisioner=csi.weka.io",
        ])
        .unwrap();
    assert_eq!(
        validate(client, &objects).await,
        4,
        "two Issuers and two Certificates"
    );
}

#[tokio::test]
async fn every_rendered_object_passes_strict_server_validation_and_restricted() {
    let plane = ControlPlane::shared().await.unwrap();
    let client = plane.client().await.unwrap();
    validate_matrix(&client).await;
}

/// The same matrix on the oldest Kubernetes the chart admits (`kubeVersion: >=1.30.0-0`): a real
/// v1.30 kube-apiserver with the workspace CRDs installed (so their schemas and CEL rules compile
/// there too), every object strict and every pod template under "restricted" of that version.
#[tokio::test]
async fn every_rendered_object_passes_on_the_oldest_supported_kubernetes() {
    let plane = tokio::task::spawn_blocking(ControlPlane::start_oldest)
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the oldest supported API server did not start: {e}"));
    let client = plane.client().await.unwrap();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "30"),
        "the oldest plane runs {}",
        version.git_version
    );
    let chart = std::fs::read_to_string(warmcache_testkit::chart_dir().join("Chart.yaml")).unwrap();
    assert!(
        chart.contains("kubeVersion: \">=1.30.0-0\""),
        "Chart.yaml's kubeVersion moved: move hack/controlplane/kube-oldest with it"
    );
    validate_matrix(&client).await;
    drop(client);
    tokio::task::spawn_blocking(move || plane.shutdown())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_value_that_breaks_an_object_is_caught_by_the_server() {
    // The schema cannot know every Kubernetes rule; the dry run is the net. A node selector
    // value that is not a label value passes the chart's schema and is refused by the server.
    let plane = ControlPlane::shared().await.unwrap();
    let client = plane.client().await.unwrap();
    let helm = Helm::new().unwrap();
    ensure_namespace(&client, NAMESPACE).await;
    let objects = helm
        .template(&["webhook.nodeSelector.pool=not a label value!"])
        .unwrap();
    let deployment = objects
        .iter()
        .find(|o| key(o) == format!("Deployment/{NAMESPACE}/warmcache-webhook"))
        .unwrap();
    let (resource, _) = pinned_kind(&client, &gvk(deployment)).await.unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &resource);
    let params = PatchParams::apply("chart-test")
        .force()
        .dry_run()
        .validation_strict();
    let err = api
        .patch("warmcache-webhook", &params, &Patch::Apply(deployment))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("nodeSelector"), "{err}");
    // And validation is strict: a field Kubernetes does not know is an error.
    let objects = helm.template(&[]).unwrap();
    let mut deployment = objects
        .iter()
        .find(|o| key(o) == format!("Deployment/{NAMESPACE}/warmcache-webhook"))
        .unwrap()
        .clone();
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = json!("Never");
    let err = api
        .patch("warmcache-webhook", &params, &Patch::Apply(&deployment))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("imagePullPolicyy"), "{err}");
}

#[tokio::test]
async fn the_node_agent_is_privileged_because_bidirectional_propagation_requires_it() {
    // The reason docs/install.md gives for the one privileged pod: without `privileged` the
    // API server refuses the bind root's Bidirectional propagation.
    let plane = ControlPlane::shared().await.unwrap();
    let client = plane.client().await.unwrap();
    let helm = Helm::new().unwrap();
    ensure_namespace_at(&client, NAMESPACE, "restricted").await;
    let objects = helm
        .template(&["modelVolumeController.enabled=true"])
        .unwrap();
    let mut agent = objects.iter().find(|o| key(o) == AGENT).unwrap().clone();
    let (resource, _) = pinned_kind(&client, &gvk(&agent)).await.unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &resource);
    let params = PatchParams::apply("chart-test")
        .force()
        .dry_run()
        .validation_strict();
    let name = agent["metadata"]["name"].as_str().unwrap().to_owned();
    api.patch(&name, &params, &Patch::Apply(&agent))
        .await
        .unwrap_or_else(|e| panic!("{AGENT} as rendered: {e}"));
    agent["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] =
        json!(false);
    let err = api
        .patch(&name, &params, &Patch::Apply(&agent))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("Bidirectional") && err.to_string().contains("privileged"),
        "{err}"
    );
}
