//! From a pod to a plan: scope, identity, sharing domain, layout, the safety checks, where the
//! copy goes in every container, the environment the engine needs and the download step. No
//! storage input is read here, so the caller can look the binding up by the plan's name.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvFromSource, EnvVar, Pod, VolumeMount};
use warmcache_api_modelcache::names::binding_name_of_hash;
use warmcache_api_modelcache::v2beta1::BindingIdentity;
use warmcache_api_modelcache::{binding_name, identity_hash};
use warmcache_cli::text::shown;
use warmcache_modelid::paths::{clean, is_within, join, strip_dir};
use warmcache_modelid::{
    DEFAULT_HF_HOME, Downloader, LandingKind, LeaderWorkerSet, RELANDED_HF_HOME, Resolution,
    Scheme, Source, landing_in, resolve_container,
};

use crate::cacheset::{self, CacheSet};
use crate::handle::{CacheHandle, Layout};
use crate::identify::identify;
use crate::keys::{
    BINDING_ANNOTATION, CACHE_SALT_ANNOTATION, HANDLE_ANNOTATION, MAX_SALT_BYTES, MODEL_VOLUME,
    REFRESH_LABEL, SCRATCH_PATH, SCRATCH_VOLUME, SEED_CONTAINER, SEED_MOUNT_PATH, SEED_VOLUME,
    WAIT_CONTAINER, WAIT_MOUNT_PATH,
};
use crate::options::Options;
use crate::safety::{extra_repositories, landing_shared};
use crate::scope::{SharingDomain, in_scope, sharing_domain};
use crate::skip::{Skip, SkipReason};
use crate::step::{self, DownloadStep, StepOrigin};
use crate::words::{
    EnvValue, container_words, env_value, flag_values, has_flag, references, script_assignments,
};

/// One admission: the pod and everything about its namespace the rewrite depends on.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The pod as admitted.
    pub pod: &'a Pod,
    /// The namespace of the request (the pod's `metadata.namespace` may be unset on create).
    pub namespace: &'a str,
    /// The labels of that namespace.
    pub namespace_labels: &'a BTreeMap<String, String>,
    /// The LeaderWorkerSet named by the pod's `leaderworkerset.sigs.k8s.io/name` label, when the
    /// pod is a worker ([`crate::leader_worker_set_name`]); `None` otherwise or when not found.
    pub leader_worker_set: Option<&'a LeaderWorkerSet>,
    /// The W3C `traceparent` of the admission's span; recorded when well formed.
    pub traceparent: Option<&'a str>,
    /// The options.
    pub options: &'a Options,
}

/// Which container of the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// `spec.containers[i]`.
    Container(usize),
    /// `spec.initContainers[i]`.
    Init(usize),
}

/// One place the shared copy is mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) slot: Slot,
    /// The mount path.
    pub(crate) path: String,
    /// The index of the mount it replaces (same path), or `None` to add one.
    pub(crate) replace: Option<usize>,
    /// The part of the copy mounted (when the container mounts a part of the landing).
    pub(crate) sub_path: Option<String>,
}

/// An in-place download for hostPath readers.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fallback {
    pub(crate) argv: Vec<String>,
    pub(crate) env: Vec<EnvVar>,
    pub(crate) env_from: Option<Vec<EnvFromSource>>,
    pub(crate) mounts: Vec<VolumeMount>,
    pub(crate) dest: String,
    pub(crate) working_dir: Option<String>,
}

/// What the wait container stands in for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WaitSource {
    pub(crate) image: String,
    pub(crate) image_pull_policy: Option<String>,
    pub(crate) user: i64,
    pub(crate) group: Option<i64>,
    pub(crate) fallback: Option<Fallback>,
}

/// A pod whose engine downloads, by its own script, an artifact no writer Job can reproduce,
/// into an emptyDir: where that download lands, for the node agent to capture once the pod is
/// Ready ([`crate::keys::CAPTURE_LABEL`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capture {
    /// The pod's emptyDir volume holding the landing.
    pub volume: String,
    /// The landing inside it: relative, `/`-separated, no `.` or `..` (empty: the root).
    pub path: String,
}

/// Everything the rewrite of one pod needs, decided from the pod and its namespace alone.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub(crate) namespace: String,
    pub(crate) control_namespace: String,
    pub(crate) sharing: SharingDomain,
    pub(crate) identity: BindingIdentity,
    pub(crate) binding_name: String,
    pub(crate) hash: String,
    pub(crate) handle: CacheHandle,
    pub(crate) uri: String,
    pub(crate) source: String,
    pub(crate) downloader: Downloader,
    pub(crate) main: usize,
    pub(crate) landing: String,
    pub(crate) targets: Vec<Target>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) scratch: bool,
    pub(crate) offline: bool,
    pub(crate) relanded: bool,
    pub(crate) replace_init: Option<usize>,
    pub(crate) wait: WaitSource,
    /// The download step a writer Job runs; `None` for a capture source ([`Plan::capture`]).
    pub(crate) step: Option<DownloadStep>,
    pub(crate) step_json: Option<String>,
    /// Where a capture source's own download lands, when no writer Job can reproduce it.
    pub(crate) capture: Option<Capture>,
    /// The pod's compile-cache set, when sets are on and the pod can have one.
    pub(crate) cache_set: Option<CacheSet>,
    pub(crate) traceparent: Option<String>,
    /// The namespace's refresh label ([`crate::keys::REFRESH_LABEL`]), for [`Plan::at`].
    pub(crate) refresh_label: Option<String>,
    /// The maximum age of floating revisions, for [`Plan::at`].
    pub(crate) max_age_seconds: Option<u64>,
}

