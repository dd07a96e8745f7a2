//! Where a download writes, as the main container sees it, and whether that place may be replaced
//! by the shared read-only copy.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, Volume, VolumeMount};
use serde::{Deserialize, Serialize};
use warmcache_cli::text::{self, shown};

use crate::paths;

/// The Hugging Face cache an engine uses when nothing sets `HF_HOME`/`HF_HUB_CACHE` (as root).
pub const DEFAULT_HF_HOME: &str = "/root/.cache/huggingface";

/// Where a rootfs landing at [`DEFAULT_HF_HOME`] is moved: `/root` is mode 0700, so engines that
/// run as a non-root user could not read a copy placed there. The webhook points `HF_HOME` here.
///
/// The path is the one nvsnap uses (reference section (g)), kept so that pods admitted by either
/// system look the same inside and specs captured from nvsnap-era pods resolve as before; see
/// `docs/model-identity.md`.
pub const RELANDED_HF_HOME: &str = "/opt/nvsnap/hf";

/// NIM's default model cache (`NIM_CACHE_PATH` unset).
pub const DEFAULT_NIM_CACHE_PATH: &str = "/opt/nim/.cache";

/// The destination used when a download container names none and mounts nothing writable.
pub const DEFAULT_MOUNT_ROOT: &str = "/mnt/models";

/// What kind of storage a landing path is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LandingKind {
    /// A pod-local `emptyDir` volume.
    EmptyDir,
    /// No volume: the container's own filesystem.
    Rootfs,
    /// A StatefulSet's per-replica claim (from `volumeClaimTemplates`): this pod's alone.
    PodClaim,
    /// A customer's PersistentVolumeClaim: sharing is already solved, the pod is left alone.
    Pvc,
    /// A node directory: left alone.
    HostPath,
    /// Anything else (image volume, CSI ephemeral, generic ephemeral, configMap, unknown): left alone.
    Other,
}

impl LandingKind {
    /// The JSON name.
    pub const fn as_str(self) -> &'static str {
        match self {
            LandingKind::EmptyDir => "emptyDir",
            LandingKind::Rootfs => "rootfs",
            LandingKind::PodClaim => "podClaim",
            LandingKind::Pvc => "pvc",
            LandingKind::HostPath => "hostPath",
            LandingKind::Other => "other",
        }
    }

    /// Whether the shared copy may take this place: only storage the pod owns alone.
    pub const fn substitutable(self) -> bool {
        matches!(
            self,
            LandingKind::EmptyDir | LandingKind::Rootfs | LandingKind::PodClaim
        )
    }
}

/// Where the model lands.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Landing {
    /// The directory the download writes, as the main container sees it.
    pub path: String,
    /// The pod volume holding it (`None` on rootfs).
    pub volume: Option<String>,
    /// The kind of that volume; when another volume is mounted below `path`, the kind of that
    /// nested volume (see `nested`).
    pub kind: LandingKind,
    /// Whether the shared copy may take this place: `kind.substitutable()` and nothing is mounted
    /// below `path`.
    pub substitutable: bool,
    /// Set when a container mounts a volume strictly below `path` (then `volume` and `kind` are
    /// that mount's and `substitutable` is false): the mount's field path and why it blocks.
    pub nested: Option<String>,
    /// Set when the landing was moved from this path (the rootfs [`DEFAULT_HF_HOME`]) to `path`;
    /// the webhook must then point `HF_HOME` at `path`.
    pub relanded_from: Option<String>,
}

fn volume<'a>(pod: &'a Pod, name: &str) -> Option<&'a Volume> {
    pod.spec
        .as_ref()?
        .volumes
        .as_ref()?
        .iter()
        .find(|v| v.name == name)
}

/// Classify pod volume `name`.
pub fn volume_kind(pod: &Pod, name: &str) -> LandingKind {
    kind_of(volume(pod, name), per_replica_pod_name(pod))
}

