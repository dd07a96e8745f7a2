//! A KVCacheBackend's life, end to end, black box: the chart installed with the real Helm CLI on
//! the real test node with its kvcache operator on (and its validating webhook, failurePolicy
//! Fail), the store image the `kv-cache-backend-image` setting names (`kvcacheOperator.
//! defaultImage`) built here from the REAL Mooncake store (`hack/mooncake.sh`'s
//! `mooncake-transfer-engine-non-cuda`), and `examples/kvcache-backend.yaml` (the one the demo
//! applies) with its local-disk tier on a host directory and `cleanAfterDelete: true`.
//!
//! It proves: the operator adds its finalizer, renders and applies the leader and the member
//! DaemonSet, and the real `mooncake_master` and `mc_store_rest_server` come up under the
//! chart's restricted defaults (`runAsNonRoot`, the image's uid 65532, no `--store-image-user`);
//! the member mounts its segment (the leader lists it) and the status says so: phase `Ready`,
//! `LeaderAvailable`, `MembersMounted`, `CapacityObserved` (memory plus the tier's ceiling in
//! `status.capacity`), `Deletable`, `TierWasEmpty` from the member's survey of the empty
//! directory, the Client and Admin endpoints and the member's segment on the node. Then, with
//! entries in the tier (written as the store's uid, and one of another owner with mode 0600),
//! deleting the backend deletes its workloads, the cleanup Pod empties the directory (the
//! directory stays), the finalizer goes and the object is gone.
//!
//! What the node cannot give and the test supplies, and nothing else: no registry (images are
//! imported, the backend says `imagePullPolicy: Never`); no pod network (the kit's
//! `PodNetwork`); no cluster DNS and no ClusterIP routing from inside pods, which the operator
//! and the members use to reach the leader (`<name>-leader.<namespace>.svc`), so the kit's
//! `ClusterDns` answers Service names and relays the leader Service's ports inside the pods of
//! the release namespace.
//!
//! Needs `WARMCACHE_MOONCAKE_MASTER` (hack/test.sh exports it); without it the test fails. It
//! needs the test node itself: with `E2E_KUBECONFIG` it fails at start, saying so.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Event, Node, Pod, Service};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use warmcache_e2e::{NAMESPACE, READY_TIMEOUT, Scenario, examples_dir};
use warmcache_testkit::{
    ClusterDns, MOONCAKE_UID, PodNetwork, eventually, mooncake_image, mooncake_master,
    namespace_report,
};

const STORE_IMAGE: &str = "warmcache.test/mooncake:0.3.13.post1";
const FINALIZER: &str = "worker.gpustack.ai/kvcache";
const NODE_LABEL: &str = "kvcache";
/// The leader Services the kit's `ClusterDns` relays inside pods.
const LEADER_SERVICES: &str =
    "app.kubernetes.io/name=kv-cache-backend,app.kubernetes.io/component=leader";
const BACKEND_PODS: &str = "app.kubernetes.io/name=kv-cache-backend";

fn backends_api(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("worker.gpustack.ai", "v1alpha1", "KVCacheBackend");
    Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

/// `examples/kvcache-backend.yaml` with its tier at `tier`.
fn example_backend(tier: &Path) -> Value {
    let path = examples_dir().join("kvcache-backend.yaml");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("TIER_PATH", &tier.display().to_string());
    let mut documents = warmcache_cli::yaml::documents(&text).unwrap();
    assert_eq!(documents.len(), 1, "{} holds one backend", path.display());
    documents.remove(0)
}

fn condition<'a>(backend: &'a Value, kind: &str) -> Option<&'a Value> {
    backend["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn condition_is(backend: &Value, kind: &str, status: &str, reason: &str) -> bool {
    condition(backend, kind).is_some_and(|c| c["status"] == status && c["reason"] == reason)
}

