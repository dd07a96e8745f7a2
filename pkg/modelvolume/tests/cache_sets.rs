//! Compile-cache sets at admission: the set's binding beside the model's, the variables and the
//! scratch directory, the capture, seed and local roles, and every case where a pod keeps its
//! compile caches as they were.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::jiff::Timestamp;
use warmcache_api_modelcache::v2beta1::{BindingPhase, ModelCacheBinding, PopulationState};
use warmcache_api_modelcache::{identity_hash, reader_pvc_name, sha256_digest};
use warmcache_modelvolume::cacheset::{COMPILE_CACHE_VARIABLES, is_cache_set_handle};
use warmcache_modelvolume::keys::{
    CACHE_BINDING_ANNOTATION, CACHE_BINDING_UID_ANNOTATION, CACHE_CAPTURE_LABEL,
    CACHE_HANDLE_ANNOTATION, CACHE_KEY_LABEL, CACHE_ORDINAL_ANNOTATION, MODEL_LABEL, SCRATCH_PATH,
    SCRATCH_VOLUME, SEED_CONTAINER, SEED_MOUNT_PATH, SEED_VOLUME,
};
use warmcache_modelvolume::{
    BindingAction, Options, Request, Rewrite, Verdict, complete_cache_set,
};

const VLLM: &str = r#"
metadata:
  name: vllm-7d9f-abcde
  namespace: team-a
  labels: {app: vllm}
spec:
  securityContext: {runAsUser: 1000}
  containers:
  - name: vllm
    image: vllm/vllm-openai:v0.9.0
    command: [vllm, serve, Qwen/Qwen3-8B, --port, "8000"]
    env:
    - {name: HF_HOME, value: /data/hf}
    - {name: HF_TOKEN, valueFrom: {secretKeyRef: {name: hf, key: token}}}
    volumeMounts:
    - {name: data, mountPath: /data}
    resources: {limits: {nvidia.com/gpu: "1"}}
  volumes:
  - {name: data, emptyDir: {}}
"#;

fn pod(yaml: &str) -> Pod {
    serde_saphyr::from_str(yaml).unwrap()
}

fn on() -> Options {
    Options {
        compile_cache_sets: true,
        ..Options::default()
    }
}

/// Admits `p` on `storage`, the lookup answering `model` for the model's binding and `set` for
/// the set's (by name).
fn admit_with(
    p: &Pod,
    options: &Options,
    storage: &str,
    model: Option<&ModelCacheBinding>,
    set: Option<&ModelCacheBinding>,
) -> Verdict {
    let stored: Vec<&ModelCacheBinding> = model.into_iter().chain(set).collect();
    common::run_named(p, &BTreeMap::new(), options, storage, &stored)
}

fn rewrite(v: Verdict) -> Box<Rewrite> {
    match v {
        Verdict::Rewrite(r) => r,
        other => panic!("expected a rewrite, got {other:?}"),
    }
}

fn created(action: Option<&BindingAction>) -> &ModelCacheBinding {
    match action {
        Some(BindingAction::Create(b)) => b,
        other => panic!("expected a create, got {other:?}"),
    }
}

fn main_of(p: &Pod) -> &Container {
    &p.spec.as_ref().unwrap().containers[0]
}

fn env(c: &Container, name: &str) -> Option<String> {
    c.env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

fn label<'p>(p: &'p Pod, key: &str) -> Option<&'p str> {
    p.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

fn annotation<'p>(p: &'p Pod, key: &str) -> Option<&'p str> {
    p.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn has_set_metadata(p: &Pod) -> bool {
    label(p, CACHE_KEY_LABEL).is_some()
        || label(p, CACHE_CAPTURE_LABEL).is_some()
        || annotation(p, CACHE_BINDING_ANNOTATION).is_some()
        || annotation(p, CACHE_HANDLE_ANNOTATION).is_some()
}

fn init_names(p: &Pod) -> Vec<String> {
    p.spec
        .as_ref()
        .unwrap()
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.name.clone())
        .collect()
}

/// A stored set binding: the one the first admission creates, with a UID, Ready with a view in
/// `view_ns` (or not complete).
fn stored_set(first: &Rewrite, complete: bool, view_ns: Option<&str>) -> ModelCacheBinding {
    let wanted = created(first.cache_set.as_ref());
    let mut b = common::stored(wanted, Some(BindingPhase::Active), view_ns);
    b.metadata.uid = Some("7a3e0c1d-2222-4b5c-9d6e-000000000002".into());
    if !complete && let Some(r) = b.status.as_mut().and_then(|s| s.realized.as_mut()) {
        r.population_state = Some(PopulationState::Pending);
    }
    b
}

