//! Admission end to end on the pure functions: every flow and reader mode, joining and creating
//! bindings (and the AlreadyExists comparison), every skip reason, the hardening of added
//! containers, secrets, trace context and the names that separate caches.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;
use warmcache_api_modelcache::selection::{Mode, Selection, SelectionTransition};
use warmcache_api_modelcache::v2beta1::{
    BindingPhase, ModelCacheBinding, PopulationState, RealizedStorage, Transition, Workflow,
};
use warmcache_api_modelcache::{FINALIZER, SHARING_DOMAIN_LABEL, STORAGE_SELECTION_ANNOTATION};
use warmcache_catalog::{CatalogInput, Gates};
use warmcache_modelid::{LWS_NAME_LABEL, LWS_WORKER_INDEX_LABEL, LeaderWorkerSet};
use warmcache_modelvolume::keys::{
    BINDING_ANNOTATION, BINDING_UID_ANNOTATION, CAPTURE_LABEL, CAPTURE_PATH_ANNOTATION,
    CAPTURE_VOLUME_ANNOTATION, DOWNLOAD_STEP_ANNOTATION, HANDLE_ANNOTATION, MANAGED_BY_LABEL,
    MODEL_LABEL, MODEL_VOLUME, OPT_OUT, PENDING_LABEL, ROLE_LABEL, SKIP_MESSAGE_ANNOTATION,
    SKIP_REASON_ANNOTATION, TRACE_PARENT_ANNOTATION, WAIT_CONTAINER,
};
use warmcache_modelvolume::{
    BindingAction, Options, ReaderMode, Request, Rewrite, Skip, SkipReason, StorageInputs, Verdict,
    accept_winner, admit, plan,
};

const TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn pod(yaml: &str) -> Pod {
    serde_saphyr::from_str(yaml).unwrap()
}

/// vLLM downloading by itself into HF_HOME on an emptyDir.
fn engine_pod() -> Pod {
    pod(r#"
apiVersion: v1
kind: Pod
metadata: {name: qwen, labels: {app: qwen}}
spec:
  containers:
    - name: vllm
      image: vllm/vllm-openai:v0.20.0
      args: [--model, Qwen/Qwen3-8B]
      env:
        - {name: HF_HOME, value: /models/hf}
        - name: HF_TOKEN
          valueFrom: {secretKeyRef: {name: hf, key: token}}
      resources:
        limits: {nvidia.com/gpu: "1"}
      volumeMounts:
        - {name: m, mountPath: /models}
  volumes:
    - {name: m, emptyDir: {}}
"#)
}

/// An init container downloading with `hf download --local-dir`.
fn init_pod() -> Pod {
    pod(r#"
apiVersion: v1
kind: Pod
metadata: {name: llama}
spec:
  initContainers:
    - name: fetch
      image: python:3.12
      command: [hf, download, meta-llama/Llama-3.1-8B-Instruct, --local-dir, /models/llama]
      volumeMounts:
        - {name: m, mountPath: /models}
  containers:
    - name: vllm
      image: vllm/vllm-openai:v0.20.0
      args: [--model, /models/llama]
      resources:
        limits: {nvidia.com/gpu: "1"}
      volumeMounts:
        - {name: m, mountPath: /models}
  volumes:
    - {name: m, emptyDir: {}}
"#)
}

struct Ctx {
    labels: BTreeMap<String, String>,
    namespace: String,
    options: Options,
    storage: String,
    gates: Gates,
    config_map: Option<ConfigMap>,
    lws: Option<LeaderWorkerSet>,
    traceparent: Option<String>,
}

impl Default for Ctx {
    fn default() -> Self {
        Ctx {
            labels: BTreeMap::new(),
            namespace: common::NAMESPACE.into(),
            options: common::options(None),
            storage: "weka".into(),
            gates: common::gates(),
            config_map: None,
            lws: None,
            traceparent: Some(TRACE.into()),
        }
    }
}

impl Ctx {
    fn admit(&self, p: &Pod, binding: Option<&ModelCacheBinding>) -> Verdict {
        let sc = common::storage_class_for(&self.storage);
        let req = Request {
            pod: p,
            namespace: &self.namespace,
            namespace_labels: &self.labels,
            leader_worker_set: self.lws.as_ref(),
            traceparent: self.traceparent.as_deref(),
            options: &self.options,
        };
        let storage = StorageInputs {
            storage_class: sc.as_ref(),
            csi_driver: None,
            catalog: match &self.config_map {
                Some(cm) => CatalogInput::ConfigMap(cm),
                None => CatalogInput::Absent,
            },
            gates: self.gates,
        };
        admit(&req, |_, _| binding, &storage)
    }

    fn rewrite(&self, p: &Pod, binding: Option<&ModelCacheBinding>) -> Rewrite {
        match self.admit(p, binding) {
            Verdict::Rewrite(r) => *r,
            other => panic!("expected a rewrite, got {other:?}"),
        }
    }

    fn skip(&self, p: &Pod, binding: Option<&ModelCacheBinding>) -> Skip {
        match self.admit(p, binding) {
            Verdict::Skip(s) => s,
            other => panic!("expected a skip, got {:?}", common::summary(&other)),
        }
    }

    fn helm(domain: &str) -> Ctx {
        Ctx {
            labels: BTreeMap::from([(SHARING_DOMAIN_LABEL.to_owned(), domain.to_owned())]),
            ..Ctx::default()
        }
    }
}

fn created(r: &Rewrite) -> ModelCacheBinding {
    match &r.binding {
        BindingAction::Create(b) => (**b).clone(),
        BindingAction::Join { .. } => panic!("expected a binding to create"),
    }
}

fn json(p: &Pod) -> Value {
    serde_json::to_value(p).unwrap()
}

fn model_volume(p: &Pod) -> Value {
    json(p)["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == MODEL_VOLUME)
        .cloned()
        .unwrap()
}

fn wait(p: &Pod) -> Container {
    p.spec
        .as_ref()
        .unwrap()
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == WAIT_CONTAINER)
        .cloned()
        .unwrap()
}

fn model_mounts(p: &Pod) -> Vec<Value> {
    let v = json(p);
    let mut out = Vec::new();
    for list in ["initContainers", "containers"] {
        for c in v["spec"][list].as_array().into_iter().flatten() {
            for m in c["volumeMounts"].as_array().into_iter().flatten() {
                if m["name"] == MODEL_VOLUME {
                    out.push(m.clone());
                }
            }
        }
    }
    out
}

// ------------------------------------------------------------------------------------------
// Flows and reader modes
// ------------------------------------------------------------------------------------------

#[test]
fn rwx_readers_mount_the_view_claim_read_only_on_the_pod_side() {
    let ctx = Ctx::default();
    for p in [engine_pod(), init_pod()] {
        let r = ctx.rewrite(&p, None);
        assert_eq!(r.transition, Transition::RwxReadOnly);
        assert_eq!(r.reader_mode, ReaderMode::Pvc);
        let v = model_volume(&r.pod);
        assert_eq!(v["persistentVolumeClaim"]["readOnly"], true, "{v}");
        let claim = v["persistentVolumeClaim"]["claimName"].as_str().unwrap();
        assert_eq!(
            claim,
            warmcache_api_modelcache::reader_pvc_name(&created(&r).spec.identity)
        );
        let mounts = model_mounts(&r.pod);
        assert!(mounts.len() >= 2);
        for m in &mounts {
            assert_eq!(m["readOnly"], true, "{m}");
            assert!(m.get("mountPropagation").is_none());
        }
    }
}

#[test]
fn rox_readers_use_pvc_or_host_path() {
    let pvc = Ctx {
        storage: "nvmesh".into(),
        ..Ctx::default()
    };
    let r = pvc.rewrite(&init_pod(), None);
    assert_eq!(r.transition, Transition::RoxReadOnly);
    assert_eq!(r.reader_mode, ReaderMode::Pvc);
    assert!(model_volume(&r.pod)["persistentVolumeClaim"].is_object());

    let host = Ctx {
        storage: "nvmesh".into(),
        options: common::options(Some("hostPath")),
        ..Ctx::default()
    };
    let r = host.rewrite(&init_pod(), None);
    assert_eq!(r.reader_mode, ReaderMode::HostPath);
    let v = model_volume(&r.pod);
    let hash = created(&r).metadata.name.unwrap()["model-cache-".len()..].to_owned();
    assert_eq!(
        v["hostPath"]["path"],
        format!("/var/lib/containerd/nvsnap-models/{hash}")
    );
    assert_eq!(v["hostPath"]["type"], "DirectoryOrCreate");
    assert_eq!(
        r.pod.metadata.labels.as_ref().unwrap()[PENDING_LABEL],
        "true"
    );
    for m in model_mounts(&r.pod) {
        assert_eq!(m["mountPropagation"], "HostToContainer", "{m}");
    }
    // The main container reads; the wait container keeps the pod's own download in place.
    let main = &r.pod.spec.as_ref().unwrap().containers[0];
    let main_mount = main
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == MODEL_VOLUME)
        .unwrap();
    assert_eq!(main_mount.read_only, Some(true));
    let w = wait(&r.pod);
    let args = w.args.unwrap();
    assert_eq!(args[6], "1", "fallback on: {args:?}");
    assert_eq!(
        &args[7..],
        &[
            "hf",
            "download",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--local-dir",
            "/models/llama"
        ]
    );
    assert_eq!(args[1], "/models/llama");
    let wm = w
        .volume_mounts
        .unwrap()
        .into_iter()
        .find(|m| m.name == MODEL_VOLUME)
        .unwrap();
    assert_eq!(wm.mount_path, "/models/llama");
    assert_eq!(wm.read_only, Some(false));
    assert_eq!(
        w.security_context.unwrap().read_only_root_filesystem,
        Some(false)
    );
    // An engine download falls back to the derived `hf download`.
    let r = host.rewrite(&engine_pod(), None);
    let args = wait(&r.pod).args.unwrap();
    assert_eq!(args[6], "1");
    assert_eq!(args[7], "/bin/sh");
    assert_eq!(&args[10..], &["nvsnap-download", "Qwen/Qwen3-8B", ""]);
}

#[test]
fn host_path_mode_applies_to_block_storage_only() {
    let ctx = Ctx {
        options: common::options(Some("hostPath")),
        ..Ctx::default()
    };
    let r = ctx.rewrite(&init_pod(), None);
    assert_eq!(r.transition, Transition::RwxReadOnly);
    assert_eq!(r.reader_mode, ReaderMode::Pvc);
    assert!(model_volume(&r.pod)["persistentVolumeClaim"].is_object());
}

#[test]
fn pod_security_that_forbids_host_paths_gets_view_claims() {
    for level in ["baseline", "restricted"] {
        let ctx = Ctx {
            storage: "nvmesh".into(),
            options: common::options(Some("hostPath")),
            labels: BTreeMap::from([(
                warmcache_modelvolume::POD_SECURITY_ENFORCE_LABEL.to_owned(),
                level.to_owned(),
            )]),
            ..Ctx::default()
        };
        let r = ctx.rewrite(&init_pod(), None);
        assert_eq!(r.reader_mode, ReaderMode::Pvc, "{level}");
        assert!(model_volume(&r.pod)["persistentVolumeClaim"].is_object());
    }
    let privileged = Ctx {
        storage: "nvmesh".into(),
        options: common::options(Some("hostPath")),
        labels: BTreeMap::from([(
            warmcache_modelvolume::POD_SECURITY_ENFORCE_LABEL.to_owned(),
            "privileged".to_owned(),
        )]),
        ..Ctx::default()
    };
    assert_eq!(
        privileged.rewrite(&init_pod(), None).reader_mode,
        ReaderMode::HostPath
    );
}

#[test]
fn helm_domains_on_both_shapes_and_none_on_non_nvmesh_rox() {
    let weka = Ctx::helm("research");
    assert_eq!(
        weka.rewrite(&engine_pod(), None).transition,
        Transition::RwxReadOnly
    );
    let nvmesh = Ctx {
        storage: "nvmesh".into(),
        ..Ctx::helm("research")
    };
    assert_eq!(
        nvmesh.rewrite(&engine_pod(), None).transition,
        Transition::RoxReadOnly
    );
    let lustre = Ctx {
        storage: "lustre".into(),
        ..Ctx::helm("research")
    };
    let s = lustre.skip(&engine_pod(), None);
    assert_eq!(s.reason, SkipReason::NoDurableStorage);
    assert!(s.message.starts_with("NoQualifiedFlow: "), "{}", s.message);
}

#[test]
fn the_download_init_becomes_the_wait_and_engines_get_one_first() {
    let ctx = Ctx::default();
    let r = ctx.rewrite(&init_pod(), None);
    let inits: Vec<String> = r
        .pod
        .spec
        .as_ref()
        .unwrap()
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.name.clone())
        .collect();
    assert_eq!(inits, vec![WAIT_CONTAINER]);
    let w = wait(&r.pod);
    assert_eq!(w.image.as_deref(), Some("python:3.12"));
    assert_eq!(
        w.command.as_ref().unwrap()[..2],
        ["/bin/sh".to_owned(), "-c".to_owned()]
    );
    let args = w.args.unwrap();
    assert_eq!(args[1], "/nvsnap-model");
    assert_eq!(args[2], "3600");
    assert_eq!(args[6], "0", "no fallback for a read-only view");
    assert_eq!(args.len(), 7);
    assert!(w.command.unwrap()[2].contains("a read-only copy has nowhere to download to"));

    let mut p = engine_pod();
    p.spec.as_mut().unwrap().init_containers = Some(vec![Container {
        name: "prepare".into(),
        image: Some("busybox".into()),
        ..Container::default()
    }]);
    let r = ctx.rewrite(&p, None);
    let inits: Vec<String> = r
        .pod
        .spec
        .as_ref()
        .unwrap()
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.name.clone())
        .collect();
    assert_eq!(inits, vec![WAIT_CONTAINER.to_owned(), "prepare".to_owned()]);
    assert_eq!(
        wait(&r.pod).image.as_deref(),
        Some("vllm/vllm-openai:v0.20.0")
    );

    let configured = Ctx {
        options: Options {
            wait_image: Some("registry.example/warmcache/wait:1".into()),
            ..common::options(None)
        },
        ..Ctx::default()
    };
    let r = configured.rewrite(&engine_pod(), None);
    assert_eq!(
        wait(&r.pod).image.as_deref(),
        Some("registry.example/warmcache/wait:1")
    );
}

