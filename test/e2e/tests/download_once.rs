//! Download once, end to end, black box: the chart installed with the real Helm CLI on the real
//! test node (the image `hack/build-image.sh` packs, built here from the component binaries),
//! and an unmodified Deployment whose init container runs the real `hf download` against the
//! simulated Hugging Face Hub, as a vLLM chart does. Three namespaces: two in one sharing
//! domain, one outside it. Every pod becomes Ready with an engine that verifies every shard's
//! SHA-256 through its read-only landing; each sharing domain downloads once (one Job), so the
//! Hub serves the model twice for four pods (without warmcache: four times).
//!
//! What the node cannot give and the test supplies, and nothing else: the node has no GPU, so it
//! advertises the extended resource `example.com/gpu` and the webhook is told that is a GPU
//! (`webhook.gpuResources`); it has no pod network, so the kit's `PodNetwork` bridges Services,
//! pod IPs, the API server and (egress) the Hub's loopback address into the pods; no registry,
//! so images are imported and pods say `imagePullPolicy: Never`; and the storage is the test
//! CSI driver's shared-filesystem profile, qualified by a catalog ConfigMap the test applies
//! (`catalog.enabled=false`, as a user with their own qualified driver does).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde_json::json;
use warmcache_test_sources::hub::{Hub, HubOptions, model_files};
use warmcache_testkit::{
    COMPONENT_BINARIES, ControlPlane, PodNetwork, RealNode, TestCsiDriver, TestNamespace,
    built_binaries_dir, chart_dir, component_image, eventually, helm_binary, hf_client_image,
    model_clients_dir, namespace_report,
};

const RELEASE: &str = "warmcache";
const NAMESPACE: &str = "warmcache-system";
const CONTROL: &str = "nvca-modelcache-init";
const IMAGE_REPOSITORY: &str = "warmcache.test/warmcache";
const IMAGE_TAG: &str = "e2e";
const HF_IMAGE: &str = "warmcache.test/hf-client:1";
const GPU: &str = "example.com/gpu";
const DOMAIN_LABEL: &str = "nvca.nvcf.nvidia.io/model-cache-sharing-domain";
const BINDING_ANNOTATION: &str = "nvca.nvcf.nvidia.io/model-cache-binding";
const REPO: &str = "org/llm";
const READY_TIMEOUT: Duration = Duration::from_secs(420);