/// The pod's volumes by name (the first of a name wins, as a linear search would find it), so
/// that classifying every mount of a container costs `m log v`, not `m * v`.
struct Volumes<'p> {
    by_name: BTreeMap<&'p str, &'p Volume>,
    /// The pod's name when a StatefulSet owns it (its per-replica claims end with it).
    replica: Option<&'p str>,
}

impl<'p> Volumes<'p> {
    fn of(pod: &'p Pod) -> Volumes<'p> {
        let mut by_name = BTreeMap::new();
        for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            by_name.entry(v.name.as_str()).or_insert(v);
        }
        Volumes {
            by_name,
            replica: per_replica_pod_name(pod),
        }
    }

    fn get(&self, name: &str) -> Option<&'p Volume> {
        self.by_name.get(name).copied()
    }

    fn kind(&self, name: &str) -> LandingKind {
        kind_of(self.get(name), self.replica)
    }
}

fn kind_of(v: Option<&Volume>, replica: Option<&str>) -> LandingKind {
    let Some(v) = v else {
        return LandingKind::Other;
    };
    if v.empty_dir.is_some() {
        LandingKind::EmptyDir
    } else if let Some(pvc) = &v.persistent_volume_claim {
        if replica.is_some_and(|pod_name| is_per_replica_claim(pod_name, &pvc.claim_name)) {
            LandingKind::PodClaim
        } else {
            LandingKind::Pvc
        }
    } else if v.host_path.is_some() {
        LandingKind::HostPath
    } else {
        LandingKind::Other
    }
}

/// The pod's name, when the pod is owned by a StatefulSet.
fn per_replica_pod_name(pod: &Pod) -> Option<&str> {
    let pod_name = pod.metadata.name.as_deref().filter(|n| !n.is_empty())?;
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "StatefulSet")
        .then_some(pod_name)
}

/// A StatefulSet creates claim `<template>-<pod name>` for each replica.
fn is_per_replica_claim(pod_name: &str, claim: &str) -> bool {
    claim.len() > pod_name.len() + 1
        && claim.ends_with(pod_name)
        && claim.as_bytes().get(claim.len() - pod_name.len() - 1) == Some(&b'-')
}

/// `Err((field, why))` when a mount of `c` (at field path `c_path`) has an empty or relative
/// `mountPath`: such a mount is placed by the runtime if at all, so no landing in `c` is known.
pub(crate) fn check_mount_paths(c: &Container, c_path: &str) -> Result<(), (String, String)> {
    match mounts(c)
        .enumerate()
        .find(|(_, m)| !m.mount_path.starts_with('/'))
    {
        Some((i, m)) => Err((
            format!("{c_path}.volumeMounts[{i}].mountPath"),
            format!(
                "{} is not an absolute path; where the runtime would mount volume {} is not known, so no landing in this container is",
                shown(&m.mount_path),
                shown(&m.name)
            ),
        )),
        None => Ok(()),
    }
}

fn mounts(c: &Container) -> impl Iterator<Item = &VolumeMount> {
    c.volume_mounts.iter().flatten()
}

/// The mount of `c` at or above clean absolute `dest`, longest mount path first.
fn covering_mount<'c>(c: &'c Container, dest: &str) -> Option<(&'c VolumeMount, String)> {
    mounts(c)
        .map(|m| (m, paths::clean(&m.mount_path)))
        .filter(|(_, p)| paths::is_within(dest, p))
        .max_by_key(|(_, p)| p.len())
}

fn landing(path: String, volume: Option<String>, kind: LandingKind) -> Landing {
    Landing {
        path,
        volume,
        kind,
        substitutable: kind.substitutable(),
        nested: None,
        relanded_from: None,
    }
}

