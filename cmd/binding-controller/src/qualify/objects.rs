//! The objects of one qualification run, built without a client: the writer's claim and Job,
//! the synthetic binding the read-only views are derived for, the reader pods and the negative
//! control's claim. Every object carries [`RUN_LABEL`].

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, PodTemplateSpec,
    ResourceRequirements, SeccompProfile, SecurityContext, Volume, VolumeMount,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use warmcache_api_modelcache::v2beta1::{
    BindingDecision, BindingIdentity, BindingResources, BindingStorageClass, ModelCacheBinding,
    ModelCacheBindingSpec, ReclaimPolicy, Transition, Workflow, WriterIdentity,
};
use warmcache_api_modelcache::{binding_name, sha256_digest};

use super::Settings;

/// The label every object of a run carries; its value is the run's id.
pub const RUN_LABEL: &str = "qualify.warmcache.io/run";
/// The second label: which part of the run an object is.
pub const PART_LABEL: &str = "qualify.warmcache.io/part";
/// Size of the random payload (seed 000: 16 MiB).
pub const PAYLOAD_BYTES: u64 = 16 << 20;
/// Where the pods mount the volume.
pub const MOUNT_PATH: &str = "/data";
/// The payload, relative to the volume's root.
pub const PAYLOAD_PATH: &str = "qualify/payload.bin";
/// The container of every pod of a run.
pub const CONTAINER: &str = "qualify";

/// Writes the payload, then reports its SHA-256 and size in the termination message.
pub fn writer_script() -> String {
    format!(
        r#"set -eu
d={MOUNT_PATH}/qualify
mkdir -p "$d"
head -c {PAYLOAD_BYTES} /dev/urandom > "$d/payload.bin.tmp"
sync
mv "$d/payload.bin.tmp" "$d/payload.bin"
sync
sum=$(sha256sum "$d/payload.bin" | cut -d' ' -f1)
size=$(wc -c < "$d/payload.bin")
printf 'sha256=%s\nbytes=%s\nuid=%s\n' "$sum" "$size" "$(id -u)" > /dev/termination-log
echo "wrote $size bytes, sha256 $sum, as uid $(id -u)"
"#
    )
}

/// Reads the payload and reports what it saw; with `writes`, tries every kind of write
/// (`write.<op> rc=<exit> <stderr>`) and hashes the payload again. Always exits 0: the checks
/// read the termination message.
pub fn reader_script(writes: bool) -> String {
    let mut s = format!(
        r#"set -u
d={MOUNT_PATH}
f="$d/{PAYLOAD_PATH}"
sum() {{ if [ -f "$f" ]; then sha256sum "$f" | cut -d' ' -f1; else echo missing; fi; }}
{{
echo "sha256=$(sum)"
[ -f "$f" ] && echo "bytes=$(wc -c < "$f")"
echo "mount=$(awk -v p="$d" '$2 == p {{ o = $4 }} END {{ print o }}' /proc/mounts)"
echo "entries=$(ls -A "$d" | grep -vx lost+found | wc -l)"
"#
    );
    if writes {
        s.push_str(
            r#"try() { op=$1; shift; err=$("$@" 2>&1 >/dev/null); rc=$?; echo "write.$op rc=$rc $(printf '%s' "$err" | tr '\n' ' ' | head -c 160)"; }
try create touch "$d/qualify/created-by-reader"
try append sh -c 'echo more >> "$0"' "$f"
try chmod chmod 600 "$f"
try truncate truncate -s 0 "$f"
try rename mv "$f" "$f.moved"
try delete rm "$f"
echo "sha256-after=$(sum)"
"#,
        );
    }
    s.push_str("} > /dev/termination-log 2>&1\ncat /dev/termination-log\n");
    s
}

/// The labels of an object of run `run`, part `part`.
pub fn labels(run: &str, part: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (RUN_LABEL.to_owned(), run.to_owned()),
        (PART_LABEL.to_owned(), part.to_owned()),
        (
            "app.kubernetes.io/created-by".to_owned(),
            "binding-controller-qualify".to_owned(),
        ),
    ])
}

