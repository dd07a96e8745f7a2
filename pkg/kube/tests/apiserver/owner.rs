//! Owner resolution against the real API server, with the real Deployment, ReplicaSet,
//! StatefulSet and Job controllers of kube-controller-manager creating the chains.
//!
//! Design around the garbage collector: chains are made of objects whose owners really exist
//! (controllers create the ReplicaSets and pods; the Job is owned by a real CronJob), so nothing
//! is collected. References that must be stale (missing owner, other UID, unknown kind) sit on
//! pods that are only built in memory and never created, since the garbage collector would
//! delete a stored object whose controller is absent.

use std::collections::BTreeMap;
use std::time::Duration;

use http::Method;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, StatefulSet, StatefulSetSpec};
use k8s_openapi::api::batch::v1::{CronJob, CronJobSpec, Job, JobSpec, JobTemplateSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use warmcache_kube::owner::{MAX_DEPTH, OwnerResolver, Stop, TopLevelOwner};
use warmcache_kube::{ErrorCategory, controller_owner_reference, set_controller_owner};
use warmcache_testkit::{ControlPlane, Fault, FaultInjector, TestNamespace, eventually};

const WAIT: Duration = Duration::from_secs(30);

/// A client whose requests pass through `faults`. The tests arm a 500 on every object GET of
/// the namespace and check afterwards that the budget is untouched: proof at the request level
/// that an answer came from the cache. (Counting requests directly would need a tower layer, and
/// tower is not a dependency of this crate.)
async fn client_through(faults: &FaultInjector, impersonate: Option<&str>) -> Client {
    let mut config = ControlPlane::shared()
        .await
        .unwrap()
        .config()
        .await
        .unwrap();
    config.auth_info.impersonate = impersonate.map(str::to_owned);
    kube::client::ClientBuilder::try_from(config)
        .unwrap()
        .with_layer(&faults.layer())
        .build()
}

/// Arms a 500 on the next object GETs in `ns`; returns the budget to compare with
/// [`FaultInjector::pending`].
fn arm_object_gets(faults: &FaultInjector, ns: &str) -> usize {
    const BUDGET: usize = 1000;
    faults.clear();
    faults.inject(
        Method::GET,
        &format!("/namespaces/{ns}/"),
        Fault::ServerError,
        BUDGET,
    );
    BUDGET
}

fn template(labels: &BTreeMap<String, String>, restart: Option<&str>) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels.clone()),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                image: Some("registry.invalid/none:1".into()),
                ..Container::default()
            }],
            restart_policy: restart.map(str::to_owned),
            ..PodSpec::default()
        }),
    }
}

fn labels(app: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("app".to_owned(), app.to_owned())])
}

/// Waits until `count` pods controlled by `uid` exist, and returns them sorted by name.
async fn pods_controlled_by(pods: &Api<Pod>, uid: &str, count: usize) -> Vec<Pod> {
    eventually(
        &format!("{count} pods controlled by {uid}"),
        WAIT,
        || async {
            let list = pods.list(&Default::default()).await.ok()?;
            let mut mine: Vec<Pod> = list
                .items
                .into_iter()
                .filter(|p| {
                    p.owner_references()
                        .iter()
                        .any(|r| r.controller == Some(true) && r.uid == uid)
                })
                .collect();
            mine.sort_by_key(ResourceExt::name_any);
            (mine.len() == count).then_some(mine)
        },
    )
    .await
    .unwrap()
}

