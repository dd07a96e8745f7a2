//! The writer (download) Job of a cache, built from the [`DownloadStep`] the webhook recorded on
//! a reading pod.
//!
//! The Job runs in the binding's writer namespace (where the step's credentials are), under the
//! deterministic name [`writer_job_name`], so creating it is the election: a second create
//! answers AlreadyExists. Its one container is the step's, with:
//!
//! - the command re-wrapped as `/bin/sh -c` [`writer_script`] `<dest> <original argv...>`: the
//!   wrapper exits 0 at once when the completion marker exists, removes a stale failure marker,
//!   runs the download, syncs, measures the bytes (`du -sb`, or `du -sk` times 1024 where `-b`
//!   is missing) and writes them into the completion marker and the termination message; on a
//!   failure it writes the last lines of the download's output into the failure marker and the
//!   termination message and exits 1;
//! - the landing volume replaced by the cache: the writer view claim `rw-pvc-<hash>` (RWX flow)
//!   mounted read-write at the step's `dest`; the step's other volumes as they were;
//! - hardening: no service-account token, every capability dropped, no privilege escalation,
//!   seccomp `RuntimeDefault`, requests and limits (the step's, else [`WriterOptions`]'s), an
//!   active deadline and a TTL;
//! - the writer identity of the decision: `fsGroup` keeps the writer non-root (the step's user,
//!   else [`crate::DEFAULT_NON_ROOT_USER`]) with the pod's `fsGroup` set, so a driver applying
//!   fsGroup makes a fresh root-owned export writable; `root` runs the writer as uid 0 (still
//!   without capabilities: it owns the fresh export, so it may write it), unless the node agent
//!   opens fresh roots ([`WriterOptions::open_root_wait_seconds`]): then the writer stays
//!   non-root too, its pod is labelled [`OPEN_ROOT_LABEL`], and the wrapper waits until the agent
//!   of its node has given the volume's root to the writer's user (see
//!   [`crate::open_root::open_root_request`]).
//!
//! # The staging Job (roxReadOnly, block storage)
//!
//! A block volume is written once and then read through read-only attachments, and its size
//! should follow the bytes, which are known only after the download. So the same step runs as
//! the init container `download` into an emptyDir ([`STAGING_VOLUME`], named by the pod
//! annotation [`STAGING_VOLUME_ANNOTATION`]); then the container [`HOLD_CONTAINER`] keeps the
//! pod (and so the emptyDir) until the node agent has measured the tree, created the primary
//! claim sized from it, copied the tree into it and recorded the copy. The agent answers
//! through a second, small emptyDir ([`HANDOFF_VOLUME`]): [`HANDOFF_COPIED`] makes the hold
//! exit 0 (the Job completes), [`HANDOFF_FAILED`] (three failed copies) makes it write the
//! agent's words into its termination message and exit [`HOLD_FAILED_EXIT_CODE`], which the
//! Job's pod failure policy turns into a failed Job at once (no second download).

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement, PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, PersistentVolumeClaimVolumeSource,
    PodSecurityContext, PodSpec, PodTemplateSpec, ResourceRequirements, SeccompProfile,
    SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use warmcache_api_modelcache::v2beta1::{ModelCacheBinding, Transition, WriterIdentity};
use warmcache_api_modelcache::{identity_hash, writer_job_name, writer_pvc_name};

use crate::keys::{
    BINDING_ANNOTATION, COMPLETE_MARKER, FAILURE_MARKER, MANAGED_BY_LABEL, MANAGED_BY_VALUE,
    MODEL_VOLUME, REVISION_FILE,
};
use crate::options::DEFAULT_NON_ROOT_USER;
use crate::step::DownloadStep;
use crate::volume_keys::{
    BINDING_LABEL, BINDING_UID_LABEL_ANNOTATION, ROLE_WRITER, VOLUME_ROLE_LABEL, WRITER_CONTAINER,
};

/// The scratch volume the wrapper keeps the download's output in.
pub const WRITER_TMP_VOLUME: &str = "nvsnap-writer-tmp";
/// Where [`WRITER_TMP_VOLUME`] is mounted.
pub const WRITER_TMP_PATH: &str = "/nvsnap-writer-tmp";

/// Volume names the Job defines itself; a step's volumes of these names are dropped.
const OURS: [&str; 4] = [
    MODEL_VOLUME,
    STAGING_VOLUME,
    HANDOFF_VOLUME,
    WRITER_TMP_VOLUME,
];

/// Default active deadline of a writer Job: 6 hours (nvsnap's safety net).
pub const DEFAULT_ACTIVE_DEADLINE_SECONDS: i64 = 6 * 3600;
/// Default TTL of a finished writer Job: 1 hour, long enough for the controller to read the
/// outcome and as long as a failure is remembered.
pub const DEFAULT_TTL_SECONDS_AFTER_FINISHED: i32 = 3600;
/// Default retries of a failed download pod.
pub const DEFAULT_BACKOFF_LIMIT: i32 = 1;

/// The staging Job's emptyDir the download writes into (roxReadOnly).
pub const STAGING_VOLUME: &str = "nvsnap-staging";
/// Pod annotation of a staging Job's pod: the emptyDir volume holding the staged tree.
pub const STAGING_VOLUME_ANNOTATION: &str = "nvsnap.io/model-staging-volume";
/// The staging Job's container that keeps the pod until the node agent copied the tree.
pub const HOLD_CONTAINER: &str = "hold";
/// The emptyDir through which the node agent answers the hold container.
pub const HANDOFF_VOLUME: &str = "nvsnap-handoff";
/// Where [`HANDOFF_VOLUME`] is mounted in the hold container.
pub const HANDOFF_PATH: &str = "/nvsnap-handoff";
/// File the node agent writes into [`HANDOFF_VOLUME`] once the copy is recorded.
pub const HANDOFF_COPIED: &str = "copied";
/// File the node agent writes into [`HANDOFF_VOLUME`] when it gave up copying (its words).
pub const HANDOFF_FAILED: &str = "failed";
/// Exit code of the hold container after [`HANDOFF_FAILED`]: the pod failure policy fails the
/// Job on it without a retry.
pub const HOLD_FAILED_EXIT_CODE: i32 = 42;
/// Pod label of a staging Job's pod (the node agent watches its node's pods with it).
pub const STAGING_LABEL: &str = "nvsnap.io/model-staging";
/// Pod label (`"true"`) of a non-root writer whose fresh ReadWriteMany root the node agent of
/// its node opens: gives to the writer's user and group, through the pod's kubelet mount.
pub const OPEN_ROOT_LABEL: &str = "warmcache.nvidia.io/open-root";
/// Environment variable of such a writer: how many seconds the wrapper waits for its landing
/// to become writable before it fails with its words.
pub const OPEN_ROOT_WAIT_ENV: &str = "NVSNAP_OPEN_ROOT_WAIT_SECONDS";
/// Default of [`WriterOptions::open_root_wait_seconds`] when the agent opens roots: 10 minutes
/// (the kubelet mounts the volume before the container starts; the agent looks every few
/// seconds).
pub const DEFAULT_OPEN_ROOT_WAIT_SECONDS: u32 = 600;

