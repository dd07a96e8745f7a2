//! Download once, end to end, black box: the chart installed with the real Helm CLI on the real
//! test node (the image `hack/build-image.sh` packs, built here from the component binaries),
//! and the unmodified Deployment of `examples/llm-deployment.yaml` (the one the demo applies),
//! whose init container runs the real `hf download` against the simulated Hugging Face Hub, as a
//! vLLM chart does. Three namespaces: two in one sharing domain, one outside it. Every pod
//! becomes Ready with an engine that verifies every file's SHA-256 (the repository's
//! `SHA256SUMS`) through its read-only landing; each sharing domain downloads once (one Job), so
//! the Hub serves the model twice for four pods (without warmcache: four times). A fifth pod of
//! the workload, whose engine tries to write into the shared copy, joins without a download and
//! finds it read-only; and every download is one trace, exported over real OTLP/gRPC to a
//! receiver on loopback, from the pod's admission through the binding controller to the Job.
//!
//! What the node cannot give and the test supplies, and nothing else: the node has no GPU, so it
//! advertises the extended resource `nvidia.com/gpu` as a device plugin would; it has no pod
//! network, so the kit's `PodNetwork` bridges Services,
//! pod IPs, the API server and (egress) the Hub's loopback address into the pods; no registry,
//! so images are imported and pods say `imagePullPolicy: Never`; and the storage is the test
//! CSI driver's shared-filesystem profile, qualified by a catalog ConfigMap the test applies
//! (`catalog.enabled=false`, as a user with their own qualified driver does).
//!
//! With `E2E_KUBECONFIG` it runs against that cluster, nothing simulated
//! (docs/e2e-on-a-cluster.md): the Hub's byte count gives way to the download Jobs and the two
//! bindings the pods name, and the traces are not checked (no OTLP receiver the cluster's pods
//! reach).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Instant;

const TRACE_PARENT_ANNOTATION: &str = "warmcache.nvidia.io/traceparent";

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use warmcache_e2e::{
    APP_SELECTOR, BINDING_ANNOTATION, CONTROL, READY_TIMEOUT, Scenario, bindings_api, model,
    read_only_landing, ready_pods, run_id, tamper_pod, webhook_serving,
};
use warmcache_testkit::{OtlpReceiver, ReceivedSpan, eventually};

