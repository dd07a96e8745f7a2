//! `webhook preview`: what admission would do to a pod, offline, with the same pure functions
//! (`warmcache_modelvolume::admit`) and the storage inputs given as files.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use serde_json::{Value, json};
use warmcache_api_modelcache::MODEL_CACHE_STORAGE_CLASS;
use warmcache_api_modelcache::v2beta1::ModelCacheBinding;
use warmcache_catalog::{CatalogFile, CatalogInput};
use warmcache_cli::args::InputFile;
use warmcache_cli::input::{self, Source};
use warmcache_cli::{text, yaml};
use warmcache_modelid::{LeaderWorkerSet, WorkloadError, decode, lws_from_object, pod_from_object};
use warmcache_modelvolume::{
    BindingAction, Options, Request, StorageInputs, Verdict, leader_worker_set_name,
};

use crate::Error;
use crate::options::RewriteArgs;

/// `webhook preview`.
#[derive(Debug, Args)]
pub struct PreviewArgs {
    /// The pod or workload manifest (YAML or JSON: one object, or a stream such as `helm
    /// template` output); `-` reads standard input.
    #[command(flatten)]
    pub input: InputFile,
    /// The storage capability catalog: the catalog document, or the ConfigMap manifest holding
    /// it.
    #[arg(long, value_name = "CATALOG.yaml")]
    pub catalog: PathBuf,
    /// The StorageClass nvcf-sc (`kubectl get storageclass nvcf-sc -o yaml`).
    #[arg(long = "storage-class", value_name = "SC.yaml")]
    pub storage_class: PathBuf,
    /// The CSIDriver named after its provisioner, when one is registered.
    #[arg(long, value_name = "CSIDRIVER.yaml")]
    pub csidriver: Option<PathBuf>,
    /// Labels of the pod's namespace, `key=value,...` (for example the sharing-domain label).
    #[arg(long = "namespace-labels", value_name = "k=v,...", value_parser = parse_labels, default_value = "")]
    pub namespace_labels: Labels,
    /// The ModelCacheBinding the cache would return for the pod's binding name (join instead of
    /// create; ignored for pods whose binding has another name).
    #[arg(long, value_name = "BINDING.yaml")]
    pub binding: Option<PathBuf>,
    /// The LeaderWorkerSet of a worker pod (also found in the input stream).
    #[arg(long, value_name = "LWS.yaml")]
    pub lws: Option<PathBuf>,
    /// The pod's namespace (default: the object's, else `default`).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// The webhook's namespace (never rewritten).
    #[arg(long = "webhook-namespace", value_name = "NS")]
    pub webhook_namespace: Option<String>,
    /// What the rewrite does (the same flags as `webhook serve`).
    #[command(flatten)]
    pub rewrite: RewriteArgs,
    /// A W3C traceparent to record, as the admission's span would.
    #[arg(long)]
    pub traceparent: Option<String>,
}

/// Namespace labels from the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Labels(pub BTreeMap<String, String>);

fn parse_labels(s: &str) -> Result<Labels, String> {
    let mut out = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = part.split_once('=') else {
            return Err(format!("{} is not key=value", text::shown(part)));
        };
        let k = k.trim();
        if k.is_empty() || k.chars().any(char::is_whitespace) {
            return Err(format!("{} is not a label key", text::shown(k)));
        }
        out.insert(k.to_owned(), v.trim().to_owned());
    }
    Ok(Labels(out))
}

fn input_error(path: &Path, message: impl Into<String>) -> Error {
    Error::Input {
        path: Source::of(path).name(),
        message: message.into(),
    }
}

fn read_object(path: &Path) -> Result<Value, Error> {
    let text = input::read(path)?;
    yaml::one_object(&text).map_err(|e| input_error(path, e.to_string()))
}

/// The single object of `path`, which must be of `kind` in `api_version`, decoded.
fn read_typed<T: serde::de::DeserializeOwned>(
    path: &Path,
    api_version: &str,
    kind: &str,
) -> Result<T, Error> {
    let v = read_object(path)?;
    let found_kind = v.get("kind").and_then(Value::as_str).unwrap_or_default();
    let found_api = v
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if found_kind != kind || found_api != api_version {
        return Err(input_error(
            path,
            format!(
                "kind: expected {api_version} {kind}, found {} {}",
                text::shown(found_api),
                text::shown(found_kind)
            ),
        ));
    }
    decode(&v, "").map_err(|e| input_error(path, e.to_string()))
}

/// Everything the command reads besides the pods.
struct Context {
    storage_class: StorageClass,
    csi_driver: Option<CSIDriver>,
    catalog: CatalogFile,
    binding: Option<ModelCacheBinding>,
    group: Option<LeaderWorkerSet>,
    options: Options,
}

