//! The KVCacheBackend controller against a real API server: finalizer, the rendered workloads
//! applied with owner references, a removed group pruned (and nothing of another backend),
//! stale member Pods restarted only while the rest of their group is ready, and the teardown
//! waiting for consumers, then removing the workloads and the finalizer.
//!
//! Its own test binary: backends are cluster-scoped, and a controller watching all of them must
//! not reconcile the objects of other test binaries' tests.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use warmcache_api_kvcache::v1alpha1::KVCacheBackend;
use warmcache_kvcache::names::{self, POD_SPEC_HASH_ANNOTATION};
use warmcache_kvcache::vectors;
use warmcache_kvcache_operator::controller::{FINALIZER, Settings, start};
use warmcache_runtime::LogFormat;
use warmcache_runtime::{Runtime, RuntimeArgs};
use warmcache_testkit::{ControlPlane, TestNamespace, eventually};

const WAIT: Duration = Duration::from_secs(60);

/// One controller at a time: each watches every (cluster-scoped) backend, so two running at
/// once would both reconcile each test's backends into their own namespaces.
static ONE_CONTROLLER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn running_controller(
    plane: &ControlPlane,
    namespace: &str,
) -> (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<Result<(), warmcache_runtime::RuntimeError>>,
    std::net::SocketAddr,
) {
    // The controller runs as the ServiceAccount the chart gives it, with the roles generated from
    // src/rbac.rs: a call the list forgot fails these tests.
    let admin_client = plane.client().await.unwrap();
    let account = warmcache_testkit::ComponentAccount::create(
        plane,
        &admin_client,
        "kvcache-operator",
        namespace,
        namespace,
    )
    .await
    .unwrap();
    let args = RuntimeArgs {
        kubeconfig: Some(account.kubeconfig_path().to_path_buf()),
        kube_context: None,
        log_level: None,
        log_format: LogFormat::Plain,
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        shutdown_grace: Duration::from_secs(5),
        shutdown_delay: Duration::ZERO,
        kube_api_qps: warmcache_runtime::DEFAULT_KUBE_API_QPS,
        kube_api_burst: warmcache_runtime::DEFAULT_KUBE_API_BURST,
    };
    static LOGS: std::sync::Once = std::sync::Once::new();
    LOGS.call_once(|| {
        // Warnings of the controller reach the test's output.
        let config = warmcache_telemetry::TelemetryConfig::from_lookup(
            "kvcache-operator-test",
            Some("warn"),
            LogFormat::Plain,
            |_| None,
        );
        if let Ok(guard) = warmcache_telemetry::init(&config) {
            std::mem::forget(guard);
        }
    });
    let mut runtime = Runtime::builder("kvcache-operator", args)
        .without_global_telemetry()
        .with_client()
        .build()
        .await
        .unwrap();
    start(
        &mut runtime,
        &Settings {
            namespace: namespace.to_owned(),
            default_image: None,
            concurrency: 2,
            admin_address: "127.0.0.1:1".to_owned(),
            image_users: Vec::new(),
        },
    )
    .unwrap();
    let stop = runtime.shutdown_token();
    let admin = runtime.admin_addr();
    let run = async move {
        let _account = account;
        runtime.run().await
    };
    (stop, tokio::spawn(run), admin)
}

/// The controller's `/metrics` (HTTP/1.0, so the body is not chunked).
async fn scrape(admin: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(admin).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: admin\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    // For `promtool check metrics`: WARMCACHE_KVCACHE_METRICS_DUMP=<file> keeps the last scrape.
    if let Some(path) = std::env::var_os("WARMCACHE_KVCACHE_METRICS_DUMP") {
        std::fs::write(path, body).unwrap();
    }
    body.to_owned()
}

/// The value of the sample `series` (name and labels exactly as exposed).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

fn backend(name: &str, value: Value) -> KVCacheBackend {
    let mut value = value;
    value["metadata"]["name"] = json!(name);
    serde_json::from_value(value).unwrap()
}

async fn exists<K>(api: &Api<K>, name: &str) -> Option<K>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug + kube::Resource,
{
    api.get_opt(name).await.unwrap()
}

