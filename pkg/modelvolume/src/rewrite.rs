//! The reader pod: the plan applied to the pod.
//!
//! - the copy is one volume, [`MODEL_VOLUME`]: the namespace's read-only view claim with
//!   `persistentVolumeClaim.readOnly: true` (a PV's `csi.readOnly` alone leaves a reader
//!   writable on a real node), or, for hostPath readers of block storage, the node directory the
//!   agent bind-mounts the view onto;
//! - every container that sees the landing mounts it there with `readOnly: true`
//!   (`HostToContainer` propagation for hostPath readers);
//! - the download init container is replaced by [`WAIT_CONTAINER`], or, for an engine that
//!   downloads by itself, that container is added first;
//! - the main container gets the cache variables and offline switches of the plan;
//! - labels and annotations name the cache, the model, the landing and the download step.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, HostPathVolumeSource,
    PersistentVolumeClaimVolumeSource, Pod, SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use warmcache_api_modelcache::names::READER_PVC_PREFIX;
use warmcache_api_modelcache::reader_pvc_name;

use crate::cacheset::CacheSet;
use crate::keys::{
    BINDING_ANNOTATION, BINDING_UID_ANNOTATION, CACHE_BINDING_ANNOTATION,
    CACHE_BINDING_UID_ANNOTATION, CACHE_CAPTURE_LABEL, CACHE_HANDLE_ANNOTATION, CACHE_KEY_LABEL,
    CACHE_ORDINAL_ANNOTATION, CAPTURE_LABEL, CAPTURE_PATH_ANNOTATION, CAPTURE_VOLUME_ANNOTATION,
    COMPLETE_MARKER, DOWNLOAD_STEP_ANNOTATION, FAILURE_MARKER, HANDLE_ANNOTATION,
    LANDING_ANNOTATION, MODEL_LABEL, MODEL_VOLUME, PENDING_LABEL, ROLE_LABEL, ROLE_READER,
    SCRATCH_PATH, SCRATCH_VOLUME, SEED_CONTAINER, SEED_MOUNT_PATH, SEED_VOLUME,
    SKIP_MESSAGE_ANNOTATION, SKIP_REASON_ANNOTATION, TRACE_PARENT_ANNOTATION, URI_ANNOTATION,
    WAIT_CONTAINER, WAIT_MOUNT_PATH,
};
use crate::options::{Options, ReaderMode};
use crate::plan::{Capture, Plan, Slot, Target};

/// The wait script. Positional parameters carry every value (`sh -c SCRIPT name dir deadline
/// poll uri binding fallback [argv...]`), so no value is parsed by the shell. It exits 0 when
/// the completion marker appears; on the failure marker or past the deadline it runs the
/// in-place fallback download when there is one (hostPath readers), else exits 1 with the
/// reason on stderr and in the termination message.
pub(crate) fn wait_script() -> String {
    WAIT_SCRIPT.clone()
}

/// [`wait_script`], built once (every rewritten pod carries a copy).
static WAIT_SCRIPT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        r#"set -u
dir="$1"; deadline="$2"; poll="$3"; uri="$4"; binding="$5"; fallback="$6"; shift 6
report() {{ printf '%s\n' "$1" >&2; printf '%s\n' "$1" > /dev/termination-log 2>/dev/null || true; }}
start=$(date +%s)
while :; do
  if [ -e "$dir/{COMPLETE_MARKER}" ]; then
    echo "nvsnap: model $uri complete"
    exit 0
  fi
  if [ -e "$dir/{FAILURE_MARKER}" ]; then
    if [ "$fallback" = 1 ] && [ "$#" -gt 0 ]; then
      echo "nvsnap: the shared download of $uri failed; downloading locally"
      exec "$@"
    fi
    report "nvsnap: the shared download of $uri failed (ModelCacheBinding $binding): $(head -c 512 "$dir/{FAILURE_MARKER}" 2>/dev/null)"
    exit 1
  fi
  now=$(date +%s)
  if [ $((now - start)) -ge "$deadline" ]; then
    if [ "$fallback" = 1 ] && [ "$#" -gt 0 ]; then
      echo "nvsnap: marker deadline passed; downloading locally"
      exec "$@"
    fi
    report "nvsnap: $uri is not complete after ${{deadline}}s (ModelCacheBinding $binding); a read-only copy has nowhere to download to, so the pod does not start: see the binding's conditions"
    exit 1
  fi
  sleep "$poll"