#[test]
fn labels_and_annotations_name_the_cache() {
    let ctx = Ctx::default();
    let r = ctx.rewrite(&engine_pod(), None);
    let b = created(&r);
    let name = b.metadata.name.clone().unwrap();
    let labels = r.pod.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[MODEL_LABEL], name["model-cache-".len()..]);
    assert_eq!(labels[ROLE_LABEL], "reader");
    assert_eq!(labels["app"], "qwen");
    let a = r.pod.metadata.annotations.as_ref().unwrap();
    assert_eq!(a[BINDING_ANNOTATION], name);
    assert!(
        !a.contains_key(BINDING_UID_ANNOTATION),
        "the UID is known after creation"
    );
    assert_eq!(a["nvsnap.io/model-uri"], "hf://Qwen/Qwen3-8B");
    assert_eq!(
        a["nvca.nvcf.nvidia.io/model-cache-handle"],
        "hf://Qwen/Qwen3-8B?layout=hub"
    );
    assert_eq!(a["nvsnap.io/model-landing"], "/models/hf");
    assert_eq!(a[TRACE_PARENT_ANNOTATION], TRACE);
    assert_eq!(
        b.metadata.annotations.as_ref().unwrap()[TRACE_PARENT_ANNOTATION],
        TRACE
    );
    let step: Value = serde_json::from_str(&a[DOWNLOAD_STEP_ANNOTATION]).unwrap();
    assert_eq!(step["version"], "v1alpha1");
    assert_eq!(step["origin"], "engine");
    // A malformed traceparent is not recorded.
    let bad = Ctx {
        traceparent: Some("00-xyz".into()),
        ..Ctx::default()
    };
    let r = bad.rewrite(&engine_pod(), None);
    assert!(
        !r.pod
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .contains_key(TRACE_PARENT_ANNOTATION)
    );
    assert!(created(&r).metadata.annotations.is_none());
}

#[test]
fn the_binding_to_create() {
    let r = Ctx::default().rewrite(&engine_pod(), None);
    let b = created(&r);
    assert_eq!(
        b.metadata.namespace.as_deref(),
        Some("nvca-modelcache-init")
    );
    assert_eq!(
        b.metadata.finalizers.as_deref(),
        Some(&[FINALIZER.to_owned()][..])
    );
    assert_eq!(
        b.metadata.labels.as_ref().unwrap()[MANAGED_BY_LABEL],
        "warmcache"
    );
    let id = &b.spec.identity;
    assert_eq!(
        b.metadata.name.as_deref(),
        Some(warmcache_api_modelcache::binding_name(id).as_str())
    );
    assert_eq!(
        id.sharing_domain_digest,
        warmcache_api_modelcache::sha256_digest("team-a")
    );
    assert_eq!(
        id.cache_handle_digest,
        warmcache_api_modelcache::sha256_digest("hf://Qwen/Qwen3-8B?layout=hub")
    );
    let res = &b.spec.resources;
    assert_eq!(res.writer_namespace, "team-a");
    assert_eq!(
        res.persistent_volume_claim_names,
        vec![
            warmcache_api_modelcache::writer_pvc_name(id),
            warmcache_api_modelcache::reader_pvc_name(id)
        ]
    );
    assert_eq!(
        res.job_names,
        vec![warmcache_api_modelcache::writer_job_name(id)]
    );
    assert!(res.lease_name.is_empty());
    let helm = created(&Ctx::helm("research").rewrite(&engine_pod(), None));
    assert_eq!(
        helm.spec.resources.lease_name,
        warmcache_api_modelcache::init_lease_name(&helm.spec.identity)
    );
    assert_eq!(helm.spec.resources.persistent_volume_claim_names.len(), 1);
    // Encrypted block caches name their StorageClass and Secret.
    let enc = Ctx {
        storage: "nvmesh".into(),
        gates: Gates {
            model_cache_encryption: true,
            ..common::gates()
        },
        ..Ctx::default()
    };
    let b = created(&enc.rewrite(&engine_pod(), None));
    let hash = warmcache_api_modelcache::identity_hash(&b.spec.identity);
    assert!(b.spec.decision.encryption_required);
    assert_eq!(
        b.spec.resources.storage_class_names,
        vec![format!("{hash}-sc")]
    );
    assert_eq!(b.spec.resources.secret_names, vec![hash]);
}

