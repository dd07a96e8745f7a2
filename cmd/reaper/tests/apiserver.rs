//! The reaper against a real API server (with kube-controller-manager's PV, protection and
//! garbage controllers), authenticated as the ServiceAccount the chart gives it with the roles
//! generated from `src/rbac.rs`: a call the list forgot fails these tests.
//!
//! The storage objects are built with the same functions the binding controller uses
//! (`warmcache_modelvolume::view`), so they carry the labels and names it writes. Every sweep is
//! made against objects a test created, but PVs and VolumeAttachments are cluster-wide, so the
//! tests of this binary take turns ([`serial`]).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Event as CoreEvent, PersistentVolume, PersistentVolumeClaim, Pod,
};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use warmcache_api_modelcache::v2beta1::{
    BindingIdentity, BindingPhase, ModelCacheBinding, ModelCacheBindingStatus, PopulationState,
    RealizedStorage, Workflow,
};
use warmcache_api_modelcache::{identity_hash, writer_job_name, writer_pvc_name};
use warmcache_modelvolume::keys::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, MODEL_LABEL};
use warmcache_modelvolume::reaper::{Config, Keep, Rule};
use warmcache_modelvolume::view;
use warmcache_modelvolume::volume_keys::{
    BINDING_LABEL, COMPLETE_LABEL, LAST_USED_ANNOTATION, SOURCE_PV_LABEL, VOLUME_ROLE_LABEL,
};
use warmcache_reaper::{Report, Settings, Sweeper};
use warmcache_testkit::{
    ComponentAccount, ControlPlane, Fault, FaultInjector, TestNamespace, eventually,
};

const WAIT: Duration = Duration::from_secs(60);
const HANDLE: &str = "hf://Qwen/Qwen3-0.6B@v1";
const DRIVER: &str = "fake.csi.warmcache.io";

/// One test at a time: the volume rules look at every PV of the cluster.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

struct World {
    admin: Client,
    control: TestNamespace,
    reader: TestNamespace,
    writer: TestNamespace,
    account: ComponentAccount,
}

impl World {
    async fn new(prefix: &str) -> World {
        let plane = ControlPlane::shared().await.unwrap();
        let admin = plane.client().await.unwrap();
        let control = TestNamespace::new(&format!("{prefix}-ctl")).await.unwrap();
        let reader = TestNamespace::new(&format!("{prefix}-rd")).await.unwrap();
        let writer = TestNamespace::new(&format!("{prefix}-wr")).await.unwrap();
        let account =
            ComponentAccount::create(plane, &admin, "reaper", &control.name, &control.name)
                .await
                .unwrap();
        World {
            admin,
            control,
            reader,
            writer,
            account,
        }
    }

    fn config(&self) -> Config {
        Config {
            idle_seconds: 1,
            retiring_grace_seconds: 0,
            ..Config::new(self.control.name.clone())
        }
    }

    async fn sweeper(&self, config: Config, dry_run: bool) -> Sweeper {
        let settings = Settings {
            config,
            dry_run,
            page_size: 2,
            stage_wait: Duration::from_secs(30),
        };
        Sweeper::new(
            self.account.client().await.unwrap(),
            settings,
            None,
            None,
            None,
        )
    }

    async fn sweep(&self, config: Config) -> Report {
        let report = self
            .sweeper(config, false)
            .await
            .sweep(Timestamp::now())
            .await;
        println!("{}\n{}", report.lines.join("\n"), report.summary());
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        report
    }
}

fn identity(domain: &str) -> BindingIdentity {
    BindingIdentity::new(Workflow::HelmModelCache, domain, HANDLE)
}

fn binding(control: &str, writer: &str, domain: &str) -> ModelCacheBinding {
    let mut b = warmcache_api_modelcache::fixtures::binding(control, writer, identity(domain));
    // Named (the reader claim name, in the writer namespaces), but the object of that name the
    // test creates is not warmcache's: it must stay.
    b.spec
        .resources
        .persistent_volume_claim_names
        .push(warmcache_api_modelcache::reader_pvc_name(&b.spec.identity));
    b
}

fn primary_pv(name: &str, control: &str, claim: &str, complete: bool) -> PersistentVolume {
    let mut labels = BTreeMap::new();
    if complete {
        labels.insert(COMPLETE_LABEL.to_owned(), "true".to_owned());
        labels.insert(MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned());
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": { "pv.kubernetes.io/provisioned-by": DRIVER },
        },
        "spec": {
            "capacity": { "storage": "10Gi" },
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "nvcf-sc",
            "claimRef": { "namespace": control, "name": claim },
            "csi": { "driver": DRIVER, "volumeHandle": format!("{name}-handle") },
        },
    }))
    .unwrap()
}

async fn create<K>(api: &Api<K>, obj: &K) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.create(&PostParams::default(), obj).await.unwrap()
}

async fn bound(client: &Client, namespace: &str, claim: &str) {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    eventually(&format!("claim {namespace}/{claim} bound"), WAIT, || {
        let api = api.clone();
        async move {
            let c = api.get(claim).await.ok()?;
            (c.status?.phase.as_deref() == Some("Bound")).then_some(())
        }
    })
    .await
    .unwrap();
}

async fn pv_phase(client: &Client, name: &str, phase: &str) {
    let api: Api<PersistentVolume> = Api::all(client.clone());
    eventually(&format!("PV {name} {phase}"), WAIT, || {
        let api = api.clone();
        async move {
            let pv = api.get(name).await.ok()?;
            (pv.status?.phase.as_deref() == Some(phase)).then_some(())
        }
    })
    .await
    .unwrap();
}

/// Waits until `name` is gone (deleted objects may wait for a protection finalizer).
async fn gone<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    eventually(&format!("{name} gone"), WAIT, || async move {
        api.get_metadata_opt(name)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await
    .unwrap();
}

async fn exists<K>(api: &Api<K>, name: &str) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_metadata_opt(name).await.unwrap().is_some()
}

/// Everything an idle binding names, as the binding controller would have made it, and the
/// look-alikes it does not name.
struct Cache {
    binding: ModelCacheBinding,
    primary: String,
    view_pv: String,
    view_claim: String,
    writer_pv: String,
    writer_claim: String,
    job: String,
    lease: String,
    users_claim: String,
    lookalike_claim: String,
    lookalike_lease: String,
}