impl Plan {
    /// The plan at `now`: with a maximum age of floating revisions configured, a floating
    /// identity's handle gets the window `w<unix seconds / max age>`, so every admission in one
    /// window reads one copy and the first admission of the next downloads a new one (the old
    /// binding idles out by the reaper's rules). Unchanged without a maximum age, for a commit,
    /// or without a clock ([`k8s_openapi::jiff::Timestamp::MIN`], as `admit` passes).
    pub fn at(mut self, now: k8s_openapi::jiff::Timestamp) -> Plan {
        let Some(max_age) = self.max_age_seconds.filter(|s| *s > 0) else {
            return self;
        };
        if now == k8s_openapi::jiff::Timestamp::MIN {
            return self;
        }
        // Each copy's windows are shifted by its own hash, so the copies of a cluster do not all
        // refresh (download again) at the same instant.
        let offset =
            u64::from_str_radix(self.hash.get(..12).unwrap_or_default(), 16).unwrap_or(0) % max_age;
        let seconds = u64::try_from(now.as_second()).unwrap_or(0);
        let window = format!("w{}", seconds.saturating_add(offset) / max_age);
        let label = self.refresh_label.clone().unwrap_or_default();
        self.handle = self.handle.with_refresh(&[&label, &window]);
        self.identity = BindingIdentity::new(
            self.sharing.workflow,
            &self.sharing.domain,
            &self.handle.to_string(),
        );
        self.binding_name = binding_name(&self.identity);
        self.hash = identity_hash(&self.identity);
        self.cache_set = self
            .cache_set
            .map(|set| set.for_model(&self.handle, &self.sharing));
        self
    }

    /// What the model's binding is made for and joined by.
    pub(crate) fn binding_target(&self) -> crate::binding::BindingTarget<'_> {
        crate::binding::BindingTarget {
            identity: &self.identity,
            name: &self.binding_name,
            control_namespace: &self.control_namespace,
            namespace: &self.namespace,
            sharing: &self.sharing,
            handle: self.handle.to_string(),
            traceparent: self.traceparent.as_deref(),
        }
    }

    /// The name of the binding the pod reads (`model-cache-<hash>`).
    pub fn binding_name(&self) -> &str {
        &self.binding_name
    }

    /// The namespace bindings live in (the control namespace).
    pub fn binding_namespace(&self) -> &str {
        &self.control_namespace
    }

    /// The binding's identity (workflow and digests of sharing domain and cache handle).
    pub fn identity(&self) -> &BindingIdentity {
        &self.identity
    }

    /// The workflow and raw sharing domain.
    pub fn sharing_domain(&self) -> &SharingDomain {
        &self.sharing
    }

    /// The cache handle.
    pub fn handle(&self) -> &CacheHandle {
        &self.handle
    }

    /// The model identity URI.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The index of the main container (`spec.containers[i]`).
    pub fn main_container(&self) -> usize {
        self.main
    }

    /// Where the main container reads the copy.
    pub fn landing(&self) -> &str {
        &self.landing
    }

    /// Who downloaded before the rewrite.
    pub fn downloader(&self) -> Downloader {
        self.downloader
    }

    /// Whether the engine is started offline.
    pub fn offline(&self) -> bool {
        self.offline
    }

    /// Whether the landing was moved (a shared `HF_HOME` re-landed at `/opt/nvsnap/hf`, or the
    /// engine's default cache re-landed by `warmcache_modelid`).
    pub fn relanded(&self) -> bool {
        self.relanded
    }

    /// The download step the writer Job runs; `None` for a capture source.
    pub fn download_step(&self) -> Option<&DownloadStep> {
        self.step.as_ref()
    }

    /// Where a capture source's own download lands; `None` when a writer Job downloads.
    pub fn capture(&self) -> Option<&Capture> {
        self.capture.as_ref()
    }

    /// The pod's compile-cache set; `None` when sets are off or the pod cannot have one.
    pub fn cache_set(&self) -> Option<&CacheSet> {
        self.cache_set.as_ref()
    }
}

/// A W3C `traceparent`: `version-traceid-parentid-flags` with 2, 32, 16 and 2 lower-case hex
/// digits, neither id all zeros, version not `ff`.
pub fn well_formed_traceparent(v: &str) -> bool {
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let parts: Vec<&str> = v.split('-').collect();
    let [version, trace, parent, flags] = parts.as_slice() else {
        return false;
    };
    hex(version, 2)
        && *version != "ff"
        && hex(trace, 32)
        && trace.bytes().any(|b| b != b'0')
        && hex(parent, 16)
        && parent.bytes().any(|b| b != b'0')
        && hex(flags, 2)
}

fn annotation<'p>(pod: &'p Pod, key: &str) -> Option<&'p str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The verdict on a pod that already carries a rewrite: unchanged when it was made for this
/// namespace's sharing domain, else `rewritten-elsewhere`.
fn already_rewritten(pod: &Pod, sharing: &SharingDomain, recorded: &str) -> crate::Verdict {
    if let Some(handle) = annotation(pod, HANDLE_ANNOTATION) {
        let identity = BindingIdentity::new(sharing.workflow, &sharing.domain, handle);
        if binding_name(&identity) == recorded {
            return crate::Verdict::Unchanged(crate::Unchanged {
                binding: recorded.to_owned(),
            });
        }
    }
    crate::Verdict::Skip(Skip::new(
        SkipReason::RewrittenElsewhere,
        format!(
            "metadata.annotations[{BINDING_ANNOTATION}]: the pod already reads binding {} and was not rewritten for sharing domain {} ({}); it was probably copied from a pod of another namespace: recreate it from its original template",
            shown(recorded),
            shown(&sharing.domain),
            sharing.workflow.as_str()
        ),
    ))
}