/// A member Pod as its DaemonSet would create it, with the given pod-spec hash, ready or not.
async fn member_pod(
    client: &Client,
    ns: &str,
    name: &str,
    ds: &DaemonSet,
    hash: &str,
    ready: bool,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let labels = ds.spec.selector.match_labels.clone().unwrap();
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                POD_SPEC_HASH_ANNOTATION.to_owned(),
                hash.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "store".into(),
                image: Some(vectors::IMAGE.into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    pods.create(&PostParams::default(), &pod).await.unwrap();
    set_ready(client, ns, name, ready).await;
}

async fn set_ready(client: &Client, ns: &str, name: &str, ready: bool) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let status = if ready { "True" } else { "False" };
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": status, "lastTransitionTime": "2026-12-01T00:00:00Z"}
        ]}})),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backend_becomes_workloads_rolls_members_prunes_and_tears_down() {
    let _one = ONE_CONTROLLER.lock().await;
    let plane = ControlPlane::shared().await.unwrap();
    let ns = TestNamespace::new("kvc-ctl").await.unwrap();
    let client = ns.client.clone();
    let (stop, running, _admin) = running_controller(plane, &ns.name).await;
    let backends: Api<KVCacheBackend> = Api::all(client.clone());
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns.name);
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);

    let name = format!("kvc-{}", &ns.name[ns.name.len() - 6..]);
    let other = format!("{name}-other");
    backends
        .create(&PostParams::default(), &backend(&name, vectors::v9()))
        .await
        .unwrap();
    backends
        .create(&PostParams::default(), &backend(&other, vectors::v1()))
        .await
        .unwrap();

    // The finalizer, then the workloads, owned by the backend.
    let stored = eventually("the finalizer", WAIT, || {
        let backends = backends.clone();
        let name = name.clone();
        async move {
            let b = backends.get(&name).await.ok()?;
            b.finalizers().iter().any(|f| f == FINALIZER).then_some(b)
        }
    })
    .await
    .unwrap();
    let uid = stored.uid().unwrap();
    let member0 = format!("{name}-member-0");
    let member1 = format!("{name}-member-1");
    let ds0 = eventually("both member DaemonSets and the leader", WAIT, || {
        let (deployments, services, daemonsets) =
            (deployments.clone(), services.clone(), daemonsets.clone());
        let (name, member0, member1) = (name.clone(), member0.clone(), member1.clone());
        async move {
            deployments
                .get_opt(&format!("{name}-leader"))
                .await
                .ok()??;
            services.get_opt(&format!("{name}-leader")).await.ok()??;
            daemonsets.get_opt(&member1).await.ok()??;
            daemonsets.get_opt(&member0).await.ok()?
        }
    })
    .await
    .unwrap();
    assert!(
        ds0.owner_references()
            .iter()
            .any(|o| o.uid == uid && o.controller == Some(true)),
        "{:?}",
        ds0.owner_references()
    );
    let other_ds = format!("{other}-member-0");
    eventually("the other backend's member", WAIT, || {
        let (daemonsets, other_ds) = (daemonsets.clone(), other_ds.clone());
        async move { daemonsets.get_opt(&other_ds).await.ok()? }
    })
    .await
    .unwrap();

    // A template change: stale members are restarted only while the rest of the group is
    // ready, oldest name first. The group is set up mid-rollout, in an order no timing can
    // change: the template changes first, then a replacement that is not ready yet, then two
    // stale members beside it.
    let old_hash = ds0
        .spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .as_ref()
        .unwrap()[POD_SPEC_HASH_ANNOTATION]
        .clone();
    // The controller writes the status meanwhile: re-read and retry on a conflict.
    loop {
        let mut changed = backends.get(&name).await.unwrap();
        changed.spec.connection.managed.as_mut().unwrap().members[0].capacity_per_member =
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("8Gi".into());
        match backends
            .replace(&name, &PostParams::default(), &changed)
            .await
        {
            Ok(_) => break,
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(err) => panic!("changing the spec: {err}"),
        }
    }
    let new_hash = eventually("the DaemonSet template to change", WAIT, || {
        let (daemonsets, member0, old_hash) =
            (daemonsets.clone(), member0.clone(), old_hash.clone());
        async move {
            let ds = daemonsets.get(&member0).await.ok()?;
            let hash = ds
                .spec
                .template
                .metadata?
                .annotations?
                .remove(POD_SPEC_HASH_ANNOTATION)?;
            (hash != old_hash).then_some(hash)
        }
    })
    .await
    .unwrap();
    // A replacement that is not ready yet holds the rollout.
    member_pod(&client, &ns.name, "m0-c", &ds0, &new_hash, false).await;
    member_pod(&client, &ns.name, "m0-a", &ds0, &old_hash, true).await;
    member_pod(&client, &ns.name, "m0-b", &ds0, &old_hash, true).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for stale in ["m0-a", "m0-b"] {
        assert!(
            exists(&pods, stale).await.is_some(),
            "{stale} restarted while a current member was not ready"
        );
    }
    set_ready(&client, &ns.name, "m0-c", true).await;
    eventually("both stale members restarted", WAIT, || {
        let pods = pods.clone();
        async move {
            (pods.get_opt("m0-a").await.ok()?.is_none()
                && pods.get_opt("m0-b").await.ok()?.is_none())
            .then_some(())
        }
    })
    .await
    .unwrap();
    assert!(
        exists(&pods, "m0-c").await.is_some(),
        "a current member was restarted"
    );

    // Removing the second group prunes its DaemonSet, and only it.
    loop {
        let mut shrunk = backends.get(&name).await.unwrap();
        shrunk
            .spec
            .connection
            .managed
            .as_mut()
            .unwrap()
            .members
            .truncate(1);
        match backends
            .replace(&name, &PostParams::default(), &shrunk)
            .await
        {
            Ok(_) => break,
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(err) => panic!("removing the second group: {err}"),
        }
    }
    eventually("the removed group's DaemonSet to go", WAIT, || {
        let (daemonsets, member1) = (daemonsets.clone(), member1.clone());
        async move {
            daemonsets
                .get_opt(&member1)
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await
    .unwrap();
    assert!(exists(&daemonsets, &member0).await.is_some());
    assert!(exists(&daemonsets, &other_ds).await.is_some());

    // A consumer holds the deletion; the workloads stay until it lets go.
    backends
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"usedBy": [{"kind": "KVCachePool", "namespace": "", "name": "pool-a"}]}})),
        )
        .await
        .unwrap();
    backends
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(exists(&backends, &name).await.is_some());
    assert!(
        exists(&daemonsets, &member0).await.is_some(),
        "workloads deleted while in use"
    );
    backends
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"usedBy": null}})),
        )
        .await
        .unwrap();
    eventually("the backend and its workloads to go", WAIT, || {
        let (backends, deployments, daemonsets, name, member0) = (
            backends.clone(),
            deployments.clone(),
            daemonsets.clone(),
            name.clone(),
            member0.clone(),
        );
        async move {
            (backends.get_opt(&name).await.ok()?.is_none()
                && deployments
                    .get_opt(&format!("{name}-leader"))
                    .await
                    .ok()?
                    .is_none()
                && daemonsets.get_opt(&member0).await.ok()?.is_none())
            .then_some(())
        }
    })
    .await
    .unwrap();
    // The other backend is untouched.
    assert!(exists(&daemonsets, &other_ds).await.is_some());
    assert!(
        exists(&deployments, &format!("{other}-leader"))
            .await
            .is_some()
    );

    backends
        .delete(&other, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the other backend to go", WAIT, || {
        let (backends, other) = (backends.clone(), other.clone());
        async move { backends.get_opt(&other).await.ok()?.is_none().then_some(()) }
    })
    .await
    .unwrap();
    stop.cancel();
    running.await.unwrap().unwrap();
    ns.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_backend_empties_its_tier_on_every_selected_node_then_goes() {
    use k8s_openapi::api::core::v1::Node;
    use warmcache_kvcache::teardown::cleanup_pod_name;

    let _one = ONE_CONTROLLER.lock().await;
    let plane = ControlPlane::shared().await.unwrap();
    let ns = TestNamespace::new("kvc-clean").await.unwrap();
    let client = ns.client.clone();
    let (stop, running, admin) = running_controller(plane, &ns.name).await;
    let backends: Api<KVCacheBackend> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let suffix = &ns.name[ns.name.len() - 6..];
    let name = format!("kvc-clean-{suffix}");
    let node = format!("tier-node-{suffix}");
    let label = format!("tier-{suffix}");
    nodes
        .create(
            &PostParams::default(),
            &Node {
                metadata: ObjectMeta {
                    name: Some(node.clone()),
                    labels: Some(BTreeMap::from([("kvcache".to_owned(), label.clone())])),
                    ..ObjectMeta::default()
                },
                ..Node::default()
            },
        )
        .await
        .unwrap();
    let value = vectors::with(vectors::v2(), |o| {
        vectors::members(o)[0]["nodeSelector"] = json!({"kvcache": label});
        vectors::tier0(o)["cleanAfterDelete"] = json!(true);
    });
    backends
        .create(&PostParams::default(), &backend(&name, value))
        .await
        .unwrap();
    // The status says what the controller sees: the leader cannot be reached here.
    let status = eventually("a status", WAIT, || {
        let (backends, name) = (backends.clone(), name.clone());
        async move {
            let b = backends.get(&name).await.ok()?;
            let status = b.status?;
            (status.phase.is_some() && status.endpoints.is_some()).then_some(status)
        }
    })
    .await
    .unwrap();
    assert_eq!(status.phase.as_deref(), Some("Provisioning"), "{status:?}");
    assert!(
        status.capacity.is_none(),
        "capacity without a scrape: {status:?}"
    );
    let endpoints: Vec<String> = status
        .endpoints
        .clone()
        .unwrap_or_default()
        .iter()
        .map(|e| e.address.clone())
        .collect();
    assert!(
        endpoints.contains(&format!("{name}-leader.{}.svc:50051", ns.name)),
        "{endpoints:?} in {status:?}"
    );

    backends
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    let cleanup = cleanup_pod_name(&name, &node);
    let pod = eventually("the cleanup Pod on the selected node", WAIT, || {
        let (pods, cleanup) = (pods.clone(), cleanup.clone());
        async move { pods.get_opt(&cleanup).await.ok()? }
    })
    .await
    .unwrap();
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(node.as_str())
    );
    // Held until the node reports its tier empty.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(exists(&backends, &name).await.is_some());
    pods.patch_status(
        &cleanup,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
    )
    .await
    .unwrap();
    // The cleanup Pod is deleted (bound to a node without a kubelet, it may stay Terminating
    // until the Pod garbage collector removes it), then the finalizer goes.
    eventually(
        "the backend to go and its cleanup Pod to be deleted",
        WAIT,
        || {
            let (backends, pods, name, cleanup) = (
                backends.clone(),
                pods.clone(),
                name.clone(),
                cleanup.clone(),
            );
            async move {
                let pod_deleted = pods
                    .get_opt(&cleanup)
                    .await
                    .ok()?
                    .is_none_or(|pod| pod.metadata.deletion_timestamp.is_some());
                (backends.get_opt(&name).await.ok()?.is_none() && pod_deleted).then_some(())
            }
        },
    )
    .await
    .unwrap();

    // What the metrics say: one node emptied, counted once the finalizer is off; the teardown
    // went through its steps; every phase and outcome is exported.
    let text = scrape(admin).await;
    let p = "warmcache_kvcache_operator_";
    assert_eq!(
        sample(
            &text,
            &format!("{p}tier_cleanup_nodes_total{{outcome=\"emptied\"}}")
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            &format!("{p}tier_cleanup_nodes_total{{outcome=\"given_up_deadline\"}}")
        ),
        Some(0.0)
    );
    for outcome in ["finalizer_added", "cleaning_tier", "released"] {
        assert!(
            sample(
                &text,
                &format!("{p}reconcile_outcomes_total{{outcome=\"{outcome}\"}}")
            )
            .is_some_and(|v| v >= 1.0),
            "{outcome}: {text}"
        );
    }
    for phase in [
        "Provisioning",
        "Ready",
        "Degraded",
        "Error",
        "Deleting",
        "Unknown",
    ] {
        assert!(
            sample(&text, &format!("{p}backends{{phase=\"{phase}\"}}")).is_some(),
            "{phase}: {text}"
        );
    }
    // The leader could not be read: no tier figures, not zeros from a failed read.
    assert_eq!(
        sample(&text, &format!("{p}tier_reporting_backends")),
        Some(0.0)
    );
    assert!(
        sample(
            &text,
            &format!("{p}reconcile_runs_total{{controller=\"kvcachebackend\"}}")
        )
        .is_some()
    );

    nodes.delete(&node, &DeleteParams::default()).await.unwrap();
    stop.cancel();
    running.await.unwrap().unwrap();
    ns.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_teardown_stopped_midway_is_finished_by_a_new_controller_without_repeating_work() {
    use k8s_openapi::api::core::v1::Node;
    use warmcache_kvcache::teardown::{LABEL_CLEANUP_OF, cleanup_pod_name};

    let _one = ONE_CONTROLLER.lock().await;
    let plane = ControlPlane::shared().await.unwrap();
    let ns = TestNamespace::new("kvc-resume").await.unwrap();
    let client = ns.client.clone();
    let backends: Api<KVCacheBackend> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let suffix = &ns.name[ns.name.len() - 6..];
    let name = format!("kvc-resume-{suffix}");
    let label = format!("resume-{suffix}");
    let node_names = [format!("resume-a-{suffix}"), format!("resume-b-{suffix}")];
    for node in &node_names {
        nodes
            .create(
                &PostParams::default(),
                &Node {
                    metadata: ObjectMeta {
                        name: Some(node.clone()),
                        labels: Some(BTreeMap::from([("kvcache".to_owned(), label.clone())])),
                        ..ObjectMeta::default()
                    },
                    ..Node::default()
                },
            )
            .await
            .unwrap();
    }
    let value = vectors::with(vectors::v2(), |o| {
        vectors::members(o)[0]["nodeSelector"] = json!({"kvcache": label});
        vectors::tier0(o)["cleanAfterDelete"] = json!(true);
    });

    // The first controller takes the backend and starts its teardown.
    let (stop, running, _admin) = running_controller(plane, &ns.name).await;
    backends
        .create(&PostParams::default(), &backend(&name, value))
        .await
        .unwrap();
    eventually("the finalizer", WAIT, || {
        let (backends, name) = (backends.clone(), name.clone());
        async move {
            let b = backends.get(&name).await.ok()?;
            b.finalizers().iter().any(|f| f == FINALIZER).then_some(())
        }
    })
    .await
    .unwrap();
    backends
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    let cleanup: Vec<String> = node_names
        .iter()
        .map(|node| cleanup_pod_name(&name, node))
        .collect();
    let first_uids = eventually("both cleanup Pods", WAIT, || {
        let (pods, cleanup) = (pods.clone(), cleanup.clone());
        async move {
            let mut uids = Vec::new();
            for pod in &cleanup {
                uids.push(pods.get_opt(pod).await.ok()??.metadata.uid?);
            }
            Some(uids)
        }
    })
    .await
    .unwrap();
    // Node a finishes; node b is still running when the controller stops.
    let set_phase = |pod: String, phase: &'static str| {
        let pods = pods.clone();
        async move {
            pods.patch_status(
                &pod,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": phase}})),
            )
            .await
            .unwrap();
        }
    };
    set_phase(cleanup[0].clone(), "Succeeded").await;
    set_phase(cleanup[1].clone(), "Running").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();
    running.await.unwrap().unwrap();

    // With no controller the finalizer holds the backend, and nothing changes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let held = exists(&backends, &name)
        .await
        .expect("held by its finalizer");
    assert!(held.metadata.deletion_timestamp.is_some());

    // A new controller resumes from what is stored: it neither recreates the finished node's
    // Pod nor starts a second cleanup on the running one, and waits for it.
    let (stop, running, admin) = running_controller(plane, &ns.name).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let ours = pods
        .list(&kube::api::ListParams::default().labels(&format!("{LABEL_CLEANUP_OF}={name}")))
        .await
        .unwrap();
    let mut uids: Vec<String> = ours
        .items
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    uids.sort();
    let mut expected = first_uids.clone();
    expected.sort();
    assert_eq!(uids, expected, "the same two Pods, none recreated or added");
    assert!(
        exists(&backends, &name).await.is_some(),
        "held while node b runs"
    );

    set_phase(cleanup[1].clone(), "Succeeded").await;
    eventually("the backend to go", WAIT, || {
        let (backends, name) = (backends.clone(), name.clone());
        async move { backends.get_opt(&name).await.ok()?.is_none().then_some(()) }
    })
    .await
    .unwrap();
    // Every cleanup Pod of the incarnation is deleted (Terminating at most: no kubelet here).
    // The last ones may go with their owner, by the garbage collector, just after it.
    for pod in &cleanup {
        eventually(&format!("cleanup Pod {pod} deleted"), WAIT, || {
            let (pods, pod) = (pods.clone(), pod.clone());
            async move {
                let left = pods.get_opt(&pod).await.ok()?;
                left.is_none_or(|p| p.metadata.deletion_timestamp.is_some())
                    .then_some(())
            }
        })
        .await
        .unwrap();
    }
    // The new controller made the final pass: both nodes counted, once.
    let text = scrape(admin).await;
    assert_eq!(
        sample(
            &text,
            "warmcache_kvcache_operator_tier_cleanup_nodes_total{outcome=\"emptied\"}"
        ),
        Some(2.0),
        "{text}"
    );

    for node in &node_names {
        nodes.delete(node, &DeleteParams::default()).await.unwrap();
    }
    stop.cancel();
    running.await.unwrap().unwrap();
    ns.cleanup().await;
}