#[test]
fn off_by_default_nothing_of_a_set_is_written() {
    let p = pod(VLLM);
    let r = rewrite(admit_with(&p, &Options::default(), "weka", None, None));
    assert!(r.plan.cache_set().is_none());
    assert!(r.cache_set.is_none());
    assert!(!has_set_metadata(&r.pod));
    for (name, _) in COMPILE_CACHE_VARIABLES {
        assert_eq!(env(main_of(&r.pod), name), None, "{name}");
    }
}

#[test]
fn the_first_pod_creates_the_set_binding_and_is_a_capture_source() {
    let p = pod(VLLM);
    let r = rewrite(admit_with(&p, &on(), "weka", None, None));
    let set = r.plan.cache_set().expect("a set");
    assert!(is_cache_set_handle(set.handle()), "{}", set.handle());
    assert!(set.handle().ends_with("?rank=0"));
    // The set's binding: its own identity, in the model's sharing domain and control namespace.
    let model = created(Some(&r.binding));
    let wanted = created(r.cache_set.as_ref());
    assert_ne!(wanted.metadata.name, model.metadata.name);
    assert_eq!(wanted.metadata.namespace, model.metadata.namespace);
    assert_eq!(
        wanted.spec.identity.cache_handle_digest,
        sha256_digest(set.handle())
    );
    assert_eq!(wanted.spec.identity.workflow, model.spec.identity.workflow);
    assert_eq!(
        wanted.spec.identity.sharing_domain_digest,
        model.spec.identity.sharing_domain_digest
    );
    assert_eq!(wanted.spec.decision, model.spec.decision);
    // The pod: the variables into the scratch directory, the set's label and annotations.
    let main = main_of(&r.pod);
    for (name, sub) in COMPILE_CACHE_VARIABLES {
        assert_eq!(
            env(main, name),
            Some(format!("{SCRATCH_PATH}/{sub}")),
            "{name}"
        );
    }
    assert!(
        main.volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == SCRATCH_VOLUME && m.mount_path == SCRATCH_PATH)
    );
    let volumes = r.pod.spec.as_ref().unwrap().volumes.clone().unwrap();
    assert_eq!(
        volumes
            .iter()
            .filter(|v| v.name == SCRATCH_VOLUME && v.empty_dir.is_some())
            .count(),
        1
    );
    assert_eq!(
        label(&r.pod, CACHE_KEY_LABEL),
        Some(identity_hash(&wanted.spec.identity).as_str())
    );
    assert!(label(&r.pod, MODEL_LABEL).is_some());
    assert_eq!(label(&r.pod, CACHE_CAPTURE_LABEL), Some("true"));
    assert_eq!(
        annotation(&r.pod, CACHE_BINDING_ANNOTATION),
        wanted.metadata.name.as_deref()
    );
    assert_eq!(
        annotation(&r.pod, CACHE_HANDLE_ANNOTATION),
        Some(set.handle())
    );
    assert_eq!(annotation(&r.pod, CACHE_ORDINAL_ANNOTATION), Some("0"));
    assert_eq!(annotation(&r.pod, CACHE_BINDING_UID_ANNOTATION), None);
    assert!(!init_names(&r.pod).contains(&SEED_CONTAINER.to_owned()));
    // Once stored, its UID is recorded; a binding that could not be created takes the pod out.
    let stored = common::stored(wanted, None, None);
    let done = complete_cache_set(r.cache_set.as_ref(), r.pod.clone(), Some(&stored));
    assert_eq!(
        annotation(&done, CACHE_BINDING_UID_ANNOTATION),
        stored.metadata.uid.as_deref()
    );
    let failed = complete_cache_set(r.cache_set.as_ref(), r.pod.clone(), None);
    assert!(!has_set_metadata(&failed));
    // The env stays: the caches are local, in the scratch directory.
    assert!(env(main_of(&failed), "TRITON_CACHE_DIR").is_some());
    // A winner of another identity (the storage decided otherwise meanwhile) is not adopted.
    let mut other = stored.clone();
    other.spec.decision.provider = "someone-else".into();
    let refused = complete_cache_set(r.cache_set.as_ref(), r.pod.clone(), Some(&other));
    assert!(!has_set_metadata(&refused));
}