/// Operator settings of writer Jobs.
#[derive(Debug, Clone, PartialEq)]
pub struct WriterOptions {
    /// Requests and limits when the step has none.
    pub resources: ResourceRequirements,
    /// `spec.activeDeadlineSeconds`.
    pub active_deadline_seconds: i64,
    /// `spec.ttlSecondsAfterFinished`.
    pub ttl_seconds_after_finished: i32,
    /// `spec.backoffLimit`.
    pub backoff_limit: i32,
    /// Whether the node agent opens fresh roots, and how long the writer waits for it: with
    /// `Some(seconds)`, a binding whose writer identity is `root` (a ReadWriteMany driver that
    /// applies no fsGroup: fresh exports are root-owned) gets a non-root writer labelled
    /// [`OPEN_ROOT_LABEL`] instead of a root one, and its wrapper waits up to `seconds` for the
    /// agent to give it the root. `None` (the default; the agent is not deployed): the writer
    /// runs as uid 0.
    pub open_root_wait_seconds: Option<u32>,
}

fn quantities(cpu: &str, memory: &str) -> BTreeMap<String, Quantity> {
    BTreeMap::from([
        ("cpu".to_owned(), Quantity(cpu.to_owned())),
        ("memory".to_owned(), Quantity(memory.to_owned())),
    ])
}

impl Default for WriterOptions {
    /// Requests 1 CPU / 1 GiB, limits 2 CPU / 4 GiB, 6 h deadline, 1 h TTL, one retry.
    fn default() -> Self {
        Self {
            resources: ResourceRequirements {
                requests: Some(quantities("1", "1Gi")),
                limits: Some(quantities("2", "4Gi")),
                ..ResourceRequirements::default()
            },
            active_deadline_seconds: DEFAULT_ACTIVE_DEADLINE_SECONDS,
            ttl_seconds_after_finished: DEFAULT_TTL_SECONDS_AFTER_FINISHED,
            backoff_limit: DEFAULT_BACKOFF_LIMIT,
            open_root_wait_seconds: None,
        }
    }
}

/// Why no writer Job can be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriterError {
    /// The step's container names no command: its image's entrypoint is unknown here, so the
    /// wrapper cannot run it.
    #[error(
        "the download step of container {container} has no command (it relies on its image's entrypoint), so the writer cannot wrap it; give the init container an explicit command"
    )]
    NoCommand {
        /// The step's source container.
        container: String,
    },
    /// The step records another contract version.
    #[error("the download step has contract version {0:?}, expected v1alpha1")]
    Version(String),
    /// The dest is not an absolute path.
    #[error("the download step's dest {0:?} is not an absolute path")]
    Dest(String),
    /// A literal secret the step says to copy from the pod was not found there.
    #[error(
        "the download step copies {name} from container {container}, which the pod does not carry"
    )]
    MissingPodEnv {
        /// The variable.
        name: String,
        /// The container.
        container: String,
    },
}

/// The wrapper the writer's container runs (`sh -c SCRIPT nvsnap-writer <dest> <argv...>`).
/// Every value is a positional parameter, never parsed by the shell.
pub fn writer_script() -> String {
    format!(
        r#"set -u
dest="$1"; shift
tmp={WRITER_TMP_PATH}
words() {{ printf '%s\n' "$1" > /dev/termination-log 2>/dev/null || true; }}
revision() {{
  r=$(find "$dest" -type f \( -path '*/models--*/refs/*' -o -path '*/.cache/huggingface/download/*.metadata' \) \
        ! -path '*/snapshots/*' ! -path '*/blobs/*' \
        -exec sh -c 'for f do head -n 1 "$f" | head -c 64; echo; done' nvsnap-revision {{}} + 2>/dev/null \
      | tr -d ' \r\t' | grep -v '^$' | sort -u)
  case "$r" in *[!0-9a-f]*|'') return 0;; esac
  [ ${{#r}} -eq 40 ] && printf '%s' "$r"
  return 0
}}
recorded() {{
  [ -f "$dest/{REVISION_FILE}" ] || return 0
  r=$(head -c 41 "$dest/{REVISION_FILE}")
  case "$r" in *[!0-9a-f]*|'') return 0;; esac
  [ ${{#r}} -eq 40 ] && printf ' revision=%s' "$r"
  return 0
}}
if [ -e "$dest/{COMPLETE_MARKER}" ]; then
  echo "nvsnap: model already complete"
  words "$(cat "$dest/{COMPLETE_MARKER}")$(recorded)"
  exit 0
fi
wait_open=${{{OPEN_ROOT_WAIT_ENV}:-0}}
if [ "$wait_open" -gt 0 ] 2>/dev/null && [ ! -w "$dest" ]; then
  echo "nvsnap: waiting up to ${{wait_open}}s for the node agent to open $dest for uid $(id -u)"
  waited=0
  while [ ! -w "$dest" ]; do
    if [ "$waited" -ge "$wait_open" ]; then
      last="nvsnap: $dest was not opened for uid $(id -u) within ${{wait_open}}s; is the node agent (model-volume-controller) running on this node?"
      echo "$last"
      words "$last"
      exit 1
    fi
    sleep 1
    waited=$((waited + 1))
  done
  echo "nvsnap: $dest is writable"
fi
rm -f "$dest/{FAILURE_MARKER}" "$dest/{REVISION_FILE}"
( "$@"; echo "$?" > "$tmp/rc" ) 2>&1 | tee "$tmp/log"
rc=$(cat "$tmp/rc" 2>/dev/null || echo 127)
if [ "$rc" != 0 ]; then
  last="nvsnap: download exited $rc: $(tail -n 20 "$tmp/log" | tail -c 2048)"
  printf '%s\n' "$last" > "$dest/{FAILURE_MARKER}" 2>/dev/null || true
  sync
  words "$last"
  exit 1
fi
sync
n=$(du -sb "$dest" 2>/dev/null | cut -f1)
case "$n" in ''|*[!0-9]*) n=$(( $(du -sk "$dest" | cut -f1) * 1024 ));; esac
rev=$(revision)
if [ -n "$rev" ]; then
  printf '%s' "$rev" > "$dest/{REVISION_FILE}.tmp" && mv "$dest/{REVISION_FILE}.tmp" "$dest/{REVISION_FILE}"
  echo "nvsnap: the download resolved commit $rev"
fi
printf '%s' "$n" > "$dest/{COMPLETE_MARKER}.tmp" && mv "$dest/{COMPLETE_MARKER}.tmp" "$dest/{COMPLETE_MARKER}"
sync
words "$n$(recorded)"
echo "nvsnap: model complete, $n bytes""#
    )
}

/// The byte count a successful writer left in its termination message (`<bytes>[
/// revision=<commit>]`), if it is one.
pub fn bytes_from_termination_message(message: &str) -> Option<u64> {
    // The first word; later `key=value` words (the revision, and what later versions add) do
    // not change it. A failure's words never start with a number.
    let mut words = message.split_whitespace();
    let bytes = words.next()?.parse().ok()?;
    words.all(|w| w.contains('=')).then_some(bytes)
}

/// The commit a successful writer resolved (`<bytes> revision=<40 lowercase hex>` in its
/// termination message): the Hugging Face cache's `refs/<revision>`, or the commit `hf download
/// --local-dir` records for its files; `None` when the message holds none (another source, or
/// the files named several commits).
pub fn revision_from_termination_message(message: &str) -> Option<String> {
    bytes_from_termination_message(message)?;
    message
        .split_whitespace()
        .find_map(|w| w.strip_prefix("revision="))
        .filter(|r| crate::handle::is_commit(r))
        .map(str::to_owned)
}

/// The hold container's loop (`sh -c SCRIPT nvsnap-hold <handoff dir>`): exit 0 on
/// [`HANDOFF_COPIED`]; on [`HANDOFF_FAILED`] its words go to the termination message and the
/// exit code is [`HOLD_FAILED_EXIT_CODE`]. A TERM (the Job's deadline, a deletion) ends it at
/// once.
pub fn hold_script() -> String {
    format!(
        r#"set -u
dir="$1"
trap 'exit 143' TERM INT
echo "nvsnap: staged; waiting for the node agent's copy"
while :; do
  if [ -e "$dir/{HANDOFF_COPIED}" ]; then
    echo "nvsnap: copied by the node agent"
    exit 0
  fi
  if [ -e "$dir/{HANDOFF_FAILED}" ]; then
    words="nvsnap: the node agent could not copy the staged download: $(head -c 2048 "$dir/{HANDOFF_FAILED}")"
    printf '%s
' "$words" > /dev/termination-log 2>/dev/null || true
    echo "$words"
    exit {HOLD_FAILED_EXIT_CODE}
  fi
  sleep 2 &
  wait $!
done"#
    )
}

fn hardened(user: i64, non_root: bool) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            add: None,
            drop: Some(vec!["ALL".to_owned()]),
        }),
        privileged: Some(false),
        run_as_non_root: Some(non_root),
        run_as_user: Some(user),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            localhost_profile: None,
        }),
        ..SecurityContext::default()
    }
}