/// The backends' statuses, the release namespace (the operator's and the store's pods with their
/// logs, events), the node's KVCache events, the pod network's and the DNS stand-in's reports.
async fn report(client: &Client, net: &PodNetwork, dns: &ClusterDns) -> String {
    let mut out = String::new();
    for b in backends_api(client)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        out.push_str(&format!(
            "backend {} (finalizers {:?}): {}\n",
            b.name_any(),
            b.finalizers(),
            serde_json::to_string_pretty(&b.data.get("status")).unwrap_or_default()
        ));
    }
    out.push_str(&namespace_report(client, NAMESPACE).await);
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    for e in events
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .iter()
        .filter(|e| e.involved_object.kind.as_deref() == Some("Node"))
    {
        out.push_str(&format!(
            "node event {:?} {:?}: {:?}\n",
            e.type_, e.reason, e.message
        ));
    }
    out.push_str(&net.report());
    out.push_str(&dns.report());
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_with_a_local_disk_tier_serves_and_is_emptied_and_released_on_deletion() {
    let started = Instant::now();
    // The chart with the operator on, its default image the store's image built below.
    let default_image = format!("kvcacheOperator.defaultImage={STORE_IMAGE}");
    let scenario = Scenario::new("kvcache_lifecycle")
        .needs_test_node(
            "the backend's local-disk tier is a directory of this machine, the store's image is \
             built and imported here, and the kit's ClusterDns relays the leader Service",
        )
        .image_tag("e2e-kvcache")
        .extra_sets(&[
            "kvcacheOperator.enabled=true",
            default_image.as_str(),
            "kvcacheOperator.webhook.replicas=1",
        ]);
    if let Some(refusal) = scenario.refusal() {
        panic!("{refusal}");
    }
    // The real store, required: never skipped.
    let master = mooncake_master().unwrap_or_else(|e| panic!("{e}"));
    let run = scenario.start().await.unwrap_or_else(|e| panic!("{e}"));
    let client = run.client.clone();
    let node = run.node().unwrap();
    let net = run.net().unwrap();
    let dns = ClusterDns::start(
        client.clone(),
        node.cgroups().first().cloned().unwrap(),
        &[NAMESPACE],
        LEADER_SERVICES,
    );

    // The store's image, the one the setting names.
    let store = mooncake_image(STORE_IMAGE, &master, run.work_dir())
        .and_then(|i| i.build(run.work_dir()))
        .unwrap();
    node.import_image(&store).await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let operator_up = eventually("the kvcache operator Ready", READY_TIMEOUT, || {
        let deployments = deployments.clone();
        async move {
            for name in [
                "warmcache-kvcache-operator",
                "warmcache-kvcache-operator-webhook",
            ] {
                let ready = deployments.get(name).await.ok()?.status?.ready_replicas;
                if ready.unwrap_or(0) < 1 {
                    return None;
                }
            }
            Some(())
        }
    })
    .await;
    if operator_up.is_err() {
        panic!(
            "the kvcache operator or its webhook never became Ready\n{}",
            report(&client, net, &dns).await
        );
    }
    eprintln!(
        "chart with the kvcache operator Ready after {:.1?}",
        started.elapsed()
    );

    // The tier: an empty directory that exists on the node and belongs to the store's uid, as
    // the doc asks (`install -d -o 65532 -g 0 -m 0750`).
    let tier_parent = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tier_parent.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let tier = tier_parent.path().join("kvcache");
    std::fs::create_dir(&tier).unwrap();
    std::os::unix::fs::chown(&tier, Some(MOONCAKE_UID), Some(0)).unwrap();
    std::fs::set_permissions(&tier, std::fs::Permissions::from_mode(0o750)).unwrap();

    // The node the member group selects.
    Api::<Node>::all(client.clone())
        .patch(
            node.name(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {NODE_LABEL: "true"}}})),
        )
        .await
        .unwrap();

    // The example, admitted by the operator's webhook.
    let backends = backends_api(&client);
    let object: DynamicObject = serde_json::from_value(example_backend(&tier)).unwrap();
    let name = object.name_any();
    // The API server reaches the webhook through its Service once the pod network routes it: a
    // dry run (which webhooks see, nothing stored) until one is admitted.
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let serving = eventually(
        "the kvcache webhook admitting a dry run",
        Duration::from_secs(120),
        || {
            let (backends, object, dry_run) = (backends.clone(), object.clone(), dry_run.clone());
            async move { backends.create(&dry_run, &object).await.ok().map(|_| ()) }
        },
    )
    .await;
    let created = match serving {
        Ok(()) => backends.create(&PostParams::default(), &object).await,
        Err(_) => backends.create(&dry_run, &object).await,
    };
    if let Err(e) = created {
        panic!(
            "creating the backend: {e}\n{}",
            report(&client, net, &dns).await
        );
    }

    // Ready, as the status describes it, from the real store.
    let ready = eventually("the backend Ready", READY_TIMEOUT, || {
        let backends = backends.clone();
        let name = name.clone();
        async move {
            let b = serde_json::to_value(backends.get(&name).await.ok()?).ok()?;
            (b["status"]["phase"] == "Ready"
                && condition_is(&b, "LeaderAvailable", "True", "LeaderServing")
                && condition_is(&b, "MembersMounted", "True", "AllMounted")
                && condition_is(&b, "CapacityObserved", "True", "Observed")
                && condition_is(&b, "TierWasEmpty", "True", "Empty"))
            .then_some(b)
        }
    })
    .await;
    let backend = match ready {
        Ok(b) => b,
        Err(e) => panic!("{e}\n{}", report(&client, net, &dns).await),
    };
    eprintln!("backend Ready after {:.1?}", started.elapsed());
    let status = &backend["status"];
    let check = |what: &str, ok: bool| {
        assert!(
            ok,
            "{what}; the backend: {}",
            serde_json::to_string_pretty(&backend).unwrap_or_default()
        );
    };
    check(
        "the operator's finalizer is on the backend",
        backend["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f == FINALIZER)),
    );
    check(
        "no consumer: Deletable",
        condition_is(&backend, "Deletable", "True", "NotInUse"),
    );
    check(
        "phaseMessage is empty when Ready",
        status["phaseMessage"].as_str().unwrap_or("").is_empty(),
    );
    let endpoints = serde_json::to_string(&status["endpoints"]).unwrap_or_default();
    check(
        "the Client and Admin endpoints are the leader Service's",
        endpoints.contains(&format!("{name}-leader.{NAMESPACE}.svc:50051"))
            && endpoints.contains(&format!("{name}-leader.{NAMESPACE}.svc:9003")),
    );
    let members = status["members"].as_array().cloned().unwrap_or_default();
    check(
        "status.members lists the one member's segment, on the node",
        members.len() == 1
            && serde_json::to_string(&members[0])
                .unwrap_or_default()
                .contains(node.name()),
    );
    check(
        "status.capacity is read from the leader's gauges",
        !status["capacity"]["total"].is_null() && !status["capacity"]["used"].is_null(),
    );
    // The capacity is a reading of the leader's gauges, taken again every settled requeue
    // (15 s): the member's tier can register with the leader a moment after its memory
    // segment, so the reading that made the backend Ready may predate it. The next ones must
    // show the segment's bytes and the tier's ceiling.
    let expected = |message: &str| {
        message.contains("of 67108864 bytes") && message.contains("ceiling 67108864 bytes")
    };
    let observed = eventually(
        "CapacityObserved with the segment's bytes and the tier's ceiling",
        Duration::from_secs(60),
        || {
            let backends = backends.clone();
            let name = name.clone();
            async move {
                let b = serde_json::to_value(backends.get(&name).await.ok()?).ok()?;
                let message = condition(&b, "CapacityObserved")?["message"]
                    .as_str()?
                    .to_owned();
                expected(&message).then_some(message)
            }
        },
    )
    .await;
    if let Err(e) = observed {
        let now = backends
            .get(&name)
            .await
            .ok()
            .and_then(|b| serde_json::to_string_pretty(&b.data["status"]).ok())
            .unwrap_or_default();
        panic!("{e}; the backend's status now: {now}");
    }

    // The workloads the operator applied, owned by the backend, running the setting's image as
    // the image's uid under runAsNonRoot.
    let uid = backend["metadata"]["uid"].as_str().unwrap().to_owned();
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    let leader = deployments.get(&format!("{name}-leader")).await.unwrap();
    let member = daemonsets.get(&format!("{name}-member-0")).await.unwrap();
    for owners in [leader.owner_references(), member.owner_references()] {
        assert!(owners.iter().any(|o| o.uid == uid), "{owners:?}");
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let store_pods = pods
        .list(&ListParams::default().labels(BACKEND_PODS))
        .await
        .unwrap()
        .items;
    assert_eq!(store_pods.len(), 2, "a leader and a member");
    for pod in &store_pods {
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(
            spec.security_context
                .as_ref()
                .and_then(|s| s.run_as_non_root),
            Some(true),
            "{}",
            pod.name_any()
        );
        assert!(
            spec.containers
                .iter()
                .all(|c| c.image.as_deref() == Some(STORE_IMAGE)),
            "{} runs the kv-cache-backend-image setting's image",
            pod.name_any()
        );
    }
    // The survey found the directory empty.
    let member_pod = store_pods
        .iter()
        .find(|p| {
            p.labels()
                .get("app.kubernetes.io/component")
                .map(String::as_str)
                == Some("member-0")
        })
        .unwrap();
    let survey = member_pod
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref())
        .and_then(|s| s.iter().find(|c| c.name == "local-disk-survey"))
        .and_then(|c| c.state.as_ref()?.terminated.as_ref()?.message.clone())
        .unwrap_or_default();
    assert!(
        survey.starts_with("entries=0 "),
        "the survey's reading: {survey:?}"
    );
    assert!(
        dns.answered(&format!("{name}-leader.{NAMESPACE}.svc")),
        "the leader's name was looked up inside the pods\n{}",
        dns.report()
    );

    // Entries in the tier: what a member writes (as its uid), and one of another owner that
    // only the cleanup's DAC_OVERRIDE can remove.
    std::fs::create_dir(tier.join("bucket-1")).unwrap();
    std::fs::write(tier.join("bucket-1/data"), vec![7u8; 1 << 20]).unwrap();
    std::fs::write(tier.join("bucket-1.meta"), b"meta").unwrap();
    for p in ["bucket-1", "bucket-1/data", "bucket-1.meta"] {
        std::os::unix::fs::chown(tier.join(p), Some(MOONCAKE_UID), Some(0)).unwrap();
    }
    std::fs::write(tier.join("foreign"), b"x").unwrap();
    std::os::unix::fs::chown(tier.join("foreign"), Some(4242), Some(4242)).unwrap();
    std::fs::set_permissions(tier.join("foreign"), std::fs::Permissions::from_mode(0o600)).unwrap();

    // Delete: workloads deleted, the tier emptied, the finalizer removed, the object gone.
    let deleting = Instant::now();
    backends
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    let saw_deleting = eventually("phase Deleting", Duration::from_secs(60), || {
        let backends = backends.clone();
        let name = name.clone();
        async move {
            match backends.get_opt(&name).await {
                Ok(Some(b)) => {
                    let b = serde_json::to_value(b).ok()?;
                    (b["status"]["phase"] == "Deleting").then_some(true)
                }
                Ok(None) => Some(false),
                Err(_) => None,
            }
        }
    })
    .await;
    let gone = eventually("the backend gone", Duration::from_secs(360), || {
        let backends = backends.clone();
        let name = name.clone();
        async move { matches!(backends.get_opt(&name).await, Ok(None)).then_some(()) }
    })
    .await;
    if gone.is_err() {
        panic!(
            "the backend was not released within 6 minutes of its deletion\n{}",
            report(&client, net, &dns).await
        );
    }
    eprintln!(
        "backend deleted and released in {:.1?} (phase Deleting seen: {:?})",
        deleting.elapsed(),
        saw_deleting
    );
    let left: Vec<String> = std::fs::read_dir(&tier)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        left.is_empty(),
        "the tier still holds {left:?} after the deletion\n{}",
        report(&client, net, &dns).await
    );
    let meta = std::fs::metadata(&tier).unwrap();
    assert!(meta.is_dir(), "the tier directory itself stays");
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&meta),
        MOONCAKE_UID,
        "the directory keeps its owner"
    );
    // Its workloads went with it, and the cleanup Pods too.
    let workloads_gone = eventually("the workloads gone", Duration::from_secs(60), || {
        let (deployments, daemonsets, services, pods) = (
            deployments.clone(),
            daemonsets.clone(),
            services.clone(),
            pods.clone(),
        );
        let name = name.clone();
        async move {
            let leader = deployments.get_opt(&format!("{name}-leader")).await.ok()?;
            let member = daemonsets.get_opt(&format!("{name}-member-0")).await.ok()?;
            let service = services.get_opt(&format!("{name}-leader")).await.ok()?;
            let left = pods
                .list(&ListParams::default().labels(BACKEND_PODS))
                .await
                .ok()?
                .items;
            (leader.is_none() && member.is_none() && service.is_none() && left.is_empty())
                .then_some(())
        }
    })
    .await;
    if workloads_gone.is_err() {
        panic!(
            "the backend's workloads or cleanup Pods outlived it\n{}",
            report(&client, net, &dns).await
        );
    }
    // No node was given up.
    let events: Api<Event> = Api::all(client.clone());
    let warnings: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason
                .as_deref()
                .is_some_and(|r| r.starts_with("KVCacheTier"))
        })
        .map(|e| format!("{:?}: {:?}", e.reason, e.message))
        .collect();
    assert!(warnings.is_empty(), "tier cleanup warnings: {warnings:?}");
    eprintln!("done after {:.1?}", started.elapsed());
    run.finish().await;
}
