//! The storage decision: every non-durable outcome, the order of the checks, writer identity,
//! digests, the built-in fallback, and that every durable decision is a valid ModelCacheBinding
//! spec (the CRD's structural schema and its CEL rules).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::CustomResourceExt;
use serde_json::Value;
use warmcache_api_modelcache::v2beta1::{
    AccessMode, BindingIdentity, BindingResources, ModelCacheBinding, ModelCacheBindingSpec,
    ReclaimPolicy, Transition, Workflow,
};
use warmcache_catalog::{
    BUILTIN_CATALOG, CONFIG_MAP_KEY, CONFIG_MAP_NAME, CatalogInput, CatalogSnapshot, Decision,
    DecisionError, DecisionInputs, DisabledReason, Gates, LoadError, NonDurable, Outcome, Refusal,
    WriterIdentity, WriterIdentitySource, decide, storage_class_digest,
};

const REGULAR: Workflow = Workflow::RegularModelCache;
const HELM: Workflow = Workflow::HelmModelCache;

fn gates() -> Gates {
    Gates {
        caching_support: true,
        helm_model_caching: true,
        model_cache_encryption: false,
    }
}

fn class(provisioner: &str) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some("nvcf-sc".into()),
            uid: Some("sc-uid-1".into()),
            ..ObjectMeta::default()
        },
        provisioner: provisioner.into(),
        reclaim_policy: Some("Retain".into()),
        volume_binding_mode: Some("WaitForFirstConsumer".into()),
        ..StorageClass::default()
    }
}

fn csi_driver(name: &str, policy: Option<&str>) -> CSIDriver {
    CSIDriver {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: CSIDriverSpec {
            fs_group_policy: policy.map(str::to_owned),
            ..CSIDriverSpec::default()
        },
    }
}

fn config_map(payload: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(CONFIG_MAP_NAME.into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            CONFIG_MAP_KEY.to_owned(),
            payload.to_owned(),
        )])),
        ..ConfigMap::default()
    }
}

fn run(
    class: Option<&StorageClass>,
    csi: Option<&CSIDriver>,
    catalog: CatalogInput<'_>,
    workflow: Workflow,
    gates: Gates,
) -> Result<Outcome, DecisionError> {
    decide(&DecisionInputs {
        storage_class: class,
        csi_driver: csi,
        catalog,
        workflow,
        gates,
    })
}

fn durable(outcome: Result<Outcome, DecisionError>) -> Decision {
    match outcome {
        Ok(Outcome::Durable(d)) => *d,
        other => panic!("expected a durable decision, got {other:?}"),
    }
}

fn non_durable(outcome: Result<Outcome, DecisionError>) -> NonDurable {
    match outcome {
        Ok(Outcome::NonDurable(n)) => n,
        other => panic!("expected a non-durable outcome, got {other:?}"),
    }
}

/// The shipped catalog with one extra driver entry appended.
fn catalog_with(extra: &str) -> String {
    format!("{BUILTIN_CATALOG}{extra}")
}

const WEKA_ROX_SHAPE: &str = "  - name: csi.rox.example\n    provider: weka\n    accessModes: [ReadWriteOnce, ReadOnlyMany]\n    readerMountOptions: [ro]\n";

// ---------------------------------------------------------------- durable decisions