/// A variable as a container's process sees it: the last script assignment, else its env.
fn defined(c: &Container, name: &str) -> Option<EnvValue> {
    if let Some((_, v)) = script_assignments(c, &[name]).pop() {
        return Some(if v.contains('$') {
            EnvValue::Unknown
        } else {
            EnvValue::Literal(v)
        });
    }
    match env_value(c, name) {
        Some(EnvValue::Literal(v)) if v.is_empty() => None,
        other => other,
    }
}

/// The layout an engine's own Hugging Face download writes, and the path that defines it
/// (`None`: the engine default).
fn engine_layout(c: &Container) -> (Layout, Option<EnvValue>) {
    let words = container_words(c);
    if let Some(v) = flag_values(&words, &["--download-dir", "--download_dir"]).pop() {
        return (
            Layout::HubCache,
            Some(v.map_or(EnvValue::Unknown, EnvValue::Literal)),
        );
    }
    if let Some(v) = defined(c, "HF_HOME") {
        return (Layout::Hub, Some(v));
    }
    for name in ["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"] {
        if let Some(v) = defined(c, name) {
            return (Layout::HubCache, Some(v));
        }
    }
    (Layout::Hub, None)
}

/// The layout a recognised download writes.
fn layout_of(source: Source, download: &Container, identity_scheme: Scheme) -> Layout {
    match source {
        Source::InitHfDownload => {
            let words = container_words(download);
            if has_flag(&words, &["--local-dir"]) {
                Layout::Flat
            } else if has_flag(&words, &["--cache-dir"]) {
                Layout::HubCache
            } else if defined(download, "HF_HOME").is_some() {
                Layout::Hub
            } else if defined(download, "HF_HUB_CACHE").is_some() {
                Layout::HubCache
            } else {
                Layout::Hub
            }
        }
        Source::KServeStorageInitializer | Source::InitS3 | Source::InitGs => Layout::Flat,
        Source::InitNgcCli | Source::InitNgcEnv | Source::EnvNgcModelName => Layout::Ngc,
        Source::EnvNimModelName | Source::NimImage => Layout::Nim,
        Source::ModelFlag
        | Source::VllmServe
        | Source::EnvHfModelId
        | Source::EnvModelId
        | Source::EnvModelPath => {
            if identity_scheme == Scheme::Hf {
                engine_layout(download).0
            } else {
                Layout::Flat
            }
        }
    }
}

/// `/`-rooted path of `path` (in container `c`'s view) inside volume `volume`: through the
/// longest mount of `volume` at or above it.
fn in_volume(c: &Container, volume: &str, path: &str) -> Option<String> {
    let (m, mount_path) = c
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| m.name == volume && m.sub_path_expr.as_deref().is_none_or(str::is_empty))
        .map(|m| (m, clean(&m.mount_path)))
        .filter(|(_, p)| is_within(path, p))
        .max_by_key(|(_, p)| p.len())?;
    let rel = strip_dir(path, &mount_path)?;
    Some(join(&sub_root(m), rel))
}

/// A mount's `subPath` as a `/`-rooted path (`/` for none).
fn sub_root(m: &VolumeMount) -> String {
    clean(&format!("/{}", m.sub_path.as_deref().unwrap_or_default()))
}

/// Where init container `init` wrote the landing (`landing_path` in `main`'s view, in pod
/// volume `volume`): its own path, and the volume when it mounts it there.
fn init_dest(
    main: &Container,
    init: &Container,
    landing_path: &str,
    volume: Option<&str>,
) -> (String, Option<String>) {
    let Some(v) = volume else {
        return (landing_path.to_owned(), None);
    };
    let Some(s) = in_volume(main, v, landing_path) else {
        return (landing_path.to_owned(), None);
    };
    init.volume_mounts
        .iter()
        .flatten()
        .filter(|m| m.name == v && m.sub_path_expr.as_deref().is_none_or(str::is_empty))
        .filter_map(|m| {
            let root = sub_root(m);
            let rel = strip_dir(&s, &root)?;
            Some((root.len(), join(&m.mount_path, rel)))
        })
        .max_by_key(|(len, _)| *len)
        .map_or((landing_path.to_owned(), None), |(_, p)| {
            (p, Some(v.to_owned()))
        })
}

fn slot_container(pod: &Pod, slot: Slot) -> Option<&Container> {
    let spec = pod.spec.as_ref()?;
    match slot {
        Slot::Container(i) => spec.containers.get(i),
        Slot::Init(i) => spec.init_containers.as_ref()?.get(i),
    }
}

fn slot_path(slot: Slot) -> String {
    match slot {
        Slot::Container(i) => format!("spec.containers[{i}]"),
        Slot::Init(i) => format!("spec.initContainers[{i}]"),
    }
}