/// The mount of `c` (at field path `c_path`) strictly below clean absolute `dest`: the first whose
/// kind is not substitutable, else the first. Any such mount blocks substitution: the shared copy
/// placed at `dest` would hide it (a customer claim at `$HF_HOME/hub`, say) or mix its bytes
/// into the pod's own. An `emptyDir` below an `emptyDir` landing blocks too: the pod chose to
/// split the place, and the resolver does not guess which part the download fills.
fn nested_mount(
    pod: &Pod,
    c: &Container,
    c_path: &str,
    dest: &str,
) -> Option<(String, String, LandingKind)> {
    let volumes = Volumes::of(pod);
    let below: Vec<(usize, &VolumeMount, String, LandingKind)> = mounts(c)
        .enumerate()
        .map(|(i, m)| (i, m, paths::clean(&m.mount_path)))
        .filter(|(_, _, p)| p != dest && paths::is_within(p, dest))
        .map(|(i, m, p)| (i, m, p, volumes.kind(&m.name)))
        .collect();
    let (i, m, p, kind) = below
        .iter()
        .find(|(_, _, _, k)| !k.substitutable())
        .or_else(|| below.first())?;
    let reason = format!(
        "{c_path}.volumeMounts[{i}]: volume {} ({}) is mounted at {}, below the landing {}; \
         the shared copy would hide it",
        shown(&m.name),
        kind.as_str(),
        text::path(p),
        text::path(dest)
    );
    Some((m.name.clone(), reason, *kind))
}

/// Mark `l` not substitutable when container `c` mounts a volume strictly below `dest` (`c`'s
/// own view of the landing). The first nested mount found is kept.
fn check_nested(pod: &Pod, c: &Container, c_path: &str, dest: &str, l: Landing) -> Landing {
    if l.nested.is_some() {
        return l;
    }
    match nested_mount(pod, c, c_path, &paths::clean(dest)) {
        Some((volume, reason, kind)) => Landing {
            volume: Some(volume),
            kind,
            substitutable: false,
            nested: Some(reason),
            ..l
        },
        None => l,
    }
}

/// The landing of `dest` in container `main` (at field path `main_path`, e.g.
/// `spec.containers[0]`): the mount at or above it, or rootfs; not substitutable when `main`
/// mounts another volume below it.
///
/// Assumes every mount of `main` has an absolute `mountPath`, as the API server enforces;
/// [`crate::resolve`] refuses a pod that breaks this (`landing-unknown`) before it looks a
/// landing up, so call it on containers that passed that check.
pub fn landing_in(pod: &Pod, main: &Container, main_path: &str, dest: &str) -> Landing {
    let dest = paths::clean(dest);
    let l = match covering_mount(main, &dest) {
        Some((m, _)) => landing(
            dest.clone(),
            Some(m.name.clone()),
            volume_kind(pod, &m.name),
        ),
        None => landing(dest.clone(), None, LandingKind::Rootfs),
    };
    check_nested(pod, main, main_path, &dest, l)
}

/// Why an init container's destination has no place in the main container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum InitLandingError {
    /// The mount uses `subPathExpr`, which is expanded only by the kubelet.
    SubPathExpr { field: String },
    /// The main container does not mount the volume the init writes to (at that sub path).
    NotMounted { volume: String },
}

fn sub_path(m: &VolumeMount) -> String {
    let p = paths::clean(m.sub_path.as_deref().unwrap_or_default());
    if p == "." { String::new() } else { p }
}

/// The landing of a download an init container writes to `dest` (in the init's own view): the
/// init's volume at that place, seen through the main container's mount of the same volume.
/// When the init writes outside its volumes, the path is looked up in the main container as is.
/// A volume mounted below the landing, in the init's view or the main container's, makes it not
/// substitutable.
pub(crate) fn landing_for_init(
    pod: &Pod,
    init: &Container,
    init_path: &str,
    main: &Container,
    main_path: &str,
    dest: &str,
) -> Result<Landing, InitLandingError> {
    let dest = paths::clean(dest);
    landing_for_init_inner(pod, init, init_path, main, main_path, &dest)
        .map(|l| check_nested(pod, init, init_path, &dest, l))
}

