//! The Pods the operator renders, run on the REAL node (kubelet, containerd, runc) against real
//! host directories:
//!
//! - the member Pod's `local-disk-survey` init container counts a tier's entries (dotfiles
//!   included) and reports them in its termination message, which the survey parser reads;
//! - under the restricted default the kubelet refuses an image that runs as root (the tools
//!   image is busybox as root), and the status derived from that Pod says what to do; with a
//!   `--store-image-user` rule (`=image`, or a uid) the same Pod runs;
//! - the tier cleanup Pod empties a directory, dotfiles and nested directories included, keeps
//!   the directory, never follows a link out of it, and leaves a sibling backend's directory
//!   alone; it exits non-zero (and is retried) when an entry cannot be removed; a node where a
//!   live backend's tier overlaps gets no cleanup Pod at all, and that backend's data stays.
//!
//! Its own test binary: the node's scheduler binds every Pod of the plane it runs on.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use warmcache_api_kvcache::v1alpha1::KVCacheBackend;
use warmcache_kvcache::render::SURVEY_CONTAINER;
use warmcache_kvcache::security::ImageUser;
use warmcache_kvcache::status::pod_problem;
use warmcache_kvcache::survey::parse_survey_message;
use warmcache_kvcache::teardown::{
    CLEANUP_CONTAINER, CleanupAction, CleanupInput, EVENT_TIER_SHARED_PATH, cleanup_pass,
    cleanup_pod, cleanup_target,
};
use warmcache_kvcache::vectors::{self, members, tier0, with};
use warmcache_kvcache::{RenderContext, ValidationContext, from_value, render, validate};
use warmcache_testkit::{RealNode, TOOLS_IMAGE, TestNamespace, eventually, wait_pod_finished};

const WAIT: Duration = Duration::from_secs(90);