#[test]
fn nvmesh_helm_decision_is_exact() {
    let sc = class("nvmesh-csi.excelero.com");
    let d = durable(run(Some(&sc), None, CatalogInput::Absent, HELM, gates()));
    let snapshot = CatalogSnapshot::builtin().unwrap();
    let driver = snapshot
        .catalog()
        .driver("nvmesh-csi.excelero.com")
        .unwrap();
    assert_eq!(d.workflow, HELM);
    assert_eq!(d.decision.provider, "nvmesh");
    assert_eq!(d.decision.provisioner, "nvmesh-csi.excelero.com");
    assert_eq!(d.decision.transition, Transition::RoxReadOnly);
    assert_eq!(
        d.decision.required_access_modes,
        [AccessMode::ReadWriteOnce, AccessMode::ReadOnlyMany]
    );
    assert_eq!(
        d.decision.required_mount_options,
        ["ro", "norecovery", "nouuid"]
    );
    assert_eq!(
        d.decision.catalog_digest,
        warmcache_catalog::profile_digest(
            driver,
            HELM,
            warmcache_catalog::Flow::Enabled(Transition::RoxReadOnly)
        )
    );
    assert!(!d.decision.encryption_required);
    assert_eq!(d.storage_class.name, "nvcf-sc");
    assert_eq!(d.storage_class.uid, "sc-uid-1");
    assert_eq!(d.storage_class.reclaim_policy, ReclaimPolicy::Retain);
    assert_eq!(
        d.storage_class.configuration_digest,
        storage_class_digest(&sc)
    );
    assert_eq!(
        d.writer_identity, None,
        "no writer identity for roxReadOnly"
    );
    assert_eq!(d.catalog_revision, snapshot.revision());
    assert!(d.catalog_builtin);
}

#[test]
fn weka_regular_decision_is_rwx_without_mount_options() {
    let sc = class("csi.weka.io");
    let cm = config_map(BUILTIN_CATALOG);
    let d = durable(run(
        Some(&sc),
        None,
        CatalogInput::ConfigMap(&cm),
        REGULAR,
        gates(),
    ));
    assert_eq!(d.decision.transition, Transition::RwxReadOnly);
    assert_eq!(
        d.decision.required_access_modes,
        [AccessMode::ReadWriteMany]
    );
    assert!(d.decision.required_mount_options.is_empty());
    assert!(!d.catalog_builtin);
    let w = d.writer_identity.unwrap();
    assert_eq!(w.identity, WriterIdentity::FsGroup);
    assert_eq!(w.source, WriterIdentitySource::NoCsiDriver);
}

#[test]
fn builtin_and_config_map_give_the_same_decision_but_for_the_flag() {
    let cm = config_map(BUILTIN_CATALOG);
    for provisioner in [
        "nvmesh-csi.excelero.com",
        "csi.weka.io",
        "fss.csi.oraclecloud.com",
    ] {
        for workflow in [REGULAR, HELM] {
            let sc = class(provisioner);
            let builtin = durable(run(
                Some(&sc),
                None,
                CatalogInput::Absent,
                workflow,
                gates(),
            ));
            let mut configured = durable(run(
                Some(&sc),
                None,
                CatalogInput::ConfigMap(&cm),
                workflow,
                gates(),
            ));
            assert!(builtin.catalog_builtin && !configured.catalog_builtin);
            configured.catalog_builtin = true;
            assert_eq!(builtin, configured, "{provisioner} {workflow:?}");
        }
    }
}

/// The flag a caller logs and counts: set on every outcome the built-in catalog decided, durable
/// or not, and only on those.
#[test]
fn every_outcome_says_whether_the_builtin_catalog_decided_it() {
    let cm = config_map(BUILTIN_CATALOG);
    let encrypted = Gates {
        model_cache_encryption: true,
        ..gates()
    };
    let mut delete = class("csi.weka.io");
    delete.reclaim_policy = Some("Delete".into());
    // (StorageClass, workflow, gates, reason (None = durable), whether the catalog is consulted)
    type Case = (
        Option<StorageClass>,
        Workflow,
        Gates,
        Option<&'static str>,
        bool,
    );
    let cases: [Case; 8] = [
        (Some(class("csi.weka.io")), REGULAR, gates(), None, true),
        (
            Some(class("nvmesh-csi.excelero.com")),
            HELM,
            gates(),
            None,
            true,
        ),
        (
            Some(class("ebs.csi.aws.com")),
            REGULAR,
            gates(),
            Some("NoCatalogEntry"),
            true,
        ),
        (
            Some(class("lustre.csi.oraclecloud.com")),
            HELM,
            gates(),
            Some("NoQualifiedFlow"),
            true,
        ),
        (
            Some(class("csi.weka.io")),
            REGULAR,
            encrypted,
            Some("EncryptionUnavailable"),
            true,
        ),
        (
            Some(class("csi.weka.io")),
            REGULAR,
            Gates::default(),
            Some("CachingDisabled"),
            false,
        ),
        (None, REGULAR, gates(), Some("StorageClassNotFound"), false),
        (
            Some(delete),
            REGULAR,
            gates(),
            Some("StorageClassNotRetain"),
            false,
        ),
    ];
    for (sc, workflow, g, reason, consulted) in &cases {
        let absent = run(sc.as_ref(), None, CatalogInput::Absent, *workflow, *g).unwrap();
        let configured = run(
            sc.as_ref(),
            None,
            CatalogInput::ConfigMap(&cm),
            *workflow,
            *g,
        )
        .unwrap();
        let got = match &absent {
            Outcome::Durable(_) => None,
            Outcome::NonDurable(n) => Some(n.reason()),
        };
        assert_eq!(got, *reason, "{sc:?}");
        assert_eq!(absent.catalog_builtin(), *consulted, "{reason:?}");
        assert!(!configured.catalog_builtin(), "{reason:?}");
    }
}