fn kinds(chain: &[TopLevelOwner]) -> Vec<&str> {
    chain.iter().map(|o| o.kind.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolves_deployment_statefulset_and_cronjob_chains_within_the_get_bound() {
    let ns = TestNamespace::new("kube-owner").await.unwrap();
    let pods: Api<Pod> = ns.api();
    let faults = FaultInjector::new();
    let resolver = OwnerResolver::new(client_through(&faults, None).await);

    // Deployment -> ReplicaSet -> 2 pods, all made by the real controllers.
    let deployment = ns
        .api::<Deployment>()
        .create(
            &PostParams::default(),
            &Deployment {
                metadata: ObjectMeta {
                    name: Some("web".into()),
                    ..ObjectMeta::default()
                },
                spec: DeploymentSpec {
                    replicas: Some(2),
                    selector: LabelSelector {
                        match_labels: Some(labels("web")),
                        ..LabelSelector::default()
                    },
                    template: template(&labels("web"), None),
                    ..DeploymentSpec::default()
                },
                ..Deployment::default()
            },
        )
        .await
        .unwrap();
    let rs_uid = eventually("the ReplicaSet of web", WAIT, || async {
        let list = ns.api::<k8s_openapi::api::apps::v1::ReplicaSet>();
        let list = list.list(&Default::default()).await.ok()?;
        list.items.first().map(|rs| rs.uid().unwrap_or_default())
    })
    .await
    .unwrap();
    let web_pods = pods_controlled_by(&pods, &rs_uid, 2).await;

    let first = resolver.resolve(&web_pods[0]).await.unwrap();
    assert_eq!(first.top, TopLevelOwner::of(&deployment));
    assert_eq!(first.top.kind, "Deployment");
    assert_eq!(first.top.namespace.as_deref(), Some(ns.name.as_str()));
    assert_eq!(kinds(&first.chain), ["Pod", "ReplicaSet", "Deployment"]);
    assert!(first.stop.is_none());
    assert!(first.is_definitive());
    assert_eq!(first.gets, 2);
    assert_eq!(resolver.cached_owners(), 2);

    // A sibling pod shares both owners: no GET reaches the server (any would get a 500).
    let budget = arm_object_gets(&faults, &ns.name);
    let second = resolver.resolve(&web_pods[1]).await.unwrap();
    assert_eq!(second.top, first.top);
    assert_eq!(second.gets, 0);
    assert_eq!(faults.pending(), budget, "a GET left the process");
    faults.clear();

    // A pod in another namespace that copies the ReplicaSet's name and uid into its own
    // controller reference does not borrow the cached owner: the lookup goes to the server (in
    // its namespace, where no such ReplicaSet exists) and the walk stops at the pod.
    let rs_name = web_pods[0]
        .metadata
        .owner_references
        .as_ref()
        .and_then(|refs| refs.first())
        .map(|r| r.name.clone())
        .unwrap();
    let intruder = pod_controlled_by(
        "another-namespace",
        "intruder",
        Some(controller("apps/v1", "ReplicaSet", &rs_name, &rs_uid)),
    );
    let r = resolver.resolve(&intruder).await.unwrap();
    assert_eq!(r.top.name, "intruder", "{r:?}");
    assert_eq!(r.top.kind, "Pod");
    assert_eq!(
        r.gets, 1,
        "the cached owner of another namespace was not used"
    );

    // StatefulSet -> pod db-0.
    let sts = ns
        .api::<StatefulSet>()
        .create(
            &PostParams::default(),
            &StatefulSet {
                metadata: ObjectMeta {
                    name: Some("db".into()),
                    ..ObjectMeta::default()
                },
                spec: StatefulSetSpec {
                    replicas: Some(1),
                    selector: LabelSelector {
                        match_labels: Some(labels("db")),
                        ..LabelSelector::default()
                    },
                    template: template(&labels("db"), None),
                    ..StatefulSetSpec::default()
                },
                ..StatefulSet::default()
            },
        )
        .await
        .unwrap();
    let db = pods_controlled_by(&pods, &sts.uid().unwrap(), 1).await;
    let r = resolver.resolve(&db[0]).await.unwrap();
    assert_eq!(r.top, TopLevelOwner::of(&sts));
    assert_eq!(kinds(&r.chain), ["Pod", "StatefulSet"]);
    assert_eq!(r.gets, 1);

    // CronJob (suspended, so it starts nothing) -> Job made by hand -> pod made by the Job
    // controller.
    let cron = ns
        .api::<CronJob>()
        .create(
            &PostParams::default(),
            &CronJob {
                metadata: ObjectMeta {
                    name: Some("nightly".into()),
                    ..ObjectMeta::default()
                },
                spec: CronJobSpec {
                    schedule: "0 0 1 1 *".into(),
                    suspend: Some(true),
                    job_template: JobTemplateSpec {
                        metadata: None,
                        spec: Some(JobSpec {
                            template: template(&labels("nightly"), Some("Never")),
                            ..JobSpec::default()
                        }),
                    },
                    ..CronJobSpec::default()
                },
                ..CronJob::default()
            },
        )
        .await
        .unwrap();
    let mut job = Job {
        metadata: ObjectMeta {
            name: Some("nightly-manual".into()),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            template: template(&labels("nightly"), Some("Never")),
            ..JobSpec::default()
        }),
        ..Job::default()
    };
    set_controller_owner(
        &mut job.metadata,
        controller_owner_reference(&cron).unwrap(),
    )
    .unwrap();
    let job = ns
        .api::<Job>()
        .create(&PostParams::default(), &job)
        .await
        .unwrap();
    let job_pods = pods_controlled_by(&pods, &job.uid().unwrap(), 1).await;
    let r = resolver.resolve(&job_pods[0]).await.unwrap();
    assert_eq!(r.top, TopLevelOwner::of(&cron));
    assert_eq!(kinds(&r.chain), ["Pod", "Job", "CronJob"]);
    assert_eq!(r.gets, 2);

    // The answer serializes as a request reference.
    let json = serde_json::to_value(&r.top).unwrap();
    assert_eq!(json["apiVersion"], "batch/v1");
    assert_eq!(json["kind"], "CronJob");
    assert_eq!(json["namespace"], ns.name.as_str());
    assert_eq!(json["name"], "nightly");
    assert_eq!(json["uid"], cron.uid().unwrap().as_str());
    ns.cleanup().await;
}

/// A pod that is never stored, controlled by `reference`.
fn pod_controlled_by(ns: &str, name: &str, reference: Option<OwnerReference>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            uid: Some(format!("uid-of-{name}")),
            owner_references: reference.map(|r| vec![r]),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    }
}

