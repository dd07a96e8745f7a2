//! Fixtures of the unit tests of the storage modules (compiled for tests only).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, Container, PersistentVolume, PersistentVolumeSpec, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use warmcache_api_modelcache::v2beta1::{
    AccessMode, BindingDecision, BindingIdentity, BindingResources, BindingStorageClass,
    ModelCacheBinding, ModelCacheBindingSpec, ReclaimPolicy, Transition, Workflow, WriterIdentity,
};
use warmcache_api_modelcache::{binding_name, sha256_digest};

use crate::step::{DownloadStep, StepOrigin};

pub(crate) const HANDLE: &str = "hf://Qwen/Qwen3-0.6B@v1";

pub(crate) fn binding(transition: Transition) -> ModelCacheBinding {
    let identity = BindingIdentity::new(Workflow::HelmModelCache, "domain-1", HANDLE);
    let name = binding_name(&identity);
    let spec = ModelCacheBindingSpec {
        identity,
        decision: BindingDecision {
            provider: "weka".into(),
            provisioner: "shared-fs.csi-test.warmcache.io".into(),
            transition,
            required_access_modes: transition.required_access_modes().to_vec(),
            required_mount_options: Vec::new(),
            catalog_digest: sha256_digest("profile"),
            encryption_required: false,
            writer_identity: (transition == Transition::RwxReadOnly)
                .then_some(WriterIdentity::FsGroup),
        },
        storage_class: BindingStorageClass {
            name: "nvcf-sc".into(),
            uid: "sc-uid".into(),
            reclaim_policy: ReclaimPolicy::Retain,
            configuration_digest: format!("v1:{}", sha256_digest("sc")),
        },
        resources: BindingResources {
            writer_namespace: "team-a".into(),
            ..BindingResources::default()
        },
    };
    let _ = AccessMode::ReadWriteMany;
    let mut b = ModelCacheBinding::new(&name, spec);
    b.metadata.namespace = Some("nvca-modelcache-init".into());
    b.metadata.uid = Some("binding-uid-1".into());
    b.metadata.generation = Some(1);
    b.metadata.resource_version = Some("10".into());
    b
}

pub(crate) fn primary_pv() -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some("pvc-primary".into()),
            resource_version: Some("5".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([(
                "storage".to_owned(),
                Quantity("100Gi".into()),
            )])),
            access_modes: Some(vec!["ReadWriteMany".into()]),
            persistent_volume_reclaim_policy: Some("Retain".into()),
            storage_class_name: Some("nvcf-sc".into()),
            mount_options: Some(vec!["vers=4.1".into()]),
            csi: Some(CSIPersistentVolumeSource {
                driver: "shared-fs.csi-test.warmcache.io".into(),
                volume_handle: "handle-1".into(),
                volume_attributes: Some(BTreeMap::from([(
                    "share".to_owned(),
                    "exports/1".to_owned(),
                )])),
                ..CSIPersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
}

pub(crate) fn init_step() -> DownloadStep {
    DownloadStep {
        version: "v1alpha1".into(),
        origin: StepOrigin::Init,
        source_container: "fetch".into(),
        container: Container {
            name: "fetch".into(),
            image: Some("tools:1".into()),
            command: Some(vec!["hf".into(), "download".into()]),
            args: Some(vec![
                "Qwen/Qwen3-0.6B".into(),
                "--local-dir".into(),
                "/models/qwen3".into(),
            ]),
            volume_mounts: Some(vec![
                VolumeMount {
                    name: "models".into(),
                    mount_path: "/models".into(),
                    ..VolumeMount::default()
                },
                VolumeMount {
                    name: "certs".into(),
                    mount_path: "/certs".into(),
                    read_only: Some(true),
                    ..VolumeMount::default()
                },
            ]),
            ..Container::default()
        },
        dest: "/models/qwen3".into(),
        landing_volume: Some("models".into()),
        volumes: vec![
            serde_json::from_value(serde_json::json!({"name": "models", "emptyDir": {}})).unwrap(),
            serde_json::from_value(
                serde_json::json!({"name": "certs", "secret": {"secretName": "ca"}}),
            )
            .unwrap(),
        ],
        image_pull_secrets: Vec::new(),
        service_account_name: Some("puller".into()),
        pod_security_context: None,
        env_from_pod: Vec::new(),
    }
}