#[test]
fn a_loaded_snapshot_decides_like_its_source() {
    let sc = class("csi.trident.netapp.io");
    let snapshot = CatalogSnapshot::builtin().unwrap();
    let loaded = durable(run(
        Some(&sc),
        None,
        CatalogInput::Loaded(&snapshot),
        HELM,
        gates(),
    ));
    let absent = durable(run(Some(&sc), None, CatalogInput::Absent, HELM, gates()));
    assert_eq!(loaded, absent);
}

#[test]
fn rwx_wins_over_the_rox_shape_and_any_provider_gets_regular_rox() {
    let payload = catalog_with(
        "  - name: csi.both.example\n    provider: someVendor\n    accessModes: [ReadWriteOnce, ReadOnlyMany, ReadWriteMany]\n    readerMountOptions: [ro]\n",
    );
    let payload = format!("{payload}{WEKA_ROX_SHAPE}");
    let cm = config_map(&payload);
    let both = class("csi.both.example");
    for workflow in [REGULAR, HELM] {
        let d = durable(run(
            Some(&both),
            None,
            CatalogInput::ConfigMap(&cm),
            workflow,
            gates(),
        ));
        assert_eq!(d.decision.transition, Transition::RwxReadOnly);
        assert!(d.decision.required_mount_options.is_empty());
    }
    let rox = class("csi.rox.example");
    let d = durable(run(
        Some(&rox),
        None,
        CatalogInput::ConfigMap(&cm),
        REGULAR,
        gates(),
    ));
    assert_eq!(d.decision.transition, Transition::RoxReadOnly);
    assert_eq!(d.decision.required_mount_options, ["ro"]);
}

// ---------------------------------------------------------------- non-durable outcomes