/// Every place the copy is mounted: the main container at the landing, and every other
/// container that sees the landing's volume there (read-only mounts only: a container that
/// mounts it writable would write where the copy is read-only).
fn targets(
    pod: &Pod,
    main: usize,
    landing: &str,
    volume: Option<&str>,
    skip_init: Option<usize>,
) -> Result<Vec<Target>, Skip> {
    let spec = pod.spec.as_ref();
    let Some(v) = volume else {
        let replace = spec.and_then(|s| s.containers.get(main)).and_then(|c| {
            c.volume_mounts
                .iter()
                .flatten()
                .position(|m| clean(&m.mount_path) == landing)
        });
        return Ok(vec![Target {
            slot: Slot::Container(main),
            path: landing.to_owned(),
            replace,
            sub_path: None,
        }]);
    };
    let main_c = spec.and_then(|s| s.containers.get(main)).ok_or_else(|| {
        Skip::new(
            SkipReason::NoDownloader,
            "spec.containers: no main container",
        )
    })?;
    let s = in_volume(main_c, v, landing).ok_or_else(|| {
        Skip::new(
            SkipReason::LandingUnknown,
            format!(
                "spec.containers[{main}].volumeMounts: the main container does not mount volume {} at {}",
                shown(v),
                shown(landing)
            ),
        )
    })?;
    let mut slots: Vec<Slot> = (0..spec.map_or(0, |s| s.containers.len()))
        .map(Slot::Container)
        .collect();
    slots.extend(
        (0..spec
            .and_then(|s| s.init_containers.as_ref())
            .map_or(0, Vec::len))
            .filter(|i| Some(*i) != skip_init)
            .map(Slot::Init),
    );
    let mut out = Vec::new();
    for slot in slots {
        let Some(c) = slot_container(pod, slot) else {
            continue;
        };
        for (mi, m) in c.volume_mounts.iter().flatten().enumerate() {
            if m.name != v {
                continue;
            }
            let root = sub_root(m);
            let (path, replace, sub_path) = if let Some(rel) = strip_dir(&s, &root) {
                let path = join(&m.mount_path, rel);
                let replace = if rel.is_empty() {
                    Some(mi)
                } else {
                    c.volume_mounts
                        .iter()
                        .flatten()
                        .position(|x| clean(&x.mount_path) == path)
                };
                (path, replace, None)
            } else if let Some(part) = strip_dir(&root, &s) {
                (clean(&m.mount_path), Some(mi), Some(part.to_owned()))
            } else {
                continue;
            };
            if m.sub_path_expr.as_deref().is_some_and(|e| !e.is_empty()) {
                return Err(Skip::new(
                    SkipReason::LandingShared,
                    format!(
                        "{}.volumeMounts[{mi}].subPathExpr: container {} mounts the landing's volume {} through a path only the kubelet knows",
                        slot_path(slot),
                        shown(&c.name),
                        shown(v)
                    ),
                ));
            }
            if slot != Slot::Container(main) && m.read_only != Some(true) {
                return Err(Skip::new(
                    SkipReason::LandingShared,
                    format!(
                        "{}.volumeMounts[{mi}]: container {} mounts the landing's volume {} writable at {}; the shared copy is read-only",
                        slot_path(slot),
                        shown(&c.name),
                        shown(v),
                        shown(&m.mount_path)
                    ),
                ));
            }
            out.push(Target {
                slot,
                path,
                replace,
                sub_path,
            });
        }
    }
    if !out.iter().any(|t| t.slot == Slot::Container(main)) {
        return Err(Skip::new(
            SkipReason::LandingUnknown,
            format!(
                "spec.containers[{main}].volumeMounts: the landing {} is not placed in the main container",
                shown(landing)
            ),
        ));
    }
    Ok(out)
}

/// The cache variables (and offline switches) an engine reading a hub-layout copy at
/// `landing` gets: every variable Hugging Face libraries honour, so none the image sets
/// (older TGI images set `HUGGINGFACE_HUB_CACHE`) points elsewhere.
pub(crate) fn hub_env(layout: Layout, landing: &str) -> Vec<(String, String)> {
    let hub = if layout == Layout::Hub {
        join(landing, "hub")
    } else {
        landing.to_owned()
    };
    let mut env = Vec::new();
    if layout == Layout::Hub {
        env.push(("HF_HOME".to_owned(), landing.to_owned()));
    }
    for name in [
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "TRANSFORMERS_CACHE",
    ] {
        env.push((name.to_owned(), hub.clone()));
    }
    for name in OFFLINE_ENV {
        env.push((name.to_owned(), "1".to_owned()));
    }
    env
}

/// The switches that start Hugging Face libraries (vLLM, SGLang, TGI, KServe, transformers)
/// offline.
pub const OFFLINE_ENV: [&str; 2] = ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"];

/// Cache variables whose values the rewrite may set; a script that assigns one differently
/// would undo it.
const CACHE_VARIABLES: [&str; 7] = [
    "HF_HOME",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "TRANSFORMERS_CACHE",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "NIM_CACHE_PATH",
];

fn same_value(name: &str, a: &str, b: &str) -> bool {
    if name.ends_with("OFFLINE") {
        let t = |v: &str| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            )
        };
        return t(a) == t(b);
    }
    clean(a.trim()) == clean(b.trim())
}

/// Whether `main` reads the Hugging Face cache at or below `landing`.
fn reads_hub_at(main: &Container, landing: &str) -> bool {
    ["HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE"]
        .iter()
        .any(|n| matches!(defined(main, n), Some(EnvValue::Literal(v)) if v.starts_with('/') && is_within(&clean(&v), landing)))
}

/// Where `main`'s Hugging Face libraries would put another repository.
fn hub_dir(main: &Container) -> Option<String> {
    for n in ["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"] {
        match defined(main, n) {
            Some(EnvValue::Literal(v)) => return Some(clean(&v)),
            Some(EnvValue::Unknown) => return None,
            None => {}
        }
    }
    match defined(main, "HF_HOME") {
        Some(EnvValue::Literal(v)) => Some(join(&v, "hub")),
        Some(EnvValue::Unknown) => None,
        None => Some(join(DEFAULT_HF_HOME, "hub")),
    }
}

fn effective_user(pod: &Pod, c: &Container, options: &Options) -> (i64, Option<i64>) {
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let sc = c.security_context.as_ref();
    let user = sc
        .and_then(|s| s.run_as_user)
        .or_else(|| pod_sc.and_then(|s| s.run_as_user));
    let group = sc
        .and_then(|s| s.run_as_group)
        .or_else(|| pod_sc.and_then(|s| s.run_as_group));
    match user {
        Some(u) if u > 0 => (u, group),
        _ => (options.fallback_user, group.or(Some(options.fallback_user))),
    }
}

