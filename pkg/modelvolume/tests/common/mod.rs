//! Shared test inputs: storage classes, catalogs, bindings, pods and the summary of a verdict the
//! fixture table compares against.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Map, Value, json};
use warmcache_api_modelcache::v2beta1::{
    BindingPhase, ModelCacheBinding, ModelCacheBindingStatus, PopulationState, ReadOnlyView,
    RealizedStorage,
};
use warmcache_catalog::{CatalogInput, Gates};
use warmcache_modelvolume::keys::{
    BINDING_ANNOTATION, CAPTURE_LABEL, CAPTURE_PATH_ANNOTATION, CAPTURE_VOLUME_ANNOTATION,
    DOWNLOAD_STEP_ANNOTATION, HANDLE_ANNOTATION, MODEL_VOLUME, PENDING_LABEL,
};
use warmcache_modelvolume::{
    BindingAction, DownloadStep, Options, ReaderMode, Request, StorageInputs, Verdict, admit,
};

pub const NAMESPACE: &str = "team-a";

pub fn storage_class(provisioner: &str) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some("nvcf-sc".into()),
            uid: Some("5f0c1f3e-8a59-4c2a-9d0e-1b2c3d4e5f60".into()),
            ..ObjectMeta::default()
        },
        provisioner: provisioner.into(),
        reclaim_policy: Some("Retain".into()),
        ..StorageClass::default()
    }
}

pub fn gates() -> Gates {
    Gates {
        caching_support: true,
        helm_model_caching: true,
        model_cache_encryption: false,
    }
}

/// The storage of a named test context: `weka` (ReadWriteMany, the default), `nvmesh`
/// (ReadWriteOnce + ReadOnlyMany), `lustre` (nothing qualified), `absent` (no nvcf-sc).
pub fn storage_class_for(storage: &str) -> Option<StorageClass> {
    match storage {
        "weka" => Some(storage_class("csi.weka.io")),
        "nvmesh" => Some(storage_class("nvmesh-csi.excelero.com")),
        "lustre" => Some(storage_class("lustre.csi.oraclecloud.com")),
        "absent" => None,
        other => panic!("unknown storage {other}"),
    }
}

pub fn inputs<'a>(sc: Option<&'a StorageClass>) -> StorageInputs<'a> {
    StorageInputs {
        storage_class: sc,
        csi_driver: None,
        catalog: CatalogInput::Absent,
        gates: gates(),
    }
}

/// Admit `pod` once with the given context; the binding lookup answers `binding`.
pub fn run(
    pod: &Pod,
    labels: &BTreeMap<String, String>,
    lws: Option<&warmcache_modelid::LeaderWorkerSet>,
    options: &Options,
    storage: &str,
    binding: Option<&ModelCacheBinding>,
) -> Verdict {
    let sc = storage_class_for(storage);
    let req = Request {
        pod,
        namespace: NAMESPACE,
        namespace_labels: labels,
        leader_worker_set: lws,
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        options,
    };
    admit(&req, |_, _| binding, &inputs(sc.as_ref()))
}

/// Admit `pod` once with the given context; the binding lookup answers each of `bindings` by
/// its name (a model's and a compile-cache set's).
pub fn run_named(
    pod: &Pod,
    labels: &BTreeMap<String, String>,
    options: &Options,
    storage: &str,
    bindings: &[&ModelCacheBinding],
) -> Verdict {
    let sc = storage_class_for(storage);
    let req = Request {
        pod,
        namespace: NAMESPACE,
        namespace_labels: labels,
        leader_worker_set: None,
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        options,
    };
    admit(
        &req,
        |_, name| {
            bindings
                .iter()
                .copied()
                .find(|b| b.metadata.name.as_deref() == Some(name))
        },
        &inputs(sc.as_ref()),
    )
}

