//! The pod webhook as users run it: the `webhook serve` binary (its caches, its HTTPS server,
//! its admin server) called by a real kube-apiserver through the registration `cargo xtask gen`
//! generates (failurePolicy Ignore, reinvocation, selectors), pointed at the process by URL and
//! scoped to each test's namespaces by one extra label.
//!
//! Each test starts its own webhook process with its own control namespace, so the bindings a
//! test counts are its own. StorageClass `nvcf-sc` (cluster-scoped) is shared: ReadWriteMany
//! on `csi.weka.io`, which the built-in catalog qualifies.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::*;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use warmcache_api_modelcache::SHARING_DOMAIN_LABEL;
use warmcache_api_modelcache::v2beta1::{ModelCacheBinding, Workflow};
use warmcache_modelvolume::keys::{
    BINDING_ANNOTATION, BINDING_UID_ANNOTATION, MODEL_VOLUME, SKIP_REASON_ANNOTATION,
    TRACE_PARENT_ANNOTATION,
};
use warmcache_testkit::{HttpsClient, OtlpReceiver, WebhookPki, eventually};
use warmcache_webhook::serve::{WEBHOOK_PATH, webhook_configurations};

/// Creates Deployment `qwen` of `replicas` engine pods in `ns` and returns its pods once all
/// exist.
async fn deployment_pods(client: &kube::Client, ns: &str, replicas: usize) -> Vec<Pod> {
    let template = engine_pod("unused");
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "qwen"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "qwen"}},
            "template": {"metadata": {"labels": {"app": "qwen"}}, "spec": template.spec}
        }
    }))
    .unwrap();
    Api::<Deployment>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    eventually(
        &format!("{replicas} pods of the Deployment"),
        TIMEOUT,
        || {
            let pods = pods.clone();
            async move {
                let list = pods.list(&ListParams::default()).await.ok()?;
                (list.items.len() == replicas).then_some(list.items)
            }
        },
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployments_pods_are_rewritten_by_the_real_api_server() {
    let client = client().await;
    let served = Served::start(&client).await;
    let ns = served.namespace(&client, "pw-deploy", &[]).await;
    let listed = deployment_pods(&client, &ns, 3).await;
    if listed
        .iter()
        .any(|p| !p.annotations().contains_key(BINDING_UID_ANNOTATION))
    {
        panic!(
            "a pod was not rewritten; the webhook's log:\n{}",
            served.log()
        );
    }
    let refs: BTreeSet<(String, String)> = listed.iter().map(read_binding).collect();
    assert_eq!(refs.len(), 1, "one binding for the three pods: {refs:?}");
    let (name, uid) = refs.into_iter().next().unwrap();
    let binding = served.bindings(&client).get(&name).await.unwrap();
    assert_eq!(binding.uid().as_deref(), Some(uid.as_str()));
    assert_eq!(binding.spec.identity.workflow, Workflow::RegularModelCache);
    assert_eq!(binding.spec.resources.writer_namespace, ns);
    assert!(
        binding
            .finalizers()
            .iter()
            .any(|f| f == warmcache_api_modelcache::FINALIZER)
    );
    let main = &listed[0].spec.as_ref().unwrap().containers[0];
    let env: BTreeMap<_, _> = main
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or_default()))
        .collect();
    assert_eq!(env.get("HF_HUB_OFFLINE"), Some(&"1"), "started offline");
    let mounts = main.volume_mounts.iter().flatten();
    for mount in mounts.filter(|m| m.name == MODEL_VOLUME) {
        assert_eq!(mount.read_only, Some(true), "{}", mount.mount_path);
    }

    let metrics = served.metrics().await;
    // Kept for `promtool check metrics` (docs/operations.md).
    std::fs::write(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("webhook-metrics.prom"),
        &metrics,
    )
    .unwrap();
    assert!(
        counter(
            &metrics,
            "warmcache_webhook_pod_admissions_total{outcome=\"rewritten\",reason=\"none\"}"
        ) >= 3.0,
        "{metrics}"
    );
    assert_eq!(
        counter(
            &metrics,
            "warmcache_webhook_bindings_total{result=\"created\"}"
        ),
        1.0
    );
    served.stop(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_pods_across_twenty_namespaces_of_one_domain_make_one_binding() {
    let _heavy = HEAVY.lock().await;
    let client = client().await;
    let served = Served::start(&client).await;
    let domain = unique("domain");
    let mut namespaces = Vec::new();
    for _ in 0..20 {
        namespaces.push(
            served
                .namespace(
                    &client,
                    "pw-dom",
                    &[(SHARING_DOMAIN_LABEL, domain.as_str())],
                )
                .await,
        );
    }
    let pods: Vec<(String, Pod)> = namespaces
        .iter()
        .flat_map(|ns| (0..10).map(move |i| (ns.clone(), engine_pod(&format!("qwen-{i}")))))
        .collect();
    let created = create_pods(&client, pods).await;
    assert_eq!(created.len(), 200);
    let refs: BTreeSet<(String, String)> = created.iter().map(read_binding).collect();
    assert_eq!(refs.len(), 1, "every pod reads the same binding: {refs:?}");
    let list = served
        .bindings(&client)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1, "exactly one binding");
    let binding = &list.items[0];
    assert_eq!(binding.spec.identity.workflow, Workflow::HelmModelCache);
    assert!(namespaces.contains(&binding.spec.resources.writer_namespace));
    let metrics = served.metrics().await;
    let created = counter(
        &metrics,
        "warmcache_webhook_bindings_total{result=\"created\"}",
    );
    let existing = counter(
        &metrics,
        "warmcache_webhook_bindings_total{result=\"existing\"}",
    );
    assert_eq!(created, 1.0, "one create call succeeded");
    // Concurrent admissions share one call; only those between its end and the watch
    // delivering the binding make another (and read the winner back).
    assert!(
        created + existing < 100.0,
        "{created} created + {existing} existing calls for 200 pods"
    );
    served.stop(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_unlabelled_namespaces_get_twenty_bindings() {
    let _heavy = HEAVY.lock().await;
    let client = client().await;
    let served = Served::start(&client).await;
    let mut pods = Vec::new();
    for _ in 0..20 {
        let ns = served.namespace(&client, "pw-alone", &[]).await;
        pods.push((ns.clone(), engine_pod("qwen-a")));
        pods.push((ns, engine_pod("qwen-b")));
    }
    let created = create_pods(&client, pods).await;
    let mut by_namespace: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for pod in &created {
        by_namespace
            .entry(pod.namespace().unwrap())
            .or_default()
            .insert(read_binding(pod).0);
    }
    assert_eq!(by_namespace.len(), 20);
    assert!(
        by_namespace.values().all(|b| b.len() == 1),
        "{by_namespace:?}"
    );
    let names: BTreeSet<&String> = by_namespace.values().flatten().collect();
    assert_eq!(names.len(), 20, "one binding per namespace");
    let list = served
        .bindings(&client)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(list.items.len(), 20);
    for binding in &list.items {
        let ns = &binding.spec.resources.writer_namespace;
        assert_eq!(binding.spec.identity.workflow, Workflow::RegularModelCache);
        assert!(
            by_namespace[ns].contains(&binding.name_any()),
            "the binding of {ns} is written by {ns}"
        );
    }
    served.stop(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_outside_a_domain_never_gets_its_binding() {
    let client = client().await;
    let served = Served::start(&client).await;
    let (x, y) = (unique("x"), unique("y"));
    let a = served
        .namespace(&client, "pw-xa", &[(SHARING_DOMAIN_LABEL, &x)])
        .await;
    let b = served
        .namespace(&client, "pw-xb", &[(SHARING_DOMAIN_LABEL, &x)])
        .await;
    let c = served
        .namespace(&client, "pw-yc", &[(SHARING_DOMAIN_LABEL, &y)])
        .await;
    let d = served.namespace(&client, "pw-none", &[]).await;
    let mut bindings = BTreeMap::new();
    for ns in [&a, &b, &c, &d] {
        let created = create_pods(&client, vec![(ns.clone(), engine_pod("qwen"))]).await;
        bindings.insert(ns.clone(), read_binding(&created[0]).0);
    }
    assert_eq!(bindings[&a], bindings[&b], "one domain shares");
    assert_ne!(bindings[&c], bindings[&a], "another domain does not");
    assert_ne!(
        bindings[&d], bindings[&a],
        "an unlabelled namespace does not"
    );
    assert_ne!(bindings[&d], bindings[&c]);
    let list = served
        .bindings(&client)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(list.items.len(), 3);
    served.stop(&client).await;
}

/// Two replicas admitting a model's first pods at once both find no binding in their caches and
/// both create it; the one whose create loses reads the winner back (`create_or_get`'s get on
/// AlreadyExists) and records the winner's UID. Which replica loses is a race the API server
/// tests above only sometimes hit, so the losing call is made here, as the webhook's
/// ServiceAccount with its generated roles, with the webhook's own decision and completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_create_loses_records_the_winner_under_its_roles() {
    let client = client().await;
    let plane = warmcache_testkit::ControlPlane::shared().await.unwrap();
    ensure_storage_class(&client).await;
    let control = namespace(&client, "pw-control", &[]).await;
    let home = namespace(&client, "pw-home", &[]).await;
    let reader = namespace(&client, "pw-race", &[]).await;
    let account =
        warmcache_testkit::ComponentAccount::create(plane, &client, "webhook", &home, &control)
            .await
            .unwrap();
    let as_webhook: Api<ModelCacheBinding> =
        Api::namespaced(account.client().await.unwrap(), &control);
    let (rewrite, wanted) = first_admission(&client, &reader, &control).await;
    let winner = as_webhook
        .create(&PostParams::default(), &wanted)
        .await
        .unwrap();
    let lost = warmcache_kube::create_or_get(&as_webhook, &wanted)
        .await
        .unwrap();
    assert!(!lost.was_created(), "the second create found the first");
    assert_eq!(lost.object().uid(), winner.uid());
    assert_eq!(
        lost.object().metadata.resource_version,
        winner.metadata.resource_version,
        "nothing was overwritten"
    );
    let pod = rewrite.complete(lost.object()).unwrap();
    assert_eq!(
        pod.annotations()
            .get(BINDING_UID_ANNOTATION)
            .map(String::as_str),
        winner.uid().as_deref()
    );
    let stored = Api::<ModelCacheBinding>::namespaced(client.clone(), &control)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(stored.items.len(), 1, "one binding: {:?}", stored.items);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_creates_nothing() {
    let client = client().await;
    let served = Served::start(&client).await;
    let ns = served.namespace(&client, "pw-dry", &[]).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let answered = pods.create(&dry_run(), &engine_pod("qwen")).await.unwrap();
    assert!(
        answered.annotations().contains_key(BINDING_ANNOTATION),
        "the rewrite is shown"
    );
    assert!(
        !answered.annotations().contains_key(BINDING_UID_ANNOTATION),
        "no binding exists to record"
    );
    let skipped = pods
        .create(&dry_run(), &literal_secret_pod("secret"))
        .await
        .unwrap();
    assert_eq!(
        skipped
            .annotations()
            .get(SKIP_REASON_ANNOTATION)
            .map(String::as_str),
        Some("secret-in-download-step")
    );
    // Give a wrong write time to land, then look.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let list = served
        .bindings(&client)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(list.items.is_empty(), "no binding: {:?}", list.items);
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let list = events.list(&ListParams::default()).await.unwrap();
    assert!(list.items.is_empty(), "no Event: {:?}", list.items);
    let metrics = served.metrics().await;
    assert_eq!(
        counter(
            &metrics,
            "warmcache_webhook_bindings_total{result=\"created\"}"
        ),
        0.0
    );
    served.stop(&client).await;
}

/// `pod`'s spec as JSON, with the name of the token volume the API server gives each pod
/// (`kube-api-access-` and five random characters) written `kube-api-access-*`.
fn token_free_spec(pod: &Pod) -> String {
    let text = serde_json::to_string(&pod.spec).unwrap();
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("kube-api-access-") {
        let end = at + "kube-api-access-".len();
        out.push_str(&rest[..end]);
        out.push('*');
        rest = rest.get(end + 5..).unwrap_or_default();
    }
    out.push_str(rest);
    out
}

/// Admissions answered from a kept answer, from the webhook's metrics.
fn reused(metrics: &str) -> f64 {
    counter(metrics, "warmcache_webhook_pod_admissions_reused_total")
}

/// A ReplicaSet's pod (no name yet, so every replica is the same object) named
/// `generate_name...`, once a dry run of it joins its model's binding: the first pod of the
/// model (created here) creates the binding, an answer that is never reused; the next joins it
/// once the webhook's cache holds it, and its answer is kept. With the binding's name and UID.
async fn joined_replica(pods: &Api<Pod>, generate_name: &str) -> (Pod, (String, String)) {
    let mut replica = engine_pod("unused");
    replica.metadata.name = None;
    replica.metadata.generate_name = Some(generate_name.into());
    let first = pods
        .create(&PostParams::default(), &engine_pod("first"))
        .await
        .unwrap();
    eventually("a join of the cached binding", TIMEOUT, || {
        let (pods, replica) = (pods.clone(), replica.clone());
        async move {
            let pod = pods.create(&dry_run(), &replica).await.ok()?;
            pod.annotations()
                .contains_key(BINDING_UID_ANNOTATION)
                .then_some(())
        }
    })
    .await
    .unwrap();
    (replica, read_binding(&first))
}

/// The trace and span IDs of a `traceparent` annotation.
fn trace_context(pod: &Pod) -> (String, String) {
    let value = pod
        .annotations()
        .get(TRACE_PARENT_ANNOTATION)
        .unwrap_or_else(|| panic!("{} has no trace context", pod.name_any()));
    let parts: Vec<&str> = value.split('-').collect();
    assert_eq!(parts.len(), 4, "{value}");
    (parts[1].to_owned(), parts[2].to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_pod_answered_from_a_kept_answer_records_its_own_admission_span() {
    let client = client().await;
    let otlp = OtlpReceiver::start().await.unwrap();
    let endpoint = otlp.endpoint();
    // A long reuse window: the three creates may take over the default second on a busy
    // machine.
    let served = Served::start_with(
        &client,
        Setup {
            args: &["--answer-reuse-ms", "60000"],
            otlp: Some(&endpoint),
            ..Setup::default()
        },
    )
    .await;
    let ns = served.namespace(&client, "pw-traced", &[]).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let (replica, (binding_name, _)) = joined_replica(&pods, "traced-").await;
    let before = reused(&served.metrics().await);
    let mut created = Vec::new();
    for _ in 0..3 {
        created.push(pods.create(&PostParams::default(), &replica).await.unwrap());
    }
    assert_eq!(reused(&served.metrics().await), before + 2.0);
    let contexts: Vec<(String, String)> = created.iter().map(trace_context).collect();
    let spans: BTreeSet<&String> = contexts.iter().map(|(_, span)| span).collect();
    assert_eq!(
        spans.len(),
        3,
        "each pod its own admission span: {contexts:?}"
    );
    // Each names a `pod_admission` span the webhook exported, with the binding it joined.
    let exported = eventually("the three admissions' spans", TIMEOUT, || {
        let spans = otlp.spans();
        let contexts = contexts.clone();
        async move {
            contexts
                .iter()
                .map(|(trace, id)| {
                    spans
                        .iter()
                        .find(|s| &s.trace_id == trace && &s.span_id == id)
                        .cloned()
                })
                .collect::<Option<Vec<_>>>()
        }
    })
    .await
    .unwrap_or_else(|_| panic!("spans missing; received: {:?}", otlp.spans()));
    for span in exported {
        assert_eq!(
            (span.service.as_str(), span.name.as_str()),
            ("webhook", "pod_admission")
        );
        assert_eq!(
            span.attribute("binding"),
            Some(binding_name.as_str()),
            "{span:?}"
        );
        assert_eq!(span.attribute("decision"), Some("rewritten"), "{span:?}");
        assert_eq!(span.attribute("pod"), Some("traced-*"), "{span:?}");
    }
    served.stop(&client).await;
}

/// The skip reason a dry-run create of `pod` is answered with, if any.
async fn dry_run_skip(pods: &Api<Pod>, pod: &Pod) -> Option<String> {
    let answered = pods.create(&dry_run(), pod).await.unwrap();
    answered.annotations().get(SKIP_REASON_ANNOTATION).cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_equal_pods_answer_is_reused_until_its_binding_changes() {
    let client = client().await;
    // A long reuse window: only a change of what the admission read ends a reuse here.
    let served = Served::start_with(
        &client,
        Setup {
            args: &["--answer-reuse-ms", "60000"],
            ..Setup::default()
        },
    )
    .await;
    let ns = served.namespace(&client, "pw-reuse", &[]).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let (replica, (binding_name, uid)) = joined_replica(&pods, "replica-").await;
    let before = reused(&served.metrics().await);
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(pods.create(&dry_run(), &replica).await.unwrap());
    }
    let metrics = served.metrics().await;
    assert_eq!(reused(&metrics), before + 3.0, "{metrics}");
    for answer in &answers {
        assert_eq!(read_binding(answer), (binding_name.clone(), uid.clone()));
        assert_eq!(
            token_free_spec(answer),
            token_free_spec(&answers[0]),
            "every reuse makes the same pod"
        );
    }
    // Real pods: the first is decided (a dry run's answer is not reused for a real create),
    // the next two are answered from its kept answer; each is counted as rewritten.
    let rewritten = |metrics: &str| {
        counter(
            metrics,
            "warmcache_webhook_pod_admissions_total{outcome=\"rewritten\",reason=\"none\"}",
        )
    };
    let metrics = served.metrics().await;
    let (rewritten_before, before) = (rewritten(&metrics), reused(&metrics));
    let mut names = BTreeSet::new();
    for i in 0..3 {
        if i > 0 {
            // Each create in another second: the API server stamps the pod's managedFields
            // entry with the time of its request, to the second, before the webhooks see it.
            tokio::time::sleep(Duration::from_millis(1100)).await;
        }
        let created = pods.create(&PostParams::default(), &replica).await.unwrap();
        assert_eq!(read_binding(&created), (binding_name.clone(), uid.clone()));
        assert_eq!(token_free_spec(&created), token_free_spec(&answers[0]));
        names.insert(created.name_any());
    }
    assert_eq!(names.len(), 3, "{names:?}");
    let metrics = served.metrics().await;
    assert_eq!(rewritten(&metrics), rewritten_before + 3.0, "{metrics}");
    assert_eq!(
        reused(&metrics),
        before + 2.0,
        "{metrics}\nwebhook log:\n{}",
        served.log()
    );

    // The binding turns Retiring: the cached answer no longer holds as soon as the webhook's
    // cache sees it. A pod never admitted before shows when that is.
    served
        .bindings(&client)
        .patch_status(
            &binding_name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"phase": "Retiring"}})),
        )
        .await
        .unwrap();
    let mut other = replica.clone();
    other.metadata.generate_name = Some("other-".into());
    eventually("the webhook's cache seeing Retiring", TIMEOUT, || {
        let (pods, other) = (pods.clone(), other.clone());
        async move {
            (dry_run_skip(&pods, &other).await.as_deref() == Some("binding-retiring")).then_some(())
        }
    })
    .await
    .unwrap();
    let before = reused(&served.metrics().await);
    assert_eq!(
        dry_run_skip(&pods, &replica).await.as_deref(),
        Some("binding-retiring"),
        "the kept answer joined a Retiring binding"
    );
    assert_eq!(reused(&served.metrics().await), before);
    served.stop(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaderworkerset_worker_takes_its_model_from_the_leader_template() {
    let client = client().await;
    warmcache_testkit::install_leaderworkerset_crd(&client)
        .await
        .unwrap();
    let served = Served::start(&client).await;
    let ns = served.namespace(&client, "pw-lws", &[]).await;
    let model = "meta-llama/Meta-Llama-3.1-405B-Instruct";
    let gpu = json!({"limits": {"nvidia.com/gpu": "8"}});
    let cache = json!([{"name": "hf", "mountPath": "/root/.cache/huggingface"}]);
    let lws = kube::core::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet"),
        "leaderworkersets",
    );
    let group: kube::core::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": "vllm"},
        "spec": {"leaderWorkerTemplate": {
            "size": 2,
            "leaderTemplate": {"spec": {"containers": [{
                "name": "leader", "image": "vllm/vllm-openai:v0.20.0",
                "command": ["sh", "-c", format!("bash multi-node-serving.sh leader; vllm serve --model {model} --tensor-parallel-size 8")],
                "resources": gpu, "volumeMounts": cache,
            }], "volumes": [{"name": "hf", "emptyDir": {}}]}},
            "workerTemplate": {"spec": {"containers": [{
                "name": "worker", "image": "vllm/vllm-openai:v0.20.0",
                "command": ["sh", "-c", "bash multi-node-serving.sh worker"],
                "resources": gpu, "volumeMounts": cache,
            }], "volumes": [{"name": "hf", "emptyDir": {}}]}},
        }},
    }))
    .unwrap();
    Api::<kube::core::DynamicObject>::namespaced_with(client.clone(), &ns, &lws)
        .create(&PostParams::default(), &group)
        .await
        .unwrap();
    // Worker 1 of group 0, as the LeaderWorkerSet controller makes it: nothing in it names the
    // model, so the webhook reads the LeaderWorkerSet its labels name.
    let worker = pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "vllm-0-1", "labels": {
            "leaderworkerset.sigs.k8s.io/name": "vllm",
            "leaderworkerset.sigs.k8s.io/group-index": "0",
            "leaderworkerset.sigs.k8s.io/worker-index": "1",
        }},
        "spec": group.data["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"],
    }));
    let created = create_pods(&client, vec![(ns.clone(), worker)]).await;
    let (name, uid) = read_binding(&created[0]);
    assert_eq!(
        created[0]
            .annotations()
            .get(warmcache_modelvolume::keys::URI_ANNOTATION)
            .map(String::as_str),
        Some(format!("hf://{model}").as_str()),
        "{:?}",
        created[0].metadata.annotations
    );
    let binding = served.bindings(&client).get(&name).await.unwrap();
    assert_eq!(binding.uid().as_deref(), Some(uid.as_str()));
    assert_eq!(binding.spec.resources.writer_namespace, ns);
    served.stop(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_left_alone_says_why_on_itself_and_its_controller() {
    let client = client().await;
    let served = Served::start(&client).await;
    let ns = served.namespace(&client, "pw-skip", &[]).await;
    let created = create_pods(&client, vec![(ns.clone(), literal_secret_pod("secret"))]).await;
    let pod = &created[0];
    assert_eq!(
        pod.annotations()
            .get(SKIP_REASON_ANNOTATION)
            .map(String::as_str),
        Some("secret-in-download-step")
    );
    assert!(!pod.annotations().contains_key(BINDING_ANNOTATION));
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let find = |kind: &'static str, name: String| {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.involved_object.kind.as_deref() == Some(kind)
                    && e.involved_object.name.as_deref() == Some(name.as_str())
                    && e.reason.as_deref() == Some("SecretInDownloadStep")
                    && e.type_.as_deref() == Some("Warning")
            })
        }
    };
    eventually("a Warning Event on the pod", TIMEOUT, || {
        find("Pod", "secret".into())
    })
    .await
    .unwrap();

    // A Deployment's pod has no name at admission: the Event goes on its ReplicaSet.
    let template = literal_secret_pod("unused");
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "llama"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "llama"}},
            "template": {"metadata": {"labels": {"app": "llama"}}, "spec": template.spec}
        }
    }))
    .unwrap();
    Api::<Deployment>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let sets: Api<k8s_openapi::api::apps::v1::ReplicaSet> = Api::namespaced(client.clone(), &ns);
    let set = eventually("the ReplicaSet", TIMEOUT, || {
        let sets = sets.clone();
        async move {
            sets.list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .next()
        }
    })
    .await
    .unwrap();
    let event = eventually("a Warning Event on the ReplicaSet", TIMEOUT, || {
        find("ReplicaSet", set.name_any())
    })
    .await
    .unwrap();
    let note = event.message.unwrap_or_default();
    assert!(note.starts_with("pod \"llama-"), "{note}");
    let metrics = served.metrics().await;
    assert!(
        counter(
            &metrics,
            "warmcache_webhook_pod_admissions_total{outcome=\"skipped\",reason=\"secret-in-download-step\"}"
        ) >= 2.0
    );
    served.stop(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_that_is_down_does_not_block_pods() {
    let client = client().await;
    ensure_storage_class(&client).await;
    let run = unique("down");
    let pki = WebhookPki::generate().unwrap();
    // Nothing listens there.
    let port = free_port();
    let configs = webhook_configurations()
        .unwrap()
        .with_url(&format!("https://127.0.0.1:{port}"), pki.ca_pem.as_bytes());
    let mut config = configs.mutating.unwrap();
    config.metadata.name = Some(format!("pw-{run}"));
    for webhook in config.webhooks.iter_mut().flatten() {
        webhook
            .namespace_selector
            .get_or_insert_with(Default::default)
            .match_expressions
            .get_or_insert_with(Vec::new)
            .push(LabelSelectorRequirement {
                key: TEST_LABEL.to_owned(),
                operator: "In".to_owned(),
                values: Some(vec![run.clone()]),
            });
    }
    let configs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    configs
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
    let ns = namespace(&client, "pw-down", &[(TEST_LABEL, &run)]).await;
    let created = create_pods(&client, vec![(ns, engine_pod("qwen"))]).await;
    assert!(
        !created[0].annotations().contains_key(BINDING_ANNOTATION),
        "admitted as written"
    );
    // The API server did try the webhook and failed open (rather than not calling it at all):
    // its own counter says so. No other test's webhook fails open.
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let metrics = client.request_text(request).await.unwrap();
    let failed_open = metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_admission_webhook_fail_open_count"))
        .filter(|l| l.contains(warmcache_webhook::serve::WEBHOOK_NAME))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    assert!(
        failed_open >= 1.0,
        "the API server failed open: {failed_open}"
    );
    configs
        .delete(&format!("pw-{run}"), &DeleteParams::default())
        .await
        .unwrap();
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// 400 with a message: not an AdmissionReview.
    Refused,
    /// Admitted as sent: nothing to do.
    Allowed,
    /// Admitted as sent, with a warning saying why nothing was done.
    AllowedWithWarning,
    /// Admitted with a patch (the rewrite, or the skip recorded).
    Patched,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_reviews_over_https_get_a_clear_answer() {
    let client = client().await;
    let served = Served::start(&client).await;
    let ns = served.namespace(&client, "pw-bad", &[]).await;
    let namespace = ns.as_str();
    let absent = unique("pw-absent");
    let review_in = |namespace: &str, kind: Value, resource: &str, object: Value| {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "0d3f6a43-5e1c-4bd7-9f3a-2a6a7e1c0001",
                "kind": kind,
                "resource": {"group": "", "version": "v1", "resource": resource},
                "namespace": namespace,
                "operation": "CREATE",
                "userInfo": {"username": "test"},
                "object": object,
                "dryRun": false
            }
        }))
        .unwrap()
    };
    let review =
        |kind: Value, resource: &str, object: Value| review_in(namespace, kind, resource, object);
    let pod_kind = json!({"group": "", "version": "v1", "kind": "Pod"});
    let gpu_pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
    let mut deep = String::new();
    for _ in 0..100_000 {
        deep.push('[');
    }
    let cases: Vec<(&str, Vec<u8>, Expect)> = vec![
        (
            "malformed JSON",
            b"{\"apiVersion\": ".to_vec(),
            Expect::Refused,
        ),
        ("not a review", b"[1, 2, 3]".to_vec(), Expect::Refused),
        ("deep nesting", deep.into_bytes(), Expect::Refused),
        (
            "a ConfigMap",
            review(
                json!({"group": "", "version": "v1", "kind": "ConfigMap"}),
                "configmaps",
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}),
            ),
            Expect::AllowedWithWarning,
        ),
        (
            "a pod with no containers",
            review(
                pod_kind.clone(),
                "pods",
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}}),
            ),
            Expect::Allowed,
        ),
        (
            "a pod that does not decode",
            review(
                pod_kind.clone(),
                "pods",
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": "vllm"}}),
            ),
            Expect::AllowedWithWarning,
        ),
        (
            // No cache has seen the namespace, so the webhook reads it (and finds nothing).
            "a pod in a namespace that does not exist",
            review_in(&absent, pod_kind.clone(), "pods", gpu_pod),
            Expect::AllowedWithWarning,
        ),
        (
            "a pod whose strings hold control characters",
            review(
                pod_kind,
                "pods",
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p\u{0}\u{1b}[31m"},
                    "spec": {"containers": [{"name": "c", "image": "i", "args": ["--model", "\u{202e}evil/../../x"],
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}),
            ),
            Expect::Patched,
        ),
    ];
    for (case, body, expect) in cases {
        let mut https = HttpsClient::connect(served.listen, &served.ca_pem)
            .await
            .unwrap();
        let reply =
            tokio::time::timeout(Duration::from_secs(5), https.post_json(WEBHOOK_PATH, body))
                .await
                .unwrap_or_else(|_| panic!("{case}: no answer within the timeout"))
                .unwrap_or_else(|e| panic!("{case}: {e}"));
        let text = String::from_utf8_lossy(&reply.body).into_owned();
        if expect == Expect::Refused {
            assert_eq!(reply.status, 400, "{case}: {text}");
            assert!(!text.is_empty(), "{case}: the refusal says why");
            continue;
        }
        assert_eq!(reply.status, 200, "{case}: {text}");
        let response = &reply.json().unwrap()["response"];
        assert_eq!(
            response["allowed"], true,
            "{case}: never refused: {response}"
        );
        let warned = response["warnings"]
            .as_array()
            .is_some_and(|w| !w.is_empty());
        let patched = !response["patch"].is_null();
        if case == "a pod in a namespace that does not exist" {
            assert!(
                response["warnings"][0]
                    .as_str()
                    .is_some_and(|w| w.contains(&format!("reading namespace {absent}"))),
                "{case}: {response}"
            );
        }
        match expect {
            Expect::Allowed => assert!(!warned && !patched, "{case}: {response}"),
            Expect::AllowedWithWarning => assert!(warned && !patched, "{case}: {response}"),
            Expect::Patched => assert!(patched, "{case}: {response}"),
            Expect::Refused => unreachable!(),
        }
    }
    served.stop(&client).await;
}