fn helm(kubeconfig: &str, args: &[&str]) -> String {
    let out = Command::new(helm_binary().unwrap())
        .args(args)
        .args(["--kubeconfig", kubeconfig])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The unmodified workload: an init container downloads the model with the real `hf` CLI into
/// an emptyDir, the engine refuses to start unless every file's SHA-256 matches.
fn workload(name: &str, replicas: i32, endpoint: &str, sums: &str) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "securityContext": {
                        "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
                        "runAsNonRoot": true,
                    },
                    "initContainers": [{
                        "name": "download-model",
                        "image": HF_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", format!("hf download {REPO} --local-dir /models/llm")],
                        "env": [
                            {"name": "HF_ENDPOINT", "value": endpoint},
                            {"name": "HOME", "value": "/tmp"},
                        ],
                        "volumeMounts": [{"name": "models", "mountPath": "/models"}],
                    }],
                    "containers": [{
                        "name": "engine",
                        "image": HF_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c",
                            "cd /models/llm && printf '%s\\n' \"$SUMS\" | sha256sum -c - \
                             && touch /tmp/ready && exec sleep 3600"],
                        "env": [{"name": "SUMS", "value": sums}],
                        "readinessProbe": {
                            "exec": {"command": ["cat", "/tmp/ready"]},
                            "periodSeconds": 1,
                        },
                        "resources": {
                            "requests": {GPU: "1", "cpu": "10m", "memory": "32Mi"},
                            "limits": {GPU: "1", "memory": "256Mi"},
                        },
                        "volumeMounts": [{"name": "models", "mountPath": "/models"}],
                    }],
                    "volumes": [{"name": "models", "emptyDir": {}}],
                },
            },
        },
    }))
    .unwrap()
}

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
    let kubeconfig = plane.kubeconfig_path().display().to_string();

    // The model source, reachable from pods at the address it has here.
    let hub = Hub::new(HubOptions::default());
    let files = model_files(REPO, "1", 24 << 20, 3);
    hub.publish(REPO, files.clone()).unwrap();
    let model_bytes: u64 = files.iter().map(|f| f.content.len()).sum();
    let hub_addr = hub.serve_loopback().await.unwrap();
    let endpoint = format!("http://{hub_addr}");
    // `sha256sum -c` lines, without a trailing empty line (busybox counts it as a mismatch).
    let sums = files
        .iter()
        .map(|f| format!("{}  {}", f.content.sha256(), f.path))
        .collect::<Vec<_>>()
        .join("\n");

    let net = PodNetwork::on_node(plane, node, &[hub_addr]).await.unwrap();

    // The product's image and the client's, on the node.
    let work = tempfile::tempdir().unwrap();
    let image = component_image(
        &format!("{IMAGE_REPOSITORY}:{IMAGE_TAG}"),
        &built_binaries_dir().unwrap(),
        &COMPONENT_BINARIES,
    )
    .unwrap_or_else(|e| panic!("{e} (run `cargo build --bins` for the component crates)"))
    .build(work.path())
    .unwrap();
    node.import_image(&image).await.unwrap();
    let hf = hf_client_image(HF_IMAGE, &model_clients_dir().unwrap(), work.path())
        .unwrap()
        .build(work.path())
        .unwrap();
    node.import_image(&hf).await.unwrap();
    eprintln!("images imported after {:.1?}", started.elapsed());

    // The node's "GPUs": an extended resource, as a device plugin would advertise.
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch_status(
            node.name(),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"capacity": {GPU: "4"}, "allocatable": {GPU: "4"}}})),
        )
        .await
        .unwrap();

    // The release namespace with a catalog that qualifies the test driver for ReadWriteMany.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap(),
        )
        .await
        .unwrap();
    let driver = TestCsiDriver::SharedFs.driver_name();
    let catalog = format!(
        "apiVersion: storage.nvcf.nvidia.com/v1alpha1\nkind: StorageCapabilityCatalog\n\
         drivers:\n  - name: {driver}\n    provider: testSharedFs\n    accessModes: [ReadWriteMany]\n    readerMountOptions: []\n"
    );
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    configmaps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "nvcf-storage-capabilities"},
                "data": {"storage-provider-capabilities.yaml": catalog},
            }))
            .unwrap(),
        )
        .await
        .unwrap();

    // The install, as docs/install.md gives it, with what this node needs.
    let chart = chart_dir().display().to_string();
    let sets = [
        format!("image.repository={IMAGE_REPOSITORY}"),
        format!("image.tag={IMAGE_TAG}"),
        "image.pullPolicy=Never".to_owned(),
        // The kit installed the CRDs from config/crd (the same files).
        "crds.enabled=false".to_owned(),
        "catalog.enabled=false".to_owned(),
        "storageClass.create=true".to_owned(),
        format!("storageClass.provisioner={driver}"),
        format!("webhook.gpuResources={{{GPU}}}"),
        "kvcacheOperator.enabled=false".to_owned(),
        "webhook.replicas=1".to_owned(),
    ];
    let mut args = vec!["install", RELEASE, &chart, "--namespace", NAMESPACE];
    for s in &sets {
        args.extend(["--set", s]);
    }
    helm(&kubeconfig, &args);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let up = eventually("the components Ready", READY_TIMEOUT, || {
        let deployments = deployments.clone();
        async move {
            let mut all = true;
            for name in ["warmcache-webhook", "warmcache-binding-controller"] {
                let d = deployments.get(name).await.ok()?;
                let status = d.status.unwrap_or_default();
                all &= status.ready_replicas.unwrap_or(0) >= 1;
            }
            all.then_some(())
        }
    })
    .await;
    if up.is_err() {
        panic!(
            "the components did not become Ready\n{}",
            report(&client, &[NAMESPACE], &net).await
        );
    }
    eprintln!("components Ready after {:.1?}", started.elapsed());

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

    // The webhook is serving (the API server reaches it through its Service) and its caches
    // see the catalog: a dry run of the workload's pod comes back rewritten. Nothing is stored.
    let probe_pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "probe"},
        "spec": workload("probe", 1, &endpoint, &sums).spec.template.spec,
    }))
    .unwrap();
    let a_pods = a.api::<Pod>();
    let serving = eventually("a dry-run pod rewritten", Duration::from_secs(120), || {
        let (pods, pod) = (a_pods.clone(), probe_pod.clone());
        async move {
            let admitted = pods
                .create(
                    &PostParams {
                        dry_run: true,
                        ..PostParams::default()
                    },
                    &pod,
                )
                .await
                .ok()?;
            admitted.annotations().get(BINDING_ANNOTATION).map(|_| ())
        }
    })
    .await;
    if serving.is_err() {
        panic!(
            "the webhook never rewrote a dry-run pod\n{}",
            report(&client, &[NAMESPACE], &net).await
        );
    }

    // The unmodified workload: three replicas in the domain, one outside it.
    for (ns, replicas) in [(&a, 2), (&b, 1), (&c, 1)] {
        ns.api::<Deployment>()
            .create(
                &PostParams::default(),
                &workload("llm", replicas, &endpoint, &sums),
            )
            .await
            .unwrap();
    }
    let names = [a.name.clone(), b.name.clone(), c.name.clone()];
    let all_ready = eventually("every pod Ready", READY_TIMEOUT, || {
        let client = client.clone();
        let names = names.clone();
        async move {
            let mut count = 0;
            for ns in &names {
                let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
                let list = pods
                    .list(&ListParams::default().labels("app=llm"))
                    .await
                    .ok()?;
                count += list.items.iter().filter(|p| ready(p)).count();
            }
            (count == 4).then_some(())
        }
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
            .list(&ListParams::default().labels("app=llm"))
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
    eprintln!(
        "download once: 4 pods in 3 namespaces (2 sharing domains) -> {} Jobs; the Hub served \
         {served} bytes = {:.1}x the model ({model_bytes} bytes); without warmcache each pod \
         downloads: 4.0x",
        jobs.values().sum::<usize>(),
        served as f64 / model_bytes as f64
    );
    eprintln!("done after {:.1?}", started.elapsed());
}