// ------------------------------------------------------------------------------------------
// Existing bindings
// ------------------------------------------------------------------------------------------

#[test]
fn an_active_binding_is_joined_with_its_uid() {
    let ctx = Ctx::default();
    let first = ctx.rewrite(&engine_pod(), None);
    let stored = common::stored(
        &created(&first),
        Some(BindingPhase::Active),
        Some(common::NAMESPACE),
    );
    let r = ctx.rewrite(&engine_pod(), Some(&stored));
    match &r.binding {
        BindingAction::Join { name, uid } => {
            assert_eq!(Some(name), stored.metadata.name.as_ref());
            assert_eq!(Some(uid), stored.metadata.uid.as_ref());
        }
        other => panic!("{other:?}"),
    }
    let a = r.pod.metadata.annotations.as_ref().unwrap();
    assert_eq!(
        a[BINDING_UID_ANNOTATION],
        stored.metadata.uid.clone().unwrap()
    );
    assert!(
        !r.pod
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .contains_key(PENDING_LABEL),
        "the view exists"
    );
    // The binding's decision is authoritative: joining never re-decides, even without storage.
    let gone = Ctx {
        storage: "absent".into(),
        ..Ctx::default()
    };
    let stored_no_view = common::stored(&created(&first), Some(BindingPhase::Active), None);
    let r = gone.rewrite(&engine_pod(), Some(&stored_no_view));
    assert!(matches!(r.binding, BindingAction::Join { .. }));
    assert_eq!(
        r.pod.metadata.labels.as_ref().unwrap()[PENDING_LABEL],
        "true"
    );
    // completing a joined rewrite changes nothing.
    assert_eq!(r.clone().complete(&stored).unwrap(), r.pod);
}

#[test]
fn bindings_that_may_not_be_joined() {
    let ctx = Ctx::default();
    let wanted = created(&ctx.rewrite(&engine_pod(), None));
    let base = common::stored(&wanted, Some(BindingPhase::Active), None);

    let mut retiring = base.clone();
    retiring.status.as_mut().unwrap().phase = Some(BindingPhase::Retiring);
    assert_eq!(
        ctx.skip(&engine_pod(), Some(&retiring)).reason,
        SkipReason::BindingRetiring
    );

    // An encrypted copy whose key is gone is never joined.
    let mut keyless = base.clone();
    keyless.status.as_mut().unwrap().conditions =
        vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: "Degraded".into(),
            status: "True".into(),
            reason: "EncryptionKeyMissing".into(),
            message: "the key Secret is gone".into(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
            observed_generation: None,
        }];
    let skip = ctx.skip(&engine_pod(), Some(&keyless));
    assert_eq!(skip.reason, SkipReason::BindingUnavailable);
    assert!(
        skip.message.contains("key Secret is gone"),
        "{}",
        skip.message
    );

    let mut deleting = base.clone();
    deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
    assert_eq!(
        ctx.skip(&engine_pod(), Some(&deleting)).reason,
        SkipReason::BindingDeleting
    );

    let mut failed = base.clone();
    failed.status.as_mut().unwrap().realized = Some(RealizedStorage {
        population_state: Some(PopulationState::Failed),
        ..RealizedStorage::default()
    });
    let s = ctx.skip(&engine_pod(), Some(&failed));
    assert_eq!(s.reason, SkipReason::DownloadFailed);
    assert!(s.reason.warrants_event());

    let mut foreign = base.clone();
    foreign.metadata.finalizers = None;
    assert_eq!(
        ctx.skip(&engine_pod(), Some(&foreign)).reason,
        SkipReason::BindingConflict
    );

    let mut other_identity = base.clone();
    other_identity.spec.identity.sharing_domain_digest =
        warmcache_api_modelcache::sha256_digest("team-b");
    let s = ctx.skip(&engine_pod(), Some(&other_identity));
    assert_eq!(s.reason, SkipReason::BindingConflict);
    assert!(s.message.contains("never adopted"), "{}", s.message);

    let mut no_uid = base.clone();
    no_uid.metadata.uid = None;
    assert_eq!(
        ctx.skip(&engine_pod(), Some(&no_uid)).reason,
        SkipReason::BindingConflict
    );

    // A later contract version of the same cache is still this cache (the name ignores it too).
    let mut later = base.clone();
    later.spec.identity.version = "v1alpha2".into();
    assert!(matches!(
        ctx.rewrite(&engine_pod(), Some(&later)).binding,
        BindingAction::Join { .. }
    ));

    let mut elsewhere = base;
    elsewhere.metadata.namespace = Some("default".into());
    assert_eq!(
        ctx.skip(&engine_pod(), Some(&elsewhere)).reason,
        SkipReason::BindingConflict
    );
}

#[test]
fn an_already_exists_winner_is_accepted_only_when_it_is_what_would_have_been_created() {
    let ctx = Ctx::default();
    let r = ctx.rewrite(&engine_pod(), None);
    let wanted = created(&r);
    let same = common::stored(&wanted, None, None);
    assert_eq!(accept_winner(&wanted, &same), Ok(()));
    let pod = r.clone().complete(&same).unwrap();
    assert_eq!(
        pod.metadata.annotations.as_ref().unwrap()[BINDING_UID_ANNOTATION],
        same.metadata.uid.clone().unwrap()
    );

    let mut other_decision = same.clone();
    other_decision.spec.decision.provider = "netappTrident".into();
    let s = accept_winner(&wanted, &other_decision).unwrap_err();
    assert_eq!(s.reason, SkipReason::BindingConflict);
    assert!(s.message.contains("the storage changed"), "{}", s.message);
    assert_eq!(
        r.clone().complete(&other_decision).unwrap_err().reason,
        SkipReason::BindingConflict
    );

    let mut other_class = same.clone();
    other_class.spec.storage_class.uid = "another".into();
    assert_eq!(
        accept_winner(&wanted, &other_class).unwrap_err().reason,
        SkipReason::BindingConflict
    );

    let mut other_writer = same.clone();
    other_writer.spec.resources.writer_namespace = "team-b".into();
    assert_eq!(
        accept_winner(&wanted, &other_writer).unwrap_err().reason,
        SkipReason::BindingConflict
    );

    let mut retiring = same.clone();
    retiring.status = Some(Default::default());
    retiring.status.as_mut().unwrap().phase = Some(BindingPhase::Retiring);
    assert_eq!(
        accept_winner(&wanted, &retiring).unwrap_err().reason,
        SkipReason::BindingRetiring
    );

    let mut no_uid = same;
    no_uid.metadata.uid = None;
    assert_eq!(
        r.complete(&no_uid).unwrap_err().reason,
        SkipReason::BindingConflict
    );

    // In a sharing domain any namespace may have won the race: the writer namespace may differ.
    let helm = Ctx::helm("research");
    let wanted = created(&helm.rewrite(&engine_pod(), None));
    let mut winner = common::stored(&wanted, None, None);
    winner.spec.resources.writer_namespace = "team-b".into();
    assert_eq!(accept_winner(&wanted, &winner), Ok(()));
}

// ------------------------------------------------------------------------------------------
// Names that separate caches
// ------------------------------------------------------------------------------------------

fn binding_name_of(ctx: &Ctx, p: &Pod) -> String {
    let req = Request {
        pod: p,
        namespace: &ctx.namespace,
        namespace_labels: &ctx.labels,
        leader_worker_set: None,
        traceparent: None,
        options: &ctx.options,
    };
    plan(&req).unwrap().binding_name().to_owned()
}