/// A stored binding as the API server would return it: the created one with a UID, in
/// `phase` (None: no status yet), with a view in `view_ns` when given.
pub fn stored(
    wanted: &ModelCacheBinding,
    phase: Option<BindingPhase>,
    view_ns: Option<&str>,
) -> ModelCacheBinding {
    let mut b = wanted.clone();
    b.metadata.uid = Some("0d9c6c62-1111-4a2b-8c3d-000000000001".into());
    b.metadata.resource_version = Some("1".into());
    if phase.is_some() || view_ns.is_some() {
        b.status = Some(ModelCacheBindingStatus {
            phase,
            realized: view_ns.map(|ns| RealizedStorage {
                population_state: Some(PopulationState::Ready),
                views: vec![ReadOnlyView {
                    namespace: ns.into(),
                    persistent_volume_name: "ro-pv-1".into(),
                    persistent_volume_claim_name: "ro-pvc-1".into(),
                }],
                ..RealizedStorage::default()
            }),
            ..ModelCacheBindingStatus::default()
        });
    }
    b
}

fn env_of(c: &Value) -> Value {
    let mut m = Map::new();
    for e in c["env"].as_array().into_iter().flatten() {
        let v = match (&e["value"], &e["valueFrom"]) {
            (Value::String(s), _) => Value::String(s.clone()),
            (_, Value::Object(_)) => json!("<valueFrom>"),
            _ => json!(""),
        };
        m.insert(e["name"].as_str().unwrap_or_default().to_owned(), v);
    }
    Value::Object(m)
}

/// A summary of a verdict that fixtures compare against (only the keys an expectation names).
pub fn summary(v: &Verdict) -> Value {
    match v {
        Verdict::Skip(s) => json!({
            "verdict": "skip",
            "reason": s.reason.code(),
            "message": s.message,
            "event": s.reason.warrants_event(),
            "uri": s.uri,
        }),
        Verdict::Unchanged(u) => json!({"verdict": "unchanged", "binding": u.binding}),
        Verdict::Rewrite(r) => {
            let pod = serde_json::to_value(&r.pod).unwrap();
            let spec = &pod["spec"];
            let main = &spec["containers"][r.plan.main_container()];
            let mut mounts = Vec::new();
            for (kind, list) in [
                ("init", &spec["initContainers"]),
                ("container", &spec["containers"]),
            ] {
                for c in list.as_array().into_iter().flatten() {
                    for m in c["volumeMounts"].as_array().into_iter().flatten() {
                        if m["name"] == MODEL_VOLUME {
                            let mut o = json!({
                                "container": c["name"],
                                "kind": kind,
                                "path": m["mountPath"],
                                "readOnly": m["readOnly"],
                            });
                            if let Some(sp) = m.get("subPath") {
                                o["subPath"] = sp.clone();
                            }
                            mounts.push(o);
                        }
                    }
                }
            }
            let volume = spec["volumes"]
                .as_array()
                .and_then(|vs| vs.iter().find(|v| v["name"] == MODEL_VOLUME))
                .cloned()
                .unwrap_or(Value::Null);
            // A capture source (or a reader of a captured copy) records no step.
            let step = r
                .pod
                .metadata
                .annotations
                .as_ref()
                .unwrap()
                .get(DOWNLOAD_STEP_ANNOTATION)
                .map(|a| DownloadStep::from_annotation(a).unwrap());
            let annotations = r.pod.metadata.annotations.as_ref().unwrap();
            let labels = r.pod.metadata.labels.clone().unwrap_or_default();
            let inits: Vec<Value> = spec["initContainers"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| c["name"].clone())
                .collect();
            json!({
                "verdict": "rewrite",
                "binding": match r.binding { BindingAction::Join { .. } => "join", BindingAction::Create(_) => "create" },
                "transition": r.transition.as_str(),
                "readerMode": r.reader_mode.as_str(),
                "uri": r.plan.uri(),
                "handle": r.plan.handle().to_string(),
                "layout": r.plan.handle().layout().as_str(),
                "landing": r.plan.landing(),
                "offline": r.plan.offline(),
                "relanded": r.plan.relanded(),
                "downloader": r.plan.downloader().as_str(),
                "mainEnv": env_of(main),
                "initContainers": inits,
                "mounts": mounts,
                "volume": volume,
                "pending": r.pod.metadata.labels.as_ref().and_then(|l| l.get(PENDING_LABEL)).is_some(),
                "step": step.map(|step| json!({
                    "origin": serde_json::to_value(step.origin).unwrap(),
                    "source": step.source_container,
                    "image": step.container.image,
                    "command": step.container.command,
                    "args": step.container.args,
                    "dest": step.dest,
                    "landingVolume": step.landing_volume,
                    "env": env_of(&serde_json::to_value(&step.container).unwrap()),
                    "envFromPod": serde_json::to_value(&step.env_from_pod).unwrap(),
                })),
                "capture": labels.get(CAPTURE_LABEL).map(|l| json!({
                    "label": l,
                    "volume": annotations.get(CAPTURE_VOLUME_ANNOTATION),
                    "path": annotations.get(CAPTURE_PATH_ANNOTATION),
                })),
                "annotations": {
                    "binding": r.pod.metadata.annotations.as_ref().unwrap().get(BINDING_ANNOTATION),
                    "handle": r.pod.metadata.annotations.as_ref().unwrap().get(HANDLE_ANNOTATION),
                },
            })
        }
    }
}