async fn idle_cache(w: &World, domain: &str, phase: BindingPhase) -> Cache {
    let c = &w.admin;
    let control = &w.control.name;
    let bindings: Api<ModelCacheBinding> = w.control.api();
    let mut b = create(&bindings, &binding(control, &w.writer.name, domain)).await;
    let hash = identity_hash(&b.spec.identity);
    let claim_name = writer_pvc_name(&b.spec.identity);

    // The primary claim and its PV (a provisioner's), bound, complete.
    let primary = format!("{control}-{}", &hash[..8]);
    let pvs: Api<PersistentVolume> = Api::all(c.clone());
    let primary_pv = create(&pvs, &primary_pv(&primary, control, &claim_name, true)).await;
    let size = k8s_openapi::apimachinery::pkg::api::resource::Quantity("10Gi".into());
    let mut claim = view::primary_claim(&b, size);
    claim.spec.as_mut().unwrap().volume_name = Some(primary.clone());
    create(&w.control.api(), &claim).await;
    bound(c, control, &claim_name).await;

    // A read-only view in the reader namespace, the writer view in the writer namespace.
    let (vpv, vclaim) =
        view::read_only_view(&b, &primary_pv, &w.reader.name, Some(1 << 20), &[]).unwrap();
    create(&pvs, &vpv).await;
    create(&w.reader.api(), &vclaim).await;
    let (wpv, wclaim) = view::writer_view(&b, &primary_pv).unwrap();
    create(&pvs, &wpv).await;
    create(&w.writer.api(), &wclaim).await;
    bound(c, &w.reader.name, &vclaim.name_any()).await;
    bound(c, &w.writer.name, &wclaim.name_any()).await;

    // The writer Job (suspended: nothing runs it here), the Lease, a named Secret that is not
    // warmcache's.
    let ours = json!({ MANAGED_BY_LABEL: MANAGED_BY_VALUE, BINDING_LABEL: b.name_any() });
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": { "name": writer_job_name(&b.spec.identity), "labels": ours },
        "spec": {
            "suspend": true,
            "template": { "spec": {
                "restartPolicy": "Never",
                "containers": [{ "name": "download", "image": "tools:1" }],
            }},
        },
    }))
    .unwrap();
    create(&w.writer.api(), &job).await;
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": { "name": b.spec.resources.lease_name, "labels": ours },
    }))
    .unwrap();
    create(&w.control.api(), &lease).await;
    let users_claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": { "name": warmcache_api_modelcache::reader_pvc_name(&b.spec.identity) },
        "spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": "none",
            "resources": { "requests": { "storage": "1Gi" } },
        },
    }))
    .unwrap();
    create(&w.writer.api(), &users_claim).await;

    // Look-alikes: warmcache's labels, names the binding does not name.
    let mut lookalike = vclaim.clone();
    lookalike.metadata.name = Some(format!("ro-pvc-{}", &hash[..20]));
    lookalike.metadata.resource_version = None;
    lookalike.spec.as_mut().unwrap().volume_name = None;
    lookalike.spec.as_mut().unwrap().storage_class_name = Some("none".into());
    create(&w.reader.api(), &lookalike).await;
    let mut other_lease = lease.clone();
    other_lease.metadata.name = Some(format!("init-lease-{}", &hash[..20]));
    create(&w.control.api(), &other_lease).await;

    // Status: unreferenced since long ago, the view recorded.
    let status = ModelCacheBindingStatus {
        phase: Some(phase),
        last_phase_transition_time: Some(Time(Timestamp::now())),
        unreferenced_since: Some(Time(
            Timestamp::now()
                .checked_sub(k8s_openapi::jiff::SignedDuration::from_hours(2))
                .unwrap(),
        )),
        realized: Some(RealizedStorage {
            bound_persistent_volume_name: Some(primary.clone()),
            population_state: Some(PopulationState::Ready),
            views: vec![view::reader_view(&b, &w.reader.name)],
            ..RealizedStorage::default()
        }),
        ..ModelCacheBindingStatus::default()
    };
    b.status = Some(status);
    let b = bindings
        .replace_status(&b.name_any(), &PostParams::default(), &b)
        .await
        .unwrap();
    Cache {
        primary,
        view_pv: vpv.name_any(),
        view_claim: vclaim.name_any(),
        writer_pv: wpv.name_any(),
        writer_claim: wclaim.name_any(),
        job: job.name_any(),
        lease: lease.name_any(),
        users_claim: users_claim.name_any(),
        lookalike_claim: lookalike.name_any(),
        lookalike_lease: other_lease.name_any(),
        binding: b,
    }
}