#[test]
fn sharing_domains_and_handles_separate_bindings() {
    let a = Ctx::default();
    let b = Ctx {
        namespace: "team-b".into(),
        ..Ctx::default()
    };
    let d1a = Ctx::helm("research");
    let d1b = Ctx {
        namespace: "team-b".into(),
        ..Ctx::helm("research")
    };
    let d2 = Ctx::helm("prod");
    let p = engine_pod();
    assert_ne!(
        binding_name_of(&a, &p),
        binding_name_of(&b, &p),
        "unlabelled namespaces share with nobody"
    );
    assert_eq!(
        binding_name_of(&d1a, &p),
        binding_name_of(&d1b, &p),
        "one sharing domain, one binding"
    );
    assert_ne!(binding_name_of(&d1a, &p), binding_name_of(&d2, &p));
    assert_ne!(binding_name_of(&a, &p), binding_name_of(&d1a, &p));
    // The layout is part of the handle: a flat copy and a hub cache of one model never mix.
    let flat = init_pod();
    let mut hub = init_pod();
    let init = &mut hub.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0];
    init.command = Some(vec![
        "hf".into(),
        "download".into(),
        "meta-llama/Llama-3.1-8B-Instruct".into(),
    ]);
    init.env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
        name: "HF_HOME".into(),
        value: Some("/models".into()),
        value_from: None,
    }]);
    hub.spec.as_mut().unwrap().containers[0].env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
        name: "HF_HOME".into(),
        value: Some("/models".into()),
        value_from: None,
    }]);
    hub.spec.as_mut().unwrap().containers[0].args = Some(vec![
        "--model".into(),
        "meta-llama/Llama-3.1-8B-Instruct".into(),
    ]);
    let rf = a.rewrite(&flat, None);
    let rh = a.rewrite(&hub, None);
    assert_eq!(rf.plan.uri(), rh.plan.uri());
    assert_eq!(
        rh.plan.handle().to_string(),
        "hf://meta-llama/Llama-3.1-8B-Instruct?layout=hub"
    );
    assert_ne!(rf.plan.binding_name(), rh.plan.binding_name());
    // The init download into HF_HOME, read by the engine through HF_HOME: offline from the copy.
    assert!(rh.plan.offline());
    assert!(!rf.plan.offline());
    // An endpoint is part of the handle.
    let mut mirror = engine_pod();
    mirror.spec.as_mut().unwrap().containers[0]
        .env
        .as_mut()
        .unwrap()
        .push(k8s_openapi::api::core::v1::EnvVar {
            name: "HF_ENDPOINT".into(),
            value: Some("https://hf-mirror.internal".into()),
            value_from: None,
        });
    assert_ne!(
        binding_name_of(&a, &engine_pod()),
        binding_name_of(&a, &mirror)
    );
    let mut public = engine_pod();
    public.spec.as_mut().unwrap().containers[0]
        .env
        .as_mut()
        .unwrap()
        .push(k8s_openapi::api::core::v1::EnvVar {
            name: "HF_ENDPOINT".into(),
            value: Some("https://huggingface.co".into()),
            value_from: None,
        });
    assert_eq!(
        binding_name_of(&a, &engine_pod()),
        binding_name_of(&a, &public),
        "the public Hub is no custom endpoint"
    );
}

// ------------------------------------------------------------------------------------------
// Every skip reason
// ------------------------------------------------------------------------------------------

fn with_labels(mut p: Pod, labels: &[(&str, &str)]) -> Pod {
    let l = p.metadata.labels.get_or_insert_with(BTreeMap::new);
    for (k, v) in labels {
        l.insert((*k).to_owned(), (*v).to_owned());
    }
    p
}

fn with_annotations(mut p: Pod, a: &[(&str, &str)]) -> Pod {
    let m = p.metadata.annotations.get_or_insert_with(BTreeMap::new);
    for (k, v) in a {
        m.insert((*k).to_owned(), (*v).to_owned());
    }
    p
}

fn engine_with(args: &[&str], env: &[(&str, &str)]) -> Pod {
    let mut p = engine_pod();
    let c = &mut p.spec.as_mut().unwrap().containers[0];
    c.args = Some(args.iter().map(|s| (*s).to_owned()).collect());
    for (n, v) in env {
        c.env
            .get_or_insert_with(Vec::new)
            .push(k8s_openapi::api::core::v1::EnvVar {
                name: (*n).to_owned(),
                value: Some((*v).to_owned()),
                value_from: None,
            });
    }
    p
}