done"#
    )
});

/// The security context of every container the rewrite adds: no capabilities, no privilege
/// escalation, seccomp `RuntimeDefault`, a non-root user (the pod's own when it names one).
pub(crate) fn hardened(user: i64, group: Option<i64>, read_only_root: bool) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            add: None,
            drop: Some(vec!["ALL".to_owned()]),
        }),
        privileged: Some(false),
        read_only_root_filesystem: Some(read_only_root),
        run_as_non_root: Some(true),
        run_as_user: Some(user),
        run_as_group: group,
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            localhost_profile: None,
        }),
        ..SecurityContext::default()
    }
}

fn model_mount(
    path: &str,
    sub_path: Option<String>,
    read_only: bool,
    mode: ReaderMode,
) -> VolumeMount {
    VolumeMount {
        name: MODEL_VOLUME.to_owned(),
        mount_path: path.to_owned(),
        read_only: Some(read_only),
        sub_path,
        mount_propagation: (mode == ReaderMode::HostPath).then(|| "HostToContainer".to_owned()),
        ..VolumeMount::default()
    }
}

fn wait_container(plan: &Plan, options: &Options, mode: ReaderMode) -> Container {
    let w = &plan.wait;
    let fallback = if mode == ReaderMode::HostPath {
        w.fallback.as_ref()
    } else {
        None
    };
    let dir = fallback
        .map_or(WAIT_MOUNT_PATH, |f| f.dest.as_str())
        .to_owned();
    let mut args = vec![
        WAIT_CONTAINER.to_owned(),
        dir.clone(),
        options.wait_deadline_seconds.to_string(),
        options.poll_seconds.to_string(),
        plan.uri.clone(),
        plan.binding_name.clone(),
        if fallback.is_some() { "1" } else { "0" }.to_owned(),
    ];
    let mut mounts = Vec::new();
    let mut env = None;
    let mut env_from = None;
    let mut working_dir = None;
    if let Some(f) = fallback {
        args.extend(f.argv.iter().cloned());
        mounts.extend(f.mounts.iter().cloned());
        env = Some(f.env.clone()).filter(|e: &Vec<EnvVar>| !e.is_empty());
        env_from.clone_from(&f.env_from);
        working_dir.clone_from(&f.working_dir);
    }
    mounts.push(model_mount(&dir, None, fallback.is_none(), mode));
    Container {
        name: WAIT_CONTAINER.to_owned(),
        image: Some(w.image.clone()),
        image_pull_policy: w.image_pull_policy.clone(),
        command: Some(vec!["/bin/sh".to_owned(), "-c".to_owned(), wait_script()]),
        args: Some(args),
        env,
        env_from,
        working_dir,
        volume_mounts: Some(mounts),
        resources: Some(if fallback.is_some() {
            options.download_resources.clone()
        } else {
            options.wait_resources.clone()
        }),
        security_context: Some(hardened(w.user, w.group, fallback.is_none())),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Container::default()
    }
}

/// Set `name=value` in `c`'s env: the first entry of that name takes the value (a `valueFrom`
/// is replaced), later duplicates are removed, and a missing one is added at the end.
pub(crate) fn set_env(c: &mut Container, name: &str, value: &str) {
    let env = c.env.get_or_insert_with(Vec::new);
    let entry = EnvVar {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        value_from: None,
    };
    match env.iter().position(|e| e.name == name) {
        Some(first) => {
            env[first] = entry;
            let mut i = 0;
            env.retain(|e| {
                i += 1;
                i - 1 <= first || e.name != name
            });
        }
        None => env.push(entry),
    }
}

fn container_mut(pod: &mut Pod, slot: Slot) -> Option<&mut Container> {
    let spec = pod.spec.as_mut()?;
    match slot {
        Slot::Container(i) => spec.containers.get_mut(i),
        Slot::Init(i) => spec.init_containers.as_mut()?.get_mut(i),
    }
}