/// The mounts of `init` other than those of `volume` at, above or below `dest`.
fn other_mounts(init: &Container, volume: Option<&str>, dest: &str) -> Vec<VolumeMount> {
    init.volume_mounts
        .iter()
        .flatten()
        .filter(|m| {
            let p = clean(&m.mount_path);
            !(Some(m.name.as_str()) == volume && (is_within(dest, &p) || is_within(&p, dest)))
                && p != dest
        })
        .cloned()
        .collect()
}

/// Decide everything about `req` that does not depend on storage.
///
/// # Errors
///
/// The final verdict when there is nothing to plan: a [`crate::Verdict::Skip`], or
/// [`crate::Verdict::Unchanged`] for a pod that already carries this namespace's rewrite.
pub fn plan(req: &Request<'_>) -> Result<Plan, crate::Verdict> {
    let skip = crate::Verdict::Skip;
    let pod = req.pod;
    let options = req.options;
    let main = in_scope(pod, req.namespace, req.namespace_labels, options).map_err(skip)?;
    let sharing = sharing_domain(req.namespace, req.namespace_labels);
    if let Some(recorded) = annotation(pod, BINDING_ANNOTATION) {
        return Err(already_rewritten(pod, &sharing, recorded));
    }
    let identified = identify(pod, main, req.leader_worker_set).map_err(skip)?;
    let res: Resolution = identified.resolution;
    let uri = res.identity.uri();
    let fail = |s: Skip| crate::Verdict::Skip(s.with_uri(uri.clone()));
    inner_plan(req, sharing, res, identified.endpoints).map_err(fail)
}