fn lws_worker() -> Pod {
    with_labels(
        pod(r#"
apiVersion: v1
kind: Pod
metadata: {name: vllm-0-1}
spec:
  containers:
    - name: worker
      image: vllm/vllm-openai:v0.20.0
      command: [sh, -c, "ray start --address=$(LWS_LEADER_ADDRESS):6379 --block"]
      resources:
        limits: {nvidia.com/gpu: "8"}
      volumeMounts:
        - {name: hf, mountPath: /root/.cache/huggingface}
  volumes:
    - {name: hf, emptyDir: {}}
"#),
        &[(LWS_NAME_LABEL, "vllm"), (LWS_WORKER_INDEX_LABEL, "1")],
    )
}

fn lws(name: &str, leader_args: &[&str]) -> LeaderWorkerSet {
    let mut l: LeaderWorkerSet = serde_saphyr::from_str(
        r#"
metadata: {name: vllm}
spec:
  leaderWorkerTemplate:
    leaderTemplate:
      spec:
        containers:
          - name: leader
            image: vllm/vllm-openai:v0.20.0
    workerTemplate:
      spec:
        containers:
          - name: worker
            image: vllm/vllm-openai:v0.20.0
"#,
    )
    .unwrap();
    l.metadata.name = Some(name.into());
    let t = l
        .spec
        .leader_worker_template
        .leader_template
        .as_mut()
        .unwrap();
    t.spec.as_mut().unwrap().containers[0].args =
        Some(leader_args.iter().map(|s| (*s).to_owned()).collect());
    l
}

#[test]
fn every_skip_reason_is_produced() {
    let default = Ctx::default();
    let mut seen: BTreeSet<SkipReason> = BTreeSet::new();
    let mut check = |ctx: &Ctx, p: Pod, binding: Option<&ModelCacheBinding>, want: SkipReason| {
        let s = ctx.skip(&p, binding);
        assert_eq!(s.reason, want, "{}", s.message);
        assert!(!s.message.is_empty());
        // A skip is stable: the pod as admitted gets the same skip again.
        let admitted = Verdict::Skip(s.clone()).admitted(&p);
        let again = ctx.skip(&admitted, binding);
        assert_eq!(again, s);
        if want.in_scope() {
            let a = admitted.metadata.annotations.as_ref().unwrap();
            assert_eq!(a[SKIP_REASON_ANNOTATION], want.code());
            assert_eq!(a[SKIP_MESSAGE_ANNOTATION], s.message);
        } else {
            assert_eq!(admitted, p, "scope skips leave the pod untouched");
        }
        seen.insert(want);
    };
    // Scope.
    for ns in ["kube-system", "warmcache-system", "nvca-modelcache-init"] {
        let ctx = Ctx {
            namespace: ns.into(),
            ..Ctx::default()
        };
        check(&ctx, engine_pod(), None, SkipReason::NamespaceExcluded);
    }
    let opted = Ctx {
        labels: BTreeMap::from([(OPT_OUT.to_owned(), "true".to_owned())]),
        ..Ctx::default()
    };
    check(&opted, engine_pod(), None, SkipReason::NamespaceOptedOut);
    check(
        &default,
        with_labels(engine_pod(), &[(OPT_OUT, "true")]),
        None,
        SkipReason::PodOptedOut,
    );
    check(
        &default,
        with_annotations(engine_pod(), &[(OPT_OUT, "True")]),
        None,
        SkipReason::PodOptedOut,
    );
    check(
        &default,
        with_labels(engine_pod(), &[(MANAGED_BY_LABEL, "warmcache")]),
        None,
        SkipReason::OwnPod,
    );
    let mut windows = engine_pod();
    windows.spec.as_mut().unwrap().os = Some(k8s_openapi::api::core::v1::PodOS {
        name: "windows".into(),
    });
    check(&default, windows, None, SkipReason::WindowsPod);
    let mut cpu = engine_pod();
    cpu.spec.as_mut().unwrap().containers[0].resources = None;
    check(&default, cpu, None, SkipReason::NotGpuPod);
    let mut zero = engine_pod();
    zero.spec.as_mut().unwrap().containers[0]
        .resources
        .as_mut()
        .unwrap()
        .limits
        .as_mut()
        .unwrap()
        .insert(
            "nvidia.com/gpu".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("0".into()),
        );
    check(&default, zero, None, SkipReason::NotGpuPod);
    // What the pod downloads.
    check(
        &default,
        engine_with(&["--port", "8000"], &[]),
        None,
        SkipReason::NoDownloader,
    );
    check(
        &default,
        engine_with(&["--model", "/models/llama"], &[]),
        None,
        SkipReason::LocalPath,
    );
    let mut unknown = engine_with(&["--model", "$(MODEL)"], &[]);
    unknown.spec.as_mut().unwrap().containers[0]
        .env
        .as_mut()
        .unwrap()
        .insert(
            0,
            k8s_openapi::api::core::v1::EnvVar {
                name: "MODEL".into(),
                value: None,
                value_from: Some(
                    serde_json::from_value(
                        serde_json::json!({"configMapKeyRef": {"name": "m", "key": "model"}}),
                    )
                    .unwrap(),
                ),
            },
        );
    check(&default, unknown, None, SkipReason::UnknownValue);
    check(
        &default,
        engine_with(&["--model", "https://example.com/m"], &[]),
        None,
        SkipReason::UnsupportedSource,
    );
    check(
        &default,
        engine_with(&["--model", "not a repo!"], &[]),
        None,
        SkipReason::InvalidReference,
    );
    let mut partial = init_pod();
    partial
        .spec
        .as_mut()
        .unwrap()
        .init_containers
        .as_mut()
        .unwrap()[0]
        .command = Some(
        [
            "hf",
            "download",
            "org/m",
            "--include",
            "*.json",
            "--local-dir",
            "/models/llama",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect(),
    );
    check(&default, partial, None, SkipReason::PartialDownload);
    let mut two = init_pod();
    let mut second = two.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0].clone();
    second.name = "fetch-2".into();
    second.command = Some(
        [
            "hf",
            "download",
            "org/other",
            "--local-dir",
            "/models/other",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect(),
    );
    two.spec
        .as_mut()
        .unwrap()
        .init_containers
        .as_mut()
        .unwrap()
        .push(second);
    check(&default, two, None, SkipReason::MultipleDownloads);
    let kserve_pvc = pod(r#"
apiVersion: v1
kind: Pod
metadata: {name: k}
spec:
  initContainers:
    - name: storage-initializer
      image: kserve/storage-initializer:v0.15.0
      args: ["pvc://models/qwen", /mnt/models]
      volumeMounts: [{name: loc, mountPath: /mnt/models}]
  containers:
    - name: kserve-container
      image: kserve/huggingfaceserver:v0.15.0
      resources: {limits: {nvidia.com/gpu: "1"}}
      volumeMounts: [{name: loc, mountPath: /mnt/models}]
  volumes: [{name: loc, emptyDir: {}}]
"#);
    check(&default, kserve_pvc, None, SkipReason::PvcStorageUri);
    let mut secret_endpoint = engine_pod();
    secret_endpoint.spec.as_mut().unwrap().containers[0]
        .env
        .as_mut()
        .unwrap()
        .push(k8s_openapi::api::core::v1::EnvVar {
            name: "HF_ENDPOINT".into(),
            value: None,
            value_from: Some(Default::default()),
        });
    check(&default, secret_endpoint, None, SkipReason::CustomEndpoint);
    let mut customer = engine_pod();
    customer.spec.as_mut().unwrap().volumes = Some(vec![
        serde_json::from_value(
            serde_json::json!({"name": "m", "persistentVolumeClaim": {"claimName": "team-models"}}),
        )
        .unwrap(),
    ]);
    check(
        &default,
        customer,
        None,
        SkipReason::LandingNotSubstitutable,
    );
    let mut relative = engine_pod();
    relative.spec.as_mut().unwrap().containers[0]
        .env
        .as_mut()
        .unwrap()[0]
        .value = Some("models/hf".into());
    check(&default, relative, None, SkipReason::LandingUnknown);
    check(
        &default,
        lws_worker(),
        None,
        SkipReason::LeaderWorkerSetMissing,
    );
    let mismatch = Ctx {
        lws: Some(lws("other", &["--model", "Qwen/Qwen3-8B"])),
        ..Ctx::default()
    };
    check(
        &mismatch,
        lws_worker(),
        None,
        SkipReason::LeaderWorkerSetMismatch,
    );
    let unresolved = Ctx {
        lws: Some(lws("vllm", &["--port", "8000"])),
        ..Ctx::default()
    };
    check(
        &unresolved,
        lws_worker(),
        None,
        SkipReason::LeaderUnresolved,
    );
    // Safety.
    check(
        &default,
        engine_with(&["--model", "Qwen/Qwen3-8B", "--download-dir", "/tmp"], &[]),
        None,
        SkipReason::LandingShared,
    );
    check(
        &default,
        engine_with(&["--model", "Qwen/Qwen3-8B", "--tokenizer", "org/tok"], &[]),
        None,
        SkipReason::MultipleRepositories,
    );
    let nim = pod(r#"
apiVersion: v1
kind: Pod
metadata: {name: nim}
spec:
  containers:
    - name: nim
      image: nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8.3
      resources: {limits: {nvidia.com/gpu: "1"}}
"#);
    check(&default, nim, None, SkipReason::NimProfileUnpinned);
    let mut script = engine_pod();
    let c = &mut script.spec.as_mut().unwrap().containers[0];
    c.args = None;
    c.command = Some(vec![
        "sh".into(),
        "-c".into(),
        "export TRANSFORMERS_OFFLINE=0; vllm serve Qwen/Qwen3-8B".into(),
    ]);
    check(&default, script, None, SkipReason::EngineEnvConflict);
    // An engine pulling an NGC model by itself into its own filesystem: no Job reproduces it,
    // and nothing outside the container can capture it.
    let ngc_engine = engine_with(
        &[],
        &[
            ("NGC_MODEL_NAME", "org/team/model:1"),
            ("NGC_MODEL_MOUNT", "/opt/ngc"),
        ],
    );
    check(
        &default,
        ngc_engine,
        None,
        SkipReason::DownloadNotReproducible,
    );
    let mut literal = init_pod();
    literal
        .spec
        .as_mut()
        .unwrap()
        .init_containers
        .as_mut()
        .unwrap()[0]
        .env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
        name: "HF_TOKEN".into(),
        value: Some("hf_0123456789abcdefghijklmnop".into()),
        value_from: None,
    }]);
    check(&default, literal, None, SkipReason::SecretInDownloadStep);
    let mut scratch_taken = engine_pod();
    scratch_taken.spec.as_mut().unwrap().containers[0]
        .volume_mounts
        .as_mut()
        .unwrap()
        .push(
            serde_json::from_value(
                serde_json::json!({"name": "m", "mountPath": "/opt/nvsnap/cache"}),
            )
            .unwrap(),
        );
    assert_eq!(
        default.skip(&scratch_taken, None).reason,
        SkipReason::NameConflict
    );
    let mut taken = engine_pod();
    taken.spec.as_mut().unwrap().volumes.as_mut().unwrap().push(
        serde_json::from_value(serde_json::json!({"name": MODEL_VOLUME, "emptyDir": {}})).unwrap(),
    );
    check(&default, taken, None, SkipReason::NameConflict);
    let rewritten = default.rewrite(&engine_pod(), None).pod;
    let other_ns = Ctx {
        namespace: "team-b".into(),
        ..Ctx::default()
    };
    check(&other_ns, rewritten, None, SkipReason::RewrittenElsewhere);
    // Storage.
    let off = Ctx {
        gates: Gates {
            caching_support: false,
            ..common::gates()
        },
        ..Ctx::default()
    };
    check(&off, engine_pod(), None, SkipReason::CachingDisabled);
    let helm_off = Ctx {
        gates: Gates {
            helm_model_caching: false,
            ..common::gates()
        },
        ..Ctx::helm("research")
    };
    check(&helm_off, engine_pod(), None, SkipReason::CachingDisabled);
    let absent = Ctx {
        storage: "absent".into(),
        ..Ctx::default()
    };
    check(&absent, engine_pod(), None, SkipReason::NoDurableStorage);
    let broken = Ctx {
        config_map: Some(serde_json::from_value(serde_json::json!({"metadata": {"name": "nvcf-storage-capabilities"}, "data": {"other": "x"}})).unwrap()),
        ..Ctx::default()
    };
    check(
        &broken,
        engine_pod(),
        None,
        SkipReason::StorageDecisionFailed,
    );
    // The binding.
    let wanted = created(&default.rewrite(&engine_pod(), None));
    let mut b = common::stored(&wanted, Some(BindingPhase::Retiring), None);
    check(
        &default,
        engine_pod(),
        Some(&b),
        SkipReason::BindingRetiring,
    );
    b.status.as_mut().unwrap().phase = Some(BindingPhase::Active);
    b.metadata.deletion_timestamp = Some(Time(Default::default()));
    check(
        &default,
        engine_pod(),
        Some(&b),
        SkipReason::BindingDeleting,
    );
    b.metadata.deletion_timestamp = None;
    b.metadata.finalizers = None;
    check(
        &default,
        engine_pod(),
        Some(&b),
        SkipReason::BindingConflict,
    );
    b.metadata.finalizers = Some(vec![FINALIZER.into()]);
    b.status.as_mut().unwrap().realized = Some(RealizedStorage {
        population_state: Some(PopulationState::Failed),
        ..RealizedStorage::default()
    });
    check(&default, engine_pod(), Some(&b), SkipReason::DownloadFailed);
    // The shell's skip when the create call fails.
    let rewrite = default.rewrite(&engine_pod(), None);
    let unavailable = rewrite.unavailable("timed out after 2s");
    assert_eq!(unavailable.reason, SkipReason::BindingUnavailable);
    assert!(
        unavailable.message.contains(rewrite.plan.binding_name())
            && unavailable.message.contains("timed out after 2s"),
        "{}",
        unavailable.message
    );
    assert_eq!(unavailable.uri.as_deref(), Some(rewrite.plan.uri()));
    assert!(unavailable.reason.warrants_event());
    seen.insert(unavailable.reason);

    let missing: Vec<&str> = SkipReason::ALL
        .iter()
        .filter(|r| !seen.contains(r))
        .map(|r| r.code())
        .collect();
    assert!(missing.is_empty(), "no case produces {missing:?}");
}

// ------------------------------------------------------------------------------------------
// Hardening and secrets
// ------------------------------------------------------------------------------------------

fn assert_hardened(c: &Container, user: i64) {
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(
        sc.capabilities.as_ref().unwrap().drop.as_deref(),
        Some(&["ALL".to_owned()][..])
    );
    assert!(sc.capabilities.as_ref().unwrap().add.is_none());
    assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.run_as_user, Some(user));
    let r = c.resources.as_ref().unwrap();
    for part in [&r.requests, &r.limits] {
        let m = part.as_ref().unwrap();
        assert!(m.contains_key("cpu") && m.contains_key("memory"), "{m:?}");
    }
}

