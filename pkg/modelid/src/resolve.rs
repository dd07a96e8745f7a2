//! Resolution: which artifact a pod downloads, who downloads it, and where it lands.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use crate::argv::View;
use crate::env::Val;
use crate::identity::{Identity, Scheme};
use crate::landing::{
    self, DEFAULT_HF_HOME, DEFAULT_NIM_CACHE_PATH, InitLandingError, Landing, check_mount_paths,
    landing_for_init, landing_in, mount_root,
};
use crate::limits::Budget;
use crate::lws::{GroupError, LWS_NAME_LABEL, LWS_WORKER_INDEX_LABEL, LeaderWorkerSet};
use crate::outcome::{Downloader, Outcome, Resolution, Source, Unresolved};
use crate::recognise::{
    Finding, argv_field, classify_ref, custom_endpoint, dest_path, env_path, flag, init_findings,
};
use crate::shell::{Command, Word};
use crate::{OPT_OUT_ANNOTATION, paths};
use warmcache_cli::text::shown;

/// Engine flags that name the model (vLLM/Dynamo `--model`, SGLang `--model-path`, TGI `--model-id`).
const MODEL_FLAGS: [&str; 4] = ["--model", "--model-path", "--model_path", "--model-id"];

/// Whether the pod opted out with [`OPT_OUT_ANNOTATION`]`: "true"`.
pub fn opted_out(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(OPT_OUT_ANNOTATION))
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// Whether a resource quantity (`1`, `0`, `0.0`, `0m`, `500m`, `1e3`, `2Ki`, ...) is zero: its
/// number, before any suffix or exponent, has digits and all of them are `0`. A quantity that
/// does not start with a number is not known to be zero.
fn quantity_is_zero(q: &str) -> bool {
    let q = q.trim();
    let q = q.strip_prefix(['+', '-']).unwrap_or(q);
    let number: &str = q
        .split(|ch: char| !(ch.is_ascii_digit() || ch == '.'))
        .next()
        .unwrap_or_default();
    number.bytes().any(|b| b.is_ascii_digit()) && number.bytes().all(|b| b == b'0' || b == b'.')
}

fn requests_gpu(c: &Container) -> bool {
    let Some(r) = &c.resources else {
        return false;
    };
    [&r.limits, &r.requests].into_iter().flatten().any(|m| {
        m.iter()
            .any(|(k, q)| k.ends_with("/gpu") && !quantity_is_zero(&q.0))
    })
}

/// The main container: the first one that requests a GPU (`*/gpu` in limits or requests), else
/// the first one.
pub fn main_container_index(pod: &Pod) -> usize {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.iter().position(requests_gpu))
        .unwrap_or(0)
}

/// Resolve a pod, with its main container chosen by [`main_container_index`].
pub fn resolve(pod: &Pod) -> Outcome {
    resolve_container(pod, main_container_index(pod))
}

/// Resolve a pod with `spec.containers[main]` as the main container.
pub fn resolve_container(pod: &Pod, main: usize) -> Outcome {
    resolve_metered(pod, main, &Budget::default())
}

/// [`resolve_container`], charging its work to `budget`.
pub(crate) fn resolve_metered(pod: &Pod, main: usize, budget: &Budget) -> Outcome {
    match resolve_inner(pod, main, budget) {
        Ok(r) => Outcome::Resolved(r),
        Err(u) => Outcome::Unresolved(u),
    }
}

/// Read a container, refusing it when reading hit a bound: what it runs is then not known.
fn read<'p>(c: &'p Container, path: &'p str, budget: &Budget) -> Result<View<'p>, Unresolved> {
    let view = View::new(c, path, budget);
    match view.limit {
        None => Ok(view),
        Some((bound, env_index)) => Err(Unresolved::UnknownValue {
            field: match env_index {
                Some(i) => format!("{path}.env[{i}]"),
                None => argv_field(&view),
            },
            what: format!(
                "{}; what the container runs is not known at admission, so the pod is left alone",
                bound.describe()
            ),
        }),
    }
}

/// A landing may only be placed in containers whose mounts all have absolute paths.
fn mounts_known(c: &Container, c_path: &str) -> Result<(), Unresolved> {
    check_mount_paths(c, c_path).map_err(|(field, why)| Unresolved::LandingUnknown { field, why })
}

fn resolve_inner(pod: &Pod, main: usize, budget: &Budget) -> Result<Resolution, Unresolved> {
    if opted_out(pod) {
        return Err(Unresolved::OptedOut {
            annotation: OPT_OUT_ANNOTATION,
        });
    }
    let spec = pod.spec.as_ref().ok_or(Unresolved::NoContainers)?;
    let main_c = spec.containers.get(main).ok_or(Unresolved::NoContainers)?;
    // 1. Download init containers, in order.
    if let Some(r) = from_inits(pod, spec, main, main_c, budget)? {
        return Ok(r);
    }
    let main_path = format!("spec.containers[{main}]");
    let view = read(main_c, &main_path, budget)?;
    // 2. The main container's own NGC download.
    if let Some(r) = from_main_ngc(pod, main, &view)? {
        return Ok(r);
    }
    // 3. The engine.
    from_engine(pod, main, &view)
}