/// The catalog of the built-in copy with `csi.weka.io` (what the shared `nvcf-sc` uses) either
/// unqualified (no access modes: no flow for any workflow) or absent.
fn weka_catalog(qualified_entry: bool) -> String {
    let weka = if qualified_entry {
        "  - {name: csi.weka.io, provider: weka, accessModes: [], readerMountOptions: []}\n"
    } else {
        ""
    };
    format!(
        "apiVersion: storage.nvcf.nvidia.com/v1alpha1\nkind: StorageCapabilityCatalog\ndrivers:\n{weka}  - {{name: nvmesh-csi.excelero.com, provider: nvmesh, accessModes: [ReadWriteOnce, ReadOnlyMany], readerMountOptions: [ro]}}\n"
    )
}

/// Every gate combination and every non-durable path the shared StorageClass allows, through
/// the real API server: each pod records the selection it runs with (and the reason), and no
/// binding is created unless the selection is durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gates_and_non_durable_paths_record_their_selection_and_create_nothing() {
    use warmcache_api_modelcache::STORAGE_SELECTION_ANNOTATION;
    use warmcache_api_modelcache::selection::{Mode, Selection};

    let client = client().await;
    let no_flow = weka_catalog(true);
    let no_entry = weka_catalog(false);
    // (gates, catalog, what a regular namespace gets, what a sharing domain gets), each as
    // (mode, skip reason or "" for a rewrite).
    type Expected = (Mode, &'static str);
    let cases: [(&[&str], Option<&str>, Expected, Expected); 5] = [
        (
            &["--feature-gates", "CachingSupport=false"],
            None,
            (Mode::None, "caching-disabled"),
            (Mode::None, "caching-disabled"),
        ),
        (
            &[
                "--feature-gates",
                "CachingSupport=false,HelmModelCaching=false",
            ],
            None,
            (Mode::None, "caching-disabled"),
            (Mode::None, "caching-disabled"),
        ),
        (
            &["--feature-gates", "HelmModelCaching=false"],
            None,
            (Mode::Durable, ""),
            (Mode::None, "caching-disabled"),
        ),
        (
            &[],
            Some(&no_flow),
            (Mode::None, "no-durable-storage"),
            (Mode::Ephemeral, "no-durable-storage"),
        ),
        (
            &[],
            Some(&no_entry),
            (Mode::None, "no-durable-storage"),
            (Mode::Ephemeral, "no-durable-storage"),
        ),
    ];
    for (args, catalog, regular, helm) in cases {
        let served = Served::start_with(
            &client,
            Setup {
                args,
                catalog,
                otlp: None,
            },
        )
        .await;
        let plain = served.namespace(&client, "pw-sel", &[]).await;
        let domain = unique("sel");
        let shared = served
            .namespace(
                &client,
                "pw-sel",
                &[(SHARING_DOMAIN_LABEL, domain.as_str())],
            )
            .await;
        let created = create_pods(
            &client,
            vec![
                (plain.clone(), engine_pod("qwen")),
                (shared.clone(), engine_pod("qwen")),
            ],
        )
        .await;
        let mut durable = 0;
        for pod in &created {
            // create_pods answers in completion order.
            let (workflow, (mode, reason)) = if pod.namespace().as_deref() == Some(plain.as_str()) {
                (Workflow::RegularModelCache, regular)
            } else {
                (Workflow::HelmModelCache, helm)
            };
            let what = format!("{args:?}, catalog {}, {workflow:?}", catalog.is_some());
            let a = pod.annotations();
            let Some(value) = a.get(STORAGE_SELECTION_ANNOTATION) else {
                panic!("{what}: no selection on {a:?}\n{}", served.log());
            };
            let selection = Selection::parse(value).unwrap();
            assert_eq!(selection.mode, mode, "{what}: {value}");
            assert_eq!(selection.workflow, workflow, "{what}: {value}");
            assert_eq!(
                a.get(SKIP_REASON_ANNOTATION)
                    .map(String::as_str)
                    .unwrap_or(""),
                reason,
                "{what}"
            );
            if mode == Mode::Durable {
                durable += 1;
                assert_eq!(
                    Some(&selection.binding_uid),
                    a.get(BINDING_UID_ANNOTATION),
                    "{what}: the selection names the stored binding"
                );
            } else {
                assert_eq!(selection, Selection::non_durable(workflow, mode), "{what}");
                assert!(!a.contains_key(BINDING_ANNOTATION), "{what}");
            }
        }
        // Give a wrong write time to land, then count.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let bindings = served
            .bindings(&client)
            .list(&ListParams::default())
            .await
            .unwrap();
        assert_eq!(bindings.items.len(), durable, "{args:?}");
        served.stop(&client).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_compile_cache_sets_a_deployment_gets_one_set_binding_beside_its_model_binding() {
    use warmcache_modelvolume::keys::{
        CACHE_BINDING_ANNOTATION, CACHE_BINDING_UID_ANNOTATION, CACHE_CAPTURE_LABEL,
        CACHE_HANDLE_ANNOTATION, CACHE_KEY_LABEL,
    };
    let client = client().await;
    let served = Served::start_with(
        &client,
        Setup {
            args: &["--compile-cache-sets"],
            ..Setup::default()
        },
    )
    .await;
    let ns = served.namespace(&client, "pw-sets", &[]).await;
    let listed = deployment_pods(&client, &ns, 2).await;
    let sets: BTreeSet<(String, String, String)> = listed
        .iter()
        .map(|p| {
            let a = p.annotations();
            let get = |k: &str| {
                a.get(k).cloned().unwrap_or_else(|| {
                    panic!(
                        "pod {} lacks {k}; the webhook's log:\n{}",
                        p.name_any(),
                        served.log()
                    )
                })
            };
            (
                get(CACHE_BINDING_ANNOTATION),
                get(CACHE_BINDING_UID_ANNOTATION),
                get(CACHE_HANDLE_ANNOTATION),
            )
        })
        .collect();
    assert_eq!(sets.len(), 1, "one set for the Deployment: {sets:?}");
    let (name, uid, handle) = sets.into_iter().next().unwrap();
    let models: BTreeSet<(String, String)> = listed.iter().map(read_binding).collect();
    assert_eq!(models.len(), 1);
    let (model, _) = models.into_iter().next().unwrap();
    assert_ne!(model, name);
    let bindings = served.bindings(&client);
    let set = bindings.get(&name).await.unwrap();
    assert_eq!(set.uid().as_deref(), Some(uid.as_str()));
    assert_eq!(
        set.spec.identity.cache_handle_digest,
        warmcache_api_modelcache::sha256_digest(&handle)
    );
    assert_eq!(
        bindings
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        2,
        "the model's binding and the set's"
    );
    for p in &listed {
        assert_eq!(
            p.labels().get(CACHE_KEY_LABEL).map(String::as_str),
            Some(warmcache_api_modelcache::identity_hash(&set.spec.identity).as_str())
        );
        assert_eq!(
            p.labels().get(CACHE_CAPTURE_LABEL).map(String::as_str),
            Some("true"),
            "the set is not complete: a capture source"
        );
        let main = &p.spec.as_ref().unwrap().containers[0];
        assert!(
            main.env
                .iter()
                .flatten()
                .any(|e| e.name == "TORCHINDUCTOR_CACHE_DIR"
                    && e.value.as_deref() == Some("/opt/nvsnap/cache/torchinductor"))
        );
    }
    let metrics = served.metrics().await;
    // At least one per pod (a pod create the ReplicaSet controller retries is admitted again).
    assert!(
        counter(
            &metrics,
            "warmcache_webhook_compile_cache_set_admissions_total{role=\"capture\"}"
        ) >= 2.0,
        "{metrics}"
    );
    assert_eq!(
        counter(
            &metrics,
            "warmcache_webhook_bindings_total{result=\"created\"}"
        ),
        2.0
    );
    served.stop(&client).await;
}