#[test]
fn added_containers_are_hardened_with_the_pods_own_user() {
    let ctx = Ctx::default();
    // No user in the pod, or root: a fixed non-root uid.
    assert_hardened(&wait(&ctx.rewrite(&engine_pod(), None).pod), 65532);
    let mut root = engine_pod();
    root.spec.as_mut().unwrap().security_context =
        Some(serde_json::from_value(serde_json::json!({"runAsUser": 0})).unwrap());
    assert_hardened(&wait(&ctx.rewrite(&root, None).pod), 65532);
    // The pod's user, from the pod or from the container it stands in for.
    let mut pod_user = engine_pod();
    pod_user.spec.as_mut().unwrap().security_context = Some(
        serde_json::from_value(
            serde_json::json!({"runAsUser": 1000, "runAsGroup": 2000, "fsGroup": 2000}),
        )
        .unwrap(),
    );
    let w = wait(&ctx.rewrite(&pod_user, None).pod);
    assert_hardened(&w, 1000);
    assert_eq!(w.security_context.unwrap().run_as_group, Some(2000));
    let mut init_user = init_pod();
    init_user
        .spec
        .as_mut()
        .unwrap()
        .init_containers
        .as_mut()
        .unwrap()[0]
        .security_context =
        Some(serde_json::from_value(serde_json::json!({"runAsUser": 1001})).unwrap());
    assert_hardened(&wait(&ctx.rewrite(&init_user, None).pod), 1001);
    // hostPath readers get the download budget.
    let host = Ctx {
        storage: "nvmesh".into(),
        options: common::options(Some("hostPath")),
        ..Ctx::default()
    };
    let w = wait(&host.rewrite(&init_pod(), None).pod);
    assert_hardened(&w, 65532);
    assert_eq!(w.resources, Some(Options::default().download_resources));
}

#[test]
fn secrets_are_never_copied_by_value() {
    let token = "hf_SECRETSECRETSECRETSECRET0123";
    let mut p = engine_pod();
    p.spec.as_mut().unwrap().containers[0]
        .env
        .as_mut()
        .unwrap()
        .push(k8s_openapi::api::core::v1::EnvVar {
            name: "HUGGING_FACE_HUB_TOKEN".into(),
            value: Some(token.into()),
            value_from: None,
        });
    for ctx in [
        Ctx::default(),
        Ctx {
            storage: "nvmesh".into(),
            options: common::options(Some("hostPath")),
            ..Ctx::default()
        },
    ] {
        let r = ctx.rewrite(&p, None);
        let annotations = serde_json::to_string(&r.pod.metadata.annotations).unwrap();
        assert!(!annotations.contains(token), "{annotations}");
        let step: Value = serde_json::from_str(
            &r.pod.metadata.annotations.as_ref().unwrap()[DOWNLOAD_STEP_ANNOTATION],
        )
        .unwrap();
        assert_eq!(
            step["envFromPod"],
            serde_json::json!([{"name": "HUGGING_FACE_HUB_TOKEN", "container": "vllm"}])
        );
        // The secret reference is copied as a reference.
        assert_eq!(
            step["container"]["env"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == "HF_TOKEN")
                .unwrap()["valueFrom"]["secretKeyRef"]["name"],
            "hf"
        );
        let w = serde_json::to_string(&wait(&r.pod)).unwrap();
        assert!(!w.contains(token), "{w}");
        assert!(!serde_json::to_string(&created(&r)).unwrap().contains(token));
    }
}

#[test]
fn configured_gpu_resources_decide_scope_and_the_main_container() {
    let mut p = engine_pod();
    let mut sidecar = p.spec.as_ref().unwrap().containers[0].clone();
    sidecar.name = "metrics".into();
    sidecar.args = Some(vec!["--port".into(), "9000".into()]);
    sidecar.resources = None;
    p.spec.as_mut().unwrap().containers.insert(0, sidecar);
    let c = &mut p.spec.as_mut().unwrap().containers[1];
    c.resources =
        Some(serde_json::from_value(serde_json::json!({"limits": {"amd.com/gpu": "1"}})).unwrap());
    assert_eq!(Ctx::default().skip(&p, None).reason, SkipReason::NotGpuPod);
    let amd = Ctx {
        options: Options {
            gpu_resources: vec!["nvidia.com/gpu".into(), "amd.com/gpu".into()],
            ..common::options(None)
        },
        ..Ctx::default()
    };
    let r = amd.rewrite(&p, None);
    assert_eq!(r.plan.main_container(), 1);
    assert_eq!(r.plan.uri(), "hf://Qwen/Qwen3-8B");
}

#[test]
fn the_original_containers_keep_their_command_and_only_gain_what_the_rewrite_needs() {
    let original = engine_pod();
    let r = Ctx::default().rewrite(&original, None);
    let before = &original.spec.as_ref().unwrap().containers[0];
    let after = &r.pod.spec.as_ref().unwrap().containers[0];
    assert_eq!(before.command, after.command);
    assert_eq!(before.args, after.args);
    assert_eq!(before.image, after.image);
    assert_eq!(before.resources, after.resources);
    for e in before.env.iter().flatten() {
        if e.name != "HF_HOME" {
            assert!(
                after.env.iter().flatten().any(|x| x == e),
                "{} kept",
                e.name
            );
        }
    }
    let vols: Vec<String> = r
        .pod
        .spec
        .as_ref()
        .unwrap()
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.clone())
        .collect();
    assert_eq!(vols, vec!["m", MODEL_VOLUME, "nvsnap-cache"]);
}

fn selection_of(p: &Pod) -> Selection {
    let a = p.metadata.annotations.as_ref().expect("annotations");
    Selection::parse(&a[STORAGE_SELECTION_ANNOTATION]).expect("a valid selection")
}

#[test]
fn every_pod_past_the_storage_decision_records_its_selection() {
    // A durable create: the decision, no binding reference until the binding is stored.
    let ctx = Ctx::default();
    let r = ctx.rewrite(&engine_pod(), None);
    let s = selection_of(&r.pod);
    assert_eq!(s.mode, Mode::Durable);
    assert_eq!(s.workflow, Workflow::RegularModelCache);
    assert_eq!(s.provisioner, "csi.weka.io");
    assert_eq!(s.storage_class_uid, "5f0c1f3e-8a59-4c2a-9d0e-1b2c3d4e5f60");
    assert_eq!(s.transition, Some(SelectionTransition::RwxReadOnly));
    assert_eq!(
        s.required_access_modes,
        Transition::RwxReadOnly.required_access_modes()
    );
    assert!(s.binding_name.is_empty() && s.binding_uid.is_empty());
    let wanted = created(&r);
    let stored = common::stored(&wanted, None, None);
    let done = r.complete(&stored).unwrap();
    let s = selection_of(&done);
    assert_eq!(Some(&s.binding_name), stored.metadata.name.as_ref());
    assert_eq!(Some(&s.binding_uid), stored.metadata.uid.as_ref());
    assert_eq!(s.catalog_digest, wanted.spec.decision.catalog_digest);

    // A join records the joined binding's frozen decision, even when storage has gone since.
    let gone = Ctx {
        storage: "absent".into(),
        ..Ctx::default()
    };
    let active = common::stored(&wanted, Some(BindingPhase::Active), None);
    let joined = gone.rewrite(&engine_pod(), Some(&active));
    assert_eq!(selection_of(&joined.pod), s);

    // Non-durable: the workflow's fallback, with nothing resolved and no binding.
    let cases: [(Ctx, Workflow, Mode, SkipReason); 5] = [
        (
            gone,
            Workflow::RegularModelCache,
            Mode::None,
            SkipReason::NoDurableStorage,
        ),
        (
            Ctx {
                storage: "absent".into(),
                ..Ctx::helm("d")
            },
            Workflow::HelmModelCache,
            Mode::Ephemeral,
            SkipReason::NoDurableStorage,
        ),
        (
            Ctx {
                storage: "lustre".into(),
                ..Ctx::helm("d")
            },
            Workflow::HelmModelCache,
            Mode::Ephemeral,
            SkipReason::NoDurableStorage,
        ),
        (
            Ctx {
                gates: Gates {
                    caching_support: false,
                    ..common::gates()
                },
                ..Ctx::helm("d")
            },
            Workflow::HelmModelCache,
            Mode::None,
            SkipReason::CachingDisabled,
        ),
        (
            Ctx {
                gates: Gates {
                    helm_model_caching: false,
                    ..common::gates()
                },
                ..Ctx::helm("d")
            },
            Workflow::HelmModelCache,
            Mode::None,
            SkipReason::CachingDisabled,
        ),
    ];
    for (ctx, workflow, mode, reason) in cases {
        let p = engine_pod();
        let skip = ctx.skip(&p, None);
        assert_eq!(skip.reason, reason, "{}", skip.message);
        let admitted = Verdict::Skip(skip.clone()).admitted(&p);
        let s = selection_of(&admitted);
        assert_eq!(
            s,
            Selection::non_durable(workflow, mode),
            "{reason:?} in {workflow:?}"
        );
        assert_eq!(skip.report()["selection"]["mode"], mode.as_str());
    }

    // Gates come before the binding: off, an existing binding is not joined either.
    let off = Ctx {
        gates: Gates {
            caching_support: false,
            ..common::gates()
        },
        ..Ctx::default()
    };
    let skip = off.skip(&engine_pod(), Some(&active));
    assert_eq!(skip.reason, SkipReason::CachingDisabled);
    assert_eq!(skip.selection.unwrap().mode, Mode::None);

    // A binding that may not be joined: the pod downloads on its own, and says so.
    let mut retiring = active.clone();
    retiring.status.as_mut().unwrap().phase = Some(BindingPhase::Retiring);
    let skip = Ctx::default().skip(&engine_pod(), Some(&retiring));
    assert_eq!(skip.reason, SkipReason::BindingRetiring);
    assert_eq!(skip.selection.unwrap().mode, Mode::None);

    // Skips decided before storage is looked at record no selection.
    let mut nothing = engine_pod();
    nothing.spec.as_mut().unwrap().containers[0].args = Some(vec!["--help".into()]);
    nothing.spec.as_mut().unwrap().containers[0].command = Some(vec!["sleep".into()]);
    let skip = ctx_skip_without_selection(&nothing);
    assert!(skip.selection.is_none(), "{skip:?}");
}