fn mount_targets(pod: &mut Pod, targets: &[Target], mode: ReaderMode) {
    // Replacements first (the indexes are the pod's own), then additions at the end, so a copy
    // mounted inside another volume comes after it.
    for t in targets.iter().filter(|t| t.replace.is_some()) {
        if let (Some(c), Some(i)) = (container_mut(pod, t.slot), t.replace)
            && let Some(m) = c.volume_mounts.as_mut().and_then(|ms| ms.get_mut(i))
        {
            *m = model_mount(&t.path, t.sub_path.clone(), true, mode);
        }
    }
    for t in targets.iter().filter(|t| t.replace.is_none()) {
        if let Some(c) = container_mut(pod, t.slot) {
            c.volume_mounts
                .get_or_insert_with(Vec::new)
                .push(model_mount(&t.path, t.sub_path.clone(), true, mode));
        }
    }
}

/// The pod `plan` describes, reading through `mode`; `uid` is the binding's when it is known,
/// `pending` whether the pod waits for something only a controller provides.
pub(crate) fn render(
    pod: &Pod,
    plan: &Plan,
    options: &Options,
    mode: ReaderMode,
    uid: Option<&str>,
    pending: bool,
) -> Pod {
    let mut out = pod.clone();
    let Some(spec) = out.spec.as_mut() else {
        return out;
    };
    let volume = match mode {
        ReaderMode::Pvc => Volume {
            name: MODEL_VOLUME.to_owned(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                // `reader_pvc_name` of the identity, whose hash the plan holds.
                claim_name: format!("{READER_PVC_PREFIX}{}", plan.hash),
                read_only: Some(true),
            }),
            ..Volume::default()
        },
        ReaderMode::HostPath => Volume {
            name: MODEL_VOLUME.to_owned(),
            host_path: Some(HostPathVolumeSource {
                path: format!("{}/{}", options.host_root, plan.hash),
                type_: Some("DirectoryOrCreate".to_owned()),
            }),
            ..Volume::default()
        },
    };
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    volumes.push(volume);
    if plan.scratch {
        volumes.push(Volume {
            name: SCRATCH_VOLUME.to_owned(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        });
    }
    let wait = wait_container(plan, options, mode);
    let inits = spec.init_containers.get_or_insert_with(Vec::new);
    match plan.replace_init {
        Some(i) if i < inits.len() => inits[i] = wait,
        _ => inits.insert(0, wait),
    }
    // A wait container added first shifts the indexes of the init containers' targets.
    let shift = usize::from(plan.replace_init.is_none());
    let targets: Vec<Target> = plan
        .targets
        .iter()
        .map(|t| match t.slot {
            Slot::Init(i) => Target {
                slot: Slot::Init(i + shift),
                ..t.clone()
            },
            Slot::Container(_) => t.clone(),
        })
        .collect();
    mount_targets(&mut out, &targets, mode);
    if let Some(main) = container_mut(&mut out, Slot::Container(plan.main)) {
        for (name, value) in &plan.env {
            set_env(main, name, value);
        }
        if plan.scratch {
            main.volume_mounts
                .get_or_insert_with(Vec::new)
                .push(VolumeMount {
                    name: SCRATCH_VOLUME.to_owned(),
                    mount_path: SCRATCH_PATH.to_owned(),
                    ..VolumeMount::default()
                });
        }
    }
    let labels = out.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(MODEL_LABEL.to_owned(), plan.hash.clone());
    labels.insert(ROLE_LABEL.to_owned(), ROLE_READER.to_owned());
    if pending || mode == ReaderMode::HostPath {
        labels.insert(PENDING_LABEL.to_owned(), "true".to_owned());
    }
    let annotations = out.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.remove(SKIP_REASON_ANNOTATION);
    annotations.remove(SKIP_MESSAGE_ANNOTATION);
    for (k, v) in [
        (BINDING_ANNOTATION, plan.binding_name.clone()),
        (URI_ANNOTATION, plan.uri.clone()),
        (HANDLE_ANNOTATION, plan.handle.to_string()),
        (LANDING_ANNOTATION, plan.landing.clone()),
    ] {
        annotations.insert(k.to_owned(), v);
    }
    // A reader of a captured copy has no step: nothing a Job could run.
    match &plan.step_json {
        Some(step) => annotations.insert(DOWNLOAD_STEP_ANNOTATION.to_owned(), step.clone()),
        None => annotations.remove(DOWNLOAD_STEP_ANNOTATION),
    };
    if let Some(uid) = uid {
        annotations.insert(BINDING_UID_ANNOTATION.to_owned(), uid.to_owned());
    }
    if let Some(t) = &plan.traceparent {
        annotations.insert(TRACE_PARENT_ANNOTATION.to_owned(), t.clone());
    }
    out
}