#[test]
fn each_non_durable_outcome_is_distinct_and_actionable() {
    let cm = config_map(&catalog_with(WEKA_ROX_SHAPE));
    let configured = CatalogInput::ConfigMap(&cm);
    let off = Gates::default();
    let no_helm = Gates {
        helm_model_caching: false,
        ..gates()
    };
    let mut delete = class("csi.weka.io");
    delete.reclaim_policy = Some("Delete".into());
    let mut unset = class("csi.weka.io");
    unset.reclaim_policy = None;
    let blank = class("  ");
    let empty = class("");
    let unknown = class("ebs.csi.aws.com");
    let lustre = class("lustre.csi.oraclecloud.com");
    let rox_shape = class("csi.rox.example");
    let weka = class("csi.weka.io");

    let cases: Vec<(NonDurable, &str, &str)> = vec![
        (
            non_durable(run(Some(&weka), None, configured, REGULAR, off)),
            "CachingDisabled",
            "CachingSupport",
        ),
        (
            non_durable(run(Some(&weka), None, configured, HELM, no_helm)),
            "HelmCachingDisabled",
            "HelmModelCaching",
        ),
        (
            non_durable(run(None, None, configured, REGULAR, gates())),
            "StorageClassNotFound",
            "\"nvcf-sc\" not found",
        ),
        (
            non_durable(run(Some(&delete), None, configured, REGULAR, gates())),
            "StorageClassNotRetain",
            "must use reclaimPolicy Retain, it uses \"Delete\"",
        ),
        (
            non_durable(run(Some(&unset), None, configured, REGULAR, gates())),
            "StorageClassNotRetain",
            "the default (Delete)",
        ),
        (
            non_durable(run(Some(&blank), None, configured, REGULAR, gates())),
            "StorageClassProvisionerBlank",
            "empty provisioner",
        ),
        (
            non_durable(run(Some(&empty), None, configured, REGULAR, gates())),
            "StorageClassProvisionerBlank",
            "empty provisioner",
        ),
        (
            non_durable(run(Some(&unknown), None, configured, REGULAR, gates())),
            "NoCatalogEntry",
            "provisioner \"ebs.csi.aws.com\" with no entry in the configured",
        ),
        (
            non_durable(run(
                Some(&unknown),
                None,
                CatalogInput::Absent,
                REGULAR,
                gates(),
            )),
            "NoCatalogEntry",
            "no entry in the built-in",
        ),
        (
            non_durable(run(Some(&lustre), None, configured, REGULAR, gates())),
            "NoQualifiedFlow",
            "qualifies no access mode",
        ),
        (
            non_durable(run(Some(&rox_shape), None, configured, HELM, gates())),
            "NoQualifiedFlow",
            "volume handles encode the namespace",
        ),
    ];
    for (outcome, reason, text) in &cases {
        assert_eq!(outcome.reason(), *reason, "{outcome:?}");
        let message = outcome.to_string();
        assert!(message.contains(text), "{reason}: {message}");
        assert!(!message.contains('\n'), "{message}");
    }
    assert!(matches!(
        cases[10].0,
        NonDurable::NoQualifiedFlow {
            why: DisabledReason::CrossNamespaceNeedsReadWriteMany,
            workflow: Workflow::HelmModelCache,
            ..
        }
    ));
    assert!(matches!(
        &cases[8].0,
        NonDurable::NoCatalogEntry { catalog_builtin: true, provisioner } if provisioner == "ebs.csi.aws.com"
    ));
    // The regular workflow does not need the Helm gate.
    durable(run(Some(&weka), None, configured, REGULAR, no_helm));
}

#[test]
fn encryption_is_never_silently_dropped() {
    let encrypted = Gates {
        model_cache_encryption: true,
        ..gates()
    };
    // NVMesh lists encryption and gives roxReadOnly: encrypted.
    let nvmesh = class("nvmesh-csi.excelero.com");
    for workflow in [REGULAR, HELM] {
        let d = durable(run(
            Some(&nvmesh),
            None,
            CatalogInput::Absent,
            workflow,
            encrypted,
        ));
        assert!(d.decision.encryption_required);
    }
    // rwxReadOnly cannot encrypt.
    let weka = class("csi.weka.io");
    let n = non_durable(run(
        Some(&weka),
        None,
        CatalogInput::Absent,
        REGULAR,
        encrypted,
    ));
    assert_eq!(n.reason(), "EncryptionUnavailable");
    assert!(n.to_string().contains("rwxReadOnly"), "{n}");
    // The ROX shape without encryptionSupported cannot either.
    let cm = config_map(&catalog_with(WEKA_ROX_SHAPE));
    let rox = class("csi.rox.example");
    let n = non_durable(run(
        Some(&rox),
        None,
        CatalogInput::ConfigMap(&cm),
        REGULAR,
        encrypted,
    ));
    assert_eq!(
        n,
        NonDurable::EncryptionUnavailable {
            provisioner: "csi.rox.example".into(),
            transition: Transition::RoxReadOnly,
            encryption_supported: false,
            catalog_builtin: false,
        }
    );
    assert!(n.to_string().contains("encryptionSupported"), "{n}");
}