#[test]
fn pods_of_one_template_share_a_set_and_another_configuration_does_not() {
    let a = rewrite(admit_with(&pod(VLLM), &on(), "weka", None, None));
    let twin = pod(&VLLM.replace("vllm-7d9f-abcde", "vllm-7d9f-fghij"));
    let b = rewrite(admit_with(&twin, &on(), "weka", None, None));
    assert_eq!(
        a.plan.cache_set().unwrap().binding_name(),
        b.plan.cache_set().unwrap().binding_name()
    );
    let other = pod(&VLLM.replace("\"8000\"]", "\"8000\", --max-model-len, \"8192\"]"));
    let c = rewrite(admit_with(&other, &on(), "weka", None, None));
    assert_eq!(
        a.plan.binding_name(),
        c.plan.binding_name(),
        "one model copy"
    );
    assert_ne!(
        a.plan.cache_set().unwrap().binding_name(),
        c.plan.cache_set().unwrap().binding_name(),
        "another configuration, another set"
    );
    let salted = pod(&VLLM.replace(
        "labels: {app: vllm}",
        "labels: {app: vllm}\n  annotations: {nvsnap.io/cache-salt: wheel-2}",
    ));
    let d = rewrite(admit_with(&salted, &on(), "weka", None, None));
    assert_ne!(
        a.plan.cache_set().unwrap().binding_name(),
        d.plan.cache_set().unwrap().binding_name(),
        "the salt folds into the set"
    );
}

#[test]
fn a_set_not_complete_is_joined_and_its_pods_are_capture_sources() {
    let first = rewrite(admit_with(&pod(VLLM), &on(), "weka", None, None));
    let set = stored_set(&first, false, None);
    let r = rewrite(admit_with(&pod(VLLM), &on(), "weka", None, Some(&set)));
    assert!(
        matches!(&r.cache_set, Some(BindingAction::Join { name, .. }) if Some(name.as_str()) == set.metadata.name.as_deref())
    );
    assert_eq!(label(&r.pod, CACHE_CAPTURE_LABEL), Some("true"));
    assert_eq!(
        annotation(&r.pod, CACHE_BINDING_UID_ANNOTATION),
        set.metadata.uid.as_deref()
    );
}

#[test]
fn a_complete_set_seeds_pods_of_namespaces_that_have_its_view() {
    let first = rewrite(admit_with(&pod(VLLM), &on(), "weka", None, None));
    let set = stored_set(&first, true, Some(common::NAMESPACE));
    let r = rewrite(admit_with(&pod(VLLM), &on(), "weka", None, Some(&set)));
    assert_eq!(label(&r.pod, CACHE_CAPTURE_LABEL), None);
    assert!(label(&r.pod, CACHE_KEY_LABEL).is_some());
    let spec = r.pod.spec.as_ref().unwrap();
    let seed = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == SEED_VOLUME)
        .expect("the seed volume");
    let claim = seed.persistent_volume_claim.as_ref().unwrap();
    assert_eq!(claim.claim_name, reader_pvc_name(&set.spec.identity));
    assert_eq!(claim.read_only, Some(true));
    let inits = spec.init_containers.as_ref().unwrap();
    let c = inits.last().unwrap();
    assert_eq!(
        c.name, SEED_CONTAINER,
        "the seed runs last, right before the engine"
    );
    assert_eq!(c.image.as_deref(), Some("vllm/vllm-openai:v0.9.0"));
    let mounts: Vec<(&str, &str, bool)> = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| {
            (
                m.name.as_str(),
                m.mount_path.as_str(),
                m.read_only.unwrap_or(false),
            )
        })
        .collect();
    assert_eq!(
        mounts,
        [
            (SEED_VOLUME, SEED_MOUNT_PATH, true),
            (SCRATCH_VOLUME, SCRATCH_PATH, false)
        ]
    );
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.run_as_user, Some(1000), "the pod's own user");
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert!(c.resources.as_ref().unwrap().limits.is_some());
    // The engine itself never mounts the set: it reads its own scratch copy.
    assert!(
        main_of(&r.pod)
            .volume_mounts
            .iter()
            .flatten()
            .all(|m| m.name != SEED_VOLUME)
    );
}

#[test]
fn a_complete_set_without_a_view_here_leaves_the_pod_compiling_on_its_own() {
    let first = rewrite(admit_with(&pod(VLLM), &on(), "weka", None, None));
    let set = stored_set(&first, true, Some("another-namespace"));
    let r = rewrite(admit_with(&pod(VLLM), &on(), "weka", None, Some(&set)));
    assert!(matches!(r.cache_set, Some(BindingAction::Join { .. })));
    assert!(
        label(&r.pod, CACHE_KEY_LABEL).is_some(),
        "still a reference"
    );
    assert_eq!(label(&r.pod, CACHE_CAPTURE_LABEL), None);
    assert!(!init_names(&r.pod).contains(&SEED_CONTAINER.to_owned()));
    assert!(
        r.pod
            .spec
            .as_ref()
            .unwrap()
            .volumes
            .iter()
            .flatten()
            .all(|v| v.name != SEED_VOLUME)
    );
}