fn describe(f: &Finding, init: &str) -> String {
    format!(
        "{} (init container {})",
        shown(&f.identity.uri()),
        shown(init)
    )
}

fn from_inits(
    pod: &Pod,
    spec: &PodSpec,
    main: usize,
    main_c: &Container,
    budget: &Budget,
) -> Result<Option<Resolution>, Unresolved> {
    let inits: Vec<&Container> = spec.init_containers.iter().flatten().collect();
    let paths: Vec<String> = (0..inits.len())
        .map(|i| format!("spec.initContainers[{i}]"))
        .collect();
    let mut first: Option<(Finding, usize, View<'_>)> = None;
    for (i, init) in inits.iter().enumerate() {
        let view = read(init, &paths[i], budget)?;
        let mut found_here = None;
        for found in init_findings(&view) {
            let f0 = match (&first, &found_here) {
                (Some((f0, i0, _)), _) => Some((f0, *i0)),
                (None, Some(f0)) => Some((f0, i)),
                (None, None) => None,
            };
            match (f0, found) {
                (None, Err(u)) => return Err(u),
                (None, Ok(f)) => found_here = Some(f),
                (Some((f0, i0)), Ok(f)) => {
                    if f.identity != f0.identity {
                        return Err(Unresolved::MultipleDownloads {
                            first: describe(f0, &inits[i0].name),
                            other: describe(&f, &init.name),
                        });
                    }
                }
                (Some((f0, i0)), Err(u)) => {
                    return Err(Unresolved::MultipleDownloads {
                        first: describe(f0, &inits[i0].name),
                        other: format!(
                            "an undecidable download in init container {}: {u}",
                            shown(&init.name)
                        ),
                    });
                }
            }
        }
        if let Some(f) = found_here {
            first = Some((f, i, view));
        }
    }
    let Some((finding, i, view)) = first else {
        return Ok(None);
    };
    let main_path = format!("spec.containers[{main}]");
    mounts_known(view.container, view.path)?;
    mounts_known(main_c, &main_path)?;
    let dest = finding
        .dest
        .clone()
        .unwrap_or_else(|| mount_root(pod, view.container));
    let landing = landing_for_init(pod, view.container, view.path, main_c, &main_path, &dest).map_err(|e| match e {
        InitLandingError::SubPathExpr { field } => Unresolved::LandingUnknown {
            field,
            why: "subPathExpr is expanded by the kubelet; the landing is not known at admission".to_owned(),
        },
        InitLandingError::NotMounted { volume } => Unresolved::LandingUnknown {
            field: format!("spec.containers[{main}].volumeMounts"),
            why: format!(
                "init container {} downloads into volume {}, which the main container does not mount there",
                shown(view.name()),
                shown(&volume)
            ),
        },
    })?;
    Ok(Some(Resolution {
        identity: finding.identity,
        source: finding.source,
        via_leader: false,
        downloader: Downloader::Init,
        init_container: Some(view.name().to_owned()),
        init_index: Some(i),
        main_index: main,
        landing: landing::reland(pod, main_c, &main_path, landing),
    }))
}

fn engine_resolution(
    pod: &Pod,
    main: usize,
    view: &View<'_>,
    identity: Identity,
    source: Source,
    dest: String,
) -> Result<Resolution, Unresolved> {
    mounts_known(view.container, view.path)?;
    Ok(Resolution {
        identity,
        source,
        via_leader: false,
        downloader: Downloader::Engine,
        init_container: None,
        init_index: None,
        main_index: main,
        landing: landing::reland(
            pod,
            view.container,
            view.path,
            landing_in(pod, view.container, view.path, &dest),
        ),
    })
}

fn from_main_ngc(
    pod: &Pod,
    main: usize,
    view: &View<'_>,
) -> Result<Option<Resolution>, Unresolved> {
    let field = format!("{}.env[NGC_MODEL_NAME]", view.path);
    let name = match view.env.get("NGC_MODEL_NAME") {
        Val::Known(v) if !v.is_empty() => v.into_owned(),
        Val::Unknown { field } => {
            return Err(Unresolved::UnknownValue {
                field,
                what: "NGC_MODEL_NAME names the model the container downloads and is not set literally"
                    .to_owned(),
            });
        }
        _ => return Ok(None),
    };
    let identity = Identity::ngc(&name).map_err(|e| Unresolved::InvalidReference {
        field,
        value: name.clone(),
        why: e.to_string(),
    })?;
    let dest = match env_path(None, view, &["NGC_MODEL_MOUNT"])? {
        Some(d) => d,
        None => match env_path(None, view, &["NGC_STABLE_MODEL_PATH", "MODEL_PATH"])? {
            Some(p) => paths::parent(&p),
            None => mount_root(pod, view.container),
        },
    };
    engine_resolution(pod, main, view, identity, Source::EnvNgcModelName, dest).map(Some)
}

fn is_nim_image(image: &str) -> bool {
    image.contains("nvcr.io/nim/") || image.contains("/nim/")
}

/// The first `--revision` of any command.
fn any_revision(view: &View<'_>) -> Option<Word> {
    view.commands
        .iter()
        .find_map(|c| flag(&c.words, &["--revision"]))
}

/// Where the engine's own download lands.
fn engine_dest(
    view: &View<'_>,
    cmd: Option<&Command>,
    identity: &Identity,
    nim_rule: bool,
) -> Result<String, Unresolved> {
    if identity.scheme() == Scheme::Path {
        return Ok(identity.reference().to_owned());
    }
    if is_nim_image(view.image()) {
        if let Some(p) = env_path(cmd, view, &["NIM_CACHE_PATH"])? {
            return Ok(p);
        }
        if nim_rule {
            return Ok(DEFAULT_NIM_CACHE_PATH.to_owned());
        }
    }
    if let Some(c) = cmd
        && let Some(d) = flag(&c.words, &["--download-dir", "--download_dir"])
    {
        return dest_path(&d, c.cwd.as_deref(), &argv_field(view), "--download-dir");
    }
    Ok(env_path(
        cmd,
        view,
        &["HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"],
    )?
    .unwrap_or_else(|| DEFAULT_HF_HOME.to_owned()))
}

fn from_engine(pod: &Pod, main: usize, view: &View<'_>) -> Result<Resolution, Unresolved> {
    let field = argv_field(view);
    let done = |identity: Identity, source: Source, cmd: Option<&Command>, nim_rule: bool| {
        custom_endpoint(identity.scheme(), cmd.or(view.commands.last()), view)?;
        let dest = engine_dest(view, cmd, &identity, nim_rule)?;
        engine_resolution(pod, main, view, identity, source, dest)
    };
    // a. --model / --model-path / --model-id, with --revision of the same command.
    for cmd in &view.commands {
        if let Some(v) = flag(&cmd.words, &MODEL_FLAGS) {
            let rev = flag(&cmd.words, &["--revision"]);
            let identity = classify_ref(&v, rev.as_ref(), &field, "the model")?;
            return done(identity, Source::ModelFlag, Some(cmd), false);
        }
    }
    // b. vllm serve <model>.
    for cmd in &view.commands {
        let w = &cmd.words;
        let Some(i) = w
            .windows(2)
            .position(|t| crate::argv::basename(&t[0]) == "vllm" && t[1].text == "serve")
        else {
            continue;
        };
        if let Some(m) = w.get(i + 2).filter(|m| !m.text.starts_with('-')) {
            let rev = flag(w, &["--revision"]);
            let identity = classify_ref(m, rev.as_ref(), &field, "the model")?;
            return done(identity, Source::VllmServe, Some(cmd), false);
        }
    }
    // c, d. Engine env.
    for (name, source) in [
        ("HF_MODEL_ID", Source::EnvHfModelId),
        ("MODEL_ID", Source::EnvModelId),
        ("MODEL_PATH", Source::EnvModelPath),
    ] {
        if let Some(identity) = env_ref(view, name)? {
            return done(identity, source, view.commands.last(), false);
        }
    }
    // e. NIM.
    if is_nim_image(view.image()) {
        if let Some(identity) = env_ref(view, "NIM_MODEL_NAME")? {
            return done(identity, Source::EnvNimModelName, None, true);
        }
        let profile = match view.env.get("NIM_MODEL_PROFILE") {
            Val::Known(p) if !p.trim().is_empty() => Some(p.trim().to_owned()),
            Val::Unknown { field } => {
                return Err(Unresolved::UnknownValue {
                    field,
                    what: "NIM_MODEL_PROFILE selects the model profile and is not set literally"
                        .to_owned(),
                });
            }
            _ => None,
        };
        let image = view.image().to_owned();
        let identity = Identity::nim(&image, profile.as_deref()).map_err(|e| {
            Unresolved::InvalidReference {
                field: format!("{}.image", view.path),
                value: image.clone(),
                why: e.to_string(),
            }
        })?;
        return done(identity, Source::NimImage, None, true);
    }
    Err(Unresolved::NoDownloader)
}

/// An env variable naming a model, classified; `Ok(None)` when unset or empty.
fn env_ref(view: &View<'_>, name: &str) -> Result<Option<Identity>, Unresolved> {
    match view.env.get(name) {
        Val::Known(v) if !v.trim().is_empty() => {
            let rev = any_revision(view);
            let field = format!("{}.env[{name}]", view.path);
            classify_ref(&Word::known(v.into_owned()), rev.as_ref(), &field, name).map(Some)
        }
        Val::Unknown { field } => Err(Unresolved::UnknownValue {
            field,
            what: format!("{name} names the model and is not set literally"),
        }),
        _ => Ok(None),
    }
}

fn lws_worker(pod: &Pod) -> Option<(&str, &str)> {
    let labels = pod.metadata.labels.as_ref()?;
    let name = labels.get(LWS_NAME_LABEL)?;
    let index = labels
        .get(LWS_WORKER_INDEX_LABEL)
        .map_or("", String::as_str);
    (!index.is_empty() && index != "0").then_some((name.as_str(), index))
}

/// Resolve a pod that may be a LeaderWorkerSet worker. A worker (label
/// `leaderworkerset.sigs.k8s.io/worker-index` not `0`) whose own spec names no model takes the
/// identity of its group's leader template (container 0); the landing is computed again on the
/// worker's own container 0 and volumes. Leaders and pods outside a group never consult `group`.
///
/// `group` is the LeaderWorkerSet named by the pod's `leaderworkerset.sigs.k8s.io/name` label, as
/// the caller read it (same namespace). A worker whose group is needed but not supplied is an
/// error ([`GroupError::Missing`]): the webhook leaves such a pod alone.
pub fn resolve_with_group(
    pod: &Pod,
    group: Option<&LeaderWorkerSet>,
) -> Result<Outcome, GroupError> {
    let budget = Budget::default();
    let Some((name, index)) = lws_worker(pod) else {
        return Ok(resolve_metered(pod, main_container_index(pod), &budget));
    };
    let own = resolve_metered(pod, 0, &budget);
    if !matches!(own, Outcome::Unresolved(Unresolved::NoDownloader)) {
        return Ok(own);
    }
    let Some(lws) = group else {
        return Err(GroupError::Missing {
            name: name.to_owned(),
            index: index.to_owned(),
        });
    };
    let given = lws.metadata.name.as_deref().unwrap_or_default();
    if given != name {
        return Err(GroupError::Mismatch {
            name: name.to_owned(),
            given: given.to_owned(),
        });
    }
    let leader_pod = lws.leader_pod();
    let leader = match resolve_metered(&leader_pod, 0, &budget) {
        Outcome::Resolved(r) => r,
        Outcome::Unresolved(u) => {
            return Ok(Outcome::Unresolved(Unresolved::LeaderUnresolved {
                leader_worker_set: name.to_owned(),
                reason: Box::new(u),
            }));
        }
    };
    let Some(worker_main) = pod.spec.as_ref().and_then(|s| s.containers.first()) else {
        return Ok(Outcome::Unresolved(Unresolved::NoContainers));
    };
    // The worker downloads the leader's artifact itself when the leader's engine does: its own
    // endpoint settings decide where from.
    let worker_path = "spec.containers[0]";
    if leader.downloader == Downloader::Engine {
        let view = match read(worker_main, worker_path, &budget) {
            Ok(v) => v,
            Err(u) => return Ok(Outcome::Unresolved(u)),
        };
        if let Err(u) = custom_endpoint(leader.identity.scheme(), view.commands.last(), &view) {
            return Ok(Outcome::Unresolved(u));
        }
    }
    if let Err(u) = mounts_known(worker_main, worker_path) {
        return Ok(Outcome::Unresolved(u));
    }
    let dest = landing::worker_dest(&leader.landing);
    let landing: Landing = landing::reland(
        pod,
        worker_main,
        worker_path,
        landing_in(pod, worker_main, worker_path, dest),
    );
    Ok(Outcome::Resolved(Resolution {
        via_leader: true,
        main_index: 0,
        landing,
        ..leader
    }))
}

#[cfg(test)]
mod tests {
    use super::quantity_is_zero;

    #[test]
    fn zero_quantities_are_zero() {
        for q in [
            "0", "0.0", "0m", " 0 ", "00", "+0", "0.", ".0", "0Ki", "0e3", "0E3",
        ] {
            assert!(quantity_is_zero(q), "{q:?} is zero");
        }
    }

    #[test]
    fn non_zero_quantities_are_not_zero() {
        for q in [
            "1", "8", "0.5", "500m", "1m", "10", "1e3", "2Ki", "", "m", "abc", ".",
        ] {
            assert!(!quantity_is_zero(q), "{q:?} is not known to be zero");
        }
    }
}