#[test]
fn checks_run_in_order_and_stop_at_the_first_that_applies() {
    let broken = config_map("drivers: [");
    let broken = CatalogInput::ConfigMap(&broken);
    // Gates come before everything; the StorageClass before the catalog.
    assert_eq!(
        non_durable(run(None, None, broken, HELM, Gates::default())),
        NonDurable::CachingDisabled
    );
    assert_eq!(
        non_durable(run(None, None, broken, REGULAR, gates())),
        NonDurable::StorageClassNotFound
    );
    let mut delete = class("csi.weka.io");
    delete.reclaim_policy = Some("Delete".into());
    assert_eq!(
        non_durable(run(Some(&delete), None, broken, REGULAR, gates())).reason(),
        "StorageClassNotRetain"
    );
    assert_eq!(
        non_durable(run(Some(&class(" ")), None, broken, REGULAR, gates())),
        NonDurable::BlankProvisioner
    );
    // Once the catalog is needed, a broken one is an error, never a fallback.
    let err = run(Some(&class("csi.weka.io")), None, broken, REGULAR, gates()).unwrap_err();
    let DecisionError::Catalog(LoadError::Invalid(errors)) = &err else {
        panic!("{err:?}");
    };
    assert!(
        errors.has("data[storage-provider-capabilities.yaml]", |r| matches!(
            r,
            Refusal::NotYaml { .. }
        ))
    );
}