fn inner_plan(
    req: &Request<'_>,
    sharing: SharingDomain,
    res: Resolution,
    endpoints: Vec<String>,
) -> Result<Plan, Skip> {
    let pod = req.pod;
    let options = req.options;
    let uri = res.identity.uri();
    if res.identity.scheme() == Scheme::Path {
        return Err(Skip::new(
            SkipReason::LocalPath,
            format!(
                "the model {} is a path already in the pod; nothing is downloaded",
                shown(&uri)
            ),
        ));
    }
    if !res.landing.substitutable {
        let why = res.landing.nested.clone().unwrap_or_else(|| {
            format!(
                "the model lands in {} ({}), storage the pod brings itself; it is already shared or node-local",
                res.landing
                    .volume
                    .as_deref()
                    .map_or_else(|| "the container".to_owned(), |v| format!("volume {}", shown(v))),
                res.landing.kind.as_str()
            )
        });
        return Err(Skip::new(SkipReason::LandingNotSubstitutable, why));
    }
    if res.source == Source::NimImage && res.identity.profile().is_none() {
        return Err(Skip::new(
            SkipReason::NimProfileUnpinned,
            format!(
                "spec.containers[{}].env: the NIM {} has no NIM_MODEL_PROFILE; the profile it downloads depends on the GPU model and count of the node it lands on, so one cache cannot stand for every pod of it: set NIM_MODEL_PROFILE (list-model-profiles shows them)",
                res.main_index,
                shown(res.identity.reference())
            ),
        ));
    }
    let spec = pod
        .spec
        .as_ref()
        .ok_or_else(|| Skip::new(SkipReason::NoDownloader, "spec: the pod has no spec"))?;
    let main = res.main_index;
    let main_path = format!("spec.containers[{main}]");
    let main_c = spec.containers.get(main).ok_or_else(|| {
        Skip::new(
            SkipReason::NoDownloader,
            "spec.containers: no main container",
        )
    })?;
    let leader_pod = match (res.via_leader, req.leader_worker_set) {
        (true, Some(lws)) => Some(lws.leader_pod()),
        (true, None) => {
            return Err(Skip::new(
                SkipReason::LeaderWorkerSetMissing,
                "the pod names its leader's model and the LeaderWorkerSet is missing",
            ));
        }
        (false, _) => None,
    };
    // The container that downloads (or the engine whose settings decide the layout).
    let (download_pod, download_c): (&Pod, &Container) =
        match (&leader_pod, res.downloader, res.init_index) {
            (Some(lp), Downloader::Init, Some(i)) => (
                lp,
                lp.spec
                    .as_ref()
                    .and_then(|s| s.init_containers.as_ref())
                    .and_then(|ic| ic.get(i))
                    .ok_or_else(|| {
                        Skip::new(
                            SkipReason::LeaderUnresolved,
                            "the leader template's download init container is missing",
                        )
                    })?,
            ),
            (Some(lp), _, _) => (
                lp,
                lp.spec
                    .as_ref()
                    .and_then(|s| s.containers.first())
                    .ok_or_else(|| {
                        Skip::new(
                            SkipReason::LeaderUnresolved,
                            "the leader template has no container",
                        )
                    })?,
            ),
            (None, Downloader::Init, Some(i)) => (
                pod,
                spec.init_containers
                    .as_ref()
                    .and_then(|ic| ic.get(i))
                    .ok_or_else(|| {
                        Skip::new(
                            SkipReason::NoDownloader,
                            "the download init container is missing",
                        )
                    })?,
            ),
            (None, _, _) => (pod, main_c),
        };
    let engine = res.downloader == Downloader::Engine;
    let modelid_relanded = res.landing.relanded_from.is_some();
    let mut layout = layout_of(res.source, download_c, res.identity.scheme());
    // The engine's cache location must be the landing the resolver placed: otherwise what the
    // rewrite sets and what the engine reads could differ.
    if engine && layout.is_hub() {
        let expected = match engine_layout(download_c).1 {
            None => Some(DEFAULT_HF_HOME.to_owned()),
            Some(EnvValue::Literal(v)) if v.starts_with('/') => Some(clean(&v)),
            Some(_) => None,
        };
        let placed = match &leader_pod {
            Some(lp) => match resolve_container(lp, 0) {
                warmcache_modelid::Outcome::Resolved(l) => {
                    Some(l.landing.relanded_from.unwrap_or(l.landing.path))
                }
                warmcache_modelid::Outcome::Unresolved(_) => None,
            },
            None => Some(
                res.landing
                    .relanded_from
                    .clone()
                    .unwrap_or_else(|| res.landing.path.clone()),
            ),
        };
        if expected.is_none() || expected != placed.map(|p| clean(&p)) {
            return Err(Skip::new(
                SkipReason::LandingUnknown,
                format!(
                    "{}: where the engine keeps its Hugging Face cache could not be confirmed against the landing {} (the variable or option that sets it is relative or not literal)",
                    if leader_pod.is_some() {
                        "the leader template".to_owned()
                    } else {
                        main_path.clone()
                    },
                    shown(&res.landing.path)
                ),
            ));
        }
    }
    if modelid_relanded {
        if !layout.is_hub() {
            return Err(Skip::new(
                SkipReason::LandingUnknown,
                format!(
                    "the landing {} was re-landed at {} but the download is not a Hugging Face cache",
                    shown(res.landing.relanded_from.as_deref().unwrap_or_default()),
                    RELANDED_HF_HOME
                ),
            ));
        }
        layout = Layout::Hub;
    }
    let mut landing = clean(&res.landing.path);
    let landing_volume = res.landing.volume.clone();
    let mut relanded = modelid_relanded;
    let replace_init = match (&leader_pod, res.downloader) {
        (None, Downloader::Init) => res.init_index,
        _ => None,
    };
    // A landing something else writes (a scratch or home directory, another variable, another
    // container mounting its volume writable): move a Hugging Face cache the engine finds by
    // variables, or leave the pod alone.
    let placed = match landing_shared(main_c, &main_path, &landing) {
        Some(why) => Err(why),
        None => match targets(pod, main, &landing, landing_volume.as_deref(), replace_init) {
            Ok(t) => Ok(t),
            Err(s) if s.reason == SkipReason::LandingShared => Err(s.message),
            Err(s) => return Err(s),
        },
    };
    let targets = match placed {
        Ok(t) => t,
        Err(why) => {
            let movable = engine
                && layout.is_hub()
                && !has_flag(
                    &container_words(main_c),
                    &["--download-dir", "--download_dir"],
                )
                && landing != RELANDED_HF_HOME
                && CACHE_VARIABLES.iter().all(|n| !references(main_c, n))
                && script_assignments(main_c, &CACHE_VARIABLES).is_empty();
            let new = landing_in(pod, main_c, &main_path, RELANDED_HF_HOME);
            if movable
                && new.substitutable
                && new.kind == LandingKind::Rootfs
                && landing_shared(main_c, &main_path, RELANDED_HF_HOME).is_none()
            {
                landing = RELANDED_HF_HOME.to_owned();
                layout = Layout::Hub;
                relanded = true;
                targets(pod, main, &landing, None, replace_init)?
            } else {
                return Err(Skip::new(
                    SkipReason::LandingShared,
                    format!(
                        "{why}; a read-only copy cannot be mounted over it, and the landing cannot be moved"
                    ),
                ));
            }
        }
    };
    // The environment the engine needs to read the copy.
    let sets_hub_env = layout.is_hub() && (engine || relanded || reads_hub_at(main_c, &landing));
    let mut env: Vec<(String, String)> = Vec::new();
    let mut scratch = false;
    if sets_hub_env {
        env = hub_env(layout, &landing);
        if layout == Layout::Hub && defined(main_c, "HF_MODULES_CACHE").is_none() {
            env.push((
                "HF_MODULES_CACHE".to_owned(),
                join(SCRATCH_PATH, "hf_modules"),
            ));
            scratch = true;
        }
    } else if layout == Layout::Nim && engine {
        env.push(("NIM_CACHE_PATH".to_owned(), landing.clone()));
    }
    // Another repository the engine fetches at start would land in the read-only copy.
    let extras = extra_repositories(main_c, &main_path, &res.identity);
    if !extras.is_empty() {
        let into_copy =
            engine || sets_hub_env || hub_dir(main_c).is_none_or(|d| is_within(&d, &landing));
        if into_copy {
            return Err(Skip::new(
                SkipReason::MultipleRepositories,
                format!(
                    "the engine fetches more than {} at start ({}); the shared copy holds one artifact and is read-only where the engine would put the others",
                    shown(&uri),
                    extras.join("; ")
                ),
            ));
        }
    }
    // The engine's own configuration must not undo or depend on what the rewrite sets.
    for (name, value) in &env {
        for (_, assigned) in script_assignments(main_c, &[name]) {
            if !same_value(name, &assigned, value) {
                return Err(Skip::new(
                    SkipReason::EngineEnvConflict,
                    format!(
                        "{main_path}.command: the container's script sets {name}={}, and reading the shared copy needs {name}={}",
                        shown(&assigned),
                        shown(value)
                    ),
                ));
            }
        }
        let old = match env_value(main_c, name) {
            Some(EnvValue::Literal(v)) => Some(v),
            Some(EnvValue::Unknown) => None,
            None => None,
        };
        let changes = old.as_deref().is_none_or(|o| !same_value(name, o, value));
        if changes && references(main_c, name) {
            return Err(Skip::new(
                SkipReason::EngineEnvConflict,
                format!(
                    "{main_path}: the container refers to ${name}, whose value reading the shared copy changes to {}",
                    shown(value)
                ),
            ));
        }
    }
    // Names the rewrite adds.
    if let Some(v) = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == MODEL_VOLUME || v.name == SCRATCH_VOLUME)
    {
        return Err(Skip::new(
            SkipReason::NameConflict,
            format!(
                "spec.volumes: the pod already has a volume named {}",
                shown(&v.name)
            ),
        ));
    }
    if scratch
        && let Some(m) = main_c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| clean(&m.mount_path) == SCRATCH_PATH)
    {
        return Err(Skip::new(
            SkipReason::NameConflict,
            format!(
                "{main_path}.volumeMounts: volume {} is already mounted at {SCRATCH_PATH}",
                shown(&m.name)
            ),
        ));
    }
    if let Some(c) = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == WAIT_CONTAINER)
    {
        return Err(Skip::new(
            SkipReason::NameConflict,
            format!("the pod already has a container named {}", shown(&c.name)),
        ));
    }
    // The download step the writer Job runs, and what the wait container stands in for.
    let filled = match (res.downloader, &leader_pod) {
        (Downloader::Init, lp) => {
            let (dl_main, origin, path) = match lp {
                Some(lp) => (
                    lp.spec
                        .as_ref()
                        .and_then(|s| s.containers.first())
                        .unwrap_or(main_c),
                    StepOrigin::LeaderInit,
                    format!(
                        "leader template spec.initContainers[{}]",
                        res.init_index.unwrap_or_default()
                    ),
                ),
                None => (
                    main_c,
                    StepOrigin::Init,
                    format!(
                        "spec.initContainers[{}]",
                        res.init_index.unwrap_or_default()
                    ),
                ),
            };
            let leader_landing = match lp {
                Some(lp) => match resolve_container(lp, 0) {
                    warmcache_modelid::Outcome::Resolved(l) => l.landing,
                    warmcache_modelid::Outcome::Unresolved(u) => {
                        return Err(Skip::new(SkipReason::LeaderUnresolved, u.to_string()));
                    }
                },
                None => res.landing.clone(),
            };
            let original = leader_landing
                .relanded_from
                .clone()
                .unwrap_or_else(|| leader_landing.path.clone());
            let (dest, volume) = init_dest(
                dl_main,
                download_c,
                &original,
                leader_landing.volume.as_deref(),
            );
            let step = step::from_init(
                download_pod,
                download_c,
                &path,
                origin,
                dest.clone(),
                volume.clone(),
            )?;
            let fallback = match (lp, download_c.command.as_ref().filter(|c| !c.is_empty())) {
                (None, Some(command)) => Some(Fallback {
                    argv: command
                        .iter()
                        .chain(download_c.args.iter().flatten())
                        .cloned()
                        .collect(),
                    env: download_c.env.clone().unwrap_or_default(),
                    env_from: download_c.env_from.clone(),
                    mounts: other_mounts(download_c, volume.as_deref(), &dest),
                    dest,
                    working_dir: download_c.working_dir.clone(),
                }),
                _ => None,
            };
            (Some(step), fallback, None)
        }
        (Downloader::Engine, lp) => {
            let origin = if lp.is_some() {
                StepOrigin::LeaderEngine
            } else {
                StepOrigin::Engine
            };
            match step::derived(pod, main_c, origin, &res.identity, layout) {
                Ok(step) => {
                    let fallback = Fallback {
                        argv: step
                            .container
                            .command
                            .iter()
                            .flatten()
                            .chain(step.container.args.iter().flatten())
                            .cloned()
                            .collect(),
                        env: step.container.env.clone().unwrap_or_default(),
                        env_from: step.container.env_from.clone(),
                        mounts: Vec::new(),
                        dest: WAIT_MOUNT_PATH.to_owned(),
                        working_dir: None,
                    };
                    (Some(step), Some(fallback), None)
                }
                // No Job can reproduce what the engine fetches: capture its own download once
                // the pod is Ready, when it lands in an emptyDir of the pod itself.
                Err(s) if s.reason == SkipReason::DownloadNotReproducible && lp.is_none() => {
                    let capture =
                        capture_source(pod, main_c, &landing, landing_volume.as_deref(), relanded)
                            .map_err(|why| {
                                Skip::new(
                                    s.reason,
                                    format!(
                                        "{}; nor can its own download be captured: {why}",
                                        s.message
                                    ),
                                )
                            })?;
                    (None, None, Some(capture))
                }
                Err(s) => return Err(s),
            }
        }
    };
    let (step, fallback, capture) = filled;
    let step_json = step.as_ref().map(DownloadStep::to_annotation).transpose()?;
    let wait_for: &Container = match replace_init {
        Some(i) => spec
            .init_containers
            .as_ref()
            .and_then(|ic| ic.get(i))
            .unwrap_or(main_c),
        None => main_c,
    };
    let (user, group) = effective_user(pod, wait_for, options);
    let image = options
        .wait_image
        .clone()
        .or_else(|| wait_for.image.clone())
        .unwrap_or_default();
    if image.is_empty() {
        return Err(Skip::new(
            SkipReason::DownloadNotReproducible,
            format!(
                "container {} names no image to wait on, and no wait image is configured",
                shown(&wait_for.name)
            ),
        ));
    }
    let salt = annotation(pod, CACHE_SALT_ANNOTATION);
    if let Some(salt) = salt.filter(|s| s.len() > MAX_SALT_BYTES) {
        return Err(Skip::new(
            SkipReason::InvalidReference,
            format!(
                "metadata.annotations[{CACHE_SALT_ANNOTATION}]: {} bytes, at most {MAX_SALT_BYTES} fold into a cache's identity",
                salt.len()
            ),
        ));
    }
    let refresh_label = req
        .namespace_labels
        .get(REFRESH_LABEL)
        .filter(|v| !v.is_empty())
        .cloned();
    let mut handle = CacheHandle::new(res.identity.clone(), layout, &endpoints)
        .with_salt(salt)
        .with_refresh(&[refresh_label.as_deref().unwrap_or_default()]);
    if capture.is_some() {
        handle = handle.with_capture();
    }
    let identity = BindingIdentity::new(sharing.workflow, &sharing.domain, &handle.to_string());
    let cache_set = if options.compile_cache_sets {
        cache_set_of(pod, main_c, &handle, &sharing, options)
    } else {
        None
    };
    let traceparent = req
        .traceparent
        .map(str::trim)
        .filter(|t| well_formed_traceparent(t))
        .map(str::to_owned);
    // The binding's name is made of the identity's hash (`binding_name`): one digest for both.
    let hash = identity_hash(&identity);
    Ok(Plan {
        namespace: req.namespace.to_owned(),
        control_namespace: options.control_namespace.clone(),
        binding_name: binding_name_of_hash(&hash),
        hash,
        identity,
        sharing,
        handle,
        uri,
        source: res.source_label(),
        downloader: res.downloader,
        main,
        landing,
        targets,
        offline: sets_hub_env,
        env,
        scratch,
        relanded,
        replace_init,
        wait: WaitSource {
            image_pull_policy: if options.wait_image.is_some() {
                None
            } else {
                wait_for.image_pull_policy.clone()
            },
            image,
            user,
            group,
            fallback,
        },
        step,
        step_json,
        capture,
        cache_set,
        traceparent,
        refresh_label,
        // Pods of one LeaderWorkerSet group must read one commit: a window that turned between
        // the leader's admission and a worker's would split them, so groups refresh only by salt
        // or label.
        max_age_seconds: options.floating_revision_max_age_seconds.filter(|_| {
            !pod.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(warmcache_modelid::LWS_NAME_LABEL))
        }),
    })
}

