//! Decision drift: what the storage would decide today for a binding, compared with what the
//! binding froze. Drift never changes a binding and never authorizes a deletion; it is reported
//! (`DecisionDrift` condition) so an operator knows why a new cache would be decided differently.
//!
//! The decision is taken again with the feature gates the components run with now (the
//! webhook's `--feature-gates`, which the chart gives the binding controller too): a gate
//! switched off (no durable cache would be decided) or encryption switched on or off is drift
//! like any storage change.

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use warmcache_api_modelcache::v2beta1::ModelCacheBinding;
use warmcache_catalog::{CatalogInput, DecisionInputs, Gates, Outcome};

/// Condition type of decision drift.
pub const DECISION_DRIFT: &str = "DecisionDrift";

/// The storage as it is now.
#[derive(Debug, Clone, Copy)]
pub struct CurrentStorage<'a> {
    /// StorageClass `nvcf-sc`, if it exists.
    pub storage_class: Option<&'a StorageClass>,
    /// The CSIDriver named after its provisioner, if registered.
    pub csi_driver: Option<&'a CSIDriver>,
    /// The catalog ConfigMap, if it exists (else the built-in catalog decides).
    pub catalog: Option<&'a ConfigMap>,
    /// The feature gates as they are now.
    pub gates: Gates,
}