const DOMAIN_LABEL: &str = "nvca.nvcf.nvidia.io/model-cache-sharing-domain";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sharing_domain_downloads_a_model_once_with_the_real_client() {
    let started = Instant::now();
    // The product on the node, as a user installs it (images imported, the node's GPUs, a
    // catalog qualifying the test driver, helm install), the model on the simulated Hub, and
    // the traces' collector (real OTLP/gRPC, reached from the pods like the Hub); or a cluster
    // (E2E_KUBECONFIG).
    let run = Scenario::new("download_once")
        .model(model(24 << 20))
        .otlp()
        // Four replicas and the reader that tries to write.
        .gpus(5)
        .start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = run.client.clone();
    let workload = run.workload().unwrap();
    eprintln!("components Ready after {:.1?}", started.elapsed());
    let namespaces: Api<Namespace> = Api::all(client.clone());

    // Two namespaces of one sharing domain, one outside it.
    // The domain's name is this run's own: a cluster may hold another run's bindings.
    let domain = format!("e2e-{}", run_id());
    let a = run.namespace("e2e-a", &[]).await.unwrap();
    let b = run.namespace("e2e-b", &[]).await.unwrap();
    let c = run.namespace("e2e-c", &[]).await.unwrap();
    for ns in [&a, &b] {
        namespaces
            .patch(
                &ns.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {DOMAIN_LABEL: domain.as_str()}}})),
            )
            .await
            .unwrap();
    }

    // The webhook serves the workload's pods (through its Service, its caches seeing the
    // catalog).
    if let Err(e) = webhook_serving(&client, &a.name, &workload).await {
        panic!("{e}\n{}", run.report(&[]).await);
    }

    // The unmodified workload: three replicas in the domain, one outside it.
    for (ns, replicas) in [(&a, 2), (&b, 1), (&c, 1)] {
        let mut deployment = workload.clone();
        deployment.spec.replicas = Some(replicas);
        ns.api::<Deployment>()
            .create(&PostParams::default(), &deployment)
            .await
            .unwrap();
    }
    let names = [a.name.clone(), b.name.clone(), c.name.clone()];
    let all_ready = eventually("every pod Ready", READY_TIMEOUT, || {
        let (client, names) = (client.clone(), names.clone());
        async move { (ready_pods(&client, &names).await? == 4).then_some(()) }
    })
    .await;
    if all_ready.is_err() {
        let namespaces = [a.name.as_str(), b.name.as_str(), c.name.as_str()];
        panic!(
            "not every pod became Ready\n{}",
            run.report(&namespaces).await
        );
    }
    eprintln!("all 4 pods Ready after {:.1?}", started.elapsed());

    // A reader that tries to write: the workload's pod whose engine, once the model verifies,
    // tries to create a file in the landing and to append to one of the model's files, and
    // says which happened. It joins the domain's cache (no download) and must find it
    // read-only.
    let tamper = tamper_pod(&workload).unwrap();
    let admitted = b
        .api::<Pod>()
        .create(&PostParams::default(), &tamper)
        .await
        .unwrap();
    assert!(
        admitted.annotations().contains_key(BINDING_ANNOTATION),
        "the reader joins the cache: {:?}",
        admitted.annotations()
    );
    let pods = b.api::<Pod>();
    let finished = eventually(
        "the reader that tries to write to finish",
        READY_TIMEOUT,
        || {
            let pods = pods.clone();
            async move {
                let pod = pods.get("tamper").await.ok()?;
                let phase = pod.status.as_ref()?.phase.clone()?;
                (phase == "Succeeded" || phase == "Failed").then_some(pod)
            }
        },
    )
    .await;
    let Ok(finished) = finished else {
        panic!(
            "the reader that tries to write never finished\n{}",
            run.report(&[b.name.as_str(), CONTROL]).await
        );
    };
    let message = finished
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == "engine"))
        .and_then(|c| c.state.as_ref()?.terminated.as_ref()?.message.clone())
        .unwrap_or_default();
    assert_eq!(
        (
            message.trim(),
            finished.status.as_ref().and_then(|s| s.phase.as_deref())
        ),
        ("read-only", Some("Succeeded")),
        "the reader could write to the shared copy, or did not verify it"
    );
    eprintln!("a reader that tries to write finds its landing read-only");

    // One download per sharing domain.
    let mut jobs = BTreeMap::new();
    for ns in &names {
        let list = Api::<Job>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap();
        jobs.insert(ns.clone(), list.items.len());
    }
    assert_eq!(
        jobs[&a.name] + jobs[&b.name],
        1,
        "one download Job for the sharing domain: {jobs:?}"
    );
    assert_eq!(
        jobs[&c.name], 1,
        "one for the namespace outside it: {jobs:?}"
    );
    // The bindings this run's pods read (a cluster may hold others).
    let all_bindings = bindings_api(&client)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let mut ours = std::collections::BTreeSet::new();
    for ns in &names {
        for pod in Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default().labels(APP_SELECTOR))
            .await
            .unwrap()
        {
            ours.insert(pod.annotations()[BINDING_ANNOTATION].clone());
        }
    }
    let bindings: Vec<DynamicObject> = all_bindings
        .iter()
        .filter(|b| ours.contains(&b.name_any()))
        .cloned()
        .collect();
    assert_eq!(
        (ours.len(), bindings.len()),
        (2, 2),
        "one binding per sharing domain: {ours:?}"
    );
    // On the test node, the Hub's count: the model served once per sharing domain. On a
    // cluster (no Hub to count), the two Jobs above are the two downloads.
    let served = run.served();
    if let (Some(served), Some(model_bytes)) = (served, run.model_bytes()) {
        assert_eq!(all_bindings.len(), 2, "one binding per sharing domain");
        assert_eq!(
            served,
            2 * model_bytes,
            "the Hub served the model once per sharing domain"
        );
    }

    // Every pod reads through its read-only landing: the engine's mount at the landing is
    // read-only, of a claim mounted read-only (the webhook's rewrite, read back from the API).
    for ns in &names {
        for pod in Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default().labels(APP_SELECTOR))
            .await
            .unwrap()
        {
            if let Err(e) = read_only_landing(&pod) {
                panic!("{e}");
            }
        }
    }
    // One trace per model download: the admission that created each binding, the binding
    // controller continuing from the binding, its writer Job handed the trace on.
    let all_jobs: Vec<Job> = {
        let mut out = Vec::new();
        for ns in &names {
            out.extend(
                Api::<Job>::namespaced(client.clone(), ns)
                    .list(&ListParams::default())
                    .await
                    .unwrap()
                    .items,
            );
        }
        out
    };
    match &run.otlp {
        Some(otlp) => assert_traces(otlp, &bindings, &all_jobs).await,
        None => eprintln!("traces: not checked on a cluster (no OTLP receiver its pods reach)"),
    }

    match (served, run.model_bytes()) {
        (Some(served), Some(model_bytes)) => eprintln!(
            "download once: 4 pods in 3 namespaces (2 sharing domains) -> {} Jobs; the Hub served \
             {served} bytes = {:.1}x the model ({model_bytes} bytes); without warmcache each pod \
             downloads: 4.0x",
            jobs.values().sum::<usize>(),
            served as f64 / model_bytes as f64
        ),
        _ => eprintln!(
            "download once on {}: 4 pods in 3 namespaces (2 sharing domains) -> {} Jobs, 2 \
             bindings; without warmcache each pod downloads: 4 downloads",
            run.kubeconfig.display(),
            jobs.values().sum::<usize>()
        ),
    }
    eprintln!("done after {:.1?}", started.elapsed());
    run.finish().await;
}