fn context(args: &PreviewArgs, err: &mut dyn Write) -> Result<Context, Error> {
    input::stdin_at_most_once(&[
        ("-f", Some(&args.input.file)),
        ("--catalog", Some(&args.catalog)),
        ("--storage-class", Some(&args.storage_class)),
        ("--csidriver", args.csidriver.as_deref()),
        ("--binding", args.binding.as_deref()),
        ("--lws", args.lws.as_deref()),
    ])?;
    let catalog_text = input::read(&args.catalog)?;
    let catalog =
        CatalogFile::parse(&catalog_text).map_err(|e| input_error(&args.catalog, e.to_string()))?;
    let mut storage_class: StorageClass =
        read_typed(&args.storage_class, "storage.k8s.io/v1", "StorageClass")?;
    let name = storage_class.metadata.name.as_deref().unwrap_or_default();
    if name != MODEL_CACHE_STORAGE_CLASS {
        return Err(input_error(
            &args.storage_class,
            format!(
                "metadata.name: the model cache StorageClass is {MODEL_CACHE_STORAGE_CLASS:?}, found {}",
                text::shown(name)
            ),
        ));
    }
    if storage_class
        .metadata
        .uid
        .as_deref()
        .is_none_or(str::is_empty)
    {
        writeln!(
            err,
            "note: {} has no metadata.uid (it was not read from a cluster); the preview pins the placeholder uid \"preview\"",
            Source::of(&args.storage_class).name()
        )?;
        storage_class.metadata.uid = Some("preview".to_owned());
    }
    let csi_driver: Option<CSIDriver> = match &args.csidriver {
        Some(p) => {
            let d: CSIDriver = read_typed(p, "storage.k8s.io/v1", "CSIDriver")?;
            let found = d.metadata.name.as_deref().unwrap_or_default();
            if found != storage_class.provisioner {
                return Err(input_error(
                    p,
                    format!(
                        "metadata.name: the CSIDriver must be the one named after the provisioner {} of nvcf-sc, found {}",
                        text::shown(&storage_class.provisioner),
                        text::shown(found)
                    ),
                ));
            }
            Some(d)
        }
        None => None,
    };
    let binding: Option<ModelCacheBinding> = match &args.binding {
        Some(p) => Some(read_typed(
            p,
            warmcache_api_modelcache::v2beta1::API_VERSION,
            warmcache_api_modelcache::KIND,
        )?),
        None => None,
    };
    let group = match &args.lws {
        Some(p) => {
            let v = read_object(p)?;
            Some(lws_from_object(&v).map_err(|e| input_error(p, e.to_string()))?)
        }
        None => None,
    };
    let options = args
        .rewrite
        .options(args.webhook_namespace.clone())
        .map_err(|e| Error::Input {
            path: "options".to_owned(),
            message: e.to_string(),
        })?;
    Ok(Context {
        storage_class,
        csi_driver,
        catalog,
        binding,
        group,
        options,
    })
}

/// What one pod gives: the pod to print (YAML), or the skip report.
enum Answer {
    Pod(Box<Pod>),
    Skip(Value),
}

fn preview_one(
    args: &PreviewArgs,
    ctx: &Context,
    pod: &Pod,
    groups: &BTreeMap<String, LeaderWorkerSet>,
    err: &mut dyn Write,
) -> Result<Answer, Error> {
    let namespace = args
        .namespace
        .clone()
        .or_else(|| pod.metadata.namespace.clone())
        .unwrap_or_else(|| "default".to_owned());
    let group = match leader_worker_set_name(pod) {
        Some(name) => ctx
            .group
            .as_ref()
            .filter(|g| g.metadata.name.as_deref() == Some(name))
            .or_else(|| groups.get(name))
            .or(ctx.group.as_ref()),
        None => None,
    };
    let req = Request {
        pod,
        namespace: &namespace,
        namespace_labels: &args.namespace_labels.0,
        leader_worker_set: group,
        traceparent: args.traceparent.as_deref(),
        options: &ctx.options,
    };
    let storage = StorageInputs {
        storage_class: Some(&ctx.storage_class),
        csi_driver: ctx.csi_driver.as_ref(),
        catalog: CatalogInput::Loaded(&ctx.catalog.snapshot),
        gates: args.rewrite.feature_gates.0,
    };
    let lookup = |ns: &str, name: &str| {
        ctx.binding.as_ref().filter(|b| {
            b.metadata.name.as_deref() == Some(name)
                && b.metadata.namespace.as_deref().is_none_or(|n| n == ns)
        })
    };
    // The maximum age of floating revisions picks the binding by the current window; every
    // failure record is taken as holding, as `admit` does (no clock for those).
    let verdict = match warmcache_modelvolume::plan(&req) {
        Err(v) => v,
        Ok(plan) => {
            let plan = plan.at(k8s_openapi::jiff::Timestamp::now());
            let found = lookup(plan.binding_namespace(), plan.binding_name());
            let set = plan
                .cache_set()
                .and_then(|s| lookup(plan.binding_namespace(), s.binding_name()));
            let now = k8s_openapi::jiff::Timestamp::MIN;
            warmcache_modelvolume::decide(&req, plan, found, set, &storage, now)
        }
    };
    Ok(match verdict {
        Verdict::Rewrite(r) => {
            match &r.binding {
                BindingAction::Create(b) => writeln!(
                    err,
                    "note: admission would create ModelCacheBinding {}/{} ({} on {}, {} readers) and record its UID on the pod",
                    b.metadata.namespace.as_deref().unwrap_or_default(),
                    b.metadata.name.as_deref().unwrap_or_default(),
                    r.transition.as_str(),
                    b.spec.decision.provider,
                    r.reader_mode.as_str()
                )?,
                BindingAction::Join { name, .. } => {
                    writeln!(err, "note: the pod joins ModelCacheBinding {name}")?;
                }
            }
            if let Some(set) = r.plan.cache_set() {
                match &r.cache_set {
                    Some(BindingAction::Create(b)) => writeln!(
                        err,
                        "note: admission would create ModelCacheBinding {}/{} for the compile-cache set {} and record its UID on the pod",
                        b.metadata.namespace.as_deref().unwrap_or_default(),
                        b.metadata.name.as_deref().unwrap_or_default(),
                        set.handle()
                    )?,
                    Some(BindingAction::Join { name, .. }) => writeln!(
                        err,
                        "note: the pod joins ModelCacheBinding {name}, the compile-cache set {}",
                        set.handle()
                    )?,
                    None => writeln!(
                        err,
                        "note: the pod keeps its compile caches local: its set's binding ({}) cannot be joined or created now",
                        set.binding_name()
                    )?,
                }
            }
            Answer::Pod(Box::new(r.pod))
        }
        Verdict::Unchanged(u) => {
            writeln!(
                err,
                "note: the pod already reads ModelCacheBinding {} and is admitted unchanged",
                u.binding
            )?;
            Answer::Pod(Box::new(pod.clone()))
        }
        Verdict::Skip(s) => Answer::Skip(s.report()),
    })
}