/// Adds the run's labels to an object's metadata (keeps the ones it has).
pub fn add_labels(meta: &mut ObjectMeta, run: &str, part: &str) {
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .extend(labels(run, part));
}

/// The name of a run's object (`wq-<run>-<part>`).
pub fn name(run: &str, part: &str) -> String {
    format!("wq-{run}-{part}")
}

/// A fresh claim of the class under test, naming only the class (the writer's, or the
/// negative control's).
pub fn writer_claim(
    settings: &Settings,
    run: &str,
    part: &str,
    namespace: &str,
    mode: &str,
) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name(run, part)),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels(run, part)),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec![mode.to_owned()]),
            storage_class_name: Some(settings.storage_class.clone()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(settings.size.clone()),
                )])),
                limits: None,
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

fn resources() -> ResourceRequirements {
    let q = |cpu: &str, mem: &str| {
        BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpu.to_owned())),
            ("memory".to_owned(), Quantity(mem.to_owned())),
        ])
    };
    ResourceRequirements {
        requests: Some(q("10m", "16Mi")),
        limits: Some(q("500m", "128Mi")),
        ..ResourceRequirements::default()
    }
}

/// A pod spec passing Pod Security "restricted": non-root (`--run-as-user`, which is also the
/// group and the fsGroup, so a driver applying fsGroup hands the writer a fresh export), no
/// capabilities, no privilege escalation, seccomp RuntimeDefault, a read-only root, no
/// service-account token, requests and limits.
fn pod_spec(
    settings: &Settings,
    script: String,
    claim: &str,
    claim_read_only: bool,
    restart: &str,
) -> PodSpec {
    let uid = settings.run_as_user;
    PodSpec {
        automount_service_account_token: Some(false),
        restart_policy: Some(restart.to_owned()),
        enable_service_links: Some(false),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(uid),
            run_as_group: Some(uid),
            fs_group: Some(uid),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                localhost_profile: None,
            }),
            ..PodSecurityContext::default()
        }),
        containers: vec![Container {
            name: CONTAINER.to_owned(),
            image: Some(settings.image.clone()),
            image_pull_policy: Some(settings.image_pull_policy.as_str().to_owned()),
            command: Some(vec!["sh".to_owned(), "-c".to_owned(), script]),
            resources: Some(resources()),
            termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
            security_context: Some(SecurityContext {
                allow_privilege_escalation: Some(false),
                capabilities: Some(Capabilities {
                    add: None,
                    drop: Some(vec!["ALL".to_owned()]),
                }),
                privileged: Some(false),
                read_only_root_filesystem: Some(true),
                run_as_non_root: Some(true),
                ..SecurityContext::default()
            }),
            volume_mounts: Some(vec![VolumeMount {
                name: "data".to_owned(),
                mount_path: MOUNT_PATH.to_owned(),
                read_only: Some(claim_read_only),
                ..VolumeMount::default()
            }]),
            ..Container::default()
        }],
        volumes: Some(vec![Volume {
            name: "data".to_owned(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.to_owned(),
                read_only: Some(claim_read_only),
            }),
            ..Volume::default()
        }]),
        ..PodSpec::default()
    }
}

/// The writer Job: one pod, no retry, bounded by the step timeout, writing [`writer_script`]
/// through `claim` mounted read-write.
pub fn writer_job(settings: &Settings, run: &str, namespace: &str, claim: &str) -> Job {
    let labels = labels(run, "writer");
    Job {
        metadata: ObjectMeta {
            name: Some(name(run, "writer")),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            active_deadline_seconds: Some(
                i64::try_from(settings.step_timeout.as_secs()).unwrap_or(i64::MAX),
            ),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod_spec(settings, writer_script(), claim, false, "Never")),
            },
            ..JobSpec::default()
        }),
        status: None,
    }
}

