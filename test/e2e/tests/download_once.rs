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

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Instant;

const TRACE_PARENT_ANNOTATION: &str = "warmcache.nvidia.io/traceparent";

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde_json::json;
use warmcache_e2e::{
    APP_SELECTOR, Install, NAMESPACE, READY_TIMEOUT, REPO, example_deployment, install, model,
    ready_pods, webhook_serving,
};
use warmcache_test_sources::hub::{Hub, HubOptions};
use warmcache_testkit::{
    ControlPlane, OtlpReceiver, PodNetwork, RealNode, ReceivedSpan, TestNamespace,
    built_binaries_dir, eventually, namespace_report,
};

const CONTROL: &str = "nvca-modelcache-init";
const IMAGE_REPOSITORY: &str = "warmcache.test/warmcache";
const IMAGE_TAG: &str = "e2e";
const HF_IMAGE: &str = "warmcache.test/hf-client:1";
const DOMAIN_LABEL: &str = "nvca.nvcf.nvidia.io/model-cache-sharing-domain";

async fn report(client: &Client, namespaces: &[&str], net: &PodNetwork) -> String {
    let mut out = String::new();
    for ns in namespaces {
        out.push_str(&namespace_report(client, ns).await);
    }
    let bindings = bindings_api(client)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    for b in bindings {
        out.push_str(&format!(
            "binding {}: {}\n",
            b.name_any(),
            serde_json::to_string(&b.data.get("status")).unwrap_or_default()
        ));
    }
    out.push_str(&net.report());
    out
}