fn pod_yaml(pod: &Pod) -> Result<String, Error> {
    serde_saphyr::to_string(pod).map_err(|e| Error::Yaml(e.to_string()))
}

/// Where a document of a stream came from.
fn object_ref(index: usize, doc: &Value) -> Value {
    crate::object_ref(index, doc)
}

/// `webhook preview`: print the rewritten pod (YAML) or the skip report (JSON) of the pod in
/// `args.input`, or one document per pod template of a stream.
pub fn preview(args: &PreviewArgs, out: &mut dyn Write, err: &mut dyn Write) -> Result<(), Error> {
    let ctx = context(args, err)?;
    let text = input::read(&args.input.file)?;
    let docs = yaml::documents(&text).map_err(|e| input_error(&args.input.file, e.to_string()))?;
    let path = Source::of(&args.input.file).name();
    match docs.as_slice() {
        [] => Err(input_error(&args.input.file, "no object in the input")),
        [doc] => {
            if !doc.is_object() {
                return Err(input_error(
                    &args.input.file,
                    "not a Kubernetes object (expected a mapping)",
                ));
            }
            let pod =
                pod_from_object(doc).map_err(|e| input_error(&args.input.file, e.to_string()))?;
            match preview_one(args, &ctx, &pod, &BTreeMap::new(), err)? {
                Answer::Pod(p) => out.write_all(pod_yaml(&p)?.as_bytes())?,
                Answer::Skip(report) => {
                    writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?
                }
            }
            Ok(())
        }
        docs => {
            let groups: BTreeMap<String, LeaderWorkerSet> = docs
                .iter()
                .filter_map(|d| lws_from_object(d).ok())
                .filter_map(|l| l.metadata.name.clone().map(|n| (n, l)))
                .collect();
            let mut entries = 0usize;
            let mut failed = 0usize;
            for (index, doc) in docs.iter().enumerate() {
                let object = object_ref(index, doc);
                let body = if !doc.is_object() {
                    failed += 1;
                    serde_json::to_string(
                        &json!({"object": object, "error": "not a Kubernetes object (expected a mapping)"}),
                    )?
                } else {
                    match pod_from_object(doc) {
                        Err(WorkloadError::UnsupportedKind { .. }) => continue,
                        Err(e) => {
                            failed += 1;
                            serde_json::to_string(
                                &json!({"object": object, "error": text::escape(&text::bounded(&e.to_string(), 4096))}),
                            )?
                        }
                        Ok(pod) => match preview_one(args, &ctx, &pod, &groups, err)? {
                            Answer::Pod(p) => pod_yaml(&p)?,
                            Answer::Skip(report) => {
                                serde_json::to_string(&json!({"object": object, "skip": report}))?
                            }
                        },
                    }
                };
                entries += 1;
                out.write_all(b"---\n")?;
                out.write_all(body.as_bytes())?;
                if !body.ends_with('\n') {
                    out.write_all(b"\n")?;
                }
            }
            if failed > 0 {
                return Err(Error::Documents {
                    path,
                    count: failed,
                });
            }
            if entries == 0 {
                return Err(Error::Input {
                    path,
                    message: format!(
                        "none of the {} documents has a pod template (expected Pod, Deployment, StatefulSet, ReplicaSet, DaemonSet, Job, CronJob or LeaderWorkerSet)",
                        docs.len()
                    ),
                });
            }
            Ok(())
        }
    }
}
