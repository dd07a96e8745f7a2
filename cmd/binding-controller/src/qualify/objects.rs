//! The objects of one qualification run, built without a client: the writer's claim and Job,
//! the synthetic binding the read-only views are derived for, the reader pods and the negative
//! control's claim. Every object carries [`RUN_LABEL`].

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, PodTemplateSpec,
    ResourceRequirements, SeccompProfile, SecurityContext, Volume, VolumeMount,
    VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
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
/// The annotation the PV controller puts on a dynamically provisioned PV: the provisioner.
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
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

/// The name of a run's own StorageClass (`wq-<run>`), the clone of the class under test.
pub fn class_name(run: &str) -> String {
    format!("wq-{run}")
}

/// The run's own StorageClass: the class under test as its provisioner sees it (provisioner,
/// parameters, mountOptions, volumeBindingMode, allowVolumeExpansion, allowedTopologies), named
/// [`class_name`], labelled with the run, reclaimPolicy Retain. The run's claims name it, so no
/// PersistentVolume that existed before the run can bind them (a claim binds only a PV of the
/// very class it names): the writer and the negative control always get a freshly provisioned
/// volume, never someone's Available model-cache PV of the class under test.
pub fn run_class(class: &StorageClass, run: &str) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(class_name(run)),
            labels: Some(labels(run, "class")),
            ..ObjectMeta::default()
        },
        provisioner: class.provisioner.clone(),
        parameters: class.parameters.clone(),
        mount_options: class.mount_options.clone(),
        volume_binding_mode: class.volume_binding_mode.clone(),
        allow_volume_expansion: class.allow_volume_expansion,
        allowed_topologies: class.allowed_topologies.clone(),
        reclaim_policy: Some("Retain".to_owned()),
    }
}

/// Whether the PV `pv` that the run's claim (UID `claim_uid`) bound is the run's own: bound to
/// that very claim (`spec.claimRef.uid`), provisioned by `provisioner`
/// ([`PROVISIONED_BY`]) and of the run's class `class`. `Err` says what differs; the run then
/// never labels, patches or deletes that PV.
pub fn verify_bound_pv(
    pv: &PersistentVolume,
    claim_uid: &str,
    provisioner: &str,
    class: &str,
) -> Result<(), String> {
    let name = pv.metadata.name.as_deref().unwrap_or("?");
    let spec = pv.spec.as_ref();
    let mut wrong = Vec::new();
    let bound_uid = spec
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.uid.as_deref());
    if claim_uid.is_empty() || bound_uid != Some(claim_uid) {
        wrong.push(format!(
            "spec.claimRef.uid is {} (the claim's is {claim_uid:?})",
            bound_uid.map_or_else(|| "unset".to_owned(), |u| format!("{u:?}"))
        ));
    }
    let by = pv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PROVISIONED_BY));
    if by.map(String::as_str) != Some(provisioner) {
        wrong.push(format!(
            "{PROVISIONED_BY} is {} (the class's provisioner is {provisioner:?})",
            by.map_or_else(|| "unset".to_owned(), |b| format!("{b:?}"))
        ));
    }
    let pv_class = spec.and_then(|s| s.storage_class_name.as_deref());
    if pv_class != Some(class) {
        wrong.push(format!(
            "storageClassName is {} (the run's class is {class:?})",
            pv_class.map_or_else(|| "unset".to_owned(), |c| format!("{c:?}"))
        ));
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "PersistentVolume {name} is not one the run provisioned: {}",
            wrong.join(", ")
        ))
    }
}