/// A capture source as admitted: the pod keeps its own download untouched (no volume, mount,
/// container or variable changes); labels and annotations name the binding, the capture handle
/// and where the download lands, for the node agent to capture it once the pod is Ready.
pub(crate) fn render_capture(pod: &Pod, plan: &Plan, capture: &Capture, uid: Option<&str>) -> Pod {
    let mut out = pod.clone();
    let labels = out.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(MODEL_LABEL.to_owned(), plan.hash.clone());
    labels.insert(CAPTURE_LABEL.to_owned(), "true".to_owned());
    let annotations = out.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.remove(SKIP_REASON_ANNOTATION);
    annotations.remove(SKIP_MESSAGE_ANNOTATION);
    annotations.remove(DOWNLOAD_STEP_ANNOTATION);
    for (k, v) in [
        (BINDING_ANNOTATION, plan.binding_name.clone()),
        (URI_ANNOTATION, plan.uri.clone()),
        (HANDLE_ANNOTATION, plan.handle.to_string()),
        (LANDING_ANNOTATION, plan.landing.clone()),
        (CAPTURE_VOLUME_ANNOTATION, capture.volume.clone()),
        (CAPTURE_PATH_ANNOTATION, capture.path.clone()),
    ] {
        annotations.insert(k.to_owned(), v);
    }
    if let Some(uid) = uid {
        annotations.insert(BINDING_UID_ANNOTATION.to_owned(), uid.to_owned());
    }
    if let Some(t) = &plan.traceparent {
        annotations.insert(TRACE_PARENT_ANNOTATION.to_owned(), t.clone());
    }
    out
}

/// The seed script (`sh -c SCRIPT name set scratch dir...`): copies each compile-cache
/// directory of a complete set into the scratch directory, each through a fresh temporary
/// directory renamed into place only when its copy succeeded. It never fails the pod: a set that
/// is not complete, or a directory that does not copy, leaves the engine to compile on its own.
pub(crate) fn seed_script() -> String {
    format!(
        r#"set -u
src="$1"; dst="$2"; shift 2
if [ ! -e "$src/{COMPLETE_MARKER}" ]; then
  echo "nvsnap: the compile-cache set is not complete; the engine compiles on its own"
  exit 0
fi
seeded=0
for d in "$@"; do
  if [ -L "$src/$d" ] || [ ! -d "$src/$d" ]; then continue; fi
  tmp="$dst/.nvsnap-seed.$$"
  rm -rf "$tmp"
  if mkdir -p "$tmp" && cp -R "$src/$d/." "$tmp/" && mkdir -p "$(dirname "$dst/$d")" && rm -rf "$dst/$d" && mv "$tmp" "$dst/$d"; then
    seeded=$((seeded + 1))
  else
    echo "nvsnap: $d was not seeded; the engine compiles it on its own" >&2
    rm -rf "$tmp"
  fi
done
echo "nvsnap: $seeded compile-cache directories seeded"
exit 0"#
    )
}

/// The directories of a set, relative to the scratch directory (and to the set's root).
pub(crate) fn set_directories() -> Vec<String> {
    crate::cacheset::COMPILE_CACHE_VARIABLES
        .iter()
        .map(|(_, sub)| (*sub).to_owned())
        .chain([crate::cacheset::MODULES_CACHE_DIR.to_owned()])
        .collect()
}

/// How a pod takes part in its compile-cache set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SetRole {
    /// The set is not complete: once Ready, the pod's caches may be collected into it.
    Capture,
    /// The set is complete and the namespace has its view: the pod starts from it.
    Seed,
    /// The set is complete but the namespace has no view yet: the pod compiles on its own (its
    /// reference makes the binding controller add the view for the next pods).
    Local,
}