/// Whether `got` contains `expect`: objects by the keys `expect` names (recursively), strings
/// ending in `*` by prefix, everything else by equality.
pub fn contains(expect: &Value, got: &Value) -> bool {
    match (expect, got) {
        (Value::Object(e), Value::Object(g)) => e.iter().all(|(k, v)| {
            g.get(k).is_some_and(|gv| contains(v, gv)) || (v.is_null() && !g.contains_key(k))
        }),
        (Value::String(e), Value::String(g))
            if e.len() > 1 && e.starts_with('*') && e.ends_with('*') =>
        {
            g.contains(&e[1..e.len() - 1])
        }
        (Value::String(e), Value::String(g)) if e.ends_with('*') => {
            g.starts_with(&e[..e.len() - 1])
        }
        (Value::String(e), Value::String(g)) if e.len() > 1 && e.starts_with('*') => {
            g.ends_with(&e[1..])
        }
        _ => expect == got,
    }
}

/// The options of a test context.
pub fn options(reader_mode: Option<&str>) -> Options {
    Options {
        reader_mode: match reader_mode {
            Some("hostPath") => ReaderMode::HostPath,
            _ => ReaderMode::Pvc,
        },
        webhook_namespace: Some("warmcache-system".into()),
        ..Options::default()
    }
}

/// What the API server's pod validation checks that a rewrite could break: unique container and
/// volume names, mounts of existing volumes, one mount per path and container, relative
/// sub-paths without `..`.
pub fn valid(p: &Pod) -> Result<(), String> {
    let spec = p.spec.as_ref().ok_or("no spec")?;
    let mut names = std::collections::BTreeSet::new();
    let all = || {
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
    };
    for c in all() {
        if !names.insert(c.name.clone()) {
            return Err(format!("container {} twice", c.name));
        }
    }
    let mut volumes = std::collections::BTreeSet::new();
    for v in spec.volumes.iter().flatten() {
        if !volumes.insert(v.name.clone()) {
            return Err(format!("volume {} twice", v.name));
        }
    }
    for c in all() {
        let mut paths = std::collections::BTreeSet::new();
        for m in c.volume_mounts.iter().flatten() {
            if !volumes.contains(&m.name) {
                return Err(format!("{} mounts missing volume {}", c.name, m.name));
            }
            if !paths.insert(m.mount_path.clone()) {
                return Err(format!("{} mounts {} twice", c.name, m.mount_path));
            }
            if let Some(sp) = &m.sub_path
                && (sp.starts_with('/') || sp.split('/').any(|x| x == ".."))
            {
                return Err(format!("subPath {sp}"));
            }
        }
    }
    Ok(())
}