/// The writer's user: the step's container user, else its pod's, when not root, else
/// [`DEFAULT_NON_ROOT_USER`].
fn non_root_user(step: &DownloadStep) -> i64 {
    step.container
        .security_context
        .as_ref()
        .and_then(|s| s.run_as_user)
        .or_else(|| {
            step.pod_security_context
                .as_ref()
                .and_then(|s| s.run_as_user)
        })
        .filter(|u| *u != 0)
        .unwrap_or(DEFAULT_NON_ROOT_USER)
}

/// The group of a writer whose root the agent opens: the step's container group, else its pod's,
/// else the pod's fsGroup, else the user's own number.
fn open_root_group(step: &DownloadStep, user: i64) -> i64 {
    step.container
        .security_context
        .as_ref()
        .and_then(|s| s.run_as_group)
        .or_else(|| {
            step.pod_security_context
                .as_ref()
                .and_then(|s| s.run_as_group.or(s.fs_group))
        })
        .unwrap_or(user)
}

/// The writer Job of `binding` running `step`; `pod_env` holds the values of the literal
/// secrets the step copies from the pod ([`DownloadStep::env_from_pod`]), read by the caller
/// from the pod's spec.
///
/// # Errors
///
/// [`WriterError`] when the step cannot be wrapped (no command, another contract version, a
/// relative dest, a copied variable missing). For a roxReadOnly binding the Job is the
/// staging Job (see the module documentation).
pub fn writer_job(
    binding: &ModelCacheBinding,
    step: &DownloadStep,
    pod_env: &[EnvVar],
    options: &WriterOptions,
) -> Result<Job, WriterError> {
    writer_job_in(
        binding,
        &binding.spec.resources.writer_namespace,
        step,
        pod_env,
        options,
    )
}