fn ctx_skip_without_selection(p: &Pod) -> Skip {
    let s = Ctx::default().skip(p, None);
    assert!(
        !matches!(
            s.reason,
            SkipReason::NoDurableStorage | SkipReason::CachingDisabled
        ),
        "{s:?}"
    );
    s
}

/// Revision pinning and refresh: a floating revision's copy is one binding until a refresh; a
/// salt (the pod's `nvsnap.io/cache-salt`), the namespace's refresh label or a new window of the
/// maximum age downloads into another binding; a commit never refreshes; a pod joining a binding
/// whose download recorded its commit carries it.
#[test]
fn salts_refreshes_and_windows_pick_another_binding_and_joins_carry_the_pinned_commit() {
    use k8s_openapi::jiff::Timestamp;
    use warmcache_modelvolume::keys::{CACHE_SALT_ANNOTATION, REFRESH_LABEL, REVISION_ANNOTATION};

    let ctx = Ctx::default();
    let floating = engine_pod(); // Qwen/Qwen3-8B, no revision: main
    let base = ctx.rewrite(&floating, None);
    let base_name = base.plan.binding_name().to_owned();
    assert!(!base.plan.handle().to_string().contains("&salt="));

    // A salt: another copy; the same salt: the same copy.
    let mut salted = floating.clone();
    salted
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(CACHE_SALT_ANNOTATION.into(), "tag-moved-2026-12".into());
    let s1 = ctx.rewrite(&salted, None);
    assert_ne!(s1.plan.binding_name(), base_name);
    assert!(
        s1.plan
            .handle()
            .to_string()
            .ends_with("&salt=tag-moved-2026-12")
    );
    assert_eq!(
        ctx.rewrite(&salted, None).plan.binding_name(),
        s1.plan.binding_name()
    );
    let mut long = floating.clone();
    long.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(CACHE_SALT_ANNOTATION.into(), "x".repeat(254));
    let skip = ctx.skip(&long, None);
    assert_eq!(skip.reason, SkipReason::InvalidReference);
    assert!(
        skip.message.contains(CACHE_SALT_ANNOTATION),
        "{}",
        skip.message
    );

    // The administrator's refresh label: another copy of a floating revision only.
    let refreshed = Ctx {
        labels: BTreeMap::from([(REFRESH_LABEL.to_owned(), "2026-12-06".to_owned())]),
        ..Ctx::default()
    };
    let r1 = refreshed.rewrite(&floating, None);
    assert_ne!(r1.plan.binding_name(), base_name);
    assert!(
        r1.plan
            .handle()
            .to_string()
            .ends_with("&refresh=2026-12-06")
    );
    let sha = "0123456789abcdef0123456789abcdef01234567";
    let pinned_pod = pod(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: qwen}}
spec:
  containers:
    - name: vllm
      image: vllm/vllm-openai:v0.20.0
      args: [--model, Qwen/Qwen3-8B, --revision, {sha}]
      env:
        - {{name: HF_HOME, value: /models/hf}}
      resources:
        limits: {{nvidia.com/gpu: "1"}}
      volumeMounts:
        - {{name: m, mountPath: /models}}
  volumes:
    - {{name: m, emptyDir: {{}}}}
"#
    ));
    assert_eq!(
        refreshed.rewrite(&pinned_pod, None).plan.binding_name(),
        ctx.rewrite(&pinned_pod, None).plan.binding_name(),
        "a commit never refreshes"
    );

    // The maximum age: one binding per window, the same in every replica; none without a clock.
    let aged = Ctx {
        options: Options {
            floating_revision_max_age_seconds: Some(86_400),
            ..common::options(None)
        },
        ..Ctx::default()
    };
    let req = |c: &'_ Ctx, p: &'_ Pod| {
        plan(&Request {
            pod: p,
            namespace: &c.namespace,
            namespace_labels: &c.labels,
            leader_worker_set: None,
            traceparent: None,
            options: &c.options,
        })
        .unwrap()
    };
    let day = |d: i64| Timestamp::from_second(d * 86_400 + 3_600).unwrap();
    // One window per max age (shifted by the copy's own hash, so copies do not all refresh at
    // once): a max age later is always another window; of three consecutive seconds at least
    // two share one.
    let at = |t: Timestamp| req(&aged, &floating).at(t).binding_name().to_owned();
    let t0 = day(20_000);
    let second = k8s_openapi::jiff::SignedDuration::from_secs(1);
    let w1 = req(&aged, &floating).at(t0);
    assert_ne!(
        at(t0),
        at(t0 + k8s_openapi::jiff::SignedDuration::from_hours(24))
    );
    assert!(at(t0) == at(t0 + second) || at(t0 + second) == at(t0 + second + second));
    assert_ne!(w1.binding_name(), base_name);
    assert!(
        w1.handle().to_string().contains("&refresh=w"),
        "{}",
        w1.handle()
    );
    assert_eq!(
        req(&aged, &floating).at(Timestamp::MIN).binding_name(),
        base_name
    );
    assert_eq!(
        req(&aged, &pinned_pod).at(day(20_000)).binding_name(),
        ctx.rewrite(&pinned_pod, None).plan.binding_name(),
        "a commit has no window"
    );
    // The label and the window together.
    let both = Ctx {
        labels: refreshed.labels.clone(),
        ..aged
    };
    let wl = req(&both, &floating).at(day(20_000));
    assert!(
        wl.handle().to_string().contains("&refresh=2026-12-06.w"),
        "{}",
        wl.handle()
    );
    // Pods of a LeaderWorkerSet group get no window (a turn between leader and workers would
    // split them across commits).
    let mut member = floating.clone();
    member
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(LWS_NAME_LABEL.into(), "llm".into());
    let m = req(&both, &member).at(day(20_000));
    assert!(
        m.handle().to_string().ends_with("&refresh=2026-12-06"),
        "only the label: {}",
        m.handle()
    );

    // Joining a binding whose download recorded its commit: the reader carries it; a commit the
    // pod names itself is never kept.
    let mut stored = common::stored(&created(&base), Some(BindingPhase::Active), None);
    let mut forged = floating.clone();
    forged
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(REVISION_ANNOTATION.into(), "f".repeat(40));
    for binding in [None, Some(&stored)] {
        let r = ctx.rewrite(&forged, binding);
        assert!(
            !r.pod
                .metadata
                .annotations
                .as_ref()
                .unwrap()
                .contains_key(REVISION_ANNOTATION),
            "{binding:?}"
        );
    }
    let joined = ctx.rewrite(&floating, Some(&stored));
    assert!(
        !joined
            .pod
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .contains_key(REVISION_ANNOTATION)
    );
    stored.status.as_mut().unwrap().resolved_revision = Some(sha.into());
    let joined = ctx.rewrite(&floating, Some(&stored));
    assert_eq!(
        joined
            .pod
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .get(REVISION_ANNOTATION)
            .map(String::as_str),
        Some(sha)
    );
}

