//! The block-storage (roxReadOnly) flow with its detach gate, end to end, black box: the chart
//! installed with the real Helm CLI on the real test node, with StorageClass `nvcf-sc` on the
//! test CSI driver's namespaced-block profile (NVMesh-style volume handles `<volume>:<namespace>`,
//! real VolumeAttachments, one read-write attachment at a time: a read-only attach of a volume
//! attached read-write anywhere is refused), qualified by a catalog ConfigMap as provider
//! `nvmesh` (ReadWriteOnce + ReadOnlyMany, reader mount option `ro`), and the chart's node agent
//! DaemonSet (`modelVolumeController.enabled=true`) running on the node.
//!
//! The unmodified Deployment of `examples/llm-deployment.yaml` in two namespaces of one sharing
//! domain (two replicas and one) is admitted to one binding decided `roxReadOnly`. One staging
//! Job downloads the model once with the real `hf download` from the simulated Hub into its
//! pod's emptyDir; the agent (the DaemonSet's pod: its metrics count the copy) measures it,
//! creates the primary claim sized from the bytes, copies and verifies, and answers; the binding
//! controller labels the primary PV complete, sets `Retain` and releases the claim. The detach
//! gate, in the order the API server stored the writes (resourceVersions), not in wall-clock
//! time:
//!
//! - the primary was attached (a VolumeAttachment of it was seen), and every VolumeAttachment of
//!   it was deleted before the binding recorded its first read-only view, before each view PV
//!   was created and before any view was attached;
//! - the binding's stored versions show `ReleasingPrimary` (and, when the controller saw the
//!   attachment, `WaitingForDetach` naming it) before the first version recording a view.
//!
//! Then every reader is Ready through its own namespace's view (handle rewritten to its
//! namespace, `csi.readOnly`, ReadOnlyMany), its landing mounted read-only; a reader that tries
//! to write finds the copy read-only; and the Hub served the model once.
//!
//! As in `download_once.rs`, the node advertises `nvidia.com/gpu`, the kit's `PodNetwork` bridges
//! Services, pod IPs and the Hub into the pods, and images are imported. It needs the test node
//! (the block profile, the agent's kubelet root) and the simulated Hub: with `E2E_KUBECONFIG` it
//! fails at start, saying so.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{
    Api, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use warmcache_e2e::{
    AGENT_DAEMON_SET, BINDING_ANNOTATION, CONTROL, READY_TIMEOUT, Scenario, app_pods, bindings_api,
    kept_primary, model, read_only_landing, ready_pods, run_id, tamper_pod, webhook_serving,
};
use warmcache_testkit::{TestCsiDriver, eventually};

const DOMAIN_LABEL: &str = "nvca.nvcf.nvidia.io/model-cache-sharing-domain";
/// The label (`true`) of the staging Job and its pod.
const STAGING_LABEL: &str = "nvsnap.io/model-staging";
/// The label of the agent's mount holders.
const HOLDER_SELECTOR: &str = "app.kubernetes.io/component=mount-holder";
/// What the agent records on the claim and the controller copies onto the complete PV.
const BYTES_ANNOTATION: &str = "nvsnap.io/model-bytes";
const MANIFEST_DIGEST_ANNOTATION: &str = "warmcache.nvidia.io/manifest-sha256";
const GIB: u64 = 1 << 30;

// ---------------------------------------------------------------------------------------------
// What the API server stored, in its order: a watch per resource from before the workload.
// ---------------------------------------------------------------------------------------------

/// One event a watch delivered: its type, the resourceVersion it carries (for a deletion, the
/// revision of the deletion, which the API server stamps on the deleted object), the object.
#[derive(Debug, Clone)]
struct Seen<K> {
    kind: &'static str,
    rv: u64,
    object: K,
}