/// A directory under the system's temporary directory (visible to the node), every level
/// world-listable so a non-root survey can read it.
fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("warmcache-realnode-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// Fills `tier` with buckets, dotfiles, a nested directory and a link to `outside`.
fn fill(tier: &Path, outside: &Path) {
    std::fs::create_dir_all(tier).unwrap();
    std::fs::set_permissions(tier, std::fs::Permissions::from_mode(0o755)).unwrap();
    for name in ["1-1.bucket", "1-1.meta", ".hidden", "..dots", "with space"] {
        std::fs::write(tier.join(name), b"x").unwrap();
    }
    std::fs::create_dir_all(tier.join(".d/deeper")).unwrap();
    std::fs::write(tier.join(".d/deeper/f"), b"x").unwrap();
    std::os::unix::fs::symlink(outside, tier.join("link-out")).unwrap();
}

/// A stored, admitted backend whose one group runs the tools image (busybox, as root) with a
/// tier at `path`: small buffers so the member requests little, `imagePullPolicy: Never` as
/// the node requires.
fn backend(name: &str, uid: &str, path: &Path, clean: bool) -> KVCacheBackend {
    let value: Value = with(vectors::v2(), |o| {
        o["metadata"]["name"] = json!(name);
        o["spec"]["image"] = json!(TOOLS_IMAGE);
        o["spec"]["imagePullPolicy"] = json!("Never");
        members(o)[0]["nodeSelector"] = json!({});
        members(o)[0]["capacityPerMember"] = json!("16Mi");
        members(o)[0]["localBufferSize"] = json!("16Mi");
        members(o)[0]["extraEnv"] =
            json!([{"name": "MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES", "value": "0"}]);
        tier0(o)["path"] = json!(path.to_str().unwrap());
        tier0(o)["keyLimit"] = json!(null);
        tier0(o)["cleanAfterDelete"] = json!(clean);
    });
    let mut b: KVCacheBackend = from_value(value).unwrap();
    assert_eq!(validate(&b, None, &ValidationContext::default()), vec![]);
    b.metadata.uid = Some(uid.to_owned());
    b
}

/// The member Pod the DaemonSet would create from the rendered template, bound to the node.
fn member_pod(backend: &KVCacheBackend, ctx: &RenderContext, name: &str, node: &str) -> Pod {
    let rendered = render(backend, ctx).unwrap();
    let template = rendered.members[0].spec.template.clone();
    let mut metadata = template.metadata.unwrap_or_default();
    metadata.name = Some(name.to_owned());
    let mut spec = template.spec.unwrap();
    spec.node_name = Some(node.to_owned());
    // The member itself cannot start in the tools image (no mc_store_rest_server); the init
    // container runs first and is what is examined. Do not let the kubelet wait a minute.
    spec.termination_grace_period_seconds = Some(1);
    spec.containers[0].lifecycle = None;
    Pod {
        metadata,
        spec: Some(spec),
        status: None,
    }
}

fn init_status(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerStatus> {
    pod.status
        .as_ref()?
        .init_container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == SURVEY_CONTAINER)
}

/// Waits until the survey init container of `name` has terminated and returns the Pod.
async fn survey_done(pods: &Api<Pod>, name: &str) -> Pod {
    eventually("the survey to terminate", WAIT, || {
        let pods = pods.clone();
        let name = name.to_owned();
        async move {
            let pod = pods.get(&name).await.ok()?;
            init_status(&pod)?
                .state
                .as_ref()?
                .terminated
                .as_ref()
                .map(|_| ())?;
            Some(pod)
        }
    })
    .await
    .unwrap()
}

async fn gone(pods: &Api<Pod>, name: &str) {
    let _ = pods
        .delete(name, &DeleteParams::default().grace_period(0))
        .await;
    eventually("the Pod to go", WAIT, || {
        let pods = pods.clone();
        let name = name.to_owned();
        async move { pods.get_opt(&name).await.ok()?.is_none().then_some(()) }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rendered_survey_counts_a_real_tier_and_a_root_image_needs_the_switch() {
    let node = RealNode::shared().await.unwrap();
    let ns = TestNamespace::new("kvc-survey").await.unwrap();
    let pods: Api<Pod> = ns.api::<Pod>();
    let dir = scratch("survey");
    let outside = dir.join("outside");
    std::fs::create_dir(&outside).unwrap();
    let tier = dir.join("tier");
    fill(&tier, &outside);
    let b = backend("kvc-survey", "uid-survey", &tier, false);

    // Restricted (the default): the kubelet refuses the root image, and the status says how
    // to run it.
    let restricted = RenderContext {
        namespace: ns.name.clone(),
        ..RenderContext::default()
    };
    let pod = member_pod(&b, &restricted, "member-restricted", node.name());
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let refused = eventually("the kubelet's runAsNonRoot refusal", WAIT, || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("member-restricted").await.ok()?;
            let waiting = init_status(&pod)?.state.as_ref()?.waiting.as_ref()?;
            (waiting.reason.as_deref() == Some("CreateContainerConfigError")).then_some(pod)
        }
    })
    .await
    .unwrap();
    let problem = pod_problem(&refused).expect("a stuck Pod");
    assert!(
        problem.contains("runAsNonRoot") && problem.contains("will run as root"),
        "{problem}"
    );
    assert!(
        problem.contains(&format!("--store-image-user '{TOOLS_IMAGE}=<uid>'")),
        "{problem}"
    );
    gone(&pods, "member-restricted").await;

    // `=image`: the Pod runs as the image's user (root, every capability dropped) and the
    // survey counts the tier: 5 files, the .d directory and the link (dotfiles included).
    let as_image = RenderContext {
        image_users: vec![format!("{TOOLS_IMAGE}=image").parse::<ImageUser>().unwrap()],
        ..restricted.clone()
    };
    let pod = member_pod(&b, &as_image, "member-as-image", node.name());
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let done = survey_done(&pods, "member-as-image").await;
    let terminated = init_status(&done)
        .unwrap()
        .state
        .as_ref()
        .unwrap()
        .terminated
        .clone()
        .unwrap();
    assert_eq!(terminated.exit_code, 0);
    let reading = parse_survey_message(terminated.message.as_deref().unwrap_or_default()).unwrap();
    assert_eq!(reading.entries, 7, "{terminated:?}");
    assert!(reading.control > 0);
    gone(&pods, "member-as-image").await;

    // A uid: runAsNonRoot holds, and the survey runs as that uid (the tier is world-listable).
    let as_uid = RenderContext {
        image_users: vec![format!("{TOOLS_IMAGE}=65534").parse::<ImageUser>().unwrap()],
        ..restricted.clone()
    };
    let pod = member_pod(&b, &as_uid, "member-as-uid", node.name());
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let done = survey_done(&pods, "member-as-uid").await;
    let message = init_status(&done)
        .unwrap()
        .state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .unwrap()
        .message
        .clone()
        .unwrap_or_default();
    assert_eq!(parse_survey_message(&message).unwrap().entries, 7);
    gone(&pods, "member-as-uid").await;

    // An empty tier reads 0; nothing in it was touched by the surveys.
    let empty = dir.join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o755)).unwrap();
    let b = backend("kvc-survey", "uid-survey", &empty, false);
    let pod = member_pod(&b, &as_image, "member-empty", node.name());
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let done = survey_done(&pods, "member-empty").await;
    let message = init_status(&done)
        .unwrap()
        .state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .unwrap()
        .message
        .clone()
        .unwrap_or_default();
    assert_eq!(parse_survey_message(&message).unwrap().entries, 0);
    gone(&pods, "member-empty").await;
    assert_eq!(std::fs::read_dir(&tier).unwrap().count(), 7);

    ns.cleanup().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs one cleanup pass of `deleted` against the real node and the given other backends.
async fn pass(
    client: &kube::Client,
    deleted: &KVCacheBackend,
    others: &[&KVCacheBackend],
    namespace: &str,
    pods: &[&Pod],
) -> warmcache_kvcache::teardown::CleanupPlan {
    let node: Node = Api::all(client.clone())
        .get(RealNode::shared().await.unwrap().name())
        .await
        .unwrap();
    let backends: Vec<&KVCacheBackend> = std::iter::once(deleted)
        .chain(others.iter().copied())
        .collect();
    cleanup_pass(&CleanupInput {
        backend: deleted,
        namespace,
        nodes: &[&node],
        backends: &backends,
        pods,
        now: k8s_openapi::jiff::Timestamp::now(),
        image: Ok(TOOLS_IMAGE.to_owned()),
    })
    .unwrap()
}

fn deleting(mut b: KVCacheBackend) -> KVCacheBackend {
    b.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rendered_cleanup_pod_empties_a_real_tier_and_nothing_else() {
    let node = RealNode::shared().await.unwrap();
    let ns = TestNamespace::new("kvc-clean").await.unwrap();
    let pods: Api<Pod> = ns.api::<Pod>();
    let dir = scratch("clean");
    let outside = dir.join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("keep"), b"x").unwrap();
    let tier = dir.join("tier");
    fill(&tier, &outside);
    // A sibling whose name starts the same ("tier" / "tier2") but is another directory.
    let sibling = dir.join("tier2");
    fill(&sibling, &outside);
    // Another backend's tier inside this one.
    let inner = tier.join("inner");
    std::fs::create_dir(&inner).unwrap();
    std::fs::write(inner.join("their-bucket"), b"theirs").unwrap();

    let deleted = deleting(backend("kvc-gone", "uid-gone", &tier, true));
    let neighbour = backend("kvc-sibling", "uid-sibling", &sibling, false);
    let nested = backend("kvc-nested", "uid-nested", &inner, false);

    // While the nested backend lives, the node is skipped: no Pod, a Node warning, and its
    // data stays (as does everything else).
    let plan = pass(&ns.client, &deleted, &[&neighbour, &nested], &ns.name, &[]).await;
    assert!(plan.done);
    assert!(
        !plan
            .actions
            .iter()
            .any(|a| matches!(a, CleanupAction::CreatePod(_))),
        "{:?}",
        plan.actions
    );
    assert!(plan.actions.iter().any(|a| matches!(
        a,
        CleanupAction::NodeEvent { reason, node: n, .. } if *reason == EVENT_TIER_SHARED_PATH && n == node.name()
    )));
    assert_eq!(
        std::fs::read(inner.join("their-bucket")).unwrap(),
        b"theirs"
    );

    // Once it is gone (deleted without cleanup of its own), the pass creates the rendered Pod;
    // it really runs on the node and empties the tier, nested directories and dotfiles
    // included, keeping the directory, the link's target and the sibling.
    let plan = pass(&ns.client, &deleted, &[&neighbour], &ns.name, &[]).await;
    let created: Vec<Pod> = plan
        .actions
        .iter()
        .filter_map(|a| match a {
            CleanupAction::CreatePod(pod) => Some((**pod).clone()),
            _ => None,
        })
        .collect();
    assert_eq!(created.len(), 1, "{:?}", plan.actions);
    let pod = &created[0];
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some(node.name())
    );
    let name = pod.name_any();
    // No owner in this cluster: the backend here is not stored.
    let mut stored = pod.clone();
    stored.metadata.owner_references = None;
    pods.create(&PostParams::default(), &stored).await.unwrap();
    let done = wait_pod_finished(&pods, &name, WAIT).await.unwrap();
    assert_eq!(
        done.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded"),
        "{:?}",
        done.status
    );
    assert!(tier.is_dir(), "the directory itself stays");
    let left: Vec<_> = std::fs::read_dir(&tier).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(outside.join("keep").exists(), "a link is never followed");
    assert_eq!(
        std::fs::read_dir(&sibling).unwrap().count(),
        7,
        "the sibling tier is untouched"
    );
    // The next pass finds the node emptied and is done, deleting the Pod.
    let done_pod = pods.get(&name).await.unwrap();
    let plan = pass(&ns.client, &deleted, &[&neighbour], &ns.name, &[&done_pod]).await;
    assert!(plan.done);
    assert_eq!(
        plan.finished,
        [(
            node.name().to_owned(),
            warmcache_kvcache::teardown::NodeOutcome::Emptied
        )]
    );
    gone(&pods, &name).await;

    // An entry the Pod cannot remove: a sticky directory owned by another uid, holding that
    // uid's file. Root with only DAC_OVERRIDE (no FOWNER) may not unlink it, so the script
    // exits non-zero and the kubelet retries it in place.
    let sticky = tier.join("sticky");
    std::fs::create_dir(&sticky).unwrap();
    std::fs::write(sticky.join("theirs"), b"x").unwrap();
    std::os::unix::fs::chown(sticky.join("theirs"), Some(4321), Some(4321)).unwrap();
    std::os::unix::fs::chown(&sticky, Some(4321), Some(4321)).unwrap();
    std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::write(tier.join(".also-here"), b"x").unwrap();
    let deleted = deleting(backend("kvc-stuck", "uid-stuck", &tier, true));
    let target = cleanup_target(&deleted).unwrap();
    let mut pod = cleanup_pod(&deleted, &target, node.name(), TOOLS_IMAGE, &ns.name).unwrap();
    pod.metadata.owner_references = None;
    let name = pod.name_any();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let failed = eventually("the cleanup to fail", WAIT, || {
        let pods = pods.clone();
        let name = name.clone();
        async move {
            let pod = pods.get(&name).await.ok()?;
            let status = pod
                .status
                .as_ref()?
                .container_statuses
                .as_ref()?
                .iter()
                .find(|c| c.name == CLEANUP_CONTAINER)?
                .clone();
            let terminated = status
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.clone())
                .or_else(|| status.state.as_ref().and_then(|s| s.terminated.clone()))?;
            Some((terminated, pod))
        }
    })
    .await
    .unwrap();
    let (terminated, pod) = failed;
    assert_ne!(terminated.exit_code, 0, "{terminated:?}");
    assert_ne!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded")
    );
    assert!(
        terminated
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("Operation not permitted"),
        "{terminated:?}"
    );
    // What it could remove is gone; the stuck entry and the directory stay.
    assert!(!tier.join(".also-here").exists());
    assert!(sticky.join("theirs").exists());
    gone(&pods, &name).await;

    ns.cleanup().await;
    std::fs::remove_dir_all(&dir).unwrap();
}