/// `pod` (already rendered for its model) with its compile-cache set: the compile-cache
/// variables and the scratch directory on the main container, the set's label and annotations,
/// and by `role` the capture label or the seed volume and container. `uid` is the set binding's
/// when it is known.
pub(crate) fn render_cache_set(
    mut pod: Pod,
    plan: &Plan,
    set: &CacheSet,
    options: &Options,
    role: SetRole,
    uid: Option<&str>,
) -> Pod {
    let Some(spec) = pod.spec.as_mut() else {
        return pod;
    };
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    if !volumes.iter().any(|v| v.name == SCRATCH_VOLUME) {
        volumes.push(Volume {
            name: SCRATCH_VOLUME.to_owned(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        });
    }
    if role == SetRole::Seed {
        volumes.push(Volume {
            name: SEED_VOLUME.to_owned(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: reader_pvc_name(&set.identity),
                read_only: Some(true),
            }),
            ..Volume::default()
        });
        let mut args = vec![
            SEED_CONTAINER.to_owned(),
            SEED_MOUNT_PATH.to_owned(),
            SCRATCH_PATH.to_owned(),
        ];
        args.extend(set_directories());
        spec.init_containers
            .get_or_insert_with(Vec::new)
            .push(Container {
                name: SEED_CONTAINER.to_owned(),
                image: Some(set.image.clone()),
                image_pull_policy: set.image_pull_policy.clone(),
                command: Some(vec!["/bin/sh".to_owned(), "-c".to_owned(), seed_script()]),
                args: Some(args),
                volume_mounts: Some(vec![
                    VolumeMount {
                        name: SEED_VOLUME.to_owned(),
                        mount_path: SEED_MOUNT_PATH.to_owned(),
                        read_only: Some(true),
                        ..VolumeMount::default()
                    },
                    VolumeMount {
                        name: SCRATCH_VOLUME.to_owned(),
                        mount_path: SCRATCH_PATH.to_owned(),
                        ..VolumeMount::default()
                    },
                ]),
                resources: Some(options.wait_resources.clone()),
                security_context: Some(hardened(plan.wait.user, plan.wait.group, true)),
                termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
                ..Container::default()
            });
    }
    if let Some(main) = container_mut(&mut pod, Slot::Container(plan.main)) {
        for (name, value) in &set.env {
            set_env(main, name, value);
        }
        let mounts = main.volume_mounts.get_or_insert_with(Vec::new);
        if !mounts.iter().any(|m| m.name == SCRATCH_VOLUME) {
            mounts.push(VolumeMount {
                name: SCRATCH_VOLUME.to_owned(),
                mount_path: SCRATCH_PATH.to_owned(),
                ..VolumeMount::default()
            });
        }
    }
    let labels = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(CACHE_KEY_LABEL.to_owned(), set.hash.clone());
    if role == SetRole::Capture {
        labels.insert(CACHE_CAPTURE_LABEL.to_owned(), "true".to_owned());
    } else {
        labels.remove(CACHE_CAPTURE_LABEL);
    }
    let annotations = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    for (k, v) in [
        (CACHE_BINDING_ANNOTATION, set.binding_name.clone()),
        (CACHE_HANDLE_ANNOTATION, set.handle.clone()),
        (CACHE_ORDINAL_ANNOTATION, set.rank.to_string()),
    ] {
        annotations.insert(k.to_owned(), v);
    }
    match uid {
        Some(uid) => annotations.insert(CACHE_BINDING_UID_ANNOTATION.to_owned(), uid.to_owned()),
        None => annotations.remove(CACHE_BINDING_UID_ANNOTATION),
    };
    pod
}