fn landing_for_init_inner(
    pod: &Pod,
    init: &Container,
    init_path: &str,
    main: &Container,
    main_path: &str,
    dest: &str,
) -> Result<Landing, InitLandingError> {
    let Some((im, im_path)) = covering_mount(init, dest) else {
        return Ok(landing_in(pod, main, main_path, dest));
    };
    if im.sub_path_expr.as_deref().is_some_and(|s| !s.is_empty()) {
        let idx = mounts(init)
            .position(|m| std::ptr::eq(m, im))
            .unwrap_or_default();
        return Err(InitLandingError::SubPathExpr {
            field: format!("{init_path}.volumeMounts[{idx}].subPathExpr"),
        });
    }
    let rel = paths::strip_dir(dest, &im_path).unwrap_or_default();
    let in_volume = {
        let p = paths::clean(&format!("{}/{rel}", sub_path(im)));
        if p == "." || p == "/" {
            String::new()
        } else {
            p.trim_start_matches('/').to_owned()
        }
    };
    let best = mounts(main)
        .filter(|m| m.name == im.name && m.sub_path_expr.as_deref().is_none_or(str::is_empty))
        .filter_map(|m| {
            let sp = sub_path(m);
            let below = if sp.is_empty() {
                Some(in_volume.as_str())
            } else if in_volume == sp {
                Some("")
            } else {
                in_volume
                    .strip_prefix(sp.as_str())
                    .and_then(|r| r.strip_prefix('/'))
            }?;
            Some((sp.len(), paths::join(&m.mount_path, below)))
        })
        .max_by_key(|(len, _)| *len);
    match best {
        Some((_, path)) => {
            let l = landing(
                path.clone(),
                Some(im.name.clone()),
                volume_kind(pod, &im.name),
            );
            Ok(check_nested(pod, main, main_path, &path, l))
        }
        None => Err(InitLandingError::NotMounted {
            volume: im.name.clone(),
        }),
    }
}

/// Move a rootfs landing at [`DEFAULT_HF_HOME`] to [`RELANDED_HF_HOME`]. The new place is looked
/// up in `main` like any landing, so a volume the pod already mounts at or above it is reported
/// (and decides substitutability) instead of a rootfs that is not there. A landing that is not
/// substitutable (a volume mounted below it) stays where it is: moving `HF_HOME` would take the
/// engine away from that volume.
pub(crate) fn reland(pod: &Pod, main: &Container, main_path: &str, l: Landing) -> Landing {
    if l.kind != LandingKind::Rootfs || l.path != DEFAULT_HF_HOME || !l.substitutable {
        return l;
    }
    Landing {
        relanded_from: Some(l.path),
        ..landing_in(pod, main, main_path, RELANDED_HF_HOME)
    }
}

/// The destination a LeaderWorkerSet worker's landing is computed at, from its leader's landing:
/// a leader landing at [`RELANDED_HF_HOME`] (re-landed by us, or written into a spec captured from
/// an nvsnap-era pod) stands for the engine default [`DEFAULT_HF_HOME`].
pub(crate) fn worker_dest(leader: &Landing) -> &str {
    if leader.relanded_from.is_some() || leader.path == RELANDED_HF_HOME {
        DEFAULT_HF_HOME
    } else {
        &leader.path
    }
}

/// The directory a download container writes to when it names none: its lexicographically first
/// writable data mount (not a service-account token, `/dev/shm`, a read-only mount, or a
/// configMap/secret/projected/downwardAPI volume), else [`DEFAULT_MOUNT_ROOT`].
pub(crate) fn mount_root(pod: &Pod, c: &Container) -> String {
    let volumes = Volumes::of(pod);
    mounts(c)
        .filter(|m| {
            let p = paths::clean(&m.mount_path);
            !p.starts_with("/var/run/secrets") && p != "/dev/shm" && m.read_only != Some(true)
        })
        .filter(|m| {
            volumes.get(&m.name).is_none_or(|v| {
                v.config_map.is_none()
                    && v.secret.is_none()
                    && v.projected.is_none()
                    && v.downward_api.is_none()
            })
        })
        .map(|m| paths::clean(&m.mount_path))
        .min()
        .unwrap_or_else(|| DEFAULT_MOUNT_ROOT.to_owned())
}