/// A highly available leader gets its ServiceAccount, a Role on its own Lease and the binding
/// between them (and, with Lease addressing, read access for the members), all owned by the
/// backend; turning high availability off prunes them. The operator holds every verb these Roles
/// grant, so creating them is no escalation.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_highly_available_leader_gets_lease_access_that_goes_with_high_availability() {
    let _one = ONE_CONTROLLER.lock().await;
    let plane = ControlPlane::shared().await.unwrap();
    let ns = TestNamespace::new("kvc-ha").await.unwrap();
    let client = ns.client.clone();
    let (stop, running, _admin) = running_controller(plane, &ns.name).await;
    let backends: Api<KVCacheBackend> = Api::all(client.clone());
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns.name);
    let roles: Api<Role> = Api::namespaced(client.clone(), &ns.name);
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &ns.name);

    let name = format!("kvc-{}", &ns.name[ns.name.len() - 6..]);
    let ha = vectors::with(vectors::v2(), |o| {
        vectors::managed(o)["leader"] =
            json!({"replicas": 3, "highAvailability": {"memberAddressing": "Lease"}});
    });
    let created = backends
        .create(&PostParams::default(), &backend(&name, ha))
        .await
        .unwrap();
    let uid = created.uid().unwrap();
    let leader = names::leader_name(&name);
    let member_access = names::member_access_name(&name);

    for access in [&leader, &member_access] {
        let (account, role, binding) = eventually("the lease access", WAIT, || {
            let (accounts, roles, bindings, access) = (
                accounts.clone(),
                roles.clone(),
                bindings.clone(),
                access.clone(),
            );
            async move {
                Some((
                    accounts.get_opt(&access).await.ok()??,
                    roles.get_opt(&access).await.ok()??,
                    bindings.get_opt(&access).await.ok()??,
                ))
            }
        })
        .await
        .unwrap();
        for owners in [
            account.owner_references(),
            role.owner_references(),
            binding.owner_references(),
        ] {
            assert!(
                owners
                    .iter()
                    .any(|o| o.uid == uid && o.controller == Some(true)),
                "{access}: {owners:?}"
            );
        }
        assert_eq!(account.automount_service_account_token, Some(false));
        let rules = role.rules.unwrap_or_default();
        assert_eq!(
            rules[0].resource_names.as_deref(),
            Some(&[leader.clone()][..]),
            "{access}: {rules:?}"
        );
        assert_eq!(binding.role_ref.name, *access);
        let subjects = binding.subjects.unwrap_or_default();
        assert_eq!(subjects.len(), 1);
        assert_eq!(
            (subjects[0].name.as_str(), subjects[0].namespace.as_deref()),
            (access.as_str(), Some(ns.name.as_str()))
        );
    }
    // The leader's Role also creates its Lease (RBAC cannot narrow create to a name); the
    // members only read it.
    let leader_rules = roles.get(&leader).await.unwrap().rules.unwrap();
    assert_eq!(leader_rules.len(), 2, "{leader_rules:?}");
    assert_eq!(leader_rules[1].verbs, ["create"]);
    assert_eq!(leader_rules[1].resource_names, None);
    let member_rules = roles.get(&member_access).await.unwrap().rules.unwrap();
    assert_eq!(member_rules.len(), 1, "{member_rules:?}");
    assert_eq!(member_rules[0].verbs, ["get", "list", "watch"]);

    // One leader, no high availability: the access goes.
    backends
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"connection": {"managed": {"leader": {
                "replicas": 1, "highAvailability": null}}}}})),
        )
        .await
        .unwrap();
    eventually("the lease access to be pruned", WAIT, || {
        let (accounts, roles, bindings, leader, member_access) = (
            accounts.clone(),
            roles.clone(),
            bindings.clone(),
            leader.clone(),
            member_access.clone(),
        );
        async move {
            for access in [&leader, &member_access] {
                if accounts.get_opt(access).await.ok()?.is_some()
                    || roles.get_opt(access).await.ok()?.is_some()
                    || bindings.get_opt(access).await.ok()?.is_some()
                {
                    return None;
                }
            }
            Some(())
        }
    })
    .await
    .unwrap();

    backends
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the backend to go", WAIT, || {
        let (backends, name) = (backends.clone(), name.clone());
        async move { backends.get_opt(&name).await.ok()?.is_none().then_some(()) }
    })
    .await
    .unwrap();
    stop.cancel();
    running.await.unwrap().unwrap();
    ns.cleanup().await;
}