/// `pod` without its compile-cache set's labels and annotations (its set binding could not be
/// created or joined): it keeps its compile caches in its scratch directory, and is neither
/// collected from nor a reference of the set.
pub(crate) fn without_cache_set(mut pod: Pod) -> Pod {
    if let Some(labels) = pod.metadata.labels.as_mut() {
        labels.remove(CACHE_KEY_LABEL);
        labels.remove(CACHE_CAPTURE_LABEL);
    }
    if let Some(annotations) = pod.metadata.annotations.as_mut() {
        for k in [
            CACHE_BINDING_ANNOTATION,
            CACHE_BINDING_UID_ANNOTATION,
            CACHE_HANDLE_ANNOTATION,
            CACHE_ORDINAL_ANNOTATION,
        ] {
            annotations.remove(k);
        }
    }
    pod
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_env_replaces_and_dedups() {
        let mut c = Container {
            env: Some(vec![
                EnvVar {
                    name: "A".into(),
                    value: Some("1".into()),
                    value_from: None,
                },
                EnvVar {
                    name: "B".into(),
                    value: Some("2".into()),
                    value_from: None,
                },
                EnvVar {
                    name: "A".into(),
                    value: Some("3".into()),
                    value_from: None,
                },
            ]),
            ..Container::default()
        };
        set_env(&mut c, "A", "x");
        set_env(&mut c, "C", "y");
        let env: Vec<(String, Option<String>)> = c
            .env
            .unwrap()
            .into_iter()
            .map(|e| (e.name, e.value))
            .collect();
        assert_eq!(
            env,
            vec![
                ("A".into(), Some("x".into())),
                ("B".into(), Some("2".into())),
                ("C".into(), Some("y".into())),
            ]
        );
    }

    /// Runs the seed script in a real shell from `set` into `scratch`.
    fn seed(set: &std::path::Path, scratch: &std::path::Path) -> std::process::Output {
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(seed_script())
            .arg(SEED_CONTAINER)
            .arg(set)
            .arg(scratch)
            .args(set_directories());
        cmd.output().unwrap()
    }

    #[test]
    fn the_seed_script_copies_a_complete_set_and_never_fails_the_pod() {
        let root = std::env::temp_dir().join(format!("seed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let set = root.join("set");
        let scratch = root.join("scratch");
        std::fs::create_dir_all(set.join(".triton/cache/k1")).unwrap();
        std::fs::create_dir_all(set.join("torchinductor/fx")).unwrap();
        std::fs::create_dir_all(&scratch).unwrap();
        std::fs::write(set.join(".triton/cache/k1/kernel.cubin"), b"cubin").unwrap();
        std::fs::write(set.join("torchinductor/fx/graph"), b"graph").unwrap();
        std::fs::write(set.join("stray"), b"not a cache").unwrap();
        // Not complete: nothing is copied, and the pod starts.
        let out = seed(&set, &scratch);
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains("not complete"));
        assert_eq!(std::fs::read_dir(&scratch).unwrap().count(), 0);
        // Complete: the cache directories land in place, nothing else does.
        std::fs::write(set.join(COMPLETE_MARKER), b"10").unwrap();
        // A stale partial directory of an earlier start is replaced whole.
        std::fs::create_dir_all(scratch.join("torchinductor/old")).unwrap();
        let out = seed(&set, &scratch);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            std::fs::read(scratch.join(".triton/cache/k1/kernel.cubin")).unwrap(),
            b"cubin"
        );
        assert_eq!(
            std::fs::read(scratch.join("torchinductor/fx/graph")).unwrap(),
            b"graph"
        );
        assert!(!scratch.join("torchinductor/old").exists());
        assert!(!scratch.join("stray").exists());
        assert!(!scratch.join(COMPLETE_MARKER).exists());
        let left: Vec<String> = std::fs::read_dir(&scratch)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".nvsnap-seed"))
            .collect();
        assert!(left.is_empty(), "no temporary directory left: {left:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("2 compile-cache directories seeded")
        );
        // A scratch path it cannot copy into (a file, even for root): each directory is
        // reported, and the pod still starts.
        let file = root.join("file");
        std::fs::write(&file, b"x").unwrap();
        let out = seed(&set, &file);
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("was not seeded"));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("0 compile-cache directories seeded")
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn the_wait_script_names_the_markers() {
        let s = wait_script();
        assert!(s.contains(COMPLETE_MARKER));
        assert!(s.contains(FAILURE_MARKER));
        assert!(s.contains("exit 1"));
        assert!(s.contains("exec \"$@\""));
    }
}