/// The seed's capture case in miniature: the engine pulls an NGC model by itself into an
/// emptyDir the main container mounts.
fn ngc_capture_pod() -> Pod {
    engine_with(
        &[],
        &[
            ("NGC_MODEL_NAME", "org/team/model:1"),
            ("NGC_MODEL_MOUNT", "/models/ngc"),
        ],
    )
}

#[test]
fn an_engine_download_no_job_can_reproduce_is_captured_until_its_cache_is_complete() {
    let ctx = Ctx::default();
    let original = ngc_capture_pod();

    // No binding: the pod is a capture source of a new binding, its spec untouched.
    let first = ctx.rewrite(&original, None);
    let wanted = created(&first);
    assert_eq!(
        first.pod.spec, original.spec,
        "a capture source keeps its own download"
    );
    let labels = first.pod.metadata.labels.clone().unwrap();
    assert_eq!(labels[CAPTURE_LABEL], "true");
    assert_eq!(labels[MODEL_LABEL].len(), 48);
    assert!(!labels.contains_key(ROLE_LABEL), "not a reader");
    assert!(!labels.contains_key(PENDING_LABEL));
    let a = first.pod.metadata.annotations.clone().unwrap();
    assert_eq!(a[CAPTURE_VOLUME_ANNOTATION], "m");
    assert_eq!(a[CAPTURE_PATH_ANNOTATION], "ngc");
    assert_eq!(
        a[HANDLE_ANNOTATION],
        "ngc://org/team/model:1?layout=ngc&fill=capture"
    );
    assert!(!a.contains_key(DOWNLOAD_STEP_ANNOTATION));
    assert_eq!(a[BINDING_ANNOTATION], first.plan.binding_name());
    assert!(first.plan.download_step().is_none());
    assert!(warmcache_modelvolume::is_capture_handle(
        &a[HANDLE_ANNOTATION]
    ));

    // The binding stored: the pod records its UID and is re-admitted unchanged.
    let stored = common::stored(&wanted, Some(BindingPhase::Active), None);
    let admitted = first.complete(&stored).unwrap();
    assert_eq!(
        admitted.metadata.annotations.as_ref().unwrap()[BINDING_UID_ANNOTATION],
        stored.metadata.uid.clone().unwrap()
    );
    assert!(matches!(ctx.admit(&admitted, None), Verdict::Unchanged(_)));

    // The binding exists and is not complete yet: the next pod joins as a capture source too.
    let joined = ctx.rewrite(&original, Some(&stored));
    assert!(matches!(joined.binding, BindingAction::Join { .. }));
    assert_eq!(joined.pod.spec, original.spec);
    assert_eq!(
        joined.pod.metadata.labels.as_ref().unwrap()[CAPTURE_LABEL],
        "true"
    );
    assert_eq!(
        joined.pod.metadata.annotations.as_ref().unwrap()[BINDING_UID_ANNOTATION],
        stored.metadata.uid.clone().unwrap()
    );

    // The copy is complete: later pods read it read-only and do not download.
    let complete = common::stored(&wanted, Some(BindingPhase::Active), Some(common::NAMESPACE));
    let reader = ctx.rewrite(&original, Some(&complete));
    let labels = reader.pod.metadata.labels.clone().unwrap();
    assert!(!labels.contains_key(CAPTURE_LABEL));
    assert_eq!(labels[ROLE_LABEL], "reader");
    let a = reader.pod.metadata.annotations.clone().unwrap();
    assert!(
        !a.contains_key(DOWNLOAD_STEP_ANNOTATION),
        "nothing a Job could run"
    );
    assert!(!a.contains_key(CAPTURE_VOLUME_ANNOTATION));
    let volume = model_volume(&reader.pod);
    assert_eq!(volume["persistentVolumeClaim"]["readOnly"], true);
    let spec = json(&reader.pod)["spec"].clone();
    let main_mount = spec["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == MODEL_VOLUME)
        .cloned()
        .unwrap();
    assert_eq!(main_mount["mountPath"], "/models/ngc");
    assert_eq!(main_mount["readOnly"], true);
    assert_eq!(spec["initContainers"][0]["name"], WAIT_CONTAINER);
    common::valid(&reader.pod).unwrap();
}

#[test]
fn an_engine_script_that_downloads_only_what_is_missing_is_a_capture_source() {
    // The shape engine start scripts have (and the e2e scenario's stand-in): the download goes
    // through the model's own variable, and is skipped when the files are there.
    let script = pod(r#"
apiVersion: v1
kind: Pod
metadata: {name: engine, labels: {app: llm}}
spec:
  securityContext: {runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, fsGroup: 65532}
  containers:
    - name: engine
      image: hf:1
      command:
        - sh
        - -c
        - set -e; if [ -f "$NGC_MODEL_MOUNT/llm/SHA256SUMS" ]; then echo present; else hf download demo/llm --local-dir "$NGC_MODEL_MOUNT/llm"; fi; cd "$NGC_MODEL_MOUNT/llm" && exec serve
      env:
        - {name: HF_ENDPOINT, value: "http://10.0.0.1:8080"}
        - {name: HOME, value: /tmp}
        - {name: NGC_MODEL_NAME, value: "demo/llm:1"}
        - {name: NGC_MODEL_MOUNT, value: /models/ngc}
      resources:
        limits: {nvidia.com/gpu: "1"}
      volumeMounts:
        - {name: models, mountPath: /models}
  volumes:
    - {name: models, emptyDir: {}}
"#);
    let r = Ctx::default().rewrite(&script, None);
    assert_eq!(r.plan.uri(), "ngc://demo/llm:1");
    let a = r.pod.metadata.annotations.as_ref().unwrap();
    assert_eq!(a[CAPTURE_VOLUME_ANNOTATION], "models");
    assert_eq!(a[CAPTURE_PATH_ANNOTATION], "ngc");
    assert_eq!(r.pod.spec, script.spec);
}

#[test]
fn a_capture_needs_an_empty_dir_a_clean_path_and_view_claims() {
    let ctx = Ctx::default();
    // The landing's volume is the customer's claim, not an emptyDir of the pod: left alone (the
    // landing is not substitutable either).
    let mut claim = ngc_capture_pod();
    claim.spec.as_mut().unwrap().volumes = Some(vec![
        serde_json::from_value(
            serde_json::json!({"name": "m", "persistentVolumeClaim": {"claimName": "models"}}),
        )
        .unwrap(),
    ]);
    assert!(matches!(ctx.admit(&claim, None), Verdict::Skip(_)));
    // Mounted through subPathExpr: the kubelet decides the path, the agent could not find it.
    let mut expr = ngc_capture_pod();
    expr.spec.as_mut().unwrap().containers[0]
        .volume_mounts
        .as_mut()
        .unwrap()[0]
        .sub_path_expr = Some("$(POD_NAME)".into());
    assert!(matches!(ctx.admit(&expr, None), Verdict::Skip(_)));
    // Block storage read through hostPath: no capture (readers would need the in-place fallback
    // a capture does not have).
    let host = Ctx {
        storage: "nvmesh".into(),
        options: common::options(Some("hostPath")),
        ..Ctx::default()
    };
    let s = host.skip(&ngc_capture_pod(), None);
    assert_eq!(s.reason, SkipReason::DownloadNotReproducible);
    assert!(s.message.contains("hostPath"), "{}", s.message);
    // The same block storage read through view claims captures.
    let pvc = Ctx {
        storage: "nvmesh".into(),
        ..Ctx::default()
    };
    let r = pvc.rewrite(&ngc_capture_pod(), None);
    assert_eq!(r.transition, Transition::RoxReadOnly);
    assert_eq!(
        r.pod.metadata.labels.as_ref().unwrap()[CAPTURE_LABEL],
        "true"
    );
}

#[test]
fn a_captured_copy_and_a_job_copy_of_one_artifact_are_two_caches() {
    let ctx = Ctx::default();
    // The init container's NGC download (a Job reproduces it) and the engine's own (captured)
    // of the same model version: different handles, so different bindings.
    let capture = ctx.rewrite(&ngc_capture_pod(), None);
    let mut init = ngc_capture_pod();
    let spec = init.spec.as_mut().unwrap();
    spec.containers[0].env = None;
    spec.init_containers = Some(vec![serde_json::from_value(serde_json::json!({
        "name": "dl",
        "image": "nvcr.io/nvidia/ngc-cli:3.41.4",
        "command": ["/bin/bash", "-c", "ngc registry model download-version --dest /models/ngc org/team/model:1"],
        "volumeMounts": [{"name": "m", "mountPath": "/models"}],
    }))
    .unwrap()]);
    spec.containers[0].env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
        name: "MODEL_PATH".into(),
        value: Some("/models/ngc".into()),
        value_from: None,
    }]);
    match ctx.admit(&init, None) {
        Verdict::Rewrite(job) => {
            assert_eq!(job.plan.uri(), capture.plan.uri());
            assert_ne!(job.plan.binding_name(), capture.plan.binding_name());
            assert!(job.plan.capture().is_none());
        }
        other => panic!("expected a rewrite, got {:?}", common::summary(&other)),
    }
}