/// A reader pod named `wq-<run>-<part>` mounting `claim` as the webhook renders readers: the
/// claim with `readOnly: true` (the kubelet takes the publish flag from here, not from the PV's
/// `csi.readOnly`) and the container's mount `readOnly: true`.
pub fn reader_pod(
    settings: &Settings,
    run: &str,
    part: &str,
    namespace: &str,
    claim: &str,
    writes: bool,
) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name(run, part)),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels(run, part)),
            ..ObjectMeta::default()
        },
        spec: Some(pod_spec(
            settings,
            reader_script(writes),
            claim,
            true,
            "Never",
        )),
        status: None,
    }
}

/// The binding the views of run `run` are derived for, as if the controller held a cache of
/// that name: the provider (whose handles may encode the namespace), the views' mount options,
/// the class, and the writer namespace. Its identity is the run's, so its view names
/// (`ro-pvc-<hash>`) never collide with a real cache's.
pub fn view_binding(
    settings: &Settings,
    run: &str,
    provisioner: &str,
    provider: &str,
    writer_mode: &str,
    mount_options: Vec<String>,
) -> ModelCacheBinding {
    let identity = BindingIdentity::new(
        Workflow::HelmModelCache,
        &format!("qualify-{run}"),
        &format!("qualify://{run}"),
    );
    let transition = if writer_mode == "ReadWriteMany" {
        Transition::RwxReadOnly
    } else {
        Transition::RoxReadOnly
    };
    let spec = ModelCacheBindingSpec {
        identity: identity.clone(),
        decision: BindingDecision {
            provider: provider.to_owned(),
            provisioner: provisioner.to_owned(),
            transition,
            required_access_modes: transition.required_access_modes().to_vec(),
            required_mount_options: mount_options,
            catalog_digest: sha256_digest("qualify"),
            encryption_required: false,
            writer_identity: (transition == Transition::RwxReadOnly)
                .then_some(WriterIdentity::FsGroup),
        },
        storage_class: BindingStorageClass {
            name: settings.storage_class.clone(),
            uid: String::new(),
            reclaim_policy: ReclaimPolicy::Retain,
            configuration_digest: String::new(),
        },
        resources: BindingResources {
            writer_namespace: settings.namespace_a.clone(),
            ..BindingResources::default()
        },
    };
    ModelCacheBinding::new(&binding_name(&identity), spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qualify::PullPolicy;
    use std::time::Duration;

    pub(crate) fn settings() -> Settings {
        Settings {
            storage_class: "fast-rwx".into(),
            namespace_a: "team-a".into(),
            namespace_b: "team-b".into(),
            image: "busybox:1.37".into(),
            image_pull_policy: PullPolicy::Never,
            writer_modes: vec!["ReadWriteMany"],
            provider: None,
            reader_mount_options: None,
            size: "1Gi".into(),
            run_as_user: 65532,
            step_timeout: Duration::from_secs(120),
            cleanup_timeout: Duration::from_secs(60),
        }
    }

    fn restricted(spec: &PodSpec) {
        let psc = spec.security_context.as_ref().unwrap();
        assert_eq!(psc.run_as_non_root, Some(true));
        assert!(psc.run_as_user.unwrap() > 0);
        assert_eq!(
            psc.seccomp_profile.as_ref().unwrap().type_,
            "RuntimeDefault"
        );
        assert_eq!(spec.automount_service_account_token, Some(false));
        for c in &spec.containers {
            let sc = c.security_context.as_ref().unwrap();
            assert_eq!(sc.allow_privilege_escalation, Some(false));
            assert_eq!(
                sc.capabilities.as_ref().unwrap().drop.as_deref(),
                Some(&["ALL".to_owned()][..])
            );
            assert!(c.resources.as_ref().unwrap().limits.is_some());
            assert_eq!(c.image_pull_policy.as_deref(), Some("Never"));
        }
    }

    #[test]
    fn the_writer_writes_through_a_read_write_claim_and_passes_restricted() {
        let s = settings();
        let job = writer_job(&s, "r1", "team-a", "wq-r1-writer");
        assert_eq!(job.metadata.labels.as_ref().unwrap()[RUN_LABEL], "r1");
        let spec = job.spec.unwrap();
        assert_eq!(spec.backoff_limit, Some(0));
        assert_eq!(spec.active_deadline_seconds, Some(120));
        let pod = spec.template.spec.unwrap();
        restricted(&pod);
        let volume = &pod.volumes.as_ref().unwrap()[0];
        assert_eq!(
            volume.persistent_volume_claim.as_ref().unwrap().read_only,
            Some(false)
        );
        let script = &pod.containers[0].command.as_ref().unwrap()[2];
        assert!(script.contains("head -c 16777216 /dev/urandom"), "{script}");
        assert!(script.contains("sha256="), "{script}");
    }

    #[test]
    fn readers_are_read_only_on_the_claim_and_the_mount() {
        let s = settings();
        let pod = reader_pod(&s, "r1", "reader-b", "team-b", "ro-pvc-x", true);
        let spec = pod.spec.unwrap();
        restricted(&spec);
        let claim = spec.volumes.as_ref().unwrap()[0]
            .persistent_volume_claim
            .clone()
            .unwrap();
        assert_eq!(
            (claim.claim_name.as_str(), claim.read_only),
            ("ro-pvc-x", Some(true))
        );
        let mount = &spec.containers[0].volume_mounts.as_ref().unwrap()[0];
        assert_eq!(mount.read_only, Some(true));
        let script = &spec.containers[0].command.as_ref().unwrap()[2];
        for op in super::super::WriteOp::ALL {
            assert!(script.contains(&format!("try {} ", op.as_str())), "{op:?}");
        }
        assert!(!reader_script(false).contains("try create"));
    }

    /// The reader is read-only where the webhook's rendered readers are: the claim of the model
    /// volume and the engine's mount (a guard against the two drifting apart).
    #[test]
    fn readers_are_mounted_as_the_webhook_renders_readers() {
        use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
        use warmcache_catalog::{CatalogInput, CatalogSnapshot, Gates};
        use warmcache_modelvolume::keys::MODEL_VOLUME;
        use warmcache_modelvolume::{BindingAction, Options, Request, StorageInputs, Verdict};

        let class: StorageClass = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "nvcf-sc", "uid": "sc-1" },
            "provisioner": "csi.example.com",
            "reclaimPolicy": "Retain",
        }))
        .unwrap();
        let driver: CSIDriver = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "csi.example.com" },
            "spec": { "fsGroupPolicy": "File" },
        }))
        .unwrap();
        let catalog = CatalogSnapshot::from_payload(
            "apiVersion: storage.nvcf.nvidia.com/v1alpha1\nkind: StorageCapabilityCatalog\ndrivers:\n  - name: csi.example.com\n    provider: example\n    accessModes: [ReadWriteMany]\n    readerMountOptions: []\n",
        )
        .unwrap();
        let storage = StorageInputs {
            storage_class: Some(&class),
            csi_driver: Some(&driver),
            catalog: CatalogInput::Loaded(&catalog),
            gates: Gates {
                caching_support: true,
                helm_model_caching: true,
                model_cache_encryption: false,
            },
        };
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "qwen3" },
            "spec": {
                "initContainers": [{
                    "name": "download-model", "image": "python:3.12-slim",
                    "command": ["sh", "-c", "hf download Qwen/Qwen3-0.6B --local-dir /models/qwen3"],
                    "volumeMounts": [{ "name": "models", "mountPath": "/models" }],
                }],
                "containers": [{
                    "name": "vllm", "image": "vllm/vllm-openai:v0.20.0",
                    "command": ["vllm", "serve", "/models/qwen3"],
                    "resources": { "limits": { "nvidia.com/gpu": "1" } },
                    "volumeMounts": [{ "name": "models", "mountPath": "/models" }],
                }],
                "volumes": [{ "name": "models", "emptyDir": {} }],
            },
        }))
        .unwrap();
        let options = Options::default();
        let labels = BTreeMap::new();
        let req = Request {
            pod: &pod,
            namespace: "team-a",
            namespace_labels: &labels,
            leader_worker_set: None,
            traceparent: None,
            options: &options,
        };
        let Verdict::Rewrite(first) = warmcache_modelvolume::admit(&req, |_, _| None, &storage)
        else {
            panic!("the GPU pod was not rewritten");
        };
        let BindingAction::Create(mut binding) = first.binding.clone() else {
            panic!("no binding to create");
        };
        binding.metadata.uid = Some("uid-1".into());
        let Verdict::Rewrite(reader) =
            warmcache_modelvolume::admit(&req, |_, _| Some(&binding), &storage)
        else {
            panic!("the reader was not rewritten");
        };
        let rendered = reader.pod.spec.unwrap();
        let volume = rendered
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == MODEL_VOLUME)
            .unwrap();
        let webhook_claim_read_only = volume.persistent_volume_claim.as_ref().unwrap().read_only;
        let webhook_mount_read_only = rendered.containers[reader.plan.main_container()]
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == MODEL_VOLUME)
            .unwrap()
            .read_only;
        let ours = reader_pod(&settings(), "r1", "reader-b", "team-b", "ro-pvc-x", true)
            .spec
            .unwrap();
        assert_eq!(webhook_claim_read_only, Some(true));
        assert_eq!(webhook_mount_read_only, Some(true));
        assert_eq!(
            ours.volumes.unwrap()[0]
                .persistent_volume_claim
                .as_ref()
                .unwrap()
                .read_only,
            webhook_claim_read_only
        );
        assert_eq!(
            ours.containers[0].volume_mounts.as_ref().unwrap()[0].read_only,
            webhook_mount_read_only
        );
    }

    #[test]
    fn claims_name_only_the_class() {
        let c = writer_claim(&settings(), "r1", "control", "team-b", "ReadWriteOnce");
        let spec = c.spec.unwrap();
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast-rwx"));
        assert_eq!(spec.volume_name, None);
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
        assert_eq!(c.metadata.name.as_deref(), Some("wq-r1-control"));
    }

    #[test]
    fn views_of_the_synthetic_binding_come_from_the_controllers_derivation() {
        use k8s_openapi::api::core::v1::{
            CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec,
        };
        let s = settings();
        let primary = PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pvc-1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeSpec {
                capacity: Some(BTreeMap::from([("storage".into(), Quantity("1Gi".into()))])),
                csi: Some(CSIPersistentVolumeSource {
                    driver: "blk.csi".into(),
                    volume_handle: "vol-1:team-a".into(),
                    ..CSIPersistentVolumeSource::default()
                }),
                storage_class_name: Some("fast-rwx".into()),
                ..PersistentVolumeSpec::default()
            }),
            status: None,
        };
        let b = view_binding(
            &s,
            "r1",
            "blk.csi",
            "nvmesh",
            "ReadWriteOnce",
            vec!["ro".into(), "nouuid".into()],
        );
        let (pv, claim) =
            warmcache_modelvolume::read_only_view(&b, &primary, "team-b", Some(PAYLOAD_BYTES), &[])
                .unwrap();
        let spec = pv.spec.unwrap();
        assert_eq!(spec.csi.as_ref().unwrap().volume_handle, "vol-1:team-b");
        assert_eq!(spec.csi.as_ref().unwrap().read_only, Some(true));
        assert_eq!(spec.storage_class_name.as_deref(), Some(""));
        assert_eq!(
            spec.mount_options,
            Some(vec!["ro".to_owned(), "nouuid".to_owned()])
        );
        assert_eq!(claim.metadata.namespace.as_deref(), Some("team-b"));
        // Another run derives other names.
        let other = view_binding(&s, "r2", "blk.csi", "nvmesh", "ReadWriteOnce", vec![]);
        assert_ne!(
            warmcache_modelvolume::reader_view(&b, "team-b"),
            warmcache_modelvolume::reader_view(&other, "team-b")
        );
    }
}