/// The compile-cache set of a pod reading the model copy `model`: none when the pod's rank is
/// unreadable, or when a name the set adds is taken (a volume, a container, a mount at the
/// scratch path from another volume): then the pod simply keeps its compile caches where they
/// were, nothing else changes.
fn cache_set_of(
    pod: &Pod,
    main_c: &Container,
    model: &CacheHandle,
    sharing: &SharingDomain,
    options: &Options,
) -> Option<CacheSet> {
    let rank = cacheset::rank(pod)?;
    let spec = pod.spec.as_ref()?;
    let taken = spec.volumes.iter().flatten().any(|v| v.name == SEED_VOLUME)
        || spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .any(|c| {
                c.name == SEED_CONTAINER
                    || c.volume_mounts.iter().flatten().any(|m| {
                        m.name != SCRATCH_VOLUME
                            && (is_within(&clean(&m.mount_path), SCRATCH_PATH)
                                || clean(&m.mount_path) == SEED_MOUNT_PATH)
                    })
            });
    if taken {
        return None;
    }
    let (image, pull) = match &options.wait_image {
        Some(i) => (i.clone(), None),
        None => (main_c.image.clone()?, main_c.image_pull_policy.clone()),
    };
    Some(CacheSet::new(
        cacheset::configuration_digest(pod, main_c),
        rank,
        model,
        sharing,
        cacheset::compile_cache_env(main_c),
        (image, pull),
    ))
}