fn bindings_api(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("nvca.nvcf.nvidia.io", "v2beta1", "ModelCacheBinding");
    Api::namespaced_with(client.clone(), CONTROL, &ApiResource::from_gvk(&gvk))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sharing_domain_downloads_a_model_once_with_the_real_client() {
    let started = Instant::now();
    let plane = ControlPlane::shared().await.unwrap();
    let node = RealNode::shared().await.unwrap();
    let client = plane.client().await.unwrap();

    // The model source, reachable from pods at the address it has here.
    let hub = Hub::new(HubOptions::default());
    let files = model(24 << 20);
    let model_bytes: u64 = files.iter().map(|f| f.content.len()).sum();
    hub.publish(REPO, files).unwrap();
    let hub_addr = hub.serve_loopback().await.unwrap();
    let endpoint = format!("http://{hub_addr}");
    let workload = example_deployment(&endpoint, HF_IMAGE).unwrap();

    // The traces' collector: real OTLP/gRPC, reached from the pods like the Hub.
    let otlp = OtlpReceiver::start().await.unwrap();
    let otlp_endpoint = otlp.endpoint();
    let otlp_addr: std::net::SocketAddr =
        otlp_endpoint.trim_start_matches("http://").parse().unwrap();

    let net = PodNetwork::on_node(plane, node, &[hub_addr, otlp_addr])
        .await
        .unwrap();

    // The product on the node, as a user installs it (images imported, the node's GPUs, a
    // catalog qualifying the test driver, helm install).
    let work = tempfile::tempdir().unwrap();
    let how = Install {
        image_repository: IMAGE_REPOSITORY,
        image_tag: IMAGE_TAG,
        bin_dir: &built_binaries_dir().unwrap(),
        hf_image: HF_IMAGE,
        // Four replicas and the reader that tries to write.
        gpus: 5,
        kubeconfig: plane.kubeconfig_path(),
        work_dir: work.path(),
        otel_endpoint: Some(&otlp_endpoint),
        extra_sets: &[],
    };
    if let Err(e) = install(plane, node, &net, &how).await {
        panic!("{e}");
    }
    eprintln!("components Ready after {:.1?}", started.elapsed());
    let namespaces: Api<Namespace> = Api::all(client.clone());

    // Two namespaces of one sharing domain, one outside it.
    let a = TestNamespace::new("e2e-a").await.unwrap();
    let b = TestNamespace::new("e2e-b").await.unwrap();
    let c = TestNamespace::new("e2e-c").await.unwrap();
    for ns in [&a, &b] {
        namespaces
            .patch(
                &ns.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {DOMAIN_LABEL: "e2e"}}})),
            )
            .await
            .unwrap();
    }

    // The webhook serves the workload's pods (through its Service, its caches seeing the
    // catalog).
    if let Err(e) = webhook_serving(&client, &a.name, &workload).await {
        panic!("{e}\n{}", report(&client, &[NAMESPACE], &net).await);
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
        let namespaces = [
            a.name.as_str(),
            b.name.as_str(),
            c.name.as_str(),
            CONTROL,
            NAMESPACE,
        ];
        panic!(
            "not every pod became Ready\n{}",
            report(&client, &namespaces, &net).await
        );
    }
    eprintln!("all 4 pods Ready after {:.1?}", started.elapsed());

    // A reader that tries to write: the workload's pod whose engine, once the model verifies,
    // tries to create a file in the landing and to append to one of the model's files, and
    // says which happened. It joins the domain's cache (no download) and must find it
    // read-only.
    let mut spec = workload.spec.template.spec.clone().unwrap();
    spec.restart_policy = Some("Never".to_owned());
    let engine = spec
        .containers
        .iter_mut()
        .find(|c| c.name == "engine")
        .unwrap();
    engine.readiness_probe = None;
    engine.command = Some(vec![
        "sh".to_owned(),
        "-c".to_owned(),
        "cd /models/llm && sha256sum -c SHA256SUMS >/dev/null || { echo unverified > /dev/termination-log; exit 2; }; \
         if touch /models/llm/tampered 2>/dev/null || echo x 2>/dev/null >> /models/llm/config.json; \
         then echo writable > /dev/termination-log; exit 1; \
         else echo read-only > /dev/termination-log; fi"
            .to_owned(),
    ]);
    let tamper = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some("tamper".to_owned()),
            ..Default::default()
        },
        spec: Some(spec),
        ..Default::default()
    };
    let admitted = b
        .api::<Pod>()
        .create(&PostParams::default(), &tamper)
        .await
        .unwrap();
    assert!(
        admitted
            .annotations()
            .contains_key(warmcache_e2e::BINDING_ANNOTATION),
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
            report(&client, &[b.name.as_str(), CONTROL], &net).await
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
    let bindings = bindings_api(&client)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(bindings.items.len(), 2, "one binding per sharing domain");
    let served = hub.stats().bytes_by_repo.get(REPO).copied().unwrap_or(0);
    assert_eq!(
        served,
        2 * model_bytes,
        "the Hub served the model once per sharing domain"
    );

    // Every pod reads through its read-only landing: the engine's mount at the landing is
    // read-only, of a claim mounted read-only (the webhook's rewrite, read back from the API).
    for ns in &names {
        for pod in Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default().labels(APP_SELECTOR))
            .await
            .unwrap()
        {
            let name = pod.name_any();
            let spec = pod.spec.clone().unwrap();
            let engine = spec.containers.iter().find(|c| c.name == "engine").unwrap();
            let mount = engine
                .volume_mounts
                .iter()
                .flatten()
                .find(|m| m.mount_path == "/models/llm")
                .unwrap_or_else(|| panic!("{name}: no mount at the landing: {engine:?}"));
            assert_eq!(mount.read_only, Some(true), "{name}: {mount:?}");
            let volume = spec
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == mount.name)
                .unwrap();
            let claim = volume
                .persistent_volume_claim
                .as_ref()
                .unwrap_or_else(|| panic!("{name}: the landing is not a claim: {volume:?}"));
            assert_eq!(claim.read_only, Some(true), "{name}: {claim:?}");
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
    assert_traces(&otlp, &bindings.items, &all_jobs).await;

    eprintln!(
        "download once: 4 pods in 3 namespaces (2 sharing domains) -> {} Jobs; the Hub served \
         {served} bytes = {:.1}x the model ({model_bytes} bytes); without warmcache each pod \
         downloads: 4.0x",
        jobs.values().sum::<usize>(),
        served as f64 / model_bytes as f64
    );
    eprintln!("done after {:.1?}", started.elapsed());
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