fn controller(api_version: &str, kind: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

#[tokio::test]
async fn stale_forbidden_and_deep_chains_stop_at_the_last_object_read() {
    let ns = TestNamespace::new("kube-owner-stop").await.unwrap();
    let cms: Api<ConfigMap> = ns.api();
    let faults = FaultInjector::new();
    let resolver = OwnerResolver::new(client_through(&faults, None).await);

    // A stored pod without owner is its own top level; nothing is read.
    let bare = ns
        .api::<Pod>()
        .create(
            &PostParams::default(),
            &Pod {
                metadata: ObjectMeta {
                    name: Some("bare".into()),
                    ..ObjectMeta::default()
                },
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "main".into(),
                        image: Some("registry.invalid/none:1".into()),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
                ..Pod::default()
            },
        )
        .await
        .unwrap();
    let budget = arm_object_gets(&faults, &ns.name);
    let r = resolver.resolve(&bare).await.unwrap();
    assert_eq!(r.top, TopLevelOwner::of(&bare));
    assert!(r.stop.is_none());
    assert_eq!(r.gets, 0);
    assert_eq!(faults.pending(), budget);
    faults.clear();

    // An owner of the right name but another UID: stale, stop at the pod.
    let impostor = cms
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("impostor".into()),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            },
        )
        .await
        .unwrap();
    let stale_uid = "00000000-0000-0000-0000-000000000001";
    let pod = pod_controlled_by(
        &ns.name,
        "p-mismatch",
        Some(controller("v1", "ConfigMap", "impostor", stale_uid)),
    );
    let r = resolver.resolve(&pod).await.unwrap();
    assert_eq!(r.top, TopLevelOwner::of(&pod));
    assert!(
        matches!(&r.stop, Some(Stop::UidMismatch { found_uid, reference }) if Some(found_uid) == impostor.uid().as_ref() && reference.uid == stale_uid),
        "{:?}",
        r.stop
    );
    assert!(r.is_definitive());
    assert_eq!(r.gets, 1);

    // A missing owner: stale, stop at the pod.
    let pod = pod_controlled_by(
        &ns.name,
        "p-ghost",
        Some(controller("apps/v1", "ReplicaSet", "ghost", "u-ghost")),
    );
    let r = resolver.resolve(&pod).await.unwrap();
    assert_eq!(r.top, TopLevelOwner::of(&pod));
    assert!(
        matches!(r.stop, Some(Stop::OwnerNotFound { .. })),
        "{:?}",
        r.stop
    );
    assert!(r.is_definitive());
    assert_eq!(r.gets, 1);

    // A kind the server does not serve: stale, no object GET.
    let pod = pod_controlled_by(
        &ns.name,
        "p-unknown",
        Some(controller("example.invalid/v1", "Widget", "w", "u-w")),
    );
    let budget = arm_object_gets(&faults, &ns.name);
    let r = resolver.resolve(&pod).await.unwrap();
    assert!(
        matches!(r.stop, Some(Stop::UnknownKind { .. })),
        "{:?}",
        r.stop
    );
    assert_eq!(r.gets, 0);
    assert_eq!(
        faults.pending(),
        budget,
        "no object GET for a kind nobody serves"
    );
    faults.clear();

    // A chain longer than the bound: c0 <- c1 <- ... <- c9 (c_i controlled by c_{i+1}).
    let mut above: Option<ConfigMap> = None;
    let mut chain = Vec::new();
    for i in (0..10).rev() {
        let mut cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("c{i}")),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        if let Some(owner) = &above {
            set_controller_owner(&mut cm.metadata, controller_owner_reference(owner).unwrap())
                .unwrap();
        }
        let stored = cms.create(&PostParams::default(), &cm).await.unwrap();
        chain.push(stored.clone());
        above = Some(stored);
    }
    chain.reverse(); // chain[i] is c{i}
    let pod = pod_controlled_by(
        &ns.name,
        "p-deep",
        Some(controller_owner_reference(&chain[0]).unwrap()),
    );
    let r = resolver.resolve(&pod).await.unwrap();
    assert_eq!(r.gets, MAX_DEPTH);
    assert_eq!(r.top, TopLevelOwner::of(&chain[MAX_DEPTH - 1]));
    assert!(
        matches!(&r.stop, Some(Stop::DepthLimit { reference, max_depth: MAX_DEPTH }) if reference.name == format!("c{MAX_DEPTH}")),
        "{:?}",
        r.stop
    );
    assert!(!r.is_definitive());
    // The same chain again comes from the cache.
    let budget = arm_object_gets(&faults, &ns.name);
    let again = resolver.resolve(&pod).await.unwrap();
    assert_eq!(again.top, r.top);
    assert_eq!(again.gets, 0);
    assert_eq!(faults.pending(), budget);
    faults.clear();

    // A 500 on an owner GET is an error for the caller to retry, not an answer.
    let fresh = OwnerResolver::new(client_through(&faults, None).await);
    arm_object_gets(&faults, &ns.name);
    let err = fresh.resolve(&pod).await.unwrap_err();
    assert_eq!(err.category(), ErrorCategory::Transient, "{err}");
    assert_eq!(err.name, "c0");
    faults.clear();

    // RBAC: a user with no grants cannot GET the owner; the walk stops there and says so.
    let unprivileged = OwnerResolver::new(
        client_through(&FaultInjector::new(), Some("warmcache-test-nobody")).await,
    );
    let r = unprivileged.resolve(&pod).await.unwrap();
    assert_eq!(r.top, TopLevelOwner::of(&pod));
    assert!(
        matches!(&r.stop, Some(Stop::Forbidden { reference }) if reference.name == "c0"),
        "{:?}",
        r.stop
    );
    assert!(!r.is_definitive());
    assert_eq!(r.gets, 1);
    ns.cleanup().await;
}