#[test]
fn a_set_that_may_not_be_joined_leaves_the_pod_without_a_set() {
    let first = rewrite(admit_with(&pod(VLLM), &on(), "weka", None, None));
    let base = stored_set(&first, false, None);
    let mut deleting = base.clone();
    deleting.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
    );
    let mut retiring = base.clone();
    retiring.status.as_mut().unwrap().phase = Some(BindingPhase::Retiring);
    let mut foreign = base.clone();
    foreign.spec.identity.cache_handle_digest = sha256_digest("cache://someone-else");
    for (what, b) in [
        ("deleting", deleting),
        ("retiring", retiring),
        ("foreign", foreign),
    ] {
        let r = rewrite(admit_with(&pod(VLLM), &on(), "weka", None, Some(&b)));
        assert!(r.cache_set.is_none(), "{what}");
        assert!(!has_set_metadata(&r.pod), "{what}");
        // The model rewrite is untouched.
        assert!(label(&r.pod, MODEL_LABEL).is_some(), "{what}");
    }
}

#[test]
fn hostpath_readers_of_block_storage_get_no_set() {
    let options = Options {
        compile_cache_sets: true,
        reader_mode: warmcache_modelvolume::ReaderMode::HostPath,
        ..Options::default()
    };
    let r = rewrite(admit_with(&pod(VLLM), &options, "nvmesh", None, None));
    assert!(r.cache_set.is_none());
    assert!(!has_set_metadata(&r.pod));
    // View claims on block storage: a set.
    let r = rewrite(admit_with(&pod(VLLM), &on(), "nvmesh", None, None));
    assert!(r.cache_set.is_some());
}

#[test]
fn what_the_engine_sets_itself_is_kept_and_a_taken_scratch_path_means_no_set() {
    let own = pod(&VLLM.replace(
        "- {name: HF_HOME, value: /data/hf}",
        "- {name: HF_HOME, value: /data/hf}\n    - {name: TRITON_CACHE_DIR, value: /data/triton}",
    ));
    let r = rewrite(admit_with(&own, &on(), "weka", None, None));
    assert_eq!(
        env(main_of(&r.pod), "TRITON_CACHE_DIR").as_deref(),
        Some("/data/triton")
    );
    assert!(env(main_of(&r.pod), "TORCHINDUCTOR_CACHE_DIR").is_some());
    let taken = pod(&VLLM.replace(
        "    - {name: data, mountPath: /data}",
        "    - {name: data, mountPath: /data}\n    - {name: data, mountPath: /opt/nvsnap/cache/torchinductor}",
    ));
    let r = rewrite(admit_with(&taken, &on(), "weka", None, None));
    assert!(r.plan.cache_set().is_none());
    assert!(!has_set_metadata(&r.pod));
    assert!(
        label(&r.pod, MODEL_LABEL).is_some(),
        "the model is still shared"
    );
}

#[test]
fn lws_workers_get_their_rank_and_a_malformed_index_gets_no_set() {
    let worker = |index: &str| {
        pod(&VLLM.replace(
            "labels: {app: vllm}",
            &format!("labels: {{app: vllm, leaderworkerset.sigs.k8s.io/worker-index: '{index}'}}"),
        ))
    };
    let plan_of = |p: &Pod| {
        let labels = BTreeMap::new();
        let options = on();
        let req = Request {
            pod: p,
            namespace: common::NAMESPACE,
            namespace_labels: &labels,
            leader_worker_set: None,
            traceparent: None,
            options: &options,
        };
        warmcache_modelvolume::plan(&req).map(|p| p.cache_set().map(|s| s.handle().to_owned()))
    };
    let rank3 = plan_of(&worker("3")).unwrap().expect("a set");
    assert!(rank3.ends_with("?rank=3"), "{rank3}");
    let rank0 = plan_of(&worker("0")).unwrap().expect("a set");
    assert!(rank0.ends_with("?rank=0"), "{rank0}");
    assert_ne!(rank0, rank3);
    assert_eq!(plan_of(&worker("01")).unwrap(), None, "a malformed index");
}