#[test]
fn config_map_without_catalog_is_an_error_not_the_builtin() {
    let mut cm = config_map("x");
    cm.data = Some(BTreeMap::new());
    let err = run(
        Some(&class("csi.weka.io")),
        None,
        CatalogInput::ConfigMap(&cm),
        REGULAR,
        gates(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("data[storage-provider-capabilities.yaml]: the ConfigMap has no"),
        "{err}"
    );
    let invalid = config_map(
        &BUILTIN_CATALOG.replace("provider: weka", "provider: weka\n    transitions: {}"),
    );
    let err = run(
        Some(&class("csi.weka.io")),
        None,
        CatalogInput::ConfigMap(&invalid),
        REGULAR,
        gates(),
    )
    .unwrap_err();
    assert!(err.to_string().contains(
        "data[storage-provider-capabilities.yaml].drivers[1].transitions: unknown field \"transitions\""
    ), "{err}");
}

#[test]
fn inputs_that_make_a_decision_impossible_are_errors() {
    let mut other = class("csi.weka.io");
    other.metadata.name = Some("standard".into());
    assert!(matches!(
        run(Some(&other), None, CatalogInput::Absent, REGULAR, gates()),
        Err(DecisionError::WrongStorageClass { .. })
    ));
    for uid in [None, Some(String::new())] {
        let mut c = class("csi.weka.io");
        c.metadata.uid = uid;
        assert_eq!(
            run(Some(&c), None, CatalogInput::Absent, REGULAR, gates()),
            Err(DecisionError::StorageClassWithoutUid)
        );
    }
    // A CSIDriver of another provisioner is a caller's mistake, not "no CSIDriver": treating it
    // as absent would freeze a writer identity nobody decided.
    let sc = class("csi.weka.io");
    let other = csi_driver("fss.csi.oraclecloud.com", Some("ReadWriteOnceWithFSType"));
    assert!(matches!(
        run(
            Some(&sc),
            Some(&other),
            CatalogInput::Absent,
            REGULAR,
            gates()
        ),
        Err(DecisionError::WrongCsiDriver { .. })
    ));
}

// ---------------------------------------------------------------- writer identity

#[test]
fn writer_identity_from_catalog_then_csi_driver() {
    let sc = class("csi.weka.io");
    let cases: [(Option<CSIDriver>, WriterIdentity, WriterIdentitySource); 5] = [
        (
            Some(csi_driver("csi.weka.io", Some("File"))),
            WriterIdentity::FsGroup,
            WriterIdentitySource::CsiDriverFsGroupPolicy(Some("File".into())),
        ),
        (
            Some(csi_driver("csi.weka.io", Some("ReadWriteOnceWithFSType"))),
            WriterIdentity::Root,
            WriterIdentitySource::CsiDriverFsGroupPolicy(Some("ReadWriteOnceWithFSType".into())),
        ),
        (
            Some(csi_driver("csi.weka.io", Some("None"))),
            WriterIdentity::Root,
            WriterIdentitySource::CsiDriverFsGroupPolicy(Some("None".into())),
        ),
        (
            Some(csi_driver("csi.weka.io", None)),
            WriterIdentity::Root,
            WriterIdentitySource::CsiDriverFsGroupPolicy(None),
        ),
        (
            None,
            WriterIdentity::FsGroup,
            WriterIdentitySource::NoCsiDriver,
        ),
    ];
    for (csi, identity, source) in cases {
        let d = durable(run(
            Some(&sc),
            csi.as_ref(),
            CatalogInput::Absent,
            REGULAR,
            gates(),
        ));
        let w = d.writer_identity.unwrap();
        assert_eq!((w.identity, &w.source), (identity, &source), "{csi:?}");
    }

    // The catalog's writerIdentity wins over the live CSIDriver, both ways.
    let payload = BUILTIN_CATALOG
        .replace(
            "  - name: csi.weka.io\n    provider: weka\n",
            "  - name: csi.weka.io\n    provider: weka\n    writerIdentity: fsGroup\n",
        )
        .replace(
            "  - name: csi.trident.netapp.io\n    provider: netappTrident\n",
            "  - name: csi.trident.netapp.io\n    provider: netappTrident\n    writerIdentity: root\n",
        );
    let cm = config_map(&payload);
    let d = durable(run(
        Some(&sc),
        Some(&csi_driver("csi.weka.io", Some("ReadWriteOnceWithFSType"))),
        CatalogInput::ConfigMap(&cm),
        REGULAR,
        gates(),
    ));
    let w = d.writer_identity.unwrap();
    assert_eq!(
        (w.identity, w.source),
        (WriterIdentity::FsGroup, WriterIdentitySource::Catalog)
    );
    let trident = class("csi.trident.netapp.io");
    let d = durable(run(
        Some(&trident),
        None,
        CatalogInput::ConfigMap(&cm),
        HELM,
        gates(),
    ));
    let w = d.writer_identity.unwrap();
    assert_eq!(
        (w.identity, w.source),
        (WriterIdentity::Root, WriterIdentitySource::Catalog)
    );
}

// ---------------------------------------------------------------- digests

#[test]
fn profile_digest_ignores_other_drivers_and_comments() {
    let sc = class("csi.weka.io");
    let base = durable(run(Some(&sc), None, CatalogInput::Absent, REGULAR, gates()));
    let edits = [
        // another driver's modes
        BUILTIN_CATALOG.replace(
            "provider: ociLustre\n    accessModes: []",
            "provider: ociLustre\n    accessModes: [ReadWriteMany]",
        ),
        // another driver's options and encryption
        BUILTIN_CATALOG.replace(
            "readerMountOptions: [ro, norecovery, nouuid]\n    encryptionSupported: true",
            "readerMountOptions: [ro]",
        ),
        // a comment and a new driver
        format!("# edited\n{}", catalog_with(WEKA_ROX_SHAPE)),
        // explicit defaults
        BUILTIN_CATALOG.replace(
            "  - name: csi.weka.io\n    provider: weka\n",
            "  - name: csi.weka.io\n    provider: weka\n    encryptionSupported: false\n",
        ),
    ];
    for payload in &edits {
        assert_ne!(payload.as_str(), BUILTIN_CATALOG, "the edit applied");
        let cm = config_map(payload);
        let d = durable(run(
            Some(&sc),
            None,
            CatalogInput::ConfigMap(&cm),
            REGULAR,
            gates(),
        ));
        assert_eq!(
            d.decision.catalog_digest, base.decision.catalog_digest,
            "{payload}"
        );
        assert_ne!(
            d.catalog_revision, base.catalog_revision,
            "the revision follows any edit"
        );
    }
}

#[test]
fn profile_digest_follows_the_selected_driver() {
    let sc = class("nvmesh-csi.excelero.com");
    let base = durable(run(Some(&sc), None, CatalogInput::Absent, REGULAR, gates()));
    let nvmesh = "  - name: nvmesh-csi.excelero.com\n    provider: nvmesh\n    accessModes: [ReadWriteOnce, ReadOnlyMany]\n    readerMountOptions: [ro, norecovery, nouuid]\n    encryptionSupported: true\n";
    assert!(BUILTIN_CATALOG.contains(nvmesh));
    let edits = [
        nvmesh.replace("[ro, norecovery, nouuid]", "[ro, nouuid, norecovery]"),
        nvmesh.replace("[ro, norecovery, nouuid]", "[ro]"),
        nvmesh.replace(
            "[ReadWriteOnce, ReadOnlyMany]",
            "[ReadWriteOnce, ReadOnlyMany, ReadWriteMany]",
        ),
        nvmesh.replace("    encryptionSupported: true\n", ""),
        nvmesh.replace("provider: nvmesh", "provider: nvmesh2"),
    ];
    for edit in &edits {
        let cm = config_map(&BUILTIN_CATALOG.replace(nvmesh, edit));
        let d = durable(run(
            Some(&sc),
            None,
            CatalogInput::ConfigMap(&cm),
            REGULAR,
            gates(),
        ));
        assert_ne!(
            d.decision.catalog_digest, base.decision.catalog_digest,
            "{edit}"
        );
    }
    // The workflow is part of the profile.
    let helm = durable(run(Some(&sc), None, CatalogInput::Absent, HELM, gates()));
    assert_ne!(helm.decision.catalog_digest, base.decision.catalog_digest);
}

#[test]
fn storage_class_drift_changes_only_the_configuration_digest() {
    let sc = class("csi.weka.io");
    let base = durable(run(Some(&sc), None, CatalogInput::Absent, REGULAR, gates()));
    let mut changed = sc.clone();
    changed.parameters = Some(BTreeMap::from([("fs".to_owned(), "b".to_owned())]));
    let d = durable(run(
        Some(&changed),
        None,
        CatalogInput::Absent,
        REGULAR,
        gates(),
    ));
    assert_ne!(
        d.storage_class.configuration_digest,
        base.storage_class.configuration_digest
    );
    assert_eq!(d.decision, base.decision);
}

// ---------------------------------------------------------------- the CRD accepts every decision

/// The openAPIV3Schema of the generated ModelCacheBinding CRD.
fn crd_schema() -> Value {
    let crd = ModelCacheBinding::crd();
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .unwrap(),
    )
    .unwrap()
}