fn phase_of(b: &ModelCacheBinding) -> Option<BindingPhase> {
    b.status.as_ref()?.phase
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_binding_retires_and_exactly_what_it_names_goes_then_the_binding() {
    let _turn = serial().await;
    let w = World::new("reap-idle").await;
    let cache = idle_cache(&w, "domain-idle", BindingPhase::Active).await;
    let c = &w.admin;
    let pvs: Api<PersistentVolume> = Api::all(c.clone());
    let bindings: Api<ModelCacheBinding> = w.control.api();
    let name = cache.binding.name_any();

    // Inside the idle period nothing happens.
    let patient = Config {
        idle_seconds: 3 * 3600,
        ..w.config()
    };
    let report = w.sweep(patient).await;
    assert_eq!(
        report
            .kept
            .get(&(Rule::IdleRetirement, Keep::NotIdleLongEnough)),
        Some(&1)
    );
    assert_eq!(
        phase_of(&bindings.get(&name).await.unwrap()),
        Some(BindingPhase::Active)
    );

    // Past it: Retiring (phase one); within the retiring grace nothing is deleted yet.
    let settling = Config {
        retiring_grace_seconds: 3600,
        ..w.config()
    };
    let report = w.sweep(settling).await;
    assert!(
        report
            .lines
            .iter()
            .any(|l| l.starts_with("retire ModelCacheBinding")),
        "{report:?}"
    );
    assert_eq!(
        report.kept.get(&(Rule::RetiredBinding, Keep::Settling)),
        Some(&1),
        "{report:?}"
    );
    let retiring = bindings.get(&name).await.unwrap();
    assert_eq!(phase_of(&retiring), Some(BindingPhase::Retiring));
    assert!(exists(&w.reader.api::<PersistentVolumeClaim>(), &cache.view_claim).await);
    assert!(exists(&w.writer.api::<Job>(), &cache.job).await);

    // Phase two: every named object, then the binding.
    let report = w.sweep(w.config()).await;
    assert_eq!(
        report.kept.get(&(Rule::RetiredBinding, Keep::NotOurs)),
        Some(&1),
        "the named claim that is not warmcache's: {report:?}"
    );
    gone(&bindings, &name).await;
    let reader_claims: Api<PersistentVolumeClaim> = w.reader.api();
    let writer_claims: Api<PersistentVolumeClaim> = w.writer.api();
    let control_claims: Api<PersistentVolumeClaim> = w.control.api();
    gone(&reader_claims, &cache.view_claim).await;
    gone(&pvs, &cache.view_pv).await;
    gone(&writer_claims, &cache.writer_claim).await;
    gone(&pvs, &cache.writer_pv).await;
    gone(&w.writer.api::<Job>(), &cache.job).await;
    assert!(
        !exists(
            &control_claims,
            &writer_pvc_name(&cache.binding.spec.identity)
        )
        .await
    );
    gone(&w.control.api::<Lease>(), &cache.lease).await;

    // Kept: the data (Released, Retain, stamped with its last use), what it does not name, and
    // the named object that is not warmcache's.
    pv_phase(c, &cache.primary, "Released").await;
    let primary = pvs.get(&cache.primary).await.unwrap();
    assert_eq!(
        primary
            .spec
            .as_ref()
            .unwrap()
            .persistent_volume_reclaim_policy
            .as_deref(),
        Some("Retain")
    );
    let stamp = primary.annotations().get(LAST_USED_ANNOTATION).unwrap();
    let unreferenced = cache
        .binding
        .status
        .as_ref()
        .unwrap()
        .unreferenced_since
        .as_ref()
        .unwrap();
    assert_eq!(stamp.parse::<Timestamp>().unwrap(), unreferenced.0);
    assert!(exists(&reader_claims, &cache.lookalike_claim).await);
    assert!(exists(&w.control.api::<Lease>(), &cache.lookalike_lease).await);
    assert!(exists(&w.writer.api::<PersistentVolumeClaim>(), &cache.users_claim).await);

    // The next sweep keeps the complete primary inside its retention; with a retention of one
    // second it goes (its reclaim policy set to Delete for the provisioner).
    let report = w.sweep(w.config()).await;
    assert_eq!(
        report
            .kept
            .get(&(Rule::ExpiredPrimary, Keep::InsideRetention)),
        Some(&1),
        "{report:?}"
    );
    let forever = Config {
        retention_seconds: 0,
        ..w.config()
    };
    let report = w.sweep(forever).await;
    assert_eq!(
        report.kept.get(&(Rule::ExpiredPrimary, Keep::KeptForever)),
        Some(&1)
    );
    let short = Config {
        retention_seconds: 1,
        ..w.config()
    };
    let report = w.sweep(short).await;
    assert!(
        report
            .lines
            .iter()
            .any(|l| l.contains(&cache.primary) && l.contains("expired-primary")),
        "{report:?}"
    );
    let primary = pvs.get(&cache.primary).await.unwrap();
    assert_eq!(
        primary
            .spec
            .unwrap()
            .persistent_volume_reclaim_policy
            .as_deref(),
        Some("Delete")
    );
    pvs.delete(&cache.primary, &DeleteParams::default())
        .await
        .ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_prints_every_action_and_writes_nothing() {
    let _turn = serial().await;
    let w = World::new("reap-dry").await;
    let cache = idle_cache(&w, "domain-dry", BindingPhase::Active).await;
    let bindings: Api<ModelCacheBinding> = w.control.api();
    let before = bindings.get(&cache.binding.name_any()).await.unwrap();
    // An orphan view too, for the volume rules.
    let pvs: Api<PersistentVolume> = Api::all(w.admin.clone());
    let orphan = format!("{}-orphan", w.control.name);
    create(
        &pvs,
        &view_pv(&orphan, &w.reader.name, "ro-pvc-gone", Some("deleted-uid")),
    )
    .await;
    pv_phase(&w.admin, &orphan, "Released").await;
    let report = w
        .sweeper(w.config(), true)
        .await
        .sweep(Timestamp::now())
        .await;
    println!("{}", report.lines.join("\n"));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(
        report
            .lines
            .iter()
            .any(|l| l.starts_with(&format!("would delete PersistentVolume {orphan}"))),
        "{report:?}"
    );
    assert!(exists(&pvs, &orphan).await, "a dry run deletes no volume");
    pvs.delete(&orphan, &DeleteParams::default()).await.ok();
    assert!(report.lines.iter().any(|l| l.starts_with("would retire")));
    for named in [&cache.view_claim, &cache.view_pv, &cache.job, &cache.lease] {
        assert!(
            report
                .lines
                .iter()
                .any(|l| l.starts_with("would delete") && l.contains(named.as_str())),
            "{named}: {report:?}"
        );
    }
    assert!(
        !report
            .lines
            .iter()
            .any(|l| l.contains(&format!("{}/{}", w.writer.name, cache.users_claim))),
        "not ours: not listed"
    );
    let after = bindings.get(&cache.binding.name_any()).await.unwrap();
    assert_eq!(
        before.resource_version(),
        after.resource_version(),
        "the binding unchanged"
    );
    assert!(exists(&w.reader.api::<PersistentVolumeClaim>(), &cache.view_claim).await);
    assert!(
        exists(
            &Api::<PersistentVolume>::all(w.admin.clone()),
            &cache.view_pv
        )
        .await
    );
    assert!(exists(&w.writer.api::<Job>(), &cache.job).await);
    cleanup_pvs(&w.admin, &cache).await;
}

async fn cleanup_pvs(c: &Client, cache: &Cache) {
    let pvs: Api<PersistentVolume> = Api::all(c.clone());
    for pv in [&cache.primary, &cache.view_pv, &cache.writer_pv] {
        pvs.delete(pv, &DeleteParams::default()).await.ok();
    }
}

fn reader_pod(b: &ModelCacheBinding, claim: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "reader-0", "labels": { MODEL_LABEL: identity_hash(&b.spec.identity) } },
        "spec": {
            "containers": [{ "name": "vllm", "image": "vllm:1" }],
            "volumes": [{ "name": "m", "persistentVolumeClaim": { "claimName": claim, "readOnly": true } }],
        },
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_between_the_phases_stops_the_deletion_until_it_is_gone() {
    let _turn = serial().await;
    let w = World::new("reap-back").await;
    let cache = idle_cache(&w, "domain-back", BindingPhase::Retiring).await;
    let bindings: Api<ModelCacheBinding> = w.control.api();
    let pods: Api<Pod> = w.reader.api();
    create(&pods, &reader_pod(&cache.binding, &cache.view_claim)).await;

    let report = w.sweep(w.config()).await;
    assert_eq!(
        report.kept.get(&(Rule::RetiredBinding, Keep::Referenced)),
        Some(&1)
    );
    assert_eq!(report.actions, 0, "{report:?}");
    let b = bindings.get(&cache.binding.name_any()).await.unwrap();
    assert_eq!(phase_of(&b), Some(BindingPhase::Retiring), "stays Retiring");
    assert!(exists(&w.reader.api::<PersistentVolumeClaim>(), &cache.view_claim).await);

    pods.delete("reader-0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    gone(&pods, "reader-0").await;
    w.sweep(w.config()).await;
    assert!(
        bindings
            .get_opt(&cache.binding.name_any())
            .await
            .unwrap()
            .is_none()
    );
    gone(&w.reader.api::<PersistentVolumeClaim>(), &cache.view_claim).await;
    cleanup_pvs(&w.admin, &cache).await;
}

fn attachment(name: &str, pv: &str) -> VolumeAttachment {
    serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": { "name": name },
        "spec": { "attacher": DRIVER, "nodeName": "gpu-node-1", "source": { "persistentVolumeName": pv } },
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retirement_cut_short_is_finished_by_the_next_sweep_and_deletes_nothing_more() {
    let _turn = serial().await;
    let w = World::new("reap-cut").await;
    let cache = idle_cache(&w, "domain-cut", BindingPhase::Retiring).await;
    let pvs: Api<PersistentVolume> = Api::all(w.admin.clone());
    let attachments: Api<VolumeAttachment> = Api::all(w.admin.clone());
    let va = format!("{}-va", w.control.name);
    create(&attachments, &attachment(&va, &cache.view_pv)).await;

    // The view PV is still attached: the sweep deletes the view claims (stage 0), waits, and
    // stops there, as a crash between two stages would leave it.
    let settings = Settings {
        config: w.config(),
        dry_run: false,
        page_size: 500,
        stage_wait: Duration::from_secs(2),
    };
    let sweeper = Sweeper::new(
        w.account.client().await.unwrap(),
        settings,
        None,
        None,
        None,
    );
    let report = sweeper.sweep(Timestamp::now()).await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(
        report.kept.get(&(Rule::RetiredBinding, Keep::Attached)),
        Some(&1),
        "{report:?}"
    );
    gone(&w.reader.api::<PersistentVolumeClaim>(), &cache.view_claim).await;
    assert!(exists(&pvs, &cache.view_pv).await, "attached: kept");
    assert!(
        exists(&w.writer.api::<Job>(), &cache.job).await,
        "a later stage: untouched"
    );
    assert!(exists(&w.control.api::<Lease>(), &cache.lease).await);

    // Detached: the next sweep finishes, and the look-alikes are still there.
    attachments
        .delete(&va, &DeleteParams::default())
        .await
        .unwrap();
    w.sweep(w.config()).await;
    let bindings: Api<ModelCacheBinding> = w.control.api();
    assert!(
        bindings
            .get_opt(&cache.binding.name_any())
            .await
            .unwrap()
            .is_none()
    );
    gone(&pvs, &cache.view_pv).await;
    gone(&w.writer.api::<Job>(), &cache.job).await;
    assert!(
        exists(
            &w.reader.api::<PersistentVolumeClaim>(),
            &cache.lookalike_claim
        )
        .await
    );
    assert!(exists(&w.control.api::<Lease>(), &cache.lookalike_lease).await);
    assert!(exists(&pvs, &cache.primary).await, "the data stays");
    cleanup_pvs(&w.admin, &cache).await;
}

fn view_pv(name: &str, claim_ns: &str, claim: &str, claim_uid: Option<&str>) -> PersistentVolume {
    let mut claim_ref = json!({ "namespace": claim_ns, "name": claim });
    if let Some(uid) = claim_uid {
        claim_ref["uid"] = json!(uid);
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {
            "name": name,
            "labels": {
                MANAGED_BY_LABEL: MANAGED_BY_VALUE,
                VOLUME_ROLE_LABEL: "reader-shared",
                BINDING_LABEL: "model-cache-none",
            },
        },
        "spec": {
            "capacity": { "storage": "1Gi" },
            "accessModes": ["ReadOnlyMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "claimRef": claim_ref,
            "csi": { "driver": DRIVER, "volumeHandle": format!("{name}-handle"), "readOnly": true },
        },
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_views_go_only_on_proof_and_never_while_attached_or_on_an_unreadable_namespace() {
    let _turn = serial().await;
    let w = World::new("reap-view").await;
    let pvs: Api<PersistentVolume> = Api::all(w.admin.clone());
    let p = &w.control.name;
    let gone_ns = format!("{p}-gone");
    // Released (its claim UID names a claim that does not exist), attached-and-released, in a
    // namespace that does not exist, the same behind a namespace GET that fails with 500, and
    // a look-alike without warmcache's label.
    let released = format!("{p}-released");
    let attached = format!("{p}-attached");
    let in_gone = format!("{p}-in-gone");
    let unreadable_ns = format!("{p}-unreadable");
    let unreadable = format!("{p}-unreadable-pv");
    let lookalike = format!("{p}-lookalike");
    create(
        &pvs,
        &view_pv(
            &released,
            &w.reader.name,
            "ro-pvc-x",
            Some("deleted-claim-uid"),
        ),
    )
    .await;
    create(
        &pvs,
        &view_pv(
            &attached,
            &w.reader.name,
            "ro-pvc-y",
            Some("deleted-claim-uid"),
        ),
    )
    .await;
    create(&pvs, &view_pv(&in_gone, &gone_ns, "ro-pvc-z", None)).await;
    create(
        &pvs,
        &view_pv(&unreadable, &unreadable_ns, "ro-pvc-z", None),
    )
    .await;
    let mut foreign = view_pv(
        &lookalike,
        &w.reader.name,
        "ro-pvc-w",
        Some("deleted-claim-uid"),
    );
    foreign
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .remove(MANAGED_BY_LABEL);
    create(&pvs, &foreign).await;
    let attachments: Api<VolumeAttachment> = Api::all(w.admin.clone());
    let va = format!("{p}-va");
    create(&attachments, &attachment(&va, &attached)).await;
    for pv in [&released, &attached, &lookalike] {
        pv_phase(&w.admin, pv, "Released").await;
    }

    // The namespace GET of one namespace fails with 500: its volume is kept.
    let faults = FaultInjector::new();
    faults.inject(
        http::Method::GET,
        &format!("/api/v1/namespaces/{unreadable_ns}"),
        Fault::ServerError,
        100,
    );
    let plane = ControlPlane::shared().await.unwrap();
    let faulty = plane.client_with_faults(faults.clone()).await.unwrap();
    let settings = Settings {
        config: w.config(),
        dry_run: false,
        page_size: 3,
        stage_wait: Duration::from_secs(2),
    };
    let report = Sweeper::new(faulty, settings, None, None, None)
        .sweep(Timestamp::now())
        .await;
    println!("{}", report.lines.join("\n"));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(faults.injected() >= 1);
    gone(&pvs, &released).await;
    gone(&pvs, &in_gone).await;
    assert!(
        exists(&pvs, &unreadable).await,
        "namespace unreadable: kept"
    );
    assert!(exists(&pvs, &attached).await, "attached: kept");
    assert!(exists(&pvs, &lookalike).await, "not warmcache's: kept");
    assert!(
        report
            .kept
            .contains_key(&(Rule::OrphanView, Keep::NamespaceUncertain))
    );
    assert!(
        report
            .kept
            .contains_key(&(Rule::OrphanView, Keep::Attached))
    );

    attachments
        .delete(&va, &DeleteParams::default())
        .await
        .unwrap();
    w.sweep(w.config()).await;
    gone(&pvs, &attached).await;
    for pv in [&unreadable, &lookalike] {
        pvs.delete(pv, &DeleteParams::default()).await.ok();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_primaries_lose_their_storage_only_when_released_incomplete_and_old() {
    let _turn = serial().await;
    let w = World::new("reap-abandon").await;
    let pvs: Api<PersistentVolume> = Api::all(w.admin.clone());
    let control = &w.control.name;
    let hash = identity_hash(&identity("domain-abandon"));
    let claim = format!("rw-pvc-{hash}");
    // As the external provisioner names a PV: pvc-<claim UID>; the claim is gone.
    let claim_uid = format!("{control}-abandoned");
    let abandoned = format!("pvc-{claim_uid}");
    let mut pv = primary_pv(&abandoned, control, &claim, false);
    pv.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some(claim_uid.clone());
    create(&pvs, &pv).await;
    // A retained PV recycled by hand onto the claim name (its name is another claim's UID).
    let recycled = format!("pvc-{control}-recycled");
    let mut pv = primary_pv(&recycled, control, &claim, false);
    pv.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some(claim_uid.clone());
    create(&pvs, &pv).await;
    // A third, whose writer view is pre-bound in a live namespace: a download may be writing.
    let written_uid = format!("{control}-writing");
    let writing = format!("pvc-{written_uid}");
    let mut pv = primary_pv(&writing, control, &claim, false);
    pv.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some(written_uid);
    create(&pvs, &pv).await;
    let writer_view = format!("{control}-writer-view");
    let mut wv = view_of(
        &writing,
        view_pv(&writer_view, &w.writer.name, "rw-pvc-x", None),
    );
    wv.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(VOLUME_ROLE_LABEL.into(), "writer".into());
    create(&pvs, &wv).await;
    // The same, claimed from another namespace: not a primary of this control namespace.
    let elsewhere = format!("{control}-elsewhere");
    let mut other = primary_pv(&elsewhere, &w.reader.name, &claim, false);
    other.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some("deleted-claim-uid".into());
    create(&pvs, &other).await;
    for pv in [&abandoned, &elsewhere, &recycled, &writing] {
        pv_phase(&w.admin, pv, "Released").await;
    }

    let report = w.sweep(w.config()).await;
    assert_eq!(
        report.kept.get(&(Rule::AbandonedPrimary, Keep::Young)),
        Some(&2),
        "{report:?}"
    );
    let reclaim = |pv: PersistentVolume| pv.spec.unwrap().persistent_volume_reclaim_policy.unwrap();
    assert_eq!(reclaim(pvs.get(&abandoned).await.unwrap()), "Retain");

    tokio::time::sleep(Duration::from_secs(2)).await;
    let old = Config {
        abandon_after_seconds: 1,
        ..w.config()
    };
    let report = w.sweep(old).await;
    assert_eq!(reclaim(pvs.get(&abandoned).await.unwrap()), "Delete");
    assert_eq!(
        reclaim(pvs.get(&recycled).await.unwrap()),
        "Retain",
        "not the provisioner's volume for that claim: untouched"
    );
    assert_eq!(reclaim(pvs.get(&writing).await.unwrap()), "Retain");
    assert_eq!(
        report.kept.get(&(Rule::AbandonedPrimary, Keep::ViewInUse)),
        Some(&1),
        "{report:?}"
    );
    assert_eq!(
        reclaim(pvs.get(&elsewhere).await.unwrap()),
        "Retain",
        "not ours: untouched"
    );
    for pv in [&abandoned, &elsewhere, &recycled, &writing, &writer_view] {
        pvs.delete(pv, &DeleteParams::default()).await.ok();
    }
}

fn holder_pod(claim: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "holder-0",
            "labels": { MANAGED_BY_LABEL: MANAGED_BY_VALUE, "app.kubernetes.io/component": "mount-holder" },
        },
        "spec": {
            "containers": [{ "name": "pause", "image": "pause:3.10" }],
            "volumes": [{ "name": "m", "persistentVolumeClaim": { "claimName": claim, "readOnly": true } }],
        },
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_view_claims_go_with_their_mount_holders_but_not_while_a_pod_reads_them() {
    let _turn = serial().await;
    let w = World::new("reap-claim").await;
    let b = binding(&w.control.name, &w.writer.name, "domain-claim");
    let bindings: Api<ModelCacheBinding> = w.control.api();
    let b = create(&bindings, &b).await;
    let primary = primary_pv("unused", &w.control.name, "rw-pvc-x", true);
    let (_, orphan) = view::read_only_view(&b, &primary, &w.reader.name, None, &[]).unwrap();
    let (_, read) = view::read_only_view(&b, &primary, &w.writer.name, None, &[]).unwrap();
    let mut lookalike = orphan.clone();
    lookalike.metadata.name = Some("ro-pvc-lookalike".into());
    lookalike
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .remove(MANAGED_BY_LABEL);
    for (ns, claim) in [
        (&w.reader, &orphan),
        (&w.writer, &read),
        (&w.reader, &lookalike),
    ] {
        let mut claim = claim.clone();
        claim.spec.as_mut().unwrap().volume_name = None;
        create(&ns.api::<PersistentVolumeClaim>(), &claim).await;
    }
    create(&w.reader.api::<Pod>(), &holder_pod(&orphan.name_any())).await;
    create(&w.writer.api::<Pod>(), &reader_pod(&b, &read.name_any())).await;

    let report = w.sweep(w.config()).await;
    assert!(
        report.kept.contains_key(&(Rule::OrphanClaim, Keep::Young)),
        "{report:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let old = Config {
        orphan_claim_after_seconds: 1,
        ..w.config()
    };
    // While its binding records it as a view, the claim is the binding's (the controller would
    // create it again): kept.
    let mut recording = bindings.get(&b.name_any()).await.unwrap();
    recording.status = Some(ModelCacheBindingStatus {
        phase: Some(BindingPhase::Active),
        realized: Some(RealizedStorage {
            views: vec![view::reader_view(&b, &w.reader.name)],
            ..RealizedStorage::default()
        }),
        ..ModelCacheBindingStatus::default()
    });
    let recording = bindings
        .replace_status(&b.name_any(), &PostParams::default(), &recording)
        .await
        .unwrap();
    let report = w.sweep(old.clone()).await;
    assert_eq!(
        report.kept.get(&(Rule::OrphanClaim, Keep::NamedByBinding)),
        Some(&1),
        "{report:?}"
    );
    assert!(exists(&w.reader.api::<PersistentVolumeClaim>(), &orphan.name_any()).await);
    let mut forgetting = recording;
    forgetting.status.as_mut().unwrap().realized = None;
    bindings
        .replace_status(&b.name_any(), &PostParams::default(), &forgetting)
        .await
        .unwrap();
    let report = w.sweep(old).await;
    assert_eq!(
        report.kept.get(&(Rule::OrphanClaim, Keep::InUse)),
        Some(&1),
        "{report:?}"
    );
    let reader_claims: Api<PersistentVolumeClaim> = w.reader.api();
    gone(&reader_claims, &orphan.name_any()).await;
    let holders: Api<Pod> = w.reader.api();
    gone(&holders, "holder-0").await;
    assert!(
        exists(&w.writer.api::<PersistentVolumeClaim>(), &read.name_any()).await,
        "read: kept"
    );
    assert!(
        exists(&reader_claims, "ro-pvc-lookalike").await,
        "not warmcache's: kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployment_records_an_event_and_metrics_for_a_retirement() {
    let _turn = serial().await;
    let w = World::new("reap-run").await;
    let cache = idle_cache(&w, "domain-run", BindingPhase::Active).await;
    let args = warmcache_runtime::RuntimeArgs {
        kubeconfig: Some(w.account.kubeconfig_path().to_path_buf()),
        kube_context: None,
        log_level: None,
        log_format: warmcache_runtime::LogFormat::Plain,
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        shutdown_grace: Duration::from_secs(5),
        shutdown_delay: Duration::ZERO,
        kube_api_qps: warmcache_runtime::DEFAULT_KUBE_API_QPS,
        kube_api_burst: warmcache_runtime::DEFAULT_KUBE_API_BURST,
    };
    let leader = warmcache_runtime::LeaderElectionArgs {
        leader_elect: true,
        leader_election_namespace: Some(w.control.name.clone()),
        leader_election_lease: None,
        leader_election_identity: Some("reaper-0".into()),
        leader_election_lease_duration: Duration::from_secs(15),
        leader_election_renew_deadline: Duration::from_secs(10),
        leader_election_retry_period: Duration::from_secs(2),
    };
    let mut runtime = warmcache_runtime::Runtime::builder("reaper", args)
        .without_global_telemetry()
        .with_leader_election(leader)
        .build()
        .await
        .unwrap();
    let settings = Settings {
        config: w.config(),
        dry_run: false,
        page_size: 500,
        stage_wait: Duration::from_secs(30),
    };
    warmcache_reaper::start(&mut runtime, settings, Duration::from_secs(3600)).unwrap();
    let admin = runtime.admin_addr();
    let stop = runtime.shutdown_token();
    let task = tokio::spawn(runtime.run());

    let bindings: Api<ModelCacheBinding> = w.control.api();
    gone(&bindings, &cache.binding.name_any()).await;
    let events: Api<CoreEvent> = w.control.api();
    let retiring = eventually("the Retiring Event", WAIT, || {
        let events = events.clone();
        async move {
            events
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("Retiring"))
        }
    })
    .await
    .unwrap();
    assert!(retiring.message.unwrap_or_default().contains("idle period"));
    // The sweep ends after the volume pass.
    let metrics = eventually("the sweep counted", WAIT, || async move {
        let text = scrape(admin).await;
        text.contains(r#"warmcache_reaper_sweeps_total{result="ok"} 1"#)
            .then_some(text)
    })
    .await
    .unwrap();
    // Kept for `promtool check metrics` (docs/operations.md).
    std::fs::write(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("reaper-metrics.prom"),
        &metrics,
    )
    .unwrap();
    for series in [
        r#"warmcache_reaper_actions_total{action="retire",rule="idle-retirement"} 1"#,
        r#"warmcache_reaper_actions_total{action="finalize",rule="retired-binding"} 1"#,
    ] {
        assert!(metrics.contains(series), "{series}\n{metrics}");
    }
    stop.cancel();
    task.await.unwrap().unwrap();
    cleanup_pvs(&w.admin, &cache).await;
}

async fn scrape(admin: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(admin).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: admin\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    raw.split_once("\r\n\r\n").unwrap().1.to_owned()
}

fn view_of(primary: &str, mut pv: PersistentVolume) -> PersistentVolume {
    pv.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(SOURCE_PV_LABEL.to_owned(), primary.to_owned());
    pv
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_primary_goes_after_its_views_and_never_while_one_is_read() {
    let _turn = serial().await;
    let w = World::new("reap-exp").await;
    let pvs: Api<PersistentVolume> = Api::all(w.admin.clone());
    let control = &w.control.name;
    let hash = identity_hash(&identity("domain-exp"));
    let primary = format!("{control}-primary");
    let mut pv = primary_pv(&primary, control, &format!("rw-pvc-{hash}"), true);
    pv.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some("deleted-claim-uid".into());
    create(&pvs, &pv).await;
    let released = format!("{control}-v-released");
    let read = format!("{control}-v-read");
    create(
        &pvs,
        &view_of(
            &primary,
            view_pv(&released, &w.writer.name, "ro-pvc-a", Some("deleted-uid")),
        ),
    )
    .await;
    create(
        &pvs,
        &view_of(&primary, view_pv(&read, &w.reader.name, "ro-pvc-b", None)),
    )
    .await;
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": { "name": "ro-pvc-b" },
        "spec": {
            "accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": read,
            "resources": { "requests": { "storage": "1Gi" } },
        },
    }))
    .unwrap();
    create(&w.reader.api(), &claim).await;
    bound(&w.admin, &w.reader.name, "ro-pvc-b").await;
    pv_phase(&w.admin, &primary, "Released").await;

    // One view is bound in a live namespace: the primary and its views stay.
    let expired = Config {
        retention_seconds: 1,
        ..w.config()
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = w.sweep(expired.clone()).await;
    assert_eq!(
        report.kept.get(&(Rule::ExpiredPrimary, Keep::ViewInUse)),
        Some(&1),
        "{report:?}"
    );
    let reclaim = |pv: PersistentVolume| pv.spec.unwrap().persistent_volume_reclaim_policy.unwrap();
    assert_eq!(reclaim(pvs.get(&primary).await.unwrap()), "Retain");
    assert!(exists(&pvs, &read).await);

    // Its claim gone, the view is Released: views first (objects only), then the primary.
    w.reader
        .api::<PersistentVolumeClaim>()
        .delete("ro-pvc-b", &DeleteParams::default())
        .await
        .unwrap();
    pv_phase(&w.admin, &read, "Released").await;
    let report = w.sweep(expired).await;
    let order: Vec<&String> = report
        .lines
        .iter()
        .filter(|l| l.contains("expired-primary") || l.contains("orphan-view"))
        .collect();
    println!("{order:?}");
    gone(&pvs, &released).await;
    gone(&pvs, &read).await;
    assert_eq!(reclaim(pvs.get(&primary).await.unwrap()), "Delete");
    assert_eq!(
        order.len(),
        2,
        "each view once, then the primary: {order:?}"
    );
    assert!(order[0].contains(&read), "{order:?}");
    assert!(
        order[1].contains(&primary) && order[1].contains("Delete"),
        "the primary last: {order:?}"
    );
    pvs.delete(&primary, &DeleteParams::default()).await.ok();
}

/// A failed read is never proof: when the bindings, the VolumeAttachments or the pods of a
/// claim's namespace cannot be listed, the sweep reports the error and deletes nothing that
/// read would have had to clear; the next sweep with the API answering does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_read_is_never_proof() {
    let _turn = serial().await;
    let w = World::new("reap-fail").await;
    let pvs: Api<PersistentVolume> = Api::all(w.admin.clone());
    let orphan = format!("{}-orphan", w.control.name);
    create(
        &pvs,
        &view_pv(&orphan, &w.reader.name, "ro-pvc-gone", Some("deleted-uid")),
    )
    .await;
    pv_phase(&w.admin, &orphan, "Released").await;
    let plane = ControlPlane::shared().await.unwrap();
    let bindings_path = format!("/namespaces/{}/modelcachebindings", w.control.name);
    let pods_path = format!("/api/v1/namespaces/{}/pods", w.reader.name);
    for (what, path) in [
        ("ModelCacheBindings", bindings_path.as_str()),
        ("VolumeAttachments", "/volumeattachments"),
        ("pods of namespace", pods_path.as_str()),
    ] {
        let faults = FaultInjector::new();
        faults.inject(http::Method::GET, path, Fault::ServerError, usize::MAX);
        let faulty = plane.client_with_faults(faults.clone()).await.unwrap();
        let settings = Settings {
            config: w.config(),
            dry_run: false,
            page_size: 500,
            stage_wait: Duration::from_secs(1),
        };
        let report = Sweeper::new(faulty, settings, None, None, None)
            .sweep(Timestamp::now())
            .await;
        assert!(faults.injected() >= 1, "{what}");
        assert!(
            report.errors.iter().any(|e| e.contains(what)),
            "{what}: {:?}",
            report.errors
        );
        assert!(exists(&pvs, &orphan).await, "{what} unreadable: kept");
    }
    w.sweep(w.config()).await;
    gone(&pvs, &orphan).await;
}

/// A crash between deleting a binding and removing its finalizer leaves a binding being deleted
/// whose objects are gone: the next sweep removes the finalizer (testing the UID it read) and
/// the binding goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_left_deleting_with_its_finalizer_is_finished() {
    let _turn = serial().await;
    let w = World::new("reap-fin").await;
    let bindings: Api<ModelCacheBinding> = w.control.api();
    let b = create(
        &bindings,
        &binding(&w.control.name, &w.writer.name, "domain-fin"),
    )
    .await;
    bindings
        .delete(&b.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    let deleting = bindings.get(&b.name_any()).await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    let report = w.sweep(w.config()).await;
    assert!(
        report
            .lines
            .iter()
            .any(|l| l.starts_with("deleted ModelCacheBinding")),
        "{report:?}"
    );
    gone(&bindings, &b.name_any()).await;
}

/// An encrypted cache's StorageClass and key Secret, as the binding controller makes them for
/// `b`.
fn encryption_objects(
    b: &ModelCacheBinding,
) -> (
    k8s_openapi::api::core::v1::Secret,
    k8s_openapi::api::storage::v1::StorageClass,
) {
    use warmcache_modelvolume::encryption::{
        EncryptionKey, KEY_BYTES, SECRET_PARAMETERS, encryption_names, key_secret,
    };
    let names = encryption_names(b).unwrap().unwrap();
    let secret = key_secret(b, &names, &EncryptionKey::from_bytes([7; KEY_BYTES]));
    let mut parameters = BTreeMap::new();
    for (name, namespace) in SECRET_PARAMETERS {
        parameters.insert(name.to_owned(), names.secret.clone());
        parameters.insert(namespace.to_owned(), names.namespace.clone());
    }
    let class = k8s_openapi::api::storage::v1::StorageClass {
        metadata: kube::api::ObjectMeta {
            name: Some(names.class.clone()),
            labels: secret.metadata.labels.clone(),
            ..kube::api::ObjectMeta::default()
        },
        provisioner: DRIVER.into(),
        parameters: Some(parameters),
        reclaim_policy: Some("Retain".into()),
        volume_binding_mode: Some("WaitForFirstConsumer".into()),
        ..k8s_openapi::api::storage::v1::StorageClass::default()
    };
    (secret, class)
}

/// The primary of an encrypted cache as the external-provisioner records it: provisioned on the
/// encrypted class, the key Secret in its CSI references and its deletion-secret annotations.
/// Not bound (a claim of another size and access mode cannot bind it).
fn encrypted_pv(name: &str, class: &str, control: &str, secret: &str) -> PersistentVolume {
    let reference = json!({ "name": secret, "namespace": control });
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {
            "name": name,
            "annotations": {
                "pv.kubernetes.io/provisioned-by": DRIVER,
                "volume.kubernetes.io/provisioner-deletion-secret-name": secret,
                "volume.kubernetes.io/provisioner-deletion-secret-namespace": control,
            },
        },
        "spec": {
            "capacity": { "storage": "1Gi" },
            "accessModes": ["ReadOnlyMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": class,
            "csi": {
                "driver": DRIVER, "volumeHandle": format!("{name}-handle"),
                "nodeStageSecretRef": reference, "nodePublishSecretRef": reference,
            },
        },
    }))
    .unwrap()
}

/// `orphan-encryption`: an encrypted cache's class and key Secret stay while a binding of the
/// cache, a PV naming them or a claim asking for the class exists; then the class goes, and
/// the Secret in the next sweep. Secrets under such names without warmcache's labels, and
/// classes with the labels under other names, are never touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_caches_class_then_key_go_once_nothing_can_need_them() {
    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::api::storage::v1::StorageClass;
    use warmcache_api_modelcache::v2beta1::Transition;

    let _turn = serial().await;
    let w = World::new("reap-enc").await;
    let control = &w.control.name;
    let mut b = warmcache_api_modelcache::fixtures::binding_with(
        control,
        &w.writer.name,
        identity("domain-enc"),
        Transition::RoxReadOnly,
    );
    let hash = identity_hash(&b.spec.identity);
    b.spec.decision.encryption_required = true;
    b.spec.resources.secret_names = vec![hash.clone()];
    b.spec.resources.storage_class_names = vec![format!("{hash}-sc")];
    let bindings: Api<ModelCacheBinding> = w.control.api();
    let b = create(&bindings, &b).await;
    let secrets: Api<Secret> = w.control.api();
    let classes: Api<StorageClass> = Api::all(w.admin.clone());
    let pvs: Api<PersistentVolume> = Api::all(w.admin.clone());
    let (secret, class) = encryption_objects(&b);
    let (secret_name, class_name) = (secret.name_any(), class.name_any());
    create(&secrets, &secret).await;
    create(&classes, &class).await;
    let pv = format!("{control}-encrypted");
    create(&pvs, &encrypted_pv(&pv, &class_name, control, &secret_name)).await;
    // Look-alikes: a Secret named after another cache's hash without the labels; a class with
    // the labels under a name that is not derived from its model label.
    let foreign_secret = identity_hash(&identity("domain-enc-foreign"));
    let foreign: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": foreign_secret },
        "data": { "key": "c2VjcmV0" },
    }))
    .unwrap();
    create(&secrets, &foreign).await;
    // And a Secret with every label of an encryption object but a name that is not the one its
    // model label derives: listed by the selector, and still never touched.
    let mut labelled = secret.clone();
    let labelled_name = format!("{secret_name}-copy");
    labelled.metadata.name = Some(labelled_name.clone());
    create(&secrets, &labelled).await;
    let mut lookalike = class.clone();
    let lookalike_name = format!("{control}-lookalike-sc");
    lookalike.metadata.name = Some(lookalike_name.clone());
    create(&classes, &lookalike).await;

    let kept = |report: &Report, reason| {
        report
            .kept
            .get(&(Rule::OrphanEncryption, reason))
            .copied()
            .unwrap_or(0)
    };
    // The binding keeps both (its phase does not matter).
    let report = w.sweep(w.config()).await;
    assert_eq!(kept(&report, Keep::BindingExists), 2, "{report:?}");

    // The binding gone (deleted, its finalizer removed): the PV keeps both.
    bindings
        .delete(&b.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    bindings
        .patch(
            &b.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .unwrap();
    gone(&bindings, &b.name_any()).await;
    let report = w.sweep(w.config()).await;
    assert_eq!(kept(&report, Keep::VolumeUses), 2, "{report:?}");
    assert_eq!(kept(&report, Keep::BindingExists), 0, "{report:?}");

    // A claim asking for the class (its volume may be being provisioned) keeps both too.
    let pending: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": { "name": "encrypted-pending" },
        "spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": class_name,
            "resources": { "requests": { "storage": "100Gi" } },
        },
    }))
    .unwrap();
    let reader_claims: Api<PersistentVolumeClaim> = w.reader.api();
    create(&reader_claims, &pending).await;
    pvs.delete(&pv, &DeleteParams::default()).await.unwrap();
    gone(&pvs, &pv).await;
    let report = w.sweep(w.config()).await;
    assert_eq!(kept(&report, Keep::ClaimUses), 2, "{report:?}");

    // Nothing uses them: a dry run says the class would go and deletes nothing.
    reader_claims
        .delete("encrypted-pending", &DeleteParams::default())
        .await
        .unwrap();
    gone(&reader_claims, "encrypted-pending").await;
    let report = w
        .sweeper(w.config(), true)
        .await
        .sweep(Timestamp::now())
        .await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(
        report.lines.iter().any(|l| l
            .starts_with(&format!("would delete StorageClass {class_name}"))
            && l.ends_with("(orphan-encryption)")),
        "{report:?}"
    );
    assert!(
        exists(&classes, &class_name).await,
        "a dry run deletes nothing"
    );

    // The class goes first; its Secret is kept while the class was listed.
    let report = w.sweep(w.config()).await;
    assert!(
        report
            .lines
            .iter()
            .any(|l| l.starts_with(&format!("delete StorageClass {class_name}"))),
        "{report:?}"
    );
    assert_eq!(kept(&report, Keep::ClassExists), 1, "{report:?}");
    gone(&classes, &class_name).await;
    assert!(
        exists(&secrets, &secret_name).await,
        "the key outlives its class"
    );

    // The next sweep: the key goes.
    let report = w.sweep(w.config()).await;
    assert!(
        report
            .lines
            .iter()
            .any(|l| l.starts_with(&format!("delete Secret {control}/{secret_name}"))),
        "{report:?}"
    );
    gone(&secrets, &secret_name).await;

    // Never touched: the Secret without the labels, the class under a foreign name.
    let report = w.sweep(w.config()).await;
    assert!(
        report.lines.iter().all(|l| !l.contains(&foreign_secret)
            && !l.contains(&lookalike_name)
            && !l.contains(&labelled_name)),
        "{report:?}"
    );
    assert!(exists(&secrets, &foreign_secret).await);
    assert!(exists(&secrets, &labelled_name).await);
    assert!(exists(&classes, &lookalike_name).await);
    classes
        .delete(&lookalike_name, &DeleteParams::default())
        .await
        .ok();
}