/// The capture source of an engine download no Job can reproduce: the landing must lie in an
/// emptyDir of the pod that the main container mounts (read through the kubelet's directory of
/// that volume, it outlives nothing the pod does not own), and must not have been moved.
fn capture_source(
    pod: &Pod,
    main_c: &Container,
    landing: &str,
    volume: Option<&str>,
    relanded: bool,
) -> Result<Capture, String> {
    if relanded {
        return Err(
            "the landing was moved, so the engine's download is not where the pod put it"
                .to_owned(),
        );
    }
    let Some(volume) = volume else {
        return Err(format!(
            "the landing {} is in the container's own filesystem, not in a pod volume the node agent can read",
            shown(landing)
        ));
    };
    let empty_dir = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|vs| vs.iter().any(|v| v.name == volume && v.empty_dir.is_some()));
    if !empty_dir {
        return Err(format!(
            "the landing's volume {} is not an emptyDir of the pod",
            shown(volume)
        ));
    }
    let Some(inside) = in_volume(main_c, volume, landing) else {
        return Err(format!(
            "the main container does not mount volume {} above the landing {} (or only through subPathExpr)",
            shown(volume),
            shown(landing)
        ));
    };
    let path = inside.trim_start_matches('/').to_owned();
    if path
        .split('/')
        .any(|c| matches!(c, "." | "..") || (c.is_empty() && !path.is_empty()))
    {
        return Err(format!(
            "the landing's path {} inside volume {} is not a plain relative path",
            shown(&inside),
            shown(volume)
        ));
    }
    Ok(Capture {
        volume: volume.to_owned(),
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents() {
        assert!(well_formed_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        assert!(!well_formed_traceparent(
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01"
        ));
        assert!(!well_formed_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"
        ));
        assert!(!well_formed_traceparent(
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        assert!(!well_formed_traceparent(
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"
        ));
        assert!(!well_formed_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"
        ));
        assert!(!well_formed_traceparent(""));
    }

    #[test]
    fn hub_env_sets_every_cache_variable() {
        let env: BTreeMap<String, String> = hub_env(Layout::Hub, "/models").into_iter().collect();
        assert_eq!(env["HF_HOME"], "/models");
        assert_eq!(env["HF_HUB_CACHE"], "/models/hub");
        assert_eq!(env["HUGGINGFACE_HUB_CACHE"], "/models/hub");
        assert_eq!(env["TRANSFORMERS_CACHE"], "/models/hub");
        assert_eq!(env["HF_HUB_OFFLINE"], "1");
        assert_eq!(env["TRANSFORMERS_OFFLINE"], "1");
        let env: BTreeMap<String, String> =
            hub_env(Layout::HubCache, "/data").into_iter().collect();
        assert!(!env.contains_key("HF_HOME"));
        assert_eq!(env["HUGGINGFACE_HUB_CACHE"], "/data");
    }
}