/// Every event of one resource from the moment it starts, as a chain of watches of one second
/// each, every one resuming at the last resourceVersion the previous one delivered (so nothing
/// between two watches is missed; an expired resourceVersion is a failure, never a silent gap).
struct Recorder<K> {
    what: &'static str,
    seen: Arc<Mutex<Vec<Seen<K>>>>,
    failure: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl<K> Recorder<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Starts recording `api` (of `client`) from its current resourceVersion.
    async fn start(client: &kube::Client, api: &Api<K>, what: &'static str) -> Self {
        let from = api
            .list_metadata(&ListParams::default().limit(1))
            .await
            .unwrap_or_else(|e| panic!("listing {what}: {e}"))
            .metadata
            .resource_version
            .unwrap_or_else(|| panic!("the list of {what} has no resourceVersion"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let failure = Arc::new(Mutex::new(None));
        let (out, failed) = (Arc::clone(&seen), Arc::clone(&failure));
        let fail = move |why: String| {
            if let Ok(mut f) = failed.lock() {
                f.get_or_insert(why);
            }
        };
        let (client, url) = (client.clone(), api.resource_url().to_owned());
        let task = tokio::spawn(async move {
            let request = kube::core::Request::new(url);
            let params = WatchParams::default().timeout(1);
            let mut rv = from;
            loop {
                let text = match request.watch(&params, &rv) {
                    Ok(watch) => client.request_text(watch).await,
                    Err(e) => {
                        fail(format!("a watch of {what}: {e}"));
                        return;
                    }
                };
                let text = match text {
                    Ok(text) => text,
                    Err(e) => {
                        // Refused or cut off: the next watch resumes at `rv`.
                        eprintln!("watch of {what} from {rv}: {e}; again");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                for line in text.lines().filter(|l| !l.trim().is_empty()) {
                    let event: WatchEvent<K> = match serde_json::from_str(line) {
                        Ok(event) => event,
                        Err(e) => {
                            fail(format!("an event of {what}: {e}: {line}"));
                            return;
                        }
                    };
                    let (kind, object) = match event {
                        WatchEvent::Added(o) => ("ADDED", o),
                        WatchEvent::Modified(o) => ("MODIFIED", o),
                        WatchEvent::Deleted(o) => ("DELETED", o),
                        WatchEvent::Bookmark(b) => {
                            rv = b.metadata.resource_version;
                            continue;
                        }
                        WatchEvent::Error(e) => {
                            fail(format!("the watch of {what} from {rv} failed: {e:?}"));
                            return;
                        }
                    };
                    let Some(version) = object.resource_version() else {
                        fail(format!("a {kind} event of {what} without resourceVersion"));
                        return;
                    };
                    let Ok(n) = version.parse::<u64>() else {
                        fail(format!(
                            "{what}: resourceVersion {version:?} is not a number"
                        ));
                        return;
                    };
                    rv = version;
                    if let Ok(mut out) = out.lock() {
                        out.push(Seen {
                            kind,
                            rv: n,
                            object,
                        });
                    }
                }
            }
        });
        Recorder {
            what,
            seen,
            failure,
            task,
        }
    }

    /// What was seen so far; panics if the recording failed (events may have been missed).
    fn seen(&self) -> Vec<Seen<K>> {
        if let Some(why) = self.failure.lock().unwrap().clone() {
            panic!("recording {}: {why}", self.what);
        }
        self.seen.lock().unwrap().clone()
    }
}

impl<K> Drop for Recorder<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The PersistentVolume a VolumeAttachment attaches.
fn attached_pv(va: &VolumeAttachment) -> Option<&str> {
    va.spec.source.persistent_volume_name.as_deref()
}

/// The condition `type_` of a binding: (status, reason, message).
fn condition(b: &DynamicObject, type_: &str) -> Option<(String, String, String)> {
    let c = b.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?;
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
    Some((s("status"), s("reason"), s("message")))
}

/// The binding's read-only views (namespace -> (PV, claim)).
fn views(b: &DynamicObject) -> BTreeMap<String, (String, String)> {
    b.data["status"]["realized"]["views"]
        .as_array()
        .map(|v| {
            v.iter()
                .map(|v| {
                    let s = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
                    (
                        s("namespace"),
                        (s("persistentVolumeName"), s("persistentVolumeClaimName")),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The size docs/node-agent.md gives a volume made for `bytes`: 10 % headroom
/// (`bytes / 100 * 10`), rounded up to a whole GiB, at least 1 GiB (the chart's `minSizeGiB`).
fn sized(bytes: u64) -> String {
    let gib = (bytes + bytes / 100 * 10).div_ceil(GIB).max(1);
    format!("{gib}Gi")
}

/// `GET path` on a pod's admin port (8080), through the pod network's listener at its IP.
async fn admin_get(pod: &Pod, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ip = pod.status.as_ref()?.pod_ip.clone()?;
    let connect = tokio::net::TcpStream::connect((ip.as_str(), 8080));
    let mut stream = tokio::time::timeout(Duration::from_secs(5), connect)
        .await
        .ok()?
        .ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {ip}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut body))
        .await
        .ok()?
        .ok()?;
    (body.split_whitespace().nth(1) == Some("200")).then_some(body)
}

/// The value of the sample `series` (name and labels as exposed) in a Prometheus exposition.
fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_cache_is_staged_copied_released_and_read_only_after_the_detach() {
    let started = Instant::now();
    let run = Scenario::new("block_flow")
        .model(model(24 << 20))
        .block_storage()
        // Three replicas and the reader that tries to write.
        .gpus(4)
        .start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = run.client.clone();
    let workload = run.workload().unwrap();
    eprintln!(
        "components and the node agent Ready after {:.1?}",
        started.elapsed()
    );

    // Two namespaces of one sharing domain (the domain's name is this run's own).
    let domain = format!("e2e-{}", run_id());
    let a = run.namespace("e2e-block-a", &[]).await.unwrap();
    let b = run.namespace("e2e-block-b", &[]).await.unwrap();
    for ns in [&a, &b] {
        Api::<Namespace>::all(client.clone())
            .patch(
                &ns.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {DOMAIN_LABEL: domain.as_str()}}})),
            )
            .await
            .unwrap();
    }
    let names = [a.name.clone(), b.name.clone()];
    let report_on = [a.name.as_str(), b.name.as_str()];
    if let Err(e) = webhook_serving(&client, &a.name, &workload).await {
        panic!("{e}\n{}", run.report(&report_on).await);
    }

    // What the API server stores from now on: attachments, volumes, the binding.
    let attachments = Recorder::start(
        &client,
        &Api::<VolumeAttachment>::all(client.clone()),
        "VolumeAttachments",
    )
    .await;
    let volumes = Recorder::start(
        &client,
        &Api::<PersistentVolume>::all(client.clone()),
        "PersistentVolumes",
    )
    .await;
    let bindings = Recorder::start(&client, &bindings_api(&client), "ModelCacheBindings").await;

    // The unmodified workload: two replicas in one namespace, one in the other.
    for (ns, replicas) in [(&a, 2), (&b, 1)] {
        let mut deployment = workload.clone();
        deployment.spec.replicas = Some(replicas);
        ns.api::<Deployment>()
            .create(&PostParams::default(), &deployment)
            .await
            .unwrap();
    }
    let all_ready = eventually("every pod Ready", READY_TIMEOUT, || {
        let (client, names) = (client.clone(), names.clone());
        async move { (ready_pods(&client, &names).await? == 3).then_some(()) }
    })
    .await;
    if all_ready.is_err() {
        panic!(
            "not every pod became Ready\n{}",
            run.report(&report_on).await
        );
    }
    eprintln!("all 3 pods Ready after {:.1?}", started.elapsed());

    // One binding for the domain's pods, decided for block storage (roxReadOnly).
    let mut pods = Vec::new();
    for ns in &names {
        pods.extend(
            app_pods(&Api::<Pod>::namespaced(client.clone(), ns))
                .await
                .unwrap(),
        );
    }
    let named: BTreeSet<String> = pods
        .iter()
        .map(|p| {
            p.annotations()
                .get(BINDING_ANNOTATION)
                .cloned()
                .unwrap_or_else(|| panic!("{} was not rewritten", p.name_any()))
        })
        .collect();
    assert_eq!(
        named.len(),
        1,
        "one binding for the sharing domain: {named:?}"
    );
    let binding_name = named.into_iter().next().unwrap();
    let binding = bindings_api(&client).get(&binding_name).await.unwrap();
    assert_eq!(
        binding.data["spec"]["decision"]["transition"], "roxReadOnly",
        "{:?}",
        binding.data["spec"]
    );
    let status = binding.data["status"].clone();
    assert_eq!(status["realized"]["populationState"], "Ready", "{status}");

    // One download: one staging Job in the domain, complete; the Hub served the model once.
    let mut staging = Vec::new();
    for ns in &names {
        let jobs = Api::<Job>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        for job in jobs {
            assert!(
                job.labels().get(STAGING_LABEL).map(String::as_str) == Some("true"),
                "a Job that is not the staging Job: {:?}",
                job.metadata
            );
            staging.push(job);
        }
    }
    assert_eq!(staging.len(), 1, "one staging Job for the domain");
    let complete = eventually("the staging Job Complete", Duration::from_secs(120), || {
        let jobs: Api<Job> =
            Api::namespaced(client.clone(), &staging[0].namespace().unwrap_or_default());
        let name = staging[0].name_any();
        async move {
            let job = jobs.get(&name).await.ok()?;
            job.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Complete" && c.status == "True")
                .then_some(())
        }
    })
    .await;
    if complete.is_err() {
        panic!(
            "the staging Job never completed\n{}",
            run.report(&report_on).await
        );
    }
    let served = run.served().unwrap();
    let model_bytes = run.model_bytes().unwrap();
    assert_eq!(served, model_bytes, "the Hub served the model once");

    // The primary: copied by the agent (its bytes and manifest digest), sized from the bytes,
    // ReadWriteOnce, complete with Retain, its claim released (the PV Released), no mount holder
    // left.
    let primary_name = status["realized"]["boundPersistentVolumeName"]
        .as_str()
        .unwrap()
        .to_owned();
    let bytes: u64 = status["realized"]["bytes"].as_u64().unwrap();
    assert!(
        bytes >= model_bytes,
        "{bytes} bytes recorded for {model_bytes}"
    );
    let primary = match kept_primary(&run, &primary_name, &a.name).await {
        Ok(primary) => primary,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(
        primary.annotations().get(BYTES_ANNOTATION),
        Some(&bytes.to_string()),
        "{:?}",
        primary.metadata
    );
    assert_eq!(
        primary
            .annotations()
            .get(MANIFEST_DIGEST_ANNOTATION)
            .map(String::len),
        Some(64),
        "the agent's manifest digest: {:?}",
        primary.metadata
    );
    let spec = primary.spec.clone().unwrap();
    assert_eq!(spec.capacity.as_ref().unwrap()["storage"].0, sized(bytes));
    assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
    let csi = spec.csi.clone().unwrap();
    assert_eq!(csi.driver, TestCsiDriver::NamespacedBlock.driver_name());
    let claim_ref = spec.claim_ref.clone().unwrap();
    assert_eq!(claim_ref.namespace.as_deref(), Some(CONTROL));
    let claim_name = claim_ref.name.clone().unwrap();
    assert!(
        Api::<PersistentVolumeClaim>::namespaced(client.clone(), CONTROL)
            .get_opt(&claim_name)
            .await
            .unwrap()
            .is_none(),
        "the primary claim {claim_name} is released"
    );
    let holders = Api::<Pod>::namespaced(client.clone(), CONTROL)
        .list(&ListParams::default().labels(HOLDER_SELECTOR))
        .await
        .unwrap()
        .items;
    assert!(
        holders.is_empty(),
        "mount holders left: {:?}",
        holders
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>()
    );
    // The copy was the chart's DaemonSet's agent's: its metrics count one copy of these bytes.
    let agents = Api::<Pod>::namespaced(client.clone(), &run.release_namespace)
        .list(&ListParams::default().labels("app.kubernetes.io/component=model-volume-controller"))
        .await
        .unwrap()
        .items;
    assert_eq!(agents.len(), 1, "one agent pod on the one node");
    assert!(
        agents[0]
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "DaemonSet" && o.name == AGENT_DAEMON_SET),
        "{:?}",
        agents[0].metadata.owner_references
    );
    let metrics = eventually("the agent's metrics", Duration::from_secs(60), || {
        admin_get(&agents[0], "/metrics")
    })
    .await
    .unwrap_or_else(|_| panic!("the agent's /metrics never answered"));
    let m = |series: &str| {
        sample(
            &metrics,
            &format!("warmcache_model_volume_controller_{series}"),
        )
    };
    assert_eq!(
        m("copies_total{outcome=\"succeeded\"}"),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(m("copied_bytes_total"), Some(bytes as f64), "{metrics}");

    // One read-only view per namespace, each its namespace's handle, bound to its claim.
    let recorded = views(&binding);
    assert_eq!(
        recorded.keys().cloned().collect::<BTreeSet<_>>(),
        names.iter().cloned().collect::<BTreeSet<_>>(),
        "one view per reading namespace: {recorded:?}"
    );
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let volume_id = csi
        .volume_handle
        .rsplit_once(':')
        .map_or(csi.volume_handle.as_str(), |(id, _)| id);
    for (ns, (pv_name, claim)) in &recorded {
        let view = pvs.get(pv_name).await.unwrap();
        let spec = view.spec.unwrap();
        let view_csi = spec.csi.unwrap();
        assert_eq!(view_csi.read_only, Some(true), "{pv_name}");
        assert_eq!(
            view_csi.volume_handle,
            format!("{volume_id}:{ns}"),
            "the view's handle names its namespace"
        );
        assert_eq!(spec.access_modes, Some(vec!["ReadOnlyMany".to_owned()]));
        assert_eq!(spec.mount_options, Some(vec!["ro".to_owned()]));
        assert_eq!(spec.capacity.unwrap()["storage"].0, sized(bytes));
        let bound = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
            .get(claim)
            .await
            .unwrap();
        assert_eq!(
            bound.spec.and_then(|s| s.volume_name).as_deref(),
            Some(pv_name.as_str())
        );
    }

    // The detach gate, in the API server's order. Wait until the recorders have seen each view
    // PV created and each view attached (every reader runs, so both happened): a watch delivers
    // its resource's events in order, so by then it has also seen everything before them.
    let view_pvs: BTreeSet<String> = recorded.values().map(|(pv, _)| pv.clone()).collect();
    let seen_all = eventually(
        "the views' creations and attachments recorded",
        Duration::from_secs(60),
        || {
            let created: BTreeSet<String> = volumes
                .seen()
                .iter()
                .filter(|s| s.kind == "ADDED")
                .map(|s| s.object.name_any())
                .collect();
            let attached: BTreeSet<String> = attachments
                .seen()
                .iter()
                .filter_map(|s| attached_pv(&s.object).map(str::to_owned))
                .collect();
            let first_views = bindings
                .seen()
                .iter()
                .any(|s| s.object.name_any() == binding_name && !views(&s.object).is_empty());
            let ok = first_views && view_pvs.is_subset(&created) && view_pvs.is_subset(&attached);
            std::future::ready(ok.then_some(()))
        },
    )
    .await;
    if seen_all.is_err() {
        panic!(
            "the recorders never saw every view created and attached: volumes {:?}, attachments {:?}",
            volumes
                .seen()
                .iter()
                .map(|s| (s.kind, s.rv, s.object.name_any()))
                .collect::<Vec<_>>(),
            attachments
                .seen()
                .iter()
                .map(|s| (s.kind, s.rv, attached_pv(&s.object).map(str::to_owned)))
                .collect::<Vec<_>>()
        );
    }
    let attachment_log = attachments.seen();
    let described: Vec<String> = attachment_log
        .iter()
        .map(|s| {
            format!(
                "{} {} {} (pv {})",
                s.rv,
                s.kind,
                s.object.name_any(),
                attached_pv(&s.object).unwrap_or("?")
            )
        })
        .collect();
    // The primary was attached (the agent's holder mounted it read-write to copy), and every
    // attachment of it is gone.
    let primary_attachments: BTreeSet<String> = attachment_log
        .iter()
        .filter(|s| attached_pv(&s.object) == Some(primary_name.as_str()))
        .map(|s| s.object.name_any())
        .collect();
    assert!(
        !primary_attachments.is_empty(),
        "no VolumeAttachment of the primary {primary_name} was seen: {described:#?}"
    );
    let mut detached_at = 0;
    for va in &primary_attachments {
        let deleted = attachment_log
            .iter()
            .find(|s| s.kind == "DELETED" && &s.object.name_any() == va)
            .unwrap_or_else(|| {
                panic!(
                    "the primary's VolumeAttachment {va} is still there while its views are \
                     attached: {described:#?}"
                )
            });
        detached_at = detached_at.max(deleted.rv);
    }
    // Every view was attached only after that (one resource: resourceVersions compare, as
    // KEP-5504 documents).
    for s in attachment_log
        .iter()
        .filter(|s| s.kind == "ADDED" && view_pvs.contains(attached_pv(&s.object).unwrap_or("")))
    {
        assert!(
            s.rv > detached_at,
            "view {} attached (rv {}) before the primary detached (rv {detached_at}): {described:#?}",
            attached_pv(&s.object).unwrap_or("?"),
            s.rv
        );
    }
    // Every view PV was created only after that, and the binding recorded its first view (it
    // records a view before creating it) only after that. Across resources these compare on
    // this API server: every resourceVersion is the revision of the one etcd all resources are
    // stored in.
    let volume_log = volumes.seen();
    for s in volume_log
        .iter()
        .filter(|s| s.kind == "ADDED" && view_pvs.contains(&s.object.name_any()))
    {
        assert!(
            s.rv > detached_at,
            "view PV {} created (rv {}) before the primary detached (rv {detached_at}): {described:#?}",
            s.object.name_any(),
            s.rv
        );
    }
    let versions: Vec<(u64, String, String, usize)> = bindings
        .seen()
        .iter()
        .filter(|s| s.object.name_any() == binding_name && s.kind != "DELETED")
        .map(|s| {
            let (_, reason, message) = condition(&s.object, "Progressing").unwrap_or_default();
            (s.rv, reason, message, views(&s.object).len())
        })
        .collect();
    let chain: Vec<String> = versions
        .iter()
        .map(|(rv, reason, _, n)| format!("{rv} Progressing={reason} views={n}"))
        .collect();
    let first_view = versions.iter().position(|v| v.3 > 0).unwrap();
    assert!(
        versions[first_view].0 > detached_at,
        "the binding recorded a view (rv {}) before the primary detached (rv {detached_at}): \
         {chain:#?}\n{described:#?}",
        versions[first_view].0
    );
    let releasing = versions
        .iter()
        .position(|v| v.1 == "ReleasingPrimary")
        .unwrap_or_else(|| panic!("ReleasingPrimary never stored: {chain:#?}"));
    assert!(releasing < first_view, "{chain:#?}");
    let waited: Vec<&(u64, String, String, usize)> = versions
        .iter()
        .filter(|v| v.1 == "WaitingForDetach")
        .collect();
    for (rv, _, message, n) in &waited {
        assert_eq!(
            *n, 0,
            "a view recorded while waiting for the detach: {chain:#?}"
        );
        assert!(*rv < versions[first_view].0, "{chain:#?}");
        assert!(
            primary_attachments
                .iter()
                .any(|va| message.contains(va.as_str())),
            "WaitingForDetach names the primary's attachment ({primary_attachments:?}): {message}"
        );
    }
    eprintln!(
        "detach gate: the primary's attachment {primary_attachments:?} deleted at rv \
         {detached_at}; the first view recorded at rv {}; WaitingForDetach stored {} time(s); \
         the binding's versions:\n  {}",
        versions[first_view].0,
        waited.len(),
        chain.join("\n  ")
    );

    // Every reader reads its namespace's view through a read-only landing.
    for pod in &pods {
        let ns = pod.namespace().unwrap();
        let claim = read_only_landing(pod).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            claim.claim_name,
            recorded[&ns].1,
            "{}/{} reads its namespace's view",
            ns,
            pod.name_any()
        );
    }

    // A reader that tries to write (as in download_once): once the model verifies, it tries to
    // create a file in the landing and to append to one of the model's files.
    let tamper = tamper_pod(&workload).unwrap();
    let admitted = b
        .api::<Pod>()
        .create(&PostParams::default(), &tamper)
        .await
        .unwrap();
    assert_eq!(
        admitted.annotations().get(BINDING_ANNOTATION),
        Some(&binding_name),
        "the reader joins the cache: {:?}",
        admitted.annotations()
    );
    let b_pods = b.api::<Pod>();
    let finished = eventually(
        "the reader that tries to write to finish",
        READY_TIMEOUT,
        || {
            let pods = b_pods.clone();
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
            run.report(&report_on).await
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
    let claim = read_only_landing(&finished).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(claim.claim_name, recorded[&b.name].1);
    eprintln!("a reader that tries to write finds its landing read-only");

    // Still one download for everything: no second Job, nothing more from the Hub.
    let mut jobs = 0;
    for ns in &names {
        jobs += Api::<Job>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len();
    }
    assert_eq!(jobs, 1, "one staging Job in all");
    assert_eq!(
        run.served(),
        Some(model_bytes),
        "the Hub served the model once"
    );

    eprintln!(
        "block flow: 4 readers in 2 namespaces of one sharing domain -> 1 staging Job; the agent \
         copied {bytes} bytes into primary {primary_name} ({}, Retain, Released); 2 views created \
         after its detach; the Hub served {served} bytes = {:.1}x the model",
        sized(bytes),
        served as f64 / model_bytes as f64
    );
    eprintln!("done after {:.1?}", started.elapsed());
    drop((attachments, volumes, bindings));
    run.finish().await;
}