/// What differs between the binding's frozen decision and the decision the current storage
/// gives, in words; `None` when nothing does.
pub fn decision_drift(binding: &ModelCacheBinding, now: &CurrentStorage<'_>) -> Option<String> {
    let spec = &binding.spec;
    let inputs = DecisionInputs {
        storage_class: now.storage_class,
        csi_driver: now.csi_driver,
        catalog: now
            .catalog
            .map_or(CatalogInput::Absent, CatalogInput::ConfigMap),
        workflow: spec.identity.workflow,
        gates: now.gates,
    };
    let decision = match warmcache_catalog::decide(&inputs) {
        Err(e) => return Some(format!("the storage decision cannot be taken again: {e}")),
        Ok(Outcome::NonDurable(n)) => {
            return Some(format!(
                "the storage would no longer give a durable cache: {n}"
            ));
        }
        Ok(Outcome::Durable(d)) => d,
    };
    let mut differences = Vec::new();
    let (was, is) = (&spec.decision, &decision.decision);
    let mut differ = |what: &str, was: String, is: String| {
        if was != is {
            differences.push(format!("{what} {was} -> {is}"));
        }
    };
    differ("provider", was.provider.clone(), is.provider.clone());
    differ(
        "provisioner",
        was.provisioner.clone(),
        is.provisioner.clone(),
    );
    differ(
        "transition",
        was.transition.as_str().to_owned(),
        is.transition.as_str().to_owned(),
    );
    differ(
        "writer identity",
        was.writer_identity
            .map_or("none", |w| w.as_str())
            .to_owned(),
        is.writer_identity.map_or("none", |w| w.as_str()).to_owned(),
    );
    differ(
        "reader mount options",
        format!("{:?}", was.required_mount_options),
        format!("{:?}", is.required_mount_options),
    );
    differ(
        "catalog profile",
        was.catalog_digest.clone(),
        is.catalog_digest.clone(),
    );
    differ(
        "encryption",
        was.encryption_required.to_string(),
        is.encryption_required.to_string(),
    );
    let (was, is) = (&spec.storage_class, &decision.storage_class);
    differ("StorageClass UID", was.uid.clone(), is.uid.clone());
    differ(
        "StorageClass configuration",
        was.configuration_digest.clone(),
        is.configuration_digest.clone(),
    );
    (!differences.is_empty()).then(|| {
        format!(
            "the storage would be decided differently today ({}); the binding keeps its decision, and a new cache would get the new one",
            differences.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::binding;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use warmcache_api_modelcache::v2beta1::{Transition, Workflow};

    fn class(provisioner: &str, uid: &str) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some("nvcf-sc".into()),
                uid: Some(uid.into()),
                ..ObjectMeta::default()
            },
            provisioner: provisioner.into(),
            reclaim_policy: Some("Retain".into()),
            ..StorageClass::default()
        }
    }

    /// A binding decided on `sc` with the built-in catalog.
    fn decided_on(sc: &StorageClass) -> ModelCacheBinding {
        decided_as(sc, binding(Transition::RwxReadOnly).spec.identity.workflow)
    }

    /// The same, in `workflow`.
    fn decided_as(sc: &StorageClass, workflow: Workflow) -> ModelCacheBinding {
        let mut b = binding(Transition::RwxReadOnly);
        b.spec.identity.workflow = workflow;
        let inputs = DecisionInputs {
            storage_class: Some(sc),
            csi_driver: None,
            catalog: CatalogInput::Absent,
            workflow: b.spec.identity.workflow,
            gates: Gates::DEFAULT,
        };
        let Ok(Outcome::Durable(d)) = warmcache_catalog::decide(&inputs) else {
            panic!("weka is durable in the built-in catalog");
        };
        b.spec.decision = d.decision;
        b.spec.storage_class = d.storage_class;
        b
    }

    #[test]
    fn the_same_storage_is_no_drift_and_every_change_is_named() {
        let sc = class("csi.weka.io", "uid-1");
        let b = decided_on(&sc);
        fn now(sc: Option<&StorageClass>) -> CurrentStorage<'_> {
            CurrentStorage {
                storage_class: sc,
                csi_driver: None,
                catalog: None,
                gates: Gates::DEFAULT,
            }
        }
        assert_eq!(decision_drift(&b, &now(Some(&sc))), None);

        let recreated = class("csi.weka.io", "uid-2");
        let d = decision_drift(&b, &now(Some(&recreated))).unwrap();
        assert!(d.contains("StorageClass UID uid-1 -> uid-2"), "{d}");
        assert!(!d.contains("provider"), "{d}");

        let mut reconfigured = sc.clone();
        reconfigured.mount_options = Some(vec!["nconnect=8".into()]);
        let d = decision_drift(&b, &now(Some(&reconfigured))).unwrap();
        assert!(d.contains("StorageClass configuration"), "{d}");

        let unqualified = class("lustre.csi.oraclecloud.com", "uid-1");
        let d = decision_drift(&b, &now(Some(&unqualified))).unwrap();
        assert!(d.contains("no longer give a durable cache"), "{d}");

        let d = decision_drift(&b, &now(None)).unwrap();
        assert!(d.contains("no longer") || d.contains("cannot"), "{d}");

        // The gates as the components run with them now.
        let gated = |gates: Gates| CurrentStorage {
            gates,
            ..now(Some(&sc))
        };
        let off = Gates {
            caching_support: false,
            ..Gates::DEFAULT
        };
        let d = decision_drift(&b, &gated(off)).unwrap();
        assert!(d.contains("no longer give a durable cache"), "{d}");
        assert!(d.contains("CachingSupport"), "{d}");
        let encrypted = Gates {
            model_cache_encryption: true,
            ..Gates::DEFAULT
        };
        // Encryption switched on: this ReadWriteMany storage cannot hold an encrypted cache.
        let d = decision_drift(&b, &gated(encrypted)).unwrap();
        assert!(d.contains("no longer give a durable cache"), "{d}");
        assert!(d.contains("encryption is on"), "{d}");
        // Sharing domains switched off: this helmModelCache binding would not be decided today,
        // a regularModelCache one on the same storage still would.
        let no_domains = Gates {
            helm_model_caching: false,
            ..Gates::DEFAULT
        };
        assert_eq!(b.spec.identity.workflow, Workflow::HelmModelCache);
        let d = decision_drift(&b, &gated(no_domains)).unwrap();
        assert!(d.contains("HelmModelCaching"), "{d}");
        let regular = decided_as(&sc, Workflow::RegularModelCache);
        assert_eq!(decision_drift(&regular, &now(Some(&sc))), None);
        assert_eq!(decision_drift(&regular, &gated(no_domains)), None);
    }
}