fn binding(d: &Decision) -> Value {
    let handle = "hf://Qwen/Qwen3-0.6B@v1";
    let spec = ModelCacheBindingSpec {
        identity: BindingIdentity::new(d.workflow, "team-a", handle),
        decision: d.decision.clone(),
        storage_class: d.storage_class.clone(),
        resources: BindingResources {
            writer_namespace: "team-a".into(),
            ..BindingResources::default()
        },
    };
    let name = warmcache_api_modelcache::binding_name(&spec.identity);
    let mut b = ModelCacheBinding::new(&name, spec);
    b.metadata.namespace = Some(warmcache_api_modelcache::DEFAULT_CONTROL_NAMESPACE.into());
    serde_json::to_value(&b).unwrap()
}

/// Every durable decision the shipped catalog (plus a both-shapes driver and an encrypted ROX
/// driver) can produce.
fn all_durable_decisions() -> Vec<Decision> {
    let payload = catalog_with(
        "  - name: csi.both.example\n    provider: someVendor\n    accessModes: [ReadWriteOnce, ReadOnlyMany, ReadWriteMany]\n    readerMountOptions: [ro]\n    writerIdentity: root\n",
    );
    let cm = config_map(&payload);
    let mut decisions = Vec::new();
    let provisioners = [
        "nvmesh-csi.excelero.com",
        "csi.weka.io",
        "fss.csi.oraclecloud.com",
        "csi.trident.netapp.io",
        "csi.both.example",
    ];
    for provisioner in provisioners {
        for workflow in [REGULAR, HELM] {
            for encryption in [false, true] {
                let g = Gates {
                    model_cache_encryption: encryption,
                    ..gates()
                };
                let sc = class(provisioner);
                if let Ok(Outcome::Durable(d)) =
                    run(Some(&sc), None, CatalogInput::ConfigMap(&cm), workflow, g)
                {
                    decisions.push(*d);
                }
            }
        }
    }
    decisions
}