/// [`writer_job`] in `namespace` (the writer the Lease names, see [`crate::lease`]).
///
/// # Errors
///
/// As [`writer_job`].
pub fn writer_job_in(
    binding: &ModelCacheBinding,
    namespace: &str,
    step: &DownloadStep,
    pod_env: &[EnvVar],
    options: &WriterOptions,
) -> Result<Job, WriterError> {
    let staged = binding.spec.decision.transition == Transition::RoxReadOnly;
    if step.version != crate::keys::DOWNLOAD_STEP_VERSION {
        return Err(WriterError::Version(step.version.clone()));
    }
    if !step.dest.starts_with('/') {
        return Err(WriterError::Dest(step.dest.clone()));
    }
    let source = &step.container;
    let Some(command) = source.command.clone().filter(|c| !c.is_empty()) else {
        return Err(WriterError::NoCommand {
            container: step.source_container.clone(),
        });
    };
    let mut args = vec!["nvsnap-writer".to_owned(), step.dest.clone()];
    args.extend(command);
    args.extend(source.args.clone().unwrap_or_default());

    let mut env = source.env.clone().unwrap_or_default();
    for r in &step.env_from_pod {
        let Some(v) = pod_env.iter().find(|e| e.name == r.name) else {
            return Err(WriterError::MissingPodEnv {
                name: r.name.clone(),
                container: r.container.clone(),
            });
        };
        env.retain(|e| e.name != r.name);
        env.push(v.clone());
    }

    let landing = step.landing_volume.as_deref();
    let mut mounts: Vec<VolumeMount> = source
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| Some(m.name.as_str()) != landing && !OURS.contains(&m.name.as_str()))
        .cloned()
        .collect();
    mounts.push(VolumeMount {
        name: if staged { STAGING_VOLUME } else { MODEL_VOLUME }.to_owned(),
        mount_path: step.dest.clone(),
        ..VolumeMount::default()
    });
    mounts.push(VolumeMount {
        name: WRITER_TMP_VOLUME.to_owned(),
        mount_path: WRITER_TMP_PATH.to_owned(),
        ..VolumeMount::default()
    });
    let mut volumes: Vec<Volume> = step
        .volumes
        .iter()
        .filter(|v| Some(v.name.as_str()) != landing && !OURS.contains(&v.name.as_str()))
        .cloned()
        .collect();
    if staged {
        volumes.push(Volume {
            name: STAGING_VOLUME.to_owned(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        });
        volumes.push(Volume {
            name: HANDOFF_VOLUME.to_owned(),
            empty_dir: Some(EmptyDirVolumeSource {
                size_limit: Some(Quantity("1Mi".to_owned())),
                ..EmptyDirVolumeSource::default()
            }),
            ..Volume::default()
        });
    } else {
        volumes.push(Volume {
            name: MODEL_VOLUME.to_owned(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: writer_pvc_name(&binding.spec.identity),
                read_only: Some(false),
            }),
            ..Volume::default()
        });
    }
    volumes.push(Volume {
        name: WRITER_TMP_VOLUME.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity("64Mi".to_owned())),
            ..EmptyDirVolumeSource::default()
        }),
        ..Volume::default()
    });

    let identity = binding
        .spec
        .decision
        .writer_identity
        .unwrap_or(WriterIdentity::FsGroup);
    let opened = identity == WriterIdentity::Root
        && !staged
        && options.open_root_wait_seconds.is_some_and(|s| s > 0);
    let (security, pod_security) = match identity {
        WriterIdentity::Root if !opened => (
            hardened(0, false),
            PodSecurityContext {
                run_as_user: Some(0),
                run_as_non_root: Some(false),
                ..PodSecurityContext::default()
            },
        ),
        WriterIdentity::Root | WriterIdentity::FsGroup => {
            let user = non_root_user(step);
            let group = step
                .pod_security_context
                .as_ref()
                .and_then(|s| s.fs_group)
                .unwrap_or(user);
            (
                hardened(user, true),
                PodSecurityContext {
                    run_as_user: Some(user),
                    run_as_non_root: Some(true),
                    fs_group: Some(group),
                    fs_group_change_policy: Some("OnRootMismatch".to_owned()),
                    ..PodSecurityContext::default()
                },
            )
        }
    };
    let mut pod_security = pod_security;
    pod_security.seccomp_profile = Some(SeccompProfile {
        type_: "RuntimeDefault".to_owned(),
        localhost_profile: None,
    });
    let mut security = security;
    security.run_as_group = source
        .security_context
        .as_ref()
        .and_then(|s| s.run_as_group);
    if opened {
        // The group the agent gives the root to: fixed here, so the writer's own group is known
        // (an image without the user in /etc/passwd would otherwise run it with group 0).
        security.run_as_group = Some(open_root_group(step, non_root_user(step)));
        env.retain(|e| e.name != OPEN_ROOT_WAIT_ENV);
        env.push(EnvVar {
            name: OPEN_ROOT_WAIT_ENV.to_owned(),
            value: options.open_root_wait_seconds.map(|s| s.to_string()),
            value_from: None,
        });
    }

    let resources = source
        .resources
        .clone()
        .filter(|r| r.requests.is_some() || r.limits.is_some())
        .unwrap_or_else(|| options.resources.clone());

    let hold = staged.then(|| Container {
        name: HOLD_CONTAINER.to_owned(),
        image: source.image.clone(),
        image_pull_policy: source.image_pull_policy.clone(),
        command: Some(vec!["/bin/sh".to_owned(), "-c".to_owned(), hold_script()]),
        args: Some(vec!["nvsnap-hold".to_owned(), HANDOFF_PATH.to_owned()]),
        volume_mounts: Some(vec![VolumeMount {
            name: HANDOFF_VOLUME.to_owned(),
            mount_path: HANDOFF_PATH.to_owned(),
            read_only: Some(true),
            ..VolumeMount::default()
        }]),
        resources: Some(ResourceRequirements {
            requests: Some(quantities("10m", "16Mi")),
            limits: Some(quantities("100m", "64Mi")),
            ..ResourceRequirements::default()
        }),
        security_context: Some(security.clone()),
        termination_message_policy: Some("File".to_owned()),
        ..Container::default()
    });
    let container = Container {
        name: WRITER_CONTAINER.to_owned(),
        image: source.image.clone(),
        image_pull_policy: source.image_pull_policy.clone(),
        command: Some(vec!["/bin/sh".to_owned(), "-c".to_owned(), writer_script()]),
        args: Some(args),
        env: Some(env).filter(|e| !e.is_empty()),
        env_from: source.env_from.clone(),
        working_dir: source.working_dir.clone(),
        volume_mounts: Some(mounts),
        resources: Some(resources),
        security_context: Some(security),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Container::default()
    };

    let name = binding.metadata.name.clone().unwrap_or_default();
    let mut labels = BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned()),
        (VOLUME_ROLE_LABEL.to_owned(), ROLE_WRITER.to_owned()),
        (BINDING_LABEL.to_owned(), name.clone()),
        (
            "nvsnap.io/writer".to_owned(),
            identity_hash(&binding.spec.identity),
        ),
    ]);
    let annotations = BTreeMap::from([
        (BINDING_ANNOTATION.to_owned(), name),
        (
            BINDING_UID_LABEL_ANNOTATION.to_owned(),
            binding.metadata.uid.clone().unwrap_or_default(),
        ),
    ]);
    if opened {
        labels.insert(OPEN_ROOT_LABEL.to_owned(), "true".to_owned());
    }
    let mut pod_annotations = BTreeMap::new();
    if opened {
        // The agent checks the pod against the binding it names.
        pod_annotations.clone_from(&annotations);
    }
    if staged {
        labels.insert(STAGING_LABEL.to_owned(), "true".to_owned());
        pod_annotations.clone_from(&annotations);
        pod_annotations.insert(
            STAGING_VOLUME_ANNOTATION.to_owned(),
            STAGING_VOLUME.to_owned(),
        );
    }
    let (init_containers, containers) = match hold {
        Some(hold) => (Some(vec![container]), vec![hold]),
        None => (None, vec![container]),
    };
    // The agent's "gave up" fails the Job at once: a second pod would download again.
    let pod_failure_policy = staged.then(|| PodFailurePolicy {
        rules: vec![PodFailurePolicyRule {
            action: "FailJob".to_owned(),
            on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                container_name: Some(HOLD_CONTAINER.to_owned()),
                operator: "In".to_owned(),
                values: vec![HOLD_FAILED_EXIT_CODE],
            }),
            on_pod_conditions: None,
        }],
    });
    Ok(Job {
        metadata: ObjectMeta {
            name: Some(writer_job_name(&binding.spec.identity)),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels.clone()),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(options.backoff_limit),
            active_deadline_seconds: Some(options.active_deadline_seconds),
            ttl_seconds_after_finished: Some(options.ttl_seconds_after_finished),
            pod_failure_policy,
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    annotations: Some(pod_annotations).filter(|a| !a.is_empty()),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".to_owned()),
                    automount_service_account_token: Some(false),
                    enable_service_links: Some(false),
                    service_account_name: step.service_account_name.clone(),
                    image_pull_secrets: Some(step.image_pull_secrets.clone())
                        .filter(|s| !s.is_empty()),
                    security_context: Some(pod_security),
                    init_containers,
                    containers,
                    volumes: Some(volumes),
                    ..PodSpec::default()
                }),
            },
            ..JobSpec::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::PodEnvRef;
    use crate::testing::{binding, init_step};

    fn pod_spec(job: &Job) -> &PodSpec {
        job.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
    }

    #[test]
    fn the_job_is_hardened_and_deterministic() {
        let b = binding(Transition::RwxReadOnly);
        let job = writer_job(&b, &init_step(), &[], &WriterOptions::default()).unwrap();
        assert_eq!(job.metadata.name, Some(writer_job_name(&b.spec.identity)));
        assert_eq!(job.metadata.namespace.as_deref(), Some("team-a"));
        let spec = job.spec.as_ref().unwrap();
        assert_eq!(spec.active_deadline_seconds, Some(6 * 3600));
        assert_eq!(spec.ttl_seconds_after_finished, Some(3600));
        let pod = pod_spec(&job);
        assert_eq!(pod.automount_service_account_token, Some(false));
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        assert_eq!(pod.service_account_name.as_deref(), Some("puller"));
        let c = &pod.containers[0];
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.privileged, Some(false));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop,
            Some(vec!["ALL".to_owned()])
        );
        assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
        let r = c.resources.as_ref().unwrap();
        assert!(r.requests.is_some() && r.limits.is_some());
        // Built twice, the same Job.
        assert_eq!(
            job,
            writer_job(&b, &init_step(), &[], &WriterOptions::default()).unwrap()
        );
    }

    #[test]
    fn the_landing_is_replaced_by_the_writer_view() {
        let b = binding(Transition::RwxReadOnly);
        let job = writer_job(&b, &init_step(), &[], &WriterOptions::default()).unwrap();
        let pod = pod_spec(&job);
        let volumes = pod.volumes.as_ref().unwrap();
        let names: Vec<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["certs", MODEL_VOLUME, WRITER_TMP_VOLUME]);
        let model = volumes.iter().find(|v| v.name == MODEL_VOLUME).unwrap();
        let claim = model.persistent_volume_claim.as_ref().unwrap();
        assert_eq!(claim.claim_name, writer_pvc_name(&b.spec.identity));
        assert_eq!(claim.read_only, Some(false));
        let mounts = pod.containers[0].volume_mounts.as_ref().unwrap();
        let at: Vec<(&str, &str)> = mounts
            .iter()
            .map(|m| (m.name.as_str(), m.mount_path.as_str()))
            .collect();
        assert_eq!(
            at,
            [
                ("certs", "/certs"),
                (MODEL_VOLUME, "/models/qwen3"),
                (WRITER_TMP_VOLUME, WRITER_TMP_PATH)
            ]
        );
        let args = pod.containers[0].args.as_ref().unwrap();
        assert_eq!(
            args,
            &[
                "nvsnap-writer",
                "/models/qwen3",
                "hf",
                "download",
                "Qwen/Qwen3-0.6B",
                "--local-dir",
                "/models/qwen3"
            ]
        );
        assert_eq!(
            pod.containers[0].command.as_ref().unwrap()[..2],
            ["/bin/sh".to_owned(), "-c".to_owned()]
        );
    }

    #[test]
    fn writer_identity_decides_user_and_fs_group() {
        let b = binding(Transition::RwxReadOnly);
        let job = writer_job(&b, &init_step(), &[], &WriterOptions::default()).unwrap();
        let pod = pod_spec(&job);
        let psc = pod.security_context.as_ref().unwrap();
        assert_eq!(psc.fs_group, Some(DEFAULT_NON_ROOT_USER));
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(
            pod.containers[0]
                .security_context
                .as_ref()
                .unwrap()
                .run_as_user,
            Some(DEFAULT_NON_ROOT_USER)
        );
        // The step's own non-root user and fsGroup are kept.
        let mut step = init_step();
        step.pod_security_context = Some(PodSecurityContext {
            run_as_user: Some(1000),
            fs_group: Some(2000),
            ..PodSecurityContext::default()
        });
        let job = writer_job(&b, &step, &[], &WriterOptions::default()).unwrap();
        let pod = pod_spec(&job);
        assert_eq!(pod.security_context.as_ref().unwrap().fs_group, Some(2000));
        assert_eq!(
            pod.security_context.as_ref().unwrap().run_as_user,
            Some(1000)
        );

        let mut root = binding(Transition::RwxReadOnly);
        root.spec.decision.writer_identity = Some(WriterIdentity::Root);
        let job = writer_job(&root, &init_step(), &[], &WriterOptions::default()).unwrap();
        let pod = pod_spec(&job);
        let psc = pod.security_context.as_ref().unwrap();
        assert_eq!(psc.run_as_user, Some(0));
        assert_eq!(psc.run_as_non_root, Some(false));
        assert_eq!(psc.fs_group, None);
        let sc = pod.containers[0].security_context.as_ref().unwrap();
        assert_eq!(sc.run_as_user, Some(0));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop,
            Some(vec!["ALL".to_owned()]),
            "root without capabilities"
        );
    }

    #[test]
    fn steps_that_cannot_be_wrapped_are_refused() {
        let b = binding(Transition::RwxReadOnly);
        let mut step = init_step();
        step.container.command = None;
        assert!(matches!(
            writer_job(&b, &step, &[], &WriterOptions::default()),
            Err(WriterError::NoCommand { .. })
        ));
        let mut step = init_step();
        step.dest = "models".into();
        assert!(matches!(
            writer_job(&b, &step, &[], &WriterOptions::default()),
            Err(WriterError::Dest(_))
        ));
        let mut step = init_step();
        step.env_from_pod = vec![PodEnvRef {
            name: "HF_TOKEN".into(),
            container: "vllm".into(),
        }];
        assert!(matches!(
            writer_job(&b, &step, &[], &WriterOptions::default()),
            Err(WriterError::MissingPodEnv { .. })
        ));
        let token = EnvVar {
            name: "HF_TOKEN".into(),
            value: Some("hf_x".into()),
            value_from: None,
        };
        let job = writer_job(
            &b,
            &step,
            std::slice::from_ref(&token),
            &WriterOptions::default(),
        )
        .unwrap();
        assert_eq!(
            pod_spec(&job).containers[0].env.as_ref().unwrap(),
            &vec![token]
        );
    }

    #[test]
    fn termination_messages_carry_bytes() {
        assert_eq!(bytes_from_termination_message("1234\n"), Some(1234));
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let with = format!("1234 revision={sha}\n");
        assert_eq!(bytes_from_termination_message(&with), Some(1234));
        assert_eq!(
            revision_from_termination_message(&with).as_deref(),
            Some(sha)
        );
        assert_eq!(revision_from_termination_message("1234"), None);
        assert_eq!(
            revision_from_termination_message("1234 revision=main"),
            None
        );
        assert_eq!(bytes_from_termination_message("1234 and more"), None);
        assert_eq!(
            bytes_from_termination_message(&format!("1234 revision={sha} later=1")),
            Some(1234),
            "words a later version adds are ignored"
        );
        assert_eq!(
            bytes_from_termination_message("1234 revision=garbage"),
            Some(1234)
        );
        assert_eq!(
            revision_from_termination_message(&format!("x revision={sha}")),
            None
        );
        assert_eq!(
            bytes_from_termination_message("nvsnap: download exited 1: boom"),
            None
        );
    }

    #[test]
    fn a_block_binding_gets_a_staging_job() {
        let b = binding(Transition::RoxReadOnly);
        let job = writer_job(&b, &init_step(), &[], &WriterOptions::default()).unwrap();
        let spec = job.spec.as_ref().unwrap();
        let template = &spec.template;
        let pod = template.spec.as_ref().unwrap();
        // The download is the init container, into the staging emptyDir at the step's dest.
        let inits = pod.init_containers.as_ref().unwrap();
        assert_eq!(inits.len(), 1);
        assert_eq!(inits[0].name, WRITER_CONTAINER);
        let mounts = inits[0].volume_mounts.as_ref().unwrap();
        let dest = mounts
            .iter()
            .find(|m| m.mount_path == init_step().dest)
            .unwrap();
        assert_eq!(dest.name, STAGING_VOLUME);
        let volumes = pod.volumes.as_ref().unwrap();
        let staging = volumes.iter().find(|v| v.name == STAGING_VOLUME).unwrap();
        assert!(staging.empty_dir.is_some());
        assert!(
            volumes.iter().all(|v| v.persistent_volume_claim.is_none()),
            "no claim: the agent creates the primary from the measured bytes"
        );
        // The hold keeps the pod until the agent answers through the handoff volume.
        assert_eq!(pod.containers.len(), 1);
        let hold = &pod.containers[0];
        assert_eq!(hold.name, HOLD_CONTAINER);
        assert_eq!(hold.image, inits[0].image);
        assert_eq!(
            hold.args.as_deref(),
            Some(&["nvsnap-hold".to_owned(), HANDOFF_PATH.to_owned()][..])
        );
        let sc = hold.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop,
            Some(vec!["ALL".to_owned()])
        );
        // The agent finds the pod and its staging volume by label and annotation.
        let meta = template.metadata.as_ref().unwrap();
        assert_eq!(
            meta.labels
                .as_ref()
                .unwrap()
                .get(STAGING_LABEL)
                .map(String::as_str),
            Some("true")
        );
        let annotations = meta.annotations.as_ref().unwrap();
        assert_eq!(
            annotations
                .get(STAGING_VOLUME_ANNOTATION)
                .map(String::as_str),
            Some(STAGING_VOLUME)
        );
        assert_eq!(
            annotations.get(BINDING_UID_LABEL_ANNOTATION),
            b.metadata.uid.as_ref()
        );
        // A copy the agent gave up on fails the Job without a second download.
        let rule = &spec.pod_failure_policy.as_ref().unwrap().rules[0];
        assert_eq!(rule.action, "FailJob");
        let codes = rule.on_exit_codes.as_ref().unwrap();
        assert_eq!(codes.container_name.as_deref(), Some(HOLD_CONTAINER));
        assert_eq!(codes.values, vec![HOLD_FAILED_EXIT_CODE]);
        // The RWX Job has none of it.
        let rwx = writer_job(
            &binding(Transition::RwxReadOnly),
            &init_step(),
            &[],
            &WriterOptions::default(),
        )
        .unwrap();
        let rwx_spec = rwx.spec.as_ref().unwrap();
        assert!(rwx_spec.pod_failure_policy.is_none());
        assert!(
            rwx_spec
                .template
                .spec
                .as_ref()
                .unwrap()
                .init_containers
                .is_none()
        );
    }

    /// The hold loop, run for real by /bin/sh: the agent's "copied" ends it with 0, its
    /// "failed" with the failure code and its words in the termination message.
    #[test]
    fn the_hold_script_answers_the_agent() {
        use std::process::{Command, Stdio};
        use std::time::{Duration, Instant};
        let root = tempfile_dir("hold-script");
        let term = root.join("term");
        let script = hold_script().replace("/dev/termination-log", term.to_str().unwrap());
        let run = |file: &str, words: &str| {
            let dir = root.join(file);
            std::fs::create_dir_all(&dir).unwrap();
            let mut child = Command::new("/bin/sh")
                .arg("-c")
                .arg(&script)
                .arg("nvsnap-hold")
                .arg(&dir)
                .stdout(Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_millis(300));
            assert!(child.try_wait().unwrap().is_none(), "it waits");
            std::fs::write(dir.join(file), words).unwrap();
            let start = Instant::now();
            loop {
                if let Some(status) = child.try_wait().unwrap() {
                    return status.code();
                }
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "hold did not end"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        };
        assert_eq!(run(HANDOFF_COPIED, ""), Some(0));
        assert!(!term.exists());
        assert_eq!(
            run(
                HANDOFF_FAILED,
                "copy failed 3 times: no space left on device"
            ),
            Some(HOLD_FAILED_EXIT_CODE)
        );
        let words = std::fs::read_to_string(&term).unwrap();
        assert!(words.contains("no space left on device"), "{words}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    fn tempfile_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A landing, a scratch directory and a termination log under `root` for the writer script
    /// run for real by /bin/sh (as root or not: the caller's user).
    struct Sandbox {
        dest: std::path::PathBuf,
        script: String,
    }

    impl Sandbox {
        fn new(root: &std::path::Path) -> Self {
            let (dest, tmp) = (root.join("dest"), root.join("tmp"));
            std::fs::create_dir_all(&dest).unwrap();
            std::fs::create_dir_all(&tmp).unwrap();
            let script = writer_script()
                .replace(WRITER_TMP_PATH, tmp.to_str().unwrap())
                .replace("/dev/termination-log", root.join("term").to_str().unwrap());
            Self { dest, script }
        }

        /// The script on `argv` (the download command), as the writer Job runs it.
        fn run(&self, argv: &[&str]) -> std::process::Output {
            std::process::Command::new("/bin/sh")
                .arg("-c")
                .arg(&self.script)
                .arg("nvsnap-writer")
                .arg(&self.dest)
                .args(argv)
                .output()
                .unwrap()
        }
    }

    /// The wrapper, run for real by /bin/sh: success writes the byte count into the marker and
    /// the termination message; failure writes the failure marker with the last words; a
    /// complete cache is not downloaded again.
    #[test]
    fn the_wrapper_script_runs() {
        let Ok(dir) = std::env::temp_dir().canonicalize() else {
            return;
        };
        let root = dir.join(format!("writer-script-{}", std::process::id()));
        let sandbox = Sandbox::new(&root);
        let dest = sandbox.dest.clone();
        let run = |argv: &[&str]| sandbox.run(argv);
        std::fs::write(dest.join(FAILURE_MARKER), "old").unwrap();
        let fail = run(&[
            "sh",
            "-c",
            "echo fetching; echo 'HTTP 401 unauthorized' >&2; exit 3",
        ]);
        assert_eq!(fail.status.code(), Some(1));
        let words = std::fs::read_to_string(dest.join(FAILURE_MARKER)).unwrap();
        assert!(
            words.contains("exited 3") && words.contains("401 unauthorized"),
            "{words}"
        );
        assert_eq!(std::fs::read_to_string(root.join("term")).unwrap(), words);
        assert!(!dest.join(COMPLETE_MARKER).exists());

        let ok = run(&[
            "sh",
            "-c",
            "head -c 5000 /dev/zero > \"$0/model.bin\"",
            dest.to_str().unwrap(),
        ]);
        assert!(ok.status.success(), "{ok:?}");
        assert!(
            !dest.join(FAILURE_MARKER).exists(),
            "a retry clears the failure marker"
        );
        let marker = std::fs::read_to_string(dest.join(COMPLETE_MARKER)).unwrap();
        let bytes: u64 = marker.parse().unwrap();
        assert!(bytes >= 5000, "{marker}");
        assert_eq!(
            bytes_from_termination_message(&std::fs::read_to_string(root.join("term")).unwrap()),
            Some(bytes)
        );
        // Complete: the download does not run again.
        let again = run(&["sh", "-c", "exit 9"]);
        assert!(again.status.success());
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// The wrapper, run for real, records the commit a Hugging Face download resolved: from the
    /// hub cache's `refs/<revision>`, or from the first line of every `--local-dir` metadata
    /// file when they agree; nothing when they disagree or hold no commit. The termination
    /// message carries it after the bytes, and a complete landing repeats it.
    #[test]
    fn the_wrapper_records_the_commit_a_download_resolved() {
        let Ok(dir) = std::env::temp_dir().canonicalize() else {
            return;
        };
        let a = "0123456789abcdef0123456789abcdef01234567";
        let b = "fedcba9876543210fedcba9876543210fedcba98";
        let cases: [(&str, String, Option<&str>); 6] = [
            (
                "hub",
                format!("mkdir -p \"$0/hf/hub/models--org--m/refs\"; printf '{a}' > \"$0/hf/hub/models--org--m/refs/v1\""),
                Some(a),
            ),
            (
                "hubcache",
                format!("mkdir -p \"$0/models--org--m/refs\"; printf '{a}\\n' > \"$0/models--org--m/refs/main\""),
                Some(a),
            ),
            (
                "localdir",
                format!("d=\"$0/llm/.cache/huggingface/download/sub\"; mkdir -p \"$d\"; printf '{a}\\netag\\n1.0\\n' > \"$d/x.metadata\"; printf '{a}\\netag2\\n2.0\\n' > \"$0/llm/.cache/huggingface/download/y.metadata\""),
                Some(a),
            ),
            (
                "disagree",
                format!("d=\"$0/.cache/huggingface/download\"; mkdir -p \"$d\"; printf '{a}\\n' > \"$d/x.metadata\"; printf '{b}\\n' > \"$d/y.metadata\""),
                None,
            ),
            (
                "snapshot-refs",
                format!("mkdir -p \"$0/hf/hub/models--org--m/refs\" \"$0/hf/hub/models--org--m/snapshots/{a}/refs\"; printf '{a}' > \"$0/hf/hub/models--org--m/refs/main\"; printf 'not a commit\\n' > \"$0/hf/hub/models--org--m/snapshots/{a}/refs/x.txt\""),
                Some(a),
            ),
            (
                "garbage",
                "mkdir -p \"$0/hub/models--org--m/refs\"; printf 'main; rm -rf /' > \"$0/hub/models--org--m/refs/main\"".to_owned(),
                None,
            ),
        ];
        for (name, download, want) in cases {
            let root = dir.join(format!("writer-rev-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            let sandbox = Sandbox::new(&root);
            let dest = sandbox.dest.clone();
            let run = |argv: &[&str]| sandbox.run(argv);
            let ok = run(&["sh", "-c", &download, dest.to_str().unwrap()]);
            assert!(ok.status.success(), "{name}: {ok:?}");
            let term = std::fs::read_to_string(root.join("term")).unwrap();
            assert!(
                bytes_from_termination_message(&term).is_some(),
                "{name}: {term}"
            );
            assert_eq!(
                revision_from_termination_message(&term).as_deref(),
                want,
                "{name}: {term}"
            );
            assert_eq!(
                std::fs::read_to_string(dest.join(REVISION_FILE))
                    .ok()
                    .as_deref(),
                want,
                "{name}"
            );
            // Complete: the recorded commit is repeated without downloading again.
            let again = run(&["sh", "-c", "exit 9"]);
            assert!(again.status.success());
            let term = std::fs::read_to_string(root.join("term")).unwrap();
            assert_eq!(
                revision_from_termination_message(&term).as_deref(),
                want,
                "{name} again"
            );
            std::fs::remove_dir_all(&root).unwrap();
        }
    }

    /// With [`OPEN_ROOT_WAIT_ENV`], the wrapper (run for real, as a non-root user: through
    /// `setpriv` when the test runs as root) waits until its landing becomes writable, then
    /// downloads; a landing never opened fails within the wait with words naming the agent.
    #[test]
    fn the_wrapper_waits_for_the_agent_to_open_its_root() {
        use std::os::unix::fs::PermissionsExt;
        use std::process::Command;
        let Ok(dir) = std::env::temp_dir().canonicalize() else {
            return;
        };
        let as_root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
        let root = dir.join(format!("writer-open-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (dest, tmp) = (root.join("dest"), root.join("tmp"));
        std::fs::create_dir_all(&dest).unwrap();
        std::fs::create_dir_all(&tmp).unwrap();
        let user = 65532u32;
        if as_root {
            // The writer owns its scratch space; the landing is root's, 0755, like a fresh export.
            for path in [&root, &tmp] {
                std::os::unix::fs::chown(path, Some(user), Some(user)).unwrap();
            }
        } else {
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o555)).unwrap();
        }
        let open = move |dest: &std::path::Path| {
            if as_root {
                std::os::unix::fs::chown(dest, Some(user), Some(user)).unwrap();
            } else {
                std::fs::set_permissions(dest, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
        };
        let script = writer_script()
            .replace(WRITER_TMP_PATH, tmp.to_str().unwrap())
            .replace("/dev/termination-log", root.join("term").to_str().unwrap());
        let run = |wait: &str| {
            let mut command = if as_root {
                let mut c = Command::new("setpriv");
                c.args([
                    "--reuid=65532",
                    "--regid=65532",
                    "--clear-groups",
                    "/bin/sh",
                ]);
                c
            } else {
                Command::new("/bin/sh")
            };
            command
                .env(OPEN_ROOT_WAIT_ENV, wait)
                .arg("-c")
                .arg(&script)
                .arg("nvsnap-writer")
                .arg(&dest)
                .args([
                    "sh",
                    "-c",
                    "echo weights > \"$0/model.bin\"",
                    dest.to_str().unwrap(),
                ])
                .output()
                .unwrap()
        };

        // Never opened: it gives up within its wait, with the agent named.
        let gave_up = run("1");
        assert_eq!(gave_up.status.code(), Some(1), "{gave_up:?}");
        let words = std::fs::read_to_string(root.join("term")).unwrap();
        assert!(
            words.contains("was not opened for uid") && words.contains("model-volume-controller"),
            "{words}"
        );
        assert!(!dest.join("model.bin").exists());

        // Opened while it waits: it downloads and completes.
        let opener = {
            let dest = dest.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_secs(2));
                open(&dest);
            })
        };
        let done = run("60");
        opener.join().unwrap();
        assert!(done.status.success(), "{done:?}");
        let out = String::from_utf8_lossy(&done.stdout);
        assert!(
            out.contains("waiting up to 60s for the node agent"),
            "{out}"
        );
        assert_eq!(
            std::fs::read_to_string(dest.join("model.bin")).unwrap(),
            "weights\n"
        );
        assert!(dest.join(COMPLETE_MARKER).exists());
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// With the agent opening roots, a `root` decision gets a non-root writer labelled for the
    /// agent, with its group fixed and the wait in its environment; fsGroup writers, block
    /// staging and the default options are unchanged.
    #[test]
    fn a_root_decision_gets_a_non_root_writer_when_the_agent_opens_roots() {
        let opening = WriterOptions {
            open_root_wait_seconds: Some(DEFAULT_OPEN_ROOT_WAIT_SECONDS),
            ..WriterOptions::default()
        };
        let mut root = binding(Transition::RwxReadOnly);
        root.spec.decision.writer_identity = Some(WriterIdentity::Root);
        let mut step = init_step();
        step.pod_security_context = Some(PodSecurityContext {
            run_as_user: Some(1000),
            fs_group: Some(2000),
            ..PodSecurityContext::default()
        });
        let job = writer_job(&root, &step, &[], &opening).unwrap();
        let template = &job.spec.as_ref().unwrap().template;
        let meta = template.metadata.as_ref().unwrap();
        assert_eq!(meta.labels.as_ref().unwrap()[OPEN_ROOT_LABEL], "true");
        // The pod names its binding, as the agent's check reads it.
        let annotations = meta.annotations.as_ref().unwrap();
        assert_eq!(
            annotations[BINDING_ANNOTATION],
            root.metadata.name.clone().unwrap()
        );
        assert_eq!(annotations[BINDING_UID_LABEL_ANNOTATION], "binding-uid-1");
        let pod = template.spec.as_ref().unwrap();
        let psc = pod.security_context.as_ref().unwrap();
        assert_eq!(
            (psc.run_as_user, psc.run_as_non_root),
            (Some(1000), Some(true))
        );
        let c = &pod.containers[0];
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(
            (sc.run_as_user, sc.run_as_group, sc.run_as_non_root),
            (Some(1000), Some(2000), Some(true))
        );
        let wait = c
            .env
            .iter()
            .flatten()
            .find(|e| e.name == OPEN_ROOT_WAIT_ENV)
            .unwrap();
        assert_eq!(wait.value.as_deref(), Some("600"));
        // No user anywhere: the default non-root user, its own number as group.
        let job = writer_job(&root, &init_step(), &[], &opening).unwrap();
        let sc = pod_spec(&job).containers[0]
            .security_context
            .clone()
            .unwrap();
        assert_eq!(
            (sc.run_as_user, sc.run_as_group),
            (Some(DEFAULT_NON_ROOT_USER), Some(DEFAULT_NON_ROOT_USER))
        );

        let unlabelled = |job: &Job| {
            let t = &job.spec.as_ref().unwrap().template;
            !t.metadata
                .as_ref()
                .and_then(|m| m.labels.as_ref())
                .is_some_and(|l| l.contains_key(OPEN_ROOT_LABEL))
                && !t.spec.as_ref().unwrap().containers[0]
                    .env
                    .iter()
                    .flatten()
                    .chain(
                        t.spec
                            .as_ref()
                            .unwrap()
                            .init_containers
                            .iter()
                            .flatten()
                            .flat_map(|c| c.env.iter().flatten()),
                    )
                    .any(|e| e.name == OPEN_ROOT_WAIT_ENV)
        };
        let fs_group = binding(Transition::RwxReadOnly);
        assert!(unlabelled(
            &writer_job(&fs_group, &step, &[], &opening).unwrap()
        ));
        let staged = binding(Transition::RoxReadOnly);
        assert!(unlabelled(
            &writer_job(&staged, &step, &[], &opening).unwrap()
        ));
        let as_root = writer_job(&root, &step, &[], &WriterOptions::default()).unwrap();
        assert!(unlabelled(&as_root));
        assert_eq!(
            pod_spec(&as_root)
                .security_context
                .as_ref()
                .unwrap()
                .run_as_user,
            Some(0)
        );
    }
}