/// `00-<trace>-<span>-<flags>` of `annotations`' traceparent.
fn trace_context(annotations: &BTreeMap<String, String>, what: &str) -> (String, String) {
    let tp = annotations
        .get(TRACE_PARENT_ANNOTATION)
        .unwrap_or_else(|| panic!("{what} carries no {TRACE_PARENT_ANNOTATION}: {annotations:?}"));
    let parts: Vec<&str> = tp.split('-').collect();
    assert_eq!(parts.len(), 4, "{what}: {tp}");
    (parts[1].to_owned(), parts[2].to_owned())
}

/// `s` and its ancestors among the received spans, `s` first, the trace's root last.
fn ancestry<'s>(spans: &'s [ReceivedSpan], mut s: &'s ReceivedSpan) -> Vec<&'s ReceivedSpan> {
    let mut out = vec![s];
    for _ in 0..spans.len() {
        match find(spans, &s.parent_span_id) {
            Some(parent) => {
                out.push(parent);
                s = parent;
            }
            None => break,
        }
    }
    out
}

/// Whether `chain` (from [`ancestry`]) begins at the webhook's review of a pod and passes its
/// `pod_admission` span.
fn begins_at_a_pod_admission(chain: &[&ReceivedSpan]) -> bool {
    let Some(root) = chain.last() else {
        return false;
    };
    root.service == "webhook"
        && root.name == "admission_review"
        && root.attribute("route") == Some("/mutate-pods")
        && chain
            .iter()
            .any(|s| s.service == "webhook" && s.name == "pod_admission")
}

fn find<'s>(spans: &'s [ReceivedSpan], span_id: &str) -> Option<&'s ReceivedSpan> {
    spans.iter().find(|s| s.span_id == span_id)
}

/// For every binding: the span its traceparent names was exported by the webhook (the
/// admission that created it), the binding controller's reconcile of it is that span's child,
/// and its writer Job names a binding-controller span of a trace that began in a webhook
/// admission (the pod whose download step the Job runs).
async fn assert_traces(otlp: &OtlpReceiver, bindings: &[DynamicObject], jobs: &[Job]) {
    let complete = eventually("the spans of every download", READY_TIMEOUT, || {
        let spans = otlp.spans();
        async move {
            let ok = bindings.iter().all(|b| {
                let (trace, span) = trace_context(b.annotations(), "a binding");
                find(&spans, &span).is_some()
                    && spans.iter().any(|s| {
                        s.trace_id == trace && s.parent_span_id == span && s.name == "reconcile"
                    })
            }) && jobs.iter().all(|j| {
                let (_, span) = trace_context(j.annotations(), "a writer Job");
                find(&spans, &span).is_some()
            });
            ok.then_some(spans)
        }
    })
    .await;
    let spans = match complete {
        Ok(spans) => spans,
        Err(_) => {
            let seen: Vec<String> = otlp
                .spans()
                .iter()
                .map(|s| {
                    format!(
                        "{} {} {}/{} <- {}",
                        s.service, s.name, s.trace_id, s.span_id, s.parent_span_id
                    )
                })
                .collect();
            panic!(
                "the traces are incomplete; bindings {:?}, jobs {:?}; spans received:\n{}",
                bindings
                    .iter()
                    .map(|b| b.annotations().get(TRACE_PARENT_ANNOTATION))
                    .collect::<Vec<_>>(),
                jobs.iter()
                    .map(|j| j.annotations().get(TRACE_PARENT_ANNOTATION))
                    .collect::<Vec<_>>(),
                seen.join("\n")
            );
        }
    };
    for b in bindings {
        let (trace, span) = trace_context(b.annotations(), "a binding");
        let admission = find(&spans, &span).unwrap();
        assert_eq!(admission.service, "webhook", "{admission:?}");
        assert_eq!(admission.trace_id, trace);
        let chain = ancestry(&spans, admission);
        assert!(
            begins_at_a_pod_admission(&chain),
            "the binding's trace begins at a pod's admission: {chain:#?}"
        );
        let reconcile = spans
            .iter()
            .find(|s| s.parent_span_id == span && s.name == "reconcile")
            .unwrap();
        assert_eq!(reconcile.service, "binding-controller", "{reconcile:?}");
        assert_eq!(reconcile.trace_id, trace);
    }
    for j in jobs {
        let (trace, span) = trace_context(j.annotations(), "a writer Job");
        let handed = find(&spans, &span).unwrap();
        assert_eq!(handed.service, "binding-controller", "{handed:?}");
        assert_eq!(handed.trace_id, trace);
        let chain = ancestry(&spans, handed);
        assert!(
            begins_at_a_pod_admission(&chain),
            "the Job's trace begins at a pod's admission: {chain:#?}"
        );
        assert!(chain.iter().all(|s| s.trace_id == trace), "{chain:#?}");
    }
    eprintln!(
        "traces: {} spans received; {} bindings and {} writer Jobs each continue a webhook admission's trace",
        spans.len(),
        bindings.len(),
        jobs.len()
    );
}