#[test]
fn every_durable_decision_passes_the_crd_cel_rules() {
    let schema = crd_schema();
    let validator = kube_cel::Validator::new();
    let decisions = all_durable_decisions();
    // nvmesh x 2 workflows x 2 encryption + 4 rwx drivers x 2 workflows (unencrypted only).
    assert_eq!(decisions.len(), 4 + 4 * 2);
    for d in &decisions {
        let value = binding(d);
        if let Err(errors) = validator.validate(&schema, &value, None) {
            panic!("{:?}: {errors}", d.decision);
        }
        // rwxReadOnly => exactly [ReadWriteMany]; roxReadOnly => exactly [RWO, ROX].
        let modes = &value["spec"]["decision"]["requiredAccessModes"];
        match d.decision.transition {
            Transition::RwxReadOnly => assert_eq!(*modes, serde_json::json!(["ReadWriteMany"])),
            Transition::RoxReadOnly => {
                assert_eq!(*modes, serde_json::json!(["ReadWriteOnce", "ReadOnlyMany"]));
            }
        }
    }
    // The validator does bite: the same binding with the other transition's modes is refused.
    let mut wrong = binding(&decisions[0]);
    wrong["spec"]["decision"]["requiredAccessModes"] = serde_json::json!(["ReadWriteMany"]);
    assert_eq!(decisions[0].decision.transition, Transition::RoxReadOnly);
    assert!(validator.validate(&schema, &wrong, None).is_err());
}

#[test]
fn every_durable_decision_passes_the_crd_structural_schema() {
    // The CRD's openAPIV3Schema is JSON Schema (draft 4 flavoured) plus x-kubernetes-*
    // extensions, which a draft-4 validator ignores: patterns, enums, lengths and required
    // fields are checked here.
    let schema = crd_schema();
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft4)
        .build(&schema)
        .unwrap();
    for d in all_durable_decisions() {
        let value = binding(&d);
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{:?}: {errors:?}", d.decision);
    }
    // And it bites: a whole-catalog style digest with another prefix is refused.
    let mut wrong = binding(&all_durable_decisions()[0]);
    wrong["spec"]["storageClass"]["configurationDigest"] =
        Value::String(warmcache_catalog::catalog_revision("x"));
    assert!(!validator.is_valid(&wrong));
}

#[test]
fn feature_gates_parse_over_the_defaults_and_refuse_what_they_do_not_know() {
    assert_eq!(Gates::parse("").unwrap(), Gates::DEFAULT);
    assert_eq!(
        Gates::DEFAULT,
        Gates {
            caching_support: true,
            helm_model_caching: true,
            model_cache_encryption: false,
        }
    );
    let g = Gates::parse("CachingSupport=false, ModelCacheEncryption=true").unwrap();
    assert!(!g.caching_support && g.helm_model_caching && g.model_cache_encryption);
    for (text, why) in [
        ("Caching=true", "unknown feature gate"),
        ("CachingSupport=yes", "expected true or false"),
        ("CachingSupport", "Name=true|false"),
    ] {
        let err = Gates::parse(text).unwrap_err();
        assert!(err.contains(why), "{text}: {err}");
    }
}