/// A pod that only consumes a claim, so a `WaitForFirstConsumer` class provisions and binds it
/// before the run looks at the volume: it mounts the claim read-only, applies no fsGroup and
/// exits at once, so it changes nothing on a volume that turns out not to be the run's.
pub fn binder_pod(settings: &Settings, run: &str, part: &str, namespace: &str, claim: &str) -> Pod {
    let part = format!("{part}-bind");
    let mut spec = pod_spec(settings, "true".to_owned(), claim, true, "Never");
    if let Some(psc) = spec.security_context.as_mut() {
        psc.fs_group = None;
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(name(run, &part)),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels(run, &part)),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// A fresh claim of the run's class ([`class_name`], the clone of the class under test),
/// naming only that class (the writer's, or the negative control's).
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
            storage_class_name: Some(class_name(run)),
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

    fn class_under_test(policy: &str) -> k8s_openapi::api::storage::v1::StorageClass {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "fast-rwx", "uid": "sc-1", "resourceVersion": "7",
                "labels": { "team": "infra" },
                "annotations": { "storageclass.kubernetes.io/is-default-class": "true" },
            },
            "provisioner": "csi.example.com",
            "parameters": { "csi.storage.k8s.io/fstype": "xfs", "tier": "gold" },
            "mountOptions": ["nconnect=4"],
            "volumeBindingMode": "WaitForFirstConsumer",
            "allowVolumeExpansion": true,
            "allowedTopologies": [{ "matchLabelExpressions": [
                { "key": "topology.kubernetes.io/zone", "values": ["z1"] },
            ] }],
            "reclaimPolicy": policy,
        }))
        .unwrap()
    }

    #[test]
    fn the_run_class_copies_what_the_provisioner_sees_and_retains() {
        for policy in ["Delete", "Retain"] {
            let class = class_under_test(policy);
            let clone = run_class(&class, "r1");
            assert_eq!(clone.metadata.name.as_deref(), Some("wq-r1"));
            assert_eq!(clone.metadata.labels.as_ref().unwrap()[RUN_LABEL], "r1");
            assert_eq!(
                clone.metadata.labels.as_ref().unwrap().get("team"),
                None,
                "the class's own labels are not the run's"
            );
            // Not the default class, no uid or resourceVersion of the original.
            assert_eq!(clone.metadata.annotations, None);
            assert_eq!(clone.metadata.uid, None);
            assert_eq!(clone.metadata.resource_version, None);
            assert_eq!(clone.provisioner, class.provisioner);
            assert_eq!(clone.parameters, class.parameters);
            assert_eq!(clone.mount_options, class.mount_options);
            assert_eq!(clone.volume_binding_mode, class.volume_binding_mode);
            assert_eq!(clone.allow_volume_expansion, Some(true));
            assert_eq!(clone.allowed_topologies, class.allowed_topologies);
            assert_eq!(clone.reclaim_policy.as_deref(), Some("Retain"));
        }
    }

    fn bound_pv(claim_uid: Option<&str>, by: Option<&str>, class: &str) -> PersistentVolume {
        let mut v = serde_json::json!({
            "metadata": { "name": "pvc-1" },
            "spec": {
                "storageClassName": class,
                "claimRef": { "namespace": "team-a", "name": "wq-r1-writer" },
            },
        });
        if let Some(uid) = claim_uid {
            v["spec"]["claimRef"]["uid"] = uid.into();
        }
        if let Some(by) = by {
            v["metadata"]["annotations"] = serde_json::json!({ PROVISIONED_BY: by });
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn only_a_pv_the_run_provisioned_for_its_claim_is_verified() {
        let p = "csi.example.com";
        let ours = bound_pv(Some("claim-1"), Some(p), "wq-r1");
        assert_eq!(verify_bound_pv(&ours, "claim-1", p, "wq-r1"), Ok(()));
        // Someone's retained PV of the class under test (its claimRef cleared, then bound).
        for (pv, claim_uid, what) in [
            (
                bound_pv(Some("claim-1"), Some(p), "fast-rwx"),
                "claim-1",
                "storageClassName",
            ),
            (
                bound_pv(Some("other"), Some(p), "wq-r1"),
                "claim-1",
                "claimRef.uid",
            ),
            (
                bound_pv(None, Some(p), "wq-r1"),
                "claim-1",
                "claimRef.uid is unset",
            ),
            (
                bound_pv(Some("claim-1"), None, "wq-r1"),
                "claim-1",
                "provisioned-by is unset",
            ),
            (
                bound_pv(Some("claim-1"), Some("other.csi"), "wq-r1"),
                "claim-1",
                "provisioned-by",
            ),
            (bound_pv(Some(""), Some(p), "wq-r1"), "", "claimRef.uid"),
        ] {
            let e = verify_bound_pv(&pv, claim_uid, p, "wq-r1").unwrap_err();
            assert!(e.contains(what), "{what}: {e}");
            assert!(e.contains("pvc-1"), "{e}");
        }
        let all_wrong = bound_pv(None, None, "fast-rwx");
        let e = verify_bound_pv(&all_wrong, "claim-1", p, "wq-r1").unwrap_err();
        for what in ["claimRef.uid", PROVISIONED_BY, "storageClassName"] {
            assert!(e.contains(what), "{what}: {e}");
        }
    }

    #[test]
    fn the_binder_mounts_read_only_without_fs_group_and_writes_nothing() {
        let pod = binder_pod(&settings(), "r1", "writer", "team-a", "wq-r1-writer");
        assert_eq!(pod.metadata.name.as_deref(), Some("wq-r1-writer-bind"));
        assert_eq!(
            pod.metadata.labels.as_ref().unwrap()[PART_LABEL],
            "writer-bind"
        );
        let spec = pod.spec.unwrap();
        assert_eq!(spec.security_context.as_ref().unwrap().fs_group, None);
        let claim = spec.volumes.as_ref().unwrap()[0]
            .persistent_volume_claim
            .clone()
            .unwrap();
        assert_eq!(claim.read_only, Some(true));
        assert_eq!(
            spec.containers[0].volume_mounts.as_ref().unwrap()[0].read_only,
            Some(true)
        );
        assert_eq!(spec.containers[0].command.as_ref().unwrap()[2], "true");
    }

    #[test]
    fn claims_name_only_the_class() {
        let c = writer_claim(&settings(), "r1", "control", "team-b", "ReadWriteOnce");
        let spec = c.spec.unwrap();
        // The run's own class, never the class under test: no pre-existing PV can match.
        assert_eq!(spec.storage_class_name.as_deref(), Some("wq-r1"));
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
